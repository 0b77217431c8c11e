/*
 * The transfer engine (see transfer.h). Both backends share the copy plan: an op's page list
 * is cut into runs where device and host page numbers both climb by one, and each run moves
 * per layer and per K/V in as few copies as the host layout allows. They differ in who runs
 * the plan: a worker thread with memcpy (sim), or the CUDA stream it is enqueued on (cuda).
 *
 * Locking: each stream has one mutex. It guards the sim queue, the load progress (the op
 * being copied and how many of its layers have landed) and the first error. The watermark
 * and the byte count are atomics written under the mutex, so waiters can test them inside
 * their predicate and the owner can read them without locking. issued is the owner thread's
 * alone.
 */
#include "transfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "kvtier.h"

struct xfer_op {
    struct xfer_op *next;
    struct xfer_stream *s;
    uint64_t id;
    uint64_t bytes; /* what the op moves, counted once it completes without error */
    size_t n;
    uint32_t *dev_pages, *host_pages; /* stored behind the struct, in the same allocation */
    int status;                       /* cuda: the first error met while enqueuing */
    bool fired;                       /* cuda: the completion callback ran (under the lock) */
#ifdef KVT_HAVE_CUDA
    cudaEvent_t *layer_ev; /* loads: recorded after each layer's copies */
#endif
};

struct xfer_stream {
    struct xfer_engine *x;
    enum xfer_dir dir;
    uint64_t issued; /* the last id handed out; owner thread only */
    _Atomic uint64_t done;
    _Atomic uint64_t bytes;
    bool inited;  /* lock and condvars exist */
    bool started; /* sim: the worker runs; cuda: the stream exists */
    pthread_mutex_t lock;
    pthread_cond_t progress; /* the watermark or a load's layer count moved */
    int err;                 /* the first error and the op it hit */
    uint64_t err_id;
    /* sim: ops queued for the worker. cuda: ops enqueued and not yet reaped, linked and
     * unlinked by the owner alone, yet under the lock, since the callback sets their fired. */
    struct xfer_op *head, *tail;
    /* sim */
    pthread_cond_t work;
    pthread_t thread;
    bool stop;
    uint64_t cur_id;     /* the op the worker is copying */
    uint32_t cur_layers; /* layers of cur_id that have landed */
    uint64_t rng;        /* the delay seam's generator; the worker's alone */
#ifdef KVT_HAVE_CUDA
    cudaStream_t cs;
#endif
};

struct xfer_engine {
    struct kv_pool *dev;
    struct host_pool *host;
    struct xfer_config cfg;
    uint32_t layers, page_size;
    uint64_t dev_npages;  /* device pages, the padding page 0 included */
    size_t page_bytes;    /* one page over every layer, K and V */
    bool host_contiguous; /* a run of host pages is one span within a layer (layer_first) */
    bool cuda;
    struct xfer_stream s[2];
};

/* Copies one span in the direction of the stream; the backend's primitive. */
typedef int (*copy_fn)(struct xfer_stream *s, void *dst, const void *src, size_t n);

/* ---- the copy plan, shared by both backends ---- */

/* Length of the run of pages starting at i whose device and host numbers both climb by one. */
static size_t run_len(const struct xfer_op *op, size_t i)
{
    size_t r = 1;

    while (i + r < op->n && op->dev_pages[i + r] == op->dev_pages[i] + r &&
           op->host_pages[i + r] == op->host_pages[i] + r)
        r++;
    return r;
}

static int copy_span(struct xfer_stream *s, copy_fn copy, uint8_t *dev, uint8_t *host, size_t n)
{
    return s->dir == XFER_LOAD ? copy(s, dev, host, n) : copy(s, host, dev, n);
}

/* K (w 0) or V (w 1) of one layer for r pages from device page d and host page h. The device
 * side of a run is always one span; the host side only in layer_first, since page_first puts
 * the other layers of a page between two pages' rows of this layer. */
static int copy_run(struct xfer_stream *s, copy_fn copy, uint32_t d, uint32_t h, size_t r,
                    uint32_t layer, int w)
{
    const struct xfer_engine *x = s->x;
    size_t span = (size_t)x->page_size * x->dev->row_bytes[w];
    uint8_t *dev = (uint8_t *)x->dev->buf[w][layer] + (size_t)d * span;
    int rc = 0;

    if (x->host_contiguous)
        return copy_span(s, copy, dev, host_pool_rows(x->host, h, layer, w), r * span);
    for (size_t i = 0; i < r && !rc; i++)
        rc = copy_span(s, copy, dev + i * span, host_pool_rows(x->host, h + i, layer, w), span);
    return rc;
}

