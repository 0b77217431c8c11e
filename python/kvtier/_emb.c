/*
 * kvtier._native's embedding cache: the engine's multimodal embedding cache (kvtier.h,
 * "multimodal embeddings") as two Python types, EmbeddingCache and Embedding (a hold).
 *
 * An EmbeddingCache opens an engine of its own whose KV part is the least the engine takes
 * (two pages): the engine is the owner of the cache's memories and of the tiers below them
 * (a disk dir, a Redis server), and its KV page is sized so that a page of the store below is
 * chunk_bytes (an embedding is kept there as chunks of that size). The engine's calls must
 * not overlap: each call takes the cache's lock with the GIL released, so Python threads run
 * beside a long read and calls from several threads take turns.
 *
 * The package is built for the sim backend, where the cache's "device" memory is host
 * memory: a held Embedding exports its bytes through the buffer protocol (read-only, no copy)
 * while it is held; it cannot be released, nor the cache closed, while such a view lives.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "kvtier.h"
#include "_emb.h"

#define HASH_BYTES KVT_EMB_HASH_BYTES
#define PAGE_TOKENS                                                                                \
    16 /* the engine's page; with one layer of one 2-byte head a page is                           \
          64 x head_dim bytes */
#define CHUNK_MIN 64
#define CHUNK_MAX (4u << 20)

static PyObject *error_type; /* kvtier.Error, from the module */
static const char *const tier_names[] = {"device", "host", "disk", "remote"};

static PyObject *raise_code(int code)
{
    PyObject *exc = PyObject_CallFunction(error_type, "is", -code, kvt_strerror(code));
    PyObject *num = PyLong_FromLong(code);

    if (exc && num && PyObject_SetAttrString(exc, "code", num) == 0)
        PyErr_SetObject(error_type, exc);
    Py_XDECREF(exc);
    Py_XDECREF(num);
    return NULL;
}

/* ---- the cache ---- */

typedef struct {
    PyObject ob_base;
    kvt_engine *e;        /* NULL once closed; read and cleared under lock */
    pthread_mutex_t lock; /* one engine call at a time */
    Py_ssize_t exports;   /* buffer views of held embeddings: close waits for none */
    uint64_t device_bytes, host_bytes, chunk_bytes;
} EmbeddingCache;

typedef struct {
    PyObject ob_base;
    EmbeddingCache *cache; /* a strong reference */
    struct kvt_emb h;      /* h.handle 0: not held */
    Py_ssize_t exports;
} Embedding;

static PyTypeObject EmbeddingCache_type, Embedding_type;

/* Run an engine call with the GIL released and the lock held; -ESHUTDOWN once closed. */
#define ENGINE_CALL(self, rc, call)                                                                \
    do {                                                                                           \
        PyThreadState *ts_ = PyEval_SaveThread();                                                  \
        pthread_mutex_lock(&(self)->lock);                                                         \
        rc = (self)->e ? (call) : -ESHUTDOWN;                                                      \
        pthread_mutex_unlock(&(self)->lock);                                                       \
        PyEval_RestoreThread(ts_);                                                                 \
    } while (0)

static PyObject *closed(void)
{
    PyErr_SetString(PyExc_ValueError, "the EmbeddingCache is closed");
    return NULL;
}

static PyObject *fail(int rc)
{
    return rc == -ESHUTDOWN ? closed() : raise_code(rc);
}

/* A key from hash (32 bytes, any buffer) and ns (a buffer, may be empty): the views are
 * the caller's to release. */
