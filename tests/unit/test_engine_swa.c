/* Hybrid models with sliding-window layers through the public engine (options.swa): KV of a
 * sliding-window layer through the map, a request freeing its SWA KV as its window moves on,
 * its key cached with SWA tombstones below the window, a match served only up to where its
 * last window still has SWA KV, SWA KV evicted alone when the SWA pool is short, options and
 * fingerprints, and a randomized run whose every served row (full layers over the whole
 * prefix, sliding-window layers over its last window) is checked, with the engine's invariant
 * check (the pair allocator's map and peers, the tree's SWA count) after every step: on the
 * device alone, and over a host tier written through (serial copies) or back (threaded), whose
 * load-backs bring the SWA layers of the nodes backed up while they held SWA KV. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "engine/engine.h"
#include "disk/layout.h"
#include "disk/ops.h"
#include "engine_fixture.h"
#include "harness.h"
#include "prefix_kv.h"

#define HARNESS_RUN(s) (s)

#define PS 4
#define CTX 256
#define LAYERS 4
#define HEAD_DIM 4
#define ROW (HEAD_DIM * 2)
#define WINDOW 8

static const uint32_t full_ids[] = {1, 3};
static uint32_t window_now = WINDOW; /* the window of the engine under test */
static const struct harness_run plain = {.prog = "test_engine_swa"};

static int is_full(uint32_t layer)
{
    return layer == 1 || layer == 3;
}

static void swa_options(struct kvt_options *o, uint32_t window, uint64_t swa_tokens)
{
    fixture_engine_options(o, LAYERS, HEAD_DIM);
    o->device_tokens = 512;
    o->max_context = CTX;
    o->swa = (struct kvt_swa){
        .window = window, .nfull = 2, .full_layers = full_ids, .tokens = swa_tokens};
}

static kvt_engine *open_swa(uint32_t window, uint64_t swa_tokens)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    swa_options(&o, window, swa_tokens);
    assert_int_equal(kvt_open(&o, &e), 0);
    window_now = window;
    return e;
}

/* With a host tier of host_tokens (0: none) under the write policy given. */
static kvt_engine *open_swa_host(uint32_t window, uint64_t swa_tokens, uint64_t host_tokens,
                                 uint32_t policy, int serial)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    swa_options(&o, window, swa_tokens);
    o.host_tokens = host_tokens;
    o.write_policy = policy;
    o.sim_serial = serial;
    assert_int_equal(kvt_open(&o, &e), 0);
    window_now = window;
    return e;
}

/* Whether the rows of tokens [from, to) of layer hold their KV. */
static int layer_is(kvt_engine *e, uint32_t l, const int32_t *slots, const uint32_t *t, size_t from,
                    size_t to)
{
    return prefix_kv_is(e, l, ROW, slots, t, from, to);
}

static void write_kv(kvt_engine *e, const int32_t *slots, const uint32_t *t, size_t from, size_t to)
{
    assert_int_equal(prefix_kv_write(e, LAYERS, ROW, slots, t, from, to), 0);
}

/* ---- a request as a serving engine runs it ---- */

struct run {
    struct kvt_req req;
    const uint32_t *t;
    size_t len;
    int32_t row[CTX];
};

/* Begin on t[0..n) and check what is served: full layers over the prefix, sliding-window
 * layers over its last window (all the model reads of them). */
static int begin(const struct harness_run *s, kvt_engine *e, struct run *r, const uint32_t *t,
                 size_t n)
{
    struct kvt_key key = {.tokens = t, .len = n};
    int rc = kvt_req_begin(e, &key, &r->req);

    if (rc)
        return rc;
    r->t = t;
    r->len = r->req.protected_len;
    /* A prefix loaded back from the host is read once its layers land. */
    for (uint32_t l = 0; r->req.load_op && l < LAYERS; l++)
        EXPECT_RC(s, kvt_load_wait_layer(e, r->req.load_op, l, NULL), 0);
    EXPECT_RC(s, kvt_req_read(e, &r->req, 0, r->len, r->row), 0);
    size_t from = r->len > window_now ? r->len - window_now : 0;
    for (uint32_t l = 0; l < LAYERS; l++)
        REQUIRE(s, layer_is(e, l, r->row, t, is_full(l) ? 0 : from, r->len));
    return 0;
}

