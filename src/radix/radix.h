/*
 * The radix prefix cache: a tree of nodes, each holding a whole number of pages (tokens, the
 * device page index of each page and, when enabled, each page's chained SHA256). It knows
 * nothing of devices: pages are numbers, and evicted pages go back through a callback.
 * All lengths here are in pages unless a name says tokens.
 *
 * A tree with page_size 2, after the keys [1 2 3 4 5 6] and [1 2 3 4 7 8 9 10] went in, all
 * but [5 6] was backed up to the host and written to disk, and [9 10] lost its device copy.
 * A box is a node; the line into it is its edge, which the tree's one edge table finds by
 * (parent, namespace, first page of the child):
 *
 *                    root: no pages, holds every tier, never evicted
 *                      |
 *                      | (root, ns, [1 2])
 *      +---------------v---------------+
 *    n | tokens  [1 2] [3 4]           |  2 pages of page_size tokens
 *      | pages     17    18            |  device copy (on_device): a device page a page
 *      | host      40    41            |  host copy (on_host): a host page a page
 *      | hash      h1    h2            |  chained SHA256 (hash_pages): h2 = H(h1, [3 4])
 *      | disk, lock_ref 1              |  on_disk; locks on this node and below it
 *      +-------+---------------+-------+
 *              | (n, ns, [5 6]) | (n, ns, [7 8])
 *    +---------v------+  +------v----------+
 *    | [5 6]          |  | [7 8]           | m
 *    | pages 19       |  | pages 20        |  a device leaf: its device copy may go,
 *    | host  -        |  | host  42        |  the node stays on the host
 *    | lock_ref 1,    |  | disk            |
 *    | own_ref 1      |  +------+----------+
 *    +----------------+         | (m, ns, [9 10])
 *     locked by a caller: +-----v-----------+
 *     not a leaf          | [9 10]          |  host-only, a host leaf: deleted when the
 *                         | pages -         |  host needs room; a match reports it so
 *                         | host  43        |  the engine can load it back
 *                         | disk            |
 *                         +-----+-----------+
 *                               : [11 12]      on disk only (say, from an earlier run): not in
 *                                              the tree; the engine finds it by page hash
 *                                              (rdx_key_hashes) and fills it back as a
 *                                              host-only leaf (rdx_attach_fill)
 *
 * Device copies form a subtree at the top, and so do host copies. Two leaf lists name what
 * eviction may take: device leaves (a device copy, no child holding one, unlocked, no
 * transfer in flight) and host leaves (host-only, childless, unlocked, no transfer in flight).
 * A transfer marks the nodes it fills (pending) or reads for a disk write (disk_op).
 */
#ifndef KVT_RADIX_H
#define KVT_RADIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "hash.h"

struct rdx_tree;

/* Namespace bytes a key may carry: a caller's (KVT_NS_MAX) and the first token the engine
 * moves there for bigram keys (options.key_bigram). */
#define RDX_NS_MAX (KVT_NS_MAX + 4)

/* Called with the device pages of a node the tree drops. */
typedef void (*rdx_free_pages_fn)(void *ctx, const uint32_t *pages, size_t n);

struct rdx_config {
    uint32_t page_size; /* tokens per page */
    uint32_t policy;    /* enum kvt_evict_policy */
    int hash_pages;     /* keep a SHA256 per page */
    uint8_t fingerprint[KVT_HASH_LEN];
    int host_tier; /* nodes may hold host copies */
    rdx_free_pages_fn free_pages;
    rdx_free_pages_fn free_host_pages; /* called with the host pages of a dropped host copy */
    void *ctx;
    /* Hybrid models (radix_mamba.c): nodes may hold a Mamba state, a checkpoint slot of the
     * device's Mamba pool. 0 turns it all off and costs the tree nothing per node. */
    int mamba;
    uint32_t mamba_grid;          /* tokens: where a request may checkpoint (mamba_ckpt_grid) */
    rdx_free_pages_fn free_mamba; /* called with the slots of the states the tree drops */
    /* With a host tier: a node that keeps a host copy when its state goes (its device copy
     * evicted, or the state alone) keeps the state too, copied by save_mamba into a host
     * slot (non-zero; 0: not saved), at most mamba_host_states of them (the least recently
     * used on an unlocked node makes room). free_host_mamba gets the host slots back when
     * their node loses its host copy. */
    uint32_t mamba_host_states;
    uint32_t (*save_mamba)(void *ctx, uint32_t slot);
    rdx_free_pages_fn free_host_mamba;
    /* Sliding-window layers (radix_swa.c): a node's device pages may hold SWA KV beside their
     * full-attention KV, and lose it alone. The window in tokens; 0 turns it all off. */
    uint32_t swa_window;
    rdx_free_pages_fn free_swa_pages; /* called with the device (full) pages whose SWA part
                                       * the tree frees: the caller frees their SWA peers */
    /* Optional (SGLang's RecoverEvictedSWA): give the node pages `to`, SWA tombstones, the
     * SWA KV of the inserting request's pages `from` for the same tokens (the caller moves
     * their SWA peers): 0 when done, else the node stays a tombstone. */
    int (*revive_swa)(void *ctx, const uint32_t *to, const uint32_t *from, size_t n);
};

