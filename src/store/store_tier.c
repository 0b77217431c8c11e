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
 *
 * A store page may hold several of the engine's pages (options.store_page_tokens: `group`
 * pages), so that small pages cost the store one record per group: the store page ending at
 * page e of a key holds its pages from e - group + 1 to e, starts at a multiple of group,
 * and is named by page e's hash, which names the whole prefix. A write takes the whole store
 * pages of its chain, with the pages before the chain that its first one starts with (from the
 * host copies above it, rdx_disk_head); what is left at its end is not written: the tree
 * counts it as stored, and it goes down with its store page once a chain below it fills that
 * page. A store page's pages are copied through a staging buffer (the host copies are not
 * contiguous); with one page to a store page the host pages are the store's buffers.
 */
#include "store/store_tier_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- ops in flight ---- */

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

/* Of the first `units` store pages of a fill, the engine's pages they bring (its first store
 * page holds skip pages above it). */
static size_t fill_pages(const struct store_tier *s, const struct store_op *op, size_t units)
{
    size_t p = units * s->group;

    p = p > op->skip ? p - op->skip : 0;
    return p < op->pages ? p : op->pages;
}

/* Tokens a completed op read (the fill's pages kept) or wrote (its store pages kept), near
 * (count) and remote: a chain says which were which; any other store's are all of its kind. */
static void count_op(struct store_tier *s, const struct store_op *op, const struct store_done *d)
{
    bool read = op->kind == STORE_OP_READ, remote_store = s->store->ops->remote;
    size_t ps = s->opts->page_size, near, remote;

    if (read) {
        size_t ok = fill_pages(s, op, leading_ok(op->results, op->n));
        near = d->split ? fill_pages(s, op, d->near_ok) : remote_store ? 0 : ok;
        if (near > ok)
            near = ok;
        remote = d->split || remote_store ? ok - near : 0;
        s->count.read += near * ps;
        s->remote.read += remote * ps;
    } else {
        size_t ok = count_ok(op->results, op->n - op->win), spt = s->store->page_tokens;
        near = d->split ? d->near_ok : remote_store ? 0 : ok;
        remote = d->split ? d->remote_ok : remote_store ? ok : 0;
        s->count.written += near * spt;
        s->remote.written += remote * spt;
    }
}

/* A fill's store pages that landed, from the first, into its host pages: how many of its
 * pages they bring. */
static size_t fill_landed(struct store_tier *s, const struct store_op *op)
{
    const struct tier_up *up = &s->base.up;
    size_t ok = fill_pages(s, op, leading_ok(op->results, op->n));

    for (size_t i = 0; op->host && !op->parts && i < ok; i++)
        memcpy(up->addr(up->ctx, op->host[i]),
               (const uint8_t *)op->stage + (op->skip + i) * s->page_bytes, s->page_bytes);
    return ok;
}

/* A write's result for each page of its span (op->pages), for the tree: a page of a store
 * page the store's; one of its lead, not written, -EAGAIN (a later write tries again); one
 * past its last store page 0, left for a later write's head. */
static const int *span_results(struct store_tier *s, const struct store_op *op)
{
    size_t units = op->n - op->win;

    if (s->group == 1)
        return op->results;
    for (size_t i = 0, at = op->skip; i < op->pages; i++, at++) {
        size_t u = at < op->lead ? 0 : (at - op->lead) / s->group;
        s->presults[i] = at < op->lead ? -EAGAIN : u < units ? op->results[u] : 0;
    }
    return s->presults;
}

/* Apply a completed op (d: what the store said of it) to the tree and forget it. The nodes
 * it names are held by its mark, so the refs are live: the tree calls cannot fail here. */
