/*
 * The bench's compute kernel (see xfer_compute.h). Each thread runs four independent FMA
 * chains, enough to keep an SM's FMA pipes busy at full occupancy; the block's result goes
 * to sink only through a value the compiler cannot know, so the loop stays.
 */
#include "xfer_compute.h"

namespace
{

__global__ void __launch_bounds__(XC_THREADS) burn(uint32_t iters, float *sink)
{
    float a = threadIdx.x * 1e-3f, b = a + 1.0f, c = a + 2.0f, d = a + 3.0f;
    const float m = 0.999999f, k = 1e-7f;

    for (uint32_t i = 0; i < iters; i++) {
        a = fmaf(a, m, k);
        b = fmaf(b, m, k);
        c = fmaf(c, m, k);
        d = fmaf(d, m, k);
    }
    if (threadIdx.x == 0)
        sink[blockIdx.x] = a + b + c + d;
}

} // namespace

extern "C" cudaError_t xc_blocks_per_sm(int *out)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, burn, XC_THREADS, 0);
}

extern "C" cudaError_t xc_burn(uint32_t blocks, uint32_t iters, float *sink, cudaStream_t stream)
{
    burn<<<blocks, XC_THREADS, 0, stream>>>(iters, sink);
    return cudaGetLastError();
}
