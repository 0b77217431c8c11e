/*
 * What the hybrid engine tests (test_engine_mamba, test_engine_swa) write and check: bytes
 * drawn from the hash of a token prefix, the stand-in for everything a forward computed from
 * those tokens (a token's KV row, a recurrent state), and engine_check as a failure of the run.
 * Header only; include after cmocka.h, harness.h (with HARNESS_RUN defined) and engine.h.
 */
#ifndef KVT_TESTS_PREFIX_KV_H
#define KVT_TESTS_PREFIX_KV_H

#include <stdint.h>
#include <string.h>

#include "rng.h"

/* A hash of tokens[0..n). */
static inline uint64_t prefix_hash(const uint32_t *tokens, size_t n)
{
    uint64_t h = 0x7072656669780aull;

    for (size_t i = 0; i < n; i++)
        h = rng_mix(h ^ tokens[i]);
    return h;
}

/* n bytes drawn from seed. */
static inline void prefix_fill(uint8_t *buf, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)rng_mix(seed + i);
}

/* K (v 0) or V (v 1) row of n bytes of token i in layer, after tokens[0..i]. */
static inline void prefix_kv_row(const uint32_t *tokens, size_t i, uint32_t layer, int v,
                                 uint8_t *row, size_t n)
{
    prefix_fill(row, n, prefix_hash(tokens, i + 1) * 7 + layer * 2 + (uint64_t)v);
}

#define PREFIX_ROW_MAX 256 /* bytes of a K or V row these helpers take */

/* Write the K and V rows (row bytes each) of tokens [from, to) into slots, layers 0..layers-1,
 * as a forward would: 0 or the first error. */
static inline int prefix_kv_write(kvt_engine *e, uint32_t layers, size_t row, const int32_t *slots,
                                  const uint32_t *tokens, size_t from, size_t to)
{
    uint8_t k[PREFIX_ROW_MAX], v[PREFIX_ROW_MAX];

    for (size_t i = from; i < to; i++)
        for (uint32_t l = 0; l < layers; l++) {
            prefix_kv_row(tokens, i, l, 0, k, row);
            prefix_kv_row(tokens, i, l, 1, v, row);
            int rc = kvt_kv_write(e, l, slots + i, 1, k, v);
            if (rc)
                return rc;
        }
    return 0;
}

/* Whether layer's rows of tokens [from, to) read back as written (a failed read is not). */
static inline int prefix_kv_is(kvt_engine *e, uint32_t layer, size_t row, const int32_t *slots,
                               const uint32_t *tokens, size_t from, size_t to)
{
    uint8_t k[PREFIX_ROW_MAX], v[PREFIX_ROW_MAX], wk[PREFIX_ROW_MAX], wv[PREFIX_ROW_MAX];

    for (size_t i = from; i < to; i++) {
        if (kvt_kv_read(e, layer, slots + i, 1, k, v))
            return 0;
        prefix_kv_row(tokens, i, layer, 0, wk, row);
        prefix_kv_row(tokens, i, layer, 1, wv, row);
        if (memcmp(k, wk, row) || memcmp(v, wv, row))
            return 0;
    }
    return 1;
}

/* engine_check, failing the run with its reason. */
#define CHECK_ENGINE(s, e)                                                                         \
    do {                                                                                           \
        char why_[256] = "";                                                                       \
        if (engine_check((e), why_, sizeof(why_)))                                                 \
            FAIL(s, "engine_check: %s", why_);                                                     \
    } while (0)

#endif
