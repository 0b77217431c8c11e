/*
 * kvtier-demo: a short walk through the device pool and the prefix cache.
 *
 * Simulated users hold multi-turn chats behind one shared system prompt. Each turn is one
 * request handled as a serving engine would: match the prompt, allocate slots for the
 * rest (evicting cached prefixes when the pool is full), "compute" KV by writing bytes that
 * are a function of the token prefix, cache the request. Every token served from the cache
 * is read back from the pool and compared with what its prefix must hold.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define USERS 24
#define TURNS 4
#define SYSTEM_TOKENS 1024
#define TURN_TOKENS 200
#define MAX_TOKENS (SYSTEM_TOKENS + TURNS * TURN_TOKENS * 2)

struct demo {
    kvt_engine *e;
    struct kvt_geometry g;
    size_t row_bytes;
    uint32_t page_size;
    uint8_t *k, *v, *want;
    uint64_t served, computed, total, pages_checked, mismatches, evicted;
};

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The KV row of a token depends on every token up to it, as real KV does. */
static void fill_row(uint64_t prefix_hash, uint32_t layer, int which, uint8_t *row, size_t n)
{
    uint64_t s = mix(prefix_hash ^ ((uint64_t)layer << 1 | (uint64_t)which));

    for (size_t i = 0; i < n; i += 8) {
        s = mix(s);
        memcpy(row + i, &s, n - i < 8 ? n - i : 8);
    }
}

static void prefix_hashes(const uint32_t *tokens, size_t n, uint64_t *h)
{
    uint64_t x = 0;

    for (size_t i = 0; i < n; i++)
        h[i] = x = mix(x ^ tokens[i]);
}

static int compute(struct demo *d, const int32_t *slots, const uint64_t *h, size_t n)
{
    for (uint32_t l = 0; l < d->g.layers; l++) {
        for (size_t i = 0; i < n; i++) {
            fill_row(h[i], l, 0, d->k + i * d->row_bytes, d->row_bytes);
            fill_row(h[i], l, 1, d->v + i * d->row_bytes, d->row_bytes);
        }
        int rc = kvt_kv_write(d->e, l, slots, n, d->k, d->v);
        if (rc)
            return rc;
    }
    return 0;
}

static int verify(struct demo *d, const int32_t *slots, const uint64_t *h, size_t n)
{
    for (uint32_t l = 0; l < d->g.layers; l++) {
        int rc = kvt_kv_read(d->e, l, slots, n, d->k, d->v);
        if (rc)
            return rc;
        for (size_t i = 0; i < n; i++) {
            fill_row(h[i], l, 0, d->want, d->row_bytes);
            int bad = memcmp(d->want, d->k + i * d->row_bytes, d->row_bytes) != 0;
            fill_row(h[i], l, 1, d->want, d->row_bytes);
            bad |= memcmp(d->want, d->v + i * d->row_bytes, d->row_bytes) != 0;
            d->mismatches += bad;
        }
    }
    d->pages_checked += n / d->page_size;
    return 0;
}

/* Allocate the request's new slots, evicting cached prefixes while the pool is short. */
static int alloc_rest(struct demo *d, struct kvt_req *r, size_t len, int32_t *out)
{
    uint32_t pre = (uint32_t)r->protected_len, seq = (uint32_t)len;
    int32_t last = -1;
    size_t got;
    int rc;

    if (pre)
        kvt_req_read(d->e, r, pre - 1, 1, &last);
    while ((rc = kvt_alloc_extend(d->e, 1, &pre, &seq, &last, out, len - pre)) == -ENOMEM) {
        if ((rc = kvt_evict(d->e, len - pre, &got)) || got == 0)
            return -ENOMEM;
        d->evicted += got;
    }
    return rc;
}

static int run_request(struct demo *d, const uint32_t *tokens, size_t len)
{
    struct kvt_key key = {.tokens = tokens, .len = len};
    struct kvt_req r;
    int32_t *slots = malloc(len * sizeof(*slots));
    uint64_t *h = malloc(len * sizeof(*h));
    int rc = -ENOMEM;

    if (!slots || !h)
        goto out;
    prefix_hashes(tokens, len, h);
    if ((rc = kvt_req_begin(d->e, &key, &r)))
        goto out;
    size_t hit = r.protected_len;
    if ((rc = kvt_req_read(d->e, &r, 0, hit, slots)) || (rc = verify(d, slots, h, hit)))
        goto out;
    if ((rc = alloc_rest(d, &r, len, slots + hit)) ||
        (rc = kvt_req_write(d->e, &r, hit, slots + hit, len - hit)) ||
        (rc = compute(d, slots + hit, h + hit, len - hit)))
        goto out;
    rc = kvt_req_cache_finished(d->e, &r, &key, 0, 1);
    d->served += hit;
    d->computed += len - hit;
    d->total += len;
out:
    free(slots);
    free(h);
    return rc;
}

