/*
 * The transfer engine (see transfer.h): the part both backends share (see xfer_int.h for the
 * split). Both backends follow one copy plan: an op's page list is cut into runs where device
 * and host page numbers both climb by one, and each run moves per layer and per K/V in as few
 * copies as the host layout allows; a sliding-window model's layer runs over the pages of its
 * own pool (full or SWA), skipping the pages with no SWA page. They differ in who runs the
 * plan: a worker thread with memcpy (xfer_sim.c), or the CUDA stream it is enqueued on
 * (xfer_cuda.c), which may also skip the plan for its gather/scatter kernels.
 *
 * Locking is described in xfer_int.h.
 */
#include "transfer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"
#include "device/swa_pool.h"
#include "xfer_int.h"

/* The backends this build has; the device pool's kind picks one. */
static const struct xfer_backend *const backends[] = {
    &xfer_backend_sim,
#ifdef KVT_HAVE_CUDA
    &xfer_backend_cuda,
#endif
};

/* ---- the copy plan, shared by both backends ---- */

/* Length of the run from i where dev[] and host[] both climb by one. */
static size_t run_len(const uint32_t *dev, const uint32_t *host, size_t n, size_t i)
{
    size_t r = 1;

    while (i + r < n && dev[i + r] == dev[i] + r && host[i + r] == host[i] + r)
        r++;
    return r;
}

size_t xfer_run_len(const struct xfer_op *op, size_t i)
{
    return run_len(op->dev_pages, op->host_pages, op->n, i);
}

/* One model layer on the device: the pool that holds it and its layer there. */
struct dev_layer {
    const struct kv_pool *pool;
    uint32_t index; /* the layer in pool */
    uint32_t layer; /* the model layer, as the host pool numbers it */
};

static int copy_span(struct xfer_stream *s, xfer_copy_fn copy, uint8_t *dev, uint8_t *host,
                     size_t n)
{
    return s->dir == XFER_LOAD ? copy(s, dev, host, n) : copy(s, host, dev, n);
}

/* K (w 0) or V (w 1) of one layer for r pages from device page d and host page h. The device
 * side of a run is always one span; the host side only in layer_first, since page_first puts
 * the other layers of a page between two pages' rows of this layer. */
static int copy_run(struct xfer_stream *s, xfer_copy_fn copy, const struct dev_layer *dl,
                    uint32_t d, uint32_t h, size_t r, int w)
{
    const struct xfer_engine *x = s->x;
    size_t span = (size_t)x->page_size * dl->pool->row_bytes[w];
    uint8_t *dev = (uint8_t *)dl->pool->buf[w][dl->index] + (size_t)d * span;
    int rc = 0;

    if (x->host_contiguous)
        return copy_span(s, copy, dev, host_pool_rows(x->host, h, dl->layer, w), r * span);
    for (size_t i = 0; i < r && !rc; i++)
        rc = copy_span(s, copy, dev + i * span, host_pool_rows(x->host, h + i, dl->layer, w), span);
    return rc;
}

/* One layer of op's pages, dev[i] paired with host page i. A page whose dev[i] is 0 has no
 * rows in this pool (an SWA page never given, or whose window passed) and is skipped; a run
 * starts at a nonzero page and climbs, so it holds none. */
static int copy_pages(struct xfer_stream *s, xfer_copy_fn copy, const struct dev_layer *dl,
                      const uint32_t *dev, const struct xfer_op *op)
{
    int rc = 0;

    for (size_t i = 0; i < op->n && !rc;) {
        size_t r = dev[i] ? run_len(dev, op->host_pages, op->n, i) : 1;

        for (int w = 0; w < 2 && dev[i] && !rc; w++)
            if (dl->pool->row_bytes[w])
                rc = copy_run(s, copy, dl, dev[i], op->host_pages[i], r, w);
        i += r;
    }
    return rc;
}

int xfer_copy_layer(struct xfer_stream *s, xfer_copy_fn copy, const struct xfer_op *op,
                    uint32_t layer)
{
    const struct xfer_engine *x = s->x;
    struct dev_layer dl = {.pool = x->dev, .index = layer, .layer = layer};
    int is_swa = 0;

    if (x->swa && swa_pool_layer(x->swa, layer, &is_swa, &dl.index))
        return -EINVAL; /* a layer past the model's: not one the backends ask for */
    if (!is_swa)
        return copy_pages(s, copy, &dl, op->dev_pages, op);
    dl.pool = &x->swa->swa;
    return op->swa_pages ? copy_pages(s, copy, &dl, op->swa_pages, op) : 0;
}

