/*
 * The index's records as the store's files use them: a record looked up and checked against
 * the dir's geometry, a record deleted when it matches, and the write transactions around
 * them (counted when the index fails). Below the front, the reads and the committer.
 */
#include "store_int.h"
#include "disk/trust.h"

#include <errno.h>
#include <string.h>

/* ---- lookups ---- */

/* The record's static bounds: what the dir's geometry allows at all. */
static bool record_in_layout(const struct dstore *s, const struct drec *r)
{
    return r->length == s->page_bytes && r->slot < s->slab_slots && r->slab < s->nslabs &&
           (uint64_t)r->slab * s->slab_slots + r->slot < s->nslots;
}

bool record_in_bounds_locked(const struct dstore *s, const struct drec *r)
{
    return record_in_layout(s, r) && r->slot < s->slabs[r->slab].valid;
}

int lookup_record(struct dstore *s, MDB_txn *txn, const uint8_t *key, struct drec *r,
                  uint64_t *digest)
{
    MDB_val k = {DSTORE_KEY_BYTES, (void *)key}, v;
    int rc = mdb_get(txn, s->ix.pages, &k, &v);

    if (rc)
        return rc == MDB_NOTFOUND ? -ENOENT : index_err(rc);
    *digest = value_digest(v.mv_data, v.mv_size);
    rc = rec_decode(key, v.mv_data, v.mv_size, r);
    pthread_mutex_lock(&s->lock);
    if (rc)
        s->st.err_record++;
    else if (r->ntokens != s->page_tokens && (rc = KVT_ECORRUPT))
        s->st.err_record++;
    else if (!record_in_layout(s, r) && (rc = KVT_ECORRUPT))
        s->st.err_bounds++;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* ---- write transactions ---- */

/* A relaxed writer's commits are not flushed, so a power cut may tear the tree on disk while
 * a clean stamp of an earlier close still matches what reached the disk of it (its meta pages
 * and times): the stamp goes, durably, before the first such commit (commits before it sync
 * whole), and the open after a power cut walks the index. Not at open: a writer that only
 * reads (a restart that looks its pages up) pays no sync of the index's dir for it. */
static int relax(struct dstore *s)
{
    int rc;

    if (s->o.sync != DSTORE_SYNC_RELAXED || s->relaxed)
        return 0;
    if ((rc = index_stamp_revoke(s->dirfd)) || (rc = index_set_sync(&s->ix, true)))
        return rc;
    s->relaxed = true;
    return 0;
}

int txn_begin(struct dstore *s, MDB_txn **txn)
{
    int rc = relax(s);

    if (!rc)
        rc = index_err(mdb_txn_begin(s->ix.env, NULL, 0, txn));

    if (rc) {
        pthread_mutex_lock(&s->lock);
        s->st.err_index++;
        pthread_mutex_unlock(&s->lock);
    }
    return rc;
}

/* A failed index write: the disk full, or anything else LMDB said. */
void count_index_error(struct dstore *s, int rc)
{
    pthread_mutex_lock(&s->lock);
    if (rc == -ENOSPC)
        s->st.err_nospc++;
    else
        s->st.err_index++;
    pthread_mutex_unlock(&s->lock);
}

int txn_commit(struct dstore *s, MDB_txn *txn)
{
    const struct dstore_faults *f = s->o.faults;
    int rc = f && f->inject ? f->inject(f->arg, DSTORE_FAULT_COMMIT, 0, 0) : 0;

    if (rc)
        mdb_txn_abort(txn);
    else
        rc = index_err(mdb_txn_commit(txn));

    if (rc) {
        count_index_error(s, rc);
        return rc;
    }
    pthread_mutex_lock(&s->lock);
    s->st.commits++;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int flush_index(struct dstore *s)
{
    const struct dstore_faults *f = s->o.faults;
    int rc = f && f->inject ? f->inject(f->arg, DSTORE_FAULT_FLUSH, 0, 0) : 0;

    if (!rc)
        rc = index_flush(&s->ix);

    pthread_mutex_lock(&s->lock);
    rc ? s->st.err_sync++ : s->st.index_flushes++;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* In durable mode a deletion must be on the disk before the slot it frees takes another page's
 * bytes: a power cut that undid it would leave its record naming them. A failed flush fails
 * the commit as far as the caller knows, which then keeps the slots from reuse (an undone
 * deletion's record finds its own bytes; one that held is a miss). Relaxed mode leaves it to
 * the checksum. */
int txn_commit_freeing(struct dstore *s, MDB_txn *txn)
{
    int rc = txn_commit(s, txn);

    if (rc || s->o.sync == DSTORE_SYNC_RELAXED)
        return rc;
    return flush_index(s);
}

/* ---- deletes ---- */

int delete_record(struct dstore *s, MDB_txn *txn, const uint8_t *key, struct rec_match m,
                  uint32_t *slot)
{
    MDB_val k = {DSTORE_KEY_BYTES, (void *)key}, v;
    struct drec r;
    bool junk, match;
    int rc = mdb_get(txn, s->ix.pages, &k, &v);

    *slot = NO_SLOT;
    if (rc)
        return rc == MDB_NOTFOUND ? -ENOENT : index_err(rc);
    junk = rec_decode(key, v.mv_data, v.mv_size, &r) != 0;
    if (!junk && r.slot < s->slab_slots && (uint64_t)r.slab * s->slab_slots + r.slot < s->nslots)
        *slot = r.slab * s->slab_slots + r.slot;
    if (m.any || junk)
        match = true;
    else if (m.g != NO_SLOT)
        match = *slot == m.g;
    else
        match = value_digest(v.mv_data, v.mv_size) == m.digest;
    if (!match)
        return -ENOENT;
    return index_err(mdb_del(txn, s->ix.pages, &k, NULL));
}