struct rdx_sizes {
    uint64_t cached_pages; /* device pages */
    uint64_t host_pages;   /* host pages, backups in flight included */
    uint64_t evictable_pages;
    uint64_t protected_pages;
    uint64_t nodes;             /* root excluded */
    uint64_t bytes;             /* heap bytes of the tree's metadata */
    uint64_t mamba_states;      /* nodes holding a Mamba state */
    uint64_t mamba_evictable;   /* of them, those no lock holds */
    uint64_t mamba_host_states; /* nodes holding a host copy of a state */
    uint64_t swa_pages;         /* device pages still holding SWA KV */
    uint64_t swa_evictable;     /* of them, those on nodes no SWA lock holds */
};

int rdx_create(const struct rdx_config *cfg, struct rdx_tree **out);
void rdx_destroy(struct rdx_tree *t);

/* Longest cached prefix of key (key->len / page_size whole pages). pages (may be NULL) gets
 * its device pages; *npages its length; *last the node ending it (the root ref when empty). */
int rdx_match(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages, size_t *npages,
              kvt_node_ref *last);

/* A match over both tiers: the device prefix, then the host-only nodes after it. */
struct rdx_hit {
    size_t dev_pages, host_pages;
    kvt_node_ref dev_last;  /* node ending the device prefix (the root when empty) */
    kvt_node_ref host_last; /* node ending the host part (dev_last when empty) */
    uint64_t pending;       /* highest load still filling a device page of the prefix */
};

/* Like rdx_match, and past the device prefix through the nodes only the host holds. dev_pages
 * and host_pages (may be NULL) receive the pages of each part. */
int rdx_match_tiers(struct rdx_tree *t, const struct kvt_key *key, uint32_t *dev_pages,
                    uint32_t *host_pages, struct rdx_hit *hit);

/* Pages of key already on the device, without changing anything. */
size_t rdx_cached_pages(const struct rdx_tree *t, const struct kvt_key *key);

/* Insert key (key->len a multiple of page_size) with one device page per key page. Pages
 * past the prefix already on the device are taken by the tree: host-only nodes on the path
 * get them as their device copies, the rest become a new leaf. *prefix_pages gets the
 * prefix that was on the device. */
int rdx_insert(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
               int32_t priority, size_t *prefix_pages);

/* rdx_insert that also names the node ending key (*last). */
int rdx_insert_ref(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
                   int32_t priority, size_t *prefix_pages, kvt_node_ref *last);

int rdx_lock(struct rdx_tree *t, kvt_node_ref ref);
int rdx_unlock(struct rdx_tree *t, kvt_node_ref ref);
/* Whether ref's node holds a lock taken on it (the root always does): 1, 0, or -EINVAL. */
int rdx_is_locked(const struct rdx_tree *t, kvt_node_ref ref);

/* Evict unlocked leaves by policy until at least pages pages are gone or none is left. */
size_t rdx_evict(struct rdx_tree *t, size_t pages);

/* rdx_evict for write_back: leaves without a host copy are not dropped but named in defer
 * (at most cap; *ndefer of them), in policy order, so the caller can back them up and evict
 * again. Returns the pages evicted; those deferred count toward pages but not in the result. */
size_t rdx_evict_backed_up(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                           size_t *ndefer);

/* Evict host-only leaves by policy until at least pages host pages are gone. */
size_t rdx_evict_host(struct rdx_tree *t, size_t pages);

/* ---- residency changes driven by transfers ----
 * A transfer is named by a non-zero op id, with RDX_OP_BACKUP set for device-to-host copies.
 * The nodes it fills are marked with it (pending) and are neither evicted nor filled again
 * until rdx_op_done. A split node keeps the mark on both halves. */
