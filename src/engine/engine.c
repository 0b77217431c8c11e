/*
 * The engine's prefix cache over the device (engine.h): matching through the tiers below,
 * insert, eviction and room on the device, allocation, KV data, and requests. It calls down
 * into the slot layer (slots.h) for every slot and KV call, and into swa.c and mamba.c for
 * what hybrid models add.
 */
#include "engine/embeddings.h"
#include "engine/engine.h"
#include "engine/mamba.h"
#include "engine/mamba_tiers.h"
#include "engine/stats.h"
#include "engine/swa.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- prefix cache ---- */

/* A key the engine can read: tokens when it has any, at most max_context of them, a
 * namespace of bounded length (a bigram key's carries its first token too). Lookups and
 * inserts also need a non-empty key. */
static int check_key_form(const kvt_engine *e, const struct kvt_key *key)
{
    if (!e || !key || key->len > e->opts.max_context || (key->len && !key->tokens))
        return -EINVAL;
    return key->ns && key->ns_len > KVT_NS_MAX + (e->opts.key_bigram ? 4 : 0) ? -EINVAL : 0;
}

/* The key the tree sees for a caller's key: itself, or with bigram keys (options.key_bigram)
 * the pairs of its tokens. Pair i = (token i, token i + 1), so two keys agree on their first j
 * pairs exactly when they agree on their first token and on tokens 1..j: the tree gets tokens
 * 1.. as the key and the first token appended to the namespace, and the positions line up with
 * the slots. NULL for a caller's key that is not well formed. */
static const struct kvt_key *tree_key(kvt_engine *e, const struct kvt_key *key, struct kvt_key *out)
{
    if (!e || !e->opts.key_bigram)
        return key;
    if (!key || key->len > (size_t)e->opts.max_context + 1 || (key->len && !key->tokens) ||
        (key->ns && key->ns_len > KVT_NS_MAX))
        return NULL;
    if (key->len == 0) {
        *out = *key;
        return out;
    }
    size_t ns_len = key->ns ? key->ns_len : 0;
    if (ns_len)
        memcpy(e->bigram_ns, key->ns, ns_len);
    for (int i = 0; i < 4; i++)
        e->bigram_ns[ns_len + (size_t)i] = (uint8_t)(key->tokens[0] >> (8 * i));
    *out = (struct kvt_key){key->tokens + 1, key->len - 1, e->bigram_ns, ns_len + 4};
    return out;
}

static int check_key(const kvt_engine *e, const struct kvt_key *key)
{
    int rc = check_key_form(e, key);

    return rc ? rc : key->len ? 0 : -EINVAL;
}

/* What a match found below the tree, and what it brought up from there. */
struct below_part {
    size_t pages; /* the leading run the tiers below hold past the tree's part */
    size_t read;  /* pages by which the tree's part grew through fetching (fetch only) */
};

/* Bring what the tiers below hold of a hit into the tree as prefetch_policy says, then
 * match again. */
static int fetch_below(kvt_engine *e, const struct kvt_key *key, struct rdx_hit *hit,
                       struct below_part *bp)
{
    static const int wait_ms[] = {
        [KVT_PREFETCH_WAIT_COMPLETE] = -1, [KVT_PREFETCH_BEST_EFFORT] = 0};
    const struct tier_ops *ops = e->below->ops;
    size_t host = hit->host_pages;
    uint32_t policy = e->opts.prefetch_policy;

    /* Not started: too short, no room, or a fetch of it (kvt_prefetch) is under way. */
    if (ops->fetch(e->below, key, hit, bp->pages, 0, NULL) && !ops->fetching(e->below))
        return 0;
    ops->wait_fetches(e->below, policy == KVT_PREFETCH_TIMEOUT ? (int)e->opts.prefetch_timeout_ms
                                                               : wait_ms[policy]);
    int rc = rdx_match_tiers(e->tree, key, e->pages, e->below_pages, hit);
    if (rc == 0 && hit->host_pages > host)
        bp->read = hit->host_pages - host;
    return rc;
}

/* Match without validation; slots may be NULL. The pages of the hit's part below the device
 * go to e->below_pages. With fetch, what the tiers below hold past the tree is brought up
 * first (kvt_req_begin). */
