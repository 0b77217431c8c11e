/*
 * KV content for the engine tests (unit hicache and disk_engine): a key's tokens with
 * the chained hash of every prefix, and the K and V rows of token i drawn from the hash of
 * tokens 0..i, the layer and K or V, so every row served, from whatever tier, is checked
 * byte for byte against the key. Include after engine.h, cmocka and string.h, with LAYERS,
 * ROW (bytes of a K or V row), MAX_TOK (longest key) and N_NS (namespaces, 2) defined.
 */
#ifndef KVT_TESTS_KV_ROWS_H
#define KVT_TESTS_KV_ROWS_H

#include "rng.h"

static const char NS_BYTES[N_NS][8] = {"", "tenant"};
static const size_t NS_LEN[N_NS] = {0, 6};

/* ---- content: a hash chain over the prefix ---- */

/* A token sequence in a namespace, with the chained hash of every prefix. */
struct seq {
    uint32_t ns;
    size_t len;
    uint32_t tok[MAX_TOK];
    uint64_t h[MAX_TOK];
};

static inline void seq_hash(struct seq *q)
{
    uint64_t h = rng_mix(0x6b767469657231ull + q->ns);

    for (size_t i = 0; i < q->len; i++)
        q->h[i] = h = rng_mix(h ^ q->tok[i]);
}

static inline struct kvt_key seq_key(const struct seq *q, size_t len)
{
    struct kvt_key k = {.tokens = q->tok, .len = len};

    if (q->ns) {
        k.ns = NS_BYTES[q->ns];
        k.ns_len = NS_LEN[q->ns];
    }
    return k;
}

static inline void fill_row(uint64_t h, uint32_t layer, int which, uint8_t *row)
{
    uint64_t s = rng_mix(h + rng_mix((uint64_t)layer << 1 | (uint64_t)which));

    for (size_t i = 0; i < ROW; i += 8) {
        uint64_t w = rng_mix(s + i);
        memcpy(row + i, &w, 8);
    }
}

/* Write the KV rows of tokens [from, from + n) of q into slots, as a forward would. */
static inline int compute_rows(kvt_engine *e, const struct seq *q, size_t from, size_t n,
                               const int32_t *slots)
{
    uint8_t k[MAX_TOK * ROW], v[MAX_TOK * ROW];

    for (uint32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < n; i++) {
            fill_row(q->h[from + i], l, 0, k + i * ROW);
            fill_row(q->h[from + i], l, 1, v + i * ROW);
        }
        int rc = kvt_kv_write(e, l, slots, n, k, v);
        if (rc)
            return rc;
    }
    return 0;
}

/* Rows of tokens [from, from + n) of q in slots, layer l: the index of the first token
 * whose K or V row is wrong, or -1 when all are right (-2 when the read fails). */
static inline long check_layer(kvt_engine *e, const struct seq *q, size_t from, size_t n,
                               const int32_t *slots, uint32_t l)
{
    uint8_t k[MAX_TOK * ROW], v[MAX_TOK * ROW], want[ROW];

    if (n == 0)
        return -1;
    if (kvt_kv_read(e, l, slots, n, k, v))
        return -2;
    for (size_t i = 0; i < n; i++) {
        fill_row(q->h[from + i], l, 0, want);
        if (memcmp(want, k + i * ROW, ROW))
            return (long)(from + i);
        fill_row(q->h[from + i], l, 1, want);
        if (memcmp(want, v + i * ROW, ROW))
            return (long)(from + i);
    }
    return -1;
}

#endif