static int key_from(PyObject *hash, PyObject *ns, Py_buffer *hv, Py_buffer *nv,
                    struct kvt_emb_key *k)
{
    memset(nv, 0, sizeof(*nv));
    if (PyObject_GetBuffer(hash, hv, PyBUF_SIMPLE) < 0)
        return -1;
    if (hv->len != HASH_BYTES) {
        PyErr_Format(PyExc_ValueError, "hash must be %d bytes, not %zd", HASH_BYTES, hv->len);
        PyBuffer_Release(hv);
        return -1;
    }
    if (ns && ns != Py_None && PyObject_GetBuffer(ns, nv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(hv);
        return -1;
    }
    if (nv->len > KVT_NS_MAX) {
        PyErr_Format(PyExc_ValueError, "ns is longer than %d bytes", KVT_NS_MAX);
        PyBuffer_Release(hv);
        PyBuffer_Release(nv);
        return -1;
    }
    *k = (struct kvt_emb_key){hv->buf, nv->len ? nv->buf : NULL, (size_t)nv->len};
    return 0;
}

static void key_release(Py_buffer *hv, Py_buffer *nv)
{
    PyBuffer_Release(hv);
    if (nv->obj)
        PyBuffer_Release(nv);
}

/* ---- open ---- */

/* The engine: the least KV the engine takes, pages of chunk_bytes, the cache's options. */
static void engine_options(struct kvt_options *o, uint64_t chunk, uint64_t dev, uint64_t host,
                           const char *dir, uint64_t disk_bytes, const char *remote,
                           const char *model_id, int store)
{
    kvt_options_init(o, sizeof(*o));
    o->geometry = (struct kvt_geometry){.attention = KVT_ATTN_MHA,
                                        .layers = 1,
                                        .kv_heads = 1,
                                        .head_dim = (uint32_t)(chunk / (PAGE_TOKENS * 4)),
                                        .dtype_bytes = 2};
    o->backend = KVT_BACKEND_SIM;
    o->page_size = PAGE_TOKENS;
    o->device_tokens = 2 * PAGE_TOKENS;
    o->max_requests = 1;
    o->max_context = 2 * PAGE_TOKENS;
    o->model_id = model_id;
    o->emb_device_bytes = dev;
    o->emb_host_bytes = host;
    o->emb_store = store ? KVT_EMB_STORE_ALL : KVT_EMB_STORE_NONE;
    if (dir || remote) {
        o->host_tokens = 4 * PAGE_TOKENS; /* the tiers below need a host tier of KV */
        o->disk_dir = dir;
        o->disk_bytes = disk_bytes;
        o->remote = remote;
    }
}

static int EmbeddingCache_init(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"device_bytes", "host_bytes", "dir",   "disk_bytes", "remote",
                         "chunk_bytes",  "model_id",   "store", NULL};
    unsigned long long dev, host = 0, disk = 1ull << 30, chunk = 256 * 1024;
    PyObject *dir_obj = Py_None, *dir_bytes = NULL;
    const char *remote = NULL, *model = "";
    int store = 1, rc;
    struct kvt_options o;
    kvt_engine *e = NULL;

    if (self->e) {
        PyErr_SetString(PyExc_RuntimeError, "EmbeddingCache.__init__ called twice");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "K|$KOKzKsp", kw, &dev, &host, &dir_obj, &disk,
                                     &remote, &chunk, &model, &store))
        return -1;
    if (dev == 0 || chunk < CHUNK_MIN || chunk > CHUNK_MAX || chunk % CHUNK_MIN) {
        PyErr_Format(PyExc_ValueError,
                     dev ? "chunk_bytes must be a multiple of %d from %d to %u"
                         : "device_bytes must be above 0",
                     CHUNK_MIN, CHUNK_MIN, CHUNK_MAX);
        return -1;
    }
    if (dir_obj != Py_None && !PyUnicode_FSConverter(dir_obj, &dir_bytes))
        return -1;
    engine_options(&o, chunk, dev, host, dir_bytes ? PyBytes_AS_STRING(dir_bytes) : NULL, disk,
                   remote, model, store);
    PyThreadState *ts = PyEval_SaveThread();
    rc = kvt_open(&o, &e);
    PyEval_RestoreThread(ts);
    Py_XDECREF(dir_bytes);
    if (rc) {
        raise_code(rc);
        return -1;
    }
    self->e = e;
    self->device_bytes = dev;
    self->host_bytes = host;
    self->chunk_bytes = chunk;
    return 0;
}

static PyObject *EmbeddingCache_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    EmbeddingCache *self = (EmbeddingCache *)type->tp_alloc(type, 0);

    (void)args;
    (void)kwds;
    if (self)
        pthread_mutex_init(&self->lock, NULL);
    return (PyObject *)self;
}

