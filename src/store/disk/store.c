/*
 * The block store's front: open and close, the data dir's life, ops and their collection,
 * and the owner's synchronous calls (see store.h and store_int.h).
 *
 * A data dir is ours when it has index/data.mdb; a dir holding nothing but what a crashed
 * creation leaves (lock, slabs/, index.new/) is created afresh; anything else is refused
 * before a byte of it is touched. Creation builds the index in index.new and renames it
 * into place, so a crash mid-way never leaves an index without its meta record.
 */
#include "store_int.h"
#include "trust.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define LOCK_TRIES 100 /* ms a writer waits out an inspector's look at the lock */

/* ---- small shared helpers ---- */

void job_push_locked(struct dstore *s, struct djob *j)
{
    j->next = NULL;
    if (s->jtail)
        s->jtail->next = j;
    else
        s->jhead = j;
    s->jtail = j;
    pthread_cond_signal(&s->job_cv);
}

/* ---- read snapshots ---- */

/* Snapshots of the index for the owner (and dstore_stats). A read-only store adopts a map
 * its writer grew, which it may do only while no other snapshot of its own is live. */
int snapshot_begin(struct dstore *s, MDB_txn **txn)
{
    int rc = index_read_begin(&s->ix, txn, s->ro && atomic_load(&s->snapshots) == 0);

    if (!rc)
        atomic_fetch_add(&s->snapshots, 1);
    return rc;
}

void snapshot_end(struct dstore *s, MDB_txn *txn)
{
    mdb_txn_abort(txn);
    atomic_fetch_sub(&s->snapshots, 1);
}

int snapshot_renew(struct dstore *s)
{
    int rc = index_read_renew(&s->ix, s->rtxn, s->ro && atomic_load(&s->snapshots) == 0);

    if (!rc)
        atomic_fetch_add(&s->snapshots, 1);
    return rc;
}

void snapshot_reset(struct dstore *s)
{
    mdb_txn_reset(s->rtxn);
    atomic_fetch_sub(&s->snapshots, 1);
}

/* ---- ops ---- */

static void op_free(struct dop *op)
{
    if (op)
        free(op->blocks);
    free(op);
}

/* Tail blocks: a write carries every page's head in one; a read needs them only for the
 * page bytes that sit beside the head. */
static int op_blocks(struct dstore *s, struct dop *op)
{
    size_t len = (size_t)op->n * s->lay.tail_bytes;
    void *p;

    if (!op->n || (op->kind == DSTORE_OP_READ && !s->lay.tail))
        return 0;
    if (posix_memalign(&p, LAYOUT_BLOCK, len))
        return -ENOMEM;
    op->blocks = p;
    for (uint32_t i = 0; i < op->n; i++)
        op->pages[i].block = op->blocks + (size_t)i * s->lay.tail_bytes;
    return 0;
}

static struct dop *op_alloc(struct dstore *s, uint32_t kind, size_t n, int *results)
{
    size_t tok = kind == DSTORE_OP_WRITE ? (size_t)s->page_tokens * sizeof(uint32_t) : 0;
    struct dop *op = calloc(1, sizeof(*op) + n * (sizeof(struct dop_page) + tok));
    uint32_t *tokens;

    if (!op)
        return NULL;
    op->s = s;
    op->kind = kind;
    op->n = (uint32_t)n;
    op->results = results;
    tokens = (uint32_t *)(op->pages + n);
    for (size_t i = 0; i < n; i++) {
        op->pages[i].op = op;
        op->pages[i].slot = NO_SLOT;
        op->pages[i].tokens = tok ? tokens + i * s->page_tokens : NULL;
    }
    if (op_blocks(s, op)) {
        op_free(op);
        return NULL;
    }
    return op;
}

/* Under the lock: the op gets its id and joins the live list. */
static void op_link_locked(struct dstore *s, struct dop *op)
{
    op->id = ++s->last_id;
    if (s->otail)
        s->otail->next = op;
    else
        s->ohead = op;
    s->otail = op;
    s->live++;
}

static void op_finish_locked(struct dstore *s, struct dop *op)
{
    op->ok = 0;
    for (uint32_t i = 0; i < op->n; i++) {
        op->results[i] = op->pages[i].res;
        op->ok += op->pages[i].res == 0;
    }
    op->done = true;
    pthread_cond_broadcast(&s->done_cv);
}

void op_page_done_locked(struct dstore *s, struct dop *op)
{
    if (--op->pending == 0)
        op_finish_locked(s, op);
}

/* Under the lock: take op (done) off the live list. */
static void op_unlink_locked(struct dstore *s, struct dop *op, struct dop *prev)
{
    if (prev)
        prev->next = op->next;
    else
        s->ohead = op->next;
    if (s->otail == op)
        s->otail = prev;
    s->live--;
}

