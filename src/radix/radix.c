/*
 * Radix prefix cache.
 *
 * Time is a logical clock that ticks once per match or insert, which makes every eviction
 * order reproducible.
 */
#include "radix_int.h"

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- nodes ---- */

static size_t block_bytes(const struct rdx_tree *t, uint32_t npages)
{
    size_t per = sizeof(uint32_t) * (1 + (t->cfg.host_tier ? 1 : 0) + (size_t)t->cfg.page_size);

    if (t->cfg.hash_pages)
        per += KVT_HASH_LEN;
    return per * npages;
}

static int node_set_block(struct rdx_tree *t, struct rdx_node *n, uint32_t npages)
{
    uint8_t *b = tree_alloc(t, block_bytes(t, npages));

    if (!b)
        return -ENOMEM;
    n->npages = npages;
    n->pages = (uint32_t *)b;
    n->host = t->cfg.host_tier ? n->pages + npages : NULL;
    n->tokens = n->pages + npages * (t->cfg.host_tier ? 2 : 1);
    n->hash = NULL;
    if (t->cfg.hash_pages)
        n->hash = (uint8_t(*)[KVT_HASH_LEN])(n->tokens + (size_t)npages * t->cfg.page_size);
    return 0;
}

/* Copy pages [from, from + n) of src into the fresh block of dst. */
static void node_copy_pages(const struct rdx_tree *t, struct rdx_node *dst,
                            const struct rdx_node *src, uint32_t from, uint32_t n)
{
    size_t ps = t->cfg.page_size;

    memcpy(dst->pages, src->pages + from, n * sizeof(uint32_t));
    if (t->cfg.host_tier)
        memcpy(dst->host, src->host + from, n * sizeof(uint32_t));
    memcpy(dst->tokens, src->tokens + from * ps, n * ps * sizeof(uint32_t));
    if (t->cfg.hash_pages)
        memcpy(dst->hash, src->hash + from, (size_t)n * KVT_HASH_LEN);
}

static struct rdx_node *node_new(struct rdx_tree *t, uint32_t npages)
{
    struct rdx_node *n = tree_alloc(t, sizeof(*n));

    if (!n)
        return NULL;
    memset(n, 0, sizeof(*n));
    n->prev[0] = n->prev[1] = n->next[0] = n->next[1] = NONE;
    n->parent = NONE;
    if (node_set_block(t, n, npages)) {
        tree_free(t, n);
        return NULL;
    }
    return n;
}

static void node_free(struct rdx_tree *t, struct rdx_node *n)
{
    tree_free(t, n->pages);
    tree_free(t, n);
}

/* Whole pages at the start of node n equal to tokens (at most max pages). */
static uint32_t common_pages(const struct rdx_tree *t, const struct rdx_node *n,
                             const uint32_t *tokens, size_t max)
{
    size_t ps = t->cfg.page_size;
    uint32_t i = 0;

    while (i < n->npages && i < max &&
           memcmp(n->tokens + i * ps, tokens + i * ps, ps * sizeof(uint32_t)) == 0)
        i++;
    return i;
}

static const uint8_t *last_hash(const struct rdx_tree *t, uint32_t idx, uint32_t ns)
{
    const struct rdx_node *n = node_at(t, idx);

    return idx == ROOT ? t->ns[ns].root_hash : n->hash[n->npages - 1];
}

/* Split node idx after its first m pages: a new node takes those pages and idx's place
 * under the parent; idx keeps the rest as the new node's only child. */
