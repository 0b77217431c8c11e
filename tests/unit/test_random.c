/*
 * Randomized test of the engine against a reference model: 100k seeded operations (insert,
 * match, lock, unlock, evict, alloc, free, free groups, request lifecycle), with every
 * invariant checked after every step.
 *
 * The model keeps one entry per device page: who owns it (free, held by the test, owned by a
 * request, cached, pending in a free group) and, for a cached page, its tokens, its parent
 * page and the keys the eviction policy compares. A cached page sits on exactly one device
 * page, so the page number doubles as the node id of the model's trie (page 0, the padding
 * page, stands for a namespace root).
 *
 * After every step: engine_check passes; the allocator's state of every page equals the
 * model's; kvt_stats sizes and counters equal the model's; every match returns the model's
 * longest cached prefix and its slots. Evictions are the engine's choice, but they must be
 * leaves first (the cached set stays prefix-closed), spare every locked page, free what they
 * report, evict enough, and follow the policy's order.
 *
 * KVT_SEED=<n> reruns a sequence; the seed is printed at the start and on failure.
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

#include "engine.h"
#include "engine_fixture.h"
#include "harness.h"
#include "rng.h"

#define MAX_PS 4
#define KEY_PAGES 16                          /* longest key, in pages */
#define TOK_MAX (KEY_PAGES * MAX_PS + MAX_PS) /* longest key in tokens, with a partial page */
#define MAX_CONTEXT 128
#define N_REQ 6 /* few request slots, so kvt_req_begin runs out of them */
#define N_LOCKS 16
#define N_HELD 16
#define N_REFS 32
#define N_BASE 8
#define N_NS 3
#define ALPHABET 4 /* few tokens, so keys share prefixes and nodes split */
#define ALLOC_PAGES 12
#define DEFAULT_SEED 0x6b76746965720001ull

enum mstate { M_FREE, M_HELD, M_REQ, M_CACHED, M_PENDING };

/* One device page as the model sees it; the trie fields matter only while it is cached. */
struct mpage {
    uint8_t state; /* enum mstate */
    uint8_t ns;
    uint32_t parent; /* 0: the namespace root */
    uint32_t child, sibling;
    uint32_t tok[MAX_PS];
    uint64_t access, created, hits;
    int32_t prio;
    uint32_t gen; /* bumped each time the page enters the cache: tells a ref's page is gone */
};

struct tkey {
    uint32_t ns;
    int alias; /* default namespace spelled as a non-NULL pointer with ns_len 0 */
    size_t len;
    uint32_t tok[TOK_MAX];
};

/* Slots the test got from kvt_alloc (or kept after an insert): whole page runs. */
struct held {
    int32_t slots[KEY_PAGES * MAX_PS];
    size_t n;
};

struct tlock {
    kvt_node_ref ref;
    uint32_t page; /* model page ending the locked prefix; 0: the root */
    uint32_t count;
};

/* A ref the test saw once, kept to check that a dead or unlocked ref is refused. */
struct oldref {
    kvt_node_ref ref;
    uint32_t page, gen;
};

struct mreq {
    int active;
    struct kvt_req r;
    struct tkey key;      /* prompt and output: what the request will hold when done */
    size_t filled;        /* tokens whose slots are in the row */
    int32_t row[TOK_MAX]; /* mirror of the request's req_to_token row */
    uint32_t lock_page;   /* model page ending the protected prefix; 0: the root */
};

struct cfg {
    const char *name;
    uint32_t ps, device_tokens, policy, hash_pages;
    uint32_t ops;
    int busy_close; /* close without the drain: kvt_close must free what is outstanding */
};

struct sim {
    kvt_engine *e;
    const struct cfg *cfg;
    uint32_t ps, npages;
    uint64_t seed, rng, step, clock, epoch;
    const char *op;
    struct mpage *pg;
    uint64_t *mark;    /* == epoch: locked, after mark_locked */
    uint64_t *gone;    /* == epoch: taken by the eviction being checked */
    uint32_t *scratch; /* npages entries */
    uint32_t root[N_NS];
    uint32_t base[N_BASE][TOK_MAX];
    struct held held[N_HELD];
    size_t nheld;
    struct tlock locks[N_LOCKS];
    size_t nlocks;
    struct oldref refs[N_REFS];
    size_t nrefs, refs_next;
    struct mreq req[N_REQ];
    struct kvt_req stale; /* a copy of the last finished request: dead once finished */
    int have_stale;
    int group_open;
    uint64_t m_calls, m_query, m_hit, inserted, evicted;       /* expected kvt_stats counters */
    uint64_t enomem, refused, finished, max_cached, max_nodes; /* what the run exercised */
};

/* Namespaces are bytes, not strings: the third extends the second past a NUL. */
static const char NS_BYTES[N_NS][9] = {"", "lora-7", "lora-7\0x"};
static const size_t NS_LEN[N_NS] = {0, 6, 8};

/* ---- failure reporting ---- */

#define HARNESS_RUN(s)                                                                             \
    (&(struct harness_run){.prog = "test_random",                                                  \
                           .config = (s)->cfg->name,                                               \
                           .seed = (s)->seed,                                                      \
                           .step = (s)->step,                                                      \
                           .op = (s)->op})

/* ---- PRNG: splitmix64, so a seed gives the same run everywhere ---- */

static uint64_t rnd(struct sim *s)
{
    return rng_next(&s->rng);
}

static uint32_t below(struct sim *s, uint32_t n)
{
    return (uint32_t)(rnd(s) % n);
}

