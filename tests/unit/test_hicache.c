/*
 * The host tier (HiCache) through the public API: load-back at request start, per-layer
 * waits, write-through and selective backups, load_back_min, device pressure, bad input,
 * and a seeded random run with random completion delays.
 *
 * KV content is a function of the token prefix: the row of token i is drawn from a hash
 * chained over the namespace and tokens 0..i (as tools/bench.c does), so any page, served
 * from the device or loaded back from the host, can be checked byte for byte against the key
 * it is cached under.
 *
 * The random run keeps a few requests in flight on a small device pool and a host pool
 * somewhat larger, so both tiers are under pressure, and swaps the transfer engine for one
 * whose worker sleeps a random 0..max_delay_us before each op (the xfer_config test seam), so
 * completions arrive late and in varied order relative to the owner thread. After every step
 * engine_check passes and the device and host pages add up.
 *
 * KVT_SEED=<n> reruns a sequence; the seed is printed at the start and on failure.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "host/host_tier.h"
#include "store/disk/ops.h"

/* tests/gpu builds this file again with TEST_BACKEND=KVT_BACKEND_CUDA. */
#ifndef TEST_BACKEND
#define TEST_BACKEND KVT_BACKEND_SIM
#endif

#define LAYERS 2
#define HEAD_DIM 8
#define DTYPE 2
#define ROW (HEAD_DIM * DTYPE) /* bytes of one K or V row: one KV head */
#define MAX_TOK 48             /* longest request */
#define MAX_CONTEXT 64
#define N_REQ 4 /* request slots, and requests in flight at most */
#define N_BASE 6
#define N_NS 2
#define ALPHABET 4 /* few tokens, so keys share prefixes */
#define DEFAULT_SEED 0x6869636163686501ull

#include "engine_fixture.h"
#include "harness.h"
#include "kv_rows.h"

/* ---- helpers for the focused tests ---- */

static void check(const kvt_engine *e)
{
    char why[256] = "";

    if (engine_check(e, why, sizeof(why)))
        fail_msg("engine check: %s", why);
}

static struct kvt_stats stats(const kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_stats(e, &st), 0);
    return st;
}

static void host_options(struct kvt_options *o, uint32_t ps, uint64_t dev, uint64_t host)
{
    fixture_engine_options(o, LAYERS, HEAD_DIM);
    o->backend = TEST_BACKEND;
    o->page_size = ps;
    o->device_tokens = dev;
    o->host_tokens = host;
    o->max_requests = N_REQ;
    o->max_context = MAX_CONTEXT;
}

/* A fresh data dir for a disk tier, under TMPDIR or /tmp. */
static void make_data_dir(char *dir, size_t len)
{
    assert_int_equal(fixture_data_dir(dir, len, "hicache"), 0);
}

/* Swap in a transfer engine with the test seams; only right after kvt_open, with nothing in
 * flight. */
static int set_xfer(kvt_engine *e, const struct xfer_config *xc)
{
    return host_tier_set_xfer(e->below, xc);
}

static kvt_engine *open_with(const struct kvt_options *o, const struct xfer_config *xc)
{
    kvt_engine *e = NULL;

    assert_int_equal(kvt_open(o, &e), 0);
    assert_non_null(e);
    if (xc)
        assert_int_equal(set_xfer(e, xc), 0);
    check(e);
    return e;
}

/* Apply every transfer: kvt_poll until nothing is in flight (bounded, 10 s). */
static int drain(kvt_engine *e)
{
    struct timespec nap = {0, 50000};

    for (int i = 0; i < 200000; i++) {
        struct kvt_stats st = {.size = sizeof(st)};
        int rc = kvt_poll(e, 0, NULL);
        if (rc)
            return rc;
        if (kvt_stats(e, &st))
            return -EINVAL;
        if (st.ops_in_flight == 0)
            return 0;
        nanosleep(&nap, NULL);
    }
    return -ETIMEDOUT;
}

static void seq_make(struct seq *q, uint32_t ns, size_t len, uint32_t salt)
{
    q->ns = ns;
    q->len = len;
    for (size_t i = 0; i < len; i++)
        q->tok[i] = salt * 1000 + (uint32_t)i;
    seq_hash(q);
}

/* Wait for every layer of op and check the request's first n rows. */
static void verify_req(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t n)
{
    int32_t slots[MAX_TOK];

    assert_true(n <= MAX_TOK);
    if (n == 0)
        return;
    assert_int_equal(kvt_req_read(e, r, 0, n, slots), 0);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvt_load_wait_layer(e, r->load_op, l, NULL), 0);
        long bad = check_layer(e, q, 0, n, slots, l);
        if (bad != -1)
            fail_msg("layer %u: token %ld of %zu has the wrong KV", l, bad, n);
    }
}

/* Compute tokens [from, to) of q for a begun request: allocate, write the rows, record the
 * slots in its row. */
static int extend(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t from,
                  size_t to)
{
    int32_t out[MAX_TOK], last = -1;
    uint32_t pl = (uint32_t)from, sl = (uint32_t)to;

    if (to <= from)
        return 0;
    if (from)
        assert_int_equal(kvt_req_read(e, r, from - 1, 1, &last), 0);
    int rc = kvt_alloc_extend(e, 1, &pl, &sl, &last, out, to - from);
    if (rc)
        return rc;
    assert_int_equal(compute_rows(e, q, from, to - from, out), 0);
    assert_int_equal(kvt_req_write(e, r, from, out, to - from), 0);
    return 0;
}

/* A whole request: begin on q's first prompt tokens, check what it got, compute the rest of
 * q, and finish (inserting when insert). Returns what kvt_req_begin gave. */
static struct kvt_req run_request(kvt_engine *e, const struct seq *q, size_t prompt, int insert)
{
    struct kvt_key key = seq_key(q, prompt);
    struct kvt_req r, got;

    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    got = r;
    verify_req(e, q, &r, r.protected_len);
    assert_int_equal(extend(e, q, &r, r.protected_len, q->len), 0);
    verify_req(e, q, &r, q->len);
    key = seq_key(q, q->len);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, insert), 0);
    check(e);
    return got;
}

static void evict_all(kvt_engine *e)
{
    size_t ev = 0;

    assert_int_equal(kvt_evict(e, SIZE_MAX / 2, &ev), 0);
    assert_int_equal(stats(e).cached_tokens, 0);
    check(e);
}

/* Device and host pages add up: free + cached (+ what requests own) is the pool. */
static void assert_pools_add_up(const kvt_engine *e)
{
    struct kvt_stats st = stats(e);

    assert_int_equal(st.device_free_tokens + st.cached_tokens, st.device_tokens);
    assert_int_equal(st.host_free_tokens + st.host_cached_tokens, st.host_tokens);
}

/* kvt_open with o fails with want and leaves e NULL. */
#define OPEN_FAILS(want)                                                                           \
    do {                                                                                           \
        e = (kvt_engine *)1;                                                                       \
        assert_int_equal(kvt_open(&o, &e), (want));                                                \
        assert_null(e);                                                                            \
    } while (0)

/* ---- focused tests ---- */

/* A load lands layer by layer: after waiting for layer 0, its rows are right while the op as
 * a whole is not done yet (layer 1 is 200 ms behind). */
static void test_layer_wait(void **state)
{
    struct kvt_options o;
    struct xfer_config xc = {.layer_delay_us = 200000};
    struct seq q;
    int32_t slots[MAX_TOK];

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, &xc);
    seq_make(&q, 0, 16, 1);
    run_request(e, &q, 0, 1);
    assert_int_equal(drain(e), 0);
    evict_all(e);

    struct kvt_key key = seq_key(&q, 16);
    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(r.protected_len, 16);
    assert_int_not_equal(r.load_op, 0);
    assert_int_equal(kvt_req_read(e, &r, 0, 16, slots), 0);

    assert_int_equal(kvt_load_wait_layer(e, r.load_op, 0, NULL), 0);
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) <
                r.load_op); /* layer 1 still on its way */
    assert_int_equal(check_layer(e, &q, 0, 16, slots, 0), -1);
    /* Waiting for layer 0 again returns at once, and the op is still not done. */
    assert_int_equal(kvt_load_wait_layer(e, r.load_op, 0, NULL), 0);
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) < r.load_op);

    /* A second request on the prefix while it is still being loaded gets it as its device
     * prefix, with the first request's load to wait for. */
    struct kvt_req r2;
    int32_t slots2[MAX_TOK];
    assert_int_equal(kvt_req_begin(e, &key, &r2), 0);
    assert_int_equal(r2.protected_len, 16);
    assert_int_equal(r2.loaded_len, 0);
    assert_int_equal(r2.load_op, r.load_op);
    assert_int_equal(kvt_req_read(e, &r2, 0, 16, slots2), 0);
    assert_memory_equal(slots2, slots, 16 * sizeof(int32_t));

    assert_int_equal(kvt_load_wait_layer(e, r2.load_op, 1, NULL), 0);
    assert_int_equal(check_layer(e, &q, 0, 16, slots2, 1), -1);
    assert_int_equal(check_layer(e, &q, 0, 16, slots, 0), -1);
    assert_int_equal(kvt_req_cache_finished(e, &r2, &key, 0, 1), 0);
    assert_int_equal(kvt_load_wait_layer(e, r.load_op, 1, NULL), 0);
    assert_int_equal(check_layer(e, &q, 0, 16, slots, 1), -1);
    assert_int_equal(drain(e), 0);
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) >= r.load_op);
    /* A done op: every layer returns at once. */
    for (uint32_t l = 0; l < LAYERS; l++)
        assert_int_equal(kvt_load_wait_layer(e, r.load_op, l, NULL), 0);
    assert_int_equal(stats(e).loaded_tokens, 16);
    assert_int_equal(stats(e).h2d_bytes, 16 * kvt_cell_bytes(&o.geometry));

    key = seq_key(&q, 16);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    check(e);
    assert_int_equal(drain(e), 0);
    assert_pools_add_up(e);
    kvt_close(e);
}

