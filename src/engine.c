/*
 * The engine: the one place where the prefix cache and the device tier meet. Every public
 * call validates all of its input before it changes anything, so a rejected call leaves the
 * engine as it was.
 */
#include "engine.h"
#include "stats_server.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- options ---- */

static void option_defaults(struct kvt_options *o)
{
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
    o->page_size = 16;
    o->backend = KVT_BACKEND_AUTO;
    o->max_requests = 256;
    o->max_context = 32768;
    o->evict_policy = KVT_EVICT_LRU;
    o->hash_pages = 1;
    o->tp_size = 1;
    o->write_threshold = 2;
}

/* size is the caller's sizeof: an older caller's struct is shorter and gets the defaults of
 * its own fields only; a newer caller's is longer and gets zeros past ours, which kvt_open
 * then checks are still zero. */
void kvt_options_init(struct kvt_options *o, size_t size)
{
    struct kvt_options d;

    if (!o || size < sizeof(o->size))
        return;
    option_defaults(&d);
    if (size > sizeof(d))
        memset((uint8_t *)o + sizeof(d), 0, size - sizeof(d));
    memcpy(o, &d, size < sizeof(d) ? size : sizeof(d));
    o->size = size;
}

/* Every field of struct kvt_options, so a shorter struct is read field by field: a field past
 * the caller's size keeps its default, even one that sits in the older struct's tail padding. */
#define OPTION(f)                                                                                  \
    {                                                                                              \
        offsetof(struct kvt_options, f), sizeof(((struct kvt_options *)0)->f)                      \
    }
static const struct {
    size_t off, len;
} option_fields[] = {
    OPTION(geometry),        OPTION(page_size),
    OPTION(backend),         OPTION(device_tokens),
    OPTION(device_bytes),    OPTION(max_requests),
    OPTION(max_context),     OPTION(evict_policy),
    OPTION(hash_pages),      OPTION(model_id),
    OPTION(tp_rank),         OPTION(tp_size),
    OPTION(host_tokens),     OPTION(host_bytes),
    OPTION(host_ratio),      OPTION(host_layout),
    OPTION(write_policy),    OPTION(write_threshold),
    OPTION(load_back_min),   OPTION(io),
    OPTION(disk_dir),        OPTION(disk_bytes),
    OPTION(disk_io),         OPTION(disk_write_policy),
    OPTION(prefetch_policy), OPTION(prefetch_timeout_ms),
    OPTION(prefetch_min),    OPTION(stats_socket),
    OPTION(sim_serial),
};
#undef OPTION
_Static_assert(sizeof(struct kvt_options) - offsetof(struct kvt_options, sim_serial) -
                       sizeof(uint32_t) <
                   _Alignof(struct kvt_options),
               "a field added to struct kvt_options needs its row in option_fields");

/* Copy the caller's options over the defaults. Bytes past the struct this library knows must
 * be zero, so a newer caller's option is never silently ignored. */
static int copy_options(const struct kvt_options *in, struct kvt_options *o)
{
    if (!in || in->size < sizeof(in->size))
        return -EINVAL;
    for (size_t i = sizeof(*o); i < in->size; i++)
        if (((const uint8_t *)in)[i])
            return -EINVAL;
    option_defaults(o);
    for (size_t i = 0; i < sizeof(option_fields) / sizeof(option_fields[0]); i++)
        if (option_fields[i].off + option_fields[i].len <= in->size)
            memcpy((uint8_t *)o + option_fields[i].off, (const uint8_t *)in + option_fields[i].off,
                   option_fields[i].len);
    return 0;
}

static int check_options(const struct kvt_options *o)
{
    uint32_t ps = o->page_size;

    if (ps == 0 || (ps & (ps - 1)) || ps > KVT_PAGE_SIZE_MAX)
        return -EINVAL;
    if (o->backend > KVT_BACKEND_CUDA || o->evict_policy > KVT_EVICT_PRIORITY ||
        o->hash_pages > 1 || o->sim_serial > 1)
        return -EINVAL;
    if (o->tp_size == 0 || o->tp_rank >= o->tp_size)
        return -EINVAL;
    if (o->max_requests == 0 || o->max_context == 0 || o->max_requests > INT32_MAX ||
        o->max_context > INT32_MAX)
        return -EINVAL;
    if (kv_geometry_check(&o->geometry))
        return -EINVAL;
    return 0;
}

