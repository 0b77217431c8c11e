/*
 * A structural check of an LMDB data file, read as bytes (lmdb_check.h).
 *
 * LMDB's reads follow page numbers and offsets as they find them, and its writes go further:
 * deleting a node moves the bytes between the page's free-space bounds, adding one writes at
 * the upper bound, a page marked dirty is written in place. A damaged field there is a crash
 * on the first write, after any amount of reading went well. So every page a tree can reach
 * is checked against what LMDB's own code assumes of it, before LMDB sees the file.
 *
 * The layout is LMDB 0.9's on-disk format (MDB_DATA_VERSION 1, native byte order, pgno_t of
 * size_t), unchanged since 2012 and checked for in the meta page: a page header (pgno,
 * flags, lower and upper free-space bounds, then 16-bit node offsets), nodes of 8 header
 * bytes (data size or child page number, flags, key size) then key and data, packed from
 * the page's end down to its upper bound; overflow pages for big values; two meta pages.
 */
#include "lmdb_check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* from LMDB's format */
#define MDB_MAGIC 0xBEEFC0DEu
#define MDB_DATA_VERSION 1u
#define PAGEHDRSZ 16u
#define NODESIZE 8u
#define P_INVALID (~(uint64_t)0)
#define P_BRANCH 0x01u
#define P_LEAF 0x02u
#define P_OVERFLOW 0x04u
#define F_BIGDATA 0x01u
#define F_SUBDATA 0x02u
#define META_DBS 24u /* mm_dbs[2] in the meta, after magic, version, address and mapsize */
#define META_LAST 120u
#define META_TXNID 128u
#define DB_BYTES 48u  /* MDB_db */
#define MAX_DEPTH 32u /* LMDB's cursor stack */

struct db {
    uint32_t psize_or_pad;
    uint16_t flags, depth;
    uint64_t branch, leaf, overflow, entries, root;
};

struct walk {
    const uint8_t *map;
    uint64_t npages;  /* pages in use: up to the meta's last page */
    uint64_t in_file; /* of those, the pages the file holds (a tree's must be here) */
    uint32_t psize;
    uint8_t *seen;                            /* a bit per page: reached by a tree */
    uint64_t branch, leaf, overflow, entries; /* counted in the tree being walked */
    uint32_t depth;
    /* the main tree's named databases, walked after it */
    struct db named[LMDB_CHECK_MAX_DBS];
    int nnamed;
    /* what the tree's values must be, when that is known here (the free list) */
    int (*value)(struct walk *w, const uint8_t *data, uint64_t dsize);
};

