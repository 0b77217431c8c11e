/*
 * The engine's disk tier: where the tree meets the block store (src/disk/store.h).
 *
 * Pages go to disk from their host copies (write-through after the backup lands, or when the
 * host evicts them) and come back into the host tier as fills: a host-only leaf the store
 * reads into, pending until the read is applied. The store is keyed by the chained page
 * hashes, so after a restart a match continues past the empty tree through the index.
 *
 * Every store op holds what it touches: a write marks its chain (disk_op) so the host copies
 * it reads stay, a fill is pending so nothing matches, extends or evicts it. Ops complete in
 * any order; kvt_poll applies them.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static size_t scratch_pages(const kvt_engine *e)
{
    return (size_t)e->opts.max_context / e->opts.page_size + 1;
}

static int check_disk_options(const kvt_engine *e)
{
    const struct kvt_options *o = &e->opts;

    if (!e->has_host || !o->hash_pages || o->host_layout != KVT_HOST_PAGE_FIRST ||
        o->disk_io > KVT_DISK_IO_PSYNC || o->disk_write_policy > KVT_DISK_WRITE_ON_EVICT ||
        o->prefetch_policy > KVT_PREFETCH_TIMEOUT)
        return -EINVAL;
    /* A page is one slab I/O: its bytes, with its head, must fit a 32-bit length. */
    return e->host.page_bytes > UINT32_MAX / 2 ? -EINVAL : 0;
}

static int alloc_scratch(kvt_engine *e)
{
    size_t n = scratch_pages(e);

    e->hashes = malloc(n * sizeof(*e->hashes));
    e->fill_host = malloc(n * sizeof(*e->fill_host));
    e->dpages = malloc(n * sizeof(*e->dpages));
    e->wpages = malloc(n * sizeof(*e->wpages));
    e->rpages = malloc(n * sizeof(*e->rpages));
    return e->hashes && e->fill_host && e->dpages && e->wpages && e->rpages ? 0 : -ENOMEM;
}

void disk_store_options(const kvt_engine *e, struct dstore_options *so)
{
    static const uint32_t io[] = {DSTORE_IO_AUTO, DSTORE_IO_URING, DSTORE_IO_PSYNC};

    dstore_options_init(so, sizeof(*so));
    so->dir = e->opts.disk_dir;
    memcpy(so->fingerprint, e->fingerprint, DSTORE_FINGERPRINT_BYTES);
    so->page_bytes = (uint32_t)e->host.page_bytes;
    so->page_tokens = e->opts.page_size;
    if (e->opts.disk_bytes)
        so->disk_bytes = e->opts.disk_bytes;
    if (so->slab_bytes > so->disk_bytes)
        so->slab_bytes = so->disk_bytes; /* no slab file larger than the whole tier */
    so->io = io[e->opts.disk_io];
    /* The host pool is where every disk read lands and every write comes from. */
    so->register_base = e->host.base;
    so->register_bytes = e->host.bytes;
}

int disk_open(kvt_engine *e)
{
    struct dstore_options so;
    int rc;

    if (!e->opts.disk_dir)
        return 0;
    if ((rc = check_disk_options(e)) || (rc = alloc_scratch(e)))
        return rc;
    if (e->opts.prefetch_timeout_ms == 0)
        e->opts.prefetch_timeout_ms = 100;
    disk_store_options(e, &so);
    return dstore_open(&so, &e->disk);
}

void disk_close(kvt_engine *e)
{
    dstore_close(e->disk); /* waits for the ops, whose buffers are host pages */
    e->disk = NULL;
    for (size_t i = 0; i < e->dops.n; i++)
        free(e->dops.v[i].results);
    free(e->dops.v);
    free(e->hashes);
    free(e->fill_host);
    free(e->dpages);
    free(e->wpages);
    free(e->rpages);
}

/* ---- ops in flight ---- */

static int dops_reserve(struct disk_ops *d)
{
    if (d->n < d->cap)
        return 0;
    size_t ncap = d->cap ? d->cap * 2 : 16;
    struct disk_op *v = realloc(d->v, ncap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    d->v = v;
    d->cap = ncap;
    return 0;
}

static struct disk_op *find_id(const struct disk_ops *d, uint64_t id)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].id == id)
            return &d->v[i];
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

/* Apply a completed op to the tree and forget it. The nodes it names are held by its mark,
 * so the refs are live: the tree calls cannot fail here. */
