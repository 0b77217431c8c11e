/* Sliding-window KV on host copies (cfg.swa_window with cfg.host_tier): a backup of a node
 * holding SWA KV gives its host copy the SWA layers, one of an SWA tombstone does not; a match
 * over the tiers counts host copies holding them as a window's KV and stops at the others;
 * the load mask and rdx_attach_device bring each node back live or a tombstone as its host
 * copy says; SWA eviction leaves nodes a transfer is moving; splits and host eviction keep
 * the host side exact. Pages are plain numbers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "radix/radix.h"

struct recorder {
    size_t swa, pages, host;
};

static void record_swa(void *ctx, const uint32_t *pages, size_t n)
{
    (void)pages;
    ((struct recorder *)ctx)->swa += n;
}

static void record_pages(void *ctx, const uint32_t *pages, size_t n)
{
    (void)pages;
    ((struct recorder *)ctx)->pages += n;
}

static void record_host(void *ctx, const uint32_t *pages, size_t n)
{
    (void)pages;
    ((struct recorder *)ctx)->host += n;
}

/* Page size 4 throughout. */
static struct rdx_tree *htree(uint32_t window, struct recorder *r)
{
    struct rdx_config cfg = {.page_size = 4,
                             .policy = KVT_EVICT_LRU,
                             .hash_pages = 1,
                             .host_tier = 1,
                             .free_pages = record_pages,
                             .free_host_pages = record_host,
                             .ctx = r,
                             .swa_window = window,
                             .free_swa_pages = record_swa};
    struct rdx_tree *t = NULL;

    assert_int_equal(rdx_create(&cfg, &t), 0);
    return t;
}

static void check(const struct rdx_tree *t)
{
    char why[200];

    if (rdx_check(t, NULL, why, sizeof(why)))
        fail_msg("tree check: %s", why);
}

static uint32_t seq[64];

static int setup_seq(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 64; i++)
        seq[i] = i + 1;
    return 0;
}

static kvt_node_ref put(struct rdx_tree *t, size_t n, size_t swa_from)
{
    uint32_t pages[16];
    struct kvt_key k = {.tokens = seq, .len = n};
    size_t pre;
    kvt_node_ref last;

    for (size_t i = 0; i < n / 4; i++)
        pages[i] = 100 + (uint32_t)i;
    assert_int_equal(rdx_insert_swa(t, &k, pages, 0, swa_from, &pre, &last), 0);
    check(t);
    return last;
}

/* Back up ref's chain and let the backup finish (op > 0). */
static void backup(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, bool finish)
{
    uint32_t host[16], dev[16];
    size_t n;

    assert_int_equal(rdx_backup_span(t, ref, &n), 0);
    for (size_t i = 0; i < n; i++)
        host[i] = (uint32_t)(op * 16 + i);
    assert_int_equal(rdx_attach_host(t, ref, host, n, dev, RDX_OP_BACKUP | op), 0);
    if (finish)
        assert_int_equal(rdx_op_done(t, ref, RDX_OP_BACKUP | op, 0), 0);
    check(t);
}

static int hlive_of(const struct rdx_tree *t, kvt_node_ref ref)
{
    int h = -1;

    assert_int_equal(rdx_swa_host_state(t, ref, &h), 0);
    return h;
}

static int live_of(const struct rdx_tree *t, kvt_node_ref ref)
{
    uint32_t locks;
    int live = -1;

    assert_int_equal(rdx_swa_state(t, ref, &live, &locks), 0);
    return live;
}

static struct rdx_swa_hit tiers(struct rdx_tree *t, size_t n, struct rdx_hit *h)
{
    struct kvt_key k = {.tokens = seq, .len = n};
    struct rdx_swa_hit s;

    assert_int_equal(rdx_match_swa_tiers(t, &k, NULL, NULL, h, &s), 0);
    check(t);
    return s;
}

/* The node ending the first n tokens. */
static kvt_node_ref node_at_len(struct rdx_tree *t, size_t n)
{
    struct rdx_hit h;

    tiers(t, n, &h);
    return h.host_last;
}

/* A: 16 tokens inserted with their window gone (a tombstone), B: 8 more holding SWA KV.
 * Backed up, then evicted from the device: the match over the tiers serves A+B (B is a
 * whole 8-token window on the host); the device match serves nothing. */
static void test_backup_records_host_swa(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = htree(8, &r);
    struct rdx_hit h;

    (void)state;
    kvt_node_ref b = put(t, 24, 16);
    kvt_node_ref a = node_at_len(t, 16);
    assert_int_equal(live_of(t, a), 0);
    assert_int_equal(live_of(t, b), 1);
    backup(t, b, 1, true);
    assert_int_equal(hlive_of(t, a), 0);
    assert_int_equal(hlive_of(t, b), 1);
    assert_int_equal(rdx_evict(t, 100), 6);
    check(t);
    struct rdx_swa_hit s = tiers(t, 24, &h);
    assert_int_equal(h.dev_pages, 0);
    assert_int_equal(h.host_pages, 6);
    assert_int_equal(s.swa_pages, 6);
    assert_int_equal(s.kv_pages, 0);
    assert_int_equal(s.branch_tokens, 0);

    struct kvt_key k = {.tokens = seq, .len = 24};
    struct rdx_swa_hit d;
    assert_int_equal(rdx_match_swa(t, &k, NULL, &d), 0);
    assert_int_equal(d.swa_pages, 0);

    /* A 12-token window no longer fits in B alone: A is a tombstone above it. */
    rdx_destroy(t);
    t = htree(12, &r);
    b = put(t, 24, 16);
    backup(t, b, 1, true);
    assert_int_equal(rdx_evict(t, 100), 6);
    s = tiers(t, 24, &h);
    assert_int_equal(h.host_pages, 6);
    assert_int_equal(s.swa_pages, 0);
    assert_int_equal(s.branch_tokens, 24);
    rdx_destroy(t);
}

