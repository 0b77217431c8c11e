/*
 * Residency driven by transfers: the tree's side of copying nodes between tiers. A transfer
 * marks the nodes it fills (pending, or disk_op for a disk write) and clears the mark when it
 * finishes; until then those nodes are neither evicted nor filled again (radix.h, "residency
 * changes driven by transfers" and "the disk tier").
 */
#include "radix_int.h"

#include <errno.h>
#include <string.h>

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