static void op_report(const struct dop *op, struct dstore_done *d)
{
    if (!d)
        return;
    d->op = op->id;
    d->kind = op->kind;
    d->pages = op->n;
    d->ok = op->ok;
}

size_t dstore_poll(struct dstore *s, struct dstore_done *done, size_t max)
{
    struct dop *op, *prev = NULL, *next;
    size_t got = 0;

    if (!s || (max && !done))
        return 0;
    pthread_mutex_lock(&s->lock);
    for (op = s->ohead; op && got < max; op = next) {
        next = op->next;
        if (!op->done) {
            prev = op;
            continue;
        }
        op_unlink_locked(s, op, prev);
        op_report(op, &done[got++]);
        op_free(op);
    }
    pthread_mutex_unlock(&s->lock);
    return got;
}

static struct timespec deadline_after(int ms)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t); /* the clock the condition variables wait on */
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* Under the lock: op by id and the op before it on the live list; NULL when not there. */
static struct dop *op_find_locked(struct dstore *s, uint64_t id, struct dop **prev)
{
    struct dop *op;

    *prev = NULL;
    for (op = s->ohead; op && op->id != id; op = op->next)
        *prev = op;
    return op;
}

int dstore_wait_for(struct dstore *s, uint64_t id, int timeout_ms, struct dstore_done *done)
{
    struct timespec until = deadline_after(timeout_ms > 0 ? timeout_ms : 0);
    struct dop *op, *prev;
    bool finished;
    int rc = 0;

    if (!s || id == 0 || id > s->last_id)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    while ((op = op_find_locked(s, id, &prev)) && !op->done && rc != ETIMEDOUT)
        rc = timeout_ms < 0 ? pthread_cond_wait(&s->done_cv, &s->lock)
                            : pthread_cond_timedwait(&s->done_cv, &s->lock, &until);
    finished = op && op->done; /* read under the lock: a worker may finish it any time */
    if (finished)
        op_unlink_locked(s, op, prev);
    pthread_mutex_unlock(&s->lock);
    if (!op)
        return -ENOENT;
    if (!finished)
        return -ETIMEDOUT;
    op_report(op, done);
    op_free(op);
    return 0;
}

int dstore_wait(struct dstore *s, uint64_t id, struct dstore_done *done)
{
    return dstore_wait_for(s, id, -1, done);
}

/* ---- writes and reads ---- */

static int check_batch(const struct dstore *s, const void *pages, size_t n, const int *results,
                       const uint64_t *id)
{
    if (!s || !id || (n && (!pages || !results)) || n > UINT32_MAX / 2)
        return -EINVAL;
    return 0;
}

/* Copy what the committer needs; a page without key or buffer fails alone. */
static void copy_wpage(struct dstore *s, struct dop_page *p, const struct dstore_wpage *w)
{
    if (!w->key || !w->buf) {
        p->res = -EINVAL;
        return;
    }
    memcpy(p->key, w->key, DSTORE_KEY_BYTES);
    if (w->parent)
        memcpy(p->parent, w->parent, DSTORE_KEY_BYTES);
    if (w->ns)
        memcpy(p->ns, w->ns, DSTORE_NS_BYTES);
    if (w->tokens && s->page_tokens)
        memcpy(p->tokens, w->tokens, (size_t)s->page_tokens * sizeof(uint32_t));
    p->buf = (void *)w->buf;
}

