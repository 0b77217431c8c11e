/*
 * A node's connection on the I/O thread: made on demand, with timeouts on connect, read and
 * write, so no exchange outlasts them, and after a failure not again before a backoff that
 * doubles up to backoff_max_ms. While it waits, pages fail at once with the last error, so a
 * dead server costs the ops in its way (on a cluster, the pages of its slots) nothing but
 * their misses.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "store/redis/redis_int.h"

#define BACKOFF_MIN_MS 20

uint64_t redis_now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static struct timeval tv_of(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* Published under the lock: leading_run reads them to answer at once while every node is
 * down; stats read the capacity (the masters' together on a cluster). */
void redis_conn_publish(struct redis_store *r)
{
    uint64_t retry = UINT64_MAX, bytes = 0, value = STORE_REDIS_HEAD_BYTES + r->base.page_bytes;
    bool up = false;

    for (size_t i = 0; i < r->n_nodes; i++) {
        const struct redis_node *n = &r->nodes[i];
        up |= n->ctx != NULL;
        retry = !n->ctx && n->retry_at_ms < retry ? n->retry_at_ms : retry;
        if (r->cluster ? n->master : i == r->standalone)
            bytes += n->capacity;
    }
    pthread_mutex_lock(&r->lock);
    r->up = up;
    r->c.connected = up;
    r->retry_at_ms = up ? 0 : retry;
    r->value_capacity = bytes / value;
    pthread_mutex_unlock(&r->lock);
}

void redis_conn_close(struct redis_node *n)
{
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = NULL;
    n->rb_pos = n->rb_len = 0; /* what was read off it belongs to nothing now */
}

static void backoff(struct redis_store *r, struct redis_node *n, int err)
{
    redis_conn_close(n);
    n->conn_err = err;
    n->retry_at_ms = redis_now_ms() + n->backoff_ms;
    n->backoff_ms =
        n->backoff_ms * 2 > r->o.backoff_max_ms ? r->o.backoff_max_ms : n->backoff_ms * 2;
    r->map_stale = true; /* a node gone: the cluster may have moved its slots */
    redis_conn_publish(r);
}

/* A SIGPIPE left pending (blocked on this thread) by a write to a closed connection. */
static void drop_sigpipe(void)
{
    struct timespec zero = {0, 0};
    sigset_t pipe, pending;

    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
        sigtimedwait(&pipe, NULL, &zero);
}

void redis_conn_lost(struct redis_store *r, struct redis_node *n)
{
    drop_sigpipe();
    backoff(r, n, -EIO);
}

/* A command whose reply must be +OK or a value; NULL on any failure. */
static redisReply *command(struct redis_node *n, int argc, const char **argv)
{
    redisReply *rep = redisCommandArgv(n->ctx, argc, argv, NULL);

    if (rep && rep->type == REDIS_REPLY_ERROR) {
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* The server's maxmemory, or its machine's memory where it has no limit (or will not say):
 * what stats report as capacity; eviction itself is the server's. */
static void probe_capacity(struct redis_node *n)
{
    const char *cfg[] = {"CONFIG", "GET", "maxmemory"}, *info[] = {"INFO", "memory"};
    redisReply *rep = command(n, 3, cfg);
    uint64_t bytes = 0;
    const char *t;

    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_STRING)
        bytes = strtoull(rep->element[1]->str, NULL, 10);
    freeReplyObject(rep);
    if (bytes == 0 && n->ctx && !n->ctx->err && (rep = command(n, 2, info))) {
        if (rep->type == REDIS_REPLY_STRING && (t = strstr(rep->str, "total_system_memory:")))
            bytes = strtoull(t + strlen("total_system_memory:"), NULL, 10);
        freeReplyObject(rep);
    }
    n->capacity = bytes;
}

/* What the server said when it refused us, kept for tools (store_redis_counters). */
void redis_note_refusal(struct redis_store *r, const char *text, bool auth)
{
    pthread_mutex_lock(&r->lock);
    snprintf(r->c.last_refusal, sizeof(r->c.last_refusal), "%s", text);
    r->c.auth_refused += auth;
    pthread_mutex_unlock(&r->lock);
}

/* AUTH [user] password: 0, -EACCES when refused (a wrong password, an unknown or disabled
 * user), -EIO when the connection failed. */
static int authenticate(struct redis_store *r, struct redis_node *n)
{
    const char *argv[] = {"AUTH", r->user ? r->user : r->password, r->password};
    redisReply *rep = redisCommandArgv(n->ctx, r->user ? 3 : 2, argv, NULL);
    char text[160];
    int rc = 0;

    if (!rep)
        return -EIO;
    if (rep->type == REDIS_REPLY_ERROR) {
        snprintf(text, sizeof(text), "AUTH%s%s refused by %s:%u: %s", r->user ? " as " : "",
                 r->user ? r->user : "", n->host, n->port, rep->str);
        redis_note_refusal(r, text, true);
        rc = -EACCES;
    }
    freeReplyObject(rep);
    return rc;
}

static int handshake(struct redis_store *r, struct redis_node *n)
{
    struct timeval wt = tv_of(r->o.write_timeout_ms);
    int rc;

    if (redisSetTimeout(n->ctx, tv_of(r->o.read_timeout_ms)) != REDIS_OK ||
        setsockopt(n->ctx->fd, SOL_SOCKET, SO_SNDTIMEO, &wt, sizeof(wt)))
        return -EIO;
    redisEnableKeepAlive(n->ctx);
    if (r->password && (rc = authenticate(r, n)))
        return rc;
    probe_capacity(n);
    return n->ctx->err ? -EIO : 0;
}

int redis_conn_ensure(struct redis_store *r, struct redis_node *n)
{
    int err;

    if (n->ctx)
        return 0;
    if (redis_now_ms() < n->retry_at_ms)
        return n->conn_err;
    n->ctx = redisConnectWithTimeout(n->host, n->port, tv_of(r->o.connect_timeout_ms));
    if (!n->ctx || n->ctx->err) {
        err = n->ctx && strstr(n->ctx->errstr, "refused") ? -ECONNREFUSED : -EIO;
        backoff(r, n, n->ctx ? err : -ENOMEM);
        return n->conn_err;
    }
    if ((err = handshake(r, n))) {
        backoff(r, n, err);
        return err;
    }
    n->backoff_ms = BACKOFF_MIN_MS;
    pthread_mutex_lock(&r->lock);
    r->c.connects++;
    pthread_mutex_unlock(&r->lock);
    redis_conn_publish(r);
    return 0;
}