static int device_tokens(const struct kvt_options *o, uint64_t *tokens)
{
    uint64_t t = o->device_tokens;

    if (t == 0)
        t = kvt_max_tokens(&o->geometry, o->page_size, o->device_bytes);
    t = t / o->page_size * o->page_size;
    if (t == 0 || t / o->page_size >= INT32_MAX / o->page_size)
        return -EINVAL;
    *tokens = t;
    return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* SHA256 over everything that makes KV bytes interchangeable, in a fixed byte order. */
static int make_fingerprint(kvt_engine *e)
{
    const struct kvt_geometry *g = &e->opts.geometry;
    uint32_t v[] = {g->attention,
                    g->layers,
                    g->kv_heads,
                    g->head_dim,
                    g->v_head_dim ? g->v_head_dim : g->head_dim,
                    g->kv_lora_rank,
                    g->qk_rope_head_dim,
                    g->dtype_bytes,
                    e->opts.page_size,
                    e->opts.tp_rank,
                    e->opts.tp_size,
                    KVT_HASH_VERSION};
    uint8_t tail[sizeof(v)];
    struct page_hasher h;
    int rc = page_hasher_init(&h);

    if (rc)
        return rc;
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        put_u32(tail + 4 * i, v[i]);
    /* The model id is NUL-terminated in the input so "ab"+fields and "a"+"b..." differ. */
    rc = page_hasher_digest2(&h, e->model_id, strlen(e->model_id) + 1, tail, sizeof(tail),
                             e->fingerprint);
    page_hasher_finish(&h);
    return rc;
}

/* ---- open / close ---- */

static void release_cached_pages(void *ctx, const uint32_t *pages, size_t n)
{
    kvt_engine *e = ctx;

    slot_release_cached(&e->alloc, pages, n);
    e->count.evicted_tokens += n * e->opts.page_size;
}

static int open_tree(kvt_engine *e)
{
    struct rdx_config cfg = {
        .page_size = e->opts.page_size,
        .policy = e->opts.evict_policy,
        .hash_pages = (int)e->opts.hash_pages,
        .host_tier = e->has_host,
        .free_pages = release_cached_pages,
        .free_host_pages = tiers_release_host_pages,
        .ctx = e,
    };

    memcpy(cfg.fingerprint, e->fingerprint, KVT_HASH_LEN);
    return rdx_create(&cfg, &e->tree);
}

static int open_parts(kvt_engine *e)
{
    uint64_t tokens;
    int rc;

    if ((rc = device_tokens(&e->opts, &tokens)))
        return rc;
    if ((rc = dev_backend_select(e->opts.backend, &e->be)))
        return rc;
    if ((rc = make_fingerprint(e)))
        return rc;
    if ((rc = slot_alloc_init(&e->alloc, tokens, e->opts.page_size)))
        return rc;
    if ((rc = req_pool_init(&e->reqs, e->opts.max_requests, e->opts.max_context)))
        return rc;
    e->pages = malloc(((size_t)e->opts.max_context / e->opts.page_size + 1) * sizeof(uint32_t));
    if (!e->pages)
        return -ENOMEM;
    if ((rc = kv_pool_init(&e->kv, e->be, &e->opts.geometry, tokens + e->opts.page_size)))
        return rc;
    if ((rc = tiers_open(e, tokens)) || (rc = disk_open(e)) || (rc = open_tree(e)))
        return rc;
    if (e->opts.stats_socket && (rc = stats_server_start(e->opts.stats_socket, &e->stats)))
        return rc;
    engine_publish(e);
    return 0;
}

int kvt_open(const struct kvt_options *opts, kvt_engine **out)
{
    kvt_engine *e;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    if ((rc = copy_options(opts, &e->opts)) || (rc = check_options(&e->opts)))
        goto fail;
    e->model_id = strdup(e->opts.model_id ? e->opts.model_id : "");
    if (!e->model_id) {
        rc = -ENOMEM;
        goto fail;
    }
    e->opts.model_id = e->model_id;
    if ((rc = open_parts(e)))
        goto fail;
    *out = e;
    return 0;
fail:
    kvt_close(e);
    return rc;
}

void kvt_close(kvt_engine *e)
{
    if (!e)
        return;
    stats_server_stop(e->stats);
    /* Transfers and disk I/O land first, then the tree hands its pages back through the
     * allocators. */
    tiers_close(e);
    disk_close(e);
    rdx_destroy(e->tree);
    tiers_close_pool(e);
    if (e->be)
        kv_pool_finish(&e->kv);
    free(e->pages);
    req_pool_finish(&e->reqs);
    slot_alloc_finish(&e->alloc);
    free(e->model_id);
    free(e);
}

void kvt_fingerprint(const kvt_engine *e, uint8_t out[32])
{
    if (out && e)
        memcpy(out, e->fingerprint, KVT_HASH_LEN);
    else if (out)
        memset(out, 0, KVT_HASH_LEN);
}

#define KVT_STR_(x) #x
#define KVT_STR(x) KVT_STR_(x)

const char *kvt_version(int *major, int *minor, int *patch)
{
    if (major)
        *major = KVT_VERSION_MAJOR;
    if (minor)
        *minor = KVT_VERSION_MINOR;
    if (patch)
        *patch = KVT_VERSION_PATCH;
    return KVT_STR(KVT_VERSION_MAJOR) "." KVT_STR(KVT_VERSION_MINOR) "." KVT_STR(KVT_VERSION_PATCH);
}

const char *kvt_strerror(int err)
{
    if (err == INT_MIN)
        return "unknown error";
    if (err > 0)
        err = -err;
    switch (err) {
    case 0:
        return "success";
    case KVT_ENOBACKEND:
        return "backend not available (not built in, or no GPU visible)";
    case KVT_EBACKEND:
        return "the device backend reported a failure";
    case KVT_EHOSTRAM:
        return "the host pool does not fit in the memory available now";
    case KVT_EHOSTSIZE:
        return "the host pool must be larger than the device pool";
    case KVT_EFORMAT:
        return "not a kvtier data dir, or a format this build cannot read";
    case KVT_EFINGERPRINT:
        return "the data dir holds KV of another model, geometry or layout";
    case KVT_ECORRUPT:
        return "stored data failed its checks";
    default: {
        const char *s = strerrordesc_np(-err);
        return s ? s : "unknown error";
    }
    }
}

void engine_publish(kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    if (e->stats && kvt_stats(e, &st) == 0)
        stats_server_publish(e->stats, &st);
}

static void fill_stats(const kvt_engine *e, struct kvt_stats *st)
{
    struct rdx_sizes s;
    uint32_t ps;

    ps = e->opts.page_size;
    rdx_sizes(e->tree, &s);
    memset(st, 0, sizeof(*st));
    st->size = sizeof(*st);
    st->backend = e->be->kind;
    st->page_size = ps;
    st->device_tokens = (uint64_t)e->alloc.npages * ps;
    st->device_free_tokens = slot_available(&e->alloc);
    st->kv_pool_bytes = kv_pool_bytes(&e->kv);
    st->cached_tokens = s.cached_pages * ps;
    st->evictable_tokens = s.evictable_pages * ps;
    st->protected_tokens = s.protected_pages * ps;
    st->nodes = s.nodes;
    st->tree_bytes = s.bytes;
    st->req_slots_free = e->reqs.nfree;
    st->match_calls = e->count.match_calls;
    st->match_query_tokens = e->count.match_query_tokens;
    st->match_hit_tokens = e->count.match_hit_tokens;
    st->inserted_tokens = e->count.inserted_tokens;
    st->evicted_tokens = e->count.evicted_tokens;
    tiers_stats(e, st);
    disk_stats(e, st);
}

/* An older caller's struct is shorter: it gets the fields it has. A newer caller's is longer:
 * the fields this library does not know are zeroed, and st->size says where ours end. */
int kvt_stats(const kvt_engine *e, struct kvt_stats *out)
{
    struct kvt_stats full;

    if (!e || !out || out->size < sizeof(out->size))
        return -EINVAL;
    size_t size = out->size;
    fill_stats(e, &full);
    if (size > sizeof(full))
        memset((uint8_t *)out + sizeof(full), 0, size - sizeof(full));
    full.size = size < sizeof(full) ? size : sizeof(full);
    memcpy(out, &full, full.size);
    return 0;
}

/* ---- prefix cache ---- */

/* A key the engine can read: tokens when it has any, at most max_context of them, a
 * namespace of bounded length. Lookups and inserts also need a non-empty key. */
static int check_key_form(const kvt_engine *e, const struct kvt_key *key)
{
    if (!e || !key || key->len > e->opts.max_context || (key->len && !key->tokens))
        return -EINVAL;
    return key->ns && key->ns_len > KVT_NS_MAX ? -EINVAL : 0;
}

static int check_key(const kvt_engine *e, const struct kvt_key *key)
{
    int rc = check_key_form(e, key);

    return rc ? rc : key->len ? 0 : -EINVAL;
}

static void pages_to_slots(const kvt_engine *e, const uint32_t *pages, size_t np, int32_t *slots)
{
    uint32_t ps = e->opts.page_size;

    for (size_t i = 0; i < np; i++)
        for (uint32_t j = 0; j < ps; j++)
            slots[i * ps + j] = (int32_t)(pages[i] * ps + j);
}

/* What a match found on disk past the host part, and what it read from there. */
struct disk_part {
    size_t pages; /* the leading run the disk index holds after the host part */
    size_t read;  /* pages by which the host part grew through reading (fetch only) */
};

/* Read the disk part of a hit to the host as prefetch_policy says, then match again. */
static int fetch_disk(kvt_engine *e, const struct kvt_key *key, struct rdx_hit *hit,
                      struct disk_part *dp)
{
    static const int wait_ms[] = {
        [KVT_PREFETCH_WAIT_COMPLETE] = -1, [KVT_PREFETCH_BEST_EFFORT] = 0};
    size_t host = hit->host_pages;
    uint32_t policy = e->opts.prefetch_policy;

    /* Not started: too short, no room, or a read of it (kvt_prefetch) is under way. */
    if (disk_fill(e, key, hit, dp->pages, NULL) && !disk_reading(e))
        return 0;
    disk_wait_reads(e, policy == KVT_PREFETCH_TIMEOUT ? (int)e->opts.prefetch_timeout_ms
                                                      : wait_ms[policy]);
    int rc = rdx_match_tiers(e->tree, key, e->pages, e->host_pages, hit);
    if (rc == 0 && hit->host_pages > host)
        dp->read = hit->host_pages - host;
    return rc;
}

/* Match without validation; slots may be NULL. The host pages of the hit go to
 * e->host_pages. With fetch, the disk part is read to the host first (kvt_req_begin). */
static int match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct rdx_hit *hit,
                 bool fetch, struct disk_part *dp)
{
    uint32_t ps = e->opts.page_size;
    int rc = rdx_match_tiers(e->tree, key, e->pages, e->has_host ? e->host_pages : NULL, hit);

    *dp = (struct disk_part){0};
    if (rc == 0 && e->disk && (dp->pages = disk_lookup(e, key, hit)) && fetch)
        rc = fetch_disk(e, key, hit, dp);
    if (rc)
        return rc;
    if (slots)
        pages_to_slots(e, e->pages, hit->dev_pages, slots);
    e->count.match_calls++;
    e->count.match_query_tokens += key->len / ps * ps;
    e->count.match_hit_tokens += hit->dev_pages * ps;
    e->count.host_hit_tokens += hit->host_pages * ps;
    e->count.disk_hit_tokens += dp->pages * ps;
    tiers_after_hit(e, hit->dev_last);
    return 0;
}

