/*
 * Hybrid models' recurrent states in the engine (engine.h): the state pool, each request's
 * running and track slots, and the tree's checkpoints, with SGLang's MambaRadixCache request
 * flow. A match serves the device prefix only up to the deepest checkpoint on it and copies
 * that state into the request's own slot (copy on write); the request records a checkpoint
 * in its track slot (kvt_req_mamba_track) and hands it to the tree when it caches its key up
 * to that position. The pieces are the device layer's (mamba_pool, mamba_req, mamba_ckpt)
 * and the tree's (radix_mamba.c); this file only joins them.
 *
 * With a host tier, a checkpoint whose node keeps a host copy when the state leaves the device
 * is saved beside it, in host memory this file keeps (save_state); a request whose deepest
 * state is such a copy has the node's KV loaded back through the tier below and the state
 * copied back into a device slot (restore) before it matches as on the device alone. With a
 * store below the host (disk, remote), each checkpoint cached is written there too, by the
 * hash of the page it follows (store_state), and a match that runs past the tree reads the
 * deepest one back with its KV into a host copy (fetch_state), from where it is restored.
 */
#include "device/mamba_ckpt.h"
#include "device/mamba_pool.h"
#include "device/mamba_req.h"
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One track slot per request: a donated checkpoint is replaced at once, so the forward
 * always has a slot to write the next one into. */
#define TRACK_SLOTS 1

struct mamba_row {
    uint64_t kv_len, branch_len, track_len;
};

/* Positions probed for a state kept below, deepest first, per match (struct probe). */
#define STATE_PROBES 64

struct engine_mamba {
    struct mamba_pool pool;
    struct mamba_req_map reqs;
    struct mamba_ckpt_rules rules;
    uint64_t grid, decode_grid;
    struct mamba_row *row; /* per request row */
    uint64_t kv_hit_tokens, evicted_states;
    /* Host copies of states, slots 1..hcap: buffers of slot_bytes made on first use and kept
     * (so memory grows with the copies held, up to hcap), and a stack of the free slots. */
    uint32_t hcap, hnfree;
    uint8_t **hbuf;
    uint32_t *hfree;
    uint64_t slot_bytes, saved, restored;
    /* With a store below: states kept there by the page hash they follow (written when a
     * checkpoint is cached, read back under a match that runs past the tree). */
    uint8_t (*hashes)[KVT_HASH_LEN]; /* a key's page hashes past the tree (nhashes) */
    size_t nhashes;
    kvt_node_ref bare[STATE_PROBES]; /* nodes of the tree without a state (rdx_mamba_bare) */
    void *stage;                     /* one state, on its way down */
    uint64_t stored, fetched;
};

/* ---- open / close ---- */

int engine_mamba_check_options(const struct kvt_options *o)
{
    const struct kvt_mamba *m = &o->mamba;
    struct mamba_geometry g = {m->layers, m->conv_bytes, m->ssm_bytes};
    struct mamba_ckpt_rules r = {m->chunk, m->track_interval, o->page_size};

    if (m->layers == 0)
        return m->slots || m->conv_bytes || m->ssm_bytes ? -EINVAL : 0;
    if (mamba_geometry_check(&g) || mamba_ckpt_rules_check(&r) || m->slots == 1 ||
        m->slots > INT32_MAX - 1)
        return -EINVAL;
    return 0;
}

int engine_mamba_open(kvt_engine *e)
{
    const struct kvt_mamba *o = &e->opts.mamba;
    struct mamba_geometry g = {o->layers, o->conv_bytes, o->ssm_bytes};
    uint64_t slots = o->slots ? o->slots : 4ull * e->opts.max_requests;
    struct engine_mamba *m;
    int rc;

    if (slots > INT32_MAX - 1)
        slots = INT32_MAX - 1;
    if (!(m = e->mamba = calloc(1, sizeof(*m))))
        return -ENOMEM;
    m->rules = (struct mamba_ckpt_rules){o->chunk, o->track_interval, e->opts.page_size};
    m->grid = mamba_ckpt_grid(&m->rules);
    m->decode_grid = mamba_ckpt_decode_grid(&m->rules);
    if ((rc = mamba_pool_init(&m->pool, e->be, &g, (uint32_t)slots)))
        return rc;
    if ((rc = mamba_req_init(&m->reqs, &m->pool, e->opts.max_requests, TRACK_SLOTS)))
        return rc;
    m->row = calloc(e->opts.max_requests, sizeof(*m->row));
    return m->row ? 0 : -ENOMEM;
}

