/*
 * Residency driven by transfers: the tree's side of copying nodes between tiers. A transfer
 * marks the nodes it fills (pending, or disk_op for a disk write) and clears the mark when it
 * finishes; until then those nodes are neither evicted nor filled again (radix.h, "residency
 * changes driven by transfers" and "the disk tier").
 */
#include "radix_int.h"

#include <errno.h>
#include <string.h>

/* ---- spans ---- */

/* Resolve ref and check that its span is n pages long and op (op_ok) fits. */
static int span_start(const struct rdx_tree *t, kvt_node_ref ref, const struct span *s, size_t n,
                      bool op_ok, uint32_t *idx)
{
    int rc = resolve(t, ref, idx);

    if (rc == 0 && (span_pages(t, *idx, s) != n || !op_ok))
        rc = -EINVAL;
    return rc;
}

/* Resolve ref and measure its span. */
static int span_of(const struct rdx_tree *t, kvt_node_ref ref, const struct span *s, size_t *pages)
{
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    if (rc == 0)
        *pages = span_pages(t, idx, s);
    return rc;
}

/* ---- device and host copies: load-back, backup, op end ---- */

static void mark_pending(struct rdx_tree *t, uint32_t idx, size_t at, const void *op)
{
    (void)at;
    node_at(t, idx)->pending = *(const uint64_t *)op;
}

int rdx_attach_device(struct rdx_tree *t, kvt_node_ref ref, const uint32_t *pages, size_t n,
                      uint64_t op)
{
    struct span s = {lacks_device, 0};
    uint32_t idx;
    int rc = span_start(t, ref, &s, n, op != 0, &idx);

    if (rc)
        return rc;
    span_each(t, idx, &s, n, mark_pending, &op);
    adopt_device_pages(t, idx, pages, n);
    /* A node's device copy holds SWA KV where its host copy did: the load brings the SWA
     * layers of those nodes alone (rdx_swa_load_mask). */
    for (size_t left = n; t->swa && left; idx = node_at(t, idx)->parent) {
        if (!t->swa[idx].hlive)
            forget_swa(t, idx);
        left -= node_at(t, idx)->npages;
    }
    return 0;
}

/* The span a backup of ref must cover: ref and its ancestors up to the first with a host
 * copy (host copies form a subtree at the top, so the backup keeps them one). */
static bool lacks_host(const struct rdx_node *n, uint64_t op)
{
    (void)op;
    return !n->on_host;
}

int rdx_backup_span(const struct rdx_tree *t, kvt_node_ref ref, size_t *pages)
{
    struct span s = {lacks_host, 0};

    return span_of(t, ref, &s, pages);
}

struct host_copy {
    const uint32_t *host_pages;
    uint32_t *dev_pages;
    uint64_t op;
};

static void take_host_copy(struct rdx_tree *t, uint32_t idx, size_t at, const void *arg)
{
    const struct host_copy *c = arg;
    struct rdx_node *n = node_at(t, idx);

    memcpy(n->host, c->host_pages + at, n->npages * sizeof(uint32_t));
    memcpy(c->dev_pages + at, n->pages, n->npages * sizeof(uint32_t));
    n->on_host = true;
    n->pending = c->op;
    if (t->swa) /* the backup copies the SWA layers of pages that have them */
        t->swa[idx].hlive = t->swa[idx].live;
    t->sz.host_pages += n->npages;
    update_leaf(t, idx);
}

int rdx_attach_host(struct rdx_tree *t, kvt_node_ref ref, const uint32_t *host_pages, size_t n,
                    uint32_t *dev_pages, uint64_t op)
{
    struct span s = {lacks_host, 0};
    struct host_copy c = {host_pages, dev_pages, op};
    uint32_t idx;
    int rc = span_start(t, ref, &s, n, op != 0, &idx);

    if (rc == 0)
        span_each(t, idx, &s, n, take_host_copy, &c);
    return rc;
}

