/*
 * The in-memory store (mem.h), written to be read: a new backend starts from a copy of it
 * (docs/tiers.md). Its parts are the parts every backend has:
 *   - the table: key -> page, here open addressing over a fixed array of entries;
 *   - eviction: least recently used first, here a list through the entries;
 *   - integrity: a checksum taken when a page is stored and checked when it is read, so a
 *     damaged page is a miss and is dropped, never served;
 *   - ops: every op completes as it is submitted and waits in the done queue for poll.
 * A lock makes stats safe from any thread; the rest is the owner's.
 */
#include "store/mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kvtier.h"

#define NONE UINT32_MAX

struct mem_page {
    uint8_t key[STORE_KEY_BYTES];
    uint64_t sum;        /* XXH3-64 of the bytes as stored */
    uint32_t prev, next; /* the LRU list: head most recent */
    bool used;
};

struct mem_store {
    struct kvt_store base;
    struct store_mem_options o;
    pthread_mutex_t lock;
    struct mem_page *pages; /* capacity_pages entries */
    uint8_t *bytes;         /* capacity_pages pages */
    uint32_t *table;        /* key -> entry, NONE for empty; table_size buckets */
    uint64_t table_size;
    uint32_t *free;
    uint64_t nfree;
    uint32_t head, tail;
    struct store_done *done; /* completed ops not yet collected, oldest first */
    size_t ndone, done_cap;
    uint64_t last_op;
    struct store_stats st;
};

static struct mem_store *ms(struct kvt_store *s)
{
    return (struct mem_store *)s;
}

/* ---- the table ---- */

static uint64_t bucket(const struct mem_store *m, const uint8_t *key)
{
    uint64_t h;

    memcpy(&h, key, sizeof(h)); /* page keys are hashes already */
    return (h * 0x9e3779b97f4a7c15ull) & (m->table_size - 1);
}

/* The bucket holding key, or the empty one where it would go. */
static uint64_t slot_of(const struct mem_store *m, const uint8_t *key)
{
    uint64_t b = bucket(m, key);

    while (m->table[b] != NONE && memcmp(m->pages[m->table[b]].key, key, STORE_KEY_BYTES))
        b = (b + 1) & (m->table_size - 1);
    return b;
}

static uint32_t find(const struct mem_store *m, const uint8_t *key)
{
    return m->table[slot_of(m, key)];
}

/* Take the entry out of the table, moving back the entries after it that may. */
static void unindex(struct mem_store *m, uint32_t e)
{
    uint64_t mask = m->table_size - 1, hole = slot_of(m, m->pages[e].key);

    for (uint64_t n = (hole + 1) & mask; m->table[n] != NONE; n = (n + 1) & mask) {
        uint64_t home = bucket(m, m->pages[m->table[n]].key);

        if (((n - home) & mask) >= ((n - hole) & mask)) {
            m->table[hole] = m->table[n];
            hole = n;
        }
    }
    m->table[hole] = NONE;
}

/* ---- the LRU list ---- */

static void unlink_lru(struct mem_store *m, uint32_t e)
{
    struct mem_page *p = &m->pages[e];

    *(p->prev != NONE ? &m->pages[p->prev].next : &m->head) = p->next;
    *(p->next != NONE ? &m->pages[p->next].prev : &m->tail) = p->prev;
}

static void push_lru(struct mem_store *m, uint32_t e)
{
    struct mem_page *p = &m->pages[e];

    p->prev = NONE;
    p->next = m->head;
    *(m->head != NONE ? &m->pages[m->head].prev : &m->tail) = e;
    m->head = e;
}

static void drop(struct mem_store *m, uint32_t e)
{
    unindex(m, e);
    unlink_lru(m, e);
    m->pages[e].used = false;
    m->free[m->nfree++] = e;
    m->st.pages--;
}

/* ---- pages ---- */

static uint8_t *bytes_of(const struct mem_store *m, uint32_t e)
{
    return m->bytes + (size_t)e * m->o.page_bytes;
}

/* An injected failure counts as an error, as the I/O error it stands for would. */
static int fault(struct mem_store *m, enum store_op_kind kind, const uint8_t *key)
{
    const struct store_mem_faults *f = m->o.faults;
    int rc = f && f->inject ? f->inject(f->arg, kind, key) : 0;

    m->st.errors += rc != 0;
    return rc;
}

