/*
 * Both sides are plain slot allocators; this file keeps them in step and owns the map. The
 * per-page peer array is the map's page-level summary: it makes "does this page still have
 * an SWA part" one lookup, and the invariant walk checks that the two agree.
 */
#include "swa_alloc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t full_slots_total(const struct swa_alloc *a)
{
    return ((size_t)a->full.npages + 1) * a->page_size;
}

int swa_alloc_init(struct swa_alloc *a, uint64_t full_tokens, uint64_t swa_tokens,
                   uint32_t page_size)
{
    int rc;

    memset(a, 0, sizeof(*a));
    if ((rc = slot_alloc_init(&a->full, full_tokens, page_size)))
        return rc;
    if ((rc = slot_alloc_init(&a->swa, swa_tokens, page_size))) {
        slot_alloc_finish(&a->full);
        return rc;
    }
    a->page_size = page_size;
    /* One request's SWA slots are at most its new pages plus the rest of a partial page. */
    uint32_t most = a->full.npages > a->swa.npages ? a->full.npages : a->swa.npages;
    a->map = calloc(full_slots_total(a), sizeof(*a->map));
    a->peer = calloc((size_t)a->full.npages + 1, sizeof(*a->peer));
    a->mark = calloc((size_t)a->full.npages + 1, 1);
    a->scratch = malloc(((size_t)most + 1) * page_size * sizeof(*a->scratch));
    if (!a->map || !a->peer || !a->mark || !a->scratch) {
        swa_alloc_finish(a);
        return -ENOMEM;
    }
    return 0;
}

void swa_alloc_finish(struct swa_alloc *a)
{
    slot_alloc_finish(&a->full);
    slot_alloc_finish(&a->swa);
    free(a->map);
    free(a->peer);
    free(a->mark);
    free(a->scratch);
    memset(a, 0, sizeof(*a));
}

void swa_alloc_clear(struct swa_alloc *a)
{
    slot_alloc_clear(&a->full);
    slot_alloc_clear(&a->swa);
    memset(a->map, 0, full_slots_total(a) * sizeof(*a->map));
    memset(a->peer, 0, ((size_t)a->full.npages + 1) * sizeof(*a->peer));
}

size_t swa_available(const struct swa_alloc *a)
{
    size_t f = slot_available(&a->full), s = slot_available(&a->swa);

    return f < s ? f : s;
}

/* Pair n full slots with n SWA slots taken in the same page order. */
static void pair(struct swa_alloc *a, const int32_t *full, const int32_t *swa, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        a->map[full[i]] = swa[i];
        a->peer[(uint32_t)full[i] / a->page_size] = (uint32_t)swa[i] / a->page_size;
    }
}

int swa_alloc(struct swa_alloc *a, size_t n, int32_t *full_slots)
{
    if (n % a->page_size || (n && !full_slots))
        return -EINVAL;
    if (n > slot_available(&a->full) || n > slot_available(&a->swa))
        return -ENOMEM;
    /* Both checked above: neither call can fail now. */
    slot_alloc(&a->full, n, full_slots);
    slot_alloc(&a->swa, n, a->scratch);
    pair(a, full_slots, a->scratch, n);
    return 0;
}

/* The SWA side of one request, rebased to the prefix's last page boundary: the SWA pool
 * holds no pages for the part of the prefix before it, so it sees a request of seq - base
 * tokens whose prefix is the partial page only (none when the prefix is page aligned). */
struct swa_req {
    uint32_t pre, seq;
    int32_t last;
};

static int swa_side(const struct swa_alloc *a, uint32_t pre, uint32_t seq, int32_t full_last,
                    struct swa_req *r)
{
    uint32_t base = pre / a->page_size * a->page_size;

    r->pre = pre - base;
    r->seq = seq - base;
    r->last = -1;
    if (r->pre == 0)
        return 0;
    /* The full side validated full_last; a partial page continues only with its peer. */
    r->last = a->map[full_last];
    return r->last ? 0 : -EINVAL;
}

