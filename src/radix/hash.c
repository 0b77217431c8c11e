#include "hash.h"

#include <errno.h>
#include <string.h>

#include <openssl/evp.h>

int page_hasher_init(struct page_hasher *h)
{
    h->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!h->md)
        return -ENOSYS;
    h->ctx = EVP_MD_CTX_new();
    if (!h->ctx) {
        EVP_MD_free(h->md);
        h->md = NULL;
        return -ENOMEM;
    }
    return 0;
}

void page_hasher_finish(struct page_hasher *h)
{
    EVP_MD_CTX_free(h->ctx);
    EVP_MD_free(h->md);
    h->ctx = NULL;
    h->md = NULL;
}

int page_hasher_digest2(struct page_hasher *h, const void *a, size_t alen, const void *b,
                        size_t blen, uint8_t out[KVT_HASH_LEN])
{
    unsigned int len = 0;

    if (!EVP_DigestInit_ex2(h->ctx, h->md, NULL) || !EVP_DigestUpdate(h->ctx, a, alen) ||
        !EVP_DigestUpdate(h->ctx, b, blen) || !EVP_DigestFinal_ex(h->ctx, out, &len))
        return -EIO;
    return len == KVT_HASH_LEN ? 0 : -EIO;
}

int page_hash_root(struct page_hasher *h, const uint8_t fingerprint[KVT_HASH_LEN], const void *ns,
                   size_t ns_len, uint8_t out[KVT_HASH_LEN])
{
    uint8_t head[8 + KVT_HASH_LEN];

    memcpy(head, "kvtier/1", 8);
    memcpy(head + 8, fingerprint, KVT_HASH_LEN);
    return page_hasher_digest2(h, head, sizeof(head), ns, ns ? ns_len : 0, out);
}

int page_hash_next(struct page_hasher *h, const uint8_t prev[KVT_HASH_LEN], const uint32_t *tokens,
                   uint32_t ntokens, uint8_t out[KVT_HASH_LEN])
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return page_hasher_digest2(h, prev, KVT_HASH_LEN, tokens, (size_t)ntokens * 4, out);
#else
    uint8_t le[4 * 256];
    if (ntokens > 256)
        return -EINVAL;
    for (uint32_t i = 0; i < ntokens; i++) {
        le[4 * i] = (uint8_t)tokens[i];
        le[4 * i + 1] = (uint8_t)(tokens[i] >> 8);
        le[4 * i + 2] = (uint8_t)(tokens[i] >> 16);
        le[4 * i + 3] = (uint8_t)(tokens[i] >> 24);
    }
    return page_hasher_digest2(h, prev, KVT_HASH_LEN, le, (size_t)ntokens * 4, out);
#endif
}
