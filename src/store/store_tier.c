/*
 * The store tier (store/store_tier.h): where the tree meets a store of pages by hash.
 *
 * Pages go down from their host copies (write-through once the backup lands, or when the host
 * evicts them) and come back into the host tier as fills: a host-only leaf the store reads
 * into, pending until the read is applied. The store is keyed by the chained page hashes, so
 * after a restart a match continues past the empty tree through the store's leading run.
 *
 * Every store op holds what it touches: a write marks its chain (disk_op) so the host copies
 * it reads stay, a fill is pending so nothing matches, extends or evicts it. Ops complete in
 * any order; poll applies them. Nothing here names a backend.
 */
#include "store/store_tier.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A store op in flight: a fill (read into a new host-only leaf), a write of a chain, or a
 * write of a recurrent state from a staging copy (OP_STATE: no node, no tag). */
struct store_op {
    uint64_t id;  /* the store's op id */
    uint64_t tag; /* the tree's mark: RDX_OP_DISK | a sequence number */
    kvt_node_ref node;
    uint32_t kind; /* enum store_op_kind, or OP_STATE */
    size_t n;
    int *results; /* n, written by the store */
    void *stage;  /* OP_STATE: the bytes being written, freed when it completes */
    size_t win;   /* a fill: its last win pages read with their window; a write: of its n
                   * pages, the last win are window copies of pages before them */
};

#define OP_STATE 2u

/* A state's pages are named apart from any page of KV (radix/hash.h, KVT_STATE_TAG); their
 * namespace root tells kvtier-ctl what they are. So are the window copies of pages whose
 * sliding-window layers the host kept (KVT_WINDOW_TAG). */
#define STATE_TAG KVT_STATE_TAG
#define WINDOW_TAG KVT_WINDOW_TAG

struct store_tier {
    struct tier base;
    const struct kvt_options *opts;
    struct rdx_tree *const *tree;
    struct kvt_store *store;
    struct store_op *ops; /* submitted and not yet applied, in no order */
    size_t nops, cap;
    uint64_t seq; /* the last tree tag handed out (RDX_OP_DISK | seq) */
    /* Scratch, one entry per page of the longest key. */
    uint8_t (*hashes)[KVT_HASH_LEN];
    struct page_hasher hasher; /* state keys */
    uint8_t state_ns[KVT_HASH_LEN];
    uint8_t window_ns[KVT_HASH_LEN];
    uint8_t (*wkeys)[KVT_HASH_LEN]; /* window keys of a fill's or a write's pages */
    uint32_t *fill_host;
    struct rdx_disk_page *dpages;
    struct store_wpage *wpages;
    struct store_rpage *rpages;
    /* Tokens, by the kind of store that found, read or kept them: near (this machine's
     * disk) and remote (store_ops.remote), so the stats count the remote tier apart. */
    struct {
        uint64_t hit, read, written;
    } count, remote;
};

static struct store_tier *st_of(const struct tier *t)
{
    return (struct store_tier *)t;
}

static struct rdx_tree *tree_of(const struct store_tier *s)
{
    return *s->tree;
}

/* ---- ops in flight ---- */

