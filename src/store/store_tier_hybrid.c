/*
 * What a store tier keeps for hybrid models (store/store_tier_int.h): the window copies of
 * pages whose sliding-window layers the host kept, and recurrent states. Both are kept with
 * one page of the engine to a store page (options.store_page_tokens is refused with them).
 */
#include "store/store_tier_int.h"

#include <string.h>

/* The key of the window copy of the page hashed hash. */
int store_window_key(struct store_tier *s, const uint8_t *hash, uint8_t *out)
{
    return page_hasher_digest2(&s->hasher, hash, KVT_HASH_LEN, WINDOW_TAG, sizeof(WINDOW_TAG) - 1,
                               out);
}

/* Lookups per window search: each looks at a window's pages at once and, failing, moves
 * below the first missing one, so a run's window copies (at node ends and at regular points
 * of the key, radix_tiers.c window_page) are found within a few unless far below its end. */
#define WINDOW_LOOKUPS 16

/* How many of pages [lo, hi) of the run have window copies, from lo on. */
static size_t windows_from(struct store_tier *s, size_t lo, size_t hi)
{
    size_t run = 0;

    for (size_t i = lo; i < hi; i++)
        if (store_window_key(s, s->hashes[i], s->wkeys[i - lo]))
            return 0;
    if (store_leading_run(s->store, (const uint8_t *)s->wkeys, hi - lo, &run))
        return 0;
    return run;
}

/* From the run's end down: the first point with a window of copies right before it, or the
 * run's start when the copies reach it and the tree's part above ends with its window. */
size_t store_tier_window(struct tier *t, size_t n, bool above, size_t *window)
{
    struct store_tier *s = st_of(t);
    uint64_t ps = s->opts->page_size, w = s->opts->swa.window;
    size_t wp = (size_t)((w + ps - 1) / ps), end = n;

    *window = 0;
    for (int i = 0; w && end > 0 && i < WINDOW_LOOKUPS; i++) {
        size_t lo = end > wp ? end - wp : 0, run = windows_from(s, lo, end);
        if (run == end - lo) {
            if (end - lo < wp && !above)
                return 0; /* the window reaches into the tree's part, which lacks its own */
            *window = end - lo;
            return end;
        }
        end = lo + run; /* a window ending past the first missing copy would hold it */
    }
    return 0;
}

/* After the n pages of a write, the window copies of those whose host copy holds their
 * sliding-window layers: how many. */
size_t store_add_windows(struct store_tier *s, size_t n)
{
    const struct tier_up *up = &s->base.up;
    size_t m = 0;

    for (size_t i = 0; i < n; i++) {
        const struct rdx_disk_page *p = &s->dpages[i];
        if (!p->window || store_window_key(s, p->hash, s->wkeys[m]))
            continue;
        s->wpages[n + m] = (struct store_wpage){.key = s->wkeys[m],
                                                .parent = p->hash,
                                                .ns = s->window_ns,
                                                .tokens = NULL,
                                                .buf = up->addr(up->ctx, p->host_page)};
        m++;
    }
    return m;
}

/* ---- recurrent states ---- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The n page keys of a state of `bytes` kept under hash. */
static int state_keys(struct store_tier *s, const uint8_t *hash, size_t bytes, size_t n,
                      uint8_t (*keys)[KVT_HASH_LEN])
{
    uint8_t b[KVT_HASH_LEN + sizeof(STATE_TAG) - 1 + 12];
    size_t tag = sizeof(STATE_TAG) - 1;

    memcpy(b, hash, KVT_HASH_LEN);
    memcpy(b + KVT_HASH_LEN, STATE_TAG, tag);
    put_le(b + KVT_HASH_LEN + tag, bytes, 8);
    for (size_t i = 0; i < n; i++) {
        put_le(b + KVT_HASH_LEN + tag + 8, i, 4);
        if (page_hasher_digest2(&s->hasher, b, sizeof(b), NULL, 0, keys[i]))
            return -ENOMEM;
    }
    return 0;
}

