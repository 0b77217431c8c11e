/*
 * Write batches, run by the committer (commit.c). A run of write ops queued back to back forms
 * one batch (up to max_batch pages): one round of I/O, one fdatasync per slab touched, one
 * index transaction (one flush of the index file).
 *
 * A batch: drop pages already stored, evict if the free slots fall short (and make that
 * durable before any slot is reused), reserve slots, write, fdatasync, commit the records
 * together with pending access times, then publish: slots become USED and the ops complete. A
 * page that fails anywhere gets its slot back and no record. A batch with no record to write
 * (its pages all stored already) commits nothing. In relaxed mode there is no fdatasync: the
 * slabs written wait for the next flush (flush.c), and the commit flushes nothing.
 *
 * The bytes go to the engine before their checksums are taken: the committer hashes the
 * batch while the I/O is in flight instead of before it (XXH3 over a 512 MiB batch is tens of
 * ms here). The buffers are the caller's and stay put until the op completes, and the engine
 * only reads them, so the sum is of the bytes written.
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- write batches ---- */

struct batch {
    struct dop_page **pg;
    size_t n;
    uint32_t *order;      /* page indices sorted by key, for duplicates */
    struct dop_page **io; /* the pages given to the engine */
    size_t nio;
    uint32_t *slabs; /* the slabs they fall in, each once */
    int *slab_rc;    /* per slab: its fdatasync's result */
    size_t nslabs;
};

static bool to_write(const struct dop_page *p)
{
    return !p->res && !p->dup && p->slot != NO_SLOT;
}

static int cmp_keys(const void *a, const void *b, void *arg)
{
    const struct batch *b_ = arg;
    uint32_t i = *(const uint32_t *)a, k = *(const uint32_t *)b;
    int c = memcmp(b_->pg[i]->key, b_->pg[k]->key, DSTORE_KEY_BYTES);

    return c ? c : (i > k) - (i < k);
}

/* A key twice in the batch is written once; the later pages follow the first. */
static void mark_batch_dups(struct batch *b)
{
    for (size_t i = 0; i < b->n; i++)
        b->order[i] = (uint32_t)i;
    qsort_r(b->order, b->n, sizeof(*b->order), cmp_keys, b);
    for (size_t i = 1; i < b->n; i++) {
        struct dop_page *first = b->pg[b->order[i - 1]], *p = b->pg[b->order[i]];

        if (!p->res && !first->res && !memcmp(first->key, p->key, DSTORE_KEY_BYTES)) {
            p->dup = true;
            p->dup_of = first->dup_of ? first->dup_of : first;
        }
    }
}

/* Pages whose key is stored and live already: done, and counted as an access. */
static void mark_stored(struct dstore *s, struct batch *b)
{
    struct drec r;
    uint64_t digest;

    if (mdb_txn_renew(s->ctxn))
        return;
    for (size_t i = 0; i < b->n; i++) {
        struct dop_page *p = b->pg[i];

        if (p->res || p->dup || lookup_record(s, s->ctxn, p->key, &r, &digest))
            continue;
        uint32_t g = r.slab * s->slab_slots + r.slot;

        pthread_mutex_lock(&s->lock);
        if (s->state[g] == SLOT_USED && !memcmp(s->skey[g], p->key, DSTORE_KEY_BYTES) &&
            s->pins[g] < UINT16_MAX) {
            p->dup = true;
            touch_locked(s, g);
            /* Pinned until the batch has its slots: the eviction that makes room for the
             * rest must not take the page this one is reported as. */
            s->pins[g]++;
            p->slot = g;
        }
        pthread_mutex_unlock(&s->lock);
    }
    mdb_txn_reset(s->ctxn);
}

/* The pins mark_stored took. */
static void unpin_stored(struct dstore *s, struct batch *b)
{
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < b->n; i++) {
        struct dop_page *p = b->pg[i];
        uint32_t g = p->slot;

        if (!p->dup || p->dup_of || g == NO_SLOT)
            continue;
        p->slot = NO_SLOT;
        unpin_locked(s, g);
    }
    pthread_mutex_unlock(&s->lock);
}

/* Slots for the pages to write, evicting what is missing first. */
/* A batch of more new pages than the store has slots (beside the batch's stored pages) could
 * only evict everything and still fail: its first pages go in (a chain's parents come first),
 * the rest are refused as too many, which is no fault of the disk. */
