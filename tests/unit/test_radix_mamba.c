/* Mamba states in the radix tree (cfg.mamba): the design's seed examples that live in the
 * tree (the A/B/C tree with a tombstone and a branching request, a split leaving a tombstone,
 * the deepest state found through tombstones, eviction making tombstones, locks keeping a
 * state), the rules of attach and locks, host copies of states (saved, their LRU, dropped with
 * the node's host copy, found, attached from below), and a randomized run against a reference
 * model.
 * Slots and pages are plain numbers; what the tree frees is recorded. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/mamba_ckpt.h"
#include "radix/radix.h"

#define MAX_FREED 1024

struct recorder {
    uint32_t slots[MAX_FREED]; /* Mamba slots the tree gave back, in order */
    size_t nslots;
    size_t pages; /* device pages the tree gave back */
};

static void record_slots(void *ctx, const uint32_t *slots, size_t n)
{
    struct recorder *r = ctx;

    for (size_t i = 0; i < n && r->nslots < MAX_FREED; i++)
        r->slots[r->nslots++] = slots[i];
}

static void record_pages(void *ctx, const uint32_t *pages, size_t n)
{
    struct recorder *r = ctx;

    (void)pages;
    r->pages += n;
}

static struct rdx_tree *mtree(uint32_t page_size, uint32_t grid, int host, struct recorder *r)
{
    struct rdx_config cfg = {.page_size = page_size,
                             .policy = KVT_EVICT_LRU,
                             .hash_pages = 1,
                             .host_tier = host,
                             .free_pages = record_pages,
                             .free_host_pages = host ? record_pages : NULL,
                             .ctx = r,
                             .mamba = 1,
                             .mamba_grid = grid,
                             .free_mamba = record_slots};
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

/* Insert tok[0..n) with pages token + 100; returns the node ending it. */
static kvt_node_ref put(struct rdx_tree *t, const uint32_t *tok, size_t n)
{
    uint32_t pages[512];
    struct kvt_key k = {.tokens = tok, .len = n};
    size_t pre;
    kvt_node_ref last;

    for (size_t i = 0; i < n; i++)
        pages[i] = tok[i] + 100;
    assert_int_equal(rdx_insert_ref(t, &k, pages, 0, &pre, &last), 0);
    check(t);
    return last;
}

static void put_state(struct rdx_tree *t, const uint32_t *tok, size_t n, uint32_t slot)
{
    assert_int_equal(rdx_mamba_attach(t, put(t, tok, n), slot), 0);
    check(t);
}

static struct rdx_mamba_hit get(struct rdx_tree *t, const uint32_t *tok, size_t n)
{
    struct kvt_key k = {.tokens = tok, .len = n};
    struct rdx_mamba_hit h;

    assert_int_equal(rdx_match_mamba(t, &k, NULL, &h), 0);
    check(t);
    return h;
}

static uint32_t slot_of(const struct rdx_tree *t, kvt_node_ref ref)
{
    uint32_t slot = 99, locks;

    assert_int_equal(rdx_mamba_state(t, ref, &slot, &locks), 0);
    return slot;
}

static void assert_dump(const struct rdx_tree *t, const char *want)
{
    char buf[4096];

    rdx_dump(t, buf, sizeof(buf));
    if (strcmp(buf, want) != 0)
        fail_msg("tree is\n%s\nwant\n%s", buf, want);
}

/* A long sequence: seq[i] = i + 1. */
static uint32_t seq[512];

static int setup_seq(void **state)
{
    (void)state;
    for (uint32_t i = 0; i < 512; i++)
        seq[i] = i + 1;
    return 0;
}

static struct mamba_ckpt_rules rules(uint32_t page_size)
{
    struct mamba_ckpt_rules r;