/* Close the engine once no view of a held embedding lives: 0, or -1 with BufferError. */
static int cache_close(EmbeddingCache *self)
{
    kvt_engine *e;

    if (self->exports) {
        PyErr_SetString(PyExc_BufferError,
                        "views of held embeddings still exist: release them first");
        return -1;
    }
    PyThreadState *ts = PyEval_SaveThread();
    pthread_mutex_lock(&self->lock);
    e = self->e;
    self->e = NULL;
    pthread_mutex_unlock(&self->lock);
    kvt_close(e); /* calls in other threads now find it closed */
    PyEval_RestoreThread(ts);
    return 0;
}

static void EmbeddingCache_dealloc(EmbeddingCache *self)
{
    kvt_close(self->e); /* no Embedding is left: each holds a reference to the cache */
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *EmbeddingCache_close(EmbeddingCache *self, PyObject *unused)
{
    (void)unused;
    if (cache_close(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *EmbeddingCache_enter(EmbeddingCache *self, PyObject *unused)
{
    (void)unused;
    if (!self->e)
        return closed();
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *EmbeddingCache_exit(EmbeddingCache *self, PyObject *args)
{
    (void)args;
    if (cache_close(self) < 0)
        return NULL;
    Py_RETURN_FALSE;
}

/* ---- put, lookup, drop, stats ---- */

static PyObject *EmbeddingCache_put(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"hash", "data", "ns", NULL};
    PyObject *hash, *data, *ns = NULL;
    Py_buffer hv, nv, dv;
    struct kvt_emb_key k;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O", kw, &hash, &data, &ns) ||
        key_from(hash, ns, &hv, &nv, &k) < 0)
        return NULL;
    if (PyObject_GetBuffer(data, &dv, PyBUF_C_CONTIGUOUS) < 0) {
        key_release(&hv, &nv);
        return NULL;
    }
    if (dv.len == 0) {
        PyErr_SetString(PyExc_ValueError, "data is empty");
        rc = 1;
    } else {
        ENGINE_CALL(self, rc, kvt_emb_put(self->e, &k, dv.buf, (size_t)dv.len, NULL));
    }
    PyBuffer_Release(&dv);
    key_release(&hv, &nv);
    if (rc == 1)
        return NULL;
    if (rc == -ENOMEM || rc == -E2BIG || rc == -EBUSY)
        Py_RETURN_FALSE; /* not cached by this call (SGLang's set answers False) */
    return rc ? fail(rc) : Py_NewRef(Py_True);
}

static PyObject *EmbeddingCache_lookup(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"hash", "ns", NULL};
    PyObject *hash, *ns = NULL;
    Py_buffer hv, nv;
    struct kvt_emb_key k;
    uint32_t tier = 0;
    size_t len = 0;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kw, &hash, &ns) ||
        key_from(hash, ns, &hv, &nv, &k) < 0)
        return NULL;
    ENGINE_CALL(self, rc, kvt_emb_lookup(self->e, &k, &tier, &len));
    key_release(&hv, &nv);
    if (rc == -ENOENT)
        Py_RETURN_NONE;
    return rc ? fail(rc) : Py_BuildValue("(sn)", tier_names[tier & 3], (Py_ssize_t)len);
}

static PyObject *EmbeddingCache_drop(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"hash", "ns", NULL};
    PyObject *hash, *ns = NULL;
    Py_buffer hv, nv;
    struct kvt_emb_key k;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kw, &hash, &ns) ||
        key_from(hash, ns, &hv, &nv, &k) < 0)
        return NULL;
    ENGINE_CALL(self, rc, kvt_emb_drop(self->e, &k));
    key_release(&hv, &nv);
    if (rc == -ENOENT || rc == -EBUSY)
        return Py_NewRef(Py_False);
    return rc ? fail(rc) : Py_NewRef(Py_True);
}

static int put_u64(PyObject *d, const char *name, uint64_t v)
{
    PyObject *num = PyLong_FromUnsignedLongLong(v);
    int rc = num ? PyDict_SetItemString(d, name, num) : -1;

    Py_XDECREF(num);
    return rc;
}

