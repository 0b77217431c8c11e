/*
 * The sim transfer backend: one worker thread per stream runs each op's copy plan with memcpy,
 * so the asynchrony is real: submit returns at once and the waits block on the CPU. A load
 * goes layer by layer and marks each layer as it lands. Two test seams from xfer_config slow
 * the worker down (max_delay_us before each op, layer_delay_us between a load's layers), and
 * serial runs each op on the submitting thread instead, so what has landed never depends on
 * timing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h> /* SSE2, the x86-64 baseline: streaming stores, prefetch, sfence */
#define SIM_STREAM 1
#else
#define SIM_STREAM 0
#endif

#include "kvtier.h"
#include "xfer_int.h"

/* A span handed to sim_copy and not yet copied (n 0: none). */
struct sim_span {
    void *dst;
    const void *src;
    size_t n;
};

/* What a stream's worker has beyond the shared stream. */
struct sim_stream {
    pthread_cond_t work; /* an op was queued, or stop was set */
    pthread_t thread;
    bool stop;
    uint64_t rng;         /* the delay seam's generator; the worker's alone */
    struct sim_span held; /* sim_copy's span waiting for the next; the worker's alone */
};

struct sim_engine {
    struct xfer_engine x; /* first: the shared engine */
    struct sim_stream s[2];
};

static struct sim_stream *sim_of(struct xfer_stream *s)
{
    return &((struct sim_engine *)s->x)->s[s->dir];
}

/* ---- copying ---- */

/*
 * Scattered spans (typically 32 KiB: one page of K or V rows of one layer) each start cold
 * when copied by memcpy one after another: the hardware prefetcher has not yet locked on to
 * the new source, and every destination line is first read for ownership. So sim_copy holds
 * each span back until the next one is known, and copies it while prefetching the next
 * one's source, with streaming stores that write whole lines without reading them first.
 * Streaming stores are weakly ordered: sim_flush copies the held span and fences, and must
 * run before anyone is told the bytes are there (a load's layer mark, an op's completion).
 */

#define SIM_LINE 64 /* bytes per cache line, the unit of the streaming loop */
/* Shorter spans go by memcpy, too short to be worth it. A build may lower it to put the
 * unit tests' short spans through the streaming path. */
#ifndef SIM_STREAM_MIN
#define SIM_STREAM_MIN 4096
#endif

#if SIM_STREAM
/* Copies n bytes to a 16-byte aligned dst with streaming stores, a line at a time, and
 * prefetches a line of next (next_n bytes) per line copied, so that the next span's source
 * is in cache by the time it is copied. The tail short of a line goes by memcpy. */
static void stream_copy(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t *next,
                        size_t next_n)
{
    size_t body = n & ~(size_t)(SIM_LINE - 1), pf = 0;

    for (size_t i = 0; i < body; i += SIM_LINE) {
        if (pf < next_n) {
            _mm_prefetch((const char *)next + pf, _MM_HINT_T0);
            pf += SIM_LINE;
        }
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + body, src + body, n - body);
}
#endif

/* Copies span h, prefetching next's source meanwhile (next NULL: none). */
static void sim_copy_span(const struct sim_span *h, const struct sim_span *next)
{
#if SIM_STREAM
    if (h->n >= SIM_STREAM_MIN && !((uintptr_t)h->dst & 15)) {
        stream_copy(h->dst, h->src, h->n, next ? next->src : NULL, next ? next->n : 0);
        return;
    }
#else
    (void)next;
#endif
    memcpy(h->dst, h->src, h->n);
}

/* Makes every span handed to sim_copy land and be visible to other threads once they
 * synchronise with this one (by the stream's lock): copies the held span, then fences the
 * streaming stores, which the lock alone need not order. */
static void sim_flush(struct sim_stream *ss)
{
    if (!ss->held.n)
        return;
    sim_copy_span(&ss->held, NULL);
    ss->held.n = 0;
#if SIM_STREAM
    _mm_sfence();
#endif
}

/* The sim backend's xfer_copy_fn: copies the span held back before, if any, prefetching this
 * one, and holds this one back in turn. The bytes land by the next call or sim_flush. */
static int sim_copy(struct xfer_stream *s, void *dst, const void *src, size_t n)
{
    struct sim_stream *ss = sim_of(s);
    struct sim_span next = {.dst = dst, .src = src, .n = n};

    if (!n)
        return 0; /* held, it would read as none held and sim_flush would skip its fence */
    if (ss->held.n)
        sim_copy_span(&ss->held, &next);
    ss->held = next;
    return 0;
}

