/*
 * Sliding-window (SWA) device memory: the full+SWA slot allocator and its map, window
 * eviction (SWA tombstones), the window rule, the two-pool KV layout, and a randomized run
 * against a reference model. KVT_SEED reruns a randomized run.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "harness.h"
#include "rng.h"
#include "device/backend.h"
#include "device/swa_alloc.h"
#include "device/swa_pool.h"

/* ---- a snapshot of everything an allocator call may change ---- */

struct side_snap {
    uint8_t *state;
    uint32_t *ring;
    uint32_t head, nfree, ngroup;
};

struct snap {
    struct side_snap full, swa;
    int32_t *map;
    uint32_t *peer;
};

static size_t map_len(const struct swa_alloc *a)
{
    return ((size_t)a->full.npages + 1) * a->page_size;
}

static void *dup_bytes(const void *p, size_t n)
{
    void *c = malloc(n);

    assert_non_null(c);
    memcpy(c, p, n);
    return c;
}

static void side_take(struct side_snap *s, const struct slot_alloc *a)
{
    s->state = dup_bytes(a->state, a->npages + 1);
    s->ring = dup_bytes(a->ring, a->npages * sizeof(uint32_t));
    s->head = a->head;
    s->nfree = a->nfree;
    s->ngroup = a->ngroup;
}

static void snap_take(struct snap *s, const struct swa_alloc *a)
{
    side_take(&s->full, &a->full);
    side_take(&s->swa, &a->swa);
    s->map = dup_bytes(a->map, map_len(a) * sizeof(int32_t));
    s->peer = dup_bytes(a->peer, (a->full.npages + 1) * sizeof(uint32_t));
}

static int side_same(const struct side_snap *s, const struct slot_alloc *a)
{
    return s->head == a->head && s->nfree == a->nfree && s->ngroup == a->ngroup &&
           !memcmp(s->state, a->state, a->npages + 1) &&
           !memcmp(s->ring, a->ring, a->npages * sizeof(uint32_t));
}

static void snap_drop(struct snap *s)
{
    free(s->full.state);
    free(s->full.ring);
    free(s->swa.state);
    free(s->swa.ring);
    free(s->map);
    free(s->peer);
}

/* Whether a is as s was; frees s. */
static int snap_same(struct snap *s, const struct swa_alloc *a)
{
    int same = side_same(&s->full, &a->full) && side_same(&s->swa, &a->swa) &&
               !memcmp(s->map, a->map, map_len(a) * sizeof(int32_t)) &&
               !memcmp(s->peer, a->peer, (a->full.npages + 1) * sizeof(uint32_t));

    snap_drop(s);
    return same;
}

/* A call that must fail with want and change nothing. */
#define REFUSED(a, call, want)                                                                     \
    do {                                                                                           \
        struct snap snap_;                                                                         \
        snap_take(&snap_, (a));                                                                    \
        assert_int_equal((call), (want));                                                          \
        assert_true(snap_same(&snap_, (a)));                                                       \
    } while (0)

/* ---- examples ---- */

/* Each full slot maps to the SWA slot at the same offset of its page peer. */
static void assert_paired(const struct swa_alloc *a, const int32_t *full, size_t n)
{
    int32_t swa[64];
    uint32_t ps = a->page_size;

    assert_true(n <= 64);
    assert_int_equal(swa_translate(a, full, n, swa), 0);
    for (size_t i = 0; i < n; i++) {
        assert_true(swa[i] > 0);
        assert_int_equal(swa[i] % (int32_t)ps, full[i] % (int32_t)ps);
        if (i && full[i] / (int32_t)ps == full[i - 1] / (int32_t)ps)
            assert_int_equal(swa[i] / (int32_t)ps, swa[i - 1] / (int32_t)ps);
    }
    assert_int_equal(swa_check_live(a, full, n), 0);
    assert_int_equal(swa_alloc_check(a), 0);
}

