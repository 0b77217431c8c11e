/* The cuda backend: plain CUDA runtime calls, compiled only when the toolkit is found. */
#include "backend.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "kvtier.h"
#ifdef KVT_HAVE_KERNELS
#include "kv_copy.h"
#endif

int dev_cuda_device_count(void)
{
    int n = 0;

    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* no driver or no device: clear the sticky error and say none */
        return 0;
    }
    return n;
}

/* Wait for the legacy default stream, where the synchronous calls below queue their work. */
static int settle(void)
{
    if (cudaStreamSynchronize(cudaStreamLegacy) != cudaSuccess) {
        cudaGetLastError();
        return KVT_EBACKEND;
    }
    return 0;
}

static int cuda_alloc(size_t bytes, void **ptr)
{
    if (cudaMalloc(ptr, bytes ? bytes : 1) != cudaSuccess) {
        *ptr = NULL;
        return -ENOMEM;
    }
    /* cudaMemset returns before it runs, and the transfer engine's non-blocking streams do
     * not wait for the legacy stream it runs on: let it finish here. */
    if (cudaMemset(*ptr, 0, bytes) != cudaSuccess || settle()) {
        cudaFree(*ptr);
        *ptr = NULL;
        return KVT_EBACKEND;
    }
    return 0;
}

static void cuda_free(void *ptr, size_t bytes)
{
    (void)bytes;
    if (ptr)
        cudaFree(ptr);
}

int dev_cuda_table(void **const bufs[2], uint32_t layers, void ***out)
{
    size_t n = 2 * (size_t)layers, bytes = n * sizeof(void *);
    void **tab = calloc(n, sizeof(void *));
    int rc = KVT_EBACKEND;

    *out = NULL;
    if (!tab)
        return -ENOMEM;
    for (int w = 0; w < 2; w++)
        for (uint32_t l = 0; bufs[w] && l < layers; l++)
            tab[w * layers + l] = bufs[w][l];
    if (cudaMalloc((void **)out, bytes) != cudaSuccess)
        *out = NULL;
    else if (cudaMemcpy(*out, tab, bytes, cudaMemcpyHostToDevice) == cudaSuccess)
        rc = settle(); /* a pageable copy may still be landing when cudaMemcpy returns */
    if (rc) {
        cudaGetLastError();
        cudaFree(*out);
        *out = NULL;
    }
    free(tab);
    return rc;
}

/* From pageable memory cudaMemcpy may return once the bytes are staged, before they land;
 * a backup on the transfer engine's own stream would not be ordered after them. */
static int cuda_to_device(void *dst, const void *src, size_t n)
{
    if (cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        return KVT_EBACKEND;
    }
    return settle();
}

static int cuda_to_host(void *dst, const void *src, size_t n)
{
    return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : KVT_EBACKEND;
}

/* Mapped, so the gather/scatter kernels can reach the pool (cudaHostGetDevicePointer);
 * portable, so it stays pinned for every context. Where mapping is refused the pool is
 * still pinned for the copy engine, and the transfer engine goes without its kernels. */
static int cuda_host_register(void *ptr, size_t bytes)
{
    if (cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) ==
        cudaSuccess)
        return 0;
    cudaGetLastError();
    if (cudaHostRegister(ptr, bytes, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError();
        return KVT_EBACKEND;
    }
    return 0;
}

static void cuda_host_unregister(void *ptr)
{
    cudaHostUnregister(ptr);
}

#ifdef KVT_HAVE_KERNELS
/* ---- scattered rows in a few calls (kvt_kv_write, kvt_kv_read) ----
 *
 * A copy per run of consecutive slots is a synchronous cudaMemcpy each, from pageable memory:
 * pages of 16 scattered over the pool moved at 47,000 - 91,000 tokens a second in kvtier-bench
 * on an H200. Instead the rows of a chunk are gathered (or scattered) by the transfer
 * engine's kernel between the pool and a staging buffer on the device, whose rows cross in
 * one cudaMemcpy per part: a handful of calls per chunk, whatever the scatter. Everything
 * runs on the legacy stream, in order; the device side is taken at the first call, so an
 * engine that never calls these pays nothing. */

/* Rows staged on the device at a time: as many as fit these bytes, up to ROWS_STAGE_MAX. */
#define ROWS_STAGE_BYTES ((size_t)32 << 20)
#define ROWS_STAGE_MAX ((size_t)1 << 16)

struct dev_rows {
    void **bufs[2]; /* the pool's row buffers per layer; bufs[1] NULL for MLA */
    uint32_t layers, parts;
    size_t row_bytes[2];
    size_t chunk;       /* rows staged at a time */
    bool refused;       /* the device side could not be had: the caller copies per run */
    void **dev_tab;     /* device: [2][layers] row buffers, the kernel's table */
    uint8_t *stage;     /* device: a chunk's K rows, then its V rows */
    uint32_t *idx;      /* device: a chunk's slots, then each row's place in stage */
    uint32_t *idx_host; /* the same, built here */
};

