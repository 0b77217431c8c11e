/*
 * kvtier-xfer-bench: how fast the transfer engine moves scattered pages, and how well a
 * layer-by-layer load hides behind compute. It prints figures; it passes or fails nothing.
 *
 * (a) Bandwidth. N pages at random places in the device and host pools (so that no two
 *     neighbours in the list coalesce into a run, unless --scatter runs asks for runs) are
 *     loaded (host -> device) and backed up (device -> host), one op each, timed from
 *     submit to the end of xfer_wait. The baseline is one contiguous copy of exactly the
 *     same byte count on the same backend in the same run, interleaved with the scattered
 *     ops rep by rep so both see the same machine: on sim one memcpy between two buffers on
 *     one thread (the sim worker is one thread doing memcpy); on cuda one cudaMemcpyAsync
 *     then a stream synchronize. The host side of that copy is the start of the host pool,
 *     so both kinds of copy use the same pinned memory.
 *
 * (b) Overlap. A prefill of L layers over a request's pages: one load of every layer is
 *     submitted, then for each layer the forward waits for that layer (xfer_wait_layer) and
 *     "computes" for C microseconds. The ideal is what a perfect pipeline would take: the
 *     first layer's copy, then L computes (T + C + (L-1) max(T, C), which is L C + T when
 *     compute hides the copy), with T, one layer's copy, measured in the same run as a
 *     whole load without compute divided by L.
 *     sim: the compute is a busy-wait on this thread while the worker copies on another.
 *     cuda: the compute stream waits for the layer's event, then runs a kernel of FMA
 *     chains (xfer_compute.cu) in waves of blocks of about 20 us over every SM, as a
 *     prefill's matrix products take the SMs and free them tile by tile; a gather kernel
 *     beside it competes for them. The kernel is sized for C and then timed alone in the
 *     same run, and that time is the C of the ideal. --compute host keeps the older
 *     stand-in, a host function busy-waiting on the stream, which takes no SM.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef KVT_HAVE_KERNELS
#include "xfer_compute.h"
#endif

#include "kvtier.h"
#include "cli.h"
#include "report.h"
#include "rng.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "host/host_pool.h"
#include "host/transfer.h"

#define PROG "kvtier-xfer-bench"
#define EXIT_SKIP 77 /* as the test suites: nothing to measure here */
#define MAX_COMPUTE 16
#define DEFAULT_GEOMETRY "llama3-8b"
#define DEFAULT_PAGES 512
#define DEFAULT_OVERLAP_PAGES 256
#define DEFAULT_REPS 5
#define DEFAULT_RUN_PAGES 8
#define AUTO_COMPUTE_FACTOR 2 /* auto: compute per layer = this many layer copies */
#define TARGET_RATIO_SIM 0.80
#define TARGET_RATIO_GPU 0.90
#define TARGET_OVERHEAD_PCT 5.0
#define BURN_BLOCK_US 20.0 /* kernel compute: each block's share, as a matrix tile's */
#define BURN_CAL_ITERS 1024
#ifdef KVT_HAVE_KERNELS
#define XC_THREADS_OR_0 XC_THREADS
#else
#define XC_THREADS_OR_0 0
#endif

enum scatter { SCATTER_RANDOM = 0, SCATTER_RUNS = 1 };

static const char *const backend_names[] = {"auto", "sim", "cuda"};
static const char *const io_names[] = {"auto", "kernel", "dma"};
static const char *const layout_names[] = {"page_first", "layer_first"};
static const char *const scatter_names[] = {"random", "runs"};
static const char *const compute_names[] = {"auto", "kernel", "host"};
static const char *const priority_names[] = {"high", "default"};
static const char *const dma_hint_names[] = {"none", "overlap"};
enum { PRIORITY_HIGH = 0, PRIORITY_DEFAULT = 1 };

enum compute { COMPUTE_AUTO = 0, COMPUTE_KERNEL = 1, COMPUTE_HOST = 2 };

/* --layers and friends: applied over --geometry whatever their order on the line. */
struct override {
    bool set;
    uint32_t v;
};

struct config {
    const char *geometry_arg;
    struct kvt_geometry g;
    uint32_t tp_size;
    struct override layers, kv_heads, head_dim, dtype_bytes;
    uint32_t page_size, backend, io, layout, scatter, compute, load_priority, dma_hint;
    uint64_t kernel_blocks;
    uint64_t pages, pool_pages, overlap_pages, run_pages, reps, seed;
    uint64_t dma_min_bytes;           /* cuda io=auto: the engine's threshold; 0: its default */
    uint64_t compute_us[MAX_COMPUTE]; /* 0: auto */
    size_t ncompute;
    bool json;
};

struct bandwidth {
    struct cli_timing load, backup, base_h2d, base_d2h;
};

struct overlap_point {
    double asked;          /* the compute asked for, seconds per layer */
    double compute, ideal; /* seconds: compute as measured alone (kernel) or as asked */
    uint32_t burn_blocks;  /* kernel compute: blocks per layer */
    struct cli_timing measured;
    bool automatic;
};

struct overlap {
    struct cli_timing load; /* the request's whole load, no compute */
    double layer;           /* T: one layer's copy */
    struct overlap_point pt[MAX_COMPUTE];
};

struct rig {
    const struct config *cfg;
    const struct dev_backend *be;
    struct kv_pool dev;
    struct host_pool host;
    bool dev_ready, host_ready;
    struct xfer_engine *x;
    uint32_t *dev_pages, *host_pages;
    size_t runs;             /* of the N pages: how many copies per layer the device side needs */
    size_t page_bytes;       /* one page over all layers, K and V */
    uint64_t bytes;          /* N pages: what every copy of (a) moves */
    uint64_t path_ops[2][2]; /* [dir][kernel, dma]: how cuda sent every op, warm-ups too */
    void *base_dev, *base_host; /* the baseline's buffers; base_host lies in the host pool */
    double spin;                /* host compute: the busy-wait's seconds */
    bool burn;                  /* cuda: compute is the burn kernel */
    int sms, burn_per_sm;       /* the GPU's SMs; burn blocks that fit on one at once */
    double burn_iter_s;         /* one wave's time per FMA round, as calibrated */
    uint32_t burn_blocks, burn_iters;
    uint32_t sink_blocks; /* what sink holds, burn_blocks at most */
#ifdef KVT_HAVE_CUDA
    cudaStream_t cs; /* the baseline's copies and the emulated compute */
    cudaEvent_t ev[2];
    float *sink; /* the burn kernel's output, one float per block */
#endif
};

/* ---- small helpers ---- */

/* The emulated compute: a busy-wait, since a sleep would give the core away and wake late. */
static void spin_for(double seconds)
{
    double end = cli_now() + seconds;

    while (cli_now() < end)
        ;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, kvt_strerror(rc));
    return -1;
}

static double max_d(double a, double b)
{
    return a > b ? a : b;
}