#define RDX_OP_BACKUP (1ull << 63)

/* Load-back: give device pages (n, top-down) to the host-only nodes from ref up to the
 * device prefix. -EINVAL if n is not their page count. */
int rdx_attach_device(struct rdx_tree *t, kvt_node_ref ref, const uint32_t *pages, size_t n,
                      uint64_t op);

/* Backup: *pages gets the pages of ref and its ancestors without a host copy. */
int rdx_backup_span(const struct rdx_tree *t, kvt_node_ref ref, size_t *pages);

/* Give that span host pages (n, top-down); dev_pages gets its device pages in the same order. */
int rdx_attach_host(struct rdx_tree *t, kvt_node_ref ref, const uint32_t *host_pages, size_t n,
                    uint32_t *dev_pages, uint64_t op);

/* Op finished: clear its mark on ref and the ancestors it covers. A failed backup drops
 * the host copies it was making, and the host copies made below them since (later backups,
 * fills): those still being filled or read go when their own op ends. A failed load drops
 * the device copies it was making where nothing holds them. */
int rdx_op_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, int failed);

/* ---- the disk tier ----
 * A node is on_disk when every page of it is durable in the disk tier, whose index is the
 * truth (the tree caches it). Pages that only the disk holds are not in the tree: a match
 * continues past it by page hash. Disk I/O ops carry RDX_OP_DISK. A host-only node being
 * filled from disk is pending with its op and is not matched, extended or evicted until
 * rdx_fill_done; a node whose host copy is being written (disk_op) keeps that copy. */
#define RDX_OP_DISK (1ull << 62)

/* The chained hashes of key's pages first .. first+n-1 (out gets n), where ref ends key's
 * first `first` pages (the root: first is 0). -EINVAL without page hashes or when ref does
 * not end that prefix of key. */
int rdx_key_hashes(struct rdx_tree *t, const struct kvt_key *key, kvt_node_ref ref, size_t first,
                   size_t n, uint8_t (*out)[KVT_HASH_LEN]);

/* Prefetch: a new host-only leaf under ref (ending key's first `first` pages) for the n pages
 * after them, holding host_pages (top-down), on disk, pending op until rdx_fill_done.
 * *leaf names it. -EEXIST when ref already has a child for the next page; -EINVAL when ref
 * has no host copy (back it up first: host copies form a subtree at the top). */
int rdx_attach_fill(struct rdx_tree *t, const struct kvt_key *key, kvt_node_ref ref, size_t first,
                    const uint32_t *host_pages, size_t n, uint64_t op, kvt_node_ref *leaf);

/* The fill op of leaf ref finished with its first ok pages landed: those stay (the node
 * splits), the rest are dropped with their host pages. */
int rdx_fill_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, size_t ok);

/* rdx_fill_done for a fill whose pages from live_from on were read with their sliding-window
 * layers (cfg.swa_window): of what stays, those pages become a node of their own whose host
 * copy holds them (rdx_swa_host_state), when that split can be made. */
int rdx_fill_done_window(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, size_t ok,
                         size_t live_from);

/* Pages a disk write of ref covers: ref and its ancestors with a finished host copy that are
 * neither on disk nor being written. 0 without page hashes. */
int rdx_disk_span(const struct rdx_tree *t, kvt_node_ref ref, size_t *pages);

/* One page of a disk write. The pointers name the tree's own memory: valid until the tree
 * next changes. parent is the previous hash in the chain (the namespace root for a first
 * page); ns is the namespace's root hash. */
struct rdx_disk_page {
    const uint8_t *hash, *parent, *ns;
    const uint32_t *tokens; /* page_size tokens */
    uint32_t host_page;
    bool window; /* cfg.swa_window: the host copy holds the page's sliding-window layers */
};

/* Mark that span (n pages) as written by op and describe its pages top-down into out. */
int rdx_attach_disk(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, struct rdx_disk_page *out,
                    size_t n);

/* A store page of `group` pages (options.store_page_tokens) starts at a multiple of group
 * pages of its key. For ref's span of n pages (rdx_attach_disk): *first = the span's first
 * page's index in its key, and the *head pages of the key before it back to such a start,
 * described top-down into out (at most group - 1), from the nodes above the span. Those are
 * not marked: the caller copies their host pages before the tree next changes. -EAGAIN (and
 * *head 0) when one of those nodes has no finished host copy. */
