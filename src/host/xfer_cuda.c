/*
 * The cuda transfer backend: each stream is a non-blocking CUDA stream; a load records one
 * event per layer, and a host callback moves the watermark. Built only with CUDA
 * (src/host/meson.build). An op goes by the gather/scatter kernels (kernels/kv_copy.h) or by
 * the copy engine following the shared copy plan, as xfer_config.io says (see transfer.h).
 *
 * Ordering: everything an op does is enqueued on its stream in this order: the wait for
 * ready, the copy of its page numbers to the device (kernel path), the copies or kernels (for
 * a load, each layer followed by its event), then the host callback that moves the watermark.
 * What an op holds (events, its region of the index ring) is freed only once that callback
 * has run, by the owner thread, oldest op first.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "kvtier.h"
#include "device/backend.h"
#include "xfer_int.h"
#ifdef KVT_HAVE_KERNELS
#include "kv_copy.h"
#endif

/* How often a waiter looks at the stream for an error that would keep callbacks away. */
#define CUDA_POLL_NS 10000000L

/* Page numbers per stream's index ring: 64 Ki pages in flight per direction. */
#define IDX_RING_ENTRIES ((size_t)1 << 17)

/* A ring of page numbers in pinned staging memory and its device twin: an op takes a
 * contiguous region, copies its numbers to the device on its own stream, and gives the
 * region back when it is reaped, so neither side is reused before the op's kernels ran. Ops
 * are reaped in the order they were submitted, so regions come back in the order taken.
 * Owner thread only. */
struct idx_ring {
    uint32_t *stage, *dev;
    size_t cap, tail, used; /* used counts the end skipped when a region wraps */
};

/* Copies for one cudaMemcpyBatchAsync call; the arrays are read during the call. */
#define DMA_BATCH 512
struct dma_batch {
    void *dst[DMA_BATCH];
    const void *src[DMA_BATCH];
    size_t size[DMA_BATCH];
    size_t n;
};

struct cuda_op {
    struct xfer_op op;     /* first: the shared op */
    int status;            /* the first error met while enqueuing */
    bool fired;            /* the completion callback ran (under the lock) */
    cudaEvent_t *layer_ev; /* loads: recorded after each layer's copies */
    uint32_t *idx;         /* kernel path: the page numbers in device memory; NULL: DMA */
    size_t ring_take;      /* index ring entries held until the op is reaped */
};

struct cuda_stream {
    cudaStream_t cs;
    struct idx_ring ring;   /* kernel path: page numbers on their way to the device */
    struct dma_batch batch; /* DMA path: copies gathered for one batched call */
};

struct cuda_engine {
    struct xfer_engine x; /* first: the shared engine */
    struct cuda_stream s[2];
    bool batch_api; /* cudaMemcpyBatchAsync has not been refused */
    bool kernels;   /* the kernel path is set up */
    void **dev_tab; /* device copy of the row-buffer table the kernels index */
#ifdef KVT_HAVE_KERNELS
    struct kvk_pool kp;
#endif
};

static struct cuda_engine *eng_of(struct xfer_engine *x)
{
    return (struct cuda_engine *)x;
}

static struct cuda_stream *cs_of(struct xfer_stream *s)
{
    return &eng_of(s->x)->s[s->dir];
}

static struct cuda_op *cop_of(struct xfer_op *op)
{
    return (struct cuda_op *)op;
}

static int cuda_ok(cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError(); /* clear a non-sticky error so later calls report their own */
    return KVT_EBACKEND;
}

/* ---- the index ring ---- */

static void ring_finish(struct idx_ring *r)
{
    if (r->stage)
        cudaFreeHost(r->stage);
    if (r->dev)
        cudaFree(r->dev);
    memset(r, 0, sizeof(*r));
}

/* A contiguous region of k entries at *off; *take (k plus the end skipped to wrap) is what
 * goes back later. false when the ring has no such room now. */
static bool ring_take(struct idx_ring *r, size_t k, size_t *off, size_t *take)
{
    bool wrap;
    size_t skip;

    if (r->used == 0)
        r->tail = 0;
    wrap = r->tail + k > r->cap;
    skip = wrap ? r->cap - r->tail : 0;
    if (k > r->cap || r->used + skip + k > r->cap)
        return false;
    *off = wrap ? 0 : r->tail;
    *take = skip + k;
    r->tail = *off + k;
    r->used += *take;
    return true;
}

/* ---- the copy-engine path: runs gathered into batches ---- */