/* ---- the backend's part: the baseline copy and the emulated compute ---- */

#ifdef KVT_HAVE_CUDA
static int cuda_ok(const char *what, cudaError_t e)
{
    if (e == cudaSuccess)
        return 0;
    fprintf(stderr, "%s: %s: %s\n", PROG, what, cudaGetErrorString(e));
    return -1;
}

static void CUDART_CB spin_host_fn(void *arg)
{
    spin_for(*(const double *)arg);
}
#endif

static bool on_cuda(const struct rig *r)
{
    return r->be->kind == KVT_BACKEND_CUDA;
}

/* One contiguous copy of r->bytes, host to device (h2d) or back; returns when it landed. */
static int base_copy(struct rig *r, bool h2d)
{
#ifdef KVT_HAVE_CUDA
    if (on_cuda(r)) {
        void *dst = h2d ? r->base_dev : r->base_host, *src = h2d ? r->base_host : r->base_dev;
        enum cudaMemcpyKind kind = h2d ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;

        if (cuda_ok("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, r->bytes, kind, r->cs)))
            return -1;
        return cuda_ok("cudaStreamSynchronize", cudaStreamSynchronize(r->cs));
    }
#endif
    if (h2d)
        memcpy(r->base_dev, r->base_host, r->bytes);
    else
        memcpy(r->base_host, r->base_dev, r->bytes);
    return 0;
}

/* One layer's compute, queued behind the layer's wait (cuda) or done here (sim). */
static int compute_layer(struct rig *r)
{
#ifdef KVT_HAVE_KERNELS
    if (r->burn)
        return cuda_ok("burn kernel", xc_burn(r->burn_blocks, r->burn_iters, r->sink, r->cs));
#endif
#ifdef KVT_HAVE_CUDA
    if (on_cuda(r))
        return cuda_ok("cudaLaunchHostFunc", cudaLaunchHostFunc(r->cs, spin_host_fn, &r->spin));
#endif
    spin_for(r->spin);
    return 0;
}

/* Wait for the last layer's compute to finish. */
static int compute_sync(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (on_cuda(r))
        return cuda_ok("cudaStreamSynchronize", cudaStreamSynchronize(r->cs));
#endif
    (void)r;
    return 0;
}

/* The stream xfer_wait_layer makes wait: the compute stream on cuda; sim ignores it. */
static void *compute_stream(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (on_cuda(r))
        return r->cs;
#endif
    (void)r;
    return NULL;
}

static int stream_create(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (on_cuda(r))
        return cuda_ok("cudaStreamCreate",
                       cudaStreamCreateWithFlags(&r->cs, cudaStreamNonBlocking));
#endif
    (void)r;
    return 0;
}

static void stream_destroy(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (r->cs)
        cudaStreamDestroy(r->cs);
    r->cs = NULL;
    for (int i = 0; i < 2; i++)
        if (r->ev[i])
            cudaEventDestroy(r->ev[i]);
    cudaFree(r->sink);
    r->sink = NULL;
#endif
    (void)r;
}

/* ---- the compute kernel (cuda, in a build with the kernels) ---- */

#ifdef KVT_HAVE_KERNELS
/* Seconds that launches layers' compute take on the compute stream, by its events. */
static int burn_time(struct rig *r, uint64_t launches, double *seconds)
{
    float ms;

    if (cuda_ok("cudaEventRecord", cudaEventRecord(r->ev[0], r->cs)))
        return -1;
    for (uint64_t i = 0; i < launches; i++)
        if (compute_layer(r))
            return -1;
    if (cuda_ok("cudaEventRecord", cudaEventRecord(r->ev[1], r->cs)) ||
        cuda_ok("cudaEventSynchronize", cudaEventSynchronize(r->ev[1])) ||
        cuda_ok("cudaEventElapsedTime", cudaEventElapsedTime(&ms, r->ev[0], r->ev[1])))
        return -1;
    *seconds = ms * 1e-3;
    return 0;
}

/* Size the kernel for blocks blocks of iters rounds; the sink grows to match. */
static int burn_size(struct rig *r, uint32_t blocks, uint32_t iters)
{
    if (blocks > r->sink_blocks) {
        cudaFree(r->sink);
        r->sink = NULL;
        r->sink_blocks = 0;
        if (cuda_ok("cudaMalloc", cudaMalloc((void **)&r->sink, blocks * sizeof(float))))
            return -1;
        r->sink_blocks = blocks;
    }
    r->burn_blocks = blocks;
    r->burn_iters = iters;
    return 0;
}

/* Read the GPU's shape, bring its clocks up (a few dozen ms of full load), then time one
 * full wave of BURN_CAL_ITERS rounds: the median of five. */
static int burn_setup(struct rig *r)
{
    double t[5], warm;
    int dev;
    uint32_t wave;

    if (cuda_ok("cudaGetDevice", cudaGetDevice(&dev)) ||
        cuda_ok("SM count", cudaDeviceGetAttribute(&r->sms, cudaDevAttrMultiProcessorCount, dev)) ||
        cuda_ok("burn kernel occupancy", xc_blocks_per_sm(&r->burn_per_sm)) ||
        cuda_ok("cudaEventCreate", cudaEventCreate(&r->ev[0])) ||
        cuda_ok("cudaEventCreate", cudaEventCreate(&r->ev[1])))
        return -1;
    wave = (uint32_t)(r->sms * r->burn_per_sm);
    if (burn_size(r, wave, BURN_CAL_ITERS) || burn_time(r, 2000, &warm))
        return -1;
    for (int i = 0; i < 5; i++)
        if (burn_time(r, 1, &t[i]))
            return -1;
    r->burn_iter_s = cli_summarize(t, 5).median / BURN_CAL_ITERS;
    return 0;
}

/* Shape the kernel for compute seconds per layer: waves of about BURN_BLOCK_US, as a
 * matrix product's tiles retire and free their SMs, then measure what L layers of it take
 * alone; that, not the asked-for figure, is the compute the ideal uses. */
static int burn_point(struct rig *r, struct overlap_point *p)
{
    uint32_t layers = r->cfg->g.layers;
    double waves = p->asked / (BURN_BLOCK_US * 1e-6), iters;
    double *t = calloc(r->cfg->reps, sizeof(*t)), warm;
    int rc = t ? 0 : -1;

    waves = waves < 1 ? 1 : (double)(uint64_t)(waves + 0.5);
    iters = p->asked / waves / r->burn_iter_s;
    p->burn_blocks = (uint32_t)waves * (uint32_t)(r->sms * r->burn_per_sm);
    rc = rc ? rc : burn_size(r, p->burn_blocks, iters < 1 ? 1 : (uint32_t)(iters + 0.5));
    rc = rc ? rc : burn_time(r, layers, &warm);
    for (uint64_t i = 0; i < r->cfg->reps && !rc; i++)
        rc = burn_time(r, layers, &t[i]);
    if (!rc)
        p->compute = cli_summarize(t, r->cfg->reps).median / layers;
    free(t);
    return rc;
}
#endif

/* ---- choosing the pages ---- */

/* n distinct values of [first, first + count) in random order: a partial Fisher-Yates. */
static int sample(uint64_t *rng, uint32_t first, uint32_t count, uint32_t *out, size_t n)
{
    uint32_t *all = malloc((size_t)count * sizeof(*all));

    if (!all)
        return -ENOMEM;
    for (uint32_t i = 0; i < count; i++)
        all[i] = first + i;
    for (size_t i = 0; i < n; i++) {
        uint32_t j = (uint32_t)i + (uint32_t)rng_below(rng, count - i), t = all[i];

        all[i] = all[j];
        all[j] = t;
        out[i] = all[i];
    }
    free(all);
    return 0;
}

/* Page i continues the run of page i-1: the transfer engine would merge them. */
static bool joins(const struct rig *r, size_t i)
{
    return r->dev_pages[i] == r->dev_pages[i - 1] + 1 &&
           r->host_pages[i] == r->host_pages[i - 1] + 1;
}

static size_t count_runs(const struct rig *r, size_t n)
{
    size_t runs = n ? 1 : 0;

    for (size_t i = 1; i < n; i++)
        runs += !joins(r, i);
    return runs;
}

/* A random draw can still put two neighbours side by side on both pools; swapping a host
 * page away breaks that. Bounded passes: with a pool barely larger than N it may not
 * succeed, and the run count reported says so. */
static void break_runs(struct rig *r, uint64_t *rng, size_t n)
{
    for (int pass = 0; pass < 8 && count_runs(r, n) < n; pass++) {
        for (size_t i = 1; i < n; i++) {
            if (!joins(r, i))
                continue;
            uint32_t j = (uint32_t)rng_below(rng, n), t;

            j = j == i ? (uint32_t)i - 1 : j; /* never with itself, which would break nothing */
            t = r->host_pages[i];
            r->host_pages[i] = r->host_pages[j];
            r->host_pages[j] = t;
        }
    }
}

static int pick_random(struct rig *r, uint64_t *rng)
{
    size_t n = r->cfg->pages;
    uint32_t pool = (uint32_t)r->cfg->pool_pages;
    int rc;

    /* Device page 0 is the padding page, never handed out. */
    if ((rc = sample(rng, 1, pool, r->dev_pages, n)) ||
        (rc = sample(rng, 0, pool, r->host_pages, n)))
        return rc;
    break_runs(r, rng, n);
    return 0;
}

/* Runs of run_pages pages, each at a random whole block of both pools. */
static int pick_runs(struct rig *r, uint64_t *rng)
{
    uint32_t rp = (uint32_t)r->cfg->run_pages, blocks = (uint32_t)(r->cfg->pool_pages / rp);
    size_t n = r->cfg->pages, nruns = (n + rp - 1) / rp;
    uint32_t *blk = malloc(2 * nruns * sizeof(*blk));
    int rc = -ENOMEM;

    if (blk && !(rc = sample(rng, 0, blocks, blk, nruns)) &&
        !(rc = sample(rng, 0, blocks, blk + nruns, nruns))) {
        for (size_t i = 0; i < n; i++) {
            r->dev_pages[i] = 1 + blk[i / rp] * rp + (uint32_t)(i % rp);
            r->host_pages[i] = blk[nruns + i / rp] * rp + (uint32_t)(i % rp);
        }
    }
    free(blk);
    return rc;
}

static int pick_pages(struct rig *r)
{
    uint64_t rng = r->cfg->seed;
    size_t n = r->cfg->pages;
    int rc;

    r->dev_pages = malloc(n * sizeof(*r->dev_pages));
    r->host_pages = malloc(n * sizeof(*r->host_pages));
    if (!r->dev_pages || !r->host_pages)
        return fail("page lists", -ENOMEM);
    rc = r->cfg->scatter == SCATTER_RUNS ? pick_runs(r, &rng) : pick_random(r, &rng);
    if (rc)
        return fail("page lists", rc);
    r->runs = count_runs(r, n);
    return 0;
}

/* ---- setup ---- */

/* Bytes of host RAM the run takes: the host pool, and on sim the "device" pool and the
 * baseline's device buffer too. */
static uint64_t ram_needed(const struct rig *r)
{
    const struct config *cfg = r->cfg;
    uint64_t host = cfg->pool_pages * r->page_bytes;

    if (on_cuda(r))
        return host;
    return host + (cfg->pool_pages + 1) * r->page_bytes + r->bytes;
}

static int check_ram(const struct rig *r)
{
    uint64_t need = ram_needed(r), avail = host_memory_available();

    if (avail == 0 || need <= avail)
        return 0;
    fprintf(stderr,
            "%s: this run needs %.1f GiB of RAM and %.1f GiB are available: lower --pages or "
            "--pool-pages\n",
            PROG, (double)need / (1 << 30), (double)avail / (1 << 30));
    return -1;
}

/* Touch every byte now, so that no copy timed later pays for page faults (a fresh mapping
 * reads as the shared zero page and faults on its first write). */
static void fill_sim_pool(struct kv_pool *p)
{
    for (int w = 0; w < 2; w++)
        for (uint32_t l = 0; p->row_bytes[w] && l < p->geo.layers; l++)
            memset(p->buf[w][l], 0x5a + w, p->rows * p->row_bytes[w]);
}

static int open_pools(struct rig *r)
{
    const struct config *cfg = r->cfg;
    struct xfer_config xc = {.io = cfg->io,
                             .seed = cfg->seed,
                             .auto_dma_min_bytes = cfg->dma_min_bytes,
                             .kernel_blocks = (uint32_t)cfg->kernel_blocks,
                             .high_priority_loads = cfg->load_priority == PRIORITY_HIGH,
                             .dma_prefer_overlap = cfg->dma_hint == 1};
    int rc;

    if ((rc = kv_pool_init(&r->dev, r->be, &cfg->g, (cfg->pool_pages + 1) * cfg->page_size)))
        return fail("device pool", rc);
    r->dev_ready = true;
    rc = host_pool_init(&r->host, r->be, &cfg->g, cfg->page_size, cfg->pool_pages, cfg->layout);
    if (rc)
        return fail("host pool", rc);
    r->host_ready = true;
    if (!on_cuda(r))
        fill_sim_pool(&r->dev); /* cuda's alloc has already zeroed (and so mapped) it */
    memset(r->host.base, 0xa5, r->host.bytes);
    if ((rc = xfer_create(&r->dev, &r->host, &xc, &r->x)))
        return fail("xfer_create", rc);
    return 0;
}

/* The baseline's host side is the start of the host pool itself: the same memory, pinned
 * the same way, as the scattered copies use (its contents do not matter here). Its device
 * side is one buffer from the backend, as the pool's are. */
static int open_baseline(struct rig *r)
{
    int rc;

    if ((rc = r->be->alloc(r->bytes, &r->base_dev)))
        return fail("baseline device buffer", rc);
    r->base_host = r->host.base;
    if (!on_cuda(r))
        memset(r->base_dev, 0x5a, r->bytes);
    return stream_create(r);
}

/* 0, -1 after an error (said on stderr), or EXIT_SKIP when cuda was asked for and there is
 * no GPU to run it on. */
static int setup(struct rig *r)
{
    const struct config *cfg = r->cfg;
    int rc = dev_backend_select(cfg->backend, &r->be);

    if (rc == KVT_ENOBACKEND) {
        fprintf(stderr,
                "%s: --backend cuda: no CUDA device here, or this build has no CUDA; "
                "nothing measured\n",
                PROG);
        return EXIT_SKIP;
    }
    if (rc)
        return fail("backend", rc);
    r->page_bytes = (size_t)kvt_cell_bytes(&cfg->g) * cfg->page_size;
    r->bytes = cfg->pages * r->page_bytes;
    if (check_ram(r) || pick_pages(r) || open_pools(r) || open_baseline(r))
        return -1;
#ifdef KVT_HAVE_KERNELS
    r->burn = on_cuda(r) && cfg->compute != COMPUTE_HOST;
    if (r->burn && burn_setup(r))
        return -1;
#else
    if (on_cuda(r) && cfg->compute == COMPUTE_KERNEL) {
        fprintf(stderr, "%s: --compute kernel: this build has no CUDA kernels\n", PROG);
        return -1;
    }
#endif
    return 0;
}

static void teardown(struct rig *r)
{
    stream_destroy(r);
    xfer_destroy(r->x);
    if (r->base_dev)
        r->be->free(r->base_dev, r->bytes);
    if (r->host_ready)
        host_pool_finish(&r->host);
    if (r->dev_ready)
        kv_pool_finish(&r->dev);
    free(r->dev_pages);
    free(r->host_pages);
}

/* ---- (a) bandwidth ---- */

/* Count which path (kernel or dma) the engine took for ops of dir since before[]. */
static void count_paths(struct rig *r, enum xfer_dir dir, const uint64_t before[2])
{
    uint64_t after[2];

    xfer_path_ops(r->x, &after[0], &after[1]);
    r->path_ops[dir][0] += after[0] - before[0];
    r->path_ops[dir][1] += after[1] - before[1];
}

/* One op over the first n pages, submit to completion; checks that every byte counted. */
static int timed_xfer(struct rig *r, enum xfer_dir dir, size_t n, double *seconds)
{
    uint64_t before = xfer_bytes(r->x, dir), id, want = n * r->page_bytes, moved, paths[2];
    double t0;
    int rc;

    xfer_path_ops(r->x, &paths[0], &paths[1]);
    t0 = cli_now();
    rc = xfer_submit(r->x, dir, r->dev_pages, r->host_pages, n, NULL, &id);
    if (rc)
        return fail("xfer_submit", rc);
    rc = xfer_wait(r->x, dir, id);
    *seconds = cli_now() - t0;
    count_paths(r, dir, paths);
    if (rc)
        return fail(dir == XFER_LOAD ? "load" : "backup", rc);
    if ((moved = xfer_bytes(r->x, dir) - before) != want) {
        fprintf(stderr, "%s: the op moved %" PRIu64 " bytes, not %" PRIu64 "\n", PROG, moved, want);
        return -1;
    }
    return 0;
}

static int timed_base(struct rig *r, bool h2d, double *seconds)
{
    double t0 = cli_now();
    int rc = base_copy(r, h2d);

    *seconds = cli_now() - t0;
    return rc;
}

/* One rep of the four copies, interleaved so that drift in the machine hits all alike. */
static int bandwidth_rep(struct rig *r, double t[4])
{
    size_t n = r->cfg->pages;

    if (timed_base(r, true, &t[0]) || timed_xfer(r, XFER_LOAD, n, &t[1]) ||
        timed_base(r, false, &t[2]) || timed_xfer(r, XFER_BACKUP, n, &t[3]))
        return -1;
    return 0;
}

static int run_bandwidth(struct rig *r, struct bandwidth *bw)
{
    size_t reps = r->cfg->reps;
    double *t = calloc(4 * reps, sizeof(*t)), warm[4];
    int rc = t ? bandwidth_rep(r, warm) : fail("timings", -ENOMEM); /* the warm-up */

    for (size_t i = 0; i < reps && !rc; i++) {
        double one[4];

        rc = bandwidth_rep(r, one);
        for (int k = 0; k < 4; k++)
            t[k * reps + i] = one[k];
    }
    if (!rc) {
        bw->base_h2d = cli_summarize(t, reps);
        bw->load = cli_summarize(t + reps, reps);
        bw->base_d2h = cli_summarize(t + 2 * reps, reps);
        bw->backup = cli_summarize(t + 3 * reps, reps);
    }
    free(t);
    return rc;
}

/* ---- (b) overlap ---- */

/* A perfect pipeline: layer k's compute starts when its copy has landed and layer k-1's
 * compute is over. With compute >= copy that is L C + T, the target's ideal. */
static double ideal_prefill(uint32_t layers, double copy, double compute)
{
    return copy + compute + (layers - 1) * max_d(copy, compute);
}

/* The forward's side of a prefill: per layer, wait for it, then compute. */
static int prefill_layers(struct rig *r, uint64_t id)
{
    for (uint32_t l = 0; l < r->cfg->g.layers; l++) {
        int rc = xfer_wait_layer(r->x, id, l, compute_stream(r));

        if (rc)
            return fail("xfer_wait_layer", rc);
        if (compute_layer(r))
            return -1;
    }
    return compute_sync(r);
}

/* One prefill, from submitting the load to the end of the last layer's compute. */
static int prefill_once(struct rig *r, size_t n, double *seconds)
{
    uint64_t id, paths[2];
    double t0;
    int rc, wrc;

    xfer_path_ops(r->x, &paths[0], &paths[1]);
    t0 = cli_now();
    rc = xfer_submit(r->x, XFER_LOAD, r->dev_pages, r->host_pages, n, NULL, &id);
    if (rc)
        return fail("xfer_submit", rc);
    count_paths(r, XFER_LOAD, paths);
    rc = prefill_layers(r, id);
    *seconds = cli_now() - t0;
    wrc = xfer_wait(r->x, XFER_LOAD, id); /* also after a failure: the op is still queued */
    if (!rc && wrc)
        return fail("load", wrc);
    return rc;
}

/* Median and best of reps calls of fn after one warm-up. */
static int repeat(struct rig *r, size_t n, int (*fn)(struct rig *, size_t, double *),
                  struct cli_timing *out)
{
    size_t reps = r->cfg->reps;
    double *t = calloc(reps, sizeof(*t)), warm;
    int rc = t ? fn(r, n, &warm) : fail("timings", -ENOMEM);

    for (size_t i = 0; i < reps && !rc; i++)
        rc = fn(r, n, &t[i]);
    if (!rc)
        *out = cli_summarize(t, reps);
    free(t);
    return rc;
}

static int load_once(struct rig *r, size_t n, double *seconds)
{
    return timed_xfer(r, XFER_LOAD, n, seconds);
}

/* Auto compute: AUTO_COMPUTE_FACTOR layer copies, whole microseconds, at least 1. */
static double auto_compute(double layer)
{
    double us = (double)(uint64_t)(layer * AUTO_COMPUTE_FACTOR * 1e6 + 0.999);

    return (us < 1 ? 1 : us) * 1e-6;
}

static int run_overlap(struct rig *r, struct overlap *ov)
{
    const struct config *cfg = r->cfg;
    size_t n = cfg->overlap_pages;
    int rc = repeat(r, n, load_once, &ov->load);

    ov->layer = ov->load.median / cfg->g.layers;
    for (size_t i = 0; i < cfg->ncompute && !rc; i++) {
        struct overlap_point *p = &ov->pt[i];

        p->automatic = cfg->compute_us[i] == 0;
        p->asked = p->automatic ? auto_compute(ov->layer) : (double)cfg->compute_us[i] * 1e-6;
        p->compute = r->spin = p->asked;
#ifdef KVT_HAVE_KERNELS
        if (r->burn && burn_point(r, p))
            return -1;
#endif
        p->ideal = ideal_prefill(cfg->g.layers, ov->layer, p->compute);
        rc = repeat(r, n, prefill_once, &p->measured);
    }
    return rc;
}

/* ---- report ---- */

static double target_ratio(const struct rig *r)
{
    return on_cuda(r) ? TARGET_RATIO_GPU : TARGET_RATIO_SIM;
}

static void print_text_config(const struct rig *r)
{
    const struct config *cfg = r->cfg;
    const struct kvt_geometry *g = &cfg->g;

    printf("%s: %s backend, io %s%s, host layout %s (%s)\n", PROG, r->be->name, io_names[cfg->io],
           on_cuda(r) ? "" : " (sim ignores it)", layout_names[cfg->layout],
           r->host.pinned ? "pinned" : "not pinned");
    printf("  geometry  %s: %u layers, ", cfg->geometry_arg, g->layers);
    if (g->attention == KVT_ATTN_MLA)
        printf("MLA latent %u + rope %u", g->kv_lora_rank, g->qk_rope_head_dim);
    else
        printf("%u KV heads of %u", g->kv_heads, g->head_dim);
    printf(", %u-byte elements; page %u tokens = ", g->dtype_bytes, cfg->page_size);
    cli_print_size(r->page_bytes);
    printf("\n  pages     %" PRIu64 " of %" PRIu64 " in each pool, ", cfg->pages, cfg->pool_pages);
    if (cfg->scatter == SCATTER_RUNS)
        printf("in runs of %" PRIu64, cfg->run_pages);
    else
        printf("scattered at random");
    printf(" (seed %" PRIu64 "): %zu runs\n", cfg->seed, r->runs);
    if (on_cuda(r))
        printf("  streams   loads at %s priority; kernel path at most %" PRIu64
               " blocks of 8 warps per layer%s; copy-engine hint %s\n",
               priority_names[cfg->load_priority],
               cfg->kernel_blocks ? cfg->kernel_blocks : (uint64_t)XFER_KERNEL_BLOCKS,
               cfg->kernel_blocks ? "" : " (the engine's default)", dma_hint_names[cfg->dma_hint]);
    if (on_cuda(r))
        printf("  paths     loads: %" PRIu64 " by kernel, %" PRIu64 " by dma; backups: %" PRIu64
               " by kernel, %" PRIu64 " by dma\n",
               r->path_ops[XFER_LOAD][0], r->path_ops[XFER_LOAD][1], r->path_ops[XFER_BACKUP][0],
               r->path_ops[XFER_BACKUP][1]);
}

static void print_text_dir(const char *name, const struct cli_timing *x, const struct cli_timing *b,
                           uint64_t bytes, double target)
{
    double rm = cli_ratio(b->median, x->median), rb = cli_ratio(b->best, x->best);

    printf("  %-13s %6.2f (%6.2f) GB/s  %6.2f (%6.2f) GB/s  %5.3f (%5.3f)  >= %.2f %s\n", name,
           cli_gbps(bytes, x->median), cli_gbps(bytes, x->best), cli_gbps(bytes, b->median),
           cli_gbps(bytes, b->best), rm, rb, target, cli_met(rm >= target));
}

static void print_text_bandwidth(const struct rig *r, const struct bandwidth *bw)
{
    printf("\n(a) bandwidth: ");
    cli_print_size(r->bytes);
    printf(" per op, median (best) of %" PRIu64 " after a warm-up\n", r->cfg->reps);
    printf("    one copy: %s\n",
           on_cuda(r) ? "one cudaMemcpyAsync between the host pool and a device buffer"
                      : "one memcpy between the host pool and a buffer, one thread");
    printf("  %-13s %-22s %-22s %-15s %s\n", "", "scattered", "one copy", "ratio", "target");
    print_text_dir("load (H2D)", &bw->load, &bw->base_h2d, r->bytes, target_ratio(r));
    print_text_dir("backup (D2H)", &bw->backup, &bw->base_d2h, r->bytes, target_ratio(r));
}

static void print_text_overlap(const struct rig *r, const struct overlap *ov)
{
    const struct config *cfg = r->cfg;
    uint64_t bytes = cfg->overlap_pages * r->page_bytes;

    printf("\n(b) overlap: prefill of %u layers over %" PRIu64 " pages (", cfg->g.layers,
           cfg->overlap_pages);
    cli_print_size(bytes);
    printf("), median of %" PRIu64 " after a warm-up\n", cfg->reps);
    printf("  one layer's copy %.1f us (", ov->layer * 1e6);
    cli_print_size(bytes / cfg->g.layers);
    printf(", whole load %.2f ms at %.2f GB/s)\n", ov->load.median * 1e3,
           cli_gbps(bytes, ov->load.median));
    if (r->burn)
        printf(
            "  compute   a kernel of waves of %d SMs x %d blocks of %d threads, each block about "
            "%.0f us;\n            compute/layer is its time alone, for %u layers in a row\n",
            r->sms, r->burn_per_sm, XC_THREADS_OR_0, BURN_BLOCK_US, cfg->g.layers);
    else if (on_cuda(r))
        printf("  compute   a host function busy-waiting on the compute stream (no SM taken)\n");
    printf("  %-16s %12s %12s %10s %13s   %s\n", "compute/layer", "measured", "ideal", "overhead",
           "copy/compute", "target");
    for (size_t i = 0; i < cfg->ncompute; i++) {
        const struct overlap_point *p = &ov->pt[i];
        double over = 100 * (cli_ratio(p->measured.median, p->ideal) - 1);

        printf("  %9.1f us%-5s %9.2f ms %9.2f ms %+9.2f%% %13.3f   <= %.0f%% %s\n",
               p->compute * 1e6, p->automatic ? " auto" : "", p->measured.median * 1e3,
               p->ideal * 1e3, over, cli_ratio(ov->layer, p->compute), TARGET_OVERHEAD_PCT,
               cli_met(over <= TARGET_OVERHEAD_PCT));
    }
}

static void print_json_geometry(struct jw *w, const struct config *cfg)
{
    const struct kvt_geometry *g = &cfg->g;

    jw_string(w, "geometry", cfg->geometry_arg);
    jw_string(w, "attention", g->attention == KVT_ATTN_MLA ? "mla" : "mha");
    jw_u64(w, "layers", g->layers);
    jw_u64(w, "kv_heads", g->kv_heads);
    jw_u64(w, "head_dim", g->head_dim);
    jw_u64(w, "v_head_dim", g->v_head_dim ? g->v_head_dim : g->head_dim);
    jw_u64(w, "kv_lora_rank", g->kv_lora_rank);
    jw_u64(w, "qk_rope_head_dim", g->qk_rope_head_dim);
    jw_u64(w, "dtype_bytes", g->dtype_bytes);
}

static void print_json_paths(struct jw *w, const struct rig *r)
{
    static const char *const dirs[2] = {[XFER_LOAD] = "load", [XFER_BACKUP] = "backup"};

    jw_object(w, "path_ops");
    for (int d = 0; d < 2; d++) {
        jw_object(w, dirs[d]);
        jw_u64(w, "kernel", r->path_ops[d][0]);
        jw_u64(w, "dma", r->path_ops[d][1]);
        jw_end(w);
    }
    jw_end(w);
}

static void print_json_config(struct jw *w, const struct rig *r)
{
    const struct config *cfg = r->cfg;

    jw_object(w, "config");
    jw_string(w, "backend", r->be->name);
    jw_string(w, "io", io_names[cfg->io]);
    jw_string(w, "load_priority", priority_names[cfg->load_priority]);
    jw_u64(w, "kernel_blocks", cfg->kernel_blocks ? cfg->kernel_blocks : XFER_KERNEL_BLOCKS);
    jw_string(w, "dma_hint", dma_hint_names[cfg->dma_hint]);
    jw_string(w, "layout", layout_names[cfg->layout]);
    jw_bool(w, "host_pinned", r->host.pinned);
    print_json_geometry(w, cfg);
    jw_u64(w, "page_size", cfg->page_size);
    jw_u64(w, "page_bytes", r->page_bytes);
    jw_u64(w, "pages", cfg->pages);
    jw_u64(w, "pool_pages", cfg->pool_pages);
    jw_string(w, "scatter", scatter_names[cfg->scatter]);
    if (cfg->scatter == SCATTER_RUNS)
        jw_u64(w, "run_pages", cfg->run_pages);
    else
        jw_null(w, "run_pages");
    jw_u64(w, "runs", r->runs);
    jw_u64(w, "reps", cfg->reps);
    jw_u64(w, "seed", cfg->seed);
    jw_u64(w, "dma_min_bytes", cfg->dma_min_bytes);
    print_json_paths(w, r);
    jw_end(w);
}

static void print_json_ratio(struct jw *w, const char *name, const struct cli_timing *x,
                             const struct cli_timing *b)
{
    jw_object(w, name);
    jw_double(w, "median", "%.6g", cli_ratio(b->median, x->median));
    jw_double(w, "best", "%.6g", cli_ratio(b->best, x->best));
    jw_end(w);
}

static void print_json_bandwidth(struct jw *w, const struct rig *r, const struct bandwidth *bw)
{
    jw_object(w, "bandwidth");
    jw_u64(w, "bytes", r->bytes);
    jw_string(w, "baseline", on_cuda(r) ? "cudaMemcpyAsync" : "memcpy");
    rpt_json_timing(w, "load", &bw->load, r->bytes, false);
    rpt_json_timing(w, "backup", &bw->backup, r->bytes, false);
    rpt_json_timing(w, "baseline_h2d", &bw->base_h2d, r->bytes, false);
    rpt_json_timing(w, "baseline_d2h", &bw->base_d2h, r->bytes, false);
    print_json_ratio(w, "load_ratio", &bw->load, &bw->base_h2d);
    print_json_ratio(w, "backup_ratio", &bw->backup, &bw->base_d2h);
    jw_double(w, "target_ratio", "%.2f", target_ratio(r));
    jw_end(w);
}

static void print_json_point(struct jw *w, const struct overlap *ov, const struct overlap_point *p)
{
    jw_object(w, NULL);
    jw_double(w, "compute_us", "%.3f", p->compute * 1e6);
    jw_double(w, "asked_us", "%.3f", p->asked * 1e6);
    jw_u64(w, "compute_blocks", p->burn_blocks);
    jw_bool(w, "auto", p->automatic);
    jw_double(w, "measured_s", "%.9g", p->measured.median);
    jw_double(w, "best_s", "%.9g", p->measured.best);
    jw_double(w, "ideal_s", "%.9g", p->ideal);
    jw_double(w, "overhead_pct", "%.4f", 100 * (cli_ratio(p->measured.median, p->ideal) - 1));
    jw_double(w, "copy_compute_ratio", "%.6g", cli_ratio(ov->layer, p->compute));
    jw_end(w);
}

static void print_json_overlap(struct jw *w, const struct rig *r, const struct overlap *ov)
{
    const struct config *cfg = r->cfg;
    uint64_t bytes = cfg->overlap_pages * r->page_bytes;

    jw_object(w, "overlap");
    jw_u64(w, "layers", cfg->g.layers);
    jw_u64(w, "pages", cfg->overlap_pages);
    jw_u64(w, "bytes", bytes);
    jw_u64(w, "layer_bytes", bytes / cfg->g.layers);
    rpt_json_timing(w, "load", &ov->load, bytes, false);
    jw_double(w, "layer_copy_s", "%.9g", ov->layer);
    jw_string(w, "compute", r->burn ? "kernel" : on_cuda(r) ? "host" : "busy-wait");
    jw_double(w, "target_overhead_pct", "%.1f", TARGET_OVERHEAD_PCT);
    jw_array(w, "points");
    for (size_t i = 0; i < cfg->ncompute; i++)
        print_json_point(w, ov, &ov->pt[i]);
    jw_end(w);
    jw_end(w);
}

static void print_report(const struct rig *r, const struct bandwidth *bw, const struct overlap *ov)
{
    struct jw w;

    if (!r->cfg->json) {
        print_text_config(r);
        print_text_bandwidth(r, bw);
        print_text_overlap(r, ov);
        return;
    }
    jw_init(&w);
    jw_object(&w, NULL);
    print_json_config(&w, r);
    print_json_bandwidth(&w, r, bw);
    print_json_overlap(&w, r, ov);
    jw_end(&w);
    putchar('\n');
}

/* ---- command line ---- */

/* --compute-us, given the whole config. */
static int parse_compute(void *field, const char *opt, const char *arg)
{
    struct config *cfg = field;
    char buf[512];
    char *save = NULL, *tok;
    uint64_t v;

    (void)opt;
    if (strlen(arg) >= sizeof(buf))
        return cli_bad_usage(PROG, "--compute-us is too long", NULL);
    strcpy(buf, arg);
    cfg->ncompute = 0;
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (cfg->ncompute == MAX_COMPUTE)
            return cli_bad_usage(PROG, "--compute-us takes at most 16 values", arg);
        if (strcmp(tok, "auto") == 0)
            v = 0;
        else if (!cli_parse_u64(tok, &v) || v == 0 || v > 10000000)
            return cli_bad_usage(PROG, "--compute-us needs auto or 1 to 10000000 us", tok);
        cfg->compute_us[cfg->ncompute++] = v;
    }
    if (cfg->ncompute == 0)
        return cli_bad_usage(PROG, "--compute-us needs at least one value", arg);
    return 0;
}

/* --layers and friends: a struct override. */
static int parse_override(void *field, const char *opt, const char *val)
{
    struct override *o = field;
    uint64_t v;
    int rc = cli_parse_count(PROG, opt, val, 1, UINT32_MAX, false, &v);

    o->set = rc == 0;
    o->v = (uint32_t)v;
    return rc;
}

static int parse_page_size(void *field, const char *opt, const char *val)
{
    uint64_t v;

    (void)opt;
    if (!cli_parse_u64(val, &v) || v == 0 || v > 256 || (v & (v - 1)))
        return cli_bad_usage(PROG, "--page-size needs a power of two from 1 to 256", val);
    *(uint32_t *)field = (uint32_t)v;
    return 0;
}

/* --geometry, given the whole config: the geometry and the argument it came from. */
static int parse_geometry(void *field, const char *opt, const char *val)
{
    struct config *cfg = field;

    (void)opt;
    cfg->geometry_arg = val;
    return cli_parse_geometry(PROG, val, &cfg->g, &cfg->tp_size);
}

static void print_presets(FILE *f)
{
    cli_print_presets(f, "                        ");
}

/* The limits keep every page and slot number inside the 32-bit types the engine uses. */
#define MAX_POOL_PAGES (1u << 24)

/* Figures the help quotes, as strings. */
#define OVERLAP_PAGES_S CLI_STR(DEFAULT_OVERLAP_PAGES)
#define KERNEL_BLOCKS_S CLI_STR(XFER_KERNEL_BLOCKS)
#define MAX_COMPUTE_S CLI_STR(MAX_COMPUTE)
#define AUTO_COMPUTE_S CLI_STR(AUTO_COMPUTE_FACTOR)

#define OFF(f) offsetof(struct config, f)
static const struct cli_option options[] = {
    {.kind = CLI_TEXT, .help = "\nGeometry:\n"},
    {"--geometry", CLI_CUSTOM, .parse = parse_geometry, .arg = "G",
     .help = "a preset, key=value pairs, or a preset then pairs, comma\n"
             "separated (keys: attention=mha|mla, layers, kv_heads,\n"
             "head_dim, v_head_dim, kv_lora_rank, qk_rope_head_dim,\n"
             "dtype_bytes, tp_size). Default " DEFAULT_GEOMETRY ". Presets:",
     .more = print_presets},
    {.kind = CLI_TEXT,
     .help = "  --layers N, --kv-heads N, --head-dim N, --dtype-bytes N\n"
             "                      override one field of the geometry (after --geometry,\n"
             "                      wherever they stand)\n"},
    {"--layers", CLI_CUSTOM, OFF(layers), .parse = parse_override},
    {"--kv-heads", CLI_CUSTOM, OFF(kv_heads), .parse = parse_override},
    {"--head-dim", CLI_CUSTOM, OFF(head_dim), .parse = parse_override},
    {"--dtype-bytes", CLI_CUSTOM, OFF(dtype_bytes), .parse = parse_override},
    {"--page-size", CLI_CUSTOM, OFF(page_size), .parse = parse_page_size, .arg = "N",
     .help = "tokens per page, a power of two up to 256 (default 16)"},
    {.kind = CLI_TEXT, .help = "\nPages:\n"},
    {"--pages", CLI_COUNT, OFF(pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "pages per op in (a) (default " CLI_STR(DEFAULT_PAGES) ")"},
    {"--pool-pages", CLI_COUNT, OFF(pool_pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "usable pages in each pool, at least --pages (default 1.5 x\n"
             "--pages); the device pool has one more, its padding page"},
    {"--scatter", CLI_NAME, OFF(scatter), CLI_NAMES(scatter_names), .arg = "S",
     .help = "random (default): pages at random places, no two\n"
             "neighbours in the list consecutive in both pools, so\n"
             "nothing coalesces;\n"
             "runs: runs of --run-pages pages at random places"},
    {"--run-pages", CLI_COUNT, OFF(run_pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "pages per run with --scatter runs (default " CLI_STR(DEFAULT_RUN_PAGES) ")"},
    {"--seed", CLI_COUNT, OFF(seed), 0, UINT64_MAX, .arg = "N",
     .help = "seeds the choice of pages (default 1)"},
    {"--overlap-pages", CLI_COUNT, OFF(overlap_pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "the request's pages in (b), the first N of (a)'s (default\n" OVERLAP_PAGES_S
             ", or --pages when fewer)"},
    {"--compute-us", CLI_CUSTOM, .parse = parse_compute, .arg = "LIST",
     .help = "compute per layer in (b), microseconds, comma separated,\n"
             "up to " MAX_COMPUTE_S " values; auto is " AUTO_COMPUTE_S
             " x one layer's copy as measured\n"
             "(default auto)"},
    {"--reps", CLI_COUNT, OFF(reps), 1, 1000, .arg = "N",
     .help = "timed repetitions of each measurement after a warm-up;\n"
             "medians and bests are reported (default " CLI_STR(DEFAULT_REPS) ")"},
    {.kind = CLI_TEXT, .help = "\nEngine:\n"},
    {"--backend", CLI_NAME, OFF(backend), CLI_NAMES(backend_names), .arg = "B",
     .help = "auto, sim or cuda (default auto: cuda when there is a GPU)"},
    {"--io", CLI_NAME, OFF(io), CLI_NAMES(io_names), .arg = "M",
     .help = "auto, kernel or dma: how cuda copies (sim ignores it;\ndefault auto)"},
    {"--dma-min-bytes", CLI_COUNT, OFF(dma_min_bytes), 0, UINT64_MAX, .arg = "N",
     .help = "with --io auto on cuda: an op whose copies average at\n"
             "least N bytes goes by the copy engine, a shorter one by\n"
             "the kernels (default 0: the engine's own threshold)"},
    {"--kernel-blocks", CLI_COUNT, OFF(kernel_blocks), 0, 4096, .arg = "N",
     .help = "cuda kernel path: blocks of 8 warps per layer of a copy at\n"
             "most (default 0: the engine's, " KERNEL_BLOCKS_S ";\n"
             "4096: one warp per page part)"},
    {"--load-priority", CLI_NAME, OFF(load_priority), CLI_NAMES(priority_names), .arg = "P",
     .help = "cuda: high (default, as the engine's host tier) or\n"
             "default, the load stream's priority"},
    {"--dma-hint", CLI_NAME, OFF(dma_hint), CLI_NAMES(dma_hint_names), .arg = "H",
     .help = "cuda copy engine: none (default) or overlap, which asks\n"
             "cudaMemcpyBatchAsync to prefer overlapping compute"},
    {"--compute", CLI_NAME, OFF(compute), CLI_NAMES(compute_names), .arg = "C",
     .help = "cuda: what (b)'s compute is: kernel, a kernel of FMA\n"
             "chains over every SM in waves of about 20 us blocks;\n"
             "host, a host function busy-waiting on the compute\n"
             "stream (it takes no SM); auto (default): kernel where\n"
             "this build has the kernels. sim: always a busy-wait"},
    {"--layout", CLI_NAME, OFF(layout), CLI_NAMES(layout_names), .arg = "L",
     .help = "host pool layout: page_first (default) or layer_first"},
    {.kind = CLI_TEXT, .help = "\nOutput:\n"},
    {"--json", CLI_FLAG, OFF(json), .help = "one JSON object on stdout instead of the text report"},
    {"--help", CLI_HELP, .help = "print this and exit"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "\n"
            "Measure kvtier's transfer engine and print figures (a benchmark: timing never\n"
            "fails a run).\n"
            "(a) bandwidth: N pages scattered over the device and host pools are loaded\n"
            "    (host -> device) and backed up (device -> host), each as one op, against one\n"
            "    contiguous copy of the same bytes on the same backend in the same run (sim:\n"
            "    one memcpy on one thread; cuda: one cudaMemcpyAsync between the pinned host\n"
            "    pool and a device buffer). Target: scattered / one copy >= %.2f on sim,\n"
            "    >= %.2f on a GPU.\n"
            "(b) overlap: a prefill of L layers, each waiting for its layer of a load and then\n"
            "    computing C us (sim: a busy-wait on this thread; cuda: a kernel over every SM,\n"
            "    see --compute, C then measured alone in the same run), against the ideal\n"
            "    T + C + (L-1) max(T, C) (L C + T when C >= T), T one layer's copy measured in\n"
            "    the same run.\n"
            "    Target: within %.0f%% of the ideal.\n",
            PROG, TARGET_RATIO_SIM, TARGET_RATIO_GPU, TARGET_OVERHEAD_PCT);
    cli_print_options(f, options, CLI_COUNT_OF(options), 22);
    fprintf(f,
            "\n"
            "Exit status: 0 when the figures were measured, 1 on an error, 2 on bad usage, %d\n"
            "when --backend cuda is asked for and there is no GPU (or no CUDA in this build).\n",
            EXIT_SKIP);
}

/* The overrides, then the geometry as a whole must still be a model. */
static int apply_overrides(struct config *cfg)
{
    struct override *o[] = {&cfg->layers, &cfg->kv_heads, &cfg->head_dim, &cfg->dtype_bytes};
    uint32_t *f[] = {&cfg->g.layers, &cfg->g.kv_heads, &cfg->g.head_dim, &cfg->g.dtype_bytes};

    for (size_t i = 0; i < 4; i++)
        if (o[i]->set)
            *f[i] = o[i]->v;
    if (kv_geometry_check(&cfg->g))
        return cli_bad_usage(PROG,
                             "the geometry with --layers/--kv-heads/--head-dim/"
                             "--dtype-bytes is not a valid model",
                             NULL);
    return 0;
}

/* Defaults that depend on other options, and the checks between options. */
static int finish_config(struct config *cfg)
{
    int rc = apply_overrides(cfg);

    if (rc)
        return rc;
    if (!cfg->pool_pages)
        cfg->pool_pages = cfg->pages + cfg->pages / 2 > MAX_POOL_PAGES
                              ? MAX_POOL_PAGES
                              : cfg->pages + cfg->pages / 2;
    if (!cfg->overlap_pages)
        cfg->overlap_pages =
            cfg->pages < DEFAULT_OVERLAP_PAGES ? cfg->pages : DEFAULT_OVERLAP_PAGES;
    if (cfg->pool_pages < cfg->pages)
        return cli_bad_usage(PROG, "--pool-pages must be at least --pages", NULL);
    if (cfg->overlap_pages > cfg->pages)
        return cli_bad_usage(PROG, "--overlap-pages must be at most --pages", NULL);
    if ((cfg->pool_pages + 1) * cfg->page_size >= INT32_MAX)
        return cli_bad_usage(PROG, "--pool-pages x --page-size must stay below 2^31 slots", NULL);
    if (cfg->scatter == SCATTER_RUNS &&
        (cfg->pages + cfg->run_pages - 1) / cfg->run_pages > cfg->pool_pages / cfg->run_pages)
        return cli_bad_usage(PROG, "--pool-pages has too few blocks of --run-pages for --pages",
                             NULL);
    if (!cfg->ncompute)
        cfg->ncompute = 1; /* compute_us[0] is 0: auto */
    return 0;
}

int main(int argc, char **argv)
{
    struct config cfg = {.geometry_arg = DEFAULT_GEOMETRY,
                         .page_size = 16,
                         .run_pages = DEFAULT_RUN_PAGES,
                         .pages = DEFAULT_PAGES,
                         .reps = DEFAULT_REPS,
                         .seed = 1};
    struct rig r = {.cfg = &cfg};
    struct bandwidth bw = {0};
    struct overlap ov = {0};
    int rc = cli_parse_geometry(PROG, DEFAULT_GEOMETRY, &cfg.g, &cfg.tp_size);

    if (rc == 0)
        rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), &cfg, argc, argv, usage);
    if (rc == 0)
        rc = finish_config(&cfg);
    if (rc)
        return rc < 0 ? 0 : rc;
    rc = setup(&r);
    if (rc == 0 && (run_bandwidth(&r, &bw) || run_overlap(&r, &ov)))
        rc = -1;
    if (rc == 0)
        print_report(&r, &bw, &ov);
    teardown(&r);
    return rc == EXIT_SKIP ? EXIT_SKIP : rc ? 1 : 0;
}
