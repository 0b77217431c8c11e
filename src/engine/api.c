/*
 * The public engine's front (engine.h): options, open and close, where the chain of tiers
 * below the device is built from the options, versions and errors (the figures: stats.c). Every
 * public call validates all of its input before it changes anything, so a rejected call leaves the
 * engine as it was.
 */
#include "engine/engine.h"
#include "engine/mamba.h"
#include "engine/mamba_tiers.h"
#include "engine/stats.h"
#include "engine/swa.h"
#include "emb/emb.h"
#include "host/host_tier.h"
#include "stats_server.h"
#include "disk/ops.h"
#include "disk/store.h"
#include "store/store_tier.h"
#include "store/chain.h"
#include "store/share.h"
#ifdef KVT_HAVE_REDIS
#include "store/redis/redis.h"
#endif

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
    o->mamba.chunk = 64;
    o->mamba.track_interval = 256;
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
    OPTION(geometry),
    OPTION(page_size),
    OPTION(backend),
    OPTION(device_tokens),
    OPTION(device_bytes),
    OPTION(max_requests),
    OPTION(max_context),
    OPTION(evict_policy),
    OPTION(hash_pages),
    OPTION(model_id),
    OPTION(tp_rank),
    OPTION(tp_size),
    OPTION(host_tokens),
    OPTION(host_bytes),
    OPTION(host_ratio),
    OPTION(host_layout),
    OPTION(write_policy),
    OPTION(write_threshold),
    OPTION(load_back_min),
    OPTION(io),
    OPTION(disk_dir),
    OPTION(disk_bytes),
    OPTION(disk_io),
    OPTION(disk_write_policy),
    OPTION(prefetch_policy),
    OPTION(prefetch_timeout_ms),
    OPTION(prefetch_min),
    OPTION(stats_socket),
    OPTION(sim_serial),
    OPTION(mamba),
    OPTION(swa),
    OPTION(key_bigram),
    OPTION(disk_sync),
    OPTION(disk_sync_ms),
    OPTION(disk_sync_bytes),
    OPTION(remote),
    OPTION(remote_timeout_ms),
    OPTION(remote_ttl_s),
    OPTION(mamba_host_states),
    OPTION(remote_tls_ca),
    OPTION(remote_tls_cert),
    OPTION(remote_tls_key),
    OPTION(store_page_tokens),
    OPTION(emb_device_bytes),
    OPTION(emb_host_bytes),
    OPTION(emb_store),
};
#undef OPTION
/* A store page's tokens are recorded in its disk page's head. */
_Static_assert(STORE_PAGE_TOKENS_MAX <= DSTORE_MAX_TOKENS, "a store page the disk cannot record");
_Static_assert(sizeof(struct kvt_options) - offsetof(struct kvt_options, emb_store) -
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
        o->hash_pages > 1 || o->sim_serial > 1 || o->key_bigram > 1)
        return -EINVAL;
    if (o->tp_size == 0 || o->tp_rank >= o->tp_size)
        return -EINVAL;
    if (o->max_requests == 0 || o->max_context == 0 || o->max_requests > INT32_MAX ||
        o->max_context > INT32_MAX)
        return -EINVAL;
    if (kv_geometry_check(&o->geometry))
        return -EINVAL;
    if (engine_mamba_check_options(o))
        return -EINVAL;
    /* A store page of several pages: whole pages, and only where a page's KV is all there is
     * to keep (a state or a window copy is kept per page). */
    if (o->store_page_tokens % ps || o->store_page_tokens > STORE_PAGE_TOKENS_MAX ||
        (store_pages(o) > 1 && (o->mamba.layers || o->swa.window)))
        return -EINVAL;
    if (o->emb_store > KVT_EMB_STORE_NONE ||
        (!o->emb_device_bytes && (o->emb_host_bytes || o->emb_store)))
        return -EINVAL;
    return engine_swa_check_options(o);
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
    /* Hybrid layers add their geometry (recurrent states; the window and which layers are
     * full attention); an engine without them hashes what earlier versions did, so their
     * data dirs stay valid. */
    const struct kvt_mamba *m = &e->opts.mamba;
    const struct kvt_swa *w = &e->opts.swa;
    uint32_t hybrid[] = {m->layers, (uint32_t)m->conv_bytes, (uint32_t)(m->conv_bytes >> 32),
                         (uint32_t)m->ssm_bytes, (uint32_t)(m->ssm_bytes >> 32)};
    size_t nv = sizeof(v) / sizeof(v[0]), nh = m->layers ? sizeof(hybrid) / sizeof(hybrid[0]) : 0;
    size_t nw = w->window ? 2 + (size_t)w->nfull : 0;
    /* So does a store page of several pages: its pages are named by the hash of their last
     * page, as a page of its own would be, so engines of either kind never share a name. */
    uint32_t spt = store_pages(&e->opts) > 1 ? e->opts.store_page_tokens : 0;
    size_t len = 4 * (nv + nh + nw + (spt != 0));
    uint8_t *tail = malloc(len);
    struct page_hasher h;
    int rc = tail ? page_hasher_init(&h) : -ENOMEM;

    if (rc) {
        free(tail);
        return rc;
    }
    for (size_t i = 0; i < nv; i++)
        put_u32(tail + 4 * i, v[i]);
    for (size_t i = 0; i < nh; i++)
        put_u32(tail + 4 * (nv + i), hybrid[i]);
    for (size_t i = 0; i < nw; i++)
        put_u32(tail + 4 * (nv + nh + i), i == 0   ? w->window
                                          : i == 1 ? w->nfull
                                                   : w->full_layers[i - 2]);
    if (spt)
        put_u32(tail + 4 * (nv + nh + nw), spt);
    /* The model id is NUL-terminated in the input so "ab"+fields and "a"+"b..." differ. */
    rc = page_hasher_digest2(&h, e->model_id, strlen(e->model_id) + 1, tail, len, e->fingerprint);
    free(tail);
    page_hasher_finish(&h);
    return rc;
}

