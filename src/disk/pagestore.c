/*
 * The public page store (include/kvtier_store.h): the block store behind a thread-safe front.
 *
 * The block store has one owner thread; here a mutex makes every caller that owner for the
 * length of a call that submits, looks up or deletes. Waiting is done outside it: each op is
 * waited for by the thread that submitted it (or the caller of kvt_pagestore_wait), and
 * nobody polls, so no thread collects another's op. An eventfd counts completions.
 *
 * An op's pages become the block store's in pagestore_op.c, some through bounce pages; a
 * synchronous call bounds that memory by working through its pages in chunks.
 *
 * With a remote (options.remote), pagestore_open.c opens the server's store and a chain of the
 * disk and the server (store/chain.h) and attaches it here: every op goes through the chain,
 * under a lock of its own (cmu), as the chain and the server's store have one owner; the
 * disk under the chain takes mu for each of its calls (locked_disk), so calls of the disk
 * alone (exists_local, touch, delete, stats) never wait for the network. Lock order: cmu,
 * then mu. Waits poll the chain under cmu (the chain has no thread-safe wait).
 */
#include "kvtier_store.h"
#include "disk/ops.h"
#include "disk/pagestore.h"
#include "disk/pagestore_op.h"
#include "store_int.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_CAPACITY (1ull << 30)
#define BOUNCE_MAX (64u << 20) /* bytes of bounce pages one synchronous call holds at most */
#define FP_DOMAIN "kvtier pagestore 1"
/* Every page is written through the page cache and read from it when it holds the page: a
 * copy, as the engines' own file backends read. Pages up to this size go through it both ways
 * (the dir is opened buffered): a direct read of 64 KiB waits for the device (2x the hot reads
 * of 64 KiB pages through SGLang's controller). Larger pages the cache lacks are read direct
 * (DSTORE_CACHED): the device's speed, with no readahead and no second copy left behind.
 * Writes stay durable, every read is checked. */
#define CACHED_PAGE_MAX (128u << 10)

_Static_assert((int)KVT_DISK_IO_AUTO == (int)DSTORE_IO_AUTO &&
                   (int)KVT_DISK_IO_URING == (int)DSTORE_IO_URING &&
                   (int)KVT_DISK_IO_PSYNC == (int)DSTORE_IO_PSYNC,
               "the public and the block store's I/O kinds are the same numbers");

struct kvt_pagestore {
    struct dstore *ds;
    pthread_mutex_t mu; /* the block store's owner, and ops */
    struct ps_op *ops;  /* submitted, not yet waited for */
    uint64_t page_bytes;
    uint32_t page_tokens;
    int efd;
    bool ro;
    struct dstore_notify notify;
    uint8_t fp[32];          /* the dir's fingerprint, which the server's keys carry too */
    struct kvt_store *chain; /* the disk and a remote; NULL: the block store alone */
    pthread_mutex_t cmu;     /* the chain's owner */
    uint64_t remote_reads;   /* under cmu */
    bool ds_given; /* the block store was handed to a locked disk store, which closes it */
};

/* ---- options and open ---- */

static void options_defaults(struct kvt_pagestore_options *o, size_t size)
{
    struct kvt_pagestore_options d = {.size = sizeof(d), .capacity_bytes = DEFAULT_CAPACITY};

    memset(o, 0, size);
    memcpy(o, &d, size < sizeof(d) ? size : sizeof(d));
    o->size = size < sizeof(d) ? size : sizeof(d);
}

void kvt_pagestore_options_init(struct kvt_pagestore_options *o, size_t size)
{
    if (o && size >= sizeof(o->size))
        options_defaults(o, size);
}

/* A caller's options struct of any size into a whole one: fields past its size take their
 * defaults, and a newer struct's fields this build does not know must be zero. */
static int copy_options(const struct kvt_pagestore_options *in, struct kvt_pagestore_options *o)
{
    if (!in || in->size < sizeof(in->size))
        return -EINVAL;
    options_defaults(o, sizeof(*o));
    for (size_t i = sizeof(*o); i < in->size; i++)
        if (((const uint8_t *)in)[i])
            return -EINVAL;
    memcpy(o, in, in->size < sizeof(*o) ? in->size : sizeof(*o));
    o->size = sizeof(*o);
    return 0;
}

