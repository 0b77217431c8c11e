/* The cuda backend: plain CUDA runtime calls, compiled only when the toolkit is found. */
#include "backend.h"

#include <errno.h>

#include <cuda_runtime_api.h>

#include "kvtier.h"

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

const struct dev_backend dev_backend_cuda = {
    .name = "cuda",
    .kind = KVT_BACKEND_CUDA,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
};
