/*
 * The host tier's side of the engine: backups after insert, load-back at request start,
 * room under device pressure, and applying finished transfers in kvt_poll.
 *
 * The tree records what each transfer fills (rdx_attach_*), the transfer engine moves the
 * bytes, and a FIFO per direction remembers which node each op covers. Ops of one direction
 * finish in order, so applying them is walking the FIFO up to the direction's watermark.
 */
#include "engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t op_tag(enum xfer_dir dir, uint64_t id)
{
    return dir == XFER_BACKUP ? RDX_OP_BACKUP | id : id;
}

void tiers_release_host_pages(void *ctx, const uint32_t *pages, size_t n)
{
    kvt_engine *e = ctx;

    host_free(&e->host, pages, n);
    e->count.host_evicted_tokens += n * e->opts.page_size;
}

/* Host pages: host_tokens, else host_bytes, else host_ratio x device; 0: no host tier. */
static uint64_t host_pages_wanted(const kvt_engine *e, uint64_t device_tokens)
{
    const struct kvt_options *o = &e->opts;
    uint64_t cell = kvt_cell_bytes(&o->geometry), tokens = o->host_tokens;

    if (tokens == 0 && o->host_bytes && cell)
        tokens = o->host_bytes / cell;
    if (tokens == 0 && o->host_ratio > 0)
        tokens = (uint64_t)(o->host_ratio * (double)device_tokens);
    return tokens / o->page_size;
}

int tiers_open(kvt_engine *e, uint64_t device_tokens)
{
    uint64_t pages = host_pages_wanted(e, device_tokens);
    size_t scratch = (size_t)e->opts.max_context / e->opts.page_size + 1;
    int rc;

    if (e->opts.host_ratio < 0 || e->opts.host_ratio != e->opts.host_ratio ||
        e->opts.host_layout > KVT_HOST_LAYER_FIRST || e->opts.write_policy > KVT_WRITE_BACK ||
        e->opts.io > KVT_IO_DMA)
        return -EINVAL;
    if (pages == 0 && !e->opts.host_tokens && !e->opts.host_bytes && !e->opts.host_ratio)
        return 0;
    if (pages * e->opts.page_size <= device_tokens)
        return KVT_EHOSTSIZE;
    if (pages >= UINT32_MAX)
        return -EINVAL;
    if ((rc = host_pool_init(&e->host, e->be, &e->opts.geometry, e->opts.page_size, pages,
                             e->opts.host_layout)))
        return rc;
    e->has_host = 1;
    e->host_pages = malloc(scratch * sizeof(uint32_t));
    e->dev_pages = malloc(scratch * sizeof(uint32_t));
    e->bk_host = malloc(scratch * sizeof(uint32_t));
    e->bk_dev = malloc(scratch * sizeof(uint32_t));
    if (!e->host_pages || !e->dev_pages || !e->bk_host || !e->bk_dev)
        return -ENOMEM;
    struct xfer_config xc = {.io = e->opts.io, .serial = e->opts.sim_serial != 0};
    return xfer_create(&e->kv, &e->host, &xc, &e->xfer);
}

void tiers_close(kvt_engine *e)
{
    /* Every transfer lands before the memory it targets goes. */
    xfer_destroy(e->xfer);
    e->xfer = NULL;
    for (int d = 0; d < 2; d++)
        free(e->ops[d].v);
    free(e->host_pages);
    free(e->dev_pages);
    free(e->bk_host);
    free(e->bk_dev);
}

