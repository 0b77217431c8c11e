/*
 * The engine's slot layer: the device's slots and KV behind every slot call. Without
 * sliding-window layers, one allocator (device/alloc.h) and one KV pool; with them, the pair
 * allocator of device/swa_alloc.h (a full slot and an SWA slot handed out together) and the
 * two pools of device/swa_pool.h. Slots in every call are full-attention slots: the tree's
 * pages and the requests' rows name them, and an SWA slot is found through its full slot.
 *
 * The engine calls down into this layer and no engine file but this one calls the device's
 * allocators or pools; it knows nothing of the engine, the tree or the tiers (what the tree
 * or the tiers add, a caller passes in).
 */
#ifndef KVT_ENGINE_SLOTS_H
#define KVT_ENGINE_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "device/alloc.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/swa_alloc.h"
#include "device/swa_pool.h"

/* With sliding-window layers: the pair allocator and both pools. */
struct engine_slots_swa {
    struct swa_alloc alloc;
    struct swa_pool pool;
};

struct engine_slots {
    uint32_t page_size;
    struct slot_alloc alloc; /* without sliding-window layers */
    struct kv_pool kv;
    struct engine_slots_swa *swa; /* with them; NULL without */
};

/* tokens slots (whole pages of page_size) and their KV, with a padding page: 0, or an error
 * with what was made left for engine_slots_close. */
int engine_slots_open(struct engine_slots *s, const struct dev_backend *be,
                      const struct kvt_geometry *g, uint32_t page_size, uint64_t tokens);
/* The sliding-window pair: full_tokens full slots and swa_tokens SWA slots; the model layers
 * full_ids[0 .. nfull) are full attention, the rest sliding-window layers. */
int engine_slots_open_swa(struct engine_slots *s, const struct dev_backend *be,
                          const struct kvt_geometry *g, uint32_t page_size, uint64_t full_tokens,
                          uint64_t swa_tokens, const uint32_t *full_ids, uint32_t nfull);
/* Free what slots_open or slots_open_swa made (a zeroed struct too). */
void engine_slots_close(struct engine_slots *s);

/* What a tier below copies to and from: the full-attention pool and allocator, and with
 * sliding-window layers the pair allocator and both pools (NULL without). */
void engine_slots_device(struct engine_slots *s, struct kv_pool **kv, struct slot_alloc **alloc,
                         struct swa_alloc **swa, const struct swa_pool **pool);

/* ---- slots: every call names full slots, the pair's SWA side follows ---- */

/* The full-attention side (its nfree, npages, in_group are what room is decided by). */
const struct slot_alloc *engine_slots_full(const struct engine_slots *s);
/* Pages of the full side, not counting the padding page. */
uint32_t engine_slots_pages(const struct engine_slots *s);
size_t engine_slots_available(const struct engine_slots *s);
int engine_slots_alloc(struct engine_slots *s, size_t n, int32_t *slots);
int engine_slots_free(struct engine_slots *s, const int32_t *slots, size_t n);
/* begin 1: kvt_free_group_begin; 0: its end. */
int engine_slots_group(struct engine_slots *s, int begin);
int engine_slots_extend_check(const struct engine_slots *s, size_t batch,
                              const uint32_t *prefix_lens, const uint32_t *seq_lens,
                              const int32_t *last_locs, const int32_t *out, size_t out_len,
                              size_t *pages);
/* After engine_slots_extend_check passed and room was made on both sides: cannot fail. */
void engine_slots_extend_take(struct engine_slots *s, size_t batch, const uint32_t *prefix_lens,
                              const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                              size_t out_len);
int engine_slots_decode_check(const struct engine_slots *s, size_t batch, const uint32_t *seq_lens,
                              const int32_t *last_locs, const int32_t *out, size_t *pages);
void engine_slots_decode_take(struct engine_slots *s, size_t batch, const uint32_t *seq_lens,
                              const int32_t *last_locs, int32_t *out);

/* The pages of n slots (whole pages, each page's slots in order): 0 or -EINVAL. */
int engine_slots_pages_of(const struct engine_slots *s, const int32_t *slots, size_t n,
                          uint32_t *pages);
/* The cache takes the caller's pages (claim), gives them back untouched (unclaim), or frees
 * pages it cached (release; with the pair, their SWA peers too). */
int engine_slots_claim(struct engine_slots *s, const uint32_t *pages, size_t n);
void engine_slots_unclaim(struct engine_slots *s, const uint32_t *pages, size_t n);
void engine_slots_release(struct engine_slots *s, const uint32_t *pages, size_t n);
/* Whether the n slots of row are the caller's, whole pages (scratch: a page per entry). */
int engine_slots_row_held(struct engine_slots *s, const int32_t *row, size_t n, uint32_t *scratch);

/* The slots of np pages, page_size per page. */
static inline void engine_slots_from_pages(const struct engine_slots *s, const uint32_t *pages,
                                           size_t np, int32_t *slots)
{
    uint32_t ps = s->page_size;

    for (size_t i = 0; i < np; i++)
        for (uint32_t j = 0; j < ps; j++)
            slots[i * ps + j] = (int32_t)(pages[i] * ps + j);
}

/* ---- KV data ---- */

int engine_slots_kv_write(struct engine_slots *s, uint32_t layer, const int32_t *slots, size_t n,
                          const void *k, const void *v);
int engine_slots_kv_read(struct engine_slots *s, uint32_t layer, const int32_t *slots, size_t n,
                         void *k, void *v);
/* The pool holding model layer `layer`, its index there in *index; NULL past the last. */
const struct kv_pool *engine_slots_kv_pool(const struct engine_slots *s, uint32_t layer,
                                           uint32_t *index);
uint64_t engine_slots_kv_bytes(const struct engine_slots *s);

/* ---- the SWA side (s->swa set) ---- */

/* The SWA side's allocator (its nfree and in_group). */
const struct slot_alloc *engine_slots_swa(const struct engine_slots *s);
/* The tree frees the SWA peers of cached pages alone (SWA tombstones), or revives a
 * tombstone with the peers of an inserting request's pages (to takes from's). */
void engine_slots_swa_release(struct engine_slots *s, const uint32_t *pages, size_t n);
int engine_slots_swa_revive(struct engine_slots *s, const uint32_t *to, const uint32_t *from,
                            size_t n);
/* A request frees the SWA KV of its own n slots of row (slots the cache holds are the
 * cache's to free): -EINVAL when one is not the caller's, nothing freed. */
int engine_slots_swa_slide(struct engine_slots *s, const int32_t *row, size_t n);
int engine_slots_swa_translate(const struct engine_slots *s, const int32_t *slots, size_t n,
                               int32_t *swa_slots);

/* ---- figures and checks ---- */

/* The device's figures (tokens, free tokens, KV bytes; the SWA pool's tokens, free). */
void engine_slots_stats(const struct engine_slots *s, struct kvt_stats *st);
/* The full side's invariants against held[p], the cache's owners of each page (the tree's
 * count): a page is cached exactly when one node holds it, free pages are on the free list
 * once. held is overwritten. 0, or -EUCLEAN with the reason in why. */
int engine_slots_check(const struct engine_slots *s, uint8_t *held, char *why, size_t len);
/* The pair's invariants, and tree_swa_pages (the tree's count of pages holding SWA KV) equal
 * to the cached full pages that still have a peer. */
int engine_slots_swa_check(const struct engine_slots *s, uint64_t tree_swa_pages, char *why,
                           size_t len);

#endif