static int match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct rdx_hit *hit,
                 bool fetch, struct below_part *bp)
{
    uint32_t ps = e->opts.page_size;
    int rc = rdx_match_tiers(e->tree, key, e->pages, e->below ? e->below_pages : NULL, hit);

    *bp = (struct below_part){0};
    if (rc == 0 && (bp->pages = tier_find(e->below, key, hit)) && fetch)
        rc = fetch_below(e, key, hit, bp);
    if (rc)
        return rc;
    if (slots)
        engine_slots_from_pages(&e->slots, e->pages, hit->dev_pages, slots);
    e->count.match_calls++;
    e->count.match_query_tokens += key->len / ps * ps;
    e->count.match_hit_tokens += hit->dev_pages * ps;
    tier_matched(e->below, hit, bp->pages);
    if (e->below)
        e->below->ops->hit(e->below, hit->dev_last);
    return 0;
}

/* The op a device prefix waits for: the highest load still filling it. */
static uint64_t load_to_wait(const kvt_engine *e, uint64_t pending)
{
    return e->below ? e->below->ops->pending_load(e->below, pending) : 0;
}

/* A failure that stops the engine (sticky): a transfer the device failed. */
static int failed(const kvt_engine *e)
{
    return tier_failed(e->below);
}

int kvt_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct kvt_match *m)
{
    struct rdx_hit hit;
    struct kvt_key tk;
    int rc = (key = tree_key(e, key, &tk)) ? check_key(e, key) : -EINVAL;

    if (rc || !m)
        return rc ? rc : -EINVAL;
    if ((rc = failed(e)))
        return rc;
    if (e->mamba)
        return engine_mamba_match(e, key, slots, m);
    if (e->swa)
        return engine_swa_match(e, key, slots, m);
    struct below_part bp;
    if ((rc = match(e, key, slots, &hit, false, &bp)))
        return rc;
    m->device_len = hit.dev_pages * e->opts.page_size;
    m->last_node = hit.dev_last;
    m->host_len = hit.host_pages * e->opts.page_size;
    m->disk_len = bp.pages * e->opts.page_size;
    m->load_op = load_to_wait(e, hit.pending);
    return 0;
}

int kvt_prefetch(kvt_engine *e, const struct kvt_key *key, size_t *tokens)
{
    struct rdx_hit hit;
    struct kvt_key tk;
    size_t n = 0, reading = 0;
    int rc = (key = tree_key(e, key, &tk)) ? check_key(e, key) : -EINVAL;

    if (rc)
        return rc;
    if ((rc = failed(e)))
        return rc;
    /* What the store has on its way, not what it held a moment before: a full store may
     * evict pages between the lookup and the read. */
    size_t win = 0;
    if (e->below && (rc = rdx_match_tiers(e->tree, key, NULL, NULL, &hit)) == 0 &&
        (n = tier_find(e->below, key, &hit)) &&
        (!e->mamba || (n = engine_mamba_prefetch_pages(e, key, &hit, n))) &&
        (!e->swa || (n = engine_swa_store_pages(e, key, &hit, n, &win))))
        e->below->ops->fetch(e->below, key, &hit, n, win, &reading);
    if (tokens)
        *tokens = reading * e->opts.page_size;
    return rc;
}

/* The tree's insert: with sliding-window layers, the pages before swa_from (whose SWA KV the
 * request freed already) come as SWA tombstones. */
static int tree_insert(kvt_engine *e, const struct kvt_key *key, int32_t prio, uint64_t swa_from,
                       size_t *got, kvt_node_ref *last)
{
    if (e->swa)
        return rdx_insert_swa(e->tree, key, e->pages, prio, swa_from, got, last);
    return rdx_insert_ref(e->tree, key, e->pages, prio, got, last);
}

/* Insert a validated key: the pages past the cached prefix must be the caller's, and pass to
 * the tree only if the insert succeeds. *lastp (may be NULL) gets the node ending the key;
 * swa_from as tree_insert. */
