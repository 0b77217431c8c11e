/*
 * Write batches, run by the committer (commit.c). A run of write ops queued back to back forms
 * one batch (up to max_batch pages): one round of I/O; the batches whose I/O has landed then
 * share one fdatasync per slab touched and one index transaction (one flush of the index
 * file).
 *
 * A batch starts: drop pages already stored, evict if the free slots fall short (the records reads
 * found bad go first, drop.c, then the oldest pages, with room for the next batch too; either
 * durable before any slot is reused), reserve slots, submit the writes. It joins the pipe, the
 * batches in flight, oldest first, and the committer goes on: the next batch's I/O flies while an
 * earlier one's sync and commit run. A batch retires once its I/O has landed, with every landed
 * batch before it as one group: fdatasync, then commit the group's records together with pending
 * access times, then publish: slots become USED and the ops complete, in the order they were
 * queued. In durable mode a landed group may wait a little for a batch in flight behind it
 * (batch_retire_now_locked), so that one joins it. A page that fails anywhere gets its slot back
 * and no record. A group with no record to write (its pages all stored already) commits nothing.
 * In relaxed mode there is no fdatasync: the slabs written wait for the next flush (flush.c), and
 * the commit flushes nothing.
 *
 * Why the crash order holds with batches in flight (docs/design.md, "When bytes reach the disk"):
 * a group is the landed batches at the head of the pipe, chosen before its fdatasync is called, so
 * every byte its records name landed before the sync that covers it; a batch still in flight never
 * commits with it (waiting for one to land changes nothing: the group is still taken, landed
 * batches only, when the committer retires it), and nothing retires ahead of an older batch. The
 * deletions that make room for a batch commit (and flush, in durable mode) in reserve, before its
 * writes are submitted, as before. A batch never shares a key with one in flight (the pipe drains
 * first), so the dedup against the index and the slot table sees every earlier write.
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
    struct batch *next; /* the pipe: the next younger batch in flight */
    struct djob *jobs;  /* the write jobs it runs; freed when it retires */
    uint64_t now;       /* its pages' creation and access time */
    uint64_t landed;    /* locked: mono_ns() when pending reached 0 */
    uint32_t pending;   /* locked: pages whose I/O has not landed yet */
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

/* Whether the slot table shows p's key in no used slot: then its record, if any, names no
 * live slot, and the index need not be asked (most pages a batch writes are new). */