/* ---- open / close ---- */

static void release_cached_pages(void *ctx, const uint32_t *pages, size_t n)
{
    kvt_engine *e = ctx;

    engine_slots_release(&e->slots, pages, n);
    e->count.evicted_tokens += n * e->opts.page_size;
}

/* The tree holds copies of the first tier below, and hands their pages back to it. */
static void release_below_pages(void *ctx, const uint32_t *pages, size_t n)
{
    kvt_engine *e = ctx;

    e->below->ops->release(e->below, pages, n);
}

static int open_tree(kvt_engine *e)
{
    struct rdx_config cfg = {
        .page_size = e->opts.page_size,
        .policy = e->opts.evict_policy,
        .hash_pages = (int)e->opts.hash_pages,
        .host_tier = e->below && e->below->ops->tree_pages(e->below) > 0,
        .free_pages = release_cached_pages,
        .free_host_pages = release_below_pages,
        .ctx = e,
    };

    int rc;

    memcpy(cfg.fingerprint, e->fingerprint, KVT_HASH_LEN);
    if (e->mamba &&
        (rc = engine_mamba_tree_config(e, &cfg, e->below ? host_tier_pool(e->below)->npages : 0,
                                       e->below ? host_memory_available() : 0)))
        return rc;
    if (e->swa)
        engine_swa_tree_config(e, &cfg);
    return rdx_create(&cfg, &e->tree);
}

/* What the device offers the tier below it: room for a load-back. */
static int room_up(void *ctx, size_t pages, size_t swa_pages)
{
    return engine_room_split(ctx, pages, swa_pages);
}

static size_t scratch_pages(const kvt_engine *e)
{
    return (size_t)e->opts.max_context / e->opts.page_size + 1;
}

/* The disk store the options name, over the host pool, which every read lands in and every
 * write comes from. */