static int split(struct rdx_tree *t, uint32_t idx, uint32_t m, uint32_t *out)
{
    struct rdx_node *c = node_at(t, idx), *n;
    struct rdx_node rest = {0};
    int rc;

    if ((rc = reserve_ids(t, 1)) || (rc = edge_reserve(t, 1)))
        return rc;
    n = node_new(t, m);
    if (!n)
        return -ENOMEM;
    if (node_set_block(t, &rest, c->npages - m)) {
        node_free(t, n);
        return -ENOMEM;
    }
    node_copy_pages(t, n, c, 0, m);
    node_copy_pages(t, &rest, c, m, c->npages - m);

    n->parent = c->parent;
    n->ns = c->ns;
    n->lock_ref = c->lock_ref; /* the locks below c now pass through n; c keeps its own */
    n->hit_count = c->hit_count;
    n->priority = c->priority;
    n->last_access = c->last_access;
    n->created = c->created;
    n->edge_hash = c->edge_hash;
    n->nchildren = 1;
    n->on_device = c->on_device;
    n->ndev_children = c->on_device ? 1 : 0;
    n->on_host = c->on_host;
    n->pending = c->pending; /* one transfer fills both halves */
    n->on_disk = c->on_disk;
    n->disk_op = c->disk_op;

    uint32_t nidx = take_id(t, n);
    t->edges[edge_slot(t, idx)] = nidx; /* same key: the parent's edge now leads to n */
    t->ns[c->ns].nodes++;

    tree_free(t, c->pages);
    c->npages = rest.npages;
    c->pages = rest.pages;
    c->host = rest.host;
    c->tokens = rest.tokens;
    c->hash = rest.hash;
    c->parent = nidx;
    c->edge_hash = edge_hash(nidx, c->ns, c->tokens, t->cfg.page_size);
    edge_put(t, idx);
    t->sz.nodes++;
    *out = nidx;
    return 0;
}

/* ---- dropping copies and nodes ---- */

void free_device_copy(struct rdx_tree *t, uint32_t idx)
{
    struct rdx_node *n = node_at(t, idx);

    if (t->cfg.free_pages)
        t->cfg.free_pages(t->cfg.ctx, n->pages, n->npages);
    account_device(t, n, -1);
    n->on_device = false;
    node_at(t, n->parent)->ndev_children--;
    next_gen(t, idx); /* the caller's refs of the node die with its device copy */
}

void free_host_copy(struct rdx_tree *t, uint32_t idx)
{
    struct rdx_node *n = node_at(t, idx);

    if (t->cfg.free_host_pages)
        t->cfg.free_host_pages(t->cfg.ctx, n->host, n->npages);
    t->sz.host_pages -= n->npages;
    n->on_host = false;
}

/* Remove an unlocked childless node and give its pages back. */
void delete_leaf(struct rdx_tree *t, uint32_t idx)
{
    struct rdx_node *n = node_at(t, idx);
    uint32_t parent = n->parent;

    if (n->on_device)
        free_device_copy(t, idx);
    if (n->on_host)
        free_host_copy(t, idx);
    update_leaf(t, idx); /* in no list now */
    edge_del(t, idx);
    t->sz.nodes--;
    ns_unref(t, n->ns);
    node_free(t, n);
    drop_id(t, idx);
    node_at(t, parent)->nchildren--;
    update_leaf(t, parent);
}

/* ---- public operations ---- */

static int check_key(const struct rdx_tree *t, const struct kvt_key *key)
{
    if (!key || (key->len && !key->tokens) || key_ns_len(key) > KVT_NS_MAX)
        return -EINVAL;
    return t ? 0 : -EINVAL;
}

/* Where a key's cached prefix ends: node is the last node covered whole; when the prefix
 * ends inside a child, child and m (its pages covered) say where. Changes nothing. */
struct walk {
    uint32_t node;
    uint32_t child;
    uint32_t m;
    size_t pages;
};

/* Which nodes a walk may enter. */
enum tier_filter {
    ANY_COPY,    /* every node */
    DEVICE_COPY, /* nodes with a device copy */
    HOST_ONLY,   /* nodes left only on the host */
};

static bool passes(const struct rdx_node *n, enum tier_filter f)
{
    /* A host-only node is pending only while the disk tier fills it: not matchable yet. */
    return f == ANY_COPY ||
           (f == DEVICE_COPY ? n->on_device : !n->on_device && n->on_host && n->pending == 0);
}

static void walk_start(struct walk *w)
{
    *w = (struct walk){.node = ROOT, .child = NONE};
}

