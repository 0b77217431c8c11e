/* Hybrid models with recurrent layers through the public engine (options.mamba): the design's
 * seed examples as requests (230 tokens reuse 192; 280 reuse 256, or 192 once that checkpoint
 * is gone; the A/B/C tree where a request sharing 200 tokens gets A's state at 128 and
 * branches at 192), copy on write at match, checkpoints handed over mid-request and at finish,
 * state eviction under slot pressure and with the KV, options, states saved beside their
 * host copies and restored (round trip, a state evicted alone, the host copies' LRU and their
 * eviction with the KV, the copy being restored kept from the room made for it), and a
 * randomized run, on the device alone and with a small host tier, whose every served KV row
 * and state byte is checked, with the engine's invariant check (each state slot and host copy
 * owned once, as its state says) after every step. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#include "engine/engine.h"
#include "disk/layout.h"
#include "disk/ops.h"
#include "radix/hash.h"
#include "store/mem.h"
#include "engine_fixture.h"
#include "harness.h"
#include "prefix_kv.h"

#define HARNESS_RUN(s) (s)

#define PS 16
#define CTX 512
#define KV_LAYERS 2
#define HEAD_DIM 4
#define M_LAYERS 3
#define CONV 24
#define SSM 600 /* a state of 3 x 624 bytes spans 4 pages of 512 in a store */
#define ROW (HEAD_DIM * 2)

static const struct harness_run plain = {.prog = "test_engine_mamba"};

static void mamba_options(struct kvt_options *o, uint32_t slots)
{
    fixture_engine_options(o, KV_LAYERS, HEAD_DIM);
    o->page_size = PS;
    o->device_tokens = 2048;
    o->max_requests = 4;
    o->max_context = CTX;
    o->mamba = (struct kvt_mamba){.layers = M_LAYERS,
                                  .slots = slots,
                                  .conv_bytes = CONV,
                                  .ssm_bytes = SSM,
                                  .chunk = 64,
                                  .track_interval = 256};
}

static kvt_engine *open_mamba(uint32_t slots)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    mamba_options(&o, slots);
    assert_int_equal(kvt_open(&o, &e), 0);
    return e;
}

/* ---- what a model would compute: KV of a token and the state after a prefix ---- */

static void state_bytes(const uint32_t *tokens, size_t len, uint32_t layer, int part, uint8_t *buf)
{
    prefix_fill(buf, part ? SSM : CONV, prefix_hash(tokens, len) * 31 + layer * 2 + (uint64_t)part);
}

/* Write the state after tokens[0..len) into slot. */
static void write_state(kvt_engine *e, int32_t slot, const uint32_t *tokens, size_t len)
{
    uint8_t buf[SSM];

    for (uint32_t l = 0; l < M_LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            state_bytes(tokens, len, l, p, buf);
            assert_int_equal(kvt_mamba_write(e, slot, l, p, buf), 0);
        }
}

/* Whether slot holds the state after tokens[0..len). */
static int state_is(kvt_engine *e, int32_t slot, const uint32_t *tokens, size_t len)
{
    uint8_t want[SSM], got[SSM];

    for (uint32_t l = 0; l < M_LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            state_bytes(tokens, len, l, p, want);
            assert_int_equal(kvt_mamba_read(e, slot, l, p, got), 0);
            if (memcmp(want, got, p ? SSM : CONV))
                return 0;
        }
    return 1;
}

/* Every KV layer's rows of tokens [0, n). */
static int kv_is(kvt_engine *e, const int32_t *slots, const uint32_t *tokens, size_t n)
{
    for (uint32_t l = 0; l < KV_LAYERS; l++)
        if (!prefix_kv_is(e, l, ROW, slots, tokens, 0, n))
            return 0;
    return 1;
}

/* ---- a request as a serving engine runs it ---- */

struct run {
    struct kvt_req req;
    struct kvt_req_mamba m;
    const uint32_t *tokens;
    size_t len; /* tokens whose KV is in the row and whose state is in the running slot */
};

/* Begin a request on key tokens[0..n) and check what it was served. */
static int begin(const struct harness_run *s, kvt_engine *e, struct run *r, const uint32_t *tokens,
                 size_t n)
{
    struct kvt_key key = {.tokens = tokens, .len = n};
    int32_t row[CTX];
    int rc = kvt_req_begin(e, &key, &r->req);

    if (rc)
        return rc;
    /* Part of the prefix may be landing from the host, layer by layer. */
    for (uint32_t l = 0; l < KV_LAYERS; l++)
        EXPECT_RC(s, kvt_load_wait_layer(e, r->req.load_op, l, NULL), 0);
    EXPECT_RC(s, kvt_req_mamba(e, &r->req, &r->m), 0);
    r->tokens = tokens;
    r->len = r->req.protected_len;
    REQUIRE(s, r->m.kv_len >= r->len && r->len % PS == 0);
    if (r->len)
        REQUIRE(s, state_is(e, r->m.slot, tokens, r->len));
    else
        REQUIRE(s, r->m.slot > 0);
    EXPECT_RC(s, kvt_req_read(e, &r->req, 0, r->len, row), 0);
    REQUIRE(s, kv_is(e, row, tokens, r->len));
    return 0;
}

/* Prefill (or decode) up to `to` tokens: slots, KV rows, the running state. */
static void extend(const struct harness_run *s, kvt_engine *e, struct run *r, size_t to)
{
    int32_t row[CTX], last;
    uint32_t pl = (uint32_t)r->len, sl = (uint32_t)to;

    if (to <= r->len)
        return;
    EXPECT_RC(s, kvt_req_read(e, &r->req, 0, r->len, row), 0);
    last = r->len ? row[r->len - 1] : -1;
    EXPECT_RC(s, kvt_alloc_extend(e, 1, &pl, &sl, &last, row + r->len, to - r->len), 0);
    EXPECT_RC(s, kvt_req_write(e, &r->req, r->len, row + r->len, to - r->len), 0);
    assert_int_equal(prefix_kv_write(e, KV_LAYERS, ROW, row, r->tokens, r->len, to), 0);
    write_state(e, r->m.slot, r->tokens, to);
    r->len = to;
}

/* The forward stopped at r->len, a checkpoint position: record it (the engine copies the
 * running slot into the track slot). */