/* The tree hands back the slots of the states it drops (with their KV, or evicted alone). */
static void release_states(void *ctx, const uint32_t *slots, size_t n)
{
    kvt_engine *e = ctx;

    /* Slots are below INT32_MAX, and int32_t may alias uint32_t. */
    (void)mamba_pool_release(&e->mamba->pool, (const int32_t *)slots, n);
}

/* The whole state in slot, every layer's conv then SSM part, into buf (slot_bytes). */
static int read_state(const struct engine_mamba *m, uint32_t slot, uint8_t *buf)
{
    const struct mamba_geometry *g = &m->pool.geo;
    int rc = 0;

    for (uint32_t l = 0; l < g->layers && rc == 0; l++, buf += g->conv_bytes + g->ssm_bytes)
        if (!(rc = mamba_pool_read(&m->pool, (int32_t)slot, l, MAMBA_CONV, buf)))
            rc = mamba_pool_read(&m->pool, (int32_t)slot, l, MAMBA_SSM, buf + g->conv_bytes);
    return rc;
}

/* The tree saves the state of a node that keeps its host copy: a host slot holding a copy
 * of device slot `slot`, or 0 (none free, no memory, a failed copy: the state is lost). */
static uint32_t save_state(void *ctx, uint32_t slot)
{
    struct engine_mamba *m = ((kvt_engine *)ctx)->mamba;
    uint32_t h;

    if (m->hnfree == 0)
        return 0;
    h = m->hfree[m->hnfree - 1];
    if (!m->hbuf[h] && !(m->hbuf[h] = malloc(m->slot_bytes)))
        return 0;
    if (read_state(m, slot, m->hbuf[h]))
        return 0;
    m->hnfree--;
    m->saved++;
    return h;
}

static void release_host_states(void *ctx, const uint32_t *hslots, size_t n)
{
    struct engine_mamba *m = ((kvt_engine *)ctx)->mamba;

    for (size_t i = 0; i < n; i++)
        m->hfree[m->hnfree++] = hslots[i];
}

/* Room for host copies of states: options.mamba_host_states, or by default as many per state
 * slot as the host pool has pages per device page (none without a host tier), at most what
 * half of the memory available (avail bytes; 0: unknown) holds. Copies are allocated as they
 * are made, so an explicit number the memory cannot hold is refused now, not met later. */
static int open_host_states(kvt_engine *e, uint64_t host_pages, uint64_t avail)
{
    struct engine_mamba *m = e->mamba;
    uint64_t dev_pages = engine_slots_c(e)->npages, cap = e->opts.mamba_host_states;

    if (host_pages == 0)
        return 0;
    m->slot_bytes = mamba_slot_bytes(&m->pool.geo);
    if (cap && avail && cap > avail / m->slot_bytes)
        return KVT_EHOSTRAM;
    if (cap == 0) {
        cap = (uint64_t)m->pool.nslots * host_pages / (dev_pages ? dev_pages : 1);
        if (avail && cap > avail / 2 / m->slot_bytes)
            cap = avail / 2 / m->slot_bytes;
    }
    if (cap > UINT32_MAX - 1)
        cap = UINT32_MAX - 1;
    m->hcap = (uint32_t)cap;
    m->hbuf = calloc(cap + 1, sizeof(*m->hbuf));
    m->hfree = malloc((cap + 1) * sizeof(*m->hfree));
    if (!m->hbuf || !m->hfree)
        return -ENOMEM;
    for (uint32_t i = 0; i < m->hcap; i++)
        m->hfree[i] = m->hcap - i; /* slot 1 on top */
    m->hnfree = m->hcap;
    if (!e->store)
        return 0;
    m->nhashes = (size_t)e->opts.max_context / e->opts.page_size + 1;
    if (m->nhashes < STATE_PROBES)
        m->nhashes = STATE_PROBES;
    m->hashes = malloc(m->nhashes * sizeof(*m->hashes));
    m->stage = malloc(m->slot_bytes);
    return m->hashes && m->stage ? 0 : -ENOMEM;
}

