/*
 * The host tier (host/host_tier.h): backups after insert, load-back at request start, its share of
 * eviction, and applying finished transfers.
 *
 * The tree records what each transfer fills (rdx_attach_*), the transfer engine moves the
 * bytes, and a FIFO per direction remembers which node each op covers. Ops of one direction
 * finish in order, so applying them is walking the FIFO up to the direction's watermark.
 */
#include "host/host_tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A submitted transfer and the node whose chain it fills. */
struct pending_op {
    uint64_t id;
    kvt_node_ref node;
};

struct op_queue {
    struct pending_op *v; /* ring of ops submitted and not yet applied, oldest first */
    size_t head, n, cap;
    uint64_t last_id; /* id of the last op submitted */
};

struct host_tier {
    struct tier base;
    const struct kvt_options *opts;
    struct rdx_tree *const *tree;
    struct slot_alloc *alloc;
    struct kv_pool *kv;
    struct host_pool pool;
    struct xfer_engine *xfer;
    struct op_queue ops[2]; /* by enum xfer_dir */
    struct swa_alloc *swa;  /* a sliding-window model's pair allocator; NULL: none */
    const struct swa_pool *swa_pool;
    /* Scratch, one entry per page of the longest key: a load's device pages, and for
     * backups, which a load's room on the device may start under write_back; with swa,
     * each's SWA pages (0: none) and a load's mask and pages to pair. */
    uint32_t *dev_pages, *bk_host, *bk_dev;
    uint32_t *ld_swa, *bk_swa, *ld_pair;
    uint8_t *ld_mask;
    int failed; /* a transfer failed: sticky KVT_EBACKEND */
    struct {
        uint64_t hit, loaded, backed_up, backup_skipped, evicted;
    } count; /* tokens */
};

static struct host_tier *ht(const struct tier *t)
{
    return (struct host_tier *)t;
}

static struct rdx_tree *tree_of(const struct host_tier *h)
{
    return *h->tree;
}

static uint64_t op_tag(enum xfer_dir dir, uint64_t id)
{
    return dir == XFER_BACKUP ? RDX_OP_BACKUP | id : id;
}

static void host_release(struct tier *t, const uint32_t *pages, size_t n)
{
    struct host_tier *h = ht(t);

    host_free(&h->pool, pages, n);
    h->count.evicted += n * h->opts->page_size;
}

/* ---- the op queues ---- */

static int queue_reserve(struct op_queue *q)
{
    if (q->n < q->cap)
        return 0;
    size_t ncap = q->cap ? q->cap * 2 : 64;
    struct pending_op *v = malloc(ncap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < q->n; i++)
        v[i] = q->v[(q->head + i) % q->cap];
    free(q->v);
    q->v = v;
    q->head = 0;
    q->cap = ncap;
    return 0;
}

static void queue_push(struct op_queue *q, uint64_t id, kvt_node_ref node)
{
    q->v[(q->head + q->n++) % q->cap] = (struct pending_op){id, node};
    q->last_id = id;
}

/* Submit an op whose id the tree already carries: ids are predictable (one more than the
 * last per direction), so the nodes are marked before the bytes start to move. */
static int submit(struct host_tier *h, enum xfer_dir dir, const uint32_t *dev_pages,
                  const uint32_t *swa_pages, const uint32_t *host_pages, size_t n,
                  kvt_node_ref node)
{
    struct op_queue *q = &h->ops[dir];
    uint64_t id;
    int rc = xfer_submit_swa(h->xfer, dir, dev_pages, swa_pages, host_pages, n, NULL, &id);

    if (rc)
        return rc;
    if (id != q->last_id + 1)
        return -EUCLEAN; /* cannot happen: the tier is the only submitter */
    queue_push(q, id, node);
    return 0;
}

/* ---- completions ---- */

