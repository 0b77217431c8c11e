/*
 * kvtier-bench's multimodal part (bench_mm.h).
 *
 * A request's image needs an embedding when some of its tokens lie past the cached prefix:
 * their KV is computed, and a vision-language model computes it from the image's embedding.
 * The bench asks the embedding cache first (kvt_emb_fetch, waiting for a read from below);
 * on a miss it "encodes" the image (its bytes are a function of its hash) and puts the result.
 * Every embedding the cache served is read back whole and compared with the image's bytes.
 * The encoder's work is counted in image tokens: an encoder's cost grows with them.
 */
#include "bench_mm.h"
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "kvtier-bench"
#define MAX_HELD 64 /* images of one request held at once */

static const char *const tier_names[] = {"device", "host", "disk", "remote"};
const char *const bench_mm_store_names[] = {"all", "none"};

struct mm_counts {
    uint64_t images, image_tokens;    /* every image of every prompt */
    uint64_t covered, covered_tokens; /* inside the cached prefix: no embedding needed */
    uint64_t needed, needed_tokens;
    uint64_t served[4], served_tokens[4];
    uint64_t encoded, encoded_tokens;
    uint64_t read_misses; /* found below, but the read missed (damaged or gone) */
    uint64_t not_cached;  /* encoded, and the cache had no room for it */
    uint64_t checked, bytes_checked, mismatches;
    uint64_t cuts, cut_tokens; /* prefixes cut at an image's first 8 tokens */
};

struct bench_mm {
    struct bench_mm_config cfg;
    kvt_engine *e;
    uint32_t page_size;
    uint8_t *want, *got; /* the largest embedding's bytes */
    size_t cap;
    struct kvt_emb held[MAX_HELD];
    size_t nheld;
    struct mm_counts c;
    uint64_t first_bad; /* the request of the first mismatch (1-based); 0: none */
};

bool bench_mm_wanted(const char *synthetic)
{
    return synthetic && !strcmp(synthetic, "multimodal");
}

int bench_mm_check_args(const struct bench_mm_config *c, const char *synthetic)
{
    if (!bench_mm_wanted(synthetic) && (c->device_bytes || c->host_bytes || c->token_bytes))
        return cli_bad_usage(PROG, "--emb-* options need --synthetic multimodal", NULL);
    return 0;
}

static uint64_t token_bytes(const struct bench_mm_config *c, uint64_t cell)
{
    uint64_t b = c->token_bytes ? c->token_bytes : cell / 8 / 16 * 16;

    return b < 16 && !c->token_bytes ? 16 : b;
}

void bench_mm_options(const struct bench_mm_config *c, uint64_t kv_bytes, struct kvt_options *o)
{
    uint64_t dev = c->device_bytes ? c->device_bytes : kv_bytes / 4;

    o->emb_device_bytes = dev < (1u << 20) ? 1u << 20 : dev;
    o->emb_host_bytes = c->host_bytes;
    o->emb_store = c->store;
}

int bench_mm_open(const struct bench_mm_config *c, uint64_t cell_bytes, uint32_t page_size,
                  kvt_engine *e, struct bench_mm **out)
{
    struct bench_mm *m = calloc(1, sizeof(*m));

    if (!m) {
        fprintf(stderr, "%s: out of memory\n", PROG);
        return -1;
    }
    m->cfg = *c;
    m->cfg.token_bytes = token_bytes(c, cell_bytes);
    m->e = e;
    m->page_size = page_size;
    *out = m;
    return 0;
}

void bench_mm_close(struct bench_mm *m)
{
    if (!m)
        return;
    bench_mm_release(m);
    free(m->want);
    free(m->got);
    free(m);
}

/* ---- one request ---- */

static int engine_error(const char *call, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, call, kvt_strerror(rc));
    return -1;
}

/* The image's embedding, into m->want: a function of its hash, word by word. */
static int image_bytes(struct bench_mm *m, const uint8_t *hash, size_t len)
{
    uint64_t seed;

    if (len > m->cap) {
        free(m->want);
        free(m->got);
        m->want = malloc(len);
        m->got = malloc(len);
        m->cap = m->want && m->got ? len : 0;
        if (!m->cap) {
            fprintf(stderr, "%s: out of memory for an embedding of %zu bytes\n", PROG, len);
            return -1;
        }
    }
    memcpy(&seed, hash, 8);
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = wl_mix(seed + i);
        memcpy(m->want + i, &v, len - i < 8 ? len - i : 8);
    }
    return 0;
}

