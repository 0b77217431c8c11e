/*
 * The Redis store behind the store contract, on the owner thread: read and write queue an op
 * for the I/O thread (io.c) and return; poll and wait_for collect what it completed, oldest
 * first; leading_run hands the I/O thread one request and waits for it, at most
 * exists_timeout_ms, answering 0 (nothing to fetch: a miss) when the server is down or slow.
 */
#include "store/redis/redis.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"
#include "store/redis/redis_int.h"

#define MAX_PAGE_BYTES (512u << 20) /* the server's largest value (proto-max-bulk-len) */

static struct redis_store *rs(struct kvt_store *s)
{
    return (struct redis_store *)s;
}

/* ---- ops ---- */

static struct redis_op *op_new(uint32_t kind, size_t n, int *results)
{
    struct redis_op *op = calloc(1, sizeof(*op) + n * (STORE_KEY_BYTES + sizeof(void *)));

    if (!op)
        return NULL;
    op->kind = kind;
    op->n = (uint32_t)n;
    op->results = results;
    op->bufs = (void **)(op + 1);
    op->keys = (uint8_t *)(op->bufs + n);
    return op;
}

/* Give op an id and queue it for the I/O thread. */
static void submit(struct redis_store *r, struct redis_op *op, uint64_t *id)
{
    pthread_mutex_lock(&r->lock);
    op->id = ++r->last_id;
    *(r->queue_tail ? &r->queue_tail->next : &r->queue) = op;
    r->queue_tail = op;
    r->queued++;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
    *id = op->id;
}

static int check_args(const void *pages, size_t n, const int *results, const uint64_t *op)
{
    return !op || n > UINT32_MAX || (n && (!pages || !results)) ? -EINVAL : 0;
}

static int redis_write(struct kvt_store *s, const struct store_wpage *pages, size_t n, int *results,
                       uint64_t *id)
{
    struct redis_op *op;
    int rc = check_args(pages, n, results, id);

    for (size_t i = 0; !rc && i < n; i++)
        rc = pages[i].key && pages[i].buf ? 0 : -EINVAL;
    if (rc || !(op = op_new(STORE_OP_WRITE, n, results)))
        return rc ? rc : -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        memcpy(op->keys + i * STORE_KEY_BYTES, pages[i].key, STORE_KEY_BYTES);
        op->bufs[i] = (void *)pages[i].buf; /* only read from */
    }
    submit(rs(s), op, id);
    return 0;
}

/* *leading: the pages from the first last seen stored (the hint table), without asking the
 * server; a page gone since is a miss when the read lands. */
static int redis_read(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                      uint64_t *id, size_t *leading)
{
    struct redis_store *r = rs(s);
    struct redis_op *op;
    size_t lead = 0;
    int rc = check_args(pages, n, results, id);

    for (size_t i = 0; !rc && i < n; i++)
        rc = pages[i].key && pages[i].buf ? 0 : -EINVAL;
    if (rc || !(op = op_new(STORE_OP_READ, n, results)))
        return rc ? rc : -ENOMEM;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < n; i++) {
        memcpy(op->keys + i * STORE_KEY_BYTES, pages[i].key, STORE_KEY_BYTES);
        op->bufs[i] = pages[i].buf;
        lead += lead == i && redis_hint_has(r, pages[i].key);
    }
    r->c.gets += n;
    pthread_mutex_unlock(&r->lock);
    submit(r, op, id);
    if (leading)
        *leading = lead;
    return 0;
}

static int keys_reserve(struct exists_req *ex, size_t n)
{
    uint8_t *k;

    if (n * STORE_KEY_BYTES <= ex->cap)
        return 0;
    if (!(k = realloc(ex->keys, n * STORE_KEY_BYTES)))
        return -ENOMEM;
    ex->keys = k;
    ex->cap = n * STORE_KEY_BYTES;
    return 0;
}

static struct timespec deadline_of(uint32_t ms)
{
    struct timespec t;

    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000;
    if (t.tv_nsec >= 1000000000) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000;
    }
    return t;
}

/* Lock held: wait for the request queued, giving it up at the deadline. */
static size_t exists_wait(struct redis_store *r)
{
    struct timespec until = deadline_of(r->o.exists_timeout_ms);
    size_t run;

    while (r->ex.state != EX_DONE)
        if (pthread_cond_timedwait(&r->done, &r->lock, &until) == ETIMEDOUT &&
            r->ex.state != EX_DONE) {
            r->ex.abandoned = true; /* the thread finishes it and answers nobody */
            r->c.exists_late++;
            return 0;
        }
    run = r->ex.run;
    r->ex.state = EX_IDLE;
    return run;
}

