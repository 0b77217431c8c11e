/*
 * The engine's private side: the device tier (pool, allocators, request rows) and the prefix
 * tree, over the chain of tiers below (tier.h), which it builds at open and from then on
 * reaches through the tier contract alone. docs/architecture.md draws the layers.
 *
 *   api.c     options, open/close (the chain is built here), stats, versions, errors
 *   engine.c  prefix cache, eviction and room on the device, allocation, requests
 *   check.c   the invariant check across tree, allocators and tiers (tests)
 *   engine_mamba.c hybrid models' recurrent states: slots, checkpoints, copy on write at match
 *   engine_mamba_tiers.c  their room, host copies and states in the store below
 *   engine_swa.c   the device allocator and KV pools, with sliding-window layers or without
 *   engine_emb.c   the multimodal embedding cache's calls (the cache: src/emb/)
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
struct emb_cache;
struct engine_mamba;
struct engine_swa;

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
    bool store_page_auto;           /* options.store_page_tokens was 0: chosen at open */
    struct stats_server *stats;     /* options.stats_socket; NULL without one */
    struct engine_mamba *mamba;     /* options.mamba; NULL without recurrent layers */
    struct engine_swa *swa;         /* options.swa; NULL without sliding-window layers: then
                                       alloc and kv are the device's */
    uint8_t bigram_ns[RDX_NS_MAX];  /* the namespace of the key at hand, with bigram keys */
    struct emb_cache *emb;          /* options.emb_device_bytes; NULL without (engine_emb.c) */
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

/* ---- the device allocator and KV (engine_swa.c): alloc and kv, or with sliding-window
 * layers the pair allocator (a full slot and an SWA slot in step) and the two pools ---- */

/* The full-attention side, which the tree's pages and requests' rows name. */
struct slot_alloc *engine_slots(kvt_engine *e);
const struct slot_alloc *engine_slots_c(const kvt_engine *e);
size_t engine_slots_available(const kvt_engine *e);
int engine_slots_alloc(kvt_engine *e, size_t n, int32_t *slots);
int engine_slots_free(kvt_engine *e, const int32_t *slots, size_t n);
int engine_slots_group(kvt_engine *e, int begin);
int engine_slots_claim(kvt_engine *e, const uint32_t *pages, size_t n);
void engine_slots_release(kvt_engine *e, const uint32_t *pages, size_t n);
int engine_slots_extend_check(const kvt_engine *e, size_t batch, const uint32_t *prefix_lens,
                              const uint32_t *seq_lens, const int32_t *last_locs,
                              const int32_t *out, size_t out_len, size_t *pages);
void engine_slots_extend_take(kvt_engine *e, size_t batch, const uint32_t *prefix_lens,
                              const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                              size_t out_len);
int engine_slots_decode_check(const kvt_engine *e, size_t batch, const uint32_t *seq_lens,
                              const int32_t *last_locs, const int32_t *out, size_t *pages);
void engine_slots_decode_take(kvt_engine *e, size_t batch, const uint32_t *seq_lens,
                              const int32_t *last_locs, int32_t *out);
int engine_kv_write(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, const void *k,
                    const void *v);
int engine_kv_read(kvt_engine *e, uint32_t layer, const int32_t *slots, size_t n, void *k, void *v);
/* The pool holding model layer `layer`, its index there in *index; NULL past the last. */
const struct kv_pool *engine_kv_pool(const kvt_engine *e, uint32_t layer, uint32_t *index);
uint64_t engine_kv_bytes(const kvt_engine *e);

/* A request's node lock moves (from -> to) or goes; with sliding-window layers it is a
 * window lock (rdx_swa_lock) whose span the engine keeps per request row. */
int engine_req_relock(kvt_engine *e, int32_t idx, kvt_node_ref from, kvt_node_ref to);
int engine_req_unlock(kvt_engine *e, int32_t idx, kvt_node_ref node);

/* ---- sliding-window layers (engine_swa.c); every call here is for an engine with e->swa,
 * except engine_swa_from and engine_swa_cached, which do nothing without ---- */
int engine_swa_check_options(const struct kvt_options *o);
int engine_swa_open(kvt_engine *e, uint64_t full_tokens);
void engine_swa_tree_config(kvt_engine *e, struct rdx_config *cfg);
/* The device side a tier below copies to and from: the full-attention pool and allocator,
 * the pair allocator and both pools. */
struct swa_alloc;
struct swa_pool;
/* Of the n pages of key's store run after hit, the prefix a sliding-window match may use;
 * *win the pages of it to read with their window copies. */
size_t engine_swa_store_pages(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit,
                              size_t n, size_t *win);