static int extend(const struct harness_run *s, kvt_engine *e, struct run *r, size_t to)
{
    uint32_t pl = (uint32_t)r->len, sl = (uint32_t)to;
    int32_t last = r->len ? r->row[r->len - 1] : -1;
    int rc;

    if (to <= r->len)
        return 0;
    if ((rc = kvt_alloc_extend(e, 1, &pl, &sl, &last, r->row + r->len, to - r->len)))
        return rc;
    EXPECT_RC(s, kvt_req_write(e, &r->req, r->len, r->row + r->len, to - r->len), 0);
    write_kv(e, r->row, r->t, r->len, to);
    r->len = to;
    return 0;
}

static void finish(const struct harness_run *s, kvt_engine *e, struct run *r)
{
    struct kvt_key key = {.tokens = r->t, .len = r->len};

    EXPECT_RC(s, kvt_req_cache_finished(e, &r->req, &key, 0, 1), 0);
}

static void tokens_of(uint32_t *t, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)i;
}

/* ---- tests ---- */

/* Sliding-window layers go through the map; the window moving on frees their KV (reads say
 * -ENOENT, nothing moved) while the full layers keep theirs. */
static void test_kv_through_the_map(void **state)
{
    (void)state;
    kvt_engine *e = open_swa(WINDOW, 0);
    uint32_t t[64];
    struct run r;
    int32_t swa[64];
    uint8_t k[ROW], v[ROW];

    tokens_of(t, 64, 1);
    assert_int_equal(begin(&plain, e, &r, t, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 40), 0);
    for (uint32_t l = 0; l < LAYERS; l++)
        assert_true(layer_is(e, l, r.row, t, 0, 40));
    assert_int_equal(kvt_swa_translate(e, r.row, 40, swa), 0);
    for (size_t i = 0; i < 40; i++)
        assert_true(swa[i] > 0);

    /* 40 tokens, window 8: tokens below 32 have left it. */
    assert_int_equal(kvt_req_swa_slide(e, &r.req, 40), 0);
    assert_int_equal(kvt_swa_translate(e, r.row, 40, swa), 0);
    for (size_t i = 0; i < 40; i++)
        assert_true((swa[i] == 0) == (i < 32));
    assert_int_equal(kvt_kv_read(e, 0, r.row + 31, 1, k, v), -ENOENT);
    assert_int_equal(kvt_kv_write(e, 2, r.row + 5, 1, k, v), -ENOENT);
    assert_true(layer_is(e, 0, r.row, t, 32, 40));
    assert_true(layer_is(e, 1, r.row, t, 0, 40));
    assert_true(layer_is(e, 3, r.row, t, 0, 40));
    assert_int_equal(kvt_req_swa_slide(e, &r.req, 41), -EINVAL); /* past the row */
    assert_int_equal(kvt_req_swa_slide(e, &r.req, 40), 0);       /* nothing more */

    struct kvt_stats st = {.size = sizeof(st)};
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.swa_released_tokens, 32);
    assert_int_equal(st.swa_tokens, 408); /* 0.8 x 512, in whole pages */

    void *p0, *p1;
    size_t rb0, rb1;
    assert_int_equal(kvt_kv_buffer(e, 0, 0, &p0, &rb0), 0);
    assert_int_equal(kvt_kv_buffer(e, 1, 0, &p1, &rb1), 0);
    assert_ptr_not_equal(p0, p1);
    assert_int_equal(rb0, ROW);
    assert_int_equal(kvt_kv_buffer(e, LAYERS, 0, &p0, &rb0), -EINVAL);
    finish(&plain, e, &r);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* A request cached after its window moved on leaves SWA tombstones below the window: the same
 * prefix is served whole (its last window is live); a prefix ending among the tombstones is
 * served only as far as a live window reaches (here nothing). */