int engine_mamba_tree_config(kvt_engine *e, struct rdx_config *cfg, uint64_t host_pages,
                             uint64_t avail)
{
    int rc = open_host_states(e, host_pages, avail);

    cfg->mamba = 1;
    cfg->mamba_grid = (uint32_t)e->mamba->grid;
    cfg->free_mamba = release_states;
    cfg->mamba_host_states = e->mamba->hcap;
    cfg->save_mamba = save_state;
    cfg->free_host_mamba = release_host_states;
    return rc;
}

void engine_mamba_close(kvt_engine *e)
{
    struct engine_mamba *m = e->mamba;

    if (!m)
        return;
    mamba_req_finish(&m->reqs);
    mamba_pool_finish(&m->pool);
    for (uint32_t i = 0; m->hbuf && i <= m->hcap; i++)
        free(m->hbuf[i]);
    free(m->hbuf);
    free(m->hfree);
    free(m->hashes);
    free(m->stage);
    free(m->row);
    free(m);
    e->mamba = NULL;
}

/* ---- matching ---- */

/* kv: the KV the match found, in tokens (on the device alone, or in every tier). */
static void count_match(kvt_engine *e, const struct kvt_key *key, const struct rdx_mamba_hit *h,
                        uint64_t kv)
{
    uint32_t ps = e->opts.page_size;

    e->count.match_calls++;
    e->count.match_query_tokens += key->len / ps * ps;
    e->count.match_hit_tokens += h->state_tokens;
    e->mamba->kv_hit_tokens += kv;
}

int engine_mamba_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots,
                       struct kvt_match *m)
{
    struct rdx_mamba_hit h;
    int rc = rdx_match_mamba(e->tree, key, e->pages, &h);

    if (rc)
        return rc;
    count_match(e, key, &h, h.kv_pages * e->opts.page_size);
    if (slots)
        engine_pages_to_slots(e, e->pages, h.state_tokens / e->opts.page_size, slots);
    *m = (struct kvt_match){.device_len = h.state_tokens, .last_node = h.state_last};
    /* A deeper state the host keeps (with the KV it continues) is what a begin would add. */
    struct rdx_hit hit;
    kvt_node_ref x;
    uint32_t slot, hslot;
    uint64_t tokens;
    if (e->below && e->mamba->hcap && rdx_match_tiers(e->tree, key, NULL, NULL, &hit) == 0 &&
        rdx_mamba_find(e->tree, hit.host_last, &x, &slot, &hslot, &tokens) == 0 && hslot && !slot &&
        tokens > h.state_tokens)
        m->host_len = tokens - h.state_tokens;
    return 0;
}

/* n free state slots, evicting unlocked checkpoints (least recently used first) when there
 * are too few, but only when that makes enough: -ENOMEM has evicted nothing. */
int engine_mamba_room(kvt_engine *e, size_t n)
{
    struct engine_mamba *m = e->mamba;
    size_t avail = mamba_pool_available(&m->pool);
    struct rdx_sizes s;

    if (avail >= n)
        return 0;
    rdx_sizes(e->tree, &s);
    if (avail + s.mamba_evictable < n)
        return -ENOMEM;
    m->evicted_states += rdx_mamba_evict(e->tree, n - avail);
    return mamba_pool_available(&m->pool) >= n ? 0 : -ENOMEM;
}

/* Row idx's slots: the checkpoint's state copied into its running slot (or zeros), and a
 * track slot. All or nothing. */
static int take_slots(kvt_engine *e, int32_t idx, uint32_t state_slot)
{
    struct engine_mamba *m = e->mamba;
    int rc = engine_mamba_room(e, mamba_req_slots_per_req(&m->reqs));

    if (rc)
        return rc;
    if (state_slot)
        rc = mamba_req_cow(&m->reqs, idx, (int32_t)state_slot);
    if (rc == 0)
        rc = mamba_req_alloc(&m->reqs, idx);
    if (rc == 0 && !state_slot) {
        int32_t run = mamba_req_slot(&m->reqs, idx);
        rc = mamba_pool_zero(&m->pool, &run, 1);
    }
    if (rc && mamba_req_holds(&m->reqs, idx))
        mamba_req_free(&m->reqs, idx, MAMBA_KEEP_NONE, NULL);
    return rc;
}

/* ---- host copies of states coming back ---- */

