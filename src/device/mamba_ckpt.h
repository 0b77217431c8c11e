/*
 * Where a Mamba state may be checkpointed, and how much of a KV hit a checkpoint makes
 * usable: pure arithmetic, SGLang's rules.
 *
 * A recurrent state exists only at the positions the forward stopped at. The chunked scan
 * (FLA's kernels) yields intermediate states at multiples of its chunk (64 tokens), so a
 * prefill can leave a checkpoint at a chunk multiple; decode takes one every
 * track_interval tokens (256 by default, a multiple of the chunk). The radix tree names a
 * checkpoint by a page-aligned depth, so the grids are widened to the page size.
 *
 * A KV hit of h tokens is worth only the deepest checkpoint at or below h: the tokens
 * between it and h are recomputed for the Mamba layers (and so for all layers).
 */
#ifndef KVT_DEVICE_MAMBA_CKPT_H
#define KVT_DEVICE_MAMBA_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define MAMBA_FLA_CHUNK 64           /* FLA_CHUNK_SIZE: the chunked scan's state grid */
#define MAMBA_TRACK_INTERVAL_DEF 256 /* SGLang's default mamba_track_interval */

struct mamba_ckpt_rules {
    uint32_t chunk;          /* the model's state chunk: MAMBA_FLA_CHUNK */
    uint32_t track_interval; /* decode checkpoints: a multiple of chunk */
    uint32_t page_size;      /* the KV pool's page: checkpoint depths are page aligned */
};

/* SGLang's defaults for a KV pool of page_size. */
void mamba_ckpt_rules_default(struct mamba_ckpt_rules *r, uint32_t page_size);

/* 0 or -EINVAL: chunk and page_size powers of two, track_interval a positive multiple of
 * chunk, every grid below 2^31. */
int mamba_ckpt_rules_check(const struct mamba_ckpt_rules *r);

/* The prefill checkpoint grid: lcm(max(chunk, page_size), page_size). */
uint64_t mamba_ckpt_grid(const struct mamba_ckpt_rules *r);

/* The decode checkpoint grid: lcm(mamba_ckpt_grid, track_interval). */
uint64_t mamba_ckpt_decode_grid(const struct mamba_ckpt_rules *r);

/* The sequence length an extend of extend_len tokens past a prefix of prefix_len (itself a
 * checkpoint) leaves a state at: prefix_len plus the most whole grids the extend covers,
 * or 0 when it covers none. */
uint64_t mamba_ckpt_prefill_track(const struct mamba_ckpt_rules *r, uint64_t prefix_len,
                                  uint64_t extend_len);

/* Whether a decode step that brings the sequence to seq_len tokens takes a checkpoint. */
int mamba_ckpt_decode_due(const struct mamba_ckpt_rules *r, uint64_t seq_len);

/* The branching point of a match: the KV hit rounded down to the grid, when that lies
 * beyond the deepest state the match returned (state_len); 0 otherwise. A request admitted
 * with it checkpoints there during its prefill, so the next request on the same prefix
 * finds a state where this one's KV hit ended. */
uint64_t mamba_ckpt_branching(const struct mamba_ckpt_rules *r, uint64_t kv_hit,
                              uint64_t state_len);

/* The effective prefix of a KV hit of kv_hit tokens: the deepest of the n checkpoint depths
 * (any order) at or below kv_hit, or 0 when none is. */
uint64_t mamba_ckpt_effective(uint64_t kv_hit, const uint64_t *ckpts, size_t n);

#endif