static int insert(kvt_engine *e, const struct kvt_key *key, const int32_t *slots, int32_t prio,
                  size_t *prefix_len, kvt_node_ref *lastp, uint64_t swa_from)
{
    uint32_t ps = e->opts.page_size;
    size_t np = key->len / ps, cached, got = 0;
    int rc;

    if (key->len % ps || !slots)
        return -EINVAL;
    if ((rc = engine_slots_pages_of(&e->slots, slots, key->len, e->pages)))
        return rc;
    cached = rdx_cached_pages(e->tree, key);
    if ((rc = engine_slots_claim(&e->slots, e->pages + cached, np - cached)))
        return rc;
    kvt_node_ref last = 0;
    rc = tree_insert(e, key, prio, swa_from < key->len ? swa_from : key->len, &got, &last);
    if (rc == -EBUSY && e->below) {
        /* The key runs into a fetch from below that has not landed: let it land. */
        e->below->ops->wait_fetches(e->below, -1);
        rc = rdx_insert_ref(e->tree, key, e->pages, prio, &got, &last);
    }
    if (rc == 0 && got != cached)
        rc = -EUCLEAN; /* cannot happen: the two walks see the same tree */
    if (rc) {
        engine_slots_unclaim(&e->slots, e->pages + cached, np - cached);
        return rc;
    }
    e->count.inserted_tokens += (np - cached) * ps;
    *prefix_len = cached * ps;
    if (np && e->below)
        e->below->ops->inserted(e->below, last);
    if (lastp)
        *lastp = last;
    return 0;
}

int kvt_insert(kvt_engine *e, const struct kvt_key *key, const int32_t *slots, int32_t priority,
               size_t *prefix_len)
{
    struct kvt_key tk;
    int rc = (key = tree_key(e, key, &tk)) ? check_key(e, key) : -EINVAL;

    if (rc || !prefix_len)
        return rc ? rc : -EINVAL;
    return insert(e, key, slots, priority, prefix_len, NULL, 0);
}

int kvt_lock(kvt_engine *e, kvt_node_ref node)
{
    return e ? rdx_lock(e->tree, node) : -EINVAL;
}

int kvt_unlock(kvt_engine *e, kvt_node_ref node)
{
    return e ? rdx_unlock(e->tree, node) : -EINVAL;
}

int kvt_evict(kvt_engine *e, size_t tokens, size_t *evicted)
{
    size_t pages;

    if (!e)
        return -EINVAL;
    pages = tokens / e->opts.page_size + (tokens % e->opts.page_size != 0);
    if (e->swa) {
        /* kvt_available is to grow by pages: each side evicts for its own shortfall, the
         * SWA side its SWA KV alone. */
        size_t full = engine_slots_full(&e->slots)->nfree, swa = engine_slots_swa(&e->slots)->nfree;
        size_t want = (full < swa ? full : swa) + pages;
        pages = full < want ? engine_evict(e, want - full) : 0;
        (void)engine_swa_room(e, want);
    } else {
        pages = engine_evict(e, pages);
    }
    if (evicted)
        *evicted = pages * e->opts.page_size;
    return 0;
}

/* ---- eviction and room on the device ---- */

size_t engine_evict(kvt_engine *e, size_t pages)
{
    size_t done = 0;

    tier_poll(e->below, SIZE_MAX);
    /* A tier below that keeps what the device evicts (write_back) stores it first. */
    if (tier_wants_evicted(e->below))
        done = tier_evict_storing(e->below, e->tree, rdx_evict_backed_up, pages);
    if (done < pages)
        done += rdx_evict(e->tree, pages - done);
    /* Nodes a transfer is filling cannot give up their device copy yet: wait for the ops
     * in flight (they are few and short), apply them and try again. */
    if (done < pages && e->below && e->below->ops->busy(e->below)) {
        tier_settle(e->below); /* not the disk's writes: they hold no device page */
        done += rdx_evict(e->tree, pages - done);
    }
    return done;
}

/* Eviction frees every unlocked device page, waiting for transfers where it must, so what is
 * evictable now says whether it can meet the need; inside a free group the pages it frees
 * are held back, so there it cannot. Deciding first means a call that fails evicted nothing. */
int engine_room_for(kvt_engine *e, size_t pages)
{
    return engine_room_split(e, pages, pages);
}

int engine_room_split(kvt_engine *e, size_t pages, size_t swa_pages)
{
    const struct slot_alloc *a = engine_slots_full(&e->slots);
    struct rdx_sizes s;
    size_t nfree = a->nfree;

    if (e->swa && engine_swa_room_check(e, swa_pages))
        return -ENOMEM;
    if (pages > nfree) {
        rdx_sizes(e->tree, &s);
        if (a->in_group || pages - nfree > s.evictable_pages)
            return -ENOMEM;
        engine_evict(e, pages - nfree);
        if (pages > a->nfree)
            return -ENOMEM;
    }
    /* Full KV evicted took its SWA KV along; what the SWA side still lacks goes alone. */
    return e->swa ? engine_swa_room(e, swa_pages) : 0;
}