/* Apply finished ops of dir, at most max; returns how many. */
static size_t apply(struct host_tier *h, enum xfer_dir dir, size_t max)
{
    struct op_queue *q = &h->ops[dir];
    struct tier *below = h->base.below;
    uint64_t done = xfer_done(h->xfer, dir);
    size_t applied = 0;

    while (q->n && applied < max && q->v[q->head].id <= done) {
        struct pending_op *p = &q->v[q->head];
        int status = xfer_status(h->xfer, dir, p->id);
        /* A copy the backend failed (a CUDA error; sim copies cannot fail) leaves a load's
         * device pages with unknown bytes, and a failed backup would leave host copies of
         * later backups below a node that lost its own. Either way: stop serving. */
        if (status)
            h->failed = KVT_EBACKEND;
        rdx_op_done(tree_of(h), p->node, op_tag(dir, p->id), status != 0);
        if (dir == XFER_BACKUP && status == 0 && below)
            below->ops->copied_above(below, p->node);
        q->head = (q->head + 1) % q->cap;
        q->n--;
        applied++;
    }
    return applied;
}

static size_t host_poll(struct tier *t, size_t max)
{
    struct host_tier *h = ht(t);
    size_t n = apply(h, XFER_LOAD, max);

    n += apply(h, XFER_BACKUP, max - n);
    return n + tier_poll(t->below, max - n);
}

/* The device's page moves in flight landed and applied: what device eviction waits for. The
 * writes below that applied backups start go on. */
static void host_settle(struct tier *t)
{
    struct host_tier *h = ht(t);

    for (int d = XFER_LOAD; d <= XFER_BACKUP; d++)
        if (h->ops[d].n)
            xfer_wait(h->xfer, (enum xfer_dir)d, h->ops[d].last_id);
    host_poll(t, SIZE_MAX);
}

static void host_sync(struct tier *t)
{
    host_settle(t); /* applied backups may start writes below */
    tier_sync(t->below);
    host_poll(t, SIZE_MAX);
}

static bool host_busy(const struct tier *t)
{
    return ht(t)->ops[XFER_LOAD].n || ht(t)->ops[XFER_BACKUP].n;
}

static int host_failed(const struct tier *t)
{
    return ht(t)->failed;
}

/* ---- room ---- */

/* Evict host leaves for pages host pages: through the tier below when it keeps what the host
 * evicts (written first, then evicted), else plainly. */
static size_t evict_pages(struct tier *t, size_t pages)
{
    struct rdx_tree *tree = tree_of(ht(t));
    size_t done = 0;

    if (tier_wants_evicted(t->below))
        done = tier_evict_storing(t->below, tree, rdx_evict_host_written, pages);
    if (done < pages)
        done += rdx_evict_host(tree, pages - done);
    return done;
}

/* n host pages into pages, applying finished transfers and then evicting host leaves when
 * there is no room: 0 or -ENOMEM. */
static int alloc_pages(struct host_tier *h, size_t n, uint32_t *pages)
{
    size_t avail;

    if (host_available(&h->pool) < n)
        host_poll(&h->base, SIZE_MAX);
    if ((avail = host_available(&h->pool)) < n)
        evict_pages(&h->base, n - avail);
    return host_alloc(&h->pool, n, pages);
}

/* ---- backups ---- */

/* Start a backup of node's chain; 1 when one was started, 0 when not (nothing to copy, no
 * host room, or no memory for the op). */
