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

static int cuda_alloc(size_t bytes, void **ptr)
{
    if (cudaMalloc(ptr, bytes ? bytes : 1) != cudaSuccess) {
        *ptr = NULL;
        return -ENOMEM;
    }
    if (cudaMemset(*ptr, 0, bytes) != cudaSuccess) {
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

static int cuda_to_device(void *dst, const void *src, size_t n)
{
    return cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : KVT_EBACKEND;
}

static int cuda_to_host(void *dst, const void *src, size_t n)
{
    return cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : KVT_EBACKEND;
}

static int cuda_host_register(void *ptr, size_t bytes)
{
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
