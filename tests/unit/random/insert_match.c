#include "random_test.h"

/* ---- insert ---- */

/* Make the run of page i of slots one the engine must refuse to cache. */
static void corrupt_page(struct sim *s, int32_t *slots, size_t i, size_t c, size_t np)
{
    int32_t *run = slots + i * s->ps;
    int32_t bad = -1;

    switch (below(s, 4)) {
    case 0:
        bad = bad_slot(s);
        break;
    case 1:
        if (np - c >= 2) { /* the same page twice among the new pages */
            size_t j = c + (i - c + 1 + below(s, (uint32_t)(np - c - 1))) % (np - c);
            memcpy(run, slots + j * s->ps, s->ps * sizeof(int32_t));
            return;
        }
        break;
    case 2:
        if (s->ps > 1) { /* not a page run */
            run[below(s, s->ps)] += chance(s, 50) ? 1 : -1;
            return;
        }
        break;
    default:
        break;
    }
    if (bad < (int32_t)s->ps || (uint32_t)bad / s->ps > s->npages)
        bad = 0; /* the padding page */
    for (uint32_t j = 0; j < s->ps; j++)
        run[j] = (int32_t)((uint32_t)bad / s->ps * s->ps + j);
}

/* Slots for the new part of an insert: from a held run when asked and one is long enough,
 * else freshly allocated. Returns 1 if fresh, 0 if taken from a held run, -1 if none. */
static int new_part_slots(struct sim *s, int32_t *slots, size_t pages, int from_held)
{
    for (size_t i = 0; from_held && i < s->nheld; i++) {
        if (s->held[i].n >= pages * s->ps) {
            memcpy(slots, s->held[i].slots, pages * s->ps * sizeof(int32_t));
            return 0;
        }
    }
    return alloc_pages(s, pages, slots, 1) == 0 ? 1 : -1;
}

void op_insert(struct sim *s)
{
    struct tkey k;
    uint32_t path[KEY_PAGES];
    int32_t slots[TOK_MAX], orig[TOK_MAX];
    size_t pl = SIZE_MAX;
    uint32_t mode = below(s, 3);
    int32_t prio = (int32_t)below(s, 4);

    gen_key(s, &k, 1);
    struct kvt_key key = kkey(&k, k.len);
    size_t np = k.len / s->ps, c = model_prefix(s, &k, k.len, path);
    if (s->ps > 1 && chance(s, 2)) {
        struct kvt_stats st = stats(s);
        key.len--; /* not whole pages */
        path_slots(s, path, c, slots);
        EXPECT_RC(s, kvt_insert(s->e, &key, slots, prio, &pl), -EINVAL);
        same_stats(s, &st);
        return;
    }
    /* The cached part: the cache's own slots, or fresh ones that stay the test's. */
    int prefix_fresh = mode == 0 && c > 0 && alloc_pages(s, c, slots, 0) == 0;
    if (!prefix_fresh)
        path_slots(s, path, c, slots);
    int new_fresh = 0;
    uint64_t evicted = s->evicted;
    if (np > c && (new_fresh = new_part_slots(s, slots + c * s->ps, np - c, mode == 2)) < 0) {
        if (prefix_fresh)
            adopt(s, slots, c * s->ps);
        return;
    }
    if (s->evicted != evicted && model_prefix(s, &k, k.len, path) != c) {
        /* Making room evicted part of the cached prefix: the plan no longer fits. */
        if (prefix_fresh)
            adopt(s, slots, c * s->ps);
        if (new_fresh)
            adopt(s, slots + c * s->ps, (np - c) * s->ps);
        return;
    }
    memcpy(orig, slots, sizeof(slots));
    if (np > c && chance(s, 8)) {
        struct kvt_stats st = stats(s);
        corrupt_page(s, slots, c + below(s, (uint32_t)(np - c)), c, np);
        EXPECT_RC(s, kvt_insert(s->e, &key, slots, prio, &pl), -EINVAL);
        same_stats(s, &st);
        if (prefix_fresh)
            adopt(s, orig, c * s->ps);
        if (new_fresh)
            adopt(s, orig + c * s->ps, (np - c) * s->ps);
        return;
    }
    EXPECT_RC(s, kvt_insert(s->e, &key, slots, prio, &pl), 0);
    if (pl != c * s->ps)
        FAIL(s, "insert found %zu tokens cached, the model %zu", pl, c * s->ps);
    model_insert(s, &k, np, path, c, slots, prio);
    if (prefix_fresh)
        adopt(s, slots, c * s->ps);
    held_compact(s);
}

/* ---- match and locks ---- */