/* Whether a page's bytes are there: a buffer, or whole parts (store.h). */
static bool bytes_given(const struct mem_store *m, const void *buf, const void *const *parts,
                        uint32_t n)
{
    if (!n)
        return buf != NULL;
    if (n > STORE_MAX_PARTS || m->o.page_bytes % n || !parts)
        return false;
    for (uint32_t i = 0; i < n; i++)
        if (!parts[i])
            return false;
    return true;
}

/* A page given in parts, into (out of) the store's copy at to. */
static void gather(const struct mem_store *m, const struct store_wpage *w, uint8_t *to)
{
    size_t part = m->o.page_bytes / (w->nparts ? w->nparts : 1);

    if (!w->nparts)
        memcpy(to, w->buf, m->o.page_bytes);
    for (uint32_t i = 0; i < w->nparts; i++)
        memcpy(to + i * part, w->parts[i], part);
}

static void scatter(const struct mem_store *m, const struct store_rpage *r, const uint8_t *from)
{
    size_t part = m->o.page_bytes / (r->nparts ? r->nparts : 1);

    if (!r->nparts)
        memcpy(r->buf, from, m->o.page_bytes);
    for (uint32_t i = 0; i < r->nparts; i++)
        memcpy(r->parts[i], from + i * part, part);
}

static int put_page(struct mem_store *m, const struct store_wpage *w)
{
    uint32_t e;
    int rc = w->key && bytes_given(m, w->buf, w->parts, w->nparts)
                 ? fault(m, STORE_OP_WRITE, w->key)
                 : -EINVAL;

    if (rc)
        return rc;
    if ((e = find(m, w->key)) != NONE) { /* stored already: an access */
        unlink_lru(m, e);
        push_lru(m, e);
        return 0;
    }
    if (!m->nfree)
        drop(m, m->tail);
    e = m->free[--m->nfree];
    memcpy(m->pages[e].key, w->key, STORE_KEY_BYTES);
    gather(m, w, bytes_of(m, e));
    m->pages[e].sum = XXH3_64bits(bytes_of(m, e), m->o.page_bytes);
    m->pages[e].used = true;
    m->table[slot_of(m, w->key)] = e;
    push_lru(m, e);
    m->st.pages++;
    m->st.bytes_written += m->o.page_bytes;
    return 0;
}

static int get_page(struct mem_store *m, const struct store_rpage *r)
{
    uint32_t e;
    int rc = r->key && bytes_given(m, r->buf, (const void *const *)r->parts, r->nparts)
                 ? fault(m, STORE_OP_READ, r->key)
                 : -EINVAL;

    if (rc || (e = find(m, r->key)) == NONE)
        return rc ? rc : -ENOENT;
    if (XXH3_64bits(bytes_of(m, e), m->o.page_bytes) != m->pages[e].sum) {
        drop(m, e); /* damaged: a miss, never served */
        m->st.errors++;
        return KVT_ECORRUPT;
    }
    scatter(m, r, bytes_of(m, e));
    unlink_lru(m, e);
    push_lru(m, e);
    m->st.bytes_read += m->o.page_bytes;
    return 0;
}

/* ---- ops ---- */

static int finish_op(struct mem_store *m, uint32_t kind, const int *results, size_t n, uint64_t *op)
{
    struct store_done d = {.op = ++m->last_op, .kind = kind, .pages = (uint32_t)n};

    if (m->ndone == m->done_cap) {
        size_t cap = m->done_cap ? 2 * m->done_cap : 16;
        struct store_done *v = realloc(m->done, cap * sizeof(*v));

        if (!v)
            return -ENOMEM;
        m->done = v;
        m->done_cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        d.ok += results[i] == 0;
    m->done[m->ndone++] = d;
    *op = d.op;
    return 0;
}

static int mem_write(struct kvt_store *s, const struct store_wpage *pages, size_t n, int *results,
                     uint64_t *op)
{
    struct mem_store *m = ms(s);
    int rc;

    if (!op || (n && (!pages || !results)))
        return -EINVAL;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < n; i++)
        results[i] = put_page(m, &pages[i]);
    rc = finish_op(m, STORE_OP_WRITE, results, n, op);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

static int mem_read(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                    uint64_t *op, size_t *leading)
{
    struct mem_store *m = ms(s);
    size_t lead = 0;
    int rc;

    if (!op || (n && (!pages || !results)))
        return -EINVAL;
    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < n; i++) {
        results[i] = get_page(m, &pages[i]);
        lead += lead == i && !results[i];
    }
    rc = finish_op(m, STORE_OP_READ, results, n, op);
    pthread_mutex_unlock(&m->lock);
    if (leading)
        *leading = lead;
    return rc;
}

