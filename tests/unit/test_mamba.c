/* Mamba state pool: slots and their states, copies, per-layer reads and writes,
 * the request map with and without track slots, the checkpoint arithmetic, and a randomized
 * run against a reference model. KVT_SEED=<n> reruns the randomized run. */
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
#include "device/mamba_ckpt.h"
#include "device/mamba_pool.h"
#include "device/mamba_req.h"

/* Odd sizes, different per part, so a copy or an offset of the wrong part shows. */
static const struct mamba_geometry GEO = {.layers = 3, .conv_bytes = 24, .ssm_bytes = 40};
#define MAX_PART 40

/* The byte i of one layer's part of a state tagged tag; tag 0 is the zero state. */
static uint8_t pattern(uint64_t tag, uint32_t layer, int part, size_t i)
{
    return tag ? (uint8_t)rng_mix(tag * 1000003 + layer * 131 + (uint64_t)part * 17 + i) : 0;
}

static size_t part_size(int part)
{
    return part == MAMBA_CONV ? GEO.conv_bytes : GEO.ssm_bytes;
}

static int write_state(struct mamba_pool *p, int32_t s, uint64_t tag)
{
    uint8_t buf[MAX_PART];

    for (uint32_t l = 0; l < GEO.layers; l++)
        for (int w = 0; w < 2; w++) {
            for (size_t i = 0; i < part_size(w); i++)
                buf[i] = pattern(tag, l, w, i);
            int rc = mamba_pool_write(p, s, l, (enum mamba_part)w, buf);
            if (rc)
                return rc;
        }
    return 0;
}

/* 1 when every layer and part of slot s holds tag's bytes. */
static int state_is(const struct mamba_pool *p, int32_t s, uint64_t tag)
{
    uint8_t buf[MAX_PART];

    for (uint32_t l = 0; l < GEO.layers; l++)
        for (int w = 0; w < 2; w++) {
            if (mamba_pool_read(p, s, l, (enum mamba_part)w, buf))
                return 0;
            for (size_t i = 0; i < part_size(w); i++)
                if (buf[i] != pattern(tag, l, w, i))
                    return 0;
        }
    return 1;
}

static void pool_init(struct mamba_pool *p, uint32_t nslots)
{
    assert_int_equal(mamba_pool_init(p, &dev_backend_sim, &GEO, nslots), 0);
}

static void test_pool_basics(void **state)
{
    struct mamba_pool p;
    struct mamba_geometry g = GEO;
    int32_t s[8];

    (void)state;
    assert_int_equal(mamba_pool_init(&p, &dev_backend_sim, &GEO, 0), -EINVAL);
    g.layers = 0;
    assert_int_equal(mamba_pool_init(&p, &dev_backend_sim, &g, 4), -EINVAL);
    g = GEO;
    g.ssm_bytes = 0;
    assert_int_equal(mamba_pool_init(&p, &dev_backend_sim, &g, 4), -EINVAL);
    assert_int_equal(mamba_slot_bytes(&GEO), 3 * (24 + 40));

    pool_init(&p, 6);
    assert_int_equal(mamba_pool_bytes(&p), 7 * mamba_slot_bytes(&GEO)); /* slot 0 too */
    assert_int_equal(mamba_pool_available(&p), 6);
    assert_int_equal(mamba_pool_slot_state(&p, 0), MAMBA_SLOT_RESERVED);
    assert_int_equal(mamba_pool_slot_state(&p, 7), -EINVAL);
    /* Slot 0 is the padding slot: the first handed out is 1. */
    assert_int_equal(mamba_pool_alloc(&p, 4, s), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(s[i], i + 1);
        assert_int_equal(mamba_pool_slot_state(&p, s[i]), MAMBA_SLOT_USED);
    }
    assert_int_equal(mamba_pool_available(&p), 2);
    assert_int_equal(mamba_pool_alloc(&p, 3, s + 4), -ENOMEM); /* all or nothing */
    assert_int_equal(mamba_pool_available(&p), 2);
    assert_int_equal(mamba_pool_alloc(&p, 1, NULL), -EINVAL);
    /* First in, first out: freed slots come back after the never-used ones, in the order
     * they were given back. */
    const int32_t back[] = {3, 1};
    assert_int_equal(mamba_pool_free(&p, back, 2), 0);
    assert_int_equal(mamba_pool_slot_state(&p, 3), MAMBA_SLOT_FREE);
    assert_int_equal(mamba_pool_alloc(&p, 4, s), 0);
    assert_int_equal(s[0], 5);
    assert_int_equal(s[1], 6);
    assert_int_equal(s[2], 3);
    assert_int_equal(s[3], 1);
    assert_int_equal(mamba_pool_available(&p), 0);
    assert_int_equal(mamba_pool_alloc(&p, 1, s), -ENOMEM);
    mamba_pool_clear(&p);
    assert_int_equal(mamba_pool_available(&p), 6);
    mamba_pool_finish(&p);
}