static uint16_t u16(const uint8_t *p)
{
    uint16_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static uint32_t u32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static uint64_t u64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static void db_read(const uint8_t *p, struct db *d)
{
    d->psize_or_pad = u32(p);
    d->flags = u16(p + 4);
    d->depth = u16(p + 6);
    d->branch = u64(p + 8);
    d->leaf = u64(p + 16);
    d->overflow = u64(p + 24);
    d->entries = u64(p + 32);
    d->root = u64(p + 40);
}

static bool seen_set(struct walk *w, uint64_t pg)
{
    uint8_t bit = (uint8_t)(1u << (pg & 7));
    bool was = w->seen[pg >> 3] & bit;

    w->seen[pg >> 3] |= bit;
    return was;
}

static const uint8_t *page_at(const struct walk *w, uint64_t pg)
{
    return w->map + pg * w->psize;
}

/* A page number below limit, past the meta pages, reached once. */
static int claim_below(struct walk *w, uint64_t pg, uint64_t limit)
{
    if (pg < 2 || pg >= limit || seen_set(w, pg))
        return LMDB_CHECK_BAD;
    return 0;
}

/* A page a tree names: one the file holds. */
static int claim(struct walk *w, uint64_t pg)
{
    return claim_below(w, pg, w->in_file);
}

static int walk_overflow(struct walk *w, uint64_t pg, uint64_t dsize)
{
    const uint8_t *p;
    uint64_t n;

    if (claim(w, pg))
        return LMDB_CHECK_BAD;
    p = page_at(w, pg);
    n = u32(p + 12);
    if (u64(p) != pg || u16(p + 10) != P_OVERFLOW || n == 0 || n > w->in_file - pg ||
        dsize > n * w->psize - PAGEHDRSZ)
        return LMDB_CHECK_BAD;
    for (uint64_t i = 1; i < n; i++)
        if (seen_set(w, pg + i))
            return LMDB_CHECK_BAD;
    w->overflow += n;
    return 0;
}

static int walk_page(struct walk *w, uint64_t pg, uint32_t depth, bool main_tree);
static int check_free(struct walk *w, const uint8_t *idl, uint64_t bytes);

/* One node at offset off of a page of kind flags; *used gets its packed size. */
static int walk_node(struct walk *w, const uint8_t *p, uint32_t off, uint16_t flags, uint32_t depth,
                     bool main_tree, uint32_t *used)
{
    const uint8_t *n = p + off;
    uint32_t ksize = u16(n + 6), nflags = u16(n + 4), size = NODESIZE + ksize;
    uint64_t dsize = (uint64_t)u16(n) | (uint64_t)u16(n + 2) << 16;

    if (off % 2 || off + NODESIZE > w->psize || size > w->psize - off)
        return LMDB_CHECK_BAD;
    if (flags == P_BRANCH) {
        *used = (size + 1) & ~1u;
        return walk_page(w, dsize | (uint64_t)nflags << 32, depth + 1, main_tree);
    }
    if (nflags & ~(F_BIGDATA | (main_tree ? F_SUBDATA : 0)))
        return LMDB_CHECK_BAD;
    size += nflags & F_BIGDATA ? 8u : (uint32_t)(dsize < w->psize ? dsize : w->psize);
    if (size > w->psize - off)
        return LMDB_CHECK_BAD;
    *used = (size + 1) & ~1u;
    w->entries++;
    if (nflags & F_BIGDATA) {
        uint64_t ov = u64(n + NODESIZE + ksize);
        int rc = walk_overflow(w, ov, dsize);

        return rc || !w->value ? rc : w->value(w, page_at(w, ov) + PAGEHDRSZ, dsize);
    }
    if (w->value)
        return w->value(w, n + NODESIZE + ksize, dsize);
    if (main_tree && (nflags & F_SUBDATA)) {
        if (dsize != DB_BYTES || w->nnamed == LMDB_CHECK_MAX_DBS)
            return LMDB_CHECK_BAD;
        db_read(n + NODESIZE + ksize, &w->named[w->nnamed++]);
    }
    return 0;
}

/* A branch or leaf page and everything below it. */
static int walk_page(struct walk *w, uint64_t pg, uint32_t depth, bool main_tree)
{
    const uint8_t *p;
    uint16_t flags, lower, upper;
    uint32_t nkeys, packed = 0;

    if (depth > MAX_DEPTH || claim(w, pg))
        return LMDB_CHECK_BAD;
    p = page_at(w, pg);
    flags = u16(p + 10);
    lower = u16(p + 12);
    upper = u16(p + 14);
    /* Exactly a branch or a leaf: a dirty bit would have LMDB write the map in place. */
    if (u64(p) != pg || (flags != P_BRANCH && flags != P_LEAF) || lower < PAGEHDRSZ ||
        lower > upper || upper > w->psize || (lower - PAGEHDRSZ) % 2)
        return LMDB_CHECK_BAD;
    nkeys = (lower - PAGEHDRSZ) / 2;
    if (flags == P_BRANCH ? nkeys < 1 : false)
        return LMDB_CHECK_BAD;
    *(flags == P_BRANCH ? &w->branch : &w->leaf) += 1;
    if (depth > w->depth)
        w->depth = depth;
    for (uint32_t i = 0; i < nkeys; i++) {
        uint32_t off = u16(p + PAGEHDRSZ + 2 * i), used;
        int rc;

        if (off < upper || (rc = walk_node(w, p, off, flags, depth, main_tree, &used)))
            return LMDB_CHECK_BAD;
        packed += used;
    }
    /* Nodes sit packed between the upper bound and the page's end. */
    return packed == w->psize - upper ? 0 : LMDB_CHECK_BAD;
}

/* A whole tree against its MDB_db record. */
static int walk_tree(struct walk *w, const struct db *d, bool main_tree)
{
    int rc;

    w->branch = w->leaf = w->overflow = w->entries = 0;
    w->depth = 0;
    if (d->root == P_INVALID)
        return d->entries || d->depth ? LMDB_CHECK_BAD : 0;
    if ((rc = walk_page(w, d->root, 1, main_tree)))
        return rc;
    if (w->entries != d->entries || w->depth != d->depth || w->branch != d->branch ||
        w->leaf != d->leaf || w->overflow != d->overflow)
        return LMDB_CHECK_BAD;
    return 0;
}

/* The meta LMDB would pick: valid magic and version, the larger transaction id. */
static const uint8_t *pick_meta(const uint8_t *map, size_t size, uint32_t *psize)
{
    const uint8_t *best = NULL;
    uint64_t best_txn = 0;

    for (int i = 0; i < 2; i++) {
        const uint8_t *m;
        uint32_t ps;

        if (size < PAGEHDRSZ + META_TXNID + 8)
            return NULL;
        m = map + PAGEHDRSZ;
        if (i == 1) { /* the second meta page sits one page (the first's size) in */
            ps = u32(m + META_DBS);
            if (ps < 512 || ps > 65536 || ps & (ps - 1) || size < 2ull * ps)
                break;
            m = map + ps + PAGEHDRSZ;
        }
        if (u32(m) != MDB_MAGIC || u32(m + 4) != MDB_DATA_VERSION)
            continue;
        if (!best || u64(m + META_TXNID) > best_txn) {
            best = m;
            best_txn = u64(m + META_TXNID);
        }
    }
    if (best)
        *psize = u32(best + META_DBS);
    return best;
}

/* The free list: per transaction, a count and the page numbers, largest first; every one a
 * page no tree holds, and none twice. Free pages may lie past the file's end (LMDB says so
 * of its last page number), which is why tree pages are checked against the file alone. */
static int check_free(struct walk *w, const uint8_t *idl, uint64_t bytes)
{
    uint64_t n = bytes >= 8 ? u64(idl) : 0, prev = P_INVALID;

    if (bytes < 8 || bytes % 8 || n != bytes / 8 - 1)
        return LMDB_CHECK_BAD;
    for (uint64_t i = 1; i <= n; i++) {
        uint64_t pg = u64(idl + 8 * i);

        if (pg >= prev || claim_below(w, pg, w->npages))
            return LMDB_CHECK_BAD;
        prev = pg;
    }
    return 0;
}

/* ---- the file ---- */

int lmdb_check(const void *map, size_t size)
{
    struct walk w = {.map = map};
    const uint8_t *meta = pick_meta(map, size, &w.psize);
    struct db free_db, main_db;
    int rc;

    if (!meta || w.psize < 512 || w.psize > 65536 || (w.psize & (w.psize - 1)))
        return LMDB_CHECK_BAD;
    w.npages = u64(meta + META_LAST) + 1;
    w.in_file = size / w.psize < w.npages ? size / w.psize : w.npages;
    /* Pages past the file's end are the last transactions' freed ones, a few; a meta naming
     * many more would have LMDB map (and allocate) what was never there. */
    if (w.npages < 2 || w.in_file < 2 || w.npages - w.in_file > w.in_file / 4 + 1024)
        return LMDB_CHECK_BAD;
    if (!(w.seen = calloc((size_t)(w.npages + 7) / 8, 1)))
        return -ENOMEM;
    db_read(meta + META_DBS, &free_db);
    db_read(meta + META_DBS + DB_BYTES, &main_db);
    w.value = check_free;
    rc = walk_tree(&w, &free_db, false);
    w.value = NULL;
    if (!rc)
        rc = walk_tree(&w, &main_db, true);
    for (int i = 0; i < w.nnamed && !rc; i++)
        rc = walk_tree(&w, &w.named[i], false);
    free(w.seen);
    return rc;
}
