/* The block store as a store of the store contract (store/store.h). */
#ifndef KVT_STORE_DISK_OPS_H
#define KVT_STORE_DISK_OPS_H

#include "disk/store.h"
#include "store/store.h"

/* dstore_open, then the store around it: its errors. */
int store_disk_open(const struct dstore_options *o, struct kvt_store **out);

/* A store around an open block store, which it then owns (closing it closes d). */
int store_disk_wrap(struct dstore *d, struct kvt_store **out);

/* The block store under a disk store, for what only it does (iteration, counters by kind);
 * NULL for a store of another backend. */
struct dstore *store_disk_dstore(struct kvt_store *s);

#endif