static void test_pool_free_errors(void **state)
{
    struct mamba_pool p;
    int32_t s[4];

    (void)state;
    pool_init(&p, 6);
    assert_int_equal(mamba_pool_alloc(&p, 3, s), 0); /* 1, 2, 3 */
    const int32_t never[] = {4}, out[] = {7}, neg[] = {-1}, pad[] = {0};
    assert_int_equal(mamba_pool_free(&p, never, 1), -EINVAL);
    assert_int_equal(mamba_pool_free(&p, out, 1), -EINVAL);
    assert_int_equal(mamba_pool_free(&p, neg, 1), -EINVAL);
    assert_int_equal(mamba_pool_free(&p, pad, 1), -EINVAL);
    assert_int_equal(mamba_pool_free(&p, NULL, 1), -EINVAL);
    /* A batch naming a slot twice, or one bad slot after good ones, changes nothing. */
    const int32_t twice[] = {1, 2, 1}, late_bad[] = {1, 2, 5};
    assert_int_equal(mamba_pool_free(&p, twice, 3), -EINVAL);
    assert_int_equal(mamba_pool_free(&p, late_bad, 3), -EINVAL);
    assert_int_equal(mamba_pool_available(&p), 3);
    for (int32_t i = 1; i <= 3; i++)
        assert_int_equal(mamba_pool_slot_state(&p, i), MAMBA_SLOT_USED);
    /* Double free. */
    assert_int_equal(mamba_pool_free(&p, s, 1), 0);
    assert_int_equal(mamba_pool_free(&p, s, 1), -EINVAL);
    assert_int_equal(mamba_pool_available(&p), 4);
    /* A cached slot is the cache's: not freed as a request's, released once. */
    assert_int_equal(mamba_pool_claim(&p, s + 1, 1), 0);
    assert_int_equal(mamba_pool_slot_state(&p, 2), MAMBA_SLOT_CACHED);
    assert_int_equal(mamba_pool_free(&p, s + 1, 1), -EINVAL);
    assert_int_equal(mamba_pool_claim(&p, s + 1, 1), -EINVAL);
    assert_int_equal(mamba_pool_release(&p, s + 2, 1), -EINVAL); /* USED, not cached */
    assert_int_equal(mamba_pool_release(&p, s + 1, 1), 0);
    assert_int_equal(mamba_pool_release(&p, s + 1, 1), -EINVAL);
    assert_int_equal(mamba_pool_available(&p), 5);
    assert_int_equal(mamba_pool_free(&p, s + 2, 1), 0);
    assert_int_equal(mamba_pool_available(&p), 6);
    assert_int_equal(mamba_pool_free(&p, s, 0), 0); /* an empty batch */
    mamba_pool_finish(&p);
}

static void test_pool_copy(void **state)
{
    struct mamba_pool p;
    int32_t s[6];

    (void)state;
    pool_init(&p, 8);
    assert_int_equal(mamba_pool_alloc(&p, 5, s), 0); /* 1..5 */
    assert_true(state_is(&p, s[0], 0));              /* fresh slots are zero */
    assert_int_equal(write_state(&p, s[0], 11), 0);
    assert_int_equal(write_state(&p, s[1], 22), 0);
    assert_int_equal(mamba_pool_copy(&p, &s[0], &s[2], 1), 0);
    assert_true(state_is(&p, s[2], 11));
    assert_true(state_is(&p, s[0], 11));
    /* From a checkpoint the cache owns, in a batch of two. */
    assert_int_equal(mamba_pool_claim(&p, &s[1], 1), 0);
    const int32_t src[] = {s[1], s[0]}, dst[] = {s[3], s[4]};
    assert_int_equal(mamba_pool_copy(&p, src, dst, 2), 0);
    assert_true(state_is(&p, s[3], 22));
    assert_true(state_is(&p, s[4], 11));

    /* Refused, copying nothing: into a free or cached slot, from a free slot, onto itself,
     * a destination twice, a destination that is another pair's source. */
    const int32_t free_slot = 7, cached = s[1];
    assert_int_equal(mamba_pool_copy(&p, &s[0], &free_slot, 1), -EINVAL);
    assert_int_equal(mamba_pool_copy(&p, &s[0], &cached, 1), -EINVAL);
    assert_int_equal(mamba_pool_copy(&p, &free_slot, &s[2], 1), -EINVAL);
    assert_int_equal(mamba_pool_copy(&p, &s[2], &s[2], 1), -EINVAL);
    const int32_t src2[] = {s[0], s[1]}, dup[] = {s[2], s[2]};
    assert_int_equal(mamba_pool_copy(&p, src2, dup, 2), -EINVAL);
    const int32_t chain_src[] = {s[1], s[2]}, chain_dst[] = {s[2], s[3]};
    assert_int_equal(mamba_pool_copy(&p, chain_src, chain_dst, 2), -EINVAL);
    assert_true(state_is(&p, s[2], 11));
    assert_true(state_is(&p, s[3], 22));
    assert_int_equal(mamba_pool_slot_state(&p, s[2]), MAMBA_SLOT_USED); /* marks undone */

    /* Zeroing: USED slots only. */
    assert_int_equal(mamba_pool_zero(&p, &s[2], 1), 0);
    assert_true(state_is(&p, s[2], 0));
    assert_int_equal(mamba_pool_zero(&p, &cached, 1), -EINVAL);
    assert_true(state_is(&p, cached, 22));
    /* Bytes stay with a freed slot: the next holder zeroes or overwrites them. */
    assert_int_equal(mamba_pool_free(&p, &s[4], 1), 0);
    assert_int_equal(mamba_pool_alloc(&p, 4, s), 0); /* 6, 7, 8, then 5 */
    assert_int_equal(s[3], 5);
    assert_true(state_is(&p, 5, 11));
    mamba_pool_finish(&p);
}