static void test_pair_alloc(void **state)
{
    struct swa_alloc a;
    int32_t f[64], t[4];

    (void)state;
    for (uint32_t ps = 1; ps <= 16; ps *= 16) {
        assert_int_equal(swa_alloc_init(&a, 64 * ps, 8 * ps, ps), 0);
        assert_int_equal(swa_available(&a), 8 * ps);
        assert_int_equal(swa_alloc(&a, 2 * ps, f), 0);
        assert_paired(&a, f, 2 * ps);
        /* The first pages of both sides: page 1, then page 2. */
        assert_int_equal(f[0], ps);
        assert_int_equal(a.map[f[0]], (int32_t)ps);
        assert_int_equal(a.peer[1], 1);
        assert_int_equal(swa_available(&a), 6 * ps);
        assert_int_equal(slot_available(&a.full), 62 * ps);
        const int32_t odd[] = {-1, 0};
        assert_int_equal(swa_translate(&a, odd, 2, t), 0);
        assert_int_equal(t[0], -1); /* no slot stays no slot */
        assert_int_equal(t[1], 0);  /* padding maps to padding */
        assert_int_equal(swa_check_live(&a, &odd[1], 1), 0);
        const int32_t past[] = {(int32_t)(65 * ps)};
        assert_int_equal(swa_translate(&a, past, 1, t), -EINVAL);
        assert_int_equal(swa_check_live(&a, past, 1), -EINVAL);
        assert_int_equal(swa_free(&a, f, 2 * ps), 0);
        assert_int_equal(swa_available(&a), 8 * ps);
        assert_int_equal(a.map[f[0]], 0);
        assert_int_equal(swa_alloc_check(&a), 0);
        swa_alloc_finish(&a);
    }
    assert_int_equal(swa_alloc_init(&a, 64, 8, 3), -EINVAL);
    assert_int_equal(swa_alloc_init(&a, 64, 2, 4), -EINVAL); /* no whole SWA page */
    assert_int_equal(swa_alloc_init(&a, 2, 64, 4), -EINVAL);
}

/* A load-back's full pages, taken without peers (SWA tombstones), get SWA pages for the ones
 * whose host copy kept the SWA layers: paired whole, and a bad call takes nothing. */
static void test_give_peers(void **state)
{
    struct swa_alloc a;
    int32_t f[16];
    uint32_t pages[4];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 16 * 4, 3 * 4, 4), 0);
    assert_int_equal(slot_alloc(&a.full, 16, f), 0); /* four full pages, no peers */
    for (int i = 0; i < 4; i++)
        pages[i] = (uint32_t)f[i * 4] / 4;
    assert_int_equal(swa_check_live(&a, f, 16), -ENOENT);
    const uint32_t twice[] = {pages[0], pages[0]}, bad[] = {pages[0], 99};
    REFUSED(&a, swa_give_peers(&a, twice, 2), -EINVAL);
    REFUSED(&a, swa_give_peers(&a, bad, 2), -EINVAL);
    REFUSED(&a, swa_give_peers(&a, pages, 4), -ENOMEM); /* three SWA pages */
    assert_int_equal(swa_give_peers(&a, pages + 1, 2), 0);
    assert_paired(&a, f + 4, 8);
    assert_int_equal(swa_check_live(&a, f, 4), -ENOENT);
    assert_int_equal(swa_check_live(&a, f + 12, 4), -ENOENT);
    REFUSED(&a, swa_give_peers(&a, pages + 1, 1), -EINVAL); /* has one */
    assert_int_equal(slot_available(&a.swa), 4);
    /* Claimed by the cache and released, both sides come back. */
    assert_int_equal(swa_claim(&a, pages, 4), 0);
    swa_release_cached(&a, pages, 4);
    assert_int_equal(slot_available(&a.swa), 12);
    assert_int_equal(slot_available(&a.full), 64);
    assert_int_equal(swa_alloc_check(&a), 0);
    swa_alloc_finish(&a);
}

/* Available is the smaller side, whichever it is; a pair allocation past it takes nothing. */
static void test_available_min(void **state)
{
    struct swa_alloc a;
    int32_t f[64];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 32, 8, 4), 0); /* the SWA side is short */
    assert_int_equal(swa_available(&a), 8);
    REFUSED(&a, swa_alloc(&a, 12, f), -ENOMEM);
    assert_int_equal(swa_alloc(&a, 8, f), 0);
    assert_int_equal(swa_available(&a), 0);
    assert_int_equal(slot_available(&a.full), 24);
    REFUSED(&a, swa_alloc(&a, 4, f), -ENOMEM);
    /* The window frees SWA only: pairs fit again, the full side is as it was. */
    assert_int_equal(swa_free_swa(&a, f, 4), 0);
    assert_int_equal(swa_available(&a), 4);
    assert_int_equal(slot_available(&a.full), 24);
    REFUSED(&a, swa_alloc(&a, 6, f), -EINVAL); /* not whole pages */
    REFUSED(&a, swa_alloc(&a, 4, NULL), -EINVAL);
    swa_alloc_finish(&a);

    assert_int_equal(swa_alloc_init(&a, 8, 32, 4), 0); /* the full side is short */
    assert_int_equal(swa_available(&a), 8);
    REFUSED(&a, swa_alloc(&a, 12, f), -ENOMEM);
    swa_alloc_finish(&a);
}