/* Extend a walk that ends on a node boundary through the nodes f admits. */
static void descend(const struct rdx_tree *t, uint32_t ns, const uint32_t *tokens, size_t np,
                    enum tier_filter f, struct walk *w)
{
    size_t ps = t->cfg.page_size;

    while (ns != NONE && w->child == NONE && w->pages < np) {
        const uint32_t *page = tokens + w->pages * ps;
        uint32_t c = edge_find(t, w->node, ns, page);
        if (c == NONE || !passes(node_at(t, c), f))
            return;
        const struct rdx_node *n = node_at(t, c);
        uint32_t m = common_pages(t, n, page, np - w->pages);
        w->pages += m;
        if (m < n->npages) {
            w->child = c;
            w->m = m;
            return;
        }
        w->node = c;
    }
}

/* Make the walk end on a node boundary: split its child if it ends inside one. */
static int settle(struct rdx_tree *t, struct walk *w)
{
    int rc = 0;

    if (w->child != NONE && (rc = split(t, w->child, w->m, &w->node)) == 0)
        w->child = NONE;
    return rc;
}

/* Refresh the path ending at node, counting a hit on each node; the root is refreshed too. */
static void touch_path(struct rdx_tree *t, uint32_t node, uint64_t now)
{
    node_at(t, ROOT)->last_access = now;
    for (uint32_t i = node; i != ROOT; i = node_at(t, i)->parent) {
        node_at(t, i)->last_access = now;
        node_at(t, i)->hit_count++;
    }
}

/* Copy the device or host pages of the path (from, to] (to below from) ending at pages + end,
 * last node first; the highest load still filling it goes to *pending. */
static void copy_path(const struct rdx_tree *t, uint32_t from, uint32_t to, bool host,
                      uint32_t *pages, size_t end, uint64_t *pending)
{
    for (uint32_t i = to; i != from; i = node_at(t, i)->parent) {
        const struct rdx_node *n = node_at(t, i);
        end -= n->npages;
        if (pages)
            memcpy(pages + end, host ? n->host : n->pages, n->npages * sizeof(uint32_t));
        if (pending && !(n->pending & (RDX_OP_BACKUP | RDX_OP_DISK)) && n->pending > *pending)
            *pending = n->pending;
    }
}

int rdx_match_tiers(struct rdx_tree *t, const struct kvt_key *key, uint32_t *dev_pages,
                    uint32_t *host_pages, struct rdx_hit *hit)
{
    struct walk w;
    size_t np;
    uint32_t ns;
    int rc = check_key(t, key);

    if (rc)
        return rc;
    np = key->len / t->cfg.page_size;
    ns = ns_find(t, key);
    walk_start(&w);
    descend(t, ns, key->tokens, np, DEVICE_COPY, &w);
    if ((rc = settle(t, &w)))
        return rc;
    struct walk dev = w;
    if (t->cfg.host_tier) {
        descend(t, ns, key->tokens, np, HOST_ONLY, &w);
        if ((rc = settle(t, &w)))
            return rc;
    }
    touch_path(t, w.node, ++t->clock);
    *hit = (struct rdx_hit){.dev_pages = dev.pages,
                            .host_pages = w.pages - dev.pages,
                            .dev_last = make_ref(t, dev.node),
                            .host_last = make_ref(t, w.node)};
    copy_path(t, ROOT, dev.node, false, dev_pages, dev.pages, &hit->pending);
    copy_path(t, dev.node, w.node, true, host_pages, hit->host_pages, NULL);
    return 0;
}

int rdx_match(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages, size_t *npages,
              kvt_node_ref *last)
{
    struct rdx_hit hit;
    int rc = rdx_match_tiers(t, key, pages, NULL, &hit);

    if (rc == 0) {
        *npages = hit.dev_pages;
        *last = hit.dev_last;
    }
    return rc;
}

size_t rdx_cached_pages(const struct rdx_tree *t, const struct kvt_key *key)
{
    struct walk w;

    if (check_key(t, key))
        return 0;
    walk_start(&w);
    descend(t, ns_find(t, key), key->tokens, key->len / t->cfg.page_size, DEVICE_COPY, &w);
    return w.pages;
}

