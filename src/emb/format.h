/*
 * How an embedding is kept in a store of fixed-size pages (docs/formats.md, "Embeddings"):
 * a record of a head and the embedding's bytes, zero-padded to whole pages ("chunks"), each
 * chunk a page of the store under a key of its own.
 *
 *   record   | head (EMB_HEAD_BYTES) | payload (len bytes) | zeros to a whole chunk |
 *   digest   SHA256(EMB_TAG || namespace digest || item hash): names the embedding
 *   chunk i  key SHA256(digest || i as u32 little-endian), parent the key of chunk i - 1
 *            (none for chunk 0), namespace root SHA256(EMB_TAG), no tokens
 *
 * The head names the embedding and carries its length and the XXH3-128 of its bytes, so a
 * reader knows how many chunks to read and checks the whole once they are in: a chunk
 * missing, failing the store's check, or a record not adding up is a miss, never bytes.
 * Shared by the cache (src/emb/) and kvtier-ctl, which lists and checks embeddings in a dir.
 */
#ifndef KVT_EMB_FORMAT_H
#define KVT_EMB_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "radix/hash.h"

#define EMB_TAG "kvtier/emb/1"
#define EMB_HEAD_BYTES 128u
#define EMB_HEAD_MAGIC "KVTEMB01"
#define EMB_VERSION 1u
#define EMB_HASH_BYTES 32u

struct emb_head {
    uint64_t len;    /* payload bytes */
    uint8_t sum[16]; /* XXH3-128 of the payload, canonical (big-endian) */
    uint8_t item[EMB_HASH_BYTES];
    uint8_t nsd[EMB_HASH_BYTES]; /* namespace digest: SHA256 of its bytes; zeros: default */
    uint64_t created_ns;
};

/* Chunks of chunk_bytes a record of len payload bytes takes. */
static inline uint64_t emb_chunks(uint64_t len, uint64_t chunk_bytes)
{
    return (EMB_HEAD_BYTES + len + chunk_bytes - 1) / chunk_bytes;
}

/* The namespace digest of ns_len bytes at ns (zeros for none). */
int emb_ns_digest(struct page_hasher *h, const void *ns, size_t ns_len, uint8_t out[32]);
/* The embedding's digest, and the key of its chunk i. */
int emb_digest(struct page_hasher *h, const uint8_t nsd[32], const uint8_t item[32],
               uint8_t out[32]);
int emb_chunk_key(struct page_hasher *h, const uint8_t digest[32], uint32_t i, uint8_t out[32]);
/* SHA256(EMB_TAG): the namespace root of every chunk. */
int emb_root(struct page_hasher *h, uint8_t out[32]);

/* The head of a payload of len bytes at payload, into buf (EMB_HEAD_BYTES). */
void emb_head_write(uint8_t *buf, const uint8_t item[32], const uint8_t nsd[32],
                    const void *payload, uint64_t len, uint64_t created_ns);
/* A whole record at buf of bytes (at least EMB_HEAD_BYTES + len): the head (created now),
 * the payload, zeros to the end. payload may not overlap buf. */
void emb_record_write(uint8_t *buf, size_t bytes, const uint8_t item[32], const uint8_t nsd[32],
                      const void *payload, uint64_t len);
/* Read a head from buf: 0, or KVT_ECORRUPT (not a head of this version, or its check fails). */
int emb_head_read(const uint8_t *buf, struct emb_head *h);
/* Whether payload (h->len bytes) has the head's checksum. */
bool emb_payload_ok(const struct emb_head *h, const void *payload);

#endif