int rdx_disk_head(const struct rdx_tree *t, kvt_node_ref ref, size_t n, size_t group,
                  struct rdx_disk_page *out, size_t *head, uint64_t *first);

/* The disk write op of ref finished: results[i] (n, top-down) is 0 for each page stored. A
 * node is on disk when all of its pages are. */
int rdx_disk_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, const int *results, size_t n);

/* rdx_evict_host when the disk tier writes on host eviction: host leaves not on disk are named
 * in defer (at most cap) instead of deleted, as rdx_evict_backed_up does for the device. */
size_t rdx_evict_host_written(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                              size_t *ndefer);

/* Matches that passed through ref's node. */
int rdx_hit_count(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *hits);

/* ---- Mamba states (cfg.mamba; radix_mamba.c) ----
 * A hybrid model's recurrent layers need, beside a prefix's KV, the state the forward had at
 * the prefix's end. A node may hold one such state, a checkpoint slot of the device's Mamba
 * pool, describing the position where the node ends. A node with KV and no state is a
 * tombstone: its KV leads to deeper states, but a request cannot start from it without
 * recomputing from the deepest state above. A split leaves the upper node a tombstone (the
 * state belongs to the end of the whole node). States live only on nodes with a device copy:
 * when that copy goes, its state goes through free_mamba, saved first beside the node's host
 * copy when it has one (cfg.save_mamba); a host copy of a state goes with the node's host
 * copy, and comes back to the device by rdx_mamba_attach once the node's KV has. A state has its
 * own lock count, never above the node's own KV locks, and its own eviction list, so that
 * rdx_mamba_evict can free states while their KV stays. Every call here is -EINVAL on a tree
 * without cfg.mamba. */

/* Give node ref (current, not the root) the state in slot (non-zero); the tree owns the slot
 * until it hands it to free_mamba. -EEXIST when the node holds a state already: the caller
 * keeps its slot (a duplicate of a state the cache has). */
int rdx_mamba_attach(struct rdx_tree *t, kvt_node_ref ref, uint32_t slot);

struct rdx_mamba_hit {
    size_t kv_pages;         /* the device prefix, as rdx_match */
    kvt_node_ref kv_last;    /* node ending it (the root when empty) */
    kvt_node_ref state_last; /* deepest node of the prefix holding a state; the root if none */
    uint32_t state_slot;     /* that node's slot; 0 when none */
    uint64_t state_tokens;   /* tokens up to where that node ends: the effective prefix */
    uint64_t branch_tokens;  /* the KV hit in tokens rounded down to cfg.mamba_grid (unrounded
                              * when 0), when that lies past state_tokens; else 0 */
};

/* rdx_match that also names the deepest state on the device prefix, passing tombstones by.
 * pages (may be NULL) gets the whole device prefix. The caller copies the state into its own
 * slot (copy on write) and recomputes from state_tokens; with branch_tokens it checkpoints
 * there so that the next request finds a state where this one's KV hit ended. */
int rdx_match_mamba(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages,
                    struct rdx_mamba_hit *hit);

/* rdx_lock of node ref, and a lock of its state (-ENOENT when it holds none): a locked state
 * is neither evicted nor dropped. */
int rdx_mamba_lock(struct rdx_tree *t, kvt_node_ref ref);

/* Undo one rdx_mamba_lock (-EINVAL when none holds). While state locks hold a node, rdx_unlock
 * refuses the KV locks they need. */
int rdx_mamba_unlock(struct rdx_tree *t, kvt_node_ref ref);

/* Free the states of up to n nodes whose state is unlocked, least recently used first; their
 * KV stays, as tombstones. Returns how many states went. */
size_t rdx_mamba_evict(struct rdx_tree *t, size_t n);

/* The deepest node from ref up (ref included; ref as for rdx_hit_count) holding a state on
 * the device or a copy of one on the host: *node (the root when none), its device slot and
 * host slot (0: none of that copy) and the tokens up to its end. */
int rdx_mamba_find(const struct rdx_tree *t, kvt_node_ref ref, kvt_node_ref *node, uint32_t *slot,
                   uint32_t *hslot, uint64_t *tokens);

/* A host copy of a state read from below (the disk tier) for node ref (current, on the host,
 * without one): the tree owns hslot until it hands it to free_host_mamba. -EEXIST when the
 * node has a copy (the caller keeps its slot), -ENOSPC when the copies are at
 * cfg.mamba_host_states (make room first with rdx_mamba_host_room). */
