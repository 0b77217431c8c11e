/*
 * The tree itself: nodes and their page blocks, splits, dropping copies and nodes, spans up
 * the parent chain, the walk behind match and insert, locks, and the tree's lifetime. Ids,
 * namespaces, edges and the leaf lists sit below it (radix_int.h); eviction and residency
 * above it.
 *
 * Time is a logical clock that ticks once per match or insert, which makes every eviction
 * order reproducible.
 */
#include "radix_int.h"

#include <errno.h>
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

const uint8_t *last_hash(const struct rdx_tree *t, uint32_t idx, uint32_t ns)
{
    const struct rdx_node *n = node_at(t, idx);

    return idx == ROOT ? t->ns[ns].root_hash : n->hash[n->npages - 1];
}

/* Split node idx after its first m pages: a new node takes those pages and idx's place
 * under the parent; idx keeps the rest as the new node's only child. */
int split(struct rdx_tree *t, uint32_t idx, uint32_t m, uint32_t *out)
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
    split_swa(t, idx, nidx);
    *out = nidx;
    return 0;
}

/* ---- dropping copies and nodes ---- */

void free_device_copy(struct rdx_tree *t, uint32_t idx)
{
    struct rdx_node *n = node_at(t, idx);

    drop_state(t, idx); /* a state needs the KV it continues */
    drop_swa(t, idx);   /* first: the caller finds the SWA peers through the full pages */
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

    drop_host_state(t, idx); /* a saved state needs the KV it continues as well */
    if (t->swa)
        t->swa[idx].hlive = false;
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

    /* The host copy first: a state saved beside it now would go with it. */
    if (n->on_host)
        free_host_copy(t, idx);
    if (n->on_device)
        free_device_copy(t, idx);
    update_leaf(t, idx); /* in no list now */
    edge_del(t, idx);
    t->sz.nodes--;
    ns_unref(t, n->ns);
    node_free(t, n);
    drop_id(t, idx);
    node_at(t, parent)->nchildren--;
    update_leaf(t, parent);
}

/* ---- spans ---- */

size_t span_pages(const struct rdx_tree *t, uint32_t idx, const struct span *s)
{
    size_t pages = 0;

    for (uint32_t i = idx; i != ROOT && s->has(node_at(t, i), s->op); i = node_at(t, i)->parent)
        pages += node_at(t, i)->npages;
    return pages;
}

void span_each(struct rdx_tree *t, uint32_t idx, const struct span *s, size_t end, span_fn fn,
               const void *arg)
{
    for (uint32_t i = idx; i != ROOT && s->has(node_at(t, i), s->op);) {
        uint32_t parent = node_at(t, i)->parent;
        end -= node_at(t, i)->npages;
        fn(t, i, end, arg);
        i = parent;
    }
}

/* ---- walk, match and insert ---- */

int check_key(const struct rdx_tree *t, const struct kvt_key *key)
{
    if (!key || (key->len && !key->tokens) || key_ns_len(key) > RDX_NS_MAX)
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
int make_leaf(struct rdx_tree *t, const uint32_t *tokens, const uint32_t *pages, uint32_t np,
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
uint32_t link_leaf(struct rdx_tree *t, uint32_t parent, uint32_t ns, struct rdx_node *n, bool host,
                   int32_t priority, uint64_t now)
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
        gain_swa(t, idx);
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

bool lacks_device(const struct rdx_node *n, uint64_t op)
{
    (void)op;
    return !n->on_device;
}

static void give_device_copy(struct rdx_tree *t, uint32_t idx, size_t at, const void *pages)
{
    struct rdx_node *n = node_at(t, idx);

    memcpy(n->pages, (const uint32_t *)pages + at, n->npages * sizeof(uint32_t));
    n->on_device = true;
    node_at(t, n->parent)->ndev_children++;
    account_device(t, n, 1);
    gain_swa(t, idx);
    update_leaf(t, idx);
    update_leaf(t, n->parent);
}

/* Give the host-only nodes on the path ending at node to device copies, from the bottom up
 * to the first node that has one: pages[] holds the key's device pages, the path ends at page
 * end. Device copies form a subtree at the top, so the nodes above that one have them too. */
void adopt_device_pages(struct rdx_tree *t, uint32_t to, const uint32_t *pages, size_t end)
{
    struct span s = {lacks_device, 0};

    span_each(t, to, &s, end, give_device_copy, pages);
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

/* ---- locks, hits and sizes ---- */

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
    /* The locks of idx's state are its own KV locks too: only rdx_mamba_unlock drops them. */
    if (d < 0 && node_at(t, idx)->own_ref <= state_locks(t, idx))
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
    t->mamba_head = t->mamba_host_head = t->swa_head = NONE;
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
    free(t->mamba);
    free(t->swa);
    if (t->hasher.md)
        page_hasher_finish(&t->hasher);
    free(t);
}