static int open_disk(kvt_engine *e, const struct host_pool *hp, struct kvt_store **out)
{
    static const uint32_t io[] = {DSTORE_IO_AUTO, DSTORE_IO_URING, DSTORE_IO_PSYNC};
    struct dstore_options *so;

    free(e->disk_so); /* a second try (open_stores_compat) */
    so = e->disk_so = malloc(sizeof(*so));
    if (!so)
        return -ENOMEM;
    dstore_options_init(so, sizeof(*so));
    so->dir = e->opts.disk_dir;
    memcpy(so->fingerprint, e->fingerprint, DSTORE_FINGERPRINT_BYTES);
    so->page_bytes = (uint32_t)(hp->page_bytes * store_pages(&e->opts));
    so->page_tokens = (uint32_t)(e->opts.page_size * store_pages(&e->opts));
    so->stripes = DSTORE_STRIPES;
    if (e->opts.disk_bytes)
        so->disk_bytes = e->opts.disk_bytes;
    if (so->slab_bytes > so->disk_bytes)
        so->slab_bytes = so->disk_bytes; /* no slab file larger than the whole tier */
    so->io = io[e->opts.disk_io];
    so->sync =
        e->opts.disk_sync == KVT_DISK_SYNC_RELAXED ? DSTORE_SYNC_RELAXED : DSTORE_SYNC_DURABLE;
    so->sync_ms = e->opts.disk_sync_ms;
    so->sync_bytes = e->opts.disk_sync_bytes;
    so->register_base = hp->base;
    so->register_bytes = hp->bytes;
    return store_disk_open(so, out);
}

/* Below the host: the store given (e->store), or the disk store the options name, or none.
 * Until the store tier owns it, the store is the engine's to close. */
/* The remote store the options name, for pages of the host pool's size. */
static int open_remote(kvt_engine *e, const struct host_pool *hp, struct kvt_store **out)
{
#ifdef KVT_HAVE_REDIS
    char buf[1024];
    size_t group = store_pages(&e->opts);
    struct store_redis_options ro = {.page_bytes = (uint32_t)(hp->page_bytes * group),
                                     .page_tokens = (uint32_t)(e->opts.page_size * group),
                                     .connect_timeout_ms = e->opts.remote_timeout_ms,
                                     .read_timeout_ms = e->opts.remote_timeout_ms,
                                     .write_timeout_ms = e->opts.remote_timeout_ms,
                                     .ttl_s = e->opts.remote_ttl_s,
                                     .tls_ca = e->opts.remote_tls_ca,
                                     .tls_cert = e->opts.remote_tls_cert,
                                     .tls_key = e->opts.remote_tls_key};
    int rc = store_redis_parse_url(e->opts.remote, buf, sizeof(buf), &ro);

    if (rc)
        return rc;
    if (!ro.tls && (ro.tls_ca || ro.tls_cert || ro.tls_key))
        return -EINVAL; /* TLS files for a plain connection: a mistake, not a preference */
    if (!ro.connect_timeout_ms)
        ro.connect_timeout_ms = ro.read_timeout_ms = ro.write_timeout_ms = 1000;
    memcpy(ro.fingerprint, e->fingerprint, STORE_REDIS_FP_BYTES);
    return store_redis_open(&ro, out); /* it copies host and password */
#else
    (void)e;
    (void)hp;
    (void)out;
    return KVT_ENOBACKEND;
#endif
}

/* The stores the options name, nearest first: the disk store, the remote store, or a chain of
 * both. */
static int open_stores(kvt_engine *e, const struct host_pool *hp, struct kvt_store **out)
{
    struct kvt_store *s[2] = {NULL, NULL};
    int rc = 0, n = 0;

    if (e->opts.disk_dir && (rc = open_disk(e, hp, &s[n])) == 0)
        n++;
    if (rc == 0 && e->opts.remote && (rc = open_remote(e, hp, &s[n])) == 0)
        n++;
    if (rc == 0 && n == 2 && (rc = store_chain_open(s, 2, out)) == 0)
        return 0; /* the chain owns both */
    if (rc == 0) {
        *out = s[0];
        return 0;
    }
    for (int i = 0; i < n; i++)
        store_close(s[i]);
    return rc;
}

