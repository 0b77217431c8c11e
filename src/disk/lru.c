/*
 * The order pages leave the disk in: access times kept in the index, and eviction of the
 * oldest unpinned pages, chain ends first (the choice is slots.c's pick_victims_locked). The
 * committer's thread only.
 *
 * Access times are written lazily: a read changes the order in memory at once (slots.c) and
 * lists its slot; the list rides on the next write batch's commit (DIRTY_MAX of it, each the
 * slot table's entry for the slot, persist_one), and what
 * has waited access_period_ms for one gets a transaction of its own, as does the rest at
 * close. So reads cost no commit and no sync, and a crash loses only access times not yet
 * committed: the order after a restart is older, no page or record is lost.
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- access times ---- */

/* Up to max of the waiting access times into t, the newest listed first (which go first does
 * not matter: each is the slot's time now); how many left the list. Those of slots no longer
 * used are dropped, so *n (the ones to write) may be fewer. */
static size_t take_dirty(struct dstore *s, struct touched *t, size_t max, size_t *n)
{
    size_t taken = 0;

    *n = 0;
    pthread_mutex_lock(&s->lock);
    for (; taken < max && s->ndirty; taken++) {
        uint32_t g = s->dirty[--s->ndirty];

        s->dirty_bit[g] = 0;
        if (s->state[g] != SLOT_USED)
            continue;
        t[*n].g = g;
        memcpy(t[*n].key, s->skey[g], DSTORE_KEY_BYTES);
        t[(*n)++].atime = s->atime[g];
    }
    pthread_mutex_unlock(&s->lock);
    return taken;
}

/* One slot's last access into its slot-table entry, if the table still gives the slot to the
 * key that was read. The page's record keeps the time it was written: the rebuild orders the
 * pages by the slot table's times alone, and iteration shows the later of the two. A record
 * carries the page's tokens and so fills an index page of its own: rewriting it for each access
 * cost a 4 KiB page write and its flush, where the slot table's entry is 48 bytes among
 * others. */
static int persist_one(struct dstore *s, MDB_txn *txn, const struct touched *t)
{
    unsigned int slot = t->g;
    MDB_val k = {sizeof(slot), &slot}, v;
    struct slot_entry e;
    int rc = mdb_get(txn, s->ix.slots, &k, &v);

    if (rc)
        return rc == MDB_NOTFOUND ? 0 : index_err(rc);
    if (slot_decode(&k, &v, &e) || memcmp(e.key, t->key, DSTORE_KEY_BYTES) || e.atime >= t->atime)
        return 0;
    return slot_put_tag(&s->ix, txn, t->g, t->key, t->atime, e.parent);
}

/* DIRTY_MAX at a time: the committer's touched buffer. */
int persist_access(struct dstore *s, MDB_txn *txn, size_t max)
{
    size_t done = 0, taken, n;

    while (done < max) {
        taken = take_dirty(s, s->touched, max - done < DIRTY_MAX ? max - done : DIRTY_MAX, &n);
        if (!taken)
            return 0;
        for (size_t i = 0; i < n; i++) {
            int rc = persist_one(s, txn, &s->touched[i]);

            if (rc)
                return rc;
        }
        done += taken;
    }
    return 0;
}

static bool waiting(struct dstore *s)
{
    bool any;

    pthread_mutex_lock(&s->lock);
    any = s->ndirty != 0;
    pthread_mutex_unlock(&s->lock);
    return any;
}

/* After a failed flush the times left wait a whole period again: an index that fails now
 * must not keep the committer spinning on them. */
static bool postpone(struct dstore *s)
{
    pthread_mutex_lock(&s->lock);
    s->dirty_since = mono_ns();
    pthread_mutex_unlock(&s->lock);
    return false;
}

bool flush_access(struct dstore *s)
{
    MDB_txn *txn;
    int rc;

    if (!waiting(s))
        return false;
    if (txn_begin(s, &txn))
        return postpone(s);
    if ((rc = persist_access(s, txn, ACCESS_TXN_MAX))) {
        mdb_txn_abort(txn);
        count_index_error(s, rc);
        return postpone(s);
    }
    if (txn_commit(s, txn))
        return postpone(s);
    return waiting(s);
}

uint64_t access_due_locked(const struct dstore *s)
{
    uint64_t period = s->o.access_period_ms ? s->o.access_period_ms : ACCESS_PERIOD_MS;

    return s->ndirty ? s->dirty_since + period * 1000000ull : UINT64_MAX;
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
    return txn_commit_freeing(s, txn);
}

/* Delete up to want LRU records in one commit (durable in durable mode); only then are their
 * slots free. */
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