static void track(const struct harness_run *s, kvt_engine *e, struct run *r)
{
    EXPECT_RC(s, kvt_req_mamba_track(e, &r->req, r->len, 1), 0);
    EXPECT_RC(s, kvt_req_mamba(e, &r->req, &r->m), 0);
    REQUIRE(s, r->m.track_len == r->len && state_is(e, r->m.track_slot, r->tokens, r->len));
}

static void finish(const struct harness_run *s, kvt_engine *e, struct run *r, size_t key_len)
{
    struct kvt_key key = {.tokens = r->tokens, .len = key_len};

    EXPECT_RC(s, kvt_req_cache_finished(e, &r->req, &key, 0, 1), 0);
}

/* A request that caches tokens[0..n) with checkpoints at each of ckpts (ascending). */
static void cache_with_states(kvt_engine *e, const uint32_t *tokens, size_t n, const size_t *ckpts,
                              size_t nc)
{
    struct run r;

    assert_int_equal(begin(&plain, e, &r, tokens, 0), 0);
    for (size_t i = 0; i < nc; i++) {
        struct kvt_key key = {.tokens = tokens, .len = ckpts[i]};
        extend(&plain, e, &r, ckpts[i]);
        track(&plain, e, &r);
        assert_int_equal(kvt_req_cache_unfinished(e, &r.req, &key), 0);
        assert_int_equal(r.req.protected_len, ckpts[i]);
    }
    extend(&plain, e, &r, n);
    finish(&plain, e, &r, n);
    CHECK_ENGINE(&plain, e);
}

static void tokens_of(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

/* A copy of a that agrees with it for `shared` tokens and then differs. */
static void branch_of(uint32_t *b, const uint32_t *a, size_t n, size_t shared)
{
    memcpy(b, a, n * sizeof(*a));
    for (size_t i = shared; i < n; i++)
        b[i] = a[i] + 100000;
}

/* ---- seed examples ---- */

/* Checkpoints at 64, 128, 192 and 320 on 320 cached tokens: a 230-token hit reuses 192. */
static void test_hit_230_reuses_192(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba(0);
    uint32_t a[320], b[320];
    const size_t ck[] = {64, 128, 192, 320};
    struct run r;

    tokens_of(a, 320, 1);
    cache_with_states(e, a, 320, ck, 4);
    branch_of(b, a, 320, 230);
    assert_int_equal(begin(&plain, e, &r, b, 300), 0);
    assert_int_equal(r.req.protected_len, 192);
    assert_int_equal(r.req.loaded_len, 0);
    assert_int_equal(r.m.kv_len, 224);   /* 230 in whole pages */
    assert_int_equal(r.m.branch_len, 0); /* 224 rounds down to 192: nothing past the state */

    struct kvt_match m;
    struct kvt_key key = {.tokens = b, .len = 300};
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 192);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* Checkpoints at 192, 256 and 320: a 280-token hit reuses 256; once that checkpoint is evicted
 * (its KV stays: a tombstone) the same request reuses 192 through it and branches at 256. */
static void test_hit_280_reuses_256_else_192(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba(0);
    uint32_t a[320], b[320];
    const size_t ck[] = {192, 256, 320};
    struct run r;
    struct kvt_stats st = {.size = sizeof(st)};

    tokens_of(a, 320, 1);
    cache_with_states(e, a, 320, ck, 3);
    branch_of(b, a, 320, 280);
    assert_int_equal(begin(&plain, e, &r, b, 300), 0);
    assert_int_equal(r.req.protected_len, 256);
    assert_int_equal(r.m.kv_len, 272);
    finish(&plain, e, &r, r.len);

    /* A request on 200 tokens uses the checkpoint at 192 and leaves those at 256 and 320 the
     * least recently used, which are the ones to go. */
    assert_int_equal(begin(&plain, e, &r, a, 200), 0);
    assert_int_equal(r.req.protected_len, 192);
    finish(&plain, e, &r, r.len);
    assert_int_equal(rdx_mamba_evict(e->tree, 2), 2);
    assert_int_equal(begin(&plain, e, &r, b, 300), 0);
    assert_int_equal(r.req.protected_len, 192);
    assert_int_equal(r.m.kv_len, 272);
    assert_int_equal(r.m.branch_len, 256);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_cached_states, 1);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* A (0..128, a state), B (..256, a tombstone), C (..320, a state): a request sharing 200
 * tokens gets a copy of A's state at 128 and branches at 192; its checkpoint at 192 then
 * serves the next request sharing 200 tokens from 192. */
static void test_abc_branching(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba(0);
    uint32_t a[320], b[320], c[320];
    const size_t ck[] = {128, 320};
    struct run r;

    tokens_of(a, 320, 1);
    cache_with_states(e, a, 320, ck, 2); /* 128 mid-request, 320 at finish */
    branch_of(b, a, 320, 200);
    assert_int_equal(begin(&plain, e, &r, b, 300), 0);
    assert_int_equal(r.req.protected_len, 128);
    assert_int_equal(r.m.kv_len, 192);
    assert_int_equal(r.m.branch_len, 192);
    assert_int_equal(r.m.grid, 64);
    assert_int_equal(r.m.decode_grid, 256);

    /* Copy on write: the request's own state changes, the checkpoint does not. */
    write_state(e, r.m.slot, b, 130);
    extend(&plain, e, &r, 192);
    track(&plain, e, &r);
    extend(&plain, e, &r, 300);
    finish(&plain, e, &r, 300); /* caches up to its checkpoint at 192, no further */
    CHECK_ENGINE(&plain, e);

    /* b's checkpoint at 192 lies on every prefix sharing its first 192 tokens. */
    branch_of(c, a, 320, 200);
    c[199] ^= 1;
    assert_int_equal(begin(&plain, e, &r, c, 300), 0);
    assert_int_equal(r.req.protected_len, 192);
    assert_int_equal(r.m.branch_len, 0);
    finish(&plain, e, &r, r.len);
    /* A's checkpoint is as A left it (begin checks the copy byte for byte). */
    assert_int_equal(begin(&plain, e, &r, a, 150), 0);
    assert_int_equal(r.req.protected_len, 128);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* ---- checkpoint rules ---- */

static void test_track_rules(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba(0);
    uint32_t a[320];
    struct run r;

    tokens_of(a, 320, 7);
    assert_int_equal(begin(&plain, e, &r, a, 0), 0);
    extend(&plain, e, &r, 100);
    assert_int_equal(kvt_req_mamba_track(e, &r.req, 32, 1), -EINVAL);  /* off the grid */
    assert_int_equal(kvt_req_mamba_track(e, &r.req, 128, 1), -EINVAL); /* past the row */
    assert_int_equal(kvt_req_mamba_track(e, &r.req, 0, 1), -EINVAL);   /* not past 0 */
    assert_int_equal(kvt_req_mamba_track(e, &r.req, 64, 2), -EINVAL);
    /* The caller's own forward wrote the checkpoint into the track slot (copy 0). */
    write_state(e, r.m.track_slot, a, 64);
    assert_int_equal(kvt_req_mamba_track(e, &r.req, 64, 0), 0);
    /* Without a checkpoint past the prefix nothing is inserted mid-request. */
    struct kvt_key key = {.tokens = a, .len = 100};
    assert_int_equal(kvt_req_cache_unfinished(e, &r.req, &key), 0);
    assert_int_equal(r.req.protected_len, 64);
    assert_int_equal(kvt_req_cache_unfinished(e, &r.req, &key), 0);
    assert_int_equal(r.req.protected_len, 64);
    assert_int_equal(kvt_req_mamba(e, &r.req, &r.m), 0);
    assert_int_equal(r.m.track_len, 0);
    /* A cached slot is the cache's: a request may read it, not write it. */
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 64);
    uint32_t slot = 0, locks = 0;
    assert_int_equal(rdx_mamba_state(e->tree, m.last_node, &slot, &locks), 0);
    uint8_t buf[SSM] = {0};
    assert_int_equal(kvt_mamba_write(e, (int32_t)slot, 0, 1, buf), -EINVAL);
    assert_int_equal(kvt_mamba_read(e, (int32_t)slot, 0, 1, buf), 0);
    assert_int_equal(kvt_mamba_read(e, (int32_t)slot, M_LAYERS, 1, buf), -EINVAL);
    assert_int_equal(kvt_mamba_read(e, (int32_t)slot, 0, 2, buf), -EINVAL);
    finish(&plain, e, &r, 100); /* no checkpoint recorded: nothing more inserted */
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 64);
    /* A stale request handle. */
    assert_int_equal(kvt_req_mamba(e, &r.req, &r.m), -EINVAL);
    assert_int_equal(kvt_req_mamba_track(e, &r.req, 64, 1), -EINVAL);

    void *ptr;
    size_t bytes;
    assert_int_equal(kvt_mamba_buffer(e, 2, 1, &ptr, &bytes), 0);
    assert_int_equal(bytes, SSM);
    assert_int_equal(kvt_mamba_buffer(e, 3, 1, &ptr, &bytes), -EINVAL);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* ---- slots under pressure ---- */

/* Five slots: two requests hold four; the cache's checkpoints go least recently used first
 * when a request needs slots; a third request with nothing evictable is -ENOMEM and changes
 * nothing. KV eviction takes the states with it. */
static void test_slot_pressure(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba(5);
    uint32_t a[256], b[256];
    struct run r1, r2, r3;
    struct kvt_stats st = {.size = sizeof(st)};

    tokens_of(a, 256, 1);
    tokens_of(b, 256, 5000);
    cache_with_states(e, a, 256, (const size_t[]){64, 128}, 2);
    cache_with_states(e, b, 256, (const size_t[]){64}, 1);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_cached_states, 3);
    assert_int_equal(st.mamba_free_slots, 2);

    assert_int_equal(begin(&plain, e, &r1, b, 200), 0); /* takes the two free slots */
    assert_int_equal(r1.req.protected_len, 64);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_evicted_states, 0);
    /* a's match locks its checkpoint at 128 while the two others go for its slots. */
    assert_int_equal(begin(&plain, e, &r2, a, 200), 0);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_evicted_states, 2);
    assert_int_equal(st.mamba_free_slots, 0);
    assert_int_equal(r2.req.protected_len, 128); /* matched before the room was made */
    CHECK_ENGINE(&plain, e);

    size_t reqs = kvt_req_available(e);
    assert_int_equal(kvt_req_begin(e, &(struct kvt_key){.tokens = a, .len = 100}, &r3.req),
                     -ENOMEM);
    assert_int_equal(kvt_req_available(e), reqs);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_cached_states, 1);
    finish(&plain, e, &r1, r1.len);
    finish(&plain, e, &r2, r2.len);
    CHECK_ENGINE(&plain, e);

    size_t evicted;
    assert_int_equal(kvt_evict(e, 4096, &evicted), 0);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_cached_states, 0);
    assert_int_equal(st.mamba_free_slots, 5);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* ---- options ---- */