static PyObject *stats_dict(const struct kvt_emb_stats *st)
{
    PyObject *d = PyDict_New();
    const struct {
        const char *name;
        uint64_t v;
    } f[] = {{"device_bytes", st->device_bytes},
             {"device_used", st->device_used},
             {"device_embeddings", st->device_embeddings},
             {"held", st->held},
             {"host_bytes", st->host_bytes},
             {"host_used", st->host_used},
             {"host_embeddings", st->host_embeddings},
             {"puts", st->puts},
             {"put_bytes", st->put_bytes},
             {"put_present", st->put_present},
             {"refused", st->refused},
             {"fetches", st->fetches},
             {"hits_device", st->hits[0]},
             {"hits_host", st->hits[1]},
             {"hits_disk", st->hits[2]},
             {"hits_remote", st->hits[3]},
             {"misses", st->misses},
             {"read_errors", st->read_errors},
             {"evicted_device", st->evicted_device},
             {"evicted_host", st->evicted_host},
             {"stored", st->stored},
             {"store_errors", st->store_errors},
             {"ops_in_flight", st->ops_in_flight}};

    for (size_t i = 0; d && i < sizeof(f) / sizeof(f[0]); i++)
        if (put_u64(d, f[i].name, f[i].v) < 0)
            Py_CLEAR(d);
    return d;
}

static PyObject *EmbeddingCache_stats(EmbeddingCache *self, PyObject *unused)
{
    struct kvt_emb_stats st = {.size = sizeof(st)};
    int rc;

    (void)unused;
    ENGINE_CALL(self, rc, kvt_emb_stats(self->e, &st));
    return rc ? fail(rc) : stats_dict(&st);
}

/* ---- fetch, get ---- */

/* Fetch and wait: 0 with emb held and landed, a miss (-ENOENT, KVT_ECORRUPT, -EIO: nothing
 * held), or another error. */
static int fetch_landed(EmbeddingCache *self, const struct kvt_emb_key *k, struct kvt_emb *emb)
{
    int rc = kvt_emb_fetch(self->e, k, emb);

    return rc ? rc : kvt_emb_wait(self->e, emb, -1);
}

static int miss(int rc)
{
    return rc == -ENOENT || rc == KVT_ECORRUPT || rc == -EIO;
}

static PyObject *new_embedding(EmbeddingCache *self, const struct kvt_emb *h)
{
    Embedding *m = PyObject_New(Embedding, &Embedding_type);

    if (!m)
        return NULL;
    m->cache = (EmbeddingCache *)Py_NewRef((PyObject *)self);
    m->h = *h;
    m->exports = 0;
    return (PyObject *)m;
}

static PyObject *EmbeddingCache_fetch(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"hash", "ns", NULL};
    PyObject *hash, *ns = NULL, *out;
    Py_buffer hv, nv;
    struct kvt_emb_key k;
    struct kvt_emb h;
    int rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kw, &hash, &ns) ||
        key_from(hash, ns, &hv, &nv, &k) < 0)
        return NULL;
    ENGINE_CALL(self, rc, kvt_emb_fetch(self->e, &k, &h));
    key_release(&hv, &nv);
    if (rc == -ENOENT || rc == -ENOMEM)
        Py_RETURN_NONE;
    if (rc)
        return fail(rc);
    if (!(out = new_embedding(self, &h)))
        ENGINE_CALL(self, rc, kvt_emb_release(self->e, &h));
    return out;
}

/* Copy a held embedding to dst (NULL: no copy), then let go of it: the first failure. */
static int read_release(kvt_engine *e, struct kvt_emb *h, void *dst)
{
    int rc = dst ? kvt_emb_read(e, h, 0, dst, h->len) : 0, rel = kvt_emb_release(e, h);

    return rc ? rc : rel;
}