static int backup(struct host_tier *h, kvt_node_ref node)
{
    struct op_queue *q = &h->ops[XFER_BACKUP];
    uint64_t tag = op_tag(XFER_BACKUP, q->last_id + 1);
    struct rdx_tree *tree = tree_of(h);
    size_t n = 0;

    if (rdx_backup_span(tree, node, &n) || n == 0 || queue_reserve(q))
        return 0;
    if (alloc_pages(h, n, h->bk_host)) {
        h->count.backup_skipped += n * h->opts->page_size;
        return 0;
    }
    if (rdx_attach_host(tree, node, h->bk_host, n, h->bk_dev, tag)) {
        host_free(&h->pool, h->bk_host, n);
        return 0;
    }
    /* The SWA peer of each page, as it stands now: a node's pages hold SWA KV all or none
     * (rdx_attach_host recorded which), and SWA eviction leaves them while this runs. */
    for (size_t i = 0; h->swa && i < n; i++)
        h->bk_swa[i] = h->swa->peer[h->bk_dev[i]];
    if (submit(h, XFER_BACKUP, h->bk_dev, h->swa ? h->bk_swa : NULL, h->bk_host, n, node)) {
        /* Undo: the tree drops the host copies it was given, freeing the pages. */
        rdx_op_done(tree, node, tag, 1);
        return 0;
    }
    h->count.backed_up += n * h->opts->page_size;
    return 1;
}

static int host_store(struct tier *t, kvt_node_ref node)
{
    return backup(ht(t), node);
}

static void host_inserted(struct tier *t, kvt_node_ref node)
{
    if (ht(t)->opts->write_policy == KVT_WRITE_THROUGH)
        backup(ht(t), node);
}

static void host_hit(struct tier *t, kvt_node_ref node)
{
    struct host_tier *h = ht(t);
    uint32_t hits = 0;

    if (h->opts->write_policy == KVT_WRITE_THROUGH_SELECTIVE &&
        rdx_hit_count(tree_of(h), node, &hits) == 0 && hits >= h->opts->write_threshold)
        backup(h, node);
}

static void host_copied_above(struct tier *t, kvt_node_ref node)
{
    (void)t; /* the host tier is the first below the device: nothing is above it but that */
    (void)node;
}

static bool host_wants_evicted(const struct tier *t)
{
    return ht(t)->opts->write_policy == KVT_WRITE_BACK;
}

/* ---- load-back ---- */

/* With sliding-window layers: the pages of a load whose nodes' host copies hold the SWA
 * layers (rdx_swa_load_mask), by position: how many, or an error. */
static int load_mask(struct host_tier *h, kvt_node_ref last, size_t n, size_t *k)
{
    int rc = rdx_swa_load_mask(tree_of(h), last, n, h->ld_mask);

    *k = 0;
    for (size_t i = 0; rc == 0 && i < n; i++)
        *k += h->ld_mask[i];
    return rc;
}

/* SWA pages for those of the load's device pages, into ld_swa (0 for the rest). 0 or
 * -ENOMEM, taking nothing. */
static int pair_load(struct host_tier *h, size_t n)
{
    size_t k = 0;
    int rc;

    for (size_t i = 0; i < n; i++)
        if (h->ld_mask[i])
            h->ld_pair[k++] = h->dev_pages[i];
    if ((rc = swa_give_peers(h->swa, h->ld_pair, k)))
        return rc;
    for (size_t i = 0; i < n; i++)
        h->ld_swa[i] = h->swa->peer[h->dev_pages[i]];
    return 0;
}