#if CUDART_VERSION >= 12080
/* One call for the whole batch; sources are read in stream order, after what the stream
 * waits for (the ready event, earlier ops). */
static cudaError_t batch_call(struct cuda_stream *cs, struct dma_batch *b, size_t n,
                              bool prefer_overlap)
{
    struct cudaMemcpyAttributes attr;
    size_t first = 0;

    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = prefer_overlap ? cudaMemcpyFlagPreferOverlapWithCompute : 0;
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(b->dst, b->src, b->size, n, &attr, &first, 1, cs->cs);
#else
    /* 12.8 declares the arrays non-const, 12.9 const; void * converts to either. 12.x also
     * reports the index of a failed copy, which the retry below makes moot. */
    size_t failed = 0;

    return cudaMemcpyBatchAsync((void *)b->dst, (void *)b->src, (void *)b->size, n, &attr, &first,
                                1, &failed, cs->cs);
#endif
}
#endif

/* Enqueue the gathered copies. A batch the driver refuses (one older than the toolkit) is
 * issued again copy by copy, which is safe since each copy only rewrites the same bytes,
 * and the engine stops asking for batches. */
static int dma_flush(struct xfer_stream *s)
{
    enum cudaMemcpyKind kind =
        s->dir == XFER_LOAD ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    struct cuda_stream *cs = cs_of(s);
    struct dma_batch *b = &cs->batch;
    size_t n = b->n;
    int rc = 0;

    b->n = 0;
#if CUDART_VERSION >= 12080
    if (n > 1 && eng_of(s->x)->batch_api) {
        if (batch_call(cs, b, n, s->x->cfg.dma_prefer_overlap) == cudaSuccess)
            return 0;
        cudaGetLastError();
        eng_of(s->x)->batch_api = false;
    }
#endif
    for (size_t i = 0; i < n && !rc; i++)
        rc = cuda_ok(cudaMemcpyAsync(b->dst[i], b->src[i], b->size[i], kind, cs->cs));
    return rc;
}

/* The copy plan's primitive on cuda: gather; a full batch goes at once. */
static int dma_add(struct xfer_stream *s, void *dst, const void *src, size_t n)
{
    struct dma_batch *b = &cs_of(s)->batch;
    int rc = b->n == DMA_BATCH ? dma_flush(s) : 0;

    if (rc)
        return rc;
    b->dst[b->n] = dst;
    b->src[b->n] = src;
    b->size[b->n++] = n;
    return 0;
}

/* Layers [l0, l1) of op by the copy engine. */
static int dma_layers(struct xfer_stream *s, const struct xfer_op *op, uint32_t l0, uint32_t l1)
{
    int rc = 0;

    for (uint32_t l = l0; l < l1 && !rc; l++)
        rc = xfer_copy_layer(s, dma_add, op, l);
    if (rc) {
        cs_of(s)->batch.n = 0; /* the op has failed; what was gathered for it goes nowhere */
        return rc;
    }
    return dma_flush(s);
}

/* ---- the kernel path ---- */

/* io=auto: the mean size of the copies the DMA path would issue for op. */
static uint64_t mean_dma_copy(const struct xfer_engine *x, const struct xfer_op *op)
{
    uint64_t copies = 0, parts = x->host->row[1] ? 2 : 1;

    for (size_t i = 0; i < op->n;) {
        size_t r = xfer_run_len(op, i);

        copies += x->host_contiguous ? 1 : r;
        i += r;
    }
    return (uint64_t)op->n * (x->page_bytes / x->layers) / (copies * parts);
}

static bool want_kernel(struct xfer_engine *x, const struct xfer_op *op)
{
    uint64_t min = x->cfg.auto_dma_min_bytes ? x->cfg.auto_dma_min_bytes : XFER_AUTO_DMA_MIN_BYTES;

    if (!eng_of(x)->kernels || op->n == 0 || op->n > UINT32_MAX)
        return false;
    return x->cfg.io == KVT_IO_KERNEL || mean_dma_copy(x, op) < min;
}

/* Put op's page numbers where its kernels read them: dev_pages then host_pages (kv_copy.h).
 * Without room in the ring the op goes by DMA instead. */
static int kern_stage(struct xfer_stream *s, struct cuda_op *cop)
{
    struct cuda_stream *cs = cs_of(s);
    const struct xfer_op *op = &cop->op;
    size_t k = 2 * op->n, off;

    if (!ring_take(&cs->ring, k, &off, &cop->ring_take))
        return 0;
    memcpy(cs->ring.stage + off, op->dev_pages, op->n * sizeof(uint32_t));
    memcpy(cs->ring.stage + off + op->n, op->host_pages, op->n * sizeof(uint32_t));
    cop->idx = cs->ring.dev + off;
    return cuda_ok(cudaMemcpyAsync(cop->idx, cs->ring.stage + off, k * sizeof(uint32_t),
                                   cudaMemcpyHostToDevice, cs->cs));
}

