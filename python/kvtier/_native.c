/*
 * kvtier._native: the page store (include/kvtier_store.h) as a Python type, PageStore.
 *
 * Every argument is turned into C arrays (keys, segments, pages, results) while the GIL is
 * held; each kvt_pagestore_* call then runs with the GIL released, so Python threads run
 * beside a long get or set, and several threads may be inside the store at once (it is
 * thread-safe). Bad arguments raise ValueError or TypeError before anything reaches C.
 *
 * A submitted op's arrays, and the buffers it holds (the *_into / *_from variants), live in
 * the store's table of pending ops until wait collects the op, or close, which waits for
 * every op, drops them. close waits out the calls in flight in other threads first: the C
 * store's close must be its last call, and comes once however many threads call close at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#include "kvtier_store.h"
#include "_emb.h"

#define KEY_BYTES KVT_PAGESTORE_KEY_BYTES
#define MAX_SEGS_PER_PAGE 65536 /* far past any layout (layer_first: 2 x layers) */

static PyObject *kvtier_error; /* kvtier.Error */

/* ---- errors ---- */

/* Raise kvtier.Error for a C call's code: errno = -code (positive, as OSError has it),
 * strerror = kvt_strerror's text, code = the code as C returned it (a KVT_E* or -errno). */
static PyObject *raise_code(int code)
{
    PyObject *exc = PyObject_CallFunction(kvtier_error, "is", -code, kvt_strerror(code));
    PyObject *num = PyLong_FromLong(code);

    if (exc && num && PyObject_SetAttrString(exc, "code", num) == 0)
        PyErr_SetObject(kvtier_error, exc);
    Py_XDECREF(exc);
    Py_XDECREF(num);
    return NULL;
}

/* ---- one batch of pages, as C wants it ---- */

struct batch {
    size_t n;
    uint8_t *keys; /* n keys back to back */
    uint8_t parent[KEY_BYTES];
    int has_parent;
    struct kvt_segment *segs; /* n * segs_per_page */
    struct kvt_page *pages;
    int *results;
    Py_buffer *views; /* the buffer variants' views, one a page; nviews of them taken */
    size_t nviews;
    uint8_t *parents;  /* a parent per page (n keys back to back), when given as a list */
    uint8_t *has_each; /* parents[i] is set; else page i starts a chain */
};

static void batch_free(struct batch *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->nviews; i++)
        PyBuffer_Release(&b->views[i]);
    PyMem_Free(b->views);
    PyMem_Free(b->results);
    PyMem_Free(b->pages);
    PyMem_Free(b->segs);
    PyMem_Free(b->keys);
    PyMem_Free(b->parents);
    PyMem_Free(b->has_each);
    PyMem_Free(b);
}

/* The arrays for b->n pages of per_page segments (keys are already there). */
static int batch_arrays(struct batch *b, size_t per_page, int with_views)
{
    size_t n = b->n ? b->n : 1;

    b->segs = PyMem_Calloc(n * per_page, sizeof(*b->segs));
    b->pages = PyMem_Calloc(n, sizeof(*b->pages));
    b->results = PyMem_Calloc(n, sizeof(*b->results));
    if (with_views)
        b->views = PyMem_Calloc(n, sizeof(*b->views));
    if (!b->segs || !b->pages || !b->results || (with_views && !b->views)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Page i: its key, its parent (the page before it, or the batch's parent for the first),
 * its per_page segments. */
static void batch_link(struct batch *b, size_t per_page)
{
    for (size_t i = 0; i < b->n; i++) {
        const uint8_t *parent = i ? b->keys + (i - 1) * KEY_BYTES : NULL;
        if (!i && b->has_parent)
            parent = b->parent;
        if (b->parents)
            parent = b->has_each[i] ? b->parents + i * KEY_BYTES : NULL;
        b->pages[i] = (struct kvt_page){.key = b->keys + i * KEY_BYTES,
                                        .parent = parent,
                                        .segs = b->segs + i * per_page,
                                        .nsegs = (uint32_t)per_page};
    }
}

/* ---- keys ---- */

/* Exactly len bytes of obj's buffer into to; else ValueError (TypeError: not a buffer). */
static int copy_exact(PyObject *obj, void *to, Py_ssize_t len, const char *what)
{
    Py_buffer v;

    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (v.len != len) {
        PyErr_Format(PyExc_ValueError, "%s must be %zd bytes, not %zd", what, len, v.len);
        PyBuffer_Release(&v);
        return -1;
    }
    memcpy(to, v.buf, (size_t)len);
    PyBuffer_Release(&v);
    return 0;
}

/* Keys given as one buffer of n * 32 bytes. */
static int keys_from_buffer(PyObject *obj, struct batch *b)
{
    Py_buffer v;
    int rc = -1;

    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (v.len % KEY_BYTES) {
        PyErr_Format(PyExc_ValueError, "keys must be a multiple of %d bytes, not %zd", KEY_BYTES,
                     v.len);
    } else if (!(b->keys = PyMem_Malloc(v.len ? (size_t)v.len : 1))) {
        PyErr_NoMemory();
    } else {
        memcpy(b->keys, v.buf, (size_t)v.len);
        b->n = (size_t)v.len / KEY_BYTES;
        rc = 0;
    }
    PyBuffer_Release(&v);
    return rc;
}

/* Keys given as a sequence of 32-byte objects. */
static int keys_from_sequence(PyObject *obj, struct batch *b)
{
    PyObject *seq = PySequence_Fast(obj, "keys must be bytes or a sequence of 32-byte keys");
    Py_ssize_t n;
    int rc = 0;

    if (!seq)
        return -1;
    n = PySequence_Fast_GET_SIZE(seq);
    if (!(b->keys = PyMem_Malloc(n ? (size_t)n * KEY_BYTES : 1))) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
        rc = copy_exact(PySequence_Fast_GET_ITEM(seq, i), b->keys + i * KEY_BYTES, KEY_BYTES,
                        "a key");
    b->n = (size_t)n;
    Py_DECREF(seq);
    return rc;
}

static int batch_keys(PyObject *obj, struct batch *b)
{
    return PyObject_CheckBuffer(obj) ? keys_from_buffer(obj, b) : keys_from_sequence(obj, b);
}

/* A list or tuple of parents, one a page: a 32-byte key, or None for a page that starts a
 * chain. The pages of a batch need not be one sequence. */
static int batch_parents(PyObject *obj, struct batch *b)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);

    if ((size_t)n != b->n) {
        PyErr_Format(PyExc_ValueError, "parent: %zu of them wanted (one a page), %zd given", b->n,
                     n);
        return -1;
    }
    b->parents = PyMem_Calloc(b->n ? b->n : 1, KEY_BYTES);
    b->has_each = PyMem_Calloc(b->n ? b->n : 1, 1);
    if (!b->parents || !b->has_each) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(obj, i);
        if (p == Py_None)
            continue;
        if (copy_exact(p, b->parents + (size_t)i * KEY_BYTES, KEY_BYTES, "a parent") < 0)
            return -1;
        b->has_each[i] = 1;
    }
    return 0;
}

