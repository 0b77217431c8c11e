/*
 * kvtier-xfer-bench's stand-in for one layer's forward on a GPU: a kernel of FMA chains in
 * waves of blocks over every SM, so that it takes the SMs as a prefill's matrix products do
 * and a gather kernel beside it competes for them. Built with the kernels (KVT_HAVE_KERNELS).
 */
#ifndef KVT_TOOLS_XFER_COMPUTE_H
#define KVT_TOOLS_XFER_COMPUTE_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block of xc_burn; blocks_per_sm of them fill an SM's threads. */
#define XC_THREADS 256

/* How many blocks of XC_THREADS fit on one SM at once (from the kernel's resources). */
cudaError_t xc_blocks_per_sm(int *out);

/* Enqueue blocks blocks, each running iters rounds of FMA chains, on stream; each block
 * writes one float of sink (blocks of them) so that nothing is optimised away. */
cudaError_t xc_burn(uint32_t blocks, uint32_t iters, float *sink, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
