/*
 * The slot table's bookkeeping, under the store's lock (store_int.h): slot states, pins, the
 * free stack, access times, and the two eviction orders.
 *
 * Every used slot is on the LRU list. A used slot none of whose children is stored (a chain
 * end, or leaf) is also on the leaf list, in the same recency order. Eviction takes leaves
 * first: a page whose parent is gone can only be served again once an engine holds that
 * parent, so evicting from the root of a chain would strand everything below it, while
 * evicting its end loses one page. A hot root stays as long as its chain does, even when its
 * own hits land in the tiers above and never touch it here.
 *
 * Children are found through a map from a key's 64-bit tag (index.h: key_tag) to its slot:
 * each used slot records its parent's tag, and counts its stored children. A page whose
 * parent is written after it (the parent was evicted and comes back) is not counted by that
 * parent; that parent may then be evicted before it, as any page was before. A tag shared by
 * two keys only misplaces such a preference, never a byte.
 */
#include "store_int.h"

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

/* Into a list ordered by last access (s->atime: newest at the head), at its place: found
 * from the tail, where a parent whose last child was evicted mostly belongs, in a bounded
 * walk (past the bound it goes there, a little out of order). */
static void insert_by_age(struct dstore *s, struct slot_list *l, uint32_t g)
{
    uint32_t older = NO_SLOT, x = l->tail; /* g goes between x (newer) and older */

    for (int steps = 0; x != NO_SLOT && s->atime[x] <= s->atime[g] && steps < 1024; steps++) {
        older = x;
        x = l->prev[x];
    }
    if (x == NO_SLOT) {
        push_head(l, g);
        return;
    }
    l->prev[g] = x;
    l->next[g] = older;
    l->next[x] = g;
    if (older != NO_SLOT)
        l->prev[older] = g;
    else
        l->tail = g;
}

static bool on_list(const struct slot_list *l, uint32_t g)
{
    return l->prev[g] != NO_SLOT || l->head == g;
}

void lists_reset_locked(struct dstore *s)
{
    s->lru.head = s->lru.tail = s->leaves.head = s->leaves.tail = NO_SLOT;
    for (uint64_t g = 0; g < s->nslots; g++)
        s->lru.prev[g] = s->lru.next[g] = s->leaves.prev[g] = s->leaves.next[g] = NO_SLOT;
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
        if (key_tag(s->skey[s->map[b]]) == tag)
            return; /* another key of this tag holds it: g only loses its children count */
    }
}

static void tag_remove(struct dstore *s, uint32_t g)
{
    uint64_t mask = s->map_size - 1, hole = bucket_of(s, key_tag(s->skey[g]));

    while (s->map[hole] != g) {
        if (s->map[hole] == NO_SLOT)
            return;
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

/* ---- slots coming and going ---- */

static void kid_added(struct dstore *s, uint32_t g)
{
    uint32_t p = tag_find_locked(s, s->ptag[g]);

    if (p == NO_SLOT || s->state[p] != SLOT_USED)
        return;
    if (s->kids[p]++ == 0 && on_list(&s->leaves, p))
        unlink_in(&s->leaves, p);
}

/* A child of a stored parent went: the parent may be a chain end now, placed among the
 * others by its own last access. */
static void kid_gone(struct dstore *s, uint32_t g)
{
    uint32_t p = tag_find_locked(s, s->ptag[g]);

    if (p == NO_SLOT || s->state[p] != SLOT_USED || s->kids[p] == 0)
        return;
    if (--s->kids[p] == 0)
        insert_by_age(s, &s->leaves, p);
}

void slot_use_locked(struct dstore *s, uint32_t g, uint64_t parent_tag)
{
    s->state[g] = SLOT_USED;
    s->ptag[g] = parent_tag;
    s->kids[g] = 0;
    push_head(&s->lru, g);
    push_head(&s->leaves, g);
    tag_insert(s, g);
    kid_added(s, g);
}

void slot_unuse_locked(struct dstore *s, uint32_t g)
{
    if (s->state[g] != SLOT_USED)
        return;
    unlink_in(&s->lru, g);
    if (on_list(&s->leaves, g))
        unlink_in(&s->leaves, g);
    tag_remove(s, g);
    kid_gone(s, g);
    s->state[g] = SLOT_DYING;
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
        uint32_t p = tag_find_locked(s, s->ptag[nth_used(s, by_age, i, &g)]);

        if (p != NO_SLOT)
            s->kids[p]++;
    }
    /* Oldest first onto the heads, so the most recent ends at the head. */
    g = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u = nth_used(s, by_age, i, &g);

        push_head(&s->lru, u);
        if (!s->kids[u])
            push_head(&s->leaves, u);
    }
}

/* ---- access ---- */

/* The access time is persisted lazily: a full dirty list only loses the hint, never order
 * in this process. */
void touch_locked(struct dstore *s, uint32_t g)
{
    if (s->state[g] != SLOT_USED)
        return;
    unlink_in(&s->lru, g);
    push_head(&s->lru, g);
    if (on_list(&s->leaves, g)) {
        unlink_in(&s->leaves, g);
        push_head(&s->leaves, g);
    }
    s->atime[g] = stamp_locked(s);
    if (!s->dirty_bit[g] && s->ndirty < DIRTY_MAX) {
        s->dirty_bit[g] = 1;
        s->dirty[s->ndirty++] = g;
    }
    if (s->ndirty >= DIRTY_FLUSH)
        pthread_cond_signal(&s->job_cv);
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

/* Up to want unpinned slots from the tail of list l, now DYING. The walk past pinned slots
 * is bounded, so a store full of readers cannot stall the committer. */
static size_t pick_from(struct dstore *s, struct slot_list *l, size_t want, uint32_t *victims)
{
    size_t n = 0, steps = 2 * want + 64;
    uint32_t g = l->tail;

    /* A parent that becomes a chain end may join at the tail: after each victim the walk
     * starts again there (pinned slots it passes again count against its steps). */
    while (g != NO_SLOT && n < want && steps--) {
        if (s->pins[g]) {
            g = l->prev[g];
            continue;
        }
        slot_unuse_locked(s, g);
        victims[n++] = g;
        g = l->tail;
    }
    return n;
}

size_t pick_victims_locked(struct dstore *s, size_t want, uint32_t *victims)
{
    size_t n = pick_from(s, &s->leaves, want, victims);

    /* Chain ends all pinned, or none left: the oldest of the rest. */
    if (n < want)
        n += pick_from(s, &s->lru, want - n, victims + n);
    return n;
}