static int batch_parent(PyObject *obj, struct batch *b)
{
    if (!obj || obj == Py_None)
        return 0;
    if (PyList_Check(obj) || PyTuple_Check(obj))
        return batch_parents(obj, b);
    b->has_parent = 1;
    return copy_exact(obj, b->parent, KEY_BYTES, "parent");
}

/* ---- segments: (address, size) pairs or buffers ---- */

/* A non-negative int (anything with __index__) that fits in 64 bits; else ValueError. */
static int uint64_from(PyObject *obj, uint64_t *out, const char *what)
{
    PyObject *num = PyNumber_Index(obj);
    unsigned long long v;

    if (!num)
        return -1;
    v = PyLong_AsUnsignedLongLong(num);
    Py_DECREF(num);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s out of range", what);
        }
        return -1;
    }
    *out = v;
    return 0;
}

/* One segment: a non-zero address and a positive size. */
static int segment_from(PyObject *ptr, PyObject *size, uint64_t page_bytes, struct kvt_segment *seg)
{
    uint64_t addr, len = page_bytes;

    if (uint64_from(ptr, &addr, "an address") < 0)
        return -1;
    if (size && uint64_from(size, &len, "a size") < 0)
        return -1;
    if (!addr || !len || len > page_bytes || addr > UINTPTR_MAX) {
        PyErr_SetString(PyExc_ValueError,
                        "a segment needs a non-zero address and a size of 1 .. page_bytes");
        return -1;
    }
    *seg = (struct kvt_segment){(void *)(uintptr_t)addr, (size_t)len};
    return 0;
}

/* Each page's segments must add up to page_bytes, checked here so C never sees a bad batch. */
static int check_page_sums(const struct batch *b, size_t per_page, uint64_t page_bytes)
{
    for (size_t i = 0; i < b->n; i++) {
        uint64_t sum = 0;
        for (size_t k = 0; k < per_page; k++)
            sum += b->segs[i * per_page + k].len;
        if (sum != page_bytes) {
            PyErr_Format(PyExc_ValueError,
                         "page %zu: its segments add up to %llu bytes, not page_bytes (%llu)", i,
                         (unsigned long long)sum, (unsigned long long)page_bytes);
            return -1;
        }
    }
    return 0;
}

static PyObject *fast_of_length(PyObject *obj, size_t len, const char *what)
{
    PyObject *seq = PySequence_Fast(obj, what);

    if (seq && (size_t)PySequence_Fast_GET_SIZE(seq) != len) {
        PyErr_Format(PyExc_ValueError, "%s: %zu of them wanted, %zd given", what, len,
                     PySequence_Fast_GET_SIZE(seq));
        Py_CLEAR(seq);
    }
    return seq;
}

/* ptrs (and sizes, or page_bytes each when None) into b->segs. */
static int batch_addrs(PyObject *ptrs, PyObject *sizes, size_t per_page, uint64_t page_bytes,
                       struct batch *b)
{
    size_t nsegs = b->n * per_page;
    PyObject *p = NULL, *z = NULL;
    int rc = -1;

