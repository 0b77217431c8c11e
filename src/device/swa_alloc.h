/*
 * The sliding-window (SWA) slot allocator of a hybrid model, with SGLang's semantics: a
 * full-attention allocator and an SWA allocator of one page size hand out their slots in
 * step, and a map from each full slot to its SWA slot tells the SWA layers where a token's KV
 * is. When tokens leave the window their SWA slots go back (swa_free_swa) while the full slots
 * stay: the full slot then maps to 0, "none" (an SWA tombstone). SWA slot 0 is the padding
 * slot, never handed out, so 0 is never a real peer.
 *
 * Pages pair whole: a full page maps into exactly one SWA page, slot offset for slot offset,
 * so freeing a full page's SWA part frees its one SWA page. Every call checks everything
 * before changing anything: 0, or -EINVAL / -ENOMEM / -ENOENT and nothing changed.
 */
#ifndef KVT_DEVICE_SWA_ALLOC_H
#define KVT_DEVICE_SWA_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "alloc.h"

struct swa_alloc {
    struct slot_alloc full; /* full-attention slots; the caller may read, not change, it */
    struct slot_alloc swa;  /* sliding-window slots; likewise */
    uint32_t page_size;
    int32_t *map;     /* per full slot, (full.npages + 1) * page_size: its SWA slot, 0 none */
    uint32_t *peer;   /* per full page: the SWA page its mapped slots lie in, 0 none */
    uint8_t *mark;    /* per full page, all 0 between calls: "seen" within one call */
    int32_t *scratch; /* SWA slots of one request or one free: (pages + 1) * page_size */
};

/* Both sides of full_tokens and swa_tokens slots (each rounded down to whole pages, each at
 * least one page). -EINVAL for a bad size or page size, -ENOMEM. */
int swa_alloc_init(struct swa_alloc *a, uint64_t full_tokens, uint64_t swa_tokens,
                   uint32_t page_size);
void swa_alloc_finish(struct swa_alloc *a);
/* Everything free, every slot unmapped. */
void swa_alloc_clear(struct swa_alloc *a);

/* Tokens a pair allocation can take now: the smaller of the two sides' free slots, as
 * SGLang's available_size(). slot_available(&a->full) and (&a->swa) give each side. */
size_t swa_available(const struct swa_alloc *a);

/* n slots (whole pages) on both sides; full slots into full_slots, each mapped to its peer.
 * -ENOMEM when either side is short. */
int swa_alloc(struct swa_alloc *a, size_t n, int32_t *full_slots);

/* slot_alloc_extend and slot_alloc_decode for the pair: last_locs are full slots. The SWA
 * side continues a request's partial last page in that page's SWA peer, so that peer must
 * exist (-EINVAL otherwise); a page-aligned prefix needs no SWA peer, its last page may be a
 * tombstone. Both sides take the same number of pages: -ENOMEM when either is short. */
int swa_alloc_extend(struct swa_alloc *a, size_t batch, const uint32_t *prefix_lens,
                     const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                     size_t out_len);
int swa_alloc_decode(struct swa_alloc *a, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, int32_t *out);

/* Free full slots held by the caller and the SWA peers of their pages where they have one
 * (tombstoned slots are fine). -EINVAL when a full page is not the caller's. */
int swa_free(struct swa_alloc *a, const int32_t *full_slots, size_t n);

/* The window moved past these full slots: free the SWA pages of their full pages and unmap
 * those pages; the full slots stay the caller's. Every slot named must still have an SWA
 * peer, else -EINVAL (a second free, or a slot never given one). */
int swa_free_swa(struct swa_alloc *a, const int32_t *full_slots, size_t n);

/* Free full slots whose pages have no SWA peer left (their SWA part already freed):
 * -EINVAL where one has, since freeing it would strand the peer. */
int swa_free_full(struct swa_alloc *a, const int32_t *full_slots, size_t n);