/* get and get_into: the embedding's bytes copied out, into a new bytes object or into out. */
static PyObject *get_common(EmbeddingCache *self, PyObject *hash, PyObject *ns, PyObject *into)
{
    Py_buffer hv, nv, ov = {0};
    struct kvt_emb_key k;
    struct kvt_emb h;
    PyObject *res = NULL;
    char *dst;
    int rc;

    if (into && PyObject_GetBuffer(into, &ov, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (key_from(hash, ns, &hv, &nv, &k) < 0)
        goto out;
    ENGINE_CALL(self, rc, fetch_landed(self, &k, &h));
    key_release(&hv, &nv);
    if (miss(rc) || rc == -ENOMEM) {
        res = Py_NewRef(Py_None);
        goto out;
    }
    if (rc) {
        fail(rc);
        goto out;
    }
    if (into && (size_t)ov.len < h.len)
        PyErr_Format(PyExc_ValueError, "out is %zd bytes; the embedding is %zu", ov.len, h.len);
    else if (!into)
        res = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)h.len); /* NULL: MemoryError set */
    dst = PyErr_Occurred() ? NULL : into ? ov.buf : PyBytes_AS_STRING(res);
    ENGINE_CALL(self, rc, read_release(self->e, &h, dst));
    if (!PyErr_Occurred() && rc)
        fail(rc);
    if (PyErr_Occurred())
        Py_CLEAR(res);
    else if (into)
        res = PyLong_FromSize_t(h.len);
out:
    if (into)
        PyBuffer_Release(&ov);
    return res;
}

static PyObject *EmbeddingCache_get(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"hash", "ns", NULL};
    PyObject *hash, *ns = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kw, &hash, &ns))
        return NULL;
    return get_common(self, hash, ns, NULL);
}

static PyObject *EmbeddingCache_get_into(EmbeddingCache *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"hash", "out", "ns", NULL};
    PyObject *hash, *out, *ns = NULL;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O", kw, &hash, &out, &ns))
        return NULL;
    return get_common(self, hash, ns, out);
}

static PyObject *EmbeddingCache_get_closed(EmbeddingCache *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->e == NULL);
}

static PyObject *EmbeddingCache_get_u64(EmbeddingCache *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(*(uint64_t *)((char *)self + (size_t)closure));
}

static PyMethodDef EmbeddingCache_methods[] = {
    {"put", (PyCFunction)(void (*)(void))EmbeddingCache_put, METH_VARARGS | METH_KEYWORDS,
     "put(hash, data, ns=b'') -> bool: cache data's bytes as the embedding of the item of\n"
     "32-byte hash; False when it was not cached (larger than device_bytes, no room beside\n"
     "held ones, or being read from below)."},
    {"get", (PyCFunction)(void (*)(void))EmbeddingCache_get, METH_VARARGS | METH_KEYWORDS,
     "get(hash, ns=b'') -> bytes | None: the embedding's bytes from the nearest tier holding\n"
     "it (waiting for a read from disk or remote); None when no tier has it whole."},
    {"get_into", (PyCFunction)(void (*)(void))EmbeddingCache_get_into, METH_VARARGS | METH_KEYWORDS,
     "get_into(hash, out, ns=b'') -> int | None: get into the writable buffer out (at least\n"
     "the embedding's length); its length, or None on a miss."},
    {"fetch", (PyCFunction)(void (*)(void))EmbeddingCache_fetch, METH_VARARGS | METH_KEYWORDS,
     "fetch(hash, ns=b'') -> Embedding | None: hold the embedding on the device (a read from\n"
     "below may still be landing: Embedding.wait); None when no tier has it or the device\n"
     "has no room beside held ones."},
    {"lookup", (PyCFunction)(void (*)(void))EmbeddingCache_lookup, METH_VARARGS | METH_KEYWORDS,
     "lookup(hash, ns=b'') -> (tier, length) | None: where it is, without moving it; length\n"
     "0 when only the disk or remote tier has it."},
    {"drop", (PyCFunction)(void (*)(void))EmbeddingCache_drop, METH_VARARGS | METH_KEYWORDS,
     "drop(hash, ns=b'') -> bool: drop it from the device and host (SGLang's free); False\n"
     "when neither has it or it is held or being read or written."},
    {"stats", (PyCFunction)EmbeddingCache_stats, METH_NOARGS, "stats() -> dict of counters."},
    {"close", (PyCFunction)EmbeddingCache_close, METH_NOARGS,
     "close(): wait for the reads and writes in flight and free everything."},
    {"__enter__", (PyCFunction)EmbeddingCache_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)EmbeddingCache_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef EmbeddingCache_getset[] = {
    {"closed", (getter)EmbeddingCache_get_closed, NULL, "whether close was called", NULL},
    {"device_bytes", (getter)EmbeddingCache_get_u64, NULL, "the device budget",
     (void *)offsetof(EmbeddingCache, device_bytes)},
    {"host_bytes", (getter)EmbeddingCache_get_u64, NULL, "the host budget",
     (void *)offsetof(EmbeddingCache, host_bytes)},
    {"chunk_bytes", (getter)EmbeddingCache_get_u64, NULL, "bytes of a chunk below",
     (void *)offsetof(EmbeddingCache, chunk_bytes)},
    {NULL, NULL, NULL, NULL, NULL},
};

PyDoc_STRVAR(EmbeddingCache_doc,
             "EmbeddingCache(device_bytes, *, host_bytes=0, dir=None, disk_bytes=1<<30,\n"
             "               remote=None, chunk_bytes=262144, model_id='', store=True)\n\n"
             "Multimodal embeddings (vision-encoder outputs) by 32-byte item hash: device_bytes\n"
             "of device memory, least recently used out first; host_bytes of host memory below\n"
             "it; a data dir (kept across restarts, every read checked) and a Redis server\n"
             "(redis://HOST:PORT, shared between engines) below that, in chunks of chunk_bytes\n"
             "(store=False keeps them out). model_id names what made the embeddings (the\n"
             "encoder and its weights): a dir or server holding another's is not read.");

static PyTypeObject EmbeddingCache_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtier.EmbeddingCache",
    .tp_basicsize = sizeof(EmbeddingCache),
    .tp_dealloc = (destructor)EmbeddingCache_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = EmbeddingCache_doc,
    .tp_methods = EmbeddingCache_methods,
    .tp_getset = EmbeddingCache_getset,
    .tp_init = (initproc)EmbeddingCache_init,
    .tp_new = EmbeddingCache_new,
};