    if (sizes == Py_None && per_page != 1) {
        PyErr_SetString(PyExc_ValueError, "sizes is needed when segs_per_page > 1");
        return -1;
    }
    if (!(p = fast_of_length(ptrs, nsegs, "ptrs (one int address a segment)")))
        return -1;
    if (sizes != Py_None && !(z = fast_of_length(sizes, nsegs, "sizes (one int a segment)")))
        goto out;
    for (size_t i = 0; i < nsegs; i++)
        if (segment_from(PySequence_Fast_GET_ITEM(p, i), z ? PySequence_Fast_GET_ITEM(z, i) : NULL,
                         page_bytes, &b->segs[i]) < 0)
            goto out;
    rc = check_page_sums(b, per_page, page_bytes);
out:
    Py_XDECREF(z);
    Py_DECREF(p);
    return rc;
}

/* One buffer a page, page_bytes each, held (b->views) until the batch is freed. */
static int batch_buffers(PyObject *buffers, int writable, uint64_t page_bytes, struct batch *b)
{
    PyObject *seq = fast_of_length(buffers, b->n, "buffers (one a page)");
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    int rc = 0;

    if (!seq)
        return -1;
    for (size_t i = 0; rc == 0 && i < b->n; i++) {
        Py_buffer *v = &b->views[i];
        if ((rc = PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), v, flags)) < 0) {
            if (PyErr_ExceptionMatches(PyExc_BufferError)) { /* read-only, or not contiguous */
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "buffer %zu is not a %scontiguous buffer", i,
                             writable ? "writable " : "");
            }
            break;
        }
        b->nviews++;
        if ((uint64_t)v->len != page_bytes) {
            PyErr_Format(PyExc_ValueError, "buffer %zu is %zd bytes, not page_bytes (%llu)", i,
                         v->len, (unsigned long long)page_bytes);
            rc = -1;
        }
        b->segs[i] = (struct kvt_segment){v->buf, (size_t)v->len};
    }
    Py_DECREF(seq);
    return rc;
}

/* ---- the PageStore object ---- */

typedef struct {
    PyObject ob_base;
    kvt_pagestore *s; /* NULL once closed */
    PyObject *dir;    /* str */
    uint64_t page_bytes;
    PyObject *pending; /* dict: op id -> capsule of its struct batch */
    Py_ssize_t busy;   /* calls inside the store with the GIL released; close waits them out */
    int closing;
} PageStore;

static int closed_error(void)
{
    PyErr_SetString(PyExc_ValueError, "the PageStore is closed");
    return -1;
}

static int check_open(PageStore *self)
{
    return self->s && !self->closing ? 0 : closed_error();
}

/* Before a call drops the GIL: the store stays open until leave. */
static int enter(PageStore *self)
{
    if (check_open(self) < 0)
        return -1;
    self->busy++;
    return 0;
}

static void leave(PageStore *self)
{
    self->busy--;
}

static PyObject *results_list(const struct batch *b)
{
    PyObject *list = PyList_New((Py_ssize_t)b->n);

    for (size_t i = 0; list && i < b->n; i++) {
        PyObject *r = PyLong_FromLong(b->results[i]);
        if (!r) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, r);
    }
    return list;
}

static struct batch *batch_new(void)
{
    struct batch *b = PyMem_Calloc(1, sizeof(*b));

    if (!b)
        PyErr_NoMemory();
    return b;
}

/* A batch from (keys, ptrs, sizes, segs_per_page[, parent]). */
static struct batch *batch_of_addrs(PageStore *self, PyObject *keys, PyObject *ptrs,
                                    PyObject *sizes, Py_ssize_t per_page, PyObject *parent)
{
    struct batch *b;

    if (per_page < 1 || per_page > MAX_SEGS_PER_PAGE) {
        PyErr_Format(PyExc_ValueError, "segs_per_page must be 1 .. %d", MAX_SEGS_PER_PAGE);
        return NULL;
    }
    if (!(b = batch_new()))
        return NULL;
    if (batch_keys(keys, b) < 0 || batch_parent(parent, b) < 0 ||
        batch_arrays(b, (size_t)per_page, 0) < 0 ||
        batch_addrs(ptrs, sizes, (size_t)per_page, self->page_bytes, b) < 0) {
        batch_free(b);
        return NULL;
    }
    batch_link(b, (size_t)per_page);
    return b;
}

/* A batch from (keys, buffers[, parent]): one buffer a page. */
static struct batch *batch_of_buffers(PageStore *self, PyObject *keys, PyObject *buffers,
                                      int writable, PyObject *parent)
{
    struct batch *b = batch_new();

    if (!b)
        return NULL;
    if (batch_keys(keys, b) < 0 || batch_parent(parent, b) < 0 || batch_arrays(b, 1, 1) < 0 ||
        batch_buffers(buffers, writable, self->page_bytes, b) < 0) {
        batch_free(b);
        return NULL;
    }
    batch_link(b, 1);
    return b;
}

typedef int (*sync_fn)(kvt_pagestore *, const struct kvt_page *, size_t, int *);
typedef int (*submit_fn)(kvt_pagestore *, const struct kvt_page *, size_t, int *, uint64_t *);

