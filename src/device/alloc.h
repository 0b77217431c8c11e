/*
 * Device slot allocator: the token allocator (page_size 1) and the paged allocator of
 * SGLang in one. Pages 1..npages are handed out; page 0 is the padding page. Each page is in
 * one state, so a double free or a free of a cached page is caught instead of corrupting
 * the free list.
 */
#ifndef KVT_DEVICE_ALLOC_H
#define KVT_DEVICE_ALLOC_H

#include <stddef.h>
#include <stdint.h>

enum page_state {
    PAGE_FREE = 0,
    PAGE_USED = 1,    /* handed to the caller */
    PAGE_CACHED = 2,  /* owned by the prefix cache */
    PAGE_PENDING = 3, /* freed inside a free group, returned at its end */
    PAGE_RESERVED = 4 /* page 0 */
};

struct slot_alloc {
    uint32_t page_size;
    uint32_t npages; /* usable pages: 1..npages */
    uint8_t *state;  /* npages + 1 entries */
    uint32_t *ring;  /* free pages, a deque of npages entries */
    uint32_t head, nfree;
    uint32_t *group; /* pages held by the open free group */
    uint32_t ngroup;
    int in_group;
    uint32_t *scratch; /* npages entries, for batches */
};

int slot_alloc_init(struct slot_alloc *a, uint64_t tokens, uint32_t page_size);
void slot_alloc_finish(struct slot_alloc *a);
void slot_alloc_clear(struct slot_alloc *a);

/* Free slots in tokens (pages held by a free group not counted). */
size_t slot_available(const struct slot_alloc *a);

int slot_alloc(struct slot_alloc *a, size_t n, int32_t *slots);
int slot_free(struct slot_alloc *a, const int32_t *slots, size_t n);
int slot_free_group_begin(struct slot_alloc *a);
int slot_free_group_end(struct slot_alloc *a);
int slot_alloc_extend(struct slot_alloc *a, size_t batch, const uint32_t *prefix_lens,
                      const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                      size_t out_len);
int slot_alloc_decode(struct slot_alloc *a, size_t batch, const uint32_t *seq_lens,
                      const int32_t *last_locs, int32_t *out);

/* The two halves of slot_alloc_extend / slot_alloc_decode, for a caller that makes room in
 * between: check validates everything and counts the pages the call takes from the free
 * list (*pages), changing nothing; take hands them out and needs that many pages free. take
 * does not look at last_locs' pages again: a page-aligned prefix's last page (the cache's)
 * may have been evicted in between, and its slot is not used. */
int slot_extend_check(const struct slot_alloc *a, size_t batch, const uint32_t *prefix_lens,
                      const uint32_t *seq_lens, const int32_t *last_locs, const int32_t *out,
                      size_t out_len, size_t *pages);
void slot_extend_take(struct slot_alloc *a, size_t batch, const uint32_t *prefix_lens,
                      const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out);
int slot_decode_check(const struct slot_alloc *a, size_t batch, const uint32_t *seq_lens,
                      const int32_t *last_locs, const int32_t *out, size_t *pages);
void slot_decode_take(struct slot_alloc *a, size_t batch, const uint32_t *seq_lens,
                      const int32_t *last_locs, int32_t *out);

/* ---- ownership hand-over with the prefix cache ---- */

/* Turn n tokens of slots (whole pages, in order) into page numbers, checking that each page
 * is the run page*page_size .. +page_size-1 and in range. -EINVAL otherwise. */
int slot_pages_of(const struct slot_alloc *a, const int32_t *slots, size_t n, uint32_t *pages);

/* Pages that must be USED and distinct become CACHED; -EINVAL changes nothing otherwise. */
int slot_claim(struct slot_alloc *a, const uint32_t *pages, size_t n);

/* Undo slot_claim: CACHED pages go back to USED. */
void slot_unclaim(struct slot_alloc *a, const uint32_t *pages, size_t n);

/* CACHED pages dropped by the prefix cache become free. */
void slot_release_cached(struct slot_alloc *a, const uint32_t *pages, size_t n);

/* 0 when a request's row from one page boundary on (n slots) is the caller's to hand back:
 * whole pages as runs, then at most one partial page as the start of a run, every page held
 * by the caller and none named twice. scratch holds n / page_size + 1 entries. */
int slot_row_held(struct slot_alloc *a, const int32_t *row, size_t n, uint32_t *scratch);

/* Whether every page of the slots is in state s (slots need not be page runs). */
int slot_all_in_state(const struct slot_alloc *a, const int32_t *slots, size_t n,
                      enum page_state s);

#endif