/* ---- completions ---- */

int kvt_poll(kvt_engine *e, size_t max, size_t *applied)
{
    size_t n;

    if (!e)
        return -EINVAL;
    n = tier_poll(e->below, max ? max : SIZE_MAX);
    if (applied)
        *applied = n;
    engine_emb_poll(e);
    engine_publish(e);
    return failed(e);
}

int kvt_sync(kvt_engine *e)
{
    if (!e)
        return -EINVAL;
    engine_emb_sync(e);
    tier_sync(e->below);
    tier_poll(e->below, SIZE_MAX);
    engine_publish(e);
    return failed(e);
}

int kvt_load_wait_layer(kvt_engine *e, uint64_t op, uint32_t layer, void *stream)
{
    if (!e || layer >= e->opts.geometry.layers || (op && !e->below))
        return -EINVAL;
    return op ? e->below->ops->wait_layer(e->below, op, layer, stream) : 0;
}

/* ---- allocator ---- */

int kvt_alloc(kvt_engine *e, size_t n, int32_t *slots)
{
    return e ? engine_slots_alloc(&e->slots, n, slots) : -EINVAL;
}

int kvt_free(kvt_engine *e, const int32_t *slots, size_t n)
{
    return e ? engine_slots_free(&e->slots, slots, n) : -EINVAL;
}

int kvt_free_group_begin(kvt_engine *e)
{
    return e ? engine_slots_group(&e->slots, 1) : -EINVAL;
}

int kvt_free_group_end(kvt_engine *e)
{
    return e ? engine_slots_group(&e->slots, 0) : -EINVAL;
}

static int check_seq_lens(const kvt_engine *e, size_t batch, const uint32_t *seq_lens)
{
    for (size_t i = 0; seq_lens && i < batch; i++)
        if (seq_lens[i] > e->opts.max_context)
            return -EINVAL;
    return 0;
}

/* An allocation short of free pages evicts device leaves (backed-up nodes keep their host
 * copy) for exactly the shortfall, and only when eviction can cover it; otherwise it is
 * -ENOMEM with nothing evicted. */
int kvt_alloc_extend(kvt_engine *e, size_t batch, const uint32_t *prefix_lens,
                     const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                     size_t out_len)
{
    size_t need;
    int rc;

    if (!e || check_seq_lens(e, batch, seq_lens))
        return -EINVAL;
    rc = engine_slots_extend_check(&e->slots, batch, prefix_lens, seq_lens, last_locs, out, out_len,
                                   &need);
    if (rc || (rc = engine_room_for(e, need)))
        return rc;
    engine_slots_extend_take(&e->slots, batch, prefix_lens, seq_lens, last_locs, out, out_len);
    return 0;
}

int kvt_alloc_decode(kvt_engine *e, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, int32_t *out)
{
    size_t need;
    int rc;

    if (!e || check_seq_lens(e, batch, seq_lens))
        return -EINVAL;
    rc = engine_slots_decode_check(&e->slots, batch, seq_lens, last_locs, out, &need);
    if (rc || (rc = engine_room_for(e, need)))
        return rc;
    engine_slots_decode_take(&e->slots, batch, seq_lens, last_locs, out);
    return 0;
}

size_t kvt_available(const kvt_engine *e)
{
    return e ? engine_slots_available(&e->slots) : 0;
}

/* ---- KV data ---- */

int kvt_kv_write(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, const void *k,
                 const void *v)
{
    return e ? engine_slots_kv_write(&e->slots, layer, slots, n, k, v) : -EINVAL;
}

int kvt_kv_read(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, void *k, void *v)
{
    return e ? engine_slots_kv_read(&e->slots, layer, slots, n, k, v) : -EINVAL;
}

int kvt_kv_buffer(kvt_engine *e, uint32_t layer, int which, void **ptr, size_t *row_bytes)
{
    const struct kv_pool *p;
    uint32_t index;

    if (!e || !ptr || !row_bytes || which < 0 || which > 1 ||
        !(p = engine_slots_kv_pool(&e->slots, layer, &index)) || !p->buf[which])
        return -EINVAL;
    *ptr = p->buf[which][index];
    *row_bytes = p->row_bytes[which];
    return 0;
}

