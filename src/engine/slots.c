/*
 * The engine's slot layer (slots.h): one allocator and pool, or the sliding-window pair and
 * its two pools, behind the same calls.
 */
#include "engine/slots.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- open, close ---- */

int engine_slots_open(struct engine_slots *s, const struct dev_backend *be,
                      const struct kvt_geometry *g, uint32_t page_size, uint64_t tokens)
{
    int rc = slot_alloc_init(&s->alloc, tokens, page_size);

    s->page_size = page_size;
    return rc ? rc : kv_pool_init(&s->kv, be, g, tokens + page_size);
}

int engine_slots_open_swa(struct engine_slots *s, const struct dev_backend *be,
                          const struct kvt_geometry *g, uint32_t page_size, uint64_t full_tokens,
                          uint64_t swa_tokens, const uint32_t *full_ids, uint32_t nfull)
{
    int rc;

    s->page_size = page_size;
    if (!(s->swa = calloc(1, sizeof(*s->swa))))
        return -ENOMEM;
    if ((rc = swa_alloc_init(&s->swa->alloc, full_tokens, swa_tokens, page_size)))
        return rc;
    return swa_pool_init(&s->swa->pool, be, g, full_ids, nfull, &s->swa->alloc);
}

void engine_slots_close(struct engine_slots *s)
{
    if (s->swa) {
        swa_pool_finish(&s->swa->pool);
        swa_alloc_finish(&s->swa->alloc);
        free(s->swa);
        s->swa = NULL;
    }
    kv_pool_finish(&s->kv);
    slot_alloc_finish(&s->alloc);
}

void engine_slots_device(struct engine_slots *s, struct kv_pool **kv, struct slot_alloc **alloc,
                         struct swa_alloc **swa, const struct swa_pool **pool)
{
    *kv = s->swa ? &s->swa->pool.full : &s->kv;
    *alloc = s->swa ? &s->swa->alloc.full : &s->alloc;
    *swa = s->swa ? &s->swa->alloc : NULL;
    *pool = s->swa ? &s->swa->pool : NULL;
}

/* ---- slots ---- */

static struct slot_alloc *full_side(struct engine_slots *s)
{
    return s->swa ? &s->swa->alloc.full : &s->alloc;
}

const struct slot_alloc *engine_slots_full(const struct engine_slots *s)
{
    return s->swa ? &s->swa->alloc.full : &s->alloc;
}

uint32_t engine_slots_pages(const struct engine_slots *s)
{
    return engine_slots_full(s)->npages;
}

size_t engine_slots_available(const struct engine_slots *s)
{
    return s->swa ? swa_available(&s->swa->alloc) : slot_available(&s->alloc);
}

int engine_slots_alloc(struct engine_slots *s, size_t n, int32_t *slots)
{
    return s->swa ? swa_alloc(&s->swa->alloc, n, slots) : slot_alloc(&s->alloc, n, slots);
}

int engine_slots_free(struct engine_slots *s, const int32_t *slots, size_t n)
{
    return s->swa ? swa_free(&s->swa->alloc, slots, n) : slot_free(&s->alloc, slots, n);
}

int engine_slots_group(struct engine_slots *s, int begin)
{
    if (s->swa)
        return begin ? swa_free_group_begin(&s->swa->alloc) : swa_free_group_end(&s->swa->alloc);
    return begin ? slot_free_group_begin(&s->alloc) : slot_free_group_end(&s->alloc);
}

int engine_slots_extend_check(const struct engine_slots *s, size_t batch,
                              const uint32_t *prefix_lens, const uint32_t *seq_lens,
                              const int32_t *last_locs, const int32_t *out, size_t out_len,
                              size_t *pages)
{
    if (s->swa)
        return swa_extend_check(&s->swa->alloc, batch, prefix_lens, seq_lens, last_locs, out,
                                out_len, pages);
    return slot_extend_check(&s->alloc, batch, prefix_lens, seq_lens, last_locs, out, out_len,
                             pages);
}

