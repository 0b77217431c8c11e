/*
 * Hybrid models' recurrent states below the device (mamba_int.h): the state pool's room,
 * host copies of states and states in the store below. docs/design.md, "Recurrent states on
 * the host and disk tiers", says what happens when.
 *
 * With a host tier, a checkpoint whose node keeps a host copy when the state leaves the device
 * is saved beside it, in host memory kept here (save_state); a request whose deepest state is
 * such a copy has the node's KV loaded back through the tier below and the state copied into
 * a device slot (mamba_restore) before it matches as on the device alone. With a store below
 * the host (disk, remote), each checkpoint cached is written there too, by the hash of the page
 * it follows (mamba_store_state), and a match that runs past the tree reads the deepest one
 * back with its KV into a host copy (fetch_state), from where it is restored.
 */
#include "engine/mamba_int.h"
#include "engine/mamba_tiers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    uint64_t dev_pages = engine_slots_pages(&e->slots), cap = e->opts.mamba_host_states, each;

    if (host_pages == 0)
        return 0;
    m->slot_bytes = mamba_slot_bytes(&m->pool.geo);
    each = m->slot_bytes + sizeof(*m->hbuf) + sizeof(*m->hfree); /* a copy and its entries */
    if (cap && avail && cap > avail / each)
        return KVT_EHOSTRAM;
    if (cap == 0) {
        cap = (uint64_t)m->pool.nslots * host_pages / (dev_pages ? dev_pages : 1);
        if (avail && cap > avail / 2 / each)
            cap = avail / 2 / each;
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
 * keeps goes for a state that is not there. *disk gets the tokens filled, *kv the pages of KV
 * key found in every tier (0 without a store below): a fill moves pages from the store into
 * the tree, so that count holds after it too. */
static void fetch_state(kvt_engine *e, const struct kvt_key *key, uint64_t *disk, size_t *kv)
{
    static const int wait_ms[] = {
        [KVT_PREFETCH_WAIT_COMPLETE] = -1, [KVT_PREFETCH_BEST_EFFORT] = 0};
    struct engine_mamba *m = e->mamba;
    uint32_t policy = e->opts.prefetch_policy, h;
    struct probe pr = {now_ms(), 0};
    struct rdx_hit hit, now;
    size_t n, p = 0, first;

    *disk = *kv = 0;
    if (!m->stage || rdx_match_tiers(e->tree, key, NULL, NULL, &hit))
        return;
    first = hit.dev_pages + hit.host_pages;
    *kv = first + (n = tier_find(e->below, key, &hit));
    if (n)
        p = past_tree(e, key, &hit, n, m->stage, &pr);
    if (!p) {
        state_for_tree(e, &hit, &pr);
        return;
    }
    if (!(h = stage_to_host(e)))
        return;
    /* find named the pages to the store tier for the fetch; reading states did not change
     * that, and making room among the host copies of states evicts no KV. */
    if (e->below->ops->fetch(e->below, key, &hit, p, 0, NULL) &&
        !e->below->ops->fetching(e->below)) {
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
void mamba_restore(kvt_engine *e, const struct kvt_key *key, int32_t *row, uint64_t *op,
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
    size_t below;
    fetch_state(e, key, disk, &below);
    size_t found = *disk / ps;
    if (rdx_match_tiers(e->tree, key, e->pages, e->below_pages, &hit))
        return;
    /* The store's run was looked up once, by fetch_state; without a store there is none. */
    if (below < hit.dev_pages + hit.host_pages)
        below = hit.dev_pages + hit.host_pages;
    *kv = (uint64_t)below * ps;
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

/* A checkpoint the cache takes goes to the store below too (as its pages do, by write
 * policy): under the hash of the page it follows, so that a match past the tree finds it. */
void mamba_store_state(kvt_engine *e, kvt_node_ref node, int32_t slot)
{
    struct engine_mamba *m = e->mamba;
    uint8_t hash[KVT_HASH_LEN];

    if (m->stage && rdx_mamba_end_hash(e->tree, node, hash) == 0 &&
        read_state(m, (uint32_t)slot, m->stage) == 0 &&
        tier_put_state(e->below, hash, m->stage, m->slot_bytes))
        m->stored++;
}

uint32_t engine_mamba_host_slots(const kvt_engine *e)
{
    return e->mamba ? e->mamba->hcap : 0;
}

/* A host copy is held by one node or is on the free stack, once. */
int mamba_check_host_states(const struct engine_mamba *m, const uint8_t *hheld, char *why,
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

void mamba_tiers_close(struct engine_mamba *m)
{
    for (uint32_t i = 0; m->hbuf && i <= m->hcap; i++)
        free(m->hbuf[i]);
    free(m->hbuf);
    free(m->hfree);
    free(m->hashes);
    free(m->stage);
}