/* Every page of op, one layer. */
static int copy_layer(struct xfer_stream *s, copy_fn copy, const struct xfer_op *op, uint32_t layer)
{
    int rc = 0;

    for (size_t i = 0; i < op->n && !rc;) {
        size_t r = run_len(op, i);

        for (int w = 0; w < 2 && !rc; w++)
            if (s->x->dev->row_bytes[w])
                rc = copy_run(s, copy, op->dev_pages[i], op->host_pages[i], r, layer, w);
        i += r;
    }
    return rc;
}

/* ---- completion and waiting, shared ---- */

/* Under the lock: op id has finished with rc. The watermark never moves back, since cuda's
 * failure path may have pushed it past ops whose callbacks come later. */
static void complete_locked(struct xfer_stream *s, uint64_t id, uint64_t bytes, int rc)
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

/* ---- sim: one worker thread per stream ---- */

static int sim_copy(struct xfer_stream *s, void *dst, const void *src, size_t n)
{
    (void)s;
    memcpy(dst, src, n);
    return 0;
}

static void sleep_us(uint32_t us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};

    while (us && nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* splitmix64: a seeded, reproducible draw for the delay seam. */
static uint64_t next_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void sim_mark_layers(struct xfer_stream *s, uint32_t landed)
{
    pthread_mutex_lock(&s->lock);
    s->cur_layers = landed;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->lock);
}

/* Layer by layer, so a load can announce each layer as it lands. */
static int sim_run(struct xfer_stream *s, const struct xfer_op *op)
{
    const struct xfer_engine *x = s->x;
    int rc = 0;

    for (uint32_t l = 0; l < x->layers && !rc; l++) {
        if (s->dir == XFER_LOAD && l)
            sleep_us(x->cfg.layer_delay_us);
        rc = copy_layer(s, sim_copy, op, l);
        if (s->dir == XFER_LOAD && !rc)
            sim_mark_layers(s, l + 1);
    }
    return rc;
}

/* The next op in FIFO order, or NULL once stopped with the queue drained. */
static struct xfer_op *sim_next(struct xfer_stream *s)
{
    struct xfer_op *op;

    pthread_mutex_lock(&s->lock);
    while (!s->head && !s->stop)
        pthread_cond_wait(&s->work, &s->lock);
    op = s->head;
    if (op) {
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->cur_id = op->id;
        s->cur_layers = 0;
    }
    pthread_mutex_unlock(&s->lock);
    return op;
}

static void *sim_worker(void *arg)
{
    struct xfer_stream *s = arg;
    uint32_t max_delay = s->x->cfg.max_delay_us;
    struct xfer_op *op;

    while ((op = sim_next(s))) {
        if (max_delay)
            sleep_us((uint32_t)(next_rand(&s->rng) % ((uint64_t)max_delay + 1)));
        int rc = sim_run(s, op);

        pthread_mutex_lock(&s->lock);
        complete_locked(s, op->id, op->bytes, rc);
        pthread_mutex_unlock(&s->lock);
        free(op);
    }
    return NULL;
}

static int sim_start(struct xfer_stream *s)
{
    /* Streams draw apart so that the two directions do not sleep in lockstep. */
    s->rng = s->x->cfg.seed ^ ((uint64_t)s->dir * 0xd1b54a32d192ed03ull);
    if (pthread_create(&s->thread, NULL, sim_worker, s))
        return -ENOMEM;
    s->started = true;
    return 0;
}

/* The worker drains the queue before it sees stop, so every op queued completes. */
static void sim_stop(struct xfer_stream *s)
{
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
}