/* Node x (locked, its KV on the device) gets a device state copied from its host slot. */
static int copy_in(kvt_engine *e, kvt_node_ref x, uint32_t hslot)
{
    struct engine_mamba *m = e->mamba;
    const struct mamba_geometry *g = &m->pool.geo;
    const uint8_t *p = m->hbuf[hslot];
    int32_t s;
    int rc;

    if ((rc = engine_mamba_room(e, 1)) || (rc = mamba_pool_alloc(&m->pool, 1, &s)))
        return rc;
    for (uint32_t l = 0; l < g->layers && rc == 0; l++, p += g->conv_bytes + g->ssm_bytes)
        if (!(rc = mamba_pool_write(&m->pool, s, l, MAMBA_CONV, p)))
            rc = mamba_pool_write(&m->pool, s, l, MAMBA_SSM, p + g->conv_bytes);
    if (rc || (rc = mamba_pool_claim(&m->pool, &s, 1))) {
        mamba_pool_free(&m->pool, &s, 1);
        return rc;
    }
    if ((rc = rdx_mamba_attach(e->tree, x, (uint32_t)s))) {
        mamba_pool_release(&m->pool, &s, 1);
        return rc;
    }
    m->restored++;
    return 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A search for a state kept below: STATE_PROBES positions at most, and none once
 * prefetch_timeout_ms has gone by, so that a store failing slowly (a stopped server) costs a
 * request about one of its timeouts, not one per checkpoint. */
struct probe {
    uint64_t t0;
    size_t tries;
};

static bool probe_spent(const kvt_engine *e, const struct probe *pr)
{
    return pr->tries >= STATE_PROBES ||
           (pr->tries && now_ms() - pr->t0 > e->opts.prefetch_timeout_ms);
}

/* Whether the store below keeps a state under hash, read back whole into buf when buf is
 * given (a state failing its checks is a miss). */
static bool state_below(kvt_engine *e, struct probe *pr, const uint8_t *hash, uint8_t *buf)
{
    uint64_t bytes = e->mamba->slot_bytes;

    pr->tries++;
    return tier_has_state(e->below, hash, bytes) &&
           (!buf || tier_get_state(e->below, hash, buf, bytes) == 0);
}

/* The deepest position past the tree (n pages the store holds there, on the checkpoint grid)
 * with a state below (read into buf when given): pages past the tree, or 0. */
static size_t past_tree(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit,
                        size_t n, uint8_t *buf, struct probe *pr)
{
    struct engine_mamba *m = e->mamba;
    size_t first = hit->dev_pages + hit->host_pages;
    uint32_t ps = e->opts.page_size;

    if (rdx_key_hashes(e->tree, key, hit->host_last, first, n, m->hashes))
        return 0;
    for (size_t j = n; j > 0 && !probe_spent(e, pr); j--)
        if ((first + j) * ps % m->grid == 0 && state_below(e, pr, m->hashes[j - 1], buf))
            return j;
    return 0;
}

size_t engine_mamba_prefetch_pages(kvt_engine *e, const struct kvt_key *key,
                                   const struct rdx_hit *hit, size_t n)
{
    struct probe pr = {now_ms(), 0};

    return e->mamba->stage ? past_tree(e, key, hit, n, NULL, &pr) : n;
}

/* A host slot holding the state in m->stage, made room for among the host copies (the least
 * recently used on an unlocked node goes when they are full): the slot, or 0. */
static uint32_t stage_to_host(kvt_engine *e)
{
    struct engine_mamba *m = e->mamba;
    uint32_t h;

    if (rdx_mamba_host_room(e->tree) || m->hnfree == 0)
        return 0;
    h = m->hfree[m->hnfree - 1];
    if (!m->hbuf[h] && !(m->hbuf[h] = malloc(m->slot_bytes)))
        return 0;
    memcpy(m->hbuf[h], m->stage, m->slot_bytes);
    m->hnfree--;
    return h;
}

/* Node ref takes host slot h (its state), or h goes back. */
static bool hang_state(kvt_engine *e, kvt_node_ref ref, uint32_t h)
{
    struct engine_mamba *m = e->mamba;

    if (rdx_mamba_attach_host(e->tree, ref, h)) {
        m->hfree[m->hnfree++] = h;
        return false;
    }
    m->fetched++;
    return true;
}

/* A state kept below for a node of the tree that has none (its host copy dropped, or its KV
 * filled ahead by kvt_prefetch), deeper than any state the tree has on key's path, hung on
 * the node as a host copy. */
static void state_for_tree(kvt_engine *e, const struct rdx_hit *hit, struct probe *pr)
{
    struct engine_mamba *m = e->mamba;
    int n = rdx_mamba_bare(e->tree, hit->host_last, m->bare, m->hashes, STATE_PROBES);
    uint32_t h;

    for (int i = 0; i < n && !probe_spent(e, pr); i++)
        if (state_below(e, pr, m->hashes[i], m->stage)) {
            if ((h = stage_to_host(e)))
                hang_state(e, m->bare[i], h);
            return;
        }
}

/* A state the store below keeps deeper than anything the tree holds for key comes up as a
 * host copy on the node ending it: past the tree, its KV filled into the host tier as a
 * match past the tree fills it (waiting as prefetch_policy says), else on a node of the tree
 * that lacks one. The state is read before a host slot is made room for: nothing the host
 * keeps goes for a state that is not there. *disk gets the tokens filled. */
static void fetch_state(kvt_engine *e, const struct kvt_key *key, uint64_t *disk)
{
    static const int wait_ms[] = {
        [KVT_PREFETCH_WAIT_COMPLETE] = -1, [KVT_PREFETCH_BEST_EFFORT] = 0};
    struct engine_mamba *m = e->mamba;
    uint32_t policy = e->opts.prefetch_policy, h;
    struct probe pr = {now_ms(), 0};
    struct rdx_hit hit, now;
    size_t n, p = 0, first;

    *disk = 0;
    if (!m->stage || rdx_match_tiers(e->tree, key, NULL, NULL, &hit))
        return;
    if ((n = tier_find(e->below, key, &hit)))
        p = past_tree(e, key, &hit, n, m->stage, &pr);
    if (!p) {
        state_for_tree(e, &hit, &pr);
        return;
    }
    if (!(h = stage_to_host(e)))
        return;
    first = hit.dev_pages + hit.host_pages;
    /* find named the pages to the store tier for the fetch; reading states did not change
     * that, and making room among the host copies of states evicts no KV. */
    if (e->below->ops->fetch(e->below, key, &hit, p, NULL) && !e->below->ops->fetching(e->below)) {
        m->hfree[m->hnfree++] = h;
        return;
    }
    e->below->ops->wait_fetches(e->below, policy == KVT_PREFETCH_TIMEOUT
                                              ? (int)e->opts.prefetch_timeout_ms
                                              : wait_ms[policy]);
    /* Not landed (yet), or shorter: the state waits below for the next request. */
    if (rdx_match_tiers(e->tree, key, NULL, NULL, &now) || now.host_pages == 0 ||
        now.dev_pages + now.host_pages != first + p) {
        m->hfree[m->hnfree++] = h;
        return;
    }
    if (hang_state(e, now.host_last, h))
        *disk = (uint64_t)p * e->opts.page_size;
}

/* When the deepest state the tree knows for key is a host copy, bring it onto the device with
 * the KV it continues (loaded back through the tier below, into row), so that the match after
 * this finds it there. Best effort: a load the tier declines, a copy the room made for it
 * evicted, or no room for a state leaves the device as it was, and the match serves less.
 * *op gets the highest load filling the device prefix, *dev the tokens the device held before
 * a load (what the match serves past them came from the host), UINT64_MAX without one; *kv
 * the KV found in every tier (0 without a tier below). */
static void restore(kvt_engine *e, const struct kvt_key *key, int32_t *row, uint64_t *op,
                    uint64_t *dev, uint64_t *disk, uint64_t *kv)
{
    uint32_t ps = e->opts.page_size, slot, hslot;
    struct rdx_hit hit;
    kvt_node_ref x, y;
    uint64_t tokens, t2;

    *op = *disk = *kv = 0;
    *dev = UINT64_MAX; /* nothing loaded */
    if (!e->below || e->mamba->hcap == 0)
        return;
    fetch_state(e, key, disk);
    size_t found = *disk / ps;
    if (rdx_match_tiers(e->tree, key, e->pages, e->below_pages, &hit))
        return;
    *kv = (uint64_t)(hit.dev_pages + hit.host_pages + tier_find(e->below, key, &hit)) * ps;
    if (rdx_mamba_find(e->tree, hit.host_last, &x, &slot, &hslot, &tokens))
        return;
    *op = hit.pending;
    struct rdx_hit part = hit;
    part.host_pages = tokens / ps > hit.dev_pages ? tokens / ps - hit.dev_pages : 0;
    part.host_last = part.host_pages ? x : hit.dev_last;
    if (slot || !hslot) { /* the deepest state is on the device, or there is none */
        part.host_pages = 0;
        tier_matched(e->below, &part, 0);
        *disk = 0;
        return;
    }
    /* A lock on x keeps its KV and its host copy of the state through the room made below;
     * the tier's load moves the lock from the device prefix to x. */
    uint64_t load = 0;
    rdx_lock(e->tree, part.host_pages ? part.dev_last : x);
    if (part.host_pages &&
        e->below->ops->load(e->below, &part, e->below_pages, row + hit.dev_pages * ps, &load)) {
        rdx_unlock(e->tree, part.dev_last);
        part.host_pages = 0;
        tier_matched(e->below, &part, 0);
        *disk = 0;
        return;
    }
    tier_matched(e->below, &part, found);
    if (load) {
        *op = load; /* loads finish in order */
        *dev = (uint64_t)hit.dev_pages * ps;
    }
    /* The load's room may have taken x's copy of the state (x was not locked yet). */
    if (rdx_mamba_find(e->tree, x, &y, &slot, &hslot, &t2) == 0 && y == x && hslot && !slot)
        (void)copy_in(e, x, hslot);
    rdx_unlock(e->tree, x);
}

int engine_mamba_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                       struct kvt_req *req)
{
    struct engine_mamba *m = e->mamba;
    struct rdx_mamba_hit h;
    uint64_t load_op, dev, disk, kv;
    int rc;

    restore(e, key, row, &load_op, &dev, &disk, &kv);
    if ((rc = rdx_match_mamba(e->tree, key, e->pages, &h)))
        return rc;
    /* The state lock keeps the checkpoint from the eviction that makes room for its copy;
     * the request then holds the KV alone, as any other request does. */
    if (h.state_slot && (rc = rdx_mamba_lock(e->tree, h.state_last)))
        return rc;
    rc = take_slots(e, idx, h.state_slot);
    if (rc == 0)
        rdx_lock(e->tree, h.state_last);
    if (h.state_slot)
        rdx_mamba_unlock(e->tree, h.state_last);
    if (rc)
        return rc;
    /* SGLang's branching point counts the KV found in every tier: a request that shares
     * part of a node the host or disk holds checkpoints where the sharing ends, so that the
     * next one finds a state there. */
    if (kv < h.kv_pages * e->opts.page_size)
        kv = h.kv_pages * e->opts.page_size;
    uint64_t branch = kv / m->grid * m->grid;
    count_match(e, key, &h, kv);
    engine_pages_to_slots(e, e->pages, h.state_tokens / e->opts.page_size, row);
    m->row[idx] = (struct mamba_row){kv, branch > h.state_tokens ? branch : 0, 0};
    *req = (struct kvt_req){.pool_idx = idx,
                            .protected_len = h.state_tokens,
                            .last_node = h.state_last,
                            .loaded_len = h.state_tokens > dev ? h.state_tokens - dev : 0,
                            .disk_len = h.state_tokens > dev ? disk : 0,
                            .load_op = load_op,
                            .gen = req_pool_gen(&e->reqs, idx)};
    if (e->below)
        e->below->ops->hit(e->below, h.state_last);
    return 0;
}