static void test_options(void **state)
{
    (void)state;
    struct kvt_options o;
    kvt_engine *e = NULL, *plain_e = NULL;
    uint8_t f1[32], f2[32];

    mamba_options(&o, 0);
    o.mamba.layers = 0; /* sizes without layers: a mistake, not "no recurrent layers" */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    mamba_options(&o, 0);
    o.mamba.chunk = 48;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    mamba_options(&o, 0);
    o.store_page_tokens = 2 * o.page_size; /* states are kept a page at a time */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    mamba_options(&o, 0);
    o.mamba.track_interval = 100;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    mamba_options(&o, 1);
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    mamba_options(&o, 0);
    o.mamba.ssm_bytes = 0;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    /* Host copies of states the memory could never hold: refused at open, not met later. */
    mamba_options(&o, 0);
    o.host_ratio = 2.0;
    o.mamba_host_states = UINT32_MAX - 1; /* x 1,872 bytes: far above this machine's RAM */
    assert_int_equal(kvt_open(&o, &e), KVT_EHOSTRAM);
    assert_null(e);

    /* The defaults: 4 slots per request, FLA's chunk, SGLang's interval. */
    mamba_options(&o, 0);
    o.mamba.chunk = 0;
    o.mamba.track_interval = 0;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    kvt_options_init(&o, sizeof(o));
    assert_int_equal(o.mamba.chunk, 64);
    assert_int_equal(o.mamba.track_interval, 256);
    mamba_options(&o, 0);
    assert_int_equal(kvt_open(&o, &e), 0);
    struct kvt_stats st = {.size = sizeof(st)};
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.mamba_slots, 16);
    assert_int_equal(st.mamba_pool_bytes, 17ull * M_LAYERS * (CONV + SSM));

    /* The fingerprint holds the state geometry; without recurrent layers it is as before. */
    kvt_fingerprint(e, f1);
    mamba_options(&o, 0);
    o.mamba = (struct kvt_mamba){0};
    o.mamba.chunk = 64;
    o.mamba.track_interval = 256;
    assert_int_equal(kvt_open(&o, &plain_e), 0);
    kvt_fingerprint(plain_e, f2);
    assert_memory_not_equal(f1, f2, 32);
    assert_int_equal(kvt_req_mamba_track(plain_e, &(struct kvt_req){0}, 64, 1), -EINVAL);
    assert_int_equal(kvt_stats(plain_e, &st), 0);
    assert_int_equal(st.mamba_slots, 0);
    kvt_close(plain_e);
    /* An older caller's options end before mamba: they open without recurrent layers. */
    mamba_options(&o, 0);
    o.size = offsetof(struct kvt_options, mamba);
    assert_int_equal(kvt_open(&o, &plain_e), 0);
    kvt_fingerprint(plain_e, f1);
    assert_memory_equal(f1, f2, 32);
    kvt_close(plain_e);
    mamba_options(&o, 0);
    o.mamba.ssm_bytes++;
    assert_int_equal(kvt_open(&o, &plain_e), 0);
    kvt_fingerprint(plain_e, f2);
    kvt_fingerprint(e, f1);
    assert_memory_not_equal(f1, f2, 32);
    kvt_close(plain_e);
    kvt_close(e);
}