static int chance(struct sim *s, uint32_t pct)
{
    return below(s, 100) < pct;
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* ---- keys ---- */

static struct kvt_key kkey(const struct tkey *k, size_t len)
{
    struct kvt_key key = {.tokens = k->tok, .len = len};

    if (k->ns) {
        key.ns = NS_BYTES[k->ns];
        key.ns_len = NS_LEN[k->ns];
    } else if (k->alias) {
        key.ns = "ignored";
    }
    return key;
}

/* Bases branch off each other, and keys are prefixes of bases with a mutation now and then:
 * prefixes are shared at every depth, and inserts and matches split nodes. */
static void make_bases(struct sim *s)
{
    for (uint32_t b = 0; b < N_BASE; b++) {
        uint32_t from = b ? below(s, b) : 0, cut = b ? below(s, TOK_MAX) : 0;
        for (uint32_t i = 0; i < TOK_MAX; i++)
            s->base[b][i] = i < cut ? s->base[from][i] : below(s, ALPHABET);
    }
}

static void gen_key(struct sim *s, struct tkey *k, int aligned)
{
    const uint32_t *b = s->base[below(s, N_BASE)];
    uint32_t r = below(s, 10);

    k->ns = r < 5 ? 0 : r < 8 ? 1 : 2;
    k->alias = k->ns == 0 && chance(s, 20);
    if (aligned)
        k->len = (1 + below(s, KEY_PAGES)) * (size_t)s->ps;
    else
        k->len = 1 + below(s, KEY_PAGES * s->ps + s->ps - 1);
    memcpy(k->tok, b, k->len * sizeof(uint32_t));
    for (int m = 0; m < 2 && chance(s, 30); m++)
        k->tok[below(s, (uint32_t)k->len)] = below(s, ALPHABET);
}

/* ---- the model's trie ---- */

static uint32_t child_of(const struct sim *s, uint32_t parent, uint32_t ns, const uint32_t *tok)
{
    uint32_t c = parent ? s->pg[parent].child : s->root[ns];

    for (; c; c = s->pg[c].sibling)
        if (memcmp(s->pg[c].tok, tok, s->ps * sizeof(uint32_t)) == 0)
            return c;
    return 0;
}

/* Whole pages of k[0, len) the model has cached; path (may be NULL) gets their pages. */
static size_t model_prefix(const struct sim *s, const struct tkey *k, size_t len, uint32_t *path)
{
    uint32_t node = 0;
    size_t i;

    for (i = 0; i < len / s->ps; i++) {
        uint32_t c = child_of(s, node, k->ns, k->tok + i * s->ps);
        if (!c)
            break;
        if (path)
            path[i] = c;
        node = c;
    }
    return i;
}

/* The tokens of the cached prefix ending at page p (the key a lock on it stands for). */
static void prefix_key(const struct sim *s, uint32_t p, struct tkey *k)
{
    uint32_t chain[KEY_PAGES + 1];
    size_t n = 0;

    for (uint32_t q = p; q; q = s->pg[q].parent) {
        REQUIRE(s, n < KEY_PAGES);
        chain[n++] = q;
    }
    k->ns = s->pg[p].ns;
    k->alias = 0;
    k->len = n * s->ps;
    for (size_t i = 0; i < n; i++)
        memcpy(k->tok + i * s->ps, s->pg[chain[n - 1 - i]].tok, s->ps * sizeof(uint32_t));
}

static void path_slots(const struct sim *s, const uint32_t *path, size_t np, int32_t *slots)
{
    for (size_t i = 0; i < np * s->ps; i++)
        slots[i] = (int32_t)(path[i / s->ps] * s->ps + i % s->ps);
}

static uint32_t page_of(const struct sim *s, int32_t slot)
{
    REQUIRE(s, slot >= (int32_t)s->ps && (uint32_t)slot / s->ps <= s->npages);
    return (uint32_t)slot / s->ps;
}

static void model_add(struct sim *s, uint32_t ns, uint32_t parent, const uint32_t *tok, uint32_t p,
                      int32_t prio)
{
    struct mpage *m = &s->pg[p];
    uint32_t *head = parent ? &s->pg[parent].child : &s->root[ns];

    REQUIRE(s, m->state == M_HELD || m->state == M_REQ);
    m->state = M_CACHED;
    m->ns = (uint8_t)ns;
    m->parent = parent;
    m->child = 0;
    m->sibling = *head;
    *head = p;
    memcpy(m->tok, tok, s->ps * sizeof(uint32_t));
    m->access = m->created = s->clock;
    m->hits = 0;
    m->prio = prio;
    m->gen++;
}

static void model_unlink(struct sim *s, uint32_t p)
{
    struct mpage *m = &s->pg[p];
    uint32_t *link = m->parent ? &s->pg[m->parent].child : &s->root[m->ns];

    while (*link != p) {
        REQUIRE(s, *link != 0);
        link = &s->pg[*link].sibling;
    }
    *link = m->sibling;
    m->sibling = m->child = m->parent = 0;
}

/* A page the engine freed: pending while a free group is open. */
static void model_release(struct sim *s, uint32_t p)
{
    s->pg[p].state = s->group_open ? M_PENDING : M_FREE;
}

/* What a match does to the pages it walks: the access clock and, for a match, hit counts. */
static void touch(struct sim *s, const uint32_t *path, size_t np, int hit)
{
    for (size_t i = 0; i < np; i++) {
        s->pg[path[i]].access = s->clock;
        s->pg[path[i]].hits += hit != 0;
    }
}

/* Mirror an insert of k[0, np pages) whose cached prefix is path[0, c): pages c.. of slots
 * join the cache, and every page of the key is touched and takes at least prio. */
static void model_insert(struct sim *s, const struct tkey *k, size_t np, uint32_t *path, size_t c,
                         const int32_t *slots, int32_t prio)
{
    s->clock++;
    for (size_t i = c; i < np; i++) {
        path[i] = page_of(s, slots[i * s->ps]);
        model_add(s, k->ns, i ? path[i - 1] : 0, k->tok + i * s->ps, path[i], prio);
    }
    touch(s, path, np, 0);
    for (size_t i = 0; i < np; i++)
        if (s->pg[path[i]].prio < prio)
            s->pg[path[i]].prio = prio;
    s->inserted += np - c;
}

/* The re-match inside kvt_req_cache_unfinished refreshes the path but is not counted. */
static void model_rematch(struct sim *s, const uint32_t *path, size_t c)
{
    s->clock++;
    touch(s, path, c, 1);
}

static void model_match(struct sim *s, const uint32_t *path, size_t c, size_t len)
{
    model_rematch(s, path, c);
    s->m_calls++;
    s->m_query += len / s->ps * s->ps;
    s->m_hit += c * s->ps;
}

static size_t mark_path(struct sim *s, uint32_t p)
{
    size_t n = 0;

    for (; p && s->mark[p] != s->epoch; p = s->pg[p].parent) {
        s->mark[p] = s->epoch;
        n++;
    }
    return n;
}

/* Mark every page under a lock held by the test or a request; returns how many. */
static size_t mark_locked(struct sim *s)
{
    size_t n = 0;

    s->epoch++;
    for (size_t i = 0; i < s->nlocks; i++)
        n += mark_path(s, s->locks[i].page);
    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active)
            n += mark_path(s, s->req[i].lock_page);
    return n;
}

