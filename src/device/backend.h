/*
 * The device backend seam. sim keeps "device" memory in host memory; cuda uses cudaMalloc.
 * Everything above this table is the same code on both.
 */
#ifndef KVT_DEVICE_BACKEND_H
#define KVT_DEVICE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

struct dev_rows; /* a backend's state for batched row copies of one pool */

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
    /* Copies of scattered rows of a pool in a few calls where a copy per run of consecutive
     * rows would be a call each (cuda: the gather/scatter kernels through a staging buffer on
     * the device); NULL where a copy per run costs no more (sim). bufs[w][l] are the pool's
     * row buffers of part w (V's NULL for MLA) in layer l, rows of row_bytes[w]. rows_copy
     * moves row slots[i] of layer to or from row i of k and v, finished when it returns;
     * KVT_ENOBACKEND when it cannot be had here (no code for this GPU): the caller copies per
     * run instead. */
    int (*rows_open)(void **const bufs[2], uint32_t layers, const size_t row_bytes[2],
                     struct dev_rows **out);
    int (*rows_copy)(struct dev_rows *r, uint32_t layer, const int32_t *slots, size_t n, void *k,
                     void *v, int to_device);
    void (*rows_close)(struct dev_rows *r);
};

extern const struct dev_backend dev_backend_sim;
#ifdef KVT_HAVE_CUDA
extern const struct dev_backend dev_backend_cuda;
int dev_cuda_device_count(void);
/* A copy in device memory of a pool's row-buffer table, [2][layers] (V's entries NULL where
 * bufs[1] is), which the gather/scatter kernels index; landed when this returns, for streams
 * that do not wait for the legacy one. The caller cudaFrees *out. 0, -ENOMEM or
 * KVT_EBACKEND. */
int dev_cuda_table(void **const bufs[2], uint32_t layers, void ***out);
#endif

/* The backend for want (enum kvt_backend): auto picks cuda when built and a GPU is visible.
 * KVT_ENOBACKEND when cuda is asked for and cannot be had. */
int dev_backend_select(uint32_t want, const struct dev_backend **out);

#endif
