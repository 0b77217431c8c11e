/*
 * The order pages leave the disk in: access times kept in the index (batched, written with
 * the committer's next transaction), and eviction of the oldest unpinned pages, chain ends
 * first (the choice is slots.c's pick_victims_locked). The committer's thread only.
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- access times ---- */

static size_t take_dirty(struct dstore *s, struct touched *t)
{
    size_t n = 0;

    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < s->ndirty; i++) {
        uint32_t g = s->dirty[i];

        s->dirty_bit[g] = 0;
        if (s->state[g] != SLOT_USED)
            continue;
        t[n].g = g;
        memcpy(t[n].key, s->skey[g], DSTORE_KEY_BYTES);
        t[n++].atime = s->atime[g];
    }
    s->ndirty = 0;
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* Rewrite one record's last access, if it still names the slot that was read. */
static int persist_one(struct dstore *s, MDB_txn *txn, const struct touched *t, uint8_t *buf)
{
    MDB_val k = {DSTORE_KEY_BYTES, (void *)t->key}, v;
    struct drec r;
    int rc = mdb_get(txn, s->ix.pages, &k, &v);

    if (rc)
        return rc == MDB_NOTFOUND ? 0 : index_err(rc);
    /* recbuf holds a record of the dir's page_tokens: anything else is not rewritten. */
    if (rec_decode(t->key, v.mv_data, v.mv_size, &r) || r.ntokens != s->page_tokens ||
        (uint64_t)r.slab * s->slab_slots + r.slot != t->g || r.last_access >= t->atime)
        return 0;
    rec_touch(t->key, v.mv_data, v.mv_size, t->atime, buf);
    v.mv_data = buf;
    if ((rc = index_err(mdb_put(txn, s->ix.pages, &k, &v, 0))))
        return rc;
    return slot_put(&s->ix, txn, t->g, t->key, t->atime, r.parent);
}

/* Persist the access times waiting, inside txn. They are hints for the order after a
 * restart: one that fails is lost, nothing else. */
void persist_access(struct dstore *s, MDB_txn *txn)
{
    size_t n = take_dirty(s, s->touched);

    for (size_t i = 0; i < n && !persist_one(s, txn, &s->touched[i], s->recbuf); i++)
        ;
}

void flush_access(struct dstore *s)
{
    MDB_txn *txn;
    uint32_t waiting;

    pthread_mutex_lock(&s->lock);
    waiting = s->ndirty;
    pthread_mutex_unlock(&s->lock);
    if (!waiting || txn_begin(s, &txn))
        return;
    persist_access(s, txn);
    txn_commit(s, txn);
}

/* ---- eviction ---- */

/* One transaction forgetting the victims: records and slot-table entries. */
static int forget_victims(struct dstore *s, const uint32_t *v, size_t n)
{
    MDB_txn *txn;
    uint32_t slot;
    int rc = txn_begin(s, &txn);

    if (rc)
        return rc;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = delete_record(s, txn, s->skey[v[i]], (struct rec_match){.g = v[i]}, &slot);
        if (rc == -ENOENT)
            rc = 0;
        if (!rc)
            rc = slot_del(&s->ix, txn, v[i]);
    }
    if (rc) {
        mdb_txn_abort(txn);
        return rc;
    }
    return txn_commit(s, txn);
}

/* Delete up to want LRU records in one durable commit; only then are their slots free. */
int evict_oldest(struct dstore *s, size_t want, size_t *evicted)
{
    uint32_t *v = malloc((want ? want : 1) * sizeof(*v));
    size_t n;
    int rc = 0;

    *evicted = 0;
    if (!v)
        return -ENOMEM;
    pthread_mutex_lock(&s->lock);
    n = pick_victims_locked(s, want, v);
    pthread_mutex_unlock(&s->lock);
    if (n)
        rc = forget_victims(s, v, n);
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++)
        rc ? slot_revive_locked(s, v[i]) : slot_release_locked(s, v[i]);
    if (!rc) {
        s->st.evicted += n;
        *evicted = n;
    }
    pthread_mutex_unlock(&s->lock);
    free(v);
    return rc;
}