/* The load mask says which pages come back with SWA layers; attach_device makes A a
 * tombstone and B live on the device, and the device match then serves A+B. */
static void test_load_mask_and_attach(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = htree(8, &r);
    struct rdx_hit h;
    uint8_t mask[8];
    uint32_t dev[6] = {1, 2, 3, 4, 5, 6};

    (void)state;
    kvt_node_ref b = put(t, 24, 16);
    backup(t, b, 1, true);
    assert_int_equal(rdx_evict(t, 100), 6);
    struct rdx_swa_hit s = tiers(t, 24, &h);
    assert_int_equal(rdx_swa_load_mask(t, s.swa_last, 6, mask), 0);
    static const uint8_t want[6] = {0, 0, 0, 0, 1, 1};
    assert_memory_equal(mask, want, 6);
    assert_int_equal(rdx_swa_load_mask(t, s.swa_last, 7, mask), -EINVAL);
    assert_int_equal(rdx_swa_load_mask(t, s.swa_last, 5, mask), -EINVAL); /* not whole nodes */

    assert_int_equal(rdx_attach_device(t, s.swa_last, dev, 6, 7), 0);
    check(t);
    kvt_node_ref a = node_at_len(t, 16);
    b = node_at_len(t, 24);
    assert_int_equal(live_of(t, a), 0);
    assert_int_equal(live_of(t, b), 1);
    struct rdx_sizes z;
    rdx_sizes(t, &z);
    assert_int_equal(z.swa_pages, 2);
    /* A load in flight: its SWA part is not evicted under it. */
    assert_int_equal(rdx_swa_evict(t, 10), 0);
    assert_int_equal(rdx_op_done(t, b, 7, 0), 0);
    struct kvt_key k = {.tokens = seq, .len = 24};
    struct rdx_swa_hit d;
    assert_int_equal(rdx_match_swa(t, &k, NULL, &d), 0);
    assert_int_equal(d.swa_pages, 6);
    assert_int_equal(rdx_swa_evict(t, 10), 2);
    assert_int_equal(r.swa, 4); /* B's SWA part went with its device copy before */
    check(t);
    rdx_destroy(t);
}

/* A backup in flight reads the SWA pages: SWA eviction leaves them until it ends. */
static void test_swa_evict_waits_for_backup(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = htree(8, &r);

    (void)state;
    kvt_node_ref b = put(t, 8, 0);
    backup(t, b, 1, false);
    assert_int_equal(rdx_swa_evict(t, 10), 0);
    assert_int_equal(r.swa, 0);
    assert_int_equal(rdx_op_done(t, b, RDX_OP_BACKUP | 1, 0), 0);
    assert_int_equal(rdx_swa_evict(t, 10), 2);
    assert_int_equal(r.swa, 2);
    /* The host copy keeps the SWA layers the backup took; the device copy is a tombstone,
     * and as a device copy it is one for the match over the tiers too. */
    assert_int_equal(hlive_of(t, b), 1);
    assert_int_equal(live_of(t, b), 0);
    struct rdx_hit h;
    assert_int_equal(tiers(t, 8, &h).swa_pages, 0);
    /* Off the device, its host copy serves the window. */
    assert_int_equal(rdx_evict(t, 10), 2);
    assert_int_equal(tiers(t, 8, &h).swa_pages, 2);
    rdx_destroy(t);
}

/* A split gives both halves the host SWA state; a failed backup and host eviction take it. */
static void test_split_and_host_eviction(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = htree(4, &r);
    struct rdx_hit h;

    (void)state;
    kvt_node_ref b = put(t, 16, 0);
    backup(t, b, 1, true);
    assert_int_equal(rdx_evict(t, 100), 4);
    /* A match ending inside the node splits it. */
    struct rdx_swa_hit s = tiers(t, 8, &h);
    assert_int_equal(s.swa_pages, 2);
    assert_int_equal(hlive_of(t, node_at_len(t, 8)), 1);
    assert_int_equal(hlive_of(t, node_at_len(t, 16)), 1);
    assert_int_equal(rdx_evict_host(t, 100), 4);
    check(t);
    assert_int_equal(r.host, 4);

    /* A failed backup leaves no host copy, and no host SWA layers. */
    b = put(t, 8, 0);
    backup(t, b, 2, false);
    assert_int_equal(hlive_of(t, b), 1);
    assert_int_equal(rdx_op_done(t, b, RDX_OP_BACKUP | 2, 1), 0);
    assert_int_equal(hlive_of(t, b), 0);
    check(t);
    rdx_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backup_records_host_swa),
        cmocka_unit_test(test_load_mask_and_attach),
        cmocka_unit_test(test_swa_evict_waits_for_backup),
        cmocka_unit_test(test_split_and_host_eviction),
    };

    return cmocka_run_group_tests(tests, setup_seq, NULL);
}
