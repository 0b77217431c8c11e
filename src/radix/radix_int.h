/*
 * The radix tree's private state, shared by its files (radix.h is the API; its top comment
 * draws the tree). Each file holds one concern and calls only the files below it:
 *
 *   radix_check.c   rdx_check, rdx_dump, rdx_node_hashes: for tests and tools
 *   radix_swa.c     sliding-window tombstones: match under the window, SWA locks, SWA
 *                   eviction
 *   radix_mamba.c   Mamba states on nodes: attach, match, state locks, state eviction
 *   radix_evict.c   eviction order: policy keys, the heap, deferring passes, rdx_evict*
 *   radix_tiers.c   residency driven by transfers: load-back, backup, op end, disk fills,
 *                   disk writes (rdx_attach_*, rdx_*span, rdx_op_done, rdx_*_done)
 *   radix.c         the tree: nodes, split, dropping copies, spans, walk, match, insert,
 *                   locks, lifetime
 *   radix_leaves.c  the two leaf lists, the list of unlocked Mamba states, the device page
 *                   counts; dropping a state; the SWA part of nodes: its list, gaining it
 *                   with a device copy, keeping it across a split, dropping it
 *   radix_heap.c    a heap of node ids in a caller's order, over the tree's heap array
 *   radix_edges.c   the edge table          radix_ns.c   namespaces
 *   radix_ids.c     node ids, refs and generations; heap accounting
 *   radix_int.h     (this file) the structs every file shares
 *
 * The tree is used from one thread, the engine's owner; nothing here locks.
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

/* A node's Mamba state (cfg.mamba), in a table beside the node table, by node index, so that
 * a tree without states pays nothing per node. */
struct mamba_state {
    uint32_t slot;         /* the pool's checkpoint slot; 0: none */
    uint32_t locks;        /* state locks: part of the node's own_ref */
    uint32_t prev, next;   /* the list of unlocked states; NONE at the ends */
    uint32_t hslot;        /* a copy of the state on the host (cfg.save_mamba); 0: none */
    uint32_t hprev, hnext; /* the list of host copies; NONE at the ends */
};

/* A node's SWA part (cfg.swa_window), in a table beside the node table like the Mamba one. */
struct swa_part {
    bool live;           /* the node's device pages hold SWA KV; false: a tombstone */
    bool hlive;          /* its host copy holds the SWA layers too (copied while live) */
    uint32_t locks;      /* SWA locks of windows covering this node (tombstone or not) */
    uint32_t own;        /* of the rdx_swa_locks taken at this node: part of its own_ref */
    uint32_t prev, next; /* the list of unlocked nodes with SWA KV; NONE at the ends */
    uint64_t access;     /* the clock when a window last covered the node */
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

    struct mamba_state *mamba; /* by node index, as long as the id table; NULL without states */
    uint32_t mamba_head;       /* the list of unlocked states (its length: sz.mamba_evictable) */
    uint32_t mamba_host_head;  /* the list of host copies of states (sz.mamba_host_states) */

    struct swa_part *swa; /* by node index, as long as the id table; NULL without a window */
    uint32_t swa_head;    /* the list of unlocked nodes with SWA KV */
    uint32_t swa_listed;  /* its length */

    struct ns_entry *ns;
    uint32_t nns;

    uint64_t clock;
    struct rdx_sizes sz;
    /* Host copies wait below a node that lost its own to a failed backup, for the ops that
     * still fill or read them (radix_tiers.c, prune_orphans). */
    bool orphans;
};

static inline struct rdx_node *node_at(const struct rdx_tree *t, uint32_t idx)
{
    return t->nodes[idx];
}

/* The KV locks of node idx that Mamba state locks and SWA locks taken there hold, which only
 * their own unlocks drop (0 in a tree without either). */
static inline uint32_t state_locks(const struct rdx_tree *t, uint32_t idx)
{
    return (t->mamba ? t->mamba[idx].locks : 0) + (t->swa ? t->swa[idx].own : 0);
}

/* A span: a node and its ancestors up the parent chain while has(node, op) holds, never the
 * root. What a transfer covers is one: the nodes lacking the copy it makes, or marked by it. */
struct span {
    bool (*has)(const struct rdx_node *n, uint64_t op);
    uint64_t op;
};

/* Called on each node of a span, bottom-up; at is where its pages start, top-down. */
typedef void (*span_fn)(struct rdx_tree *t, uint32_t idx, size_t at, const void *arg);