int swa_extend_check(const struct swa_alloc *a, size_t batch, const uint32_t *prefix_lens,
                     const uint32_t *seq_lens, const int32_t *last_locs, const int32_t *out,
                     size_t out_len, size_t *need)
{
    size_t pages = 0;
    int rc =
        slot_extend_check(&a->full, batch, prefix_lens, seq_lens, last_locs, out, out_len, &pages);

    for (size_t i = 0; rc == 0 && i < batch; i++) {
        struct swa_req r;
        size_t p = 0;
        if ((rc = swa_side(a, prefix_lens[i], seq_lens[i], last_locs[i], &r)))
            break;
        rc = slot_extend_check(&a->swa, 1, &r.pre, &r.seq, &r.last, a->scratch, r.seq - r.pre, &p);
    }
    /* Rebasing by whole pages keeps the page counts equal; the sides differ only in room. */
    *need = pages;
    return rc;
}

int swa_alloc_extend(struct swa_alloc *a, size_t batch, const uint32_t *prefix_lens,
                     const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                     size_t out_len)
{
    size_t pages = 0;
    int rc = swa_extend_check(a, batch, prefix_lens, seq_lens, last_locs, out, out_len, &pages);

    if (rc)
        return rc;
    if (pages > a->full.nfree || pages > a->swa.nfree)
        return -ENOMEM;
    for (size_t i = 0; i < batch; i++) {
        struct swa_req r;
        size_t n = seq_lens[i] - prefix_lens[i];
        swa_side(a, prefix_lens[i], seq_lens[i], last_locs[i], &r);
        slot_extend_take(&a->full, 1, &prefix_lens[i], &seq_lens[i], &last_locs[i], out);
        slot_extend_take(&a->swa, 1, &r.pre, &r.seq, &r.last, a->scratch);
        pair(a, out, a->scratch, n);
        out += n;
    }
    return 0;
}

int swa_decode_check(const struct swa_alloc *a, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, const int32_t *out, size_t *need)
{
    size_t pages = 0;
    int rc = slot_decode_check(&a->full, batch, seq_lens, last_locs, out, &pages);

    for (size_t i = 0; rc == 0 && i < batch; i++) {
        struct swa_req r;
        size_t p = 0;
        /* A decode step extends a prefix of seq - 1 tokens by one. */
        if ((rc = swa_side(a, seq_lens[i] - 1, seq_lens[i], last_locs[i], &r)))
            break;
        rc = slot_decode_check(&a->swa, 1, &r.seq, &r.last, a->scratch, &p);
    }
    *need = pages;
    return rc;
}

int swa_alloc_decode(struct swa_alloc *a, size_t batch, const uint32_t *seq_lens,
                     const int32_t *last_locs, int32_t *out)
{
    size_t pages = 0;
    int rc = swa_decode_check(a, batch, seq_lens, last_locs, out, &pages);

    if (rc)
        return rc;
    if (pages > a->full.nfree || pages > a->swa.nfree)
        return -ENOMEM;
    for (size_t i = 0; i < batch; i++) {
        struct swa_req r;
        swa_side(a, seq_lens[i] - 1, seq_lens[i], last_locs[i], &r);
        slot_decode_take(&a->full, 1, &seq_lens[i], &last_locs[i], &out[i]);
        slot_decode_take(&a->swa, 1, &r.seq, &r.last, a->scratch);
        pair(a, &out[i], a->scratch, 1);
    }
    return 0;
}

/* The first slot of the SWA peers of the distinct full pages of slots, into a->scratch;
 * pages without a peer are skipped. Returns how many; leaves a->mark set on the pages seen
 * (unmark_pages clears them). */
static size_t collect_peers(struct swa_alloc *a, const int32_t *slots, size_t n)
{
    size_t m = 0;

    for (size_t i = 0; i < n; i++) {
        uint32_t p = (uint32_t)slots[i] / a->page_size;
        if (a->mark[p])
            continue;
        a->mark[p] = 1;
        if (a->peer[p])
            a->scratch[m++] = (int32_t)(a->peer[p] * a->page_size);
    }
    return m;
}

static void unmark_pages(struct swa_alloc *a, const int32_t *slots, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a->mark[(uint32_t)slots[i] / a->page_size] = 0;
}

/* Unmap every slot of the full pages of slots. */
static void unmap_pages(struct swa_alloc *a, const int32_t *slots, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t p = (uint32_t)slots[i] / a->page_size;
        if (!a->peer[p])
            continue;
        a->peer[p] = 0;
        memset(a->map + (size_t)p * a->page_size, 0, a->page_size * sizeof(*a->map));
    }
}

/* Free the SWA pages of slots' full pages and unmap them, once every one is checked to be
 * in use on the SWA side (a guard: the invariant says it is). */
