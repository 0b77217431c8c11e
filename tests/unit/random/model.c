#include "random_test.h"

/* ---- PRNG: splitmix64, so a seed gives the same run everywhere ---- */

static uint64_t rnd(struct sim *s)
{
    return rng_next(&s->rng);
}

uint32_t below(struct sim *s, uint32_t n)
{
    return (uint32_t)(rnd(s) % n);
}

int chance(struct sim *s, uint32_t pct)
{
    return below(s, 100) < pct;
}

size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* ---- keys ---- */

struct kvt_key kkey(const struct tkey *k, size_t len)
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
void make_bases(struct sim *s)
{
    for (uint32_t b = 0; b < N_BASE; b++) {
        uint32_t from = b ? below(s, b) : 0, cut = b ? below(s, TOK_MAX) : 0;
        for (uint32_t i = 0; i < TOK_MAX; i++)
            s->base[b][i] = i < cut ? s->base[from][i] : below(s, ALPHABET);
    }
}

void gen_key(struct sim *s, struct tkey *k, int aligned)
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
size_t model_prefix(const struct sim *s, const struct tkey *k, size_t len, uint32_t *path)
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
void prefix_key(const struct sim *s, uint32_t p, struct tkey *k)
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

void path_slots(const struct sim *s, const uint32_t *path, size_t np, int32_t *slots)
{
    for (size_t i = 0; i < np * s->ps; i++)
        slots[i] = (int32_t)(path[i / s->ps] * s->ps + i % s->ps);
}

uint32_t page_of(const struct sim *s, int32_t slot)
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

void model_unlink(struct sim *s, uint32_t p)
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
void model_release(struct sim *s, uint32_t p)
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
void model_insert(struct sim *s, const struct tkey *k, size_t np, uint32_t *path, size_t c,
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
void model_rematch(struct sim *s, const uint32_t *path, size_t c)
{
    s->clock++;
    touch(s, path, c, 1);
}

void model_match(struct sim *s, const uint32_t *path, size_t c, size_t len)
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
size_t mark_locked(struct sim *s)
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

size_t count_state(const struct sim *s, int state)
{
    size_t n = 0;

    for (uint32_t p = 1; p <= s->npages; p++)
        n += s->pg[p].state == state;
    return n;
}

void remember_ref(struct sim *s, kvt_node_ref ref, uint32_t page)
{
    s->refs[s->refs_next] = (struct oldref){ref, page, page ? s->pg[page].gen : 0};
    s->refs_next = (s->refs_next + 1) % N_REFS;
    if (s->nrefs < N_REFS)
        s->nrefs++;
}

/* ---- the engine side ---- */

/* The one private field the test reads: there is no public per-page state, and the model
 * needs it to learn which pages an eviction took and to compare owners page by page. */
int engine_state(const struct sim *s, uint32_t p)
{
    return engine_slots_full(&s->e->slots)->state[p];
}

struct kvt_stats stats(const struct sim *s)
{
    struct kvt_stats st = {.size = sizeof(st)};

    EXPECT_RC(s, kvt_stats(s->e, &st), 0);
    return st;
}

/* A call that fails must leave the engine as it was. */
void same_stats(struct sim *s, const struct kvt_stats *a)
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

void check_all(struct sim *s)
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
