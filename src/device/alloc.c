/*
 * The free list follows SGLang's allocators so that a scheduler ported from it sees the
 * same slots: pages are taken from the front; the paged allocator puts freed pages back at
 * the front in ascending order (unique(index / page_size)), the token allocator appends
 * them at the back in the order given.
 */
#include "alloc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t pop_front(struct slot_alloc *a)
{
    uint32_t p = a->ring[a->head];

    a->head = (a->head + 1) % a->npages;
    a->nfree--;
    return p;
}

static void push_front(struct slot_alloc *a, uint32_t p)
{
    a->head = (a->head + a->npages - 1) % a->npages;
    a->ring[a->head] = p;
    a->nfree++;
}

static void push_back(struct slot_alloc *a, uint32_t p)
{
    a->ring[(a->head + a->nfree) % a->npages] = p;
    a->nfree++;
}

int slot_alloc_init(struct slot_alloc *a, uint64_t tokens, uint32_t page_size)
{
    memset(a, 0, sizeof(*a));
    if (page_size == 0 || (page_size & (page_size - 1)) || tokens / page_size == 0 ||
        tokens / page_size >= INT32_MAX / page_size)
        return -EINVAL;
    a->page_size = page_size;
    a->npages = (uint32_t)(tokens / page_size);
    a->state = malloc(a->npages + 1);
    a->ring = malloc(a->npages * sizeof(uint32_t));
    a->group = malloc(a->npages * sizeof(uint32_t));
    a->scratch = malloc(a->npages * sizeof(uint32_t));
    if (!a->state || !a->ring || !a->group || !a->scratch) {
        slot_alloc_finish(a);
        return -ENOMEM;
    }
    slot_alloc_clear(a);
    return 0;
}

void slot_alloc_finish(struct slot_alloc *a)
{
    free(a->state);
    free(a->ring);
    free(a->group);
    free(a->scratch);
    memset(a, 0, sizeof(*a));
}

void slot_alloc_clear(struct slot_alloc *a)
{
    a->state[0] = PAGE_RESERVED;
    memset(a->state + 1, PAGE_FREE, a->npages);
    for (uint32_t i = 0; i < a->npages; i++)
        a->ring[i] = i + 1;
    a->head = 0;
    a->nfree = a->npages;
    a->ngroup = 0;
    a->in_group = 0;
}

size_t slot_available(const struct slot_alloc *a)
{
    return (size_t)a->nfree * a->page_size;
}

static void put_page(struct slot_alloc *a, uint32_t p, int32_t *slots)
{
    for (uint32_t j = 0; j < a->page_size; j++)
        slots[j] = (int32_t)(p * a->page_size + j);
}

static uint32_t take_page(struct slot_alloc *a)
{
    uint32_t p = pop_front(a);

    a->state[p] = PAGE_USED;
    return p;
}

int slot_alloc(struct slot_alloc *a, size_t n, int32_t *slots)
{
    if (n % a->page_size || (n && !slots))
        return -EINVAL;
    if (n / a->page_size > a->nfree)
        return -ENOMEM;
    for (size_t i = 0; i < n / a->page_size; i++)
        put_page(a, take_page(a), slots + i * a->page_size);
    return 0;
}

static int page_of(const struct slot_alloc *a, int32_t slot, uint32_t *page)
{
    if (slot < 0 || (uint32_t)slot / a->page_size == 0 || (uint32_t)slot / a->page_size > a->npages)
        return -EINVAL;
    *page = (uint32_t)slot / a->page_size;
    return 0;
}

int slot_all_in_state(const struct slot_alloc *a, const int32_t *slots, size_t n, enum page_state s)
{
    uint32_t p;

    for (size_t i = 0; i < n; i++)
        if (page_of(a, slots[i], &p) || a->state[p] != s)
            return 0;
    return 1;
}

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

/* Give n distinct pages (state already changed by the caller) back to the free list. */
static void release(struct slot_alloc *a, uint32_t *pages, size_t n)
{
    if (a->in_group) {
        for (size_t i = 0; i < n; i++) {
            a->state[pages[i]] = PAGE_PENDING;
            a->group[a->ngroup++] = pages[i];
        }
        return;
    }
    for (size_t i = 0; i < n; i++)
        a->state[pages[i]] = PAGE_FREE;
    if (a->page_size == 1) {
        for (size_t i = 0; i < n; i++)
            push_back(a, pages[i]);
        return;
    }
    qsort(pages, n, sizeof(*pages), cmp_u32);
    for (size_t i = n; i-- > 0;)
        push_front(a, pages[i]);
}

