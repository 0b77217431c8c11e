/*
 * The I/O thread: it takes ops oldest first and runs each as pipelined chunks (all of a
 * chunk's commands sent, then all replies read), answering a waiting leading run between
 * chunks so that one never waits behind a large write. A connection that fails mid-chunk
 * fails the chunk's pages not yet answered; the next chunk tries a new one (conn.c).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvtier.h"
#include "store/redis/redis_int.h"

#define CHUNK_PAGES 64
#define CHUNK_BYTES (16u << 20) /* what one chunk of writes buffers before the server acks */
#define EXISTS_CHUNK 256

/* What a chunk tells the counters, added under the lock once it is done. */
struct tally {
    uint64_t hits, misses, corrupt, failed, sets, dups, bytes;
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

/* Pages [p, p + k) of op fail with err: nothing more is asked of the server for them. */
static void fail_pages(struct redis_op *op, size_t p, size_t k, int err, struct tally *t)
{
    for (size_t i = p; i < p + k; i++)
        op->results[i] = err;
    t->failed += k;
}

static int append_key_cmd(struct redis_store *r, const char *cmd, const uint8_t *key)
{
    char name[STORE_REDIS_KEY_CHARS + 1];
    const char *argv[] = {cmd, name};
    size_t lens[] = {strlen(cmd), STORE_REDIS_KEY_CHARS};

    store_redis_key(r->o.fingerprint, key, name);
    return redisAppendCommandArgv(r->ctx, 2, argv, lens) == REDIS_OK ? 0 : -ENOMEM;
}

/* SET key value NX [EX ttl]: written once; a page is a function of its key, so one there
 * already is the same page (or damage, which its next read finds). */
static int append_set(struct redis_store *r, const uint8_t *key, const void *page)
{
    char name[STORE_REDIS_KEY_CHARS + 1], ttl[16];
    const char *argv[] = {"SET", name, (const char *)r->scratch, "NX", "EX", ttl};
    size_t lens[] = {
        3, STORE_REDIS_KEY_CHARS, STORE_REDIS_HEAD_BYTES + (size_t)r->base.page_bytes, 2, 2, 0};

    store_redis_key(r->o.fingerprint, key, name);
    store_redis_value(r->o.fingerprint, key, page, r->base.page_bytes, r->scratch);
    lens[5] = (size_t)snprintf(ttl, sizeof(ttl), "%u", r->o.ttl_s);
    return redisAppendCommandArgv(r->ctx, r->o.ttl_s ? 6 : 4, argv, lens) == REDIS_OK ? 0 : -ENOMEM;
}

static int set_result(const redisReply *rep, struct tally *t)
{
    if (rep->type == REDIS_REPLY_STATUS)
        return 0;
    if (rep->type == REDIS_REPLY_NIL) {
        t->dups++;
        return 0;
    }
    /* OOM: the server is at maxmemory with a policy that does not evict. */
    if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "OOM", 3))
        return -ENOSPC;
    return -EIO;
}

static int get_result(struct redis_store *r, const uint8_t *key, void *buf, const redisReply *rep,
                      struct tally *t)
{
    if (rep->type == REDIS_REPLY_NIL) {
        t->misses++;
        return -ENOENT;
    }
    /* A value that is not a string (WRONGTYPE) is as foreign as a bad header. */
    bool foreign = rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "WRONGTYPE", 9);
    if (rep->type != REDIS_REPLY_STRING && !foreign)
        return -EIO;
    if (foreign || redis_value_check(r, key, (const uint8_t *)rep->str, rep->len)) {
        t->corrupt++;
        return KVT_ECORRUPT;
    }
    memcpy(buf, rep->str + STORE_REDIS_HEAD_BYTES, r->base.page_bytes);
    t->hits++;
    t->bytes += r->base.page_bytes;
    return 0;
}