/* ---- through the host tier ---- */

static kvt_engine *open_mamba_host_tokens(uint32_t slots, uint32_t host_states, uint32_t policy,
                                          uint64_t device_tokens, uint64_t host_tokens)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    mamba_options(&o, slots);
    if (device_tokens)
        o.device_tokens = device_tokens;
    if (host_tokens)
        o.host_tokens = host_tokens;
    else
        o.host_ratio = 2.0;
    o.write_policy = policy;
    o.mamba_host_states = host_states;
    assert_int_equal(kvt_open(&o, &e), 0);
    return e;
}

static kvt_engine *open_mamba_host(uint32_t slots, uint32_t host_states, uint32_t policy)
{
    return open_mamba_host_tokens(slots, host_states, policy, 0, 0);
}

static void stats_of(kvt_engine *e, struct kvt_stats *st)
{
    *st = (struct kvt_stats){.size = sizeof(*st)};
    assert_int_equal(kvt_stats(e, st), 0);
}

/* A checkpoint whose KV the device evicts is saved beside the host copy; a later request on
 * its prefix gets the KV loaded back and the state copied back, byte for byte. */
static void test_host_round_trip(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba_host(0, 0, KVT_WRITE_THROUGH);
    uint32_t a[320], b[320];
    const size_t ck[] = {128, 192};
    struct kvt_stats st;
    struct run r;
    size_t evicted = 0;

    tokens_of(a, 320, 1);
    cache_with_states(e, a, 320, ck, 2);
    stats_of(e, &st);
    assert_int_equal(st.mamba_host_slots, 16 * 2); /* 16 state slots, twice the pages */
    assert_int_equal(st.mamba_saved_states, 0);
    assert_int_equal(kvt_sync(e), 0); /* the backups land */
    assert_int_equal(kvt_evict(e, 2048, &evicted), 0);
    assert_int_equal(evicted, 192); /* the cache holds the key up to its last checkpoint */
    stats_of(e, &st);
    assert_int_equal(st.mamba_cached_states, 0);
    assert_int_equal(st.mamba_host_states, 2);
    assert_int_equal(st.mamba_saved_states, 2);
    CHECK_ENGINE(&plain, e);

    struct kvt_match m;
    struct kvt_key key = {.tokens = a, .len = 230};
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 0);
    assert_int_equal(m.host_len, 192);

    branch_of(b, a, 320, 230);
    assert_int_equal(begin(&plain, e, &r, b, 300), 0); /* checks KV rows and state bytes */
    assert_int_equal(r.req.protected_len, 192);
    assert_int_equal(r.req.loaded_len, 192);
    stats_of(e, &st);
    assert_int_equal(st.mamba_restored_states, 1);
    assert_int_equal(st.mamba_cached_states, 1);
    assert_int_equal(st.loaded_tokens, 192);
    CHECK_ENGINE(&plain, e);
    /* The state it runs in is its own: writing it leaves the cache's copies as they were. */
    extend(&plain, e, &r, 256);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);

    /* The state alone evicted from a node on both tiers is saved too, and comes back. */
    assert_int_equal(begin(&plain, e, &r, a, 320), 0);
    assert_int_equal(r.req.protected_len, 192);
    finish(&plain, e, &r, r.len);
    assert_int_equal(kvt_sync(e), 0);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* The branching point counts the KV found on the host: a request sharing 300 tokens of a
 * prefix whose states (128, 320) the host keeps starts from 128 and branches at 256. */
static void test_host_branch_point(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba_host(0, 0, KVT_WRITE_THROUGH);
    uint32_t a[400], b[400];
    const size_t ck[] = {128, 320};
    struct run r;

    tokens_of(a, 400, 1);
    cache_with_states(e, a, 400, ck, 2);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_evict(e, 2048, NULL), 0);
    branch_of(b, a, 400, 300);
    assert_int_equal(begin(&plain, e, &r, b, 380), 0);
    assert_int_equal(r.req.protected_len, 128);
    assert_int_equal(r.m.kv_len, 288);     /* 300 in whole pages, 160 of them on the host */
    assert_int_equal(r.m.branch_len, 256); /* 288 on the grid of 64 */
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* A state evicted alone (slot pressure) from a node the host holds is saved, and a request
 * restores it even though the node's KV never left the device. */
