/*
 * The block store for inspectors (store.h): iteration over the index from a snapshot, the
 * counters, and what kvtier-ctl reads of a dir without opening it.
 */
#include "store_int.h"
#include "trust.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- iteration and counters ---- */

static void entry_fill(struct dstore_entry *e, const struct drec *r, uint32_t *tokens)
{
    e->parent = r->parent;
    e->ns = r->ns;
    e->ntokens = r->ntokens;
    for (uint32_t i = 0; i < r->ntokens; i++) {
        const uint8_t *t = r->tokens + 4 * (size_t)i;

        tokens[i] =
            (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    }
    e->tokens = tokens;
    e->slab = r->slab;
    e->slot = r->slot;
    e->length = r->length;
    memcpy(e->checksum, r->sum, 16);
    e->created_ns = r->created;
    e->last_access_ns = r->last_access;
}

/* One walk over the index: its snapshot and what each record is shown with. */
struct walk {
    struct dstore *s;
    MDB_txn *txn;
    uint32_t *tokens;
    dstore_visit_fn fn;
    void *arg;
};

/* The slot table's entry for r's slot, in the walk's snapshot: whether there is one. */
static bool slot_owner(const struct walk *w, const struct drec *r, struct slot_entry *e)
{
    uint64_t g = (uint64_t)r->slab * w->s->slab_slots + r->slot;
    unsigned int slot = (unsigned int)g;
    MDB_val k = {sizeof(slot), &slot}, v;

    if (r->slot >= w->s->slab_slots || g >= NO_SLOT)
        return false;
    return !mdb_get(w->txn, w->s->ix.slots, &k, &v) && !slot_decode(&k, &v, e);
}

static int visit(const struct walk *w, MDB_val *k, MDB_val *v)
{
    struct dstore_entry e = {
        .key = k->mv_data, .status = KVT_ECORRUPT, .key_bytes = (uint32_t)k->mv_size};
    struct slot_entry se;
    struct drec r;

    if (k->mv_size == DSTORE_KEY_BYTES && !rec_decode(k->mv_data, v->mv_data, v->mv_size, &r)) {
        e.status = 0;
        entry_fill(&e, &r, w->tokens);
        e.slot_owner = slot_owner(w, &r, &se) ? se.key : NULL;
        /* Accesses since the write are kept in the slot table's entry only (lru.c). */
        if (e.slot_owner && !memcmp(se.key, k->mv_data, DSTORE_KEY_BYTES) &&
            se.atime > e.last_access_ns)
            e.last_access_ns = se.atime;
    }
    return w->fn(w->arg, &e);
}

static int walk_begin(struct dstore *s, struct walk *w, dstore_visit_fn fn, void *arg)
{
    int rc;

    if (!s || !fn)
        return -EINVAL;
    *w = (struct walk){.s = s, .fn = fn, .arg = arg};
    if (!(w->tokens = malloc(DSTORE_MAX_TOKENS * sizeof(uint32_t))))
        return -ENOMEM;
    if ((rc = snapshot_begin(s, &w->txn)))
        free(w->tokens);
    return rc;
}

static void walk_end(struct walk *w)
{
    snapshot_end(w->s, w->txn);
    free(w->tokens);
}

int dstore_iterate_from(struct dstore *s, const uint8_t *from, dstore_visit_fn fn, void *arg)
{
    struct walk w;
    MDB_cursor *c;
    MDB_val k = {DSTORE_KEY_BYTES, (void *)from}, v;
    int rc = walk_begin(s, &w, fn, arg), mrc;

    if (rc)
        return rc;
    if ((rc = index_err(mdb_cursor_open(w.txn, s->ix.pages, &c))))
        goto out;
    for (mrc = mdb_cursor_get(c, &k, &v, from ? MDB_SET_RANGE : MDB_FIRST); !mrc && !rc;
         mrc = mdb_cursor_get(c, &k, &v, MDB_NEXT))
        rc = visit(&w, &k, &v);
    if (!rc && mrc != MDB_NOTFOUND)
        rc = index_err(mrc);
    mdb_cursor_close(c);
out:
    walk_end(&w);
    return rc;
}

int dstore_iterate(struct dstore *s, dstore_visit_fn fn, void *arg)
{
    return dstore_iterate_from(s, NULL, fn, arg);
}

int dstore_lookup(struct dstore *s, const uint8_t *key, dstore_visit_fn fn, void *arg)
{
    struct walk w;
    MDB_val k = {DSTORE_KEY_BYTES, (void *)key}, v;
    int rc;

    if (!key)
        return -EINVAL;
    if ((rc = walk_begin(s, &w, fn, arg)))
        return rc;
    rc = mdb_get(w.txn, s->ix.pages, &k, &v);
    rc = rc ? index_err(rc) : visit(&w, &k, &v);
    walk_end(&w);
    return rc;
}

/* Entries in one of the index's databases, in a snapshot of their own; 0 on an error. */
static uint64_t db_entries(struct dstore *s, MDB_dbi dbi)
{
    MDB_txn *txn;
    MDB_stat ms = {0};

    if (snapshot_begin(s, &txn))
        return 0;
    mdb_stat(txn, dbi, &ms);
    snapshot_end(s, txn);
    return ms.ms_entries;
}

void dstore_stats(struct dstore *s, struct dstore_stats *st)
{
    if (!s || !st)
        return;
    pthread_mutex_lock(&s->lock);
    *st = s->st;
    st->free_slots = s->ready ? s->nfree : 0;
    st->index_walked = s->index_walked;
    st->index_rebuilt = s->recovering;
    st->index_foreign = s->index_foreign;
    st->ready = s->ro || s->ready;
    st->ops_in_flight = s->live;
    st->direct = s->direct; /* may turn off when the first slab is made */
    pthread_mutex_unlock(&s->lock);
    st->pages = db_entries(s, s->ix.pages);
    st->bytes = st->pages * s->page_bytes;
    st->capacity_slots = s->nslots;
    st->page_bytes = s->page_bytes;
    st->slot_bytes = s->slot_bytes;
    st->io = dio_kind(s->io);
    st->fixed_buffers = dio_fixed_buffers(s->io);
}

/* ---- for inspectors ---- */

uint64_t dstore_slot_entries(struct dstore *s)
{
    return s ? db_entries(s, s->ix.slots) : 0;
}

void dstore_info(struct dstore *s, struct dstore_info *info)
{
    if (!s || !info)
        return;
    memset(info, 0, sizeof(*info));
    info->format_version = s->meta.version;
    memcpy(info->fingerprint, s->meta.fingerprint, DSTORE_FINGERPRINT_BYTES);
    info->page_bytes = s->page_bytes;
    info->page_tokens = s->page_tokens;
    info->slot_bytes = s->slot_bytes;
    info->slab_slots = s->slab_slots;
    info->slabs = s->nslabs;
    info->capacity_slots = s->nslots;
    info->created_ns = s->meta.created;
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < s->nslabs; i++) {
        info->slab_files += s->slabs[i].dfd >= 0 || s->slabs[i].bfd >= 0;
        info->backed_slots += s->slabs[i].valid;
    }
    pthread_mutex_unlock(&s->lock);
}

