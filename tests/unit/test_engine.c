/* The public API: options, bad input, and the request lifecycle across cache and allocator. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine.h"
#include "engine_fixture.h"

static void base_options(struct kvt_options *o)
{
    fixture_engine_options(o, 2, 4);
}

static kvt_engine *open_engine(void)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    base_options(&o);
    assert_int_equal(kvt_open(&o, &e), 0);
    return e;
}

static void check(const kvt_engine *e)
{
    char why[200];

    if (engine_check(e, why, sizeof(why)))
        fail_msg("engine check: %s", why);
}

static struct kvt_stats stats(const kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_stats(e, &st), 0);
    return st;
}

/* Everything a rejected call must leave as it was. */
static void assert_same(const kvt_engine *e, const struct kvt_stats *before)
{
    struct kvt_stats now = stats(e);

    assert_int_equal(now.device_free_tokens, before->device_free_tokens);
    assert_int_equal(now.cached_tokens, before->cached_tokens);
    assert_int_equal(now.protected_tokens, before->protected_tokens);
    assert_int_equal(now.nodes, before->nodes);
    assert_int_equal(now.req_slots_free, before->req_slots_free);
    check(e);
}

static void test_options(void **state)
{
    struct kvt_options o;
    kvt_engine *e = (kvt_engine *)1;

    (void)state;
    kvt_options_init(&o, sizeof(o));
    assert_int_equal(o.size, sizeof(o));
    assert_int_equal(o.page_size, 16);
    assert_int_equal(o.hash_pages, 1);
    assert_int_equal(o.tp_size, 1);
    assert_int_equal(kvt_open(&o, &e), -EINVAL); /* no geometry */
    assert_null(e);

#define REJECT(field, value)                                                                       \
    do {                                                                                           \
        base_options(&o);                                                                          \
        o.field = value;                                                                           \
        assert_int_equal(kvt_open(&o, &e), -EINVAL);                                               \
    } while (0)
    REJECT(page_size, 0);
    REJECT(page_size, 3);
    REJECT(page_size, 512);
    REJECT(backend, 7);
    REJECT(sim_serial, 2);
    REJECT(evict_policy, 6);
    REJECT(hash_pages, 2);
    REJECT(tp_rank, 1);
    REJECT(tp_size, 0);
    REJECT(max_requests, 0);
    REJECT(max_context, 0);
    REJECT(geometry.layers, 0);
    REJECT(geometry.dtype_bytes, 3);
    REJECT(geometry.attention, 2);
    REJECT(geometry.kv_heads, 1u << 31); /* a row size that would overflow */
    REJECT(geometry.layers, 1u << 20);
    REJECT(geometry.kv_lora_rank, 4); /* an MLA field on an MHA geometry */
    REJECT(max_context, 0x80000000u);
    REJECT(device_tokens, 3); /* less than a page */
    REJECT(size, 0);
    REJECT(size, sizeof(o.size) - 1); /* not even the size field */
#undef REJECT
    base_options(&o);
    o.device_tokens = 0; /* and no budget either */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    assert_int_equal(kvt_open(NULL, &e), -EINVAL);
    assert_int_equal(kvt_open(&o, NULL), -EINVAL);

    /* A caller built against a newer header: unknown options must be zero. */
    struct {
        struct kvt_options o;
        uint64_t newer;
    } ext;
    memset(&ext, 0, sizeof(ext));
    base_options(&ext.o);
    ext.o.size = sizeof(ext);
    ext.newer = 1;
    assert_int_equal(kvt_open(&ext.o, &e), -EINVAL);
    ext.newer = 0;
    assert_int_equal(kvt_open(&ext.o, &e), 0);
    kvt_close(e);

    /* A budget instead of a token count: 2 layers x (K + V) x 4 x 2 bytes = 32 B a token. */
    base_options(&o);
    o.device_tokens = 0;
    o.device_bytes = 32 * 100;
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(stats(e).device_tokens, 96); /* 100 rows - 4 padding, whole pages */
    kvt_close(e);
    kvt_close(NULL);
}

/* A caller built against an older header passes a shorter struct kvt_options (and struct
 * kvt_stats): init fills only its bytes, open reads only its fields and gives the rest their
 * defaults, stats fills only what it has. The structs are heap blocks of exactly that size,
 * so ASan sees any access past them; the test reads and writes them as bytes, as the older
 * struct is another type. */
#define PUT(buf, type, field, v)                                                                   \
    do {                                                                                           \
        __typeof__(((type *)0)->field) v_ = (v);                                                   \
        memcpy((uint8_t *)(buf) + offsetof(type, field), &v_, sizeof(v_));                         \
    } while (0)
#define GET(buf, type, field, out)                                                                 \
    memcpy(&(out), (uint8_t *)(buf) + offsetof(type, field), sizeof(out))