static int redis_leading_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    struct redis_store *r = rs(s);

    if (!run || (n && !keys))
        return -EINVAL;
    *run = 0;
    if (n == 0)
        return 0;
    pthread_mutex_lock(&r->lock);
    /* Every node it would ask known down, or an earlier request still running: no time to
     * ask, so nothing found. */
    if (r->ex.state != EX_IDLE || !r->usable || keys_reserve(&r->ex, n)) {
        r->c.exists_late++;
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    memcpy(r->ex.keys, keys, n * STORE_KEY_BYTES);
    r->ex.n = n;
    r->ex.state = EX_QUEUED;
    pthread_cond_signal(&r->wake);
    *run = exists_wait(r);
    pthread_mutex_unlock(&r->lock);
    return 0;
}

/* ---- completions ---- */

static void fill_done(const struct redis_op *op, struct store_done *d)
{
    *d = (struct store_done){.op = op->id, .kind = op->kind, .pages = op->n, .ok = op->ok};
}

static size_t redis_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    struct redis_store *r = rs(s);
    struct redis_op *op;
    size_t n = 0;

    pthread_mutex_lock(&r->lock);
    while (n < max && (op = r->done_head)) {
        r->done_head = op->next;
        if (!r->done_head)
            r->done_tail = NULL;
        fill_done(op, &done[n++]);
        free(op);
    }
    r->queued -= n;
    pthread_mutex_unlock(&r->lock);
    return n;
}

/* Lock held: take op off the done list; false when it is not there. */
static bool take_done(struct redis_store *r, uint64_t id, struct store_done *d)
{
    struct redis_op *op = r->done_head, *prev = NULL;

    for (; op && op->id != id; prev = op, op = op->next)
        ;
    if (!op)
        return false;
    *(prev ? &prev->next : &r->done_head) = op->next;
    if (r->done_tail == op)
        r->done_tail = prev;
    if (d)
        fill_done(op, d);
    free(op);
    r->queued--;
    return true;
}