/* Run a batch to its end; the batch is freed. */
static PyObject *run_sync(PageStore *self, struct batch *b, sync_fn fn)
{
    PyObject *out = NULL;
    int rc;

    if (!b)
        return NULL;
    if (enter(self) == 0) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = fn(self->s, b->pages, b->n, b->results);
        PyEval_RestoreThread(ts);
        leave(self);
        out = rc ? raise_code(rc) : results_list(b);
    }
    batch_free(b);
    return out;
}

static void capsule_free(PyObject *capsule)
{
    batch_free(PyCapsule_GetPointer(capsule, "kvtier.batch"));
}

/* The op could not be recorded: let it finish before its memory goes. */
static void drain(PageStore *self, uint64_t op)
{
    PyThreadState *ts = PyEval_SaveThread();

    kvt_pagestore_wait(self->s, op, -1, NULL);
    PyEval_RestoreThread(ts);
}

/* Submit a batch; it lives in self->pending until wait. Returns the op id. */
static PyObject *run_submit(PageStore *self, struct batch *b, submit_fn fn)
{
    PyObject *capsule, *id = NULL;
    PyThreadState *ts;
    uint64_t op = 0;
    int rc;

    if (!b)
        return NULL;
    if (!(capsule = PyCapsule_New(b, "kvtier.batch", capsule_free))) {
        batch_free(b);
        return NULL;
    }
    if (enter(self) < 0)
        goto out;
    ts = PyEval_SaveThread();
    rc = fn(self->s, b->pages, b->n, b->results, &op);
    PyEval_RestoreThread(ts);
    if (rc) {
        leave(self);
        raise_code(rc);
        goto out;
    }
    if (!(id = PyLong_FromUnsignedLongLong(op)) || PyDict_SetItem(self->pending, id, capsule) < 0) {
        drain(self, op);
        Py_CLEAR(id);
    }
    leave(self);
out:
    Py_DECREF(capsule);
    return id;
}

/* ---- methods ---- */

/* Let other threads run for a millisecond. */
static void nap(void)
{
    PyThreadState *ts = PyEval_SaveThread();

    usleep(1000);
    PyEval_RestoreThread(ts);
}

/* The first caller closes; one that comes while it does (another thread: the GIL is let go
 * inside) waits until it has, so each returns with the store closed and the C store is closed
 * once. self->closing stays set from the first close on; self->s is NULL once the C store is
 * gone. */
static void store_close(PageStore *self)
{
    kvt_pagestore *s = self->s;
    PyThreadState *ts;

    if (self->closing) {
        while (self->s)
            nap();
        return;
    }
    if (!s)
        return; /* never opened */
    self->closing = 1;
    while (self->busy) /* other threads' calls: the C close must come after them */
        nap();
    ts = PyEval_SaveThread();
    kvt_pagestore_close(s);
    PyEval_RestoreThread(ts);
    self->s = NULL;
    if (self->pending)
        PyDict_Clear(self->pending); /* every op is done: close waited for them */
}

static const char *const disk_io_names[] = {"auto", "uring", "psync"};

static int disk_io_from(const char *name, uint32_t *out)
{
    for (uint32_t i = 0; i < sizeof(disk_io_names) / sizeof(disk_io_names[0]); i++)
        if (strcmp(name, disk_io_names[i]) == 0) {
            *out = i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "disk_io must be 'auto', 'uring' or 'psync', not '%s'", name);
    return -1;
}

static int sync_from(const char *name, uint32_t *out)
{
    if (strcmp(name, "durable") == 0 || strcmp(name, "relaxed") == 0) {
        *out = name[0] == 'r' ? KVT_DISK_SYNC_RELAXED : KVT_DISK_SYNC_DURABLE;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "sync must be 'durable' or 'relaxed', not '%s'", name);
    return -1;
}

static int open_checks(const struct kvt_pagestore_options *o)
{
    if (!o->fingerprint_len)
        PyErr_SetString(PyExc_ValueError, "fingerprint must not be empty");
    else if (o->page_bytes < 1 || o->page_bytes > (1ull << 31))
        PyErr_SetString(PyExc_ValueError, "page_bytes must be 1 .. 2**31");
    else if (o->page_tokens > 4096)
        PyErr_SetString(PyExc_ValueError, "page_tokens must be 0 .. 4096");
    else if (!o->capacity_bytes)
        PyErr_SetString(PyExc_ValueError, "capacity must be positive");
    else
        return 0;
    return -1;
}

