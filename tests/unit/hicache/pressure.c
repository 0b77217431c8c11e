#include "hicache_test.h"

/* ---- focused tests: device pressure, closing busy, sizing and bad input ---- */

void test_device_pressure(void **state)
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
void test_ref_dies_with_device_copy(void **state)
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
void test_load_back_no_room(void **state)
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
void test_pressure_waits_for_load(void **state)
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
void test_close_busy(void **state)
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
void test_unfinished_pending_load(void **state)
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
void test_host_sizing(void **state)
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

void test_bad_input(void **state)
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
void test_no_host(void **state)
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
