/*
 * The I/O thread: it takes ops oldest first and runs each as pipelined chunks (all of a
 * chunk's commands sent, then all replies read; on a cluster split per master, route.c),
 * answering a waiting leading run between chunks so that one never waits behind a large
 * write. A connection that fails mid-chunk fails the chunk's pages not yet answered by its
 * node, and marks the node down (conn.c). On a cluster a chunk of writes also writes each
 * page's copy, and a read or a leading run asks elsewhere (alt.c) for the pages whose master
 * did not answer or did not have them; a page is stored when either of its two keys took it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvtier.h"
#include "store/redis/redis_int.h"

#define CHUNK_PAGES 64
#define CHUNK_BYTES (16u << 20) /* what one chunk of writes buffers before the server acks */
#define EXISTS_CHUNK 256

_Static_assert(EXISTS_CHUNK <= ITEMS_MAX && 2 * CHUNK_PAGES <= ITEMS_MAX,
               "a chunk (its copies too) is one batch");

/* What a chunk tells the counters, added under the lock once it is done. */
struct tally {
    uint64_t hits, misses, corrupt, failed, sets, dups, bytes, denied;
    uint64_t copy_sets, copy_reads, replica_reads;
};

static void add_tally(struct redis_store *r, enum store_op_kind kind, const struct tally *t)
{
    pthread_mutex_lock(&r->lock);
    r->c.hits += t->hits;
    r->c.misses += t->misses;
    r->c.corrupt += t->corrupt;
    r->c.failed += t->failed;
    r->c.sets += t->sets;
    r->c.set_dups += t->dups;
    r->c.denied += t->denied;
    r->c.copy_sets += t->copy_sets;
    r->c.copy_reads += t->copy_reads;
    r->c.replica_reads += t->replica_reads;
    r->st.errors += t->corrupt + t->failed;
    if (kind == STORE_OP_READ)
        r->st.bytes_read += t->bytes;
    else
        r->st.bytes_written += t->bytes;
    pthread_mutex_unlock(&r->lock);
}

static void hint(struct redis_store *r, const uint8_t *key, bool present)
{
    pthread_mutex_lock(&r->lock);
    redis_hint_set(r, key, present);
    pthread_mutex_unlock(&r->lock);
}

static size_t chunk_pages(const struct redis_store *r, size_t left)
{
    size_t by_bytes = CHUNK_BYTES / (STORE_REDIS_HEAD_BYTES + (size_t)r->base.page_bytes);
    size_t k = by_bytes < CHUNK_PAGES ? by_bytes : CHUNK_PAGES;

    k = k ? k : 1;
    return k < left ? k : left;
}

static int set_result(const struct resp_reply *rep, struct tally *t)
{
    if (rep->type == RESP_STATUS)
        return 0;
    if (rep->type == RESP_NIL) {
        t->dups++;
        return 0;
    }
    /* OOM: the server is at maxmemory with a policy that does not evict. */
    if (rep->type == RESP_ERROR && !strncmp(rep->line, "OOM", 3))
        return -ENOSPC;
    return -EIO;
}

/* A GET's answer: the page landed and checked (route.c, resp.c), or why not. */
static int get_result(struct redis_store *r, const struct redis_item *it, struct tally *t)
{
    if (it->rep.type == RESP_NIL) {
        t->misses++;
        return -ENOENT;
    }
    /* A value that is not a string (WRONGTYPE) is as foreign as a bad header. */
    bool foreign = it->rep.type == RESP_ERROR && !strncmp(it->rep.line, "WRONGTYPE", 9);
    if (it->rep.type != RESP_BULK && !foreign)
        return -EIO;
    if (foreign || it->page_rc) {
        t->corrupt++;
        return KVT_ECORRUPT;
    }
    t->hits++;
    t->copy_reads += it->copy;
    t->replica_reads += it->replica;
    t->bytes += r->base.page_bytes;
    return 0;
}

/* A command refused for want of a permission (NOPERM: an ACL user without it) or of AUTH
 * (NOAUTH: the server wants a password the URL did not give): -EACCES, noted. */
static bool refused(struct redis_store *r, const struct redis_item *it, struct tally *t)
{
    char text[200];

    if (it->err || it->rep.type != RESP_ERROR ||
        (strncmp(it->rep.line, "NOPERM", 6) && strncmp(it->rep.line, "NOAUTH", 6)))
        return false;
    if (t->denied++ == 0) { /* once a chunk: the text is the same */
        snprintf(text, sizeof(text), "refused: %s", it->rep.line);
        redis_note_refusal(r, text, false);
    }
    return true;
}