static int fill_hashes(struct rdx_tree *t, struct rdx_node *n, const uint8_t *prev)
{
    uint32_t ps = t->cfg.page_size;

    for (uint32_t i = 0; i < n->npages; i++) {
        int rc = page_hash_next(&t->hasher, prev, n->tokens + (size_t)i * ps, ps, n->hash[i]);
        if (rc)
            return rc;
        prev = n->hash[i];
    }
    return 0;
}

/* A complete new leaf for np pages of tokens and pages (of the device, or of the host when
 * host is set), chained from prev; not yet linked. */
static int make_leaf(struct rdx_tree *t, const uint32_t *tokens, const uint32_t *pages, uint32_t np,
                     bool host, const uint8_t *prev, struct rdx_node **out)
{
    struct rdx_node *n = node_new(t, np);
    int rc;

    if (!n)
        return -ENOMEM;
    memcpy(host ? n->host : n->pages, pages, np * sizeof(uint32_t));
    memcpy(n->tokens, tokens, (size_t)np * t->cfg.page_size * sizeof(uint32_t));
    if (t->cfg.hash_pages && (rc = fill_hashes(t, n, prev))) {
        node_free(t, n);
        return rc;
    }
    *out = n;
    return 0;
}

/* Link leaf n under parent, with its device copy or (host) its host copy; ids and edges were
 * reserved, so this cannot fail. */
static uint32_t link_leaf(struct rdx_tree *t, uint32_t parent, uint32_t ns, struct rdx_node *n,
                          bool host, int32_t priority, uint64_t now)
{
    n->parent = parent;
    n->ns = ns;
    n->priority = priority;
    n->last_access = n->created = now;
    n->edge_hash = edge_hash(parent, ns, n->tokens, t->cfg.page_size);
    uint32_t idx = take_id(t, n);
    edge_put(t, idx);
    t->ns[ns].nodes++;
    node_at(t, parent)->nchildren++;
    t->sz.nodes++;
    if (host) {
        n->on_host = true;
        t->sz.host_pages += n->npages;
    } else {
        node_at(t, parent)->ndev_children++;
        n->on_device = true;
        account_device(t, n, 1);
    }
    update_leaf(t, parent);
    update_leaf(t, idx);
    return idx;
}

/* The hash a new leaf chains from: the end of the cached prefix the walk found. */
static const uint8_t *prefix_hash(const struct rdx_tree *t, const struct walk *w, uint32_t ns)
{
    if (w->child != NONE)
        return node_at(t, w->child)->hash[w->m - 1];
    return last_hash(t, w->node, ns);
}

/* Give the host-only nodes on the path ending at node to device copies, from the bottom up
 * to the first node that has one: pages[] holds the key's device pages, the path ends at page
 * end. Device copies form a subtree at the top, so the nodes above that one have them too. */
static void adopt_device_pages(struct rdx_tree *t, uint32_t to, const uint32_t *pages, size_t end)
{
    for (uint32_t i = to; !node_at(t, i)->on_device; i = node_at(t, i)->parent) {
        struct rdx_node *n = node_at(t, i);
        end -= n->npages;
        memcpy(n->pages, pages + end, n->npages * sizeof(uint32_t));
        n->on_device = true;
        node_at(t, n->parent)->ndev_children++;
        account_device(t, n, 1);
        update_leaf(t, i);
        update_leaf(t, n->parent);
    }
}

/* Everything that can fail happens before the tree changes: the walk, the reservations, the
 * new leaf with its hashes, and the split (which is all-or-nothing itself). */
int rdx_insert(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
               int32_t priority, size_t *prefix_pages)
{
    kvt_node_ref last;

    return rdx_insert_ref(t, key, pages, priority, prefix_pages, &last);
}

