/* EAGLE bigram keys (options.key_bigram): a key of n tokens names n - 1 positions, position i
 * standing for the pair (token i, token i + 1). A cached position matches only while the next
 * token matches too; keys with another first token share nothing; every length counts
 * positions; the first token rides in the namespace, so the tiers below (host, disk across a
 * restart) find the pages as they do any other's. A randomized run compares every match with
 * a brute force over the pairs inserted. */
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
#include "engine_fixture.h"
#include "rng.h"

#define PS 4

static kvt_engine *open_bigram(int bigram, const char *dir)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    fixture_engine_options(&o, 2, 4);
    o.device_tokens = 1024; /* the random test's keys all fit: nothing is evicted */
    o.key_bigram = (uint32_t)bigram;
    if (dir) {
        o.host_tokens = 2048;
        o.disk_dir = dir;
        o.disk_bytes = 1 << 20;
        o.store_page_tokens = o.page_size; /* a store page to a page */
    }
    assert_int_equal(kvt_open(&o, &e), 0);
    return e;
}

/* A request on key t[0..n): begin, fill its positions (n - 1 with bigram keys) with slots,
 * finish (inserting). Returns the positions it found cached. */
static size_t serve(kvt_engine *e, const uint32_t *t, size_t n, int bigram)
{
    struct kvt_key key = {.tokens = t, .len = n};
    struct kvt_req r;
    int32_t row[64];
    size_t pos = bigram && n ? n - 1 : n;

    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    size_t hit = r.protected_len;
    if (pos > hit) {
        uint32_t pl = (uint32_t)hit, sl = (uint32_t)pos;
        int32_t last = -1;
        if (hit)
            assert_int_equal(kvt_req_read(e, &r, hit - 1, 1, &last), 0);
        assert_int_equal(kvt_alloc_extend(e, 1, &pl, &sl, &last, row, pos - hit), 0);
        assert_int_equal(kvt_req_write(e, &r, hit, row, pos - hit), 0);
    }
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, 1), 0);
    return hit;
}

static size_t match_len(kvt_engine *e, const uint32_t *t, size_t n)
{
    struct kvt_key key = {.tokens = t, .len = n};
    struct kvt_match m;

    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    return m.device_len;
}

static void test_pairs(void **state)
{
    (void)state;
    kvt_engine *e = open_bigram(1, NULL), *plain = open_bigram(0, NULL);
    uint32_t a[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b[9], c[9];

    /* 9 tokens are 8 positions: two pages. */
    assert_int_equal(serve(e, a, 9, 1), 0);
    assert_int_equal(match_len(e, a, 9), 8);
    assert_int_equal(serve(plain, a, 8, 0), 0);
    /* b differs at its last token: its 8th pair differs, so 7 positions match, one page. */
    memcpy(b, a, sizeof(b));
    b[8] = 99;
    assert_int_equal(match_len(e, b, 9), 4);
    assert_int_equal(match_len(plain, b, 8), 8); /* plain keys cannot see it */
    /* Another first token shares nothing, however much follows is equal. */
    memcpy(c, a, sizeof(c));
    c[0] = 5;
    assert_int_equal(match_len(e, c, 9), 0);
    /* Lengths count positions: a request on a's 9 tokens is served 8. */
    assert_int_equal(serve(e, a, 9, 1), 8);

    /* A single token names no position; max_context + 1 tokens are max_context positions. */
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &(struct kvt_key){.tokens = a, .len = 1}, NULL, &m), -EINVAL);
    uint32_t lng[66];
    for (size_t i = 0; i < 66; i++)
        lng[i] = (uint32_t)i + 1;
    assert_int_equal(kvt_match(e, &(struct kvt_key){.tokens = lng, .len = 65}, NULL, &m), 0);
    assert_int_equal(kvt_match(e, &(struct kvt_key){.tokens = lng, .len = 66}, NULL, &m), -EINVAL);
    /* The caller's namespace limit is as without bigrams. */
    uint8_t ns[KVT_NS_MAX + 1] = {0};
    struct kvt_key k = {.tokens = a, .len = 9, .ns = ns, .ns_len = KVT_NS_MAX};
    assert_int_equal(kvt_match(e, &k, NULL, &m), 0);
    assert_int_equal(m.device_len, 0); /* a namespace of its own */
    k.ns_len = KVT_NS_MAX + 1;
    assert_int_equal(kvt_match(e, &k, NULL, &m), -EINVAL);

    char why[256];
    assert_int_equal(engine_check(e, why, sizeof(why)), 0);
    kvt_close(e);
    kvt_close(plain);
}

/* Through the host and disk tiers and a restart: the pages come back from disk. */
static void test_through_disk(void **state)
{
    (void)state;
    char dir[256];
    uint32_t a[17];

    for (size_t i = 0; i < 17; i++)
        a[i] = 7 * (uint32_t)i + 3;
    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "bigram"), 0);
    kvt_engine *e = open_bigram(1, dir);
    assert_int_equal(serve(e, a, 17, 1), 0);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);
    e = open_bigram(1, dir);
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &(struct kvt_key){.tokens = a, .len = 17}, NULL, &m), 0);
    assert_int_equal(m.device_len + m.host_len + m.disk_len, 16);
    assert_int_equal(m.disk_len, 16);
    a[16]++; /* the last pair differs: the last page does not match */
    assert_int_equal(kvt_match(e, &(struct kvt_key){.tokens = a, .len = 17}, NULL, &m), 0);
    assert_int_equal(m.disk_len, 12);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* Random keys over a small alphabet against a brute force: the longest common prefix in
 * pairs with any key inserted, in whole pages. */
static void test_random(void **state)
{
    (void)state;
    kvt_engine *e = open_bigram(1, NULL);
    uint32_t keys[40][20];
    size_t lens[40], n = 0;
    uint64_t rng = 42;

    for (int step = 0; step < 200; step++) {
        uint32_t t[20];
        size_t len = 2 + rng_next(&rng) % 18;
        for (size_t i = 0; i < len; i++)
            t[i] = (uint32_t)(rng_next(&rng) % 3);
        size_t want = 0;
        for (size_t k = 0; k < n; k++) {
            size_t p = 0; /* pairs in common */
            while (p + 1 < len && p + 1 < lens[k] && keys[k][p] == t[p] &&
                   keys[k][p + 1] == t[p + 1])
                p++;
            p = p / PS * PS;
            want = p > want ? p : want;
        }
        assert_int_equal(match_len(e, t, len), want);
        if (n < 40 && rng_next(&rng) % 2) {
            serve(e, t, len, 1);
            memcpy(keys[n], t, len * sizeof(*t));
            lens[n++] = len;
        }
    }
    char why[256];
    assert_int_equal(engine_check(e, why, sizeof(why)), 0);
    kvt_close(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pairs),
        cmocka_unit_test(test_through_disk),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