static size_t count_state(const struct sim *s, int state)
{
    size_t n = 0;

    for (uint32_t p = 1; p <= s->npages; p++)
        n += s->pg[p].state == state;
    return n;
}

static void remember_ref(struct sim *s, kvt_node_ref ref, uint32_t page)
{
    s->refs[s->refs_next] = (struct oldref){ref, page, page ? s->pg[page].gen : 0};
    s->refs_next = (s->refs_next + 1) % N_REFS;
    if (s->nrefs < N_REFS)
        s->nrefs++;
}

/* ---- the engine side ---- */

/* The one private field the test reads: there is no public per-page state, and the model
 * needs it to learn which pages an eviction took and to compare owners page by page. */
static int engine_state(const struct sim *s, uint32_t p)
{
    return s->e->alloc.state[p];
}

static struct kvt_stats stats(const struct sim *s)
{
    struct kvt_stats st = {.size = sizeof(st)};

    EXPECT_RC(s, kvt_stats(s->e, &st), 0);
    return st;
}

/* A call that fails must leave the engine as it was. */
static void same_stats(struct sim *s, const struct kvt_stats *a)
{
    struct kvt_stats b = stats(s);

    s->refused++;
    REQUIRE(s, a->cached_tokens == b.cached_tokens && a->evictable_tokens == b.evictable_tokens &&
                   a->protected_tokens == b.protected_tokens && a->nodes == b.nodes);
    REQUIRE(s, a->device_free_tokens == b.device_free_tokens && a->tree_bytes == b.tree_bytes);
    REQUIRE(s, a->req_slots_free == b.req_slots_free && a->match_calls == b.match_calls);
    REQUIRE(s, a->inserted_tokens == b.inserted_tokens && a->evicted_tokens == b.evicted_tokens);
}

static const int EXPECTED_STATE[] = {
    [M_FREE] = PAGE_FREE,     [M_HELD] = PAGE_USED,       [M_REQ] = PAGE_USED,
    [M_CACHED] = PAGE_CACHED, [M_PENDING] = PAGE_PENDING,
};

/* Pages the test's own bookkeeping says are held and request-owned: must equal the model's
 * counts, or the test lost track of a page. */
static void check_bookkeeping(struct sim *s, size_t held, size_t owned)
{
    size_t h = 0, o = 0;

    for (size_t i = 0; i < s->nheld; i++) {
        REQUIRE(s, s->held[i].n > 0 && s->held[i].n % s->ps == 0);
        for (size_t j = 0; j < s->held[i].n; j += s->ps)
            REQUIRE(s, s->pg[page_of(s, s->held[i].slots[j])].state == M_HELD);
        h += s->held[i].n / s->ps;
    }
    for (size_t i = 0; i < N_REQ; i++) {
        const struct mreq *q = &s->req[i];
        if (!q->active)
            continue;
        for (size_t j = q->r.protected_len; j < q->filled; j += s->ps)
            REQUIRE(s, s->pg[page_of(s, q->row[j])].state == M_REQ);
        o += (q->filled - q->r.protected_len + s->ps - 1) / s->ps;
    }
    REQUIRE(s, h == held && o == owned);
}

static void check_all(struct sim *s)
{
    char why[256] = "";
    int rc = engine_check(s->e, why, sizeof(why));
    struct kvt_stats st = stats(s);
    size_t n[5] = {0}, active = 0;
    uint64_t ps = s->ps;

    if (rc)
        FAIL(s, "engine_check: %d: %s", rc, why);
    for (uint32_t p = 1; p <= s->npages; p++) {
        int m = s->pg[p].state;
        n[m]++;
        if (engine_state(s, p) != EXPECTED_STATE[m])
            FAIL(s, "page %u: engine state %d, model state %d", p, engine_state(s, p), m);
    }
    for (size_t i = 0; i < N_REQ; i++)
        active += s->req[i].active != 0;
    check_bookkeeping(s, n[M_HELD], n[M_REQ]);

    REQUIRE(s, st.evictable_tokens + st.protected_tokens == st.cached_tokens);
    REQUIRE(s, st.device_tokens == s->npages * ps);
    REQUIRE(s, st.cached_tokens == n[M_CACHED] * ps);
    REQUIRE(s, st.protected_tokens == mark_locked(s) * ps);
    REQUIRE(s, st.device_free_tokens == n[M_FREE] * ps && kvt_available(s->e) == n[M_FREE] * ps);
    REQUIRE(s,
            st.device_free_tokens + (n[M_HELD] + n[M_REQ] + n[M_PENDING]) * ps + st.cached_tokens ==
                st.device_tokens);
    REQUIRE(s, st.nodes <= n[M_CACHED] && (st.nodes == 0) == (n[M_CACHED] == 0));
    REQUIRE(s, st.req_slots_free == N_REQ - active && kvt_req_available(s->e) == N_REQ - active);
    REQUIRE(s, st.match_calls == s->m_calls && st.match_query_tokens == s->m_query &&
                   st.match_hit_tokens == s->m_hit);
    REQUIRE(s, st.inserted_tokens == s->inserted * ps && st.evicted_tokens == s->evicted * ps);
    if (n[M_CACHED] > s->max_cached)
        s->max_cached = n[M_CACHED];
    if (st.nodes > s->max_nodes)
        s->max_nodes = st.nodes;
}

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
static size_t learn_eviction(struct sim *s, size_t want)
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