/* open_stores, and for a store page size chosen by bytes, a second try with pages of
 * page_size, which was the default before 0.9: a data dir written then keeps them, and its
 * fingerprint says so. The fingerprint names the page hashes too, and the tree that hashes
 * them is made after this. */
static int open_stores_compat(kvt_engine *e, const struct host_pool *hp)
{
    int rc = open_stores(e, hp, &e->store);

    if (rc != KVT_EFINGERPRINT || !e->store_page_auto || store_pages(&e->opts) == 1)
        return rc;
    e->opts.store_page_tokens = e->opts.page_size;
    if ((rc = make_fingerprint(e)))
        return rc;
    return open_stores(e, hp, &e->store);
}

/* The embedding cache (embeddings.c), over a view of the store below when it keeps
 * embeddings there (*store: the store tier's, then its own view; NULL: none). */
static int open_emb(kvt_engine *e, struct kvt_store **store)
{
    struct emb_config c = {.be = e->be,
                           .device_bytes = e->opts.emb_device_bytes,
                           .host_bytes = e->opts.emb_host_bytes};
    struct kvt_store *v[2];
    int rc;

    if (!e->opts.emb_device_bytes || e->emb)
        return 0;
    if (*store && e->opts.emb_store == KVT_EMB_STORE_ALL) {
        if ((rc = store_share_open(*store, 2, v)))
            return rc;
        *store = v[0];
        c.store = v[1];
    }
    return emb_open(&c, &e->emb);
}

static int open_store_tier(kvt_engine *e)
{
    struct tier *host = e->below;
    const struct host_pool *hp = host ? host_tier_pool(host) : NULL;
    size_t group;
    int rc;

    if (!e->store && !e->opts.disk_dir && !e->opts.remote)
        return 0;
    if ((rc = store_tier_check_options(&e->opts, host != NULL, hp ? hp->page_bytes : 0)) ||
        (!e->store && (rc = open_stores_compat(e, hp))))
        return rc;
    group = store_pages(&e->opts); /* as opened: open_stores_compat may have changed it */
    if (e->store->page_bytes != hp->page_bytes * group ||
        e->store->page_tokens != e->opts.page_size * group)
        return -EINVAL; /* a store given for pages of another size */
    if ((rc = open_emb(e, &e->store)))
        return rc;
    struct store_tier_config c = {&e->opts, &e->tree, scratch_pages(e)};
    if ((rc = store_tier_open(&c, e->store, host_tier_up(host), &e->bottom))) {
        e->store = NULL; /* closed by the failed open */
        return rc;
    }
    host->below = e->bottom;
    return 0;
}

/* The chain the options ask for: the host tier, then a store below it. */
static int open_tiers(kvt_engine *e, uint64_t device_tokens)
{
    struct host_tier_config hc = {.opts = &e->opts,
                                  .tree = &e->tree,
                                  .be = e->be,
                                  .device_tokens = device_tokens,
                                  .scratch_pages = scratch_pages(e)};
    struct tier_up up = {.ctx = e, .room = room_up};
    int rc;

    engine_slots_device(&e->slots, &hc.kv, &hc.alloc, &hc.swa, &hc.swa_pool);
    if ((rc = host_tier_open(&hc, up, &e->below)))
        return rc;
    if (e->opts.prefetch_timeout_ms == 0)
        e->opts.prefetch_timeout_ms = 100;
    return open_store_tier(e);
}