static uint32_t token(uint32_t user, uint32_t pos)
{
    return (uint32_t)(mix((uint64_t)user << 32 | pos) % 128000);
}

static int run(struct demo *d)
{
    static uint32_t conv[USERS][MAX_TOKENS];
    size_t len[USERS] = {0};
    int rc;

    for (uint32_t u = 0; u < USERS; u++)
        for (uint32_t i = 0; i < SYSTEM_TOKENS; i++)
            conv[u][len[u]++] = token(0, i);
    /* Turn by turn across users: each turn appends a question, runs, appends the answer. */
    for (uint32_t t = 0; t < TURNS; t++) {
        for (uint32_t u = 0; u < USERS; u++) {
            for (uint32_t i = 0; i < TURN_TOKENS; i++)
                conv[u][len[u]++] = token(u + 1, t * 2 * TURN_TOKENS + i);
            if ((rc = run_request(d, conv[u], len[u])))
                return rc;
            for (uint32_t i = 0; i < TURN_TOKENS; i++)
                conv[u][len[u]++] = token(u + 1, (t * 2 + 1) * TURN_TOKENS + i);
        }
    }
    return 0;
}

static void report(const struct demo *d)
{
    struct kvt_stats st = {.size = sizeof(st)};

    kvt_stats(d->e, &st);
    printf("kvtier demo: %d users x %d turns behind a %d-token system prompt\n", USERS, TURNS,
           SYSTEM_TOKENS);
    printf("  backend %s, page %u tokens, device pool %" PRIu64 " tokens (%.1f MiB of KV)\n",
           st.backend == KVT_BACKEND_CUDA ? "cuda" : "sim", st.page_size, st.device_tokens,
           st.kv_pool_bytes / 1048576.0);
    printf("  input tokens        %8" PRIu64 "\n", d->total);
    printf("  served from cache   %8" PRIu64 "  (%.1f%%)\n", d->served,
           d->total ? 100.0 * (double)d->served / (double)d->total : 0.0);
    printf("  computed            %8" PRIu64 "\n", d->computed);
    printf("  evicted under load  %8" PRIu64 "\n", d->evicted);
    printf("  pages verified      %8" PRIu64 "  mismatches %" PRIu64 "\n", d->pages_checked,
           d->mismatches);
    printf("  cache now           %8" PRIu64 " tokens in %" PRIu64 " nodes, %.0f bytes of "
           "metadata per cached page\n",
           st.cached_tokens, st.nodes,
           st.cached_tokens ? (double)st.tree_bytes * st.page_size / (double)st.cached_tokens
                            : 0.0);
}

int main(void)
{
    struct kvt_options o;
    struct demo d = {0};
    int rc;

    kvt_options_init(&o, sizeof(o));
    o.geometry = (struct kvt_geometry){
        .attention = KVT_ATTN_MHA, .layers = 4, .kv_heads = 2, .head_dim = 64, .dtype_bytes = 2};
    o.page_size = 16;
    o.device_tokens = 8192;
    o.model_id = "kvtier-demo";
    d.g = o.geometry;
    d.page_size = o.page_size;
    d.row_bytes = (size_t)d.g.kv_heads * d.g.head_dim * d.g.dtype_bytes;
    if ((rc = kvt_open(&o, &d.e))) {
        fprintf(stderr, "kvtier-demo: cannot open the engine: %s\n", kvt_strerror(rc));
        return 1;
    }
    d.k = malloc(MAX_TOKENS * d.row_bytes);
    d.v = malloc(MAX_TOKENS * d.row_bytes);
    d.want = malloc(d.row_bytes);
    rc = d.k && d.v && d.want ? run(&d) : -ENOMEM;
    if (rc == 0)
        report(&d);
    else
        fprintf(stderr, "kvtier-demo: %s\n", kvt_strerror(rc));
    free(d.k);
    free(d.v);
    free(d.want);
    kvt_close(d.e);
    if (rc == 0 && d.mismatches) {
        fprintf(stderr, "kvtier-demo: %" PRIu64 " KV rows differ from what was stored\n",
                d.mismatches);
        return 1;
    }
    return rc ? 1 : 0;
}
