/*
 * The rebuild: the committer's first job after open. Open itself reads nothing per page, so
 * a dir of a million pages serves reads at once; this pass builds, in the background, what
 * writes and eviction need, from the compact slot table (about 50 bytes a page; the records
 * themselves are checked when read):
 * - the slot table: each entry claims its slot; an entry outside the slabs (a truncated or
 *   missing slab file, a shrunk capacity) is dropped with the record it names;
 * - the free stack, lowest slot on top, so slabs fill in order;
 * - the LRU list, ordered by the persisted last-access times.
 *
 * The arrays are written without the lock: until ready is set (under it), no other thread
 * reads them. Readers pin slots meanwhile (under the lock, in their own array).
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define DROP_CHUNK 4096         /* deletions per transaction */
#define WARM_CHUNK (256u << 10) /* bytes per read when warming the index */

/* The scan walks `slots` leaf by leaf, and a leaf not in the page cache is a page fault and a
 * 4 KiB read of its own (LMDB maps the file for random access): at three million pages, 3.9 s
 * of a cold rebuild against 0.7 s to read the whole file in order. So an index that a quarter
 * of the memory holds is read through first, each 256 KiB of it that is not all in the page
 * cache already (mincore on a map of our own; larger reads delay the first lookups), and the
 * `pages` leaves it brings in serve the lookups after it. A hint: a failure changes nothing
 * but the time. */
static void warm_index(struct dstore *s)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    size_t per = page > 0 ? WARM_CHUNK / (size_t)page : 0, n, len;
    unsigned char *in = NULL;
    void *buf = NULL, *map = MAP_FAILED;
    struct stat st;
    int fd;

    if (per == 0 || pages <= 0 || mdb_env_get_fd(s->ix.env, &fd) || fstat(fd, &st) ||
        st.st_size <= 0 || (uint64_t)st.st_size > (uint64_t)pages * (uint64_t)page / 4)
        return;
    n = ((size_t)st.st_size + (size_t)page - 1) / (size_t)page;
    len = n * (size_t)page;
    map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED || !(in = malloc(n)) || !(buf = malloc(WARM_CHUNK)) ||
        mincore(map, len, in))
        goto out;
    for (size_t first = 0; first < n; first += per) {
        size_t last = first + per < n ? first + per : n, i = first;

        while (i < last && (in[i] & 1))
            i++;
        if (i < last && pread(fd, buf, WARM_CHUNK, (off_t)(first * (size_t)page)) <= 0)
            break;
    }
out:
    if (map != MAP_FAILED)
        munmap(map, len);
    free(in);
    free(buf);
}

struct drop {
    uint32_t g;
    uint64_t atime;
    uint8_t key[DSTORE_KEY_BYTES];
};

struct drops {
    struct drop *v;
    size_t n, cap;
};

struct scan_counts {
    uint64_t err_record, err_bounds, max_atime;
};

static void drops_add(struct drops *d, uint32_t g, const uint8_t *key, uint64_t atime)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 64;
        struct drop *v = realloc(d->v, cap * sizeof(*v));

        if (!v)
            return; /* left in place: its slot stays unused, its record fails at read */
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n].g = g;
    d->v[d->n].atime = atime;
    memcpy(d->v[d->n++].key, key, DSTORE_KEY_BYTES);
}

/* Whether the slabs back global slot g now. */
static bool backed(const struct dstore *s, uint64_t g)
{
    return g < s->nslots && g % s->slab_slots < s->slabs[g / s->slab_slots].valid;
}

/* One slot-table entry: it claims its slot, or is marked for dropping. */
static void scan_one(struct dstore *s, const MDB_val *k, const MDB_val *v, struct drops *d,
                     struct scan_counts *c)
{
    struct slot_entry e;
    uint32_t g;

    if (slot_decode(k, v, &e)) {
        c->err_record++; /* cannot be deleted by slot number: never read either */
        return;
    }
    g = e.g;
    if (!backed(s, g)) {
        c->err_bounds += g < s->nslots; /* past a lowered capacity is no fault */
        drops_add(d, g, e.key, e.atime);
        return;
    }
    s->state[g] = SLOT_USED;
    memcpy(s->skey[g], e.key, DSTORE_KEY_BYTES);
    s->atime[g] = e.atime;
    s->ptag[g] = e.parent;
    if (e.atime > c->max_atime)
        c->max_atime = e.atime;
}

static int scan(struct dstore *s, struct drops *d, struct scan_counts *c)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    const struct dstore_faults *f = s->o.faults;
    int rc = f && f->inject ? f->inject(f->arg, DSTORE_FAULT_REBUILD, 0, 0) : 0, mrc;

    if (rc || (rc = index_err(mdb_txn_begin(s->ix.env, NULL, MDB_RDONLY, &txn))))
        return rc;
    if ((rc = index_err(mdb_cursor_open(txn, s->ix.slots, &cur)))) {
        mdb_txn_abort(txn);
        return rc;
    }
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); !mrc;
         mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT))
        scan_one(s, &k, &v, d, c);
    rc = mrc == MDB_NOTFOUND ? 0 : index_err(mrc);
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return rc;
}

