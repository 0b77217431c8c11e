/*
 * Drops: the records reads found bad, gathered and deleted together. A read that finds bad
 * bytes or a bad record notes a drop (read.c); the committer deletes the drops noted so far in
 * one transaction, one commit and, in durable mode, one flush of the index (commit.c says
 * when). One transaction per bad page cost two fdatasyncs a page, and a slab of zeroes a
 * thousand times that.
 *
 * Why a drop may wait behind writes: each is conditional. One from bad bytes deletes the
 * record only while it names the slot those bytes came from, and frees that slot only while
 * the slot table still gives it to the key; one from a bad record deletes the record only
 * while it is the very value read (its digest). A key written again meanwhile has a record of
 * its own, in a slot of its own, which no drop matches. What must not happen is the slot
 * freed, then taken by a new page of the same key, before the drop runs: the read took the
 * slot out of service (DYING, "held"), so only a delete could free it, and the committer runs
 * the drops waiting before any job other than a write. A drop noted before the slot table was
 * known holds nothing: it runs before the next write batch starts.
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DROPS_DUE 4096                      /* drops waiting that make a transaction at once */
#define DROPS_MAX (4 * DROPS_DUE)           /* drops kept waiting at most; more are not noted */
#define DROP_DELAY_NS (100ull * 1000000ull) /* how long a drop may wait for others */

void drop_note_locked(struct dstore *s, const uint8_t *key, uint32_t g, uint64_t digest)
{
    struct drop_req *d;

    /* Best effort: a drop not noted leaves the record, which keeps failing its checks and is
     * noted again by the next read. A reader drops nothing; nor does a store without its slot
     * table (rebuild failed). */
    if (s->ro || s->broken || s->ndrops == DROPS_MAX)
        return;
    if (s->ndrops == s->drops_cap) {
        size_t cap = s->drops_cap ? 2 * s->drops_cap : 64;

        if (!(d = realloc(s->drops, cap * sizeof(*d))))
            return;
        s->drops = d;
        s->drops_cap = cap;
    }
    d = &s->drops[s->ndrops++];
    memcpy(d->key, key, DSTORE_KEY_BYTES);
    d->g = g;
    d->digest = digest;
    d->held = g == NO_SLOT || (table_known_locked(s) && s->state[g] == SLOT_DYING &&
                               !memcmp(s->skey[g], key, DSTORE_KEY_BYTES));
    s->drops_unheld |= !d->held;
    if (s->ndrops == 1)
        s->drops_since = mono_ns();
    if (s->ndrops == 1 || s->ndrops == DROPS_DUE || !d->held)
        pthread_cond_signal(&s->job_cv); /* a new deadline, or one due now */
}

uint64_t drops_due_locked(const struct dstore *s)
{
    if (!s->ndrops)
        return UINT64_MAX;
    if (s->ndrops >= DROPS_DUE)
        return 0;
    return s->drops_since + DROP_DELAY_NS;
}

static int cmp_drops(const void *a, const void *b)
{
    const struct drop_req *x = a, *y = b;
    int c = memcmp(x->key, y->key, DSTORE_KEY_BYTES);

    if (c)
        return c;
    if (x->g != y->g)
        return x->g < y->g ? -1 : 1;
    return (x->digest > y->digest) - (x->digest < y->digest);
}

/* The drops sorted, each once: two reads of one bad page note it twice, and its slot must be
 * taken out and given back once. */
static size_t unique_drops(struct drop_req *d, size_t n)
{
    size_t k = 0;

    qsort(d, n, sizeof(*d), cmp_drops);
    for (size_t i = 0; i < n; i++)
        if (!k || cmp_drops(&d[k - 1], &d[i]))
            d[k++] = d[i];
    return k;
}

/* Each drop's slot out of service, when the slot table still gives it to the key: either the
 * record names it and goes, or the key was written elsewhere since and no record names it. */
static void kill_slots(struct dstore *s, struct drop_req *d, size_t n, bool *killed)
{
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++)
        killed[i] = d[i].g != NO_SLOT && kill_locked(s, d[i].g, d[i].key);
    pthread_mutex_unlock(&s->lock);
}

/* The drops' records and killed slots out of the index in txn; *gone: the bad pages gone, by
 * their record or, when the key was written again since, by their slot. */
static int delete_drops(struct dstore *s, MDB_txn *txn, const struct drop_req *d, size_t n,
                        const bool *killed, size_t *gone)
{
    *gone = 0;
    for (size_t i = 0; i < n; i++) {
        struct rec_match m = {.g = d[i].g, .digest = d[i].digest};
        uint32_t slot;
        int rc = delete_record(s, txn, d[i].key, m, &slot);

        if (rc && rc != -ENOENT)
            return rc;
        *gone += rc == 0 || killed[i];
        if (killed[i] && (rc = slot_del(&s->ix, txn, d[i].g)))
            return rc;
    }
    return 0;
}

/* Under the lock: the drops waiting, taken off the store. */
static struct drop_req *take_drops_locked(struct dstore *s, size_t *n)
{
    struct drop_req *d = s->drops;

    *n = s->ndrops;
    s->drops = NULL;
    s->ndrops = s->drops_cap = 0;
    s->drops_unheld = false;
    return d;
}

void drops_run(struct dstore *s)
{
    struct drop_req *d;
    bool *killed = NULL;
    size_t n, gone = 0;
    MDB_txn *txn;
    int rc;

    pthread_mutex_lock(&s->lock);
    d = take_drops_locked(s, &n);
    rc = s->broken; /* noted before the rebuild failed: without a slot table, nothing goes */
    pthread_mutex_unlock(&s->lock);
    if (!n || rc || !(killed = calloc(n, sizeof(*killed))))
        goto out; /* best effort, as noting them was */
    n = unique_drops(d, n);
    kill_slots(s, d, n, killed);
    if (!(rc = txn_begin(s, &txn))) {
        if ((rc = delete_drops(s, txn, d, n, killed, &gone))) {
            mdb_txn_abort(txn);
            count_index_error(s, rc);
        } else {
            rc = txn_commit_freeing(s, txn);
        }
    }
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++)
        if (killed[i])
            rc ? slot_revive_locked(s, d[i].g) : slot_release_locked(s, d[i].g);
    if (!rc)
        s->st.dropped += gone;
    pthread_mutex_unlock(&s->lock);
out:
    free(killed);
    free(d);
}
