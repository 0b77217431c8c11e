#include "random_test.h"

/* ---- eviction ---- */

struct ekey {
    int64_t a;
    uint64_t b;
};

/* The policy's order for page p. Only policies whose key never decreases from child to
 * parent are checked: then leaves-first eviction is a global order, and every evicted page
 * sorts no later than every unlocked page left. LRU: a match or insert touches the whole
 * path. LFU: hits only come through the parent. PRIORITY: an insert raises the whole path.
 * FILO: a child is never older than its parent. FIFO and MRU give 0: not checked. */
static int policy_key(const struct sim *s, uint32_t p, struct ekey *k)
{
    const struct mpage *m = &s->pg[p];

    switch (s->cfg->policy) {
    case KVT_EVICT_LRU:
        *k = (struct ekey){(int64_t)m->access, 0};
        return 1;
    case KVT_EVICT_LFU:
        *k = (struct ekey){(int64_t)m->hits, m->access};
        return 1;
    case KVT_EVICT_PRIORITY:
        *k = (struct ekey){m->prio, m->access};
        return 1;
    case KVT_EVICT_FILO:
        *k = (struct ekey){-(int64_t)m->created, 0};
        return 1;
    default:
        return 0;
    }
}

static int ekey_after(struct ekey x, struct ekey y)
{
    return x.a != y.a ? x.a > y.a : x.b > y.b;
}

static void check_policy(struct sim *s, const uint32_t *gone, size_t ngone)
{
    struct ekey worst = {INT64_MIN, 0}, k;
    uint32_t worst_page = 0;

    for (size_t i = 0; i < ngone; i++) {
        if (!policy_key(s, gone[i], &k))
            return;
        if (ekey_after(k, worst) || !worst_page) {
            worst = k;
            worst_page = gone[i];
        }
    }
    for (uint32_t p = 1; worst_page && p <= s->npages; p++) {
        if (s->pg[p].state != M_CACHED || s->gone[p] == s->epoch || s->mark[p] == s->epoch)
            continue;
        policy_key(s, p, &k);
        if (ekey_after(worst, k))
            FAIL(s,
                 "evicted page %u (key %" PRId64 ",%" PRIu64
                 ") before unlocked page %u (key %" PRId64 ",%" PRIu64 ")",
                 worst_page, worst.a, worst.b, p, k.a, k.b);
    }
}

/* Learn from the allocator which pages an eviction of want pages took; check they could go.
 * Returns how many went. */
size_t learn_eviction(struct sim *s, size_t want)
{
    size_t ngone = 0, locked = mark_locked(s);

    for (uint32_t p = 1; p <= s->npages; p++) {
        if (s->pg[p].state == M_CACHED && engine_state(s, p) != PAGE_CACHED) {
            s->gone[p] = s->epoch;
            s->scratch[ngone++] = p;
        }
    }
    for (size_t i = 0; i < ngone; i++) {
        uint32_t p = s->scratch[i];
        if (s->mark[p] == s->epoch)
            FAIL(s, "evicted page %u under a lock", p);
        for (uint32_t c = s->pg[p].child; c; c = s->pg[c].sibling)
            if (s->gone[c] != s->epoch)
                FAIL(s, "evicted page %u but kept its child %u", p, c);
    }
    check_policy(s, s->scratch, ngone);
    /* Whole subtrees went: cut each at its top, then forget the pages below. */
    for (size_t i = 0; i < ngone; i++) {
        uint32_t parent = s->pg[s->scratch[i]].parent;
        if (parent == 0 || s->gone[parent] != s->epoch)
            model_unlink(s, s->scratch[i]);
    }
    for (size_t i = 0; i < ngone; i++) {
        struct mpage *m = &s->pg[s->scratch[i]];
        m->parent = m->child = m->sibling = 0;
        model_release(s, s->scratch[i]);
    }
    s->evicted += ngone;
    if (ngone < want)
        REQUIRE(s, count_state(s, M_CACHED) == locked); /* nothing evictable is left */
    else
        REQUIRE(s, ngone < want + KEY_PAGES); /* a node never holds more than one key */
    return ngone;
}

void do_evict(struct sim *s, size_t tokens)
{
    size_t got = SIZE_MAX, want = tokens / s->ps + (tokens % s->ps != 0);
    int report = chance(s, 80);

    EXPECT_RC(s, kvt_evict(s->e, tokens, report ? &got : NULL), 0);
    size_t ngone = learn_eviction(s, want);
    if (report)
        REQUIRE(s, got == ngone * s->ps);
}

void op_evict(struct sim *s)
{
    uint32_t r = below(s, 20);
    size_t tokens = r < 8 ? below(s, 8 * s->ps) : r < 17 ? below(s, 64 * s->ps) : 0;

    if (r == 19)
        tokens = SIZE_MAX; /* everything: rarely, so the cache fills up */
    do_evict(s, tokens);
}
