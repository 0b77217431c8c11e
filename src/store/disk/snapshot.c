/*
 * Read snapshots of the index for the owner's calls, the reads and the inspectors (and
 * dstore_stats). A read-only store adopts a map its writer grew, which it may do only while
 * no other snapshot of its own is live: the count here says when.
 */
#include "store_int.h"

/* Snapshots of the index for the owner (and dstore_stats). A read-only store adopts a map
 * its writer grew, which it may do only while no other snapshot of its own is live. */
int snapshot_begin(struct dstore *s, MDB_txn **txn)
{
    int rc = index_read_begin(&s->ix, txn, s->ro && atomic_load(&s->snapshots) == 0);

    if (!rc)
        atomic_fetch_add(&s->snapshots, 1);
    return rc;
}

void snapshot_end(struct dstore *s, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    atomic_fetch_sub(&s->snapshots, 1);
}

int snapshot_renew(struct dstore *s)
{
    int rc = index_read_renew(&s->ix, s->rtxn, s->ro && atomic_load(&s->snapshots) == 0);

    if (!rc)
        atomic_fetch_add(&s->snapshots, 1);
    return rc;
}

void snapshot_reset(struct dstore *s)
{
    mdb_txn_reset(s->rtxn);
    atomic_fetch_sub(&s->snapshots, 1);
}
