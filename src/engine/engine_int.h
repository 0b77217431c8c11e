/*
 * The engine's state, which its files share (engine.h lists them): the device tier (the slot
 * layer, request rows), the prefix tree, and the chain of tiers below (tier.h), which api.c
 * builds at open and the engine from then on reaches through the tier contract alone.
 * docs/architecture.md draws the layers.
 *
 * This header declares no function: each file's calls are in its own header (engine.h,
 * slots.h, swa.h, mamba.h), so including the state never means calling up into the file
 * that uses it.
 */
#ifndef KVT_ENGINE_INT_H
#define KVT_ENGINE_INT_H

#include "kvtier.h"
#include "device/backend.h"
#include "device/req_pool.h"
#include "engine/slots.h"
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
    struct engine_slots slots; /* the device's slots and KV (slots.h) */
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
    struct engine_mamba *mamba;     /* options.mamba; NULL without recurrent layers (mamba.c) */
    struct engine_swa *swa;         /* options.swa; NULL without sliding-window layers (swa.c) */
    uint8_t bigram_ns[RDX_NS_MAX];  /* the namespace of the key at hand, with bigram keys */
    struct emb_cache *emb;          /* options.emb_device_bytes; NULL without (embeddings.c) */
};

#endif
