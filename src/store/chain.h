/*
 * A chain of stores, nearest first (the disk, then a remote store): one store to the tier
 * above, so a chain needs no change above the store contract.
 *
 * - A write goes to every store of the chain. A page's result is 0 when any store kept it,
 *   else the nearest store's error.
 * - A read goes by runs: from its first page on, the chain asks the stores for their leading
 *   runs, nearest first, and the first store with one reads it whole (even where a nearer
 *   store holds some of its later pages: eviction keeps prefixes, so that is rare). A page
 *   no store has is a miss (-ENOENT); a page that fails its check in the store read is that
 *   store's miss (KVT_ECORRUPT): the engine recomputes it, as it would with one store.
 * - leading_run is the longest run of keys each held by some store.
 * - Stats: pages and capacity are the largest store's (every store gets every write); errors
 *   and bytes add up, remote_errors those of its remote stores. Ops and their ids are the
 *   chain's own.
 * - Where pages came from, by kind (store_ops.remote): a completed op's store_done is split
 *   (a read's leading pages by the store that read them, a write's pages by the kinds of
 *   store that kept them), and run_remote tells the remote part of the last leading run.
 * Every store must have the chain's page size. The owner's thread only, like every store;
 * stats from any thread when every store allows it.
 */
#ifndef KVT_STORE_CHAIN_H
#define KVT_STORE_CHAIN_H

#include "store/store.h"

#define STORE_CHAIN_MAX 4

/* A chain of n stores (1 to STORE_CHAIN_MAX), nearest first, which it owns from now on and
 * closes with itself. -EINVAL (and the stores stay the caller's) for a bad n, a NULL store or
 * stores of different page sizes; -ENOMEM. */
int store_chain_open(struct kvt_store *const *stores, size_t n, struct kvt_store **out);

#endif