static int host_load(struct tier *t, const struct rdx_hit *hit, const uint32_t *pages,
                     int32_t *slots, uint64_t *op)
{
    struct host_tier *h = ht(t);
    struct op_queue *q = &h->ops[XFER_LOAD];
    struct rdx_tree *tree = tree_of(h);
    uint32_t ps = h->opts->page_size;
    size_t n = hit->host_pages, tokens = n * ps, k = 0;
    int rc;

    if (n == 0 || tokens < h->opts->load_back_min || queue_reserve(q))
        return 1;
    if (h->swa && load_mask(h, hit->host_last, n, &k))
        return 1;
    /* The device prefix is locked by the caller, so making room cannot take it. With
     * sliding-window layers the full pages are taken alone (SWA tombstones) and pair_load
     * pairs the k whose SWA layers the host kept. */
    if (t->up.room(t->up.ctx, n, k) || slot_alloc(h->alloc, tokens, slots))
        return 1;
    slot_pages_of(h->alloc, slots, tokens, h->dev_pages);
    if (h->swa && pair_load(h, n)) {
        slot_free(h->alloc, slots, tokens);
        return 1;
    }
    slot_claim(h->alloc, h->dev_pages, n);
    uint64_t id = q->last_id + 1;
    if ((rc = rdx_attach_device(tree, hit->host_last, h->dev_pages, n, id)))
        goto undo_claim;
    /* The match gave the host pages; the op copies them in the same order. */
    if ((rc = submit(h, XFER_LOAD, h->dev_pages, h->swa ? h->ld_swa : NULL, pages, n,
                     hit->host_last)))
        goto undo_attach;
    rdx_lock(tree, hit->host_last);
    rdx_unlock(tree, hit->dev_last);
    h->count.loaded += tokens;
    *op = id;
    return 0;
undo_attach:
    rdx_op_done(tree, hit->host_last, id, 1); /* gives the device pages back, peers too */
    return rc;
undo_claim:
    slot_unclaim(h->alloc, h->dev_pages, n);
    if (h->swa)
        swa_release_swa(h->swa, h->dev_pages, n);
    slot_free(h->alloc, slots, tokens);
    return rc;
}

static int host_wait_layer(struct tier *t, uint64_t op, uint32_t layer, void *stream)
{
    struct host_tier *h = ht(t);
    int rc;

    if (op > h->ops[XFER_LOAD].last_id)
        return -EINVAL;
    if (op == 0)
        return 0;
    rc = xfer_wait_layer(h->xfer, op, layer, stream);
    if (rc == 0 && xfer_done(h->xfer, XFER_LOAD) >= op)
        rc = xfer_status(h->xfer, XFER_LOAD, op);
    return rc && rc != -EINPROGRESS ? KVT_EBACKEND : 0;
}

static uint64_t host_pending_load(const struct tier *t, uint64_t op)
{
    return op > xfer_done(ht(t)->xfer, XFER_LOAD) ? op : 0;
}

/* ---- matching: the host part is the tree's; what is past it, the tiers below have ---- */

static size_t host_find(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit)
{
    return tier_find(t->below, key, hit);
}

static void host_matched(struct tier *t, const struct rdx_hit *hit, size_t found)
{
    ht(t)->count.hit += hit->host_pages * ht(t)->opts->page_size;
    tier_matched(t->below, hit, found);
}

static int host_fetch(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit,
                      size_t n, size_t window, size_t *reading)
{
    if (reading)
        *reading = 0;
    return t->below ? t->below->ops->fetch(t->below, key, hit, n, window, reading) : 1;
}

static size_t host_window(struct tier *t, size_t n, bool above, size_t *window)
{
    *window = 0;
    return t->below && t->below->ops->window ? t->below->ops->window(t->below, n, above, window)
                                             : 0;
}

static bool host_fetching(const struct tier *t)
{
    return t->below && t->below->ops->fetching(t->below);
}

static void host_wait_fetches(struct tier *t, int timeout_ms)
{
    if (t->below)
        t->below->ops->wait_fetches(t->below, timeout_ms);
}

/* ---- what the host offers the tier below ---- */

/* A fill's parent needs a host copy (host copies grow from the top). */
static int up_hold(void *ctx, kvt_node_ref node)
{
    struct host_tier *h = ctx;
    size_t span = 0;

    if (rdx_backup_span(tree_of(h), node, &span))
        return 0;
    return span == 0 || backup(h, node);
}

static int up_alloc(void *ctx, size_t n, uint32_t *pages)
{
    return alloc_pages(ctx, n, pages);
}

static void up_free(void *ctx, const uint32_t *pages, size_t n)
{
    host_free(&((struct host_tier *)ctx)->pool, pages, n);
}