static int check_options(const struct kvt_pagestore_options *o)
{
    if (!o->dir || !*o->dir || !o->fingerprint || !o->fingerprint_len || !o->page_bytes ||
        (o->remote && !*o->remote) || o->page_bytes > (1ull << 31) ||
        o->page_tokens > DSTORE_MAX_TOKENS || o->disk_io > KVT_DISK_IO_PSYNC || o->read_only > 1 ||
        !o->capacity_bytes || o->sync > KVT_DISK_SYNC_RELAXED || o->page_cache_bypass > 1)
        return -EINVAL;
    return 0;
}

/* The dir's fingerprint: SHA256 over a domain and the caller's bytes. */
static int fingerprint(const struct kvt_pagestore_options *o, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned len = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(c, FP_DOMAIN, sizeof(FP_DOMAIN)) &&
             EVP_DigestUpdate(c, o->fingerprint, o->fingerprint_len) &&
             EVP_DigestFinal_ex(c, out, &len) && len == 32;

    EVP_MD_CTX_free(c);
    return ok ? 0 : -ENOMEM;
}

static void count_done(void *arg)
{
    uint64_t one = 1;
    ssize_t rc = write(((struct kvt_pagestore *)arg)->efd, &one, sizeof(one));

    (void)rc; /* a full counter (2^64 - 2 unread) still reads as readable */
}

int pagestore_options(const struct kvt_pagestore_options *in, struct kvt_pagestore_options *out)
{
    int rc = copy_options(in, out);

    return rc ? rc : check_options(out);
}

static int open_block_store(struct kvt_pagestore *s, const struct kvt_pagestore_options *o)
{
    struct dstore_options d;
    int rc;

    dstore_options_init(&d, sizeof(d));
    if ((rc = fingerprint(o, d.fingerprint)))
        return rc;
    memcpy(s->fp, d.fingerprint, sizeof(s->fp));
    d.dir = o->dir;
    d.page_bytes = (uint32_t)o->page_bytes;
    d.page_tokens = o->page_tokens;
    d.disk_bytes = o->capacity_bytes;
    d.io = o->disk_io;
    d.flags =
        (o->read_only ? DSTORE_READONLY : 0) | (o->page_bytes <= CACHED_PAGE_MAX ? DSTORE_BUFFERED
                                                : o->page_cache_bypass           ? 0
                                                                                 : DSTORE_CACHED);
    d.sync = o->sync == KVT_DISK_SYNC_RELAXED ? DSTORE_SYNC_RELAXED : DSTORE_SYNC_DURABLE;
    d.stripes = DSTORE_STRIPES;
    d.notify = &s->notify;
    return dstore_open(&d, &s->ds);
}

