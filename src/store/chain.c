/*
 * A chain of stores (chain.h). The chain's ops are made of the stores' ops ("parts"): a read
 * is one part per run of pages found in one store, a write one part per store. A chain op
 * completes when its last part has; the stores' completions are collected by the chain's
 * poll and wait_for and matched to their chain op by (store, op id).
 */
#include "store/chain.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct part {
    uint32_t store;
    uint32_t first, count; /* the op's pages it covers */
    uint64_t op;           /* the store's op id */
    bool done;
};

struct chain_op {
    struct chain_op *next; /* live ops, in submission order */
    uint64_t id;
    uint32_t kind; /* enum store_op_kind */
    uint32_t n;
    int *results;       /* the caller's */
    int *store_results; /* writes: n per store; the caller's results are made from them */
    struct part *parts;
    uint32_t nparts, pending;
};

struct chain_store {
    struct kvt_store base;
    struct store_ops ops; /* chain_ops, parts as its stores allow */
    struct kvt_store *stores[STORE_CHAIN_MAX];
    uint32_t n;
    uint64_t last_id;
    struct chain_op *head, *tail;
    uint8_t *keys; /* a read's keys back to back, for leading_run */
    size_t keys_cap;
    /* The last leading run by store: run_remote's answer. A run alternates stores rarely,
     * so a few segments, grown as needed. */
    struct segment {
        size_t end; /* the run's pages before this one's end */
        bool remote;
    } * segs;
    size_t nsegs, segs_cap;
};

static struct chain_store *cs(struct kvt_store *s)
{
    return (struct chain_store *)s;
}

/* ---- ops ---- */

static struct chain_op *op_new(struct chain_store *c, uint32_t kind, size_t n, uint32_t max_parts,
                               int *results)
{
    struct chain_op *op = calloc(1, sizeof(*op));

    if (!op || !(op->parts = calloc(max_parts ? max_parts : 1, sizeof(*op->parts)))) {
        free(op);
        return NULL;
    }
    if (kind == STORE_OP_WRITE && !(op->store_results = malloc((c->n * n + 1) * sizeof(int)))) {
        free(op->parts);
        free(op);
        return NULL;
    }
    op->kind = kind;
    op->n = (uint32_t)n;
    op->results = results;
    return op;
}

static void op_free(struct chain_op *op)
{
    free(op->parts);
    free(op->store_results);
    free(op);
}

static void op_link(struct chain_store *c, struct chain_op *op)
{
    op->id = ++c->last_id;
    if (c->tail)
        c->tail->next = op;
    else
        c->head = op;
    c->tail = op;
}

static void add_part(struct chain_op *op, uint32_t store, size_t first, size_t count, uint64_t id)
{
    op->parts[op->nparts++] = (struct part){store, (uint32_t)first, (uint32_t)count, id, false};
    op->pending++;
}

/* A part whose store could not say how it ended: its pages failed with rc, never bytes
 * nobody vouched for. */
static void fail_part(struct chain_op *op, const struct part *p, int rc)
{
    int *r = op->kind == STORE_OP_READ ? op->results : op->store_results + (size_t)p->store * op->n;

    for (uint32_t i = p->first; i < p->first + p->count; i++)
        r[i] = rc;
}

/* A write's page result: 0 when any store kept it, else the nearest store's error. */
static void merge_writes(const struct chain_store *c, struct chain_op *op)
{
    for (uint32_t i = 0; i < op->n; i++) {
        op->results[i] = op->store_results[i];
        for (uint32_t k = 1; k < c->n && op->results[i]; k++)
            if (op->store_results[k * op->n + i] == 0)
                op->results[i] = 0;
    }
}

static void part_done(struct chain_store *c, struct chain_op *op, struct part *p)
{
    p->done = true;
    if (--op->pending == 0 && op->kind == STORE_OP_WRITE)
        merge_writes(c, op);
}

/* The live op holding the part (store, id), and the part; NULL when none. */
static struct chain_op *find_part(struct chain_store *c, uint32_t store, uint64_t id,
                                  struct part **part)
{
    for (struct chain_op *op = c->head; op; op = op->next)
        for (uint32_t i = 0; i < op->nparts; i++)
            if (op->parts[i].store == store && op->parts[i].op == id && !op->parts[i].done) {
                *part = &op->parts[i];
                return op;
            }
    return NULL;
}