static void test_pool_read_write(void **state)
{
    struct mamba_pool p;
    int32_t s[2];
    uint8_t buf[MAX_PART], got[MAX_PART];

    (void)state;
    pool_init(&p, 4);
    assert_int_equal(mamba_pool_alloc(&p, 2, s), 0);
    memset(buf, 0xab, sizeof(buf));
    /* One layer's one part moves; its neighbours (the other part, the other layers, the
     * next slot) do not. */
    assert_int_equal(mamba_pool_write(&p, s[0], 1, MAMBA_SSM, buf), 0);
    assert_int_equal(mamba_pool_read(&p, s[0], 1, MAMBA_SSM, got), 0);
    assert_memory_equal(got, buf, GEO.ssm_bytes);
    memset(buf, 0, sizeof(buf));
    assert_int_equal(mamba_pool_read(&p, s[0], 1, MAMBA_CONV, got), 0);
    assert_memory_equal(got, buf, GEO.conv_bytes);
    assert_int_equal(mamba_pool_read(&p, s[0], 0, MAMBA_SSM, got), 0);
    assert_memory_equal(got, buf, GEO.ssm_bytes);
    assert_int_equal(mamba_pool_read(&p, s[0], 2, MAMBA_SSM, got), 0);
    assert_memory_equal(got, buf, GEO.ssm_bytes);
    assert_int_equal(mamba_pool_read(&p, s[1], 1, MAMBA_SSM, got), 0);
    assert_memory_equal(got, buf, GEO.ssm_bytes);
    /* Refused: a layer out of range, a part that is neither, no buffer, a free slot, the
     * padding slot, out of range. */
    assert_int_equal(mamba_pool_write(&p, s[0], 3, MAMBA_CONV, buf), -EINVAL);
    assert_int_equal(mamba_pool_write(&p, s[0], 0, (enum mamba_part)2, buf), -EINVAL);
    assert_int_equal(mamba_pool_write(&p, s[0], 0, MAMBA_CONV, NULL), -EINVAL);
    assert_int_equal(mamba_pool_read(&p, s[0], 0, MAMBA_CONV, NULL), -EINVAL);
    assert_int_equal(mamba_pool_write(&p, 3, 0, MAMBA_CONV, buf), -EINVAL);
    assert_int_equal(mamba_pool_read(&p, 3, 0, MAMBA_CONV, got), -EINVAL);
    assert_int_equal(mamba_pool_write(&p, 0, 0, MAMBA_CONV, buf), -EINVAL);
    assert_int_equal(mamba_pool_read(&p, 5, 0, MAMBA_CONV, got), -EINVAL);
    /* A cached slot is read and written (a checkpoint loaded back from the host). */
    assert_int_equal(mamba_pool_claim(&p, &s[1], 1), 0);
    assert_int_equal(write_state(&p, s[1], 5), 0);
    assert_true(state_is(&p, s[1], 5));
    mamba_pool_finish(&p);
}

/* ---- the request map ---- */

static void test_req_no_extra_buffer(void **state)
{
    struct mamba_pool p;
    struct mamba_req_map m;
    int32_t kept = 99, slot;

    (void)state;
    pool_init(&p, 3);
    assert_int_equal(mamba_req_init(&m, &p, 4, 3), -EINVAL); /* at most two track slots */
    assert_int_equal(mamba_req_init(&m, &p, 0, 0), -EINVAL);
    assert_int_equal(mamba_req_init(&m, &p, 4, 0), 0);
    assert_int_equal(mamba_req_slots_per_req(&m), 1);
    assert_false(mamba_req_holds(&m, 0));
    assert_int_equal(mamba_req_slot(&m, 0), MAMBA_NO_SLOT);
    assert_int_equal(mamba_req_alloc(&m, 4), -EINVAL);
    assert_int_equal(mamba_req_alloc(&m, -1), -EINVAL);

    assert_int_equal(mamba_req_alloc(&m, 2), 0);
    slot = mamba_req_slot(&m, 2);
    assert_int_equal(slot, 1);
    assert_true(mamba_req_holds(&m, 2));
    assert_int_equal(mamba_req_track(&m, 2, 0), MAMBA_NO_SLOT);
    /* A row that holds its slot (a later chunk of a chunked prefill) takes nothing more. */
    assert_int_equal(mamba_req_alloc(&m, 2), 0);
    assert_int_equal(mamba_req_slot(&m, 2), slot);
    assert_int_equal(mamba_pool_available(&p), 2);

    /* Plain free, then a double free. */
    assert_int_equal(mamba_req_free(&m, 2, MAMBA_KEEP_NONE, &kept), 0);
    assert_int_equal(kept, MAMBA_NO_SLOT);
    assert_int_equal(mamba_pool_slot_state(&p, slot), MAMBA_SLOT_FREE);
    assert_int_equal(mamba_req_free(&m, 2, MAMBA_KEEP_NONE, NULL), -EINVAL);
    assert_int_equal(mamba_pool_available(&p), 3);

    /* Without track slots the running state at the end is the checkpoint: kept, it is
     * the cache's. A track slot cannot be kept where there is none. */
    assert_int_equal(mamba_req_alloc(&m, 0), 0);
    slot = mamba_req_slot(&m, 0);
    assert_int_equal(mamba_req_free(&m, 0, MAMBA_KEEP_TRACK0, &kept), -EINVAL);
    assert_true(mamba_req_holds(&m, 0));
    assert_int_equal(mamba_req_free(&m, 0, MAMBA_KEEP_RUNNING, &kept), 0);
    assert_int_equal(kept, slot);
    assert_int_equal(mamba_pool_slot_state(&p, slot), MAMBA_SLOT_CACHED);
    assert_false(mamba_req_holds(&m, 0));
    assert_int_equal(mamba_pool_available(&p), 2);

    /* A full pool: -ENOMEM, the row stays empty. */
    assert_int_equal(mamba_req_alloc(&m, 1), 0);
    assert_int_equal(mamba_req_alloc(&m, 3), 0);
    assert_int_equal(mamba_req_alloc(&m, 2), -ENOMEM);
    assert_false(mamba_req_holds(&m, 2));
    mamba_req_finish(&m);
    mamba_pool_finish(&p);
}