/* ---- host copies below a lost one ---- */

/* Whether an ancestor of idx has no host copy. */
static bool below_lost_host(const struct rdx_tree *t, uint32_t idx)
{
    for (uint32_t i = node_at(t, idx)->parent; i != ROOT; i = node_at(t, i)->parent)
        if (!node_at(t, i)->on_host)
            return true;
    return false;
}

/* Drop idx's host copy if it sits below a lost one and nothing fills, reads or needs it;
 * whether it went. A host-only node goes whole once its children have. *busy: one must
 * wait for an op's end. */
static bool drop_orphan(struct rdx_tree *t, uint32_t idx, bool *busy)
{
    struct rdx_node *n = node_at(t, idx);

    if (!n->on_host || !below_lost_host(t, idx))
        return false;
    if (n->pending || n->disk_op || (!n->on_device && n->nchildren)) {
        *busy = true;
        return false;
    }
    if (!n->on_device) {
        delete_leaf(t, idx);
        return true;
    }
    free_host_copy(t, idx);
    update_leaf(t, idx);
    return true;
}

/* A backup that failed lost a node's host copy after copies below it were made (later
 * backups of its children, fills under it): those go too, since host copies form a subtree
 * at the top. Copies still being filled or read wait for their op's end, which calls this
 * again. A walk over every node, repeated while it drops something: the failure path only,
 * and the engine stops serving after a failed transfer. */
static void prune_orphans(struct rdx_tree *t)
{
    bool busy, dropped;

    do {
        busy = dropped = false;
        for (uint32_t i = ROOT + 1; i < t->cap; i++)
            if (t->nodes[i] && drop_orphan(t, i, &busy))
                dropped = true;
    } while (dropped);
    t->orphans = busy;
}

/* The span an op's end clears: the nodes it marked pending. */
static bool pending_on(const struct rdx_node *n, uint64_t op)
{
    return n->pending == op;
}

struct op_end {
    uint64_t op;
    int failed;
};

static void end_op(struct rdx_tree *t, uint32_t idx, size_t at, const void *arg)
{
    const struct op_end *e = arg;
    struct rdx_node *n = node_at(t, idx);

    (void)at;
    n->pending = 0;
    /* A failed backup leaves nothing on the host; what was copied below its nodes since it
     * began goes too (prune_orphans). A failed load leaves device pages holding garbage:
     * they go when nothing holds them; a locked node is the engine's to fence off. The
     * parent may be a device leaf again. */
    if (e->failed && (e->op & RDX_OP_BACKUP) && n->on_host) {
        free_host_copy(t, idx);
        t->orphans = true;
    } else if (e->failed && !(e->op & RDX_OP_BACKUP) && n->on_device && n->lock_ref == 0 &&
               n->ndev_children == 0) {
        free_device_copy(t, idx);
        update_leaf(t, n->parent);
    }
    update_leaf(t, idx);
}

int rdx_op_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, int failed)
{
    struct span s = {pending_on, op};
    struct op_end e = {op, failed};
    uint32_t idx;
    int rc = resolve(t, ref, &idx);

    /* end_op needs no page offsets; the span's length only keeps them in range. */
    if (rc == 0)
        span_each(t, idx, &s, span_pages(t, idx, &s), end_op, &e);
    if (rc == 0 && t->orphans)
        prune_orphans(t);
    return rc;
}

/* ---- the disk tier: key hashes, fills, writes ---- */

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

/* What stays of a fill: its node, or the upper half holding the ok pages that landed; NONE
 * when nothing does. */
static uint32_t fill_done(struct rdx_tree *t, uint32_t idx, size_t ok)
{
    uint32_t top = NONE;
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
    if (t->orphans)
        prune_orphans(t);
    return whole ? idx : top;
}

