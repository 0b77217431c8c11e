/*
 * Hybrid models' recurrent states in the engine (mamba.h): the state pool, each request's
 * running and track slots, and the tree's checkpoints, with SGLang's MambaRadixCache request
 * flow. A match serves the device prefix only up to the deepest checkpoint on it and copies
 * that state into the request's own slot (copy on write); the request records a checkpoint
 * in its track slot (kvt_req_mamba_track) and hands it to the tree when it caches its key up
 * to that position. The pieces are the device layer's (mamba_pool, mamba_req, mamba_ckpt)
 * and the tree's (radix_mamba.c); this file only joins them.
 *
 * Below the device (host copies of states, states in the store below): mamba_tiers.c.
 */
#include "engine/mamba.h"
#include "engine/mamba_int.h"
#include "engine/mamba_tiers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void engine_mamba_close(kvt_engine *e)
{
    struct engine_mamba *m = e->mamba;

    if (!m)
        return;
    mamba_req_finish(&m->reqs);
    mamba_pool_finish(&m->pool);
    mamba_tiers_close(m);
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
        engine_slots_from_pages(&e->slots, e->pages, h.state_tokens / e->opts.page_size, slots);
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

int engine_mamba_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                       struct kvt_req *req)
{
    struct engine_mamba *m = e->mamba;
    struct rdx_mamba_hit h;
    uint64_t load_op, dev, disk, kv;
    int rc;

    mamba_restore(e, key, row, &load_op, &dev, &disk, &kv);
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
    engine_slots_from_pages(&e->slots, e->pages, h.state_tokens / e->opts.page_size, row);
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

/* The tree takes slot as node's state, or the node has one already and the slot goes. */
static int give_state(kvt_engine *e, kvt_node_ref node, int32_t slot)
{
    int rc = rdx_mamba_attach(e->tree, node, (uint32_t)slot);

    if (rc == 0)
        mamba_store_state(e, node, slot);
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
    return mamba_check_host_states(m, hheld, why, len);
}