static void test_req_extra_buffer(void **state)
{
    struct mamba_pool p;
    struct mamba_req_map m;
    int32_t kept, donated, run, t0, t1;

    (void)state;
    pool_init(&p, 7);
    assert_int_equal(mamba_req_init(&m, &p, 4, 2), 0);
    assert_int_equal(mamba_req_slots_per_req(&m), 3);
    assert_int_equal(mamba_req_alloc(&m, 1), 0);
    run = mamba_req_slot(&m, 1);
    t0 = mamba_req_track(&m, 1, 0);
    t1 = mamba_req_track(&m, 1, 1);
    assert_int_equal(run, 1);
    assert_int_equal(t0, 2);
    assert_int_equal(t1, 3);
    assert_int_equal(mamba_req_track(&m, 1, 2), MAMBA_NO_SLOT);
    assert_int_equal(mamba_pool_available(&p), 4);

    /* Donating track slot 1 mid-request: the cache gets it, a fresh slot takes its place. */
    assert_int_equal(write_state(&p, t1, 7), 0);
    assert_int_equal(mamba_req_donate(&m, 1, 1, &donated), 0);
    assert_int_equal(donated, t1);
    assert_int_equal(mamba_pool_slot_state(&p, t1), MAMBA_SLOT_CACHED);
    assert_true(state_is(&p, t1, 7));
    assert_int_equal(mamba_req_track(&m, 1, 1), 4);
    assert_int_equal(mamba_pool_available(&p), 3);
    assert_int_equal(mamba_req_donate(&m, 1, 2, &donated), -EINVAL);
    assert_int_equal(mamba_req_donate(&m, 0, 0, &donated), -EINVAL); /* holds nothing */

    /* Two more requests fill the pool: the second finds two of three and takes none. */
    assert_int_equal(mamba_req_alloc(&m, 2), 0);
    assert_int_equal(mamba_pool_available(&p), 0);
    assert_int_equal(mamba_req_donate(&m, 2, 0, &donated), -ENOMEM);
    assert_int_equal(mamba_pool_slot_state(&p, mamba_req_track(&m, 2, 0)), MAMBA_SLOT_USED);
    assert_int_equal(mamba_pool_release(&p, &t1, 1), 0); /* the cache drops it */
    assert_int_equal(mamba_req_alloc(&m, 3), -ENOMEM);
    assert_false(mamba_req_holds(&m, 3));
    assert_int_equal(mamba_pool_available(&p), 1);

    /* Finishing with the state in track slot 0 kept: the rest is freed. */
    t0 = mamba_req_track(&m, 1, 0);
    assert_int_equal(mamba_req_free(&m, 1, MAMBA_KEEP_TRACK0, &kept), 0);
    assert_int_equal(kept, t0);
    assert_int_equal(mamba_pool_slot_state(&p, t0), MAMBA_SLOT_CACHED);
    assert_int_equal(mamba_pool_slot_state(&p, run), MAMBA_SLOT_FREE);
    assert_int_equal(mamba_pool_slot_state(&p, 4), MAMBA_SLOT_FREE);
    assert_int_equal(mamba_req_track(&m, 1, 0), MAMBA_NO_SLOT);
    assert_int_equal(mamba_pool_available(&p), 3);
    assert_int_equal(mamba_req_free(&m, 1, MAMBA_KEEP_NONE, NULL), -EINVAL);
    assert_int_equal(mamba_req_free(&m, 2, MAMBA_KEEP_NONE, NULL), 0);
    assert_int_equal(mamba_pool_available(&p), 6);
    mamba_req_finish(&m);

    /* One track slot (no overlap): track slot 1 is nobody's to keep. */
    assert_int_equal(mamba_req_init(&m, &p, 2, 1), 0);
    assert_int_equal(mamba_req_alloc(&m, 0), 0);
    assert_int_equal(mamba_pool_available(&p), 4);
    assert_int_equal(mamba_req_track(&m, 0, 1), MAMBA_NO_SLOT);
    assert_int_equal(mamba_req_free(&m, 0, MAMBA_KEEP_TRACK1, &kept), -EINVAL);
    assert_int_equal(mamba_req_free(&m, 0, MAMBA_KEEP_NONE, &kept), 0);
    assert_int_equal(mamba_pool_available(&p), 6);
    mamba_req_finish(&m);
    mamba_pool_finish(&p);
}