/* kvt_match on a prefix another request's load-back is still filling names that load: the
 * slots it returns are safe to read only after waiting for it. */
static void test_match_pending_load(void **state)
{
    struct kvt_options o;
    struct xfer_config xc = {.layer_delay_us = 200000};
    struct seq q;
    int32_t slots[MAX_TOK];

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, &xc);
    seq_make(&q, 0, 16, 130);
    run_request(e, &q, 0, 1);
    assert_int_equal(drain(e), 0);
    struct kvt_key key = seq_key(&q, 16);
    struct kvt_match m = {0};
    assert_int_equal(kvt_match(e, &key, slots, &m), 0);
    assert_int_equal(m.device_len, 16);
    assert_int_equal(m.load_op, 0); /* nothing in flight */
    evict_all(e);

    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.loaded_len, 16);
    memset(&m, 0, sizeof(m));
    assert_int_equal(kvt_match(e, &key, slots, &m), 0);
    assert_int_equal(m.device_len, 16);
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) < r.load_op); /* still landing */
    assert_int_equal(m.load_op, r.load_op);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvt_load_wait_layer(e, m.load_op, l, NULL), 0);
        assert_int_equal(check_layer(e, &q, 0, 16, slots, l), -1);
    }
    assert_int_equal(drain(e), 0);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.load_op, 0); /* landed */
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    check(e);
    kvt_close(e);
}

/* write_through backs a prefix up when it is inserted; once the device copy is evicted the
 * next request loads it back, exactly the evicted part. */
static void test_write_through(void **state)
{
    struct kvt_options o;
    struct seq a, ab;
    uint64_t cell;

    (void)state;
    for (uint32_t layout = KVT_HOST_PAGE_FIRST; layout <= KVT_HOST_LAYER_FIRST; layout++) {
        host_options(&o, 4, 64, 256);
        o.host_layout = layout;
        o.write_policy = KVT_WRITE_THROUGH;
        cell = kvt_cell_bytes(&o.geometry);
        kvt_engine *e = open_with(&o, NULL);
        assert_int_equal(stats(e).host_tokens, 256);
        assert_int_equal(stats(e).host_free_tokens, 256);

        seq_make(&a, 0, 8, 2);
        ab = a;
        ab.len = 16;
        for (size_t i = 8; i < 16; i++)
            ab.tok[i] = 7000 + (uint32_t)i;
        seq_hash(&ab);

        /* Inserting A backs it up: its host copy counts while the backup is in flight. */
        run_request(e, &a, 0, 1);
        assert_int_equal(stats(e).host_cached_tokens, 8);
        assert_int_equal(stats(e).backed_up_tokens, 8);
        assert_int_equal(drain(e), 0);
        struct kvt_stats st = stats(e);
        assert_int_equal(st.host_cached_tokens, 8);
        assert_int_equal(st.host_free_tokens, 248);
        assert_int_equal(st.d2h_bytes, 8 * cell);
        assert_int_equal(st.ops_in_flight, 0);

        /* A+B backs up only B: A already has its host copy. */
        struct kvt_req r = run_request(e, &ab, 8, 1);
        assert_int_equal(r.protected_len, 8);
        assert_int_equal(r.loaded_len, 0);
        assert_int_equal(drain(e), 0);
        st = stats(e);
        assert_int_equal(st.host_cached_tokens, 16);
        assert_int_equal(st.backed_up_tokens, 16);
        assert_int_equal(st.d2h_bytes, 16 * cell);
        assert_pools_add_up(e);

        /* Evict B's device copy only (A has a device child, so B is the one leaf). */
        size_t ev = 0;
        assert_int_equal(kvt_evict(e, 8, &ev), 0);
        assert_int_equal(ev, 8);
        check(e);
        st = stats(e);
        assert_int_equal(st.cached_tokens, 8);
        assert_int_equal(st.host_cached_tokens, 16);
        assert_int_equal(st.host_evicted_tokens, 0);
        struct kvt_key key = seq_key(&ab, 16);
        struct kvt_match m;
        assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
        assert_int_equal(m.device_len, 8);
        assert_int_equal(m.host_len, 8);

        /* The next request loads back exactly the evicted part. */
        r = run_request(e, &ab, 16, 1);
        assert_int_equal(r.protected_len, 16);
        assert_int_equal(r.loaded_len, 8);
        assert_int_not_equal(r.load_op, 0);
        assert_int_equal(drain(e), 0);
        st = stats(e);
        assert_int_equal(st.loaded_tokens, 8);
        assert_int_equal(st.h2d_bytes, 8 * cell);
        assert_int_equal(st.cached_tokens, 16);
        assert_int_equal(st.backed_up_tokens, 16); /* nothing new to back up */

        /* Evict everything: the whole key comes back from the host, bytes exact. */
        evict_all(e);
        assert_int_equal(stats(e).host_cached_tokens, 16);
        assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
        assert_int_equal(m.device_len, 0);
        assert_int_equal(m.host_len, 16);
        /* A key one partial page longer: the loaded part is the whole pages on the host. */
        struct seq abc = ab;
        abc.len = 19;
        for (size_t i = 16; i < 19; i++)
            abc.tok[i] = 9000 + (uint32_t)i;
        seq_hash(&abc);
        r = run_request(e, &abc, 19, 1);
        assert_int_equal(r.protected_len, 16);
        assert_int_equal(r.loaded_len, 16);
        assert_int_not_equal(r.load_op, 0);
        assert_int_equal(drain(e), 0);
        st = stats(e);
        assert_int_equal(st.loaded_tokens, 24);
        assert_int_equal(st.host_hit_tokens, 8 + 8 + 16 + 16); /* 2 matches, 2 begins */
        assert_pools_add_up(e);
        kvt_close(e);
    }
}

/* write_through_selective backs a prefix up once its node has been hit write_threshold
 * times, and not before. */
static void test_selective(void **state)
{
    struct kvt_options o;
    struct seq q;
    struct kvt_match m;

    (void)state;
    host_options(&o, 4, 64, 256);
    o.write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    o.write_threshold = 3;
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&q, 1, 16, 3);
    struct kvt_key key = seq_key(&q, 16);

    run_request(e, &q, 16, 1); /* the first begin found nothing: no hit on q's node */
    assert_int_equal(drain(e), 0);
    assert_int_equal(stats(e).host_cached_tokens, 0);
    assert_int_equal(stats(e).backed_up_tokens, 0);
    for (int hit = 1; hit <= 3; hit++) {
        assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
        assert_int_equal(m.device_len, 16);
        assert_int_equal(drain(e), 0);
        check(e);
        assert_int_equal(stats(e).host_cached_tokens, hit < 3 ? 0 : 16);
        assert_int_equal(stats(e).backed_up_tokens, hit < 3 ? 0 : 16);
    }
    /* A fourth hit has nothing more to back up. */
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(drain(e), 0);
    assert_int_equal(stats(e).backed_up_tokens, 16);

    evict_all(e);
    struct kvt_req r = run_request(e, &q, 16, 1);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(r.protected_len, 16);

    /* A prefix never hit enough is never backed up: evicted, it is gone. */
    struct seq p;
    seq_make(&p, 0, 8, 4);
    run_request(e, &p, 8, 1);
    key = seq_key(&p, 8);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0); /* one hit of three */
    assert_int_equal(drain(e), 0);
    evict_all(e);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len + m.host_len, 0);
    assert_int_equal(stats(e).backed_up_tokens, 16);
    assert_pools_add_up(e);
    kvt_close(e);

    /* The default threshold is documented as 2: one hit must not back a prefix up. */
    host_options(&o, 4, 64, 256);
    o.write_policy = KVT_WRITE_THROUGH_SELECTIVE;
    e = open_with(&o, NULL);
    run_request(e, &q, 16, 1);
    key = seq_key(&q, 16);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(drain(e), 0);
    assert_int_equal(o.write_threshold, 2);
    assert_int_equal(stats(e).backed_up_tokens, 0);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0); /* a second hit: backed up by now */
    assert_int_equal(drain(e), 0);
    assert_int_equal(stats(e).backed_up_tokens, 16);
    kvt_close(e);
}

/* write_back backs nothing up at insert or on hits: a prefix goes to the host when the
 * device evicts it, with its ancestors that have no host copy yet, and comes back exact. */
static void test_write_back(void **state)
{
    struct kvt_options o;
    struct seq a, ab, k[4], x;
    struct kvt_match m;

    (void)state;
    host_options(&o, 4, 64, 256);
    o.write_policy = KVT_WRITE_BACK;
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 8, 2);
    ab = a;
    ab.len = 16;
    for (size_t i = 8; i < 16; i++)
        ab.tok[i] = 7000 + (uint32_t)i;
    seq_hash(&ab);
    run_request(e, &a, 0, 1);
    run_request(e, &ab, 8, 1);
    struct kvt_key key = seq_key(&ab, 16);
    for (int hit = 0; hit < 3; hit++)
        assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(drain(e), 0);
    assert_int_equal(stats(e).backed_up_tokens, 0);
    assert_int_equal(stats(e).host_cached_tokens, 0);

    /* Evicting the leaf B backs up A and B (host copies grow from the top), then drops B. */
    size_t ev = 0;
    assert_int_equal(kvt_evict(e, 8, &ev), 0);
    assert_int_equal(ev, 8);
    check(e);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.backed_up_tokens, 16);
    assert_int_equal(st.host_cached_tokens, 16);
    assert_int_equal(st.cached_tokens, 8);
    assert_int_equal(st.ops_in_flight, 0); /* eviction waited for its backup */
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 8);
    assert_int_equal(m.host_len, 8);
    struct kvt_req r = run_request(e, &ab, 16, 1);
    assert_int_equal(r.protected_len, 16);
    assert_int_equal(r.loaded_len, 8);
    assert_int_equal(drain(e), 0);
    assert_pools_add_up(e);
    evict_all(e);
    assert_int_equal(stats(e).backed_up_tokens, 16); /* both had their host copy already */
    kvt_close(e);

    /* Device pressure inside an allocation: the evicted prefix is backed up first. */
    host_options(&o, 4, 64, 256);
    o.write_policy = KVT_WRITE_BACK;
    e = open_with(&o, NULL);
    for (int i = 0; i < 4; i++) {
        seq_make(&k[i], 0, 16, 10 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(stats(e).device_free_tokens, 0);
    assert_int_equal(stats(e).backed_up_tokens, 0);
    seq_make(&x, 0, 16, 20);
    run_request(e, &x, 0, 1);
    st = stats(e);
    /* What the allocation evicted (the shortfall and some slack) is exactly what went to the
     * host; LRU took k[0] first. */
    assert_true(st.evicted_tokens >= 16);
    assert_int_equal(st.backed_up_tokens, st.evicted_tokens);
    assert_int_equal(st.host_cached_tokens, st.evicted_tokens);
    key = seq_key(&k[0], 16);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 0);
    assert_int_equal(m.host_len, 16);
    r = run_request(e, &k[0], 16, 1);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(drain(e), 0);
    assert_pools_add_up(e);
    kvt_close(e);
}