static void do_evict(struct sim *s, size_t tokens)
{
    size_t got = SIZE_MAX, want = tokens / s->ps + (tokens % s->ps != 0);
    int report = chance(s, 80);

    EXPECT_RC(s, kvt_evict(s->e, tokens, report ? &got : NULL), 0);
    size_t ngone = learn_eviction(s, want);
    if (report)
        REQUIRE(s, got == ngone * s->ps);
}

static void op_evict(struct sim *s)
{
    uint32_t r = below(s, 20);
    size_t tokens = r < 8 ? below(s, 8 * s->ps) : r < 17 ? below(s, 64 * s->ps) : 0;

    if (r == 19)
        tokens = SIZE_MAX; /* everything: rarely, so the cache fills up */
    do_evict(s, tokens);
}

/* ---- slots held by the test ---- */

/* Check that slots are whole page runs the model had free, and give them to owner. */
static void take_pages(struct sim *s, const int32_t *slots, size_t n, int owner)
{
    for (size_t i = 0; i < n; i += s->ps) {
        uint32_t p = page_of(s, slots[i]);
        REQUIRE(s, slots[i] % (int32_t)s->ps == 0);
        for (uint32_t j = 1; j < s->ps; j++)
            REQUIRE(s, slots[i + j] == slots[i] + (int32_t)j);
        if (s->pg[p].state != M_FREE)
            FAIL(s, "allocator handed out page %u in model state %d", p, s->pg[p].state);
        s->pg[p].state = (uint8_t)owner;
    }
}

/* kvt_alloc of pages pages; on -ENOMEM evict the shortfall and retry when may_evict. */
static int alloc_pages(struct sim *s, size_t pages, int32_t *slots, int may_evict)
{
    int rc = kvt_alloc(s->e, pages * s->ps, slots);

    s->enomem += rc == -ENOMEM;
    if (rc == -ENOMEM && may_evict) {
        size_t nfree = count_state(s, M_FREE);
        REQUIRE(s, nfree < pages);
        do_evict(s, (pages - nfree) * s->ps);
        rc = kvt_alloc(s->e, pages * s->ps, slots);
    }
    if (rc == -ENOMEM) {
        REQUIRE(s, count_state(s, M_FREE) < pages);
        return rc;
    }
    EXPECT_RC(s, rc, 0);
    take_pages(s, slots, pages * s->ps, M_HELD);
    return 0;
}

static void free_slots(struct sim *s, const int32_t *slots, size_t n)
{
    EXPECT_RC(s, kvt_free(s->e, slots, n), 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = page_of(s, slots[i]);
        if (s->pg[p].state == M_HELD)
            model_release(s, p);
    }
}

/* Slots that are the test's now: keep them for a later free, or free them at once. */
static void adopt(struct sim *s, const int32_t *slots, size_t n)
{
    if (n == 0)
        return;
    if (s->nheld == N_HELD) {
        free_slots(s, slots, n);
        return;
    }
    memcpy(s->held[s->nheld].slots, slots, n * sizeof(int32_t));
    s->held[s->nheld++].n = n;
}

/* Drop the pages of held runs that left the test (inserted or freed). */
static void held_compact(struct sim *s)
{
    size_t k = 0;

    for (size_t i = 0; i < s->nheld; i++) {
        struct held *h = &s->held[i];
        size_t m = 0;
        for (size_t j = 0; j < h->n; j += s->ps)
            if (s->pg[page_of(s, h->slots[j])].state == M_HELD) {
                memmove(h->slots + m, h->slots + j, s->ps * sizeof(int32_t));
                m += s->ps;
            }
        h->n = m;
        if (m)
            s->held[k++] = *h;
    }
    s->nheld = k;
}

static void op_alloc(struct sim *s)
{
    int32_t slots[ALLOC_PAGES * MAX_PS];
    size_t pages = 1 + below(s, ALLOC_PAGES);

    if (chance(s, 3)) {
        /* Not a whole number of pages: refused; none: nothing to do. Nothing taken. */
        struct kvt_stats st = stats(s);
        size_t n = s->ps > 1 && chance(s, 70) ? pages * s->ps - 1 : 0;
        EXPECT_RC(s, kvt_alloc(s->e, n, n ? slots : NULL), n ? -EINVAL : 0);
        same_stats(s, &st);
        return;
    }
    if (s->nheld < N_HELD && alloc_pages(s, pages, slots, chance(s, 50)) == 0)
        adopt(s, slots, pages * s->ps);
}