static int parse_open_args(PyObject *args, PyObject *kwds, struct kvt_pagestore_options *o,
                           PyObject **dir_bytes, Py_buffer *fp)
{
    static char *kwlist[] = {"dir",      "fingerprint",       "page_bytes",   "page_tokens",
                             "capacity", "disk_io",           "read_only",    "sync",
                             "remote",   "remote_timeout_ms", "remote_ttl_s", "page_cache",
                             NULL};
    unsigned long long page_bytes, capacity = 1ull << 30;
    unsigned int page_tokens = 0, remote_timeout_ms = 0, remote_ttl_s = 0;
    const char *disk_io = "auto", *sync = "durable", *remote = NULL;
    int read_only = 0, page_cache = 1;

    kvt_pagestore_options_init(o, sizeof(*o));
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&y*K|$IKspszIIp:PageStore", kwlist,
                                     PyUnicode_FSConverter, dir_bytes, fp, &page_bytes,
                                     &page_tokens, &capacity, &disk_io, &read_only, &sync, &remote,
                                     &remote_timeout_ms, &remote_ttl_s, &page_cache))
        return -1;
    o->page_cache_bypass = !page_cache;
    o->remote = remote; /* the caller's argument: alive until the open returns */
    o->remote_timeout_ms = remote_timeout_ms;
    o->remote_ttl_s = remote_ttl_s;
    o->dir = PyBytes_AS_STRING(*dir_bytes);
    o->fingerprint = fp->buf;
    o->fingerprint_len = (size_t)fp->len;
    o->page_bytes = page_bytes;
    o->page_tokens = page_tokens;
    o->capacity_bytes = capacity;
    o->read_only = (uint32_t)read_only;
    if (disk_io_from(disk_io, &o->disk_io) == 0 && sync_from(sync, &o->sync) == 0)
        return 0;
    PyBuffer_Release(fp);
    Py_CLEAR(*dir_bytes);
    return -1;
}

static int PageStore_init(PageStore *self, PyObject *args, PyObject *kwds)
{
    struct kvt_pagestore_options o;
    PyObject *dir_bytes = NULL;
    Py_buffer fp = {0};
    kvt_pagestore *s = NULL;
    PyThreadState *ts;
    int rc = -1;

    if (self->s || self->dir) {
        PyErr_SetString(PyExc_RuntimeError, "PageStore.__init__ called twice");
        return -1;
    }
    if (parse_open_args(args, kwds, &o, &dir_bytes, &fp) < 0)
        return -1;
    if (open_checks(&o) < 0 || !(self->pending = PyDict_New()) ||
        !(self->dir = PyUnicode_DecodeFSDefault(PyBytes_AS_STRING(dir_bytes))))
        goto out;
    self->page_bytes = o.page_bytes;
    ts = PyEval_SaveThread();
    rc = kvt_pagestore_open(&o, &s);
    PyEval_RestoreThread(ts);
    if (rc) {
        raise_code(rc);
        rc = -1;
        goto out;
    }
    self->s = s;
out:
    PyBuffer_Release(&fp);
    Py_XDECREF(dir_bytes);
    return rc;
}