/* Check a served embedding against the image's bytes (in m->want). */
static int verify(struct bench_mm *m, const struct kvt_emb *h, size_t len, uint64_t request)
{
    int rc;

    m->c.checked++;
    if (h->len != len) {
        m->c.mismatches++;
    } else if ((rc = kvt_emb_read(m->e, h, 0, m->got, len))) {
        return engine_error("kvt_emb_read", rc);
    } else {
        m->c.bytes_checked += len;
        m->c.mismatches += memcmp(m->got, m->want, len) != 0;
    }
    if (m->c.mismatches && !m->first_bad)
        m->first_bad = request;
    return 0;
}

/* A miss: encode the image and cache it, held; when the cache has no room, serve it uncached. */
static int encode(struct bench_mm *m, const struct kvt_emb_key *k, size_t len, uint32_t tokens)
{
    int rc = kvt_emb_put(m->e, k, m->want, len, &m->held[m->nheld]);

    m->c.encoded++;
    m->c.encoded_tokens += tokens;
    if (rc == 0)
        m->nheld++;
    else if (rc == -ENOMEM || rc == -E2BIG)
        m->c.not_cached++;
    else
        return engine_error("kvt_emb_put", rc);
    return 0;
}

static int one_image(struct bench_mm *m, const struct wl_seg *g, uint64_t request)
{
    uint8_t hash[32];
    struct kvt_emb_key k = {hash, NULL, 0};
    struct kvt_emb *h = &m->held[m->nheld];
    size_t len = (size_t)(g->len * m->cfg.token_bytes);
    int rc;

    wl_image_hash(g->id, hash);
    if (image_bytes(m, hash, len))
        return -1;
    m->c.needed++;
    m->c.needed_tokens += g->len;
    if (m->nheld == MAX_HELD) {
        fprintf(stderr, "%s: request %" PRIu64 " has more than %d images\n", PROG, request,
                MAX_HELD);
        return -1;
    }
    if ((rc = kvt_emb_fetch(m->e, &k, h)) == -ENOENT || rc == -ENOMEM || rc == -EIO)
        return encode(m, &k, len, g->len);
    if (rc)
        return engine_error("kvt_emb_fetch", rc);
    if ((rc = kvt_emb_wait(m->e, h, -1)) == -ENOENT || rc == KVT_ECORRUPT || rc == -EIO) {
        m->c.read_misses++;
        return encode(m, &k, len, g->len);
    }
    if (rc)
        return engine_error("kvt_emb_wait", rc);
    m->nheld++;
    m->c.served[h->tier]++;
    m->c.served_tokens[h->tier] += g->len;
    return verify(m, h, len, request);
}

int bench_mm_serve(struct bench_mm *m, const struct workload *w, const struct wl_req *r, size_t hit,
                   uint64_t request)
{
    size_t at = 0;

    for (uint32_t s = 0; s < r->nsegs; s++) {
        const struct wl_seg *g = &w->segs[r->first_seg + s];
        at += g->len;
        if (!(g->id & WL_IMAGE_BIT) || (g->id & WL_OUTPUT_BIT))
            continue;
        m->c.images++;
        m->c.image_tokens += g->len;
        if (at <= hit) {
            m->c.covered++;
            m->c.covered_tokens += g->len;
        } else if (one_image(m, g, request)) {
            return -1;
        }
    }
    return 0;
}

void bench_mm_release(struct bench_mm *m)
{
    for (size_t i = 0; i < m->nheld; i++)
        (void)kvt_emb_release(m->e, &m->held[i]);
    m->nheld = 0;
}

int bench_mm_key(struct bench_mm *m, const struct workload *w, const struct wl_req *r,
                 struct kvt_key *key)
{
    size_t starts[MAX_HELD], n = 0, at = 0;
    struct kvt_match mt;
    int rc;

    for (uint32_t s = 0; s < r->nsegs && n < MAX_HELD; s++) {
        const struct wl_seg *g = &w->segs[r->first_seg + s];
        if ((g->id & WL_IMAGE_BIT) && !(g->id & WL_OUTPUT_BIT))
            starts[n++] = at;
        at += g->len;
    }
    if (n == 0 || key->len == 0)
        return 0;
    if ((rc = kvt_match(m->e, key, NULL, &mt)))
        return engine_error("kvt_match", rc);
    size_t found = mt.device_len + mt.host_len + mt.disk_len;
    size_t limit = kvt_emb_prefix_limit(starts, n, found, m->page_size);
    if (limit < found) {
        m->c.cuts++;
        m->c.cut_tokens += found - limit;
        key->len = limit;
    }
    return 0;
}

/* ---- report ---- */

uint64_t bench_mm_mismatches(const struct bench_mm *m)
{
    return m ? m->c.mismatches : 0;
}

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static uint64_t sum4(const uint64_t *v)
{
    return v[0] + v[1] + v[2] + v[3];
}

