/*
 * Read snapshots of the index for the owner's calls, the reads and the inspectors (and
 * dstore_stats). A read-only store adopts a map its writer grew, which it may do only while
 * no other snapshot of the environment is live in the process: share.c counts them, those of
 * every store sharing it.
 */
#include "store_int.h"

int snapshot_begin(struct dstore *s, MDB_txn **txn)
{
    return share_read(s, txn, false);
}

void snapshot_end(struct dstore *s, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    share_read_end(s);
}

int snapshot_renew(struct dstore *s)
{
    return share_read(s, &s->rtxn, true);
}

void snapshot_reset(struct dstore *s)
{
    mdb_txn_reset(s->rtxn);
    share_read_end(s);
}
