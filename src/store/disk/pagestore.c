/*
 * The public page store (include/kvtier_store.h): the block store behind a thread-safe front.
 *
 * The block store has one owner thread; here a mutex makes every caller that owner for the
 * length of a call that submits, looks up or deletes. Waiting is done outside it: each op is
 * waited for by the thread that submitted it (or the caller of kvt_pagestore_wait), and
 * nobody polls, so no thread collects another's op. An eventfd counts completions.
 *
 * Pages of one segment go to the block store as they are. Pages of several are gathered into
 * (or read into and scattered from) a bounce page aligned for O_DIRECT; a synchronous call
 * bounds that memory by working through its pages in chunks.
 */
#include "kvtier_store.h"
#include "store_int.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEFAULT_CAPACITY (1ull << 30)
#define BOUNCE_MAX (64u << 20) /* bytes of bounce pages one synchronous call holds at most */
#define BOUNCE_HUGE (2u << 20) /* a huge page: bounce regions this large ask for them */
#define FP_DOMAIN "kvtier pagestore 1"
/* Pages up to this size go through the page cache (the dir is opened buffered): a read of a
 * page the cache holds is a copy, as SGLang's file backend's reads are, where a direct read of
 * 64 KiB waits for the device (2x the hot reads of 64 KiB pages through SGLang's controller,
 * for 25% of the writes' speed). Larger pages go direct: the cache's copy costs more than it
 * saves, and keeps a second copy of the engine's host tier. Writes stay durable, every read
 * is checked. */
#define CACHED_PAGE_MAX (128u << 10)

_Static_assert((int)KVT_DISK_IO_AUTO == (int)DSTORE_IO_AUTO &&
                   (int)KVT_DISK_IO_URING == (int)DSTORE_IO_URING &&
                   (int)KVT_DISK_IO_PSYNC == (int)DSTORE_IO_PSYNC,
               "the public and the block store's I/O kinds are the same numbers");

struct ps_op {
    struct ps_op *next;
    uint64_t id;
    uint32_t kind; /* enum dstore_op_kind */
    size_t n;
    const struct kvt_page *pages; /* the caller's, valid until the op is waited for */
    int *results;
    uint8_t *bounce; /* a page for each page of several segments, in order; or NULL */
    void **bufs;     /* each page's buffer: its one segment, or its bounce page */
    struct dstore_wpage *w;
    struct dstore_rpage *r;
};

struct kvt_pagestore {
    struct dstore *ds;
    pthread_mutex_t mu; /* the block store's owner, and ops */
    struct ps_op *ops;  /* submitted, not yet waited for */
    uint64_t page_bytes;
    int efd;
    bool ro;
    struct dstore_notify notify;
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
        o->page_bytes > (1ull << 31) || o->page_tokens > DSTORE_MAX_TOKENS ||
        o->disk_io > KVT_DISK_IO_PSYNC || o->read_only > 1 || !o->capacity_bytes)
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

static int open_block_store(struct kvt_pagestore *s, const struct kvt_pagestore_options *o)
{
    struct dstore_options d;
    int rc;

    dstore_options_init(&d, sizeof(d));
    if ((rc = fingerprint(o, d.fingerprint)))
        return rc;
    d.dir = o->dir;
    d.page_bytes = (uint32_t)o->page_bytes;
    d.page_tokens = o->page_tokens;
    d.disk_bytes = o->capacity_bytes;
    d.io = o->disk_io;
    d.flags = (o->read_only ? DSTORE_READONLY : 0) |
              (o->page_bytes <= CACHED_PAGE_MAX ? DSTORE_BUFFERED : 0);
    d.notify = &s->notify;
    return dstore_open(&d, &s->ds);
}

int kvt_pagestore_open(const struct kvt_pagestore_options *opts, kvt_pagestore **out)
{
    struct kvt_pagestore_options o;
    struct kvt_pagestore *s;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if ((rc = copy_options(opts, &o)) || (rc = check_options(&o)))
        return rc;
    if (!(s = calloc(1, sizeof(*s))))
        return -ENOMEM;
    s->page_bytes = o.page_bytes;
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
    if ((rc = open_block_store(s, &o)))
        goto fail_store;
    *out = s;
    return 0;

fail_store:
    pthread_mutex_destroy(&s->mu);
fail_mutex:
    close(s->efd);
fail_efd:
    free(s);
    return rc;
}

static void op_free(struct ps_op *op)
{
    if (!op)
        return;
    free(op->bounce);
    free(op->bufs);
    free(op->w);
    free(op->r);
    free(op);
}

void kvt_pagestore_close(kvt_pagestore *s)
{
    if (!s)
        return;
    dstore_close(s->ds); /* waits for every op */
    while (s->ops) {
        struct ps_op *op = s->ops;
        s->ops = op->next;
        op_free(op);
    }
    pthread_mutex_destroy(&s->mu);
    close(s->efd);
    free(s);
}

/* ---- pages ---- */

static int check_pages(const kvt_pagestore *s, const struct kvt_page *pages, size_t n,
                       const int *results)
{
    if (!s || (n && (!pages || !results)) || n > UINT32_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        const struct kvt_page *p = &pages[i];
        uint64_t sum = 0;
        if (!p->key || !p->nsegs || !p->segs)
            return -EINVAL;
        for (uint32_t k = 0; k < p->nsegs; k++) {
            if (!p->segs[k].addr && p->segs[k].len)
                return -EINVAL;
            sum += p->segs[k].len;
        }
        if (sum != s->page_bytes)
            return -EINVAL;
    }
    return 0;
}