/* ---- checkpoints ---- */

size_t engine_mamba_cache_len(const kvt_engine *e, int32_t idx, size_t protected_len,
                              size_t key_len)
{
    uint64_t t = e->mamba->row[idx].track_len;

    return t > protected_len && t <= key_len ? (size_t)t : protected_len;
}

/* A checkpoint the cache takes goes to the store below too (as its pages do, by write
 * policy): under the hash of the page it follows, so that a match past the tree finds it. */
static void store_state(kvt_engine *e, kvt_node_ref node, int32_t slot)
{
    struct engine_mamba *m = e->mamba;
    uint8_t hash[KVT_HASH_LEN];

    if (m->stage && rdx_mamba_end_hash(e->tree, node, hash) == 0 &&
        read_state(m, (uint32_t)slot, m->stage) == 0 &&
        tier_put_state(e->below, hash, m->stage, m->slot_bytes))
        m->stored++;
}

/* The tree takes slot as node's state, or the node has one already and the slot goes. */
static int give_state(kvt_engine *e, kvt_node_ref node, int32_t slot)
{
    int rc = rdx_mamba_attach(e->tree, node, (uint32_t)slot);

    if (rc == 0)
        store_state(e, node, slot);
    if (rc == -EEXIST)
        rc = mamba_pool_release(&e->mamba->pool, &slot, 1);
    return rc ? -EUCLEAN : 0;
}