void engine_slots_extend_take(struct engine_slots *s, size_t batch, const uint32_t *prefix_lens,
                              const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                              size_t out_len)
{
    if (s->swa) /* checked, and room made on both sides: it cannot fail */
        (void)swa_alloc_extend(&s->swa->alloc, batch, prefix_lens, seq_lens, last_locs, out,
                               out_len);
    else
        slot_extend_take(&s->alloc, batch, prefix_lens, seq_lens, last_locs, out);
}

int engine_slots_decode_check(const struct engine_slots *s, size_t batch, const uint32_t *seq_lens,
                              const int32_t *last_locs, const int32_t *out, size_t *pages)
{
    if (s->swa)
        return swa_decode_check(&s->swa->alloc, batch, seq_lens, last_locs, out, pages);
    return slot_decode_check(&s->alloc, batch, seq_lens, last_locs, out, pages);
}

void engine_slots_decode_take(struct engine_slots *s, size_t batch, const uint32_t *seq_lens,
                              const int32_t *last_locs, int32_t *out)
{
    if (s->swa)
        (void)swa_alloc_decode(&s->swa->alloc, batch, seq_lens, last_locs, out);
    else
        slot_decode_take(&s->alloc, batch, seq_lens, last_locs, out);
}

int engine_slots_pages_of(const struct engine_slots *s, const int32_t *slots, size_t n,
                          uint32_t *pages)
{
    return slot_pages_of(engine_slots_full(s), slots, n, pages);
}

/* The cache's claim is on the full side alone: a claimed page keeps its SWA peer. */
int engine_slots_claim(struct engine_slots *s, const uint32_t *pages, size_t n)
{
    return slot_claim(full_side(s), pages, n);
}

void engine_slots_unclaim(struct engine_slots *s, const uint32_t *pages, size_t n)
{
    slot_unclaim(full_side(s), pages, n);
}

void engine_slots_release(struct engine_slots *s, const uint32_t *pages, size_t n)
{
    if (s->swa)
        swa_release_cached(&s->swa->alloc, pages, n);
    else
        slot_release_cached(&s->alloc, pages, n);
}

int engine_slots_row_held(struct engine_slots *s, const int32_t *row, size_t n, uint32_t *scratch)
{
    return slot_row_held(full_side(s), row, n, scratch);
}

/* ---- KV data ---- */

int engine_slots_kv_write(struct engine_slots *s, uint32_t layer, const int32_t *slots, size_t n,
                          const void *k, const void *v)
{
    if (s->swa)
        return swa_pool_write(&s->swa->pool, &s->swa->alloc, layer, slots, n, k, v);
    return kv_pool_write(&s->kv, layer, slots, n, k, v);
}

int engine_slots_kv_read(struct engine_slots *s, uint32_t layer, const int32_t *slots, size_t n,
                         void *k, void *v)
{
    if (s->swa)
        return swa_pool_read(&s->swa->pool, &s->swa->alloc, layer, slots, n, k, v);
    return kv_pool_read(&s->kv, layer, slots, n, k, v);
}

const struct kv_pool *engine_slots_kv_pool(const struct engine_slots *s, uint32_t layer,
                                           uint32_t *index)
{
    int is_swa = 0;

    *index = layer;
    if (!s->swa)
        return layer < s->kv.geo.layers ? &s->kv : NULL;
    if (swa_pool_layer(&s->swa->pool, layer, &is_swa, index))
        return NULL;
    return is_swa ? &s->swa->pool.swa : &s->swa->pool.full;
}

uint64_t engine_slots_kv_bytes(const struct engine_slots *s)
{
    return s->swa ? swa_pool_bytes(&s->swa->pool) : kv_pool_bytes(&s->kv);
}

/* ---- the SWA side ---- */