/* A slot kvt_free must refuse: a cached or free page, the padding page, out of range. */
static int32_t bad_slot(struct sim *s)
{
    uint32_t start = 1 + below(s, s->npages), want = chance(s, 50) ? M_CACHED : M_FREE;

    switch (below(s, 4)) {
    case 0:
        for (uint32_t i = 0; i < s->npages; i++) {
            uint32_t p = 1 + (start - 1 + i) % s->npages;
            if (s->pg[p].state == want)
                return (int32_t)(p * s->ps + below(s, s->ps));
        }
        return -1;
    case 1:
        return (int32_t)below(s, s->ps); /* padding page */
    case 2:
        return (int32_t)((s->npages + 1) * s->ps + below(s, s->ps));
    default:
        return -1 - (int32_t)below(s, 3);
    }
}

static void shuffle(struct sim *s, int32_t *v, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = below(s, (uint32_t)i);
        int32_t t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

static void op_free(struct sim *s)
{
    int32_t list[2 * KEY_PAGES * MAX_PS + 1];
    size_t n = 0;
    uint32_t r = below(s, 10);

    if (s->nheld == 0) {
        if (chance(s, 10))
            EXPECT_RC(s, kvt_free(s->e, NULL, 0), 0); /* nothing to free is not an error */
        return;
    }
    struct held *h = &s->held[below(s, (uint32_t)s->nheld)];
    if (r < 6) {
        memcpy(list, h->slots, h->n * sizeof(int32_t));
        n = h->n;
    } else {
        /* Some pages, named by some of their slots, some twice: each page returns once. */
        for (size_t j = 0; j < h->n; j += s->ps) {
            if (chance(s, 50) && !(n == 0 && j + s->ps == h->n))
                continue;
            for (uint32_t t = 0; t < s->ps; t++)
                if (t == 0 || chance(s, 50))
                    list[n++] = h->slots[j + (t + s->ps - 1) % s->ps];
            if (chance(s, 20))
                list[n++] = h->slots[j + below(s, s->ps)];
        }
    }
    shuffle(s, list, n);
    if (r == 9) {
        struct kvt_stats st = stats(s);
        size_t at = below(s, (uint32_t)n + 1);
        memmove(list + at + 1, list + at, (n - at) * sizeof(int32_t));
        list[at] = bad_slot(s);
        EXPECT_RC(s, kvt_free(s->e, list, n + 1), -EINVAL);
        same_stats(s, &st);
        return;
    }
    free_slots(s, list, n);
    held_compact(s);
}

static void op_group(struct sim *s)
{
    int misuse = chance(s, 25);

    if (s->group_open == misuse) {
        struct kvt_stats st = stats(s);
        EXPECT_RC(s, s->group_open ? kvt_free_group_begin(s->e) : kvt_free_group_end(s->e),
                  -EINVAL);
        same_stats(s, &st);
    } else if (s->group_open) {
        EXPECT_RC(s, kvt_free_group_end(s->e), 0);
        s->group_open = 0;
        for (uint32_t p = 1; p <= s->npages; p++)
            if (s->pg[p].state == M_PENDING)
                s->pg[p].state = M_FREE;
    } else {
        EXPECT_RC(s, kvt_free_group_begin(s->e), 0);
        s->group_open = 1;
    }
}

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

static void op_insert(struct sim *s)
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

static void op_match(struct sim *s)
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

static void op_unlock(struct sim *s)
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
static void op_bad_ref(struct sim *s)
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
static void op_lock_old(struct sim *s)
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

/* ---- requests ---- */

static void verify_row(struct sim *s, const struct mreq *q)
{
    int32_t row[TOK_MAX];

    EXPECT_RC(s, kvt_req_read(s->e, &q->r, 0, q->filled, row), 0);
    for (size_t i = 0; i < q->filled; i++)
        if (row[i] != q->row[i])
            FAIL(s, "request row[%zu] is %d, expected %d", i, row[i], q->row[i]);
}

/* Free the request's own pages among its tokens [from, to) (from is page-aligned). */
static void release_own(struct sim *s, const struct mreq *q, size_t from, size_t to)
{
    for (size_t i = from; i < to; i += s->ps) {
        uint32_t p = page_of(s, q->row[i]);
        REQUIRE(s, s->pg[p].state == M_REQ);
        model_release(s, p);
    }
}

static struct mreq *pick_req(struct sim *s, int want_active)
{
    uint32_t start = below(s, N_REQ);

    for (uint32_t i = 0; i < N_REQ; i++) {
        struct mreq *q = &s->req[(start + i) % N_REQ];
        if (q->active == want_active)
            return q;
    }
    return NULL;
}

static void op_req_begin(struct sim *s)
{
    struct mreq *q = pick_req(s, 0);
    uint32_t path[KEY_PAGES + 1];

    if (!q) {
        struct kvt_stats st = stats(s);
        struct tkey k;
        struct kvt_req r;
        gen_key(s, &k, 0);
        struct kvt_key key = kkey(&k, k.len);
        EXPECT_RC(s, kvt_req_begin(s->e, &key, &r), -ENOMEM);
        s->enomem++;
        same_stats(s, &st);
        return;
    }
    gen_key(s, &q->key, 0);
    size_t c = model_prefix(s, &q->key, q->key.len, path);
    struct kvt_key key = kkey(&q->key, q->key.len);
    EXPECT_RC(s, kvt_req_begin(s->e, &key, &q->r), 0);
    REQUIRE(s, q->r.pool_idx >= 0 && q->r.last_node != 0);
    if (q->r.protected_len != c * s->ps)
        FAIL(s, "request matched %zu tokens, the model %zu", q->r.protected_len, c * s->ps);
    model_match(s, path, c, q->key.len);
    q->active = 1;
    q->filled = c * s->ps;
    q->lock_page = c ? path[c - 1] : 0;
    path_slots(s, path, c, q->row);
    remember_ref(s, q->r.last_node, q->lock_page);
    verify_row(s, q);
}

/* Check the slots kvt_alloc_extend/decode gave one request for tokens [filled, filled + n):
 * inside a page they continue the request's own page; at a page start, a free page. */
static void take_extension(struct sim *s, struct mreq *q, const int32_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t pos = q->filled + i;
        if (pos % s->ps) {
            if (out[i] != q->row[pos - 1] + 1)
                FAIL(s, "token %zu got slot %d after slot %d", pos, out[i], q->row[pos - 1]);
        } else {
            uint32_t p = page_of(s, out[i]);
            REQUIRE(s, out[i] % (int32_t)s->ps == 0);
            if (s->pg[p].state != M_FREE)
                FAIL(s, "extension handed out page %u in model state %d", p, s->pg[p].state);
            s->pg[p].state = M_REQ;
        }
        q->row[pos] = out[i];
    }
    EXPECT_RC(s, kvt_req_write(s->e, &q->r, q->filled, out, n), 0);
    q->filled += n;
    verify_row(s, q);
}