/* ---- the op list, completion and layer marks, shared ---- */

void xfer_push_locked(struct xfer_stream *s, struct xfer_op *op)
{
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
}

struct xfer_op *xfer_pop_locked(struct xfer_stream *s)
{
    struct xfer_op *op = s->head;

    if (op) {
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
    }
    return op;
}

/* The watermark never moves back, since cuda's failure path may have pushed it past ops whose
 * callbacks come later. */
void xfer_complete_locked(struct xfer_stream *s, uint64_t id, uint64_t bytes, int rc)
{
    if (rc && !s->err) {
        s->err = rc;
        s->err_id = id;
    }
    if (!rc)
        atomic_fetch_add_explicit(&s->bytes, bytes, memory_order_relaxed);
    if (id > atomic_load_explicit(&s->done, memory_order_relaxed))
        atomic_store_explicit(&s->done, id, memory_order_release);
    pthread_cond_broadcast(&s->progress);
}

void xfer_layers_begin_locked(struct xfer_stream *s, uint64_t id)
{
    s->cur_id = id;
    s->cur_layers = 0;
}

void xfer_layers_landed(struct xfer_stream *s, uint32_t landed)
{
    pthread_mutex_lock(&s->lock);
    s->cur_layers = landed;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->lock);
}

/* Under the lock: status of every op up to id (see xfer_status). */
static int status_locked(const struct xfer_stream *s, uint64_t id)
{
    if (id > atomic_load_explicit(&s->done, memory_order_relaxed))
        return -EINPROGRESS;
    return s->err && s->err_id <= id ? s->err : 0;
}

static bool load_layer_landed(const struct xfer_stream *s, uint64_t id, uint32_t layer)
{
    return atomic_load_explicit(&s->done, memory_order_relaxed) >= id ||
           (s->cur_id == id && s->cur_layers > layer);
}

/* ---- setup ---- */

/* The backend for the device pool's kind; NULL when this build has none (cuda without CUDA). */
static const struct xfer_backend *find_backend(uint32_t kind)
{
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
        if (backends[i]->kind == kind)
            return backends[i];
    return NULL;
}

/* A sliding-window model's pools: dev is the full pool, and a host page holds every model
 * layer, each at the rows of both pools. */
static bool swa_fits(const struct kv_pool *dev, const struct host_pool *host,
                     const struct swa_pool *swa)
{
    return dev == &swa->full && swa->swa.be == dev->be && host->layers == swa->layers &&
           host->row[0] == swa->swa.row_bytes[0] && host->row[1] == swa->swa.row_bytes[1];
}

/* The device and host pools must agree on everything a page copy relies on. */
static int check_pools(const struct kv_pool *dev, const struct host_pool *host,
                       const struct swa_pool *swa)
{
    const struct xfer_backend *be;

    if (!dev || !host || !dev->be || !host->page_size)
        return -EINVAL;
    if (swa ? !swa_fits(dev, host, swa) : host->layers != dev->geo.layers)
        return -EINVAL;
    if (host->row[0] != dev->row_bytes[0] || host->row[1] != dev->row_bytes[1])
        return -EINVAL;
    if (host->layout != HOST_PAGE_FIRST && host->layout != HOST_LAYER_FIRST)
        return -EINVAL;
    be = find_backend(dev->be->kind);
    if (!be || (swa && !be->two_pools))
        return KVT_ENOBACKEND;
    return 0;
}

static int stream_init(struct xfer_engine *x, enum xfer_dir dir)
{
    struct xfer_stream *s = &x->s[dir];
    pthread_condattr_t ca;
    int rc = 0;

    s->x = x;
    s->dir = dir;
    /* Monotonic, so cuda's timed waits do not jump with the wall clock. */
    if (pthread_condattr_init(&ca))
        return -ENOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&s->lock, NULL))
        rc = -ENOMEM;
    else if (pthread_cond_init(&s->progress, &ca))
        rc = -ENOMEM;
    pthread_condattr_destroy(&ca);
    if (rc)
        return rc; /* a half-made stream is not destroyed: pthread objects cannot leak memory */
    s->inited = true;
    rc = x->be->start(s);
    s->started = rc == 0;
    return rc;
}