static size_t fit_batch_locked(struct dstore *s, struct batch *b, size_t need)
{
    size_t stored = 0, fit, seen = 0;

    for (size_t i = 0; i < b->n; i++)
        stored += b->pg[i]->dup && !b->pg[i]->dup_of && b->pg[i]->slot != NO_SLOT;
    fit = s->nslots > stored ? (size_t)s->nslots - stored : 0;
    if (need <= fit)
        return need;
    for (size_t i = 0; i < b->n; i++) {
        struct dop_page *p = b->pg[i];

        if (!p->res && !p->dup && ++seen > fit) {
            p->res = -ENOSPC;
            s->st.too_many++;
        }
    }
    return fit;
}

static void reserve(struct dstore *s, struct batch *b)
{
    size_t need = 0, have, evicted;

    for (size_t i = 0; i < b->n; i++)
        need += !b->pg[i]->res && !b->pg[i]->dup;
    pthread_mutex_lock(&s->lock);
    need = fit_batch_locked(s, b, need);
    have = s->nfree;
    pthread_mutex_unlock(&s->lock);
    if (have < need)
        evict_oldest(s, need - have, &evicted);
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < b->n; i++) {
        struct dop_page *p = b->pg[i];

        if (p->res || p->dup)
            continue;
        p->slot = pop_free_locked(s);
        if (p->slot == NO_SLOT) {
            p->res = -ENOSPC;
            s->st.err_nospc++;
            continue;
        }
        s->state[p->slot] = SLOT_RESERVED;
        memcpy(s->skey[p->slot], p->key, DSTORE_KEY_BYTES);
    }
    pthread_mutex_unlock(&s->lock);
}

static void write_landed(struct dio_req *req)
{
    struct dop_page *p = req->ctx;
    struct dstore *s = p->op->s;

    pthread_mutex_lock(&s->lock);
    s->st.fixed_ios += req->fixed && !req->res;
    if (page_io_landed_locked(req) && --s->batch_pending == 0)
        pthread_cond_signal(&s->io_cv);
    pthread_mutex_unlock(&s->lock);
}

static void count_write_error(struct dstore *s, int rc)
{
    pthread_mutex_lock(&s->lock);
    if (rc == -ENOSPC)
        s->st.err_nospc++;
    else
        s->st.err_write_io++;
    pthread_mutex_unlock(&s->lock);
}

static uint32_t slab_of(const struct dstore *s, uint32_t g)
{
    return g / s->slab_slots;
}

/* The index of slab in the batch's list, added when new. */
static size_t batch_slab(struct batch *b, uint32_t slab)
{
    size_t k = 0;

    while (k < b->nslabs && b->slabs[k] != slab)
        k++;
    if (k == b->nslabs) {
        b->slabs[b->nslabs] = slab;
        b->slab_rc[b->nslabs++] = 0;
    }
    return k;
}

/* The page's slab made whole and its requests filled; 0 or the error. */
static int prepare_write(struct dstore *s, struct dop_page *p)
{
    int rc = slab_ready(s, slab_of(s, p->slot));

    return rc ? rc : page_io_prepare(s, p, p->slot, true, write_landed);
}

/* The reserved pages in b->io, their slabs noted; a page that cannot be written fails. */
static void collect_writes(struct dstore *s, struct batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        struct dop_page *p = b->pg[i];

        if (!to_write(p))
            continue;
        if ((p->res = prepare_write(s, p))) {
            count_write_error(s, p->res);
            continue;
        }
        batch_slab(b, slab_of(s, p->slot));
        b->io[b->nio++] = p;
    }
}

/* Requests number which (0: bodies, 1: tail blocks) of the batch's pages, linked. */
static struct dio_req *requests(const struct dstore *s, struct batch *b, int which)
{
    struct dio_req *list = NULL, **tail = &list;
    bool body = s->lay.body != 0;

    for (size_t i = 0; i < b->nio; i++) {
        struct dop_page *p = b->io[i];
        struct dio_req *r = which == 0 ? (body ? &p->io[0] : NULL) : &p->io[p->nio - 1];

        if (!r)
            continue;
        r->next = NULL;
        *tail = r;
        tail = &r->next;
    }
    return list;
}

