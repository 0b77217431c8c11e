/*
 * A page store op's pages (pagestore_op.c): the caller's page descriptions checked and turned
 * into the block store's, with the buffers that takes. pagestore.c submits and waits.
 */
#ifndef KVT_STORE_DISK_PAGESTORE_OP_H
#define KVT_STORE_DISK_PAGESTORE_OP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "disk/store.h"
#include "kvtier_store.h"

struct ps_op {
    struct ps_op *next; /* the page store's list of ops submitted, not yet waited for */
    uint64_t id;
    uint32_t kind; /* enum dstore_op_kind */
    size_t n;
    const struct kvt_page *pages; /* the caller's, valid until the op is waited for */
    int *results;
    uint8_t *bounce; /* a page for each page that bounces, in order; or NULL */
    void **bufs;     /* each page's buffer: its one segment, its bounce page, or NULL (parts) */
    void **parts;    /* the segments of the pages that go in parts, in order; or NULL */
    struct dstore_wpage *w; /* the block store's pages: w for a write, r for a read */
    struct dstore_rpage *r;
};

/* Whether n pages (of page_bytes each) and their results are well formed: 0 or -EINVAL. */
int ps_check_pages(uint64_t page_bytes, const struct kvt_page *pages, size_t n, const int *results);

/* A new op of kind over n checked pages, described for the block store, a write's pages
 * gathered where they bounce; parts: whether the store under it takes pages in parts. 0 or
 * -ENOMEM. */
int ps_op_new(uint64_t page_bytes, bool parts, uint32_t kind, const struct kvt_page *pages,
              size_t n, int *results, struct ps_op **out);

/* A read op waited for: each page read into a bounce page scattered to its segments. */
void ps_op_land(struct ps_op *op);

/* NULL is a no-op. */
void ps_op_free(struct ps_op *op);

#endif
