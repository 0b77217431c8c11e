/*
 * The embedding cache's entries (emb_int.h): slots by index, a chained table by digest,
 * handles, holds and the two LRU lists.
 */
#include "emb/emb_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t bucket_of(const struct emb_cache *c, const uint8_t *digest)
{
    uint32_t h;

    memcpy(&h, digest, sizeof(h)); /* a SHA256: any four bytes are uniform */
    return h & (c->nbuckets - 1);
}

int emb_table_init(struct emb_cache *c)
{
    c->nbuckets = 64;
    c->free_head = EMB_NONE;
    c->dlru = c->hlru = (struct emb_lru){EMB_NONE, EMB_NONE, 0};
    if (!(c->buckets = malloc(c->nbuckets * sizeof(*c->buckets))))
        return -ENOMEM;
    memset(c->buckets, 0xff, c->nbuckets * sizeof(*c->buckets));
    return 0;
}

void emb_table_finish(struct emb_cache *c)
{
    free(c->buckets);
    free(c->e);
    c->buckets = NULL;
    c->e = NULL;
}

uint32_t emb_table_find(const struct emb_cache *c, const uint8_t *digest)
{
    for (uint32_t i = c->buckets[bucket_of(c, digest)]; i != EMB_NONE; i = c->e[i].next)
        if (!memcmp(c->e[i].digest, digest, 32))
            return i;
    return EMB_NONE;
}

/* Twice the buckets once there are more live entries than buckets; a failure only leaves
 * chains longer. */
static void grow_buckets(struct emb_cache *c)
{
    uint32_t nb = c->nbuckets * 2, *b;

    if (c->live < c->nbuckets || !(b = malloc(nb * sizeof(*b))))
        return;
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = nb;
    memset(b, 0xff, nb * sizeof(*b));
    for (uint32_t i = 0; i < c->n; i++)
        if (c->e[i].state == EMB_LIVE || c->e[i].state == EMB_FILLING) {
            uint32_t k = bucket_of(c, c->e[i].digest);
            c->e[i].next = b[k];
            b[k] = i;
        }
}

static uint32_t slot_take(struct emb_cache *c)
{
    uint32_t i;

    if (c->free_head != EMB_NONE) {
        i = c->free_head;
        c->free_head = c->e[i].next;
        return i;
    }
    if (c->n == c->cap) {
        uint32_t ncap = c->cap ? c->cap * 2 : 64;
        struct emb_entry *v = ncap > c->cap ? realloc(c->e, ncap * sizeof(*v)) : NULL;
        if (!v)
            return EMB_NONE;
        c->e = v;
        c->cap = ncap;
    }
    c->e[c->n].gen = 0;
    return c->n++;
}

uint32_t emb_table_add(struct emb_cache *c, const uint8_t *digest, const uint8_t *item,
                       const uint8_t *nsd)
{
    uint32_t i = slot_take(c), gen;

    if (i == EMB_NONE)
        return EMB_NONE;
    gen = c->e[i].gen + 1;
    struct emb_entry *x = &c->e[i];
    memset(x, 0, sizeof(*x));
    x->gen = gen ? gen : 1;
    x->state = EMB_LIVE;
    x->dprev = x->dnext = x->hprev = x->hnext = EMB_NONE;
    memcpy(x->digest, digest, 32);
    memcpy(x->item, item, 32);
    memcpy(x->nsd, nsd, 32);
    uint32_t k = bucket_of(c, digest);
    x->next = c->buckets[k];
    c->buckets[k] = i;
    c->live++;
    grow_buckets(c);
    return i;
}

static void slot_free(struct emb_cache *c, uint32_t i)
{
    c->e[i].state = EMB_FREE;
    c->e[i].next = c->free_head;
    c->free_head = i;
}

void emb_table_detach(struct emb_cache *c, uint32_t i, int rc)
{
    struct emb_entry *x = &c->e[i];
    uint32_t *link = &c->buckets[bucket_of(c, x->digest)];

    while (*link != i)
        link = &c->e[*link].next;
    *link = x->next;
    c->live--;
    if (x->holds) {
        x->state = EMB_FAILED;
        x->fail_rc = rc;
    } else {
        slot_free(c, i);
    }
}

uint64_t emb_table_handle(const struct emb_cache *c, uint32_t i)
{
    return (uint64_t)c->e[i].gen << 32 | (i + 1);
}

uint32_t emb_table_held(const struct emb_cache *c, uint64_t handle)
{
    uint32_t i = (uint32_t)handle - 1, gen = (uint32_t)(handle >> 32);

    if ((uint32_t)handle == 0 || i >= c->n || c->e[i].gen != gen || c->e[i].state == EMB_FREE ||
        c->e[i].holds == 0)
        return EMB_NONE;
    return i;
}

void emb_table_hold(struct emb_cache *c, uint32_t i)
{
    if (c->e[i].holds++ == 0)
        c->held++;
}

void emb_table_unhold(struct emb_cache *c, uint32_t i)
{
    if (--c->e[i].holds > 0)
        return;
    c->held--;
    if (c->e[i].state == EMB_FAILED)
        slot_free(c, i);
}

/* ---- LRU lists ---- */

static struct emb_lru *lru_of(struct emb_cache *c, int which)
{
    return which ? &c->hlru : &c->dlru;
}

static uint32_t *prev_of(struct emb_cache *c, int which, uint32_t i)
{
    return which ? &c->e[i].hprev : &c->e[i].dprev;
}

static uint32_t *next_of(struct emb_cache *c, int which, uint32_t i)
{
    return which ? &c->e[i].hnext : &c->e[i].dnext;
}

static bool in_lru(struct emb_cache *c, int which, uint32_t i)
{
    return which ? c->e[i].on_host : c->e[i].on_dev;
}

void emb_lru_remove(struct emb_cache *c, int which, uint32_t i)
{
    struct emb_lru *l = lru_of(c, which);
    uint32_t p = *prev_of(c, which, i), n = *next_of(c, which, i);

    if (p != EMB_NONE)
        *next_of(c, which, p) = n;
    else
        l->oldest = n;
    if (n != EMB_NONE)
        *prev_of(c, which, n) = p;
    else
        l->newest = p;
    *prev_of(c, which, i) = *next_of(c, which, i) = EMB_NONE;
    l->count--;
}

/* The caller sets on_dev or on_host after the first touch: an entry is in a list exactly
 * while it has that copy. */
void emb_lru_touch(struct emb_cache *c, int which, uint32_t i)
{
    struct emb_lru *l = lru_of(c, which);

    if (in_lru(c, which, i))
        emb_lru_remove(c, which, i);
    *prev_of(c, which, i) = l->newest;
    *next_of(c, which, i) = EMB_NONE;
    if (l->newest != EMB_NONE)
        *next_of(c, which, l->newest) = i;
    else
        l->oldest = i;
    l->newest = i;
    l->count++;
}