static void PageStore_dealloc(PageStore *self)
{
    store_close(self);
    Py_XDECREF(self->pending);
    Py_XDECREF(self->dir);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *PageStore_close(PageStore *self, PyObject *unused)
{
    (void)unused;
    store_close(self);
    Py_RETURN_NONE;
}

static PyObject *PageStore_enter(PageStore *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *PageStore_exit(PageStore *self, PyObject *args)
{
    (void)args;
    store_close(self);
    Py_RETURN_FALSE;
}

/* A call of the page store over a list of keys that answers a count, without the GIL. */
static PyObject *keys_call(PageStore *self, PyObject *keys,
                           int (*fn)(kvt_pagestore *, const uint8_t *, size_t, size_t *))
{
    struct batch *b;
    PyThreadState *ts;
    size_t count = 0;
    int rc;

    if (check_open(self) < 0 || !(b = batch_new()))
        return NULL;
    if (batch_keys(keys, b) < 0 || enter(self) < 0) {
        batch_free(b);
        return NULL;
    }
    ts = PyEval_SaveThread();
    rc = fn(self->s, b->keys, b->n, &count);
    PyEval_RestoreThread(ts);
    leave(self);
    batch_free(b);
    return rc ? raise_code(rc) : PyLong_FromSize_t(count);
}

static PyObject *PageStore_exists(PageStore *self, PyObject *keys)
{
    return keys_call(self, keys, kvt_pagestore_exists);
}

static PyObject *PageStore_touch(PageStore *self, PyObject *keys)
{
    return keys_call(self, keys, kvt_pagestore_touch);
}

static PyObject *PageStore_exists_local(PageStore *self, PyObject *keys)
{
    return keys_call(self, keys, kvt_pagestore_exists_local);
}

static PyObject *PageStore_delete(PageStore *self, PyObject *keys)
{
    return keys_call(self, keys, kvt_pagestore_delete);
}

static PyObject *PageStore_clear(PageStore *self, PyObject *unused)
{
    PyThreadState *ts;
    int rc;

    (void)unused;
    if (enter(self) < 0)
        return NULL;
    ts = PyEval_SaveThread();
    rc = kvt_pagestore_clear(self->s);
    PyEval_RestoreThread(ts);
    leave(self);
    if (rc)
        return raise_code(rc);
    Py_RETURN_NONE;
}

/* get / set / submit_get / submit_set share one argument list. */
static struct batch *addr_batch(PageStore *self, PyObject *args, PyObject *kwds, int with_parent)
{
    static char *get_kw[] = {"keys", "ptrs", "sizes", "segs_per_page", NULL};
    static char *set_kw[] = {"keys", "ptrs", "sizes", "segs_per_page", "parent", NULL};
    PyObject *keys, *ptrs, *sizes = Py_None, *parent = Py_None;
    Py_ssize_t per_page = 1;

    if (check_open(self) < 0)
        return NULL;
    if (with_parent ? !PyArg_ParseTupleAndKeywords(args, kwds, "OO|OnO", set_kw, &keys, &ptrs,
                                                   &sizes, &per_page, &parent)
                    : !PyArg_ParseTupleAndKeywords(args, kwds, "OO|On", get_kw, &keys, &ptrs,
                                                   &sizes, &per_page))
        return NULL;
    return batch_of_addrs(self, keys, ptrs, sizes, per_page, parent);
}

/* get_into / set_from and their submit_ forms. */
static struct batch *buffer_batch(PageStore *self, PyObject *args, PyObject *kwds, int is_set)
{
    static char *get_kw[] = {"keys", "buffers", NULL};
    static char *set_kw[] = {"keys", "buffers", "parent", NULL};
    PyObject *keys, *buffers, *parent = Py_None;

    if (check_open(self) < 0)
        return NULL;
    if (is_set ? !PyArg_ParseTupleAndKeywords(args, kwds, "OO|O", set_kw, &keys, &buffers, &parent)
               : !PyArg_ParseTupleAndKeywords(args, kwds, "OO", get_kw, &keys, &buffers))
        return NULL;
    return batch_of_buffers(self, keys, buffers, !is_set, parent);
}

static PyObject *PageStore_get(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_sync(self, addr_batch(self, args, kwds, 0), kvt_pagestore_get);
}

static PyObject *PageStore_set(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_sync(self, addr_batch(self, args, kwds, 1), kvt_pagestore_set);
}

static PyObject *PageStore_get_into(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_sync(self, buffer_batch(self, args, kwds, 0), kvt_pagestore_get);
}

static PyObject *PageStore_set_from(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_sync(self, buffer_batch(self, args, kwds, 1), kvt_pagestore_set);
}

static PyObject *PageStore_submit_get(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_submit(self, addr_batch(self, args, kwds, 0), kvt_pagestore_submit_get);
}

static PyObject *PageStore_submit_set(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_submit(self, addr_batch(self, args, kwds, 1), kvt_pagestore_submit_set);
}

static PyObject *PageStore_submit_get_into(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_submit(self, buffer_batch(self, args, kwds, 0), kvt_pagestore_submit_get);
}

static PyObject *PageStore_submit_set_from(PageStore *self, PyObject *args, PyObject *kwds)
{
    return run_submit(self, buffer_batch(self, args, kwds, 1), kvt_pagestore_submit_set);
}

/* Collect op: its results; TimeoutError (op stays pending) when it is not done in time. */
static PyObject *PageStore_wait(PageStore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"op", "timeout_ms", NULL};
    unsigned long long op;
    int timeout_ms = -1, rc;
    PyObject *id, *capsule, *out = NULL;

    if (check_open(self) < 0 ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "K|i", kwlist, &op, &timeout_ms))
        return NULL;
    if (!(id = PyLong_FromUnsignedLongLong(op)))
        return NULL;
    capsule = PyDict_GetItemWithError(self->pending, id);
    if (!capsule) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "op %llu is not pending (collected already?)", op);
        Py_DECREF(id);
        return NULL;
    }
    Py_INCREF(capsule); /* another thread's wait may collect it meanwhile */
    if (enter(self) == 0) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = kvt_pagestore_wait(self->s, op, timeout_ms, NULL);
        PyEval_RestoreThread(ts);
        leave(self);
        if (rc == -ETIMEDOUT)
            PyErr_Format(PyExc_TimeoutError, "op %llu not done within %d ms", op, timeout_ms);
        else if (rc)
            raise_code(rc);
        else if ((out = results_list(PyCapsule_GetPointer(capsule, "kvtier.batch"))) &&
                 PyDict_DelItem(self->pending, id) < 0)
            PyErr_Clear(); /* gone already: close dropped it */
    }
    Py_DECREF(capsule);
    Py_DECREF(id);
    return out;
}

static PyObject *PageStore_event_fd(PageStore *self, PyObject *unused)
{
    (void)unused;
    if (check_open(self) < 0)
        return NULL;
    return PyLong_FromLong(kvt_pagestore_event_fd(self->s));
}

static int put_u64(PyObject *dict, const char *name, uint64_t v)
{
    PyObject *num = PyLong_FromUnsignedLongLong(v);
    int rc = num ? PyDict_SetItemString(dict, name, num) : -1;

    Py_XDECREF(num);
    return rc;
}

static int put_str(PyObject *dict, const char *name, const char *v)
{
    PyObject *str = PyUnicode_FromString(v);
    int rc = str ? PyDict_SetItemString(dict, name, str) : -1;

    Py_XDECREF(str);
    return rc;
}