static void test_older_caller(void **state)
{
    size_t sz = offsetof(struct kvt_options, model_id), got_size; /* up to hash_pages */
    struct kvt_options full;
    uint8_t *raw = malloc(sizeof(full));
    uint32_t u32;
    uint64_t u64;
    kvt_engine *e = NULL;

    (void)state;
    memset(raw, 0xab, sizeof(full));
    kvt_options_init((struct kvt_options *)raw, sz);
    GET(raw, struct kvt_options, size, got_size);
    assert_int_equal(got_size, sz);
    GET(raw, struct kvt_options, page_size, u32);
    assert_int_equal(u32, 16);
    for (size_t i = sz; i < sizeof(full); i++)
        assert_int_equal(raw[i], 0xab); /* not the caller's to write */
    free(raw);

    uint8_t *old = malloc(sz);
    base_options(&full);
    memcpy(old, &full, sz);
    PUT(old, struct kvt_options, size, sz);
    PUT(old, struct kvt_options, page_size, 8);
    assert_int_equal(kvt_open((struct kvt_options *)old, &e), 0);
    assert_int_equal(e->opts.page_size, 8);
    assert_int_equal(e->opts.max_requests, 4);
    assert_int_equal(e->opts.write_threshold, 2); /* past its size: the defaults */
    assert_int_equal(e->opts.tp_size, 1);
    assert_null(e->below);
    assert_null(e->stats);
    free(old);

    size_t ssz = offsetof(struct kvt_stats, cached_tokens);
    uint8_t *st = malloc(ssz);
    PUT(st, struct kvt_stats, size, ssz);
    assert_int_equal(kvt_stats(e, (struct kvt_stats *)st), 0);
    GET(st, struct kvt_stats, size, got_size);
    assert_int_equal(got_size, ssz);
    GET(st, struct kvt_stats, page_size, u32);
    assert_int_equal(u32, 8);
    GET(st, struct kvt_stats, device_tokens, u64);
    assert_int_equal(u64, 64);
    free(st);
    kvt_close(e);
}
#undef PUT
#undef GET

/* A caller built against a newer header: init zeroes its fields past ours and keeps its size,
 * so an option this library does not know, once set, is refused rather than ignored. */
static void test_newer_caller(void **state)
{
    struct {
        struct kvt_options o;
        uint64_t newer;
    } ext;
    kvt_engine *e = NULL;

    (void)state;
    memset(&ext, 0xab, sizeof(ext));
    kvt_options_init(&ext.o, sizeof(ext));
    assert_int_equal(ext.o.size, sizeof(ext));
    assert_int_equal(ext.newer, 0);
    struct kvt_options base;
    base_options(&base);
    memcpy((uint8_t *)&ext.o + sizeof(size_t), (uint8_t *)&base + sizeof(size_t),
           sizeof(base) - sizeof(size_t));
    ext.newer = 5;
    assert_int_equal(kvt_open(&ext.o, &e), -EINVAL);
    ext.newer = 0;
    assert_int_equal(kvt_open(&ext.o, &e), 0);

    struct {
        struct kvt_stats st;
        uint64_t newer;
    } sx;
    memset(&sx, 0xab, sizeof(sx));
    sx.st.size = sizeof(sx);
    assert_int_equal(kvt_stats(e, &sx.st), 0);
    assert_int_equal(sx.st.size, sizeof(struct kvt_stats));
    assert_int_equal(sx.newer, 0);
    assert_int_equal(sx.st.device_tokens, 64);
    kvt_close(e);
}

static void test_backend_choice(void **state)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    (void)state;
    base_options(&o);
    o.backend = KVT_BACKEND_AUTO;
    assert_int_equal(kvt_open(&o, &e), 0);
    uint32_t chosen = stats(e).backend;
    kvt_close(e);
    o.backend = KVT_BACKEND_CUDA;
    int rc = kvt_open(&o, &e);
    if (chosen == KVT_BACKEND_SIM) {
        /* auto fell back to sim, so cuda cannot be had: a clear error, not a crash. */
        assert_int_equal(rc, KVT_ENOBACKEND);
    } else {
        assert_int_equal(rc, 0);
        kvt_close(e);
    }
}

static void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(kvt_strerror(0), "success");
    assert_non_null(strstr(kvt_strerror(KVT_ENOBACKEND), "backend"));
    assert_string_equal(kvt_strerror(-EINVAL), kvt_strerror(EINVAL));
    assert_non_null(strstr(kvt_strerror(-ENOMEM), "memory"));
    assert_string_equal(kvt_strerror(-99999), "unknown error");
    assert_string_equal(kvt_strerror(INT_MIN), "unknown error");
}

static void test_version(void **state)
{
    int major = -1, minor = -1, patch = -1;
    char want[32];

    (void)state;
    snprintf(want, sizeof(want), "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
             KVT_VERSION_PATCH);
    assert_string_equal(kvt_version(&major, &minor, &patch), want);
    assert_int_equal(major, KVT_VERSION_MAJOR);
    assert_int_equal(minor, KVT_VERSION_MINOR);
    assert_int_equal(patch, KVT_VERSION_PATCH);
    assert_string_equal(kvt_version(NULL, NULL, NULL), want);
}