/* Collect what the stores have completed. */
static void collect_parts(struct chain_store *c)
{
    struct store_done d[16];
    struct part *p;
    size_t got;

    for (uint32_t k = 0; k < c->n; k++)
        do {
            got = store_poll(c->stores[k], d, 16);
            for (size_t i = 0; i < got; i++) {
                struct chain_op *op = find_part(c, k, d[i].op, &p);
                if (op)
                    part_done(c, op, p);
            }
        } while (got == 16);
}

static bool is_remote(const struct chain_store *c, uint32_t k)
{
    return c->stores[k]->ops->remote;
}

/* A read's leading pages read (result 0 from the first on), by the kind of store of the
 * part that read each. Parts are in page order. */
static void split_read(const struct chain_store *c, const struct chain_op *op, struct store_done *d)
{
    uint32_t lead = 0;

    while (lead < op->n && op->results[lead] == 0)
        lead++;
    for (uint32_t i = 0; i < op->nparts; i++) {
        const struct part *p = &op->parts[i];
        uint32_t end = p->first + p->count < lead ? p->first + p->count : lead;
        uint32_t got = end > p->first ? end - p->first : 0;
        *(is_remote(c, p->store) ? &d->remote_ok : &d->near_ok) += got;
    }
}

/* A write's pages kept, by the kind of store that kept each. */
static void split_write(const struct chain_store *c, const struct chain_op *op,
                        struct store_done *d)
{
    for (uint32_t i = 0; i < op->n; i++) {
        bool near = false, remote = false;
        for (uint32_t k = 0; k < c->n; k++)
            if (op->store_results[(size_t)k * op->n + i] == 0)
                *(is_remote(c, k) ? &remote : &near) = true;
        d->near_ok += near;
        d->remote_ok += remote;
    }
}

static void report(const struct chain_store *c, const struct chain_op *op, struct store_done *d)
{
    uint32_t ok = 0;

    for (uint32_t i = 0; i < op->n; i++)
        ok += op->results[i] == 0;
    *d = (struct store_done){op->id, op->kind, op->n, ok, .split = 1};
    if (op->kind == STORE_OP_READ)
        split_read(c, op, d);
    else
        split_write(c, op, d);
}

static void unlink_op(struct chain_store *c, struct chain_op *op, struct chain_op *prev)
{
    if (prev)
        prev->next = op->next;
    else
        c->head = op->next;
    if (c->tail == op)
        c->tail = prev;
}

/* ---- the contract ---- */

/* One more segment of the run being found; false when out of memory (run_remote then
 * knows less of the run: its pages count as near). */
static bool add_segment(struct chain_store *c, size_t end, bool remote)
{
    if (c->nsegs == c->segs_cap) {
        size_t cap = c->segs_cap ? 2 * c->segs_cap : 4;
        struct segment *grown = realloc(c->segs, cap * sizeof(*grown));
        if (!grown)
            return false;
        c->segs = grown;
        c->segs_cap = cap;
    }
    c->segs[c->nsegs++] = (struct segment){end, remote};
    return true;
}

/* From key p on: the longest run each key of which some store holds, nearest first. */
static int chain_leading_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    struct chain_store *c = cs(s);
    size_t p = 0, r;
    bool more = true, room = true;
    int rc;

    c->nsegs = 0;
    while (p < n && more) {
        more = false;
        for (uint32_t k = 0; k < c->n && !more; k++) {
            if ((rc = store_leading_run(c->stores[k], keys + p * STORE_KEY_BYTES, n - p, &r)))
                return rc;
            more = r > 0;
            p += r;
            room = room && (!r || add_segment(c, p, is_remote(c, k)));
        }
    }
    *run = p;
    return 0;
}

static size_t chain_run_remote(struct kvt_store *s, size_t pages)
{
    const struct chain_store *c = cs(s);
    size_t start = 0, remote = 0;

    for (size_t i = 0; i < c->nsegs && start < pages; start = c->segs[i++].end) {
        size_t end = c->segs[i].end < pages ? c->segs[i].end : pages;
        remote += c->segs[i].remote ? end - start : 0;
    }
    return remote;
}