/* The op a device prefix waits for: the highest load still filling it. */
static uint64_t load_to_wait(const kvt_engine *e, uint64_t pending)
{
    return e->has_host && pending > xfer_done(e->xfer, XFER_LOAD) ? pending : 0;
}

int kvt_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct kvt_match *m)
{
    struct rdx_hit hit;
    int rc = check_key(e, key);

    if (rc || !m)
        return rc ? rc : -EINVAL;
    if (e->failed)
        return e->failed;
    struct disk_part dp;
    if ((rc = match(e, key, slots, &hit, false, &dp)))
        return rc;
    m->device_len = hit.dev_pages * e->opts.page_size;
    m->last_node = hit.dev_last;
    m->host_len = hit.host_pages * e->opts.page_size;
    m->disk_len = dp.pages * e->opts.page_size;
    m->load_op = load_to_wait(e, hit.pending);
    return 0;
}

int kvt_prefetch(kvt_engine *e, const struct kvt_key *key, size_t *tokens)
{
    struct rdx_hit hit;
    size_t n = 0, reading = 0;
    int rc = check_key(e, key);

    if (rc)
        return rc;
    if (e->failed)
        return e->failed;
    /* What the store has on its way, not what the index held a moment before: a full store
     * may evict pages between the lookup and the read. */
    if (e->disk && (rc = rdx_match_tiers(e->tree, key, NULL, NULL, &hit)) == 0 &&
        (n = disk_lookup(e, key, &hit)))
        disk_fill(e, key, &hit, n, &reading);
    if (tokens)
        *tokens = reading * e->opts.page_size;
    return rc;
}

