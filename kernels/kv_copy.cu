/*
 * Gather/scatter of KV pages (see kv_copy.h).
 *
 * Launch shape: 256 threads (8 warps) per block; one warp copies one item, an item being one
 * page of K or of V in one layer (a contiguous span on both sides). grid.x covers the items
 * of a layer up to the pool's max_blocks (then warps loop over items), grid.y the layers, so
 * the per-layer and the all-layers copies are one kernel with grid.y 1 or the layer count.
 * The link, not the SMs, bounds the copy: a few blocks keep it full, and the rest of the SMs
 * stay with the forward that runs beside a load.
 *
 * The host side crosses the link as plain loads and stores on mapped pinned memory. Reads
 * over the link have long latency, so each lane issues several loads before it stores
 * anything (kUnroll words in flight per lane, 32 lanes per warp, many warps).
 */
#include "kv_copy.h"

#include <cuda_runtime.h>

namespace
{

constexpr unsigned kWarp = 32;
constexpr unsigned kWarpsPerBlock = 8;
constexpr unsigned kThreads = kWarp * kWarpsPerBlock;
constexpr unsigned kUnroll = 4;
constexpr uint64_t kMaxBlocksX = 4096; /* enough to fill an H100 several times over */
constexpr uint32_t kMaxGridY = 65535;

/* One lane's share of a span: words lane, lane + 32, ... Loads go first, then stores, so
 * that kUnroll reads are in flight at once; __restrict__ lets the compiler keep them so. */
template <typename W>
__device__ __forceinline__ void copy_span(W *__restrict__ dst, const W *__restrict__ src,
                                          uint64_t words, unsigned lane)
{
    uint64_t i = lane;

    for (; i + (kUnroll - 1) * kWarp < words; i += kUnroll * kWarp) {
        W r[kUnroll];
#pragma unroll
        for (unsigned u = 0; u < kUnroll; u++)
            r[u] = src[i + u * kWarp];
#pragma unroll
        for (unsigned u = 0; u < kUnroll; u++)
            dst[i + u * kWarp] = r[u];
    }
    for (; i < words; i += kWarp)
        dst[i] = src[i];
}

template <typename W>
__global__ void __launch_bounds__(kThreads)
    page_copy(const kvk_pool p, const uint32_t *__restrict__ idx, uint32_t n, uint32_t layer0,
              int to_host)
{
    const uint32_t layer = layer0 + blockIdx.y;
    const uint64_t items = (uint64_t)n * p.parts;
    const uint64_t step = (uint64_t)gridDim.x * kWarpsPerBlock;
    const unsigned lane = threadIdx.x % kWarp;
    const uint32_t shift = p.parts - 1; /* parts is 1 or 2: no 64-bit division per item */

    for (uint64_t it = (uint64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp; it < items;
         it += step) {
        const uint32_t i = (uint32_t)(it >> shift), w = (uint32_t)(it & shift);
        /* Selects, not p.span[w]: a parameter array indexed at run time is copied to the
         * stack. */
        const uint64_t span = w ? p.span[1] : p.span[0];
        const uint64_t page_stride = w ? p.host_page_stride[1] : p.host_page_stride[0];
        uint8_t *dev = (uint8_t *)p.dev[w * p.layers + layer] + (uint64_t)idx[i] * span;
        uint8_t *host = p.host + layer * p.host_layer_stride + (w ? p.host_v_off : 0) +
                        (uint64_t)idx[n + i] * page_stride;
        const uint8_t *src = to_host ? dev : host;
        uint8_t *dst = to_host ? host : dev;

        copy_span<W>((W *)dst, (const W *)src, span / sizeof(W), lane);
    }
}

template <typename W>
cudaError_t launch(const kvk_pool *p, const uint32_t *idx, uint32_t n, uint32_t layer0,
                   uint32_t nlayers, int to_host, cudaStream_t stream)
{
    const uint64_t cap = p->max_blocks && p->max_blocks < kMaxBlocksX ? p->max_blocks : kMaxBlocksX;
    uint64_t blocks = ((uint64_t)n * p->parts + kWarpsPerBlock - 1) / kWarpsPerBlock;
    dim3 grid((unsigned)(blocks < cap ? blocks : cap), nlayers);

    page_copy<W><<<grid, kThreads, 0, stream>>>(*p, idx, n, layer0, to_host);
    return cudaGetLastError();
}

cudaError_t copy(const kvk_pool *p, const uint32_t *idx, uint32_t n, uint32_t layer0,
                 uint32_t nlayers, int to_host, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    if (!p || !idx || p->parts < 1 || p->parts > 2 || nlayers == 0 || nlayers > kMaxGridY ||
        layer0 >= p->layers || nlayers > p->layers - layer0)
        return cudaErrorInvalidValue;
    switch (kvk_access_width(p)) {
    case 16:
        return launch<uint4>(p, idx, n, layer0, nlayers, to_host, stream);
    case 8:
        return launch<uint2>(p, idx, n, layer0, nlayers, to_host, stream);
    case 4:
        return launch<uint32_t>(p, idx, n, layer0, nlayers, to_host, stream);
    default:
        return launch<uint8_t>(p, idx, n, layer0, nlayers, to_host, stream);
    }
}

} // namespace

extern "C" cudaError_t kvk_check_device(void)
{
    cudaFuncAttributes attr;
    cudaError_t e = cudaFuncGetAttributes(&attr, page_copy<uint4>);

    if (e != cudaSuccess)
        cudaGetLastError(); /* not sticky: leave no error behind for the next call */
    return e;
}

/* Every address the kernels form is a sum of these (and of the device row buffers, which
 * cudaMalloc aligns to 256 bytes), so their lowest set bit bounds the access width. */
extern "C" uint32_t kvk_access_width(const struct kvk_pool *p)
{
    uint64_t bits = (uint64_t)(uintptr_t)p->host | p->span[0] | p->host_page_stride[0] |
                    p->host_layer_stride | 16;

    if (p->parts > 1)
        bits |= p->span[1] | p->host_page_stride[1] | p->host_v_off;
    bits &= ~bits + 1; /* lowest set bit */
    return bits >= 16 ? 16 : bits >= 8 ? 8 : bits >= 4 ? 4 : 1;
}

extern "C" cudaError_t kvk_copy_layer(const struct kvk_pool *p, const uint32_t *idx, uint32_t n,
                                      uint32_t layer, int to_host, cudaStream_t stream)
{
    return copy(p, idx, n, layer, 1, to_host, stream);
}

extern "C" cudaError_t kvk_copy_all(const struct kvk_pool *p, const uint32_t *idx, uint32_t n,
                                    int to_host, cudaStream_t stream)
{
    return copy(p, idx, n, 0, p ? p->layers : 0, to_host, stream);
}