int dstore_write(struct dstore *s, const struct dstore_wpage *pages, size_t n, int *results,
                 uint64_t *id)
{
    struct dop *op;
    struct djob *j;
    int rc = check_batch(s, pages, n, results, id);

    if (rc)
        return rc;
    if (s->ro)
        return -EROFS;
    op = op_alloc(s, DSTORE_OP_WRITE, n, results);
    j = calloc(1, sizeof(*j));
    if (!op || !j) {
        op_free(op);
        free(j);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        copy_wpage(s, &op->pages[i], &pages[i]);
    j->kind = JOB_WRITE;
    j->op = op;
    op->pending = 1; /* the committer finishes a write op whole */
    pthread_mutex_lock(&s->lock);
    op_link_locked(s, op);
    job_push_locked(s, j);
    pthread_mutex_unlock(&s->lock);
    *id = op->id;
    return 0;
}

int dstore_read(struct dstore *s, const struct dstore_rpage *pages, size_t n, int *results,
                uint64_t *id, size_t *leading)
{
    struct dop *op;
    int rc = check_batch(s, pages, n, results, id);

    if (rc)
        return rc;
    op = op_alloc(s, DSTORE_OP_READ, n, results);
    if (!op)
        return -ENOMEM;
    op->pending = 1; /* held by the submission until every page is on its way */
    pthread_mutex_lock(&s->lock);
    op_link_locked(s, op);
    pthread_mutex_unlock(&s->lock);
    *id = op->id;
    return read_submit(s, op, pages, leading);
}

int dstore_put(struct dstore *s, const struct dstore_wpage *pages, size_t n, int *results)
{
    uint64_t id;
    int rc = dstore_write(s, pages, n, results, &id);

    return rc ? rc : dstore_wait(s, id, NULL);
}

int dstore_get(struct dstore *s, const struct dstore_rpage *pages, size_t n, int *results)
{
    uint64_t id;
    int rc = dstore_read(s, pages, n, results, &id, NULL);

    return rc ? rc : dstore_wait(s, id, NULL);
}

/* ---- existence ---- */

/* Whether key has a valid record whose slot is live (once the slot table is known). */
static bool present(struct dstore *s, const uint8_t *key)
{
    struct drec r;
    uint64_t digest;
    bool live = true;

    if (lookup_record(s, s->rtxn, key, &r, &digest))
        return false;
    if (s->ro)
        return true;
    pthread_mutex_lock(&s->lock);
    if (table_known_locked(s)) {
        uint32_t g = r.slab * s->slab_slots + r.slot;

        live = s->state[g] == SLOT_USED && !memcmp(s->skey[g], key, DSTORE_KEY_BYTES);
    }
    pthread_mutex_unlock(&s->lock);
    return live;
}

/* Answer for up to n keys, stopping at the first absent one when stop_at_miss. */
static int probe_keys(struct dstore *s, const uint8_t *keys, size_t n, bool *out, bool stop_at_miss,
                      size_t *count)
{
    int rc;

    if (!s || (n && !keys))
        return -EINVAL;
    if ((rc = snapshot_renew(s)))
        return rc;
    *count = 0;
    for (size_t i = 0; i < n; i++) {
        bool here = present(s, keys + i * DSTORE_KEY_BYTES);

        if (out)
            out[i] = here;
        if (!here && stop_at_miss)
            break;
        *count += here;
    }
    snapshot_reset(s);
    return 0;
}

int dstore_exists(struct dstore *s, const uint8_t *keys, size_t n, bool *present_out)
{
    size_t count;

    if (n && !present_out)
        return -EINVAL;
    return probe_keys(s, keys, n, present_out, false, &count);
}

int dstore_leading_run(struct dstore *s, const uint8_t *keys, size_t n, size_t *run)
{
    if (!run)
        return -EINVAL;
    return probe_keys(s, keys, n, NULL, true, run);
}

/* ---- synchronous jobs ---- */

static int sync_job(struct dstore *s, enum djob_kind kind, const uint8_t *keys, size_t n,
                    size_t *result)
{
    struct djob *j;
    int rc;

    if (!s || (kind == JOB_DELETE && n && !keys))
        return -EINVAL;
    if (s->ro)
        return -EROFS;
    j = calloc(1, sizeof(*j));
    if (!j)
        return -ENOMEM;
    j->kind = kind;
    j->n = n;
    if (kind == JOB_DELETE && n) {
        j->keys = malloc(n * DSTORE_KEY_BYTES);
        if (!j->keys) {
            free(j);
            return -ENOMEM;
        }
        memcpy(j->keys, keys, n * DSTORE_KEY_BYTES);
    }
    rc = job_run(s, j);
    if (result)
        *result = j->result;
    free(j->keys);
    free(j);
    return rc;
}

int dstore_delete(struct dstore *s, const uint8_t *keys, size_t n, size_t *deleted)
{
    return sync_job(s, JOB_DELETE, keys, n, deleted);
}

int dstore_evict(struct dstore *s, size_t max_pages, size_t *evicted)
{
    return sync_job(s, JOB_EVICT, NULL, max_pages, evicted);
}

int dstore_flush(struct dstore *s)
{
    return sync_job(s, JOB_FLUSH, NULL, 0, NULL);
}

int dstore_drain(struct dstore *s)
{
    if (s && s->ro)
        return 0; /* a reader queues nothing */
    return sync_job(s, JOB_BARRIER, NULL, 0, NULL);
}

int dstore_wait_ready(struct dstore *s)
{
    int rc;

    if (!s)
        return -EINVAL;
    if (s->ro)
        return 0;
    pthread_mutex_lock(&s->lock);
    while (!s->ready)
        pthread_cond_wait(&s->done_cv, &s->lock);
    rc = s->broken;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

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

/* The key the slot table gives r's slot, in the walk's snapshot; NULL when none. */
static const uint8_t *slot_owner(const struct walk *w, const struct drec *r)
{
    uint64_t g = (uint64_t)r->slab * w->s->slab_slots + r->slot;
    unsigned int slot = (unsigned int)g;
    MDB_val k = {sizeof(slot), &slot}, v;

    if (r->slot >= w->s->slab_slots || g >= NO_SLOT)
        return NULL;
    if (mdb_get(w->txn, w->s->ix.slots, &k, &v) || v.mv_size != SLOT_ENTRY_BYTES)
        return NULL;
    return v.mv_data;
}

static int visit(const struct walk *w, MDB_val *k, MDB_val *v)
{
    struct dstore_entry e = {
        .key = k->mv_data, .status = KVT_ECORRUPT, .key_bytes = (uint32_t)k->mv_size};
    struct drec r;

    if (k->mv_size == DSTORE_KEY_BYTES && !rec_decode(k->mv_data, v->mv_data, v->mv_size, &r)) {
        e.status = 0;
        entry_fill(&e, &r, w->tokens);
        e.slot_owner = slot_owner(w, &r);
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

int dstore_peek_version(const char *dir, uint32_t *version)
{
    struct dindex ix = {0};
    struct stat st;
    bool walked;
    char *path;
    int dirfd, rc;

    if (!dir || !version)
        return -EINVAL;
    if ((dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    if (fstatat(dirfd, "index/data.mdb", &st, AT_SYMLINK_NOFOLLOW))
        rc = errno == ENOENT ? KVT_EFORMAT : -errno;
    else if (!(path = malloc(strlen(dir) + sizeof("/index"))))
        rc = -ENOMEM;
    else {
        sprintf(path, "%s/index", dir);
        if (!(rc = index_trust(dirfd, path, &walked)) && !(rc = index_open(&ix, path, true, 0))) {
            rc = index_peek_version(&ix, version);
            index_close(&ix);
        }
        free(path);
    }
    close(dirfd);
    return rc;
}

/* ---- the data dir ---- */

enum dir_kind { DIR_OURS, DIR_FRESH, DIR_FOREIGN };

/* Names a fresh dir, or one whose creation crashed, may hold. */
static bool fresh_name(const char *n)
{
    return !strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "lock") || !strcmp(n, "slabs") ||
           !strcmp(n, "index.new") || !strcmp(n, "index.damaged");
}

static int classify(int dirfd, enum dir_kind *kind)
{
    struct dirent *de;
    struct stat st;
    DIR *d;
    int fd;

    if (fstatat(dirfd, "index/data.mdb", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        *kind = DIR_OURS; /* what kind of file it is, index_files_ok tells */
        return 0;
    }
    if ((fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    *kind = DIR_FRESH;
    while ((de = readdir(d)))
        if (!fresh_name(de->d_name))
            *kind = DIR_FOREIGN;
    closedir(d);
    return 0;
}

/* What a crashed creation left in index.new. */
static void remove_partial_index(int dirfd)
{
    unlinkat(dirfd, "index.new/data.mdb", 0);
    unlinkat(dirfd, "index.new/lock.mdb", 0);
    unlinkat(dirfd, "index.new", AT_REMOVEDIR);
}

/* The writer's map: the index's pages for the capacity, with room for a B-tree's half-full
 * pages, copy-on-write and the old pages a long reader (kvtier-ctl beside the engine) keeps,
 * and never less than four times the file as found (a dir written with a larger capacity
 * must still have room for the deletes that shrink it). Address space only: the file grows
 * as pages are used. */
static size_t map_bytes(const struct dstore *s, uint64_t file_bytes)
{
    uint64_t per = rec_bytes(s->page_tokens) + SLOT_ENTRY_BYTES + 128;
    uint64_t want = 8 * per * s->nslots;

    if (s->o.map_bytes)
        return (size_t)s->o.map_bytes;
    if (want < 4 * file_bytes)
        want = 4 * file_bytes;
    want += 256 * MIB;
    if (want < GIB)
        want = GIB;
    return (size_t)((want + MIB - 1) / MIB * MIB);
}

static char *dir_path(const struct dstore *s, const char *name)
{
    size_t len = strlen(s->dir) + strlen(name) + 2;
    char *p = malloc(len);

    if (p)
        snprintf(p, len, "%s/%s", s->dir, name);
    return p;
}

/* The dir's geometry for a new store, from the options. */
static void geometry_new(struct dstore *s, struct dmeta *m)
{
    uint64_t slab_slots = s->o.slab_bytes / s->slot_bytes;

    memset(m, 0, sizeof(*m));
    m->version = DSTORE_FORMAT_VERSION;
    m->page_bytes = s->page_bytes;
    m->page_tokens = s->page_tokens;
    m->slot_bytes = s->slot_bytes;
    m->slab_slots =
        (uint32_t)(slab_slots ? slab_slots > UINT32_MAX / 2 ? UINT32_MAX / 2 : slab_slots : 1);
    memcpy(m->fingerprint, s->o.fingerprint, DSTORE_FINGERPRINT_BYTES);
    pthread_mutex_lock(&s->lock);
    m->created = stamp_locked(s);
    pthread_mutex_unlock(&s->lock);
}

/* Build an index holding only meta m in index.new, and move it into place. */
static int index_install(struct dstore *s, const struct dmeta *m)
{
    char *path;
    int rc;

    remove_partial_index(s->dirfd);
    if (mkdirat(s->dirfd, "index.new", 0700))
        return -errno;
    if (!(path = dir_path(s, "index.new")))
        return -ENOMEM;
    rc = index_create(path, m, s->o.map_bytes ? s->o.map_bytes : GIB);
    free(path);
    if (rc)
        return rc;
    if (renameat(s->dirfd, "index.new", s->dirfd, "index"))
        return -errno;
    s->created = true;
    return fsync(s->dirfd) ? -errno : 0;
}

static int dir_create(struct dstore *s)
{
    struct dmeta m;

    if (mkdirat(s->dirfd, "slabs", 0700) && errno != EEXIST)
        return -errno;
    geometry_new(s, &m);
    return index_install(s, &m);
}

/* Empty index.damaged (files only: it is ours) and remove it. */
static int remove_damaged(int data_dirfd)
{
    int fd = openat(data_dirfd, "index.damaged", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    struct dirent *de;
    DIR *d;

    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP)) /* not even a dir: junk */
        return unlinkat(data_dirfd, "index.damaged", 0) ? -errno : 0;
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(fd, de->d_name, 0);
    closedir(d);
    return unlinkat(data_dirfd, "index.damaged", AT_REMOVEDIR) ? -errno : 0;
}

/* The meta of a dir whose index is lost, from a slab's head; the options' geometry must be
 * the dir's unless the dir is taken as found. */
static int meta_from_slabs(struct dstore *s, struct dmeta *m)
{
    struct slab_head h;
    int rc = slabs_first_head(s->dirfd, &h);

    if (rc)
        return rc;
    if (h.version != DSTORE_FORMAT_VERSION)
        return KVT_EFORMAT;
    if (!(s->o.flags & DSTORE_AS_FOUND) &&
        (memcmp(h.fingerprint, s->o.fingerprint, DSTORE_FINGERPRINT_BYTES) ||
         h.page_bytes != s->page_bytes || h.page_tokens != s->page_tokens))
        return KVT_EFINGERPRINT;
    *m = (struct dmeta){.version = h.version,
                        .page_bytes = h.page_bytes,
                        .page_tokens = h.page_tokens,
                        .slot_bytes = h.slot_bytes,
                        .slab_slots = h.slab_slots,
                        .created = h.created};
    memcpy(m->fingerprint, h.fingerprint, DSTORE_FINGERPRINT_BYTES);
    return 0;
}

/* The writer's answer to an index it cannot trust, or lost: set it aside (index.damaged, the
 * last one only) and start an empty one that the committer fills from the slabs' heads. */
static int index_rebuild(struct dstore *s)
{
    struct dmeta m;
    struct stat st;
    int rc = meta_from_slabs(s, &m);

    if (rc)
        return rc;
    if (fstatat(s->dirfd, "index", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if ((rc = remove_damaged(s->dirfd)))
            return rc;
        if (renameat(s->dirfd, "index", s->dirfd, "index.damaged"))
            return -errno;
    }
    if ((rc = index_install(s, &m)))
        return rc;
    s->recovering = true;
    return 0;
}

/* The lock file, a regular file opened through no link and without blocking: the fd, or
 * -ELOOP (a link), -ENOTSUP (not a regular file), or another -errno. */
static int open_lock_file(int dirfd)
{
    struct stat st;
    int fd = openat(dirfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);

    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return -ENOTSUP;
    }
    return fd;
}

/* Only one writer per dir: a second open (here or in another process) gets -EBUSY. */
/* The writer's lock. An inspector checking whether a writer is there holds the lock shared
 * for a moment, so a refusal is retried for LOCK_TRIES ms before it means another writer. */
static int take_lock(struct dstore *s)
{
    const struct timespec ms = {0, 1000000};
    int rc = open_lock_file(s->dirfd);

    /* A link or a FIFO where the lock file should be is junk in our dir: it is replaced. */
    if (rc == -ELOOP || rc == -ENOTSUP) {
        if (unlinkat(s->dirfd, "lock", 0))
            return -errno;
        rc = open_lock_file(s->dirfd);
    }
    if (rc < 0)
        return rc;
    s->lockfd = rc;
    for (int i = 0; flock(s->lockfd, LOCK_EX | LOCK_NB); i++) {
        if (errno != EWOULDBLOCK)
            return -errno;
        if (i == LOCK_TRIES)
            return -EBUSY;
        nanosleep(&ms, NULL);
    }
    return 0;
}

/* Classify before locking, so a foreign dir is refused untouched; again after, since a
 * creation may have finished in between. */
static int dir_prepare(struct dstore *s)
{
    struct slab_head h;
    enum dir_kind kind;
    int rc;

    bool create = !s->ro && !(s->o.flags & DSTORE_AS_FOUND);

    if (create && mkdir(s->dir, 0700) && errno != EEXIST)
        return -errno;
    s->dirfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0)
        return -errno;
    if ((rc = classify(s->dirfd, &kind)))
        return rc;
    if (kind == DIR_FOREIGN || (s->ro && kind != DIR_OURS))
        return kind == DIR_FRESH && slabs_first_head(s->dirfd, &h) == 0 ? KVT_ECORRUPT
                                                                        : KVT_EFORMAT;
    if (s->ro)
        return 0;
    if ((rc = take_lock(s)) || (rc = classify(s->dirfd, &kind)))
        return rc;
    if (kind == DIR_FOREIGN)
        return KVT_EFORMAT;
    /* Slabs of ours without an index: it was lost (or set aside by a crashed rebuild). */
    if (kind == DIR_FRESH && slabs_first_head(s->dirfd, &h) == 0)
        return index_rebuild(s);
    if (kind == DIR_FRESH)
        return create ? dir_create(s) : KVT_EFORMAT;
    return s->o.flags & DSTORE_RECOVER ? index_rebuild(s) : 0;
}

/* DSTORE_AS_FOUND: the dir's fingerprint and page geometry become the options'. */
static int adopt_meta(struct dstore *s, const struct dmeta *m)
{
    if (!m->page_bytes || m->page_tokens > DSTORE_MAX_TOKENS)
        return KVT_ECORRUPT;
    memcpy(s->o.fingerprint, m->fingerprint, DSTORE_FINGERPRINT_BYTES);
    s->o.page_bytes = s->page_bytes = m->page_bytes;
    s->o.page_tokens = s->page_tokens = m->page_tokens;
    return 0;
}

/* DSTORE_AS_FOUND: the capacity covers every slab file, so none of their records is out of
 * bounds (and a writer's rebuild drops none of them). */
static int capacity_as_found(struct dstore *s)
{
    uint32_t files;
    int rc = slabs_found(s, &files);

    if (rc)
        return rc;
    if (!files)
        files = 1;
    if ((uint64_t)files * s->slab_slots > s->nslots)
        s->nslots = (uint64_t)files * s->slab_slots;
    return 0;
}

/* The options' geometry must be the dir's; its own layout (slots, slabs) is taken as is. */
static int check_meta(struct dstore *s, const struct dmeta *m)
{
    bool as_found = s->o.flags & DSTORE_AS_FOUND;
    int rc;

    if (as_found && (rc = adopt_meta(s, m)))
        return rc;
    if (memcmp(m->fingerprint, s->o.fingerprint, DSTORE_FINGERPRINT_BYTES) ||
        m->page_bytes != s->page_bytes || m->page_tokens != s->page_tokens)
        return KVT_EFINGERPRINT;
    if (layout_init(&s->lay, m->page_bytes, m->page_tokens) || !m->slab_slots ||
        m->slot_bytes != s->lay.slot_bytes)
        return KVT_ECORRUPT;
    s->meta = *m;
    s->fp_digest = layout_fp_digest(m->fingerprint);
    s->slot_bytes = m->slot_bytes;
    s->slab_slots = m->slab_slots;
    s->nslots = s->o.disk_bytes / s->slot_bytes;
    if (as_found && (rc = capacity_as_found(s)))
        return rc;
    if (s->nslots >= NO_SLOT)
        s->nslots = NO_SLOT - 1;
    if (!s->nslots)
        return -EINVAL;
    s->nslabs = (uint32_t)((s->nslots + s->slab_slots - 1) / s->slab_slots);
    return 0;
}

/* The index cannot be trusted: the dir is ours and damaged when a slab says so, else it is
 * nobody's we know. */
static int index_lost(struct dstore *s)
{
    struct slab_head h;

    return slabs_first_head(s->dirfd, &h) ? KVT_EFORMAT : KVT_ECORRUPT;
}

static int index_prepare(struct dstore *s)
{
    struct dmeta m;
    char *path = dir_path(s, "index/data.mdb");
    uint64_t file;
    int rc;

    if (!path)
        return -ENOMEM;
    /* A reader takes the writer's map; a writer sizes it once the capacity is known. */
    file = index_file_bytes(path);
    path[strlen(path) - strlen("/data.mdb")] = '\0';
    if (!s->created && (rc = index_trust(s->dirfd, path, &s->index_walked))) {
        if (rc == KVT_ECORRUPT)
            rc = index_lost(s);
        /* A reader reports it; the writer sets it aside and recovers from the slabs. */
        if (rc != KVT_ECORRUPT || s->ro || (rc = index_rebuild(s))) {
            free(path);
            return rc;
        }
    }
    rc = index_open(&s->ix, path, s->ro,
                    s->ro            ? 0
                    : s->o.map_bytes ? s->o.map_bytes
                                     : GIB + 4 * file);
    free(path);
    if (rc)
        return rc;
    if ((rc = index_read_meta(&s->ix, &m)) || (rc = check_meta(s, &m)))
        return rc;
    if (!s->ro && (rc = index_set_mapsize(&s->ix, map_bytes(s, file))))
        return rc;
    if ((rc = index_read_begin(&s->ix, &s->rtxn, s->ro)))
        return rc;
    mdb_txn_reset(s->rtxn);
    return 0;
}

/* ---- the slot table ---- */

/* The tag map's size: a power of two at least twice the slots, so runs stay short. */
static int map_alloc(struct dstore *s)
{
    uint64_t size = 2;
    uint32_t bits = 1;

    while (size < 2 * s->nslots) {
        size <<= 1;
        bits++;
    }
    s->map_size = size;
    s->map_shift = 64 - bits;
    s->map = malloc(size * sizeof(*s->map));
    if (!s->map)
        return -ENOMEM;
    memset(s->map, 0xff, size * sizeof(*s->map)); /* NO_SLOT everywhere */
    return 0;
}

static int table_alloc(struct dstore *s)
{
    size_t n = (size_t)s->nslots;

    s->state = calloc(n, 1);
    s->pins = calloc(n, sizeof(*s->pins));
    s->skey = calloc(n, DSTORE_KEY_BYTES);
    s->atime = calloc(n, sizeof(*s->atime));
    s->ptag = calloc(n, sizeof(*s->ptag));
    s->kids = calloc(n, sizeof(*s->kids));
    s->lru.prev = malloc(n * sizeof(uint32_t));
    s->lru.next = malloc(n * sizeof(uint32_t));
    s->ends = malloc(n * sizeof(uint32_t));
    s->end_pos = calloc(n, sizeof(uint32_t));
    s->freestk = malloc(n * sizeof(*s->freestk));
    s->dirty_bit = calloc(n, 1);
    s->early = malloc(EARLY_MAX * sizeof(*s->early));
    s->touched = malloc(DIRTY_MAX * sizeof(*s->touched));
    s->recbuf = malloc(rec_bytes(s->page_tokens));
    if (!s->early || !s->touched || !s->recbuf || !s->state || !s->pins || !s->skey || !s->atime ||
        !s->ptag || !s->kids || !s->lru.prev || !s->lru.next || !s->ends || !s->end_pos ||
        !s->freestk || !s->dirty_bit || map_alloc(s))
        return -ENOMEM;
    lists_reset_locked(s); /* no other thread yet */
    return 0;
}

static void table_free(struct dstore *s)
{
    free(s->state);
    free(s->pins);
    free(s->skey);
    free(s->atime);
    free(s->ptag);
    free(s->kids);
    free(s->lru.prev);
    free(s->lru.next);
    free(s->ends);
    free(s->end_pos);
    free(s->map);
    free(s->waiting);
    free(s->freestk);
    free(s->dirty_bit);
    free(s->early);
    free(s->touched);
    free(s->recbuf);
}

/* ---- open and close ---- */

void dstore_options_init(struct dstore_options *o, size_t size)
{
    if (!o || size < sizeof(*o))
        return;
    memset(o, 0, size);
    o->size = size;
    o->disk_bytes = GIB;
    o->slab_bytes = GIB;
    o->io = DSTORE_IO_AUTO;
    o->queue_depth = 64;
    o->io_threads = 4;
    o->max_batch = 256;
}

static int check_options(const struct dstore_options *o)
{
    struct slot_layout l;

    if (!o || o->size != sizeof(*o) || !o->dir || !o->dir[0])
        return -EINVAL;
    if (!o->page_bytes && !(o->flags & DSTORE_AS_FOUND))
        return -EINVAL;
    if (o->page_tokens > DSTORE_MAX_TOKENS || o->io > DSTORE_IO_PSYNC || !o->max_batch)
        return -EINVAL;
    if (o->flags &
        ~(uint32_t)(DSTORE_READONLY | DSTORE_BUFFERED | DSTORE_AS_FOUND | DSTORE_RECOVER))
        return -EINVAL;
    if ((o->flags & DSTORE_RECOVER) && (o->flags & DSTORE_READONLY))
        return -EINVAL;
    if (o->page_bytes &&
        (layout_init(&l, o->page_bytes, o->page_tokens) || o->disk_bytes < l.slot_bytes))
        return -EINVAL;
    return 0;
}

static int sync_init(struct dstore *s)
{
    pthread_condattr_t ca;
    int rc = 0;

    if (pthread_condattr_init(&ca))
        return -ENOMEM;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&s->lock, NULL) || pthread_cond_init(&s->job_cv, &ca) ||
        pthread_cond_init(&s->done_cv, &ca) || pthread_cond_init(&s->io_cv, &ca))
        rc = -ENOMEM; /* objects made before a failure hold no memory on Linux */
    pthread_condattr_destroy(&ca);
    return rc;
}

static struct dstore *store_new(const struct dstore_options *o)
{
    struct dstore *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    s->o = *o;
    s->dir = strdup(o->dir);
    s->o.dir = s->dir;
    s->ro = o->flags & DSTORE_READONLY;
    s->dirfd = s->slabfd = s->lockfd = -1;
    s->page_bytes = o->page_bytes;
    s->page_tokens = o->page_tokens;
    /* DSTORE_AS_FOUND gives no geometry: the dir's comes with its meta. */
    s->slot_bytes = LAYOUT_BLOCK;
    if (o->page_bytes && !layout_init(&s->lay, o->page_bytes, o->page_tokens))
        s->slot_bytes = s->lay.slot_bytes;
    s->nslots = o->disk_bytes / s->slot_bytes; /* until the dir's own slot size is known */
    if (!s->dir || sync_init(s)) {
        free(s->dir);
        free(s);
        return NULL;
    }
    return s;
}

static int io_start(struct dstore *s)
{
    struct dio_config c = {
        .kind = s->o.io,
        .depth = s->o.queue_depth,
        .threads = s->o.io_threads,
        .reg_base = s->o.register_base,
        .reg_bytes = s->o.register_base ? s->o.register_bytes : 0,
        .faults = s->o.faults,
    };

    return dio_create(&c, &s->io);
}

/* Everything open() may have made, in reverse; safe on a partly opened store. */
static void teardown(struct dstore *s)
{
    dio_destroy(s->io);
    for (struct dop *op = s->ohead, *next; op; op = next) {
        next = op->next;
        op_free(op);
    }
    for (struct djob *j = s->jhead, *next; j; j = next) {
        next = j->next;
        free(j->keys);
        free(j);
    }
    if (s->rtxn)
        mdb_txn_abort(s->rtxn);
    index_close(&s->ix);
    slabs_close(s);
    table_free(s);
    if (s->lockfd >= 0)
        close(s->lockfd); /* releases the flock */
    if (s->dirfd >= 0)
        close(s->dirfd);
    pthread_cond_destroy(&s->io_cv);
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->job_cv);
    pthread_mutex_destroy(&s->lock);
    free(s->dir);
    free(s);
}

int dstore_open(const struct dstore_options *o, struct dstore **out)
{
    struct dstore *s;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if ((rc = check_options(o)))
        return rc;
    if (!(s = store_new(o)))
        return -ENOMEM;
    if ((rc = dir_prepare(s)) || (rc = index_prepare(s)) || (rc = slabs_open(s)))
        goto fail;
    if (!s->ro && (rc = table_alloc(s)))
        goto fail;
    if ((rc = io_start(s)))
        goto fail;
    if (!s->ro && (rc = committer_start(s)))
        goto fail;
    *out = s;
    return 0;

fail:
    teardown(s);
    return rc;
}

static void wait_ops(struct dstore *s)
{
    pthread_mutex_lock(&s->lock);
    for (struct dop *op = s->ohead; op;) {
        if (op->done) {
            op = op->next;
            continue;
        }
        pthread_cond_wait(&s->done_cv, &s->lock);
        op = s->ohead; /* the list may have changed; look again from the start */
    }
    pthread_mutex_unlock(&s->lock);
}

void dstore_close(struct dstore *s)
{
    if (!s)
        return;
    wait_ops(s);
    if (s->committer_started) {
        committer_stop(s);
        /* The next open may skip walking the index when nothing wrote it since. */
        if (!s->broken && mdb_env_sync(s->ix.env, 1) == 0)
            index_stamp_clean(s->dirfd);
    }
    teardown(s);
}