/* Insert a validated key: the pages past the cached prefix must be the caller's, and pass to
 * the tree only if the insert succeeds. */
static int insert(kvt_engine *e, const struct kvt_key *key, const int32_t *slots, int32_t prio,
                  size_t *prefix_len)
{
    uint32_t ps = e->opts.page_size;
    size_t np = key->len / ps, cached, got = 0;
    int rc;

    if (key->len % ps || !slots)
        return -EINVAL;
    if ((rc = slot_pages_of(&e->alloc, slots, key->len, e->pages)))
        return rc;
    cached = rdx_cached_pages(e->tree, key);
    if ((rc = slot_claim(&e->alloc, e->pages + cached, np - cached)))
        return rc;
    kvt_node_ref last = 0;
    rc = rdx_insert_ref(e->tree, key, e->pages, prio, &got, &last);
    if (rc == -EBUSY && e->disk) {
        /* The key runs into a fill from disk that has not landed: let it land. */
        disk_sync(e);
        rc = rdx_insert_ref(e->tree, key, e->pages, prio, &got, &last);
    }
    if (rc == 0 && got != cached)
        rc = -EUCLEAN; /* cannot happen: the two walks see the same tree */
    if (rc) {
        slot_unclaim(&e->alloc, e->pages + cached, np - cached);
        return rc;
    }
    e->count.inserted_tokens += (np - cached) * ps;
    *prefix_len = cached * ps;
    if (np)
        tiers_after_insert(e, last);
    return 0;
}