static void test_req_cow(void **state)
{
    struct mamba_pool p;
    struct mamba_req_map m;
    int32_t ckpt, other;

    (void)state;
    pool_init(&p, 5);
    assert_int_equal(mamba_req_init(&m, &p, 3, 1), 0);
    /* A finished request leaves its state as a checkpoint. */
    assert_int_equal(mamba_req_alloc(&m, 0), 0);
    assert_int_equal(write_state(&p, mamba_req_track(&m, 0, 0), 42), 0);
    assert_int_equal(mamba_req_free(&m, 0, MAMBA_KEEP_TRACK0, &ckpt), 0);
    assert_int_equal(mamba_pool_available(&p), 4);

    /* A match hands a new request a private copy; the checkpoint stays the cache's, and
     * the request's writes do not reach it. */
    assert_int_equal(mamba_req_cow(&m, 1, ckpt), 0);
    assert_true(mamba_req_holds(&m, 1));
    assert_true(state_is(&p, mamba_req_slot(&m, 1), 42));
    assert_int_equal(mamba_pool_slot_state(&p, ckpt), MAMBA_SLOT_CACHED);
    assert_int_equal(mamba_req_track(&m, 1, 0), MAMBA_NO_SLOT);
    assert_int_equal(mamba_req_alloc(&m, 1), 0); /* adds only the track slot */
    assert_int_equal(mamba_pool_available(&p), 2);
    assert_int_equal(write_state(&p, mamba_req_slot(&m, 1), 43), 0);
    assert_true(state_is(&p, ckpt, 42));
    /* Into a row that holds a slot: copied over it, no slot taken. */
    assert_int_equal(mamba_req_cow(&m, 1, ckpt), 0);
    assert_true(state_is(&p, mamba_req_slot(&m, 1), 42));
    assert_int_equal(mamba_pool_available(&p), 2);

    /* Refused, the row left as it was: its own track or running slot, a free slot, and a
     * full pool (the slot taken for the copy is given back). */
    assert_int_equal(mamba_req_cow(&m, 1, mamba_req_track(&m, 1, 0)), -EINVAL);
    assert_int_equal(mamba_req_cow(&m, 1, mamba_req_slot(&m, 1)), -EINVAL);
    other = 5;
    assert_int_equal(mamba_pool_slot_state(&p, other), MAMBA_SLOT_FREE);
    assert_int_equal(mamba_req_cow(&m, 2, other), -EINVAL);
    assert_false(mamba_req_holds(&m, 2));
    assert_int_equal(mamba_pool_available(&p), 2);
    assert_int_equal(mamba_req_alloc(&m, 2), 0);
    assert_int_equal(mamba_pool_available(&p), 0);
    assert_int_equal(mamba_req_cow(&m, 0, ckpt), -ENOMEM);
    assert_false(mamba_req_holds(&m, 0));
    assert_int_equal(mamba_req_free(&m, 2, MAMBA_KEEP_NONE, NULL), 0);
    assert_int_equal(mamba_req_free(&m, 1, MAMBA_KEEP_NONE, NULL), 0);
    assert_int_equal(mamba_pool_available(&p), 4);
    mamba_req_finish(&m);
    mamba_pool_finish(&p);
}

/* ---- checkpoint arithmetic ---- */

static void test_ckpt_grids(void **state)
{
    struct mamba_ckpt_rules r;

    (void)state;
    mamba_ckpt_rules_default(&r, 1);
    assert_int_equal(mamba_ckpt_rules_check(&r), 0);
    assert_int_equal(mamba_ckpt_grid(&r), 64);
    assert_int_equal(mamba_ckpt_decode_grid(&r), 256);
    mamba_ckpt_rules_default(&r, 16); /* a page below the chunk changes nothing */
    assert_int_equal(mamba_ckpt_grid(&r), 64);
    assert_int_equal(mamba_ckpt_decode_grid(&r), 256);
    mamba_ckpt_rules_default(&r, 128); /* a page above it moves the grid to the page */
    assert_int_equal(mamba_ckpt_grid(&r), 128);
    assert_int_equal(mamba_ckpt_decode_grid(&r), 256);
    mamba_ckpt_rules_default(&r, 512);
    assert_int_equal(mamba_ckpt_decode_grid(&r), 512);
    r = (struct mamba_ckpt_rules){.chunk = 64, .track_interval = 192, .page_size = 128};
    assert_int_equal(mamba_ckpt_rules_check(&r), 0);
    assert_int_equal(mamba_ckpt_decode_grid(&r), 384); /* lcm(128, 192) */

    r = (struct mamba_ckpt_rules){.chunk = 64, .track_interval = 100, .page_size = 1};
    assert_int_equal(mamba_ckpt_rules_check(&r), -EINVAL); /* not a multiple of 64 */
    r.track_interval = 0;
    assert_int_equal(mamba_ckpt_rules_check(&r), -EINVAL);
    r = (struct mamba_ckpt_rules){.chunk = 48, .track_interval = 96, .page_size = 1};
    assert_int_equal(mamba_ckpt_rules_check(&r), -EINVAL);
    r = (struct mamba_ckpt_rules){.chunk = 64, .track_interval = 256, .page_size = 3};
    assert_int_equal(mamba_ckpt_rules_check(&r), -EINVAL);
    assert_int_equal(mamba_ckpt_rules_check(NULL), -EINVAL);

    /* Prefill: whole grids of the extend past the prefix; decode: every 256 tokens. */
    mamba_ckpt_rules_default(&r, 1);
    assert_int_equal(mamba_ckpt_prefill_track(&r, 0, 63), 0);
    assert_int_equal(mamba_ckpt_prefill_track(&r, 0, 64), 64);
    assert_int_equal(mamba_ckpt_prefill_track(&r, 0, 230), 192);
    assert_int_equal(mamba_ckpt_prefill_track(&r, 192, 88), 256);
    assert_int_equal(mamba_ckpt_prefill_track(&r, 192, 38), 0);
    assert_false(mamba_ckpt_decode_due(&r, 0));
    assert_false(mamba_ckpt_decode_due(&r, 192)); /* a prefill grid point, not decode's */
    assert_false(mamba_ckpt_decode_due(&r, 255));
    assert_true(mamba_ckpt_decode_due(&r, 256));
    assert_false(mamba_ckpt_decode_due(&r, 257));
    assert_true(mamba_ckpt_decode_due(&r, 1024));
}