int engine_mamba_cached(kvt_engine *e, int32_t idx, kvt_node_ref node, int finished)
{
    struct engine_mamba *m = e->mamba;
    int32_t slot;
    int rc = 0;

    m->row[idx].track_len = 0;
    if (!finished) /* engine_mamba_room made room for the fresh track slot */
        rc = mamba_req_donate(&m->reqs, idx, 0, &slot);
    else if (node)
        rc = mamba_req_free(&m->reqs, idx, MAMBA_KEEP_TRACK0, &slot);
    else
        return mamba_req_free(&m->reqs, idx, MAMBA_KEEP_NONE, NULL) ? -EUCLEAN : 0;
    return rc ? -EUCLEAN : give_state(e, node, slot);
}

/* ---- the public calls ---- */

static struct mamba_row *live_row(const kvt_engine *e, const struct kvt_req *req)
{
    if (!e || !e->mamba || !req || !req_pool_live(&e->reqs, req->pool_idx, req->gen))
        return NULL;
    return &e->mamba->row[req->pool_idx];
}

int kvt_req_mamba(const kvt_engine *e, const struct kvt_req *req, struct kvt_req_mamba *out)
{
    const struct mamba_row *r = live_row(e, req);

    if (!r || !out)
        return -EINVAL;
    const struct engine_mamba *m = e->mamba;
    *out = (struct kvt_req_mamba){.slot = mamba_req_slot(&m->reqs, req->pool_idx),
                                  .track_slot = mamba_req_track(&m->reqs, req->pool_idx, 0),
                                  .kv_len = r->kv_len,
                                  .branch_len = r->branch_len,
                                  .track_len = r->track_len,
                                  .grid = (uint32_t)m->grid,
                                  .decode_grid = (uint32_t)m->decode_grid};
    return 0;
}

