/*
 * The embedding cache's store below (emb_int.h): records of chunks (format.h) written from
 * the host copy (or a staged record when there is none) and read into a new host copy (or a
 * stage), checked whole, then copied onto the device extent the fetch took. Ops complete in
 * any order; emb_below_poll applies what has finished, emb_below_wait one op.
 */
#include "emb/emb_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- keys ---- */

static int scratch(struct emb_cache *c, size_t n)
{
    if (n <= c->keys_cap)
        return 0;
    uint8_t(*k)[32] = realloc(c->keys, n * sizeof(*k));
    if (!k)
        return -ENOMEM;
    c->keys = k;
    struct store_wpage *w = realloc(c->wpages, n * sizeof(*w));
    if (!w)
        return -ENOMEM;
    c->wpages = w;
    c->keys_cap = n;
    return 0;
}

/* Keys of chunks [from, to) of digest's record into c->keys. */
static int chunk_keys(struct emb_cache *c, const uint8_t *digest, size_t from, size_t to)
{
    int rc = scratch(c, to);

    for (size_t i = from; rc == 0 && i < to; i++)
        rc = emb_chunk_key(&c->hasher, digest, (uint32_t)i, c->keys[i]);
    return rc;
}

/* The chunks of the largest record the device budget holds. */
static size_t max_chunks(const struct emb_cache *c)
{
    return (size_t)emb_chunks(c->dev_arena.bytes, c->chunk);
}

size_t emb_below_run(struct emb_cache *c, const uint8_t *digest, bool *remote)
{
    size_t total = 0, want = 0, max, run, steps = 0;

    *remote = false;
    if (!c->store)
        return 0;
    max = max_chunks(c);
    /* Doubling: a record's chunk count is in its head, which has not been read. */
    for (size_t k = 4; total == want && want < max; k *= 2, steps++) {
        size_t to = k < max ? k : max;
        if (chunk_keys(c, digest, want, to) ||
            store_leading_run(c->store, c->keys[want], to - want, &run))
            return 0;
        want = to;
        total += run;
    }
    /* Which kind of store holds it, from a leading run over the whole record. */
    if (total && steps > 1 && store_leading_run(c->store, c->keys[0], total, &run))
        return 0;
    *remote = total && store_run_remote(c->store, total) > 0;
    return total;
}

/* ---- ops ---- */

static struct emb_op *op_new(struct emb_cache *c, uint32_t kind, size_t n)
{
    if (c->nops == c->ops_cap) {
        size_t ncap = c->ops_cap ? c->ops_cap * 2 : 16;
        struct emb_op *v = realloc(c->ops, ncap * sizeof(*v));
        if (!v)
            return NULL;
        c->ops = v;
        c->ops_cap = ncap;
    }
    struct emb_op *op = &c->ops[c->nops];
    *op = (struct emb_op){.kind = kind, .entry = EMB_NONE, .n = n};
    if (!(op->results = malloc(n * sizeof(int))))
        return NULL;
    return op;
}

static void op_free(struct emb_op *op)
{
    free(op->results);
    free(op->stage);
    free(op->rkeys);
    free(op->rpages);
}

/* An op made by op_new and submitted: it counts. */
static void op_commit(struct emb_cache *c, struct emb_op *op)
{
    op->id = ++c->last_op;
    c->nops++;
    c->count.ops_in_flight++;
}

static void op_forget(struct emb_cache *c, struct emb_op *op)
{
    op_free(op);
    *op = c->ops[--c->nops];
    c->count.ops_in_flight--;
}

static uint8_t *stage_new(size_t bytes)
{
    void *p = NULL;

    return posix_memalign(&p, EMB_HOST_UNIT, bytes) ? NULL : p;
}

/* ---- writes ---- */

static bool stored_whole(struct emb_cache *c, size_t n)
{
    size_t run = 0;

    return store_leading_run(c->store, c->keys[0], n, &run) == 0 && run == n;
}