/* Pick op's path (kernel or DMA) and count it; the kernel path stages the page numbers. */
static int choose_path(struct xfer_stream *s, struct cuda_op *cop)
{
    int rc = 0;

    if (cop->op.n == 0)
        return 0;
    if (want_kernel(s->x, &cop->op))
        rc = kern_stage(s, cop);
    s->x->path_ops[cop->idx ? 0 : 1]++;
    return rc;
}

/* Layers [l0, l1) of op by whichever path it took: one kernel launch for all of them, or
 * the copy engine's copies. */
static int copy_layers(struct xfer_stream *s, const struct cuda_op *cop, uint32_t l0, uint32_t l1)
{
#ifdef KVT_HAVE_KERNELS
    const struct kvk_pool *kp = &eng_of(s->x)->kp;
    int to_host = s->dir == XFER_BACKUP;
    uint32_t n = (uint32_t)cop->op.n;

    if (cop->idx && l1 - l0 == kp->layers)
        return cuda_ok(kvk_copy_all(kp, cop->idx, n, to_host, cs_of(s)->cs));
    if (cop->idx && l1 - l0 == 1)
        return cuda_ok(kvk_copy_layer(kp, cop->idx, n, l0, to_host, cs_of(s)->cs));
#endif
    return dma_layers(s, &cop->op, l0, l1);
}

/* ---- ops and their completion ---- */

/* The stream's host callback: runs on a CUDA thread, so it takes the lock and calls no CUDA
 * API. fired, set under the lock, is what lets the owner free the op. */
static void CUDART_CB cuda_landed(void *arg)
{
    struct cuda_op *cop = arg;
    struct xfer_stream *s = cop->op.s;

    pthread_mutex_lock(&s->lock);
    cop->fired = true;
    xfer_complete_locked(s, cop->op.id, cop->op.bytes, cop->status);
    pthread_mutex_unlock(&s->lock);
}

/* Owner thread, once the op's stream work is over (or will never run). */
static void free_op(struct xfer_stream *s, struct cuda_op *cop)
{
    for (uint32_t l = 0; cop->layer_ev && l < s->x->layers; l++)
        if (cop->layer_ev[l])
            cudaEventDestroy(cop->layer_ev[l]);
    cs_of(s)->ring.used -= cop->ring_take;
    free(cop->layer_ev);
    free(cop);
}

/* Owner thread: free the ops whose callbacks have run (all: every op), oldest first. */
static void reap_ops(struct xfer_stream *s, bool all)
{
    for (;;) {
        pthread_mutex_lock(&s->lock);
        struct cuda_op *cop = s->head ? cop_of(s->head) : NULL;
        bool take = cop && (cop->fired || all);

        if (take)
            xfer_pop_locked(s);
        pthread_mutex_unlock(&s->lock);
        if (!take)
            return;
        free_op(s, cop);
    }
}

static int make_events(struct xfer_stream *s, struct cuda_op *cop)
{
    uint32_t layers = s->x->layers;

    cop->layer_ev = calloc(layers, sizeof(*cop->layer_ev));
    if (!cop->layer_ev)
        return -ENOMEM;
    for (uint32_t l = 0; l < layers; l++)
        if (cuda_ok(cudaEventCreateWithFlags(&cop->layer_ev[l], cudaEventDisableTiming)))
            return KVT_EBACKEND;
    return 0;
}

/* A load goes layer by layer (one kernel or one batch each), each followed by its event.
 * Every event is recorded even after a failure, so a layer wait never passes on a
 * never-recorded event. */
static int load_layers(struct xfer_stream *s, struct cuda_op *cop, int rc)
{
    for (uint32_t l = 0; l < s->x->layers; l++) {
        if (!rc)
            rc = copy_layers(s, cop, l, l + 1);
        if (cop->layer_ev) {
            int e = cuda_ok(cudaEventRecord(cop->layer_ev[l], cs_of(s)->cs));

            rc = rc ? rc : e;
        }
    }
    return rc;
}

/* Enqueue the op's work after ready; the first failure becomes its status. A backup needs
 * no per-layer events, so it goes whole: one all-layers kernel, or one stream of batches. */