static void test_fingerprint(void **state)
{
    struct kvt_options o;
    kvt_engine *e;
    uint8_t a[32], b[32], c[32];

    (void)state;
    base_options(&o);
    o.model_id = "llama";
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, a);
    kvt_close(e);
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, b);
    kvt_close(e);
    assert_memory_equal(a, b, 32);
    o.model_id = "llamb";
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, c);
    kvt_close(e);
    assert_memory_not_equal(a, c, 32);
    memset(c, 0xab, sizeof(c));
    kvt_fingerprint(NULL, c); /* no engine: zeros */
    assert_memory_equal(c, (uint8_t[32]){0}, 32);
    kvt_fingerprint(NULL, NULL);
    o.model_id = "llama";
    o.tp_size = 2;
    o.tp_rank = 1;
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, c);
    kvt_close(e);
    assert_memory_not_equal(a, c, 32);
}

static void test_insert_ownership(void **state)
{
    kvt_engine *e = open_engine();
    const uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kvt_key key = {.tokens = tok, .len = 8};
    int32_t s[8], dup[8], got[8];
    struct kvt_match m;
    size_t pre;

    (void)state;
    struct kvt_stats before = stats(e);
    /* Slots nobody allocated cannot enter the cache. */
    const int32_t stray[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    assert_int_equal(kvt_insert(e, &key, stray, 0, &pre), -EINVAL);
    assert_same(e, &before);
    assert_int_equal(kvt_alloc(e, 8, s), 0);
    const int32_t torn[8] = {s[0], s[1], s[2], s[3], s[5], s[4], s[6], s[7]};
    assert_int_equal(kvt_insert(e, &key, torn, 0, &pre), -EINVAL);
    key.len = 6;
    assert_int_equal(kvt_insert(e, &key, s, 0, &pre), -EINVAL); /* not whole pages */
    key.len = 0;
    assert_int_equal(kvt_insert(e, &key, s, 0, &pre), -EINVAL);
    assert_int_equal(kvt_match(e, &key, got, &m), -EINVAL);
    key.len = 65; /* past max_context */
    assert_int_equal(kvt_insert(e, &key, s, 0, &pre), -EINVAL);
    key.len = 8;
    before = stats(e);
    assert_same(e, &before);

    assert_int_equal(kvt_insert(e, &key, s, 0, &pre), 0);
    assert_int_equal(pre, 0);
    check(e);
    assert_int_equal(kvt_free(e, s, 8), -EINVAL); /* the cache owns them now */
    /* The same slots again: already cached, nothing changes hands. */
    assert_int_equal(kvt_insert(e, &key, s, 0, &pre), 0);
    assert_int_equal(pre, 8);
    /* A duplicate computed elsewhere stays the caller's to free. */
    assert_int_equal(kvt_alloc(e, 8, dup), 0);
    assert_int_equal(kvt_insert(e, &key, dup, 0, &pre), 0);
    assert_int_equal(pre, 8);
    assert_int_equal(kvt_free(e, dup, 8), 0);
    assert_int_equal(kvt_match(e, &key, got, &m), 0);
    assert_int_equal(m.device_len, 8);
    assert_memory_equal(got, s, sizeof(s));
    assert_int_equal(kvt_lock(e, m.last_node), 0);
    assert_int_equal(kvt_unlock(e, m.last_node), 0);
    assert_int_equal(kvt_unlock(e, m.last_node), -EINVAL);
    size_t ev;
    assert_int_equal(kvt_evict(e, 1, &ev), 0);
    assert_int_equal(ev, 8);
    assert_int_equal(kvt_available(e), 64);
    assert_int_equal(kvt_lock(e, m.last_node), -EINVAL); /* stale after eviction */
    check(e);
    kvt_close(e);
}

/* Run a request as a scheduler would: begin, allocate the rest, write it, finish. */
static void run_request(kvt_engine *e, const uint32_t *tok, size_t len, size_t want_hit)
{
    struct kvt_key key = {.tokens = tok, .len = len};
    struct kvt_req r;
    int32_t out[64], last = -1;

    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.protected_len, want_hit);
    uint32_t pre = (uint32_t)r.protected_len, seq = (uint32_t)len;
    if (pre)
        assert_int_equal(kvt_req_read(e, &r, pre - 1, 1, &last), 0);
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, &last, out, len - pre), 0);
    assert_int_equal(kvt_req_write(e, &r, pre, out, len - pre), 0);
    check(e);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    assert_int_equal(r.pool_idx, -1);
    check(e);
}