static int fill_start(const struct rdx_tree *t, kvt_node_ref ref, uint64_t op, uint32_t *idx)
{
    int rc = resolve(t, ref, idx);

    if (rc == 0 && (node_at(t, *idx)->pending != op || !(op & RDX_OP_DISK)))
        rc = -EINVAL;
    return rc;
}

int rdx_fill_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, size_t ok)
{
    uint32_t idx;
    int rc = fill_start(t, ref, op, &idx);

    if (rc == 0)
        fill_done(t, idx, ok);
    return rc;
}

int rdx_fill_done_window(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, size_t ok,
                         size_t live_from)
{
    uint32_t idx, upper;
    int rc = fill_start(t, ref, op, &idx);

    if (rc)
        return rc;
    idx = fill_done(t, idx, ok);
    if (!t->swa || idx == NONE || ok <= live_from || node_at(t, idx)->pending)
        return 0;
    /* A split keeps idx as the lower half, the pages from live_from on. */
    if (live_from == 0 || split(t, idx, (uint32_t)live_from, &upper) == 0)
        t->swa[idx].hlive = true;
    return 0;
}

/* The span a disk write of ref covers: ref and its ancestors with a host copy that is
 * neither on disk, being written, nor still being backed up. */
static bool disk_writable(const struct rdx_node *n, uint64_t op)
{
    (void)op;
    return n->on_host && !n->on_disk && n->disk_op == 0 && !(n->pending & RDX_OP_BACKUP);
}

int rdx_disk_span(const struct rdx_tree *t, kvt_node_ref ref, size_t *pages)
{
    struct span s = {disk_writable, 0};
    int rc = span_of(t, ref, &s, pages);

    if (rc == 0 && !t->cfg.hash_pages)
        *pages = 0;
    return rc;
}

struct disk_write {
    struct rdx_disk_page *out;
    uint64_t op;
    uint64_t first; /* the span's first page's index in its key (cfg.swa_window) */
};

/* Window copies inside a node: the window before every multiple of RDX_WINDOW_EVERY tokens of
 * the key, or of a larger multiple of it for a window so long that copies would cover more
 * than about a third of the pages (gemma-3-27b's 1,024 tokens: every 3,584). A match ending
 * inside a node is then served from below up to the last such point under its end. 512 is
 * Mooncake's block: the traces' shared prefixes end on it. */
#define RDX_WINDOW_EVERY 512

static uint64_t window_every(const struct rdx_tree *t)
{
    uint64_t ps = t->cfg.page_size, want = 3 * ((uint64_t)t->cfg.swa_window + ps);
    uint64_t every = (want + RDX_WINDOW_EVERY - 1) / RDX_WINDOW_EVERY * RDX_WINDOW_EVERY;

    return every / ps ? every / ps : 1; /* in pages */
}

/* Pages above node idx: its first page's index in its key (one walk per disk write). */
static uint64_t node_start(const struct rdx_tree *t, uint32_t idx)
{
    uint64_t pages = 0;

    for (uint32_t i = node_at(t, idx)->parent; i != ROOT; i = node_at(t, i)->parent)
        pages += node_at(t, i)->npages;
    return pages;
}

/* Whether page k of node idx (start: its first page's index in the key) gets a window copy
 * below: the node's host copy holds its sliding-window layers, and the page lies in the
 * window and a page before the node's end or before a multiple of window_every pages
 * (a match ending there reads it; one a page earlier too, as a repeated prompt's does, its
 * last token computed again). */
static bool window_page(const struct rdx_tree *t, uint32_t idx, uint64_t start, uint32_t k)
{
    uint64_t ps = t->cfg.page_size, wp = (t->cfg.swa_window + ps - 1) / ps;
    uint64_t every = window_every(t);

    if (!t->swa || !t->swa[idx].hlive)
        return false;
    return node_at(t, idx)->npages - k <= wp + 1 || every - (start + k) % every <= wp + 1;
}

/* Page k of node idx, as a disk write names it. */
static struct rdx_disk_page page_of(const struct rdx_tree *t, uint32_t idx, uint32_t k)
{
    const struct rdx_node *n = node_at(t, idx);