/* Tokens leave the window: their SWA pages go, their full slots stay and map to none. */
static void test_window_eviction(void **state)
{
    struct swa_alloc a;
    const uint32_t pre = 0, seq = 40;
    const int32_t none = -1;
    int32_t row[40], t[40];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 256, 64, 16), 0);
    assert_int_equal(swa_alloc_extend(&a, 1, &pre, &seq, &none, row, 40), 0);
    assert_paired(&a, row, 40);
    assert_int_equal(swa_available(&a), 16); /* 3 SWA pages of 4 taken */
    assert_int_equal(swa_free_swa(&a, row, 16), 0);
    assert_true(slot_all_in_state(&a.full, row, 40, PAGE_USED));
    assert_int_equal(swa_translate(&a, row, 40, t), 0);
    for (int i = 0; i < 16; i++)
        assert_int_equal(t[i], 0);
    assert_true(t[16] > 0);
    assert_int_equal(a.peer[(uint32_t)row[0] / 16], 0);
    assert_int_equal(swa_available(&a), 32);
    assert_int_equal(slot_available(&a.full), 256 - 48);
    assert_int_equal(swa_check_live(&a, row, 40), -ENOENT);
    assert_int_equal(swa_check_live(&a, row + 16, 24), 0);
    assert_int_equal(swa_alloc_check(&a), 0);
    /* A second free of the window, and a mixed one, are caught and change nothing. */
    REFUSED(&a, swa_free_swa(&a, row, 16), -EINVAL);
    REFUSED(&a, swa_free_swa(&a, row + 8, 16), -EINVAL);
    /* The full part cannot go alone while a page of it has SWA KV. */
    REFUSED(&a, swa_free_full(&a, row, 40), -EINVAL);
    assert_int_equal(swa_free_full(&a, row, 16), 0);
    REFUSED(&a, swa_free_full(&a, row, 16), -EINVAL);
    REFUSED(&a, swa_free(&a, row, 40), -EINVAL); /* its first page is free already */
    assert_int_equal(swa_free(&a, row + 16, 24), 0);
    assert_int_equal(swa_available(&a), 64);
    assert_int_equal(slot_available(&a.full), 256);
    REFUSED(&a, swa_free(&a, row + 16, 24), -EINVAL);
    REFUSED(&a, swa_free_swa(&a, row + 16, 1), -EINVAL);
    assert_int_equal(swa_alloc_check(&a), 0);
    swa_alloc_finish(&a);
}

/* A pair free of a row that is partly tombstone frees the full side whole, the SWA side
 * where it is left; page_size 1 has no page rounding. */
static void test_free_tombstoned_row(void **state)
{
    struct swa_alloc a;
    int32_t row[8];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 16, 8, 1), 0);
    assert_int_equal(swa_alloc(&a, 8, row), 0);
    assert_int_equal(swa_free_swa(&a, row + 1, 3), 0);
    assert_int_equal(a.map[row[0]], 1);
    assert_int_equal(a.map[row[1]], 0);
    assert_int_equal(a.map[row[4]], 5);
    assert_int_equal(swa_available(&a), 3);
    REFUSED(&a, swa_free_swa(&a, row, 2), -EINVAL); /* row[1] has no SWA slot */
    assert_int_equal(swa_free(&a, row, 8), 0);
    assert_int_equal(swa_available(&a), 8);
    assert_int_equal(slot_available(&a.full), 16);
    assert_int_equal(swa_alloc_check(&a), 0);
    swa_alloc_finish(&a);
}

/* Extend and decode keep the sides in step, continuing a partial page in its peer. */
static void test_extend_decode(void **state)
{
    struct swa_alloc a;
    uint32_t pre[2] = {0, 0}, seq[2] = {20, 5};
    int32_t last[2] = {-1, -1}, row[64], out[2];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 256, 128, 16), 0);
    assert_int_equal(swa_alloc_extend(&a, 2, pre, seq, last, row, 25), 0);
    assert_paired(&a, row, 25);
    /* Continue request 0 by 14 (to 34): 12 in its partial page, then a new page. */
    pre[0] = 20;
    seq[0] = 34;
    last[0] = row[19];
    assert_int_equal(swa_alloc_extend(&a, 1, pre, seq, last, row + 25, 14), 0);
    assert_int_equal(row[25], row[19] + 1);
    assert_int_equal(a.map[row[25]], a.map[row[19]] + 1);
    assert_paired(&a, row + 25, 14);
    /* Decode: request 0 at 35 stays in its page; request 1 at 6 too. */
    seq[0] = 35;
    seq[1] = 6;
    last[0] = row[38];
    last[1] = row[24];
    assert_int_equal(swa_alloc_decode(&a, 2, seq, last, out), 0);
    assert_int_equal(out[0], row[38] + 1);
    assert_int_equal(a.map[out[0]], a.map[row[38]] + 1);
    assert_int_equal(a.map[out[1]], a.map[row[24]] + 1);
    assert_int_equal(swa_alloc_check(&a), 0);
    swa_alloc_finish(&a);
}

