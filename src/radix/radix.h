/*
 * The radix prefix cache: a tree of nodes, each holding a whole number of pages (tokens, the
 * device page index of each page and, when enabled, each page's chained SHA256). It knows
 * nothing of devices: pages are numbers, and evicted pages go back through a callback.
 * All lengths here are in pages unless a name says tokens.
 */
#ifndef KVT_RADIX_H
#define KVT_RADIX_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "hash.h"

struct rdx_tree;

/* Called with the device pages of a node the tree drops. */
typedef void (*rdx_free_pages_fn)(void *ctx, const uint32_t *pages, size_t n);

struct rdx_config {
    uint32_t page_size; /* tokens per page */
    uint32_t policy;    /* enum kvt_evict_policy */
    int hash_pages;     /* keep a SHA256 per page */
    uint8_t fingerprint[KVT_HASH_LEN];
    rdx_free_pages_fn free_pages;
    void *ctx;
};

struct rdx_sizes {
    uint64_t cached_pages;
    uint64_t evictable_pages;
    uint64_t protected_pages;
    uint64_t nodes; /* root excluded */
    uint64_t bytes; /* heap bytes of the tree's metadata */
};

int rdx_create(const struct rdx_config *cfg, struct rdx_tree **out);
void rdx_destroy(struct rdx_tree *t);

/* Longest cached prefix of key (key->len / page_size whole pages). pages (may be NULL) gets
 * its device pages; *npages its length; *last the node ending it (the root ref when empty). */
int rdx_match(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages, size_t *npages,
              kvt_node_ref *last);

/* Pages of key already cached, without changing anything. */
size_t rdx_cached_pages(const struct rdx_tree *t, const struct kvt_key *key);

/* Insert key (key->len a multiple of page_size) with one device page per key page. Pages
 * past the cached prefix are taken by the tree; *prefix_pages gets the cached prefix. */
int rdx_insert(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
               int32_t priority, size_t *prefix_pages);

int rdx_lock(struct rdx_tree *t, kvt_node_ref ref);
int rdx_unlock(struct rdx_tree *t, kvt_node_ref ref);
/* Whether ref's node holds a lock taken on it (the root always does): 1, 0, or -EINVAL. */
int rdx_is_locked(const struct rdx_tree *t, kvt_node_ref ref);

/* Evict unlocked leaves by policy until at least pages pages are gone or none is left. */
size_t rdx_evict(struct rdx_tree *t, size_t pages);

kvt_node_ref rdx_root(const struct rdx_tree *t);
void rdx_sizes(const struct rdx_tree *t, struct rdx_sizes *s);

/* ---- for tests and tools ---- */

/* Check every invariant of the tree (sizes, leaf set, edges, lock refs, hash chains). Each
 * cached page is passed to page_fn (may be NULL). 0, or -EUCLEAN with a reason in why. */
int rdx_check(const struct rdx_tree *t, void (*page_fn)(void *ctx, uint32_t page), void *ctx,
              char *why, size_t why_len);

/* The tree as text, one node a line, children in token order:
 * "<indent>[t0,t1,...] pages=[p0,...] lock=N". Returns the length it needed. */
size_t rdx_dump(const struct rdx_tree *t, char *buf, size_t cap);

/* The hashes of the pages of the node ref names, for tests: copies up to max hashes. */
int rdx_node_hashes(const struct rdx_tree *t, kvt_node_ref ref, uint8_t (*out)[KVT_HASH_LEN],
                    size_t max, size_t *n);

#endif