static int enqueue(struct xfer_stream *s, struct cuda_op *cop, void *ready)
{
    int rc = 0;

    if (ready)
        rc = cuda_ok(cudaStreamWaitEvent(cs_of(s)->cs, (cudaEvent_t)ready, 0));
    if (!rc)
        rc = choose_path(s, cop);
    if (s->dir == XFER_LOAD)
        return load_layers(s, cop, rc);
    return rc ? rc : copy_layers(s, cop, 0, s->x->layers);
}

/* When the callback cannot be launched, nothing would move the watermark: finish the op here,
 * after the stream's earlier work, so completions stay in order. */
static void finish_inline(struct xfer_stream *s, struct cuda_op *cop)
{
    cudaStreamSynchronize(cs_of(s)->cs);
    cudaGetLastError();
    pthread_mutex_lock(&s->lock);
    cop->fired = true;
    xfer_complete_locked(s, cop->op.id, cop->op.bytes, KVT_EBACKEND);
    pthread_mutex_unlock(&s->lock);
}

/* A stream in an error state may never run its callbacks; then every op issued has failed. */
static void poll_stream(struct xfer_stream *s)
{
    cudaError_t e = cudaStreamQuery(cs_of(s)->cs);

    if (e == cudaSuccess || e == cudaErrorNotReady)
        return;
    cudaGetLastError();
    pthread_mutex_lock(&s->lock);
    uint64_t done = atomic_load_explicit(&s->done, memory_order_relaxed);

    if (done < s->issued) {
        xfer_complete_locked(s, done + 1, 0, KVT_EBACKEND); /* the first error: the oldest op's */
        xfer_complete_locked(s, s->issued, 0, KVT_EBACKEND);
    }
    pthread_mutex_unlock(&s->lock);
}

/* ---- setting the kernel path up ---- */

#ifdef KVT_HAVE_KERNELS
/* The kernels address host pages by formula (kv_copy.h); these are its terms for the pool's
 * layout, as host_pool_rows lays it out. */
static void kern_host_strides(const struct host_pool *hp, struct kvk_pool *kp)
{
    uint64_t run = (uint64_t)hp->page_size * (hp->row[0] + hp->row[1]); /* a page, a layer */

    kp->span[0] = (uint64_t)hp->page_size * hp->row[0];
    kp->span[1] = (uint64_t)hp->page_size * hp->row[1];
    if (hp->layout == HOST_PAGE_FIRST) {
        kp->host_page_stride[0] = kp->host_page_stride[1] = hp->page_bytes;
        kp->host_layer_stride = run;
        kp->host_v_off = kp->span[0];
        return;
    }
    kp->host_page_stride[0] = kp->span[0];
    kp->host_page_stride[1] = kp->span[1];
    kp->host_layer_stride = (uint64_t)hp->npages * run;
    kp->host_v_off = (uint64_t)hp->npages * kp->span[0];
}

/* The formula agrees with host_pool_rows at the corners of the pool, or the kernels stay
 * off: a layout changed in one place and not the other must not scatter pages. */
static bool kern_strides_match(const struct host_pool *hp, const struct kvk_pool *kp)
{
    const uint32_t pages[2] = {0, hp->npages - 1}, layers[2] = {0, hp->layers - 1};

    for (int c = 0; c < 4; c++)
        for (uint32_t w = 0; w < kp->parts; w++) {
            uint32_t p = pages[c & 1], l = layers[c >> 1];
            uint64_t off = l * kp->host_layer_stride + w * kp->host_v_off +
                           (uint64_t)p * kp->host_page_stride[w];

            if (hp->base + off != host_pool_rows(hp, p, l, (int)w))
                return false;
        }
    return true;
}

static int ring_init(struct idx_ring *r)
{
    size_t bytes = IDX_RING_ENTRIES * sizeof(uint32_t);

    if (cuda_ok(cudaHostAlloc((void **)&r->stage, bytes, cudaHostAllocDefault))) {
        r->stage = NULL;
        return -ENOMEM;
    }
    if (cuda_ok(cudaMalloc((void **)&r->dev, bytes))) {
        r->dev = NULL;
        return -ENOMEM;
    }
    r->cap = IDX_RING_ENTRIES;
    return 0;
}