    return (struct rdx_disk_page){
        .hash = n->hash[k],
        .parent = k ? n->hash[k - 1] : last_hash(t, n->parent, n->ns),
        .ns = t->ns[n->ns].root_hash,
        .tokens = n->tokens + (size_t)k * t->cfg.page_size,
        .host_page = n->host[k],
    };
}

static void describe_page(struct rdx_tree *t, uint32_t idx, size_t at, const void *arg)
{
    const struct disk_write *w = arg;
    struct rdx_node *n = node_at(t, idx);
    uint64_t start = w->first + at;

    for (uint32_t k = 0; k < n->npages; k++) {
        w->out[at + k] = page_of(t, idx, k);
        w->out[at + k].window = window_page(t, idx, start, k);
    }
    n->disk_op = w->op;
    update_leaf(t, idx);
}

int rdx_attach_disk(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, struct rdx_disk_page *out,
                    size_t n)
{
    struct span s = {disk_writable, 0};
    struct disk_write w = {out, op, 0};
    uint32_t idx;
    int rc = span_start(t, ref, &s, n, t->cfg.hash_pages && (op & RDX_OP_DISK), &idx);

    if (rc)
        return rc;
    if (t->swa) /* the span ends at idx's end */
        w.first = node_start(t, idx) + node_at(t, idx)->npages - n;
    span_each(t, idx, &s, n, describe_page, &w);
    return 0;
}

int rdx_disk_head(const struct rdx_tree *t, kvt_node_ref ref, size_t n, size_t group,
                  struct rdx_disk_page *out, size_t *head, uint64_t *first)
{
    uint32_t idx, i;
    size_t h, got = 0;
    int rc = resolve(t, ref, &idx);

    *head = 0;
    if (rc || group == 0)
        return rc ? rc : -EINVAL;
    *first = node_start(t, idx) + node_at(t, idx)->npages;
    if (n > *first)
        return -EINVAL;
    *first -= n;
    h = (size_t)(*first % group);
    /* Up past the span, whole nodes, to the node that ends right before it. */
    for (i = idx; n; i = node_at(t, i)->parent) {
        if (node_at(t, i)->npages > n)
            return -EINVAL;
        n -= node_at(t, i)->npages;
    }
    for (; got < h; i = node_at(t, i)->parent) {
        const struct rdx_node *a = node_at(t, i);
        if (i == ROOT)
            return -EINVAL; /* cannot happen: the key holds *first pages above the span */
        if (!a->on_host || (a->pending & (RDX_OP_BACKUP | RDX_OP_DISK)))
            return -EAGAIN; /* its host copy is lost, or not yet all there */
        for (uint32_t k = a->npages; k-- > 0 && got < h; got++)
            out[h - 1 - got] = page_of(t, i, k);
    }
    *head = h;
    return 0;
}

/* The span a disk write's end clears: the nodes it is writing. */
static bool written_by(const struct rdx_node *n, uint64_t op)
{
    return n->disk_op == op;
}

static void record_disk_result(struct rdx_tree *t, uint32_t idx, size_t at, const void *results)
{
    struct rdx_node *n = node_at(t, idx);
    bool all = true;

    for (uint32_t k = 0; k < n->npages; k++)
        all = all && ((const int *)results)[at + k] == 0;
    n->on_disk = all;
    n->disk_op = 0;
    update_leaf(t, idx);
}

int rdx_disk_done(struct rdx_tree *t, kvt_node_ref ref, uint64_t op, const int *results, size_t n)
{
    struct span s = {written_by, op};
    uint32_t idx;
    int rc = span_start(t, ref, &s, n, op != 0, &idx);

    if (rc == 0)
        span_each(t, idx, &s, n, record_disk_result, results);
    if (rc == 0 && t->orphans)
        prune_orphans(t);
    return rc;
}