static void req_finish(struct sim *s, struct mreq *q, int insert, int32_t prio);

/* Grow one or two requests by a chunk (or one decode token); on -ENOMEM evict and retry,
 * then give up: release a request with what it has, or let it wait if it has nothing. */
static void op_req_extend(struct sim *s)
{
    struct mreq *qs[2];
    uint32_t pre[2], seq[2];
    int32_t last[2], out[2 * 3 * MAX_PS];
    size_t nb = 0, total = 0, need = 0;
    uint32_t start = below(s, N_REQ), want = chance(s, 20) ? 2 : 1;

    for (uint32_t i = 0; i < N_REQ && nb < want; i++) {
        struct mreq *q = &s->req[(start + i) % N_REQ];
        if (!q->active || q->filled == q->key.len)
            continue;
        size_t n = 1 + below(s, (uint32_t)min_sz(q->key.len - q->filled, 3 * s->ps));
        qs[nb] = q;
        pre[nb] = (uint32_t)q->filled;
        seq[nb] = (uint32_t)(q->filled + n);
        last[nb] = q->filled ? q->row[q->filled - 1] : -1;
        total += n;
        need += (seq[nb] + s->ps - 1) / s->ps - (pre[nb] + s->ps - 1) / s->ps;
        nb++;
    }
    if (nb == 0)
        return;
    int decode = nb == 1 && total == 1 && chance(s, 50);
    size_t nfree = count_state(s, M_FREE);
    int rc = decode ? kvt_alloc_decode(s->e, 1, seq, last, out)
                    : kvt_alloc_extend(s->e, nb, pre, seq, last, out, total);
    int could = 0;
    if (need > nfree) {
        /* Short of pages, the engine evicts exactly the shortfall, and only when eviction
         * can cover it: never inside a free group (what it frees is held back there). */
        size_t evictable = count_state(s, M_CACHED) - mark_locked(s);
        could = !s->group_open && need - nfree <= evictable;
        size_t gone = learn_eviction(s, could ? need - nfree : 0);
        if (!could)
            REQUIRE(s, gone == 0);
    }
    if (rc) {
        EXPECT_RC(s, rc, -ENOMEM);
        s->enomem++;
        REQUIRE(s, need > nfree && !could);
        for (size_t i = 0; i < nb; i++)
            req_finish(s, qs[i], 0, 0);
        return;
    }
    for (size_t i = 0, off = 0; i < nb; off += seq[i] - pre[i], i++)
        take_extension(s, qs[i], out + off, seq[i] - pre[i]);
    for (size_t i = 0; i < nb; i++)
        if (qs[i]->filled == qs[i]->key.len && chance(s, 50))
            req_finish(s, qs[i], chance(s, 80), (int32_t)below(s, 4));
}

/* Chunked-prefill boundary: the request's whole pages join the cache. */
static void op_req_unfinished(struct sim *s)
{
    struct mreq *q = pick_req(s, 1);
    uint32_t path[KEY_PAGES + 1];

    if (!q || q->filled == 0)
        return;
    size_t len = q->filled, kl = len / s->ps * s->ps, pl = q->r.protected_len;
    struct kvt_key key = kkey(&q->key, len);
    if (kl <= pl) {
        struct kvt_stats st = stats(s);
        EXPECT_RC(s, kvt_req_cache_unfinished(s->e, &q->r, &key), 0);
        same_stats(s, &st);
        REQUIRE(s, q->r.protected_len == pl);
        return;
    }
    size_t c = model_prefix(s, &q->key, kl, path);
    REQUIRE(s, c * s->ps >= pl); /* the locked prefix is cached */
    EXPECT_RC(s, kvt_req_cache_unfinished(s->e, &q->r, &key), 0);
    release_own(s, q, pl, c * s->ps);
    model_insert(s, &q->key, kl / s->ps, path, c, q->row, 0);
    model_rematch(s, path, kl / s->ps);
    REQUIRE(s, q->r.protected_len == kl && q->r.last_node != 0);
    path_slots(s, path, kl / s->ps, q->row);
    q->lock_page = path[kl / s->ps - 1];
    remember_ref(s, q->r.last_node, q->lock_page);
    verify_row(s, q);
}