static void print_size(uint64_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    size_t u = 0;

    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    printf(u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static void print_cache(const struct bench_mm *m)
{
    struct kvt_emb_stats st = {.size = sizeof(st)};

    if (kvt_emb_stats(m->e, &st))
        return;
    printf("  emb cache     device ");
    print_size(st.device_bytes);
    printf(" (%" PRIu64 " kept, %" PRIu64 " evicted)", st.device_embeddings, st.evicted_device);
    if (st.host_bytes) {
        printf(", host ");
        print_size(st.host_bytes);
        printf(" (%" PRIu64 " kept, %" PRIu64 " evicted)", st.host_embeddings, st.evicted_host);
    }
    printf("; %" PRIu64 " B a token; stored below %" PRIu64 ", read misses %" PRIu64 "\n",
           m->cfg.token_bytes, st.stored, m->c.read_misses);
}

void bench_mm_print(const struct bench_mm *m)
{
    const struct mm_counts *c = &m->c;
    uint64_t served = sum4(c->served), st = sum4(c->served_tokens);

    printf("  images        %" PRIu64 " in prompts (%" PRIu64 " tokens): %" PRIu64
           " inside the cached prefix, %" PRIu64 " needed an embedding (%" PRIu64 " tokens)\n",
           c->images, c->image_tokens, c->covered, c->needed, c->needed_tokens);
    printf("  embeddings    served %" PRIu64 " (%.1f%%): ", served, pct(served, c->needed));
    for (int t = 0; t < 4; t++)
        printf("%s%s %" PRIu64, t ? ", " : "", tier_names[t], c->served[t]);
    printf("; encoded %" PRIu64 "\n", c->encoded);
    printf("  encoder saved %.1f%% of the image tokens needing an embedding (%" PRIu64
           " of %" PRIu64 "); %.1f%% of all image tokens with the prefix cache's\n",
           pct(st, c->needed_tokens), st, c->needed_tokens,
           pct(st + c->covered_tokens, c->image_tokens));
    print_cache(m);
    printf("  verified      %" PRIu64 " embeddings served (", c->checked);
    print_size(c->bytes_checked);
    printf("), %" PRIu64 " mismatches", c->mismatches);
    if (m->first_bad)
        printf(" (the first in request %" PRIu64 ")", m->first_bad);
    printf("; %" PRIu64 " prefixes cut short of an image's first 8 tokens\n", c->cuts);
}

static void json_tiers(const char *name, const uint64_t *v)
{
    printf(",\"%s\":{", name);
    for (int t = 0; t < 4; t++)
        printf("%s\"%s\":%" PRIu64, t ? "," : "", tier_names[t], v[t]);
    printf("}");
}

void bench_mm_json(const struct bench_mm *m)
{
    const struct mm_counts *c = &m->c;
    struct kvt_emb_stats st = {.size = sizeof(st)};

    (void)kvt_emb_stats(m->e, &st);
    printf("\"multimodal\":{\"images\":%" PRIu64 ",\"image_tokens\":%" PRIu64
           ",\"covered\":%" PRIu64 ",\"covered_tokens\":%" PRIu64 ",\"needed\":%" PRIu64
           ",\"needed_tokens\":%" PRIu64,
           c->images, c->image_tokens, c->covered, c->covered_tokens, c->needed, c->needed_tokens);
    json_tiers("served", c->served);
    json_tiers("served_tokens", c->served_tokens);
    printf(",\"encoded\":%" PRIu64 ",\"encoded_tokens\":%" PRIu64 ",\"encoder_saved\":%.4f"
           ",\"read_misses\":%" PRIu64 ",\"not_cached\":%" PRIu64 ",\"verified\":%" PRIu64
           ",\"bytes_verified\":%" PRIu64 ",\"mismatches\":%" PRIu64 ",\"prefix_cuts\":%" PRIu64
           ",\"cut_tokens\":%" PRIu64,
           c->encoded, c->encoded_tokens,
           c->needed_tokens ? (double)sum4(c->served_tokens) / (double)c->needed_tokens : 0.0,
           c->read_misses, c->not_cached, c->checked, c->bytes_checked, c->mismatches, c->cuts,
           c->cut_tokens);
    printf(",\"emb_device_bytes\":%" PRIu64 ",\"emb_host_bytes\":%" PRIu64
           ",\"emb_token_bytes\":%" PRIu64 ",\"emb_store\":\"%s\",\"evicted_device\":%" PRIu64
           ",\"evicted_host\":%" PRIu64 ",\"stored\":%" PRIu64 ",\"store_errors\":%" PRIu64 "},",
           st.device_bytes, st.host_bytes, m->cfg.token_bytes, bench_mm_store_names[m->cfg.store],
           st.evicted_device, st.evicted_host, st.stored, st.store_errors);
}
