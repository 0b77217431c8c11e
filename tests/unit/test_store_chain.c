/*
 * A chain of stores (src/store/chain.h) beyond the contract every store passes
 * (test_store_contract has a chain row): each run is read from the nearest store holding its
 * first page, runs are put together across stores, a page that fails its check in the store read is
 * a miss and never another store's bytes, a write counts when any store kept it, and a chain of
 * mismatched stores is refused. Two mem stores, so each store's share can be counted; one
 * of them posing as remote (ops->remote) for the split the tier above counts by: reads' leading
 * pages and writes' kept pages by kind (store_done), a leading run's remote part (run_remote),
 * and errors (store_stats).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "store/chain.h"
#include "store/mem.h"

#define PAGE_BYTES 512
#define PAGE_TOKENS 4
#define MAXP 32

static void key_of(uint32_t i, uint8_t key[STORE_KEY_BYTES])
{
    memset(key, 0, STORE_KEY_BYTES);
    memcpy(key, &i, sizeof(i));
    key[31] = 0x5a;
}

static void bytes_of(uint32_t i, uint8_t *buf)
{
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull;

    for (size_t b = 0; b < PAGE_BYTES; b++) {
        z ^= z >> 31;
        z *= 0xBF58476D1CE4E5B9ull;
        buf[b] = (uint8_t)(z >> 56);
    }
}

/* Fails every write with err when err is set. */
struct faults {
    int err;
    struct store_mem_faults hooks;
};

static int fail_writes(void *arg, enum store_op_kind kind, const uint8_t *key)
{
    const struct faults *f = arg;

    (void)key;
    return kind == STORE_OP_WRITE ? f->err : 0;
}

static struct kvt_store *mem(uint64_t capacity, struct faults *f)
{
    struct store_mem_options o = {.page_bytes = PAGE_BYTES,
                                  .page_tokens = PAGE_TOKENS,
                                  .capacity_pages = capacity,
                                  .faults = f ? &f->hooks : NULL};
    struct kvt_store *s = NULL;

    if (f)
        f->hooks = (struct store_mem_faults){fail_writes, f};
    assert_int_equal(store_mem_open(&o, &s), 0);
    return s;
}

static struct kvt_store *chain2(struct kvt_store *a, struct kvt_store *b)
{
    struct kvt_store *s[2] = {a, b}, *c = NULL;

    assert_int_equal(store_chain_open(s, 2, &c), 0);
    return c;
}

static struct store_done last_done; /* put's and get's op, as the store reported it */