static void test_tombstones_and_match(void **state)
{
    (void)state;
    kvt_engine *e = open_swa(WINDOW, 0);
    uint32_t a[64], b[64];
    struct run r;

    tokens_of(a, 64, 1);
    assert_int_equal(begin(&plain, e, &r, a, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 64), 0);
    assert_int_equal(kvt_req_swa_slide(e, &r.req, 64), 0);
    finish(&plain, e, &r);
    CHECK_ENGINE(&plain, e);

    struct kvt_stats st = {.size = sizeof(st)};
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.cached_tokens, 64);
    assert_int_equal(st.swa_cached_tokens, 8); /* tokens 56..63 */

    assert_int_equal(begin(&plain, e, &r, a, 64), 0);
    assert_int_equal(r.req.protected_len, 64);
    r.len = 64;
    finish(&plain, e, &r);

    memcpy(b, a, sizeof(b));
    b[40] ^= 1; /* shares 40 tokens, all below the live window */
    assert_int_equal(begin(&plain, e, &r, b, 64), 0);
    assert_int_equal(r.req.protected_len, 0);
    struct kvt_match m;
    struct kvt_key key = {.tokens = b, .len = 64};
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len, 0);
    /* It recomputes and caches its own prefix with a live window at its end. */
    assert_int_equal(extend(&plain, e, &r, 48), 0);
    finish(&plain, e, &r);
    assert_int_equal(begin(&plain, e, &r, b, 48), 0);
    assert_int_equal(r.req.protected_len, 48);
    finish(&plain, e, &r);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_true(st.swa_kv_hit_tokens > st.match_hit_tokens);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* A small SWA pool: a request short of SWA slots evicts cached SWA KV alone (least recently
 * used first), leaving SWA tombstones whose full KV is still cached; when nothing can be
 * evicted the allocation is -ENOMEM and nothing changed. */
static void test_swa_pressure(void **state)
{
    (void)state;
    kvt_engine *e = open_swa(WINDOW, 96);
    uint32_t a[96], b[96];
    struct run r1, r2;
    struct kvt_stats st = {.size = sizeof(st)};

    tokens_of(a, 96, 1);
    tokens_of(b, 96, 5000);
    assert_int_equal(begin(&plain, e, &r1, a, 0), 0);
    assert_int_equal(extend(&plain, e, &r1, 64), 0);
    finish(&plain, e, &r1); /* 64 tokens cached, all with SWA KV */
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.swa_cached_tokens, 64);
    assert_int_equal(kvt_available(e), 32); /* the SWA side is the short one */

    assert_int_equal(begin(&plain, e, &r2, b, 0), 0);
    assert_int_equal(extend(&plain, e, &r2, 80), 0); /* needs 48 SWA slots more */
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_true(st.swa_evicted_tokens >= 48);
    assert_int_equal(st.cached_tokens, 64); /* full KV stays */
    CHECK_ENGINE(&plain, e);

    /* 16 SWA slots left free at most, and r2 locks nothing cached: a's SWA KV is all that
     * can go; asking for more than that and the free is -ENOMEM with nothing evicted. */
    uint64_t before = st.swa_evicted_tokens;
    uint32_t pl = 80, sl = 80 + 96;
    int32_t last = r2.row[79];
    assert_int_equal(kvt_alloc_extend(e, 1, &pl, &sl, &last, r2.row + 80, 96), -ENOMEM);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.swa_evicted_tokens, before);
    finish(&plain, e, &r2);

    /* a's first pages are SWA tombstones now: its prefix is served where a window is live. */
    assert_int_equal(begin(&plain, e, &r1, a, 64), 0);
    assert_true(r1.req.protected_len < 64);
    finish(&plain, e, &r1);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* kvt_evict makes kvt_available grow by what was asked: when only the SWA side is short, by
 * freeing SWA KV alone (SWA tombstones) and keeping the full KV. */
