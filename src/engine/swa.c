/*
 * Hybrid models' sliding-window layers in the engine (swa.h): SGLang's SWA request flow over
 * the slot layer's pair of allocators and pools (slots.h): a match served up to where its
 * last window still has SWA KV, window locks on the nodes that window covers, a request
 * freeing its SWA KV as its window moves on (kvt_req_swa_slide) and inserting those pages as
 * SWA tombstones, and the cache freeing SWA KV alone when the SWA pool is short. The tree's
 * side is radix_swa.c. A host tier keeps the SWA layers of the pages it backs up while they
 * hold SWA KV, a store below keeps window copies of those pages, and a request's begin brings
 * back from the store, then loads back from the host, what a match over every tier can serve.
 */
#include "engine/swa.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SGLang's swa_full_tokens_ratio default: the SWA pool holds 0.8 of the full slots. */
#define SWA_TOKENS_RATIO 0.8

struct swa_row {
    uint64_t span;   /* tokens the request's window lock covers (rdx_swa_unlock needs it) */
    uint64_t cursor; /* the request's SWA KV is freed below here (a page boundary) */
    uint64_t kv_len; /* device KV the match found */
};

struct engine_swa {
    uint32_t *full_ids; /* options.swa.full_layers, copied */
    struct swa_row *row;
    uint64_t kv_hit_tokens, evicted_tokens, released_tokens, revived_tokens;
};

/* ---- options, open, close ---- */

int engine_swa_check_options(const struct kvt_options *o)
{
    const struct kvt_swa *s = &o->swa;

    if (s->window == 0)
        return s->nfull || s->full_layers || s->tokens ? -EINVAL : 0;
    if (s->nfull == 0 || s->nfull >= o->geometry.layers || !s->full_layers ||
        s->tokens >= INT32_MAX || o->mamba.layers)
        return -EINVAL;
    for (uint32_t i = 0; i < s->nfull; i++) {
        if (s->full_layers[i] >= o->geometry.layers)
            return -EINVAL;
        for (uint32_t j = 0; j < i; j++)
            if (s->full_layers[j] == s->full_layers[i])
                return -EINVAL;
    }
    return 0;
}

int engine_swa_open(kvt_engine *e, uint64_t full_tokens)
{
    struct kvt_swa *o = &e->opts.swa;
    uint32_t ps = e->opts.page_size;
    uint64_t swa_tokens =
        o->tokens ? o->tokens : (uint64_t)(SWA_TOKENS_RATIO * (double)full_tokens);
    struct engine_swa *s;

    if (!(s = e->swa = calloc(1, sizeof(*s))))
        return -ENOMEM;
    s->full_ids = malloc(o->nfull * sizeof(*s->full_ids));
    s->row = calloc(e->opts.max_requests, sizeof(*s->row));
    if (!s->full_ids || !s->row)
        return -ENOMEM;
    memcpy(s->full_ids, o->full_layers, o->nfull * sizeof(*s->full_ids));
    o->full_layers = s->full_ids;
    if (swa_tokens < ps)
        swa_tokens = ps;
    return engine_slots_open_swa(&e->slots, e->be, &e->opts.geometry, ps, full_tokens, swa_tokens,
                                 s->full_ids, o->nfull);
}

/* The slot layer's pair goes with the rest of the slots (engine_slots_close). */
void engine_swa_close(kvt_engine *e)
{
    struct engine_swa *s = e->swa;

    if (!s)
        return;
    free(s->full_ids);
    free(s->row);
    free(s);
    e->swa = NULL;
}

/* The tree frees a node's SWA part alone (an SWA tombstone): the peers of its pages go. */
static void release_swa_pages(void *ctx, const uint32_t *pages, size_t n)
{
    kvt_engine *e = ctx;

    engine_slots_swa_release(&e->slots, pages, n);
    e->swa->evicted_tokens += n * e->opts.page_size;
}

/* The tree revives an SWA tombstone from an inserting request's own pages. */
static int revive_swa(void *ctx, const uint32_t *to, const uint32_t *from, size_t n)
{
    kvt_engine *e = ctx;
    int rc = engine_slots_swa_revive(&e->slots, to, from, n);

    if (rc == 0)
        e->swa->revived_tokens += n * e->opts.page_size;
    return rc;
}

