#include "engine_test.h"

/* ---- the request lifecycle across cache and allocator, and bad calls ---- */

void test_insert_ownership(void **state)
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

void test_finished(void **state)
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
void test_duplicates(void **state)
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
void test_unfinished(void **state)
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

void test_request_errors(void **state)
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
void test_release_empty(void **state)
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

void test_bad_calls(void **state)
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
void test_alloc_enomem_keeps_cache(void **state)
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
void test_alloc_extend_evicts_own_prefix(void **state)
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
void test_finished_frees_row(void **state)
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
void test_stale_request(void **state)
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

void test_kv_data(void **state)
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