/* Host runs shorter than load_back_min are recomputed, not loaded; from it on they load. */
static void test_load_back_min(void **state)
{
    struct kvt_options o;
    struct seq s8, s12, s16;
    struct kvt_match m;

    (void)state;
    host_options(&o, 4, 64, 256);
    o.load_back_min = 12;
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&s8, 0, 8, 5);
    seq_make(&s12, 0, 12, 6);
    seq_make(&s16, 0, 16, 7);
    run_request(e, &s8, 0, 1);
    run_request(e, &s12, 0, 1);
    run_request(e, &s16, 0, 1);
    assert_int_equal(drain(e), 0);
    evict_all(e);
    assert_int_equal(stats(e).host_cached_tokens, 36);

    struct kvt_key key = seq_key(&s8, 8);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.host_len, 8);
    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.loaded_len, 0);
    assert_int_equal(r.protected_len, 0);
    assert_int_equal(r.load_op, 0);
    assert_int_equal(stats(e).loaded_tokens, 0);
    /* The request recomputes it; its insert gives the host-only node a device copy again. */
    assert_int_equal(extend(e, &s8, &r, 0, 8), 0);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    check(e);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 8);
    assert_int_equal(m.host_len, 0);
    assert_int_equal(stats(e).host_cached_tokens, 36); /* no second host copy */

    r = run_request(e, &s12, 12, 1); /* exactly load_back_min: loaded */
    assert_int_equal(r.loaded_len, 12);
    r = run_request(e, &s16, 16, 1);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(drain(e), 0);
    assert_int_equal(stats(e).loaded_tokens, 28);
    assert_pools_add_up(e);
    kvt_close(e);
}

/* A full device pool: kvt_alloc_extend evicts backed-up nodes by itself; they stay on the
 * host, and a later request loads them back. */
static void test_device_pressure(void **state)
{
    struct kvt_options o;
    struct seq k[4], x;
    struct kvt_match m;

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, NULL);
    for (int i = 0; i < 4; i++) {
        seq_make(&k[i], 0, 16, 10 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(drain(e), 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.device_free_tokens, 0);
    assert_int_equal(st.cached_tokens, 64);
    assert_int_equal(st.host_cached_tokens, 64);

    /* A new request on a full pool: the allocation evicts (LRU: k[0] first). */
    seq_make(&x, 0, 16, 20);
    struct kvt_key key = seq_key(&x, 16);
    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.protected_len, 0);
    assert_int_equal(extend(e, &x, &r, 0, 16), 0);
    check(e);
    st = stats(e);
    assert_true(st.evicted_tokens >= 16);
    assert_int_equal(st.host_cached_tokens, 64); /* evicted nodes keep their host copy */
    assert_int_equal(st.host_evicted_tokens, 0);
    struct kvt_key k0 = seq_key(&k[0], 16);
    assert_int_equal(kvt_match(e, &k0, NULL, &m), 0);
    assert_int_equal(m.device_len, 0);
    assert_int_equal(m.host_len, 16);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 0), 0);
    check(e);

    /* Every evicted key comes back from the host, bytes exact. */
    for (int i = 0; i < 4; i++) {
        key = seq_key(&k[i], 16);
        assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
        size_t host = m.host_len;
        r = run_request(e, &k[i], 16, 1);
        assert_int_equal(r.protected_len, 16);
        assert_int_equal(r.loaded_len, host);
    }
    assert_true(stats(e).loaded_tokens >= 16);

    /* Nothing evictable: every slot is held by requests. -ENOMEM, nothing changed. */
    assert_int_equal(drain(e), 0);
    struct kvt_req big[N_REQ];
    struct seq y[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        seq_make(&y[i], 1, 16, 30 + (uint32_t)i);
        key = seq_key(&y[i], 16);
        assert_int_equal(kvt_req_begin(e, &key, &big[i]), 0);
        assert_int_equal(extend(e, &y[i], &big[i], 0, 16), 0);
    }
    st = stats(e);
    assert_int_equal(st.device_free_tokens, 0);
    assert_int_equal(st.evictable_tokens, 0);
    {
        int32_t out[4], last = -1;
        uint32_t pl = 16, sl = 20;
        assert_int_equal(kvt_req_read(e, &big[0], 15, 1, &last), 0);
        assert_int_equal(kvt_alloc_extend(e, 1, &pl, &sl, &last, out, 4), -ENOMEM);
    }
    struct kvt_stats st2 = stats(e);
    assert_int_equal(st2.device_free_tokens, st.device_free_tokens);
    assert_int_equal(st2.host_cached_tokens, st.host_cached_tokens);
    check(e);
    for (int i = 0; i < N_REQ; i++) {
        key = seq_key(&y[i], 16);
        assert_int_equal(kvt_req_cache_finished(e, &big[i], &key, 0, i % 2), 0);
    }
    assert_int_equal(drain(e), 0);
    check(e);
    assert_pools_add_up(e);
    kvt_close(e);
}

/* A node whose device copy was evicted lives on in the host tier, but the ref a match gave
 * for it is dead: locking it would protect nothing the caller holds (its slots may be
 * anyone's), also after a load-back gives the node a device copy again. */
static void test_ref_dies_with_device_copy(void **state)
{
    struct kvt_options o;
    struct seq q;
    struct kvt_match m;
    int32_t slots[16], again[16];

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&q, 0, 16, 120);
    run_request(e, &q, 0, 1);
    assert_int_equal(drain(e), 0);
    struct kvt_key key = seq_key(&q, 16);
    assert_int_equal(kvt_match(e, &key, slots, &m), 0);
    assert_int_equal(m.device_len, 16);
    kvt_node_ref old = m.last_node;
    assert_int_equal(kvt_lock(e, old), 0);
    assert_int_equal(kvt_unlock(e, old), 0);

    evict_all(e); /* the node is host-only now */
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.host_len, 16);
    struct kvt_stats before = stats(e);
    assert_int_equal(kvt_lock(e, old), -EINVAL);
    assert_int_equal(kvt_unlock(e, old), -EINVAL);
    assert_int_equal(stats(e).protected_tokens, before.protected_tokens);
    check(e);

    /* Loaded back into other slots: the old ref stays dead, a new match names it anew. */
    int32_t hold[16];
    assert_int_equal(kvt_alloc(e, 16, hold), 0); /* the old slots are someone else's */
    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(drain(e), 0);
    assert_int_equal(kvt_match(e, &key, again, &m), 0);
    assert_int_equal(m.device_len, 16);
    assert_memory_not_equal(again, slots, sizeof(slots));
    assert_int_equal(kvt_lock(e, old), -EINVAL);
    assert_int_equal(kvt_lock(e, m.last_node), 0);
    assert_int_equal(kvt_unlock(e, m.last_node), 0);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    assert_int_equal(kvt_free(e, hold, 16), 0);
    check(e);
    kvt_close(e);
}

/* A load-back the device has no room for even after eviction is left to be recomputed
 * without evicting anything for it. */
static void test_load_back_no_room(void **state)
{
    struct kvt_options o;
    struct seq big, small;
    int32_t held[64];

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&big, 0, 32, 110);
    seq_make(&small, 0, 16, 111);
    run_request(e, &big, 0, 1);
    assert_int_equal(drain(e), 0);
    evict_all(e); /* big lives on the host only */
    run_request(e, &small, 0, 1);
    assert_int_equal(drain(e), 0);
    assert_int_equal(kvt_alloc(e, 40, held), 0); /* 8 free + 16 evictable < 32 */
    struct kvt_stats before = stats(e);
    assert_int_equal(before.device_free_tokens, 8);
    assert_int_equal(before.evictable_tokens, 16);

    struct kvt_key key = seq_key(&big, 32);
    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.protected_len, 0);
    assert_int_equal(r.loaded_len, 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.evicted_tokens, before.evicted_tokens);
    assert_int_equal(st.cached_tokens, 16); /* small is still on the device */
    assert_int_equal(st.device_free_tokens, 8);
    struct kvt_key none = seq_key(&big, 0);
    assert_int_equal(kvt_req_cache_finished(e, &r, &none, 0, 0), 0);
    assert_int_equal(kvt_free(e, held, 40), 0);
    check(e);
    kvt_close(e);
}

/* Nodes a load is still filling cannot give up their device copy; when only they are left to
 * evict (their request was dropped before its forward), an allocation waits for the load
 * instead of failing. */
