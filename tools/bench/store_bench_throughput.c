/* kvtier-store-bench (a) throughput (store_bench.h): each page size x queue depth, the store and
 * fio rep by rep. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_bench.h"

struct samples {
    double *v[5]; /* store write, store read, fio write, fio synced write, fio read */
};

static int samples_alloc(struct samples *s, size_t reps)
{
    for (int k = 0; k < 5; k++)
        if (!(s->v[k] = calloc(reps, sizeof(double))))
            return sb_fail("samples", -ENOMEM);
    return 0;
}

static void samples_free(struct samples *s)
{
    for (int k = 0; k < 5; k++)
        free(s->v[k]);
}

/* Reps alternate store and fio, so that drift in the disk hits both alike. */
static int point_reps(struct bench *b, struct point *pt, const struct ring *ring,
                      const uint32_t *order, struct samples *sm)
{
    size_t reps = b->cfg->reps;

    pt->fio_ran = b->fio.usable;
    for (size_t i = 0; i < reps; i++) {
        double st[2], ft[3];

        if (sb_store_rep(b, pt, ring, order, st))
            return -1;
        sm->v[0][i] = st[0];
        sm->v[1][i] = st[1];
        if (pt->fio_ran && sb_fio_rep(b, pt, ft) == 0) {
            for (int k = 0; k < 3; k++)
                sm->v[2 + k][i] = ft[k];
        } else {
            pt->fio_ran = false;
            b->fio.usable = false; /* the note says why; later points skip fio too */
        }
    }
    pt->write = cli_summarize(sm->v[0], reps);
    pt->read = cli_summarize(sm->v[1], reps);
    if (pt->fio_ran) {
        pt->fio_write = cli_summarize(sm->v[2], reps);
        pt->fio_sync = cli_summarize(sm->v[3], reps);
        pt->fio_read = cli_summarize(sm->v[4], reps);
    }
    return 0;
}

static uint64_t point_pages(const struct config *cfg, uint64_t page_bytes)
{
    uint64_t n = cfg->pages_set ? cfg->pages : cfg->bytes / page_bytes;

    return n ? n : 1;
}

static int run_point(struct bench *b, struct point *pt)
{
    const struct config *cfg = b->cfg;
    /* Writes keep two ops of a batch in flight; reads use the first pages (read_batch). */
    uint64_t rpages = (uint64_t)read_batch(pt->queue_depth) * READ_OPS;
    uint64_t ring_pages = 2 * cfg->batch > rpages ? 2 * cfg->batch : rpages;
    struct ring ring = {0};
    struct samples sm = {{0}};
    uint32_t *order = NULL;
    char what[96];
    int rc = -1;

    if (ring_pages > pt->pages + 1)
        ring_pages = pt->pages + 1; /* every position has its own buffer */
    snprintf(what, sizeof(what), "%u B pages, queue depth %u", pt->page_bytes, pt->queue_depth);
    sb_progress("%s: throughput with %s\n", what);
    if (workdir_check_space(&b->wd, PROG,
                            (pt->pages + 1) * pt->slot_bytes + pt->pages * INDEX_BYTES_PER_PAGE,
                            "lower --bytes or --pages, or pick another --dir"))
        return -1;
    if (!(order = sb_read_order(cfg, pt->pages)))
        rc = sb_fail("read order", -ENOMEM);
    else if (!samples_alloc(&sm, cfg->reps) &&
             !sb_ring_create(&ring, pt->slot_bytes, ring_pages, b->buffers == BUF_HUGE)) {
        pt->buffer_bytes = ring.bytes;
        pt->huge_bytes = sb_huge_bytes_at(ring.base); /* touched by now: filled with random bytes */
        rc = point_reps(b, pt, &ring, order, &sm);
    }
    sb_ring_destroy(&ring);
    samples_free(&sm);
    free(order);
    return rc;
}

int sb_run_throughput(struct bench *b)
{
    const struct config *cfg = b->cfg;

    if (!cfg->pages_set || cfg->pages) {
        b->npt = cfg->page_bytes.n * cfg->queue_depth.n;
        if (!(b->pt = calloc(b->npt, sizeof(*b->pt))))
            return sb_fail("points", -ENOMEM);
    }
    for (size_t i = 0; i < b->npt; i++) {
        struct point *pt = &b->pt[i];

        pt->page_bytes = (uint32_t)cfg->page_bytes.v[i / cfg->queue_depth.n];
        pt->slot_bytes = sb_slot_of(pt->page_bytes);
        pt->read_block = sb_read_block_of(pt->page_bytes);
        pt->queue_depth = (uint32_t)cfg->queue_depth.v[i % cfg->queue_depth.n];
        pt->pages = point_pages(cfg, pt->page_bytes);
        if (run_point(b, pt))
            return -1;
    }
    return 0;
}