static int sim_submit(struct xfer_stream *s, struct xfer_op *op)
{
    op->id = ++s->issued;
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* ---- cuda: copies enqueued on a non-blocking stream ---- */

#ifdef KVT_HAVE_CUDA

/* How often a waiter looks at the stream for an error that would keep callbacks away. */
#define CUDA_POLL_NS 10000000L

static int cuda_ok(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError(); /* clear a non-sticky error so later calls report their own */
    return KVT_EBACKEND;
}

static int cuda_copy(struct xfer_stream *s, void *dst, const void *src, size_t n)
{
    enum cudaMemcpyKind kind =
        s->dir == XFER_LOAD ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;

    return cuda_ok(cudaMemcpyAsync(dst, src, n, kind, s->cs));
}

/* The stream's host callback: runs on a CUDA thread, so it takes the lock and calls no CUDA
 * API. fired, set under the lock, is what lets the owner free the op. */
static void CUDART_CB cuda_landed(void *arg)
{
    struct xfer_op *op = arg;
    struct xfer_stream *s = op->s;

    pthread_mutex_lock(&s->lock);
    op->fired = true;
    complete_locked(s, op->id, op->bytes, op->status);
    pthread_mutex_unlock(&s->lock);
}

static void cuda_free_op(struct xfer_op *op, uint32_t layers)
{
    for (uint32_t l = 0; op->layer_ev && l < layers; l++)
        if (op->layer_ev[l])
            cudaEventDestroy(op->layer_ev[l]);
    free(op->layer_ev);
    free(op);
}

/* Owner thread: free the ops whose callbacks have run, oldest first. */
static void cuda_reap(struct xfer_stream *s, bool all)
{
    for (;;) {
        pthread_mutex_lock(&s->lock);
        struct xfer_op *op = s->head;
        bool take = op && (op->fired || all);

        if (take) {
            s->head = op->next;
            if (!s->head)
                s->tail = NULL;
        }
        pthread_mutex_unlock(&s->lock);
        if (!take)
            return;
        cuda_free_op(op, s->x->layers);
    }
}

static int cuda_make_events(struct xfer_stream *s, struct xfer_op *op)
{
    uint32_t layers = s->x->layers;

    op->layer_ev = calloc(layers, sizeof(*op->layer_ev));
    if (!op->layer_ev)
        return -ENOMEM;
    for (uint32_t l = 0; l < layers; l++)
        if (cuda_ok(cudaEventCreateWithFlags(&op->layer_ev[l], cudaEventDisableTiming)))
            return KVT_EBACKEND;
    return 0;
}

/* Enqueue the op's copies; the first failure becomes its status. Every layer's event is
 * recorded even after a failure, so a layer wait never passes on a never-recorded event. */
static int cuda_enqueue(struct xfer_stream *s, struct xfer_op *op, void *ready)
{
    int rc = 0;

    if (ready)
        rc = cuda_ok(cudaStreamWaitEvent(s->cs, (cudaEvent_t)ready, 0));
    for (uint32_t l = 0; l < s->x->layers; l++) {
        if (!rc)
            rc = copy_layer(s, cuda_copy, op, l);
        if (op->layer_ev) {
            int e = cuda_ok(cudaEventRecord(op->layer_ev[l], s->cs));

            rc = rc ? rc : e;
        }
    }
    return rc;
}

/* When the callback cannot be launched, nothing would move the watermark: finish the op here,
 * after the stream's earlier work, so completions stay in order. */
static void cuda_finish_inline(struct xfer_stream *s, struct xfer_op *op)
{
    cudaStreamSynchronize(s->cs);
    cudaGetLastError();
    pthread_mutex_lock(&s->lock);
    op->fired = true;
    complete_locked(s, op->id, op->bytes, KVT_EBACKEND);
    pthread_mutex_unlock(&s->lock);
}

static int cuda_submit(struct xfer_stream *s, struct xfer_op *op, void *ready)
{
    int rc;

    cuda_reap(s, false);
    if (s->dir == XFER_LOAD && (rc = cuda_make_events(s, op))) {
        cuda_free_op(op, s->x->layers);
        return rc;
    }
    op->id = ++s->issued;
    op->status = cuda_enqueue(s, op, ready);
    pthread_mutex_lock(&s->lock); /* the callback's fired sits beside the list links */
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_mutex_unlock(&s->lock);
    if (cudaLaunchHostFunc(s->cs, cuda_landed, op) != cudaSuccess)
        cuda_finish_inline(s, op);
    return 0;
}

/* A stream in an error state may never run its callbacks; then every op issued has failed. */
static void cuda_poll(struct xfer_stream *s)
{
    cudaError_t e = cudaStreamQuery(s->cs);

    if (e == cudaSuccess || e == cudaErrorNotReady)
        return;
    cudaGetLastError();
    pthread_mutex_lock(&s->lock);
    uint64_t done = atomic_load_explicit(&s->done, memory_order_relaxed);

    if (done < s->issued) {
        complete_locked(s, done + 1, 0, KVT_EBACKEND); /* the first error is the oldest op's */
        complete_locked(s, s->issued, 0, KVT_EBACKEND);
    }
    pthread_mutex_unlock(&s->lock);
}

/* Under the lock: wait a while for progress, then look for a broken stream. */
static void cuda_wait_progress(struct xfer_stream *s)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_nsec += CUDA_POLL_NS;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    if (pthread_cond_timedwait(&s->progress, &s->lock, &t) != ETIMEDOUT)
        return;
    pthread_mutex_unlock(&s->lock);
    cuda_poll(s);
    pthread_mutex_lock(&s->lock);
}