static int open_parts(kvt_engine *e)
{
    uint64_t tokens;
    int rc;

    /* The store page size, when left to kvt_open: only for stores of its own (a store
     * handed to engine_open has a page size already). */
    if (!e->store && (e->opts.disk_dir || e->opts.remote) && !e->opts.store_page_tokens) {
        e->store_page_auto = true;
        e->opts.store_page_tokens = store_page_tokens_of(&e->opts);
    }
    if ((rc = device_tokens(&e->opts, &tokens)) ||
        (rc = dev_backend_select(e->opts.backend, &e->be)) || (rc = make_fingerprint(e)) ||
        (rc = req_pool_init(&e->reqs, e->opts.max_requests, e->opts.max_context)))
        return rc;
    e->pages = malloc(scratch_pages(e) * sizeof(uint32_t));
    e->below_pages = malloc(scratch_pages(e) * sizeof(uint32_t));
    if (!e->pages || !e->below_pages)
        return -ENOMEM;
    /* The device's slots and KV: one allocator and pool, or the sliding-window pair. */
    if (e->opts.swa.window)
        rc = engine_swa_open(e, tokens);
    else
        rc = engine_slots_open(&e->slots, e->be, &e->opts.geometry, e->opts.page_size, tokens);
    struct kvt_store *none = NULL;
    if (rc || (e->opts.mamba.layers && (rc = engine_mamba_open(e))) ||
        (rc = open_tiers(e, tokens)) || (rc = open_emb(e, &none)) || (rc = open_tree(e)))
        return rc;
    if (e->opts.stats_socket && (rc = stats_server_start(e->opts.stats_socket, &e->stats)))
        return rc;
    engine_publish(e);
    return 0;
}

static void engine_free(kvt_engine *e);

int engine_open(const struct kvt_options *opts, struct kvt_store *store, kvt_engine **out)
{
    kvt_engine *e;
    int rc;

    if (!out) {
        store_close(store);
        return -EINVAL;
    }
    *out = NULL;
    e = calloc(1, sizeof(*e));
    if (!e) {
        store_close(store);
        return -ENOMEM;
    }
    e->store = store; /* the engine's from here on */
    if ((rc = copy_options(opts, &e->opts)) || (rc = check_options(&e->opts)) ||
        !(e->model_id = strdup(e->opts.model_id ? e->opts.model_id : ""))) {
        rc = rc ? rc : -ENOMEM;
        goto fail;
    }
    e->opts.model_id = e->model_id;
    if ((rc = open_parts(e)))
        goto fail;
    *out = e;
    return 0;
fail:
    engine_free(e);
    return rc;
}

int kvt_open(const struct kvt_options *opts, kvt_engine **out)
{
    return engine_open(opts, NULL, out);
}

void engine_disk_options(const kvt_engine *e, struct dstore_options *so)
{
    if (e->disk_so)
        *so = *e->disk_so;
    else
        dstore_options_init(so, sizeof(*so));
}

int engine_swap_store(kvt_engine *e, struct kvt_store *s)
{
    if (!e->bottom) {
        store_close(s);
        return -EINVAL;
    }
    store_tier_swap(e->bottom, s);
    e->store = s;
    return 0;
}

static void engine_free(kvt_engine *e)
{
    if (!e)
        return;
    stats_server_stop(e->stats);
    emb_close(e->emb); /* its ops land first; the store goes with the tier's view */
    /* Transfers and store I/O land first, then the tree hands its pages back through the
     * allocators, and only then do the tiers' memories go. */
    tier_stop_chain(e->below);
    rdx_destroy(e->tree);
    tier_close_chain(e->below);
    engine_mamba_close(e);
    engine_swa_close(e);
    if (!e->bottom)
        store_close(e->store); /* given to a failed open, never handed to a tier */
    engine_slots_close(&e->slots);
    free(e->pages);
    free(e->below_pages);
    req_pool_finish(&e->reqs);
    free(e->disk_so);
    free(e->model_id);
    free(e);
}

void kvt_close(kvt_engine *e)
{
    engine_free(e);
}

uint32_t kvt_store_page_tokens(const struct kvt_options *o)
{
    struct kvt_options full;

    if (copy_options(o, &full) || check_options(&full))
        return 0;
    return store_page_tokens_of(&full);
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