/* A page-aligned prefix whose SWA part left the window extends and decodes (the SWA side
 * starts a new page); a partial page without its SWA peer cannot be continued. */
static void test_extend_after_tombstone(void **state)
{
    struct swa_alloc a;
    uint32_t pre = 0, seq = 32;
    int32_t last = -1, row[64], out;

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 256, 64, 16), 0);
    assert_int_equal(swa_alloc_extend(&a, 1, &pre, &seq, &last, row, 32), 0);
    assert_int_equal(swa_free_swa(&a, row, 32), 0);
    pre = 32;
    seq = 33;
    last = row[31];
    assert_int_equal(swa_alloc_decode(&a, 1, &seq, &last, &out), 0);
    assert_int_equal(out % 16, 0);
    assert_int_equal(a.map[out] % 16, 0);
    row[32] = out;
    pre = 33;
    seq = 40;
    last = out;
    assert_int_equal(swa_alloc_extend(&a, 1, &pre, &seq, &last, row + 33, 7), 0);
    assert_paired(&a, row + 32, 8);
    assert_int_equal(swa_free_swa(&a, row + 32, 1), 0); /* the partial page's SWA part */
    pre = 40;
    seq = 41;
    last = row[39];
    REFUSED(&a, swa_alloc_extend(&a, 1, &pre, &seq, &last, row + 40, 1), -EINVAL);
    REFUSED(&a, swa_alloc_decode(&a, 1, &seq, &last, row + 40), -EINVAL);
    assert_int_equal(swa_free(&a, row, 40), 0);
    assert_int_equal(swa_available(&a), 64);
    swa_alloc_finish(&a);
}

/* The SWA side runs out first: extend and decode refuse and take nothing. */
static void test_extend_enomem(void **state)
{
    struct swa_alloc a;
    uint32_t pre = 0, seq = 32;
    int32_t last = -1, row[64], out;

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 256, 32, 16), 0);
    assert_int_equal(swa_alloc_extend(&a, 1, &pre, &seq, &last, row, 32), 0);
    seq = 33;
    last = row[31];
    REFUSED(&a, swa_alloc_decode(&a, 1, &seq, &last, &out), -ENOMEM);
    pre = 32;
    seq = 48;
    REFUSED(&a, swa_alloc_extend(&a, 1, &pre, &seq, &last, row + 32, 16), -ENOMEM);
    REFUSED(&a, swa_alloc_extend(&a, 1, &pre, &seq, &last, row + 32, 15), -EINVAL);
    assert_int_equal(swa_free_swa(&a, row, 16), 0); /* the window frees one page */
    assert_int_equal(swa_alloc_extend(&a, 1, &pre, &seq, &last, row + 32, 16), 0);
    assert_int_equal(swa_alloc_check(&a), 0);
    swa_alloc_finish(&a);
}

/* Inside a free group the map changes at once, the pages come back at its end. */
static void test_free_group(void **state)
{
    struct swa_alloc a;
    int32_t row[16];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 32, 16, 4), 0);
    assert_int_equal(swa_alloc(&a, 16, row), 0);
    assert_int_equal(swa_free_group_end(&a), -EINVAL);
    assert_int_equal(swa_free_group_begin(&a), 0);
    assert_int_equal(swa_free_group_begin(&a), -EINVAL);
    assert_int_equal(swa_free_swa(&a, row, 4), 0);
    assert_int_equal(swa_free(&a, row + 8, 8), 0);
    assert_int_equal(a.map[row[0]], 0);
    assert_int_equal(swa_available(&a), 0);
    REFUSED(&a, swa_free_swa(&a, row, 4), -EINVAL);
    REFUSED(&a, swa_free(&a, row + 8, 4), -EINVAL);
    assert_int_equal(swa_alloc_check(&a), 0);
    assert_int_equal(swa_free_group_end(&a), 0);
    assert_int_equal(swa_available(&a), 12);
    assert_int_equal(slot_available(&a.full), 24);
    assert_int_equal(swa_alloc_check(&a), 0);
    swa_alloc_finish(&a);
}

