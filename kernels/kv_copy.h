/*
 * Gather/scatter kernels: whole pages of KV between the device KV pool and the pinned host
 * pool, the host side read and written through its device mapping (zero-copy over the link),
 * so a list of scattered pages costs one launch instead of one DMA copy per page.
 *
 * Addressing. For layer l and part w (0: K or MLA's latent rows, 1: V), page d of the device
 * pool is the span of span[w] bytes at dev[w * layers + l] + d * span[w], and page h of the
 * host pool is the span of the same length at
 *     host + l * host_layer_stride + w * host_v_off + h * host_page_stride[w].
 * Both host layouts fit this form (the caller fills the strides for its layout). Every
 * offset is computed in 64 bits. The device row buffers must be 16-byte aligned (cudaMalloc
 * gives 256); the access width follows from the spans, strides and host base alone.
 *
 * Built only when the CUDA toolkit is found; callers test KVT_HAVE_KERNELS.
 */
#ifndef KVT_KERNELS_KV_COPY_H
#define KVT_KERNELS_KV_COPY_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kvk_pool {
    void *const *dev; /* device memory: [2][layers] row buffers; V's NULL for MLA */
    uint8_t *host;    /* the host pool's base, as the device addresses it */
    uint64_t span[2]; /* bytes of one page of K and of V in one layer */
    uint64_t host_page_stride[2];
    uint64_t host_layer_stride;
    uint64_t host_v_off;
    uint32_t layers;
    uint32_t parts;      /* 2 for MHA (K and V), 1 for MLA */
    uint32_t max_blocks; /* blocks per layer at most (each 8 warps); 0: as many as items */
};

/* Whether this device can run the kernels (the binary holds code it can load): 0 when it
 * can, else the CUDA error. */
cudaError_t kvk_check_device(void);

/* The widest access (16, 8, 4 or 1 bytes) every span and stride of p allows; the kernels
 * use it for every load and store. */
uint32_t kvk_access_width(const struct kvk_pool *p);

/* Enqueue on stream the copy of n pages, device page idx[i] <-> host page idx[n + i], for
 * one layer (kvk_copy_layer) or every layer (kvk_copy_all). idx is device memory and must
 * stay unchanged until the copy has run. to_host: device -> host, else host -> device.
 * Returns the launch's error; n == 0 enqueues nothing. */
cudaError_t kvk_copy_layer(const struct kvk_pool *p, const uint32_t *idx, uint32_t n,
                           uint32_t layer, int to_host, cudaStream_t stream);
cudaError_t kvk_copy_all(const struct kvk_pool *p, const uint32_t *idx, uint32_t n, int to_host,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