static void test_host_state_evicted_alone(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba_host(4, 0, KVT_WRITE_THROUGH);
    uint32_t a[320], c[320];
    const size_t ck[] = {128};
    struct kvt_stats st;
    struct run r, q;

    tokens_of(a, 320, 1);
    tokens_of(c, 320, 5000);
    cache_with_states(e, a, 256, ck, 1);
    assert_int_equal(kvt_sync(e), 0);
    /* Two running requests need all 4 slots: a's checkpoint is evicted for them. */
    assert_int_equal(begin(&plain, e, &r, c, 64), 0);
    assert_int_equal(begin(&plain, e, &q, c, 64), 0);
    stats_of(e, &st);
    assert_int_equal(st.mamba_evicted_states, 1);
    assert_int_equal(st.mamba_saved_states, 1);
    assert_int_equal(st.mamba_cached_states, 0);
    finish(&plain, e, &q, 0);
    finish(&plain, e, &r, 0);
    CHECK_ENGINE(&plain, e);
    assert_int_equal(begin(&plain, e, &r, a, 200), 0);
    assert_int_equal(r.req.protected_len, 128);
    assert_int_equal(r.req.loaded_len, 0);
    stats_of(e, &st);
    assert_int_equal(st.mamba_restored_states, 1);
    assert_int_equal(st.loaded_tokens, 0); /* the KV was on the device */
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* With room for two host copies, the third state saved pushes out the least recently used. */
static void test_host_states_lru(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba_host(0, 2, KVT_WRITE_THROUGH);
    uint32_t p[3][256];
    const size_t ck[] = {128};
    struct kvt_stats st;
    struct run r;

    for (uint32_t i = 0; i < 3; i++) {
        tokens_of(p[i], 256, 1 + 7000 * i);
        cache_with_states(e, p[i], 256, ck, 1);
    }
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_evict(e, 2048, NULL), 0); /* in the order they were used */
    stats_of(e, &st);
    assert_int_equal(st.mamba_saved_states, 3);
    assert_int_equal(st.mamba_host_states, 2);
    CHECK_ENGINE(&plain, e);
    assert_int_equal(begin(&plain, e, &r, p[0], 200), 0);
    assert_int_equal(r.req.protected_len, 0);
    finish(&plain, e, &r, 0);
    for (int i = 1; i < 3; i++) {
        assert_int_equal(begin(&plain, e, &r, p[i], 200), 0);
        assert_int_equal(r.req.protected_len, 128);
        finish(&plain, e, &r, r.len);
    }
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* A node the host evicts takes the host copy of its state along. */
static void test_host_eviction_drops_states(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba_host_tokens(0, 0, KVT_WRITE_THROUGH, 1024, 1024 + 256);
    uint32_t p[8][320];
    const size_t ck[] = {256};
    struct kvt_stats st;
    struct run r;

    for (uint32_t i = 0; i < 8; i++) {
        tokens_of(p[i], 320, 1 + 1000 * i);
        cache_with_states(e, p[i], 320, ck, 1);
        assert_int_equal(kvt_sync(e), 0);
        assert_int_equal(kvt_evict(e, 1024, NULL), 0);
        CHECK_ENGINE(&plain, e);
    }
    stats_of(e, &st);
    assert_int_equal(st.mamba_saved_states, 8);
    assert_int_equal(st.host_evicted_tokens, 3 * 256); /* 5 of the 8 fit */
    assert_int_equal(st.mamba_host_states, 5);
    assert_int_equal(begin(&plain, e, &r, p[0], 300), 0);
    assert_int_equal(r.req.protected_len, 0);
    finish(&plain, e, &r, 0);
    assert_int_equal(begin(&plain, e, &r, p[7], 300), 0);
    assert_int_equal(r.req.protected_len, 256);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* ---- damage on disk: the pages of the state that follows the KV page holding tokens ---- */

struct state_damage {
    const uint32_t *tokens; /* the KV page's */
    uint8_t key[32];        /* its key, once found */
    const uint8_t *only;    /* NULL, or the one page to flip, by key */
    int found, done;
    const char *dir;
    uint32_t slot_bytes;
};

static int find_page(void *arg, const struct dstore_entry *en)
{
    struct state_damage *d = arg;

    if (!en->status && en->ntokens == PS && !memcmp(en->tokens, d->tokens, PS * 4)) {
        memcpy(d->key, en->key, 32);
        d->found++;
    }
    return 0;
}

/* A state's pages name the page they follow as their parent; flip bytes of their payload. */
static int flip_state(void *arg, const struct dstore_entry *en)
{
    struct state_damage *d = arg;
    char path[512];

    if (d->only ? en->status || memcmp(en->key, d->only, 32)
                : en->status || memcmp(en->parent, d->key, 32) || en->ntokens != PS ||
                      !memcmp(en->tokens, d->tokens + PS, PS * 4))
        return 0; /* not a state page of that parent (a KV page's next has tokens) */
    snprintf(path, sizeof(path), "%s/slabs/%04u.slab", d->dir, en->slab);
    uint64_t off = SLAB_HEAD_BYTES + (uint64_t)en->slot * d->slot_bytes + 100;
    assert_int_equal(fixture_flip_bytes(path, off, 16), 0);
    d->done++;
    return 0;
}

/* The key of page i of the state kept after the page whose key is parent (formats.md). */
static void state_page_key(const uint8_t *parent, uint32_t i, uint8_t *key)
{
    uint8_t b[32 + sizeof(KVT_STATE_TAG) - 1 + 12];
    size_t tag = sizeof(KVT_STATE_TAG) - 1;
    uint64_t bytes = (uint64_t)M_LAYERS * (CONV + SSM);
    struct page_hasher h;

    memcpy(b, parent, 32);
    memcpy(b + 32, KVT_STATE_TAG, tag);
    for (int k = 0; k < 8; k++)
        b[32 + tag + k] = (uint8_t)(bytes >> (8 * k));
    for (int k = 0; k < 4; k++)
        b[32 + tag + 8 + k] = (uint8_t)(i >> (8 * k));
    assert_int_equal(page_hasher_init(&h), 0);
    assert_int_equal(page_hasher_digest2(&h, b, sizeof(b), NULL, 0, key), 0);
    page_hasher_finish(&h);
}

/* One page of the state after the page of tokens: its bytes flipped (flip) or its record
 * deleted. */
static void hurt_state_page(kvt_engine *e, const char *dir, const uint32_t *tokens, uint32_t i,
                            bool flip)
{
    struct dstore *ds = store_disk_dstore(e->store);
    struct state_damage d = {.tokens = tokens, .dir = dir};
    uint8_t key[32];
    size_t deleted = 0;

    assert_int_equal(dstore_iterate(ds, find_page, &d), 0);
    assert_int_equal(d.found, 1);
    state_page_key(d.key, i, key);
    if (!flip) {
        assert_int_equal(dstore_delete(ds, key, 1, &deleted), 0);
        assert_int_equal(deleted, 1);
        return;
    }
    d.only = key;
    struct dstore_stats st;
    dstore_stats(ds, &st);
    d.slot_bytes = st.slot_bytes;
    assert_int_equal(dstore_iterate(ds, flip_state, &d), 0);
    assert_int_equal(d.done, 1);
}

/* Damage the state kept after the page of tokens[0..PS); how many states were hit. */
static int damage_state(kvt_engine *e, const char *dir, const uint32_t *tokens)
{
    struct dstore *ds = store_disk_dstore(e->store);
    struct state_damage d = {.tokens = tokens, .dir = dir};
    struct dstore_stats st;

    dstore_stats(ds, &st);
    d.slot_bytes = st.slot_bytes;
    assert_int_equal(dstore_iterate(ds, find_page, &d), 0);
    assert_int_equal(d.found, 1);
    assert_int_equal(dstore_iterate(ds, flip_state, &d), 0);
    return d.done > 0;
}

/* With a disk tier, checkpoints are written with their pages: a restarted engine (an empty
 * tree) serves a prefix from disk up to its deepest checkpoint there, with that state. */
static void test_disk_restart(void **state)
{
    (void)state;
    char dir[256];
    struct kvt_options o;
    kvt_engine *e = NULL;
    uint32_t a[320], b[320];
    const size_t ck[] = {128, 192};
    struct kvt_stats st;
    struct run r;

    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "mamba-disk"), 0);
    mamba_options(&o, 0);
    o.host_ratio = 2.0;
    o.disk_dir = dir;
    o.prefetch_timeout_ms = 60000; /* a loaded machine's disk reads are no miss here */
    o.disk_bytes = 8 << 20;
    assert_int_equal(kvt_open(&o, &e), 0);
    tokens_of(a, 320, 1);
    cache_with_states(e, a, 320, ck, 2);
    stats_of(e, &st);
    assert_int_equal(st.mamba_stored_states, 2);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);

    assert_int_equal(kvt_open(&o, &e), 0);
    branch_of(b, a, 320, 230);
    struct kvt_match m;
    struct kvt_key key = {.tokens = b, .len = 300};
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 0);
    assert_int_equal(m.disk_len, 0);                   /* KV found is not served without a state */
    assert_int_equal(begin(&plain, e, &r, b, 300), 0); /* checks KV rows and state bytes */
    assert_int_equal(r.req.protected_len, 192);
    assert_int_equal(r.req.loaded_len, 192);
    assert_int_equal(r.req.disk_len, 192);
    stats_of(e, &st);
    assert_int_equal(st.mamba_fetched_states, 1);
    assert_int_equal(st.mamba_restored_states, 1);
    assert_int_equal(st.disk_read_tokens, 192);
    extend(&plain, e, &r, 256);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);

    /* A state whose bytes were damaged on disk is a miss, never served: a fresh engine gets
     * the next state down that reads back whole, at 128. */
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(damage_state(e, dir, a + 176), 1);
    assert_int_equal(begin(&plain, e, &r, a, 300), 0);
    assert_int_equal(r.req.protected_len, 128);
    stats_of(e, &st);
    assert_true(st.disk_errors > 0);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* A state spans several pages below; one of them damaged or missing makes the whole state a
 * miss, and the request gets the next one up (128), never a state with a hole in it. */