/* Write pages [first, first + n) to s; each page's result in res; the op's ok count. */
static uint32_t put(struct kvt_store *s, uint32_t first, uint32_t n, int *res)
{
    uint8_t keys[MAXP][STORE_KEY_BYTES], bufs[MAXP][PAGE_BYTES];
    struct store_wpage w[MAXP];
    struct store_done d;
    uint64_t op = 0;

    assert_true(n <= MAXP);
    for (uint32_t i = 0; i < n; i++) {
        key_of(first + i, keys[i]);
        bytes_of(first + i, bufs[i]);
        w[i] = (struct store_wpage){.key = keys[i], .buf = bufs[i]};
    }
    assert_int_equal(store_write(s, w, n, res, &op), 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    assert_int_equal(d.pages, n);
    last_done = d;
    return d.ok;
}

static void put_all(struct kvt_store *s, uint32_t first, uint32_t n)
{
    int res[MAXP];

    assert_int_equal(put(s, first, n, res), n);
}

/* Read the pages named in ids (n of them) through s: each page whose result is 0 must be
 * exact. *leading: what the read reported. */
static void get(struct kvt_store *s, const uint32_t *ids, uint32_t n, int *res, size_t *leading)
{
    uint8_t keys[MAXP][STORE_KEY_BYTES], want[PAGE_BYTES];
    struct store_rpage r[MAXP];
    struct store_done d;
    uint64_t op = 0;
    uint8_t(*got)[PAGE_BYTES] = calloc(MAXP, PAGE_BYTES);
    uint32_t ok = 0;

    assert_non_null(got);
    for (uint32_t i = 0; i < n; i++) {
        key_of(ids[i], keys[i]);
        r[i] = (struct store_rpage){.key = keys[i], .buf = got[i]};
    }
    assert_int_equal(store_read(s, r, n, res, &op, leading), 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    for (uint32_t i = 0; i < n; i++) {
        if (res[i])
            continue;
        bytes_of(ids[i], want);
        assert_memory_equal(got[i], want, PAGE_BYTES);
        ok++;
    }
    assert_int_equal(d.ok, ok);
    last_done = d;
    free(got);
}

static size_t run_of(struct kvt_store *s, const uint32_t *ids, uint32_t n)
{
    uint8_t keys[MAXP][STORE_KEY_BYTES];
    size_t run = 999;

    for (uint32_t i = 0; i < n; i++)
        key_of(ids[i], keys[i]);
    assert_int_equal(store_leading_run(s, &keys[0][0], n, &run), 0);
    return run;
}

static uint64_t pages_read(struct kvt_store *s)
{
    struct store_stats st;

    store_stats(s, &st);
    return st.bytes_read / PAGE_BYTES;
}

static void ids_from(uint32_t *ids, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ids[i] = first + i;
}

/* A small store before a big one: the small one kept the newest pages and serves them; a run
 * that starts where only the big one has pages is read from it whole. */
static void test_nearest_first(void **state)
{
    struct kvt_store *a = mem(8, NULL), *b = mem(64, NULL), *c = chain2(a, b);
    uint32_t ids[24];
    int res[24];
    size_t lead = 0;
    struct store_stats st;

    (void)state;
    put_all(c, 0, 24);
    store_stats(c, &st);
    assert_int_equal(st.pages, 24);
    assert_int_equal(st.capacity_pages, 64);
    ids_from(ids, 0, 24);
    assert_int_equal(run_of(c, ids, 24), 24);
    assert_int_equal(run_of(a, ids, 24), 0); /* the first pages left the small store */
    get(c, ids + 16, 8, res, &lead);
    assert_int_equal(lead, 8);
    assert_int_equal(pages_read(a), 8);
    assert_int_equal(pages_read(b), 0);
    /* A run starts in the big store: it reads the run whole. */
    get(c, ids, 24, res, &lead);
    assert_int_equal(lead, 24);
    for (uint32_t i = 0; i < 24; i++)
        assert_int_equal(res[i], 0);
    assert_int_equal(pages_read(a), 8);
    assert_int_equal(pages_read(b), 24);
    store_close(c);
}

/* Runs put together across stores; a page no store has is a miss that ends the leading pages,
 * and the pages after it are still read. */
static void test_runs_across_stores(void **state)
{
    struct kvt_store *a = mem(32, NULL), *b = mem(32, NULL), *c = chain2(a, b);
    uint32_t ids[14];
    int res[14];
    size_t lead = 0;

    (void)state;
    put_all(a, 0, 4);
    put_all(b, 4, 4);
    put_all(a, 8, 4);
    put_all(b, 13, 1);
    ids_from(ids, 0, 14);
    assert_int_equal(run_of(c, ids, 12), 12);
    assert_int_equal(run_of(c, ids, 14), 12);
    get(c, ids, 14, res, &lead);
    assert_int_equal(lead, 12);
    for (uint32_t i = 0; i < 14; i++)
        assert_int_equal(res[i], i == 12 ? -ENOENT : 0);
    assert_int_equal(pages_read(a), 8);
    assert_int_equal(pages_read(b), 5);
    store_close(c);
}

/* A page damaged in the store it is read from is a miss there, never served. */
static void test_damage_is_a_miss(void **state)
{
    struct kvt_store *a = mem(32, NULL), *b = mem(32, NULL), *c = chain2(a, b);
    uint8_t key[STORE_KEY_BYTES];
    uint32_t ids[4];
    int res[4];
    size_t lead = 0;

    (void)state;
    put_all(c, 0, 4);
    key_of(2, key);
    assert_int_equal(store_mem_damage(a, key), 0);
    ids_from(ids, 0, 4);
    get(c, ids, 4, res, &lead);
    assert_int_equal(res[2], KVT_ECORRUPT);
    assert_int_equal(lead, 2);
    assert_int_equal(res[0] | res[1] | res[3], 0);
    store_close(c);
}

/* A write counts when any store kept the page; when none did, the nearest store's error. */
static void test_write_results(void **state)
{
    struct faults fa = {0}, fb = {0};
    struct kvt_store *a = mem(32, &fa), *b = mem(32, &fb), *c = chain2(a, b);
    uint32_t ids[4];
    int res[4];
    size_t lead = 0;

    (void)state;
    fa.err = -ENOSPC;
    assert_int_equal(put(c, 0, 4, res), 4);
    ids_from(ids, 0, 4);
    assert_int_equal(run_of(a, ids, 4), 0);
    get(c, ids, 4, res, &lead);
    assert_int_equal(lead, 4);
    assert_int_equal(pages_read(b), 4);
    fb.err = -EIO;
    assert_int_equal(put(c, 10, 4, res), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i], -ENOSPC);
    store_close(c);
}

/* A store that says it has every page and takes reads, but cannot say how they ended. */
static int lost_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    (void)s, (void)keys;
    *run = n;
    return 0;
}

static int lost_read(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                     uint64_t *op, size_t *leading)
{
    (void)s, (void)pages, (void)n, (void)results; /* results never written */
    *op = 1;
    if (leading)
        *leading = n;
    return 0;
}

static size_t lost_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    (void)s, (void)done, (void)max;
    return 0;
}

static int lost_wait_for(struct kvt_store *s, uint64_t op, int timeout_ms, struct store_done *d)
{
    (void)s, (void)op, (void)timeout_ms, (void)d;
    return -EIO;
}

