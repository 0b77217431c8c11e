/*
 * Checks and dumps, for tests and tools: rdx_check walks every node against the invariants
 * radix.h lists, rdx_dump prints the tree, rdx_node_hashes reads a node's page hashes.
 */
#include "radix_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks ---- */

struct checker {
    const struct rdx_tree *t;
    struct page_hasher hasher;
    uint32_t *kids, *dev_kids;
    uint64_t *child_locks; /* sum of the children's lock refs, per node */
    uint64_t *ns_nodes;    /* nodes per namespace id */
    struct rdx_sizes sz;
    char *why;
    size_t why_len;
};

static int fail(struct checker *c, uint32_t idx, const char *what)
{
    if (c->why_len)
        snprintf(c->why, c->why_len, "node %u: %s", idx, what);
    return -EUCLEAN;
}

static int check_hashes(struct checker *c, uint32_t idx, const struct rdx_node *n)
{
    const struct rdx_tree *t = c->t;
    const uint8_t *prev = last_hash(t, n->parent, n->ns);
    uint8_t h[KVT_HASH_LEN];

    for (uint32_t i = 0; i < n->npages; i++) {
        if (page_hash_next(&c->hasher, prev, n->tokens + (size_t)i * t->cfg.page_size,
                           t->cfg.page_size, h) ||
            memcmp(h, n->hash[i], KVT_HASH_LEN) != 0)
            return fail(c, idx, "page hash does not chain from its parent");
        prev = n->hash[i];
    }
    return 0;
}

static int check_node(struct checker *c, uint32_t idx, const struct rdx_node *n)
{
    const struct rdx_tree *t = c->t;

    if (n->parent >= t->cap || !t->nodes[n->parent])
        return fail(c, idx, "parent is not a node");
    if (n->npages == 0)
        return fail(c, idx, "empty node");
    if (n->parent != ROOT && node_at(t, n->parent)->lock_ref < n->lock_ref)
        return fail(c, idx, "parent holds fewer lock refs than its child");
    if (n->ns >= t->nns || !t->ns[n->ns].used)
        return fail(c, idx, "namespace is not live");
    if (n->parent != ROOT && node_at(t, n->parent)->ns != n->ns)
        return fail(c, idx, "namespace differs from its parent's");
    if (!n->on_device && !n->on_host)
        return fail(c, idx, "node has no copy anywhere");
    if (n->on_device && !node_at(t, n->parent)->on_device)
        return fail(c, idx, "on the device but its parent is not");
    if (n->on_host && !node_at(t, n->parent)->on_host && !t->orphans)
        return fail(c, idx, "on the host but its parent is not");
    if (!n->on_device && n->lock_ref)
        return fail(c, idx, "host-only node is locked");
    if (!n->on_device && n->pending && (!(n->pending & RDX_OP_DISK) || n->nchildren))
        return fail(c, idx, "host-only node is pending, but not as a leaf the disk fills");
    if ((n->disk_op && !n->on_host) || (n->on_disk && !t->cfg.hash_pages))
        return fail(c, idx, "disk state without a host copy or without page hashes");
    if (n->edge_hash != edge_hash(n->parent, n->ns, n->tokens, t->cfg.page_size) ||
        edge_find(t, n->parent, n->ns, n->tokens) != idx)
        return fail(c, idx, "edge from parent does not lead here");
    if (t->cfg.hash_pages && check_hashes(c, idx, n))
        return -EUCLEAN;
    c->kids[n->parent]++;
    c->dev_kids[n->parent] += n->on_device;
    c->child_locks[n->parent] += n->lock_ref;
    c->ns_nodes[n->ns]++;
    c->sz.nodes++;
    if (n->on_host)
        c->sz.host_pages += n->npages;
    if (!n->on_device)
        return 0;
    c->sz.cached_pages += n->npages;
    if (n->lock_ref)
        c->sz.protected_pages += n->npages;
    else
        c->sz.evictable_pages += n->npages;
    return 0;
}

static int check_list(struct checker *c, int list)
{
    const struct rdx_tree *t = c->t;
    uint32_t leaves = 0;

    for (uint32_t i = t->leaf_head[list]; i != NONE; i = node_at(t, i)->next[list])
        if (++leaves > t->nleaves[list])
            return fail(c, i, "leaf list is longer than its count");
    if (leaves != t->nleaves[list])
        return fail(c, ROOT, "leaf count is wrong");
    return 0;
}

