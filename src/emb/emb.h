/*
 * The multimodal embedding cache (docs/design.md, "Multimodal embeddings"): vision-encoder
 * outputs kept by item hash in device memory under a byte budget, least recently used out
 * first, with copies on the host and in a store below (the engine's disk and remote tiers,
 * through a view of its store: store/share.h). The engine's kvt_emb_* calls (engine/embeddings.c)
 * check their arguments and come here; the owner's thread only.
 *
 *   emb.c     the calls: put, fetch, wait, release, read, lookup, drop, stats
 *   below.c   the store below: records of chunks (format.h), reads and writes, completions
 *   room.c    device and host memory: extents, eviction, the copies between them
 *   table.c   entries: by digest, holds, the two LRU lists
 *   arena.c   extents of one allocation;  format.c  the record's head and keys
 */
#ifndef KVT_EMB_H
#define KVT_EMB_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "device/backend.h"
#include "store/store.h"

struct emb_cache;

struct emb_config {
    const struct dev_backend *be;
    uint64_t device_bytes;   /* > 0 */
    uint64_t host_bytes;     /* 0: no host copies */
    struct kvt_store *store; /* where records go; NULL: none. The cache owns it from the call
                              * on, whatever emb_open returns */
};

/* -ENOMEM, KVT_EHOSTRAM (host_bytes above the memory available), the backend's errors. */
int emb_open(const struct emb_config *c, struct emb_cache **out);
/* Wait for its ops, close its store, free everything. NULL is a no-op. */
void emb_close(struct emb_cache *c);

/* kvtier.h's calls, their arguments checked (key->hash, buf, out not NULL, ns_len). */
int emb_put(struct emb_cache *c, const struct kvt_emb_key *key, const void *buf, size_t len,
            struct kvt_emb *held);
int emb_fetch(struct emb_cache *c, const struct kvt_emb_key *key, struct kvt_emb *out);
int emb_wait(struct emb_cache *c, struct kvt_emb *emb, int timeout_ms);
int emb_release(struct emb_cache *c, struct kvt_emb *emb);
int emb_read(struct emb_cache *c, const struct kvt_emb *emb, size_t offset, void *buf, size_t n);
int emb_lookup(struct emb_cache *c, const struct kvt_emb_key *key, uint32_t *tier, size_t *len);
int emb_drop(struct emb_cache *c, const struct kvt_emb_key *key);
void emb_stats(const struct emb_cache *c, struct kvt_emb_stats *st);
/* Apply the ops the store finished (kvt_poll); wait for every op and apply it (kvt_sync). */
void emb_poll(struct emb_cache *c);
void emb_sync(struct emb_cache *c);

#endif
