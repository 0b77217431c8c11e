/*
 * Sliding-window tombstones (cfg.swa_window): SGLang's SWA radix semantics over the tree.
 * A node's device pages hold SWA KV beside their full KV until the SWA part is freed alone
 * (an SWA tombstone). A match is good only where the window before its end holds SWA KV
 * throughout; SWA locks protect the nodes covering a running request's window; the unlocked
 * nodes holding SWA KV form an eviction list of their own, ordered by when a window last
 * covered them rather than by when any match passed through.
 *
 * Below this file: radix.c gives a node SWA KV with each device copy it gets, keeps both
 * halves of a split alike and frees the SWA part with the device copy (gain_swa, split_swa,
 * drop_swa in radix_leaves.c), so nothing there calls up here.
 */
#include "radix_int.h"

#include <errno.h>
#include <string.h>

static bool swa_on(const struct rdx_tree *t)
{
    return t && t->swa;
}

static uint64_t node_tokens(const struct rdx_tree *t, uint32_t idx)
{
    return (uint64_t)node_at(t, idx)->npages * t->cfg.page_size;
}

/* Whether node idx's SWA KV is there for a match: on its device copy, or with tiers (a
 * match that may load host copies back) on a host copy holding the SWA layers, for a node
 * with no device copy. A device copy that is an SWA tombstone counts as one: a load-back
 * brings whole nodes that lack a device copy, never the SWA part of one that has it. */
static bool swa_there(const struct rdx_tree *t, uint32_t idx, bool tiers)
{
    const struct rdx_node *n = node_at(t, idx);

    if (tiers && !n->on_device)
        return n->on_host && t->swa[idx].hlive;
    return t->swa[idx].live;
}

/* Whether the window ending at node idx (whose SWA KV is there) holds SWA KV throughout: the
 * run above it spans the window or reaches the root. *stop gets the node that ended the run. */
static bool window_whole(const struct rdx_tree *t, uint32_t idx, bool tiers, uint32_t *stop)
{
    uint64_t run = 0;
    uint32_t i = idx;

    while (i != ROOT && swa_there(t, i, tiers) && run < t->cfg.swa_window) {
        run += node_tokens(t, i);
        i = node_at(t, i)->parent;
    }
    *stop = i;
    return run >= t->cfg.swa_window || i == ROOT;
}

/* The deepest node from idx up whose window is whole; ROOT (the empty prefix) when none is.
 * A run too short fails for every node in it, so the search goes on above its tombstone:
 * each node is looked at once. */
static uint32_t usable_end(const struct rdx_tree *t, uint32_t idx, bool tiers)
{
    uint32_t stop;

    while (idx != ROOT) {
        if (!swa_there(t, idx, tiers))
            idx = node_at(t, idx)->parent;
        else if (window_whole(t, idx, tiers, &stop))
            return idx;
        else
            idx = stop;
    }
    return ROOT;
}

/* The nodes a window (and a page, as a request continues into its next page) ending at idx
 * covers are the ones its next request reads: they become the most recent. */
static void touch_window(struct rdx_tree *t, uint32_t idx)
{
    uint64_t covered = 0, reach = (uint64_t)t->cfg.swa_window + t->cfg.page_size;

    for (uint32_t i = idx; i != ROOT && covered < reach; i = node_at(t, i)->parent) {
        t->swa[i].access = t->clock;
        covered += node_tokens(t, i);
    }
}

static size_t depth_pages(const struct rdx_tree *t, uint32_t idx)
{
    size_t pages = 0;

    for (uint32_t i = idx; i != ROOT; i = node_at(t, i)->parent)
        pages += node_at(t, i)->npages;
    return pages;
}

/* The usable prefix of a match ending at node last (device and host parts in hit). */
static void usable(struct rdx_tree *t, uint32_t last, const struct rdx_hit *h, bool tiers,
                   struct rdx_swa_hit *hit)
{
    uint32_t end = usable_end(t, last, tiers);

    hit->kv_pages = h->dev_pages;
    hit->kv_last = h->dev_last;
    hit->pending = h->pending;
    hit->swa_last = make_ref(t, end);
    hit->swa_pages = depth_pages(t, end);
    if (h->dev_pages + h->host_pages > hit->swa_pages)
        hit->branch_tokens = (uint64_t)(h->dev_pages + h->host_pages) * t->cfg.page_size;
    touch_window(t, end);
}

int rdx_match_swa(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages,
                  struct rdx_swa_hit *hit)
{
    struct rdx_hit h;
    uint32_t last;
    int rc;

    if (!swa_on(t) || !hit)
        return -EINVAL;
    *hit = (struct rdx_swa_hit){0};
    if ((rc = rdx_match_tiers(t, key, pages, NULL, &h)) || (rc = resolve(t, h.dev_last, &last)))
        return rc;
    h.host_pages = 0;
    usable(t, last, &h, false, hit);
    return 0;
}