static void apply(kvt_engine *e, struct disk_op *op)
{
    uint32_t ps = e->opts.page_size;

    if (op->kind == DSTORE_OP_READ) {
        size_t ok = leading_ok(op->results, op->n);
        rdx_fill_done(e->tree, op->node, op->tag, ok);
        e->count.disk_read_tokens += ok * ps;
    } else {
        rdx_disk_done(e->tree, op->node, op->tag, op->results, op->n);
        e->count.disk_written_tokens += count_ok(op->results, op->n) * ps;
    }
    free(op->results);
    *op = e->dops.v[--e->dops.n];
}

static void apply_done(kvt_engine *e, const struct dstore_done *d)
{
    struct disk_op *op = find_id(&e->dops, d->op);

    if (op)
        apply(e, op);
}

size_t disk_poll(kvt_engine *e, size_t max)
{
    struct dstore_done d[16];
    size_t n, total = 0;

    while (e->disk && total < max &&
           (n = dstore_poll(e->disk, d, max - total < 16 ? max - total : 16)) > 0) {
        for (size_t i = 0; i < n; i++)
            apply_done(e, &d[i]);
        total += n;
    }
    return total;
}

static int wait_one(kvt_engine *e, struct disk_op *op)
{
    struct dstore_done d;
    int rc = dstore_wait(e->disk, op->id, &d);

    if (rc == 0)
        apply(e, op);
    return rc;
}

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct disk_op *first_read(const struct disk_ops *d)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].kind == DSTORE_OP_READ)
            return &d->v[i];
    return NULL;
}

bool disk_reading(const kvt_engine *e)
{
    return first_read(&e->dops) != NULL;
}

void disk_wait_reads(kvt_engine *e, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    struct disk_op *op;

    disk_poll(e, SIZE_MAX);
    while (timeout_ms != 0 && (op = first_read(&e->dops)) != NULL) {
        uint64_t now = now_ms();
        struct dstore_done d;
        if (timeout_ms > 0 && now >= deadline)
            return;
        int left = timeout_ms < 0 ? -1 : (int)(deadline - now);
        if (dstore_wait_for(e->disk, op->id, left, &d))
            return; /* timed out: the read goes on, a later poll applies it */
        apply(e, op);
    }
}

/* Every op applied, and what the store queued behind them done: a read that found bad bytes
 * queued the drop of its record, which is part of what was asked. */
void disk_sync(kvt_engine *e)
{
    while (e->disk && e->dops.n)
        if (wait_one(e, &e->dops.v[0]))
            break; /* cannot happen: the op was issued and not yet collected */
    if (e->disk)
        dstore_drain(e->disk);
}

/* ---- reads: fills ---- */

size_t disk_lookup(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit)
{
    size_t first = hit->dev_pages + hit->host_pages, rest, run = 0;

    if (!e->disk)
        return 0;
    rest = key->len / e->opts.page_size - first;
    if (rest == 0 || rdx_key_hashes(e->tree, key, hit->host_last, first, rest, e->hashes) ||
        dstore_leading_run(e->disk, (const uint8_t *)e->hashes, rest, &run))
        return 0;
    return run;
}

/* The parent of a fill needs a host copy (host copies grow from the top). */
static int host_parent(kvt_engine *e, kvt_node_ref ref)
{
    size_t span = 0;

    if (rdx_backup_span(e->tree, ref, &span))
        return 0;
    return span == 0 || tiers_backup(e, ref);
}

static int submit_fill(kvt_engine *e, kvt_node_ref leaf, uint64_t tag, size_t n, size_t *reading)
{
    struct disk_op *op;
    int *results;
    uint64_t id;

    if (dops_reserve(&e->dops) || !(results = malloc(n * sizeof(int))))
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        e->rpages[i] = (struct dstore_rpage){
            .key = e->hashes[i],
            .buf = host_pool_rows(&e->host, e->fill_host[i], 0, 0), /* the page's start */
        };
    int rc = dstore_read(e->disk, e->rpages, n, results, &id, reading);
    if (rc) {
        free(results);
        return rc;
    }
    op = &e->dops.v[e->dops.n++];
    *op = (struct disk_op){id, tag, leaf, DSTORE_OP_READ, n, results};
    return 0;
}