static void test_pressure_waits_for_load(void **state)
{
    struct kvt_options o;
    struct xfer_config xc = {.layer_delay_us = 50000};
    struct seq k[4], x[2];
    struct kvt_req r, rx[2];
    struct kvt_match m;

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, &xc);
    for (int i = 0; i < 4; i++) {
        seq_make(&k[i], 0, 16, 70 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(drain(e), 0);
    evict_all(e);

    struct kvt_key key = seq_key(&k[0], 16);
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.loaded_len, 16);
    uint64_t op = r.load_op;
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 0), 0); /* dropped, unserved */
    check(e);
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) < op);
    assert_int_equal(stats(e).evictable_tokens, 16);

    /* 32 of the 48 free slots, then 32 more: the second needs k[0]'s pages. */
    for (int i = 0; i < 2; i++) {
        seq_make(&x[i], 1, 32, 80 + (uint32_t)i);
        key = seq_key(&x[i], 0);
        assert_int_equal(kvt_req_begin(e, &key, &rx[i]), 0);
        assert_int_equal(extend(e, &x[i], &rx[i], 0, 32), 0);
        check(e);
    }
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) >= op);
    assert_int_equal(stats(e).device_free_tokens, 0);
    assert_int_equal(stats(e).cached_tokens, 0);
    for (int i = 0; i < 2; i++) {
        verify_req(e, &x[i], &rx[i], 32);
        key = seq_key(&x[i], 32);
        assert_int_equal(kvt_req_cache_finished(e, &rx[i], &key, 0, i), 0);
    }
    key = seq_key(&k[0], 16);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 0);
    assert_int_equal(m.host_len, 16);
    r = run_request(e, &k[0], 16, 1); /* and it loads back right */
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(drain(e), 0);
    check(e);
    assert_pools_add_up(e);
    kvt_close(e);
}

/* kvt_close with requests live, a load and a backup in flight: it waits for the transfers
 * and frees everything (the sanitizer builds check the memory). */
static void test_close_busy(void **state)
{
    struct kvt_options o;
    struct xfer_config xc = {.max_delay_us = 20000, .layer_delay_us = 20000, .seed = 1};
    struct seq a, b, c;
    struct kvt_req ra, rb, rq;

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, &xc);
    seq_make(&a, 0, 16, 90);
    seq_make(&b, 0, 16, 91);
    seq_make(&c, 1, 24, 92);
    run_request(e, &a, 0, 1);
    assert_int_equal(drain(e), 0);
    evict_all(e);
    struct kvt_key key = seq_key(&a, 16);
    assert_int_equal(kvt_req_begin(e, &key, &ra), 0); /* a load in flight */
    assert_int_equal(ra.loaded_len, 16);
    key = seq_key(&b, 0);
    assert_int_equal(kvt_req_begin(e, &key, &rb), 0);
    assert_int_equal(extend(e, &b, &rb, 0, 16), 0);
    key = seq_key(&b, 16);
    assert_int_equal(kvt_req_cache_finished(e, &rb, &key, 0, 1), 0); /* a backup in flight */
    key = seq_key(&c, 0);
    assert_int_equal(kvt_req_begin(e, &key, &rq), 0);
    assert_int_equal(extend(e, &c, &rq, 0, 22), 0); /* holds slots, a partial page */
    assert_true(stats(e).ops_in_flight > 0);
    check(e);
    kvt_close(e);
}

/* Kvt_req_cache_unfinished points the row at the cached slots; when those are pages another
 * request's load is still filling, the request must have a load to wait for. */
static void test_unfinished_pending_load(void **state)
{
    struct kvt_options o;
    struct xfer_config xc = {.layer_delay_us = 100000};
    struct seq q, junk;
    int32_t slots[MAX_TOK];

    (void)state;
    host_options(&o, 4, 64, 256);
    kvt_engine *e = open_with(&o, &xc);
    seq_make(&q, 0, 16, 40);
    run_request(e, &q, 0, 1);
    assert_int_equal(drain(e), 0);
    evict_all(e);

    /* The test holds the whole device pool, junk in every slot, so A's begin cannot load q
     * back: A recomputes it. */
    int32_t held[64];
    struct kvt_req a, b;
    assert_int_equal(kvt_alloc(e, 64, held), 0);
    seq_make(&junk, 1, 32, 41);
    assert_int_equal(compute_rows(e, &junk, 0, 32, held), 0);
    assert_int_equal(compute_rows(e, &junk, 0, 32, held + 32), 0);
    struct kvt_key key = seq_key(&q, 16);
    assert_int_equal(kvt_req_begin(e, &key, &a), 0);
    assert_int_equal(a.protected_len, 0);
    assert_int_equal(a.loaded_len, 0);
    assert_int_equal(kvt_free(e, held, 64), 0);
    assert_int_equal(extend(e, &q, &a, 0, 16), 0);
    verify_req(e, &q, &a, 16);

    /* B loads q back (slowly: 100 ms between layers). */
    key = seq_key(&q, 16);
    assert_int_equal(kvt_req_begin(e, &key, &b), 0);
    assert_int_equal(b.loaded_len, 16);
    assert_int_equal(kvt_load_wait_layer(e, b.load_op, 0, NULL), 0);
    assert_true(xfer_done(host_tier_xfer(e->below), XFER_LOAD) < b.load_op);

    /* A's chunked-prefill boundary: the tree has q on the device now (B's load), so A's
     * duplicates go and A's row points at B's pages. */
    assert_int_equal(kvt_req_cache_unfinished(e, &a, &key), 0);
    check(e);
    assert_int_equal(a.protected_len, 16);
    assert_int_equal(kvt_req_read(e, &a, 0, 16, slots), 0);
    int32_t bslots[16];
    assert_int_equal(kvt_req_read(e, &b, 0, 16, bslots), 0);
    int shares = memcmp(slots, bslots, sizeof(bslots)) == 0;
    int unsafe = shares && xfer_done(host_tier_xfer(e->below), XFER_LOAD) < b.load_op &&
                 a.load_op < b.load_op;
    /* A's row names pages B's load may still be filling: A must wait for that load. */
    assert_false(unsafe);
    /* Safe from here: wait for B's load, then both rows must read right. */
    verify_req(e, &q, &b, 16);
    verify_req(e, &q, &a, 16);
    key = seq_key(&q, 16);
    assert_int_equal(kvt_req_cache_finished(e, &a, &key, 0, 1), 0);
    assert_int_equal(kvt_req_cache_finished(e, &b, &key, 0, 1), 0);
    assert_int_equal(drain(e), 0);
    check(e);
    assert_pools_add_up(e);
    kvt_close(e);
}

/* Host sizes: host_tokens, else host_bytes, else host_ratio x the device pool. */
static void test_host_sizing(void **state)
{
    struct kvt_options o;
    kvt_engine *e;

    (void)state;
    host_options(&o, 4, 64, 0);
    o.host_bytes = 200 * kvt_cell_bytes(&o.geometry) + 5;
    e = open_with(&o, NULL);
    assert_int_equal(stats(e).host_tokens, 200);
    kvt_close(e);

    host_options(&o, 4, 64, 0);
    o.host_ratio = 2.5;
    e = open_with(&o, NULL);
    assert_int_equal(stats(e).host_tokens, 160);
    assert_int_equal(stats(e).host_free_tokens, 160);
    kvt_close(e);

    host_options(&o, 4, 64, 68); /* one page more than the device: the smallest allowed */
    o.host_ratio = 0.5;          /* host_tokens wins */
    e = open_with(&o, NULL);
    assert_int_equal(stats(e).host_tokens, 68);
    kvt_close(e);
}