/* The page's tail block: its last bytes and its head, checksum and all. */
static void fill_block(struct dstore *s, struct dop_page *p, uint64_t now)
{
    struct page_head h = {
        .created = now,
        .slab = slab_of(s, p->slot),
        .slot = p->slot % s->slab_slots,
        .length = s->page_bytes,
        .ntokens = s->page_tokens,
        .fp_digest = s->fp_digest,
    };

    memcpy(h.key, p->key, DSTORE_KEY_BYTES);
    memcpy(h.parent, p->parent, DSTORE_KEY_BYTES);
    memcpy(h.ns, p->ns, DSTORE_NS_BYTES);
    memcpy(h.sum, p->sum, 16);
    layout_fill_tail(&s->lay, p->buf, &h, p->tokens, p->block);
}

/* Write every reserved page and wait for all of them. The bodies go first, straight from the
 * caller's buffers; the checksums are taken while they fly, and the tail blocks, which carry
 * them in the page heads, follow. */
static void write_pages(struct dstore *s, struct batch *b, uint64_t now)
{
    collect_writes(s, b);
    pthread_mutex_lock(&s->lock);
    s->batch_pending = (uint32_t)b->nio;
    pthread_mutex_unlock(&s->lock);
    dio_submit(s->io, requests(s, b, 0));
    /* Only the requests are shared with the engine: it reads buf and never writes it. */
    for (size_t i = 0; i < b->nio; i++) {
        page_checksum(b->io[i]->buf, s->page_bytes, b->io[i]->sum);
        fill_block(s, b->io[i], now);
    }
    dio_submit(s->io, requests(s, b, 1));
    pthread_mutex_lock(&s->lock);
    while (s->batch_pending)
        pthread_cond_wait(&s->io_cv, &s->lock);
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < b->nio; i++)
        if (b->io[i]->res)
            count_write_error(s, b->io[i]->res);
}

/* fdatasync each slab written once; a slab that fails fails its pages. */
static void sync_slabs(struct dstore *s, struct batch *b)
{
    for (size_t k = 0; k < b->nslabs; k++) {
        int rc = b->slab_rc[k] = slab_sync(s, b->slabs[k]);

        if (rc) {
            pthread_mutex_lock(&s->lock);
            s->st.err_sync++;
            pthread_mutex_unlock(&s->lock);
        }
    }
    for (size_t i = 0; i < b->nio; i++)
        if (!b->io[i]->res)
            b->io[i]->res = b->slab_rc[batch_slab(b, slab_of(s, b->io[i]->slot))];
}

/* Durable mode: the bytes on the disk before the records that name them commit. Relaxed
 * mode: they wait for a flush; the read's checksum covers a power cut before it. */
static void sync_or_note(struct dstore *s, struct batch *b)
{
    if (s->o.sync == DSTORE_SYNC_DURABLE) {
        sync_slabs(s, b);
        return;
    }
    for (size_t i = 0; i < b->nio; i++)
        if (!b->io[i]->res)
            flush_note(s, slab_of(s, b->io[i]->slot), s->slot_bytes);
}

static int put_record(struct dstore *s, MDB_txn *txn, const struct dop_page *p, uint64_t now,
                      uint8_t *buf)
{
    struct drec r = {
        .slab = slab_of(s, p->slot),
        .slot = p->slot % s->slab_slots,
        .length = s->page_bytes,
        .created = now,
        .last_access = now,
        .ntokens = s->page_tokens,
    };
    MDB_val k = {DSTORE_KEY_BYTES, (void *)p->key}, v = {rec_bytes(s->page_tokens), buf};
    int rc;

    memcpy(r.sum, p->sum, 16);
    memcpy(r.parent, p->parent, DSTORE_KEY_BYTES);
    memcpy(r.ns, p->ns, DSTORE_NS_BYTES);
    rec_encode(p->key, &r, p->tokens, buf);
    rc = index_err(mdb_put(txn, s->ix.pages, &k, &v, 0));
    return rc ? rc : slot_put(&s->ix, txn, p->slot, p->key, now, p->parent);
}

/* One transaction for the batch's records and up to DIRTY_MAX of the access times waiting.
 * A batch that writes no record (all stored already, or all failed) commits nothing: its
 * accesses wait for a later commit rather than cost a sync of their own. */