/* Read the k replies of a chunk from page p; a lost connection fails what is unanswered. */
static int collect(struct redis_store *r, struct redis_op *op, size_t p, size_t k, struct tally *t)
{
    redisReply *rep;

    for (size_t i = p; i < p + k; i++) {
        if (redisGetReply(r->ctx, (void **)&rep) != REDIS_OK || !rep) {
            fail_pages(op, i, p + k - i, -EIO, t);
            redis_conn_lost(r);
            return -EIO;
        }
        const uint8_t *key = op->keys + i * STORE_KEY_BYTES;
        if (op->kind == STORE_OP_WRITE) {
            op->results[i] = set_result(rep, t);
            t->sets++;
            t->bytes += op->results[i] == 0 ? r->base.page_bytes : 0;
        } else {
            op->results[i] = get_result(r, key, op->bufs[i], rep, t);
        }
        t->failed += op->results[i] == -EIO || op->results[i] == -ENOSPC;
        if (op->results[i] != -EIO)
            hint(r, key, op->results[i] == 0);
        freeReplyObject(rep);
    }
    return 0;
}

/* Values that failed their checks are deleted: a bad value under a key would otherwise keep
 * the right page from ever being written there (SET NX). */
static void delete_bad(struct redis_store *r, struct redis_op *op, size_t p, size_t k)
{
    redisReply *rep;
    size_t sent = 0;

    for (size_t i = p; i < p + k; i++)
        if (op->results[i] == KVT_ECORRUPT &&
            append_key_cmd(r, "DEL", op->keys + i * STORE_KEY_BYTES) == 0)
            sent++;
    for (size_t i = 0; i < sent; i++) {
        if (redisGetReply(r->ctx, (void **)&rep) != REDIS_OK || !rep) {
            redis_conn_lost(r);
            return;
        }
        freeReplyObject(rep);
    }
}

static void run_chunk(struct redis_store *r, struct redis_op *op, size_t p, size_t k,
                      struct tally *t)
{
    int rc = 0;

    for (size_t i = p; i < p + k && !rc; i++) {
        const uint8_t *key = op->keys + i * STORE_KEY_BYTES;
        rc = op->kind == STORE_OP_WRITE ? append_set(r, key, op->bufs[i])
                                        : append_key_cmd(r, "GET", key);
    }
    if (rc) { /* out of memory building the pipeline: start afresh */
        fail_pages(op, p, k, rc, t);
        redis_conn_lost(r);
        return;
    }
    if (collect(r, op, p, k, t) == 0 && op->kind == STORE_OP_READ && t->corrupt)
        delete_bad(r, op, p, k);
}

/* DBSIZE, for stats' pages: every key of the server's database, other fingerprints' too. */
static void refresh_pages(struct redis_store *r)
{
    redisReply *rep;

    if (!r->ctx || !(rep = redisCommand(r->ctx, "DBSIZE"))) {
        if (r->ctx)
            redis_conn_lost(r);
        return;
    }
    pthread_mutex_lock(&r->lock);
    if (rep->type == REDIS_REPLY_INTEGER)
        r->st.pages = (uint64_t)rep->integer;
    pthread_mutex_unlock(&r->lock);
    freeReplyObject(rep);
}

/* ---- leading runs ---- */

/* How many of keys, from the first, the server holds: pipelined EXISTS, a chunk at a time,
 * stopping at the chunk where the run ends. */
static size_t exists_run(struct redis_store *r, const uint8_t *keys, size_t n)
{
    size_t run = 0, k;
    redisReply *rep;

    for (size_t p = 0; p < n && run == p && redis_conn_ensure(r) == 0; p += k) {
        k = n - p < EXISTS_CHUNK ? n - p : EXISTS_CHUNK;
        for (size_t i = p; i < p + k; i++)
            if (append_key_cmd(r, "EXISTS", keys + i * STORE_KEY_BYTES)) {
                redis_conn_lost(r); /* the pipeline is half built: start afresh */
                return run;
            }
        for (size_t i = p; i < p + k; i++) {
            if (redisGetReply(r->ctx, (void **)&rep) != REDIS_OK || !rep) {
                redis_conn_lost(r);
                return run;
            }
            bool present = rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
            run += present && run == i;
            hint(r, keys + i * STORE_KEY_BYTES, present);
            freeReplyObject(rep);
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
    int err;

    for (size_t p = 0; p < op->n; p += k) {
        serve_exists(r);
        k = chunk_pages(r, op->n - p);
        if ((err = redis_conn_ensure(r))) {
            fail_pages(op, p, op->n - p, err, &t);
            break;
        }
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
        if (r->ex.state == EX_QUEUED) {
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
    redis_conn_close(r);
    return NULL;
}