/* ---- radix_ids.c: heap accounting, node ids ---- */

/* malloc, counting the block in the tree's sizes. */
void *tree_alloc(struct rdx_tree *t, size_t n);
/* free a block from tree_alloc or tree_realloc; NULL is a no-op. */
void tree_free(struct rdx_tree *t, void *p);
/* realloc, keeping the tree's sizes; on failure p is untouched. */
void *tree_realloc(struct rdx_tree *t, void *p, size_t n);
/* The ref of node idx at its id's current generation. */
kvt_node_ref make_ref(const struct rdx_tree *t, uint32_t idx);
/* The node of one of the tree's own refs, any generation since the node took the id. */
int resolve(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *idx);
/* The node of a caller's ref: current generation, and on the device (or the root). */
int resolve_current(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *idx);
/* Move idx's generation on, so the refs handed out for it so far stop resolving. */
void next_gen(struct rdx_tree *t, uint32_t idx);
/* Make sure n ids can be taken without allocating. */
int reserve_ids(struct rdx_tree *t, uint32_t n);
/* Give node n a free id (reserved before); returns the id. */
uint32_t take_id(struct rdx_tree *t, struct rdx_node *n);
/* Free id idx; its refs stop resolving. */
void drop_id(struct rdx_tree *t, uint32_t idx);

/* ---- radix_ns.c: namespaces ---- */

/* Length of key's namespace bytes (0 for the default namespace). */
size_t key_ns_len(const struct kvt_key *key);
/* The id of key's namespace, or NONE when it has none yet. */
uint32_t ns_find(const struct rdx_tree *t, const struct kvt_key *key);
/* Fill a free entry with these bytes and their root hash; the entry stays free on failure. */
int ns_fill(struct rdx_tree *t, struct ns_entry *e, const void *bytes, size_t len);
/* The id of key's namespace, created when absent. */
int ns_intern(struct rdx_tree *t, const struct kvt_key *key, uint32_t *id);
/* Free namespace id when it is not the default and has no nodes. */
void ns_drop_if_empty(struct rdx_tree *t, uint32_t id);
/* One node of namespace id is gone. */
void ns_unref(struct rdx_tree *t, uint32_t id);

/* ---- radix_edges.c: the edge table ---- */

/* The edge key's hash: (parent, namespace, first page of the child). */
uint32_t edge_hash(uint32_t parent, uint32_t ns, const uint32_t *page, uint32_t ps);
/* The child of parent in ns whose first page is page, or NONE. */
uint32_t edge_find(const struct rdx_tree *t, uint32_t parent, uint32_t ns, const uint32_t *page);
/* Add child's edge (room reserved, edge_hash set). */
void edge_put(struct rdx_tree *t, uint32_t child);
/* Make room for more edges, rehashing when the table would be over half full. */
int edge_reserve(struct rdx_tree *t, uint32_t more);
/* The table slot holding child's edge. */
uint32_t edge_slot(const struct rdx_tree *t, uint32_t child);
/* Remove child's edge. */
void edge_del(struct rdx_tree *t, uint32_t child);

/* ---- radix_heap.c: a min-heap of node ids ---- */

/* Whether node x comes out of a heap before node y. */
typedef bool (*heap_before_fn)(const struct rdx_tree *t, uint32_t x, uint32_t y);

struct heap {
    uint32_t *v; /* the tree's heap array */
    size_t n;
    heap_before_fn before;
};

/* Put v[i] in place below it; heap_build: v[0 .. n) made a heap. */
void heap_sift_down(const struct rdx_tree *t, struct heap *h, size_t i);
void heap_build(const struct rdx_tree *t, struct heap *h);
void heap_push(const struct rdx_tree *t, struct heap *h, uint32_t x);
/* The first node in order (h->n > 0), taken off. */
uint32_t heap_pop(const struct rdx_tree *t, struct heap *h);

/* ---- radix_leaves.c: the leaf lists and device page counts ---- */

