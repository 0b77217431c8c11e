/*
 * The tier contract: what the engine asks of a tier below the device, and a tier of the one
 * below it. docs/architecture.md draws the chain:
 *
 *   engine (device pool, tree) --ops--> host tier (host/host_tier.c) --ops--> store tier
 *                                         |   copies in the tree           (store/store_tier.c)
 *                                         |                                  | pages past the
 *                                         |                                  | tree, by hash
 *                                    host pool, transfers               kvt_store (store.h)
 *
 * A tier is a table of functions and a pointer to the tier below (NULL at the bottom). The
 * engine builds the chain at open and from then on calls the first tier through its table
 * alone; a tier calls the one below through the same table, never by name. What a tier needs
 * from the layer above (room on the device, pages of the host pool) it asks through the
 * callbacks that layer registered when the chain was built (struct tier_up).
 *
 * Copies move by policy, each tier owning its own: a tier takes a copy of a chain from the
 * tier above when its write policy says so (inserted, hit, copied_above: write-through and
 * selective), or when the tier above evicts the chain (wants_evicted: write-back, on-evict),
 * which the tier above arranges through tier_evict_storing.
 *
 * Everything here runs on the engine's owner thread.
 */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "radix/radix.h"

/* Leaves stored below per round of a storing eviction; bounds the work of a round. */
#define TIER_STORE_BATCH 64
#define TIER_STORE_ROUNDS 4

struct tier;

/* What a tier may ask of the layer above it: callbacks registered when the chain is built.
 * A function that layer does not offer is NULL. */
struct tier_up {
    void *ctx;
    /* Room for pages more pages above, swa_pages of them taking a sliding-window page too
     * (ignored without sliding-window layers), made by eviction there: 0, or -ENOMEM (the
     * host tier asks it of the device for a load-back). */
    int (*room)(void *ctx, size_t pages, size_t swa_pages);
    /* Give node's chain a copy above (a fill's parent must have one): 1 when it has or one
     * was started, 0 when not. */
    int (*hold)(void *ctx, kvt_node_ref node);
    /* n pages of the memory above for pages coming up, making room there: 0 or -ENOMEM. */
    int (*alloc)(void *ctx, size_t n, uint32_t *pages);
    void (*free)(void *ctx, const uint32_t *pages, size_t n);
    /* Where a page of that memory starts. */
    void *(*addr)(void *ctx, uint32_t page);
};

struct tier_ops {
    const char *name;

    /* ---- matching past what the tree holds ---- */
    /* Pages of key right after hit (whose tree part ends at hit->host_last) that this tier
     * and those below hold: a leading run, by page hash. */
    size_t (*find)(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit);
    /* A match ended: hit (after any fetch) and the pages find gave before it; each tier
     * counts its hits. */
    void (*matched)(struct tier *t, const struct rdx_hit *hit, size_t found);
    /* Start bringing those n pages into the tree (new nodes holding them above): 0 when
     * started, 1 when not (too short, no room, a read of them already under way). *reading
     * (may be NULL) gets the pages on their way. With sliding-window layers, the last
     * `window` of them are read with those layers (their window copies; see window). */
    int (*fetch)(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit, size_t n,
                 size_t window, size_t *reading);
    /* Sliding-window layers (options.swa): of the n pages find gave last, the longest prefix
     * a match may use: one whose last window of pages all have window copies below, or that
     * runs whole from the tree's part (above: that part's own last window is there) when
     * the window reaches into it. *window gets the pages to read with their window; 0 when
     * no prefix is usable. A tier that keeps no windows has it NULL. */
    size_t (*window)(struct tier *t, size_t n, bool above, size_t *window);
    /* Whether a fetch is in flight; wait for the fetches: not at all (0), up to timeout_ms,
     * or until they are applied (-1). */
    bool (*fetching)(const struct tier *t);
    void (*wait_fetches)(struct tier *t, int timeout_ms);
    /* Bring the part of hit this tier holds in the tree (its host part) onto the device,
     * with slots for it: 0 and *op the load to wait for, 1 when not (too short, no room on
     * the device), or an error. The lock moves to the end of that part. */
    int (*load)(struct tier *t, const struct rdx_hit *hit, const uint32_t *pages, int32_t *slots,
                uint64_t *op);
    /* Make the caller wait until layer of load op has landed (kvt_load_wait_layer). */
    int (*wait_layer)(struct tier *t, uint64_t op, uint32_t layer, void *stream);
    /* The highest load still filling what a match found, when it is not done; 0 if none. */
    uint64_t (*pending_load)(const struct tier *t, uint64_t op);