int kvt_insert(kvt_engine *e, const struct kvt_key *key, const int32_t *slots, int32_t priority,
               size_t *prefix_len)
{
    int rc = check_key(e, key);

    if (rc || !prefix_len)
        return rc ? rc : -EINVAL;
    return insert(e, key, slots, priority, prefix_len);
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
    pages = tiers_evict(e, pages);
    if (evicted)
        *evicted = pages * e->opts.page_size;
    return 0;
}

/* ---- allocator ---- */

int kvt_alloc(kvt_engine *e, size_t n, int32_t *slots)
{
    return e ? slot_alloc(&e->alloc, n, slots) : -EINVAL;
}

int kvt_free(kvt_engine *e, const int32_t *slots, size_t n)
{
    return e ? slot_free(&e->alloc, slots, n) : -EINVAL;
}

int kvt_free_group_begin(kvt_engine *e)
{
    return e ? slot_free_group_begin(&e->alloc) : -EINVAL;
}

int kvt_free_group_end(kvt_engine *e)
{
    return e ? slot_free_group_end(&e->alloc) : -EINVAL;
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
    rc = slot_extend_check(&e->alloc, batch, prefix_lens, seq_lens, last_locs, out, out_len, &need);
    if (rc || (rc = tiers_room_for(e, need)))
        return rc;
    slot_extend_take(&e->alloc, batch, prefix_lens, seq_lens, last_locs, out);
    return 0;
}

int kvt_alloc_decode(kvt_engine *e, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, int32_t *out)
{
    size_t need;
    int rc;

    if (!e || check_seq_lens(e, batch, seq_lens))
        return -EINVAL;
    rc = slot_decode_check(&e->alloc, batch, seq_lens, last_locs, out, &need);
    if (rc || (rc = tiers_room_for(e, need)))
        return rc;
    slot_decode_take(&e->alloc, batch, seq_lens, last_locs, out);
    return 0;
}