static void apply(struct store_tier *s, struct store_op *op, const struct store_done *d)
{
    if (op->kind == OP_STATE) {
        /* a state not stored whole is a miss when read: nothing to undo */
    } else if (op->kind == STORE_OP_READ) {
        size_t ok = fill_landed(s, op);
        if (op->win)
            rdx_fill_done_window(tree_of(s), op->node, op->tag, ok, op->pages - op->win);
        else
            rdx_fill_done(tree_of(s), op->node, op->tag, ok);
        count_op(s, op, d);
    } else {
        /* A window copy not kept is a window missing when read: nothing to record. */
        rdx_disk_done(tree_of(s), op->node, op->tag, span_results(s, op), op->pages);
        count_op(s, op, d);
    }
    free(op->stage);
    free(op->host);
    free(op->parts);
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

/* The name of the store page that holds page k of the run find hashed (the run starts off
 * pages into a store page): its last page's hash. */
static const uint8_t *unit_key(const struct store_tier *s, size_t off, size_t k)
{
    return s->hashes[(k + off) / s->group * s->group + s->group - 1 - off];
}

/* Pages of the run after hit that the store holds, whole store pages from the one holding
 * the run's first page (which may start above it, in the tree's part). Their names go to
 * wkeys, which only sliding-window layers use otherwise, and they have one page to a store
 * page. */
static size_t store_tier_find(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit)
{
    struct store_tier *s = st_of(t);
    size_t first = hit->dev_pages + hit->host_pages, rest, run = 0, off, units;
    const uint8_t *keys = (const uint8_t *)s->hashes;

    rest = key->len / s->opts->page_size - first;
    if (rest == 0 || rdx_key_hashes(tree_of(s), key, hit->host_last, first, rest, s->hashes))
        return 0;
    off = first % s->group;
    units = (off + rest) / s->group;
    if (s->group > 1) {
        for (size_t k = 0; k < units; k++)
            memcpy(s->wkeys[k], unit_key(s, off, k * s->group), KVT_HASH_LEN);
        keys = (const uint8_t *)s->wkeys;
    }
    if (units == 0 || store_leading_run(s->store, keys, units, &run) || run == 0)
        return 0;
    return run * s->group - off;
}

/* found: the first pages of the run find's leading_run answered. */
static void store_tier_matched(struct tier *t, const struct rdx_hit *hit, size_t found)
{
    struct store_tier *s = st_of(t);
    size_t off = (hit->dev_pages + hit->host_pages) % s->group, remote = 0;

    if (found) { /* the remote store's share, in store pages, of those found */
        size_t units = (off + found + s->group - 1) / s->group;
        remote = store_run_remote(s->store, units) * s->group;
        remote = remote < found ? remote : found;
    }
    s->count.hit += (found - remote) * s->opts->page_size;
    s->remote.hit += remote * s->opts->page_size;
}

/* Whether store pages of several pages move in parts, without a staging copy. */
static bool in_parts(const struct store_tier *s)
{
    return s->group > 1 && s->group <= STORE_MAX_PARTS && s->store->ops->parts;
}

/* A fill's store pages in parts: its pages' host pages, and stage for the pages of its store
 * pages above it (skip) or past its end, which it does not keep. */
static int fill_parts(struct store_tier *s, struct store_op *op)
{
    const struct tier_up *up = &s->base.up;
    size_t g = s->group, n = op->n * g, extra = n - op->pages, x = 0;

    if (!(op->parts = malloc(n * sizeof(void *))) ||
        (extra && posix_memalign(&op->stage, 4096, extra * s->page_bytes)))
        return -ENOMEM;
    for (size_t k = 0; k < n; k++) {
        bool ours = k >= op->skip && k - op->skip < op->pages;
        op->parts[k] = ours ? up->addr(up->ctx, s->fill_host[k - op->skip])
                            : (uint8_t *)op->stage + x++ * s->page_bytes;
    }
    for (size_t i = 0; i < op->n; i++)
        s->rpages[i] = (struct store_rpage){
            .key = unit_key(s, op->skip, i * g), .parts = op->parts + i * g, .nparts = (uint32_t)g};
    return 0;
}

/* The fill's store reads: one per page, into its host pages, or one per store page of
 * several pages, in parts into its host pages (fill_parts), or else into a staging buffer
 * (op->stage, op->host) that the op copies out. */
static int fill_reads(struct store_tier *s, struct store_op *op, size_t win)
{
    const struct tier_up *up = &s->base.up;
    size_t n = op->n, sb = s->store->page_bytes;

    if (in_parts(s))
        return fill_parts(s, op);
    if (s->group > 1 && (posix_memalign(&op->stage, 4096, n * sb) ||
                         !(op->host = malloc(op->pages * sizeof(uint32_t)))))
        return -ENOMEM;
    if (op->host)
        memcpy(op->host, s->fill_host, op->pages * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        const uint8_t *key = unit_key(s, op->skip, i * s->group);
        void *buf = op->stage ? (uint8_t *)op->stage + i * sb : up->addr(up->ctx, s->fill_host[i]);
        if (i >= n - win) { /* the page whole, its sliding-window layers current */
            if (store_window_key(s, s->hashes[i], s->wkeys[i]))
                return -ENOMEM;
            key = s->wkeys[i];
        }
        s->rpages[i] = (struct store_rpage){.key = key, .buf = buf};
    }
    return 0;
}

static int submit_fill(struct store_tier *s, kvt_node_ref leaf, uint64_t tag, size_t n, size_t off,
                       size_t win, size_t *reading)
{
    size_t units = (off + n + s->group - 1) / s->group, leading = 0;
    struct store_op op = {.tag = tag,
                          .node = leaf,
                          .kind = STORE_OP_READ,
                          .n = units,
                          .win = win,
                          .pages = n,
                          .skip = off};
    int rc = -ENOMEM;

    if (ops_reserve(s) == 0 && (op.results = malloc(units * sizeof(int))) &&
        (rc = fill_reads(s, &op, win)) == 0)
        rc = store_read(s->store, s->rpages, units, op.results, &op.id, &leading);
    if (rc) {
        free(op.results);
        free(op.stage);
        free(op.host);
        free(op.parts);
        return rc;
    }
    s->ops[s->nops++] = op;
    if (reading)
        *reading = fill_pages(s, &op, leading);
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
    if (submit_fill(s, leaf, tag, n, first % s->group, window, &queued)) {
        rdx_fill_done(tree_of(s), leaf, tag, 0); /* drops the leaf and its host pages */
        return 1;
    }
    if (reading)
        *reading = queued;
    return 0;
}

/* ---- writes ---- */

/* A write's store pages in parts: its span's host pages, which the write holds, as they are;
 * its head's (the pages above the span its first store page holds), which nothing holds
 * while the write flies, copied into stage first. */
static int write_parts(struct store_tier *s, struct store_op *op, size_t units)
{
    const struct tier_up *up = &s->base.up;
    size_t g = s->group, ps = s->opts->page_size,
           heads = op->skip > op->lead ? op->skip - op->lead : 0;

    if (!(op->parts = malloc(units * g * sizeof(void *))) ||
        (heads && posix_memalign(&op->stage, 4096, heads * s->page_bytes)))
        return -ENOMEM;
    for (size_t u = 0; u < units; u++) {
        const struct rdx_disk_page *p = &s->dpages[op->lead + u * g];
        for (size_t k = 0; k < g; k++) {
            size_t at = op->lead + u * g + k; /* in dpages: the head's first, then the span */
            void *host = up->addr(up->ctx, p[k].host_page);
            if (at < op->skip) {
                host = memcpy((uint8_t *)op->stage + (at - op->lead) * s->page_bytes, host,
                              s->page_bytes);
            }
            op->parts[u * g + k] = host;
            memcpy(s->gtokens + (u * g + k) * ps, p[k].tokens, ps * sizeof(uint32_t));
        }
        s->wpages[u] = (struct store_wpage){.key = p[g - 1].hash,
                                            .parent = p->parent,
                                            .ns = p->ns,
                                            .tokens = s->gtokens + u * g * ps,
                                            .parts = (const void *const *)op->parts + u * g,
                                            .nparts = (uint32_t)g};
    }
    return 0;
}

/* The store pages of a write whose pages (its head, then its span) are described in dpages,
 * from op->lead on, into wpages: a page's own host page and tokens, its pages in parts
 * (write_parts), or a copy of a store page's pages and tokens, back to back, in op->stage
 * and gtokens. */
static int write_units(struct store_tier *s, struct store_op *op, size_t units)
{
    const struct tier_up *up = &s->base.up;
    size_t g = s->group, ps = s->opts->page_size, sb = s->store->page_bytes;

    if (in_parts(s))
        return write_parts(s, op, units);
    if (g > 1 && posix_memalign(&op->stage, 4096, units * sb))
        return -ENOMEM;
    for (size_t u = 0; u < units; u++) {
        const struct rdx_disk_page *p = &s->dpages[op->lead + u * g];
        const uint32_t *tokens = p->tokens;
        void *buf = up->addr(up->ctx, p->host_page);
        if (g > 1) {
            buf = (uint8_t *)op->stage + u * sb;
            tokens = s->gtokens + u * g * ps;
            for (size_t k = 0; k < g; k++) {
                memcpy((uint8_t *)buf + k * s->page_bytes, up->addr(up->ctx, p[k].host_page),
                       s->page_bytes);
                memcpy(s->gtokens + (u * g + k) * ps, p[k].tokens, ps * sizeof(uint32_t));
            }
        }
        s->wpages[u] = (struct store_wpage){
            .key = p[g - 1].hash, .parent = p->parent, .ns = p->ns, .tokens = tokens, .buf = buf};
    }
    return 0;
}

/* Write node's chain of host copies not yet stored: 1 when a write was started, or when the
 * chain was all left for a later write's head (its store page not yet whole). */
static int write_chain(struct store_tier *s, kvt_node_ref node)
{
    uint64_t tag = RDX_OP_DISK | (s->seq + 1), first = 0;
    struct rdx_tree *tree = tree_of(s);
    struct store_op op = {.tag = tag, .node = node, .kind = STORE_OP_WRITE};
    size_t n = 0, g = s->group, units;
    int rc;

    if (rdx_disk_span(tree, node, &n) || n == 0 || ops_reserve(s))
        return 0;
    /* Its store pages start at multiples of g pages of the key: the first may hold pages
     * above the span, which their host copies give. A head lost leaves the span's lead. */
    if (g > 1 && (rc = rdx_disk_head(tree, node, n, g, s->dpages, &op.skip, &first)) &&
        rc != -EAGAIN)
        return 0;
    /* Room for a window copy of each page beside it. */
    if (!(op.results = malloc(2 * n * sizeof(int))) ||
        rdx_attach_disk(tree, node, tag, s->dpages + op.skip, n)) {
        free(op.results);
        return 0;
    }
    s->seq++;
    op.pages = n;
    op.lead = (g - (first - op.skip) % g) % g;
    units = op.skip + n > op.lead ? (op.skip + n - op.lead) / g : 0;
    if (units == 0) { /* nothing whole to write yet */
        rdx_disk_done(tree, node, tag, span_results(s, &op), n);
        free(op.results);
        return 1;
    }
    /* Window copies: sliding-window layers, so one page to a store page. */
    op.win = s->opts->swa.window ? store_add_windows(s, n) : 0;
    op.n = units + op.win;
    if ((rc = write_units(s, &op, units)) == 0)
        rc = store_write(s->store, s->wpages, op.n, op.results, &op.id);
    if (rc) {
        for (size_t i = 0; i < op.n; i++)
            op.results[i] = rc;
        rdx_disk_done(tree, node, tag, span_results(s, &op), n); /* nothing was stored */
        free(op.results);
        free(op.stage);
        free(op.parts);
        return 0;
    }
    s->ops[s->nops++] = op;
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
    uint32_t ps = s->store->page_tokens; /* the store counts its own pages */
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
        free(s->ops[i].host);
    }
    page_hasher_finish(&s->hasher);
    free(s->ops);
    free(s->hashes);
    free(s->fill_host);
    free(s->dpages);
    free(s->wpages);
    free(s->rpages);
    free(s->wkeys);
    free(s->gtokens);
    free(s->presults);
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

uint32_t store_page_tokens_of(const struct kvt_options *o)
{
    uint64_t page = kvt_cell_bytes(&o->geometry) * o->page_size, group, most;

    if (o->store_page_tokens)
        return o->store_page_tokens;
    if (o->mamba.layers || o->swa.window || !page || page >= STORE_PAGE_AUTO_BYTES)
        return o->page_size;
    group = (STORE_PAGE_AUTO_BYTES + page - 1) / page;
    /* No longer than a key can be: a store page no key fills is never written. */
    most = (o->max_context < STORE_PAGE_TOKENS_MAX ? o->max_context : STORE_PAGE_TOKENS_MAX) /
           o->page_size;
    if (group > most)
        group = most ? most : 1;
    return (uint32_t)(group * o->page_size);
}

int store_tier_check_options(const struct kvt_options *o, bool has_host, size_t page_bytes)
{
    if (!has_host || !o->hash_pages || o->host_layout != KVT_HOST_PAGE_FIRST ||
        o->disk_io > KVT_DISK_IO_PSYNC || o->disk_write_policy > KVT_DISK_WRITE_ON_EVICT ||
        o->prefetch_policy > KVT_PREFETCH_TIMEOUT || o->disk_sync > KVT_DISK_SYNC_RELAXED)
        return -EINVAL;
    /* A store page is one store I/O: its bytes, with a disk page's head, fit a 32-bit
     * length. */
    return page_bytes > UINT32_MAX / 2 / store_pages(o) ? -EINVAL : 0;
}

/* n: pages of the longest key, and a store page's more (a write's head). */
static int alloc_scratch(struct store_tier *s, size_t n)
{
    n += s->group;
    s->gtokens = malloc(n * s->opts->page_size * sizeof(*s->gtokens));
    s->presults = malloc(n * sizeof(*s->presults));
    if (!s->gtokens || !s->presults)
        return -ENOMEM;
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
    s->group = store_pages(c->opts);
    s->page_bytes = store->page_bytes / s->group;
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
