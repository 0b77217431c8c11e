/*
 * The private side of hybrid models' recurrent states in the engine, shared by its two files:
 *
 *   mamba.c        the request flow on the device: slots, checkpoints, copy on write at
 *                  match, the public calls (kvt_req_mamba, kvt_mamba_*)
 *   mamba_tiers.c  below the device: the state pool's room, host copies of states (saved,
 *                  restored), states in the store below (written, fetched)
 *
 * mamba.c calls mamba_tiers.c, never the other way.
 */
#ifndef KVT_ENGINE_MAMBA_INT_H
#define KVT_ENGINE_MAMBA_INT_H

#include "device/mamba_ckpt.h"
#include "device/mamba_pool.h"
#include "device/mamba_req.h"
#include "engine/engine_int.h"

/* One track slot per request: a donated checkpoint is replaced at once, so the forward
 * always has a slot to write the next one into. */
#define TRACK_SLOTS 1

struct mamba_row {
    uint64_t kv_len, branch_len, track_len;
};

/* Positions probed for a state kept below, deepest first, per match (struct probe). */
#define STATE_PROBES 64

struct engine_mamba {
    struct mamba_pool pool;
    struct mamba_req_map reqs;
    struct mamba_ckpt_rules rules;
    uint64_t grid, decode_grid;
    struct mamba_row *row; /* per request row */
    uint64_t kv_hit_tokens, evicted_states;
    /* Host copies of states, slots 1..hcap: buffers of slot_bytes made on first use and kept
     * (so memory grows with the copies held, up to hcap), and a stack of the free slots. */
    uint32_t hcap, hnfree;
    uint8_t **hbuf;
    uint32_t *hfree;
    uint64_t slot_bytes, saved, restored;
    /* With a store below: states kept there by the page hash they follow (written when a
     * checkpoint is cached, read back under a match that runs past the tree). */
    uint8_t (*hashes)[KVT_HASH_LEN]; /* a key's page hashes past the tree (nhashes) */
    size_t nhashes;
    kvt_node_ref bare[STATE_PROBES]; /* nodes of the tree without a state (rdx_mamba_bare) */
    void *stage;                     /* one state, on its way down */
    uint64_t stored, fetched;
};

/* ---- mamba_tiers.c ---- */

/* Before a match: when the deepest state for key lies below the device (a host copy, or in
 * the store below), bring it onto the device with the KV it continues (loaded into row), so
 * that the match finds it there. *op: the highest load filling the device prefix; *dev: the
 * tokens the device held before a load (UINT64_MAX without one); *disk: the tokens filled
 * from the store; *kv: the KV found in every tier (0 without a tier below). */
void mamba_restore(kvt_engine *e, const struct kvt_key *key, int32_t *row, uint64_t *op,
                   uint64_t *dev, uint64_t *disk, uint64_t *kv);

/* A checkpoint the cache took (node's state, in slot) goes to the store below too. */
void mamba_store_state(kvt_engine *e, kvt_node_ref node, int32_t slot);

/* Free what the host copies and the store's staging hold. */
void mamba_tiers_close(struct engine_mamba *m);

/* Each host copy held by one node (hheld[h] counts them) or free, once: 0 or -EUCLEAN. */
int mamba_check_host_states(const struct engine_mamba *m, const uint8_t *hheld, char *why,
                            size_t len);

#endif