size_t kvt_available(const kvt_engine *e)
{
    return e ? slot_available(&e->alloc) : 0;
}

/* ---- KV data ---- */

int kvt_kv_write(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, const void *k,
                 const void *v)
{
    return e ? kv_pool_write(&e->kv, layer, slots, n, k, v) : -EINVAL;
}

int kvt_kv_read(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, void *k, void *v)
{
    return e ? kv_pool_read(&e->kv, layer, slots, n, k, v) : -EINVAL;
}

int kvt_kv_buffer(kvt_engine *e, uint32_t layer, int which, void **ptr, size_t *row_bytes)
{
    if (!e || !ptr || !row_bytes || layer >= e->kv.geo.layers || which < 0 || which > 1 ||
        !e->kv.buf[which])
        return -EINVAL;
    *ptr = e->kv.buf[which][layer];
    *row_bytes = e->kv.row_bytes[which];
    return 0;
}

/* ---- requests ---- */

int kvt_req_begin(kvt_engine *e, const struct kvt_key *key, struct kvt_req *req)
{
    struct rdx_hit hit;
    uint32_t ps;
    int32_t idx, *row;
    int rc = check_key_form(e, key); /* an empty key takes a slot and matches nothing */

    if (rc || !req)
        return rc ? rc : -EINVAL;
    if (e->failed)
        return e->failed;
    if ((rc = req_pool_alloc(&e->reqs, &idx)))
        return rc;
    ps = e->opts.page_size;
    row = e->reqs.map + (size_t)idx * e->reqs.max_context;
    /* The match writes its slots straight into the request's row. */
    struct disk_part dp;
    rc = match(e, key, row, &hit, true, &dp);
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
    if (tiers_load_back(e, &hit, row + req->protected_len, &op) == 0) {
        req->loaded_len = hit.host_pages * ps;
        req->protected_len += req->loaded_len;
        req->last_node = hit.host_last;
        req->load_op = op; /* loads finish in order: waiting for it covers the prefix too */
        req->disk_len = dp.read * ps;
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
    return slot_row_held(&e->alloc, row + req->protected_len,
                         (whole_row ? filled : key->len) - req->protected_len, e->pages);
}

static struct kvt_key aligned_key(const kvt_engine *e, const struct kvt_key *key)
{
    struct kvt_key k = *key;

    k.len = key->len / e->opts.page_size * e->opts.page_size;
    return k;
}

int kvt_req_cache_unfinished(kvt_engine *e, struct kvt_req *req, const struct kvt_key *key)
{
    kvt_node_ref last;
    size_t cached = 0;
    int rc = check_req(e, req, key, false);

    if (rc)
        return rc;
    struct kvt_key k = aligned_key(e, key);
    int32_t *row = e->reqs.map + (size_t)req->pool_idx * e->reqs.max_context;
    if (k.len > req->protected_len) {
        if ((rc = insert(e, &k, row, 0, &cached)))
            return rc;
        slot_free(&e->alloc, row + req->protected_len, cached - req->protected_len);
        /* Point the row at the cached slots: ours for the part the tree already had are
         * free now. The insert left the key ending on a node, so this match cannot split
         * and cannot fail; it is bookkeeping, not a lookup, and is not counted. */
        struct rdx_hit hit;
        if ((rc = rdx_match_tiers(e->tree, &k, e->pages, NULL, &hit)))
            return rc;
        if (hit.dev_pages * e->opts.page_size != k.len)
            return -EUCLEAN;
        last = hit.dev_last;
        pages_to_slots(e, e->pages, hit.dev_pages, row);
        /* The cached pages may be another request's load still landing. */
        uint64_t wait = load_to_wait(e, hit.pending);
        if (wait > req->load_op)
            req->load_op = wait;
        rdx_lock(e->tree, last);
        rdx_unlock(e->tree, req->last_node);
        req->last_node = last;
        req->protected_len = k.len;
    }
    return 0;
}

int kvt_req_cache_finished(kvt_engine *e, struct kvt_req *req, const struct kvt_key *key,
                           int32_t priority, int insert_pages)
{
    size_t cached;
    int rc = check_req(e, req, key, true);

    if (rc)
        return rc;
    struct kvt_key k = aligned_key(e, key);
    const int32_t *row = req_pool_row(&e->reqs, req->pool_idx);
    size_t filled = req_pool_filled(&e->reqs, req->pool_idx);
    cached = k.len; /* without an insert, every page past the protected prefix goes */
    if (insert_pages && k.len > req->protected_len && (rc = insert(e, &k, row, priority, &cached)))
        return rc;
    /* Duplicates of what the tree had (or everything, without insert), then the rest of the
     * row: the key's partial tail page and slots past the key (allocated, not committed). */
    slot_free(&e->alloc, row + req->protected_len, cached - req->protected_len);
    slot_free(&e->alloc, row + k.len, filled - k.len);
    rdx_unlock(e->tree, req->last_node);
    req_pool_free(&e->reqs, req->pool_idx);
    req->pool_idx = -1;
    req->protected_len = 0;
    req->last_node = 0;
    req->gen = 0;
    return 0;
}

/* ---- invariants, for tests ---- */

/* How many nodes hold each page of one tier; pages outside [lo, hi] are errors. */
struct page_count {
    uint8_t *count;
    uint32_t lo, hi;
    int bad;
};

static void count_one(struct page_count *pc, uint32_t page)
{
    if (page < pc->lo || page > pc->hi || pc->count[page]++ != 0)
        pc->bad = 1;
}

struct owners {
    struct page_count dev, host;
};

static void count_device_page(void *ctx, uint32_t page)
{
    count_one(&((struct owners *)ctx)->dev, page);
}

static void count_host_page(void *ctx, uint32_t page)
{
    count_one(&((struct owners *)ctx)->host, page);
}

static int check_free_list(const struct slot_alloc *a, uint8_t *seen, char *why, size_t len)
{
    for (uint32_t i = 0; i < a->nfree; i++) {
        uint32_t p = a->ring[(a->head + i) % a->npages];
        if (p == 0 || p > a->npages || a->state[p] != PAGE_FREE || seen[p]++) {
            snprintf(why, len, "free list holds page %u that is not free or twice", p);
            return -EUCLEAN;
        }
    }
    return 0;
}

static int check_ownership(const kvt_engine *e, const struct page_count *oc, char *why, size_t len)
{
    const struct slot_alloc *a = &e->alloc;
    uint32_t nfree = 0;

    for (uint32_t p = 1; p <= a->npages; p++) {
        int cached = a->state[p] == PAGE_CACHED;
        if (cached != (oc->count[p] == 1)) {
            snprintf(why, len, "page %u: allocator state %d, held by %u nodes", p, a->state[p],
                     oc->count[p]);
            return -EUCLEAN;
        }
        nfree += a->state[p] == PAGE_FREE;
    }
    if (nfree != a->nfree) {
        snprintf(why, len, "%u pages free, free list holds %u", nfree, a->nfree);
        return -EUCLEAN;
    }
    return 0;
}

/* One walk of the tree counts the owners of every device and host page. */
int kvt_engine_check(const kvt_engine *e, char *why, size_t why_len)
{
    struct owners o = {.dev = {.lo = 1, .hi = e->alloc.npages},
                       .host = {.lo = 0, .hi = e->host.npages ? e->host.npages - 1 : 0}};
    struct rdx_page_visitor v = {.device = count_device_page, .ctx = &o};
    int rc = -ENOMEM;

    o.dev.count = calloc(e->alloc.npages + 1, 1);
    o.host.count = calloc(e->has_host ? e->host.npages : 1, 1);
    if (!o.dev.count || !o.host.count)
        goto out;
    if (e->has_host)
        v.host = count_host_page;
    rc = rdx_check(e->tree, &v, why, why_len);
    if (rc == 0 && (o.dev.bad || o.host.bad)) {
        snprintf(why, why_len, "a page is held by two nodes or is out of range");
        rc = -EUCLEAN;
    }
    if (rc == 0)
        rc = check_ownership(e, &o.dev, why, why_len);
    if (rc == 0) {
        memset(o.dev.count, 0, e->alloc.npages + 1);
        rc = check_free_list(&e->alloc, o.dev.count, why, why_len);
    }
    if (rc == 0)
        rc = tiers_check(e, o.host.count, why, why_len);
out:
    free(o.dev.count);
    free(o.host.count);
    return rc;
}