/* Whether node idx may give up its device copy now. */
bool is_device_leaf(const struct rdx_node *n, uint32_t idx);
/* Whether node idx, left only on the host, may be deleted now. */
bool is_host_leaf(const struct rdx_node *n, uint32_t idx);
/* Whether node idx is on leaf list list. */
bool in_list(const struct rdx_tree *t, uint32_t idx, int list);
/* Put node idx on, or take it off, each leaf list as its state now says. */
void update_leaf(struct rdx_tree *t, uint32_t idx);
/* Count n's device pages in (sign 1) or out of (sign -1) the tree's sizes. */
void account_device(struct rdx_tree *t, const struct rdx_node *n, int sign);
/* Whether node idx is on the list of unlocked states. */
bool in_state_list(const struct rdx_tree *t, uint32_t idx);
/* Put node idx on, or take it off, the list of unlocked states as its state now says. */
void update_state(struct rdx_tree *t, uint32_t idx);
/* Give node idx's state (if any) back through free_mamba: the node is a tombstone. When the
 * node keeps a host copy, the state is first saved beside it (cfg.save_mamba), making room
 * among the host copies of states when they are at cfg.mamba_host_states. */
void drop_state(struct rdx_tree *t, uint32_t idx);
/* Give node idx's host copy of its state (if any) back through free_host_mamba. */
void drop_host_state(struct rdx_tree *t, uint32_t idx);
/* Node idx (on the host, with no host copy of a state) takes host slot hslot. */
void host_state_add(struct rdx_tree *t, uint32_t idx, uint32_t hslot);
/* Room for one more host copy of a state, dropping the least recently used on an unlocked
 * node when the copies are at cfg.mamba_host_states: false when none can go. */
bool host_state_room(struct rdx_tree *t);
/* Whether node idx is on the list of unlocked nodes with SWA KV. */
bool in_swa_list(const struct rdx_tree *t, uint32_t idx);
/* Put node idx on, or take it off, that list as its SWA part now says. */
void update_swa(struct rdx_tree *t, uint32_t idx);
/* Node idx just got a device copy (with a window): its pages come with SWA KV. */
void gain_swa(struct rdx_tree *t, uint32_t idx);
/* A split made upper the new parent of idx: it takes idx's SWA part (both halves alike). */
void split_swa(struct rdx_tree *t, uint32_t idx, uint32_t upper);
/* Node idx's SWA part (if any) is gone, freed by someone else: the node is an SWA tombstone. */
void forget_swa(struct rdx_tree *t, uint32_t idx);
/* Free node idx's SWA part (if any) through free_swa_pages: the node is an SWA tombstone. */
void drop_swa(struct rdx_tree *t, uint32_t idx);

/* ---- radix.c: the tree ---- */

/* Split node idx after its first m pages; *out gets the new upper node. All or nothing. */
int split(struct rdx_tree *t, uint32_t idx, uint32_t m, uint32_t *out);
/* The hash ending node idx's pages (for the root, namespace ns's root hash). */
const uint8_t *last_hash(const struct rdx_tree *t, uint32_t idx, uint32_t ns);
/* Drop node idx's device copy: pages to free_pages, sizes, the caller's refs die. */
void free_device_copy(struct rdx_tree *t, uint32_t idx);
/* Drop node idx's host copy: pages to free_host_pages, sizes. */
void free_host_copy(struct rdx_tree *t, uint32_t idx);
/* Remove an unlocked childless node and give its pages back. */
void delete_leaf(struct rdx_tree *t, uint32_t idx);
/* The pages of the span starting at node idx. */
size_t span_pages(const struct rdx_tree *t, uint32_t idx, const struct span *s);
/* Call fn(arg) on each node of the span starting at idx, whose pages end at page end. */
void span_each(struct rdx_tree *t, uint32_t idx, const struct span *s, size_t end, span_fn fn,
               const void *arg);
/* 0 when t and key are usable: tokens present, namespace not too long. */
int check_key(const struct rdx_tree *t, const struct kvt_key *key);
/* A new unlinked leaf for np pages of tokens holding pages (host pages when host). */
int make_leaf(struct rdx_tree *t, const uint32_t *tokens, const uint32_t *pages, uint32_t np,
              bool host, const uint8_t *prev, struct rdx_node **out);
/* Link leaf n under parent (ids and edges reserved); returns its id. */
uint32_t link_leaf(struct rdx_tree *t, uint32_t parent, uint32_t ns, struct rdx_node *n, bool host,
                   int32_t priority, uint64_t now);
/* The span a load-back covers: nodes without a device copy. */
bool lacks_device(const struct rdx_node *n, uint64_t op);
/* Give device pages to the host-only nodes on the path ending at node to, from page end down. */
void adopt_device_pages(struct rdx_tree *t, uint32_t to, const uint32_t *pages, size_t end);

#endif
