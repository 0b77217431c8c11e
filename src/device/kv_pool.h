/*
 * The device KV pool: per layer a K and a V buffer (MHA) or one latent buffer (MLA), each of
 * rows = slots + page_size token rows, so slot indices address rows directly and page 0 takes
 * the padding writes.
 */
#ifndef KVT_DEVICE_KV_POOL_H
#define KVT_DEVICE_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "backend.h"

struct kv_pool {
    const struct dev_backend *be;
    struct kvt_geometry geo;
    uint64_t rows;
    size_t row_bytes[2];    /* K (or latent), V */
    void **buf[2];          /* per layer; buf[1] is NULL for MLA */
    struct dev_rows *batch; /* the backend's batched copies of scattered rows; NULL: none */
};

/* Validate a geometry: 0 or -EINVAL. */
int kv_geometry_check(const struct kvt_geometry *g);

/* Bytes of one token row of K (which 0) or V (which 1) in one layer; 0 for MLA's V. */
size_t kv_row_bytes(const struct kvt_geometry *g, int which);

int kv_pool_init(struct kv_pool *p, const struct dev_backend *be, const struct kvt_geometry *g,
                 uint64_t rows);
void kv_pool_finish(struct kv_pool *p);
uint64_t kv_pool_bytes(const struct kv_pool *p);

/* Copy n rows between host buffers and the rows named by slots in one layer. Runs of
 * consecutive slots move in one copy; rows of more than one run move by the backend's
 * batched copy where it has one (cuda), which gives a slot named twice in one write one of
 * its rows, not the last. */
int kv_pool_write(struct kv_pool *p, uint32_t layer, const int32_t *slots, size_t n, const void *k,
                  const void *v);
int kv_pool_read(const struct kv_pool *p, uint32_t layer, const int32_t *slots, size_t n, void *k,
                 void *v);

#endif