static int cuda_start(struct xfer_stream *s)
{
    if (cuda_ok(cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking)))
        return KVT_EBACKEND;
    s->started = true;
    return 0;
}

static void cuda_stop(struct xfer_stream *s)
{
    cudaStreamSynchronize(s->cs); /* runs every callback still due */
    cudaGetLastError();
    cudaStreamDestroy(s->cs);
    cuda_reap(s, true);
}

/* Make stream wait for a layer of a load still in flight (its op is still on the list, since
 * only this thread reaps). */
static int cuda_wait_layer(struct xfer_stream *s, uint64_t id, uint32_t layer, void *stream)
{
    struct xfer_op *op;

    pthread_mutex_lock(&s->lock);
    for (op = s->head; op && op->id != id; op = op->next)
        ;
    pthread_mutex_unlock(&s->lock);
    if (!op)
        return xfer_status(s->x, XFER_LOAD, id); /* reaped: it has completed */
    return cuda_ok(cudaStreamWaitEvent((cudaStream_t)stream, op->layer_ev[layer], 0));
}

#endif /* KVT_HAVE_CUDA */

/* ---- dispatch ---- */

static int stream_start(struct xfer_stream *s)
{
#ifdef KVT_HAVE_CUDA
    if (s->x->cuda)
        return cuda_start(s);
#endif
    return sim_start(s);
}

static void stream_stop(struct xfer_stream *s)
{
#ifdef KVT_HAVE_CUDA
    if (s->x->cuda) {
        cuda_stop(s);
        return;
    }
#endif
    sim_stop(s);
}

static int stream_submit(struct xfer_stream *s, struct xfer_op *op, void *ready)
{
#ifdef KVT_HAVE_CUDA
    if (s->x->cuda)
        return cuda_submit(s, op, ready);
#endif
    (void)ready;
    return sim_submit(s, op);
}

/* Under the lock: block until woken (sim), or for a bounded while (cuda). */
static void wait_progress(struct xfer_stream *s)
{
#ifdef KVT_HAVE_CUDA
    if (s->x->cuda) {
        cuda_wait_progress(s);
        return;
    }
#endif
    pthread_cond_wait(&s->progress, &s->lock);
}

/* ---- setup ---- */

/* The device and host pools must agree on everything a page copy relies on. */
static int check_pools(const struct kv_pool *dev, const struct host_pool *host)
{
    if (!dev || !host || !dev->be || !host->page_size || host->layers != dev->geo.layers)
        return -EINVAL;
    if (host->row[0] != dev->row_bytes[0] || host->row[1] != dev->row_bytes[1])
        return -EINVAL;
    if (host->layout != HOST_PAGE_FIRST && host->layout != HOST_LAYER_FIRST)
        return -EINVAL;
#ifndef KVT_HAVE_CUDA
    if (dev->be->kind == KVT_BACKEND_CUDA)
        return KVT_ENOBACKEND;
#endif
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
    else if (pthread_cond_init(&s->work, &ca))
        rc = -ENOMEM;
    pthread_condattr_destroy(&ca);
    if (rc)
        return rc; /* a half-made stream is not destroyed: pthread objects cannot leak memory */
    s->inited = true;
    return stream_start(s);
}