static PyObject *stats_dict(const struct kvt_pagestore_stats *st)
{
    PyObject *d = PyDict_New();
    const char *io = st->disk_io < 3 ? disk_io_names[st->disk_io] : "unknown";

    if (!d || put_u64(d, "pages", st->pages) || put_u64(d, "capacity_pages", st->capacity_pages) ||
        put_u64(d, "page_bytes", st->page_bytes) || put_u64(d, "gets", st->gets) ||
        put_u64(d, "get_hits", st->get_hits) || put_u64(d, "sets", st->sets) ||
        put_u64(d, "set_dups", st->set_dups) || put_u64(d, "bytes_read", st->bytes_read) ||
        put_u64(d, "bytes_written", st->bytes_written) || put_u64(d, "evicted", st->evicted) ||
        put_u64(d, "deleted", st->deleted) || put_u64(d, "errors", st->errors) ||
        put_u64(d, "recovered", st->recovered) || put_str(d, "disk_io", io) ||
        PyDict_SetItemString(d, "read_only", st->read_only ? Py_True : Py_False) ||
        PyDict_SetItemString(d, "remote", st->remote ? Py_True : Py_False) ||
        put_u64(d, "remote_reads", st->remote_reads) ||
        put_u64(d, "remote_errors", st->remote_errors) ||
        put_u64(d, "cache_reads", st->cache_reads))
        Py_CLEAR(d);
    return d;
}

static PyObject *PageStore_stats(PageStore *self, PyObject *unused)
{
    PyThreadState *ts;
    struct kvt_pagestore_stats st = {.size = sizeof(st)};
    int rc;

    (void)unused;
    if (enter(self) < 0)
        return NULL;
    ts = PyEval_SaveThread();
    rc = kvt_pagestore_stats(self->s, &st);
    PyEval_RestoreThread(ts);
    leave(self);
    return rc ? raise_code(rc) : stats_dict(&st);
}

static PyObject *PageStore_get_page_bytes(PageStore *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->page_bytes);
}

static PyObject *PageStore_get_dir(PageStore *self, void *closure)
{
    (void)closure;
    return Py_NewRef(self->dir ? self->dir : Py_None);
}

static PyObject *PageStore_get_closed(PageStore *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(!self->s || self->closing);
}

static PyObject *PageStore_repr(PageStore *self)
{
    return PyUnicode_FromFormat("<kvtier.PageStore dir=%R page_bytes=%llu%s>", self->dir,
                                (unsigned long long)self->page_bytes, self->s ? "" : " closed");
}

/* Slots take PyObject *self; ours take PageStore *: the cast through void (*)(void) says so. */
#define FN(type, fn) ((type)(void (*)(void))(fn))
#define KW(fn) FN(PyCFunction, fn), METH_VARARGS | METH_KEYWORDS