static int mem_leading_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    struct mem_store *m = ms(s);

    if (!run || (n && !keys))
        return -EINVAL;
    pthread_mutex_lock(&m->lock);
    for (*run = 0; *run < n && find(m, keys + *run * STORE_KEY_BYTES) != NONE; ++*run)
        ;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

static size_t mem_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    struct mem_store *m = ms(s);
    size_t n;

    pthread_mutex_lock(&m->lock);
    n = m->ndone < max ? m->ndone : max;
    if (n) { /* m->done is NULL until the first op */
        memcpy(done, m->done, n * sizeof(*done));
        memmove(m->done, m->done + n, (m->ndone - n) * sizeof(*done));
        m->ndone -= n;
    }
    pthread_mutex_unlock(&m->lock);
    return n;
}

static int mem_wait_for(struct kvt_store *s, uint64_t op, int timeout_ms, struct store_done *done)
{
    struct mem_store *m = ms(s);
    int rc = -ENOENT;

    (void)timeout_ms; /* every op is done as it is submitted */
    pthread_mutex_lock(&m->lock);
    if (op == 0 || op > m->last_op)
        rc = -EINVAL;
    for (size_t i = 0; rc == -ENOENT && i < m->ndone; i++) {
        if (m->done[i].op != op)
            continue;
        if (done)
            *done = m->done[i];
        memmove(m->done + i, m->done + i + 1, (m->ndone - i - 1) * sizeof(*m->done));
        m->ndone--;
        rc = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

static int mem_drain(struct kvt_store *s)
{
    (void)s; /* nothing happens in the background */
    return 0;
}

static void mem_stats(struct kvt_store *s, struct store_stats *st)
{
    struct mem_store *m = ms(s);

    pthread_mutex_lock(&m->lock);
    *st = m->st;
    st->capacity_pages = m->o.capacity_pages;
    st->in_flight = m->ndone;
    pthread_mutex_unlock(&m->lock);
}

static void mem_close(struct kvt_store *s)
{
    struct mem_store *m = ms(s);

    pthread_mutex_destroy(&m->lock);
    free(m->pages);
    free(m->bytes);
    free(m->table);
    free(m->free);
    free(m->done);
    free(m);
}

static const struct store_ops mem_ops = {
    .name = "mem",
    .parts = true,
    .leading_run = mem_leading_run,
    .read = mem_read,
    .write = mem_write,
    .poll = mem_poll,
    .wait_for = mem_wait_for,
    .drain = mem_drain,
    .stats = mem_stats,
    .close = mem_close,
};

int store_mem_damage(struct kvt_store *s, const uint8_t *key)
{
    struct mem_store *m = ms(s);
    uint32_t e;

    if (s->ops != &mem_ops)
        return -EINVAL;
    pthread_mutex_lock(&m->lock);
    e = find(m, key);
    if (e != NONE)
        bytes_of(m, e)[0] ^= 0x5a;
    pthread_mutex_unlock(&m->lock);
    return e == NONE ? -ENOENT : 0;
}

static int alloc_table(struct mem_store *m)
{
    uint64_t n = m->o.capacity_pages;

    for (m->table_size = 2; m->table_size < 2 * n; m->table_size <<= 1)
        ;
    m->pages = calloc(n, sizeof(*m->pages));
    m->bytes = malloc(n * m->o.page_bytes);
    m->table = malloc(m->table_size * sizeof(*m->table));
    m->free = malloc(n * sizeof(*m->free));
    if (!m->pages || !m->bytes || !m->table || !m->free)
        return -ENOMEM;
    memset(m->table, 0xff, m->table_size * sizeof(*m->table));
    for (uint64_t i = 0; i < n; i++)
        m->free[i] = (uint32_t)(n - 1 - i);
    m->nfree = n;
    m->head = m->tail = NONE;
    return 0;
}

int store_mem_open(const struct store_mem_options *o, struct kvt_store **out)
{
    struct mem_store *m;
    int rc;

    if (!o || !out || !o->page_bytes || !o->capacity_pages || o->capacity_pages >= NONE)
        return -EINVAL;
    if (!(m = calloc(1, sizeof(*m))))
        return -ENOMEM;
    m->base = (struct kvt_store){&mem_ops, o->page_bytes, o->page_tokens};
    m->o = *o;
    pthread_mutex_init(&m->lock, NULL);
    if ((rc = alloc_table(m))) {
        mem_close(&m->base);
        return rc;
    }
    *out = &m->base;
    return 0;
}