static int check_shape(struct checker *c)
{
    const struct rdx_tree *t = c->t;

    for (uint32_t i = 0; i < t->cap; i++) {
        const struct rdx_node *n = t->nodes[i];
        if (!n)
            continue;
        if (c->kids[i] != n->nchildren || c->dev_kids[i] != n->ndev_children)
            return fail(c, i, "child count is wrong");
        if (i != ROOT && n->lock_ref != n->own_ref + c->child_locks[i])
            return fail(c, i, "lock refs are not its own plus its children's");
        if (in_list(t, i, LIST_DEV) != is_device_leaf(n, i) ||
            in_list(t, i, LIST_HOST) != is_host_leaf(n, i))
            return fail(c, i, "eviction list membership is wrong");
    }
    if (check_list(c, LIST_DEV) || check_list(c, LIST_HOST))
        return -EUCLEAN;
    for (uint32_t i = 0; i < t->nns; i++)
        if (t->ns[i].used && t->ns[i].nodes != c->ns_nodes[i])
            return fail(c, ROOT, "a namespace's node count differs from its nodes");
    if (t->nedges != c->sz.nodes)
        return fail(c, ROOT, "edge count differs from node count");
    if (c->sz.nodes != t->sz.nodes || c->sz.cached_pages != t->sz.cached_pages ||
        c->sz.evictable_pages != t->sz.evictable_pages ||
        c->sz.protected_pages != t->sz.protected_pages || c->sz.host_pages != t->sz.host_pages)
        return fail(c, ROOT, "evictable/protected/cached/host sizes differ from the nodes");
    return 0;
}

/* ---- Mamba states ---- */