static void req_finish(struct sim *s, struct mreq *q, int insert, int32_t prio)
{
    uint32_t path[KEY_PAGES + 1];
    size_t filled = q->filled, pl = q->r.protected_len, c = 0;
    /* Sometimes fewer tokens are committed than the row holds (a rejected draft, a stop
     * string): the slots past the key are freed with the rest. */
    size_t len = chance(s, 15) ? pl + below(s, (uint32_t)(filled - pl + 1)) : filled;
    size_t kl = len / s->ps * s->ps;
    struct kvt_key key = kkey(&q->key, len);

    /* A request that matched nothing and got no slot yet is released with an empty key. A
     * key past what its row holds would make the engine read entries never written. */
    if (filled < q->key.len && chance(s, 5)) {
        struct kvt_stats st = stats(s);
        key.len = filled + 1;
        EXPECT_RC(s, kvt_req_cache_finished(s->e, &q->r, &key, prio, insert), -EINVAL);
        same_stats(s, &st);
        key.len = len;
    }
    if (pl > 0 && chance(s, 5)) {
        struct kvt_stats st = stats(s);
        key.len = pl - 1; /* shorter than what the request has locked */
        EXPECT_RC(s, kvt_req_cache_finished(s->e, &q->r, &key, prio, insert), -EINVAL);
        same_stats(s, &st);
        key.len = len;
    }
    if (insert && kl > pl) {
        c = model_prefix(s, &q->key, kl, path);
        REQUIRE(s, c * s->ps >= pl);
    }
    struct kvt_req copy = q->r;
    EXPECT_RC(s, kvt_req_cache_finished(s->e, &q->r, &key, prio, insert), 0);
    REQUIRE(s, q->r.pool_idx == -1 && q->r.protected_len == 0 && q->r.last_node == 0);
    s->stale = copy;
    s->have_stale = 1;
    s->finished++;
    if (insert && kl > pl) {
        release_own(s, q, pl, c * s->ps);
        model_insert(s, &q->key, kl / s->ps, path, c, q->row, prio);
    } else {
        release_own(s, q, pl, kl);
    }
    if (filled > kl)
        release_own(s, q, kl, filled); /* the partial tail page, and what is past the key */
    q->active = 0;
    if (chance(s, 10)) {
        struct kvt_stats st = stats(s);
        EXPECT_RC(s, kvt_req_cache_finished(s->e, &q->r, &key, prio, insert), -EINVAL);
        same_stats(s, &st);
    }
}

static void op_req_finish(struct sim *s)
{
    struct mreq *q = pick_req(s, 1);

    if (q)
        req_finish(s, q, chance(s, 75), (int32_t)below(s, 4));
}

/* ---- calls that must be refused without a change ---- */

static void op_misuse(struct sim *s)
{
    static uint32_t big[MAX_CONTEXT + 1];
    struct kvt_stats st = stats(s);
    struct kvt_key key = {.tokens = big, .len = 0};
    struct kvt_match m;
    int32_t out[MAX_PS + 1];
    uint32_t pre = 0, seq = 0;
    int32_t last = -1;

    switch (below(s, 7)) {
    case 0:
        EXPECT_RC(s, kvt_match(s->e, &key, NULL, &m), -EINVAL);
        break;
    case 1:
        key.len = MAX_CONTEXT + 1;
        EXPECT_RC(s, kvt_match(s->e, &key, NULL, &m), -EINVAL);
        break;
    case 2:
        key.len = s->ps;
        key.ns = big;
        key.ns_len = KVT_NS_MAX + 1;
        EXPECT_RC(s, kvt_match(s->e, &key, NULL, &m), -EINVAL);
        break;
    case 3:
        key.len = s->ps;
        EXPECT_RC(s, kvt_insert(s->e, &key, out, 0, NULL), -EINVAL);
        break;
    case 4:
        pre = seq = 4; /* no growth */
        EXPECT_RC(s, kvt_alloc_extend(s->e, 1, &pre, &seq, &last, out, 0), -EINVAL);
        break;
    case 5:
        /* A leftover copy of a finished request, its slot maybe serving another one now. */
        if (s->have_stale) {
            EXPECT_RC(s, kvt_req_read(s->e, &s->stale, 0, 1, out), -EINVAL);
            EXPECT_RC(s, kvt_req_write(s->e, &s->stale, 0, out, 0), -EINVAL);
            key.len = 0;
            EXPECT_RC(s, kvt_req_cache_finished(s->e, &s->stale, &key, 0, 0), -EINVAL);
        }
        break;
    default:
        if (s->ps > 1) {
            /* Continuing a partial page the caller does not own (the padding page). */
            pre = 1;
            seq = 2;
            last = 0;
            EXPECT_RC(s, kvt_alloc_extend(s->e, 1, &pre, &seq, &last, out, 1), -EINVAL);
        }
        break;
    }
    same_stats(s, &st);
}

/* ---- the run ---- */

enum {
    OP_INSERT,
    OP_MATCH,
    OP_UNLOCK,
    OP_BAD_REF,
    OP_LOCK_OLD,
    OP_EVICT,
    OP_ALLOC,
    OP_FREE,
    OP_GROUP,
    OP_REQ_BEGIN,
    OP_REQ_EXTEND,
    OP_REQ_UNFINISHED,
    OP_REQ_FINISH,
    OP_MISUSE,
    OP_COUNT
};

static const struct {
    const char *name;
    void (*fn)(struct sim *s);
    uint32_t weight;
} OPS[OP_COUNT] = {
    [OP_INSERT] = {"insert", op_insert, 14},
    [OP_MATCH] = {"match", op_match, 16},
    [OP_UNLOCK] = {"unlock", op_unlock, 7},
    [OP_BAD_REF] = {"bad_ref", op_bad_ref, 3},
    [OP_LOCK_OLD] = {"lock_old", op_lock_old, 2},
    [OP_EVICT] = {"evict", op_evict, 6},
    [OP_ALLOC] = {"alloc", op_alloc, 10},
    [OP_FREE] = {"free", op_free, 10},
    [OP_GROUP] = {"group", op_group, 3},
    [OP_REQ_BEGIN] = {"req_begin", op_req_begin, 7},
    [OP_REQ_EXTEND] = {"req_extend", op_req_extend, 14},
    [OP_REQ_UNFINISHED] = {"req_unfinished", op_req_unfinished, 4},
    [OP_REQ_FINISH] = {"req_finish", op_req_finish, 5},
    [OP_MISUSE] = {"misuse", op_misuse, 2},
};