void engine_swa_tree_config(kvt_engine *e, struct rdx_config *cfg)
{
    cfg->swa_window = e->opts.swa.window;
    cfg->free_swa_pages = release_swa_pages;
    cfg->revive_swa = revive_swa;
}

/* ---- room on the SWA side ---- */

/* Room for pages on the SWA side once the full side has it: the SWA KV of unlocked nodes
 * goes, least recently used first, their full KV staying. Decided first: -ENOMEM evicts
 * nothing. */
int engine_swa_room_check(const kvt_engine *e, size_t pages)
{
    const struct slot_alloc *a = engine_slots_swa(&e->slots);
    struct rdx_sizes s;

    if (pages <= a->nfree)
        return 0;
    rdx_sizes(e->tree, &s);
    return a->in_group || pages - a->nfree > s.swa_evictable ? -ENOMEM : 0;
}

int engine_swa_room(kvt_engine *e, size_t pages)
{
    const struct slot_alloc *a = engine_slots_swa(&e->slots);

    /* A host tier that keeps what the device evicts (write_back) keeps the window too: the
     * nodes without a host copy are backed up, SWA layers and all, before theirs goes. */
    if (pages > a->nfree && tier_wants_evicted(e->below))
        tier_evict_storing(e->below, e->tree, rdx_swa_evict_backed_up, pages - a->nfree);
    if (pages > a->nfree)
        rdx_swa_evict(e->tree, pages - a->nfree);
    /* The SWA KV of nodes a transfer is moving waits for it: they are few and short. */
    if (pages > a->nfree && e->below && e->below->ops->busy(e->below)) {
        tier_settle(e->below);
        rdx_swa_evict(e->tree, pages - a->nfree);
    }
    return pages <= a->nfree ? 0 : -ENOMEM;
}

int kvt_swa_translate(const kvt_engine *e, const int32_t *slots, size_t n, int32_t *swa_slots)
{
    if (!e || !e->swa)
        return -EINVAL;
    return engine_slots_swa_translate(&e->slots, slots, n, swa_slots);
}

/* ---- requests ---- */

/* kv: the KV found in every tier, in pages, when more than the device match's. */
static void count_match(kvt_engine *e, const struct kvt_key *key, const struct rdx_swa_hit *h,
                        size_t kv)
{
    uint32_t ps = e->opts.page_size;

    e->count.match_calls++;
    e->count.match_query_tokens += key->len / ps * ps;
    e->count.match_hit_tokens += h->swa_pages * ps;
    e->swa->kv_hit_tokens += (kv > h->kv_pages ? kv : h->kv_pages) * ps;
}

/* What a match over both tiers would serve past the device's usable prefix, in pages; the
 * host part of it in *part (host_last its end) for a load-back. *kv (may be NULL) gets the
 * KV found in both tiers. */
static size_t host_part(kvt_engine *e, const struct kvt_key *key, struct rdx_hit *part, size_t *kv)
{
    struct rdx_swa_hit s;

    *part = (struct rdx_hit){0};
    if (kv)
        *kv = 0;
    if (!e->below || rdx_match_swa_tiers(e->tree, key, e->pages, e->below_pages, part, &s))
        return 0;
    if (kv)
        *kv = part->dev_pages + part->host_pages;
    if (s.swa_pages <= part->dev_pages)
        return 0;
    part->host_pages = s.swa_pages - part->dev_pages;
    part->host_last = s.swa_last;
    return part->host_pages;
}

int engine_swa_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct kvt_match *m)
{
    struct rdx_swa_hit h;
    struct rdx_hit part;
    size_t kv, host = host_part(e, key, &part, &kv);
    int rc = rdx_match_swa(e->tree, key, e->pages, &h);

    if (rc)
        return rc;
    count_match(e, key, &h, kv);
    if (slots)
        engine_slots_from_pages(&e->slots, e->pages, h.swa_pages, slots);
    *m = (struct kvt_match){.device_len = h.swa_pages * e->opts.page_size,
                            .last_node = h.swa_last,
                            .host_len = host * e->opts.page_size};
    return 0;
}

