/*
 * The slot table's bookkeeping, under the store's lock (store_int.h): slot states, pins, the
 * free stack, access times, and the two eviction orders.
 *
 * Every used slot is on the LRU list. A used slot none of whose children is stored (a chain
 * end, or leaf) is also in the chain-end heap, ordered by last access. Eviction takes chain
 * ends first: a page whose parent is gone can only be served again once an engine holds that
 * parent, so evicting from the root of a chain would strand everything below it, while
 * evicting its end loses one page. A hot root stays as long as its chain does, even when its
 * own hits land in the tiers above and never touch it here.
 *
 * Children are found through a map from a key's 64-bit tag (index.h: key_tag) to its slot:
 * each used slot records its parent's tag, and counts its stored children. The children of a
 * parent that is not stored (evicted, dropped, or not written yet) wait under its tag in a
 * small table, and a parent written (again) starts with them. A tag shared by two keys only
 * misplaces such a preference, never a byte.
 */
#include "store_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- time ---- */

uint64_t stamp_locked(struct dstore *s)
{
    struct timespec ts;
    uint64_t now;

    clock_gettime(CLOCK_REALTIME, &ts);
    now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    s->clock = now > s->clock ? now : s->clock + 1;
    return s->clock;
}

/* ---- the two lists ---- */

static void unlink_in(struct slot_list *l, uint32_t g)
{
    uint32_t p = l->prev[g], n = l->next[g];

    if (p != NO_SLOT)
        l->next[p] = n;
    else if (l->head == g)
        l->head = n;
    if (n != NO_SLOT)
        l->prev[n] = p;
    else if (l->tail == g)
        l->tail = p;
    l->prev[g] = l->next[g] = NO_SLOT;
}

static void push_head(struct slot_list *l, uint32_t g)
{
    l->prev[g] = NO_SLOT;
    l->next[g] = l->head;
    if (l->head != NO_SLOT)
        l->prev[l->head] = g;
    l->head = g;
    if (l->tail == NO_SLOT)
        l->tail = g;
}

void lists_reset_locked(struct dstore *s)
{
    s->lru.head = s->lru.tail = NO_SLOT;
    for (uint64_t g = 0; g < s->nslots; g++) {
        s->lru.prev[g] = s->lru.next[g] = NO_SLOT;
        s->end_pos[g] = 0;
    }
    s->nends = 0;
}

/* ---- the chain ends: a min-heap on last access, each slot knowing its place ---- */

static bool older(const struct dstore *s, uint32_t a, uint32_t b)
{
    return s->atime[a] < s->atime[b] || (s->atime[a] == s->atime[b] && a < b);
}

static void heap_set(struct dstore *s, uint32_t i, uint32_t g)
{
    s->ends[i] = g;
    s->end_pos[g] = i + 1;
}

static void sift_up(struct dstore *s, uint32_t i)
{
    uint32_t g = s->ends[i];

    for (; i > 0 && older(s, g, s->ends[(i - 1) / 2]); i = (i - 1) / 2)
        heap_set(s, i, s->ends[(i - 1) / 2]);
    heap_set(s, i, g);
}

static void sift_down(struct dstore *s, uint32_t i)
{
    uint32_t g = s->ends[i];

    for (;;) {
        uint32_t c = 2 * i + 1;

        if (c >= s->nends)
            break;
        if (c + 1 < s->nends && older(s, s->ends[c + 1], s->ends[c]))
            c++;
        if (!older(s, s->ends[c], g))
            break;
        heap_set(s, i, s->ends[c]);
        i = c;
    }
    heap_set(s, i, g);
}

static bool is_end(const struct dstore *s, uint32_t g)
{
    return s->end_pos[g] != 0;
}

static void end_add(struct dstore *s, uint32_t g)
{
    if (is_end(s, g))
        return;
    heap_set(s, s->nends++, g);
    sift_up(s, s->nends - 1);
}

static void end_remove(struct dstore *s, uint32_t g)
{
    uint32_t i = s->end_pos[g] - 1, last;

    if (!is_end(s, g))
        return;
    s->end_pos[g] = 0;
    last = s->ends[--s->nends];
    if (i == s->nends)
        return;
    heap_set(s, i, last);
    sift_up(s, i);
    sift_down(s, s->end_pos[last] - 1);
}

