#include "random_test.h"

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

void op_req_begin(struct sim *s)
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

/* Grow one or two requests by a chunk (or one decode token); on -ENOMEM evict and retry,
 * then give up: release a request with what it has, or let it wait if it has nothing. */
void op_req_extend(struct sim *s)
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
void op_req_unfinished(struct sim *s)
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

void req_finish(struct sim *s, struct mreq *q, int insert, int32_t prio)
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

void op_req_finish(struct sim *s)
{
    struct mreq *q = pick_req(s, 1);

    if (q)
        req_finish(s, q, chance(s, 75), (int32_t)below(s, 4));
}

/* ---- calls that must be refused without a change ---- */

void op_misuse(struct sim *s)
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
