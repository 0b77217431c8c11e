/*
 * A page as a server value (docs/formats.md): a 104-byte header then the page's bytes.
 *
 *   0  magic "KVTRPAGE"      8  u32 format (1)         12 u32 reserved (0)
 *   16 fingerprint[32]       48 page key[32]           80 u64 payload bytes
 *   88 XXH3-128 of the payload, canonical (big-endian)
 *
 * Integers are little-endian. The header names what the bytes are, so a value put under the
 * key by anyone else (another fingerprint's writer, a stray SET, a truncated write) fails a
 * field before a byte of it reaches a host page. A page's copy (on a cluster) is the same
 * value under another name, checked the same way.
 */
#include <string.h>
#include <xxhash.h>

#include "kvtier.h"
#include "store/redis/redis_int.h"

#define MAGIC "KVTRPAGE"
#define FORMAT 1u

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;

    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
}

void store_redis_key(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t key[STORE_KEY_BYTES],
                     char *out)
{
    memcpy(out, "kvt:", 4);
    hex(fp, STORE_REDIS_FP_BYTES, out + 4);
    out[4 + 2 * STORE_REDIS_FP_BYTES] = ':';
    hex(key, STORE_KEY_BYTES, out + 5 + 2 * STORE_REDIS_FP_BYTES);
    out[STORE_REDIS_KEY_CHARS] = '\0';
}

void store_redis_copy_key(const uint8_t fp[STORE_REDIS_FP_BYTES],
                          const uint8_t key[STORE_KEY_BYTES], char *out)
{
    size_t k = STORE_REDIS_KEY_CHARS, suffix = strlen(STORE_REDIS_COPY_SUFFIX);
    uint16_t slot;

    store_redis_key(fp, key, out);
    slot = store_redis_slot(out, k);
    memcpy(out + k, STORE_REDIS_COPY_SUFFIX, suffix);
    store_redis_slot_tag(STORE_REDIS_COPY_SLOT(slot), out + k + suffix);
    out[STORE_REDIS_COPY_KEY_CHARS - 1] = '}';
    out[STORE_REDIS_COPY_KEY_CHARS] = '\0';
}

void store_redis_value_head(const uint8_t fp[STORE_REDIS_FP_BYTES],
                            const uint8_t key[STORE_KEY_BYTES], const void *page,
                            uint32_t page_bytes, uint8_t *out)
{
    XXH128_canonical_t sum;

    memcpy(out, MAGIC, 8);
    put_le(out + 8, FORMAT, 4);
    put_le(out + 12, 0, 4);
    memcpy(out + 16, fp, STORE_REDIS_FP_BYTES);
    memcpy(out + 48, key, STORE_KEY_BYTES);
    put_le(out + 80, page_bytes, 8);
    XXH128_canonicalFromHash(&sum, XXH3_128bits(page, page_bytes));
    memcpy(out + 88, sum.digest, sizeof(sum.digest));
}

void store_redis_value(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t key[STORE_KEY_BYTES],
                       const void *page, uint32_t page_bytes, uint8_t *out)
{
    store_redis_value_head(fp, key, page, page_bytes, out);
    memcpy(out + STORE_REDIS_HEAD_BYTES, page, page_bytes);
}

/* Every field of the header but the checksum. */
static int head_check(const uint8_t *fp, const uint8_t *key, uint32_t page_bytes,
                      const uint8_t *head)
{
    return memcmp(head, MAGIC, 8) || get_le(head + 8, 4) != FORMAT ||
                   memcmp(head + 16, fp, STORE_REDIS_FP_BYTES) ||
                   memcmp(head + 48, key, STORE_KEY_BYTES) || get_le(head + 80, 8) != page_bytes
               ? KVT_ECORRUPT
               : 0;
}

static int payload_check(const uint8_t *head, const uint8_t *payload, uint32_t page_bytes)
{
    XXH128_canonical_t sum;

    XXH128_canonicalFromHash(&sum, XXH3_128bits(payload, page_bytes));
    return memcmp(head + 88, sum.digest, sizeof(sum.digest)) ? KVT_ECORRUPT : 0;
}

int store_redis_value_check(const uint8_t fp[STORE_REDIS_FP_BYTES],
                            const uint8_t key[STORE_KEY_BYTES], uint32_t page_bytes,
                            const uint8_t *v, size_t len)
{
    if (len != STORE_REDIS_HEAD_BYTES + (size_t)page_bytes || head_check(fp, key, page_bytes, v))
        return KVT_ECORRUPT;
    return payload_check(v, v + STORE_REDIS_HEAD_BYTES, page_bytes);
}

int redis_head_check(const struct redis_store *r, const uint8_t *key, const uint8_t *head)
{
    return head_check(r->o.fingerprint, key, r->base.page_bytes, head);
}

int redis_payload_check(const struct redis_store *r, const uint8_t *head, const uint8_t *payload)
{
    return payload_check(head, payload, r->base.page_bytes);
}