static void add_lock(struct sim *s, kvt_node_ref ref, uint32_t page)
{
    for (size_t i = 0; i < s->nlocks; i++) {
        if (s->locks[i].ref == ref) {
            REQUIRE(s, s->locks[i].page == page);
            s->locks[i].count++;
            return;
        }
    }
    s->locks[s->nlocks++] = (struct tlock){ref, page, 1};
}

void op_match(struct sim *s)
{
    struct tkey k;
    uint32_t path[KEY_PAGES];
    int32_t slots[TOK_MAX];
    struct kvt_match m = {0};
    int with_slots = chance(s, 80);

    gen_key(s, &k, 0);
    if (s->nlocks && chance(s, 20)) {
        /* A locked prefix, maybe with more behind it: it must still be there. */
        const struct tlock *l = &s->locks[below(s, (uint32_t)s->nlocks)];
        if (l->page) {
            size_t len = k.len;
            prefix_key(s, l->page, &k);
            k.len = len > k.len ? len : k.len;
        }
    }
    size_t c = model_prefix(s, &k, k.len, path);
    struct kvt_key key = kkey(&k, k.len);
    EXPECT_RC(s, kvt_match(s->e, &key, with_slots ? slots : NULL, &m), 0);
    if (m.device_len != c * s->ps)
        FAIL(s, "match found %zu tokens, the model %zu", m.device_len, c * s->ps);
    for (size_t i = 0; with_slots && i < c * s->ps; i++)
        if (slots[i] != (int32_t)(path[i / s->ps] * s->ps + i % s->ps))
            FAIL(s, "match slot %zu is %d, the model's page is %u", i, slots[i], path[i / s->ps]);
    REQUIRE(s, m.last_node != 0);
    model_match(s, path, c, k.len);
    uint32_t end = c ? path[c - 1] : 0;
    remember_ref(s, m.last_node, end);
    if (s->nlocks < N_LOCKS && chance(s, 40)) {
        EXPECT_RC(s, kvt_lock(s->e, m.last_node), 0);
        add_lock(s, m.last_node, end);
    }
}

void op_unlock(struct sim *s)
{
    if (s->nlocks == 0)
        return;
    size_t i = below(s, (uint32_t)s->nlocks);
    struct tlock *l = &s->locks[i];
    if (chance(s, 20)) {
        EXPECT_RC(s, kvt_lock(s->e, l->ref), 0);
        l->count++;
        return;
    }
    EXPECT_RC(s, kvt_unlock(s->e, l->ref), 0);
    if (--l->count == 0) {
        remember_ref(s, l->ref, l->page);
        s->locks[i] = s->locks[--s->nlocks];
    }
}

/* Whether the node a remembered ref named is still cached (the same incarnation). */
static int ref_alive(const struct sim *s, const struct oldref *r)
{
    return s->pg[r->page].state == M_CACHED && s->pg[r->page].gen == r->gen;
}

/* Refs that name no locked node are refused and change nothing: forged ones, refs of
 * evicted nodes, refs of live nodes nobody locked. */
void op_bad_ref(struct sim *s)
{
    struct kvt_stats st = stats(s);
    kvt_node_ref ref;

    if (s->nrefs == 0 || chance(s, 20)) {
        /* Generations this high are never reached in a run: the ref is forged. */
        ref = chance(s, 30) ? 0 : ((uint64_t)(0x80000000u + below(s, 1000)) << 32 | below(s, 4096));
        EXPECT_RC(s, kvt_lock(s->e, ref), -EINVAL);
    } else {
        const struct oldref *r = &s->refs[below(s, (uint32_t)s->nrefs)];
        mark_locked(s);
        if (r->page == 0 || (ref_alive(s, r) && s->mark[r->page] == s->epoch))
            return; /* the root, or a locked node: an unlock would be legitimate */
        ref = r->ref;
    }
    EXPECT_RC(s, kvt_unlock(s->e, ref), -EINVAL);
    same_stats(s, &st);
}

/* Lock a remembered ref again: refused once its node is gone. A live unlocked node may have
 * been split, which the API allows to invalidate its ref, so both answers pass there. */
void op_lock_old(struct sim *s)
{
    if (s->nrefs == 0 || s->nlocks == N_LOCKS)
        return;
    const struct oldref *r = &s->refs[below(s, (uint32_t)s->nrefs)];
    if (r->page == 0)
        return;
    struct kvt_stats st = stats(s);
    int rc = kvt_lock(s->e, r->ref);
    if (!ref_alive(s, r) || rc != 0) {
        if (rc != -EINVAL)
            FAIL(s, "lock of a %s ref gave %d", ref_alive(s, r) ? "live" : "dead", rc);
        same_stats(s, &st);
        return;
    }
    add_lock(s, r->ref, r->page);
}
