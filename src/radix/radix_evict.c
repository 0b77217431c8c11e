/*
 * Eviction: the order each policy gives (LRU, LFU, FIFO, MRU, FILO, priority), a heap over
 * one leaf list in that order (radix_heap.c), and eviction passes that drop leaves, or defer
 * those that want
 * a copy in the tier below first. Work is bounded by the pages asked for; nothing allocates.
 */
#include "radix_int.h"

/* ---- policy order ---- */

struct evict_key {
    int64_t a;
    uint64_t b;
};

static struct evict_key evict_key(const struct rdx_tree *t, const struct rdx_node *n)
{
    switch (t->cfg.policy) {
    case KVT_EVICT_LFU:
        return (struct evict_key){n->hit_count, n->last_access};
    case KVT_EVICT_FIFO:
        return (struct evict_key){(int64_t)n->created, 0};
    case KVT_EVICT_MRU:
        return (struct evict_key){-(int64_t)n->last_access, 0};
    case KVT_EVICT_FILO:
        return (struct evict_key){-(int64_t)n->created, 0};
    case KVT_EVICT_PRIORITY:
        return (struct evict_key){n->priority, n->last_access};
    default:
        return (struct evict_key){(int64_t)n->last_access, 0};
    }
}

static bool evict_before(const struct rdx_tree *t, uint32_t x, uint32_t y)
{
    struct evict_key kx = evict_key(t, node_at(t, x)), ky = evict_key(t, node_at(t, y));

    if (kx.a != ky.a)
        return kx.a < ky.a;
    if (kx.b != ky.b)
        return kx.b < ky.b;
    return x < y;
}

/* ---- eviction passes ---- */

/* Drop a device leaf's device copy: the node stays on the host, or goes. */
static void evict_device(struct rdx_tree *t, uint32_t idx)
{
    uint32_t parent = node_at(t, idx)->parent;

    if (!node_at(t, idx)->on_host) {
        delete_leaf(t, idx);
        return;
    }
    free_device_copy(t, idx);
    update_leaf(t, idx);
    update_leaf(t, parent);
}

/* What one eviction pass is asked to do. Under write_back, device leaves without a host
 * copy are not dropped but named in defer[] (up to cap), their pages counted as planned. */
struct evict_req {
    size_t pages;
    int list;
    kvt_node_ref *defer;
    size_t cap, n;
    size_t planned; /* pages of the deferred leaves */
};

/* Whether leaf x lacks the copy in the next tier down that a deferring eviction wants first:
 * a host copy before a device leaf goes, a disk copy before a host leaf goes. */
static bool needs_copy_below(const struct rdx_node *n, int list)
{
    return list == LIST_DEV ? !n->on_host : !n->on_disk;
}

/* Take leaf x: evict it, or defer it for a copy below; the pages it accounts for. */
static size_t evict_one(struct rdx_tree *t, uint32_t x, struct evict_req *r, bool *gone)
{
    const struct rdx_node *n = node_at(t, x);
    size_t np = n->npages;

    *gone = false;
    if (r->defer && needs_copy_below(n, r->list)) {
        if (r->n == r->cap)
            return 0;
        r->defer[r->n++] = make_ref(t, x);
        r->planned += np;
        return np;
    }
    if (r->list == LIST_HOST)
        delete_leaf(t, x);
    else
        evict_device(t, x);
    *gone = true;
    return np;
}

/* Evict leaves by policy until r->pages pages are gone or planned, or none is left. */
static size_t evict_list(struct rdx_tree *t, struct evict_req *r)
{
    /* A parent is pushed only after its last child was popped, so the heap never holds
     * more entries than there are nodes. */
    struct heap h = {.v = t->heap, .before = evict_before};
    size_t done = 0;

    if (r->pages == 0 || t->nleaves[r->list] == 0)
        return 0;
    for (uint32_t i = t->leaf_head[r->list]; i != NONE; i = node_at(t, i)->next[r->list])
        h.v[h.n++] = i;
    heap_build(t, &h);

    while (done < r->pages && h.n) {
        uint32_t x = heap_pop(t, &h);
        uint32_t parent = node_at(t, x)->parent;
        bool gone;
        done += evict_one(t, x, r, &gone);
        if (gone && in_list(t, parent, r->list))
            heap_push(t, &h, parent);
    }
    return done;
}

size_t rdx_evict(struct rdx_tree *t, size_t pages)
{
    struct evict_req r = {.pages = pages, .list = LIST_DEV};
    return evict_list(t, &r);
}

static size_t evict_deferring(struct rdx_tree *t, int list, size_t pages, kvt_node_ref *defer,
                              size_t cap, size_t *ndefer)
{
    struct evict_req r = {.pages = pages, .list = list, .defer = defer, .cap = cap};
    size_t done = evict_list(t, &r);

    *ndefer = r.n;
    return done - r.planned;
}

size_t rdx_evict_backed_up(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                           size_t *ndefer)
{
    return evict_deferring(t, LIST_DEV, pages, defer, cap, ndefer);
}

size_t rdx_evict_host(struct rdx_tree *t, size_t pages)
{
    struct evict_req r = {.pages = pages, .list = LIST_HOST};
    return evict_list(t, &r);
}

size_t rdx_evict_host_written(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                              size_t *ndefer)
{
    return evict_deferring(t, LIST_HOST, pages, defer, cap, ndefer);
}