int rdx_match_swa_tiers(struct rdx_tree *t, const struct kvt_key *key, uint32_t *dev_pages,
                        uint32_t *host_pages, struct rdx_hit *tiers, struct rdx_swa_hit *hit)
{
    uint32_t last;
    int rc;

    if (!swa_on(t) || !hit || !tiers)
        return -EINVAL;
    *hit = (struct rdx_swa_hit){0};
    if ((rc = rdx_match_tiers(t, key, dev_pages, host_pages, tiers)) ||
        (rc = resolve(t, tiers->host_last, &last)))
        return rc;
    usable(t, last, tiers, true, hit);
    return 0;
}

/* Whether the n pages ending at idx's end are whole host-only nodes. */
static bool host_only_span(const struct rdx_tree *t, uint32_t idx, size_t n)
{
    for (size_t left = n; left; idx = node_at(t, idx)->parent) {
        const struct rdx_node *nd = node_at(t, idx);
        if (idx == ROOT || nd->on_device || !nd->on_host || nd->npages > left)
            return false;
        left -= nd->npages;
    }
    return true;
}

int rdx_swa_load_mask(const struct rdx_tree *t, kvt_node_ref ref, size_t n, uint8_t *live)
{
    uint32_t idx;
    int rc;

    if (!swa_on(t) || (n && !live))
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    if (!host_only_span(t, idx, n))
        return -EINVAL;
    for (size_t left = n; left; idx = node_at(t, idx)->parent) {
        left -= node_at(t, idx)->npages;
        memset(live + left, t->swa[idx].hlive, node_at(t, idx)->npages);
    }
    return 0;
}

/* ---- inserts from requests that freed part of their SWA KV ---- */

/* Node idx holds pages [start, start + npages) of the key and straddles page from: its pages
 * before from come without SWA KV. Split it there (the upper half a tombstone); failing
 * that, the whole node goes tombstone, handing back the SWA part the caller still had. */
static void clip_straddling(struct rdx_tree *t, uint32_t idx, size_t start, size_t from)
{
    struct rdx_node *n = node_at(t, idx);
    uint32_t m = (uint32_t)(from - start), upper;

    if (split(t, idx, m, &upper) == 0) {
        forget_swa(t, upper);
        return;
    }
    if (t->cfg.free_swa_pages)
        t->cfg.free_swa_pages(t->cfg.ctx, n->pages + m, n->npages - m);
    forget_swa(t, idx);
}

/* The nodes ending at idx (whose pages end at page end) that this insert gave device pages,
 * those below prefix: the ones before page from hold no SWA KV. */
static void clip_inserted(struct rdx_tree *t, uint32_t idx, size_t end, size_t prefix, size_t from)
{
    while (idx != ROOT && end > prefix) {
        size_t start = end - node_at(t, idx)->npages;
        uint32_t parent = node_at(t, idx)->parent;
        if (end <= from)
            forget_swa(t, idx);
        else if (start < from)
            clip_straddling(t, idx, start, from);
        idx = parent; /* taken before any split: above the upper half it made */
        end = start;
    }
}

/* SGLang's RecoverEvictedSWA: the nodes ending at or above idx (ending at page end) within
 * the part the tree had (below page prefix) and wholly at or past page from, that are SWA
 * tombstones, take the SWA KV of the request's own pages for the same tokens, which the
 * caller moves onto theirs (it refuses pages that are not the request's: where the request
 * reads the cache's own pages there is nothing to give). */
static void revive_inserted(struct rdx_tree *t, uint32_t idx, size_t end, const uint32_t *pages,
                            size_t prefix, size_t from)
{
    for (; idx != ROOT && end > from; idx = node_at(t, idx)->parent) {
        struct rdx_node *n = node_at(t, idx);
        size_t start = end - n->npages;
        if (end <= prefix && start >= from && !t->swa[idx].live && n->pages &&
            t->cfg.revive_swa(t->cfg.ctx, n->pages, pages + start, n->npages) == 0)
            gain_swa(t, idx);
        end = start;
    }
}

int rdx_insert_swa(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
                   int32_t priority, uint64_t swa_from, size_t *prefix_pages, kvt_node_ref *last)
{
    uint32_t idx;
    int rc;

    if (!swa_on(t) || !key || !prefix_pages || !last || swa_from % t->cfg.page_size ||
        swa_from > key->len)
        return -EINVAL;
    if ((rc = rdx_insert_ref(t, key, pages, priority, prefix_pages, last)) ||
        (rc = resolve(t, *last, &idx)))
        return rc;
    size_t np = key->len / t->cfg.page_size, from = swa_from / t->cfg.page_size;
    clip_inserted(t, idx, np, *prefix_pages, from);
    if (t->cfg.revive_swa && *prefix_pages > from)
        revive_inserted(t, idx, np, pages, *prefix_pages, from);
    return 0;
}

/* ---- SWA locks ---- */