int disk_fill(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit, size_t n,
              size_t *reading)
{
    size_t first = hit->dev_pages + hit->host_pages, queued = 0;
    kvt_node_ref leaf = 0;
    uint64_t t;

    if (reading)
        *reading = 0;
    if (n == 0 || n * e->opts.page_size < e->opts.prefetch_min || !host_parent(e, hit->host_last))
        return 1;
    if (tiers_host_alloc(e, n, e->fill_host))
        return 1;
    /* Only now: making room above may have started disk writes, which take tags too. */
    t = RDX_OP_DISK | (e->dops.seq + 1);
    /* Making room may have evicted what the hit named: the tree says so (a stale ref). */
    if (rdx_attach_fill(e->tree, key, hit->host_last, first, e->fill_host, n, t, &leaf)) {
        host_free(&e->host, e->fill_host, n);
        return 1;
    }
    e->dops.seq++;
    if (submit_fill(e, leaf, t, n, &queued)) {
        rdx_fill_done(e->tree, leaf, t, 0); /* drops the leaf and its host pages */
        return 1;
    }
    if (reading)
        *reading = queued;
    return 0;
}

/* ---- writes ---- */

/* Write node's chain of host copies not yet on disk: 1 when a write was started. */
static int disk_write(kvt_engine *e, kvt_node_ref node)
{
    uint64_t tag = RDX_OP_DISK | (e->dops.seq + 1), id;
    size_t n = 0;
    int *results;

    if (rdx_disk_span(e->tree, node, &n) || n == 0 || dops_reserve(&e->dops) ||
        !(results = malloc(n * sizeof(int))))
        return 0;
    if (rdx_attach_disk(e->tree, node, tag, e->dpages, n)) {
        free(results);
        return 0;
    }
    e->dops.seq++;
    for (size_t i = 0; i < n; i++) {
        const struct rdx_disk_page *p = &e->dpages[i];
        e->wpages[i] = (struct dstore_wpage){p->hash, p->parent, p->ns, p->tokens,
                                             host_pool_rows(&e->host, p->host_page, 0, 0)};
    }
    int rc = dstore_write(e->disk, e->wpages, n, results, &id);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
        rdx_disk_done(e->tree, node, tag, results, n); /* nothing went to disk */
        free(results);
        return 0;
    }
    e->dops.v[e->dops.n++] = (struct disk_op){id, tag, node, DSTORE_OP_WRITE, n, results};
    return 1;
}

void disk_after_backup(kvt_engine *e, kvt_node_ref node)
{
    if (e->disk && e->opts.disk_write_policy == KVT_DISK_WRITE_THROUGH)
        disk_write(e, node);
}

/* As write_back does for the device: host leaves not on disk are written first, waited for
 * and evicted in the next round; what is still not on disk after that (a failed write) is
 * dropped by the plain eviction. */
void disk_evict_host(kvt_engine *e, size_t pages)
{
    size_t done = 0, n = 0;

    for (int round = 0; round < KVT_WRITE_BACK_ROUNDS && done < pages; round++) {
        done +=
            rdx_evict_host_written(e->tree, pages - done, e->defer_host, KVT_WRITE_BACK_BATCH, &n);
        size_t started = 0;
        for (size_t i = 0; i < n; i++)
            started += (size_t)disk_write(e, e->defer_host[i]);
        if (started == 0)
            break;
        disk_sync(e);
    }
    if (done < pages)
        rdx_evict_host(e->tree, pages - done);
}

void disk_stats(const kvt_engine *e, struct kvt_stats *st)
{
    static const uint32_t io[] = {
        [DSTORE_IO_URING] = KVT_DISK_IO_URING, [DSTORE_IO_PSYNC] = KVT_DISK_IO_PSYNC};
    struct dstore_stats ds;
    uint32_t ps = e->opts.page_size;

    if (!e->disk)
        return;
    dstore_stats(e->disk, &ds);
    st->disk_tokens = ds.capacity_slots * ps;
    st->disk_cached_tokens = ds.pages * ps;
    st->disk_hit_tokens = e->count.disk_hit_tokens;
    st->disk_read_tokens = e->count.disk_read_tokens;
    st->disk_written_tokens = e->count.disk_written_tokens;
    st->disk_errors = ds.err_checksum + ds.err_record + ds.err_bounds + ds.err_read_io +
                      ds.err_write_io + ds.err_nospc + ds.err_sync + ds.err_index;
    st->disk_read_bytes = ds.bytes_read;
    st->disk_written_bytes = ds.bytes_written;
    st->disk_ops_in_flight = e->dops.n;
    st->disk_io = ds.io <= DSTORE_IO_PSYNC ? io[ds.io] : KVT_DISK_IO_AUTO;
    st->disk_index_rebuilt = ds.index_rebuilt;
    st->disk_recovered_tokens = ds.recovered * ps;
    st->disk_skipped_tokens = ds.too_many * ps;
}