static void test_finished(void **state)
{
    kvt_engine *e = open_engine();
    uint32_t tok[14];

    (void)state;
    for (uint32_t i = 0; i < 14; i++)
        tok[i] = i + 1;
    /* 10 tokens: 2 whole pages are cached, the partial third page is freed. */
    run_request(e, tok, 10, 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.cached_tokens, 8);
    assert_int_equal(st.device_free_tokens, 64 - 8);
    assert_int_equal(st.protected_tokens, 0);
    assert_int_equal(st.req_slots_free, 4);
    /* 14 tokens sharing them: 8 served, one more page cached. */
    run_request(e, tok, 14, 8);
    st = stats(e);
    assert_int_equal(st.cached_tokens, 12);
    assert_int_equal(st.device_free_tokens, 64 - 12);
    assert_int_equal(st.match_hit_tokens, 8);
    kvt_close(e);
}

/* Two requests compute the same prompt at once: the second one's pages are duplicates and
 * go back to the allocator when it finishes. */
static void test_duplicates(void **state)
{
    kvt_engine *e = open_engine();
    const uint32_t tok[8] = {9, 9, 9, 9, 8, 8, 8, 8};
    struct kvt_key key = {.tokens = tok, .len = 8};
    struct kvt_req a, b;
    int32_t sa[8], sb[8], got[8];
    uint32_t pre = 0, seq = 8;
    int32_t none = -1;

    (void)state;
    assert_int_equal(kvt_req_begin(e, &key, &a), 0);
    assert_int_equal(kvt_req_begin(e, &key, &b), 0);
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, &none, sa, 8), 0);
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, &none, sb, 8), 0);
    assert_int_equal(kvt_req_write(e, &a, 0, sa, 8), 0);
    assert_int_equal(kvt_req_write(e, &b, 0, sb, 8), 0);
    assert_int_equal(kvt_req_cache_finished(e, &a, &key, 0, 1), 0);
    assert_int_equal(kvt_available(e), 64 - 16);
    assert_int_equal(kvt_req_cache_finished(e, &b, &key, 0, 1), 0);
    assert_int_equal(kvt_available(e), 64 - 8);
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, got, &m), 0);
    assert_memory_equal(got, sa, sizeof(sa));
    check(e);
    kvt_close(e);
}

/* Chunked prefill: 18 tokens in chunks of 6. After each chunk the whole pages are cached,
 * the lock moves to the new last node, and the partial page stays with the request. */
static void test_unfinished(void **state)
{
    kvt_engine *e = open_engine();
    uint32_t tok[18];
    struct kvt_req r;
    int32_t out[8], row[18];

    (void)state;
    for (uint32_t i = 0; i < 18; i++)
        tok[i] = 100 + i;
    struct kvt_key key = {.tokens = tok, .len = 18};
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    kvt_node_ref first_lock = r.last_node;
    for (uint32_t done = 0; done < 18; done += 6) {
        uint32_t pre = done, seq = done + 6;
        int32_t last = -1;
        if (pre)
            assert_int_equal(kvt_req_read(e, &r, pre - 1, 1, &last), 0);
        assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, &last, out, 6), 0);
        assert_int_equal(kvt_req_write(e, &r, pre, out, 6), 0);
        struct kvt_key fill = {.tokens = tok, .len = seq};
        assert_int_equal(kvt_req_cache_unfinished(e, &r, &fill), 0);
        assert_int_equal(r.protected_len, seq / 4 * 4);
        struct kvt_stats st = stats(e);
        assert_int_equal(st.protected_tokens, r.protected_len);
        assert_int_equal(st.cached_tokens, r.protected_len);
        check(e);
    }
    assert_true(r.last_node != first_lock);
    /* The row names the cached slots for the cached part. */
    struct kvt_match m;
    int32_t cached[16];
    assert_int_equal(kvt_req_read(e, &r, 0, 18, row), 0);
    assert_int_equal(kvt_match(e, &key, cached, &m), 0);
    assert_int_equal(m.device_len, 16);
    assert_memory_equal(row, cached, 16 * sizeof(int32_t));
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.protected_tokens, 0);
    assert_int_equal(st.cached_tokens, 16);
    assert_int_equal(st.device_free_tokens, 64 - 16);
    check(e);
    kvt_close(e);
}