    mamba_ckpt_rules_default(&r, page_size);
    return r;
}

/* ---- the seed examples ---- */

/* A (0..128, a state), B (..256, a tombstone), C (..320, a state). A 280-token request
 * shares 200 tokens: its KV hit ends inside B, the deepest state on it is A's, which the
 * request copies (COW into its own slot) and recomputes from 128; it branches at 192, and
 * what it caches afterwards gives the next request states at 192 and 280. */
static void test_abc_tombstone_branching(void **state)
{
    struct mamba_ckpt_rules ru = rules(8);
    struct recorder r = {0};
    struct rdx_tree *t = mtree(8, (uint32_t)mamba_ckpt_grid(&ru), 0, &r);
    uint32_t req[280];

    (void)state;
    assert_int_equal(mamba_ckpt_grid(&ru), 64);
    put_state(t, seq, 128, 1);         /* A */
    kvt_node_ref b = put(t, seq, 256); /* B: KV, no state */
    put_state(t, seq, 320, 3);         /* C */
    assert_int_equal(slot_of(t, b), 0);

    memcpy(req, seq, 200 * sizeof(uint32_t));
    for (uint32_t i = 200; i < 280; i++)
        req[i] = 9000 + i;
    struct rdx_mamba_hit h = get(t, req, 280);
    uint64_t ckpts[] = {128};
    assert_int_equal(h.kv_pages * 8, 200);
    assert_int_equal(h.state_slot, 1); /* A's: B's tombstone is passed by */
    assert_int_equal(h.state_tokens, 128);
    assert_int_equal(h.state_tokens, mamba_ckpt_effective(200, ckpts, 1));
    assert_int_equal(h.branch_tokens, 192);
    assert_int_equal(h.branch_tokens, mamba_ckpt_branching(&ru, 200, h.state_tokens));
    assert_int_equal(slot_of(t, h.kv_last), 0); /* B's upper half, split at 200: a tombstone */

    /* The request holds A's state while it copies it; eviction takes only C's. */
    assert_int_equal(rdx_mamba_lock(t, h.state_last), 0);
    assert_int_equal(rdx_mamba_evict(t, 10), 1);
    assert_int_equal(r.nslots, 1);
    assert_int_equal(r.slots[0], 3);
    check(t);

    /* Its prefill checkpointed at 192 (slot 11) and it ended at 280 (slot 12). */
    put_state(t, req, 192, 11);
    put_state(t, req, 280, 12);
    assert_int_equal(rdx_mamba_unlock(t, h.state_last), 0);
    h = get(t, req, 280);
    assert_int_equal(h.state_slot, 12);
    assert_int_equal(h.state_tokens, 280);
    assert_int_equal(h.branch_tokens, 0);
    h = get(t, seq, 240); /* along B: its tombstones lead back to 192 */
    assert_int_equal(h.kv_pages * 8, 240);
    assert_int_equal(h.state_slot, 11);
    assert_int_equal(h.state_tokens, 192);
    assert_int_equal(h.branch_tokens, 0);
    rdx_destroy(t);
}

/* States at 64, 128 and 192, KV to 256: a 230-token request reuses 192. */
static void test_230_reuses_192(void **state)
{
    struct mamba_ckpt_rules ru = rules(8);
    struct recorder r = {0};
    struct rdx_tree *t = mtree(8, 64, 0, &r);
    uint64_t ckpts[] = {64, 128, 192};

    (void)state;
    put_state(t, seq, 64, 1);
    put_state(t, seq, 128, 2);
    put_state(t, seq, 192, 3);
    put(t, seq, 256);
    struct rdx_mamba_hit h = get(t, seq, 230);
    assert_int_equal(h.kv_pages * 8, 224); /* whole pages of 230 */
    assert_int_equal(h.state_slot, 3);
    assert_int_equal(h.state_tokens, 192);
    assert_int_equal(h.state_tokens, mamba_ckpt_effective(224, ckpts, 3));
    assert_int_equal(h.branch_tokens, mamba_ckpt_branching(&ru, 224, 192));
    assert_int_equal(h.branch_tokens, 0);
    rdx_destroy(t);
}

/* States at 64 .. 256, KV to 320: a 280-token request reuses 256; once that state is
 * evicted (its KV stays, a tombstone) it reuses 192 and branches at 256. */
static void test_280_reuses_256_else_192(void **state)
{
    struct mamba_ckpt_rules ru = rules(8);
    struct recorder r = {0};
    struct rdx_tree *t = mtree(8, 64, 0, &r);
    struct rdx_sizes before, after;

    (void)state;
    for (uint32_t i = 1; i <= 4; i++)
        put_state(t, seq, 64 * i, i);
    put(t, seq, 320);
    struct rdx_mamba_hit h = get(t, seq, 280);
    assert_int_equal(h.kv_pages * 8, 280);
    assert_int_equal(h.state_slot, 4);
    assert_int_equal(h.state_tokens, 256);
    assert_int_equal(h.branch_tokens, 0);

    get(t, seq, 192); /* the states up to 192 are now newer than 256's */
    rdx_sizes(t, &before);
    assert_int_equal(rdx_mamba_evict(t, 1), 1);
    rdx_sizes(t, &after);
    assert_int_equal(r.nslots, 1);
    assert_int_equal(r.slots[0], 4);
    assert_int_equal(after.cached_pages, before.cached_pages); /* the KV stays */
    assert_int_equal(after.mamba_states, 3);
    check(t);

    h = get(t, seq, 280);
    assert_int_equal(h.kv_pages * 8, 280);
    assert_int_equal(h.state_slot, 3);
    assert_int_equal(h.state_tokens, 192);
    assert_int_equal(h.branch_tokens, 256);
    assert_int_equal(h.branch_tokens, mamba_ckpt_branching(&ru, 280, 192));
    rdx_destroy(t);
}

/* A state describes the end of its node: a split of [1,2,3,4] leaves [1,2] a tombstone. */
static void test_split_leaves_tombstone(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = mtree(1, 0, 0, &r);
    const uint32_t abcd[] = {1, 2, 3, 4}, abx[] = {1, 2, 9};

    (void)state;
    put_state(t, abcd, 4, 5);
    struct rdx_mamba_hit h = get(t, abx, 3); /* splits after [1,2] */
    assert_int_equal(h.kv_pages, 2);
    assert_int_equal(h.state_slot, 0); /* [1,2] holds no state: none on the prefix */
    assert_int_equal(h.state_tokens, 0);
    assert_int_equal(h.state_last, rdx_root(t));
    assert_int_equal(h.branch_tokens, 2); /* grid 0: the hit itself */
    assert_dump(t, "[1,2] pages=[101,102] lock=0\n"
                   "  [3,4] pages=[103,104] mamba=5 lock=0\n");
    h = get(t, abcd, 4);
    assert_int_equal(h.state_slot, 5);
    assert_int_equal(h.state_tokens, 4);
    rdx_destroy(t);
}

/* Eviction frees the least recently used states and leaves their KV (tombstones), which a
 * match passes by; KV eviction frees the states of the nodes it drops. */
static void test_evict_makes_tombstones(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = mtree(8, 64, 0, &r);
    struct rdx_sizes s;

    (void)state;
    put_state(t, seq, 64, 1);
    put_state(t, seq, 128, 2);
    put_state(t, seq, 192, 3);
    get(t, seq, 192);
    get(t, seq, 64); /* 64's state is the newest */
    assert_int_equal(rdx_mamba_evict(t, 2), 2);
    assert_int_equal(r.nslots, 2);
    assert_true((r.slots[0] == 2 && r.slots[1] == 3) || (r.slots[0] == 3 && r.slots[1] == 2));
    rdx_sizes(t, &s);
    assert_int_equal(s.cached_pages, 24);
    assert_int_equal(s.mamba_states, 1);
    assert_int_equal(s.mamba_evictable, 1);
    check(t);
    struct rdx_mamba_hit h = get(t, seq, 192);
    assert_int_equal(h.kv_pages, 24);
    assert_int_equal(h.state_slot, 1);
    assert_int_equal(h.state_tokens, 64);
    assert_int_equal(h.branch_tokens, 192);

    assert_int_equal(rdx_evict(t, 100), 24);
    assert_int_equal(r.nslots, 3);
    assert_int_equal(r.slots[2], 1);
    rdx_sizes(t, &s);
    assert_int_equal(s.mamba_states, 0);
    assert_int_equal(s.mamba_evictable, 0);
    check(t);
    rdx_destroy(t);
}

/* A state lock keeps the state and its KV; it is one of the node's own KV locks (full >=
 * mamba), which rdx_unlock cannot take away. */
static void test_locks_protect_state(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = mtree(1, 0, 0, &r);
    const uint32_t k[] = {1, 2, 3}, k2[] = {1, 2, 3, 4, 5};

    (void)state;
    kvt_node_ref n = put(t, k, 3);
    kvt_node_ref leaf = put(t, k2, 5); /* a tombstone leaf below */
    assert_int_equal(rdx_mamba_lock(t, n), -ENOENT);
    assert_int_equal(rdx_mamba_attach(t, n, 7), 0);
    assert_int_equal(rdx_mamba_lock(t, n), 0);
    check(t);
    assert_int_equal(rdx_unlock(t, n), -EINVAL); /* only the state's lock holds it */
    assert_int_equal(rdx_mamba_evict(t, 5), 0);
    assert_int_equal(rdx_evict(t, 100), 2); /* the tombstone leaf only */
    assert_int_equal(r.nslots, 0);
    assert_int_equal(rdx_mamba_lock(t, leaf), -EINVAL); /* evicted: the ref is dead */

    assert_int_equal(rdx_lock(t, n), 0);
    assert_int_equal(rdx_unlock(t, n), 0);
    assert_int_equal(rdx_unlock(t, n), -EINVAL);
    uint32_t slot, locks;
    assert_int_equal(rdx_mamba_state(t, n, &slot, &locks), 0);
    assert_int_equal(slot, 7);
    assert_int_equal(locks, 1);
    assert_dump(t, "[1,2,3] pages=[101,102,103] mamba=7 mlock=1 lock=1\n");
    assert_int_equal(rdx_mamba_unlock(t, n), 0);
    assert_int_equal(rdx_mamba_unlock(t, n), -EINVAL);
    check(t);
    assert_int_equal(rdx_mamba_evict(t, 5), 1);
    assert_int_equal(r.slots[0], 7);
    rdx_destroy(t);
}

static void test_attach_rules(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = mtree(1, 0, 0, &r);
    const uint32_t k[] = {1, 2};

    (void)state;
    kvt_node_ref n = put(t, k, 2);
    assert_int_equal(rdx_mamba_attach(t, n, 0), -EINVAL);
    assert_int_equal(rdx_mamba_attach(t, rdx_root(t), 3), -EINVAL);
    assert_int_equal(rdx_mamba_attach(t, n, 3), 0);
    assert_int_equal(rdx_mamba_attach(t, n, 4), -EEXIST); /* the caller keeps slot 4 */
    assert_int_equal(slot_of(t, n), 3);
    check(t);
    assert_int_equal(rdx_evict(t, 10), 2);
    assert_int_equal(rdx_mamba_attach(t, n, 4), -EINVAL);
    assert_int_equal(r.nslots, 1);
    rdx_destroy(t);
}

/* Without cfg.mamba every call is refused and the tree prints as before. */
static void test_off_by_default(void **state)
{
    struct rdx_config cfg = {.page_size = 1, .hash_pages = 1};
    struct rdx_tree *t = NULL;
    const uint32_t k[] = {1, 2};
    struct rdx_mamba_hit h;
    uint32_t slot, locks;

    (void)state;
    assert_int_equal(rdx_create(&cfg, &t), 0);
    kvt_node_ref n = put(t, k, 2);
    struct kvt_key key = {.tokens = k, .len = 2};
    assert_int_equal(rdx_mamba_attach(t, n, 1), -EINVAL);
    assert_int_equal(rdx_match_mamba(t, &key, NULL, &h), -EINVAL);
    assert_int_equal(rdx_mamba_lock(t, n), -EINVAL);
    assert_int_equal(rdx_mamba_unlock(t, n), -EINVAL);
    assert_int_equal(rdx_mamba_state(t, n, &slot, &locks), -EINVAL);
    assert_int_equal(rdx_mamba_evict(t, 1), 0);
    assert_dump(t, "[1,2] pages=[101,102] lock=0\n");
    rdx_destroy(t);
}

/* A node that keeps only its host copy loses its state: the state is a device slot. */
static void test_state_goes_with_device_copy(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = mtree(1, 0, 1, &r);
    const uint32_t k[] = {1, 2, 3};
    uint32_t host[3] = {900, 901, 902}, dev[3];
    size_t n;

    (void)state;
    kvt_node_ref ref = put(t, k, 3);
    assert_int_equal(rdx_mamba_attach(t, ref, 6), 0);
    assert_int_equal(rdx_backup_span(t, ref, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(rdx_attach_host(t, ref, host, n, dev, RDX_OP_BACKUP | 1), 0);
    assert_int_equal(rdx_op_done(t, ref, RDX_OP_BACKUP | 1, 0), 0);
    check(t);
    assert_int_equal(rdx_evict(t, 10), 3);
    assert_int_equal(r.nslots, 1);
    assert_int_equal(r.slots[0], 6);
    check(t);
    struct rdx_mamba_hit h = get(t, k, 3);
    assert_int_equal(h.kv_pages, 0);
    assert_int_equal(h.state_slot, 0);
    rdx_destroy(t);
}

/* ---- host copies of states (cfg.save_mamba) ---- */

struct saver {
    struct recorder r;
    uint32_t next, saved, hfreed[16];
    size_t nhfreed;
};

static uint32_t save_one(void *ctx, uint32_t slot)
{
    struct saver *s = ctx;

    (void)slot;
    s->saved++;
    return s->next++;
}

static void free_hslots(void *ctx, const uint32_t *h, size_t n)
{
    struct saver *s = ctx;

    for (size_t i = 0; i < n && s->nhfreed < 16; i++)
        s->hfreed[s->nhfreed++] = h[i];
}

/* k[0..n) inserted, its node given state slot and backed up (host pages host0..). */
static kvt_node_ref put_backed(struct rdx_tree *t, const uint32_t *k, size_t n, uint32_t slot,
                               uint32_t host0, uint64_t op)
{
    uint32_t host[8], dev[8];
    size_t np;
    kvt_node_ref ref = put(t, k, n);

    assert_int_equal(rdx_mamba_attach(t, ref, slot), 0);
    assert_int_equal(rdx_backup_span(t, ref, &np), 0);
    for (size_t i = 0; i < np; i++)
        host[i] = host0 + (uint32_t)i;
    assert_int_equal(rdx_attach_host(t, ref, host, np, dev, RDX_OP_BACKUP | op), 0);
    assert_int_equal(rdx_op_done(t, ref, RDX_OP_BACKUP | op, 0), 0);
    check(t);
    return ref;
}

/* A state leaving the device while its node stays on the host is saved (a host slot from
 * save_mamba); the copies are at most mamba_host_states, the least recently used on an
 * unlocked node making room; a node losing its host copy hands its copy back; rdx_mamba_find
 * names a host copy; rdx_mamba_attach_host and rdx_mamba_bare follow their rules. */
static void test_host_copies(void **state)
{
    struct saver s = {.next = 1};
    struct rdx_config cfg = {.page_size = 1,
                             .policy = KVT_EVICT_LRU,
                             .hash_pages = 1,
                             .host_tier = 1,
                             .free_pages = record_pages,
                             .free_host_pages = record_pages,
                             .ctx = &s,
                             .mamba = 1,
                             .mamba_grid = 1,
                             .free_mamba = record_slots,
                             .mamba_host_states = 2,
                             .save_mamba = save_one,
                             .free_host_mamba = free_hslots};
    struct rdx_tree *t = NULL;
    const uint32_t a[] = {1, 2}, b[] = {3, 4}, c[] = {5, 6};
    kvt_node_ref x, node;
    uint32_t slot, hslot;
    uint64_t tokens;
    struct rdx_sizes sz;

    (void)state;
    assert_int_equal(rdx_create(&cfg, &t), 0);
    put_backed(t, a, 2, 11, 100, 1);
    put_backed(t, b, 2, 12, 110, 2);
    kvt_node_ref cref = put_backed(t, c, 2, 13, 120, 3);
    /* c is locked: it stays on the device; a and b go to the host with their states. */
    assert_int_equal(rdx_lock(t, cref), 0);
    assert_int_equal(rdx_evict(t, 6), 4);
    rdx_sizes(t, &sz);
    assert_int_equal(s.saved, 2);
    assert_int_equal(sz.mamba_host_states, 2);
    assert_int_equal(rdx_mamba_find(t, rdx_root(t), &x, &slot, &hslot, &tokens), 0);
    assert_int_equal(x, rdx_root(t));
    assert_dump(t, "[1,2] pages=- host=[100,101] hmamba=1 lock=0\n"
                   "[3,4] pages=- host=[110,111] hmamba=2 lock=0\n"
                   "[5,6] pages=[105,106] host=[120,121] mamba=13 lock=1\n");
    /* The third save pushes out the least recently used copy (a's); c's own KV lock does not
     * keep another node's copy. */
    assert_int_equal(rdx_unlock(t, cref), 0);
    assert_int_equal(rdx_mamba_evict(t, 1), 1); /* c's state alone: saved beside its host copy */
    assert_int_equal(s.saved, 3);
    assert_int_equal(s.nhfreed, 1);
    assert_int_equal(s.hfreed[0], 1);
    check(t);
    /* rdx_mamba_find sees a host copy on a device node too; a host copy on a node without
     * one is attached by rdx_mamba_attach_host, refused when full or present. */
    struct kvt_key kc = {.tokens = c, .len = 2};
    struct rdx_hit hit;
    assert_int_equal(rdx_match_tiers(t, &kc, NULL, NULL, &hit), 0);
    assert_int_equal(rdx_mamba_find(t, hit.host_last, &node, &slot, &hslot, &tokens), 0);
    assert_int_equal(slot, 0);
    assert_int_equal(hslot, 3);
    assert_int_equal(tokens, 2);
    assert_int_equal(rdx_mamba_attach_host(t, node, 7), -EEXIST);
    struct kvt_key ka = {.tokens = a, .len = 2};
    assert_int_equal(rdx_match_tiers(t, &ka, NULL, NULL, &hit), 0);
    assert_int_equal(hit.host_pages, 2);
    kvt_node_ref bare[4];
    uint8_t hashes[4][KVT_HASH_LEN];
    assert_int_equal(rdx_mamba_bare(t, hit.host_last, bare, hashes, 4), 1);
    assert_int_equal(bare[0], hit.host_last);
    assert_int_equal(rdx_mamba_attach_host(t, hit.host_last, 7), -ENOSPC);
    assert_int_equal(rdx_mamba_host_room(t), 0); /* b's copy goes: the least recently used */
    assert_int_equal(s.hfreed[1], 2);
    assert_int_equal(rdx_mamba_attach_host(t, hit.host_last, 7), 0);
    assert_int_equal(rdx_mamba_bare(t, hit.host_last, bare, hashes, 4), 0);
    check(t);
    /* Host eviction deletes b's node (used least lately, no copy now), then a's: its copy
     * goes back. */
    assert_int_equal(rdx_evict_host(t, 2), 2);
    assert_int_equal(s.nhfreed, 2);
    assert_int_equal(rdx_evict_host(t, 2), 2);
    assert_int_equal(s.nhfreed, 3);
    assert_int_equal(s.hfreed[2], 7);
    check(t);
    rdx_sizes(t, &sz);
    assert_int_equal(sz.mamba_host_states, 1);
    rdx_destroy(t);
}

/* ---- randomized, against a reference model ----
 * The model knows each state by the tokens it ends (its position), its slot, its state locks
 * and the clock tick of the last match or insert that passed through it. After every step:
 * rdx_check, the tree's slots are exactly the model's, and the sizes agree. */

#define RPS 2     /* page size */
#define RMAXP 10  /* pages per key */
#define RSLOTS 48 /* the Mamba pool's slots: 1 .. RSLOTS */
#define RLOCKS 64

struct mstate {
    uint32_t tok[RMAXP * RPS];
    size_t len; /* tokens */
    uint32_t slot, locks;
    uint64_t time;
};

struct held {
    kvt_node_ref ref;
    uint32_t slot; /* the state a state lock holds; 0 for a KV lock */
};

struct model {
    struct rdx_tree *t;
    struct recorder r;
    uint64_t rng, clock;
    struct mstate st[RSLOTS];
    size_t nst;
    uint32_t free_slots[RSLOTS];
    size_t nfree;
    struct held locks[RLOCKS];
    size_t nlocks;
    bool seen[RSLOTS + 1]; /* slots the tree's check visited */
};

static uint32_t rnd(struct model *m, uint32_t n)
{
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 7;
    m->rng ^= m->rng << 17;
    return (uint32_t)(m->rng % n);
}

/* Keys over two tokens share prefixes often and branch everywhere. */
static size_t rand_key(struct model *m, uint32_t *tok)
{
    size_t len = (1 + rnd(m, RMAXP)) * RPS;

    for (size_t i = 0; i < len; i++)
        tok[i] = 1 + rnd(m, 2);
    return len;
}

static bool on_path(const struct mstate *s, const uint32_t *tok, size_t len)
{
    return s->len <= len && memcmp(s->tok, tok, s->len * sizeof(uint32_t)) == 0;
}

/* A match or insert passed through tok[0..len): every state on it is touched. */
static void touch(struct model *m, const uint32_t *tok, size_t len)
{
    m->clock++;
    for (size_t i = 0; i < m->nst; i++)
        if (on_path(&m->st[i], tok, len))
            m->st[i].time = m->clock;
}

static struct mstate *state_at(struct model *m, const uint32_t *tok, size_t len)
{
    for (size_t i = 0; i < m->nst; i++)
        if (m->st[i].len == len && on_path(&m->st[i], tok, len))
            return &m->st[i];
    return NULL;
}

static struct mstate *state_of_slot(struct model *m, uint32_t slot)
{
    for (size_t i = 0; i < m->nst; i++)
        if (m->st[i].slot == slot)
            return &m->st[i];
    return NULL;
}

static void forget(struct model *m, struct mstate *s)
{
    m->free_slots[m->nfree++] = s->slot;
    *s = m->st[--m->nst];
}

static void see_slot(void *ctx, uint32_t slot)
{
    struct model *m = ctx;

    assert_true(slot >= 1 && slot <= RSLOTS);
    assert_false(m->seen[slot]); /* rdx_check fails first; this names the slot */
    m->seen[slot] = true;
}

static void verify(struct model *m)
{
    struct rdx_page_visitor v = {.mamba = see_slot, .ctx = m};
    struct rdx_sizes s;
    char why[200];
    size_t unlocked = 0;

    memset(m->seen, 0, sizeof(m->seen));
    if (rdx_check(m->t, &v, why, sizeof(why)))
        fail_msg("tree check: %s", why);
    for (size_t i = 0; i < m->nst; i++) {
        assert_true(m->seen[m->st[i].slot]);
        m->seen[m->st[i].slot] = false;
        unlocked += m->st[i].locks == 0;
    }
    for (uint32_t i = 0; i <= RSLOTS; i++)
        assert_false(m->seen[i]); /* a slot the model thinks free is held */
    rdx_sizes(m->t, &s);
    assert_int_equal(s.mamba_states, m->nst);
    assert_int_equal(s.mamba_evictable, unlocked);
    assert_int_equal(m->r.nslots, 0); /* every free was accounted for */
}

/* Attach a fresh slot at ref, which ends tok[0..len); the model says whether it may. */
static void attach(struct model *m, kvt_node_ref ref, const uint32_t *tok, size_t len)
{
    if (m->nfree == 0)
        return;
    uint32_t slot = m->free_slots[m->nfree - 1];
    int want = len == 0 ? -EINVAL : state_at(m, tok, len) ? -EEXIST : 0;
    assert_int_equal(rdx_mamba_attach(m->t, ref, slot), want);
    if (want)
        return;
    m->nfree--;
    struct mstate *s = &m->st[m->nst++];
    memset(s, 0, sizeof(*s));
    memcpy(s->tok, tok, len * sizeof(uint32_t));
    s->len = len;
    s->slot = slot;
    s->time = m->clock;
}

static void step_insert(struct model *m)
{
    uint32_t tok[RMAXP * RPS], pages[RMAXP * RPS];
    size_t len = rand_key(m, tok), pre;
    struct kvt_key k = {.tokens = tok, .len = len};
    kvt_node_ref last;

    for (size_t i = 0; i < len; i++)
        pages[i] = 1000 + rnd(m, 100000);
    assert_int_equal(rdx_insert_ref(m->t, &k, pages, 0, &pre, &last), 0);
    touch(m, tok, len);
    if (rnd(m, 2))
        attach(m, last, tok, len);
}

/* The deepest state of the model on tok[0..hit). */
static const struct mstate *deepest(const struct model *m, const uint32_t *tok, size_t hit)
{
    const struct mstate *best = NULL;

    for (size_t i = 0; i < m->nst; i++)
        if (on_path(&m->st[i], tok, hit) && (!best || m->st[i].len > best->len))
            best = &m->st[i];
    return best;
}

static void take_lock(struct model *m, kvt_node_ref ref, uint32_t slot)
{
    if (m->nlocks == RLOCKS)
        return;
    if (slot) {
        assert_int_equal(rdx_mamba_lock(m->t, ref), 0);
        state_of_slot(m, slot)->locks++;
    } else {
        assert_int_equal(rdx_lock(m->t, ref), 0);
    }
    m->locks[m->nlocks++] = (struct held){ref, slot};
}

static void step_match(struct model *m)
{
    uint32_t tok[RMAXP * RPS];
    size_t len = rand_key(m, tok);
    struct kvt_key k = {.tokens = tok, .len = len};
    size_t hit = rdx_cached_pages(m->t, &k) * RPS;
    struct rdx_mamba_hit h;

    assert_int_equal(rdx_match_mamba(m->t, &k, NULL, &h), 0);
    touch(m, tok, hit);
    assert_int_equal(h.kv_pages * RPS, hit);
    const struct mstate *best = deepest(m, tok, hit);
    assert_int_equal(h.state_slot, best ? best->slot : 0);
    assert_int_equal(h.state_tokens, best ? best->len : 0);
    uint64_t at = hit / 4 * 4; /* the grid is 4 tokens */
    assert_int_equal(h.branch_tokens, at > h.state_tokens ? at : 0);
    switch (rnd(m, 4)) {
    case 0:
        if (best)
            take_lock(m, h.state_last, best->slot);
        break;
    case 1:
        if (hit)
            take_lock(m, h.kv_last, 0);
        break;
    case 2:
        attach(m, h.kv_last, tok, hit);
        break;
    }
}

static void step_unlock(struct model *m)
{
    if (m->nlocks == 0)
        return;
    size_t i = rnd(m, (uint32_t)m->nlocks);
    struct held l = m->locks[i];
    m->locks[i] = m->locks[--m->nlocks];
    if (l.slot) {
        assert_int_equal(rdx_mamba_unlock(m->t, l.ref), 0);
        state_of_slot(m, l.slot)->locks--;
    } else {
        assert_int_equal(rdx_unlock(m->t, l.ref), 0);
    }
}

/* Whether the slot is among those the tree freed since the last verify; takes it out. */
static bool was_freed(struct model *m, uint32_t slot)
{
    for (size_t i = 0; i < m->r.nslots; i++)
        if (m->r.slots[i] == slot) {
            m->r.slots[i] = m->r.slots[--m->r.nslots];
            return true;
        }
    return false;
}

/* KV eviction: a state goes exactly when its KV went, and never a locked one. */
static void step_evict_kv(struct model *m)
{
    rdx_evict(m->t, rnd(m, 32));
    for (size_t i = 0; i < m->nst;) {
        struct mstate *s = &m->st[i];
        struct kvt_key k = {.tokens = s->tok, .len = s->len};
        bool cached = rdx_cached_pages(m->t, &k) * RPS == s->len;
        assert_int_equal(was_freed(m, s->slot), !cached);
        if (cached) {
            i++;
            continue;
        }
        assert_int_equal(s->locks, 0);
        forget(m, s);
    }
    for (size_t i = 0; i < m->nlocks; i++)
        assert_int_equal(rdx_is_locked(m->t, m->locks[i].ref), 1);
}

/* State eviction: as many as asked or unlocked, all unlocked, none newer than a survivor. */
static void step_evict_states(struct model *m)
{
    size_t want = rnd(m, 4), unlocked = 0;
    uint64_t newest_gone = 0, oldest_left = UINT64_MAX;

    for (size_t i = 0; i < m->nst; i++)
        unlocked += m->st[i].locks == 0;
    assert_int_equal(rdx_mamba_evict(m->t, want), want < unlocked ? want : unlocked);
    for (size_t i = 0; i < m->nst;) {
        struct mstate *s = &m->st[i];
        if (!was_freed(m, s->slot)) {
            if (s->locks == 0 && s->time < oldest_left)
                oldest_left = s->time;
            i++;
            continue;
        }
        assert_int_equal(s->locks, 0);
        if (s->time > newest_gone)
            newest_gone = s->time;
        forget(m, s);
    }
    assert_true(newest_gone <= oldest_left);
}

static void run_model(uint64_t seed, int steps)
{
    struct model *m = calloc(1, sizeof(*m));

    assert_non_null(m);
    m->rng = seed;
    m->t = mtree(RPS, 4, 0, &m->r);
    for (uint32_t i = RSLOTS; i >= 1; i--)
        m->free_slots[m->nfree++] = i;
    for (int i = 0; i < steps; i++) {
        uint32_t op = rnd(m, 10);
        if (op < 3)
            step_insert(m);
        else if (op < 6)
            step_match(m);
        else if (op < 8)
            step_unlock(m);
        else if (op < 9)
            step_evict_kv(m);
        else
            step_evict_states(m);
        verify(m);
    }
    while (m->nlocks)
        step_unlock(m);
    rdx_evict(m->t, SIZE_MAX);
    assert_int_equal(m->r.nslots, m->nst); /* every state went with its KV */
    m->r.nslots = 0;
    m->nst = 0;
    verify(m);
    rdx_destroy(m->t);
    free(m);
}

static void test_random_against_model(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++)
        run_model(seed * 0x9e3779b97f4a7c15ull, 3000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abc_tombstone_branching),
        cmocka_unit_test(test_230_reuses_192),
        cmocka_unit_test(test_280_reuses_256_else_192),
        cmocka_unit_test(test_split_leaves_tombstone),
        cmocka_unit_test(test_evict_makes_tombstones),
        cmocka_unit_test(test_locks_protect_state),
        cmocka_unit_test(test_attach_rules),
        cmocka_unit_test(test_off_by_default),
        cmocka_unit_test(test_state_goes_with_device_copy),
        cmocka_unit_test(test_host_copies),
        cmocka_unit_test(test_random_against_model),
    };

    return cmocka_run_group_tests(tests, setup_seq, NULL);
}