/* ---- a held embedding ---- */

static int not_held(void)
{
    PyErr_SetString(PyExc_ValueError, "the Embedding was released");
    return -1;
}

static int embedding_release(Embedding *m)
{
    int rc;

    if (!m->h.handle)
        return 0;
    if (m->exports) {
        PyErr_SetString(PyExc_BufferError, "views of the Embedding still exist");
        return -1;
    }
    ENGINE_CALL(m->cache, rc, kvt_emb_release(m->cache->e, &m->h));
    m->h.handle = 0;
    return rc && rc != -ESHUTDOWN ? (fail(rc), -1) : 0;
}

static void Embedding_dealloc(Embedding *m)
{
    if (m->h.handle && m->cache->e) {
        int rc;
        ENGINE_CALL(m->cache, rc, kvt_emb_release(m->cache->e, &m->h));
        (void)rc;
    }
    Py_XDECREF(m->cache);
    PyObject_Free(m);
}

static PyObject *Embedding_wait(Embedding *m, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"timeout_ms", NULL};
    int timeout = -1, rc;

    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|i", kw, &timeout))
        return NULL;
    if (!m->h.handle)
        return not_held(), NULL;
    ENGINE_CALL(m->cache, rc, kvt_emb_wait(m->cache->e, &m->h, timeout));
    if (rc == -ETIMEDOUT) {
        PyErr_SetString(PyExc_TimeoutError, "the embedding's read has not landed yet");
        return NULL;
    }
    if (miss(rc) || rc == KVT_EBACKEND) {
        m->h.handle = 0; /* a miss lets go of the hold */
        Py_RETURN_FALSE;
    }
    return rc ? fail(rc) : Py_NewRef(Py_True);
}