/* Add d to the SWA locks of the nodes covering span tokens ending at idx's end. */
static void lock_window(struct rdx_tree *t, uint32_t idx, uint64_t span, int d)
{
    uint64_t covered = 0;

    for (uint32_t i = idx; i != ROOT && covered < span; i = node_at(t, i)->parent) {
        t->swa[i].locks += (uint32_t)d;
        update_swa(t, i);
        covered += node_tokens(t, i);
    }
}

/* Whether span tokens ending at idx's end are whole nodes that SWA locks hold. Splits since
 * the lock refined those nodes, never moved their boundaries, so the sum lands on span. */
static bool window_locked(const struct rdx_tree *t, uint32_t idx, uint64_t span)
{
    uint64_t covered = 0;
    uint32_t i = idx;

    for (; i != ROOT && covered < span; i = node_at(t, i)->parent) {
        if (t->swa[i].locks == 0)
            return false;
        covered += node_tokens(t, i);
    }
    return covered == span && (covered >= t->cfg.swa_window || i == ROOT);
}

int rdx_swa_lock(struct rdx_tree *t, kvt_node_ref ref, uint64_t *span)
{
    uint64_t covered = 0;
    uint32_t idx;
    int rc;

    if (!swa_on(t) || !span)
        return -EINVAL;
    if ((rc = resolve_current(t, ref, &idx)) || (rc = rdx_lock(t, ref)))
        return rc;
    for (uint32_t i = idx; i != ROOT && covered < t->cfg.swa_window; i = node_at(t, i)->parent)
        covered += node_tokens(t, i);
    if (idx != ROOT)
        t->swa[idx].own++;
    lock_window(t, idx, covered, 1);
    *span = covered;
    return 0;
}

int rdx_swa_unlock(struct rdx_tree *t, kvt_node_ref ref, uint64_t span)
{
    uint32_t idx;
    int rc;

    if (!swa_on(t))
        return -EINVAL;
    if ((rc = resolve_current(t, ref, &idx)))
        return rc;
    if (idx == ROOT)
        return span == 0 ? 0 : -EINVAL;
    if (t->swa[idx].own == 0 || !window_locked(t, idx, span))
        return -EINVAL;
    t->swa[idx].own--; /* first, or rdx_unlock would refuse the lock it holds */
    if ((rc = rdx_unlock(t, ref))) {
        t->swa[idx].own++;
        return rc;
    }
    lock_window(t, idx, span, -1);
    return 0;
}

int rdx_swa_state(const struct rdx_tree *t, kvt_node_ref ref, int *live, uint32_t *locks)
{
    uint32_t idx;
    int rc;

    if (!swa_on(t) || !live || !locks)
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    *live = t->swa[idx].live;
    *locks = t->swa[idx].locks;
    return 0;
}

int rdx_swa_host_state(const struct rdx_tree *t, kvt_node_ref ref, int *hlive)
{
    uint32_t idx;
    int rc;

    if (!swa_on(t) || !hlive)
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    *hlive = t->swa[idx].hlive;
    return 0;
}

/* ---- SWA eviction: least recently covered by a window first ---- */

static bool covered_before(const struct rdx_tree *t, uint32_t x, uint32_t y)
{
    uint64_t ax = t->swa[x].access, ay = t->swa[y].access;

    return ax != ay ? ax < ay : x < y;
}

/* Free the SWA part of unlocked nodes, least recently covered first, until pages went. With
 * defer, nodes with no host copy are named there instead (at most cap), counting toward
 * pages but not in the result. */
static size_t swa_evict(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                        size_t *ndefer)
{
    struct heap h = {.before = covered_before};
    size_t done = 0, seen = 0;

    if (!swa_on(t) || pages == 0)
        return 0;
    h.v = t->heap; /* as long as the id table, and idle between calls */
    /* Not the SWA part of a node a transfer is filling or reading: its bytes are moving. */
    for (uint32_t i = t->swa_head; i != NONE; i = t->swa[i].next)
        if (node_at(t, i)->pending == 0)
            h.v[h.n++] = i;
    heap_build(t, &h);
    while (seen < pages && h.n) {
        uint32_t x = heap_pop(t, &h);
        seen += node_at(t, x)->npages;
        if (defer && !node_at(t, x)->on_host) {
            if (*ndefer < cap)
                defer[(*ndefer)++] = make_ref(t, x);
            continue;
        }
        done += node_at(t, x)->npages;
        drop_swa(t, x);
    }
    return done;
}

size_t rdx_swa_evict(struct rdx_tree *t, size_t pages)
{
    return swa_evict(t, pages, NULL, 0, NULL);
}

size_t rdx_swa_evict_backed_up(struct rdx_tree *t, size_t pages, kvt_node_ref *defer, size_t cap,
                               size_t *ndefer)
{
    *ndefer = 0;
    return swa_evict(t, pages, defer, cap, ndefer);
}