static void test_bad_input(void **state)
{
    struct kvt_options o;
    kvt_engine *e = (kvt_engine *)1;

    (void)state;
    /* A host pool no larger than the device pool. */
    host_options(&o, 4, 64, 64);
    OPEN_FAILS(KVT_EHOSTSIZE);
    host_options(&o, 4, 64, 32);
    OPEN_FAILS(KVT_EHOSTSIZE);
    host_options(&o, 4, 64, 67); /* 16 pages after rounding down */
    OPEN_FAILS(KVT_EHOSTSIZE);
    host_options(&o, 4, 64, 3); /* less than a page */
    OPEN_FAILS(KVT_EHOSTSIZE);
    host_options(&o, 4, 64, 0);
    o.host_ratio = 1.0;
    OPEN_FAILS(KVT_EHOSTSIZE);
    host_options(&o, 4, 64, 0);
    o.host_ratio = 0.5;
    OPEN_FAILS(KVT_EHOSTSIZE);
    host_options(&o, 4, 64, 0);
    o.host_bytes = 64 * kvt_cell_bytes(&o.geometry);
    OPEN_FAILS(KVT_EHOSTSIZE);

    /* Bad host options. */
    host_options(&o, 4, 64, 256);
    o.host_layout = 2;
    OPEN_FAILS(-EINVAL);
    host_options(&o, 4, 64, 256);
    o.write_policy = 3;
    OPEN_FAILS(-EINVAL);
    host_options(&o, 4, 64, 256);
    o.io = KVT_IO_DMA + 1;
    OPEN_FAILS(-EINVAL);
    host_options(&o, 4, 64, 0);
    o.host_ratio = -1.0;
    OPEN_FAILS(-EINVAL);
    host_options(&o, 4, 64, 256);
    o.host_ratio = -0.5; /* rejected even when host_tokens sizes the pool */
    OPEN_FAILS(-EINVAL);
    host_options(&o, 4, 64, 0);
    o.host_ratio = NAN;
    OPEN_FAILS(-EINVAL);

    /* A host pool larger than RAM (llama3-8b-sized KV, 2^31 tokens: 256 TiB) is refused at
     * once, before any memory is touched. */
    host_options(&o, 16, 64, (1ull << 31) - 16);
    o.geometry = (struct kvt_geometry){
        .attention = KVT_ATTN_MHA, .layers = 32, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    OPEN_FAILS(KVT_EHOSTRAM);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (secs > 2.0)
        fail_msg("KVT_EHOSTRAM took %.3f s", secs);

    /* kvt_load_wait_layer: an op never issued, a layer out of range; op 0 returns at once. */
    host_options(&o, 4, 64, 256);
    e = open_with(&o, NULL);
    assert_int_equal(kvt_load_wait_layer(e, 0, 0, NULL), 0);
    assert_int_equal(kvt_load_wait_layer(e, 0, LAYERS - 1, NULL), 0);
    assert_int_equal(kvt_load_wait_layer(e, 1, 0, NULL), -EINVAL);
    assert_int_equal(kvt_load_wait_layer(e, UINT64_MAX, 0, NULL), -EINVAL);
    assert_int_equal(kvt_load_wait_layer(e, 0, LAYERS, NULL), -EINVAL);
    assert_int_equal(kvt_load_wait_layer(NULL, 0, 0, NULL), -EINVAL);
    struct seq q;
    seq_make(&q, 0, 8, 50);
    run_request(e, &q, 0, 1);
    assert_int_equal(drain(e), 0);
    evict_all(e);
    struct kvt_key key = seq_key(&q, 8);
    struct kvt_req r;
    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    assert_int_equal(r.loaded_len, 8);
    assert_int_equal(r.load_op, 1);
    assert_int_equal(kvt_load_wait_layer(e, r.load_op, LAYERS, NULL), -EINVAL);
    assert_int_equal(kvt_load_wait_layer(e, r.load_op + 1, 0, NULL), -EINVAL);
    assert_int_equal(kvt_load_wait_layer(e, r.load_op, LAYERS - 1, NULL), 0);
    assert_int_equal(kvt_load_wait_layer(e, r.load_op, 0, NULL), 0);
    verify_req(e, &q, &r, 8);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    assert_int_equal(kvt_poll(NULL, 0, NULL), -EINVAL);
    assert_int_equal(drain(e), 0);
    check(e);
    kvt_close(e);
}

/* Without a host tier: every host stat is 0, kvt_poll has nothing to do, no load is named. */
static void test_no_host(void **state)
{
    struct kvt_options o;
    size_t applied = 7;

    (void)state;
    host_options(&o, 4, 64, 0);
    kvt_engine *e = open_with(&o, NULL);
    assert_null(e->below);
    struct seq q;
    seq_make(&q, 0, 16, 60);
    run_request(e, &q, 0, 1);
    struct kvt_req r = run_request(e, &q, 16, 1);
    assert_int_equal(r.protected_len, 16);
    assert_int_equal(r.loaded_len, 0);
    assert_int_equal(r.load_op, 0);
    evict_all(e);
    r = run_request(e, &q, 16, 1);
    assert_int_equal(r.protected_len, 0);
    struct kvt_key key = seq_key(&q, 16);
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.host_len, 0);
    assert_int_equal(m.load_op, 0);

    assert_int_equal(kvt_poll(e, 0, &applied), 0);
    assert_int_equal(applied, 0);
    assert_int_equal(kvt_poll(e, 3, NULL), 0);
    assert_int_equal(kvt_load_wait_layer(e, 0, 0, NULL), 0);
    assert_int_equal(kvt_load_wait_layer(e, 1, 0, NULL), -EINVAL);
    assert_int_equal(kvt_load_wait_layer(e, 0, LAYERS, NULL), -EINVAL);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.host_tokens, 0);
    assert_int_equal(st.host_free_tokens, 0);
    assert_int_equal(st.host_cached_tokens, 0);
    assert_int_equal(st.host_pinned, 0);
    assert_int_equal(st.host_hit_tokens, 0);
    assert_int_equal(st.loaded_tokens, 0);
    assert_int_equal(st.backed_up_tokens, 0);
    assert_int_equal(st.backup_skipped_tokens, 0);
    assert_int_equal(st.host_evicted_tokens, 0);
    assert_int_equal(st.h2d_bytes, 0);
    assert_int_equal(st.d2h_bytes, 0);
    assert_int_equal(st.ops_in_flight, 0);
    check(e);
    kvt_close(e);
}

/* ---- the random run ---- */

struct rcfg {
    const char *name;
    uint32_t ps, device_tokens, host_tokens;
    uint32_t layout, write_policy, write_threshold, load_back_min, evict_policy;
    uint32_t max_delay_us;
    uint32_t reuse; /* percent of new tokens that follow the base: how often keys repeat */
    uint32_t ops;
    int pressure;      /* the device is small enough that kvt_alloc_extend must hit -ENOMEM */
    int host_pressure; /* enough is backed up that the host pool must evict */
    int disk;          /* with a disk tier in a fresh data dir */
    uint32_t disk_write_policy, prefetch_policy;
};

struct rreq {
    int active;
    struct kvt_req r;
    struct seq q; /* every token the request will hold */
    size_t filled;
    int32_t row[MAX_TOK]; /* mirror of its req_to_token row, [0, filled) */
    int served;           /* its prefix was read once load_op landed it (its first forward) */
};

struct rsim {
    kvt_engine *e;
    const struct rcfg *cfg;
    uint32_t ps;
    uint64_t seed, rng, step;
    const char *op;
    uint32_t base[N_BASE][MAX_TOK];
    struct seq last; /* the last request begun, and its prompt length */
    size_t last_prompt;
    struct rreq req[N_REQ];
    /* what the run exercised */
    uint64_t begins, loaded_begins, waited_other, enomem, full, unfinished, finished;
    uint64_t matches, match_checked, rows_checked, polls, applied, evicts, tail_loaded;
    uint64_t prefetched; /* tokens kvt_prefetch started reading */
    uint64_t decodes, dropped;
};

#define HARNESS_RUN(s)                                                                             \
    (&(struct harness_run){.prog = "test_hicache",                                                 \
                           .config = (s)->cfg->name,                                               \
                           .seed = (s)->seed,                                                      \
                           .step = (s)->step,                                                      \
                           .op = (s)->op})

static uint64_t rnd(struct rsim *s)
{
    return rng_mix(s->rng += 0x632BE59BD9B4E019ull);
}

static uint32_t below(struct rsim *s, uint32_t n)
{
    return (uint32_t)(rnd(s) % n);
}

static int chance(struct rsim *s, uint32_t pct)
{
    return below(s, 100) < pct;
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

static struct kvt_stats rstats(struct rsim *s)
{
    struct kvt_stats st = {.size = sizeof(st)};

    EXPECT_RC(s, kvt_stats(s->e, &st), 0);
    return st;
}

/* Bases branch off each other, so keys share prefixes at every depth. */
static void make_bases(struct rsim *s)
{
    for (uint32_t b = 0; b < N_BASE; b++) {
        uint32_t from = b ? below(s, b) : 0, cut = b ? below(s, MAX_TOK) : 0;
        for (uint32_t i = 0; i < MAX_TOK; i++)
            s->base[b][i] = i < cut ? s->base[from][i] : below(s, ALPHABET);
    }
}

/* Invariants after every step: the engine's own check, and the pages add up: every device
 * slot is free, cached, or owned by a request past its protected prefix (whole pages), and
 * every host page is free or holds a copy. */
static void check_all(struct rsim *s)
{
    char why[256] = "";
    int rc = engine_check(s->e, why, sizeof(why));

    if (rc)
        FAIL(s, "engine_check: %d %s", rc, why);
    struct kvt_stats st = rstats(s);
    uint64_t owned = 0, ps = s->ps;
    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active)
            owned += (s->req[i].filled + ps - 1) / ps * ps - s->req[i].r.protected_len;
    if (st.device_free_tokens + st.cached_tokens + owned != st.device_tokens)
        FAIL(s, "device: %" PRIu64 " free + %" PRIu64 " cached + %" PRIu64 " owned != %" PRIu64,
             st.device_free_tokens, st.cached_tokens, owned, st.device_tokens);
    if (st.host_free_tokens + st.host_cached_tokens != st.host_tokens)
        FAIL(s, "host: %" PRIu64 " free + %" PRIu64 " cached != %" PRIu64, st.host_free_tokens,
             st.host_cached_tokens, st.host_tokens);
}

/* Check rows [0, n) of a request (its row mirror), waiting for each layer of op first. */
static void verify_rows(struct rsim *s, const struct seq *q, const int32_t *slots, size_t n,
                        uint64_t op)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        EXPECT_RC(s, kvt_load_wait_layer(s->e, op, l, NULL), 0);
        long bad = check_layer(s->e, q, 0, n, slots, l);
        if (bad != -1)
            FAIL(s,
                 "layer %u: token %ld of %zu (slot %d) has the wrong KV (op %" PRIu64
                 ", load done %" PRIu64 ")",
                 l, bad, n, bad >= 0 ? slots[bad] : -1, op,
                 xfer_done(host_tier_xfer(s->e->below), XFER_LOAD));
    }
    s->rows_checked += n;
}

static struct rreq *pick(struct rsim *s, int (*ok)(const struct rsim *, const struct rreq *))
{
    size_t n = 0, idx[N_REQ];

    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active && (!ok || ok(s, &s->req[i])))
            idx[n++] = i;
    return n ? &s->req[idx[below(s, (uint32_t)n)]] : NULL;
}

static int can_extend(const struct rsim *s, const struct rreq *q)
{
    (void)s;
    return q->filled < q->q.len;
}

static int can_unfinish(const struct rsim *s, const struct rreq *q)
{
    return q->filled / s->ps * s->ps > q->r.protected_len;
}

/* A key: a prefix of a base (now and then with a token changed), then new tokens. */
static void gen_seq(struct rsim *s, struct seq *q, size_t *prompt)
{
    const uint32_t *b = s->base[below(s, N_BASE)];

    q->ns = chance(s, 75) ? 0 : 1;
    *prompt = chance(s, 3) ? 0 : 1 + below(s, MAX_TOK - 4);
    q->len = *prompt + below(s, (uint32_t)min_sz(16, MAX_TOK - *prompt) + 1);
    if (q->len == 0)
        q->len = 1;
    memcpy(q->tok, b, *prompt * sizeof(uint32_t));
    for (size_t i = *prompt; i < q->len; i++)
        q->tok[i] = chance(s, s->cfg->reuse) ? b[i] : below(s, ALPHABET);
    if (*prompt && chance(s, (100 - s->cfg->reuse) * 2 / 5))
        q->tok[below(s, (uint32_t)*prompt)] = below(s, ALPHABET);
    seq_hash(q);
}

/* A forward over the request's rows: wait for its load, layer by layer, and read them. */
static void serve(struct rsim *s, struct rreq *q)
{
    verify_rows(s, &q->q, q->row, q->filled, q->r.load_op);
    q->served = 1;
}