int xfer_create(struct kv_pool *dev, struct host_pool *host, const struct xfer_config *cfg,
                struct xfer_engine **out)
{
    struct xfer_engine *x;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if ((rc = check_pools(dev, host)))
        return rc;
    x = calloc(1, sizeof(*x));
    if (!x)
        return -ENOMEM;
    x->dev = dev;
    x->host = host;
    if (cfg)
        x->cfg = *cfg;
    x->layers = host->layers;
    x->page_size = host->page_size;
    x->dev_npages = dev->rows / host->page_size;
    x->page_bytes = (size_t)host->page_size * (host->row[0] + host->row[1]) * host->layers;
    x->host_contiguous = host->layout == HOST_LAYER_FIRST;
    x->cuda = dev->be->kind == KVT_BACKEND_CUDA;
    for (int d = XFER_LOAD; d <= XFER_BACKUP && !rc; d++)
        rc = stream_init(x, (enum xfer_dir)d);
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
    for (int d = XFER_LOAD; d <= XFER_BACKUP; d++) {
        struct xfer_stream *s = &x->s[d];

        if (s->started)
            stream_stop(s);
        if (!s->inited)
            continue;
        pthread_cond_destroy(&s->work);
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
 * one out of it would back up garbage. */
static int check_pages(const struct xfer_engine *x, const uint32_t *dev_pages,
                       const uint32_t *host_pages, size_t n)
{
    if (n && (!dev_pages || !host_pages))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (dev_pages[i] == 0 || dev_pages[i] >= x->dev_npages || host_pages[i] >= x->host->npages)
            return -EINVAL;
    return 0;
}

/* The op with copies of both page arrays behind it, in one allocation. */
static struct xfer_op *op_new(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                              const uint32_t *host_pages, size_t n)
{
    struct xfer_op *op;

    if (n > (SIZE_MAX - sizeof(*op)) / (2 * sizeof(uint32_t)))
        return NULL;
    op = calloc(1, sizeof(*op) + 2 * n * sizeof(uint32_t));
    if (!op)
        return NULL;
    op->s = &x->s[dir];
    op->n = n;
    op->bytes = (uint64_t)n * x->page_bytes;
    op->dev_pages = (uint32_t *)(op + 1);
    op->host_pages = op->dev_pages + n;
    if (n) {
        memcpy(op->dev_pages, dev_pages, n * sizeof(uint32_t));
        memcpy(op->host_pages, host_pages, n * sizeof(uint32_t));
    }
    return op;
}

int xfer_submit(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                const uint32_t *host_pages, size_t n, void *ready, uint64_t *id)
{
    struct xfer_op *op;
    int rc;

    if (!x || !id || bad_dir(dir))
        return -EINVAL;
    if ((rc = check_pages(x, dev_pages, host_pages, n)))
        return rc;
    op = op_new(x, dir, dev_pages, host_pages, n);
    if (!op)
        return -ENOMEM;
    rc = stream_submit(&x->s[dir], op, ready);
    /* Not op->id: the worker may have copied and freed the op already. */
    if (rc == 0)
        *id = x->s[dir].issued;
    return rc;
}

/* ---- queries and waits ---- */

uint64_t xfer_done(struct xfer_engine *x, enum xfer_dir dir)
{
    if (!x || bad_dir(dir))
        return 0;
    return atomic_load_explicit(&x->s[dir].done, memory_order_acquire);
}

int xfer_status(struct xfer_engine *x, enum xfer_dir dir, uint64_t id)
{
    struct xfer_stream *s;
    int rc;

    if (!x || bad_dir(dir) || id > x->s[dir].issued)
        return -EINVAL;
    s = &x->s[dir];
    pthread_mutex_lock(&s->lock);
    rc = status_locked(s, id);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int xfer_wait(struct xfer_engine *x, enum xfer_dir dir, uint64_t id)
{
    struct xfer_stream *s;
    int rc;

    if (!x || bad_dir(dir) || id > x->s[dir].issued)
        return -EINVAL;
    s = &x->s[dir];
    pthread_mutex_lock(&s->lock);
    while (atomic_load_explicit(&s->done, memory_order_relaxed) < id)
        wait_progress(s);
    rc = status_locked(s, id);
    pthread_mutex_unlock(&s->lock);
#ifdef KVT_HAVE_CUDA
    if (x->cuda)
        cuda_reap(s, false);
#endif
    return rc;
}

int xfer_wait_layer(struct xfer_engine *x, uint64_t id, uint32_t layer, void *stream)
{
    struct xfer_stream *s;
    int rc;

    if (!x || id == 0 || id > x->s[XFER_LOAD].issued || layer >= x->layers)
        return -EINVAL;
    s = &x->s[XFER_LOAD];
#ifdef KVT_HAVE_CUDA
    if (x->cuda && xfer_done(x, XFER_LOAD) < id)
        return cuda_wait_layer(s, id, layer, stream);
#endif
    (void)stream;
    pthread_mutex_lock(&s->lock);
    while (!load_layer_landed(s, id, layer))
        wait_progress(s);
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