static void *up_addr(void *ctx, uint32_t page)
{
    return host_pool_rows(&((struct host_tier *)ctx)->pool, page, 0, 0); /* the page's start */
}

struct tier_up host_tier_up(struct tier *t)
{
    return (struct tier_up){
        .ctx = t, .hold = up_hold, .alloc = up_alloc, .free = up_free, .addr = up_addr};
}

const struct host_pool *host_tier_pool(const struct tier *t)
{
    return &ht(t)->pool;
}

struct xfer_engine *host_tier_xfer(const struct tier *t)
{
    return ht(t)->xfer;
}

uint64_t host_tier_last_op(const struct tier *t, int dir)
{
    return ht(t)->ops[dir].last_id;
}

int host_tier_set_xfer(struct tier *t, const struct xfer_config *xc)
{
    struct host_tier *h = ht(t);

    struct xfer_config c = xc ? *xc : (struct xfer_config){0};

    xfer_destroy(h->xfer);
    h->xfer = NULL;
    c.swa = h->swa_pool; /* the engine's pools, whatever the seam's config says */
    return xfer_create(h->kv, &h->pool, &c, &h->xfer);
}

/* ---- stats, checks, closing ---- */

static void host_stats(const struct tier *t, struct kvt_stats *st)
{
    const struct host_tier *h = ht(t);
    uint32_t ps = h->opts->page_size;
    struct rdx_sizes s;

    rdx_sizes(tree_of(h), &s);
    st->host_tokens = (uint64_t)h->pool.npages * ps;
    st->host_free_tokens = host_available(&h->pool) * ps;
    st->host_cached_tokens = s.host_pages * ps;
    st->host_pinned = h->pool.pinned;
    st->host_hit_tokens = h->count.hit;
    st->loaded_tokens = h->count.loaded;
    st->backed_up_tokens = h->count.backed_up;
    st->backup_skipped_tokens = h->count.backup_skipped;
    st->host_evicted_tokens = h->count.evicted;
    st->h2d_bytes = xfer_bytes(h->xfer, XFER_LOAD);
    st->d2h_bytes = xfer_bytes(h->xfer, XFER_BACKUP);
    st->ops_in_flight = h->ops[0].n + h->ops[1].n;
}

static uint32_t host_tree_pages(const struct tier *t)
{
    return ht(t)->pool.npages;
}

static int host_check(const struct tier *t, const uint8_t *held, char *why, size_t len)
{
    const struct host_pool *hp = &ht(t)->pool;

    for (uint32_t p = 0; p < hp->npages; p++) {
        if ((hp->state[p] == HOST_PAGE_USED) != (held[p] == 1)) {
            snprintf(why, len, "host page %u: allocator state %d, held by %u nodes", p,
                     hp->state[p], held[p]);
            return -EUCLEAN;
        }
    }
    return 0;
}

/* Every transfer lands before the memory it targets goes. */
static void host_stop(struct tier *t)
{
    xfer_destroy(ht(t)->xfer);
    ht(t)->xfer = NULL;
}

/* After the tree is gone, which handed its host pages back. */
static void host_close(struct tier *t)
{
    struct host_tier *h = ht(t);

    if (h->xfer)
        host_stop(t);
    for (int d = 0; d < 2; d++)
        free(h->ops[d].v);
    free(h->dev_pages);
    free(h->bk_host);
    free(h->bk_dev);
    free(h->ld_swa);
    free(h->bk_swa);
    free(h->ld_pair);
    free(h->ld_mask);
    host_pool_finish(&h->pool);
    free(h);
}

static const struct tier_ops host_ops = {
    .name = "host",
    .find = host_find,
    .matched = host_matched,
    .fetch = host_fetch,
    .window = host_window,
    .fetching = host_fetching,
    .wait_fetches = host_wait_fetches,
    .load = host_load,
    .wait_layer = host_wait_layer,
    .pending_load = host_pending_load,
    .inserted = host_inserted,
    .hit = host_hit,
    .copied_above = host_copied_above,
    .store = host_store,
    .wants_evicted = host_wants_evicted,
    .poll = host_poll,
    .sync = host_sync,
    .settle = host_settle,
    .busy = host_busy,
    .failed = host_failed,
    .stats = host_stats,
    .release = host_release,
    .tree_pages = host_tree_pages,
    .check = host_check,
    .stop = host_stop,
    .close = host_close,
};

