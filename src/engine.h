/* The engine's private side: what tests and tools inside the project may see. */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "kvtier.h"
#include "device/alloc.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/req_pool.h"
#include "store/disk/store.h"
#include "host/host_pool.h"
#include "host/transfer.h"
#include "radix/radix.h"

#define KVT_PAGE_SIZE_MAX 256
/* Under write_back, leaves backed up per round of an eviction; bounds the work of a round. */
#define KVT_WRITE_BACK_BATCH 64
#define KVT_WRITE_BACK_ROUNDS 4

struct kvt_engine {
    struct kvt_options opts;
    char *model_id;
    uint8_t fingerprint[KVT_HASH_LEN];
    const struct dev_backend *be;
    struct kv_pool kv;
    struct slot_alloc alloc;
    struct req_pool reqs;
    struct rdx_tree *tree;
    uint32_t *pages; /* scratch: one entry per page of the longest key */
    struct {
        uint64_t match_calls, match_query_tokens, match_hit_tokens;
        uint64_t inserted_tokens, evicted_tokens;
        uint64_t host_hit_tokens, loaded_tokens, backed_up_tokens, backup_skipped_tokens;
        uint64_t host_evicted_tokens;
        uint64_t disk_hit_tokens, disk_read_tokens, disk_written_tokens;
    } count;

    /* The host tier; has_host 0 without one. */
    int has_host;
    struct host_pool host;
    struct xfer_engine *xfer;
    struct op_queue {
        struct pending_op *v; /* ring of ops submitted and not yet applied, oldest first */
        size_t head, n, cap;
        uint64_t last_id; /* id of the last op submitted */
    } ops[2];             /* by enum xfer_dir */
    /* Scratch, one entry per page of the longest key: for a load (filled by a match, kept
     * across the eviction that makes room for it), and for backups, which that eviction
     * may start under write_back. */
    uint32_t *host_pages, *dev_pages;
    uint32_t *bk_host, *bk_dev;
    kvt_node_ref defer[KVT_WRITE_BACK_BATCH];      /* write_back: leaves to back up, then evict */
    kvt_node_ref defer_host[KVT_WRITE_BACK_BATCH]; /* the same for host leaves and the disk */
    int failed;                                    /* a transfer failed: sticky KVT_EBACKEND */

    /* The disk tier; disk NULL without one. */
    struct dstore *disk;
    struct disk_ops {
        struct disk_op *v; /* store ops submitted and not yet applied, in no order */
        size_t n, cap;
        uint64_t seq; /* the last tree tag handed out (RDX_OP_DISK | seq) */
    } dops;
    /* Scratch, one entry per page of the longest key. */
    uint8_t (*hashes)[KVT_HASH_LEN];
    uint32_t *fill_host;
    struct rdx_disk_page *dpages;
    struct dstore_wpage *wpages;
    struct dstore_rpage *rpages;

    struct stats_server *stats; /* options.stats_socket; NULL without one */
};

/* A store op in flight: a fill (read into a new host-only leaf) or a write of a chain. */
struct disk_op {
    uint64_t id;  /* the store's op id */
    uint64_t tag; /* the tree's mark: RDX_OP_DISK | a sequence number */
    kvt_node_ref node;
    uint32_t kind; /* enum dstore_op_kind */
    size_t n;
    int *results; /* n, written by the store */
};

/* A submitted transfer and the node whose chain it fills. */
struct pending_op {
    uint64_t id;
    kvt_node_ref node;
};

/* Hand the stats socket (if any) the figures of now; kvt_poll and kvt_sync call it. */
void engine_publish(kvt_engine *e);

/* ---- the host tier's side of the engine (tiers.c) ---- */

/* Open the host pool and transfer engine when the options ask for a host tier. */
int tiers_open(kvt_engine *e, uint64_t device_tokens);
void tiers_close(kvt_engine *e);      /* waits for every transfer */
void tiers_close_pool(kvt_engine *e); /* after the tree is gone */