static int rows_open(void **const bufs[2], uint32_t layers, const size_t row_bytes[2],
                     struct dev_rows **out)
{
    struct dev_rows *r = calloc(1, sizeof(*r));

    if (!r)
        return -ENOMEM;
    for (int w = 0; w < 2; w++) {
        r->bufs[w] = bufs[w];
        r->row_bytes[w] = bufs[w] ? row_bytes[w] : 0;
    }
    r->layers = layers;
    r->parts = bufs[1] ? 2 : 1;
    r->chunk = ROWS_STAGE_BYTES / (r->row_bytes[0] + r->row_bytes[1]);
    if (r->chunk > ROWS_STAGE_MAX)
        r->chunk = ROWS_STAGE_MAX;
    if (r->chunk == 0)
        r->chunk = 1;
    *out = r;
    return 0;
}

static void rows_free_device(struct dev_rows *r)
{
    cudaFree(r->dev_tab);
    cudaFree(r->stage);
    cudaFree(r->idx);
    free(r->idx_host);
    r->dev_tab = NULL;
    r->stage = NULL;
    r->idx = NULL;
    r->idx_host = NULL;
}

static void rows_close(struct dev_rows *r)
{
    if (!r)
        return;
    rows_free_device(r);
    free(r);
}

/* The device side, at the first copy. */
static int rows_setup(struct dev_rows *r)
{
    bool ok = kvk_check_device() == cudaSuccess &&
              dev_cuda_table(r->bufs, r->layers, &r->dev_tab) == 0 &&
              cudaMalloc((void **)&r->stage, r->chunk * (r->row_bytes[0] + r->row_bytes[1])) ==
                  cudaSuccess &&
              cudaMalloc((void **)&r->idx, 2 * r->chunk * sizeof(uint32_t)) == cudaSuccess &&
              (r->idx_host = malloc(2 * r->chunk * sizeof(uint32_t))) != NULL;

    if (ok)
        return 0;
    cudaGetLastError();
    rows_free_device(r);
    return KVT_ENOBACKEND;
}

static int rows_copy(struct dev_rows *r, uint32_t layer, const int32_t *slots, size_t n, void *k,
                     void *v, int to_device)
{
    uint8_t *host[2] = {k, v};
    struct kvk_pool kp = {.layers = r->layers, .parts = r->parts};
    size_t m;

    if (r->refused || (!r->stage && rows_setup(r))) {
        r->refused = true;
        return KVT_ENOBACKEND;
    }
    kp.dev = r->dev_tab;
    kp.host = r->stage;
    for (int w = 0; w < 2; w++)
        kp.span[w] = kp.host_page_stride[w] = r->row_bytes[w];
    for (size_t i = 0; i < n; i += m) {
        m = n - i < r->chunk ? n - i : r->chunk;
        for (size_t j = 0; j < m; j++) {
            r->idx_host[j] = (uint32_t)slots[i + j];
            r->idx_host[m + j] = (uint32_t)j;
        }
        kp.host_v_off = m * r->row_bytes[0];
        if (cudaMemcpy(r->idx, r->idx_host, 2 * m * sizeof(uint32_t), cudaMemcpyHostToDevice) !=
            cudaSuccess)
            goto fail;
        for (uint32_t w = 0; to_device && w < r->parts; w++)
            if (cudaMemcpy(r->stage + w * kp.host_v_off, host[w] + i * r->row_bytes[w],
                           m * r->row_bytes[w], cudaMemcpyHostToDevice) != cudaSuccess)
                goto fail;
        if (kvk_copy_layer(&kp, r->idx, (uint32_t)m, layer, !to_device, cudaStreamLegacy) !=
            cudaSuccess)
            goto fail;
        /* To pageable memory cudaMemcpy returns once the rows are there. */
        for (uint32_t w = 0; !to_device && w < r->parts; w++)
            if (cudaMemcpy(host[w] + i * r->row_bytes[w], r->stage + w * kp.host_v_off,
                           m * r->row_bytes[w], cudaMemcpyDeviceToHost) != cudaSuccess)
                goto fail;
    }
    return to_device ? settle() : 0;
fail:
    cudaGetLastError();
    return KVT_EBACKEND;
}
#endif /* KVT_HAVE_KERNELS */

const struct dev_backend dev_backend_cuda = {
    .name = "cuda",
    .kind = KVT_BACKEND_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
#ifdef KVT_HAVE_KERNELS
    .rows_open = rows_open,
    .rows_copy = rows_copy,
    .rows_close = rows_close,
#endif
};