/* ---- open ---- */

/* Host pages: host_tokens, else host_bytes, else host_ratio x device; 0: no host tier. */
static uint64_t pages_wanted(const struct kvt_options *o, uint64_t device_tokens)
{
    uint64_t cell = kvt_cell_bytes(&o->geometry), tokens = o->host_tokens;

    if (tokens == 0 && o->host_bytes && cell)
        tokens = o->host_bytes / cell;
    if (tokens == 0 && o->host_ratio > 0)
        tokens = (uint64_t)(o->host_ratio * (double)device_tokens);
    return tokens / o->page_size;
}

static int check_options(const struct kvt_options *o)
{
    if (o->host_ratio < 0 || o->host_ratio != o->host_ratio ||
        o->host_layout > KVT_HOST_LAYER_FIRST || o->write_policy > KVT_WRITE_BACK ||
        o->io > KVT_IO_DMA)
        return -EINVAL;
    return 0;
}

static int open_parts(struct host_tier *h, const struct host_tier_config *c, uint64_t pages)
{
    const struct kvt_options *o = c->opts;
    int rc;

    if ((rc = host_pool_init(&h->pool, c->be, &o->geometry, o->page_size, pages, o->host_layout)))
        return rc;
    h->dev_pages = malloc(c->scratch_pages * sizeof(uint32_t));
    h->bk_host = malloc(c->scratch_pages * sizeof(uint32_t));
    h->bk_dev = malloc(c->scratch_pages * sizeof(uint32_t));
    if (!h->dev_pages || !h->bk_host || !h->bk_dev)
        return -ENOMEM;
    if (c->swa) {
        h->ld_swa = malloc(c->scratch_pages * sizeof(uint32_t));
        h->bk_swa = malloc(c->scratch_pages * sizeof(uint32_t));
        h->ld_pair = malloc(c->scratch_pages * sizeof(uint32_t));
        h->ld_mask = malloc(c->scratch_pages);
        if (!h->ld_swa || !h->bk_swa || !h->ld_pair || !h->ld_mask)
            return -ENOMEM;
    }
    /* Loads on a high-priority stream: the forward waits for them layer by layer. */
    struct xfer_config xc = {
        .io = o->io, .serial = o->sim_serial != 0, .swa = c->swa_pool, .high_priority_loads = true};
    return xfer_create(c->kv, &h->pool, &xc, &h->xfer);
}

int host_tier_open(const struct host_tier_config *c, struct tier_up up, struct tier **out)
{
    const struct kvt_options *o = c->opts;
    uint64_t pages = pages_wanted(o, c->device_tokens);
    struct host_tier *h;
    int rc;

    *out = NULL;
    if ((rc = check_options(o)))
        return rc;
    if (pages == 0 && !o->host_tokens && !o->host_bytes && !o->host_ratio)
        return 0;
    if (pages * o->page_size <= c->device_tokens)
        return KVT_EHOSTSIZE;
    if (pages >= UINT32_MAX)
        return -EINVAL;
    if (!(h = calloc(1, sizeof(*h))))
        return -ENOMEM;
    h->base = (struct tier){.ops = &host_ops, .up = up};
    h->opts = o;
    h->tree = c->tree;
    h->alloc = c->alloc;
    h->kv = c->kv;
    h->swa = c->swa;
    h->swa_pool = c->swa_pool;
    if ((rc = open_parts(h, c, pages))) {
        host_close(&h->base);
        return rc;
    }
    *out = &h->base;
    return 0;
}