/* SGLang's rule for how far a request's SWA part may go. */
static void test_window_rule(void **state)
{
    (void)state;
    /* Without prefix sharing: everything but the last `window` tokens, page aligned. */
    assert_int_equal(swa_window_evict_to(100, 0, 32, 1, 0), 68);
    assert_int_equal(swa_window_evict_to(100, 0, 32, 16, 0), 64);
    /* Nothing until the window passed the cursor by a token. */
    assert_int_equal(swa_window_evict_to(32, 0, 32, 1, 0), 0);
    assert_int_equal(swa_window_evict_to(33, 0, 32, 1, 0), 1);
    assert_int_equal(swa_window_evict_to(100, 68, 32, 1, 0), 68);
    assert_int_equal(swa_window_evict_to(101, 68, 32, 1, 0), 69);
    /* With prefix sharing: keep max(window, page) in whole pages. */
    assert_int_equal(swa_window_evict_to(100, 0, 20, 16, 1), 64); /* keeps 32 */
    assert_int_equal(swa_window_evict_to(100, 0, 4, 16, 1), 80);  /* keeps 16 */
    assert_int_equal(swa_window_evict_to(40, 0, 20, 16, 1), 0);   /* 40 - 32 floors to 0 */
    assert_int_equal(swa_window_evict_to(100, 80, 4, 16, 1), 80);
    assert_int_equal(swa_window_evict_to(100, 0, 200, 16, 1), 0);
    assert_int_equal(swa_window_evict_to(0, 0, 0, 1, 1), 0);
}

/* ---- the two-pool KV layout ---- */

static void fill(uint8_t *buf, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)(seed + i * 7);
}

static void test_pool_mha(void **state)
{
    struct kvt_geometry g = {
        .attention = KVT_ATTN_MHA, .layers = 4, .kv_heads = 2, .head_dim = 8, .dtype_bytes = 2};
    const uint32_t full_ids[] = {3, 1};
    struct swa_alloc a;
    struct swa_pool p;
    int32_t row[8];
    size_t rb = 2 * 8 * 2, n = 8;
    uint8_t k[8 * 32], v[8 * 32], k2[8 * 32], v2[8 * 32];
    int is_swa;
    uint32_t index;

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 64, 16, 4), 0);
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, full_ids, 2, &a), 0);
    assert_int_equal(p.full.rows, 68);
    assert_int_equal(p.swa.rows, 20);
    assert_int_equal(swa_pool_bytes(&p), (68 + 20) * 2 * rb * 2);
    assert_int_equal(swa_pool_layer(&p, 3, &is_swa, &index), 0);
    assert_true(!is_swa && index == 0);
    assert_int_equal(swa_pool_layer(&p, 1, &is_swa, &index), 0);
    assert_true(!is_swa && index == 1);
    assert_int_equal(swa_pool_layer(&p, 2, &is_swa, &index), 0);
    assert_true(is_swa && index == 1);
    assert_int_equal(swa_pool_layer(&p, 4, &is_swa, &index), -EINVAL);

    assert_int_equal(swa_alloc(&a, 8, row), 0);
    for (uint32_t l = 0; l < 4; l++) {
        fill(k, n * rb, (uint8_t)(l * 2));
        fill(v, n * rb, (uint8_t)(l * 2 + 1));
        assert_int_equal(swa_pool_write(&p, &a, l, row, n, k, v), 0);
    }
    for (uint32_t l = 0; l < 4; l++) {
        assert_int_equal(swa_pool_read(&p, &a, l, row, n, k2, v2), 0);
        fill(k, n * rb, (uint8_t)(l * 2));
        fill(v, n * rb, (uint8_t)(l * 2 + 1));
        assert_memory_equal(k, k2, n * rb);
        assert_memory_equal(v, v2, n * rb);
    }
    /* An SWA layer's rows sit at the SWA slots: read them from its pool directly. */
    int32_t swa_slots[8];
    swa_translate_live(&a, row, n, swa_slots);
    assert_int_equal(kv_pool_read(&p.swa, 0, swa_slots, n, k2, v2), 0);
    fill(k, n * rb, 0);
    assert_memory_equal(k, k2, n * rb);

    /* Out of the window: full layers still read, SWA layers refuse and move nothing. */
    assert_int_equal(swa_free_swa(&a, row, 4), 0);
    assert_int_equal(swa_pool_read(&p, &a, 1, row, n, k2, v2), 0);
    memset(k2, 0xEE, sizeof(k2));
    assert_int_equal(swa_pool_read(&p, &a, 0, row, n, k2, v2), -ENOENT);
    assert_int_equal(k2[0], 0xEE);
    assert_int_equal(swa_pool_write(&p, &a, 2, row, n, k, v), -ENOENT);
    assert_int_equal(swa_pool_read(&p, &a, 0, row + 4, 4, k2, v2), 0);
    assert_int_equal(swa_pool_write(&p, &a, 0, row, n, k, NULL), -EINVAL);
    assert_int_equal(swa_pool_write(&p, &a, 9, row, n, k, v), -EINVAL);
    swa_pool_finish(&p);
    swa_pool_finish(&p); /* a finished pool finishes again harmlessly */

    const uint32_t bad1[] = {4}, bad2[] = {1, 1}, all[] = {0, 1, 2, 3};
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, bad1, 1, &a), -EINVAL);
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, bad2, 2, &a), -EINVAL);
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, all, 4, &a), -EINVAL);
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, all, 0, &a), -EINVAL);
    g.dtype_bytes = 3;
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, full_ids, 2, &a), -EINVAL);
    swa_alloc_finish(&a);
}