static void test_request_errors(void **state)
{
    kvt_engine *e = open_engine();
    const uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kvt_key key = {.tokens = tok, .len = 8};
    struct kvt_req r[5];
    int32_t s[8];

    (void)state;
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvt_req_begin(e, &key, &r[i]), 0);
    struct kvt_stats before = stats(e);
    assert_int_equal(kvt_req_begin(e, &key, &r[4]), -ENOMEM);
    assert_same(e, &before);
    /* The row holds slots nobody allocated: rejected before anything moves. */
    const int32_t stray[8] = {4, 5, 6, 7, 8, 9, 10, 11};
    assert_int_equal(kvt_req_write(e, &r[0], 0, stray, 8), 0);
    assert_int_equal(kvt_req_cache_finished(e, &r[0], &key, 0, 1), -EINVAL);
    assert_same(e, &before);
    /* A row naming one page twice would free it twice: refused. */
    int32_t twice[12];
    assert_int_equal(kvt_alloc(e, 8, s), 0);
    memcpy(twice, s, 8 * sizeof(int32_t));
    memcpy(twice + 8, s + 4, 4 * sizeof(int32_t));
    const uint32_t tok12[12] = {0};
    struct kvt_key key12 = {.tokens = tok12, .len = 12};
    assert_int_equal(kvt_req_write(e, &r[0], 0, twice, 12), 0);
    before = stats(e);
    assert_int_equal(kvt_req_cache_finished(e, &r[0], &key12, 0, 1), -EINVAL);
    assert_int_equal(kvt_req_cache_finished(e, &r[0], &key12, 0, 0), -EINVAL);
    assert_same(e, &before);
    assert_int_equal(kvt_free(e, s, 8), 0);
    /* insert 0 frees what the request computed and caches nothing: the whole row, whose
     * entries 8..11 (past the key) still name the page freed above: rewrite them. */
    assert_int_equal(kvt_alloc(e, 8, s), 0);
    assert_int_equal(kvt_req_write(e, &r[0], 0, s, 8), 0);
    before = stats(e);
    assert_int_equal(kvt_req_cache_finished(e, &r[0], &key, 0, 0), -EINVAL); /* page twice */
    assert_same(e, &before);
    int32_t tail[4];
    assert_int_equal(kvt_alloc(e, 4, tail), 0);
    assert_int_equal(kvt_req_write(e, &r[0], 8, tail, 4), 0);
    assert_int_equal(kvt_req_cache_finished(e, &r[0], &key, 0, 0), 0);
    assert_int_equal(kvt_available(e), 64);
    assert_int_equal(stats(e).cached_tokens, 0);
    before = stats(e);
    assert_int_equal(kvt_req_cache_finished(e, &r[0], &key, 0, 1), -EINVAL); /* twice */
    struct kvt_req forged = r[1];
    forged.pool_idx = 77;
    assert_int_equal(kvt_req_cache_finished(e, &forged, &key, 0, 1), -EINVAL);
    forged = r[1];
    forged.protected_len = 4; /* not what was locked */
    forged.last_node = 12345;
    assert_int_equal(kvt_req_cache_unfinished(e, &forged, &key), -EINVAL);
    assert_int_equal(kvt_req_write(e, &r[1], 60, s, 8), -EINVAL); /* past max_context */
    assert_same(e, &before);
    for (int i = 1; i < 4; i++) {
        struct kvt_key none = {.tokens = tok, .len = 1};
        assert_int_equal(kvt_req_cache_finished(e, &r[i], &none, 0, 0), -EINVAL);
        assert_int_equal(kvt_alloc(e, 4, s), 0);
        assert_int_equal(kvt_req_write(e, &r[i], 0, s, 1), 0);
        assert_int_equal(kvt_req_cache_finished(e, &r[i], &none, 0, 1), 0);
    }
    assert_int_equal(kvt_available(e), 64);
    assert_int_equal(kvt_req_available(e), 4);
    check(e);
    kvt_close(e);
}

/* A request that matched nothing and never got a slot (say its allocation failed) is
 * released with an empty key; a key longer than its row is refused. */
static void test_release_empty(void **state)
{
    kvt_engine *e = open_engine();
    const uint32_t tok[3] = {1, 2, 3};
    struct kvt_key key = {.tokens = tok, .len = 3}, empty = {.tokens = NULL, .len = 0};
    struct kvt_req r;

    (void)state;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.protected_len, 0);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 0), -EINVAL); /* row is empty */
    assert_int_equal(kvt_req_cache_finished(e, &r, &empty, 0, 1), 0);
    assert_int_equal(kvt_req_available(e), 4);
    check(e);
    kvt_close(e);
}

