/*
 * The block store's front: open and close, ops and their collection, and the owner's
 * synchronous calls (see store.h and store_int.h). The data dir at open is dir.c's; what
 * inspectors read, inspect.c's.
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

#define GIB (1ull << 30)

/* ---- ops ---- */

static void op_free(struct dop *op)
{
    if (op) {
        free(op->blocks);
        free(op->hashes);
    }
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

/* A fused store's running checksums, one a page. */
static int op_hashes(struct dstore *s, struct dop *op)
{
    void *p;

    if (!op->n || !s->fused)
        return 0;
    if (posix_memalign(&p, 64, (size_t)op->n * sizeof(page_hash)))
        return -ENOMEM;
    op->hashes = p;
    for (uint32_t i = 0; i < op->n; i++)
        op->pages[i].hash = op->hashes + i;
    return 0;
}

/* An op of n pages, room for iovs regions of their bodies (pages in parts) beside them. */
static struct dop *op_alloc(struct dstore *s, uint32_t kind, size_t n, int *results, size_t iovs)
{
    size_t tok = kind == DSTORE_OP_WRITE ? (size_t)s->page_tokens * sizeof(uint32_t) : 0;
    struct dop *op =
        calloc(1, sizeof(*op) + n * (sizeof(struct dop_page) + tok) + iovs * sizeof(struct iovec));
    uint32_t *tokens;

    if (!op)
        return NULL;
    op->s = s;
    op->kind = kind;
    op->n = (uint32_t)n;
    op->results = results;
    tokens = (uint32_t *)(op->pages + n);
    op->iov = (struct iovec *)((uint8_t *)tokens + n * tok);
    for (size_t i = 0; i < n; i++) {
        op->pages[i].op = op;
        op->pages[i].slot = NO_SLOT;
        op->pages[i].tokens = tok ? tokens + i * s->page_tokens : NULL;
    }
    if (op_blocks(s, op) || op_hashes(s, op)) {
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
    d->split = d->near_ok = d->remote_ok = 0;
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

    if (!s || id == 0)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    if (id > s->last_id) { /* under the lock: another thread may be submitting */
        pthread_mutex_unlock(&s->lock);
        return -EINVAL;
    }
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

/* Regions the bodies of the pages in parts need (a count past the most is refused later). */
static size_t wparts_of(const struct dstore_wpage *pages, size_t n)
{
    size_t sum = 0;

    for (size_t i = 0; i < n; i++)
        sum += pages[i].nparts <= DSTORE_MAX_PARTS ? pages[i].nparts : 0;
    return sum;
}

static size_t rparts_of(const struct dstore_rpage *pages, size_t n)
{
    size_t sum = 0;

    for (size_t i = 0; i < n; i++)
        sum += pages[i].nparts <= DSTORE_MAX_PARTS ? pages[i].nparts : 0;
    return sum;
}

/* Copy what the committer needs; a page without key or bytes fails alone. */
static void copy_wpage(struct dstore *s, struct dop_page *p, const struct dstore_wpage *w,
                       struct iovec **iov)
{
    if (!w->key ||
        !page_take_bytes(s, p, (void *)w->buf, (void *const *)w->parts, w->nparts, iov)) {
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
    op = op_alloc(s, DSTORE_OP_WRITE, n, results, wparts_of(pages, n));
    j = calloc(1, sizeof(*j));
    if (!op || !j) {
        op_free(op);
        free(j);
        return -ENOMEM;
    }
    struct iovec *iov = op->iov;
    for (size_t i = 0; i < n; i++)
        copy_wpage(s, &op->pages[i], &pages[i], &iov);
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
    op = op_alloc(s, DSTORE_OP_READ, n, results, rparts_of(pages, n));
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
    o->max_batch = 256;
}

/* The format version a new dir is made in. */
static uint32_t new_format(const struct dstore_options *o)
{
    return o->format ? o->format : DSTORE_FORMAT_VERSION;
}

static int check_options(const struct dstore_options *o)
{
    struct slot_layout l;

    if (!o || o->size != sizeof(*o) || !o->dir || !o->dir[0])
        return -EINVAL;
    if (!o->page_bytes && !(o->flags & DSTORE_AS_FOUND))
        return -EINVAL;
    if (o->page_tokens > DSTORE_MAX_TOKENS || o->io > DSTORE_IO_PSYNC || !o->max_batch ||
        o->sync > DSTORE_SYNC_RELAXED)
        return -EINVAL;
    if (o->flags & ~(uint32_t)(DSTORE_READONLY | DSTORE_BUFFERED | DSTORE_AS_FOUND |
                               DSTORE_RECOVER | DSTORE_CACHED))
        return -EINVAL;
    if ((o->flags & DSTORE_RECOVER) && (o->flags & DSTORE_READONLY))
        return -EINVAL;
    if (o->format && (o->format < DSTORE_FORMAT_OLDEST || o->format > DSTORE_FORMAT_VERSION))
        return -EINVAL;
    if (o->page_bytes && (layout_init(&l, o->page_bytes, o->page_tokens, new_format(o)) ||
                          o->disk_bytes < l.slot_bytes))
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
        pthread_cond_init(&s->done_cv, &ca))
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
    if (o->page_bytes && !layout_init(&s->lay, o->page_bytes, o->page_tokens, new_format(o)))
        s->slot_bytes = s->lay.slot_bytes;
    s->nslots = o->disk_bytes / s->slot_bytes; /* until the dir's own slot size is known */
    if (!s->dir || sync_init(s)) {
        free(s->dir);
        free(s);
        return NULL;
    }
    return s;
}

/* The psync engine's workers: as asked, else 4, or for a dir in memory one a CPU (4 to 16):
 * there each of them is a CPU copying, as many as the kernel's would be under io_uring. */
static uint32_t psync_workers(const struct dstore *s)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);

    if (s->o.io_threads)
        return s->o.io_threads;
    if (!s->in_memory || cpus < 4)
        return 4;
    return cpus > 16 ? 16 : (uint32_t)cpus;
}

/* The I/O engine. A dir in memory (tmpfs) gets psync under AUTO: there every I/O is a copy
 * the CPU makes (io_uring hands them to its workers, those of one slab file one at a time),
 * and psync's workers can take each body's checksum as they copy it (s->fused). */
static int io_start(struct dstore *s)
{
    int rc;
    struct dio_config c = {
        .kind = s->o.io == DSTORE_IO_AUTO && s->in_memory ? DSTORE_IO_PSYNC : s->o.io,
        .depth = s->o.queue_depth,
        .threads = psync_workers(s),
        .reg_base = s->o.register_base,
        .reg_bytes = s->o.register_base ? s->o.register_bytes : 0,
        .faults = s->o.faults,
    };

    if ((rc = dio_create(&c, &s->io)))
        return rc;
    s->fused = s->in_memory && s->lay.body && dio_kind(s->io) == DSTORE_IO_PSYNC;
    return 0;
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
    free(s->drops);
    if (s->rtxn)
        mdb_txn_abort(s->rtxn);
    share_leave(s);
    slabs_close(s);
    table_free(s);
    if (s->lockfd >= 0)
        close(s->lockfd); /* releases the flock */
    if (s->dirfd >= 0)
        close(s->dirfd);
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