/* ---- running ops ---- */

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

/* Layer by layer, so a load can announce each layer as it lands. */
static int sim_run(struct xfer_stream *s, const struct xfer_op *op)
{
    const struct xfer_engine *x = s->x;
    int rc = 0;

    for (uint32_t l = 0; l < x->layers && !rc; l++) {
        if (s->dir == XFER_LOAD && l)
            sleep_us(x->cfg.layer_delay_us);
        rc = xfer_copy_layer(s, sim_copy, op, l);
        sim_flush(sim_of(s)); /* the layer's last span, before its mark or the op's completion */
        if (s->dir == XFER_LOAD && !rc)
            xfer_layers_landed(s, l + 1);
    }
    return rc;
}

/* Record op's completion and free it. */
static void sim_complete(struct xfer_stream *s, struct xfer_op *op, int rc)
{
    pthread_mutex_lock(&s->lock);
    xfer_complete_locked(s, op->id, op->bytes, rc);
    pthread_mutex_unlock(&s->lock);
    free(op);
}

/* The next op in FIFO order, or NULL once stopped with the queue drained. */
static struct xfer_op *sim_next(struct xfer_stream *s)
{
    struct sim_stream *ss = sim_of(s);
    struct xfer_op *op;

    pthread_mutex_lock(&s->lock);
    while (!s->head && !ss->stop)
        pthread_cond_wait(&ss->work, &s->lock);
    op = xfer_pop_locked(s);
    if (op)
        xfer_layers_begin_locked(s, op->id);
    pthread_mutex_unlock(&s->lock);
    return op;
}

static void *sim_worker(void *arg)
{
    struct xfer_stream *s = arg;
    uint32_t max_delay = s->x->cfg.max_delay_us;
    uint64_t *rng = &sim_of(s)->rng;
    struct xfer_op *op;

    while ((op = sim_next(s))) {
        if (max_delay)
            sleep_us((uint32_t)(next_rand(rng) % ((uint64_t)max_delay + 1)));
        sim_complete(s, op, sim_run(s, op));
    }
    return NULL;
}

/* ---- the backend's table ---- */

static int sim_start(struct xfer_stream *s)
{
    struct sim_stream *ss = sim_of(s);

    /* Streams draw apart so that the two directions do not sleep in lockstep. */
    ss->rng = s->x->cfg.seed ^ ((uint64_t)s->dir * 0xd1b54a32d192ed03ull);
    if (pthread_cond_init(&ss->work, NULL))
        return -ENOMEM;
    if (pthread_create(&ss->thread, NULL, sim_worker, s)) {
        pthread_cond_destroy(&ss->work);
        return -ENOMEM;
    }
    return 0;
}

/* The worker drains the queue before it sees stop, so every op queued completes. */
static void sim_stop(struct xfer_stream *s)
{
    struct sim_stream *ss = sim_of(s);

    pthread_mutex_lock(&s->lock);
    ss->stop = true;
    pthread_cond_signal(&ss->work);
    pthread_mutex_unlock(&s->lock);
    pthread_join(ss->thread, NULL);
    pthread_cond_destroy(&ss->work);
}

/* serial: the op runs here, as the worker would run it, before the submit returns. */
static void sim_run_here(struct xfer_stream *s, struct xfer_op *op)
{
    pthread_mutex_lock(&s->lock);
    xfer_layers_begin_locked(s, op->id);
    pthread_mutex_unlock(&s->lock);
    sim_complete(s, op, sim_run(s, op));
}

static int sim_submit(struct xfer_stream *s, struct xfer_op *op, void *ready)
{
    (void)ready; /* a CUDA event; the sim has nothing to wait for */
    op->id = ++s->issued;
    if (s->x->cfg.serial) {
        sim_run_here(s, op);
        return 0;
    }
    pthread_mutex_lock(&s->lock);
    xfer_push_locked(s, op);
    pthread_cond_signal(&sim_of(s)->work);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* The worker broadcasts progress under the lock at every mark and completion. */
static void sim_wait_progress(struct xfer_stream *s)
{
    pthread_cond_wait(&s->progress, &s->lock);
}

const struct xfer_backend xfer_backend_sim = {
    .kind = KVT_BACKEND_SIM,
    .engine_size = sizeof(struct sim_engine),
    .op_size = sizeof(struct xfer_op),
    .two_pools = true,
    .start = sim_start,
    .stop = sim_stop,
    .submit = sim_submit,
    .wait_progress = sim_wait_progress,
};