static void test_evict_frees_both(void **state)
{
    (void)state;
    kvt_engine *e = open_swa(WINDOW, 96);
    uint32_t a[96];
    struct run r;
    struct kvt_stats st = {.size = sizeof(st)};
    size_t evicted = 0;

    tokens_of(a, 96, 1);
    for (size_t len = 32; len <= 64; len += 32) { /* two nodes of 32 tokens */
        assert_int_equal(begin(&plain, e, &r, a, len), 0);
        assert_int_equal(extend(&plain, e, &r, len), 0);
        finish(&plain, e, &r);
    }
    assert_int_equal(kvt_available(e), 32);
    /* Only the SWA side is short: SWA KV goes alone (a node's whole SWA part, 32 tokens, for
     * the 16 asked), the full KV stays; then the full side too. */
    assert_int_equal(kvt_evict(e, 16, &evicted), 0);
    assert_int_equal(evicted, 0);
    assert_int_equal(kvt_available(e), 32 + 32);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.cached_tokens, 64);
    assert_int_equal(st.swa_cached_tokens, 32);
    CHECK_ENGINE(&plain, e);
    assert_int_equal(kvt_evict(e, 512, &evicted), 0);
    assert_int_equal(evicted, 64);
    assert_int_equal(kvt_available(e), 96);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* SGLang's RecoverEvictedSWA: a request that recomputes a prefix whose SWA KV the cache
 * evicted gives its own fresh SWA KV to those tombstones when it caches its key, and the next
 * request on that prefix is served whole (begin checks the window's bytes). */
static void test_revive(void **state)
{
    (void)state;
    kvt_engine *e = open_swa(WINDOW, 96);
    uint32_t a[96];
    struct run r;
    struct kvt_stats st = {.size = sizeof(st)};

    tokens_of(a, 96, 1);
    assert_int_equal(begin(&plain, e, &r, a, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 64), 0);
    finish(&plain, e, &r);
    assert_int_equal(kvt_evict(e, 32, NULL), 0); /* the SWA side is short: a's window goes */
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.cached_tokens, 64);
    assert_int_equal(st.swa_cached_tokens, 0);

    assert_int_equal(begin(&plain, e, &r, a, 64), 0);
    assert_int_equal(r.req.protected_len, 0);
    assert_int_equal(extend(&plain, e, &r, 64), 0);
    finish(&plain, e, &r);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.swa_revived_tokens, 64);
    assert_int_equal(st.swa_cached_tokens, 64);
    CHECK_ENGINE(&plain, e);

    assert_int_equal(begin(&plain, e, &r, a, 64), 0);
    assert_int_equal(r.req.protected_len, 64);
    finish(&plain, e, &r);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

static void test_options(void **state)
{
    (void)state;
    struct kvt_options o;
    kvt_engine *e = NULL, *f = NULL;
    static const uint32_t dup[] = {1, 1}, out[] = {1, 4}, all[] = {0, 1, 2, 3};
    uint8_t f1[32], f2[32];

    swa_options(&o, 0, 0); /* layers named without a window */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    swa_options(&o, WINDOW, 0);
    o.swa.nfull = 0;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    swa_options(&o, WINDOW, 0);
    o.swa.full_layers = dup;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    o.swa.full_layers = out;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    o.swa.full_layers = all;
    o.swa.nfull = 4; /* no sliding-window layer left */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    swa_options(&o, WINDOW, 0);
    o.mamba = (struct kvt_mamba){
        .layers = 1, .conv_bytes = 8, .ssm_bytes = 8, .chunk = 64, .track_interval = 256};
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    assert_null(e);
    /* Window copies are kept a page at a time: no store page of several. */
    swa_options(&o, WINDOW, 0);
    o.store_page_tokens = 2 * o.page_size;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    o.store_page_tokens = o.page_size;
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_close(e);
    e = NULL;

    /* The window and the full layers are in the fingerprint; a plain engine's is unchanged. */
    swa_options(&o, WINDOW, 0);
    uint32_t ids[] = {1, 3};
    o.swa.full_layers = ids;
    assert_int_equal(kvt_open(&o, &e), 0);
    ids[0] = 0; /* copied at open */
    kvt_fingerprint(e, f1);
    o.swa.window = WINDOW * 2;
    assert_int_equal(kvt_open(&o, &f), 0);
    kvt_fingerprint(f, f2);
    assert_memory_not_equal(f1, f2, 32);
    kvt_close(f);
    o.swa.window = WINDOW; /* ids now {0, 3} */
    assert_int_equal(kvt_open(&o, &f), 0);
    kvt_fingerprint(f, f2);
    assert_memory_not_equal(f1, f2, 32);
    kvt_close(f);
    o.swa = (struct kvt_swa){0};
    assert_int_equal(kvt_open(&o, &f), 0);
    kvt_fingerprint(f, f2);
    assert_memory_not_equal(f1, f2, 32);
    assert_int_equal(kvt_req_swa_slide(f, &(struct kvt_req){0}, 0), -EINVAL);
    int32_t s0 = 4, t0;
    assert_int_equal(kvt_swa_translate(f, &s0, 1, &t0), -EINVAL);
    kvt_close(f);
    /* An older caller's options end before swa: no sliding-window layers. */
    swa_options(&o, WINDOW, 0);
    o.size = offsetof(struct kvt_options, swa);
    assert_int_equal(kvt_open(&o, &f), 0);
    kvt_fingerprint(f, f1);
    assert_memory_equal(f1, f2, 32);
    kvt_close(f);
    kvt_close(e);
}