/* The design's seed examples that need no tree. */
static void test_ckpt_seed_examples(void **state)
{
    struct mamba_ckpt_rules r;
    const uint64_t to192[] = {128, 64, 192}, to256[] = {64, 128, 192, 256};

    (void)state;
    mamba_ckpt_rules_default(&r, 1);
    /* A 230-token prefix with checkpoints at 64, 128 and 192 reuses 192. */
    assert_int_equal(mamba_ckpt_effective(230, to192, 3), 192);
    /* A 280-token prefix reuses 256 where that checkpoint exists, else 192. */
    assert_int_equal(mamba_ckpt_effective(280, to256, 4), 256);
    assert_int_equal(mamba_ckpt_effective(280, to192, 3), 192);
    /* The 280-token request that finds only 192 branches at 256 and checkpoints there in
     * its prefill (an extend of 88 past 192); one of 230 finds no point past 192. */
    assert_int_equal(mamba_ckpt_branching(&r, 280, 192), 256);
    assert_int_equal(mamba_ckpt_prefill_track(&r, 192, 280 - 192), 256);
    assert_int_equal(mamba_ckpt_branching(&r, 230, 192), 0);
    assert_int_equal(mamba_ckpt_branching(&r, 280, 256), 0);
    /* No checkpoint at or below the hit: nothing is reused. */
    assert_int_equal(mamba_ckpt_effective(63, to192, 3), 0);
    assert_int_equal(mamba_ckpt_effective(500, NULL, 0), 0);
    assert_int_equal(mamba_ckpt_effective(192, to192, 3), 192);
}

/* ---- randomized run against a reference model ---- */

#define R_SLOTS 9
#define R_REQS 5
#define R_STEPS 4000
#define DEFAULT_SEED 0x6d616d6261ull

enum { OWN_FREE, OWN_REQ, OWN_CACHED };

/* The model: who owns each slot, the tag of its bytes, each row's slots, and the free list
 * in the order the pool must hand it out. */
struct rsim {
    const char *config;
    uint64_t seed, rng, step;
    const char *op;
    uint32_t ntrack;
    struct mamba_pool p;
    struct mamba_req_map m;
    int own[R_SLOTS + 1];
    uint64_t tag[R_SLOTS + 1], next_tag;
    int32_t run[R_REQS], trk[R_REQS][MAMBA_TRACK_MAX];
    int32_t queue[R_SLOTS];
    uint32_t qhead, qlen;
    uint64_t cows, donated, kept, enomem; /* what the run exercised */
};

#define HARNESS_RUN(s)                                                                             \
    (&(struct harness_run){.prog = "test_mamba",                                                   \
                           .config = (s)->config,                                                  \
                           .seed = (s)->seed,                                                      \
                           .step = (s)->step,                                                      \
                           .op = (s)->op})

static uint32_t rbelow(struct rsim *s, uint32_t n)
{
    return (uint32_t)(rng_next(&s->rng) % n);
}

static int32_t model_pop(struct rsim *s)
{
    int32_t v = s->queue[s->qhead];

    s->qhead = (s->qhead + 1) % R_SLOTS;
    s->qlen--;
    s->own[v] = OWN_REQ;
    return v;
}

static void model_push(struct rsim *s, int32_t v)
{
    s->queue[(s->qhead + s->qlen) % R_SLOTS] = v;
    s->qlen++;
    s->own[v] = OWN_FREE;
}

static int row_holds(const struct rsim *s, int r)
{
    return s->run[r] != MAMBA_NO_SLOT;
}

static int is_row_track(const struct rsim *s, int r, int32_t v)
{
    for (uint32_t t = 0; t < s->ntrack; t++)
        if (s->trk[r][t] == v)
            return 1;
    return 0;
}

static void op_alloc(struct rsim *s, int r)
{
    uint32_t need = (row_holds(s, r) ? 0 : 1) + (s->ntrack && s->trk[r][0] < 0 ? s->ntrack : 0);

    s->op = "req_alloc";
    if (need > s->qlen) {
        s->enomem++;
        EXPECT_RC(s, mamba_req_alloc(&s->m, r), -ENOMEM);
        return;
    }
    EXPECT_RC(s, mamba_req_alloc(&s->m, r), 0);
    if (!row_holds(s, r))
        s->run[r] = model_pop(s);
    if (s->ntrack && s->trk[r][0] < 0)
        for (uint32_t t = 0; t < s->ntrack; t++)
            s->trk[r][t] = model_pop(s);
}