/* MLA rows (one latent buffer), over more slots than one translation chunk. */
static void test_pool_mla(void **state)
{
    struct kvt_geometry g = {.attention = KVT_ATTN_MLA,
                             .layers = 3,
                             .kv_lora_rank = 8,
                             .qk_rope_head_dim = 4,
                             .dtype_bytes = 1};
    const uint32_t full_ids[] = {0};
    enum { N = 600 };
    struct swa_alloc a;
    struct swa_pool p;
    static int32_t row[N];
    static uint8_t k[N * 12], k2[N * 12];

    (void)state;
    assert_int_equal(swa_alloc_init(&a, 2048, 1024, 1), 0);
    assert_int_equal(swa_pool_init(&p, &dev_backend_sim, &g, full_ids, 1, &a), 0);
    assert_int_equal(swa_alloc(&a, N, row), 0);
    fill(k, sizeof(k), 9);
    assert_int_equal(swa_pool_write(&p, &a, 2, row, N, k, NULL), 0);
    assert_int_equal(swa_pool_read(&p, &a, 2, row, N, k2, NULL), 0);
    assert_memory_equal(k, k2, sizeof(k));
    assert_int_equal(swa_pool_read(&p, &a, 1, row, N, k2, NULL), 0);
    assert_int_equal(swa_pool_write(&p, &a, 2, row, N, k, k), -EINVAL);
    swa_pool_finish(&p);
    swa_alloc_finish(&a);
}

/* ---- randomized run against a reference model ---- */

#define R_REQ 8
#define R_MAXLEN 200
#define R_STEPS 20000

/* The model: each request's row of full slots, its length and its SWA cursor (the row's
 * SWA part is gone below it, page aligned unless page_size is 1), and the pages a free
 * group holds back. */
struct rreq {
    int live;
    uint32_t len;
    uint32_t cursor;
    int32_t row[R_MAXLEN];
};

struct rsim {
    const char *name;
    uint32_t ps;
    uint64_t seed, rng, step;
    const char *op;
    struct swa_alloc a;
    struct rreq req[R_REQ];
    int group;
    uint32_t full_pending, swa_pending;
    uint8_t *fseen, *sseen;
    uint64_t ok, enomem, einval, tomb_refused;
};

#define HARNESS_RUN(s)                                                                             \
    (&(struct harness_run){.prog = "test_swa",                                                     \
                           .config = (s)->name,                                                    \
                           .seed = (s)->seed,                                                      \
                           .step = (s)->step,                                                      \
                           .op = (s)->op})

static uint64_t rnd(struct rsim *s, uint64_t n)
{
    return rng_next(&s->rng) % n;
}

static uint32_t pages_of(const struct rsim *s, uint32_t tokens)
{
    return (tokens + s->ps - 1) / s->ps;
}

/* SWA pages a request still holds: its pages from the cursor's on. */
static uint32_t live_swa_pages(const struct rsim *s, const struct rreq *r)
{
    uint32_t pages = pages_of(s, r->len), gone = pages_of(s, r->cursor);

    return gone < pages ? pages - gone : 0;
}

static uint32_t model_free(const struct rsim *s, int swa)
{
    uint32_t used = swa ? s->swa_pending : s->full_pending;

    for (int i = 0; i < R_REQ; i++)
        if (s->req[i].live)
            used += swa ? live_swa_pages(s, &s->req[i]) : pages_of(s, s->req[i].len);
    return (swa ? s->a.swa.npages : s->a.full.npages) - used;
}

/* Pages the model expects free on both sides now. */
static uint32_t model_room(const struct rsim *s)
{
    uint32_t f = model_free(s, 0), w = model_free(s, 1);

    return f < w ? f : w;
}

static void check_row(struct rsim *s, const struct rreq *r)
{
    int32_t t[R_MAXLEN];
    int32_t ps = (int32_t)s->ps;

    REQUIRE(s, swa_translate(&s->a, r->row, r->len, t) == 0);
    REQUIRE(s, slot_all_in_state(&s->a.full, r->row, r->len, PAGE_USED));
    for (uint32_t i = 0; i < r->len; i++) {
        REQUIRE(s, r->row[i] % ps == (int32_t)(i % s->ps));
        REQUIRE(s, !s->fseen[r->row[i]]++); /* no full slot in two rows */
        if (i < r->cursor) {
            REQUIRE(s, t[i] == 0);
            continue;
        }
        REQUIRE(s, t[i] > 0 && t[i] % ps == r->row[i] % ps);
        REQUIRE(s, !s->sseen[t[i]]++); /* no SWA slot owned twice */
        REQUIRE(s, slot_all_in_state(&s->a.swa, &t[i], 1, PAGE_USED));
    }
}