/* ---- the tag map: open addressing, linear probing, deletion by shifting back ---- */

static uint64_t bucket_of(const struct dstore *s, uint64_t tag)
{
    return (tag * 0x9e3779b97f4a7c15ull) >> s->map_shift;
}

uint32_t tag_find_locked(const struct dstore *s, uint64_t tag)
{
    uint64_t mask = s->map_size - 1;

    if (!tag)
        return NO_SLOT;
    for (uint64_t b = bucket_of(s, tag);; b = (b + 1) & mask) {
        uint32_t g = s->map[b];

        if (g == NO_SLOT)
            return NO_SLOT;
        if (key_tag(s->skey[g]) == tag)
            return g;
    }
}

static void tag_insert(struct dstore *s, uint32_t g)
{
    uint64_t tag = key_tag(s->skey[g]), mask = s->map_size - 1;

    for (uint64_t b = bucket_of(s, tag);; b = (b + 1) & mask) {
        if (s->map[b] == NO_SLOT) {
            s->map[b] = g;
            return;
        }
        if (key_tag(s->skey[s->map[b]]) == tag) {
            /* Another key of this tag holds it: g loses its children count, and lookups
             * by tag cannot see it (tag_absent_locked). */
            s->tags_shadowed += s->map[b] != g;
            return;
        }
    }
}

static void tag_remove(struct dstore *s, uint32_t g)
{
    uint64_t mask = s->map_size - 1, hole = bucket_of(s, key_tag(s->skey[g]));

    while (s->map[hole] != g) {
        if (s->map[hole] == NO_SLOT) {
            s->tags_shadowed -= s->tags_shadowed != 0; /* g was one tag_insert left out */
            return;
        }
        hole = (hole + 1) & mask;
    }
    /* Close the hole: an entry of the run moves into it unless its home lies after the hole,
     * where a lookup would never pass the hole to reach it. */
    for (uint64_t n = (hole + 1) & mask; s->map[n] != NO_SLOT; n = (n + 1) & mask) {
        uint64_t home = bucket_of(s, key_tag(s->skey[s->map[n]]));

        if (((n - home) & mask) >= ((n - hole) & mask)) {
            s->map[hole] = s->map[n];
            hole = n;
        }
    }
    s->map[hole] = NO_SLOT;
}

/* Every used slot is in the map but those tags_shadowed counts, so with none of those a key
 * whose tag finds no slot holding it is in no used slot. */
bool tag_absent_locked(const struct dstore *s, const uint8_t *key)
{
    uint32_t g;

    if (!table_known_locked(s) || s->tags_shadowed)
        return false;
    g = tag_find_locked(s, key_tag(key));
    return g == NO_SLOT || memcmp(s->skey[g], key, DSTORE_KEY_BYTES) != 0;
}

/* ---- children waiting for a parent that is not stored ---- */

/* Counts by parent tag of the used slots whose parent is not stored: when that parent is
 * written (again), it starts with them. A small table, grown as needed. */
static uint64_t wbucket(const struct dstore *s, uint64_t tag)
{
    return (tag * 0x9e3779b97f4a7c15ull) >> s->wait_shift;
}

static struct tag_count *waiting_find(const struct dstore *s, uint64_t tag)
{
    uint64_t mask = s->wait_size - 1;

    for (uint64_t b = s->wait_size ? wbucket(s, tag) : 0; s->wait_size; b = (b + 1) & mask) {
        if (!s->waiting[b].tag)
            return NULL;
        if (s->waiting[b].tag == tag)
            return &s->waiting[b];
    }
    return NULL;
}

static void waiting_put(struct dstore *s, uint64_t tag, uint32_t count)
{
    uint64_t mask = s->wait_size - 1, b = wbucket(s, tag);

    while (s->waiting[b].tag)
        b = (b + 1) & mask;
    s->waiting[b] = (struct tag_count){tag, count};
    s->wait_used++;
}

/* Room for one more entry at half load; false without memory (the count is then lost, which
 * only misplaces an eviction preference). */