static struct xfer_engine *engine_new(const struct xfer_backend *be, struct kv_pool *dev,
                                      struct host_pool *host, const struct xfer_config *cfg)
{
    struct xfer_engine *x = calloc(1, be->engine_size);

    if (!x)
        return NULL;
    x->be = be;
    x->dev = dev;
    x->host = host;
    if (cfg)
        x->cfg = *cfg;
    x->layers = host->layers;
    x->page_size = host->page_size;
    x->dev_npages = dev->rows / host->page_size;
    x->swa = cfg ? cfg->swa : NULL;
    x->swa_npages = x->swa ? x->swa->swa.rows / host->page_size : 0;
    x->page_bytes = (size_t)host->page_size * (host->row[0] + host->row[1]) * host->layers;
    x->host_contiguous = host->layout == HOST_LAYER_FIRST;
    return x;
}

int xfer_create(struct kv_pool *dev, struct host_pool *host, const struct xfer_config *cfg,
                struct xfer_engine **out)
{
    struct xfer_engine *x;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if (cfg && cfg->io > KVT_IO_DMA)
        return -EINVAL; /* sim copies one way whatever io says, yet a typo is still one */
    if ((rc = check_pools(dev, host, cfg ? cfg->swa : NULL)))
        return rc;
    x = engine_new(find_backend(dev->be->kind), dev, host, cfg);
    if (!x)
        return -ENOMEM;
    for (int d = XFER_LOAD; d <= XFER_BACKUP && !rc; d++)
        rc = stream_init(x, (enum xfer_dir)d);
    if (!rc && x->be->setup)
        rc = x->be->setup(x);
    if (rc) {
        xfer_destroy(x);
        return rc;
    }
    *out = x;
    return 0;
}

void xfer_destroy(struct xfer_engine *x)
{
    if (!x)
        return;
    for (int d = XFER_LOAD; d <= XFER_BACKUP; d++)
        if (x->s[d].started)
            x->be->stop(&x->s[d]);
    if (x->be->finish)
        x->be->finish(x); /* both streams are idle: nothing of the setup is in use */
    for (int d = XFER_LOAD; d <= XFER_BACKUP; d++) {
        struct xfer_stream *s = &x->s[d];

        if (!s->inited)
            continue;
        pthread_cond_destroy(&s->progress);
        pthread_mutex_destroy(&s->lock);
    }
    free(x);
}

/* ---- submit ---- */

static bool bad_dir(enum xfer_dir dir)
{
    return dir != XFER_LOAD && dir != XFER_BACKUP;
}

/* Device page 0 is the padding page: a copy into it would be overwritten by padding writes,
 * one out of it would back up garbage. The SWA pool's page 0 is its padding page too, so there
 * 0 means "none"; a plain engine has no SWA pages (swa_npages 0). */
static int check_pages(const struct xfer_engine *x, const uint32_t *dev_pages,
                       const uint32_t *swa_pages, const uint32_t *host_pages, size_t n)
{
    if (n && (!dev_pages || !host_pages))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (dev_pages[i] == 0 || dev_pages[i] >= x->dev_npages || host_pages[i] >= x->host->npages)
            return -EINVAL;
        if (swa_pages && swa_pages[i] && swa_pages[i] >= x->swa_npages)
            return -EINVAL;
    }
    return 0;
}

/* What op moves: every layer of each page, less the SWA layers of pages without an SWA page. */
static uint64_t op_bytes(const struct xfer_engine *x, const uint32_t *swa_pages, size_t n)
{
    uint64_t bytes = (uint64_t)n * x->page_bytes, bare = 0;

    if (!x->swa)
        return bytes;
    for (size_t i = 0; i < n; i++)
        bare += !swa_pages || !swa_pages[i];
    return bytes - bare * x->swa->swa.geo.layers * (x->page_bytes / x->layers);
}

/* The backend's op with copies of the page arrays behind it, in one allocation: dev_pages,
 * host_pages, then swa_pages where the engine has SWA layers and the caller gave them. */
static struct xfer_op *op_new(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                              const uint32_t *swa_pages, const uint32_t *host_pages, size_t n)
{
    size_t size = x->be->op_size, arrays = x->swa && swa_pages ? 3 : 2;
    struct xfer_op *op;