int pagestore_open_disk(const struct kvt_pagestore_options *opts, kvt_pagestore **out)
{
    struct kvt_pagestore_options o;
    struct kvt_pagestore *s;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if ((rc = pagestore_options(opts, &o)))
        return rc;
    if (!(s = calloc(1, sizeof(*s))))
        return -ENOMEM;
    s->page_bytes = o.page_bytes;
    s->page_tokens = o.page_tokens;
    s->ro = o.read_only;
    s->notify = (struct dstore_notify){count_done, s};
    if ((s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        rc = -errno;
        goto fail_efd;
    }
    if (pthread_mutex_init(&s->mu, NULL)) {
        rc = -ENOMEM;
        goto fail_mutex;
    }
    if (pthread_mutex_init(&s->cmu, NULL)) {
        rc = -ENOMEM;
        goto fail_cmu;
    }
    if ((rc = open_block_store(s, &o)))
        goto fail_store;
    *out = s;
    return 0;

fail_store:
    pthread_mutex_destroy(&s->cmu);
fail_cmu:
    pthread_mutex_destroy(&s->mu);
fail_mutex:
    close(s->efd);
fail_efd:
    free(s);
    return rc;
}

void pagestore_close(kvt_pagestore *s)
{
    if (!s)
        return;
    if (s->chain)
        store_close(s->chain); /* waits for every op; closes the block store under it */
    else if (!s->ds_given)
        dstore_close(s->ds); /* waits for every op */
    while (s->ops) {
        struct ps_op *op = s->ops;
        s->ops = op->next;
        ps_op_free(op);
    }
    pthread_mutex_destroy(&s->cmu);
    pthread_mutex_destroy(&s->mu);
    close(s->efd);
    free(s);
}

void kvt_pagestore_close(kvt_pagestore *s)
{
    pagestore_close(s);
}

/* ---- pages ---- */

/* Through the chain: the op is linked (under mu) before cmu goes, so no wait misses it. The
 * block store's page structs are the contract's (ops.c checks it). */
static int submit_chain(struct kvt_pagestore *s, struct ps_op *op, uint64_t *id)
{
    int rc;

    pthread_mutex_lock(&s->cmu);
    rc = op->kind == DSTORE_OP_WRITE
             ? store_write(s->chain, (const struct store_wpage *)op->w, op->n, op->results, &op->id)
             : store_read(s->chain, (const struct store_rpage *)op->r, op->n, op->results, &op->id,
                          NULL);
    if (rc == 0) {
        pthread_mutex_lock(&s->mu);
        op->next = s->ops;
        s->ops = op;
        pthread_mutex_unlock(&s->mu);
        *id = op->id;
    }
    pthread_mutex_unlock(&s->cmu);
    if (rc)
        ps_op_free(op);
    return rc;
}

static int submit(struct kvt_pagestore *s, uint32_t kind, const struct kvt_page *pages, size_t n,
                  int *results, uint64_t *id)
{
    struct ps_op *op;
    int rc = s ? ps_check_pages(s->page_bytes, pages, n, results) : -EINVAL;

    if (rc || !id)
        return rc ? rc : -EINVAL;
    if (kind == DSTORE_OP_WRITE && s->ro)
        return -EROFS;
    if ((rc = ps_op_new(s->page_bytes, !s->chain || s->chain->ops->parts, kind, pages, n, results,
                        &op)))
        return rc;
    if (s->chain)
        return submit_chain(s, op, id);
    pthread_mutex_lock(&s->mu);
    rc = kind == DSTORE_OP_WRITE ? dstore_write(s->ds, op->w, op->n, op->results, &op->id)
                                 : dstore_read(s->ds, op->r, op->n, op->results, &op->id, NULL);
    if (rc == 0) {
        op->next = s->ops;
        s->ops = op;
        *id = op->id;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc)
        ps_op_free(op);
    return rc;
}

int kvt_pagestore_submit_get(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results,
                             uint64_t *op)
{
    return submit(s, DSTORE_OP_READ, pages, n, results, op);
}

int kvt_pagestore_submit_set(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results,
                             uint64_t *op)
{
    return submit(s, DSTORE_OP_WRITE, pages, n, results, op);
}

/* Take op id off the list; NULL when it is not there. */
static struct ps_op *take_op(struct kvt_pagestore *s, uint64_t id)
{
    struct ps_op **pp, *op = NULL;

    pthread_mutex_lock(&s->mu);
    for (pp = &s->ops; *pp && (*pp)->id != id; pp = &(*pp)->next)
        ;
    if (*pp) {
        op = *pp;
        *pp = op->next;
    }
    pthread_mutex_unlock(&s->mu);
    return op;
}

static int64_t now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The chain's op: polled under cmu, sleeping between tries (50 us, doubling to 1 ms). */
static int wait_chain(kvt_pagestore *s, uint64_t id, int timeout_ms, struct dstore_done *d)
{
    int64_t until = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
    long nap = 50000;
    struct store_done sd;
    int rc;

    for (;;) {
        pthread_mutex_lock(&s->cmu);
        rc = store_wait_for(s->chain, id, 0, &sd);
        if (rc == 0 && sd.kind == STORE_OP_READ) /* split: the chain's own figures */
            s->remote_reads += sd.remote_ok;
        pthread_mutex_unlock(&s->cmu);
        if (rc != -ETIMEDOUT)
            break;
        if (timeout_ms == 0 || (timeout_ms > 0 && now_ms() >= until))
            return -ETIMEDOUT;
        nanosleep(&(struct timespec){0, nap}, NULL);
        nap = nap < 1000000 ? 2 * nap : nap;
    }
    if (rc == 0)
        *d = (struct dstore_done){.op = sd.op,
                                  .kind = sd.kind,
                                  .pages = sd.pages,
                                  .ok = sd.ok,
                                  .split = sd.split,
                                  .near_ok = sd.near_ok,
                                  .remote_ok = sd.remote_ok};
    return rc;
}

static int wait_op(kvt_pagestore *s, uint64_t id, int timeout_ms, size_t *ok)
{
    struct dstore_done d;
    struct ps_op *op;
    int rc =
        s->chain ? wait_chain(s, id, timeout_ms, &d) : dstore_wait_for(s->ds, id, timeout_ms, &d);

    if (rc)
        return rc;
    if ((op = take_op(s, id)))
        ps_op_land(op);
    ps_op_free(op);
    if (ok)
        *ok = d.ok;
    return 0;
}

int kvt_pagestore_wait(kvt_pagestore *s, uint64_t id, int timeout_ms, size_t *ok)
{
    return s ? wait_op(s, id, timeout_ms, ok) : -EINVAL;
}

/* A synchronous get or set: chunks whose bounce pages stay under BOUNCE_MAX. */
static int run_sync(kvt_pagestore *s, uint32_t kind, const struct kvt_page *pages, size_t n,
                    int *results)
{
    size_t chunk = s && s->page_bytes < BOUNCE_MAX ? BOUNCE_MAX / s->page_bytes : 1;
    int rc = s ? ps_check_pages(s->page_bytes, pages, n, results) : -EINVAL;
    uint64_t id;

    for (size_t at = 0; rc == 0 && at < n; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        rc = submit(s, kind, pages + at, m, results + at, &id);
        if (rc == 0)
            rc = wait_op(s, id, -1, NULL);
    }
    return rc;
}

int kvt_pagestore_get(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results)
{
    return run_sync(s, DSTORE_OP_READ, pages, n, results);
}

int kvt_pagestore_set(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results)
{
    return run_sync(s, DSTORE_OP_WRITE, pages, n, results);
}

/* ---- keys ---- */

static int exists_disk(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *run)
{
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = dstore_leading_run(s->ds, keys, n, run);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvt_pagestore_exists_local(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *run)
{
    if (!s || !run || (n && !keys))
        return -EINVAL;
    return exists_disk(s, keys, n, run);
}

int kvt_pagestore_exists(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *run)
{
    int rc;

    if (!s || !run || (n && !keys))
        return -EINVAL;
    if (!s->chain)
        return exists_disk(s, keys, n, run);
    pthread_mutex_lock(&s->cmu);
    rc = store_leading_run(s->chain, keys, n, run);
    pthread_mutex_unlock(&s->cmu);
    return rc;
}

int kvt_pagestore_touch(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *touched)
{
    int rc;

    if (!s || (n && !keys))
        return -EINVAL;
    pthread_mutex_lock(&s->mu);
    rc = dstore_touch(s->ds, keys, n, touched);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvt_pagestore_delete(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *deleted)
{
    int rc;

    if (!s || (n && !keys))
        return -EINVAL;
    if (s->ro)
        return -EROFS;
    pthread_mutex_lock(&s->mu);
    rc = dstore_delete(s->ds, keys, n, deleted);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvt_pagestore_clear(kvt_pagestore *s)
{
    struct dstore_stats st;
    size_t evicted = 1;
    int rc = 0;

    if (!s)
        return -EINVAL;
    if (s->ro)
        return -EROFS;
    pthread_mutex_lock(&s->mu);
    /* Eviction takes every page no read holds; a page being read goes on a later round. */
    for (dstore_stats(s->ds, &st); rc == 0 && st.pages && evicted; dstore_stats(s->ds, &st))
        rc = dstore_evict(s->ds, st.pages, &evicted);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int kvt_pagestore_event_fd(kvt_pagestore *s)
{
    return s ? s->efd : -EINVAL;
}

/* ---- the disk under a chain ---- */

/* The block store as a store of the contract, each owner call under the page store's mu, so
 * that the chain's owner (cmu, held across a server's answer) and calls of the disk alone
 * (mu) stay apart. Waits and stats need no owner. The contract's structs are the block
 * store's (ops.c checks it). Closing it closes the block store. */
struct locked_disk {
    struct kvt_store base;
    struct kvt_pagestore *ps;
};

static struct kvt_pagestore *ld_ps(struct kvt_store *st)
{
    return ((struct locked_disk *)st)->ps;
}

static int ld_leading_run(struct kvt_store *st, const uint8_t *keys, size_t n, size_t *run)
{
    return exists_disk(ld_ps(st), keys, n, run);
}

static int ld_read(struct kvt_store *st, const struct store_rpage *pages, size_t n, int *results,
                   uint64_t *op, size_t *leading)
{
    struct kvt_pagestore *s = ld_ps(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = dstore_read(s->ds, (const struct dstore_rpage *)pages, n, results, op, leading);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int ld_write(struct kvt_store *st, const struct store_wpage *pages, size_t n, int *results,
                    uint64_t *op)
{
    struct kvt_pagestore *s = ld_ps(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = dstore_write(s->ds, (const struct dstore_wpage *)pages, n, results, op);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static size_t ld_poll(struct kvt_store *st, struct store_done *done, size_t max)
{
    struct kvt_pagestore *s = ld_ps(st);
    size_t got;

    pthread_mutex_lock(&s->mu);
    got = dstore_poll(s->ds, (struct dstore_done *)done, max);
    pthread_mutex_unlock(&s->mu);
    return got;
}

static int ld_wait_for(struct kvt_store *st, uint64_t op, int timeout_ms, struct store_done *done)
{
    return dstore_wait_for(ld_ps(st)->ds, op, timeout_ms, (struct dstore_done *)done);
}

static int ld_drain(struct kvt_store *st)
{
    struct kvt_pagestore *s = ld_ps(st);
    int rc;

    pthread_mutex_lock(&s->mu);
    rc = dstore_drain(s->ds);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static void ld_stats(struct kvt_store *st, struct store_stats *out)
{
    struct dstore_stats d;

    dstore_stats(ld_ps(st)->ds, &d);
    *out = (struct store_stats){
        .capacity_pages = d.capacity_slots,
        .pages = d.pages,
        .errors = d.err_checksum + d.err_record + d.err_bounds + d.err_read_io + d.err_write_io +
                  d.err_nospc + d.err_sync + d.err_index,
        .bytes_read = d.bytes_read,
        .bytes_written = d.bytes_written,
        .in_flight = d.ops_in_flight,
        .too_many = d.too_many,
        .recovered = d.recovered,
        .index_rebuilt = d.index_rebuilt,
        .io = d.io,
    };
}

static void ld_close(struct kvt_store *st)
{
    dstore_close(ld_ps(st)->ds); /* waits for every op of the disk */
    free(st);
}

static const struct store_ops locked_disk_ops = {
    .name = "disk",
    .leading_run = ld_leading_run,
    .read = ld_read,
    .write = ld_write,
    .poll = ld_poll,
    .wait_for = ld_wait_for,
    .drain = ld_drain,
    .stats = ld_stats,
    .close = ld_close,
};

int pagestore_disk_store(kvt_pagestore *s, struct kvt_store **out)
{
    struct locked_disk *l;

    if (!s || s->ds_given || s->ops)
        return -EINVAL;
    if (!(l = calloc(1, sizeof(*l))))
        return -ENOMEM;
    l->base = (struct kvt_store){&locked_disk_ops, (uint32_t)s->page_bytes, s->page_tokens};
    l->ps = s;
    s->ds_given = true;
    *out = &l->base;
    return 0;
}

void pagestore_attach_chain(kvt_pagestore *s, struct kvt_store *chain)
{
    s->chain = chain;
}

const uint8_t *pagestore_fingerprint(const kvt_pagestore *s)
{
    return s->fp;
}

/* ---- stats ---- */

int kvt_pagestore_stats(kvt_pagestore *s, struct kvt_pagestore_stats *out)
{
    struct kvt_pagestore_stats st = {.size = sizeof(st)};
    struct dstore_stats d;

    if (!s || !out || out->size < sizeof(out->size))
        return -EINVAL;
    pthread_mutex_lock(&s->mu); /* its index snapshot is the owner's */
    dstore_stats(s->ds, &d);
    pthread_mutex_unlock(&s->mu);
    st.pages = d.pages;
    st.capacity_pages = d.capacity_slots;
    st.page_bytes = s->page_bytes;
    st.gets = d.reads;
    st.get_hits = d.read_hits;
    st.sets = d.writes;
    st.set_dups = d.write_dups;
    st.bytes_read = d.bytes_read;
    st.bytes_written = d.bytes_written;
    st.evicted = d.evicted;
    st.deleted = d.deleted;
    st.errors = d.err_checksum + d.err_record + d.err_bounds + d.err_read_io + d.err_write_io +
                d.err_nospc + d.err_sync + d.err_index;
    st.recovered = d.recovered;
    st.cache_reads = d.cache_reads;
    st.disk_io = d.io;
    st.read_only = s->ro;
    if (s->chain) {
        struct store_stats c;
        pthread_mutex_lock(&s->cmu);
        store_stats(s->chain, &c);
        st.remote_reads = s->remote_reads;
        pthread_mutex_unlock(&s->cmu);
        st.remote = 1;
        st.remote_errors = c.remote_errors;
    }
    size_t size = out->size < sizeof(st) ? out->size : sizeof(st);
    if (out->size > sizeof(st))
        memset((uint8_t *)out + sizeof(st), 0, out->size - sizeof(st));
    st.size = size;
    memcpy(out, &st, size);
    return 0;
}