static bool waiting_room(struct dstore *s)
{
    struct tag_count *old = s->waiting;
    uint64_t n = s->wait_size, size = n ? 2 * n : 1024;
    uint32_t shift = 64;

    if (2 * (s->wait_used + 1) <= n)
        return true;
    if (!(s->waiting = calloc(size, sizeof(*s->waiting)))) {
        s->waiting = old;
        return false;
    }
    for (uint64_t z = size; z > 1; z >>= 1)
        shift--;
    s->wait_size = size;
    s->wait_shift = shift;
    s->wait_used = 0;
    for (uint64_t i = 0; i < n; i++)
        if (old[i].tag)
            waiting_put(s, old[i].tag, old[i].count);
    free(old);
    return true;
}

static void waiting_add(struct dstore *s, uint64_t tag, uint32_t count)
{
    struct tag_count *e = waiting_find(s, tag);

    if (e)
        e->count += count;
    else if (waiting_room(s))
        waiting_put(s, tag, count);
}

static void waiting_remove(struct dstore *s, struct tag_count *e)
{
    uint64_t mask = s->wait_size - 1, hole = (uint64_t)(e - s->waiting);

    for (uint64_t n = (hole + 1) & mask; s->waiting[n].tag; n = (n + 1) & mask) {
        uint64_t home = wbucket(s, s->waiting[n].tag);

        if (((n - home) & mask) >= ((n - hole) & mask)) {
            s->waiting[hole] = s->waiting[n];
            hole = n;
        }
    }
    s->waiting[hole] = (struct tag_count){0, 0};
    s->wait_used--;
}

/* The children waiting for tag, now stored: their count, out of the table. */
static uint32_t waiting_take(struct dstore *s, uint64_t tag)
{
    struct tag_count *e = waiting_find(s, tag);
    uint32_t n = e ? e->count : 0;

    if (e)
        waiting_remove(s, e);
    return n;
}

static void waiting_sub(struct dstore *s, uint64_t tag)
{
    struct tag_count *e = waiting_find(s, tag);

    if (e && --e->count == 0)
        waiting_remove(s, e);
}

/* ---- slots coming and going ---- */

/* A used slot g counts in its parent: the stored parent's children, or the waiting ones. */
static void kid_added(struct dstore *s, uint32_t g)
{
    uint32_t p = tag_find_locked(s, s->ptag[g]);

    if (p != NO_SLOT && s->state[p] == SLOT_USED) {
        if (s->kids[p]++ == 0)
            end_remove(s, p);
    } else if (s->ptag[g]) {
        waiting_add(s, s->ptag[g], 1);
    }
}

/* A child of a stored parent went: the parent may be a chain end now, ordered among the
 * others by its own last access. */
static void kid_gone(struct dstore *s, uint32_t g)
{
    uint32_t p = tag_find_locked(s, s->ptag[g]);

    if (p != NO_SLOT && s->state[p] == SLOT_USED) {
        if (s->kids[p] && --s->kids[p] == 0)
            end_add(s, p);
    } else if (s->ptag[g]) {
        waiting_sub(s, s->ptag[g]);
    }
}

void slot_use_locked(struct dstore *s, uint32_t g, uint64_t parent_tag)
{
    s->state[g] = SLOT_USED;
    s->ptag[g] = parent_tag;
    s->kids[g] = waiting_take(s, key_tag(s->skey[g])); /* written after some of its children */
    push_head(&s->lru, g);
    if (!s->kids[g])
        end_add(s, g);
    tag_insert(s, g);
    kid_added(s, g);
}

void slot_unuse_locked(struct dstore *s, uint32_t g)
{
    if (s->state[g] != SLOT_USED)
        return;
    unlink_in(&s->lru, g);
    end_remove(s, g);
    tag_remove(s, g);
    if (s->kids[g]) /* its children wait for it to come back */
        waiting_add(s, key_tag(s->skey[g]), s->kids[g]);
    s->state[g] = SLOT_DYING;
    kid_gone(s, g);
}

void slot_revive_locked(struct dstore *s, uint32_t g)
{
    if (s->state[g] == SLOT_DYING)
        slot_use_locked(s, g, s->ptag[g]);
}

