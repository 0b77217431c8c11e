/* The engine's private side: what tests and tools inside the project may see. */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "kvtier.h"
#include "device/alloc.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/req_pool.h"
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
    kvt_node_ref defer[KVT_WRITE_BACK_BATCH]; /* write_back: leaves to back up, then evict */
    int failed;                               /* a load failed: sticky KVT_EBACKEND */
};

/* A submitted transfer and the node whose chain it fills. */
struct pending_op {
    uint64_t id;
    kvt_node_ref node;
};

/* ---- the host tier's side of the engine (tiers.c) ---- */

/* Open the host pool and transfer engine when the options ask for a host tier. */
int tiers_open(kvt_engine *e, uint64_t device_tokens);
void tiers_close(kvt_engine *e);      /* waits for every transfer */
void tiers_close_pool(kvt_engine *e); /* after the tree is gone */

/* The tree's callback for host pages it drops. */
void tiers_release_host_pages(void *ctx, const uint32_t *pages, size_t n);

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

/* Make tokens slots free by tiers_evict. */
void tiers_make_room(kvt_engine *e, size_t tokens);

void tiers_stats(const kvt_engine *e, struct kvt_stats *st);

/* Each host page is free or held by exactly one node: held[p] counts the nodes holding p. */
int tiers_check(const kvt_engine *e, const uint8_t *held, char *why, size_t why_len);

/* Check every invariant across tree and allocator: each page is free, held by a caller,
 * pending in a free group, or cached by exactly one node; tree sizes add up. 0, or
 * -EUCLEAN with the reason in why. For tests; walks everything. */
int kvt_engine_check(const kvt_engine *e, char *why, size_t why_len);

#endif
