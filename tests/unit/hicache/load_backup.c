#include "hicache_test.h"

/* ---- focused tests: loads layer by layer and pending, backups by each write policy ---- */

/* A load lands layer by layer: after waiting for layer 0, its rows are right while the op as
 * a whole is not done yet (layer 1 is 200 ms behind). */
void test_layer_wait(void **state)
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
void test_match_pending_load(void **state)
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
void test_write_through(void **state)
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
void test_selective(void **state)
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
void test_write_back(void **state)
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
void test_load_back_min(void **state)
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
