/*
 * The KV pool of a hybrid sliding-window model, as SGLang's SWAKVPool: the full-attention
 * layers (full_attention_layer_ids) in one kv_pool with a row per full slot, every other
 * layer in a second kv_pool with a row per SWA slot, usually far fewer. Callers name a model
 * layer and full slots; a sliding-window layer's rows are found through the allocator's map.
 * Both pools share one geometry (heads, dims, dtype) and the backend's memory (sim: host).
 */
#ifndef KVT_DEVICE_SWA_POOL_H
#define KVT_DEVICE_SWA_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "backend.h"
#include "kv_pool.h"
#include "swa_alloc.h"

struct swa_pool {
    struct kv_pool full; /* the full-attention layers, in the order of their ids */
    struct kv_pool swa;  /* the sliding-window layers, in model order */
    uint32_t layers;     /* model layers */
    uint32_t *index;     /* per model layer: its layer in its own pool */
    uint8_t *is_swa;     /* per model layer */
};

/* g is the model's geometry (g->layers all layers); full_layer_ids names nfull distinct
 * layers below g->layers, at least one layer must be left for the window. The pools' rows
 * follow the allocator's sizes: every slot of either side, padding page included. -EINVAL,
 * -ENOMEM or the backend's error, with nothing held. */
int swa_pool_init(struct swa_pool *p, const struct dev_backend *be, const struct kvt_geometry *g,
                  const uint32_t *full_layer_ids, size_t nfull, const struct swa_alloc *a);
void swa_pool_finish(struct swa_pool *p);
uint64_t swa_pool_bytes(const struct swa_pool *p);

/* Where model layer `layer` lives: *is_swa and its index in that pool. -EINVAL past the
 * last layer. */
int swa_pool_layer(const struct swa_pool *p, uint32_t layer, int *is_swa, uint32_t *index);

/* kv_pool_write / kv_pool_read of n rows of model layer `layer` at full slots. A full layer
 * uses the slots themselves; a sliding-window layer their SWA slots, so every slot must have
 * one (swa_check_live: -ENOENT for a slot whose window has passed, nothing moved). */
int swa_pool_write(struct swa_pool *p, const struct swa_alloc *a, uint32_t layer,
                   const int32_t *full_slots, size_t n, const void *k, const void *v);
int swa_pool_read(const struct swa_pool *p, const struct swa_alloc *a, uint32_t layer,
                  const int32_t *full_slots, size_t n, void *k, void *v);

#endif
