/*
 * The Mamba state pool (0.4): fixed-size state slots for the recurrent layers of a
 * hybrid model (Mamba2, Gated DeltaNet). A slot holds, for every Mamba layer, one conv state
 * and one SSM temporal state; a request runs in one slot, and the prefix cache keeps others
 * as checkpoints. Unlike KV, a state is whole or useless: it is never split or paged.
 *
 * Slots 1..nslots are handed out; slot 0 is the padding slot (the dummy target of padded
 * batch rows, as in SGLang), never handed out. Each slot is in one state, so a double free,
 * a free of a slot never handed out or one the cache owns is caught, and a batch that names
 * a bad slot changes nothing. The free list is first in, first out: alloc takes from the
 * front, free appends in the order given, as SGLang's MambaSlotAllocator does.
 *
 * Storage is per layer, one conv buffer and one SSM buffer of (nslots + 1) slots each,
 * through the device backend (host memory on sim).
 */
#ifndef KVT_DEVICE_MAMBA_POOL_H
#define KVT_DEVICE_MAMBA_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* The state of one slot: bytes per Mamba layer. A model whose conv state is several tensors
 * (GDN's q, k, v convs) gives their sum as conv_bytes. */
struct mamba_geometry {
    uint32_t layers;     /* Mamba layers (the attention layers are the KV pool's) */
    uint64_t conv_bytes; /* one layer's conv state of one slot */
    uint64_t ssm_bytes;  /* one layer's SSM temporal state of one slot */
};

enum mamba_slot_state {
    MAMBA_SLOT_FREE = 0,
    MAMBA_SLOT_USED = 1,    /* held by a request (running or track slot) */
    MAMBA_SLOT_CACHED = 2,  /* a checkpoint owned by the prefix cache */
    MAMBA_SLOT_RESERVED = 3 /* slot 0 */
};

/* Which of a layer's two states. */
enum mamba_part { MAMBA_CONV = 0, MAMBA_SSM = 1 };

struct mamba_pool {
    const struct dev_backend *be;
    struct mamba_geometry geo;
    uint32_t nslots; /* usable slots: 1..nslots */
    uint8_t *state;  /* nslots + 1 entries */
    uint32_t *ring;  /* free slots, first in first out, nslots entries */
    uint32_t head, nfree;
    void **buf[2];   /* per layer: conv, ssm; (nslots + 1) * bytes each */
    uint8_t *bounce; /* host staging of one layer's part, for slot-to-slot copies */
};

/* 0 or -EINVAL: at least one layer, both parts non-empty, sizes that cannot overflow. */
int mamba_geometry_check(const struct mamba_geometry *g);

/* Bytes of one slot over all layers. */
uint64_t mamba_slot_bytes(const struct mamba_geometry *g);

/* nslots usable slots, all free and zeroed. -EINVAL on a bad geometry or nslots 0 or past
 * INT32_MAX - 1, -ENOMEM or the backend's code when memory cannot be had. */
int mamba_pool_init(struct mamba_pool *p, const struct dev_backend *be,
                    const struct mamba_geometry *g, uint32_t nslots);
void mamba_pool_finish(struct mamba_pool *p);

/* Every slot free again (the cache and all requests dropped); bytes are left as they are. */
void mamba_pool_clear(struct mamba_pool *p);

/* Free slots. */
uint32_t mamba_pool_available(const struct mamba_pool *p);

/* Device bytes the pool holds (slot 0 included). */
uint64_t mamba_pool_bytes(const struct mamba_pool *p);

/* The state of slot s, or -EINVAL when s is out of 0..nslots. */
int mamba_pool_slot_state(const struct mamba_pool *p, int32_t s);

/* n slots become USED, written to slots; -ENOMEM (nothing taken) when fewer are free. The
 * bytes are what the last holder left: a request that does not start from a copied
 * checkpoint zeroes its slot first (mamba_pool_zero). */
int mamba_pool_alloc(struct mamba_pool *p, size_t n, int32_t *slots);

/* USED slots go back to the free list, in the order given. -EINVAL, changing nothing, when
 * one is out of range, not USED or named twice. */
int mamba_pool_free(struct mamba_pool *p, const int32_t *slots, size_t n);

/* USED slots become CACHED: a request's state handed to the prefix cache as a checkpoint.
 * -EINVAL as mamba_pool_free. */
int mamba_pool_claim(struct mamba_pool *p, const int32_t *slots, size_t n);

/* CACHED slots the cache drops become free. -EINVAL, changing nothing, unless each is
 * CACHED and named once. */
int mamba_pool_release(struct mamba_pool *p, const int32_t *slots, size_t n);

/* The whole state (every layer, both parts) of src[i] into dst[i]: the copy-on-write of a
 * checkpoint into a request's private slot. Each src must be USED or CACHED, each dst USED,
 * the dsts distinct and none of them a src; -EINVAL copies nothing otherwise. */
int mamba_pool_copy(struct mamba_pool *p, const int32_t *src, const int32_t *dst, size_t n);

/* Zero the whole state of USED slots (a request starting from no prefix). */
int mamba_pool_zero(struct mamba_pool *p, const int32_t *slots, size_t n);

/* One layer's conv or SSM state of slot s from or into buf (geo.conv_bytes or ssm_bytes).
 * The slot must be USED or CACHED (a free slot's bytes belong to nobody). */
int mamba_pool_write(struct mamba_pool *p, int32_t s, uint32_t layer, enum mamba_part part,
                     const void *buf);
int mamba_pool_read(const struct mamba_pool *p, int32_t s, uint32_t layer, enum mamba_part part,
                    void *buf);

#endif