static int drop_peers(struct swa_alloc *a, const int32_t *slots, size_t n)
{
    size_t m = collect_peers(a, slots, n);

    unmark_pages(a, slots, n);
    if (!slot_all_in_state(&a->swa, a->scratch, m, PAGE_USED))
        return -EINVAL;
    slot_free(&a->swa, a->scratch, m);
    unmap_pages(a, slots, n);
    return 0;
}

int swa_free(struct swa_alloc *a, const int32_t *full_slots, size_t n)
{
    int rc;

    if (n && !full_slots)
        return -EINVAL;
    if (!slot_all_in_state(&a->full, full_slots, n, PAGE_USED))
        return -EINVAL;
    if ((rc = drop_peers(a, full_slots, n)))
        return rc;
    return slot_free(&a->full, full_slots, n);
}

static int in_full_range(const struct swa_alloc *a, int32_t slot)
{
    return slot >= 0 && (size_t)slot < full_slots_total(a);
}

int swa_free_swa(struct swa_alloc *a, const int32_t *full_slots, size_t n)
{
    if (n && !full_slots)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!in_full_range(a, full_slots[i]) || a->map[full_slots[i]] == 0)
            return -EINVAL;
    return drop_peers(a, full_slots, n);
}

int swa_free_full(struct swa_alloc *a, const int32_t *full_slots, size_t n)
{
    if (n && !full_slots)
        return -EINVAL;
    if (!slot_all_in_state(&a->full, full_slots, n, PAGE_USED))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (a->peer[(uint32_t)full_slots[i] / a->page_size])
            return -EINVAL;
    return slot_free(&a->full, full_slots, n);
}

int swa_claim(struct swa_alloc *a, const uint32_t *pages, size_t n)
{
    return slot_claim(&a->full, pages, n);
}

void swa_unclaim(struct swa_alloc *a, const uint32_t *pages, size_t n)
{
    slot_unclaim(&a->full, pages, n);
}

void swa_release_swa(struct swa_alloc *a, const uint32_t *pages, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int32_t first = (int32_t)(pages[i] * a->page_size);
        if (a->peer[pages[i]])
            (void)drop_peers(a, &first, 1); /* a peer in use: the invariant says so */
    }
}

void swa_release_cached(struct swa_alloc *a, const uint32_t *pages, size_t n)
{
    swa_release_swa(a, pages, n);
    slot_release_cached(&a->full, pages, n);
}

int swa_move_peers(struct swa_alloc *a, const uint32_t *to, const uint32_t *from, size_t n)
{
    uint32_t np = a->full.npages;

    for (size_t i = 0; i < n; i++)
        if (to[i] == 0 || to[i] > np || from[i] == 0 || from[i] > np || a->peer[to[i]] ||
            !a->peer[from[i]] || a->full.state[to[i]] != PAGE_CACHED ||
            a->full.state[from[i]] != PAGE_USED)
            return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        int32_t *dst = a->map + (size_t)to[i] * a->page_size;
        int32_t *src = a->map + (size_t)from[i] * a->page_size;
        memcpy(dst, src, a->page_size * sizeof(*dst));
        memset(src, 0, a->page_size * sizeof(*src));
        a->peer[to[i]] = a->peer[from[i]];
        a->peer[from[i]] = 0;
    }
    return 0;
}

int swa_give_peers(struct swa_alloc *a, const uint32_t *pages, size_t n)
{
    uint32_t ps = a->page_size;
    size_t i;

    if (n && !pages)
        return -EINVAL;
    for (i = 0; i < n; i++) {
        uint32_t p = pages[i];
        if (p == 0 || p > a->full.npages || a->peer[p] || a->mark[p])
            break;
        a->mark[p] = 1; /* a page named twice would get two peers */
    }
    for (size_t j = 0; j < i; j++)
        a->mark[pages[j]] = 0;
    if (i < n)
        return -EINVAL;
    if ((uint64_t)n * ps > slot_available(&a->swa))
        return -ENOMEM;
    for (i = 0; i < n; i++) {
        int32_t first = (int32_t)(pages[i] * ps);
        (void)slot_alloc(&a->swa, ps, a->scratch); /* room checked above */
        for (uint32_t j = 0; j < ps; j++)
            a->map[first + (int32_t)j] = a->scratch[j];
        a->peer[pages[i]] = (uint32_t)a->scratch[0] / ps;
    }
    return 0;
}