void engine_swa_device(kvt_engine *e, struct kv_pool **kv, struct slot_alloc **alloc,
                       struct swa_alloc **swa, const struct swa_pool **pool);
void engine_swa_close(kvt_engine *e);
int engine_swa_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct kvt_match *m);
int engine_swa_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                     struct kvt_req *req);
/* Where request row idx's SWA KV is freed below (its inserts' SWA tombstones end); 0
 * without sliding-window layers. */
uint64_t engine_swa_from(const kvt_engine *e, int32_t idx);
/* Request row idx's protected prefix grew to protected_len (the cache's SWA KV from there). */
void engine_swa_cached(kvt_engine *e, int32_t idx, size_t protected_len);
/* Room for pages SWA slots once the full side has it: check decides (-ENOMEM), room evicts
 * SWA KV alone. */
int engine_swa_room_check(const kvt_engine *e, size_t pages);
int engine_swa_room(kvt_engine *e, size_t pages);
/* Free pages on the SWA side. */
size_t engine_swa_free_pages(const kvt_engine *e);
int engine_swa_check(const kvt_engine *e, char *why, size_t why_len);
void engine_swa_stats(const kvt_engine *e, struct kvt_stats *st);

/* ---- recurrent states (engine_mamba.c, engine_mamba_tiers.c: engine_mamba_room,
 * _prefetch_pages, _tree_config, _host_slots); every call here is for an engine with e->mamba ----
 */

/* Options check, then the state pool and request map; the tree's settings for states. */
int engine_mamba_check_options(const struct kvt_options *o);
int engine_mamba_open(kvt_engine *e);
/* The tree's state settings; with host_pages (the host tier's pool) the host copies of
 * states are made room for, within avail bytes of memory (0: unknown). */
int engine_mamba_tree_config(kvt_engine *e, struct rdx_config *cfg, uint64_t host_pages,
                             uint64_t avail);
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
/* kvt_prefetch's share: of the n pages past hit that the store below holds, how many to
 * fetch: up to the deepest state kept there (0: none), since KV past a state serves nothing;
 * n without a store. */
size_t engine_mamba_prefetch_pages(kvt_engine *e, const struct kvt_key *key,
                                   const struct rdx_hit *hit, size_t n);

/* The request's checkpoint goes to node (which ends at its recorded position): mid-request a
 * fresh track slot replaces it; at finish (finished 1) the row's slots go, the checkpoint
 * kept when node is not 0. 0, or -EUCLEAN (a slot not where this engine put it). */
int engine_mamba_cached(kvt_engine *e, int32_t idx, kvt_node_ref node, int finished);

/* State slots (1 .. n); 0 without recurrent layers. */
uint32_t engine_mamba_slots(const kvt_engine *e);

/* Every state slot has the one owner its state says (held[s]: the tree's nodes naming s). */
/* Each state slot and host copy of a state has the one owner its state says: held[s] and
 * hheld[h] count the tree's nodes naming them. */
int engine_mamba_check(const kvt_engine *e, const uint8_t *held, const uint8_t *hheld, char *why,
                       size_t why_len);
/* How many host copies of states the engine may keep (0: none). */
uint32_t engine_mamba_host_slots(const kvt_engine *e);
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

/* The embedding cache's ops (engine_emb.c): apply those finished; wait for them all. Nothing
 * without an embedding cache. */
void engine_emb_poll(kvt_engine *e);
void engine_emb_sync(kvt_engine *e);

/* Hand the stats socket (if any) the figures of now; kvt_poll and kvt_sync call it. */
void engine_publish(kvt_engine *e);

/* Evict pages device pages, storing below first what the tier below keeps of evictions, and
 * waiting for the ops in flight when that is not enough: the pages evicted. */
size_t engine_evict(kvt_engine *e, size_t pages);

/* Make pages device pages free, evicting as engine_evict does when there are too few: 0, or
 * -ENOMEM having changed nothing when eviction could not free enough. */
int engine_room_for(kvt_engine *e, size_t pages);
/* engine_room_for with sliding-window layers taking fewer pages on the SWA side (a load-back
 * pairs only the pages of its window). */
int engine_room_split(kvt_engine *e, size_t pages, size_t swa_pages);

/* Check every invariant across tree and allocators: each device page is free, held by a
 * caller, pending in a free group, or cached by exactly one node; each page a tier below
 * keeps in the tree is held once; tree sizes add up. 0, or -EUCLEAN with the reason in why.
 * For tests; walks everything. */
int engine_check(const kvt_engine *e, char *why, size_t why_len);

#endif