/* A load-back takes SWA pages for the window it brings, not for the whole prefix: bringing
 * back a long prompt whose host copy holds only its last window evicts no SWA KV while the
 * SWA pool has room for that window. */
static void test_load_room_is_the_window(void **state)
{
    (void)state;
    uint32_t a[96], b[64];
    struct run r;
    struct kvt_stats st = {.size = sizeof(st)}, st2 = {.size = sizeof(st2)};
    kvt_engine *e = open_swa_host(WINDOW, 128, 2048, KVT_WRITE_THROUGH, 1);

    tokens_of(a, 96, 1);
    tokens_of(b, 64, 5000);
    assert_int_equal(begin(&plain, e, &r, a, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 96), 0);
    assert_int_equal(kvt_req_swa_slide(e, &r.req, 96), 0); /* [0, 88) tombstones */
    finish(&plain, e, &r);
    assert_int_equal(kvt_sync(e), 0);
    size_t evicted = 0;
    assert_int_equal(kvt_evict(e, 512, &evicted), 0); /* a leaves the device for the host */
    assert_int_equal(evicted, 96);
    /* b (16 SWA pages) and a prompt after its first 16 tokens (12): of the SWA pool's 32
     * pages, 4 stay free. */
    assert_int_equal(begin(&plain, e, &r, b, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 64), 0);
    finish(&plain, e, &r);
    assert_int_equal(begin(&plain, e, &r, b + 16, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 48), 0);
    finish(&plain, e, &r);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.swa_free_tokens, 16);

    assert_int_equal(begin(&plain, e, &r, a, 96), 0); /* 24 pages, 2 of them paired */
    assert_int_equal(r.req.protected_len, 96);
    assert_int_equal(r.req.loaded_len, 96);
    assert_int_equal(kvt_stats(e, &st2), 0);
    assert_int_equal(st2.swa_evicted_tokens, st.swa_evicted_tokens);
    assert_int_equal(st2.swa_free_tokens, 8);
    finish(&plain, e, &r);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);
}

/* Flip bytes of the disk page (under its own key, not a window copy: those have no tokens)
 * holding tokens[0..PS), so that a read of it fails its check. */
struct page_flip {
    const uint32_t *tokens;
    const char *dir;
    uint32_t slot_bytes;
    int done;
};

static int flip_page(void *arg, const struct dstore_entry *en)
{
    struct page_flip *f = arg;
    char path[512];

    if (en->status || en->ntokens != PS || memcmp(en->tokens, f->tokens, PS * 4))
        return 0;
    snprintf(path, sizeof(path), "%s/slabs/%04u.slab", f->dir, en->slab);
    uint64_t off = SLAB_HEAD_BYTES + (uint64_t)en->slot * f->slot_bytes + 100;
    assert_int_equal(fixture_flip_bytes(path, off, 16), 0);
    f->done++;
    return 0;
}

static void flip_disk_page(kvt_engine *e, const char *dir, const uint32_t *tokens)
{
    struct dstore *ds = store_disk_dstore(e->store);
    struct page_flip f = {.tokens = tokens, .dir = dir};
    struct dstore_stats st;

    dstore_stats(ds, &st);
    f.slot_bytes = st.slot_bytes;
    assert_int_equal(dstore_iterate(ds, flip_page, &f), 0);
    assert_int_equal(f.done, 1);
}

/* A window copy below: a prompt cached after its window moved on is written to disk with the
 * window copies of its last window's pages; a restarted engine (an empty tree) serves the
 * prompt whole from disk, the sliding-window rows of its last window included, read from the
 * window copies (the last page's own copy is damaged here: the fill does not read it), and
 * serves nothing of a prefix of it whose last window has no copies. */
