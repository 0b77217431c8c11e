/*
 * An arena of bytes handed out in contiguous extents: the device memory and the host memory
 * of the embedding cache, each one allocation cut into extents (an embedding is one extent,
 * so its device copy has one address). First fit over a free list kept in address order,
 * merged on free. Offsets and lengths are in bytes, lengths rounded up to the arena's unit.
 */
#ifndef KVT_EMB_ARENA_H
#define KVT_EMB_ARENA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct emb_extent {
    uint64_t off, len;
};

struct emb_arena {
    uint64_t bytes, unit, used;
    struct emb_extent *free; /* by offset, none adjacent to another */
    size_t nfree, cap;
    size_t nalloc; /* extents handed out: free holes never outnumber them by more than one,
                      so cap (kept above that at alloc) spares free and trim a failure */
};

/* An arena of bytes (rounded down to unit, a power of two): -EINVAL, -ENOMEM. */
int emb_arena_init(struct emb_arena *a, uint64_t bytes, uint64_t unit);
void emb_arena_finish(struct emb_arena *a);

/* len rounded up to the unit. */
uint64_t emb_arena_round(const struct emb_arena *a, uint64_t len);

/* An extent of len bytes at *off: 0, -ENOSPC (no hole that large), -ENOMEM. */
int emb_arena_alloc(struct emb_arena *a, uint64_t len, uint64_t *off);

/* Give back the extent [off, off + len). */
void emb_arena_free(struct emb_arena *a, uint64_t off, uint64_t len);

/* Keep the first keep bytes of the extent [off, off + len), give back the rest. */
void emb_arena_trim(struct emb_arena *a, uint64_t off, uint64_t len, uint64_t keep);

/* Whether a hole of len bytes would exist once the n extents given were freed too (they
 * must be allocated ones). -ENOMEM when it cannot tell (no memory to merge). */
int emb_arena_would_fit(const struct emb_arena *a, const struct emb_extent *more, size_t n,
                        uint64_t len, bool *fits);

#endif