static void test_bad_calls(void **state)
{
    kvt_engine *e = open_engine();
    int32_t s[8];
    size_t n;
    struct kvt_match m;
    struct kvt_key key = {.tokens = (const uint32_t[]){1, 2, 3, 4}, .len = 4};

    (void)state;
    assert_int_equal(kvt_alloc(NULL, 4, s), -EINVAL);
    assert_int_equal(kvt_alloc(e, 0, s), 0); /* a multiple of the page size: nothing */
    assert_int_equal(kvt_alloc(e, 0, NULL), 0);
    assert_int_equal(kvt_alloc(e, 2, s), -EINVAL);
    assert_int_equal(kvt_alloc(e, 68, s), -ENOMEM);
    assert_int_equal(kvt_alloc(e, 4, s), 0);
    assert_int_equal(kvt_free(e, s, 4), 0);
    assert_int_equal(kvt_free(e, s, 4), -EINVAL); /* double free */
    assert_int_equal(kvt_match(e, NULL, s, &m), -EINVAL);
    assert_int_equal(kvt_match(e, &key, s, NULL), -EINVAL);
    assert_int_equal(kvt_insert(e, &key, NULL, 0, &n), -EINVAL);
    assert_int_equal(kvt_unlock(e, 0), -EINVAL);
    assert_int_equal(kvt_lock(e, ~0ull), -EINVAL);
    assert_int_equal(kvt_evict(NULL, 1, &n), -EINVAL);
    assert_int_equal(kvt_free_group_end(e), -EINVAL);
    assert_int_equal(kvt_stats(e, &(struct kvt_stats){.size = 0}), -EINVAL);
    assert_int_equal(kvt_stats(e, &(struct kvt_stats){.size = sizeof(size_t) - 1}), -EINVAL);
    assert_int_equal(kvt_stats(NULL, &(struct kvt_stats){.size = sizeof(struct kvt_stats)}),
                     -EINVAL);
    assert_int_equal(kvt_stats(e, NULL), -EINVAL);
    /* Empty batches: nothing to do. */
    assert_int_equal(kvt_alloc_extend(e, 0, NULL, NULL, NULL, NULL, 0), 0);
    assert_int_equal(kvt_alloc_extend(e, 0, NULL, NULL, NULL, NULL, 4), -EINVAL);
    assert_int_equal(kvt_alloc_decode(e, 0, NULL, NULL, NULL), 0);
    struct kvt_key big_ns = {.tokens = key.tokens, .len = 4, .ns = "x", .ns_len = 257};
    assert_int_equal(kvt_match(e, &big_ns, s, &m), -EINVAL);
    assert_int_equal(kvt_available(e), 64);
    check(e);
    kvt_close(e);
}

/* Cache key (pages of 4 tokens from tok0) and return the slots it got. */
static void cache_key(kvt_engine *e, uint32_t tok0, size_t len, int32_t *slots)
{
    uint32_t tok[64];
    size_t pre;

    for (size_t i = 0; i < len; i++)
        tok[i] = tok0 + (uint32_t)i;
    struct kvt_key key = {.tokens = tok, .len = len};
    assert_int_equal(kvt_alloc(e, len, slots), 0);
    assert_int_equal(kvt_insert(e, &key, slots, 0, &pre), 0);
    assert_int_equal(pre, 0);
}

/* An allocation eviction cannot cover fails before it evicts: -ENOMEM leaves the cache as
 * it was. One eviction can cover is met, evicting no more than it must. */
static void test_alloc_enomem_keeps_cache(void **state)
{
    kvt_engine *e = open_engine();
    int32_t a[8], b[8], held[48], out[20];
    uint32_t pre = 0, seq = 20, ones[5] = {1, 1, 1, 1, 1};
    int32_t none[5] = {-1, -1, -1, -1, -1};

    (void)state;
    cache_key(e, 100, 8, a); /* 2 evictable pages */
    cache_key(e, 200, 8, b); /* 2 more, locked below */
    struct kvt_match m;
    struct kvt_key kb = {.tokens = (const uint32_t[]){200, 201, 202, 203, 204, 205, 206, 207},
                         .len = 8};
    assert_int_equal(kvt_match(e, &kb, NULL, &m), 0);
    assert_int_equal(kvt_lock(e, m.last_node), 0);
    assert_int_equal(kvt_alloc(e, 40, held), 0); /* 2 pages left free */
    struct kvt_stats before = stats(e);
    assert_int_equal(before.evictable_tokens, 8);

    /* 5 pages wanted, 2 free + 2 evictable: refused, nothing evicted. */
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, none, out, 20), -ENOMEM);
    assert_same(e, &before);
    assert_int_equal(stats(e).evicted_tokens, 0);
    assert_int_equal(kvt_alloc_decode(e, 5, ones, none, out), -ENOMEM); /* 5 new pages */
    assert_same(e, &before);
    assert_int_equal(stats(e).evicted_tokens, 0);
    /* Inside a free group evicted pages are held back: no eviction can help there. */
    assert_int_equal(kvt_free_group_begin(e), 0);
    seq = 12;
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, none, out, 12), -ENOMEM);
    assert_int_equal(kvt_free_group_end(e), 0);
    assert_same(e, &before);

    /* 3 pages: 1 short, so a's node (its 2 pages) goes and b stays. */
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, none, out, 12), 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.evicted_tokens, 8);
    assert_int_equal(st.cached_tokens, 8);
    assert_int_equal(st.device_free_tokens, 4);
    assert_int_equal(kvt_free(e, out, 12), 0);
    assert_int_equal(kvt_unlock(e, m.last_node), 0);
    assert_int_equal(kvt_free(e, held, 40), 0);
    check(e);
    kvt_close(e);
}

/* A page-aligned prefix's last page is the cache's; when the eviction that makes room takes
 * it (the caller did not lock it), the checked call still succeeds rather than failing
 * after it evicted. */