static int kern_init(struct cuda_engine *ce)
{
    struct kvk_pool *kp = &ce->kp;
    const struct xfer_engine *x = &ce->x;
    void *host = NULL;
    int rc;

    if (kvk_check_device() != cudaSuccess)
        return KVT_ENOBACKEND; /* no code in this build for this GPU */
    if (cuda_ok(cudaHostGetDevicePointer(&host, x->host->base, 0)))
        return KVT_ENOBACKEND; /* the host pool is not mapped for the device */
    kp->host = host;
    kp->layers = x->layers;
    kp->parts = x->host->row[1] ? 2 : 1;
    kp->max_blocks = x->cfg.kernel_blocks ? x->cfg.kernel_blocks : XFER_KERNEL_BLOCKS;
    kern_host_strides(x->host, kp);
    if (!kern_strides_match(x->host, kp))
        return -EINVAL;
    /* The kernels find each layer's row buffers through a table in device memory. */
    if ((rc = dev_cuda_table(x->dev->buf, x->layers, &ce->dev_tab)))
        return rc;
    kp->dev = ce->dev_tab;
    for (int d = XFER_LOAD; d <= XFER_BACKUP && !rc; d++)
        rc = ring_init(&ce->s[d].ring);
    return rc;
}
#endif /* KVT_HAVE_KERNELS */

/* After the streams have stopped; also after a kernel path that failed or never was. */
static void kern_finish(struct xfer_engine *x)
{
    struct cuda_engine *ce = eng_of(x);

    for (int d = XFER_LOAD; d <= XFER_BACKUP; d++)
        ring_finish(&ce->s[d].ring);
    if (ce->dev_tab)
        cudaFree(ce->dev_tab);
    ce->dev_tab = NULL;
    ce->kernels = false;
}

/* io=kernel needs the kernel path (KVT_ENOBACKEND where it cannot be had: not built, no code
 * for this GPU, host pool not mapped); io=auto goes without it, by DMA alone. */
static int kern_setup(struct xfer_engine *x)
{
    int rc = KVT_ENOBACKEND;

#ifdef KVT_HAVE_KERNELS
    rc = kern_init(eng_of(x));
    eng_of(x)->kernels = rc == 0;
#endif
    if (rc)
        kern_finish(x);
    return rc && x->cfg.io == KVT_IO_KERNEL ? rc : 0;
}

/* ---- the backend's table ---- */

static int cuda_start(struct xfer_stream *s)
{
    int prio = 0, least, greatest; /* lower numbers are higher priorities */

    if (s->dir == XFER_LOAD && s->x->cfg.high_priority_loads &&
        !cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest)))
        prio = greatest;
    return cuda_ok(cudaStreamCreateWithPriority(&cs_of(s)->cs, cudaStreamNonBlocking, prio));
}

static void cuda_stop(struct xfer_stream *s)
{
    cudaStreamSynchronize(cs_of(s)->cs); /* runs every callback still due */
    cudaGetLastError();
    cudaStreamDestroy(cs_of(s)->cs);
    reap_ops(s, true);
}

static int cuda_setup(struct xfer_engine *x)
{
    eng_of(x)->batch_api = true;
    return x->cfg.io != KVT_IO_DMA ? kern_setup(x) : 0;
}

static int cuda_submit(struct xfer_stream *s, struct xfer_op *op, void *ready)
{
    struct cuda_op *cop = cop_of(op);
    int rc;

    reap_ops(s, false);
    if (s->dir == XFER_LOAD && (rc = make_events(s, cop))) {
        free_op(s, cop);
        return rc;
    }
    op->id = ++s->issued;
    cop->status = enqueue(s, cop, ready);
    pthread_mutex_lock(&s->lock); /* the callback's fired sits beside the list links */
    xfer_push_locked(s, op);
    pthread_mutex_unlock(&s->lock);
    if (cudaLaunchHostFunc(cs_of(s)->cs, cuda_landed, cop) != cudaSuccess)
        finish_inline(s, cop);
    return 0;
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
    poll_stream(s);
    pthread_mutex_lock(&s->lock);
}

static void cuda_reap(struct xfer_stream *s)
{
    reap_ops(s, false);
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
    return cuda_ok(cudaStreamWaitEvent((cudaStream_t)stream, cop_of(op)->layer_ev[layer], 0));
}

const struct xfer_backend xfer_backend_cuda = {
    .kind = KVT_BACKEND_CUDA,
    .engine_size = sizeof(struct cuda_engine),
    .op_size = sizeof(struct cuda_op),
    .two_pools = false, /* not until a GPU has run it */
    .start = cuda_start,
    .stop = cuda_stop,
    .setup = cuda_setup,
    .finish = kern_finish,
    .submit = cuda_submit,
    .wait_progress = cuda_wait_progress,
    .reap = cuda_reap,
    .wait_layer = cuda_wait_layer,
};