static int ops_reserve(struct store_tier *s)
{
    if (s->nops < s->cap)
        return 0;
    size_t ncap = s->cap ? s->cap * 2 : 16;
    struct store_op *v = realloc(s->ops, ncap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    s->ops = v;
    s->cap = ncap;
    return 0;
}

static struct store_op *find_id(const struct store_tier *s, uint64_t id)
{
    for (size_t i = 0; i < s->nops; i++)
        if (s->ops[i].id == id)
            return &s->ops[i];
    return NULL;
}

/* Pages from the top whose result is 0: what a fill keeps. */
static size_t leading_ok(const int *results, size_t n)
{
    size_t ok = 0;

    while (ok < n && results[ok] == 0)
        ok++;
    return ok;
}

static size_t count_ok(const int *results, size_t n)
{
    size_t ok = 0;

    for (size_t i = 0; i < n; i++)
        ok += results[i] == 0;
    return ok;
}

/* A completed op's pages read or kept, near (count) and remote: a chain says which were
 * which; any other store's are all of its kind. */
static void count_op(struct store_tier *s, const struct store_op *op, const struct store_done *d)
{
    uint32_t ps = s->opts->page_size;
    bool read = op->kind == STORE_OP_READ;
    size_t ok = read ? leading_ok(op->results, op->n) : count_ok(op->results, op->n - op->win);
    size_t near = d->split ? d->near_ok : s->store->ops->remote ? 0 : ok;
    size_t remote = d->split ? d->remote_ok : s->store->ops->remote ? ok : 0;

    *(read ? &s->count.read : &s->count.written) += near * ps;
    *(read ? &s->remote.read : &s->remote.written) += remote * ps;
}

/* Apply a completed op (d: what the store said of it) to the tree and forget it. The nodes
 * it names are held by its mark, so the refs are live: the tree calls cannot fail here. */
static void apply(struct store_tier *s, struct store_op *op, const struct store_done *d)
{
    if (op->kind == OP_STATE) {
        free(op->stage); /* a state not stored whole is a miss when read: nothing to undo */
    } else if (op->kind == STORE_OP_READ) {
        size_t ok = leading_ok(op->results, op->n);
        if (op->win)
            rdx_fill_done_window(tree_of(s), op->node, op->tag, ok, op->n - op->win);
        else
            rdx_fill_done(tree_of(s), op->node, op->tag, ok);
        count_op(s, op, d);
    } else {
        /* A window copy not kept is a window missing when read: nothing to record. */
        rdx_disk_done(tree_of(s), op->node, op->tag, op->results, op->n - op->win);
        count_op(s, op, d);
    }
    free(op->results);
    *op = s->ops[--s->nops];
}

static size_t store_tier_poll(struct tier *t, size_t max)
{
    struct store_tier *s = st_of(t);
    struct store_done d[16];
    size_t n, total = 0;

    while (total < max && (n = store_poll(s->store, d, max - total < 16 ? max - total : 16))) {
        for (size_t i = 0; i < n; i++) {
            struct store_op *op = find_id(s, d[i].op);

            if (op)
                apply(s, op, &d[i]);
        }
        total += n;
    }
    return total;
}

static int wait_one(struct store_tier *s, struct store_op *op, int timeout_ms)
{
    struct store_done d;
    int rc = store_wait_for(s->store, op->id, timeout_ms, &d);

    if (rc == 0)
        apply(s, op, &d);
    return rc;
}

/* Every op applied, and what the store queued behind them done: a read that found bad bytes
 * queued the drop of its record, which is part of what was asked. */
static void store_tier_sync(struct tier *t)
{
    struct store_tier *s = st_of(t);

    while (s->nops)
        if (wait_one(s, &s->ops[0], -1))
            break; /* cannot happen: the op was issued and not yet collected */
    store_drain(s->store);
}

static bool store_tier_busy(const struct tier *t)
{
    return st_of(t)->nops != 0;
}

static int store_tier_failed(const struct tier *t)
{
    (void)t; /* a store's errors are misses, never the engine's end */
    return 0;
}

/* ---- reads: fills ---- */

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct store_op *first_read(const struct store_tier *s)
{
    for (size_t i = 0; i < s->nops; i++)
        if (s->ops[i].kind == STORE_OP_READ)
            return &s->ops[i];
    return NULL;
}

static bool store_tier_fetching(const struct tier *t)
{
    return first_read(st_of(t)) != NULL;
}

static void store_tier_wait_fetches(struct tier *t, int timeout_ms)
{
    struct store_tier *s = st_of(t);
    uint64_t deadline = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    struct store_op *op;

    store_tier_poll(t, SIZE_MAX);
    while (timeout_ms != 0 && (op = first_read(s)) != NULL) {
        uint64_t now = now_ms();
        if (timeout_ms > 0 && now >= deadline)
            return;
        if (wait_one(s, op, timeout_ms < 0 ? -1 : (int)(deadline - now)))
            return; /* timed out: the read goes on, a later poll applies it */
    }
}

static size_t store_tier_find(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit)
{
    struct store_tier *s = st_of(t);
    size_t first = hit->dev_pages + hit->host_pages, rest, run = 0;

    rest = key->len / s->opts->page_size - first;
    if (rest == 0 || rdx_key_hashes(tree_of(s), key, hit->host_last, first, rest, s->hashes) ||
        store_leading_run(s->store, (const uint8_t *)s->hashes, rest, &run))
        run = 0;
    return run;
}

/* found: the first pages of the run find's leading_run answered. */
static void store_tier_matched(struct tier *t, const struct rdx_hit *hit, size_t found)
{
    struct store_tier *s = st_of(t);
    size_t remote = found ? store_run_remote(s->store, found) : 0;

    (void)hit;
    s->count.hit += (found - remote) * s->opts->page_size;
    s->remote.hit += remote * s->opts->page_size;
}

/* The key of the window copy of the page hashed hash. */
static int window_key(struct store_tier *s, const uint8_t *hash, uint8_t *out)
{
    return page_hasher_digest2(&s->hasher, hash, KVT_HASH_LEN, WINDOW_TAG, sizeof(WINDOW_TAG) - 1,
                               out);
}

/* Lookups per window search: each looks at a window's pages at once and, failing, moves
 * below the first missing one, so a run's window copies (at node ends and at regular points
 * of the key, radix_tiers.c window_page) are found within a few unless far below its end. */
#define WINDOW_LOOKUPS 16

/* How many of pages [lo, hi) of the run have window copies, from lo on. */
static size_t windows_from(struct store_tier *s, size_t lo, size_t hi)
{
    size_t run = 0;

    for (size_t i = lo; i < hi; i++)
        if (window_key(s, s->hashes[i], s->wkeys[i - lo]))
            return 0;
    if (store_leading_run(s->store, (const uint8_t *)s->wkeys, hi - lo, &run))
        return 0;
    return run;
}

/* From the run's end down: the first point with a window of copies right before it, or the
 * run's start when the copies reach it and the tree's part above ends with its window. */
static size_t store_tier_window(struct tier *t, size_t n, bool above, size_t *window)
{
    struct store_tier *s = st_of(t);
    uint64_t ps = s->opts->page_size, w = s->opts->swa.window;
    size_t wp = (size_t)((w + ps - 1) / ps), end = n;

    *window = 0;
    for (int i = 0; w && end > 0 && i < WINDOW_LOOKUPS; i++) {
        size_t lo = end > wp ? end - wp : 0, run = windows_from(s, lo, end);
        if (run == end - lo) {
            if (end - lo < wp && !above)
                return 0; /* the window reaches into the tree's part, which lacks its own */
            *window = end - lo;
            return end;
        }
        end = lo + run; /* a window ending past the first missing copy would hold it */
    }
    return 0;
}

static int submit_fill(struct store_tier *s, kvt_node_ref leaf, uint64_t tag, size_t n, size_t win,
                       size_t *reading)
{
    const struct tier_up *up = &s->base.up;
    struct store_op *op;
    int *results;
    uint64_t id;

    if (ops_reserve(s) || !(results = malloc(n * sizeof(int))))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *key = s->hashes[i];
        if (i >= n - win) { /* the page whole, its sliding-window layers current */
            if (window_key(s, s->hashes[i], s->wkeys[i])) {
                free(results);
                return -ENOMEM;
            }
            key = s->wkeys[i];
        }
        s->rpages[i] = (struct store_rpage){key, up->addr(up->ctx, s->fill_host[i])};
    }
    int rc = store_read(s->store, s->rpages, n, results, &id, reading);
    if (rc) {
        free(results);
        return rc;
    }
    op = &s->ops[s->nops++];
    *op = (struct store_op){id, tag, leaf, STORE_OP_READ, n, results, NULL, win};
    return 0;
}