/* extend and decode's checks alone, as slot_extend_check and slot_decode_check: everything
 * validated on both sides, *pages the pages each side takes (the same count), nothing
 * changed; -ENOMEM is not among their errors (room is the caller's to make). */
int swa_extend_check(const struct swa_alloc *a, size_t batch, const uint32_t *prefix_lens,
                     const uint32_t *seq_lens, const int32_t *last_locs, const int32_t *out,
                     size_t out_len, size_t *pages);
int swa_decode_check(const struct swa_alloc *a, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, const int32_t *out, size_t *pages);

/* ---- hand-over with the prefix cache: full pages, each with its SWA peer or none ---- */

/* Full pages (USED, distinct) become CACHED with their peers; -EINVAL changes nothing. */
int swa_claim(struct swa_alloc *a, const uint32_t *pages, size_t n);
void swa_unclaim(struct swa_alloc *a, const uint32_t *pages, size_t n);
/* CACHED full pages the cache drops become free, their peers (where left) too. */
void swa_release_cached(struct swa_alloc *a, const uint32_t *pages, size_t n);
/* The cache drops the SWA part of these full pages (an SWA tombstone): their peers go, the
 * full pages stay. Pages without a peer are skipped. */
void swa_release_swa(struct swa_alloc *a, const uint32_t *pages, size_t n);
/* RecoverEvictedSWA's move: the SWA peers of full pages `from` (the caller's: USED, each with
 * a peer) go to full pages `to` (the cache's: CACHED, none with a peer), slot for slot, as the
 * same tokens' SWA KV. -EINVAL changes nothing. */
int swa_move_peers(struct swa_alloc *a, const uint32_t *to, const uint32_t *from, size_t n);

/* Give each of n full pages (none with a peer) an SWA page: a load-back of SWA KV that the
 * host kept lands there. -ENOMEM when the SWA side is short, -EINVAL for a page out of range,
 * with a peer, or named twice; either changes nothing. */
int swa_give_peers(struct swa_alloc *a, const uint32_t *pages, size_t n);

/* Whether full page p has an SWA peer. */
int swa_page_live(const struct swa_alloc *a, uint32_t p);

/* Free groups on both sides (slot_free_group_begin/end): the map changes at once, the pages
 * come back at the end. */
int swa_free_group_begin(struct swa_alloc *a);
int swa_free_group_end(struct swa_alloc *a);

/* SGLang's translate_loc_from_full_to_swa: each full slot's SWA slot, 0 where it has none,
 * -1 for -1 (no slot). -EINVAL for a slot out of range. */
int swa_translate(const struct swa_alloc *a, const int32_t *full_slots, size_t n,
                  int32_t *swa_slots);

/* 0 when every full slot has an SWA slot a KV write or read may use: a mapped slot, or a
 * slot of the padding page (whose SWA side is SWA slot 0). -ENOENT for a tombstone or an
 * unmapped slot, -EINVAL for a slot out of range. */
int swa_check_live(const struct swa_alloc *a, const int32_t *full_slots, size_t n);

/* The SWA slots for a KV access, after swa_check_live passed on the same slots. */
void swa_translate_live(const struct swa_alloc *a, const int32_t *full_slots, size_t n,
                        int32_t *swa_slots);

/* SGLang's out-of-window rule: a request of seq_len tokens whose SWA part is freed below
 * cursor (which the caller has raised above the rows it does not own) may free its row's
 * SWA slots in [cursor, returned value). With prefix sharing it keeps max(window,
 * page_size) rounded up to whole pages, so a cached key ending at a page boundary still has a
 * whole window of SWA KV; without, it keeps window tokens. The end is page aligned; nothing
 * moves until the window has passed the cursor by a token. */
uint64_t swa_window_evict_to(uint64_t seq_len, uint64_t cursor, uint32_t window, uint32_t page_size,
                             int prefix_sharing);

/* The invariant walk: the map pairs pages whole, each SWA page in use is the peer of exactly
 * one full page in use, free pages have no peer. 0 or -EINVAL. */
int swa_alloc_check(const struct swa_alloc *a);

#endif