/* A source: mostly a slot holding a state, sometimes any slot. */
static int32_t pick_slot(struct rsim *s)
{
    for (int tries = 0; tries < 8 && rbelow(s, 4); tries++) {
        int32_t v = (int32_t)(1 + rbelow(s, R_SLOTS));
        if (s->own[v] != OWN_FREE)
            return v;
    }
    return (int32_t)rbelow(s, R_SLOTS + 2) - 1; /* -1 .. R_SLOTS */
}

static void op_cow(struct rsim *s, int r)
{
    int32_t src = pick_slot(s);
    int valid = src >= 1 && src <= R_SLOTS && s->own[src] != OWN_FREE && src != s->run[r] &&
                !is_row_track(s, r, src);

    s->op = "req_cow";
    if (!valid) {
        EXPECT_RC(s, mamba_req_cow(&s->m, r, src), -EINVAL);
        return;
    }
    if (!row_holds(s, r) && s->qlen == 0) {
        EXPECT_RC(s, mamba_req_cow(&s->m, r, src), -ENOMEM);
        return;
    }
    EXPECT_RC(s, mamba_req_cow(&s->m, r, src), 0);
    if (!row_holds(s, r))
        s->run[r] = model_pop(s);
    s->tag[s->run[r]] = s->tag[src];
    s->cows++;
}

static void op_write(struct rsim *s, int r)
{
    uint32_t which = rbelow(s, 1 + s->ntrack);
    int32_t v = which == 0 ? s->run[r] : s->trk[r][which - 1];

    s->op = "write";
    if (v == MAMBA_NO_SLOT)
        return;
    s->tag[v] = ++s->next_tag;
    EXPECT_RC(s, write_state(&s->p, v, s->tag[v]), 0);
}

static void op_zero(struct rsim *s, int r)
{
    s->op = "zero";
    if (!row_holds(s, r))
        return;
    EXPECT_RC(s, mamba_pool_zero(&s->p, &s->run[r], 1), 0);
    s->tag[s->run[r]] = 0;
}

static void op_donate(struct rsim *s, int r)
{
    uint32_t idx = rbelow(s, MAMBA_TRACK_MAX + 1);
    int32_t got = -2, old;

    s->op = "donate";
    if (idx >= s->ntrack || s->trk[r][idx] == MAMBA_NO_SLOT) {
        EXPECT_RC(s, mamba_req_donate(&s->m, r, idx, &got), -EINVAL);
        return;
    }
    if (s->qlen == 0) {
        EXPECT_RC(s, mamba_req_donate(&s->m, r, idx, &got), -ENOMEM);
        return;
    }
    old = s->trk[r][idx];
    EXPECT_RC(s, mamba_req_donate(&s->m, r, idx, &got), 0);
    REQUIRE(s, got == old);
    s->trk[r][idx] = model_pop(s);
    s->own[old] = OWN_CACHED;
    s->donated++;
}

static int32_t model_kept(const struct rsim *s, int r, int keep)
{
    if (keep == MAMBA_KEEP_RUNNING)
        return s->run[r];
    if (keep >= 0 && (uint32_t)keep < s->ntrack)
        return s->trk[r][keep];
    return MAMBA_NO_SLOT;
}

static void op_free(struct rsim *s, int r)
{
    int keep = (int)rbelow(s, 4) - 1; /* NONE, TRACK0, TRACK1, RUNNING */
    int32_t k = model_kept(s, r, keep), got = -2;

    s->op = "req_free";
    if (!row_holds(s, r) || (keep != MAMBA_KEEP_NONE && k == MAMBA_NO_SLOT)) {
        EXPECT_RC(s, mamba_req_free(&s->m, r, (enum mamba_keep)keep, &got), -EINVAL);
        return;
    }
    EXPECT_RC(s, mamba_req_free(&s->m, r, (enum mamba_keep)keep, &got), 0);
    REQUIRE(s, got == k);
    if (s->run[r] != k)
        model_push(s, s->run[r]);
    for (uint32_t t = 0; t < s->ntrack; t++)
        if (s->trk[r][t] != MAMBA_NO_SLOT && s->trk[r][t] != k)
            model_push(s, s->trk[r][t]);
    if (k != MAMBA_NO_SLOT) {
        s->own[k] = OWN_CACHED;
        s->kept++;
    }
    s->run[r] = MAMBA_NO_SLOT;
    for (uint32_t t = 0; t < MAMBA_TRACK_MAX; t++)
        s->trk[r][t] = MAMBA_NO_SLOT;
}

static void op_release(struct rsim *s)
{
    int32_t v = pick_slot(s);

    s->op = "release";
    if (v < 1 || v > R_SLOTS || s->own[v] != OWN_CACHED) {
        EXPECT_RC(s, mamba_pool_release(&s->p, &v, 1), -EINVAL);
        return;
    }
    EXPECT_RC(s, mamba_pool_release(&s->p, &v, 1), 0);
    model_push(s, v);
}

/* Frees that must be refused: a slot named twice, or one no request holds as USED. */
static void op_bad_free(struct rsim *s)
{
    int32_t v = pick_slot(s), twice[2] = {v, v};

    s->op = "bad_free";
    EXPECT_RC(s, mamba_pool_free(&s->p, twice, 2), -EINVAL);
    if (v < 1 || v > R_SLOTS || s->own[v] != OWN_REQ)
        EXPECT_RC(s, mamba_pool_free(&s->p, &v, 1), -EINVAL);
}