int slot_free(struct slot_alloc *a, const int32_t *slots, size_t n)
{
    size_t m = 0;

    if (n && !slots)
        return -EINVAL;
    if (!slot_all_in_state(a, slots, n, PAGE_USED))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        uint32_t p = (uint32_t)slots[i] / a->page_size; /* in range: checked above */
        if (a->state[p] == PAGE_USED) { /* later slots of the same page are skipped */
            a->state[p] = PAGE_FREE;
            a->scratch[m++] = p;
        }
    }
    release(a, a->scratch, m);
    return 0;
}

int slot_free_group_begin(struct slot_alloc *a)
{
    if (a->in_group)
        return -EINVAL;
    a->in_group = 1;
    a->ngroup = 0;
    return 0;
}

int slot_free_group_end(struct slot_alloc *a)
{
    if (!a->in_group)
        return -EINVAL;
    a->in_group = 0;
    memcpy(a->scratch, a->group, a->ngroup * sizeof(uint32_t));
    release(a, a->scratch, a->ngroup);
    a->ngroup = 0;
    return 0;
}

static uint64_t pages_for(uint64_t tokens, uint32_t ps)
{
    return (tokens + ps - 1) / ps;
}

/* last_loc is the slot of a request's token len-1: -1 for an empty request; in a page the
 * request holds when that page is partial (the allocator continues it); in a page the
 * request or the cache holds otherwise. */
static int check_last_loc(const struct slot_alloc *a, uint64_t len, int32_t last_loc)
{
    uint32_t p;

    if (len == 0)
        return last_loc == -1 ? 0 : -EINVAL;
    if (page_of(a, last_loc, &p) || ((uint64_t)last_loc + 1) % a->page_size != len % a->page_size)
        return -EINVAL;
    if (a->state[p] == PAGE_USED)
        return 0;
    return len % a->page_size == 0 && a->state[p] == PAGE_CACHED ? 0 : -EINVAL;
}

int slot_extend_check(const struct slot_alloc *a, size_t batch, const uint32_t *prefix_lens,
                      const uint32_t *seq_lens, const int32_t *last_locs, const int32_t *out,
                      size_t out_len, size_t *pages)
{
    uint32_t ps = a->page_size;
    uint64_t total = 0, need = 0;

    if (batch && (!prefix_lens || !seq_lens || !last_locs || !out))
        return -EINVAL;
    for (size_t i = 0; i < batch; i++) {
        if (seq_lens[i] <= prefix_lens[i] || check_last_loc(a, prefix_lens[i], last_locs[i]))
            return -EINVAL;
        total += seq_lens[i] - prefix_lens[i];
        need += pages_for(seq_lens[i], ps) - pages_for(prefix_lens[i], ps);
    }
    if (total != out_len)
        return -EINVAL;
    *pages = need;
    return 0;
}

void slot_extend_take(struct slot_alloc *a, size_t batch, const uint32_t *prefix_lens,
                      const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out)
{
    uint32_t ps = a->page_size;

    for (size_t i = 0; i < batch; i++) {
        uint64_t pre = prefix_lens[i], seq = seq_lens[i];
        uint64_t first_full = pages_for(pre, ps) * ps; /* end of the prefix's last page */
        uint64_t num1 = (seq < first_full ? seq : first_full) - pre;
        for (uint64_t k = 0; k < num1; k++)
            *out++ = last_locs[i] + 1 + (int32_t)k;
        for (uint64_t pos = first_full; pos + ps <= seq; pos += ps, out += ps)
            put_page(a, take_page(a), out);
        uint64_t num3 = seq > first_full ? seq % ps : 0;
        if (num3) {
            uint32_t p = take_page(a);
            for (uint64_t k = 0; k < num3; k++)
                *out++ = (int32_t)(p * ps + k);
        }
    }
}