const struct slot_alloc *engine_slots_swa(const struct engine_slots *s)
{
    return &s->swa->alloc.swa;
}

void engine_slots_swa_release(struct engine_slots *s, const uint32_t *pages, size_t n)
{
    swa_release_swa(&s->swa->alloc, pages, n);
}

int engine_slots_swa_revive(struct engine_slots *s, const uint32_t *to, const uint32_t *from,
                            size_t n)
{
    return swa_move_peers(&s->swa->alloc, to, from, n);
}

int engine_slots_swa_slide(struct engine_slots *s, const int32_t *row, size_t n)
{
    if (!slot_all_in_state(&s->swa->alloc.full, row, n, PAGE_USED))
        return -EINVAL;
    return swa_free_swa(&s->swa->alloc, row, n);
}

int engine_slots_swa_translate(const struct engine_slots *s, const int32_t *slots, size_t n,
                               int32_t *swa_slots)
{
    return swa_translate(&s->swa->alloc, slots, n, swa_slots);
}

/* ---- figures and checks ---- */

void engine_slots_stats(const struct engine_slots *s, struct kvt_stats *st)
{
    st->device_tokens = (uint64_t)engine_slots_pages(s) * s->page_size;
    st->device_free_tokens = engine_slots_available(s);
    st->kv_pool_bytes = engine_slots_kv_bytes(s);
    if (!s->swa)
        return;
    st->swa_tokens = (uint64_t)s->swa->alloc.swa.npages * s->page_size;
    st->swa_free_tokens = slot_available(&s->swa->alloc.swa);
}

static int check_free_list(const struct slot_alloc *a, uint8_t *seen, char *why, size_t len)
{
    for (uint32_t i = 0; i < a->nfree; i++) {
        uint32_t p = a->ring[(a->head + i) % a->npages];
        if (p == 0 || p > a->npages || a->state[p] != PAGE_FREE || seen[p]++) {
            snprintf(why, len, "free list holds page %u that is not free or twice", p);
            return -EUCLEAN;
        }
    }
    return 0;
}

static int check_ownership(const struct slot_alloc *a, const uint8_t *held, char *why, size_t len)
{
    uint32_t nfree = 0;

    for (uint32_t p = 1; p <= a->npages; p++) {
        int cached = a->state[p] == PAGE_CACHED;
        if (cached != (held[p] == 1)) {
            snprintf(why, len, "page %u: allocator state %d, held by %u nodes", p, a->state[p],
                     held[p]);
            return -EUCLEAN;
        }
        nfree += a->state[p] == PAGE_FREE;
    }
    if (nfree != a->nfree) {
        snprintf(why, len, "%u pages free, free list holds %u", nfree, a->nfree);
        return -EUCLEAN;
    }
    return 0;
}

int engine_slots_check(const struct engine_slots *s, uint8_t *held, char *why, size_t len)
{
    const struct slot_alloc *a = engine_slots_full(s);
    int rc = check_ownership(a, held, why, len);

    if (rc)
        return rc;
    memset(held, 0, a->npages + 1);
    return check_free_list(a, held, why, len);
}

int engine_slots_swa_check(const struct engine_slots *s, uint64_t tree_swa_pages, char *why,
                           size_t len)
{
    const struct swa_alloc *a = &s->swa->alloc;
    uint64_t live = 0;

    if (swa_alloc_check(a)) {
        snprintf(why, len, "the SWA allocator's map or peers are inconsistent");
        return -EUCLEAN;
    }
    for (uint32_t p = 1; p <= a->full.npages; p++)
        live += a->full.state[p] == PAGE_CACHED && swa_page_live(a, p);
    if (live != tree_swa_pages) {
        snprintf(why, len, "%llu cached pages have SWA KV, the tree counts %llu",
                 (unsigned long long)live, (unsigned long long)tree_swa_pages);
        return -EUCLEAN;
    }
    return 0;
}
