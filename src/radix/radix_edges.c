/*
 * The tree's edges: one open-addressing table for the whole tree, keyed by (parent,
 * namespace, first page of the child). A node needs no child container, and a lookup is one
 * probe sequence plus one page compare.
 */
#include "radix_int.h"

#include <errno.h>
#include <string.h>

uint32_t edge_hash(uint32_t parent, uint32_t ns, const uint32_t *page, uint32_t ps)
{
    uint64_t h = ((uint64_t)parent << 32 | ns) * 0x9E3779B97F4A7C15ull;

    for (uint32_t i = 0; i < ps; i++) {
        h ^= page[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return (uint32_t)(h ^ (h >> 29));
}

static bool edge_is(const struct rdx_tree *t, const struct rdx_node *c, uint32_t parent,
                    uint32_t ns, const uint32_t *page)
{
    return c->parent == parent && c->ns == ns &&
           memcmp(c->tokens, page, (size_t)t->cfg.page_size * sizeof(uint32_t)) == 0;
}

uint32_t edge_find(const struct rdx_tree *t, uint32_t parent, uint32_t ns, const uint32_t *page)
{
    uint32_t h = edge_hash(parent, ns, page, t->cfg.page_size);

    for (uint32_t i = h & t->edge_mask;; i = (i + 1) & t->edge_mask) {
        uint32_t c = t->edges[i];
        if (c == NONE)
            return NONE;
        struct rdx_node *n = node_at(t, c);
        if (n->edge_hash == h && edge_is(t, n, parent, ns, page))
            return c;
    }
}

void edge_put(struct rdx_tree *t, uint32_t child)
{
    struct rdx_node *n = node_at(t, child);
    uint32_t i = n->edge_hash & t->edge_mask;

    while (t->edges[i] != NONE)
        i = (i + 1) & t->edge_mask;
    t->edges[i] = child;
    t->nedges++;
}

int edge_reserve(struct rdx_tree *t, uint32_t more)
{
    uint32_t cap = t->edge_mask + 1;

    if ((uint64_t)(t->nedges + more) * 2 <= cap)
        return 0;
    uint32_t ncap = cap;
    while ((uint64_t)(t->nedges + more) * 2 > ncap)
        ncap *= 2;
    uint32_t *old = t->edges, oldcap = cap;
    uint32_t *edges = tree_alloc(t, (size_t)ncap * sizeof(*edges));
    if (!edges)
        return -ENOMEM;
    memset(edges, 0xff, (size_t)ncap * sizeof(*edges));
    t->edges = edges;
    t->edge_mask = ncap - 1;
    t->nedges = 0;
    for (uint32_t i = 0; i < oldcap; i++)
        if (old[i] != NONE)
            edge_put(t, old[i]);
    tree_free(t, old);
    return 0;
}

uint32_t edge_slot(const struct rdx_tree *t, uint32_t child)
{
    uint32_t i = node_at(t, child)->edge_hash & t->edge_mask;

    while (t->edges[i] != child)
        i = (i + 1) & t->edge_mask;
    return i;
}

/* Backward-shift deletion keeps probe sequences unbroken without tombstones. */
void edge_del(struct rdx_tree *t, uint32_t child)
{
    uint32_t hole = edge_slot(t, child), i = hole;

    for (;;) {
        i = (i + 1) & t->edge_mask;
        uint32_t c = t->edges[i];
        if (c == NONE)
            break;
        uint32_t home = node_at(t, c)->edge_hash & t->edge_mask;
        /* c may fill the hole when its home is not in (hole, i]. */
        if (((i - home) & t->edge_mask) >= ((i - hole) & t->edge_mask)) {
            t->edges[hole] = c;
            hole = i;
        }
    }
    t->edges[hole] = NONE;
    t->nedges--;
}
