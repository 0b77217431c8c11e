/*
 * The radix tree's private state, shared by its files (src/radix/radix.h is the API).
 */
#ifndef KVT_RADIX_INT_H
#define KVT_RADIX_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "radix.h"

#define NONE UINT32_MAX
#define ROOT 0u

/* The two eviction lists: device leaves (whose device copy may go) and host leaves (nodes
 * left only on the host, which may be deleted). */
enum { LIST_DEV = 0, LIST_HOST = 1 };

struct rdx_node {
    uint32_t parent;
    uint32_t ns;
    uint32_t npages;
    uint32_t nchildren;
    uint32_t ndev_children; /* children holding a device copy */
    uint32_t lock_ref;      /* locks on this node and on its descendants */
    uint32_t own_ref;       /* locks taken on this node itself: what unlock may drop */
    uint32_t hit_count;
    int32_t priority;
    uint32_t edge_hash;
    uint32_t prev[2], next[2]; /* eviction lists; NONE at the ends */
    bool on_device;            /* pages[] names device pages */
    bool on_host;              /* host[] names host pages */
    bool on_disk;              /* every page is durable in the disk tier's index */
    uint32_t born;             /* the id's generation when this node took it */
    uint64_t pending;          /* the transfer filling one of the copies; 0: none */
    uint64_t disk_op;          /* the disk write reading the host copy; 0: none */
    uint64_t last_access;
    uint64_t created;
    /* One block: npages device pages, npages host pages (with a host tier), npages *
     * page_size tokens, npages hashes. */
    uint32_t *pages;
    uint32_t *host;
    uint32_t *tokens;
    uint8_t (*hash)[KVT_HASH_LEN];
};

struct ns_entry {
    uint8_t *bytes;
    size_t len;
    uint64_t key; /* cheap hash of bytes, compared before the bytes */
    uint64_t nodes;
    bool used;
    uint8_t root_hash[KVT_HASH_LEN];
};

struct rdx_tree {
    struct rdx_config cfg;
    struct page_hasher hasher;

    struct rdx_node **nodes; /* by index; NULL when free */
    uint32_t *gens;          /* generation per index, bumped when the index is freed */
    uint32_t *free_ids;
    uint32_t *heap; /* eviction heap, as long as the id table, so evict never allocates */
    uint32_t cap, nfree, used_ids;

    uint32_t *edges; /* node index or NONE */
    uint32_t edge_mask, nedges;

    uint32_t leaf_head[2];
    uint32_t nleaves[2];

    struct ns_entry *ns;
    uint32_t nns;

    uint64_t clock;
    struct rdx_sizes sz;
};

#endif
