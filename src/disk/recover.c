/*
 * Recovery: the index rebuilt from the slab files alone, when the one found could not be
 * trusted (trust.c) or was lost. The committer runs it before the rebuild, so writes queue
 * behind it as they queue behind the rebuild; reads find pages as their records commit.
 *
 * Every slot's page head is read and checked (magic, check digest, the dir's fingerprint, the
 * slot it sits in, the page geometry); a slot with a good head gets its record back, unless
 * the key already has one written later (a page written again elsewhere leaves its old head
 * behind). The page bytes are not read: every read checks them against the head's checksum,
 * which the record keeps. A page deleted or evicted before the index was lost may come back
 * this way: it is a good page of this dir, as any read will check.
 */
#include "le.h"
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_BYTES (1u << 20) /* bytes read at once when slots are small */
#define PUT_CHUNK 4096       /* records per transaction */

struct recovery {
    MDB_txn *txn;
    size_t in_txn;
    uint8_t *buf, *recbuf;
    uint32_t run; /* slots read at once */
    uint64_t scanned, found, replaced;
};

static int begin(struct dstore *s, struct recovery *r)
{
    r->in_txn = 0;
    return index_err(mdb_txn_begin(s->ix.env, NULL, 0, &r->txn));
}

static int commit(struct recovery *r)
{
    int rc = index_err(mdb_txn_commit(r->txn));

    r->txn = NULL;
    return rc;
}

/* Whether the head describes a page of this dir written into slot g. */
static bool head_fits(const struct dstore *s, const struct page_head *h, uint32_t slab,
                      uint32_t slot)
{
    return h->fp_digest == s->fp_digest && h->slab == slab && h->slot == slot &&
           h->length == s->page_bytes && h->ntokens == s->page_tokens;
}

/* Whether key's record in txn was written no earlier than created; *old_g gets its slot. */
static bool newer_exists(struct dstore *s, MDB_txn *txn, const uint8_t *key, uint64_t created,
                         uint32_t *old_g)
{
    MDB_val k = {DSTORE_KEY_BYTES, (void *)key}, v;
    struct drec rec;

    *old_g = NO_SLOT;
    if (mdb_get(txn, s->ix.pages, &k, &v) || rec_decode(key, v.mv_data, v.mv_size, &rec))
        return false;
    *old_g = rec.slab * s->slab_slots + rec.slot;
    return rec.created >= created;
}

/* The record and slot entry a page head stands for. */
static int put_page(struct dstore *s, struct recovery *r, const struct page_head *h, uint32_t g)
{
    struct drec rec = {
        .slab = h->slab,
        .slot = h->slot,
        .length = h->length,
        .created = h->created,
        .last_access = h->created,
        .ntokens = h->ntokens,
    };
    MDB_val k = {DSTORE_KEY_BYTES, (void *)h->key}, v = {rec_bytes(h->ntokens), r->recbuf};
    uint32_t *tokens = (uint32_t *)(r->buf + r->run * (size_t)s->slot_bytes);
    uint32_t old_g;
    int rc;

    if (newer_exists(s, r->txn, h->key, h->created, &old_g))
        return 0;
    if (old_g != NO_SLOT && (rc = slot_del(&s->ix, r->txn, old_g)))
        return rc;
    r->replaced += old_g != NO_SLOT;
    memcpy(rec.sum, h->sum, 16);
    memcpy(rec.parent, h->parent, DSTORE_KEY_BYTES);
    memcpy(rec.ns, h->ns, DSTORE_NS_BYTES);
    for (uint32_t i = 0; i < h->ntokens; i++)
        tokens[i] = get32(h->tokens + 4 * (size_t)i);
    rec_encode(h->key, &rec, tokens, r->recbuf);
    if ((rc = index_err(mdb_put(r->txn, s->ix.pages, &k, &v, 0))))
        return rc;
    if ((rc = slot_put(&s->ix, r->txn, g, h->key, h->created, h->parent)))
        return rc;
    r->found++;
    if (++r->in_txn == PUT_CHUNK && (!(rc = commit(r))))
        rc = begin(s, r);
    return rc;
}

/* The slot's tail block, as read into block: its head, if it is one of ours, goes in. */
static int take_slot(struct dstore *s, struct recovery *r, const uint8_t *block, uint32_t slab,
                     uint32_t slot)
{
    struct page_head h;
    const struct slot_layout *l = &s->lay;

    r->scanned++;
    if (page_head_decode(block + l->head_off, l->tail_bytes - l->head_off, &h) ||
        !head_fits(s, &h, slab, slot))
        return 0;
    return put_page(s, r, &h, slab * s->slab_slots + slot);
}

/* Read n slots from first (whole slots when they are small, else their tail blocks alone). */
static int scan_run(struct dstore *s, struct recovery *r, int fd, uint32_t slab, uint32_t first,
                    uint32_t n)
{
    const struct slot_layout *l = &s->lay;
    bool whole = n > 1;
    uint64_t off = layout_slot_off(l, first) + (whole ? 0 : l->body);
    size_t len = whole ? (size_t)n * l->slot_bytes : l->tail_bytes;
    int rc = 0;

    if (pread(fd, r->buf, len, (off_t)off) != (ssize_t)len)
        return 0; /* unreadable: its pages stay unknown, as any read of them would fail */
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = take_slot(s, r, r->buf + (whole ? (size_t)i * l->slot_bytes + l->body : 0), slab,
                       first + i);
    return rc;
}

static int scan_slab(struct dstore *s, struct recovery *r, uint32_t slab)
{
    uint32_t valid;
    int fd, rc = 0;

    pthread_mutex_lock(&s->lock);
    valid = s->slabs[slab].valid;
    fd = valid ? slab_fd_locked(s, slab, r->buf) : -1;
    pthread_mutex_unlock(&s->lock);
    if (fd < 0)
        return 0;
    if ((uint64_t)slab * s->slab_slots + valid > s->nslots)
        valid = (uint32_t)(s->nslots - (uint64_t)slab * s->slab_slots);
    for (uint32_t i = 0; i < valid && !rc; i += r->run)
        rc = scan_run(s, r, fd, slab, i, valid - i < r->run ? valid - i : r->run);
    return rc;
}

static int alloc(struct dstore *s, struct recovery *r)
{
    void *p;

    r->run = s->slot_bytes <= RUN_BYTES / 16 ? RUN_BYTES / s->slot_bytes : 1;
    /* a run of slots (or one tail block), then room for a page's tokens */
    if (posix_memalign(&p, LAYOUT_BLOCK,
                       (size_t)r->run * s->slot_bytes + 4 * (size_t)s->page_tokens))
        return -ENOMEM;
    r->buf = p;
    r->recbuf = malloc(rec_bytes(s->page_tokens));
    return r->recbuf ? 0 : -ENOMEM;
}

int recover(struct dstore *s)
{
    struct recovery r = {0};
    int rc = alloc(s, &r);

    if (!rc)
        rc = begin(s, &r);
    for (uint32_t slab = 0; slab < s->nslabs && !rc; slab++)
        rc = scan_slab(s, &r, slab);
    if (r.txn)
        rc = rc ? (mdb_txn_abort(r.txn), rc) : commit(&r);
    pthread_mutex_lock(&s->lock);
    s->st.recovered += r.found - r.replaced;
    s->st.recover_scanned += r.scanned;
    pthread_mutex_unlock(&s->lock);
    free(r.buf);
    free(r.recbuf);
    return rc;
}