int rdx_mamba_attach_host(struct rdx_tree *t, kvt_node_ref ref, uint32_t hslot);

/* Room for one more host copy of a state: 0, dropping the least recently used copy on a node
 * no lock holds when they are at cfg.mamba_host_states, or -ENOSPC. */
int rdx_mamba_host_room(struct rdx_tree *t);

/* The nodes from ref up to the deepest one holding a state (device or host copy; the root
 * when none does), that are on the host and end on cfg.mamba_grid: where a state kept below
 * could hang. Deepest first, at most max, into refs (and each one's last page hash into
 * hashes); how many, or -EINVAL without page hashes. */
int rdx_mamba_bare(const struct rdx_tree *t, kvt_node_ref ref, kvt_node_ref *refs,
                   uint8_t (*hashes)[KVT_HASH_LEN], size_t max);

/* The hash of the last page of node ref: the key a state at its end is kept under below.
 * -EINVAL without page hashes. */
int rdx_mamba_end_hash(const struct rdx_tree *t, kvt_node_ref ref, uint8_t out[KVT_HASH_LEN]);

/* Node ref's state slot (0: none) and state locks; ref as for rdx_hit_count. */
int rdx_mamba_state(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *slot, uint32_t *locks);

/* ---- sliding-window tombstones (cfg.swa_window; radix_swa.c) ----
 * A model with sliding-window layers keeps two KV parts per device page: the full-attention
 * part and the SWA part, which only the last swa_window tokens before a position need. A node
 * whose SWA part was freed while its full part stays is an SWA tombstone. A node holds SWA KV
 * (all its pages, or none) from the moment it gets a device copy (rdx_insert_swa says which
 * pages came without); it loses it through rdx_swa_evict or with its device copy, and a split gives
 * both halves what the whole had. A match is good only to the deepest node end whose last
 * swa_window tokens all hold SWA KV, or whose whole prefix does. SWA locks protect the SWA part of
 * the nodes covering a window; the unlocked nodes holding SWA KV form their own eviction list.
 * Every call here is -EINVAL on a tree without cfg.swa_window. */

struct rdx_swa_hit {
    size_t kv_pages;        /* the device prefix, as rdx_match */
    kvt_node_ref kv_last;   /* node ending it (the root when empty) */
    size_t swa_pages;       /* the usable prefix: its last window holds SWA KV throughout */
    kvt_node_ref swa_last;  /* node ending it (the root when empty) */
    uint64_t branch_tokens; /* the KV hit in tokens when it lies past the usable prefix, else 0:
                             * where the request should re-insert so that the next one finds
                             * a whole window there */
    uint64_t pending;       /* highest load still filling a device page of the prefix */
};

/* rdx_match under the window. pages (may be NULL) gets the whole device prefix; the request
 * reuses its first swa_pages and recomputes the rest. Refreshes the SWA recency of the nodes
 * covering a window (plus a page) above swa_last. */
int rdx_match_swa(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages,
                  struct rdx_swa_hit *hit);

/* rdx_match_tiers under the window, counting host copies that hold the SWA layers (a
 * backup of a node holding SWA KV copies them; rdx_swa_host_state) as SWA KV for the nodes
 * with no device copy: a load-back of the host part up to swa_last brings them. tiers gets
 * the match over both tiers; hit->kv_pages is its device part, and swa_pages may lie past it
 * in the host part. A device copy that is an SWA tombstone is one here too. */
int rdx_match_swa_tiers(struct rdx_tree *t, const struct kvt_key *key, uint32_t *dev_pages,
                        uint32_t *host_pages, struct rdx_hit *tiers, struct rdx_swa_hit *hit);

/* For the load-back of the n pages of host-only nodes ending at ref's end: live[i] (page i
 * of those n, top first) is 1 where the node's host copy holds the SWA layers, so the load
 * brings them into an SWA peer and the node's device copy holds SWA KV; 0 where the node
 * comes back an SWA tombstone (rdx_attach_device decides the same way). -EINVAL where the
 * span is not n pages of host-only nodes. */
int rdx_swa_load_mask(const struct rdx_tree *t, kvt_node_ref ref, size_t n, uint8_t *live);

/* rdx_insert_ref for a request whose SWA part below token swa_from (a multiple of page_size,
 * at most key->len) it freed already as its window moved on (swa_window_evict_to): the pages
 * the tree takes before swa_from come as SWA tombstones, not handed to free_swa_pages. A node
 * straddling swa_from splits there; when that split cannot be made, its SWA part goes whole
 * (the part past swa_from through free_swa_pages) and the insert still stands. With
 * cfg.revive_swa, the nodes of the part the tree had already that are SWA tombstones lying
 * wholly at or past swa_from take the SWA KV of the request's own pages for them. */