static void lost_stats(struct kvt_store *s, struct store_stats *st)
{
    (void)s;
    memset(st, 0, sizeof(*st));
}

static void lost_close(struct kvt_store *s)
{
    (void)s;
}

static const struct store_ops lost_ops = {.name = "lost",
                                          .leading_run = lost_run,
                                          .read = lost_read,
                                          .poll = lost_poll,
                                          .wait_for = lost_wait_for,
                                          .stats = lost_stats,
                                          .close = lost_close};

/* A store's op that ends in an error the chain cannot read results from: its pages fail,
 * whatever their result slots held before. */
static void test_lost_part_fails(void **state)
{
    struct kvt_store lost = {&lost_ops, PAGE_BYTES, PAGE_TOKENS}, *c = NULL, *one[1] = {&lost};
    uint8_t key[STORE_KEY_BYTES], buf[PAGE_BYTES];
    struct store_rpage r = {.key = key, .buf = buf};
    struct store_done d;
    uint64_t op = 0;
    int res = 0; /* looks like success unless the chain writes it */

    (void)state;
    key_of(1, key);
    assert_int_equal(store_chain_open(one, 1, &c), 0);
    assert_int_equal(store_read(c, &r, 1, &res, &op, NULL), 0);
    assert_int_equal(store_wait_for(c, op, -1, &d), 0);
    assert_int_equal(res, -EIO);
    assert_int_equal(d.ok, 0);
    store_close(c);
}

/* Bad chains are refused and the stores stay the caller's. */
/* A mem store that says it is remote: a copy of its ops with the flag set. */
static struct kvt_store *as_remote(struct kvt_store *s, struct store_ops *ops)
{
    *ops = *s->ops;
    ops->remote = true;
    s->ops = ops;
    return s;
}

static void expect_split(uint32_t near, uint32_t remote)
{
    assert_int_equal(last_done.split, 1);
    assert_int_equal(last_done.near_ok, near);
    assert_int_equal(last_done.remote_ok, remote);
}

/* Which kind of store served each page, as the tier above counts disk and remote apart. */
static void test_remote_split(void **state)
{
    struct store_ops remote_ops;
    struct faults f = {0};
    struct kvt_store *a = mem(32, &f), *b = as_remote(mem(32, NULL), &remote_ops);
    struct kvt_store *c = chain2(a, b);
    struct store_stats st;
    uint32_t ids[14];
    int res[14];

    (void)state;
    put_all(a, 0, 4);
    put_all(b, 4, 4);
    put_all(a, 8, 4);
    put_all(b, 13, 1);
    ids_from(ids, 0, 14);
    /* The run: 4 near, 4 remote, 4 near; run_remote answers for its first pages. */
    assert_int_equal(run_of(c, ids, 14), 12);
    assert_int_equal(store_run_remote(c, 3), 0);
    assert_int_equal(store_run_remote(c, 6), 2);
    assert_int_equal(store_run_remote(c, 12), 4);
    assert_int_equal(store_run_remote(c, 20), 4);
    assert_int_equal(store_run_remote(a, 5), 0); /* one store: all of its own kind */
    assert_int_equal(store_run_remote(b, 5), 5);
    /* Of the leading pages read (12: page 12 is a miss), by kind; page 13 is past them. */
    get(c, ids, 14, res, NULL);
    expect_split(8, 4);
    /* Writes: kept by both, then by the remote alone (the near one failing). */
    put_all(c, 20, 3);
    expect_split(3, 3);
    f.err = -EIO;
    put_all(c, 23, 2);
    expect_split(0, 2);
    store_stats(c, &st);
    assert_int_equal(st.remote_errors, 0); /* a mem store counts no errors of a remote kind */
    store_close(c);
}

static void test_open_refuses(void **state)
{
    struct store_mem_options o = {
        .page_bytes = PAGE_BYTES + 1, .page_tokens = PAGE_TOKENS, .capacity_pages = 4};
    struct kvt_store *a = mem(4, NULL), *odd = NULL, *c = (struct kvt_store *)1;
    struct kvt_store *five[5] = {a, a, a, a, a}, *pair[2] = {a, NULL};

    (void)state;
    assert_int_equal(store_mem_open(&o, &odd), 0);
    assert_int_equal(store_chain_open(five, 0, &c), -EINVAL);
    assert_null(c);
    assert_int_equal(store_chain_open(five, STORE_CHAIN_MAX + 1, &c), -EINVAL);
    assert_int_equal(store_chain_open(pair, 2, &c), -EINVAL);
    pair[1] = odd;
    assert_int_equal(store_chain_open(pair, 2, &c), -EINVAL);
    put_all(a, 0, 2); /* still open, still the caller's */
    store_close(a);
    store_close(odd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nearest_first),    cmocka_unit_test(test_runs_across_stores),
        cmocka_unit_test(test_damage_is_a_miss), cmocka_unit_test(test_write_results),
        cmocka_unit_test(test_open_refuses),     cmocka_unit_test(test_lost_part_fails),
        cmocka_unit_test(test_remote_split),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