int rdx_insert_ref(struct rdx_tree *t, const struct kvt_key *key, const uint32_t *pages,
                   int32_t priority, size_t *prefix_pages, kvt_node_ref *last)
{
    struct rdx_node *leaf = NULL;
    struct walk w;
    size_t ps, np;
    uint32_t ns;
    int rc = check_key(t, key);

    if (rc)
        return rc;
    ps = t->cfg.page_size;
    if (key->len % ps || key->len / ps > UINT32_MAX || (key->len && !pages))
        return -EINVAL;
    np = key->len / ps;
    if ((rc = ns_intern(t, key, &ns)))
        return rc;
    walk_start(&w);
    descend(t, ns, key->tokens, np, DEVICE_COPY, &w);
    size_t dev_pages = w.pages;
    if (t->cfg.host_tier)
        descend(t, ns, key->tokens, np, HOST_ONLY, &w);
    /* The walk stopped at a node the disk tier is still filling: not now. */
    if (w.child == NONE && w.pages < np &&
        edge_find(t, w.node, ns, key->tokens + w.pages * ps) != NONE) {
        rc = -EBUSY;
        goto fail;
    }
    if ((rc = reserve_ids(t, 2)) || (rc = edge_reserve(t, 2)))
        goto fail;
    if (w.pages < np &&
        (rc = make_leaf(t, key->tokens + w.pages * ps, pages + w.pages, (uint32_t)(np - w.pages),
                        false, t->cfg.hash_pages ? prefix_hash(t, &w, ns) : NULL, &leaf)))
        goto fail;
    if ((rc = settle(t, &w)))
        goto fail;

    uint64_t now = ++t->clock;
    adopt_device_pages(t, w.node, pages, w.pages);
    uint32_t end = leaf ? link_leaf(t, w.node, ns, leaf, false, priority, now) : w.node;
    *last = make_ref(t, end);
    for (uint32_t i = w.node;; i = node_at(t, i)->parent) {
        struct rdx_node *n = node_at(t, i);
        n->last_access = now;
        if (priority > n->priority)
            n->priority = priority;
        if (i == ROOT)
            break;
    }
    *prefix_pages = dev_pages;
    return 0;
fail:
    if (leaf)
        node_free(t, leaf);
    ns_drop_if_empty(t, ns);
    return rc;
}

/* ---- residency changes driven by transfers ---- */

int rdx_attach_device(struct rdx_tree *t, kvt_node_ref ref, const uint32_t *pages, size_t n,
                      uint64_t op)
{
    uint32_t idx, i;
    size_t span = 0;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    for (i = idx; !node_at(t, i)->on_device; i = node_at(t, i)->parent)
        span += node_at(t, i)->npages;
    if (span != n || op == 0)
        return -EINVAL;
    for (i = idx; !node_at(t, i)->on_device; i = node_at(t, i)->parent)
        node_at(t, i)->pending = op;
    adopt_device_pages(t, idx, pages, n);
    return 0;
}

/* The nodes a backup of ref must cover: ref and its ancestors up to the first with a host
 * copy (host copies form a subtree at the top, so the backup keeps them one). */
static size_t backup_span(const struct rdx_tree *t, uint32_t idx)
{
    size_t span = 0;

    for (uint32_t i = idx; !node_at(t, i)->on_host; i = node_at(t, i)->parent)
        span += node_at(t, i)->npages;
    return span;
}

int rdx_backup_span(const struct rdx_tree *t, kvt_node_ref ref, size_t *pages)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc == 0)
        *pages = backup_span(t, idx);
    return rc;
}

int rdx_attach_host(struct rdx_tree *t, kvt_node_ref ref, const uint32_t *host_pages, size_t n,
                    uint32_t *dev_pages, uint64_t op)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    if (backup_span(t, idx) != n || op == 0)
        return -EINVAL;
    size_t end = n;
    for (uint32_t i = idx; !node_at(t, i)->on_host; i = node_at(t, i)->parent) {
        struct rdx_node *nd = node_at(t, i);
        end -= nd->npages;
        memcpy(nd->host, host_pages + end, nd->npages * sizeof(uint32_t));
        memcpy(dev_pages + end, nd->pages, nd->npages * sizeof(uint32_t));
        nd->on_host = true;
        nd->pending = op;
        t->sz.host_pages += nd->npages;
        update_leaf(t, i);
    }
    return 0;
}