/* An op's buffers: one segment as it is, several through a bounce page. */
static int op_buffers(struct kvt_pagestore *s, struct ps_op *op)
{
    size_t multi = 0, b = 0;

    for (size_t i = 0; i < op->n; i++)
        multi += op->pages[i].nsegs > 1;
    if (!(op->bufs = calloc(op->n ? op->n : 1, sizeof(void *))))
        return -ENOMEM;
    if (multi && posix_memalign((void **)&op->bounce, 4096, multi * s->page_bytes))
        return -ENOMEM;
    /* Bounce pages on huge pages where the kernel gives them, as the engine's host pool: a
     * page's I/O is then a few DMA segments, not one per 4 KiB (kvtier-pagestore-bench, 64 KiB
     * pages of 2 segments on ext4: set 0.71 - 0.76 -> 1.00 - 1.03 GB/s, get 1.30 - 1.36 ->
     * 1.57 - 1.67). A region under one huge page cannot have one. */
    if (multi * s->page_bytes >= BOUNCE_HUGE)
        madvise(op->bounce, multi * s->page_bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < op->n; i++)
        op->bufs[i] =
            op->pages[i].nsegs > 1 ? op->bounce + b++ * s->page_bytes : op->pages[i].segs[0].addr;
    return 0;
}

/* Segments of no bytes may have no address: nothing is copied for them. */
static void gather(const struct kvt_page *p, uint8_t *to)
{
    for (uint32_t k = 0; k < p->nsegs; k++)
        if (p->segs[k].len) {
            memcpy(to, p->segs[k].addr, p->segs[k].len);
            to += p->segs[k].len;
        }
}

static void scatter(const struct kvt_page *p, const uint8_t *from)
{
    for (uint32_t k = 0; k < p->nsegs; k++)
        if (p->segs[k].len) {
            memcpy(p->segs[k].addr, from, p->segs[k].len);
            from += p->segs[k].len;
        }
}

static struct ps_op *op_new(struct kvt_pagestore *s, uint32_t kind, const struct kvt_page *pages,
                            size_t n, int *results)
{
    struct ps_op *op = calloc(1, sizeof(*op));

    if (!op)
        return NULL;
    *op = (struct ps_op){.kind = kind, .n = n, .pages = pages, .results = results};
    if (op_buffers(s, op)) {
        op_free(op);
        return NULL;
    }
    return op;
}

/* The block store's page descriptors, gathering what needs it: before the lock, so that
 * other threads' calls do not wait for these copies. */
static int describe(struct ps_op *op)
{
    if (op->kind == DSTORE_OP_WRITE) {
        if (!(op->w = calloc(op->n ? op->n : 1, sizeof(*op->w))))
            return -ENOMEM;
        for (size_t i = 0; i < op->n; i++) {
            if (op->pages[i].nsegs > 1)
                gather(&op->pages[i], op->bufs[i]);
            op->w[i] = (struct dstore_wpage){
                .key = op->pages[i].key, .parent = op->pages[i].parent, .buf = op->bufs[i]};
        }
        return 0;
    }
    if (!(op->r = calloc(op->n ? op->n : 1, sizeof(*op->r))))
        return -ENOMEM;
    for (size_t i = 0; i < op->n; i++)
        op->r[i] = (struct dstore_rpage){.key = op->pages[i].key, .buf = op->bufs[i]};
    return 0;
}

static int submit(struct kvt_pagestore *s, uint32_t kind, const struct kvt_page *pages, size_t n,
                  int *results, uint64_t *id)
{
    struct ps_op *op;
    int rc = check_pages(s, pages, n, results);

    if (rc || !id)
        return rc ? rc : -EINVAL;
    if (kind == DSTORE_OP_WRITE && s->ro)
        return -EROFS;
    if (!(op = op_new(s, kind, pages, n, results)))
        return -ENOMEM;
    if ((rc = describe(op))) {
        op_free(op);
        return rc;
    }
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
        op_free(op);
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

static int wait_op(kvt_pagestore *s, uint64_t id, int timeout_ms, size_t *ok)
{
    struct dstore_done d;
    struct ps_op *op;
    int rc = dstore_wait_for(s->ds, id, timeout_ms, &d);

    if (rc)
        return rc;
    if ((op = take_op(s, id)) && op->kind == DSTORE_OP_READ)
        for (size_t i = 0; i < op->n; i++)
            if (op->results[i] == 0 && op->pages[i].nsegs > 1)
                scatter(&op->pages[i], op->bufs[i]);
    op_free(op);
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
    int rc = check_pages(s, pages, n, results);
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

int kvt_pagestore_exists(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *run)
{
    int rc;

    if (!s || !run || (n && !keys))
        return -EINVAL;
    pthread_mutex_lock(&s->mu);
    rc = dstore_leading_run(s->ds, keys, n, run);
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
    st.disk_io = d.io;
    st.read_only = s->ro;
    size_t size = out->size < sizeof(st) ? out->size : sizeof(st);
    if (out->size > sizeof(st))
        memset((uint8_t *)out + sizeof(st), 0, out->size - sizeof(st));
    st.size = size;
    memcpy(out, &st, size);
    return 0;
}