static void one_step(struct sim *s)
{
    static uint32_t total;
    uint32_t r;

    if (!total)
        for (int i = 0; i < OP_COUNT; i++)
            total += OPS[i].weight;
    r = below(s, total);
    for (int i = 0; i < OP_COUNT; i++) {
        if (r < OPS[i].weight) {
            s->op = OPS[i].name;
            OPS[i].fn(s);
            return;
        }
        r -= OPS[i].weight;
    }
}

/* Hand everything back; then the device must be entirely free. */
static void drain(struct sim *s)
{
    s->op = "drain";
    if (s->group_open) {
        EXPECT_RC(s, kvt_free_group_end(s->e), 0);
        s->group_open = 0;
        for (uint32_t p = 1; p <= s->npages; p++)
            if (s->pg[p].state == M_PENDING)
                s->pg[p].state = M_FREE;
    }
    while (s->nlocks)
        op_unlock(s);
    while (s->nheld) {
        free_slots(s, s->held[0].slots, s->held[0].n);
        held_compact(s);
    }
    do_evict(s, SIZE_MAX);
    check_all(s);
    for (size_t i = 0; i < N_REQ; i++) {
        struct mreq *q = &s->req[i];
        if (!q->active)
            continue;
        req_finish(s, q, chance(s, 50), 0);
        check_all(s);
    }
    do_evict(s, SIZE_MAX);
    check_all(s);
    REQUIRE(s, kvt_available(s->e) == (size_t)s->npages * s->ps);
    REQUIRE(s, stats(s).cached_tokens == 0 && stats(s).nodes == 0);
}

/* What the run exercised, so a change that stops it reaching eviction or -ENOMEM shows. */
static void print_summary(const struct sim *s)
{
    printf("test_random: %s: inserted %" PRIu64 " evicted %" PRIu64 " hit %" PRIu64 "/%" PRIu64
           " tokens, most cached %" PRIu64 "/%u pages in %" PRIu64 " nodes, %" PRIu64
           " requests, %" PRIu64 " -ENOMEM, %" PRIu64 " refused calls\n",
           s->cfg->name, s->inserted * s->ps, s->evicted * s->ps, s->m_hit, s->m_query,
           s->max_cached, s->npages, s->max_nodes, s->finished, s->enomem, s->refused);
}

static uint64_t base_seed(void)
{
    const char *env = getenv("KVT_SEED");

    return env && *env ? strtoull(env, NULL, 0) : DEFAULT_SEED;
}

static void run(const struct cfg *cfg)
{
    struct kvt_options o;
    struct sim *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    s->cfg = cfg;
    s->seed = base_seed();
    /* Each configuration draws its own sequence from the one seed. */
    s->rng = s->seed;
    for (const char *c = cfg->name; *c; c++)
        s->rng = (s->rng ^ (uint8_t)*c) * 0x100000001B3ull;
    s->ps = cfg->ps;
    s->npages = cfg->device_tokens / cfg->ps;
    printf("test_random: %s: seed=%" PRIu64 " (KVT_SEED reruns it), %u ops\n", cfg->name, s->seed,
           cfg->ops);
    fflush(stdout);

    fixture_engine_options(&o, 1, 4);
    o.page_size = cfg->ps;
    o.device_tokens = cfg->device_tokens;
    o.max_requests = N_REQ;
    o.max_context = MAX_CONTEXT;
    o.evict_policy = cfg->policy;
    o.hash_pages = cfg->hash_pages;
    assert_int_equal(kvt_open(&o, &s->e), 0);

    s->pg = calloc(s->npages + 1, sizeof(*s->pg));
    s->mark = calloc(s->npages + 1, sizeof(*s->mark));
    s->gone = calloc(s->npages + 1, sizeof(*s->gone));
    s->scratch = calloc(s->npages + 1, sizeof(*s->scratch));
    assert_true(s->pg && s->mark && s->gone && s->scratch);
    make_bases(s);
    check_all(s);
    for (s->step = 0; s->step < cfg->ops; s->step++) {
        one_step(s);
        check_all(s);
    }
    if (!cfg->busy_close) {
        drain(s);
        print_summary(s);
    }
    kvt_close(s->e); /* busy_close: with locks, requests, held slots, maybe a free group */
    free(s->pg);
    free(s->mark);
    free(s->gone);
    free(s->scratch);
    free(s);
}

static void test_random_page1(void **state)
{
    static const struct cfg cfgs[] = {
        {"ps1-lru", 1, 256, KVT_EVICT_LRU, 0, 100000, 0},
        {"ps1-lfu-hashed", 1, 256, KVT_EVICT_LFU, 1, 100000, 0},
        {"ps1-priority", 1, 256, KVT_EVICT_PRIORITY, 0, 100000, 0},
        {"ps1-mru", 1, 256, KVT_EVICT_MRU, 0, 30000, 0}, /* order unchecked: fewer ops */
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

static void test_random_page4(void **state)
{
    static const struct cfg cfgs[] = {
        {"ps4-lru", 4, 1024, KVT_EVICT_LRU, 0, 100000, 0},
        {"ps4-filo-hashed", 4, 1024, KVT_EVICT_FILO, 1, 100000, 0},
        {"ps4-lfu", 4, 1024, KVT_EVICT_LFU, 0, 100000, 0},
        {"ps4-fifo", 4, 1024, KVT_EVICT_FIFO, 0, 30000, 0}, /* order unchecked: fewer ops */
        {"ps4-busy-close", 4, 1024, KVT_EVICT_LRU, 1, 3000, 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_page1),
        cmocka_unit_test(test_random_page4),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