int rdx_op_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, int failed)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    for (uint32_t i = idx; i != ROOT && node_at(t, i)->pending == op;) {
        struct rdx_node *n = node_at(t, i);
        uint32_t parent = n->parent;
        n->pending = 0;
        /* A failed backup leaves nothing on the host. A failed load leaves device pages
         * holding garbage: they go when nothing holds them; a locked node is the engine's
         * to fence off. */
        if (failed && (op & RDX_OP_BACKUP) && n->on_host)
            free_host_copy(t, i);
        else if (failed && !(op & RDX_OP_BACKUP) && n->on_device && n->lock_ref == 0 &&
                 n->ndev_children == 0)
            free_device_copy(t, i);
        update_leaf(t, i);
        i = parent;
    }
    return 0;
}

/* ---- the disk tier ---- */

/* Whether node idx ends the first `first` pages of key in namespace ns. */
static bool ends_key(const struct rdx_tree *t, uint32_t idx, uint32_t ns, const struct kvt_key *key,
                     size_t first)
{
    size_t ps = t->cfg.page_size, end = first;

    for (uint32_t i = idx; i != ROOT; i = node_at(t, i)->parent) {
        const struct rdx_node *n = node_at(t, i);
        if (n->ns != ns || n->npages > end)
            return false;
        end -= n->npages;
        if (memcmp(n->tokens, key->tokens + end * ps, (size_t)n->npages * ps * sizeof(uint32_t)))
            return false;
    }
    return end == 0;
}

/* Resolve ref and check it ends key's first `first` pages, with n more pages in key. */
static int resolve_on_key(const struct rdx_tree *t, const struct kvt_key *key, kvt_node_ref ref,
                          size_t first, size_t n, uint32_t *idx)
{
    int rc = check_key(t, key);

    if (rc || (rc = resolve(t, ref, idx)))
        return rc;
    if (!t->cfg.hash_pages || first + n > key->len / t->cfg.page_size ||
        (*idx != ROOT && !ends_key(t, *idx, ns_find(t, key), key, first)) ||
        (*idx == ROOT && first != 0))
        return -EINVAL;
    return 0;
}

int rdx_key_hashes(struct rdx_tree *t, const struct kvt_key *key, kvt_node_ref ref, size_t first,
                   size_t n, uint8_t (*out)[KVT_HASH_LEN])
{
    uint8_t root[KVT_HASH_LEN];
    const uint8_t *prev = root;
    size_t ps;
    uint32_t idx;
    int rc = resolve_on_key(t, key, ref, first, n, &idx);

    if (rc)
        return rc;
    ps = t->cfg.page_size;
    if (idx != ROOT)
        prev = last_hash(t, idx, 0);
    else if ((rc = page_hash_root(&t->hasher, t->cfg.fingerprint, key->ns, key_ns_len(key), root)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *page = key->tokens + (first + i) * ps;
        if ((rc = page_hash_next(&t->hasher, prev, page, (uint32_t)ps, out[i])))
            return rc;
        prev = out[i];
    }
    return 0;
}

int rdx_attach_fill(struct rdx_tree *t, const struct kvt_key *key, kvt_node_ref ref, size_t first,
                    const uint32_t *host_pages, size_t n, uint64_t op, kvt_node_ref *leaf)
{
    struct rdx_node *nd;
    uint32_t idx, ns, at;
    size_t ps;
    int rc = resolve_on_key(t, key, ref, first, n, &idx);

    if (rc)
        return rc;
    ps = t->cfg.page_size;
    /* Host copies form a subtree at the top: the new leaf's parent needs one too. */
    if (!t->cfg.host_tier || n == 0 || n > UINT32_MAX || !(op & RDX_OP_DISK) ||
        (idx != ROOT && !node_at(t, idx)->on_host))
        return -EINVAL;
    if ((rc = ns_intern(t, key, &ns)))
        return rc;
    if (edge_find(t, idx, ns, key->tokens + first * ps) != NONE)
        return -EEXIST;
    if ((rc = reserve_ids(t, 1)) || (rc = edge_reserve(t, 1)) ||
        (rc = make_leaf(t, key->tokens + first * ps, host_pages, (uint32_t)n, true,
                        last_hash(t, idx, ns), &nd))) {
        ns_drop_if_empty(t, ns);
        return rc;
    }
    nd->on_disk = true;
    nd->pending = op; /* before linking, so it never shows as a host leaf */
    at = link_leaf(t, idx, ns, nd, true, 0, ++t->clock);
    *leaf = make_ref(t, at);
    return 0;
}

int rdx_fill_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, size_t ok)
{
    uint32_t idx, top;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    if (node_at(t, idx)->pending != op || !(op & RDX_OP_DISK))
        return -EINVAL;
    bool whole = ok >= node_at(t, idx)->npages;
    if (!whole && ok > 0 && split(t, idx, (uint32_t)ok, &top) == 0) {
        node_at(t, top)->pending = 0;
        update_leaf(t, top);
    }
    node_at(t, idx)->pending = 0;
    if (whole)
        update_leaf(t, idx);
    else
        delete_leaf(t, idx); /* what did not land, or all of it when the split failed */
    return 0;
}