void emb_below_write(struct emb_cache *c, uint32_t i, const void *payload)
{
    struct emb_entry *x = &c->e[i];
    size_t n = c->store ? (size_t)emb_chunks(x->len, c->chunk) : 0;
    struct emb_op *op;

    if (!n || chunk_keys(c, x->digest, 0, n) || stored_whole(c, n) ||
        !(op = op_new(c, STORE_OP_WRITE, n)))
        return;
    if (x->on_host) {
        op->buf = c->host + x->host_off; /* the record is there already */
        op->entry = i;
    } else if ((op->buf = op->stage = stage_new(n * c->chunk)) != NULL) {
        emb_record_write(op->buf, n * c->chunk, x->item, x->nsd, payload, x->len);
    }
    for (size_t k = 0; op->buf && k < n; k++)
        c->wpages[k] = (struct store_wpage){.key = c->keys[k],
                                            .parent = k ? c->keys[k - 1] : c->root,
                                            .ns = c->root,
                                            .buf = op->buf + k * c->chunk};
    if (!op->buf || store_write(c->store, c->wpages, n, op->results, &op->store_op)) {
        c->count.store_errors++;
        op_free(op);
        return;
    }
    if (op->entry != EMB_NONE)
        x->pins++;
    op_commit(c, op);
}

/* ---- reads ---- */

int emb_below_read(struct emb_cache *c, uint32_t i, size_t run)
{
    struct emb_entry *x = &c->e[i];
    size_t bytes = run * c->chunk;
    struct emb_op *op = op_new(c, STORE_OP_READ, run);
    int rc = -ENOMEM;

    if (!op || chunk_keys(c, x->digest, 0, run) || !(op->rkeys = malloc(run * 32)) ||
        !(op->rpages = malloc(run * sizeof(*op->rpages))))
        goto fail;
    memcpy(op->rkeys, c->keys, run * 32);
    op->entry = i;
    if (emb_room_host(c, i, bytes) == 0) {
        op->buf = c->host + x->host_off;
        x->pins++;
    } else if (!(op->buf = op->stage = stage_new(bytes))) {
        goto fail;
    }
    for (size_t k = 0; k < run; k++)
        op->rpages[k] =
            (struct store_rpage){.key = op->rkeys + 32 * k, .buf = op->buf + k * c->chunk};
    if ((rc = store_read(c->store, op->rpages, run, op->results, &op->store_op, NULL)))
        goto fail;
    op_commit(c, op);
    x->fill = op->id;
    return 0;
fail:
    if (op && !op->stage && op->buf) {
        x->pins--;
        emb_room_drop_host(c, i);
    }
    if (op)
        op_free(op);
    return rc;
}

/* A store's miss as the cache says it: a chunk absent, damaged, or anything else. */
static int miss_code(int rc)
{
    return rc == -ENOENT || rc == KVT_ECORRUPT ? rc : -EIO;
}

/* Whether the record read (ok chunks from the first landed) is entry x's whole: 0 with its
 * head, or the miss. x->len is the most its chunks hold. */
static int record_check(const struct emb_cache *c, const struct emb_op *op,
                        const struct emb_entry *x, struct emb_head *h)
{
    size_t ok = 0;

    while (ok < op->n && op->results[ok] == 0)
        ok++;
    if (ok == 0)
        return miss_code(op->results[0]);
    if (emb_head_read(op->buf, h) || memcmp(h->item, x->item, 32) || memcmp(h->nsd, x->nsd, 32) ||
        h->len == 0)
        return KVT_ECORRUPT;
    /* Longer than the chunks found from the first, or than the device budget (an engine
     * with a larger one wrote it): not one this cache can hold whole. */
    if (h->len > x->len)
        return -ENOENT;
    size_t need = (size_t)emb_chunks(h->len, c->chunk);
    if (need > ok)
        return ok < op->n ? miss_code(op->results[ok]) : -ENOENT;
    return emb_payload_ok(h, op->buf + EMB_HEAD_BYTES) ? 0 : KVT_ECORRUPT;
}