/* Called after the tree is gone, which handed its host pages back. */
void tiers_close_pool(kvt_engine *e)
{
    if (e->has_host)
        host_pool_finish(&e->host);
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
static int submit(kvt_engine *e, enum xfer_dir dir, const uint32_t *dev_pages,
                  const uint32_t *host_pages, size_t n, kvt_node_ref node)
{
    struct op_queue *q = &e->ops[dir];
    uint64_t id;
    int rc = xfer_submit(e->xfer, dir, dev_pages, host_pages, n, NULL, &id);

    if (rc)
        return rc;
    if (id != q->last_id + 1)
        return -EUCLEAN; /* cannot happen: the engine is the only submitter */
    queue_push(q, id, node);
    return 0;
}

/* ---- backups ---- */

int tiers_host_alloc(kvt_engine *e, size_t n, uint32_t *pages)
{
    if (host_available(&e->host) < n)
        kvt_poll(e, 0, NULL);
    size_t avail = host_available(&e->host);
    if (avail < n && e->disk && e->opts.disk_write_policy == KVT_DISK_WRITE_ON_EVICT)
        disk_evict_host(e, n - avail);
    else if (avail < n)
        rdx_evict_host(e->tree, n - avail);
    return host_alloc(&e->host, n, pages);
}

/* Start a backup of node's chain; 1 when one was started, 0 when not (nothing to copy, no
 * host room, or no memory for the op). */
static int backup(kvt_engine *e, kvt_node_ref node)
{
    struct op_queue *q = &e->ops[XFER_BACKUP];
    uint64_t tag = op_tag(XFER_BACKUP, q->last_id + 1);
    size_t n = 0;

    if (rdx_backup_span(e->tree, node, &n) || n == 0 || queue_reserve(q))
        return 0;
    if (tiers_host_alloc(e, n, e->bk_host)) {
        e->count.backup_skipped_tokens += n * e->opts.page_size;
        return 0;
    }
    if (rdx_attach_host(e->tree, node, e->bk_host, n, e->bk_dev, tag)) {
        host_free(&e->host, e->bk_host, n);
        return 0;
    }
    if (submit(e, XFER_BACKUP, e->bk_dev, e->bk_host, n, node)) {
        /* Undo: the tree drops the host copies it was given, freeing the pages. */
        rdx_op_done(e->tree, node, tag, 1);
        return 0;
    }
    e->count.backed_up_tokens += n * e->opts.page_size;
    return 1;
}

int tiers_backup(kvt_engine *e, kvt_node_ref node)
{
    return e->has_host ? backup(e, node) : 0;
}

void tiers_after_insert(kvt_engine *e, kvt_node_ref node)
{
    if (e->has_host && e->opts.write_policy == KVT_WRITE_THROUGH)
        backup(e, node);
}

void tiers_after_hit(kvt_engine *e, kvt_node_ref node)
{
    uint32_t hits = 0;

    if (e->has_host && e->opts.write_policy == KVT_WRITE_THROUGH_SELECTIVE &&
        rdx_hit_count(e->tree, node, &hits) == 0 && hits >= e->opts.write_threshold)
        backup(e, node);
}

/* ---- load-back ---- */

/* write_back: evict backed-up leaves by policy; those without a host copy are backed up,
 * waited for and then evicted like the rest, a bounded batch per round. What still has no
 * host copy after the rounds (no host room) is left to the plain eviction that follows. */
static size_t evict_write_back(kvt_engine *e, size_t pages)
{
    size_t done = 0, n = 0;

    for (int round = 0; round < KVT_WRITE_BACK_ROUNDS && done < pages; round++) {
        done += rdx_evict_backed_up(e->tree, pages - done, e->defer, KVT_WRITE_BACK_BATCH, &n);
        size_t started = 0;
        for (size_t i = 0; i < n; i++)
            started += backup(e, e->defer[i]);
        if (started == 0)
            break;
        kvt_sync(e);
    }
    return done;
}

size_t tiers_evict(kvt_engine *e, size_t pages)
{
    size_t done = 0;

    if (e->has_host)
        kvt_poll(e, 0, NULL);
    if (e->has_host && e->opts.write_policy == KVT_WRITE_BACK)
        done = evict_write_back(e, pages);
    if (done < pages)
        done += rdx_evict(e->tree, pages - done);
    /* Nodes a transfer is filling cannot give up their device copy yet: wait for the ops
     * in flight (they are few and short), apply them and try again. */
    if (done < pages && e->has_host && (e->ops[XFER_LOAD].n || e->ops[XFER_BACKUP].n)) {
        kvt_sync(e);
        done += rdx_evict(e->tree, pages - done);
    }
    return done;
}

/* Eviction frees every unlocked device page, waiting for transfers where it must, so what is
 * evictable now says whether it can meet the need; inside a free group the pages it frees
 * are held back, so there it cannot. Deciding first means a call that fails evicted nothing. */
int tiers_room_for(kvt_engine *e, size_t pages)
{
    struct rdx_sizes s;
    size_t nfree = e->alloc.nfree;

    if (pages <= nfree)
        return 0;
    rdx_sizes(e->tree, &s);
    if (e->alloc.in_group || pages - nfree > s.evictable_pages)
        return -ENOMEM;
    tiers_evict(e, pages - nfree);
    return pages <= e->alloc.nfree ? 0 : -ENOMEM;
}

int tiers_load_back(kvt_engine *e, const struct rdx_hit *hit, int32_t *slots, uint64_t *op)
{
    struct op_queue *q = &e->ops[XFER_LOAD];
    uint32_t ps = e->opts.page_size;
    size_t n = hit->host_pages, tokens = n * ps;
    int rc;

    if (!e->has_host || n == 0 || tokens < e->opts.load_back_min || queue_reserve(q))
        return 1;
    /* The device prefix is locked by the caller, so making room cannot take it. */
    if (tiers_room_for(e, n) || slot_alloc(&e->alloc, tokens, slots))
        return 1;
    slot_pages_of(&e->alloc, slots, tokens, e->dev_pages);
    slot_claim(&e->alloc, e->dev_pages, n);
    uint64_t id = q->last_id + 1;
    if ((rc = rdx_attach_device(e->tree, hit->host_last, e->dev_pages, n, id)))
        goto undo_claim;
    /* rdx_match_tiers gave the host pages; the op copies them in the same order. */
    if ((rc = submit(e, XFER_LOAD, e->dev_pages, e->host_pages, n, hit->host_last)))
        goto undo_attach;
    rdx_lock(e->tree, hit->host_last);
    rdx_unlock(e->tree, hit->dev_last);
    e->count.loaded_tokens += tokens;
    *op = id;
    return 0;
undo_attach:
    rdx_op_done(e->tree, hit->host_last, id, 1); /* gives the device pages back */
    return rc;
undo_claim:
    slot_unclaim(&e->alloc, e->dev_pages, n);
    slot_free(&e->alloc, slots, tokens);
    return rc;
}

/* ---- completions ---- */

/* Apply finished ops of dir, at most max; returns how many. */
static size_t apply(kvt_engine *e, enum xfer_dir dir, size_t max)
{
    struct op_queue *q = &e->ops[dir];
    uint64_t done = xfer_done(e->xfer, dir);
    size_t applied = 0;

    while (q->n && applied < max && q->v[q->head].id <= done) {
        struct pending_op *p = &q->v[q->head];
        int status = xfer_status(e->xfer, dir, p->id);
        /* A copy the backend failed (a CUDA error; sim copies cannot fail) leaves a load's
         * device pages with unknown bytes, and a failed backup would leave host copies of
         * later backups below a node that lost its own. Either way: stop serving. */
        if (status)
            e->failed = KVT_EBACKEND;
        rdx_op_done(e->tree, p->node, op_tag(dir, p->id), status != 0);
        if (dir == XFER_BACKUP && status == 0)
            disk_after_backup(e, p->node);
        q->head = (q->head + 1) % q->cap;
        q->n--;
        applied++;
    }
    return applied;
}

int kvt_poll(kvt_engine *e, size_t max, size_t *applied)
{
    size_t n = 0;

    if (!e)
        return -EINVAL;
    if (e->has_host) {
        if (max == 0)
            max = SIZE_MAX;
        n = apply(e, XFER_LOAD, max);
        n += apply(e, XFER_BACKUP, max - n);
        n += disk_poll(e, max - n);
    }
    if (applied)
        *applied = n;
    engine_publish(e);
    return e->failed;
}

int kvt_sync(kvt_engine *e)
{
    if (!e)
        return -EINVAL;
    for (int d = XFER_LOAD; e->has_host && d <= XFER_BACKUP; d++)
        if (e->ops[d].n)
            xfer_wait(e->xfer, (enum xfer_dir)d, e->ops[d].last_id);
    kvt_poll(e, 0, NULL); /* applied backups may start disk writes */
    disk_sync(e);
    return kvt_poll(e, 0, NULL);
}

int kvt_load_wait_layer(kvt_engine *e, uint64_t op, uint32_t layer, void *stream)
{
    if (!e || layer >= e->opts.geometry.layers || (op && !e->has_host) ||
        op > e->ops[XFER_LOAD].last_id)
        return -EINVAL;
    if (op == 0)
        return 0;
    int rc = xfer_wait_layer(e->xfer, op, layer, stream);
    if (rc == 0 && xfer_done(e->xfer, XFER_LOAD) >= op)
        rc = xfer_status(e->xfer, XFER_LOAD, op);
    return rc && rc != -EINPROGRESS ? KVT_EBACKEND : 0;
}

/* ---- stats and checks ---- */

void tiers_stats(const kvt_engine *e, struct kvt_stats *st)
{
    struct rdx_sizes s;
    uint32_t ps = e->opts.page_size;

    if (!e->has_host)
        return;
    rdx_sizes(e->tree, &s);
    st->host_tokens = (uint64_t)e->host.npages * ps;
    st->host_free_tokens = host_available(&e->host) * ps;
    st->host_cached_tokens = s.host_pages * ps;
    st->host_pinned = e->host.pinned;
    st->host_hit_tokens = e->count.host_hit_tokens;
    st->loaded_tokens = e->count.loaded_tokens;
    st->backed_up_tokens = e->count.backed_up_tokens;
    st->backup_skipped_tokens = e->count.backup_skipped_tokens;
    st->host_evicted_tokens = e->count.host_evicted_tokens;
    st->h2d_bytes = xfer_bytes(e->xfer, XFER_LOAD);
    st->d2h_bytes = xfer_bytes(e->xfer, XFER_BACKUP);
    st->ops_in_flight = e->ops[0].n + e->ops[1].n;
}

int tiers_check(const kvt_engine *e, const uint8_t *held, char *why, size_t why_len)
{
    for (uint32_t p = 0; e->has_host && p < e->host.npages; p++) {
        if ((e->host.state[p] == HOST_PAGE_USED) != (held[p] == 1)) {
            snprintf(why, why_len, "host page %u: allocator state %d, held by %u nodes", p,
                     e->host.state[p], held[p]);
            return -EUCLEAN;
        }
    }
    return 0;
}
