/*
 * The page store's insides for pagestore_open.c, which opens it (kvt_pagestore_open) and,
 * with options.remote, puts a chain of its disk and a server under it. The store-disk module
 * cannot open a chain or a server itself (the layout's rule 2): the one above it does.
 */
#ifndef KVT_STORE_DISK_PAGESTORE_H
#define KVT_STORE_DISK_PAGESTORE_H

#include <stdint.h>

#include "kvtier_store.h"
#include "store/store.h"

/* The caller's options struct of any size into a whole one, checked: 0 or -EINVAL. */
int pagestore_options(const struct kvt_pagestore_options *in, struct kvt_pagestore_options *out);

/* Open the page store over its disk alone (options.remote is not looked at). */
int pagestore_open_disk(const struct kvt_pagestore_options *o, kvt_pagestore **out);

/* kvt_pagestore_close. */
void pagestore_close(kvt_pagestore *s);

/* The disk as a store of the contract for a chain, each call under the page store's owner
 * lock; it owns the block store from now on (closing it closes the block store). Before any
 * op only. -EINVAL when given already, -ENOMEM. */
int pagestore_disk_store(kvt_pagestore *s, struct kvt_store **out);

/* Every op goes through chain from now on (the page store owns and closes it). */
void pagestore_attach_chain(kvt_pagestore *s, struct kvt_store *chain);

/* The dir's fingerprint (32 bytes), which a server's keys carry too. */
const uint8_t *pagestore_fingerprint(const kvt_pagestore *s);

#endif
