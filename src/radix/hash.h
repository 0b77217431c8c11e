/* Chained SHA256 page hashes (docs/design.md, "Hashes"). */
#ifndef KVT_RADIX_HASH_H
#define KVT_RADIX_HASH_H

#include <stddef.h>
#include <stdint.h>

#define KVT_HASH_LEN 32
#define KVT_HASH_VERSION 1

struct evp_md_st;
struct evp_md_ctx_st;

/* One fetched SHA256 and one reused context: the per-page cost is then only the digest. */
struct page_hasher {
    struct evp_md_st *md;
    struct evp_md_ctx_st *ctx;
};

int page_hasher_init(struct page_hasher *h);
void page_hasher_finish(struct page_hasher *h);

/* out = SHA256(a || b); either part may be empty. */
int page_hasher_digest2(struct page_hasher *h, const void *a, size_t alen, const void *b,
                        size_t blen, uint8_t out[KVT_HASH_LEN]);

/* The pages of recurrent states kept below (store/store_tier.c) have the namespace root
 * SHA256(KVT_STATE_TAG), and keys SHA256(the hash of the page the state follows ||
 * KVT_STATE_TAG || state bytes as u64 || page index as u32, little-endian). */
#define KVT_STATE_TAG "kvtier/state/1"

/* A page's sliding-window layers (options.swa) are kept below beside it, when its host copy
 * held them, as a second copy of the whole page under SHA256(the page's hash ||
 * KVT_WINDOW_TAG), parent the page's hash, namespace root SHA256(KVT_WINDOW_TAG): the page
 * under its own hash may have been written from a tombstone, whose window rows are stale. */
#define KVT_WINDOW_TAG "kvtier/window/1"

/* Root of a namespace: SHA256("kvtier/1" || fingerprint || namespace bytes). */
int page_hash_root(struct page_hasher *h, const uint8_t fingerprint[KVT_HASH_LEN], const void *ns,
                   size_t ns_len, uint8_t out[KVT_HASH_LEN]);

/* Next link: SHA256(prev || tokens as u32 little-endian). */
int page_hash_next(struct page_hasher *h, const uint8_t prev[KVT_HASH_LEN], const uint32_t *tokens,
                   uint32_t ntokens, uint8_t out[KVT_HASH_LEN]);

#endif