static void do_begin(struct rsim *s)
{
    struct rreq *q = NULL;
    size_t prompt;

    for (size_t i = 0; i < N_REQ && !q; i++)
        if (!s->req[i].active)
            q = &s->req[i];
    if (!q) {
        /* Every slot taken: kvt_req_begin refuses, changing nothing. */
        struct seq t;
        struct kvt_req r;
        s->op = "begin-full";
        gen_seq(s, &t, &prompt);
        struct kvt_key key = seq_key(&t, prompt);
        REQUIRE(s, kvt_req_available(s->e) == 0);
        EXPECT_RC(s, kvt_req_begin(s->e, &key, &r), -ENOMEM);
        s->full++;
        return;
    }
    s->op = "begin";
    if (s->last.len && chance(s, 25)) {
        /* The same prompt again (parallel sampling, a retry): it meets the prefix the last
         * request may still be loading. */
        q->q = s->last;
        prompt = s->last_prompt;
        for (size_t i = prompt; i < q->q.len; i++)
            q->q.tok[i] = below(s, ALPHABET);
        seq_hash(&q->q);
    } else {
        gen_seq(s, &q->q, &prompt);
    }
    s->last = q->q;
    s->last_prompt = prompt;
    struct kvt_key key = seq_key(&q->q, prompt);
    struct kvt_req *r = &q->r;
    EXPECT_RC(s, kvt_req_begin(s->e, &key, r), 0);
    uint32_t ps = s->ps;
    REQUIRE(s, r->pool_idx >= 0);
    REQUIRE(s, r->protected_len % ps == 0 && r->protected_len <= prompt / ps * ps);
    REQUIRE(s, r->loaded_len % ps == 0 && r->loaded_len <= r->protected_len);
    REQUIRE(s, r->loaded_len == 0 || r->loaded_len >= s->cfg->load_back_min);
    REQUIRE(s, r->loaded_len == 0 || r->load_op != 0);
    q->active = 1;
    q->filled = r->protected_len;
    EXPECT_RC(s, kvt_req_read(s->e, r, 0, q->filled, q->row), 0);
    s->begins++;
    s->loaded_begins += r->loaded_len != 0;
    s->waited_other += r->loaded_len == 0 && r->load_op != 0;
    /* The forward: wait for each layer, then read the prefix it is served. Half the time it
     * comes later (at the request's next step), so loads stay in flight across steps and
     * other requests meet prefixes still being filled. */
    q->served = 0;
    if (chance(s, 50))
        serve(s, q);
}

static void finish(struct rsim *s, struct rreq *q, int insert)
{
    struct kvt_key key = seq_key(&q->q, q->filled);

    /* A request dropped before its first forward (a client gone) is let go with its load
     * still in flight; otherwise its rows are read once more. */
    if (q->served || insert || !chance(s, 30))
        serve(s, q);
    else
        s->dropped++;
    EXPECT_RC(s, kvt_req_cache_finished(s->e, &q->r, &key, (int32_t)below(s, 3), insert), 0);
    REQUIRE(s, q->r.pool_idx == -1);
    q->active = 0;
    s->finished++;
}

static void do_extend(struct rsim *s, struct rreq *q)
{
    int32_t out[MAX_TOK];
    uint32_t pl = (uint32_t)q->filled;
    uint32_t sl = pl + 1 + below(s, (uint32_t)min_sz(q->q.len - q->filled, 16));
    int32_t last = pl ? q->row[pl - 1] : -1;
    size_t n = sl - pl;

    s->op = "extend";
    if (!q->served)
        serve(s, q);
    struct kvt_stats before = rstats(s);
    size_t need = (sl + s->ps - 1) / s->ps - (pl + s->ps - 1) / s->ps;
    int rc;
    if (n == 1 && pl && chance(s, 50)) {
        s->op = "decode"; /* one token: the decode path, which evicts by itself too */
        rc = kvt_alloc_decode(s->e, 1, &sl, &last, out);
        s->decodes += rc == 0;
    } else {
        rc = kvt_alloc_extend(s->e, 1, &pl, &sl, &last, out, n);
    }
    if (rc == -ENOMEM) {
        /* Allowed only when eviction could not cover the need, and then nothing went. */
        struct kvt_stats st = rstats(s);
        if (need * s->ps <= before.device_free_tokens + before.evictable_tokens)
            FAIL(s,
                 "allocating %u -> %u: -ENOMEM with %" PRIu64 " tokens evictable, %" PRIu64
                 " free, %" PRIu64 " ops in flight",
                 pl, sl, before.evictable_tokens, before.device_free_tokens, st.ops_in_flight);
        REQUIRE(s, st.evicted_tokens == before.evicted_tokens &&
                       st.cached_tokens == before.cached_tokens);
        s->enomem++;
        s->op = "extend-abort";
        finish(s, q, 0);
        return;
    }
    EXPECT_RC(s, rc, 0);
    if (pl % s->ps)
        REQUIRE(s, out[0] == last + 1);
    EXPECT_RC(s, compute_rows(s->e, &q->q, pl, n, out), 0);
    EXPECT_RC(s, kvt_req_write(s->e, &q->r, pl, out, n), 0);
    memcpy(q->row + pl, out, n * sizeof(int32_t));
    q->filled = sl;
}

static void do_unfinished(struct rsim *s, struct rreq *q)
{
    struct kvt_key key = seq_key(&q->q, q->filled);

    s->op = "unfinished";
    if (!q->served && chance(s, 50))
        serve(s, q);
    EXPECT_RC(s, kvt_req_cache_unfinished(s->e, &q->r, &key), 0);
    REQUIRE(s, q->r.protected_len == q->filled / s->ps * s->ps);
    EXPECT_RC(s, kvt_req_read(s->e, &q->r, 0, q->filled, q->row), 0);
    s->unfinished++;
    /* The row may now point at pages another request's load is still filling: the
     * request's load_op names it, and serve waits for it per layer. */
    serve(s, q);
}

static void do_match(struct rsim *s)
{
    struct seq t;
    size_t prompt;
    struct kvt_match m;
    int32_t slots[MAX_TOK];

    s->op = "match";
    gen_seq(s, &t, &prompt);
    if (t.len == 0)
        return;
    struct kvt_key key = seq_key(&t, t.len);
    EXPECT_RC(s, kvt_match(s->e, &key, slots, &m), 0);
    REQUIRE(s, m.device_len % s->ps == 0 && m.host_len % s->ps == 0);
    REQUIRE(s, m.device_len + m.host_len + m.disk_len <= t.len / s->ps * s->ps);
    REQUIRE(s, m.disk_len % s->ps == 0 && (s->cfg->disk || m.disk_len == 0));
    REQUIRE(s, m.last_node != 0);
    s->matches++;
    /* A match locks nothing: its pages are right only while no load may still fill them. */
    uint64_t issued = host_tier_last_op(s->e->below, XFER_LOAD);
    if (xfer_done(host_tier_xfer(s->e->below), XFER_LOAD) >= issued) {
        verify_rows(s, &t, slots, m.device_len, 0);
        s->match_checked++;
    }
}

/* Start reading a key's disk part; a later begin of it finds it on the host or waits. */
static void do_prefetch(struct rsim *s)
{
    struct seq t;
    size_t prompt, tokens = 1;

    s->op = "prefetch";
    gen_seq(s, &t, &prompt);
    struct kvt_key key = seq_key(&t, t.len);
    EXPECT_RC(s, kvt_prefetch(s->e, &key, &tokens), 0);
    REQUIRE(s, tokens % s->ps == 0 && (s->cfg->disk || tokens == 0));
    s->prefetched += tokens;
}

static void one_step(struct rsim *s)
{
    uint32_t r = below(s, 100);
    struct rreq *q;

    s->op = NULL;
    if (r < 22) {
        do_begin(s);
    } else if (r < 52) {
        if ((q = pick(s, can_extend)))
            do_extend(s, q);
        else
            do_begin(s);
    } else if (r < 64) {
        if ((q = pick(s, NULL))) {
            s->op = "finish";
            finish(s, q, chance(s, 85));
        } else {
            do_begin(s);
        }
    } else if (r < 68) {
        if ((q = pick(s, can_unfinish)))
            do_unfinished(s, q);
    } else if (r < 78) {
        size_t applied = 0;
        s->op = "poll";
        EXPECT_RC(s, kvt_poll(s->e, below(s, 4), &applied), 0);
        s->polls++;
        s->applied += applied;
    } else if (r < 83) {
        size_t want = chance(s, 10) ? SIZE_MAX / 2 : 1 + below(s, 3 * s->ps), got = 0;
        s->op = "evict";
        EXPECT_RC(s, kvt_evict(s->e, want, &got), 0);
        REQUIRE(s, got % s->ps == 0);
        s->evicts++;
    } else if (r < 91) {
        do_match(s);
    } else if (r < 93) {
        do_prefetch(s);
    } else if ((q = pick(s, NULL))) {
        s->op = "verify";
        serve(s, q);
    }
}

static uint64_t base_seed(void)
{
    const char *env = getenv("KVT_SEED");

    return env && *env ? strtoull(env, NULL, 0) : DEFAULT_SEED;
}

/* Finish everything, let every transfer land, and check that nothing leaked; then serve
 * every base key again from an empty device, all of it from the host. */