static void test_alloc_extend_evicts_own_prefix(void **state)
{
    kvt_engine *e = open_engine();
    int32_t a[8], held[56], out[4];

    (void)state;
    cache_key(e, 100, 8, a);
    assert_int_equal(kvt_alloc(e, 56, held), 0); /* nothing free */
    uint32_t pre = 8, seq = 12;
    int32_t last = a[7];
    assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, &last, out, 4), 0);
    assert_int_equal(stats(e).evicted_tokens, 8);
    assert_int_equal(out[0] % 4, 0);
    assert_int_equal(kvt_free(e, out, 4), 0);
    assert_int_equal(kvt_free(e, held, 56), 0);
    check(e);
    kvt_close(e);
}

/* Finishing a request frees every slot its row holds past the protected prefix that does
 * not pass to the cache, including slots past the committed key: nothing leaks. */
static void test_finished_frees_row(void **state)
{
    kvt_engine *e = open_engine();
    uint32_t tok[12];
    int32_t out[12];
    struct kvt_req r;

    (void)state;
    for (uint32_t i = 0; i < 12; i++)
        tok[i] = 500 + i;
    for (int insert = 0; insert <= 1; insert++) {
        struct kvt_key all = {.tokens = tok, .len = 12};
        assert_int_equal(kvt_req_begin(e, &all, &r), 0);
        uint32_t pre = 0, seq = 12;
        int32_t none = -1;
        assert_int_equal(kvt_alloc_extend(e, 1, &pre, &seq, &none, out, 12), 0);
        assert_int_equal(kvt_req_write(e, &r, 0, out, 12), 0);
        /* 6 tokens committed (say the rest was a rejected draft): 12 slots in the row. */
        struct kvt_key six = {.tokens = tok, .len = 6};
        assert_int_equal(kvt_req_cache_finished(e, &r, &six, 0, insert), 0);
        struct kvt_stats st = stats(e);
        assert_int_equal(st.cached_tokens, insert ? 4 : 0);
        assert_int_equal(st.device_free_tokens, 64 - st.cached_tokens);
        check(e);
        size_t ev;
        assert_int_equal(kvt_evict(e, 64, &ev), 0);
    }
    /* A row past the key whose slots are not the caller's is refused whole. */
    struct kvt_key all = {.tokens = tok, .len = 12};
    assert_int_equal(kvt_req_begin(e, &all, &r), 0);
    assert_int_equal(kvt_alloc(e, 8, out), 0);
    const int32_t stray[4] = {40, 41, 42, 43}; /* a free page */
    assert_int_equal(kvt_req_write(e, &r, 0, out, 8), 0);
    assert_int_equal(kvt_req_write(e, &r, 8, stray, 4), 0);
    struct kvt_stats before = stats(e);
    struct kvt_key eight = {.tokens = tok, .len = 8};
    assert_int_equal(kvt_req_cache_finished(e, &r, &eight, 0, 1), -EINVAL);
    assert_same(e, &before);
    /* Rewritten with a page the caller holds, the row is released whole. */
    assert_int_equal(kvt_alloc(e, 4, out + 8), 0);
    assert_int_equal(kvt_req_write(e, &r, 8, out + 8, 4), 0);
    assert_int_equal(kvt_req_cache_finished(e, &r, &eight, 0, 0), 0);
    assert_int_equal(kvt_available(e), 64);
    assert_int_equal(kvt_req_available(e), 4);
    check(e);
    kvt_close(e);
}

/* A copy of a finished request kept by mistake must not act on the next request that takes
 * its slot: not finish it, not write or read its row. */
static void test_stale_request(void **state)
{
    kvt_engine *e = open_engine();
    const uint32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct kvt_key key = {.tokens = tok, .len = 8}, empty = {.tokens = tok, .len = 0};
    struct kvt_req r, stale, next;
    int32_t s[8], row[8];

    (void)state;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    stale = r;
    assert_int_equal(kvt_req_cache_finished(e, &r, &empty, 0, 0), 0);
    assert_int_equal(kvt_req_begin(e, &key, &next), 0);
    assert_int_equal(next.pool_idx, stale.pool_idx); /* the slot is reused */
    assert_int_not_equal(next.gen, stale.gen);
    assert_int_equal(kvt_alloc(e, 8, s), 0);
    assert_int_equal(kvt_req_write(e, &next, 0, s, 8), 0);

    struct kvt_stats before = stats(e);
    assert_int_equal(kvt_req_write(e, &stale, 0, s, 4), -EINVAL);
    assert_int_equal(kvt_req_read(e, &stale, 0, 8, row), -EINVAL);
    assert_int_equal(kvt_req_cache_unfinished(e, &stale, &key), -EINVAL);
    assert_int_equal(kvt_req_cache_finished(e, &stale, &key, 0, 1), -EINVAL);
    assert_int_equal(kvt_req_cache_finished(e, &stale, &empty, 0, 0), -EINVAL);
    assert_same(e, &before);
    struct kvt_req zeroed = {0};
    assert_int_equal(kvt_req_read(e, &zeroed, 0, 1, row), -EINVAL); /* gen 0: never live */

    assert_int_equal(kvt_req_read(e, &next, 0, 8, row), 0);
    assert_memory_equal(row, s, sizeof(s));
    assert_int_equal(kvt_req_cache_finished(e, &next, &key, 0, 1), 0);
    assert_int_equal(stats(e).cached_tokens, 8);
    check(e);
    kvt_close(e);
}

