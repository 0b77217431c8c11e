/*
 * One store, several users: views of a store (store.h) that each see only their own ops.
 *
 * A store's poll hands out whatever has completed, so two users of one store would collect
 * each other's completions and lose them (the store tier applies the ops it knows and drops
 * the rest). A share gives each user a view: a store of the same pages whose read and write
 * go straight to the store underneath, and whose poll and wait_for give back the view's own
 * ops only; a completion another view's poll collected is kept until its own view asks.
 * leading_run, run_remote, drain and stats are the store's (stats count every view's ops).
 *
 * The engine shares its store below the host between the store tier and the multimodal
 * embedding cache (src/emb/): one disk dir, one remote connection, one capacity.
 *
 * The owner's thread only, like every store; stats from any thread when the store allows it.
 */
#ifndef KVT_STORE_SHARE_H
#define KVT_STORE_SHARE_H

#include "store/store.h"

#define STORE_SHARE_MAX 4

/* n views (2 to STORE_SHARE_MAX) of store, which the share owns from now on: closing a view
 * waits for that view's ops in flight, and closing the last one closes the store. -EINVAL
 * (and the store stays the caller's) for a bad n or a NULL store; -ENOMEM. */
int store_share_open(struct kvt_store *store, size_t n, struct kvt_store **views);

#endif
