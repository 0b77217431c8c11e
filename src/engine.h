/*
 * The engine's private side: the device tier (pool, allocators, request rows) and the prefix
 * tree, over the chain of tiers below (tier.h), which it builds at open and from then on
 * reaches through the tier contract alone. docs/architecture.md draws the layers.
 *
 *   api.c     options, open/close (the chain is built here), stats, versions, errors
 *   engine.c  prefix cache, eviction and room on the device, allocation, requests
 *   check.c   the invariant check across tree, allocators and tiers (tests)
 *   engine_mamba.c hybrid models' recurrent states: slots, checkpoints, copy on write at match
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
struct engine_mamba;

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
    struct engine_mamba *mamba;     /* options.mamba; NULL without recurrent layers */
};

/* The device pages' slots, page_size per page. */
static inline void engine_pages_to_slots(const kvt_engine *e, const uint32_t *pages, size_t np,
                                         int32_t *slots)
{
    uint32_t ps = e->opts.page_size;

    for (size_t i = 0; i < np; i++)
        for (uint32_t j = 0; j < ps; j++)
            slots[i * ps + j] = (int32_t)(pages[i] * ps + j);
}

/* ---- recurrent states (engine_mamba.c); every call here is for an engine with e->mamba ---- */

/* Options check, then the state pool and request map; the tree's settings for states. */
int engine_mamba_check_options(const struct kvt_options *o);
int engine_mamba_open(kvt_engine *e);
void engine_mamba_tree_config(kvt_engine *e, struct rdx_config *cfg);
void engine_mamba_close(kvt_engine *e);

/* kvt_match and the match of kvt_req_begin: the device prefix cut to its deepest state. The
 * begin writes that prefix's slots into row, locks it, and gives request row idx its slots
 * (a copy of the state, or zeros). */
int engine_mamba_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots,
                       struct kvt_match *m);
int engine_mamba_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                       struct kvt_req *req);

/* Where an insert of request row idx ends: its recorded checkpoint, when one lies past
 * protected_len and within key_len; else protected_len (nothing to insert). */
size_t engine_mamba_cache_len(const kvt_engine *e, int32_t idx, size_t protected_len,
                              size_t key_len);

/* A free state slot for the track slot that replaces a donated one: 0 or -ENOMEM. */
int engine_mamba_room(kvt_engine *e, size_t n);

/* The request's checkpoint goes to node (which ends at its recorded position): mid-request a
 * fresh track slot replaces it; at finish (finished 1) the row's slots go, the checkpoint
 * kept when node is not 0. 0, or -EUCLEAN (a slot not where this engine put it). */
int engine_mamba_cached(kvt_engine *e, int32_t idx, kvt_node_ref node, int finished);

/* State slots (1 .. n); 0 without recurrent layers. */
uint32_t engine_mamba_slots(const kvt_engine *e);

/* Every state slot has the one owner its state says (held[s]: the tree's nodes naming s). */
int engine_mamba_check(const kvt_engine *e, const uint8_t *held, char *why, size_t why_len);
void engine_mamba_stats(const kvt_engine *e, struct kvt_stats *st);

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