static void test_disk_restart(void **state)
{
    (void)state;
    char dir[256];
    struct kvt_options o;
    kvt_engine *e = NULL;
    uint32_t a[64];
    struct run r;
    struct kvt_stats st = {.size = sizeof(st)};

    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "swa-disk"), 0);
    swa_options(&o, WINDOW, 0);
    o.host_ratio = 2.0;
    o.write_policy = KVT_WRITE_THROUGH;
    o.disk_write_policy = KVT_DISK_WRITE_THROUGH;
    o.disk_dir = dir;
    o.disk_bytes = 8 << 20;
    o.prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE;
    assert_int_equal(kvt_open(&o, &e), 0);
    tokens_of(a, 64, 1);
    assert_int_equal(begin(&plain, e, &r, a, 0), 0);
    assert_int_equal(extend(&plain, e, &r, 64), 0);
    assert_int_equal(kvt_req_swa_slide(e, &r.req, 64), 0); /* [0, 56) tombstones */
    finish(&plain, e, &r);
    assert_int_equal(kvt_sync(e), 0);
    CHECK_ENGINE(&plain, e);
    kvt_close(e);

    assert_int_equal(kvt_open(&o, &e), 0);
    window_now = WINDOW;
    flip_disk_page(e, dir, a + 60);
    assert_int_equal(begin(&plain, e, &r, a, 48), 0); /* [40, 48) has no window below */
    assert_int_equal(r.req.protected_len, 0);
    finish(&plain, e, &r);
    assert_int_equal(begin(&plain, e, &r, a, 64), 0); /* checks full and window rows */
    assert_int_equal(r.req.protected_len, 64);
    assert_int_equal(r.req.loaded_len, 64);
    assert_int_equal(r.req.disk_len, 64);
    finish(&plain, e, &r);
    CHECK_ENGINE(&plain, e);
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_int_equal(st.disk_hit_tokens, 64);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* ---- randomized ---- */

#define NPROMPT 5

static uint64_t revived;     /* SWA tombstones the randomized runs saw revived */
static uint64_t host_loaded; /* tokens they served loaded back from the host */

/* The figures of an engine about to close, added to those of the engines before it. */
struct totals {
    uint64_t match_hit, swa_kv_hit, released, evicted, loaded, backed_up, disk_hit, revived;
};

static void absorb(kvt_engine *e, struct totals *t)
{
    struct kvt_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_stats(e, &st), 0);
    t->match_hit += st.match_hit_tokens;
    t->swa_kv_hit += st.swa_kv_hit_tokens;
    t->released += st.swa_released_tokens;
    t->evicted += st.swa_evicted_tokens;
    t->loaded += st.loaded_tokens;
    t->backed_up += st.backed_up_tokens;
    t->disk_hit += st.disk_hit_tokens;
    t->revived += st.swa_revived_tokens;
}

static uint64_t disk_served; /* tokens the randomized runs served from disk */

/* host: 0 the device alone; 1 a host tier written through, serial copies; 2 one written
 * back on eviction, copies on the transfer engine's threads; 3 a host tier and a disk tier
 * under it, both written through, the engine closed and reopened on the same dir thrice. */
static kvt_engine *open_random(uint32_t window, int host, const char *dir)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    if (host < 3)
        return host ? open_swa_host(window, 200, 2048,
                                    host == 1 ? KVT_WRITE_THROUGH : KVT_WRITE_BACK, host == 1)
                    : open_swa(window, 200);
    swa_options(&o, window, 200);
    o.host_tokens = 2048;
    o.write_policy = KVT_WRITE_THROUGH;
    o.disk_write_policy = KVT_DISK_WRITE_THROUGH;
    o.prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE;
    o.disk_dir = dir;
    o.disk_bytes = 16 << 20;
    assert_int_equal(kvt_open(&o, &e), 0);
    window_now = window;
    return e;
}