/* The entry, and the record of its key when that names the same slot (or is junk). */
static int drop_one(struct dstore *s, MDB_txn *txn, const struct drop *d)
{
    MDB_val k = {DSTORE_KEY_BYTES, (void *)d->key}, v;
    struct drec r;
    int rc = slot_del(&s->ix, txn, d->g), m;

    if (rc || (m = mdb_get(txn, s->ix.pages, &k, &v)) == MDB_NOTFOUND)
        return rc;
    if (m)
        return index_err(m);
    if (!rec_decode(d->key, v.mv_data, v.mv_size, &r) &&
        (uint64_t)r.slab * s->slab_slots + r.slot != d->g)
        return 0;
    return index_err(mdb_del(txn, s->ix.pages, &k, NULL));
}

static int drop_chunk(struct dstore *s, const struct drop *first, size_t n)
{
    MDB_txn *txn;
    int rc = index_err(mdb_txn_begin(s->ix.env, NULL, 0, &txn));

    if (rc)
        return rc;
    for (size_t i = 0; i < n && !rc; i++)
        rc = drop_one(s, txn, &first[i]);
    if (rc) {
        mdb_txn_abort(txn);
        return rc;
    }
    return index_err(mdb_txn_commit(txn));
}

static int cmp_drop_age(const void *a, const void *b)
{
    const struct drop *x = a, *y = b;

    return (x->atime > y->atime) - (x->atime < y->atime);
}

/* Dropped in chunks, oldest first; a chunk that fails (an index error) stays, never served. */
static size_t drop_all(struct dstore *s, struct drops *d)
{
    size_t dropped = 0;

    if (d->n)
        qsort(d->v, d->n, sizeof(*d->v), cmp_drop_age);
    for (size_t i = 0; i < d->n; i += DROP_CHUNK) {
        size_t n = d->n - i < DROP_CHUNK ? d->n - i : DROP_CHUNK;

        if (drop_chunk(s, d->v + i, n) == 0)
            dropped += n;
    }
    return dropped;
}

/* The stack's order, last taken first: slab groups of o.stripes from the highest, within a
 * group the slots from the highest position, each position across the group's slabs from
 * the last. The top is the lowest slot, and the slots taken after it go to each slab of its
 * group in turn (stripes of 0 or 1: lowest slot first). */
static uint64_t build_free(struct dstore *s)
{
    uint64_t n = 0, w = s->o.stripes > 1 ? s->o.stripes : 1;
    uint64_t groups = (s->nslabs + w - 1) / w;

    for (uint64_t gr = groups; gr-- > 0;)
        for (uint64_t i = s->slab_slots; i-- > 0;)
            for (uint64_t k = w; k-- > 0;) {
                uint64_t g = (gr * w + k) * s->slab_slots + i;

                if (g < s->nslots && s->state[g] == SLOT_FREE)
                    s->freestk[n++] = (uint32_t)g;
            }
    return n;
}

struct aged {
    uint64_t atime;
    uint32_t g;
};

static int cmp_aged(const void *a, const void *b)
{
    const struct aged *x = a, *y = b;

    if (x->atime != y->atime)
        return x->atime < y->atime ? -1 : 1;
    return (x->g > y->g) - (x->g < y->g);
}

/* The used slots oldest first into the lists (slots.c), so the most recent end at their
 * heads. Without memory to sort, slot order stands in: eviction still works, only its order
 * is off. */
static void build_lists(struct dstore *s, uint64_t used)
{
    struct aged *a = malloc((used ? used : 1) * sizeof(*a));
    uint32_t *order = malloc((used ? used : 1) * sizeof(*order));
    uint64_t n = 0;

    lists_reset_locked(s); /* the committer alone touches the table until ready */
    for (uint64_t g = 0; a && g < s->nslots; g++)
        if (s->state[g] == SLOT_USED)
            a[n++] = (struct aged){s->atime[g], (uint32_t)g};
    if (a && order) {
        qsort(a, n, sizeof(*a), cmp_aged);
        for (uint64_t i = 0; i < n; i++)
            order[i] = a[i].g;
    }
    slots_link_all(s, a && order ? order : NULL, n);
    free(a);
    free(order);
}

/* Under the lock, once the table is known: the hits served before it, in their order. */
static void apply_early_locked(struct dstore *s)
{
    for (uint32_t i = 0; i < s->nearly; i++) {
        const struct early_touch *t = &s->early[i];

        if (!memcmp(s->skey[t->g], t->key, DSTORE_KEY_BYTES))
            touch_locked(s, t->g);
    }
    s->nearly = 0;
}

void rebuild(struct dstore *s)
{
    struct drops d = {0};
    struct scan_counts c = {0};
    uint64_t nfree, dropped = 0;
    int rc;

    table_init(s); /* the committer alone touches the table until ready */
    warm_index(s);
    rc = scan(s, &d, &c);

    if (!rc)
        dropped = drop_all(s, &d);
    if (!rc && dropped == d.n)
        slabs_trim(s); /* nothing names a slot past the capacity now */
    /* The free slots are taken from the index as this process sees it, which may hold the
     * unflushed last commit of a process that was killed, and the drops just made: in
     * durable mode that is made durable before any of those slots is written again. */
    if (!rc && s->o.sync == DSTORE_SYNC_DURABLE)
        rc = flush_index(s);
    free(d.v);
    nfree = build_free(s);
    build_lists(s, s->nslots - nfree);
    pthread_mutex_lock(&s->lock);
    s->nfree = nfree;
    s->broken = rc;
    s->st.err_record += c.err_record;
    s->st.err_bounds += c.err_bounds;
    s->st.dropped += dropped;
    if (c.max_atime > s->clock)
        s->clock = c.max_atime;
    s->ready = true;
    apply_early_locked(s);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->lock);
}