static int keys_reserve(struct chain_store *c, const struct store_rpage *pages, size_t n)
{
    if (n * STORE_KEY_BYTES > c->keys_cap) {
        uint8_t *k = realloc(c->keys, n * STORE_KEY_BYTES);
        if (!k)
            return -ENOMEM;
        c->keys = k;
        c->keys_cap = n * STORE_KEY_BYTES;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(c->keys + i * STORE_KEY_BYTES, pages[i].key, STORE_KEY_BYTES);
    return 0;
}

/* Which store holds the run of pages from p on: *store and *run (0: none does). */
static int find_run(struct chain_store *c, size_t p, size_t n, uint32_t *store, size_t *run)
{
    int rc;

    *run = 0;
    for (uint32_t k = 0; k < c->n; k++) {
        if ((rc = store_leading_run(c->stores[k], c->keys + p * STORE_KEY_BYTES, n - p, run)))
            return rc;
        if (*run) {
            *store = k;
            return 0;
        }
    }
    return 0;
}

static int chain_read(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                      uint64_t *id, size_t *leading)
{
    struct chain_store *c = cs(s);
    struct chain_op *op;
    size_t p = 0, run = 0, lead = 0, got;
    bool open = true; /* every page so far found and on its way */
    uint32_t k = 0;
    uint64_t sub;
    int rc;

    if (n > UINT32_MAX || (rc = keys_reserve(c, pages, n)))
        return n > UINT32_MAX ? -EINVAL : rc;
    if (!(op = op_new(c, STORE_OP_READ, n, (uint32_t)n, results)))
        return -ENOMEM;
    while (p < n && (rc = find_run(c, p, n, &k, &run)) == 0) {
        if (run == 0) { /* no store has page p: a miss, and the leading pages end */
            results[p++] = -ENOENT;
            open = false;
            continue;
        }
        if ((rc = store_read(c->stores[k], pages + p, run, results + p, &sub, &got)))
            break;
        add_part(op, k, p, run, sub);
        lead += open ? got : 0;
        open = open && got == run;
        p += run;
    }
    if (rc && op->nparts == 0) {
        op_free(op);
        return rc;
    }
    for (size_t i = p; i < n; i++)
        results[i] = rc; /* their read could not start */
    op_link(c, op);
    *id = op->id;
    if (leading)
        *leading = lead;
    return 0;
}

static int chain_write(struct kvt_store *s, const struct store_wpage *pages, size_t n, int *results,
                       uint64_t *id)
{
    struct chain_store *c = cs(s);
    struct chain_op *op;
    uint64_t sub;
    int rc = 0;

    if (n > UINT32_MAX)
        return -EINVAL;
    if (!(op = op_new(c, STORE_OP_WRITE, n, c->n, results)))
        return -ENOMEM;
    for (uint32_t k = 0; k < c->n; k++) {
        int *r = op->store_results + (size_t)k * n;
        int krc = store_write(c->stores[k], pages, n, r, &sub);
        if (krc == 0) {
            add_part(op, k, 0, n, sub);
            continue;
        }
        for (size_t i = 0; i < n; i++)
            r[i] = krc;
        rc = rc ? rc : krc;
    }
    if (op->nparts == 0) {
        op_free(op);
        return rc;
    }
    if (op->pending == 0)
        merge_writes(c, op);
    op_link(c, op);
    *id = op->id;
    return 0;
}

static size_t chain_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    struct chain_store *c = cs(s);
    struct chain_op *prev = NULL, *op, *next;
    size_t got = 0;

    collect_parts(c);
    for (op = c->head; op && got < max; op = next) {
        next = op->next;
        if (op->pending) {
            prev = op;
            continue;
        }
        report(c, op, &done[got++]);
        unlink_op(c, op, prev);
        op_free(op);
    }
    return got;
}