/* The pages of key after hit that find left in hashes, read into a new host-only leaf. */
static int store_tier_fetch(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit,
                            size_t n, size_t window, size_t *reading)
{
    struct store_tier *s = st_of(t);
    const struct tier_up *up = &t->up;
    size_t first = hit->dev_pages + hit->host_pages, queued = 0;
    kvt_node_ref leaf = 0;
    uint64_t tag;

    if (reading)
        *reading = 0;
    if (n == 0 || window > n || n * s->opts->page_size < s->opts->prefetch_min ||
        !up->hold(up->ctx, hit->host_last))
        return 1;
    if (up->alloc(up->ctx, n, s->fill_host))
        return 1;
    /* Only now: making room above may have started writes here, which take tags too. */
    tag = RDX_OP_DISK | (s->seq + 1);
    /* Making room may have evicted what the hit named: the tree says so (a stale ref). */
    if (rdx_attach_fill(tree_of(s), key, hit->host_last, first, s->fill_host, n, tag, &leaf)) {
        up->free(up->ctx, s->fill_host, n);
        return 1;
    }
    s->seq++;
    if (submit_fill(s, leaf, tag, n, window, &queued)) {
        rdx_fill_done(tree_of(s), leaf, tag, 0); /* drops the leaf and its host pages */
        return 1;
    }
    if (reading)
        *reading = queued;
    return 0;
}