/* The nodes a disk write of ref covers: ref and its ancestors with a host copy that is
 * neither on disk, being written, nor still being backed up. */
static bool disk_writable(const struct rdx_node *n)
{
    return n->on_host && !n->on_disk && n->disk_op == 0 && !(n->pending & RDX_OP_BACKUP);
}

static size_t disk_span(const struct rdx_tree *t, uint32_t idx)
{
    size_t span = 0;

    for (uint32_t i = idx; i != ROOT && disk_writable(node_at(t, i)); i = node_at(t, i)->parent)
        span += node_at(t, i)->npages;
    return span;
}

int rdx_disk_span(const struct rdx_tree *t, kvt_node_ref ref, size_t *pages)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc == 0)
        *pages = t->cfg.hash_pages ? disk_span(t, idx) : 0;
    return rc;
}

int rdx_attach_disk(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, struct rdx_disk_page *out,
                    size_t n)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    if (!t->cfg.hash_pages || disk_span(t, idx) != n || !(op & RDX_OP_DISK))
        return -EINVAL;
    size_t end = n, ps = t->cfg.page_size;
    for (uint32_t i = idx; i != ROOT && disk_writable(node_at(t, i)); i = node_at(t, i)->parent) {
        struct rdx_node *nd = node_at(t, i);
        end -= nd->npages;
        for (uint32_t k = 0; k < nd->npages; k++)
            out[end + k] = (struct rdx_disk_page){
                .hash = nd->hash[k],
                .parent = k ? nd->hash[k - 1] : last_hash(t, nd->parent, nd->ns),
                .ns = t->ns[nd->ns].root_hash,
                .tokens = nd->tokens + k * ps,
                .host_page = nd->host[k],
            };
        nd->disk_op = op;
        update_leaf(t, i);
    }
    return 0;
}

int rdx_disk_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, const int *results, size_t n)
{
    uint32_t idx;
    size_t span = 0;
    int rc = resolve(t, ref, &idx);

    if (rc)
        return rc;
    for (uint32_t i = idx; i != ROOT && node_at(t, i)->disk_op == op; i = node_at(t, i)->parent)
        span += node_at(t, i)->npages;
    if (span != n || op == 0)
        return -EINVAL;
    for (uint32_t i = idx; i != ROOT && node_at(t, i)->disk_op == op;) {
        struct rdx_node *nd = node_at(t, i);
        bool all = true;
        span -= nd->npages;
        for (uint32_t k = 0; k < nd->npages; k++)
            all = all && results[span + k] == 0;
        nd->on_disk = all;
        nd->disk_op = 0;
        update_leaf(t, i);
        i = nd->parent;
    }
    return 0;
}

int rdx_hit_count(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *hits)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc == 0)
        *hits = node_at(t, idx)->hit_count;
    return rc;
}