bool dstore_entry_in_bounds(struct dstore *s, const struct dstore_entry *e)
{
    struct drec r = {.slab = e->slab, .slot = e->slot, .length = e->length};
    bool ok;

    if (!s || e->status)
        return false;
    for (int pass = 0; pass < 2; pass++) {
        pthread_mutex_lock(&s->lock);
        ok = record_in_bounds_locked(s, &r);
        pthread_mutex_unlock(&s->lock);
        if (ok || pass || r.length != s->page_bytes)
            break;
        slab_refresh(s, r.slab); /* a writer beside us may have made it since open */
    }
    return ok;
}

/* fn on the index of the data dir at dir once trust.h vouches for it: fn's result;
 * KVT_EFORMAT when there is no index/data.mdb, KVT_ECORRUPT when the walk finds it damaged,
 * -errno. */
static int with_index(const char *dir, int (*fn)(const char *path, void *arg), void *arg)
{
    struct stat st;
    bool walked;
    char *path;
    int dirfd, rc;

    if ((dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    if (share_busy(dirfd)) /* a second environment of it would break the store's */
        rc = -EBUSY;
    else if (fstatat(dirfd, "index/data.mdb", &st, AT_SYMLINK_NOFOLLOW))
        rc = errno == ENOENT ? KVT_EFORMAT : -errno;
    else if (!(path = malloc(strlen(dir) + sizeof("/index"))))
        rc = -ENOMEM;
    else {
        sprintf(path, "%s/index", dir);
        if (!(rc = index_trust(dirfd, path, &walked)))
            rc = fn(path, arg);
        free(path);
    }
    close(dirfd);
    return rc;
}

static int peek_at(const char *path, void *version)
{
    return index_peek_version(path, version);
}

int dstore_peek_version(const char *dir, uint32_t *version)
{
    if (!dir || !version)
        return -EINVAL;
    return with_index(dir, peek_at, version);
}

struct look {
    enum index_verdict *verdict;
    uint32_t *version;
};

static int examine_at(const char *path, void *arg)
{
    struct look *l = arg;
    int rc = index_examine(path, l->verdict, l->version);

    if (rc != KVT_EFORMAT && rc != KVT_ECORRUPT)
        return rc;
    *l->verdict = INDEX_UNSOUND; /* LMDB refused a file the walk passed: unsound all the same */
    return 0;
}

int dstore_examine_index(const char *dir, enum index_verdict *verdict, uint32_t *version)
{
    struct look l = {verdict, version};
    int rc;

    if (!dir || !verdict || !version)
        return -EINVAL;
    *verdict = INDEX_UNSOUND;
    *version = 0;
    rc = with_index(dir, examine_at, &l);
    return rc == KVT_ECORRUPT ? 0 : rc;
}

/* ---- an index copied from another dir ---- */

struct foreign {
    int dirfd;
    struct dstore_dir_id *index, *slabs;
};

static void id_of_meta(const struct dmeta *m, struct dstore_dir_id *id)
{
    *id = (struct dstore_dir_id){m->version, m->page_bytes, m->page_tokens, {0}, m->created};
    memcpy(id->fingerprint, m->fingerprint, DSTORE_FINGERPRINT_BYTES);
}

static int foreign_at(const char *path, void *arg)
{
    struct foreign *f = arg;
    struct dindex ix = {0};
    struct slab_head h;
    struct dmeta m;
    bool agrees;
    int rc = index_open(&ix, path, true, 0);

    if (rc)
        return rc;
    rc = index_read_meta(&ix, &m);
    index_close(&ix);
    if (rc || (rc = slabs_against_meta(f->dirfd, &m, &h, &agrees)))
        return rc == KVT_EFORMAT ? 0 : rc; /* no whole slab head: nothing to compare */
    id_of_meta(&m, f->index);
    *f->slabs = (struct dstore_dir_id){h.version, h.page_bytes, h.page_tokens, {0}, h.created};
    memcpy(f->slabs->fingerprint, h.fingerprint, DSTORE_FINGERPRINT_BYTES);
    return !agrees;
}

int dstore_index_foreign(const char *dir, struct dstore_dir_id *index, struct dstore_dir_id *slabs)
{
    struct foreign f = {.index = index, .slabs = slabs};
    int rc;

    if (!dir || !index || !slabs)
        return -EINVAL;
    if ((f.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    rc = with_index(dir, foreign_at, &f);
    close(f.dirfd);
    return rc;
}