static PyObject *Embedding_release(Embedding *m, PyObject *unused)
{
    (void)unused;
    if (embedding_release(m) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Embedding_enter(Embedding *m, PyObject *unused)
{
    (void)unused;
    return Py_NewRef((PyObject *)m);
}

static PyObject *Embedding_exit(Embedding *m, PyObject *args)
{
    (void)args;
    if (embedding_release(m) < 0)
        return NULL;
    Py_RETURN_FALSE;
}

static PyObject *Embedding_read_into(Embedding *m, PyObject *out)
{
    Py_buffer ov;
    int rc;

    if (!m->h.handle)
        return not_held(), NULL;
    if (PyObject_GetBuffer(out, &ov, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (m->h.op || (size_t)ov.len < m->h.len) {
        PyBuffer_Release(&ov);
        PyErr_SetString(PyExc_ValueError, m->h.op ? "the read has not landed: wait() first"
                                                  : "out is shorter than the embedding");
        return NULL;
    }
    ENGINE_CALL(m->cache, rc, kvt_emb_read(m->cache->e, &m->h, 0, ov.buf, m->h.len));
    PyBuffer_Release(&ov);
    return rc ? fail(rc) : PyLong_FromSize_t(m->h.len);
}

/* The device bytes themselves (sim: host memory), read-only, while held and landed. */
static int Embedding_getbuffer(Embedding *m, Py_buffer *view, int flags)
{
    if (!m->h.handle)
        return not_held();
    if (m->h.op) {
        PyErr_SetString(PyExc_BufferError, "the read has not landed: wait() first");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)m, m->h.ptr, (Py_ssize_t)m->h.len, 1, flags) < 0)
        return -1;
    m->exports++;
    m->cache->exports++;
    return 0;
}

static void Embedding_releasebuffer(Embedding *m, Py_buffer *view)
{
    (void)view;
    m->exports--;
    m->cache->exports--;
}

static PyObject *Embedding_get(Embedding *m, void *closure)
{
    switch ((intptr_t)closure) {
    case 0:
        return PyLong_FromSize_t(m->h.handle ? m->h.len : 0);
    case 1:
        return PyLong_FromVoidPtr(m->h.handle ? m->h.ptr : NULL);
    case 2:
        return PyUnicode_FromString(tier_names[m->h.tier & 3]);
    case 3:
        return PyBool_FromLong(m->h.handle && !m->h.op);
    default:
        return PyBool_FromLong(m->h.handle != 0);
    }
}

static PyBufferProcs Embedding_as_buffer = {
    .bf_getbuffer = (getbufferproc)Embedding_getbuffer,
    .bf_releasebuffer = (releasebufferproc)Embedding_releasebuffer,
};

static PyMethodDef Embedding_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Embedding_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout_ms=-1) -> bool: True once on the device; False on a miss (the read found it\n"
     "damaged or incomplete: the hold is gone); TimeoutError when not landed in time."},
    {"read_into", (PyCFunction)Embedding_read_into, METH_O,
     "read_into(out) -> int: copy its bytes into the writable buffer out."},
    {"release", (PyCFunction)Embedding_release, METH_NOARGS,
     "release(): let go of the hold (BufferError while a view of it lives)."},
    {"__enter__", (PyCFunction)Embedding_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Embedding_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Embedding_getset[] = {
    {"nbytes", (getter)Embedding_get, NULL, "its length (0 until landed)", (void *)0},
    {"ptr", (getter)Embedding_get, NULL, "its device address (0 until landed)", (void *)1},
    {"tier", (getter)Embedding_get, NULL, "where it was found", (void *)2},
    {"ready", (getter)Embedding_get, NULL, "held and landed", (void *)3},
    {"held", (getter)Embedding_get, NULL, "not released", (void *)4},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Embedding_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvtier.Embedding",
    .tp_basicsize = sizeof(Embedding),
    .tp_dealloc = (destructor)Embedding_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A held embedding (EmbeddingCache.fetch): never evicted until released; its\n"
              "bytes through the buffer protocol (read-only, no copy) once landed.",
    .tp_methods = Embedding_methods,
    .tp_getset = Embedding_getset,
    .tp_as_buffer = &Embedding_as_buffer,
};

int kvt_py_emb_add(PyObject *module, PyObject *error)
{
    error_type = error;
    if (PyType_Ready(&EmbeddingCache_type) < 0 || PyType_Ready(&Embedding_type) < 0 ||
        PyModule_AddObjectRef(module, "EmbeddingCache", (PyObject *)&EmbeddingCache_type) < 0 ||
        PyModule_AddObjectRef(module, "Embedding", (PyObject *)&Embedding_type) < 0)
        return -1;
    return 0;
}