/* ---- writes ---- */

/* After the n pages of a write, the window copies of those whose host copy holds their
 * sliding-window layers: how many. */
static size_t add_windows(struct store_tier *s, size_t n)
{
    const struct tier_up *up = &s->base.up;
    size_t m = 0;

    for (size_t i = 0; i < n; i++) {
        const struct rdx_disk_page *p = &s->dpages[i];
        if (!p->window || window_key(s, p->hash, s->wkeys[m]))
            continue;
        s->wpages[n + m] = (struct store_wpage){s->wkeys[m], p->hash, s->window_ns, NULL,
                                                up->addr(up->ctx, p->host_page)};
        m++;
    }
    return m;
}

/* Write node's chain of host copies not yet stored: 1 when a write was started. */
static int write_chain(struct store_tier *s, kvt_node_ref node)
{
    const struct tier_up *up = &s->base.up;
    uint64_t tag = RDX_OP_DISK | (s->seq + 1), id;
    struct rdx_tree *tree = tree_of(s);
    size_t n = 0, m;
    int *results;

    /* Room for a window copy of each page beside it. */
    if (rdx_disk_span(tree, node, &n) || n == 0 || ops_reserve(s) ||
        !(results = malloc(2 * n * sizeof(int))))
        return 0;
    if (rdx_attach_disk(tree, node, tag, s->dpages, n)) {
        free(results);
        return 0;
    }
    s->seq++;
    for (size_t i = 0; i < n; i++) {
        const struct rdx_disk_page *p = &s->dpages[i];
        s->wpages[i] = (struct store_wpage){p->hash, p->parent, p->ns, p->tokens,
                                            up->addr(up->ctx, p->host_page)};
    }
    m = s->opts->swa.window ? add_windows(s, n) : 0;
    int rc = store_write(s->store, s->wpages, n + m, results, &id);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
        rdx_disk_done(tree, node, tag, results, n); /* nothing was stored */
        free(results);
        return 0;
    }
    s->ops[s->nops++] = (struct store_op){id, tag, node, STORE_OP_WRITE, n + m, results, NULL, m};
    return 1;
}

static int store_tier_store(struct tier *t, kvt_node_ref node)
{
    return write_chain(st_of(t), node);
}

static void store_tier_copied_above(struct tier *t, kvt_node_ref node)
{
    if (st_of(t)->opts->disk_write_policy == KVT_DISK_WRITE_THROUGH)
        write_chain(st_of(t), node);
}