/* ---- requests ---- */

int kvt_req_begin(kvt_engine *e, const struct kvt_key *key, struct kvt_req *req)
{
    struct rdx_hit hit;
    uint32_t ps;
    int32_t idx, *row;
    struct kvt_key tk;
    /* An empty key takes a slot and matches nothing. */
    int rc = (key = tree_key(e, key, &tk)) ? check_key_form(e, key) : -EINVAL;

    if (rc || !req)
        return rc ? rc : -EINVAL;
    if ((rc = failed(e)))
        return rc;
    if ((rc = req_pool_alloc(&e->reqs, &idx)))
        return rc;
    ps = e->opts.page_size;
    row = e->reqs.map + (size_t)idx * e->reqs.max_context;
    if (e->mamba || e->swa) {
        rc = e->mamba ? engine_mamba_begin(e, idx, key, row, req)
                      : engine_swa_begin(e, idx, key, row, req);
        if (rc) {
            req_pool_free(&e->reqs, idx);
            return rc;
        }
        e->reqs.filled[idx] = (uint32_t)req->protected_len;
        req->load_op = load_to_wait(e, req->load_op); /* a state's KV may be landing */
        return 0;
    }
    /* The match writes its slots straight into the request's row. */
    struct below_part bp;
    rc = match(e, key, row, &hit, true, &bp);
    if (rc == 0)
        rc = rdx_lock(e->tree, hit.dev_last);
    if (rc) {
        req_pool_free(&e->reqs, idx);
        return rc;
    }
    *req = (struct kvt_req){.pool_idx = idx,
                            .protected_len = hit.dev_pages * ps,
                            .last_node = hit.dev_last,
                            .load_op = load_to_wait(e, hit.pending),
                            .gen = req_pool_gen(&e->reqs, idx)};
    uint64_t op = 0;
    if (e->below &&
        e->below->ops->load(e->below, &hit, e->below_pages, row + req->protected_len, &op) == 0) {
        req->loaded_len = hit.host_pages * ps;
        req->protected_len += req->loaded_len;
        req->last_node = hit.host_last;
        req->load_op = op; /* loads finish in order: waiting for it covers the prefix too */
        req->disk_len = bp.read * ps;
    }
    e->reqs.filled[idx] = (uint32_t)req->protected_len;
    return 0;
}

/* A request handle names its slot's current holder: a copy kept past the finish of its
 * request must not act on the next request the slot serves. */
static bool req_live(const kvt_engine *e, const struct kvt_req *req)
{
    return e && req && req_pool_live(&e->reqs, req->pool_idx, req->gen);
}

int kvt_req_write(kvt_engine *e, const struct kvt_req *req, size_t start, const int32_t *slots,
                  size_t n)
{
    if (!req_live(e, req))
        return -EINVAL;
    return req_pool_write(&e->reqs, req->pool_idx, start, slots, n);
}

int kvt_req_read(const kvt_engine *e, const struct kvt_req *req, size_t start, size_t n,
                 int32_t *out)
{
    if (!req_live(e, req))
        return -EINVAL;
    return req_pool_read(&e->reqs, req->pool_idx, start, n, out);
}

size_t kvt_req_available(const kvt_engine *e)
{
    return e ? e->reqs.nfree : 0;
}

/* A request the caller hands back must be live, its key must cover the protected prefix and
 * stay within what its row holds, and the row's slots past the protected prefix (up to the
 * key's end, or with whole_row all it holds) must be the caller's; then nothing below can
 * fail halfway. A key of exactly the protected prefix (even empty) is fine: it releases a
 * request that allocated nothing. */
static int check_req(kvt_engine *e, const struct kvt_req *req, const struct kvt_key *key,
                     bool whole_row)
{
    const int32_t *row;
    size_t filled;

    if (!req_live(e, req) || check_key_form(e, key))
        return -EINVAL;
    filled = req_pool_filled(&e->reqs, req->pool_idx);
    if (key->len < req->protected_len || key->len > filled ||
        req->protected_len % e->opts.page_size || rdx_is_locked(e->tree, req->last_node) != 1)
        return -EINVAL;
    row = req_pool_row(&e->reqs, req->pool_idx);
    return engine_slots_row_held(&e->slots, row + req->protected_len,
                                 (whole_row ? filled : key->len) - req->protected_len, e->pages);
}