void slot_release_locked(struct dstore *s, uint32_t g)
{
    if (s->pins[g]) {
        s->state[g] = SLOT_DEAD;
        return;
    }
    s->state[g] = SLOT_FREE;
    s->freestk[s->nfree++] = g;
}

void unpin_locked(struct dstore *s, uint32_t g)
{
    /* Before the rebuild is done the committer is still writing the slot table, and no slot
     * can be dead yet (deletes queue behind the rebuild): leave the table alone. */
    if (s->ro || --s->pins[g] || !table_known_locked(s))
        return;
    if (s->state[g] == SLOT_DEAD) {
        s->state[g] = SLOT_FREE;
        s->freestk[s->nfree++] = g;
    }
}

/* ---- the rebuild's view: every used slot known, then linked ---- */

/* The i-th used slot, oldest first; slot order without by_age. */
static uint32_t nth_used(const struct dstore *s, const uint32_t *by_age, uint64_t i, uint64_t *g)
{
    if (by_age)
        return by_age[i];
    while (s->state[*g] != SLOT_USED)
        ++*g;
    return (uint32_t)(*g)++;
}

void slots_link_all(struct dstore *s, const uint32_t *by_age, uint64_t n)
{
    uint64_t g = 0;

    for (uint64_t i = 0; i < n; i++)
        tag_insert(s, nth_used(s, by_age, i, &g));
    g = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u = nth_used(s, by_age, i, &g), p = tag_find_locked(s, s->ptag[u]);

        if (p != NO_SLOT)
            s->kids[p]++;
        else if (s->ptag[u])
            waiting_add(s, s->ptag[u], 1);
    }
    /* Oldest first onto the heads, so the most recent ends at the head. */
    g = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u = nth_used(s, by_age, i, &g);

        push_head(&s->lru, u);
        if (!s->kids[u])
            end_add(s, u); /* oldest first: each lands at the bottom, no sifting */
    }
}

/* ---- access ---- */

/* The order changes now; the access time reaches the index lazily (lru.c), so a read costs
 * no write. The dirty list has room for every slot, each listed once. */
void touch_locked(struct dstore *s, uint32_t g)
{
    if (s->state[g] != SLOT_USED)
        return;
    unlink_in(&s->lru, g);
    push_head(&s->lru, g);
    s->atime[g] = stamp_locked(s);
    if (is_end(s, g))
        sift_down(s, s->end_pos[g] - 1); /* it is the most recent now */
    if (s->dirty_bit[g])
        return;
    s->dirty_bit[g] = 1;
    s->dirty[s->ndirty++] = g;
    if (s->ndirty == 1) {
        /* The committer sleeps without a deadline while nothing waits: give it one. */
        s->dirty_since = mono_ns();
        pthread_cond_signal(&s->job_cv);
    }
}

/* A hint like the rest: past EARLY_MAX the oldest order is kept and the rest lost. */
void touch_early_locked(struct dstore *s, uint32_t g, const uint8_t *key)
{
    if (s->nearly == EARLY_MAX)
        return;
    s->early[s->nearly].g = g;
    memcpy(s->early[s->nearly++].key, key, DSTORE_KEY_BYTES);
}

/* ---- eviction order ---- */

/* Up to want unpinned slots from the tail of the LRU list, now DYING. The walk past pinned
 * slots is bounded, so a store full of readers cannot stall the committer. */
static size_t pick_lru(struct dstore *s, size_t want, uint32_t *victims)
{
    size_t n = 0, steps = 2 * want + 64;
    uint32_t g = s->lru.tail;

    while (g != NO_SLOT && n < want && steps--) {
        uint32_t prev = s->lru.prev[g];

        if (!s->pins[g]) {
            slot_unuse_locked(s, g);
            victims[n++] = g;
        }
        g = prev;
    }
    return n;
}

/* Up to want unpinned chain ends, the least recently used first, now DYING; a parent whose
 * last child goes is a chain end at once, in its place. Pinned ones are set aside (bounded)
 * and put back. */