static void test_disk_state_pages(void **state)
{
    (void)state;
    const uint64_t bytes = (uint64_t)M_LAYERS * (CONV + SSM);
    uint32_t a[320];
    const size_t ck[] = {128, 192};

    tokens_of(a, 320, 1);
    for (int flip = 0; flip < 2; flip++) {
        char dir[256];
        struct kvt_options o;
        kvt_engine *e = NULL;
        struct kvt_stats st;
        struct run r;

        assert_int_equal(fixture_data_dir(dir, sizeof(dir), "mamba-pages"), 0);
        mamba_options(&o, 0);
        o.host_ratio = 2.0;
        o.disk_dir = dir;
        o.prefetch_timeout_ms = 60000; /* a loaded machine's disk reads are no miss here */
        o.disk_bytes = 8 << 20;
        assert_int_equal(kvt_open(&o, &e), 0);
        assert_true(bytes > 3 * 512); /* the page: 16 tokens of 32 bytes */
        cache_with_states(e, a, 320, ck, 2);
        assert_int_equal(kvt_sync(e), 0);
        kvt_close(e);
        assert_int_equal(kvt_open(&o, &e), 0);
        hurt_state_page(e, dir, a + 176, 2, flip);
        assert_int_equal(begin(&plain, e, &r, a, 300), 0); /* checks the state's bytes */
        assert_int_equal(r.req.protected_len, 128);
        stats_of(e, &st);
        assert_int_equal(st.mamba_fetched_states, 1);
        if (flip)
            assert_true(st.disk_errors > 0);
        finish(&plain, e, &r, r.len);
        CHECK_ENGINE(&plain, e);
        kvt_close(e);
        fixture_remove_tree(dir);
    }
}

/* Two ways a node of the tree lacks the state the disk keeps for it: its host copy was the
 * least recently used of too few (the disk's copy is read back onto the node), and a
 * kvt_prefetch that filled KV ahead of the request (it fills only up to the deepest state
 * below, whose node then takes the disk's copy; KV past it would serve nothing). */