static int redis_wait_for(struct kvt_store *s, uint64_t id, int timeout_ms, struct store_done *d)
{
    struct redis_store *r = rs(s);
    struct timespec until = deadline_of(timeout_ms > 0 ? (uint32_t)timeout_ms : 0);
    int rc = -ETIMEDOUT;

    pthread_mutex_lock(&r->lock);
    if (id == 0 || id > r->last_id)
        rc = -EINVAL;
    while (rc == -ETIMEDOUT) {
        if (take_done(r, id, d))
            rc = 0;
        else if (!r->queue || id < r->queue->id) /* queued ops are the newest, in order */
            rc = -ENOENT;
        else if (timeout_ms == 0 ||
                 (timeout_ms < 0 ? pthread_cond_wait(&r->done, &r->lock)
                                 : pthread_cond_timedwait(&r->done, &r->lock, &until)) == ETIMEDOUT)
            break;
    }
    if (rc == -ETIMEDOUT && take_done(r, id, d)) /* done just as the wait ran out */
        rc = 0;
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static int redis_drain(struct kvt_store *s)
{
    (void)s; /* bad values are deleted within the read that found them */
    return 0;
}

static void redis_stats(struct kvt_store *s, struct store_stats *st)
{
    struct redis_store *r = rs(s);

    pthread_mutex_lock(&r->lock);
    *st = r->st;
    st->capacity_pages = r->value_capacity;
    st->in_flight = r->queued;
    st->remote_errors = st->errors;
    pthread_mutex_unlock(&r->lock);
}

static void free_store(struct redis_store *r)
{
    for (struct redis_op *op = r->done_head, *next; op; op = next) {
        next = op->next;
        free(op);
    }
    redis_prober_stop(r);
    pthread_cond_destroy(&r->wake);
    pthread_cond_destroy(&r->done);
    pthread_cond_destroy(&r->probe_wake);
    pthread_mutex_destroy(&r->lock);
    redis_nodes_free(r);
    free(r->ex.keys);
    free(r->hint);
    free(r->items);
    free(r->alt);
    free(r->slot_node);
    free(r->slot_replica);
    free(r->password);
    free(r->user);
    redis_tls_ctx_free(r->tls);
    free(r);
}

/* Every op queued runs first (a dead server fails them fast, within the timeouts; one known
 * down at once); then the prober, whose probe under way (if any) is cancelled. */
static void redis_close(struct kvt_store *s)
{
    struct redis_store *r = rs(s);

    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_signal(&r->wake);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    free_store(r);
}

static const struct store_ops redis_ops = {
    .name = "redis",
    .remote = true,
    .leading_run = redis_leading_run,
    .read = redis_read,
    .write = redis_write,
    .poll = redis_poll,
    .wait_for = redis_wait_for,
    .drain = redis_drain,
    .stats = redis_stats,
    .close = redis_close,
};

int store_redis_counters(struct kvt_store *s, struct store_redis_counters *c)
{
    struct redis_store *r = rs(s);

    if (!s || s->ops != &redis_ops || !c)
        return -EINVAL;
    pthread_mutex_lock(&r->lock);
    *c = r->c;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

static void defaults(struct store_redis_options *o)
{
    o->port = o->port ? o->port : 6379;
    o->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 1000;
    o->read_timeout_ms = o->read_timeout_ms ? o->read_timeout_ms : 2000;
    o->write_timeout_ms = o->write_timeout_ms ? o->write_timeout_ms : 2000;
    o->exists_timeout_ms = o->exists_timeout_ms ? o->exists_timeout_ms : o->read_timeout_ms;
    o->backoff_max_ms = o->backoff_max_ms ? o->backoff_max_ms : 1000;
}

/* The seeds are the first nodes, in the order given. */
static int add_seeds(struct redis_store *r, const struct store_redis_options *o)
{
    struct store_redis_addr one = {o->host ? o->host : "127.0.0.1", o->port};
    const struct store_redis_addr *seeds = o->n_seeds ? o->seeds : &one;

    for (uint32_t i = 0; i < (o->n_seeds ? o->n_seeds : 1); i++) {
        const char *host = seeds[i].host ? seeds[i].host : "127.0.0.1";
        if (redis_node_find(r, host, strlen(host), seeds[i].port ? seeds[i].port : 6379) ==
            NODE_NONE)
            return -ENOMEM;
    }
    r->n_seeds = r->n_nodes;
    return 0;
}

static int alloc_store(struct redis_store *r, const struct store_redis_options *o)
{
    r->password = o->password ? strdup(o->password) : NULL;
    r->user = o->user ? strdup(o->user) : NULL;
    r->hint = calloc(HINT_SLOTS, STORE_KEY_BYTES);
    r->items = calloc(ITEMS_MAX, sizeof(*r->items));
    r->alt = calloc(ITEMS_MAX, sizeof(*r->alt));
    r->slot_node = malloc(STORE_REDIS_SLOTS * sizeof(*r->slot_node));
    if (o->replica_reads)
        r->slot_replica = malloc(STORE_REDIS_SLOTS * sizeof(*r->slot_replica));
    if (!r->hint || !r->items || !r->alt || !r->slot_node ||
        (o->replica_reads && !r->slot_replica) || (!r->password && o->password) ||
        (!r->user && o->user))
        return -ENOMEM;
    for (size_t s = 0; s < STORE_REDIS_SLOTS; s++) {
        r->slot_node[s] = NODE_NONE;
        if (r->slot_replica)
            r->slot_replica[s] = NODE_NONE;
    }
    return add_seeds(r, o);
}

/* The I/O thread starts with every signal blocked: the application's signals go to its own
 * threads, and a write to a connection the server closed fails with EPIPE instead of killing
 * the process with SIGPIPE (a write's SIGPIPE goes to the thread that wrote). */
static int start_thread(struct redis_store *r)
{
    sigset_t all, old;
    int rc;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&r->thread, NULL, redis_io_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return -rc;
}

int store_redis_open_err(const struct store_redis_options *o, struct kvt_store **out, char *err,
                         size_t len)
{
    struct redis_store *r;
    int rc;

    if (err && len)
        err[0] = '\0';
    if (!o || !out || !o->page_bytes || o->page_bytes > MAX_PAGE_BYTES - STORE_REDIS_HEAD_BYTES ||
        o->n_seeds > STORE_REDIS_MAX_SEEDS || (o->user && !o->password) || o->copies > 2)
        return -EINVAL;
    if (!(r = calloc(1, sizeof(*r))))
        return -ENOMEM;
    r->base = (struct kvt_store){&redis_ops, o->page_bytes, o->page_tokens};
    r->o = *o;
    r->cancel_fd = -1;
    r->usable = true; /* nothing is known down before the first try */
    r->c.copies = 1;
    defaults(&r->o);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->wake, NULL);
    pthread_cond_init(&r->done, NULL);
    pthread_cond_init(&r->probe_wake, NULL);
    if ((o->tls && (rc = redis_tls_ctx(o->tls_ca, o->tls_cert, o->tls_key, &r->tls, err, len))) ||
        (rc = alloc_store(r, o)) || (rc = redis_prober_start(r)) || (rc = start_thread(r))) {
        free_store(r);
        return rc;
    }
    r->o.tls_ca = r->o.tls_cert = r->o.tls_key = NULL; /* read at open, not kept */
    *out = &r->base;
    return 0;
}

int store_redis_open(const struct store_redis_options *o, struct kvt_store **out)
{
    return store_redis_open_err(o, out, NULL, 0);
}
