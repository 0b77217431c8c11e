/*
 * The read path. The owner looks each key up in the index, checks the record, pins its slot
 * (so eviction cannot hand the slot to a write while the bytes are on their way) and queues
 * the I/O; an engine thread verifies the checksum when the bytes land and finishes the page.
 *
 * Before the rebuild has run the slot table is unknown, but nothing can reuse a slot then
 * either (writes wait for the rebuild), so a read pins without looking at the slot's state.
 * A bad record or bad bytes are a miss; the committer drops the record behind it, with the
 * other drops waiting (drop.c).
 */
#include "store_int.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Ask the committer to drop key's record: the one with digest, or the one naming slot g. */
static void drop_later(struct dstore *s, const uint8_t *key, uint32_t g, uint64_t digest)
{
    pthread_mutex_lock(&s->lock);
    drop_note_locked(s, key, g, digest);
    pthread_mutex_unlock(&s->lock);
}

/* Under the lock: the slot of a live record, pinned. -ENOENT when it is on its way out or
 * being written; -ESTALE when the slot table gives the slot to nobody or to another key (a
 * record left behind: it is dropped, unless the committer finds it changed since). */
static int pin_locked(struct dstore *s, const uint8_t *key, uint32_t g)
{
    uint8_t st;

    if (s->ro)
        return 0;
    if (table_known_locked(s)) {
        st = s->state[g];
        if (st == SLOT_FREE || (st == SLOT_USED && memcmp(s->skey[g], key, DSTORE_KEY_BYTES)))
            return -ESTALE;
        if (st != SLOT_USED)
            return -ENOENT;
    }
    if (s->pins[g] == UINT16_MAX)
        return -ENOENT; /* that many reads of one page in flight: this one misses */
    s->pins[g]++;
    return 0;
}

/* The page's result: the I/O's, then the checksum's, over the body and the tail block's
 * copy of the page's last bytes. A read past the end of the slab (-ENODATA: truncated under
 * us) is as bad as bad bytes. */
static int landed_result(const struct dstore *s, struct dop_page *p)
{
    uint8_t sum[16];

    if (p->res)
        return p->res;
    if (s->lay.tail) /* a page of whole blocks has no bytes beside its head */
        page_scatter(s, p, s->lay.body, s->lay.tail, p->block);
    if (s->fused) { /* the body's sum was taken as it came in (page_body_step) */
        if (s->lay.tail)
            page_hash_add(p->hash, p->block, s->lay.tail);
        page_hash_end(p->hash, sum);
    } else {
        page_sum(s, p, sum);
    }
    return memcmp(sum, p->sum, 16) ? KVT_ECORRUPT : 0;
}

static void count_read_locked(struct dstore *s, const struct dop_page *p, int res)
{
    if (res == KVT_ECORRUPT)
        s->st.err_checksum++;
    else if (res == -ENODATA)
        s->st.err_bounds++;
    else if (res)
        s->st.err_read_io++;
    if (res)
        return;
    s->st.read_hits++;
    s->st.bytes_read += s->page_bytes;
    s->st.cache_reads += p->cached;
    for (uint32_t i = 0; i < p->nio; i++)
        s->st.fixed_ios += p->io[i].fixed;
}

/* Under the lock: a hit counts as an access; bad bytes take the slot out of service until
 * the drop frees it. Before the rebuild the slot table is unknown: hits wait. */
static void slot_after_read_locked(struct dstore *s, const struct dop_page *p, int res)
{
    if (s->ro || s->broken)
        return;
    if (!s->ready) {
        if (!res)
            touch_early_locked(s, p->slot, p->key);
        return;
    }
    if (memcmp(s->skey[p->slot], p->key, DSTORE_KEY_BYTES))
        return;
    if (!res) {
        touch_locked(s, p->slot);
    } else if (res == KVT_ECORRUPT) {
        slot_unuse_locked(s, p->slot);
    }
}