static bool store_tier_wants_evicted(const struct tier *t)
{
    return st_of(t)->opts->disk_write_policy == KVT_DISK_WRITE_ON_EVICT;
}

/* ---- recurrent states ---- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The n page keys of a state of `bytes` kept under hash. */
static int state_keys(struct store_tier *s, const uint8_t *hash, size_t bytes, size_t n,
                      uint8_t (*keys)[KVT_HASH_LEN])
{
    uint8_t b[KVT_HASH_LEN + sizeof(STATE_TAG) - 1 + 12];
    size_t tag = sizeof(STATE_TAG) - 1;

    memcpy(b, hash, KVT_HASH_LEN);
    memcpy(b + KVT_HASH_LEN, STATE_TAG, tag);
    put_le(b + KVT_HASH_LEN + tag, bytes, 8);
    for (size_t i = 0; i < n; i++) {
        put_le(b + KVT_HASH_LEN + tag + 8, i, 4);
        if (page_hasher_digest2(&s->hasher, b, sizeof(b), NULL, 0, keys[i]))
            return -ENOMEM;
    }
    return 0;
}

/* Keys for a state of `bytes` and, when stage is given, a page-aligned staging buffer for its
 * pages: its page count, or 0. */
static size_t state_begin(struct store_tier *s, const uint8_t *hash, size_t bytes,
                          uint8_t (**keys)[KVT_HASH_LEN], void **stage)
{
    size_t pb = s->store->page_bytes, n = bytes ? (bytes + pb - 1) / pb : 0;

    *keys = NULL;
    if (stage)
        *stage = NULL;
    if (n == 0 || !(*keys = malloc(n * sizeof(**keys))) || state_keys(s, hash, bytes, n, *keys) ||
        (stage && posix_memalign(stage, 4096, n * pb))) {
        free(*keys);
        *keys = NULL;
        if (stage)
            *stage = NULL;
        return 0;
    }
    return n;
}

static int store_tier_put_state(struct tier *t, const uint8_t *hash, const void *buf, size_t bytes)
{
    struct store_tier *s = st_of(t);
    size_t pb = s->store->page_bytes;
    uint8_t(*keys)[KVT_HASH_LEN];
    void *stage;
    size_t n = state_begin(s, hash, bytes, &keys, &stage);
    struct store_wpage *w = n ? malloc(n * sizeof(*w)) : NULL;
    int *results = n ? malloc(n * sizeof(int)) : NULL;
    uint64_t id;
    int rc = w && results && !ops_reserve(s) ? 0 : -ENOMEM;

    if (rc == 0) {
        memcpy(stage, buf, bytes);
        memset((uint8_t *)stage + bytes, 0, n * pb - bytes);
        for (size_t i = 0; i < n; i++)
            w[i] =
                (struct store_wpage){keys[i], hash, s->state_ns, NULL, (uint8_t *)stage + i * pb};
        rc = store_write(s->store, w, n, results, &id);
    }
    free(keys);
    free(w);
    if (rc) {
        free(results);
        free(stage);
        return 0;
    }
    s->ops[s->nops++] = (struct store_op){id, 0, 0, OP_STATE, n, results, stage, 0};
    return 1;
}

static bool store_tier_has_state(struct tier *t, const uint8_t *hash, size_t bytes)
{
    struct store_tier *s = st_of(t);
    uint8_t(*keys)[KVT_HASH_LEN];
    size_t n = state_begin(s, hash, bytes, &keys, NULL), run = 0;

    if (n && store_leading_run(s->store, (const uint8_t *)keys, n, &run))
        run = 0;
    free(keys);
    return n && run == n;
}