static void run_random(uint64_t seed, uint32_t window, int host)
{
    char cfg[64], dir[256] = "";
    snprintf(cfg, sizeof(cfg), "window=%u host=%d", window, host);
    struct harness_run s = {.prog = "test_engine_swa", .config = cfg, .seed = seed};
    uint64_t rng = seed;
    uint32_t prompts[NPROMPT][CTX];
    if (host == 3)
        assert_int_equal(fixture_data_dir(dir, sizeof(dir), "swa-random"), 0);
    kvt_engine *e = open_random(window, host, dir);
    uint64_t loaded = 0, disk = 0;
    struct run *live = calloc(3, sizeof(*live));
    int nlive = 0;
    uint64_t served = 0;
    struct totals tot = {0};

    assert_non_null(live);
    for (int p = 0; p < NPROMPT; p++) {
        tokens_of(prompts[p], CTX, 1);
        for (size_t i = (size_t)(rng_next(&rng) % 160); i < CTX; i++)
            prompts[p][i] = (uint32_t)(1000 * (p + 1) + i);
    }
    for (s.step = 0; s.step < 800; s.step++) {
        uint64_t op = rng_next(&rng) % 10;
        if (host == 3 && s.step && s.step % 200 == 0) {
            s.op = "reopen";
            while (nlive > 0) {
                nlive--;
                finish(&s, e, &live[nlive]);
            }
            EXPECT_RC(&s, kvt_sync(e), 0);
            CHECK_ENGINE(&s, e);
            absorb(e, &tot);
            kvt_close(e);
            e = open_random(window, host, dir);
        } else if (op < 3 && nlive < 3) {
            s.op = "begin";
            int rc = begin(&s, e, &live[nlive], prompts[rng_next(&rng) % NPROMPT],
                           1 + rng_next(&rng) % 200);
            EXPECT_RC(&s, rc, 0);
            served += live[nlive].req.protected_len;
            loaded += live[nlive].req.loaded_len;
            disk += live[nlive].req.disk_len;
            nlive++;
        } else if (op < 7 && nlive) {
            s.op = "forward";
            struct run *r = &live[rng_next(&rng) % (uint64_t)nlive];
            size_t to = r->len + 1 + rng_next(&rng) % 40;
            if (to > 220)
                continue;
            int rc = extend(&s, e, r, to);
            if (rc == -ENOMEM)
                continue;
            EXPECT_RC(&s, rc, 0);
            if (rng_next(&rng) % 2)
                EXPECT_RC(&s, kvt_req_swa_slide(e, &r->req, r->len), 0);
            if (rng_next(&rng) % 4 == 0) {
                struct kvt_key key = {.tokens = r->t, .len = r->len};
                s.op = "cache_unfinished";
                EXPECT_RC(&s, kvt_req_cache_unfinished(e, &r->req, &key), 0);
                EXPECT_RC(&s, kvt_req_read(e, &r->req, 0, r->len, r->row), 0);
            }
        } else if (op < 9 && nlive) {
            s.op = "finish";
            int i = (int)(rng_next(&rng) % (uint64_t)nlive);
            finish(&s, e, &live[i]);
            live[i] = live[--nlive];
        } else {
            s.op = "evict";
            kvt_evict(e, (rng_next(&rng) % 8) * PS, NULL);
        }
        CHECK_ENGINE(&s, e);
    }
    while (nlive > 0) {
        nlive--;
        finish(&s, e, &live[nlive]);
    }
    CHECK_ENGINE(&s, e);
    absorb(e, &tot);
    REQUIRE(&s, served > 0 && tot.match_hit == served);
    REQUIRE(&s, tot.swa_kv_hit >= tot.match_hit);
    REQUIRE(&s, tot.released > 0 && tot.evicted > 0);
    /* With a host tier, prefixes were served from it, windows included. */
    REQUIRE(&s, !host || (loaded > 0 && tot.loaded >= loaded && tot.backed_up > 0));
    REQUIRE(&s, tot.disk_hit >= disk);
    revived += tot.revived;
    host_loaded += loaded;
    disk_served += disk;
    free(live);
    kvt_close(e);
    if (host == 3)
        fixture_remove_tree(dir);
}

static void test_random(void **state)
{
    (void)state;
    const char *env = getenv("KVT_SEED");
    static const uint32_t windows[] = {3, 4, 8, 13};

    for (int host = 0; host <= 3; host++)
        for (size_t w = 0; w < sizeof(windows) / sizeof(windows[0]); w++) {
            if (env) {
                run_random(strtoull(env, NULL, 0), windows[w], host);
                continue;
            }
            for (uint64_t seed = 1; seed <= 4; seed++)
                run_random(seed, windows[w], host);
        }
    assert_true(env || (revived > 0 && host_loaded > 0 && disk_served > 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_through_the_map),
        cmocka_unit_test(test_tombstones_and_match),
        cmocka_unit_test(test_swa_pressure),
        cmocka_unit_test(test_evict_frees_both),
        cmocka_unit_test(test_revive),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_disk_restart),
        cmocka_unit_test(test_load_room_is_the_window),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
