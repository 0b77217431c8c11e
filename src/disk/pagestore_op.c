/*
 * A page store op's pages (pagestore_op.h). Pages of one segment go to the block store as they
 * are, and so do pages of several segments of one length (a page's K and V halves, its
 * layers), as the block store's parts. Other pages are gathered into (or read into and
 * scattered from) a bounce page aligned for O_DIRECT.
 */
#include "disk/pagestore_op.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BOUNCE_HUGE (2u << 20) /* a huge page: bounce regions this large ask for them */

int ps_check_pages(uint64_t page_bytes, const struct kvt_page *pages, size_t n, const int *results)
{
    if ((n && (!pages || !results)) || n > UINT32_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        const struct kvt_page *p = &pages[i];
        uint64_t sum = 0;
        if (!p->key || !p->nsegs || !p->segs)
            return -EINVAL;
        for (uint32_t k = 0; k < p->nsegs; k++) {
            if (!p->segs[k].addr && p->segs[k].len)
                return -EINVAL;
            sum += p->segs[k].len;
        }
        if (sum != page_bytes)
            return -EINVAL;
    }
    return 0;
}

/* Whether page p goes to the store in parts: segments of one length, as many as the store
 * takes, where the store takes parts (a chain with a server does not). */
static bool in_parts(bool parts, const struct kvt_page *p)
{
    if (!parts || p->nsegs < 2 || p->nsegs > DSTORE_MAX_PARTS)
        return false;
    for (uint32_t k = 0; k < p->nsegs; k++)
        if (p->segs[k].len != p->segs[0].len)
            return false;
    return true;
}

/* An op's buffers: one segment as it is, several of one length as parts, others through a
 * bounce page. */
static int op_buffers(uint64_t page_bytes, bool parts, struct ps_op *op)
{
    size_t multi = 0, nparts = 0, b = 0;

    for (size_t i = 0; i < op->n; i++) {
        if (in_parts(parts, &op->pages[i]))
            nparts += op->pages[i].nsegs;
        else
            multi += op->pages[i].nsegs > 1;
    }
    if (!(op->bufs = calloc(op->n ? op->n : 1, sizeof(void *))))
        return -ENOMEM;
    if (nparts && !(op->parts = calloc(nparts, sizeof(void *))))
        return -ENOMEM;
    if (multi && posix_memalign((void **)&op->bounce, 4096, multi * page_bytes))
        return -ENOMEM;
    /* Bounce pages on huge pages where the kernel gives them, as the engine's host pool: a
     * page's I/O is then a few DMA segments, not one per 4 KiB (kvtier-pagestore-bench, 64 KiB
     * pages of 2 segments on ext4: set 0.71 - 0.76 -> 1.00 - 1.03 GB/s, get 1.30 - 1.36 ->
     * 1.57 - 1.67). A region under one huge page cannot have one. */
    if (multi * page_bytes >= BOUNCE_HUGE)
        madvise(op->bounce, multi * page_bytes, MADV_HUGEPAGE);
    for (size_t i = 0, k = 0; i < op->n; i++) {
        const struct kvt_page *p = &op->pages[i];

        if (in_parts(parts, p))
            for (uint32_t j = 0; j < p->nsegs; j++)
                op->parts[k++] = p->segs[j].addr;
        else
            op->bufs[i] = p->nsegs > 1 ? op->bounce + b++ * page_bytes : p->segs[0].addr;
    }
    return 0;
}

/* Segments of no bytes may have no address: nothing is copied for them. */
static void gather(const struct kvt_page *p, uint8_t *to)
{
    for (uint32_t k = 0; k < p->nsegs; k++)
        if (p->segs[k].len) {
            memcpy(to, p->segs[k].addr, p->segs[k].len);
            to += p->segs[k].len;
        }
}

static void scatter(const struct kvt_page *p, const uint8_t *from)
{
    for (uint32_t k = 0; k < p->nsegs; k++)
        if (p->segs[k].len) {
            memcpy(p->segs[k].addr, from, p->segs[k].len);
            from += p->segs[k].len;
        }
}

/* The block store's page descriptors, gathering what needs it: before the lock, so that
 * other threads' calls do not wait for these copies. */
static int describe(struct ps_op *op)
{
    size_t k = 0;

    if (op->kind == DSTORE_OP_WRITE) {
        if (!(op->w = calloc(op->n ? op->n : 1, sizeof(*op->w))))
            return -ENOMEM;
    } else if (!(op->r = calloc(op->n ? op->n : 1, sizeof(*op->r)))) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < op->n; i++) {
        const struct kvt_page *p = &op->pages[i];
        uint32_t nparts = op->bufs[i] ? 0 : p->nsegs;
        void *const *parts = nparts ? op->parts + k : NULL;

        k += nparts;
        if (op->kind == DSTORE_OP_READ) {
            op->r[i] = (struct dstore_rpage){
                .key = p->key, .buf = op->bufs[i], .parts = parts, .nparts = nparts};
            continue;
        }
        if (p->nsegs > 1 && !nparts)
            gather(p, op->bufs[i]);
        op->w[i] = (struct dstore_wpage){.key = p->key,
                                         .parent = p->parent,
                                         .buf = op->bufs[i],
                                         .parts = (const void *const *)parts,
                                         .nparts = nparts};
    }
    return 0;
}

int ps_op_new(uint64_t page_bytes, bool parts, uint32_t kind, const struct kvt_page *pages,
              size_t n, int *results, struct ps_op **out)
{
    struct ps_op *op = calloc(1, sizeof(*op));
    int rc;

    if (!op)
        return -ENOMEM;
    *op = (struct ps_op){.kind = kind, .n = n, .pages = pages, .results = results};
    if ((rc = op_buffers(page_bytes, parts, op)) || (rc = describe(op))) {
        ps_op_free(op);
        return rc;
    }
    *out = op;
    return 0;
}

void ps_op_land(struct ps_op *op)
{
    if (op->kind == DSTORE_OP_READ)
        for (size_t i = 0; i < op->n; i++)
            if (op->results[i] == 0 && op->pages[i].nsegs > 1 && op->bufs[i])
                scatter(&op->pages[i], op->bufs[i]);
}

void ps_op_free(struct ps_op *op)
{
    if (!op)
        return;
    free(op->bounce);
    free(op->parts);
    free(op->bufs);
    free(op->w);
    free(op->r);
    free(op);
}