/* Milliseconds left until deadline; negative timeouts never run out. */
static int ms_left(int timeout_ms, const struct timespec *start)
{
    struct timespec now;
    int64_t spent;

    if (timeout_ms < 0)
        return -1;
    clock_gettime(CLOCK_MONOTONIC, &now);
    spent = (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
    return spent >= timeout_ms ? 0 : (int)(timeout_ms - spent);
}

static int chain_wait_for(struct kvt_store *s, uint64_t id, int timeout_ms, struct store_done *done)
{
    struct chain_store *c = cs(s);
    struct chain_op *op, *prev = NULL;
    struct store_done d;
    struct timespec start;
    int rc;

    for (op = c->head; op && op->id != id; op = op->next)
        prev = op;
    if (!op)
        return id == 0 || id > c->last_id ? -EINVAL : -ENOENT;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (uint32_t i = 0; i < op->nparts; i++) {
        struct part *p = &op->parts[i];
        if (p->done)
            continue;
        rc = store_wait_for(c->stores[p->store], p->op, ms_left(timeout_ms, &start), &d);
        if (rc == -ETIMEDOUT)
            return rc;
        if (rc && rc != -ENOENT) /* -ENOENT: collected already, its results written */
            fail_part(op, p, rc);
        part_done(c, op, p);
    }
    report(c, op, done);
    unlink_op(c, op, prev);
    op_free(op);
    return 0;
}

static int chain_drain(struct kvt_store *s)
{
    struct chain_store *c = cs(s);
    int rc = 0;

    for (uint32_t k = 0; k < c->n; k++) {
        int krc = store_drain(c->stores[k]);
        rc = rc ? rc : krc;
    }
    return rc;
}

static void chain_stats(struct kvt_store *s, struct store_stats *st)
{
    struct chain_store *c = cs(s);
    struct store_stats k;

    memset(st, 0, sizeof(*st));
    for (uint32_t i = 0; i < c->n; i++) {
        store_stats(c->stores[i], &k);
        /* Writes go to every store: the chain holds what its largest store holds. */
        st->capacity_pages =
            k.capacity_pages > st->capacity_pages ? k.capacity_pages : st->capacity_pages;
        st->pages = k.pages > st->pages ? k.pages : st->pages;
        st->errors += k.errors;
        st->bytes_read += k.bytes_read;
        st->bytes_written += k.bytes_written;
        st->in_flight += k.in_flight; /* the parts of the chain's ops */
        st->too_many += k.too_many;
        st->recovered += k.recovered;
        st->index_rebuilt |= k.index_rebuilt;
        st->io = i == 0 ? k.io : st->io;
        st->remote_errors += k.remote_errors;
    }
}

static void chain_close(struct kvt_store *s)
{
    struct chain_store *c = cs(s);

    for (uint32_t k = 0; k < c->n; k++)
        store_close(c->stores[k]); /* waits for its ops: every part lands */
    while (c->head) {
        struct chain_op *op = c->head;
        c->head = op->next;
        op_free(op);
    }
    free(c->keys);
    free(c->segs);
    free(c);
}

static const struct store_ops chain_ops = {
    .name = "chain",
    /* .parts: set per chain (its ops), when every store of it takes parts */
    .leading_run = chain_leading_run,
    .read = chain_read,
    .write = chain_write,
    .poll = chain_poll,
    .wait_for = chain_wait_for,
    .drain = chain_drain,
    .stats = chain_stats,
    .run_remote = chain_run_remote,
    .close = chain_close,
};

int store_chain_open(struct kvt_store *const *stores, size_t n, struct kvt_store **out)
{
    struct chain_store *c;

    *out = NULL;
    if (n == 0 || n > STORE_CHAIN_MAX)
        return -EINVAL;
    for (size_t k = 0; k < n; k++)
        if (!stores[k] || stores[k]->page_bytes != stores[0]->page_bytes ||
            stores[k]->page_tokens != stores[0]->page_tokens)
            return -EINVAL;
    if (!(c = calloc(1, sizeof(*c))))
        return -ENOMEM;
    c->ops = chain_ops;
    c->ops.parts = true;
    for (size_t k = 0; k < n; k++)
        c->ops.parts = c->ops.parts && stores[k]->ops->parts;
    c->base = (struct kvt_store){&c->ops, stores[0]->page_bytes, stores[0]->page_tokens};
    memcpy(c->stores, stores, n * sizeof(*stores));
    c->n = (uint32_t)n;
    *out = &c->base;
    return 0;
}