static void test_kv_data(void **state)
{
    struct kvt_options o;
    kvt_engine *e;
    uint8_t k[2 * 12], back[2 * 12];
    int32_t s[4];
    void *ptr;
    size_t row;

    (void)state;
    base_options(&o);
    o.geometry = (struct kvt_geometry){.attention = KVT_ATTN_MLA,
                                       .layers = 3,
                                       .kv_lora_rank = 4,
                                       .qk_rope_head_dim = 2,
                                       .dtype_bytes = 2};
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(kvt_alloc(e, 4, s), 0);
    for (size_t i = 0; i < sizeof(k); i++)
        k[i] = (uint8_t)(i + 1);
    assert_int_equal(kvt_kv_write(e, 2, s + 1, 2, k, NULL), 0);
    assert_int_equal(kvt_kv_read(e, 2, s + 1, 2, back, NULL), 0);
    assert_memory_equal(k, back, sizeof(k));
    assert_int_equal(kvt_kv_buffer(e, 2, 0, &ptr, &row), 0);
    assert_int_equal(row, 12);
    assert_memory_equal((uint8_t *)ptr + (size_t)s[1] * row, k, sizeof(k)); /* sim: host */
    assert_int_equal(kvt_kv_buffer(e, 2, 1, &ptr, &row), -EINVAL);          /* MLA has no V */
    assert_int_equal(kvt_kv_buffer(e, 3, 0, &ptr, &row), -EINVAL);
    assert_int_equal(kvt_kv_write(e, 0, s, 1, k, k), -EINVAL);
    kvt_close(e);
}

/* ---- the stats socket ---- */

/* Send one request line to the socket at path; the whole reply, NUL-terminated. */
static void ask(const char *path, const char *req, char *out, size_t cap)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    size_t n = 0;
    ssize_t r;

    assert_true(fd >= 0);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    while (n + 1 < cap && (r = read(fd, out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd);
}

/* The engine serves the figures of its last poll as JSON and as Prometheus text, on a socket
 * only its owner may use; a second engine cannot take a live socket; close removes it. */
static void test_stats_socket(void **state)
{
    char dir[] = "/tmp/kvt-sock-XXXXXX", path[64], want[96], reply[16384];
    struct kvt_options o;
    kvt_engine *e = NULL, *other = NULL;
    struct stat st;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/stats.sock", dir);
    base_options(&o);
    o.stats_socket = path;
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(kvt_open(&o, &other), -EADDRINUSE);
    assert_null(other);

    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "{\"kvtier\":1,\"time_ns\":"));
    assert_non_null(strstr(reply, "\"device_tokens\":64,"));
    assert_non_null(strstr(reply, "\"match_calls\":0,"));
    /* Figures move at the next poll, not before. */
    struct kvt_key key = {.tokens = (const uint32_t[]){1, 2, 3, 4}, .len = 4};
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "\"match_calls\":0,"));
    assert_int_equal(kvt_poll(e, 0, NULL), 0);
    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "\"match_calls\":1,"));

    ask(path, "metrics\n", reply, sizeof(reply));
    snprintf(want, sizeof(want), "\nkvtier_device_tokens %u\n", 64u);
    assert_non_null(strstr(reply, want));
    assert_non_null(strstr(reply, "# TYPE kvtier_match_calls counter\nkvtier_match_calls 1\n"));
    assert_non_null(strstr(reply, "# TYPE kvtier_cached_tokens gauge\n"));
    ask(path, "bogus\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "error: unknown request"));
    /* Clients that leave before the reply: the server's write fails, and that must not
     * raise SIGPIPE in this process (it would end the test). */
    for (int i = 0; i < 200; i++) {
        int c = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un ca = {.sun_family = AF_UNIX};
        snprintf(ca.sun_path, sizeof(ca.sun_path), "%s", path);
        assert_int_equal(connect(c, (struct sockaddr *)&ca, sizeof(ca)), 0);
        assert_int_equal(write(c, "metrics\n", 8), 8);
        close(c);
    }
    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "\"match_calls\":1,"));

    kvt_close(e);
    assert_int_equal(stat(path, &st), -1);
    /* A socket file left behind by a dead process is taken over. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    close(fd);
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_close(e);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_backend_choice),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_insert_ownership),
        cmocka_unit_test(test_finished),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_unfinished),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_kv_data),
        cmocka_unit_test(test_release_empty),
        cmocka_unit_test(test_stats_socket),
        cmocka_unit_test(test_alloc_enomem_keeps_cache),
        cmocka_unit_test(test_alloc_extend_evicts_own_prefix),
        cmocka_unit_test(test_finished_frees_row),
        cmocka_unit_test(test_stale_request),
        cmocka_unit_test(test_older_caller),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_newer_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