/* Of the n pages of the store's run after the match h (s: under the window), the prefix a
 * match may use: its last window has window copies below, or it runs up from the tree's part
 * whose own last window is there. *win: the pages of it read with their window. */
static size_t store_window(kvt_engine *e, const struct rdx_hit *h, const struct rdx_swa_hit *s,
                           size_t n, size_t *win)
{
    *win = 0;
    if (!n)
        return 0;
    return e->below->ops->window(e->below, n, s->swa_pages == h->dev_pages + h->host_pages, win);
}

size_t engine_swa_store_pages(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit,
                              size_t n, size_t *win)
{
    struct rdx_hit h;
    struct rdx_swa_hit s;

    *win = 0;
    if (!n || rdx_match_swa_tiers(e->tree, key, NULL, NULL, &h, &s) ||
        h.dev_pages + h.host_pages != hit->dev_pages + hit->host_pages)
        return 0;
    return store_window(e, &h, &s, n, win);
}

/* With a store below: bring the prefix of its run a match may use into the tree as host
 * copies (the window's pages whole, from their window copies), waiting as prefetch_policy
 * says. The pages fetched, or 0. */
static size_t swa_fetch(kvt_engine *e, const struct kvt_key *key)
{
    static const int wait_ms[] = {
        [KVT_PREFETCH_WAIT_COMPLETE] = -1, [KVT_PREFETCH_BEST_EFFORT] = 0};
    uint32_t policy = e->opts.prefetch_policy;
    struct rdx_hit hit, now;
    struct rdx_swa_hit s;
    size_t n, p, win;

    if (!e->store || rdx_match_swa_tiers(e->tree, key, NULL, NULL, &hit, &s) ||
        !(n = tier_find(e->below, key, &hit)) || !(p = store_window(e, &hit, &s, n, &win)))
        return 0;
    if (e->below->ops->fetch(e->below, key, &hit, p, win, NULL) &&
        !e->below->ops->fetching(e->below))
        return 0;
    e->below->ops->wait_fetches(e->below, policy == KVT_PREFETCH_TIMEOUT
                                              ? (int)e->opts.prefetch_timeout_ms
                                              : wait_ms[policy]);
    if (rdx_match_tiers(e->tree, key, NULL, NULL, &now) ||
        now.dev_pages + now.host_pages != hit.dev_pages + hit.host_pages + p)
        return 0; /* not landed (yet), or shorter */
    return p;
}

/* With a tier below: when a match over every tier serves more than the device's usable
 * prefix, fetch the store's part and load the host part up to it back (nodes whose host
 * copy holds the SWA layers come back holding SWA KV, the rest as tombstones), so that the
 * device match after this serves it. Best effort: a fetch or a load a tier declines leaves
 * the tree as it was. *op gets the load, *dev the device tokens before it (UINT64_MAX:
 * nothing loaded), *disk the tokens fetched from the store, *kv the KV pages found in the
 * tree. */
static void swa_restore(kvt_engine *e, const struct kvt_key *key, int32_t *row, uint64_t *op,
                        uint64_t *dev, uint64_t *disk, size_t *kv)
{
    struct rdx_hit part;
    size_t fetched = e->below ? swa_fetch(e, key) : 0;

    *op = 0;
    *dev = UINT64_MAX;
    *disk = (uint64_t)fetched * e->opts.page_size;
    if (!host_part(e, key, &part, kv)) {
        if (e->below)
            tier_matched(e->below, &(struct rdx_hit){.dev_last = part.dev_last}, 0);
        *disk = 0;
        return;
    }
    /* The tier's load moves this lock from the device prefix to the host part's end. */
    rdx_lock(e->tree, part.dev_last);
    if (e->below->ops->load(e->below, &part, e->below_pages,
                            row + part.dev_pages * e->opts.page_size, op)) {
        rdx_unlock(e->tree, part.dev_last);
        part.host_pages = 0;
        *op = 0;
        *disk = 0;
    } else {
        rdx_unlock(e->tree, part.host_last);
        *dev = (uint64_t)part.dev_pages * e->opts.page_size;
    }
    tier_matched(e->below, &part, *disk / e->opts.page_size);
}