static size_t pick_ends(struct dstore *s, size_t want, uint32_t *victims)
{
    uint32_t held[64];
    size_t n = 0, nheld = 0;

    while (s->nends && n < want) {
        uint32_t g = s->ends[0];

        if (s->pins[g]) {
            if (nheld == sizeof(held) / sizeof(held[0]))
                break;
            end_remove(s, g);
            held[nheld++] = g;
            continue;
        }
        slot_unuse_locked(s, g);
        victims[n++] = g;
    }
    while (nheld)
        end_add(s, held[--nheld]);
    return n;
}

size_t pick_victims_locked(struct dstore *s, size_t want, uint32_t *victims)
{
    size_t n = pick_ends(s, want, victims);

    /* Chain ends all pinned, or none left: the oldest of the rest. */
    if (n < want)
        n += pick_lru(s, want - n, victims + n);
    return n;
}

/* ---- checks, for tests ---- */

/* Every used slot is found by its tag; each counts exactly its used children, and the
 * children of parents not stored wait under their tag; the chain ends are exactly the used
 * slots without children, in heap order. */
int slots_check(struct dstore *s, char *why, size_t len)
{
    uint32_t *kids = calloc(s->nslots ? s->nslots : 1, sizeof(*kids));
    int rc = 0;

    if (!kids)
        return -ENOMEM;
    pthread_mutex_lock(&s->lock);
    for (uint64_t g = 0; g < s->nslots && !rc; g++) {
        uint32_t p;

        if (s->state[g] != SLOT_USED)
            continue;
        if (tag_find_locked(s, key_tag(s->skey[g])) != g) {
            snprintf(why, len, "slot %" PRIu64 " is not found by its tag", g);
            rc = -EUCLEAN;
        }
        if ((p = tag_find_locked(s, s->ptag[g])) != NO_SLOT)
            kids[p]++;
    }
    for (uint64_t g = 0; g < s->nslots && !rc; g++) {
        bool used = s->state[g] == SLOT_USED;

        if (used && kids[g] != s->kids[g])
            snprintf(why, len, "slot %" PRIu64 " counts %u children, has %u", g, s->kids[g],
                     kids[g]),
                rc = -EUCLEAN;
        else if (used && (kids[g] == 0) != is_end(s, g))
            snprintf(why, len, "slot %" PRIu64 " with %u children is%s a chain end", g, kids[g],
                     is_end(s, g) ? "" : " not"),
                rc = -EUCLEAN;
        else if (!used && is_end(s, g))
            snprintf(why, len, "slot %" PRIu64 " (state %u) is a chain end", g, s->state[g]),
                rc = -EUCLEAN;
    }
    /* Each waiting count: the used slots naming that parent, which is not stored. */
    for (uint64_t b = 0; b < s->wait_size && !rc; b++) {
        uint64_t tag = s->waiting[b].tag, n = 0;

        if (!tag)
            continue;
        for (uint64_t g = 0; g < s->nslots; g++)
            n += s->state[g] == SLOT_USED && s->ptag[g] == tag;
        if (n != s->waiting[b].count || tag_find_locked(s, tag) != NO_SLOT)
            snprintf(why, len, "%" PRIu64 " children wait for tag %016" PRIx64 ", %" PRIu64 " do",
                     (uint64_t)s->waiting[b].count, tag, n),
                rc = -EUCLEAN;
    }
    for (uint32_t i = 1; i < s->nends && !rc; i++)
        if (older(s, s->ends[i], s->ends[(i - 1) / 2]))
            snprintf(why, len, "chain ends out of order at %u", i), rc = -EUCLEAN;
    pthread_mutex_unlock(&s->lock);
    free(kids);
    return rc;
}

/* ---- taking and killing slots (the committer) ---- */

uint32_t pop_free_locked(struct dstore *s)
{
    while (s->nfree) {
        uint32_t g = s->freestk[--s->nfree];

        if (!s->pins[g])
            return g;
        s->state[g] = SLOT_DEAD; /* pinned by a read from before the rebuild */
    }
    return NO_SLOT;
}

bool kill_locked(struct dstore *s, uint32_t g, const uint8_t *key)
{
    if (memcmp(s->skey[g], key, DSTORE_KEY_BYTES))
        return false;
    slot_unuse_locked(s, g);
    return s->state[g] == SLOT_DYING;
}