int kvt_req_mamba_track(kvt_engine *e, const struct kvt_req *req, size_t len, int copy)
{
    struct mamba_row *r = live_row(e, req);

    if (!r || copy < 0 || copy > 1 || len % e->mamba->grid || len <= req->protected_len ||
        len > req_pool_filled(&e->reqs, req->pool_idx))
        return -EINVAL;
    if (copy) {
        const struct mamba_req_map *q = &e->mamba->reqs;
        int32_t run = mamba_req_slot(q, req->pool_idx),
                track = mamba_req_track(q, req->pool_idx, 0);
        int rc = mamba_pool_copy(&e->mamba->pool, &run, &track, 1);
        if (rc)
            return rc;
    }
    r->track_len = len;
    return 0;
}

static int check_state_io(const kvt_engine *e, int32_t slot, uint32_t layer, int part,
                          const void *buf)
{
    if (!e || !e->mamba || !buf || part < 0 || part > 1 || layer >= e->mamba->pool.geo.layers)
        return -EINVAL;
    return mamba_pool_slot_state(&e->mamba->pool, slot) < 0 ? -EINVAL : 0;
}

int kvt_mamba_write(kvt_engine *e, int32_t slot, uint32_t layer, int part, const void *buf)
{
    int rc = check_state_io(e, slot, layer, part, buf);

    if (rc)
        return rc;
    /* A checkpoint is the cache's: requests write their own slots only. */
    if (mamba_pool_slot_state(&e->mamba->pool, slot) != MAMBA_SLOT_USED)
        return -EINVAL;
    return mamba_pool_write(&e->mamba->pool, slot, layer, (enum mamba_part)part, buf);
}

int kvt_mamba_read(kvt_engine *e, int32_t slot, uint32_t layer, int part, void *buf)
{
    int rc = check_state_io(e, slot, layer, part, buf);

    return rc ? rc : mamba_pool_read(&e->mamba->pool, slot, layer, (enum mamba_part)part, buf);
}

int kvt_mamba_buffer(kvt_engine *e, uint32_t layer, int part, void **ptr, size_t *slot_bytes)
{
    if (!e || !e->mamba || !ptr || !slot_bytes || part < 0 || part > 1 ||
        layer >= e->mamba->pool.geo.layers)
        return -EINVAL;
    const struct mamba_pool *p = &e->mamba->pool;
    *ptr = p->buf[part][layer];
    *slot_bytes = part == MAMBA_CONV ? p->geo.conv_bytes : p->geo.ssm_bytes;
    return 0;
}