static bool surely_new(struct dstore *s, const struct dop_page *p)
{
    bool absent;

    pthread_mutex_lock(&s->lock);
    absent = tag_absent_locked(s, p->key);
    pthread_mutex_unlock(&s->lock);
    return absent;
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

        if (p->res || p->dup || surely_new(s, p) || lookup_record(s, s->ctxn, p->key, &r, &digest))
            continue;
        uint32_t g = r.slab * s->slab_slots + r.slot;

        pthread_mutex_lock(&s->lock);
        if (s->state[g] == SLOT_USED && !memcmp(s->skey[g], p->key, DSTORE_KEY_BYTES) &&
            s->pins[g] < UINT16_MAX) {
            p->dup = true;
            touch_locked(s, g);
            /* Pinned until the batch retires: no eviction (the one that makes room for the
             * rest, or a later batch's while this one is in flight) may take the page this
             * one is reported as. */
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
    stored += s->piped_pages; /* the batches in flight hold slots too */
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

/* Slots a batch that must evict frees beyond its own need: room for the next batch too, so
 * that evictions (a commit and two flushes of the index each, in durable mode) come once per
 * full batch written rather than once per batch, and delete their records together (fewer
 * index pages rewritten per record). At most a 256th of the store waits free for it. */
static size_t evict_ahead(const struct dstore *s)
{
    size_t most = s->nslots / 256;

    return s->o.max_batch < most ? s->o.max_batch : most;
}

static void reserve(struct dstore *s, struct batch *b)
{
    size_t need = 0, have, evicted, drops;

    for (size_t i = 0; i < b->n; i++)
        need += !b->pg[i]->res && !b->pg[i]->dup;
    pthread_mutex_lock(&s->lock);
    need = fit_batch_locked(s, b, need);
    have = s->nfree;
    drops = s->ndrops;
    pthread_mutex_unlock(&s->lock);
    if (have < need && drops) { /* the slots of bad pages first, before good pages go */
        drops_run(s);
        pthread_mutex_lock(&s->lock);
        have = s->nfree;
        pthread_mutex_unlock(&s->lock);
    }
    if (have < need)
        evict_oldest(s, need - have + evict_ahead(s), &evicted);
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
    if (page_io_landed_locked(req) && --p->op->batch->pending == 0) {
        p->op->batch->landed = mono_ns();
        pthread_cond_signal(&s->job_cv); /* the committer waits there for the oldest */
    }
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
    int rc = slab_ready(s, slab_of(s, p->slot), p->slot % s->slab_slots);

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

/* The rest of the page's tail block, whose first bytes hold its last bytes already
 * (page_gather): its head, checksum and all. */
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
    layout_fill_tail(&s->lay, &h, p->tokens, p->block);
}

/* A fused store: the body has landed (on an engine thread), its checksum with it. The rest of
 * the page joins the sum and the tail block, which carries it, follows; after a failed body
 * it is never written. The page is not touched once its last request is in the engine's
 * hands: its landing may finish the batch. */
static void body_landed(struct dio_req *r)
{
    struct dop_page *p = r->ctx;
    struct dstore *s = p->op->s;
    struct dio_req *tail = &p->io[p->nio - 1];

    if (!r->res) {
        page_gather(s, p, s->lay.body, s->lay.tail, p->block);
        page_hash_add(p->hash, p->block, s->lay.tail);
        page_hash_end(p->hash, p->sum);
        fill_block(s, p, p->op->batch->now);
    }
    write_landed(r);
    if (r->res) {
        tail->res = r->res;
        write_landed(tail);
        return;
    }
    tail->next = NULL;
    dio_submit(s->io, tail);
}

/* Write every reserved page; the batch's pending counts them down as they land. The bodies
 * go first, straight from the caller's buffers; the checksums are taken while they fly, and
 * the tail blocks, which carry them in the page heads, follow. A fused store takes each
 * body's checksum in the engine's copy and sends its tail from there (body_landed). */
static void submit_pages(struct dstore *s, struct batch *b)
{
    collect_writes(s, b);
    pthread_mutex_lock(&s->lock);
    b->pending = (uint32_t)b->nio;
    b->landed = mono_ns(); /* for a batch with nothing to write; a write's landing resets it */
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; s->fused && i < b->nio; i++) {
        page_hash_start(b->io[i]->hash);
        b->io[i]->io[0].each = page_body_step;
        b->io[i]->io[0].complete = body_landed;
    }
    dio_submit(s->io, requests(s, b, 0));
    if (s->fused)
        return;
    /* Only the requests are shared with the engine: it reads buf and never writes it. */
    for (size_t i = 0; i < b->nio; i++) {
        page_sum(s, b->io[i], b->io[i]->sum);
        page_gather(s, b->io[i], s->lay.body, s->lay.tail, b->io[i]->block);
        fill_block(s, b->io[i], b->now);
    }
    dio_submit(s->io, requests(s, b, 1));
}

/* ---- a group of landed batches: one sync, one commit ---- */

/* An earlier batch of the group that synced slab already: its result, else 1. */
static int synced_before(const struct batch *group, const struct batch *b, uint32_t slab)
{
    for (const struct batch *a = group; a != b; a = a->next)
        for (size_t k = 0; k < a->nslabs; k++)
            if (a->slabs[k] == slab)
                return a->slab_rc[k];
    return 1;
}

/* fdatasync each slab the group wrote, once; a slab that fails fails its pages. */
static void sync_slabs(struct dstore *s, struct batch *group)
{
    for (struct batch *b = group; b; b = b->next)
        for (size_t k = 0; k < b->nslabs; k++) {
            int rc = synced_before(group, b, b->slabs[k]);

            if (rc == 1 && (rc = slab_sync(s, b->slabs[k]))) {
                pthread_mutex_lock(&s->lock);
                s->st.err_sync++;
                pthread_mutex_unlock(&s->lock);
            }
            b->slab_rc[k] = rc;
        }
    for (struct batch *b = group; b; b = b->next)
        for (size_t i = 0; i < b->nio; i++)
            if (!b->io[i]->res)
                b->io[i]->res = b->slab_rc[batch_slab(b, slab_of(s, b->io[i]->slot))];
}

/* Durable mode: the bytes on the disk before the records that name them commit. Relaxed
 * mode: they wait for a flush; the read's checksum covers a power cut before it. */
static void sync_or_note(struct dstore *s, struct batch *group)
{
    for (struct batch *b = group; b; b = b->next)
        for (size_t i = 0; i < b->nio; i++)
            if (b->io[i]->res)
                count_write_error(s, b->io[i]->res);
    if (s->o.sync == DSTORE_SYNC_DURABLE) {
        sync_slabs(s, group);
        return;
    }
    for (struct batch *b = group; b; b = b->next)
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

static size_t group_records(const struct batch *group)
{
    size_t records = 0;

    for (const struct batch *b = group; b; b = b->next)
        for (size_t i = 0; i < b->n; i++)
            records += to_write(b->pg[i]);
    return records;
}

/* One transaction for the group's records and up to DIRTY_MAX of the access times waiting.
 * A group that writes no record (all stored already, or all failed) commits nothing: its
 * accesses wait for a later commit rather than cost a sync of their own. */
static int commit_group(struct dstore *s, struct batch *group)
{
    MDB_txn *txn;
    int rc;

    if (!group_records(group))
        return 0;
    if ((rc = txn_begin(s, &txn)))
        return rc;
    for (struct batch *b = group; b && !rc; b = b->next)
        for (size_t i = 0; i < b->n && !rc; i++)
            if (to_write(b->pg[i]))
                rc = put_record(s, txn, b->pg[i], b->now, s->recbuf);
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
static void settle(struct dstore *s, struct batch *b, int rc)
{
    pthread_mutex_lock(&s->lock);
    for (int dups = 0; dups < 2; dups++)
        for (size_t i = 0; i < b->n; i++)
            if (b->pg[i]->dup == (dups == 1))
                settle_page_locked(s, b->pg[i], rc, b->now);
    for (struct djob *j = b->jobs; j; j = j->next)
        op_page_done_locked(s, j->op);
    pthread_mutex_unlock(&s->lock);
}

/* ---- a batch's life ---- */

static size_t batch_pages(const struct djob *jobs)
{
    size_t n = 0;

    for (const struct djob *j = jobs; j; j = j->next)
        n += j->op->n;
    return n;
}

static void batch_free(struct batch *b)
{
    if (!b)
        return;
    free(b->pg);
    free(b->order);
    free(b->io);
    free(b->slabs);
    free(b->slab_rc);
    free(b);
}

static struct batch *batch_new(struct djob *jobs, uint64_t now)
{
    struct batch *b = calloc(1, sizeof(*b));
    size_t k = 0, room;

    if (!b)
        return NULL;
    b->jobs = jobs;
    b->now = now;
    b->n = batch_pages(jobs);
    room = b->n ? b->n : 1;
    b->pg = malloc(room * sizeof(*b->pg));
    b->order = malloc(room * sizeof(*b->order));
    b->io = malloc(room * sizeof(*b->io));
    b->slabs = malloc(room * sizeof(*b->slabs));
    b->slab_rc = malloc(room * sizeof(*b->slab_rc));
    if (!b->pg || !b->order || !b->io || !b->slabs || !b->slab_rc) {
        batch_free(b);
        return NULL;
    }
    for (struct djob *j = jobs; j; j = j->next) {
        j->op->batch = b;
        for (uint32_t i = 0; i < j->op->n; i++)
            b->pg[k++] = &j->op->pages[i];
    }
    return b;
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

/* Whether the sorted keys of a and b meet. */
static bool keys_meet(const struct batch *a, const struct batch *b)
{
    size_t i = 0, k = 0;

    while (i < a->n && k < b->n) {
        int c = memcmp(a->pg[a->order[i]]->key, b->pg[b->order[k]]->key, DSTORE_KEY_BYTES);

        if (!c)
            return true;
        c < 0 ? i++ : k++;
    }
    return false;
}

/* Whether b writes a key a batch in flight writes too: that one must commit first, so that b
 * finds it stored (or rewrites it once it is). */
static bool meets_pipe(const struct dstore *s, const struct batch *b)
{
    for (const struct batch *a = s->pipe; a; a = a->next)
        if (keys_meet(a, b))
            return true;
    return false;
}

static void pipe_push(struct dstore *s, struct batch *b)
{
    if (s->pipe_tail)
        s->pipe_tail->next = b;
    else
        s->pipe = b;
    s->pipe_tail = b;
    s->piped++;
    s->piped_pages += b->n;
}

bool batch_room_locked(const struct dstore *s, size_t pages)
{
    if (!s->pipe)
        return true;
    /* Every slot a batch in flight holds is out of eviction's reach: half the store at most,
     * so a batch that may take a quarter always finds room beside them. */
    return s->piped < PIPE_BATCHES && s->piped_pages + pages <= s->nslots / 2;
}

bool batch_landed_locked(const struct dstore *s)
{
    return s->pipe && s->pipe->pending == 0;
}

static uint64_t group_wait_ns(const struct dstore *s)
{
    return (s->o.group_wait_us ? s->o.group_wait_us : DSTORE_GROUP_WAIT_US) * 1000ull;
}

/* Under the lock, with the head of the pipe landed: whether its group retires now. In durable
 * mode it waits while a batch behind it is still in flight, up to group_wait_us after the head
 * landed, so that batch joins the group: one fdatasync of the slabs and one commit for both.
 * A commit flushes every index page its records touch, and random keys touch most leaves of
 * the index whatever their number, so records per commit are what saves. It never waits for
 * writes not yet submitted (a lone batch retires at once, so a caller that waits for each
 * write never pays), nor while anything is queued behind the pipe (a write the full pipe
 * keeps out, a delete, a flush), nor at stop. *until: when it retires at the latest. */
bool batch_retire_now_locked(const struct dstore *s, uint64_t *until)
{
    const struct batch *b = s->pipe;

    while (b && !b->pending)
        b = b->next;
    if (!b || s->o.sync != DSTORE_SYNC_DURABLE || s->jhead || s->stop || s->drops_unheld)
        return true;
    *until = s->pipe->landed + group_wait_ns(s);
    return mono_ns() >= *until;
}

void batch_start(struct dstore *s, struct djob *jobs)
{
    struct batch *b = NULL;
    uint64_t now;
    int rc;

    pthread_mutex_lock(&s->lock);
    rc = s->broken;
    now = stamp_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (!rc && !(b = batch_new(jobs, now)))
        rc = -ENOMEM;
    if (rc) {
        batch_drain(s); /* ops complete in the order they came */
        fail_jobs(s, jobs, rc);
        job_free_all(jobs);
        return;
    }
    mark_batch_dups(b);
    if (meets_pipe(s, b))
        batch_drain(s);
    mark_stored(s, b);
    reserve(s, b);
    submit_pages(s, b);
    pipe_push(s, b);
}

/* Under the lock: the landed batches at the head of the pipe, taken off it. */
static struct batch *take_landed_locked(struct dstore *s)
{
    struct batch *group = s->pipe, *last = NULL;

    for (struct batch *b = s->pipe; b && !b->pending; b = b->next)
        last = b;
    if (!last)
        return NULL;
    s->pipe = last->next;
    if (!s->pipe)
        s->pipe_tail = NULL;
    last->next = NULL;
    for (struct batch *b = group; b; b = b->next) {
        s->piped--;
        s->piped_pages -= b->n;
    }
    return group;
}

void batch_retire(struct dstore *s)
{
    struct batch *group, *next;
    int rc;

    pthread_mutex_lock(&s->lock);
    group = take_landed_locked(s);
    s->st.groups += group != NULL;
    pthread_mutex_unlock(&s->lock);
    if (!group)
        return;
    sync_or_note(s, group);
    rc = commit_group(s, group);
    for (struct batch *b = group; b; b = next) {
        next = b->next;
        unpin_stored(s, b);
        settle(s, b, rc);
        job_free_all(b->jobs);
        batch_free(b);
    }
}

void batch_drain(struct dstore *s)
{
    while (s->pipe) {
        pthread_mutex_lock(&s->lock);
        while (s->pipe->pending)
            pthread_cond_wait(&s->job_cv, &s->lock);
        pthread_mutex_unlock(&s->lock);
        batch_retire(s);
    }
}
