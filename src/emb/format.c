/*
 * The embedding record's head and keys (format.h, docs/formats.md). Integers little-endian.
 *
 *   0   8  magic "KVTEMB01"          40  32 item hash
 *   8   4  version (1)               72  32 namespace digest
 *   12  4  head bytes (128)          104  8 created, ns since the epoch
 *   16  8  payload length            112  8 zero
 *   24 16  XXH3-128 of the payload   120  8 XXH3-64 (seed "kvtemb") of bytes 0..119
 */
#include "emb/format.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "kvtier.h"

#define HEAD_SEED 0x6b7674656d62ull /* "kvtemb" */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int emb_ns_digest(struct page_hasher *h, const void *ns, size_t ns_len, uint8_t out[32])
{
    if (!ns_len) {
        memset(out, 0, 32);
        return 0;
    }
    return page_hasher_digest2(h, ns, ns_len, NULL, 0, out);
}

int emb_digest(struct page_hasher *h, const uint8_t nsd[32], const uint8_t item[32],
               uint8_t out[32])
{
    uint8_t b[sizeof(EMB_TAG) - 1 + 64];

    memcpy(b, EMB_TAG, sizeof(EMB_TAG) - 1);
    memcpy(b + sizeof(EMB_TAG) - 1, nsd, 32);
    memcpy(b + sizeof(EMB_TAG) - 1 + 32, item, 32);
    return page_hasher_digest2(h, b, sizeof(b), NULL, 0, out);
}

int emb_chunk_key(struct page_hasher *h, const uint8_t digest[32], uint32_t i, uint8_t out[32])
{
    uint8_t le[4];

    put_le(le, i, 4);
    return page_hasher_digest2(h, digest, 32, le, 4, out);
}

int emb_root(struct page_hasher *h, uint8_t out[32])
{
    return page_hasher_digest2(h, EMB_TAG, sizeof(EMB_TAG) - 1, NULL, 0, out);
}

static void payload_sum(const void *payload, uint64_t len, uint8_t out[16])
{
    XXH128_canonical_t c;

    XXH128_canonicalFromHash(&c, XXH3_128bits(payload, (size_t)len));
    memcpy(out, c.digest, 16);
}

void emb_head_write(uint8_t *buf, const uint8_t item[32], const uint8_t nsd[32],
                    const void *payload, uint64_t len, uint64_t created_ns)
{
    memset(buf, 0, EMB_HEAD_BYTES);
    memcpy(buf, EMB_HEAD_MAGIC, 8);
    put_le(buf + 8, EMB_VERSION, 4);
    put_le(buf + 12, EMB_HEAD_BYTES, 4);
    put_le(buf + 16, len, 8);
    payload_sum(payload, len, buf + 24);
    memcpy(buf + 40, item, 32);
    memcpy(buf + 72, nsd, 32);
    put_le(buf + 104, created_ns, 8);
    put_le(buf + 120, XXH3_64bits_withSeed(buf, 120, HEAD_SEED), 8);
}

void emb_record_write(uint8_t *buf, size_t bytes, const uint8_t item[32], const uint8_t nsd[32],
                      const void *payload, uint64_t len)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    emb_head_write(buf, item, nsd, payload, len,
                   (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    memcpy(buf + EMB_HEAD_BYTES, payload, (size_t)len);
    memset(buf + EMB_HEAD_BYTES + len, 0, bytes - EMB_HEAD_BYTES - (size_t)len);
}

int emb_head_read(const uint8_t *buf, struct emb_head *h)
{
    if (memcmp(buf, EMB_HEAD_MAGIC, 8) || get_le(buf + 8, 4) != EMB_VERSION ||
        get_le(buf + 12, 4) != EMB_HEAD_BYTES ||
        get_le(buf + 120, 8) != XXH3_64bits_withSeed(buf, 120, HEAD_SEED))
        return KVT_ECORRUPT;
    h->len = get_le(buf + 16, 8);
    memcpy(h->sum, buf + 24, 16);
    memcpy(h->item, buf + 40, 32);
    memcpy(h->nsd, buf + 72, 32);
    h->created_ns = get_le(buf + 104, 8);
    return 0;
}

bool emb_payload_ok(const struct emb_head *h, const void *payload)
{
    uint8_t sum[16];

    payload_sum(payload, h->len, sum);
    return memcmp(sum, h->sum, 16) == 0;
}