static void drain_and_check(struct rsim *s)
{
    s->op = "drain";
    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active) {
            finish(s, &s->req[i], chance(s, 50));
            check_all(s);
        }
    EXPECT_RC(s, drain(s->e), 0);
    check_all(s);
    struct kvt_stats st = rstats(s);
    REQUIRE(s, st.ops_in_flight == 0);
    REQUIRE(s, st.device_free_tokens + st.cached_tokens == st.device_tokens);
    REQUIRE(s, st.host_free_tokens + st.host_cached_tokens == st.host_tokens);
    REQUIRE(s, st.protected_tokens == 0 && st.req_slots_free == N_REQ);

    /* Every cached device page holds the KV of its key. */
    s->op = "final-match";
    for (uint32_t b = 0; b < N_BASE; b++)
        for (uint32_t ns = 0; ns < N_NS; ns++) {
            struct seq t = {.ns = ns, .len = MAX_TOK};
            struct kvt_match m;
            int32_t slots[MAX_TOK];
            memcpy(t.tok, s->base[b], sizeof(t.tok));
            seq_hash(&t);
            struct kvt_key key = seq_key(&t, MAX_TOK);
            EXPECT_RC(s, kvt_match(s->e, &key, slots, &m), 0);
            verify_rows(s, &t, slots, m.device_len, 0);
        }

    /* Empty the device; every base key the host still holds is loaded back and checked. */
    s->op = "final-load";
    EXPECT_RC(s, drain(s->e), 0);
    size_t ev = 0;
    EXPECT_RC(s, kvt_evict(s->e, SIZE_MAX / 2, &ev), 0);
    st = rstats(s);
    REQUIRE(s, st.cached_tokens == 0 && st.device_free_tokens == st.device_tokens);
    check_all(s);
    for (uint32_t b = 0; b < N_BASE; b++)
        for (uint32_t ns = 0; ns < N_NS; ns++) {
            struct rreq *q = &s->req[0];
            q->q = (struct seq){.ns = ns, .len = MAX_TOK};
            memcpy(q->q.tok, s->base[b], sizeof(q->q.tok));
            seq_hash(&q->q);
            struct kvt_key key = seq_key(&q->q, MAX_TOK);
            EXPECT_RC(s, kvt_req_begin(s->e, &key, &q->r), 0);
            q->active = 1;
            q->filled = q->r.protected_len;
            EXPECT_RC(s, kvt_req_read(s->e, &q->r, 0, q->filled, q->row), 0);
            s->tail_loaded += q->r.loaded_len;
            verify_rows(s, &q->q, q->row, q->filled, q->r.load_op);
            check_all(s);
            finish(s, q, 1);
            check_all(s);
        }
    EXPECT_RC(s, drain(s->e), 0);
    check_all(s);
    st = rstats(s);
    REQUIRE(s, st.device_free_tokens + st.cached_tokens == st.device_tokens);
    REQUIRE(s, st.host_free_tokens + st.host_cached_tokens == st.host_tokens);
}

static void print_summary(struct rsim *s)
{
    struct kvt_stats st = rstats(s);

    printf("test_hicache: %s: %" PRIu64 " requests (%" PRIu64 " loaded back, %" PRIu64
           " waited on another's load, %" PRIu64 " -ENOMEM, %" PRIu64 " unfinished, %" PRIu64
           " dropped unserved, %" PRIu64 " decodes), loaded %" PRIu64 " backed up %" PRIu64
           " skipped %" PRIu64 " host-evicted %" PRIu64 " host-hit %" PRIu64 " evicted %" PRIu64
           " tokens, %" PRIu64 " rows checked, %" PRIu64 "/%" PRIu64 " matches checked\n",
           s->cfg->name, s->finished, s->loaded_begins, s->waited_other, s->enomem, s->unfinished,
           s->dropped, s->decodes, st.loaded_tokens, st.backed_up_tokens, st.backup_skipped_tokens,
           st.host_evicted_tokens, st.host_hit_tokens, st.evicted_tokens, s->rows_checked,
           s->match_checked, s->matches);
    if (s->cfg->disk)
        printf("test_hicache: %s: disk: written %" PRIu64 " hit %" PRIu64 " read %" PRIu64
               " prefetched %" PRIu64 " tokens, %" PRIu64 " held now, %" PRIu64 " errors\n",
               s->cfg->name, st.disk_written_tokens, st.disk_hit_tokens, st.disk_read_tokens,
               s->prefetched, st.disk_cached_tokens, st.disk_errors);
    fflush(stdout);
}

static void run(const struct rcfg *cfg)
{
    struct kvt_options o;
    struct rsim *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    s->cfg = cfg;
    s->ps = cfg->ps;
    s->seed = base_seed();
    s->rng = s->seed;
    for (const char *c = cfg->name; *c; c++)
        s->rng = (s->rng ^ (uint8_t)*c) * 0x100000001B3ull;
    printf("test_hicache: %s: seed=%" PRIu64 " (KVT_SEED reruns it), %u ops\n", cfg->name, s->seed,
           cfg->ops);
    fflush(stdout);

    host_options(&o, cfg->ps, cfg->device_tokens, cfg->host_tokens);
    char dir[64] = "";
    if (cfg->disk) {
        make_data_dir(dir, sizeof(dir));
        o.disk_dir = dir;
        o.disk_write_policy = cfg->disk_write_policy;
        o.disk_bytes = 2 << 20; /* 512 slots of 4 KiB: the disk tier evicts too */
        o.prefetch_policy = cfg->prefetch_policy;
    }
    o.host_layout = cfg->layout;
    o.write_policy = cfg->write_policy;
    o.write_threshold = cfg->write_threshold;
    o.load_back_min = cfg->load_back_min;
    o.evict_policy = cfg->evict_policy;
    EXPECT_RC(s, kvt_open(&o, &s->e), 0);
    struct xfer_config xc = {.max_delay_us = cfg->max_delay_us, .seed = rnd(s)};
    EXPECT_RC(s, set_xfer(s->e, &xc), 0);
    make_bases(s);
    check_all(s);
    for (s->step = 0; s->step < cfg->ops; s->step++) {
        one_step(s);
        check_all(s);
    }
    drain_and_check(s);
    print_summary(s);

    /* The run must have exercised the host tier, not just the device. */
    struct kvt_stats st = rstats(s);
    s->op = "coverage";
    REQUIRE(s, st.loaded_tokens > 0 && s->loaded_begins > 0);
    REQUIRE(s, st.backed_up_tokens > 0);
    REQUIRE(s, st.host_hit_tokens > 0);
    REQUIRE(s, st.host_evicted_tokens > 0 || !s->cfg->host_pressure);
    REQUIRE(s, st.evicted_tokens > 0);
    REQUIRE(s, s->unfinished > 0 && s->match_checked > 0);
    /* Not required: how often a begin meets another's load still in flight depends on
     * timing (a sanitizer's slowdown); test_layer_wait checks that case deterministically. */
    REQUIRE(s, s->enomem > 0 || !s->cfg->pressure);
    REQUIRE(s, s->tail_loaded > 0);
    REQUIRE(s, !cfg->disk || (st.disk_written_tokens > 0 && st.disk_read_tokens > 0 &&
                              st.disk_hit_tokens > 0 && s->prefetched > 0 && st.disk_errors == 0));
    kvt_close(s->e);
    if (cfg->disk)
        fixture_remove_tree(dir);
    free(s);
}

/* Write-through fills the host, so the host pool is what runs out; selective backs up only
 * what is hit again, so its keys repeat more and its host pool is smaller. */
static void test_random_page1(void **state)
{
    static const struct rcfg cfgs[] = {
        {.name = "ps1-wt-pagefirst",
         .ps = 1,
         .device_tokens = 96,
         .host_tokens = 384,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .max_delay_us = 300,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps1-sel-layerfirst",
         .ps = 1,
         .device_tokens = 128,
         .host_tokens = 144,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_THROUGH_SELECTIVE,
         .write_threshold = 1,
         .max_delay_us = 300,
         .reuse = 90,
         .ops = 25000},
        {.name = "ps1-wb-pagefirst",
         .ps = 1,
         .device_tokens = 96,
         .host_tokens = 192,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_BACK,
         .max_delay_us = 300,
         .reuse = 60,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

static void test_random_page4(void **state)
{
    static const struct rcfg cfgs[] = {
        {.name = "ps4-wt-layerfirst",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 512,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .max_delay_us = 1000,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps4-sel-pagefirst",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 160,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH_SELECTIVE,
         .write_threshold = 2,
         .max_delay_us = 500,
         .reuse = 90,
         .ops = 25000,
         .host_pressure = 1},
        {.name = "ps4-wt-min8-lfu",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 512,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .load_back_min = 8,
         .evict_policy = KVT_EVICT_LFU,
         .max_delay_us = 100,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps4-wb-layerfirst-mru",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 256,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_BACK,
         .evict_policy = KVT_EVICT_MRU,
         .max_delay_us = 500,
         .reuse = 60,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps4-wt-nodelay",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 384,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

/* ---- the disk tier ---- */

static void disk_options(struct kvt_options *o, const char *dir)
{
    host_options(o, 4, 64, 256);
    o->disk_dir = dir;
    o->disk_bytes = 1 << 20;
}

/* Flip the first byte of every slot of a slab file (4 KiB slots). */
static void damage_slab(const char *dir)
{
    char path[128];
    struct stat st;

    snprintf(path, sizeof(path), "%s/slabs/0000.slab", dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    for (off_t off = 0; off < st.st_size; off += 4096) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, off), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, off), 1);
    }
    close(fd);
}

/* What was written through to disk is served after a restart, byte-exact, in its own
 * namespace; a dir of another model or page size is refused, and so is a second writer. */
static void test_disk_restart(void **state)
{
    struct kvt_options o;
    struct seq a, b;
    struct kvt_match m;
    char dir[64];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 16, 3);
    seq_make(&b, 1, 12, 3); /* the same tokens in another namespace */
    run_request(e, &a, 0, 1);
    run_request(e, &b, 0, 1);
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.disk_written_tokens, 28);
    assert_int_equal(st.disk_cached_tokens, 28);
    assert_int_equal(st.disk_errors, 0);
    assert_int_equal(st.disk_tokens, (1 << 20) / 4096 * 4);
    kvt_engine *second = NULL;
    assert_int_equal(kvt_open(&o, &second), -EBUSY);
    kvt_close(e);

    /* A new engine: the tree is empty, the disk has it all. */
    e = open_with(&o, NULL);
    struct kvt_key key = seq_key(&a, 16);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len + m.host_len, 0);
    assert_int_equal(m.disk_len, 16);
    struct kvt_req r = run_request(e, &a, 16, 1); /* verifies every row */
    assert_int_equal(r.protected_len, 16);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(r.disk_len, 16);
    r = run_request(e, &b, 12, 1);
    assert_int_equal(r.protected_len, 12);
    assert_int_equal(r.disk_len, 12);
    st = stats(e);
    assert_int_equal(st.disk_read_tokens, 28);
    assert_int_equal(st.disk_written_tokens, 0); /* already there: nothing written twice */
    check(e);
    kvt_close(e);

    o.model_id = "another-model";
    OPEN_FAILS(KVT_EFINGERPRINT);
    disk_options(&o, dir);
    o.page_size = 8;
    OPEN_FAILS(KVT_EFINGERPRINT);
    fixture_remove_tree(dir);
}

