/*
 * Node ids and the tree's memory accounting. Nodes live behind an id table (index +
 * generation), so the refs handed out through the API can be checked instead of trusted.
 */
#include "radix_int.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>

/* ---- memory accounting ---- */

void *tree_alloc(struct rdx_tree *t, size_t n)
{
    void *p = malloc(n);

    if (p)
        t->sz.bytes += malloc_usable_size(p) + sizeof(size_t);
    return p;
}

void tree_free(struct rdx_tree *t, void *p)
{
    if (!p)
        return;
    t->sz.bytes -= malloc_usable_size(p) + sizeof(size_t);
    free(p);
}

void *tree_realloc(struct rdx_tree *t, void *p, size_t n)
{
    size_t before = p ? malloc_usable_size(p) + sizeof(size_t) : 0;
    void *q = realloc(p, n);

    if (!q)
        return NULL;
    t->sz.bytes += malloc_usable_size(q) + sizeof(size_t) - before;
    return q;
}

/* ---- node ids ---- */

kvt_node_ref make_ref(const struct rdx_tree *t, uint32_t idx)
{
    return ((uint64_t)t->gens[idx] << 32) | idx;
}

/* An id's generation moves on when its node goes and when its node loses its device copy.
 * The tree's own refs (ops in flight, deferred leaves) name a node through both: any
 * generation since the node took the id resolves. */
int resolve(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *idx)
{
    uint32_t i = (uint32_t)ref, gen = (uint32_t)(ref >> 32);

    if (i >= t->cap || !t->nodes[i] || gen == 0 ||
        gen - t->nodes[i]->born > t->gens[i] - t->nodes[i]->born)
        return -EINVAL;
    *idx = i;
    return 0;
}

/* A caller's ref is the node's current generation, and names a node on the device: once the
 * device copy went, the slots of the match that gave the ref may belong to someone else,
 * even after a load-back gives the node a device copy again. */
int resolve_current(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *idx)
{
    int rc = resolve(t, ref, idx);

    if (rc == 0 &&
        (t->gens[*idx] != (uint32_t)(ref >> 32) || (*idx != ROOT && !node_at(t, *idx)->on_device)))
        rc = -EINVAL;
    return rc;
}

void next_gen(struct rdx_tree *t, uint32_t idx)
{
    if (++t->gens[idx] == 0)
        t->gens[idx] = 1;
}

static int grow_ids(struct rdx_tree *t)
{
    uint32_t ncap = t->cap ? t->cap * 2 : 1024;
    struct rdx_node **nodes;
    uint32_t *gens, *free_ids;

    nodes = tree_realloc(t, t->nodes, ncap * sizeof(*nodes));
    if (!nodes)
        return -ENOMEM;
    t->nodes = nodes;
    gens = tree_realloc(t, t->gens, ncap * sizeof(*gens));
    if (!gens)
        return -ENOMEM;
    t->gens = gens;
    free_ids = tree_realloc(t, t->free_ids, ncap * sizeof(*free_ids));
    if (!free_ids)
        return -ENOMEM;
    t->free_ids = free_ids;
    uint32_t *heap = tree_realloc(t, t->heap, ncap * sizeof(*heap));
    if (!heap)
        return -ENOMEM;
    t->heap = heap;
    if (t->cfg.mamba) {
        struct mamba_state *m = tree_realloc(t, t->mamba, ncap * sizeof(*m));
        if (!m)
            return -ENOMEM;
        t->mamba = m;
    }
    if (t->cfg.swa_window) {
        struct swa_part *w = tree_realloc(t, t->swa, ncap * sizeof(*w));
        if (!w)
            return -ENOMEM;
        t->swa = w;
    }
    for (uint32_t i = t->cap; i < ncap; i++) {
        t->nodes[i] = NULL;
        t->gens[i] = 1;
    }
    /* Hand out low indices first so small trees dump in a stable order. */
    for (uint32_t i = ncap; i > t->cap; i--)
        t->free_ids[t->nfree++] = i - 1;
    t->cap = ncap;
    return 0;
}

int reserve_ids(struct rdx_tree *t, uint32_t n)
{
    while (t->nfree < n) {
        int rc = grow_ids(t);
        if (rc)
            return rc;
    }
    return 0;
}

uint32_t take_id(struct rdx_tree *t, struct rdx_node *n)
{
    uint32_t idx = t->free_ids[--t->nfree];

    t->nodes[idx] = n;
    if (t->mamba)
        t->mamba[idx] =
            (struct mamba_state){.prev = NONE, .next = NONE, .hprev = NONE, .hnext = NONE};
    if (t->swa)
        t->swa[idx] = (struct swa_part){.prev = NONE, .next = NONE};
    n->born = t->gens[idx];
    t->used_ids++;
    return idx;
}

void drop_id(struct rdx_tree *t, uint32_t idx)
{
    t->nodes[idx] = NULL;
    next_gen(t, idx);
    t->free_ids[t->nfree++] = idx;
    t->used_ids--;
}