/* The read landed whole: the payload onto the device extent, both extents cut to size. */
static int read_landed(struct emb_cache *c, struct emb_op *op, struct emb_entry *x,
                       const struct emb_head *h)
{
    int rc = c->be->to_device(c->dev + x->dev_off, op->buf + EMB_HEAD_BYTES, (size_t)h->len);

    if (rc)
        return rc;
    emb_arena_trim(&c->dev_arena, x->dev_off, x->dev_len, h->len);
    x->dev_len = x->len = h->len;
    if (!op->stage) {
        uint64_t keep = emb_room_record_bytes(c, h->len);
        emb_arena_trim(&c->host_arena, x->host_off, x->host_len, keep);
        x->host_len = keep;
    }
    return 0;
}

/* The read missed: its memory goes, and the entry leaves the table (its holders learn it). */
static void read_missed(struct emb_cache *c, const struct emb_op *op, uint32_t i, int rc)
{
    struct emb_entry *x = &c->e[i];

    if (x->on_dev)
        emb_room_drop_device(c, i); /* filling: the entry stays for emb_table_detach */
    if (!op->stage && x->on_host)
        emb_room_drop_host(c, i);
    emb_table_detach(c, i, rc);
    c->count.misses++;
    if (rc != -ENOENT)
        c->count.read_errors++;
}

static void apply_read(struct emb_cache *c, struct emb_op *op, const struct store_done *d)
{
    struct emb_entry *x = &c->e[op->entry];
    struct emb_head h;
    int rc;

    if (!op->stage)
        x->pins--;
    x->fill = 0;
    if ((rc = record_check(c, op, x, &h)) == 0)
        rc = read_landed(c, op, x, &h);
    if (rc) {
        read_missed(c, op, op->entry, rc);
        return;
    }
    x->state = EMB_LIVE;
    x->tier = (d->split ? d->remote_ok > 0 : c->store->ops->remote) ? KVT_EMB_REMOTE : KVT_EMB_DISK;
    c->count.hits[x->tier]++;
}

static void apply(struct emb_cache *c, struct emb_op *op, const struct store_done *d)
{
    if (op->kind == STORE_OP_READ) {
        apply_read(c, op, d);
    } else {
        if (op->entry != EMB_NONE)
            c->e[op->entry].pins--;
        if (d->ok == op->n)
            c->count.stored++;
        else
            c->count.store_errors++;
    }
    op_forget(c, op);
}

static struct emb_op *by_store_op(struct emb_cache *c, uint64_t id)
{
    for (size_t i = 0; i < c->nops; i++)
        if (c->ops[i].store_op == id)
            return &c->ops[i];
    return NULL;
}

void emb_below_poll(struct emb_cache *c, size_t max)
{
    struct store_done d[16];
    size_t got, total = 0;
    struct emb_op *op;

    while (c->nops && total < max &&
           (got = store_poll(c->store, d, max - total < 16 ? max - total : 16)) > 0) {
        for (size_t i = 0; i < got; i++)
            if ((op = by_store_op(c, d[i].op)) != NULL)
                apply(c, op, &d[i]);
        total += got;
    }
}

/* A wait the store could not answer (it lost the op): its pages failed, never served. */
static void lost(struct emb_cache *c, struct emb_op *op)
{
    struct store_done d = {.op = op->store_op, .kind = op->kind, .pages = (uint32_t)op->n};

    for (size_t k = 0; k < op->n; k++)
        op->results[k] = -EIO;
    apply(c, op, &d);
}

int emb_below_wait(struct emb_cache *c, uint64_t id, int timeout_ms)
{
    struct emb_op *op = NULL;
    struct store_done d;
    int rc;

    for (size_t i = 0; i < c->nops && !op; i++)
        if (c->ops[i].id == id)
            op = &c->ops[i];
    if (!op)
        return 0; /* applied already */
    rc = store_wait_for(c->store, op->store_op, timeout_ms, &d);
    if (rc == -ETIMEDOUT)
        return rc;
    if (rc)
        lost(c, op);
    else
        apply(c, op, &d);
    return 0;
}

void emb_below_sync(struct emb_cache *c)
{
    while (c->nops)
        emb_below_wait(c, c->ops[0].id, -1);
}

void emb_below_finish(struct emb_cache *c)
{
    emb_below_sync(c);
    free(c->ops);
    free(c->keys);
    free(c->wpages);
    c->ops = NULL;
    c->keys = NULL;
    c->wpages = NULL;
}
