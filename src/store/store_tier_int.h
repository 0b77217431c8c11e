/*
 * The store tier's insides (store/store_tier.c), shared with what it keeps for hybrid models
 * (store/store_tier_hybrid.c): the ops in flight and the tier's state.
 */
#ifndef KVT_STORE_TIER_INT_H
#define KVT_STORE_TIER_INT_H

#include "store/store_tier.h"

#include <errno.h>
#include <stdlib.h>

/* A store op in flight: a fill (read into a new host-only leaf), a write of a chain, or a
 * write of a recurrent state from a staging copy (OP_STATE: no node, no tag). */
struct store_op {
    uint64_t id;  /* the store's op id */
    uint64_t tag; /* the tree's mark: RDX_OP_DISK | a sequence number */
    kvt_node_ref node;
    uint32_t kind; /* enum store_op_kind, or OP_STATE */
    size_t n;
    int *results; /* n, written by the store */
    void *stage;  /* OP_STATE, or store pages of several pages: their bytes, freed when it
                   * completes */
    size_t win;   /* a fill: its last win pages read with their window; a write: of its n
                   * pages, the last win are window copies of pages before them */
    /* The engine's pages, where n counts store pages: a fill's, a write's span. */
    size_t pages;
    size_t skip;    /* a fill: pages of its first store page already above it; a write: its
                     * head, the pages before the span that its first store page holds */
    size_t lead;    /* a write whose head was lost: pages of the span before its first
                     * store page, not written */
    uint32_t *host; /* a fill of store pages of several pages: its host pages */
    /* Store pages of several pages moved in parts (the store takes them, store.h): each
     * store page's group pointers, to host pages (a write's span, a fill's pages) or into
     * stage (a write's head, which nothing holds, copied; a fill's pages above it or past
     * its end). */
    void **parts;
};

#define OP_STATE 2u

/* A state's pages are named apart from any page of KV (radix/hash.h, KVT_STATE_TAG); their
 * namespace root tells kvtier-ctl what they are. So are the window copies of pages whose
 * sliding-window layers the host kept (KVT_WINDOW_TAG). */
#define STATE_TAG KVT_STATE_TAG
#define WINDOW_TAG KVT_WINDOW_TAG

struct store_tier {
    struct tier base;
    const struct kvt_options *opts;
    struct rdx_tree *const *tree;
    struct kvt_store *store;
    size_t group;         /* the engine's pages to a store page */
    size_t page_bytes;    /* of one of the engine's pages */
    struct store_op *ops; /* submitted and not yet applied, in no order */
    size_t nops, cap;
    uint64_t seq; /* the last tree tag handed out (RDX_OP_DISK | seq) */
    /* Scratch, one entry per page of the longest key. */
    uint8_t (*hashes)[KVT_HASH_LEN];
    struct page_hasher hasher; /* state keys */
    uint8_t state_ns[KVT_HASH_LEN];
    uint8_t window_ns[KVT_HASH_LEN];
    uint8_t (*wkeys)[KVT_HASH_LEN]; /* window keys of a fill's or a write's pages */
    uint32_t *fill_host;
    struct rdx_disk_page *dpages;
    struct store_wpage *wpages;
    struct store_rpage *rpages;
    uint32_t *gtokens; /* the tokens of a write's store pages, back to back */
    int *presults;     /* a write's results by page of its span, for the tree */
    /* Tokens, by the kind of store that found, read or kept them: near (this machine's
     * disk) and remote (store_ops.remote), so the stats count the remote tier apart. */
    struct {
        uint64_t hit, read, written;
    } count, remote;
};

static inline struct store_tier *st_of(const struct tier *t)
{
    return (struct store_tier *)t;
}

static inline struct rdx_tree *tree_of(const struct store_tier *s)
{
    return *s->tree;
}

static inline int ops_reserve(struct store_tier *s)
{
    if (s->nops < s->cap)
        return 0;
    size_t ncap = s->cap ? s->cap * 2 : 16;
    struct store_op *v = realloc(s->ops, ncap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    s->ops = v;
    s->cap = ncap;
    return 0;
}

/* ---- store_tier_hybrid.c ---- */

/* The key of the window copy of the page hashed hash. */
int store_window_key(struct store_tier *s, const uint8_t *hash, uint8_t *out);
/* After the n pages of a write (dpages, wpages), the window copies of those whose host copy
 * holds their sliding-window layers: how many. */
size_t store_add_windows(struct store_tier *s, size_t n);
/* tier_ops' window, put_state, has_state and get_state. */
size_t store_tier_window(struct tier *t, size_t n, bool above, size_t *window);
int store_tier_put_state(struct tier *t, const uint8_t *hash, const void *buf, size_t bytes);
bool store_tier_has_state(struct tier *t, const uint8_t *hash, size_t bytes);
int store_tier_get_state(struct tier *t, const uint8_t *hash, void *buf, size_t bytes);

#endif
