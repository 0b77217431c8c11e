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
 *     same run, and that time is the C of the ideal. --compute host keeps the older *
 * Its files, each calling only those below it:
 *   xfer_bench.c          main
 *   xfer_bench_options.c  the command line: options, their checks, --help
 *   xfer_bench_report.c   the report, text and JSON
 *   xfer_bench_run.c      (a) bandwidth and (b) overlap, rep by rep
 *   xfer_bench_setup.c    the pools, the transfer engine and the pages chosen
 *   xfer_bench_backend.c  the backend's part: the baseline copy, the emulated compute (a
 *                         busy-wait, or with the kernels a burn kernel sized for C)
 */
#ifndef KVT_XFER_BENCH_H
#define KVT_XFER_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#ifdef KVT_HAVE_KERNELS
#include "xfer_compute.h"
#endif

#include "kvtier.h"
#include "cli.h"
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
/* Names of the config's enums, as the options take them (xfer_bench_options.c). */
extern const char *const xb_backend_names[3];
extern const char *const xb_io_names[3];
extern const char *const xb_layout_names[2];
extern const char *const xb_scatter_names[2];
extern const char *const xb_compute_names[3];
extern const char *const xb_priority_names[2];
extern const char *const xb_dma_hint_names[2];
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

static inline double max_d(double a, double b)
{
    return a > b ? a : b;
}

/* ---- the command line (xfer_bench_options.c) ---- */

/* The options into cfg, then the defaults that depend on others and the checks between
 * them: 0 to go on, -1 after --help, else the exit status. */
int xb_parse_args(struct config *cfg, int argc, char **argv);

/* ---- the report (xfer_bench_report.c) ---- */

void xb_print_report(const struct rig *r, const struct bandwidth *bw, const struct overlap *ov);

/* ---- the runs (xfer_bench_run.c) ---- */

int xb_run_bandwidth(struct rig *r, struct bandwidth *bw);
int xb_run_overlap(struct rig *r, struct overlap *ov);

/* ---- the rig (xfer_bench_setup.c) ---- */

/* 0, EXIT_SKIP when the backend asked for is not here, or -1 after saying why. */
int xb_setup(struct rig *r);
void xb_teardown(struct rig *r);

/* ---- the backend's part (xfer_bench_backend.c) ---- */

/* "PROG: what: error" on stderr: -1. */
int xb_fail(const char *what, int rc);
bool xb_on_cuda(const struct rig *r);
/* The baseline: one contiguous copy of the bytes (a) moves, h2d or d2h. */
int xb_base_copy(struct rig *r, bool h2d);
/* One layer's compute, on the compute stream (cuda) or this thread (sim); then wait for it. */
int xb_compute_layer(struct rig *r);
int xb_compute_sync(struct rig *r);
/* The stream compute runs on, for xfer_wait_layer (NULL on sim). */
void *xb_compute_stream(struct rig *r);
int xb_stream_create(struct rig *r);
void xb_stream_destroy(struct rig *r);
#ifdef KVT_HAVE_KERNELS
/* The burn kernel calibrated (its blocks per SM, its time per round). */
int xb_burn_setup(struct rig *r);
/* The burn kernel sized for point p's compute and timed alone: p->compute. */
int xb_burn_point(struct rig *r, struct overlap_point *p);
#endif

#endif