/* What an item's command came to, as a page's result. */
static int item_result(struct redis_store *r, enum store_op_kind kind, const struct redis_item *it,
                       struct tally *t)
{
    if (it->err)
        return it->err;
    if (refused(r, it, t))
        return -EACCES;
    return kind == STORE_OP_WRITE ? set_result(&it->rep, t) : get_result(r, it, t);
}

/* A write's page: stored when its key or its copy took it (copy: NULL when none was sent). */
static int write_result(struct redis_store *r, const struct redis_item *it,
                        const struct redis_item *copy, struct tally *t)
{
    struct tally ct = {0};
    int rc = item_result(r, STORE_OP_WRITE, it, t);
    int crc = copy ? item_result(r, STORE_OP_WRITE, copy, &ct) : -EIO;

    t->copy_sets += copy && crc == 0; /* ct's other counts are the page's, counted once */
    rc = rc == 0 || crc == 0 ? 0 : rc;
    t->sets++;
    t->bytes += rc == 0 ? r->base.page_bytes : 0;
    return rc;
}

/* Values that failed their checks are deleted, under the name they were read from: a bad value
 * under a key would otherwise keep the right page from ever being written there (SET NX). */
static void delete_bad(struct redis_store *r, const int *results, size_t k)
{
    size_t n = 0;

    for (size_t i = 0; i < k; i++)
        if (results[i] == KVT_ECORRUPT)
            r->alt[n++] = (struct redis_item){.key = r->items[i].key, .copy = r->items[i].copy};
    if (n)
        redis_route_batch(r, CMD_DEL, r->alt, n);
}

/* The chunk's items: its pages' keys, then (writes on a cluster with copies) their copies. */
static size_t chunk_items(struct redis_store *r, struct redis_op *op, size_t p, size_t k)
{
    bool copies = op->kind == STORE_OP_WRITE && redis_copies(r) == 2;

    for (size_t i = 0; i < k; i++) {
        struct redis_item it = {.key = op->keys + (p + i) * STORE_KEY_BYTES,
                                .page = op->bufs[p + i],
                                .dst = op->bufs[p + i]};
        r->items[i] = it;
        if (copies) {
            it.copy = true;
            r->items[k + i] = it;
        }
    }
    return copies ? 2 * k : k;
}

static void run_chunk(struct redis_store *r, struct redis_op *op, size_t p, size_t k,
                      struct tally *t)
{
    uint64_t corrupt = t->corrupt;
    size_t n;

    redis_cluster_update(r); /* the mode and map, which say whether copies are written */
    n = chunk_items(r, op, p, k);
    redis_route_batch(r, op->kind == STORE_OP_WRITE ? CMD_SET : CMD_GET, r->items, n);
    if (op->kind == STORE_OP_READ)
        redis_read_elsewhere(r, CMD_GET, r->items, k);
    for (size_t i = p; i < p + k; i++) {
        const struct redis_item *it = &r->items[i - p];
        op->results[i] = op->kind == STORE_OP_WRITE
                             ? write_result(r, it, n > k ? &r->items[k + i - p] : NULL, t)
                             : item_result(r, STORE_OP_READ, it, t);
        t->failed +=
            op->results[i] != 0 && op->results[i] != -ENOENT && op->results[i] != KVT_ECORRUPT;
        if (op->results[i] == 0 || (!it->err && op->results[i] != -EIO))
            hint(r, it->key, op->results[i] == 0);
    }
    if (op->kind == STORE_OP_READ && t->corrupt > corrupt)
        delete_bad(r, op->results + p, k);
}

/* DBSIZE, for stats' pages: every key of the database (of every master on a cluster), other
 * fingerprints' too. Pipelined to each node that holds a connection now. */
static void refresh_pages(struct redis_store *r)
{
    const char *argv[] = {"DBSIZE"};
    uint64_t pages = 0;
    struct resp_value *rep;
    bool any = false;
    int rc;

    for (size_t i = 0; i < r->n_nodes; i++) {
        struct redis_node *n = &r->nodes[i];
        bool wanted = r->cluster ? n->master : r->mode_known && i == r->standalone;
        n->sent = wanted && n->ctx && !redis_wire_append(n->ctx, 1, argv, NULL);
        if (n->sent && redis_wire_flush(n->ctx)) {
            redis_conn_lost(r, n);
            n->sent = false;
        }
    }
    for (size_t i = 0; i < r->n_nodes; i++) {
        struct redis_node *n = &r->nodes[i];
        if (!n->sent || !n->ctx)
            continue;
        if ((rc = redis_resp_read(n->ctx, &rep))) {
            char why[200];
            snprintf(why, sizeof(why), "DBSIZE: %s", redis_wire_why(n->ctx, rc));
            redis_conn_down(r, n, -EIO, why);
            continue;
        }
        if (rep->type == RESP_INT) {
            pages += (uint64_t)rep->integer;
            any = true;
        }
        redis_resp_free(rep);
    }
    pthread_mutex_lock(&r->lock);
    if (any)
        r->st.pages = pages / redis_copies(r); /* a page and its copy are one page */
    pthread_mutex_unlock(&r->lock);
}