static int store_tier_get_state(struct tier *t, const uint8_t *hash, void *buf, size_t bytes)
{
    struct store_tier *s = st_of(t);
    uint8_t(*keys)[KVT_HASH_LEN];
    void *stage;
    size_t n = state_begin(s, hash, bytes, &keys, &stage), pb = s->store->page_bytes;
    struct store_rpage *r = n ? malloc(n * sizeof(*r)) : NULL;
    int *results = n ? malloc(n * sizeof(int)) : NULL;
    struct store_done d;
    uint64_t id;
    int rc = r && results ? 0 : -ENOMEM;

    for (size_t i = 0; rc == 0 && i < n; i++)
        r[i] = (struct store_rpage){keys[i], (uint8_t *)stage + i * pb};
    if (rc == 0 && (rc = store_read(s->store, r, n, results, &id, NULL)) == 0 &&
        (rc = store_wait_for(s->store, id, -1, &d)) == 0)
        for (size_t i = 0; rc == 0 && i < n; i++)
            rc = results[i];
    if (rc == 0)
        memcpy(buf, stage, bytes);
    free(keys);
    free(r);
    free(results);
    free(stage);
    return rc;
}

/* The engine's copies (inserted, hit) reach a store from the host tier, not straight down. */
static void store_tier_ignore(struct tier *t, kvt_node_ref node)
{
    (void)t;
    (void)node;
}

static int store_tier_load(struct tier *t, const struct rdx_hit *hit, const uint32_t *pages,
                           int32_t *slots, uint64_t *op)
{
    (void)t, (void)hit, (void)pages, (void)slots, (void)op;
    return 1; /* what a store holds comes up through the host tier */
}

static int store_tier_wait_layer(struct tier *t, uint64_t op, uint32_t layer, void *stream)
{
    (void)t, (void)layer, (void)stream;
    return op ? -EINVAL : 0;
}

static uint64_t store_tier_pending_load(const struct tier *t, uint64_t op)
{
    (void)t, (void)op;
    return 0;
}

/* ---- stats, closing ---- */

static void store_tier_stats(const struct tier *t, struct kvt_stats *st)
{
    const struct store_tier *s = st_of(t);
    uint32_t ps = s->opts->page_size;
    struct store_stats ss;

    store_stats(s->store, &ss);
    st->disk_tokens = ss.capacity_pages * ps;
    st->disk_cached_tokens = ss.pages * ps;
    st->disk_hit_tokens = s->count.hit;
    st->disk_read_tokens = s->count.read;
    st->disk_written_tokens = s->count.written;
    st->disk_errors = ss.errors - ss.remote_errors;
    st->remote_hit_tokens = s->remote.hit;
    st->remote_read_tokens = s->remote.read;
    st->remote_written_tokens = s->remote.written;
    st->remote_errors = ss.remote_errors;
    st->disk_read_bytes = ss.bytes_read;
    st->disk_written_bytes = ss.bytes_written;
    st->disk_ops_in_flight = s->nops;
    st->disk_io = ss.io;
    st->disk_index_rebuilt = ss.index_rebuilt;
    st->disk_recovered_tokens = ss.recovered * ps;
    st->disk_skipped_tokens = ss.too_many * ps;
}

static void store_tier_release(struct tier *t, const uint32_t *pages, size_t n)
{
    (void)t, (void)pages, (void)n; /* none of its pages are in the tree */
}

static uint32_t store_tier_tree_pages(const struct tier *t)
{
    (void)t;
    return 0;
}

static int store_tier_check(const struct tier *t, const uint8_t *held, char *why, size_t len)
{
    (void)t, (void)held, (void)why, (void)len;
    return 0; /* its pages are the store's, not the tree's */
}

/* The store waits for its ops, whose buffers are host pages: before the host pool goes. */
static void store_tier_stop(struct tier *t)
{
    struct store_tier *s = st_of(t);

    store_close(s->store);
    s->store = NULL;
}

static void store_tier_close(struct tier *t)
{
    struct store_tier *s = st_of(t);

    if (s->store)
        store_tier_stop(t);
    for (size_t i = 0; i < s->nops; i++) {
        free(s->ops[i].results);
        free(s->ops[i].stage);
    }
    page_hasher_finish(&s->hasher);
    free(s->ops);
    free(s->hashes);
    free(s->fill_host);
    free(s->dpages);
    free(s->wpages);
    free(s->rpages);
    free(s->wkeys);
    free(s);
}

