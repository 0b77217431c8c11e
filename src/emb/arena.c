/*
 * The embedding cache's arenas (arena.h). Small lists: an arena holds at most a few thousand
 * embeddings, and every walk here is over its holes.
 */
#include "emb/arena.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int emb_arena_init(struct emb_arena *a, uint64_t bytes, uint64_t unit)
{
    memset(a, 0, sizeof(*a));
    if (unit == 0 || (unit & (unit - 1)) || bytes < unit)
        return -EINVAL;
    a->unit = unit;
    a->bytes = bytes / unit * unit;
    if (!(a->free = malloc(4 * sizeof(*a->free))))
        return -ENOMEM;
    a->cap = 4;
    a->free[0] = (struct emb_extent){0, a->bytes};
    a->nfree = 1;
    return 0;
}

void emb_arena_finish(struct emb_arena *a)
{
    free(a->free);
    memset(a, 0, sizeof(*a));
}

uint64_t emb_arena_round(const struct emb_arena *a, uint64_t len)
{
    return (len + a->unit - 1) / a->unit * a->unit;
}

static int keep_room(struct emb_arena *a)
{
    if (a->cap >= a->nalloc + 2)
        return 0;
    size_t ncap = a->cap * 2;
    struct emb_extent *v = realloc(a->free, ncap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    a->free = v;
    a->cap = ncap;
    return 0;
}

int emb_arena_alloc(struct emb_arena *a, uint64_t len, uint64_t *off)
{
    uint64_t want = emb_arena_round(a, len ? len : 1);
    int rc = keep_room(a);

    if (rc)
        return rc;
    for (size_t i = 0; i < a->nfree; i++) {
        struct emb_extent *h = &a->free[i];
        if (h->len < want)
            continue;
        *off = h->off;
        h->off += want;
        h->len -= want;
        if (h->len == 0) {
            memmove(h, h + 1, (a->nfree - i - 1) * sizeof(*h));
            a->nfree--;
        }
        a->used += want;
        a->nalloc++;
        return 0;
    }
    return -ENOSPC;
}

/* Put the hole [off, off + len) back, merging with its neighbours. Room for one more hole is
 * always there (keep_room). */
static void put_hole(struct emb_arena *a, uint64_t off, uint64_t len)
{
    size_t i = 0;

    while (i < a->nfree && a->free[i].off < off)
        i++;
    bool left = i > 0 && a->free[i - 1].off + a->free[i - 1].len == off;
    bool right = i < a->nfree && off + len == a->free[i].off;
    if (left && right) {
        a->free[i - 1].len += len + a->free[i].len;
        memmove(&a->free[i], &a->free[i + 1], (a->nfree - i - 1) * sizeof(*a->free));
        a->nfree--;
    } else if (left) {
        a->free[i - 1].len += len;
    } else if (right) {
        a->free[i].off = off;
        a->free[i].len += len;
    } else {
        memmove(&a->free[i + 1], &a->free[i], (a->nfree - i) * sizeof(*a->free));
        a->free[i] = (struct emb_extent){off, len};
        a->nfree++;
    }
}

void emb_arena_free(struct emb_arena *a, uint64_t off, uint64_t len)
{
    uint64_t l = emb_arena_round(a, len ? len : 1);

    put_hole(a, off, l);
    a->used -= l;
    a->nalloc--;
}

void emb_arena_trim(struct emb_arena *a, uint64_t off, uint64_t len, uint64_t keep)
{
    uint64_t l = emb_arena_round(a, len ? len : 1), k = emb_arena_round(a, keep ? keep : 1);

    if (k >= l)
        return;
    put_hole(a, off + k, l - k);
    a->used -= l - k;
}

static int by_off(const void *x, const void *y)
{
    const struct emb_extent *a = x, *b = y;

    return a->off < b->off ? -1 : a->off > b->off;
}

int emb_arena_would_fit(const struct emb_arena *a, const struct emb_extent *more, size_t n,
                        uint64_t len, bool *fits)
{
    uint64_t want = emb_arena_round(a, len ? len : 1);
    size_t m = a->nfree + n;
    struct emb_extent *v = malloc((m ? m : 1) * sizeof(*v));

    if (!v)
        return -ENOMEM;
    memcpy(v, a->free, a->nfree * sizeof(*v));
    for (size_t i = 0; i < n; i++)
        v[a->nfree + i] = (struct emb_extent){more[i].off, emb_arena_round(a, more[i].len)};
    qsort(v, m, sizeof(*v), by_off);
    *fits = false;
    for (size_t i = 0; i < m && !*fits;) {
        uint64_t start = v[i].off, end = v[i].off + v[i].len;
        while (++i < m && v[i].off == end)
            end += v[i].len;
        *fits = end - start >= want;
    }
    free(v);
    return 0;
}
