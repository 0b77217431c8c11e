/*
 * The device backend seam. sim keeps "device" memory in host memory; cuda uses cudaMalloc.
 * Everything above this table is the same code on both.
 */
#ifndef KVT_DEVICE_BACKEND_H
#define KVT_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct dev_backend {
    const char *name;
    uint32_t kind;                          /* enum kvt_backend */
    int (*alloc)(size_t bytes, void **ptr); /* zeroed memory */
    void (*free)(void *ptr, size_t bytes);
    int (*to_device)(void *dst, const void *src, size_t n);
    int (*to_host)(void *dst, const void *src, size_t n);
    /* Pin host memory so copies from and to it can be asynchronous (cudaHostRegister);
     * NULL where the backend has no such step (sim). */
    int (*host_register)(void *ptr, size_t bytes);
    void (*host_unregister)(void *ptr);
};

extern const struct dev_backend dev_backend_sim;
#ifdef KVT_HAVE_CUDA
extern const struct dev_backend dev_backend_cuda;
int dev_cuda_device_count(void);
#endif

/* The backend for want (enum kvt_backend): auto picks cuda when built and a GPU is visible.
 * KVT_ENOBACKEND when cuda is asked for and cannot be had. */
int dev_backend_select(uint32_t want, const struct dev_backend **out);

#endif