/* Keys for a state of `bytes` and, when stage is given, a page-aligned staging buffer for its
 * pages: its page count, or 0. */
static size_t state_begin(struct store_tier *s, const uint8_t *hash, size_t bytes,
                          uint8_t (**keys)[KVT_HASH_LEN], void **stage)
{
    size_t pb = s->store->page_bytes, n = bytes ? (bytes + pb - 1) / pb : 0;

    *keys = NULL;
    if (stage)
        *stage = NULL;
    if (n == 0 || !(*keys = malloc(n * sizeof(**keys))) || state_keys(s, hash, bytes, n, *keys) ||
        (stage && posix_memalign(stage, 4096, n * pb))) {
        free(*keys);
        *keys = NULL;
        if (stage)
            *stage = NULL;
        return 0;
    }
    return n;
}

int store_tier_put_state(struct tier *t, const uint8_t *hash, const void *buf, size_t bytes)
{
    struct store_tier *s = st_of(t);
    size_t pb = s->store->page_bytes;
    uint8_t(*keys)[KVT_HASH_LEN];
    void *stage;
    size_t n = state_begin(s, hash, bytes, &keys, &stage);
    struct store_wpage *w = n ? malloc(n * sizeof(*w)) : NULL;
    int *results = n ? malloc(n * sizeof(int)) : NULL;
    uint64_t id;
    int rc = w && results && !ops_reserve(s) ? 0 : -ENOMEM;

    if (rc == 0) {
        memcpy(stage, buf, bytes);
        memset((uint8_t *)stage + bytes, 0, n * pb - bytes);
        for (size_t i = 0; i < n; i++)
            w[i] = (struct store_wpage){.key = keys[i],
                                        .parent = hash,
                                        .ns = s->state_ns,
                                        .tokens = NULL,
                                        .buf = (uint8_t *)stage + i * pb};
        rc = store_write(s->store, w, n, results, &id);
    }
    free(keys);
    free(w);
    if (rc) {
        free(results);
        free(stage);
        return 0;
    }
    s->ops[s->nops++] =
        (struct store_op){.id = id, .kind = OP_STATE, .n = n, .results = results, .stage = stage};
    return 1;
}

bool store_tier_has_state(struct tier *t, const uint8_t *hash, size_t bytes)
{
    struct store_tier *s = st_of(t);
    uint8_t(*keys)[KVT_HASH_LEN];
    size_t n = state_begin(s, hash, bytes, &keys, NULL), run = 0;

    if (n && store_leading_run(s->store, (const uint8_t *)keys, n, &run))
        run = 0;
    free(keys);
    return n && run == n;
}

int store_tier_get_state(struct tier *t, const uint8_t *hash, void *buf, size_t bytes)
{
    struct store_tier *s = st_of(t);
    uint8_t(*keys)[KVT_HASH_LEN];
    void *stage;
    size_t n = state_begin(s, hash, bytes, &keys, &stage), pb = s->store->page_bytes;
    struct store_rpage *r = n ? malloc(n * sizeof(*r)) : NULL;
    int *results = n ? malloc(n * sizeof(int)) : NULL;
    struct store_done d;
    uint64_t id;
    int rc = r && results ? 0 : -ENOMEM;

    for (size_t i = 0; rc == 0 && i < n; i++)
        r[i] = (struct store_rpage){.key = keys[i], .buf = (uint8_t *)stage + i * pb};
    if (rc == 0 && (rc = store_read(s->store, r, n, results, &id, NULL)) == 0 &&
        (rc = store_wait_for(s->store, id, -1, &d)) == 0)
        for (size_t i = 0; rc == 0 && i < n; i++)
            rc = results[i];
    if (rc == 0)
        memcpy(buf, stage, bytes);
    free(keys);
    free(r);
    free(results);
    free(stage);
    return rc;
}