int slot_alloc_extend(struct slot_alloc *a, size_t batch, const uint32_t *prefix_lens,
                      const uint32_t *seq_lens, const int32_t *last_locs, int32_t *out,
                      size_t out_len)
{
    size_t need;
    int rc = slot_extend_check(a, batch, prefix_lens, seq_lens, last_locs, out, out_len, &need);

    if (rc)
        return rc;
    if (need > a->nfree)
        return -ENOMEM;
    slot_extend_take(a, batch, prefix_lens, seq_lens, last_locs, out);
    return 0;
}

int slot_decode_check(const struct slot_alloc *a, size_t batch, const uint32_t *seq_lens,
                      const int32_t *last_locs, const int32_t *out, size_t *pages)
{
    size_t need = 0;

    if (batch && (!seq_lens || !last_locs || !out))
        return -EINVAL;
    for (size_t i = 0; i < batch; i++) {
        if (seq_lens[i] == 0 || check_last_loc(a, seq_lens[i] - 1, last_locs[i]))
            return -EINVAL;
        need += (seq_lens[i] - 1) % a->page_size == 0;
    }
    *pages = need;
    return 0;
}

void slot_decode_take(struct slot_alloc *a, size_t batch, const uint32_t *seq_lens,
                      const int32_t *last_locs, int32_t *out)
{
    for (size_t i = 0; i < batch; i++) {
        if ((seq_lens[i] - 1) % a->page_size == 0)
            out[i] = (int32_t)(take_page(a) * a->page_size);
        else
            out[i] = last_locs[i] + 1;
    }
}

int slot_alloc_decode(struct slot_alloc *a, size_t batch, const uint32_t *seq_lens,
                      const int32_t *last_locs, int32_t *out)
{
    size_t need;
    int rc = slot_decode_check(a, batch, seq_lens, last_locs, out, &need);

    if (rc)
        return rc;
    if (need > a->nfree)
        return -ENOMEM;
    slot_decode_take(a, batch, seq_lens, last_locs, out);
    return 0;
}

int slot_pages_of(const struct slot_alloc *a, const int32_t *slots, size_t n, uint32_t *pages)
{
    uint32_t ps = a->page_size;

    if (n % ps || (n && !slots))
        return -EINVAL;
    for (size_t i = 0; i < n / ps; i++) {
        const int32_t *s = slots + i * ps;
        if (s[0] % (int32_t)ps || page_of(a, s[0], &pages[i]))
            return -EINVAL;
        for (uint32_t j = 1; j < ps; j++)
            if (s[j] != s[0] + (int32_t)j)
                return -EINVAL;
    }
    return 0;
}

/* A partial page of n < page_size slots: the first n slots of one page, in order. */
static int partial_page_of(const struct slot_alloc *a, const int32_t *slots, size_t n,
                           uint32_t *page)
{
    if (n == 0 || slots[0] % (int32_t)a->page_size || page_of(a, slots[0], page))
        return -EINVAL;
    for (size_t j = 1; j < n; j++)
        if (slots[j] != slots[0] + (int32_t)j)
            return -EINVAL;
    return 0;
}

int slot_row_held(struct slot_alloc *a, const int32_t *row, size_t n, uint32_t *scratch)
{
    size_t whole = n / a->page_size * a->page_size, np = whole / a->page_size;
    int rc;

    if ((rc = slot_pages_of(a, row, whole, scratch)))
        return rc;
    if (n > whole && (rc = partial_page_of(a, row + whole, n - whole, &scratch[np++])))
        return rc;
    /* Claiming checks "held and distinct" in one pass and undoes itself on failure. */
    if ((rc = slot_claim(a, scratch, np)))
        return rc;
    slot_unclaim(a, scratch, np);
    return 0;
}

int slot_claim(struct slot_alloc *a, const uint32_t *pages, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (pages[i] == 0 || pages[i] > a->npages || a->state[pages[i]] != PAGE_USED) {
            while (i-- > 0)
                a->state[pages[i]] = PAGE_USED;
            return -EINVAL;
        }
        a->state[pages[i]] = PAGE_CACHED;
    }
    return 0;
}

void slot_unclaim(struct slot_alloc *a, const uint32_t *pages, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a->state[pages[i]] = PAGE_USED;
}

void slot_release_cached(struct slot_alloc *a, const uint32_t *pages, size_t n)
{
    size_t m = 0;

    for (size_t i = 0; i < n; i++)
        if (a->state[pages[i]] == PAGE_CACHED)
            a->scratch[m++] = pages[i];
    release(a, a->scratch, m);
}
