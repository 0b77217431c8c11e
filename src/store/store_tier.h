/*
 * The store tier (tier.h): any store of the store contract (store/store.h) as the tier below
 * the host. Pages go down from their host copies (write-through once a backup lands, or when
 * the host evicts them) and come back up into the host tier as fills; past the tree, a match
 * goes on by chained page hash through the store's leading run.
 */
#ifndef KVT_STORE_TIER_H
#define KVT_STORE_TIER_H

#include "store/store.h"
#include "tier.h"

/* Pages of the engine that one store page holds (options.store_page_tokens; 0 is one). */
static inline size_t store_pages(const struct kvt_options *o)
{
    return o->store_page_tokens ? o->store_page_tokens / o->page_size : 1;
}

/* The most tokens a store page may hold (a disk page's head records them all). */
#define STORE_PAGE_TOKENS_MAX 4096

/* options.store_page_tokens left 0: store pages of at least this many bytes. A page below
 * the host costs its store a record (an index entry and, once full, an eviction's delete; a
 * server's key) whatever its size: on the shared trace with the tiny geometry's 2 KiB pages
 * that cost, not the bytes, made a disk tier cost the replay 23 times its time, and store
 * pages of 64 KiB (512 tokens) brought it within 2x at no cost in hits. */
#define STORE_PAGE_AUTO_BYTES (64u << 10)

/* The store page size a store tier takes for o: o->store_page_tokens when set, else the
 * smallest multiple of page_size holding STORE_PAGE_AUTO_BYTES of KV (at most
 * STORE_PAGE_TOKENS_MAX and max_context), or page_size where a page holds that much already or the
 * model has recurrent or sliding-window layers (their states and window copies are kept a page at
 * a time). o is validated. */
uint32_t store_page_tokens_of(const struct kvt_options *o);

struct store_tier_config {
    const struct kvt_options *opts; /* the engine's, validated; outlives the tier */
    struct rdx_tree *const *tree;   /* the engine's tree, made after the tiers */
    size_t scratch_pages;           /* pages of the longest key */
};

/* The options a store tier needs of the engine: -EINVAL when they do not allow one (no
 * host tier above, no page hashes, a host layout other than page_first, an unknown policy,
 * pages that do not fit one I/O). */
int store_tier_check_options(const struct kvt_options *o, bool has_host, size_t page_bytes);

/* The tier around store, which it then owns (closing it closes the store). up is the host
 * tier's (host_tier_up). -ENOMEM. */
int store_tier_open(const struct store_tier_config *c, struct kvt_store *store, struct tier_up up,
                    struct tier **out);

/* Test seam: replace the store by s (nothing in flight); the old one is closed. */
void store_tier_swap(struct tier *t, struct kvt_store *s);

#endif
