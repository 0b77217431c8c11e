/*
 * A min-heap of node ids over the tree's heap array (as long as the id table, so eviction
 * never allocates), in the order a caller's before() gives: the policy order of KV eviction,
 * and the least recently used or covered order of Mamba states and SWA parts.
 */
#include "radix_int.h"

static void swap_ids(uint32_t *v, size_t i, size_t j)
{
    uint32_t tmp = v[i];

    v[i] = v[j];
    v[j] = tmp;
}

void heap_sift_down(const struct rdx_tree *t, struct heap *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->before(t, h->v[l], h->v[m]))
            m = l;
        if (r < h->n && h->before(t, h->v[r], h->v[m]))
            m = r;
        if (m == i)
            return;
        swap_ids(h->v, i, m);
        i = m;
    }
}

void heap_build(const struct rdx_tree *t, struct heap *h)
{
    for (size_t i = h->n / 2; i-- > 0;)
        heap_sift_down(t, h, i);
}

void heap_push(const struct rdx_tree *t, struct heap *h, uint32_t x)
{
    size_t i = h->n++;

    h->v[i] = x;
    while (i > 0 && h->before(t, h->v[i], h->v[(i - 1) / 2])) {
        swap_ids(h->v, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

uint32_t heap_pop(const struct rdx_tree *t, struct heap *h)
{
    uint32_t top = h->v[0];

    h->v[0] = h->v[--h->n];
    heap_sift_down(t, h, 0);
    return top;
}
