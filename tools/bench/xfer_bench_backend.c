/* kvtier-xfer-bench's backend part (xfer_bench.h): the baseline copy and the emulated compute,
 * a busy-wait or (cuda, with the kernels) a burn kernel sized for it. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_bench.h"

/* ---- small helpers ---- */

/* The emulated compute: a busy-wait, since a sleep would give the core away and wake late. */
static void spin_for(double seconds)
{
    double end = cli_now() + seconds;

    while (cli_now() < end)
        ;
}

int xb_fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, kvt_strerror(rc));
    return -1;
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

bool xb_on_cuda(const struct rig *r)
{
    return r->be->kind == KVT_BACKEND_CUDA;
}

/* One contiguous copy of r->bytes, host to device (h2d) or back; returns when it landed. */
int xb_base_copy(struct rig *r, bool h2d)
{
#ifdef KVT_HAVE_CUDA
    if (xb_on_cuda(r)) {
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
int xb_compute_layer(struct rig *r)
{
#ifdef KVT_HAVE_KERNELS
    if (r->burn)
        return cuda_ok("burn kernel", xc_burn(r->burn_blocks, r->burn_iters, r->sink, r->cs));
#endif
#ifdef KVT_HAVE_CUDA
    if (xb_on_cuda(r))
        return cuda_ok("cudaLaunchHostFunc", cudaLaunchHostFunc(r->cs, spin_host_fn, &r->spin));
#endif
    spin_for(r->spin);
    return 0;
}

/* Wait for the last layer's compute to finish. */
int xb_compute_sync(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (xb_on_cuda(r))
        return cuda_ok("cudaStreamSynchronize", cudaStreamSynchronize(r->cs));
#endif
    (void)r;
    return 0;
}

/* The stream xfer_wait_layer makes wait: the compute stream on cuda; sim ignores it. */
void *xb_compute_stream(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (xb_on_cuda(r))
        return r->cs;
#endif
    (void)r;
    return NULL;
}

int xb_stream_create(struct rig *r)
{
#ifdef KVT_HAVE_CUDA
    if (xb_on_cuda(r))
        return cuda_ok("cudaStreamCreate",
                       cudaStreamCreateWithFlags(&r->cs, cudaStreamNonBlocking));
#endif
    (void)r;
    return 0;
}

void xb_stream_destroy(struct rig *r)
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
        if (xb_compute_layer(r))
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
int xb_burn_setup(struct rig *r)
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
int xb_burn_point(struct rig *r, struct overlap_point *p)
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