static PyMethodDef PageStore_methods[] = {
    {"exists", FN(PyCFunction, PageStore_exists), METH_O,
     "exists(keys) -> int\n\nHow many of keys, from the first, are all stored (the leading "
     "run).\nkeys: bytes of n*32 bytes, or a sequence of 32-byte keys."},
    {"get", KW(PageStore_get),
     "get(keys, ptrs, sizes=None, segs_per_page=1) -> list[int]\n\nRead pages into memory at "
     "int addresses, zero-copy. Page i's segments are\nptrs[i*segs_per_page:(i+1)*segs_per_page] "
     "with the sizes at the same places\n(None: one segment of page_bytes a page). Per page: "
     "0, -ENOENT, ECORRUPT, -EIO."},
    {"set", KW(PageStore_set),
     "set(keys, ptrs, sizes=None, segs_per_page=1, parent=None) -> list[int]\n\nStore pages "
     "from memory at int addresses; blocks until durable. parent:\nthe key of the page before "
     "keys[0]; inside the batch page i's parent is keys[i-1]. Or a list\nof parents, one a "
     "page (a key, or None for a first page). Per page: 0 (stored,\nor stored already), "
     "-ENOSPC, another -errno."},
    {"get_into", KW(PageStore_get_into),
     "get_into(keys, buffers) -> list[int]\n\nget into writable buffer-protocol objects, one "
     "of page_bytes a page."},
    {"set_from", KW(PageStore_set_from),
     "set_from(keys, buffers, parent=None) -> list[int]\n\nset from buffer-protocol objects, "
     "one of page_bytes a page."},
    {"submit_get", KW(PageStore_submit_get),
     "submit_get(keys, ptrs, sizes=None, segs_per_page=1) -> int\n\nget without waiting: the "
     "op id for wait. The memory must stay valid until then."},
    {"submit_set", KW(PageStore_submit_set),
     "submit_set(keys, ptrs, sizes=None, segs_per_page=1, parent=None) -> int\n\nset without "
     "waiting: the op id for wait."},
    {"submit_get_into", KW(PageStore_submit_get_into),
     "submit_get_into(keys, buffers) -> int\n\nget_into without waiting; the buffers are held "
     "until wait."},
    {"submit_set_from", KW(PageStore_submit_set_from),
     "submit_set_from(keys, buffers, parent=None) -> int\n\nset_from without waiting; the "
     "buffers are held until wait."},
    {"wait", KW(PageStore_wait),
     "wait(op, timeout_ms=-1) -> list[int]\n\nCollect a submitted op: its per-page results. "
     "TimeoutError when it is not\ndone within timeout_ms (negative: no limit); the op stays "
     "waitable."},
    {"event_fd", FN(PyCFunction, PageStore_event_fd), METH_NOARGS,
     "event_fd() -> int\n\nAn eventfd that becomes readable when a submitted op completes "
     "(read 8 bytes to\nrearm). Valid until close."},
    {"exists_local", FN(PyCFunction, PageStore_exists_local), METH_O,
     "exists_local(keys) -> int\n\nexists on this machine's disk alone: never waits for a "
     "remote server."},
    {"touch", FN(PyCFunction, PageStore_touch), METH_O,
     "touch(keys) -> int\n\nCount the pages of keys as used now, as a read would (eviction "
     "takes the\nleast recently used first), without reading them: how many were stored."},
    {"delete", FN(PyCFunction, PageStore_delete), METH_O,
     "delete(keys) -> int\n\nDelete the pages of keys: how many were stored."},
    {"clear", FN(PyCFunction, PageStore_clear), METH_NOARGS, "clear()\n\nDelete every page."},
    {"stats", FN(PyCFunction, PageStore_stats), METH_NOARGS,
     "stats() -> dict\n\nEvery field of kvt_pagestore_stats: pages, capacity_pages, "
     "page_bytes, gets,\nget_hits, sets, set_dups, bytes_read, bytes_written, evicted, "
     "deleted, errors,\nrecovered (ints), disk_io ('uring' or 'psync'), read_only (bool)."},
    {"close", FN(PyCFunction, PageStore_close), METH_NOARGS,
     "close()\n\nWait for every op and close; idempotent. Later calls raise ValueError."},
    {"__enter__", FN(PyCFunction, PageStore_enter), METH_NOARGS, NULL},
    {"__exit__", FN(PyCFunction, PageStore_exit), METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PageStore_getset[] = {
    {"page_bytes", FN(getter, PageStore_get_page_bytes), NULL, "bytes of one page", NULL},
    {"dir", FN(getter, PageStore_get_dir), NULL, "the data dir", NULL},
    {"closed", FN(getter, PageStore_get_closed), NULL, "whether close was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(PageStore_doc,
             "PageStore(dir, fingerprint, page_bytes, *, page_tokens=0, capacity=1 << 30,\n"
             "          disk_io='auto', read_only=False, sync='durable', remote=None,\n"
             "          remote_timeout_ms=0, remote_ttl_s=0, page_cache=True)\n\n"
             "kvtier's page store: whole KV pages of page_bytes named by 32-byte keys, in a\n"
             "data dir of kvtier's disk-tier format (kvtier-ctl reads it). fingerprint (bytes)\n"
             "names the KV (model, revision, dtype, layout, TP rank); a dir holding another\n"
             "fingerprint's pages raises kvtier.Error with code EFINGERPRINT. capacity: bytes\n"
             "of pages kept, the oldest going past it. disk_io: 'auto', 'uring' or 'psync'.\n"
             "sync: 'durable' (set returns once its pages are on disk) or 'relaxed' (flushed\n"
             "every second or 256 MiB and at close). remote: a Redis/Valkey URL, a server\n"
             "below the disk (writes go to both, reads to the nearest that has the page,\n"
             "checked); remote_timeout_ms bounds each wait for it (0: 1000). page_cache:\n"
             "True keeps pages above 128 KiB in the page cache and reads them from it while it\n"
             "holds them (else direct); False writes and reads them with O_DIRECT only.\n"
             "Every page read is checked: a damaged page is a miss, never wrong bytes.\n"
             "Thread-safe; the GIL is released inside every call.");

static PyTypeObject PageStore_type = {
    .ob_base = PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtier.PageStore",
    .tp_basicsize = sizeof(PageStore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = PageStore_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = FN(initproc, PageStore_init),
    .tp_dealloc = FN(destructor, PageStore_dealloc),
    .tp_repr = FN(reprfunc, PageStore_repr),
    .tp_methods = PageStore_methods,
    .tp_getset = PageStore_getset,
};

/* ---- the module ---- */

static int add_constants(PyObject *m)
{
    return PyModule_AddIntConstant(m, "ECORRUPT", KVT_ECORRUPT) ||
           PyModule_AddIntConstant(m, "EFINGERPRINT", KVT_EFINGERPRINT) ||
           PyModule_AddIntConstant(m, "EFORMAT", KVT_EFORMAT) ||
           PyModule_AddIntConstant(m, "KEY_BYTES", KEY_BYTES);
}

static struct PyModuleDef native_module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "kvtier._native",
    .m_doc = "kvtier's page store in C; use it through the kvtier package.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m;

    if (PyType_Ready(&PageStore_type) < 0 || !(m = PyModule_Create(&native_module)))
        return NULL;
    kvtier_error = PyErr_NewExceptionWithDoc(
        "kvtier.Error",
        "A kvtier call failed: errno and strerror as OSError has them, code as C returned "
        "it\n(a negative KVT_E* code such as kvtier.EFINGERPRINT, or -errno).",
        PyExc_OSError, NULL);
    if (!kvtier_error || add_constants(m) < 0 ||
        PyModule_AddObjectRef(m, "Error", kvtier_error) < 0 ||
        PyModule_AddObjectRef(m, "PageStore", (PyObject *)&PageStore_type) < 0 ||
        kvt_py_emb_add(m, kvtier_error) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