static int cmp_slot(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

/* One node's state: only on a device copy, locks within its own KV locks (full >= mamba),
 * on the list of unlocked states exactly when it is one. Its slot goes to slots[]. */
static int check_state(struct checker *c, uint32_t idx, uint32_t *slots, size_t *nslots,
                       uint32_t *hslots, size_t *nhslots, const struct rdx_page_visitor *v)
{
    const struct rdx_tree *t = c->t;
    const struct mamba_state *m = &t->mamba[idx];
    const struct rdx_node *n = node_at(t, idx);

    if (m->slot && (idx == ROOT || !n->on_device))
        return fail(c, idx, "a Mamba state without device KV under it");
    if (m->locks && !m->slot)
        return fail(c, idx, "Mamba locks without a state");
    if (idx != ROOT && m->locks > n->own_ref)
        return fail(c, idx, "more Mamba locks than the node's own KV locks");
    if (in_state_list(t, idx) != (m->slot && !m->locks))
        return fail(c, idx, "Mamba state list membership is wrong");
    if (m->hslot && (idx == ROOT || !n->on_host))
        return fail(c, idx, "a host copy of a Mamba state without a host copy of its KV");
    if (m->slot)
        slots[(*nslots)++] = m->slot;
    if (m->slot && v && v->mamba)
        v->mamba(v->ctx, m->slot);
    if (m->hslot)
        hslots[(*nhslots)++] = m->hslot;
    if (m->hslot && v && v->mamba_host)
        v->mamba_host(v->ctx, m->hslot);
    c->sz.mamba_evictable += m->slot && !m->locks;
    return 0;
}

/* Every state, no slot on two nodes, the list of unlocked states and the state counts. */
static int check_states(struct checker *c, const struct rdx_page_visitor *v)
{
    const struct rdx_tree *t = c->t;
    uint32_t *slots = calloc(2 * (size_t)t->cap, sizeof(*slots)), *hslots = slots + t->cap;
    size_t n = 0, nh = 0, listed = 0;
    int rc = 0;

    if (!slots)
        return -ENOMEM;
    for (uint32_t i = 0; i < t->cap && rc == 0; i++)
        if (t->nodes[i])
            rc = check_state(c, i, slots, &n, hslots, &nh, v);
    qsort(slots, n, sizeof(*slots), cmp_slot);
    qsort(hslots, nh, sizeof(*hslots), cmp_slot);
    for (size_t i = 1; i < n && rc == 0; i++)
        if (slots[i] == slots[i - 1])
            rc = fail(c, ROOT, "a Mamba slot is held by two nodes");
    for (size_t i = 1; i < nh && rc == 0; i++)
        if (hslots[i] == hslots[i - 1])
            rc = fail(c, ROOT, "a host copy of a Mamba state is held by two nodes");
    for (uint32_t i = t->mamba_host_head; rc == 0 && i != NONE; i = t->mamba[i].hnext)
        if (++listed > t->sz.mamba_host_states || !t->mamba[i].hslot)
            rc = fail(c, i, "the list of host copies of states is wrong");
    if (rc == 0 && (listed != nh || nh != t->sz.mamba_host_states || nh > t->cfg.mamba_host_states))
        rc = fail(c, ROOT, "host copies of states differ from their count or limit");
    listed = 0;
    for (uint32_t i = t->mamba_head; rc == 0 && i != NONE; i = t->mamba[i].next)
        if (++listed > t->sz.mamba_evictable)
            rc = fail(c, i, "Mamba state list is longer than its count");
    if (rc == 0 && (listed != t->sz.mamba_evictable || n != t->sz.mamba_states ||
                    c->sz.mamba_evictable != t->sz.mamba_evictable))
        rc = fail(c, ROOT, "Mamba state counts differ from the nodes");
    free(slots);
    return rc;
}

/* ---- the SWA part of nodes ---- */

/* One node's SWA part: only on a device copy, SWA locks within its KV locks (a window's lock
 * holds a KV lock at the window's end, below or at every node it covers), locks taken here
 * within its own, on the list exactly when it holds SWA KV that no lock holds. */
static int check_swa_part(struct checker *c, uint32_t idx)
{
    const struct rdx_tree *t = c->t;
    const struct swa_part *w = &t->swa[idx];
    const struct rdx_node *n = node_at(t, idx);

    if (w->live && (idx == ROOT || !n->on_device))
        return fail(c, idx, "SWA KV without device KV under it");
    if (w->hlive && (idx == ROOT || !n->on_host))
        return fail(c, idx, "host SWA layers without a host copy");
    if (idx != ROOT && (w->locks > n->lock_ref || w->own > n->own_ref || w->own > w->locks))
        return fail(c, idx, "SWA locks out of order with the KV locks");
    if (idx == ROOT && (w->locks || w->own))
        return fail(c, idx, "SWA locks on the root");
    if (in_swa_list(t, idx) != (w->live && w->locks == 0))
        return fail(c, idx, "SWA list membership is wrong");
    if (w->live)
        c->sz.swa_pages += n->npages;
    if (w->live && w->locks == 0)
        c->sz.swa_evictable += n->npages;
    return 0;
}

/* Every node's SWA part, the list of unlocked nodes with SWA KV and the SWA sizes. */
static int check_swa(struct checker *c)
{
    const struct rdx_tree *t = c->t;
    uint32_t listed = 0;
    int rc = 0;

    for (uint32_t i = 0; i < t->cap && rc == 0; i++)
        if (t->nodes[i])
            rc = check_swa_part(c, i);
    for (uint32_t i = t->swa_head; rc == 0 && i != NONE; i = t->swa[i].next)
        if (++listed > t->swa_listed)
            rc = fail(c, i, "SWA list is longer than its count");
    if (rc == 0 && (listed != t->swa_listed || c->sz.swa_pages != t->sz.swa_pages ||
                    c->sz.swa_evictable != t->sz.swa_evictable))
        rc = fail(c, ROOT, "SWA counts differ from the nodes");
    return rc;
}

static void visit_pages(const struct rdx_node *n, const struct rdx_page_visitor *v)
{
    for (uint32_t p = 0; v && v->device && n->on_device && p < n->npages; p++)
        v->device(v->ctx, n->pages[p]);
    for (uint32_t p = 0; v && v->host && n->on_host && p < n->npages; p++)
        v->host(v->ctx, n->host[p]);
}

int rdx_check(const struct rdx_tree *t, const struct rdx_page_visitor *v, char *why, size_t why_len)
{
    struct checker c = {.t = t, .why = why, .why_len = why_len};
    int rc = -ENOMEM;

    if (why_len)
        why[0] = '\0';
    c.kids = calloc(t->cap, sizeof(*c.kids));
    c.dev_kids = calloc(t->cap, sizeof(*c.dev_kids));
    c.child_locks = calloc(t->cap, sizeof(*c.child_locks));
    c.ns_nodes = calloc(t->nns, sizeof(*c.ns_nodes));
    if (!c.kids || !c.dev_kids || !c.child_locks || !c.ns_nodes ||
        (t->cfg.hash_pages && page_hasher_init(&c.hasher)))
        goto out;
    rc = 0;
    for (uint32_t i = 1; i < t->cap && rc == 0; i++) {
        const struct rdx_node *n = t->nodes[i];
        if (n && (rc = check_node(&c, i, n)) == 0)
            visit_pages(n, v);
    }
    if (rc == 0)
        rc = check_shape(&c);
    if (rc == 0 && t->mamba)
        rc = check_states(&c, v);
    if (rc == 0 && t->swa)
        rc = check_swa(&c);
    if (t->cfg.hash_pages)
        page_hasher_finish(&c.hasher);
out:
    free(c.kids);
    free(c.dev_kids);
    free(c.child_locks);
    free(c.ns_nodes);
    return rc;
}

/* ---- dumps and node hashes ---- */

struct dumper {
    char *buf;
    size_t cap, len;
};

static void emit(struct dumper *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emit(struct dumper *d, const char *fmt, ...)
{
    va_list ap;
    size_t room = d->len < d->cap ? d->cap - d->len : 0;

    va_start(ap, fmt);
    int n = vsnprintf(room ? d->buf + d->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        d->len += (size_t)n;
}

static bool sorts_before(const struct rdx_tree *t, const struct rdx_node *a,
                         const struct rdx_node *b)
{
    if (a->ns != b->ns)
        return a->ns < b->ns;
    for (uint32_t i = 0; i < t->cfg.page_size; i++)
        if (a->tokens[i] != b->tokens[i])
            return a->tokens[i] < b->tokens[i];
    return false;
}

/* "[p0,p1,...]", or "-" for no copy. */
static void emit_pages(struct dumper *d, const uint32_t *pages, uint32_t n)
{
    if (!pages) {
        emit(d, "-");
        return;
    }
    emit(d, "[");
    for (uint32_t i = 0; i < n; i++)
        emit(d, i ? ",%u" : "%u", pages[i]);
    emit(d, "]");
}

static void dump_node(const struct rdx_tree *t, struct dumper *d, uint32_t idx, int depth)
{
    const struct rdx_node *n = node_at(t, idx);
    size_t ntok = (size_t)n->npages * t->cfg.page_size;

    if (idx != ROOT) {
        emit(d, "%*s[", depth * 2, "");
        for (size_t i = 0; i < ntok; i++)
            emit(d, i ? ",%u" : "%u", n->tokens[i]);
        emit(d, "] pages=");
        emit_pages(d, n->on_device ? n->pages : NULL, n->npages);
        if (n->on_host) {
            emit(d, " host=");
            emit_pages(d, n->host, n->npages);
        }
        if (n->on_disk)
            emit(d, " disk");
        if (t->mamba && t->mamba[idx].slot)
            emit(d, " mamba=%u", t->mamba[idx].slot);
        if (t->mamba && t->mamba[idx].locks)
            emit(d, " mlock=%u", t->mamba[idx].locks);
        if (t->mamba && t->mamba[idx].hslot)
            emit(d, " hmamba=%u", t->mamba[idx].hslot);
        if (t->swa && n->on_device && !t->swa[idx].live)
            emit(d, " swa-");
        if (t->swa && t->swa[idx].locks)
            emit(d, " slock=%u", t->swa[idx].locks);
        emit(d, " lock=%u\n", n->lock_ref);
    }
    /* Visit children smallest first; quadratic, which is fine at the sizes tests dump. */
    uint32_t prev = NONE;
    for (uint32_t k = 0; k < n->nchildren; k++) {
        uint32_t best = NONE;
        for (uint32_t i = 1; i < t->cap; i++) {
            const struct rdx_node *c = t->nodes[i];
            if (!c || c->parent != idx)
                continue;
            if (prev != NONE && !sorts_before(t, node_at(t, prev), c))
                continue;
            if (best == NONE || sorts_before(t, c, node_at(t, best)))
                best = i;
        }
        if (best == NONE)
            break;
        dump_node(t, d, best, idx == ROOT ? 0 : depth + 1);
        prev = best;
    }
}

size_t rdx_dump(const struct rdx_tree *t, char *buf, size_t cap)
{
    struct dumper d = {.buf = buf, .cap = cap};

    if (cap)
        buf[0] = '\0';
    dump_node(t, &d, ROOT, 0);
    return d.len;
}

int rdx_node_hashes(const struct rdx_tree *t, kvt_node_ref ref, uint8_t (*out)[KVT_HASH_LEN],
                    size_t max, size_t *n)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    if (!t->cfg.hash_pages)
        return -ENODATA;
    const struct rdx_node *node = node_at(t, idx);
    *n = node->npages < max ? node->npages : max;
    memcpy(out, node->hash, *n * KVT_HASH_LEN);
    return 0;
}