/* The tree's callback for host pages it drops. */
void tiers_release_host_pages(void *ctx, const uint32_t *pages, size_t n);

/* Start a backup of node's chain to the host: 1 when one was started. */
int tiers_backup(kvt_engine *e, kvt_node_ref node);

/* Take n host pages into pages, evicting host leaves (writing them to disk first when the
 * disk tier wants that) when there is no room: 0 or -ENOMEM. */
int tiers_host_alloc(kvt_engine *e, size_t n, uint32_t *pages);

/* Back the prefix ending at node up to the host when the write policy wants it now.
 * Best effort: without host room after host eviction it is skipped and counted. */
void tiers_after_insert(kvt_engine *e, kvt_node_ref node);
void tiers_after_hit(kvt_engine *e, kvt_node_ref node);

/* Load back the host part of hit: allocate device slots for it (evicting device leaves),
 * start the load and give the nodes their device pages. On success *slots gets the slots,
 * *op the load's id, and the lock moves from hit->dev_last to hit->host_last. 1 when the
 * host part was not loaded (too short, or no device room), 0 on success, or an error. */
int tiers_load_back(kvt_engine *e, const struct rdx_hit *hit, int32_t *slots, uint64_t *op);

/* Evict pages device pages, applying finished transfers first and waiting for the ones in
 * flight when that is not enough. Under write_back a leaf without a host copy is backed up
 * (and waited for) before its device copy goes; without host room it is dropped. Returns the
 * pages evicted. */
size_t tiers_evict(kvt_engine *e, size_t pages);

/* Make pages device pages free, evicting as tiers_evict does when there are too few: 0, or
 * -ENOMEM having changed nothing when eviction could not free enough. */
int tiers_room_for(kvt_engine *e, size_t pages);

void tiers_stats(const kvt_engine *e, struct kvt_stats *st);

/* Each host page is free or held by exactly one node: held[p] counts the nodes holding p. */
int tiers_check(const kvt_engine *e, const uint8_t *held, char *why, size_t why_len);

/* Check every invariant across tree and allocator: each page is free, held by a caller,
 * pending in a free group, or cached by exactly one node; tree sizes add up. 0, or
 * -EUCLEAN with the reason in why. For tests; walks everything. */
int kvt_engine_check(const kvt_engine *e, char *why, size_t why_len);

/* ---- the disk tier's side of the engine (disk_tier.c) ---- */

/* Open the data dir when the options name one; check the disk options. */
int disk_open(kvt_engine *e);
/* The store options disk_open uses (a test seam opens the store again with faults). */
void disk_store_options(const kvt_engine *e, struct dstore_options *so);
void disk_close(kvt_engine *e); /* waits for every disk op */

/* Pages of key on disk right after hit's host part (the leading run the index holds); their
 * hashes are left in e->hashes. 0 without a disk tier. */
size_t disk_lookup(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit);

/* Start reading those n pages into a new host-only leaf after hit: 0 when started, 1 when
 * not (below prefetch_min, no host room, a fill already under way there). *reading (may be
 * NULL) gets the leading pages the store found and has on their way. */
int disk_fill(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit, size_t n,
              size_t *reading);

/* Whether a fill is in flight. */
bool disk_reading(const kvt_engine *e);

/* Apply what has completed, then wait for the fills in flight: not at all (timeout_ms 0),
 * up to timeout_ms, or until they are all applied (-1). */
void disk_wait_reads(kvt_engine *e, int timeout_ms);

/* Apply completed disk ops, at most max of them: how many. */
size_t disk_poll(kvt_engine *e, size_t max);

/* Wait for and apply every disk op. */
void disk_sync(kvt_engine *e);

/* A backup of node's chain landed: write it to disk when the policy says so. */
void disk_after_backup(kvt_engine *e, kvt_node_ref node);

/* Evict host leaves for pages host pages, writing those not on disk first. */
void disk_evict_host(kvt_engine *e, size_t pages);

void disk_stats(const kvt_engine *e, struct kvt_stats *st);

#endif