static int commit_pages(struct dstore *s, struct batch *b, uint64_t now)
{
    MDB_txn *txn;
    size_t records = 0;
    int rc;

    for (size_t i = 0; i < b->n; i++)
        records += to_write(b->pg[i]);
    if (!records)
        return 0;
    if ((rc = txn_begin(s, &txn)))
        return rc;
    for (size_t i = 0; i < b->n && !rc; i++)
        if (to_write(b->pg[i]))
            rc = put_record(s, txn, b->pg[i], now, s->recbuf);
    if (!rc) {
        persist_access(s, txn, DIRTY_MAX);
        return txn_commit(s, txn);
    }
    mdb_txn_abort(txn);
    count_index_error(s, rc);
    return rc;
}

/* Under the lock: the page's outcome into the slot table and the counters. */
static void settle_page_locked(struct dstore *s, struct dop_page *p, int rc, uint64_t now)
{
    if (p->dup) {
        p->res = p->dup_of ? p->dup_of->res : 0;
        s->st.write_dups += !p->res;
        return;
    }
    if (p->slot == NO_SLOT)
        return;
    if (!p->res && rc)
        p->res = rc;
    if (p->res) {
        s->state[p->slot] = SLOT_DYING; /* reserved, never named by a record */
        slot_release_locked(s, p->slot);
        return;
    }
    s->atime[p->slot] = now;
    slot_use_locked(s, p->slot, parent_tag(p->parent));
    s->st.writes++;
    s->st.bytes_written += s->page_bytes;
}

/* Duplicates last, so they copy their first page's final result. */
static void settle(struct dstore *s, struct batch *b, int rc, uint64_t now, struct djob *jobs)
{
    pthread_mutex_lock(&s->lock);
    for (int dups = 0; dups < 2; dups++)
        for (size_t i = 0; i < b->n; i++)
            if (b->pg[i]->dup == (dups == 1))
                settle_page_locked(s, b->pg[i], rc, now);
    for (struct djob *j = jobs; j; j = j->next)
        op_page_done_locked(s, j->op);
    pthread_mutex_unlock(&s->lock);
}

static size_t batch_pages(const struct djob *jobs)
{
    size_t n = 0;

    for (const struct djob *j = jobs; j; j = j->next)
        n += j->op->n;
    return n;
}

static int batch_init(struct batch *b, struct djob *jobs)
{
    size_t k = 0, room;

    b->n = batch_pages(jobs);
    room = b->n ? b->n : 1;
    b->pg = malloc(room * sizeof(*b->pg));
    b->order = malloc(room * sizeof(*b->order));
    b->io = malloc(room * sizeof(*b->io));
    b->slabs = malloc(room * sizeof(*b->slabs));
    b->slab_rc = malloc(room * sizeof(*b->slab_rc));
    if (!b->pg || !b->order || !b->io || !b->slabs || !b->slab_rc)
        return -ENOMEM;
    for (struct djob *j = jobs; j; j = j->next)
        for (uint32_t i = 0; i < j->op->n; i++)
            b->pg[k++] = &j->op->pages[i];
    return 0;
}

static void batch_free(struct batch *b)
{
    free(b->pg);
    free(b->order);
    free(b->io);
    free(b->slabs);
    free(b->slab_rc);
}

/* Fail every page of the jobs (no memory, or a store whose rebuild failed). */
static void fail_jobs(struct dstore *s, struct djob *jobs, int rc)
{
    pthread_mutex_lock(&s->lock);
    for (struct djob *j = jobs; j; j = j->next) {
        for (uint32_t i = 0; i < j->op->n; i++)
            if (!j->op->pages[i].res)
                j->op->pages[i].res = rc;
        op_page_done_locked(s, j->op);
    }
    pthread_mutex_unlock(&s->lock);
}

void batch_run(struct dstore *s, struct djob *jobs)
{
    struct batch b = {0};
    uint64_t now;
    int rc;

    pthread_mutex_lock(&s->lock);
    rc = s->broken;
    now = stamp_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (!rc)
        rc = batch_init(&b, jobs);
    if (rc) {
        fail_jobs(s, jobs, rc);
    } else {
        mark_batch_dups(&b);
        mark_stored(s, &b);
        reserve(s, &b);
        unpin_stored(s, &b);
        write_pages(s, &b, now);
        sync_or_note(s, &b);
        settle(s, &b, commit_pages(s, &b, now), now, jobs);
    }
    batch_free(&b);
}