static void test_disk_states_for_tree_nodes(void **state)
{
    (void)state;
    char dir[256];
    struct kvt_options o;
    kvt_engine *e = NULL;
    uint32_t p[2][320];
    const size_t ck[] = {128, 192};
    struct kvt_stats st;
    struct run r;
    size_t reading = 0;

    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "mamba-bare"), 0);
    mamba_options(&o, 0);
    o.host_ratio = 2.0;
    o.mamba_host_states = 1;
    o.disk_dir = dir;
    o.prefetch_timeout_ms = 60000; /* a loaded machine's disk reads are no miss here */
    o.disk_bytes = 8 << 20;
    assert_int_equal(kvt_open(&o, &e), 0);
    for (int i = 0; i < 2; i++) {
        tokens_of(p[i], 320, 1 + 7000 * (uint32_t)i);
        cache_with_states(e, p[i], 320, ck, 2);
    }
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_evict(e, 2048, NULL), 0); /* 4 states saved, 1 kept on the host */
    stats_of(e, &st);
    assert_int_equal(st.mamba_host_states, 1);
    assert_int_equal(begin(&plain, e, &r, p[0], 300), 0); /* checks the state's bytes */
    assert_int_equal(r.req.protected_len, 192);
    stats_of(e, &st);
    assert_int_equal(st.mamba_fetched_states, 1);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);

    /* A fresh engine on the dir, the state at 192 missing a page: a prefetch fills 128. */
    assert_int_equal(kvt_open(&o, &e), 0);
    hurt_state_page(e, dir, p[1] + 176, 1, false);
    struct kvt_key key = {.tokens = p[1], .len = 300};
    assert_int_equal(kvt_prefetch(e, &key, &reading), 0);
    assert_int_equal(reading, 128);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(begin(&plain, e, &r, p[1], 300), 0);
    assert_int_equal(r.req.protected_len, 128);
    finish(&plain, e, &r, r.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* A store that fails slowly (a stopped server) costs a request about one timeout, not one
 * per checkpoint: the probes for a state below stop once prefetch_timeout_ms (100 here) has
 * gone by. Reads of the mem store under the hook take 40 ms a page and fail. */
struct slow_store {
    int on, reads;
};

static int slow_inject(void *arg, enum store_op_kind kind, const uint8_t *key)
{
    struct slow_store *s = arg;

    (void)key;
    if (!s->on || kind != STORE_OP_READ)
        return 0;
    s->reads++;
    usleep(40 * 1000);
    return -EIO;
}

static void test_slow_store_bounded(void **state)
{
    (void)state;
    struct slow_store slow = {0};
    struct store_mem_faults hooks = {slow_inject, &slow};
    struct kvt_options o;
    struct kvt_store *s = NULL;
    kvt_engine *e = NULL;
    uint32_t a[512], p[512];
    const size_t ck[] = {64, 128, 192, 256, 320, 384, 448}, last[] = {448};
    struct run r;

    mamba_options(&o, 0);
    o.device_tokens = 1024;
    o.host_tokens = 1024 + 256;
    struct store_mem_options mo = {.page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS),
                                   .page_tokens = PS,
                                   .capacity_pages = 4096,
                                   .faults = &hooks};
    assert_int_equal(store_mem_open(&mo, &s), 0);
    assert_int_equal(engine_open(&o, s, &e), 0);
    tokens_of(a, 512, 1);
    cache_with_states(e, a, 512, ck, 7);
    for (uint32_t i = 1; i <= 4; i++) { /* the tree forgets a: it is the store's alone */
        tokens_of(p, 512, 1000 * i);
        cache_with_states(e, p, 512, last, 1);
        assert_int_equal(kvt_sync(e), 0);
        assert_int_equal(kvt_evict(e, 1024, NULL), 0);
    }
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &(struct kvt_key){.tokens = a, .len = 500}, NULL, &m), 0);
    assert_int_equal(m.device_len + m.host_len, 0);
    slow.on = 1;
    assert_int_equal(begin(&plain, e, &r, a, 500), 0);
    assert_int_equal(r.req.protected_len, 0);
    /* 4 pages a state: the first state's read takes 160 ms, past the budget, and no other
     * is tried (seven were there to try). */
    assert_int_equal(slow.reads, 4);
    slow.on = 0;
    finish(&plain, e, &r, 0);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* The copy being restored is not the one pushed out to save another: here making a device
 * slot for it evicts b's state, whose saving finds the host copies full with the one being
 * restored. (Taking it would put b's bytes under a's prefix.) */
static void test_host_restore_keeps_its_copy(void **state)
{
    (void)state;
    kvt_engine *e = open_mamba_host(4, 1, KVT_WRITE_THROUGH);
    uint32_t a[256], b[256], c[256], d[256];
    const size_t ck[] = {128};
    struct kvt_stats st;
    struct run r, q;

    tokens_of(a, 256, 1);
    tokens_of(b, 256, 7000);
    tokens_of(c, 256, 14000);
    tokens_of(d, 256, 21000);
    cache_with_states(e, a, 256, ck, 1);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_evict(e, 2048, NULL), 0); /* a's state saved: the one host copy */
    cache_with_states(e, b, 256, ck, 1);
    cache_with_states(e, c, 256, ck, 1);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(begin(&plain, e, &r, d, 0), 0); /* every state slot taken now */
    assert_int_equal(kvt_req_begin(e, &(struct kvt_key){.tokens = a, .len = 200}, &q.req),
                     -ENOMEM); /* a restored, then no two slots for the request */
    stats_of(e, &st);
    assert_int_equal(st.mamba_restored_states, 1);
    assert_int_equal(st.mamba_host_states, 1);
    CHECK_ENGINE(&plain, e);
    finish(&plain, e, &r, 0);
    assert_int_equal(begin(&plain, e, &q, a, 200), 0); /* checks the state's bytes */
    assert_int_equal(q.req.protected_len, 128);
    finish(&plain, e, &q, q.len);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* ---- randomized ---- */

#define NPROMPT 6

/* Requests over a few shared prompts with random cut points: every served prefix's KV rows
 * and state bytes are checked, checkpoints are taken mid-prefill, at the end and in decode,
 * slots are scarce and KV is evicted at random; engine_check after every step. */
enum random_tiers { DEVICE_ONLY, WITH_HOST, WITH_DISK };

/* With a host tier: write-through or write-back by turns, host pages little more than the
 * device's and fewer than the prompts (host copies are evicted too), room for few host copies
 * of states so that they are pushed out too; with a disk tier under that, in dir. */
static kvt_engine *open_random(enum random_tiers tiers, uint32_t policy, const char *dir)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    if (tiers == DEVICE_ONLY)
        return open_mamba(7);
    mamba_options(&o, 7);
    o.device_tokens = 1536;
    o.host_tokens = 1536 + 64;
    o.write_policy = policy;
    o.mamba_host_states = 5;
    if (tiers == WITH_DISK) {
        o.disk_dir = dir;
        o.disk_bytes = 4 << 20;
    }
    assert_int_equal(kvt_open(&o, &e), 0);
    return e;
}