    if (n > (SIZE_MAX - size) / (arrays * sizeof(uint32_t)))
        return NULL;
    op = calloc(1, size + arrays * n * sizeof(uint32_t));
    if (!op)
        return NULL;
    op->s = &x->s[dir];
    op->n = n;
    op->bytes = op_bytes(x, swa_pages, n);
    op->dev_pages = (uint32_t *)((char *)op + size);
    op->host_pages = op->dev_pages + n;
    if (arrays == 3)
        op->swa_pages = op->host_pages + n;
    if (n) {
        memcpy(op->dev_pages, dev_pages, n * sizeof(uint32_t));
        memcpy(op->host_pages, host_pages, n * sizeof(uint32_t));
        if (op->swa_pages)
            memcpy(op->swa_pages, swa_pages, n * sizeof(uint32_t));
    }
    return op;
}

int xfer_submit_swa(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                    const uint32_t *swa_pages, const uint32_t *host_pages, size_t n, void *ready,
                    uint64_t *id)
{
    struct xfer_op *op;
    int rc;

    if (!x || !id || bad_dir(dir))
        return -EINVAL;
    if ((rc = check_pages(x, dev_pages, swa_pages, host_pages, n)))
        return rc;
    op = op_new(x, dir, dev_pages, swa_pages, host_pages, n);
    if (!op)
        return -ENOMEM;
    rc = x->be->submit(&x->s[dir], op, ready);
    /* Not op->id: the worker may have copied and freed the op already. */
    if (rc == 0)
        *id = x->s[dir].issued;
    return rc;
}

int xfer_submit(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                const uint32_t *host_pages, size_t n, void *ready, uint64_t *id)
{
    return xfer_submit_swa(x, dir, dev_pages, NULL, host_pages, n, ready, id);
}

/* ---- queries and waits ---- */

uint64_t xfer_done(struct xfer_engine *x, enum xfer_dir dir)
{
    if (!x || bad_dir(dir))
        return 0;
    return atomic_load_explicit(&x->s[dir].done, memory_order_acquire);
}

/* The stream of dir, locked, when op id was issued on it; NULL otherwise. */
static struct xfer_stream *lock_issued(struct xfer_engine *x, enum xfer_dir dir, uint64_t id)
{
    if (!x || bad_dir(dir) || id > x->s[dir].issued)
        return NULL;
    pthread_mutex_lock(&x->s[dir].lock);
    return &x->s[dir];
}

int xfer_status(struct xfer_engine *x, enum xfer_dir dir, uint64_t id)
{
    struct xfer_stream *s = lock_issued(x, dir, id);
    int rc;

    if (!s)
        return -EINVAL;
    rc = status_locked(s, id);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int xfer_wait(struct xfer_engine *x, enum xfer_dir dir, uint64_t id)
{
    struct xfer_stream *s = lock_issued(x, dir, id);
    int rc;

    if (!s)
        return -EINVAL;
    while (atomic_load_explicit(&s->done, memory_order_relaxed) < id)
        x->be->wait_progress(s);
    rc = status_locked(s, id);
    pthread_mutex_unlock(&s->lock);
    if (x->be->reap)
        x->be->reap(s);
    return rc;
}

int xfer_wait_layer(struct xfer_engine *x, uint64_t id, uint32_t layer, void *stream)
{
    struct xfer_stream *s;
    int rc;

    if (!x || id == 0 || id > x->s[XFER_LOAD].issued || layer >= x->layers)
        return -EINVAL;
    s = &x->s[XFER_LOAD];
    if (x->be->wait_layer && xfer_done(x, XFER_LOAD) < id)
        return x->be->wait_layer(s, id, layer, stream);
    pthread_mutex_lock(&s->lock);
    while (!load_layer_landed(s, id, layer))
        x->be->wait_progress(s);
    /* A done op answers for itself; a layer that landed mid-op has no error to report,
     * since a failed copy stops the op before its layer is marked. */
    rc = atomic_load_explicit(&s->done, memory_order_relaxed) >= id ? status_locked(s, id) : 0;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

uint64_t xfer_bytes(const struct xfer_engine *x, enum xfer_dir dir)
{
    if (!x || bad_dir(dir))
        return 0;
    return atomic_load_explicit(&x->s[dir].bytes, memory_order_relaxed);
}

void xfer_path_ops(const struct xfer_engine *x, uint64_t *kernel_ops, uint64_t *dma_ops)
{
    *kernel_ops = x ? x->path_ops[0] : 0;
    *dma_ops = x ? x->path_ops[1] : 0;
}