/* kvt_poll(e, max) applies at most max completions over transfers and disk ops together. */
static void test_poll_budget(void **state)
{
    struct kvt_options o;
    struct seq q[3];
    char dir[64];
    size_t applied = 0;

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    for (uint32_t i = 0; i < 3; i++) {
        seq_make(&q[i], 0, 8, 140 + i);
        run_request(e, &q[i], 0, 1); /* one backup each */
    }
    assert_int_equal(stats(e).ops_in_flight, 3);
    /* Let the backups land, unapplied; applying them starts one disk write each. */
    xfer_wait(host_tier_xfer(e->below), XFER_BACKUP, host_tier_last_op(e->below, XFER_BACKUP));
    assert_int_equal(kvt_poll(e, 3, &applied), 0);
    assert_int_equal(applied, 3);
    assert_int_equal(stats(e).disk_ops_in_flight, 3);
    /* Let the writes complete, uncollected (the store counts a batch's pages as it settles
     * its ops). */
    struct dstore_stats ds;
    for (int i = 0; i < 10000; i++) {
        dstore_stats(store_disk_dstore(e->store), &ds);
        if (ds.writes == 3 * 2)
            break;
        usleep(1000);
    }
    assert_int_equal(ds.writes, 3 * 2);
    for (size_t left = 3; left > 0; left--) {
        assert_int_equal(kvt_poll(e, 1, &applied), 0);
        assert_int_equal(applied, 1);
        assert_int_equal(stats(e).disk_ops_in_flight, left - 1);
    }
    assert_int_equal(kvt_poll(e, 1, &applied), 0);
    assert_int_equal(applied, 0);
    assert_int_equal(stats(e).disk_written_tokens, 3 * 8);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* The disk tier needs a host tier in page_first layout and page hashes; its enums are
 * checked. */
static void test_disk_bad_options(void **state)
{
    struct kvt_options o;
    kvt_engine *e;
    char dir[64];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    o.host_tokens = 0;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.host_layout = KVT_HOST_LAYER_FIRST;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.hash_pages = 0;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.disk_write_policy = KVT_DISK_WRITE_ON_EVICT + 1;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.prefetch_policy = KVT_PREFETCH_TIMEOUT + 1;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.disk_io = KVT_DISK_IO_PSYNC + 1;
    OPEN_FAILS(-EINVAL);
    /* A dir that holds something else is not taken over. */
    char junk[96];
    snprintf(junk, sizeof(junk), "%s/notes.txt", dir);
    FILE *f = fopen(junk, "w");
    assert_non_null(f);
    fputs("not kvtier\n", f);
    fclose(f);
    disk_options(&o, dir);
    OPEN_FAILS(KVT_EFORMAT);
    fixture_remove_tree(dir);
}

/* Damaged pages on disk are never served: the read fails its checksum, the entry goes, the
 * request computes the prefix, and the engine writes it again. */
static void test_disk_corruption(void **state)
{
    struct kvt_options o;
    struct seq a;
    char dir[64];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 16, 5);
    run_request(e, &a, 0, 1);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);
    damage_slab(dir);

    e = open_with(&o, NULL);
    struct kvt_req r = run_request(e, &a, 16, 1); /* computes: nothing served from disk */
    assert_int_equal(r.protected_len, 0);
    assert_int_equal(r.disk_len, 0);
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_stats st = stats(e);
    assert_true(st.disk_errors >= 1);
    assert_int_equal(st.disk_read_tokens, 0);
    assert_int_equal(st.disk_written_tokens, 16); /* written again from the new backup */
    check(e);
    kvt_close(e);

    e = open_with(&o, NULL);
    r = run_request(e, &a, 16, 1);
    assert_int_equal(r.disk_len, 16);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* kvt_prefetch reads the disk part ahead; under best_effort a begin takes what has landed.
 * Under write-on-evict nothing reaches the disk until the host evicts it. */
static void test_disk_prefetch_and_on_evict(void **state)
{
    struct kvt_options o;
    struct seq a, k[6];
    char dir[64];
    size_t tokens = 0;

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 16, 6);
    run_request(e, &a, 0, 1);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);

    disk_options(&o, dir);
    o.prefetch_policy = KVT_PREFETCH_BEST_EFFORT;
    e = open_with(&o, NULL);
    struct kvt_key key = seq_key(&a, 16);
    assert_int_equal(kvt_prefetch(e, &key, &tokens), 0);
    assert_int_equal(tokens, 16);
    assert_int_equal(kvt_prefetch(e, &key, &tokens), 0);
    assert_int_equal(tokens, 0); /* already under way */
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.host_len, 16);
    assert_int_equal(m.disk_len, 0);
    struct kvt_req r = run_request(e, &a, 16, 1);
    assert_int_equal(r.loaded_len, 16);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);

    /* write on evict: a host pool of 80 tokens must evict to hold six 16-token keys. */
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    o.host_tokens = 80;
    o.disk_write_policy = KVT_DISK_WRITE_ON_EVICT;
    e = open_with(&o, NULL);
    for (int i = 0; i < 4; i++) {
        seq_make(&k[i], 0, 16, 40 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(stats(e).disk_written_tokens, 0);
    for (int i = 4; i < 6; i++) {
        seq_make(&k[i], 0, 16, 40 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_stats st = stats(e);
    assert_true(st.host_evicted_tokens > 0);
    assert_int_equal(st.disk_written_tokens, st.host_evicted_tokens);
    /* The oldest went to disk and comes back from there. */
    evict_all(e);
    r = run_request(e, &k[0], 16, 1);
    assert_int_equal(r.disk_len, 16);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* The disk tier under the same random load: host eviction leaves pages only on disk, later
 * begins read them back (or take what landed), and every row served is checked. */
static void test_random_disk(void **state)
{
    static const struct rcfg cfgs[] = {
        {.name = "ps4-disk-wt-wait",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 192,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .max_delay_us = 300,
         .reuse = 60,
         .ops = 15000,
         .host_pressure = 1,
         .pressure = 1,
         .disk = 1,
         .disk_write_policy = KVT_DISK_WRITE_THROUGH,
         .prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE},
        {.name = "ps1-disk-wb-onevict-best",
         .ps = 1,
         .device_tokens = 96,
         .host_tokens = 128,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_BACK,
         .max_delay_us = 200,
         .reuse = 60,
         .ops = 15000,
         .host_pressure = 1,
         .pressure = 1,
         .disk = 1,
         .disk_write_policy = KVT_DISK_WRITE_ON_EVICT,
         .prefetch_policy = KVT_PREFETCH_BEST_EFFORT},
        {.name = "ps4-disk-sel-timeout",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 160,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH_SELECTIVE,
         .write_threshold = 1,
         .max_delay_us = 300,
         .reuse = 80,
         .ops = 15000,
         .host_pressure = 1,
         .disk = 1,
         .disk_write_policy = KVT_DISK_WRITE_THROUGH,
         .prefetch_policy = KVT_PREFETCH_TIMEOUT},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_wait),        cmocka_unit_test(test_match_pending_load),
        cmocka_unit_test(test_write_through),     cmocka_unit_test(test_selective),
        cmocka_unit_test(test_write_back),        cmocka_unit_test(test_load_back_min),
        cmocka_unit_test(test_device_pressure),   cmocka_unit_test(test_pressure_waits_for_load),
        cmocka_unit_test(test_load_back_no_room), cmocka_unit_test(test_ref_dies_with_device_copy),
        cmocka_unit_test(test_close_busy),        cmocka_unit_test(test_unfinished_pending_load),
        cmocka_unit_test(test_host_sizing),       cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_no_host),           cmocka_unit_test(test_random_page1),
        cmocka_unit_test(test_random_page4),      cmocka_unit_test(test_disk_restart),
        cmocka_unit_test(test_disk_bad_options),  cmocka_unit_test(test_poll_budget),
        cmocka_unit_test(test_disk_corruption),   cmocka_unit_test(test_disk_prefetch_and_on_evict),
        cmocka_unit_test(test_random_disk),
    };
    /* On a GPU these cannot hold: they time their checks by the sim-only delay seams of
     * xfer_config, or watch a load still in flight that a GPU has long finished. */
    static const char *const sim_only[] = {"test_layer_wait", "test_match_pending_load",
                                           "test_pressure_waits_for_load", "test_close_busy",
                                           "test_unfinished_pending_load"};
    const size_t n_tests = sizeof(tests) / sizeof(tests[0]);
    struct CMUnitTest on_gpu[sizeof(tests) / sizeof(tests[0])];
    size_t n_gpu = 0;

    if (TEST_BACKEND != KVT_BACKEND_CUDA)
        return cmocka_run_group_tests(tests, NULL, NULL);
#ifdef KVT_HAVE_CUDA
    if (dev_cuda_device_count() == 0)
        return T_EXIT_SKIP;
#else
    return T_EXIT_SKIP;
#endif
    for (size_t i = 0; i < n_tests; i++) {
        int keep = 1;

        for (size_t j = 0; j < sizeof(sim_only) / sizeof(sim_only[0]); j++)
            keep = keep && strcmp(tests[i].name, sim_only[j]) != 0;
        if (keep)
            on_gpu[n_gpu++] = tests[i];
    }
    return _cmocka_run_group_tests("hicache_cuda", on_gpu, n_gpu, NULL, NULL);
}