    /* ---- copies, by this tier's write policy ---- */
    void (*inserted)(struct tier *t, kvt_node_ref node);     /* node's chain was just inserted */
    void (*hit)(struct tier *t, kvt_node_ref node);          /* a match ended at node */
    void (*copied_above)(struct tier *t, kvt_node_ref node); /* the tier above got node's chain */
    /* Take a copy of node's chain from the tier above now: 1 when one was started. */
    int (*store)(struct tier *t, kvt_node_ref node);
    /* Whether this tier takes a copy of what the tier above evicts (store, then evict). */
    bool (*wants_evicted)(const struct tier *t);

    /* ---- recurrent states (options.mamba): a state is kept by the page hash of the page
     * it follows, split into pages of the store; only a store tier keeps them ---- */
    /* Start writing a copy of the state at buf (bytes, copied before this returns) under
     * hash: 1 when a write was started. */
    int (*put_state)(struct tier *t, const uint8_t *hash, const void *buf, size_t bytes);
    /* Whether a state of that many bytes is kept under hash. */
    bool (*has_state)(struct tier *t, const uint8_t *hash, size_t bytes);
    /* Read it into buf, waiting: 0, or a miss (-ENOENT, KVT_ECORRUPT, -EIO: nothing served). */
    int (*get_state)(struct tier *t, const uint8_t *hash, void *buf, size_t bytes);

    /* ---- completions ---- */
    /* Apply at most max finished ops, here then below; how many. */
    size_t (*poll)(struct tier *t, size_t max);
    /* Wait for every op in flight, here and below, and apply them all. */
    void (*sync)(struct tier *t);
    /* Whether ops of this tier are in flight (a storing eviction may wait for them). */
    bool (*busy)(const struct tier *t);
    /* Wait for this tier's own ops in flight (those busy counts) and apply them; the tiers
     * below are polled, not waited for. NULL: sync. What frees the tier above needs no more. */
    void (*settle)(struct tier *t);
    /* A failure that stops the engine (a transfer the device failed): 0, or KVT_EBACKEND. */
    int (*failed)(const struct tier *t);

    /* ---- observability ---- */
    void (*stats)(const struct tier *t, struct kvt_stats *st);
    /* The tree dropped these pages of this tier's memory (its copies in evicted nodes). */
    void (*release)(struct tier *t, const uint32_t *pages, size_t n);
    /* Pages of this tier's memory that nodes of the tree may hold (0: none, its pages are
     * past the tree), for check. */
    uint32_t (*tree_pages)(const struct tier *t);
    /* Each page of this tier's memory is free or held by exactly one node: held[p] counts
     * the nodes holding page p (the tree's visitor counted them). 0 or -EUCLEAN. */
    int (*check)(const struct tier *t, const uint8_t *held, char *why, size_t len);
    /* Closing, in two steps, since the tree hands the memory of its copies back to their
     * tier as it goes: stop waits for every op in flight and applies none; close, after the
     * tree is gone, frees this tier (not the one below). */
    void (*stop)(struct tier *t);
    void (*close)(struct tier *t);
};

struct tier {
    const struct tier_ops *ops;
    struct tier *below;
    struct tier_up up;
};

/* The tree's eviction of a tier's copies that defers the leaves without a copy below:
 * rdx_evict_backed_up, rdx_evict_host_written. */
typedef size_t (*tier_evict_fn)(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                                size_t *ndefer);

/* Evict pages by fn, first storing below the leaves it defers: rounds of at most
 * TIER_STORE_BATCH leaves stored and waited for, TIER_STORE_ROUNDS rounds at most, ending
 * early when nothing could be stored. Returns the pages evicted; the caller evicts what is
 * left plainly (those leaves go without a copy below). */
size_t tier_evict_storing(struct tier *below, struct rdx_tree *tree, tier_evict_fn fn,
                          size_t pages);

/* The chain's operations, NULL-safe: without a tier below, nothing is there. */
size_t tier_poll(struct tier *t, size_t max);
void tier_sync(struct tier *t);
void tier_settle(struct tier *t);
size_t tier_find(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit);
void tier_matched(struct tier *t, const struct rdx_hit *hit, size_t found);
bool tier_wants_evicted(const struct tier *t);
int tier_failed(const struct tier *t);
void tier_stats(const struct tier *t, struct kvt_stats *st);
/* The first tier of t's chain that keeps states does it; without one, 0, false and
 * -ENOENT. */
int tier_put_state(struct tier *t, const uint8_t *hash, const void *buf, size_t bytes);
bool tier_has_state(struct tier *t, const uint8_t *hash, size_t bytes);
int tier_get_state(struct tier *t, const uint8_t *hash, void *buf, size_t bytes);
/* Stop t and every tier below it (top first: a transfer lands before its pages are written
 * down); close them (top first: nothing is in flight any more). */
void tier_stop_chain(struct tier *t);
void tier_close_chain(struct tier *t);

#endif