static void check_all(struct rsim *s)
{
    memset(s->fseen, 0, ((size_t)s->a.full.npages + 1) * s->ps);
    memset(s->sseen, 0, ((size_t)s->a.swa.npages + 1) * s->ps);
    REQUIRE(s, swa_alloc_check(&s->a) == 0);
    for (int i = 0; i < R_REQ; i++)
        if (s->req[i].live)
            check_row(s, &s->req[i]);
    /* The counts add up on both sides, pages held by a free group included. */
    REQUIRE(s, s->a.full.nfree == model_free(s, 0));
    REQUIRE(s, s->a.swa.nfree == model_free(s, 1));
    REQUIRE(s, s->a.full.ngroup == s->full_pending && s->a.swa.ngroup == s->swa_pending);
    REQUIRE(s, swa_available(&s->a) == (size_t)model_room(s) * s->ps);
}

/* A refused call: the wanted error, and nothing changed. */
static void refused(struct rsim *s, int rc, int want, struct snap *before)
{
    if (rc != want)
        FAIL(s, "%s gave %d, expected %d", s->op, rc, want);
    REQUIRE(s, snap_same(before, &s->a));
    s->einval += want == -EINVAL;
    s->enomem += want == -ENOMEM;
}

/* The answer a growth of r from len to len + k must get. */
static int grow_expect(const struct rsim *s, const struct rreq *r, uint32_t k)
{
    if (r->len % s->ps && r->cursor > r->len)
        return -EINVAL; /* its partial page's SWA part is gone */
    return pages_of(s, r->len + k) - pages_of(s, r->len) > model_room(s) ? -ENOMEM : 0;
}

static void op_grow(struct rsim *s, struct rreq *r, int decode)
{
    uint32_t k = decode ? 1 : 1 + (uint32_t)rnd(s, 24), pre = r->len, seq;
    int32_t last = r->len ? r->row[r->len - 1] : -1;
    struct snap before;
    int want, rc;

    if (r->len + k > R_MAXLEN)
        return;
    seq = pre + k;
    s->op = decode ? "decode" : "extend";
    want = grow_expect(s, r, k);
    snap_take(&before, &s->a);
    rc = decode ? swa_alloc_decode(&s->a, 1, &seq, &last, r->row + pre)
                : swa_alloc_extend(&s->a, 1, &pre, &seq, &last, r->row + pre, k);
    if (want) {
        s->tomb_refused += want == -EINVAL;
        refused(s, rc, want, &before);
        return;
    }
    snap_drop(&before);
    REQUIRE(s, rc == 0);
    r->len = seq;
    r->live = 1;
    s->ok++;
}

static void op_alloc(struct rsim *s, struct rreq *r)
{
    uint32_t pages = 1 + (uint32_t)rnd(s, R_MAXLEN / s->ps < 8 ? R_MAXLEN / s->ps : 8);
    struct snap before;
    int rc;

    s->op = "alloc";
    snap_take(&before, &s->a);
    rc = swa_alloc(&s->a, (size_t)pages * s->ps, r->row);
    if (pages > model_room(s)) {
        refused(s, rc, -ENOMEM, &before);
        return;
    }
    snap_drop(&before);
    REQUIRE(s, rc == 0);
    r->live = 1;
    r->len = pages * s->ps;
    r->cursor = 0;
}

/* Free the SWA part of r's rows [r->cursor, end): whole pages go. */
static void drop_window(struct rsim *s, struct rreq *r, uint32_t end)
{
    uint32_t before = live_swa_pages(s, r);

    EXPECT_RC(s, swa_free_swa(&s->a, r->row + r->cursor, end - r->cursor), 0);
    r->cursor = pages_of(s, end) * s->ps;
    if (s->group)
        s->swa_pending += before - live_swa_pages(s, r);
}

static void op_window(struct rsim *s, struct rreq *r)
{
    uint32_t w = (uint32_t)rnd(s, 64);
    uint64_t end = swa_window_evict_to(r->len, r->cursor, w, s->ps, (int)rnd(s, 2));

    s->op = "window";
    REQUIRE(s, end >= r->cursor && (end == r->cursor || end <= r->len));
    REQUIRE(s, end == r->cursor || end % s->ps == 0);
    if (end > r->cursor)
        drop_window(s, r, (uint32_t)end);
}

static void op_tombstone(struct rsim *s, struct rreq *r)
{
    s->op = "free_swa";
    if (r->cursor < r->len)
        drop_window(s, r, r->cursor + 1 + (uint32_t)rnd(s, r->len - r->cursor));
}