/* When the bytes land (on an engine thread): check them and finish the page. */
static void read_landed(struct dio_req *req)
{
    struct dop_page *p = req->ctx;
    struct dop *op = p->op;
    struct dstore *s = op->s;
    int res;

    pthread_mutex_lock(&s->lock);
    p = page_io_landed_locked(req);
    pthread_mutex_unlock(&s->lock);
    if (!p)
        return; /* the page's other request is still on its way */
    res = landed_result(s, p);
    pthread_mutex_lock(&s->lock);
    count_read_locked(s, p, res);
    p->res = res == -ENODATA ? KVT_ECORRUPT : res;
    slot_after_read_locked(s, p, p->res);
    if (p->res == KVT_ECORRUPT) /* after the slot is out of service: the drop holds it */
        drop_note_locked(s, p->key, p->slot, 0);
    unpin_locked(s, p->slot);
    op_page_done_locked(s, op);
    pthread_mutex_unlock(&s->lock);
}

static bool in_bounds(struct dstore *s, const struct drec *r)
{
    bool in;

    pthread_mutex_lock(&s->lock);
    in = record_in_bounds_locked(s, r);
    pthread_mutex_unlock(&s->lock);
    return in;
}

/* A pinned page whose descriptor could not be opened: unpin and fail it. */
static int unusable_fd(struct dstore *s, struct dop_page *p)
{
    pthread_mutex_lock(&s->lock);
    unpin_locked(s, p->slot);
    s->st.err_read_io++;
    pthread_mutex_unlock(&s->lock);
    return -EIO;
}

/* Look the page up, pin its slot and fill its request; the page's result when it needs no
 * I/O (a miss, a bad record). */
static int prepare(struct dstore *s, struct dop_page *p)
{
    struct drec r;
    uint64_t digest = 0;
    uint32_t g;
    int rc = lookup_record(s, s->rtxn, p->key, &r, &digest);

    if (rc == KVT_ECORRUPT)
        drop_later(s, p->key, NO_SLOT, digest);
    if (rc)
        return rc;
    g = r.slab * s->slab_slots + r.slot;
    /* A reader beside a writer: the writer may have made or grown the slab since. */
    if (s->ro && !in_bounds(s, &r))
        slab_refresh(s, r.slab);
    pthread_mutex_lock(&s->lock);
    if (!record_in_bounds_locked(s, &r)) {
        s->st.err_bounds++;
        rc = KVT_ECORRUPT;
    } else {
        rc = pin_locked(s, p->key, g);
    }
    pthread_mutex_unlock(&s->lock);
    if (rc == KVT_ECORRUPT || rc == -ESTALE)
        drop_later(s, p->key, NO_SLOT, digest);
    if (rc)
        return rc == -ESTALE ? -ENOENT : rc;
    p->slot = g;
    memcpy(p->sum, r.sum, 16);
    if ((rc = page_io_prepare(s, p, g, false, read_landed)))
        return unusable_fd(s, p);
    if (s->fused) {
        page_hash_start(p->hash);
        p->io[0].each = page_body_step;
    }
    return 0;
}

/* Every page's result is settled here or by its I/O: the op always completes. */
int read_submit(struct dstore *s, struct dop *op, const struct dstore_rpage *pages, size_t *leading)
{
    struct dio_req *list = NULL, **tail = &list;
    struct iovec *iov = op->iov;
    int rc = snapshot_renew(s);
    uint32_t queued = 0;
    size_t lead = 0;

    for (uint32_t i = 0; i < op->n; i++) {
        struct dop_page *p = &op->pages[i];

        if (!pages[i].key ||
            !page_take_bytes(s, p, pages[i].buf, pages[i].parts, pages[i].nparts, &iov)) {
            p->res = -EINVAL;
            continue;
        }
        memcpy(p->key, pages[i].key, DSTORE_KEY_BYTES);
        p->res = rc ? rc : prepare(s, p);
        if (p->res)
            continue;
        *tail = &p->io[0];
        tail = &p->io[p->nio - 1].next;
        lead += queued++ == i; /* every page so far is on its way */
    }
    if (leading)
        *leading = lead;
    if (!rc)
        snapshot_reset(s);
    pthread_mutex_lock(&s->lock);
    s->st.reads += op->n;
    op->pending += queued;
    pthread_mutex_unlock(&s->lock);
    dio_submit(s->io, list);
    pthread_mutex_lock(&s->lock);
    op_page_done_locked(s, op); /* the submission's hold */
    pthread_mutex_unlock(&s->lock);
    return 0;
}