/* The part of key a request inserts: its whole pages, or with recurrent layers the part up
 * to the checkpoint it recorded (none: only the protected prefix, nothing new). */
static struct kvt_key cache_key(const kvt_engine *e, const struct kvt_req *req,
                                const struct kvt_key *key)
{
    struct kvt_key k = *key;

    if (e->mamba)
        k.len = engine_mamba_cache_len(e, req->pool_idx, req->protected_len, key->len);
    else
        k.len = key->len / e->opts.page_size * e->opts.page_size;
    return k;
}

int kvt_req_cache_unfinished(kvt_engine *e, struct kvt_req *req, const struct kvt_key *key)
{
    kvt_node_ref last;
    size_t cached = 0;
    struct kvt_key tk;
    int rc = (key = tree_key(e, key, &tk)) ? check_req(e, req, key, false) : -EINVAL;

    if (rc)
        return rc;
    struct kvt_key k = cache_key(e, req, key);
    if (k.len <= req->protected_len)
        return 0;
    /* The checkpoint the cache takes is replaced by a fresh track slot: have one first. */
    if (e->mamba && (rc = engine_mamba_room(e, 1)))
        return rc;
    int32_t *row = e->reqs.map + (size_t)req->pool_idx * e->reqs.max_context;
    if ((rc = insert(e, &k, row, 0, &cached, NULL, engine_swa_from(e, req->pool_idx))))
        return rc;
    engine_slots_free(&e->slots, row + req->protected_len, cached - req->protected_len);
    /* Point the row at the cached slots: ours for the part the tree already had are free
     * now. The insert left the key ending on a node, so this match cannot split and cannot
     * fail; it is bookkeeping, not a lookup, and is not counted. */
    struct rdx_hit hit;
    if ((rc = rdx_match_tiers(e->tree, &k, e->pages, NULL, &hit)))
        return rc;
    if (hit.dev_pages * e->opts.page_size != k.len)
        return -EUCLEAN;
    last = hit.dev_last;
    engine_slots_from_pages(&e->slots, e->pages, hit.dev_pages, row);
    /* The cached pages may be another request's load still landing. */
    uint64_t wait = load_to_wait(e, hit.pending);
    if (wait > req->load_op)
        req->load_op = wait;
    if ((rc = engine_req_relock(e, req->pool_idx, req->last_node, last)))
        return rc;
    req->last_node = last;
    req->protected_len = k.len;
    engine_swa_cached(e, req->pool_idx, k.len);
    return e->mamba ? engine_mamba_cached(e, req->pool_idx, last, 0) : 0;
}

int kvt_req_cache_finished(kvt_engine *e, struct kvt_req *req, const struct kvt_key *key,
                           int32_t priority, int insert_pages)
{
    kvt_node_ref last = 0;
    size_t cached;
    struct kvt_key tk;
    int rc = (key = tree_key(e, key, &tk)) ? check_req(e, req, key, true) : -EINVAL;

    if (rc)
        return rc;
    struct kvt_key k = cache_key(e, req, key);
    const int32_t *row = req_pool_row(&e->reqs, req->pool_idx);
    size_t filled = req_pool_filled(&e->reqs, req->pool_idx);
    cached = k.len; /* without an insert, every page past the protected prefix goes */
    if (insert_pages && k.len > req->protected_len &&
        (rc = insert(e, &k, row, priority, &cached, &last, engine_swa_from(e, req->pool_idx))))
        return rc;
    /* Duplicates of what the tree had (or everything, without insert), then the rest of the
     * row: the key's partial tail page and slots past the key (allocated, not committed). */
    engine_slots_free(&e->slots, row + req->protected_len, cached - req->protected_len);
    engine_slots_free(&e->slots, row + k.len, filled - k.len);
    if (engine_req_unlock(e, req->pool_idx, req->last_node))
        rc = -EUCLEAN;
    if (e->mamba && rc == 0)
        rc = engine_mamba_cached(e, req->pool_idx, last, 1);
    req_pool_free(&e->reqs, req->pool_idx);
    req->pool_idx = -1;
    req->protected_len = 0;
    req->last_node = 0;
    req->gen = 0;
    return rc;
}
