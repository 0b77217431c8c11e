/*
 * The block store behind the store contract (store/store.h): a disk store is a struct
 * kvt_store around a struct dstore, each call passed through. The contract's page and
 * completion structs are the block store's own, field for field (checked below), so batches
 * pass without a copy.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "disk/ops.h"
#include "store/store.h"

#define SAME(a, b, f) (offsetof(struct a, f) == offsetof(struct b, f))
_Static_assert(sizeof(struct store_wpage) == sizeof(struct dstore_wpage) &&
                   SAME(store_wpage, dstore_wpage, key) &&
                   SAME(store_wpage, dstore_wpage, parent) && SAME(store_wpage, dstore_wpage, ns) &&
                   SAME(store_wpage, dstore_wpage, tokens) &&
                   SAME(store_wpage, dstore_wpage, buf) && SAME(store_wpage, dstore_wpage, parts) &&
                   SAME(store_wpage, dstore_wpage, nparts) && STORE_MAX_PARTS == DSTORE_MAX_PARTS,
               "store_wpage is dstore_wpage");
_Static_assert(sizeof(struct store_rpage) == sizeof(struct dstore_rpage) &&
                   SAME(store_rpage, dstore_rpage, key) && SAME(store_rpage, dstore_rpage, buf) &&
                   SAME(store_rpage, dstore_rpage, parts) &&
                   SAME(store_rpage, dstore_rpage, nparts),
               "store_rpage is dstore_rpage");
_Static_assert(sizeof(struct store_done) == sizeof(struct dstore_done) &&
                   SAME(store_done, dstore_done, op) && SAME(store_done, dstore_done, kind) &&
                   SAME(store_done, dstore_done, pages) && SAME(store_done, dstore_done, ok) &&
                   SAME(store_done, dstore_done, split) && SAME(store_done, dstore_done, near_ok) &&
                   SAME(store_done, dstore_done, remote_ok),
               "store_done is dstore_done");
_Static_assert((int)STORE_OP_READ == (int)DSTORE_OP_READ &&
                   (int)STORE_OP_WRITE == (int)DSTORE_OP_WRITE,
               "op kinds agree");
#undef SAME

struct disk_store {
    struct kvt_store base;
    struct dstore *d;
};

static struct dstore *dst(struct kvt_store *s)
{
    return ((struct disk_store *)s)->d;
}

static int disk_leading_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    return dstore_leading_run(dst(s), keys, n, run);
}

static int disk_read(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                     uint64_t *op, size_t *leading)
{
    return dstore_read(dst(s), (const struct dstore_rpage *)pages, n, results, op, leading);
}

static int disk_write(struct kvt_store *s, const struct store_wpage *pages, size_t n, int *results,
                      uint64_t *op)
{
    return dstore_write(dst(s), (const struct dstore_wpage *)pages, n, results, op);
}

static size_t disk_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    return dstore_poll(dst(s), (struct dstore_done *)done, max);
}

static int disk_wait_for(struct kvt_store *s, uint64_t op, int timeout_ms, struct store_done *done)
{
    return dstore_wait_for(dst(s), op, timeout_ms, (struct dstore_done *)done);
}

static int disk_drain(struct kvt_store *s)
{
    return dstore_drain(dst(s));
}

static void disk_stats(struct kvt_store *s, struct store_stats *st)
{
    struct dstore_stats ds;

    dstore_stats(dst(s), &ds);
    *st = (struct store_stats){
        .capacity_pages = ds.capacity_slots,
        .pages = ds.pages,
        .errors = ds.err_checksum + ds.err_record + ds.err_bounds + ds.err_read_io +
                  ds.err_write_io + ds.err_nospc + ds.err_sync + ds.err_index,
        .bytes_read = ds.bytes_read,
        .bytes_written = ds.bytes_written,
        .in_flight = ds.ops_in_flight,
        .too_many = ds.too_many,
        .recovered = ds.recovered,
        .index_rebuilt = ds.index_rebuilt,
        .io = ds.io,
    };
}

static void disk_close(struct kvt_store *s)
{
    dstore_close(dst(s));
    free(s);
}

static const struct store_ops disk_ops = {
    .name = "disk",
    .parts = true,
    .leading_run = disk_leading_run,
    .read = disk_read,
    .write = disk_write,
    .poll = disk_poll,
    .wait_for = disk_wait_for,
    .drain = disk_drain,
    .stats = disk_stats,
    .close = disk_close,
};

int store_disk_wrap(struct dstore *d, struct kvt_store **out)
{
    struct disk_store *s = calloc(1, sizeof(*s));
    struct dstore_info in;

    if (!s)
        return -ENOMEM;
    dstore_info(d, &in);
    s->base = (struct kvt_store){&disk_ops, in.page_bytes, in.page_tokens};
    s->d = d;
    *out = &s->base;
    return 0;
}

int store_disk_open(const struct dstore_options *o, struct kvt_store **out)
{
    struct dstore *d;
    int rc = dstore_open(o, &d);

    if (rc)
        return rc;
    if ((rc = store_disk_wrap(d, out)))
        dstore_close(d);
    return rc;
}

struct dstore *store_disk_dstore(struct kvt_store *s)
{
    return s && s->ops == &disk_ops ? dst(s) : NULL;
}
