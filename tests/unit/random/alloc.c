#include "random_test.h"

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
int alloc_pages(struct sim *s, size_t pages, int32_t *slots, int may_evict)
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

void free_slots(struct sim *s, const int32_t *slots, size_t n)
{
    EXPECT_RC(s, kvt_free(s->e, slots, n), 0);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = page_of(s, slots[i]);
        if (s->pg[p].state == M_HELD)
            model_release(s, p);
    }
}

/* Slots that are the test's now: keep them for a later free, or free them at once. */
void adopt(struct sim *s, const int32_t *slots, size_t n)
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
void held_compact(struct sim *s)
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

void op_alloc(struct sim *s)
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
int32_t bad_slot(struct sim *s)
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

void op_free(struct sim *s)
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

void op_group(struct sim *s)
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