int engine_swa_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                     struct kvt_req *req)
{
    struct rdx_swa_hit h;
    uint64_t span = 0, load, dev, disk;
    size_t kv;
    int rc;

    swa_restore(e, key, row, &load, &dev, &disk, &kv);
    if ((rc = rdx_match_swa(e->tree, key, e->pages, &h)) ||
        (rc = rdx_swa_lock(e->tree, h.swa_last, &span)))
        return rc;
    count_match(e, key, &h, kv);
    engine_slots_from_pages(&e->slots, e->pages, h.swa_pages, row);
    uint64_t len = h.swa_pages * e->opts.page_size;
    e->swa->row[idx] = (struct swa_row){span, len, h.kv_pages * e->opts.page_size};
    *req = (struct kvt_req){.pool_idx = idx,
                            .protected_len = len,
                            .last_node = h.swa_last,
                            .loaded_len = len > dev ? len - dev : 0,
                            /* what the store gave is the end of what was loaded */
                            .disk_len = len > dev ? (len - dev < disk ? len - dev : disk) : 0,
                            .load_op = load > h.pending ? load : h.pending, /* in order */
                            .gen = req_pool_gen(&e->reqs, idx)};
    if (e->below)
        e->below->ops->hit(e->below, h.swa_last);
    return 0;
}

uint64_t engine_swa_from(const kvt_engine *e, int32_t idx)
{
    return e->swa ? e->swa->row[idx].cursor : 0;
}

int engine_req_relock(kvt_engine *e, int32_t idx, kvt_node_ref from, kvt_node_ref to)
{
    uint64_t span;
    int rc;

    if (!e->swa) {
        if ((rc = rdx_lock(e->tree, to)))
            return rc;
        return to == from ? 0 : rdx_unlock(e->tree, from) ? -EUCLEAN : 0;
    }
    if ((rc = rdx_swa_lock(e->tree, to, &span)))
        return rc;
    if (rdx_swa_unlock(e->tree, from, e->swa->row[idx].span))
        return -EUCLEAN;
    e->swa->row[idx].span = span;
    return 0;
}

int engine_req_unlock(kvt_engine *e, int32_t idx, kvt_node_ref node)
{
    if (!e->swa)
        return rdx_unlock(e->tree, node);
    return rdx_swa_unlock(e->tree, node, e->swa->row[idx].span);
}

void engine_swa_cached(kvt_engine *e, int32_t idx, size_t protected_len)
{
    if (e->swa && e->swa->row[idx].cursor < protected_len)
        e->swa->row[idx].cursor = protected_len;
}

int kvt_req_swa_slide(kvt_engine *e, const struct kvt_req *req, size_t seq_len)
{
    if (!e || !e->swa || !req || !req_pool_live(&e->reqs, req->pool_idx, req->gen) ||
        seq_len > req_pool_filled(&e->reqs, req->pool_idx))
        return -EINVAL;
    struct swa_row *r = &e->swa->row[req->pool_idx];
    uint64_t to = swa_window_evict_to(seq_len, r->cursor, e->opts.swa.window, e->opts.page_size, 1);
    if (to <= r->cursor)
        return 0;
    const int32_t *row = req_pool_row(&e->reqs, req->pool_idx) + r->cursor;
    size_t n = (size_t)(to - r->cursor);
    /* Only the request's own slots: the cache's SWA KV is the cache's to free. */
    int rc = engine_slots_swa_slide(&e->slots, row, n);
    if (rc)
        return rc;
    e->swa->released_tokens += n;
    r->cursor = to;
    return 0;
}

/* ---- figures and checks ---- */

void engine_swa_stats(const kvt_engine *e, struct kvt_stats *st)
{
    const struct engine_swa *s = e->swa;
    struct rdx_sizes z;

    if (!s)
        return;
    rdx_sizes(e->tree, &z);
    st->swa_cached_tokens = z.swa_pages * e->opts.page_size;
    st->swa_kv_hit_tokens = s->kv_hit_tokens;
    st->swa_evicted_tokens = s->evicted_tokens;
    st->swa_released_tokens = s->released_tokens;
    st->swa_revived_tokens = s->revived_tokens;
}

int engine_swa_check(const kvt_engine *e, char *why, size_t len)
{
    struct rdx_sizes z;

    rdx_sizes(e->tree, &z);
    return engine_slots_swa_check(&e->slots, z.swa_pages, why, len);
}