/* Frees that must be refused: a second free of the window, the full part while some of it
 * still has SWA KV. */
static void op_probe(struct rsim *s, struct rreq *r)
{
    struct snap before;

    s->op = "refused free";
    snap_take(&before, &s->a);
    if (r->cursor > 0)
        refused(s, swa_free_swa(&s->a, r->row, 1), -EINVAL, &before);
    else
        refused(s, swa_free_full(&s->a, r->row, r->len), -EINVAL, &before);
}

static void op_free(struct rsim *s, struct rreq *r)
{
    struct snap before;
    int full_only = r->cursor >= r->len && rnd(s, 2);

    s->op = full_only ? "free_full" : "free";
    if (s->group) {
        s->full_pending += pages_of(s, r->len);
        s->swa_pending += live_swa_pages(s, r);
    }
    if (full_only)
        EXPECT_RC(s, swa_free_full(&s->a, r->row, r->len), 0);
    else
        EXPECT_RC(s, swa_free(&s->a, r->row, r->len), 0);
    r->live = 0;
    s->op = "double free";
    snap_take(&before, &s->a);
    refused(s, swa_free(&s->a, r->row, r->len), -EINVAL, &before);
    r->len = r->cursor = 0;
}

static void op_group(struct rsim *s)
{
    s->op = s->group ? "group end" : "group begin";
    if (!s->group) {
        EXPECT_RC(s, swa_free_group_begin(&s->a), 0);
    } else {
        EXPECT_RC(s, swa_free_group_end(&s->a), 0);
        s->full_pending = s->swa_pending = 0;
    }
    s->group = !s->group;
}

static void step(struct rsim *s)
{
    struct rreq *r = &s->req[rnd(s, R_REQ)];
    uint64_t op = rnd(s, 100);

    if (op < 4)
        op_group(s); /* from any state: a group may hold every freed page */
    else if (!r->live && op < 25)
        op_alloc(s, r);
    else if (!r->live)
        op_grow(s, r, 0);
    else if (op < 30)
        op_grow(s, r, op < 15);
    else if (op < 50)
        op_window(s, r);
    else if (op < 58)
        op_tombstone(s, r);
    else if (op < 68)
        op_probe(s, r);
    else
        op_free(s, r);
}

static uint64_t base_seed(void)
{
    const char *env = getenv("KVT_SEED");

    return env && *env ? strtoull(env, NULL, 0) : 0x5A5A2016ull;
}

static void random_run(const char *name, uint32_t ps, uint64_t full_tokens, uint64_t swa_tokens)
{
    struct rsim *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    s->name = name;
    s->ps = ps;
    s->seed = base_seed();
    s->rng = s->seed ^ ps;
    printf("test_swa: %s: seed=%" PRIu64 " (KVT_SEED reruns it), %d steps\n", name, s->seed,
           R_STEPS);
    assert_int_equal(swa_alloc_init(&s->a, full_tokens, swa_tokens, ps), 0);
    s->fseen = calloc(full_tokens + ps, 1);
    s->sseen = calloc(swa_tokens + ps, 1);
    assert_true(s->fseen && s->sseen);
    for (s->step = 0; s->step < R_STEPS; s->step++) {
        step(s);
        check_all(s);
    }
    if (s->group)
        op_group(s);
    check_all(s);
    printf("test_swa: %s: %" PRIu64 " grown, %" PRIu64 " -ENOMEM, %" PRIu64 " -EINVAL (%" PRIu64
           " growths of a tombstoned partial page)\n",
           name, s->ok, s->enomem, s->einval, s->tomb_refused);
    /* The run must have reached every refusal it models, or it tested less than it says. */
    assert_true(s->enomem > 0 && s->einval > 0 && (ps == 1 || s->tomb_refused > 0));
    swa_alloc_finish(&s->a);
    free(s->fseen);
    free(s->sseen);
    free(s);
}

static void test_random_ps1(void **state)
{
    (void)state;
    random_run("ps1", 1, 256, 96);
}

static void test_random_ps16(void **state)
{
    (void)state;
    random_run("ps16", 16, 1024, 384);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_alloc),
        cmocka_unit_test(test_available_min),
        cmocka_unit_test(test_give_peers),
        cmocka_unit_test(test_window_eviction),
        cmocka_unit_test(test_free_tombstoned_row),
        cmocka_unit_test(test_extend_decode),
        cmocka_unit_test(test_extend_after_tombstone),
        cmocka_unit_test(test_extend_enomem),
        cmocka_unit_test(test_free_group),
        cmocka_unit_test(test_window_rule),
        cmocka_unit_test(test_pool_mha),
        cmocka_unit_test(test_pool_mla),
        cmocka_unit_test(test_random_ps1),
        cmocka_unit_test(test_random_ps16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