int rdx_insert_swa(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
                   int32_t priority, uint64_t swa_from, size_t *prefix_pages, kvt_node_ref *last);

/* rdx_lock of node ref, and an SWA lock of each node covering the swa_window tokens ending at
 * ref's end (tombstones included, stopping at the root). *span gets the tokens covered, which
 * rdx_swa_unlock needs back: splits later refine those nodes but keep the span. */
int rdx_swa_lock(struct rdx_tree *t, kvt_node_ref ref, uint64_t *span);

/* Undo one rdx_swa_lock of ref with the span it gave. -EINVAL where no SWA lock was taken at
 * ref, or where span does not end on a boundary of SWA-locked nodes (a span the lock did not
 * give that still does is not caught: the caller keeps its own). While SWA locks taken at a
 * node hold it, rdx_unlock refuses the KV locks they need. */
int rdx_swa_unlock(struct rdx_tree *t, kvt_node_ref ref, uint64_t span);

/* Free the SWA part of unlocked nodes, least recently used first, until at least pages pages
 * went or none is left; their full KV stays, as SWA tombstones. Returns the pages freed. */
size_t rdx_swa_evict(struct rdx_tree *t, size_t pages);

/* rdx_swa_evict for write_back, as rdx_evict_backed_up: nodes with no host copy are named in
 * defer (at most cap; *ndefer of them) instead, so that the caller can back them up (with
 * their SWA layers) and evict again. */
size_t rdx_swa_evict_backed_up(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                               size_t *ndefer);

/* Whether node ref holds SWA KV (1, 0: a tombstone or no device copy) and its SWA locks. */
int rdx_swa_state(const struct rdx_tree *t, kvt_node_ref ref, int *live, uint32_t *locks);

/* Whether node ref's host copy holds the SWA layers (1; 0 also without a host copy). */
int rdx_swa_host_state(const struct rdx_tree *t, kvt_node_ref ref, int *hlive);

kvt_node_ref rdx_root(const struct rdx_tree *t);
void rdx_sizes(const struct rdx_tree *t, struct rdx_sizes *s);

/* ---- for tests and tools ---- */

/* Called with every page the tree holds, per tier; any function may be NULL. */
struct rdx_page_visitor {
    void (*device)(void *ctx, uint32_t page);
    void (*host)(void *ctx, uint32_t page);
    void *ctx;
    void (*mamba)(void *ctx, uint32_t slot);       /* the slot of every Mamba state; may be NULL */
    void (*mamba_host)(void *ctx, uint32_t hslot); /* every host copy of one; may be NULL */
};

/* Check every invariant of the tree (sizes, eviction lists, edges, lock refs, hash chains,
 * residency: every node has a copy, device and host copies each form a subtree at the top,
 * host-only nodes are neither locked nor being filled; with cfg.mamba: states only on device
 * copies, no slot on two nodes, state locks within the node's own locks, the list of unlocked
 * states exact; with cfg.swa_window: SWA KV only on device copies and host SWA layers only on host
 * copies, SWA locks within the node's
 * KV locks, the list of unlocked nodes holding SWA KV exact). v (may be NULL) visits every page.
 * 0, or -EUCLEAN with a reason in why. */
int rdx_check(const struct rdx_tree *t, const struct rdx_page_visitor *v, char *why,
              size_t why_len);

/* The tree as text, one node a line, children in token order:
 * "<indent>[t0,t1,...] pages=[p0,...] lock=N", with pages=- when
 * the node has no device copy, host=[h0,...] before lock when it has a host copy, and " disk" after
 * that when it is on disk, and with cfg.mamba " mamba=S" (and " mlock=N" when locked, " hmamba=H"
 * with a host copy) for a node holding a state, with cfg.swa_window " swa-" for an SWA tombstone on
 * the device (and " slock=N" when SWA-locked). Returns the length it needed. */
size_t rdx_dump(const struct rdx_tree *t, char *buf, size_t cap);

/* The hashes of the pages of the node ref names, for tests: copies up to max hashes. */
int rdx_node_hashes(const struct rdx_tree *t, kvt_node_ref ref, uint8_t (*out)[KVT_HASH_LEN],
                    size_t max, size_t *n);

#endif