/* ---- figures and checks ---- */

void engine_mamba_stats(const kvt_engine *e, struct kvt_stats *st)
{
    const struct engine_mamba *m = e->mamba;
    struct rdx_sizes s;

    if (!m)
        return;
    rdx_sizes(e->tree, &s);
    st->mamba_slots = m->pool.nslots;
    st->mamba_free_slots = mamba_pool_available(&m->pool);
    st->mamba_cached_states = s.mamba_states;
    st->mamba_kv_hit_tokens = m->kv_hit_tokens;
    st->mamba_evicted_states = m->evicted_states;
    st->mamba_pool_bytes = mamba_pool_bytes(&m->pool);
    st->mamba_host_slots = m->hcap;
    st->mamba_host_states = s.mamba_host_states;
    st->mamba_saved_states = m->saved;
    st->mamba_restored_states = m->restored;
    st->mamba_stored_states = m->stored;
    st->mamba_fetched_states = m->fetched;
}

uint32_t engine_mamba_slots(const kvt_engine *e)
{
    return e->mamba ? e->mamba->pool.nslots : 0;
}

uint32_t engine_mamba_host_slots(const kvt_engine *e)
{
    return e->mamba ? e->mamba->hcap : 0;
}

/* A host copy is held by one node or is on the free stack, once. */
static int check_host_states(const struct engine_mamba *m, const uint8_t *hheld, char *why,
                             size_t len)
{
    uint8_t *free_ = calloc((size_t)m->hcap + 1, 1);
    int rc = 0;

    if (!free_)
        return -ENOMEM;
    for (uint32_t i = 0; i < m->hnfree && rc == 0; i++)
        if (m->hfree[i] == 0 || m->hfree[i] > m->hcap || free_[m->hfree[i]]++)
            rc = -EUCLEAN;
    for (uint32_t h = 1; h <= m->hcap && rc == 0; h++)
        if (hheld[h] + free_[h] != 1)
            rc = -EUCLEAN;
    if (rc)
        snprintf(why, len, "a host copy of a state is held and free, twice, or lost");
    free(free_);
    return rc;
}

/* Each slot has one owner that agrees with its state: the tree (held[s] counts its nodes
 * naming s) for a checkpoint, one live request for a used slot, nobody for a free one. */
int engine_mamba_check(const kvt_engine *e, const uint8_t *held, const uint8_t *hheld, char *why,
                       size_t len)
{
    const struct engine_mamba *m = e->mamba;
    uint8_t *reqs = calloc(m->pool.nslots + 1, 1);

    if (!reqs)
        return -ENOMEM;
    for (uint32_t r = 0; r < m->reqs.max_reqs; r++) {
        int32_t own[1 + TRACK_SLOTS] = {mamba_req_slot(&m->reqs, (int32_t)r),
                                        mamba_req_track(&m->reqs, (int32_t)r, 0)};
        bool live = req_pool_in_use(&e->reqs, (int32_t)r) == 1;
        for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++) {
            if ((own[i] == MAMBA_NO_SLOT) == live || (own[i] != MAMBA_NO_SLOT && reqs[own[i]]++)) {
                snprintf(why, len, "request row %u holds state slots it should not", r);
                free(reqs);
                return -EUCLEAN;
            }
        }
    }
    uint32_t nfree = 0;
    for (uint32_t s = 1; s <= m->pool.nslots; s++) {
        int st = mamba_pool_slot_state(&m->pool, (int32_t)s);
        bool ok = st == MAMBA_SLOT_CACHED ? held[s] == 1 && !reqs[s]
                  : st == MAMBA_SLOT_USED ? held[s] == 0 && reqs[s] == 1
                  : st == MAMBA_SLOT_FREE ? held[s] == 0 && !reqs[s]
                                          : false;
        nfree += st == MAMBA_SLOT_FREE;
        if (!ok) {
            snprintf(why, len, "state slot %u: state %d, held by %u nodes and %u requests", s, st,
                     held[s], reqs[s]);
            free(reqs);
            return -EUCLEAN;
        }
    }
    free(reqs);
    if (nfree != mamba_pool_available(&m->pool)) {
        snprintf(why, len, "%u state slots free, the free list holds %u", nfree,
                 mamba_pool_available(&m->pool));
        return -EUCLEAN;
    }
    return check_host_states(m, hheld, why, len);
}