static int lock_delta(struct rdx_tree *t, kvt_node_ref ref, int d)
{
    uint32_t idx;
    int rc = resolve_current(t, ref, &idx);

    if (rc)
        return rc;
    if (idx == ROOT)
        return 0;
    if (d < 0 && node_at(t, idx)->own_ref == 0)
        return -EINVAL;
    node_at(t, idx)->own_ref += (uint32_t)d;
    for (uint32_t i = idx; i != ROOT; i = node_at(t, i)->parent) {
        struct rdx_node *n = node_at(t, i);
        if (d > 0 && n->lock_ref++ == 0 && n->on_device) {
            t->sz.evictable_pages -= n->npages;
            t->sz.protected_pages += n->npages;
        } else if (d < 0 && --n->lock_ref == 0 && n->on_device) {
            t->sz.evictable_pages += n->npages;
            t->sz.protected_pages -= n->npages;
        }
        update_leaf(t, i);
    }
    return 0;
}

int rdx_lock(struct rdx_tree *t, kvt_node_ref ref)
{
    return t ? lock_delta(t, ref, 1) : -EINVAL;
}

int rdx_unlock(struct rdx_tree *t, kvt_node_ref ref)
{
    return t ? lock_delta(t, ref, -1) : -EINVAL;
}

int rdx_is_locked(const struct rdx_tree *t, kvt_node_ref ref)
{
    uint32_t idx;
    int rc = resolve_current(t, ref, &idx);

    if (rc)
        return rc;
    return idx == ROOT || node_at(t, idx)->own_ref > 0;
}

kvt_node_ref rdx_root(const struct rdx_tree *t)
{
    return make_ref(t, ROOT);
}

void rdx_sizes(const struct rdx_tree *t, struct rdx_sizes *s)
{
    *s = t->sz;
}

/* ---- lifetime ---- */

int rdx_create(const struct rdx_config *cfg, struct rdx_tree **out)
{
    struct rdx_tree *t;
    struct rdx_node *root;
    int rc;

    if (!cfg || !out || cfg->page_size == 0 || (cfg->page_size & (cfg->page_size - 1)) ||
        cfg->policy > KVT_EVICT_PRIORITY)
        return -EINVAL;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->cfg = *cfg;
    t->leaf_head[0] = t->leaf_head[1] = NONE;
    if (cfg->hash_pages && (rc = page_hasher_init(&t->hasher)))
        goto fail;
    rc = -ENOMEM;
    t->edges = tree_alloc(t, 64 * sizeof(*t->edges));
    t->ns = tree_alloc(t, sizeof(*t->ns));
    if (!t->edges || !t->ns || reserve_ids(t, 1))
        goto fail;
    memset(t->edges, 0xff, 64 * sizeof(*t->edges));
    t->edge_mask = 63;
    t->nns = 1;
    if ((rc = ns_fill(t, &t->ns[0], NULL, 0)))
        goto fail;
    rc = -ENOMEM;
    root = node_new(t, 0);
    if (!root)
        goto fail;
    root->lock_ref = 1;                     /* the root is never evicted */
    root->on_device = root->on_host = true; /* so every child's parent holds both */
    root->priority = INT32_MIN;
    take_id(t, root);
    *out = t;
    return 0;
fail:
    rdx_destroy(t);
    return rc;
}

void rdx_destroy(struct rdx_tree *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->nodes[i])
            node_free(t, t->nodes[i]);
    for (uint32_t i = 0; i < t->nns; i++)
        if (t->ns[i].used)
            tree_free(t, t->ns[i].bytes);
    free(t->ns);
    free(t->edges);
    free(t->nodes);
    free(t->gens);
    free(t->free_ids);
    free(t->heap);
    if (t->hasher.md)
        page_hasher_finish(&t->hasher);
    free(t);
}

/* ---- checks and dumps, for tests and tools ---- */

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
    if (n->on_host && !node_at(t, n->parent)->on_host)
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
    if (t->cfg.hash_pages)
        page_hasher_finish(&c.hasher);
out:
    free(c.kids);
    free(c.dev_kids);
    free(c.child_locks);
    free(c.ns_nodes);
    return rc;
}

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