static const struct tier_ops store_tier_ops = {
    .name = "store",
    .find = store_tier_find,
    .matched = store_tier_matched,
    .fetch = store_tier_fetch,
    .window = store_tier_window,
    .fetching = store_tier_fetching,
    .wait_fetches = store_tier_wait_fetches,
    .load = store_tier_load,
    .wait_layer = store_tier_wait_layer,
    .pending_load = store_tier_pending_load,
    .inserted = store_tier_ignore,
    .hit = store_tier_ignore,
    .copied_above = store_tier_copied_above,
    .store = store_tier_store,
    .wants_evicted = store_tier_wants_evicted,
    .put_state = store_tier_put_state,
    .has_state = store_tier_has_state,
    .get_state = store_tier_get_state,
    .poll = store_tier_poll,
    .sync = store_tier_sync,
    .busy = store_tier_busy,
    .failed = store_tier_failed,
    .stats = store_tier_stats,
    .release = store_tier_release,
    .tree_pages = store_tier_tree_pages,
    .check = store_tier_check,
    .stop = store_tier_stop,
    .close = store_tier_close,
};

void store_tier_swap(struct tier *t, struct kvt_store *store)
{
    store_close(st_of(t)->store);
    st_of(t)->store = store;
}

/* ---- open ---- */

int store_tier_check_options(const struct kvt_options *o, bool has_host, size_t page_bytes)
{
    if (!has_host || !o->hash_pages || o->host_layout != KVT_HOST_PAGE_FIRST ||
        o->disk_io > KVT_DISK_IO_PSYNC || o->disk_write_policy > KVT_DISK_WRITE_ON_EVICT ||
        o->prefetch_policy > KVT_PREFETCH_TIMEOUT || o->disk_sync > KVT_DISK_SYNC_RELAXED)
        return -EINVAL;
    /* A page is one store I/O: its bytes, with a disk page's head, fit a 32-bit length. */
    return page_bytes > UINT32_MAX / 2 ? -EINVAL : 0;
}

static int alloc_scratch(struct store_tier *s, size_t n)
{
    s->hashes = malloc(n * sizeof(*s->hashes));
    s->fill_host = malloc(n * sizeof(*s->fill_host));
    s->dpages = malloc(n * sizeof(*s->dpages));
    s->wpages = malloc(2 * n * sizeof(*s->wpages)); /* a page and its window copy */
    s->rpages = malloc(n * sizeof(*s->rpages));
    s->wkeys = malloc(n * sizeof(*s->wkeys));
    return s->hashes && s->fill_host && s->dpages && s->wpages && s->rpages && s->wkeys ? 0
                                                                                        : -ENOMEM;
}

int store_tier_open(const struct store_tier_config *c, struct kvt_store *store, struct tier_up up,
                    struct tier **out)
{
    struct store_tier *s = calloc(1, sizeof(*s));
    int rc;

    if (!s) {
        store_close(store);
        return -ENOMEM;
    }
    s->base = (struct tier){.ops = &store_tier_ops, .up = up};
    s->opts = c->opts;
    s->tree = c->tree;
    s->store = store;
    if ((rc = page_hasher_init(&s->hasher)) == 0)
        rc =
            page_hasher_digest2(&s->hasher, STATE_TAG, sizeof(STATE_TAG) - 1, NULL, 0, s->state_ns);
    if (rc == 0)
        rc = page_hasher_digest2(&s->hasher, WINDOW_TAG, sizeof(WINDOW_TAG) - 1, NULL, 0,
                                 s->window_ns);
    if (rc || (rc = alloc_scratch(s, c->scratch_pages))) {
        store_tier_close(&s->base);
        return rc;
    }
    *out = &s->base;
    return 0;
}
