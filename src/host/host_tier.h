/*
 * The host tier (tier.h): pinned host memory under the device. Its copies live in the tree
 * (a node's host pages), and it moves them with the transfer engine: backups device -> host
 * by its write policy, load-back host -> device for a request. The engine builds it at open
 * with what it needs of the device; after that, only the tier contract reaches it.
 */
#ifndef KVT_HOST_TIER_H
#define KVT_HOST_TIER_H

#include "device/alloc.h"
#include "device/kv_pool.h"
#include "host/host_pool.h"
#include "device/swa_alloc.h"
#include "device/swa_pool.h"
#include "host/transfer.h"
#include "tier.h"

struct host_tier_config {
    const struct kvt_options *opts; /* the engine's, validated; outlives the tier */
    struct rdx_tree *const *tree;   /* the engine's tree, made after the tiers */
    const struct dev_backend *be;
    struct kv_pool *kv;       /* the device pool the transfers copy to and from */
    struct slot_alloc *alloc; /* the device's allocator: a load-back takes its slots */
    uint64_t device_tokens;   /* the device pool's size: the host pool must be larger */
    size_t scratch_pages;     /* pages of the longest key */
    /* A sliding-window model (options.swa): kv and alloc are the full-attention side of
     * these; backups copy each page's SWA peer with it, load-backs give the pages of nodes
     * whose host copy holds the SWA layers peers to land in. NULL otherwise. */
    struct swa_alloc *swa;
    const struct swa_pool *swa_pool;
};

/* Open the host tier the options ask for; *out NULL when they ask for none. up is the
 * device's: room for a load-back. -EINVAL for bad host options, KVT_EHOSTSIZE, KVT_EHOSTRAM,
 * -ENOMEM, or the transfer engine's error. */
int host_tier_open(const struct host_tier_config *c, struct tier_up up, struct tier **out);

/* What the host tier offers the tier below it: host pages for pages coming up, and host
 * copies of a chain made first (struct tier_up). */
struct tier_up host_tier_up(struct tier *t);

/* The host pool, for a store below that registers it for I/O. */
const struct host_pool *host_tier_pool(const struct tier *t);

/* Test seams. The transfer engine (its watermarks), the id of the last op of dir; and
 * replacing it by one made with xc, right after open with nothing in flight. */
struct xfer_engine *host_tier_xfer(const struct tier *t);
uint64_t host_tier_last_op(const struct tier *t, int dir);
int host_tier_set_xfer(struct tier *t, const struct xfer_config *xc);

#endif