int swa_page_live(const struct swa_alloc *a, uint32_t p)
{
    return p <= a->full.npages && a->peer[p] != 0;
}

int swa_free_group_begin(struct swa_alloc *a)
{
    if (a->full.in_group || a->swa.in_group)
        return -EINVAL;
    slot_free_group_begin(&a->full);
    slot_free_group_begin(&a->swa);
    return 0;
}

int swa_free_group_end(struct swa_alloc *a)
{
    if (!a->full.in_group || !a->swa.in_group)
        return -EINVAL;
    slot_free_group_end(&a->swa);
    slot_free_group_end(&a->full);
    return 0;
}

int swa_translate(const struct swa_alloc *a, const int32_t *full_slots, size_t n,
                  int32_t *swa_slots)
{
    if (n && (!full_slots || !swa_slots))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (full_slots[i] != -1 && !in_full_range(a, full_slots[i]))
            return -EINVAL;
    for (size_t i = 0; i < n; i++)
        swa_slots[i] = full_slots[i] == -1 ? -1 : a->map[full_slots[i]];
    return 0;
}

int swa_check_live(const struct swa_alloc *a, const int32_t *full_slots, size_t n)
{
    if (n && !full_slots)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!in_full_range(a, full_slots[i]))
            return -EINVAL;
        /* The padding page's writes go to the SWA pool's padding slot. */
        if ((uint32_t)full_slots[i] >= a->page_size && a->map[full_slots[i]] == 0)
            return -ENOENT;
    }
    return 0;
}

void swa_translate_live(const struct swa_alloc *a, const int32_t *full_slots, size_t n,
                        int32_t *swa_slots)
{
    for (size_t i = 0; i < n; i++)
        swa_slots[i] = a->map[full_slots[i]];
}

uint64_t swa_window_evict_to(uint64_t seq_len, uint64_t cursor, uint32_t window, uint32_t page_size,
                             int prefix_sharing)
{
    uint64_t keep = window, end;

    if (seq_len < (uint64_t)window + cursor + 1)
        return cursor;
    if (prefix_sharing) {
        keep = window > page_size ? window : page_size;
        keep = (keep + page_size - 1) / page_size * page_size;
    }
    if (seq_len <= keep)
        return cursor;
    end = (seq_len - keep) / page_size * page_size;
    return end > cursor ? end : cursor;
}

static int page_in_use(const struct slot_alloc *s, uint32_t p)
{
    return s->state[p] == PAGE_USED || s->state[p] == PAGE_CACHED;
}

/* Full page p's slots map to 0 or to the same offset in its peer, and some slot maps
 * exactly when it has a peer. */
static int page_map_ok(const struct swa_alloc *a, uint32_t p)
{
    const int32_t *m = a->map + (size_t)p * a->page_size;
    int any = 0;

    for (uint32_t j = 0; j < a->page_size; j++) {
        if (m[j] == 0)
            continue;
        if (m[j] != (int32_t)(a->peer[p] * a->page_size + j))
            return 0;
        any = 1;
    }
    return any == (a->peer[p] != 0);
}

/* Full page p's peer is in use on both sides and no other full page's peer (seen counts). */
static int peer_ok(const struct swa_alloc *a, uint32_t p, uint8_t *seen)
{
    uint32_t q = a->peer[p];

    if (q == 0)
        return 1;
    if (q > a->swa.npages || seen[q] || !page_in_use(&a->full, p) || !page_in_use(&a->swa, q))
        return 0;
    seen[q] = 1;
    return 1;
}

int swa_alloc_check(const struct swa_alloc *a)
{
    uint8_t *seen = calloc((size_t)a->swa.npages + 1, 1);
    size_t peers = 0, swa_in_use = 0;
    int ok = a->peer[0] == 0 && page_map_ok(a, 0);

    if (!seen)
        return -ENOMEM;

    for (uint32_t p = 1; ok && p <= a->full.npages; p++) {
        ok = page_map_ok(a, p) && peer_ok(a, p, seen) && !a->mark[p];
        peers += a->peer[p] != 0;
    }
    for (uint32_t q = 1; ok && q <= a->swa.npages; q++)
        swa_in_use += page_in_use(&a->swa, q);
    /* Every SWA page in use is some full page's peer: none stranded. */
    ok = ok && swa_in_use == peers;
    free(seen);
    return ok ? 0 : -EINVAL;
}
