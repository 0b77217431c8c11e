/*
 * The engine's private side: the device tier (pool, allocators, request rows) and the prefix
 * tree, over the chain of tiers below (tier.h), which it builds at open and from then on
 * reaches through the tier contract alone. docs/architecture.md draws the layers.
 *
 *   api.c     options, open/close (the chain is built here), stats, versions, errors
 *   engine.c  prefix cache, eviction and room on the device, allocation, requests
 *   check.c   the invariant check across tree, allocators and tiers (tests)
 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "kvtier.h"
#include "device/alloc.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/req_pool.h"
#include "radix/radix.h"
#include "store/store.h"
#include "tier.h"

#define KVT_PAGE_SIZE_MAX 256

struct dstore_options;

struct kvt_engine {
    struct kvt_options opts;
    char *model_id;
    uint8_t fingerprint[KVT_HASH_LEN];
    const struct dev_backend *be;
    struct kv_pool kv;
    struct slot_alloc alloc;
    struct req_pool reqs;
    struct rdx_tree *tree;
    struct tier *below;      /* the first tier below the device; NULL: the device alone */
    struct kvt_store *store; /* the store at the bottom of the chain (tests); NULL: none */
    struct tier *bottom;     /* the tier around it */
    /* Scratch, one entry per page of the longest key: a match's device pages, and the pages
     * of the part the tier below holds in the tree (kept across the eviction that makes
     * room for its load). */
    uint32_t *pages, *below_pages;
    struct {
        uint64_t match_calls, match_query_tokens, match_hit_tokens;
        uint64_t inserted_tokens, evicted_tokens;
    } count;
    struct dstore_options *disk_so; /* what the disk store was opened with (tests) */
    struct stats_server *stats;     /* options.stats_socket; NULL without one */
};

/* kvt_open with the store below the host given (NULL: the one the options name): the test
 * seam for stores with faults, and the way in for a backend not built in. The engine owns
 * store from the call on, whatever it returns. */
int engine_open(const struct kvt_options *opts, struct kvt_store *store, kvt_engine **out);

/* The options of the disk store the engine opened (tests open it again with faults). */
void engine_disk_options(const kvt_engine *e, struct dstore_options *so);

/* Replace the store below the host by s (test seam: right after open, nothing in flight);
 * the old one is closed first. s NULL only closes it (to open another writer on its dir):
 * call again with a store before the engine is used. -EINVAL without a store tier. */
int engine_swap_store(kvt_engine *e, struct kvt_store *s);

/* Hand the stats socket (if any) the figures of now; kvt_poll and kvt_sync call it. */
void engine_publish(kvt_engine *e);

/* Evict pages device pages, storing below first what the tier below keeps of evictions, and
 * waiting for the ops in flight when that is not enough: the pages evicted. */
size_t engine_evict(kvt_engine *e, size_t pages);

/* Make pages device pages free, evicting as engine_evict does when there are too few: 0, or
 * -ENOMEM having changed nothing when eviction could not free enough. */
int engine_room_for(kvt_engine *e, size_t pages);

/* Check every invariant across tree and allocators: each device page is free, held by a
 * caller, pending in a free group, or cached by exactly one node; each page a tier below
 * keeps in the tree is held once; tree sizes add up. 0, or -EUCLEAN with the reason in why.
 * For tests; walks everything. */
int engine_check(const kvt_engine *e, char *why, size_t why_len);

#endif