static void run_random(uint64_t seed, enum random_tiers tiers)
{
    static const char *name[] = {"device", "host", "host+disk, reopened thrice"};
    uint32_t policy = seed % 2 ? KVT_WRITE_THROUGH : KVT_WRITE_BACK;
    char cfg[96], dir[256] = "";
    snprintf(cfg, sizeof(cfg), "slots=7 %s policy=%u host_states=5", name[tiers], policy);
    struct harness_run s = {.prog = "test_engine_mamba", .config = cfg, .seed = seed};
    uint64_t rng = seed;
    uint32_t prompts[NPROMPT][CTX];
    if (tiers == WITH_DISK)
        assert_int_equal(fixture_data_dir(dir, sizeof(dir), "mamba-random"), 0);
    kvt_engine *e = open_random(tiers, policy, dir);
    struct run live[3];
    int nlive = 0;
    uint64_t served = 0;
    struct kvt_stats st = {.size = sizeof(st)};
    struct {
        uint64_t saved, restored, stored, fetched;
    } sum = {0}; /* over the engines a reopening run had */

    for (int p = 0; p < NPROMPT; p++) {
        tokens_of(prompts[p], CTX, 1);
        for (size_t i = (size_t)(rng_next(&rng) % 400); i < CTX; i++)
            prompts[p][i] = (uint32_t)(1000 * (p + 1) + i);
    }
    for (s.step = 0; s.step < 600; s.step++) {
        uint64_t op = rng_next(&rng) % 10;
        if (tiers == WITH_DISK && s.step % 150 == 149 && s.step < 500) {
            s.op = "reopen";
            while (nlive > 0) {
                nlive--;
                finish(&s, e, &live[nlive], live[nlive].len);
            }
            EXPECT_RC(&s, kvt_sync(e), 0);
            EXPECT_RC(&s, kvt_stats(e, &st), 0);
            REQUIRE(&s, st.match_hit_tokens == served);
            sum.saved += st.mamba_saved_states;
            sum.restored += st.mamba_restored_states;
            sum.stored += st.mamba_stored_states;
            sum.fetched += st.mamba_fetched_states;
            served = 0;
            kvt_close(e);
            e = open_random(tiers, policy, dir);
        } else if (op < 3 && nlive < 3) {
            s.op = "begin";
            const uint32_t *t = prompts[rng_next(&rng) % NPROMPT];
            size_t n = 1 + rng_next(&rng) % 480;
            int rc = begin(&s, e, &live[nlive], t, n);
            if (rc == -ENOMEM)
                continue;
            EXPECT_RC(&s, rc, 0);
            served += live[nlive].req.protected_len;
            nlive++;
        } else if (op < 7 && nlive) {
            s.op = "forward";
            struct run *r = &live[rng_next(&rng) % (uint64_t)nlive];
            size_t to = r->len + 1 + rng_next(&rng) % 100;
            if (to > 500)
                continue;
            size_t free_tokens = kvt_available(e);
            if (to - r->len + PS > free_tokens)
                kvt_evict(e, to - r->len + PS, NULL);
            if (to - r->len + PS > kvt_available(e))
                continue;
            extend(&s, e, r, to / 64 * 64 > r->len ? to / 64 * 64 : to);
            if (r->len % 64 == 0 && r->len > r->req.protected_len)
                track(&s, e, r);
            extend(&s, e, r, to);
            if (rng_next(&rng) % 3 == 0) {
                struct kvt_key key = {.tokens = r->tokens, .len = r->len};
                s.op = "cache_unfinished";
                int rc = kvt_req_cache_unfinished(e, &r->req, &key);
                if (rc != -ENOMEM)
                    EXPECT_RC(&s, rc, 0);
                EXPECT_RC(&s, kvt_req_mamba(e, &r->req, &r->m), 0);
            }
        } else if (op < 9 && nlive) {
            s.op = "finish";
            int i = (int)(rng_next(&rng) % (uint64_t)nlive);
            finish(&s, e, &live[i], live[i].len);
            live[i] = live[--nlive];
        } else {
            s.op = "evict";
            kvt_evict(e, (rng_next(&rng) % 8) * PS, NULL);
        }
        CHECK_ENGINE(&s, e);
    }
    while (nlive > 0) {
        nlive--;
        finish(&s, e, &live[nlive], live[nlive].len);
    }
    CHECK_ENGINE(&s, e);
    EXPECT_RC(&s, kvt_stats(e, &st), 0);
    REQUIRE(&s, served > 0 && st.match_hit_tokens == served);
    REQUIRE(&s, st.mamba_kv_hit_tokens >= st.match_hit_tokens);
    REQUIRE(&s, st.mamba_evicted_states > 0);
    if (tiers != DEVICE_ONLY)
        REQUIRE(&s, sum.saved + st.mamba_saved_states > 0 &&
                        sum.restored + st.mamba_restored_states > 0);
    if (tiers == WITH_HOST) /* engines that live 150 steps may never fill the host */
        REQUIRE(&s, st.host_evicted_tokens > 0);
    if (tiers == WITH_DISK)
        REQUIRE(&s, sum.stored + st.mamba_stored_states > 0 &&
                        sum.fetched + st.mamba_fetched_states > 0);
    kvt_close(e);
    if (tiers == WITH_DISK)
        fixture_remove_tree(dir);
}

static void test_random(void **state)
{
    (void)state;
    const char *env = getenv("KVT_SEED");

    if (env) {
        const char *t = getenv("KVT_TIERS"); /* device, host or disk */
        run_random(strtoull(env, NULL, 0), !t || !strcmp(t, "device") ? DEVICE_ONLY
                                           : !strcmp(t, "host")       ? WITH_HOST
                                                                      : WITH_DISK);
        return;
    }
    for (uint64_t seed = 1; seed <= 8; seed++) {
        run_random(seed, DEVICE_ONLY);
        run_random(seed, WITH_HOST);
        run_random(seed, WITH_DISK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_230_reuses_192),
        cmocka_unit_test(test_hit_280_reuses_256_else_192),
        cmocka_unit_test(test_abc_branching),
        cmocka_unit_test(test_track_rules),
        cmocka_unit_test(test_slot_pressure),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_host_round_trip),
        cmocka_unit_test(test_host_branch_point),
        cmocka_unit_test(test_host_state_evicted_alone),
        cmocka_unit_test(test_host_states_lru),
        cmocka_unit_test(test_host_restore_keeps_its_copy),
        cmocka_unit_test(test_host_eviction_drops_states),
        cmocka_unit_test(test_disk_restart),
        cmocka_unit_test(test_disk_state_pages),
        cmocka_unit_test(test_slow_store_bounded),
        cmocka_unit_test(test_disk_states_for_tree_nodes),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