static void check_invariants(struct rsim *s)
{
    int owners[R_SLOTS + 1] = {0};
    uint32_t nfree = 0;

    s->op = "check";
    for (int r = 0; r < R_REQS; r++) {
        REQUIRE(s, mamba_req_slot(&s->m, r) == s->run[r]);
        for (uint32_t t = 0; t < MAMBA_TRACK_MAX; t++)
            REQUIRE(s, mamba_req_track(&s->m, r, t) == s->trk[r][t]);
        /* Track slots come all or none, and only beside a running slot (a COW gives the
         * running slot alone; the next alloc adds the track slots). */
        for (uint32_t t = 0; t < s->ntrack; t++)
            REQUIRE(s, (s->trk[r][t] != MAMBA_NO_SLOT) == (s->trk[r][0] != MAMBA_NO_SLOT));
        REQUIRE(s, s->trk[r][0] == MAMBA_NO_SLOT || row_holds(s, r));
        for (uint32_t i = 0; i <= s->ntrack; i++) {
            int32_t v = i == 0 ? s->run[r] : s->trk[r][i - 1];
            if (v == MAMBA_NO_SLOT)
                continue;
            REQUIRE(s, v >= 1 && v <= R_SLOTS);
            REQUIRE(s, s->own[v] == OWN_REQ);
            owners[v]++;
        }
    }
    for (int32_t v = 1; v <= R_SLOTS; v++) {
        int want = s->own[v] == OWN_FREE     ? MAMBA_SLOT_FREE
                   : s->own[v] == OWN_CACHED ? MAMBA_SLOT_CACHED
                                             : MAMBA_SLOT_USED;
        REQUIRE(s, mamba_pool_slot_state(&s->p, v) == want);
        REQUIRE(s, owners[v] == (s->own[v] == OWN_REQ)); /* no slot held twice */
        nfree += s->own[v] == OWN_FREE;
        if (s->own[v] != OWN_FREE)
            REQUIRE(s, state_is(&s->p, v, s->tag[v]));
    }
    REQUIRE(s, mamba_pool_slot_state(&s->p, 0) == MAMBA_SLOT_RESERVED);
    REQUIRE(s, nfree == s->qlen);
    REQUIRE(s, mamba_pool_available(&s->p) == nfree);
}

static void step(struct rsim *s)
{
    int r = (int)rbelow(s, R_REQS);

    switch (rbelow(s, 10)) {
    case 0:
    case 1:
        op_alloc(s, r);
        break;
    case 2:
        op_cow(s, r);
        break;
    case 3:
    case 4:
        op_write(s, r);
        break;
    case 5:
        op_donate(s, r);
        break;
    case 6:
        op_free(s, r);
        break;
    case 7: /* the cache drops a checkpoint less often than requests leave one, so the
             * pool fills and -ENOMEM is met */
        if (rbelow(s, 2))
            op_release(s);
        else
            op_alloc(s, r);
        break;
    case 8:
        op_zero(s, r);
        break;
    default:
        op_bad_free(s);
        break;
    }
}

static void run_random(const char *config, uint32_t ntrack, uint64_t seed)
{
    struct rsim *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    s->config = config;
    s->seed = seed;
    s->rng = seed;
    s->ntrack = ntrack;
    assert_int_equal(mamba_pool_init(&s->p, &dev_backend_sim, &GEO, R_SLOTS), 0);
    assert_int_equal(mamba_req_init(&s->m, &s->p, R_REQS, ntrack), 0);
    for (int32_t v = 1; v <= R_SLOTS; v++)
        s->queue[s->qlen++] = v;
    for (int r = 0; r < R_REQS; r++) {
        s->run[r] = MAMBA_NO_SLOT;
        for (uint32_t t = 0; t < MAMBA_TRACK_MAX; t++)
            s->trk[r][t] = MAMBA_NO_SLOT;
    }
    for (s->step = 0; s->step < R_STEPS; s->step++) {
        step(s);
        check_invariants(s);
    }
    printf("test_mamba: %s: %" PRIu64 " copies, %" PRIu64 " donated, %" PRIu64
           " kept at free, %" PRIu64 " -ENOMEM\n",
           config, s->cows, s->donated, s->kept, s->enomem);
    REQUIRE(s, s->cows && s->kept && s->enomem && (ntrack == 0 || s->donated));
    mamba_req_finish(&s->m);
    mamba_pool_finish(&s->p);
    free(s);
}

static void test_random(void **state)
{
    const char *env = getenv("KVT_SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : DEFAULT_SEED;

    (void)state;
    printf("test_mamba: random: seed=%" PRIu64 " (KVT_SEED reruns it), %d steps each\n", seed,
           R_STEPS);
    run_random("no extra buffer", 0, seed);
    run_random("one track slot", 1, rng_mix(seed));
    run_random("two track slots", 2, rng_mix(seed + 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_basics),
        cmocka_unit_test(test_pool_free_errors),
        cmocka_unit_test(test_pool_copy),
        cmocka_unit_test(test_pool_read_write),
        cmocka_unit_test(test_req_no_extra_buffer),
        cmocka_unit_test(test_req_extra_buffer),
        cmocka_unit_test(test_req_cow),
        cmocka_unit_test(test_ckpt_grids),
        cmocka_unit_test(test_ckpt_seed_examples),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