/* ---- leading runs ---- */

/* How many of keys, from the first, the servers hold: pipelined EXISTS, a chunk at a time,
 * stopping at the chunk where the run ends. */
static size_t exists_run(struct redis_store *r, const uint8_t *keys, size_t n)
{
    size_t run = 0, k;

    for (size_t p = 0; p < n && run == p; p += k) {
        k = n - p < EXISTS_CHUNK ? n - p : EXISTS_CHUNK;
        for (size_t i = 0; i < k; i++)
            r->items[i] = (struct redis_item){.key = keys + (p + i) * STORE_KEY_BYTES};
        redis_route_batch(r, CMD_EXISTS, r->items, k);
        redis_read_elsewhere(r, CMD_EXISTS, r->items, k);
        for (size_t i = 0; i < k; i++) {
            const struct redis_item *it = &r->items[i];
            bool present = it->answered && it->rep.type == RESP_INT && it->rep.integer == 1;
            run += present && run == p + i;
            if (it->answered) /* a node that did not answer says nothing of its keys */
                hint(r, it->key, present);
        }
    }
    return run;
}

/* Answer the leading run the owner waits for, if one does. */
static void serve_exists(struct redis_store *r)
{
    size_t run;

    pthread_mutex_lock(&r->lock);
    if (r->ex.state != EX_QUEUED) {
        pthread_mutex_unlock(&r->lock);
        return;
    }
    r->ex.state = EX_RUNNING;
    pthread_mutex_unlock(&r->lock);
    /* ex.keys and ex.n are left alone by the owner while the request runs. */
    run = exists_run(r, r->ex.keys, r->ex.n);
    pthread_mutex_lock(&r->lock);
    r->ex.run = run;
    r->ex.state = r->ex.abandoned ? EX_IDLE : EX_DONE;
    r->ex.abandoned = false;
    pthread_cond_broadcast(&r->done);
    pthread_mutex_unlock(&r->lock);
}

/* ---- ops ---- */

static void run_op(struct redis_store *r, struct redis_op *op)
{
    struct tally t = {0};
    size_t k;

    for (size_t p = 0; p < op->n; p += k) {
        serve_exists(r);
        k = chunk_pages(r, op->n - p);
        run_chunk(r, op, p, k, &t);
    }
    refresh_pages(r);
    for (size_t i = 0; i < op->n; i++)
        op->ok += op->results[i] == 0;
    add_tally(r, op->kind, &t);
}

/* Move the op at the head of the queue to the done list. Lock held. */
static void complete_head(struct redis_store *r)
{
    struct redis_op *op = r->queue;

    r->queue = op->next;
    if (!r->queue)
        r->queue_tail = NULL;
    op->next = NULL;
    *(r->done_tail ? &r->done_tail->next : &r->done_head) = op;
    r->done_tail = op;
    r->completed++;
    pthread_cond_broadcast(&r->done);
}

void *redis_io_main(void *arg)
{
    struct redis_store *r = arg;

    pthread_mutex_lock(&r->lock);
    for (;;) {
        if (r->revived) { /* a probe answered: its node takes commands again */
            pthread_mutex_unlock(&r->lock);
            redis_conn_adopt(r);
            pthread_mutex_lock(&r->lock);
        } else if (r->ex.state == EX_QUEUED) {
            pthread_mutex_unlock(&r->lock);
            serve_exists(r);
            pthread_mutex_lock(&r->lock);
        } else if (r->queue) {
            struct redis_op *op = r->queue; /* stays the head: only this thread takes it off */
            pthread_mutex_unlock(&r->lock);
            run_op(r, op);
            pthread_mutex_lock(&r->lock);
            complete_head(r);
        } else if (r->stop) {
            break;
        } else {
            pthread_cond_wait(&r->wake, &r->lock);
        }
    }
    pthread_mutex_unlock(&r->lock);
    redis_nodes_free(r);
    return NULL;
}
