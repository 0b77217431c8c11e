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
    redis_wire_close(n->ctx); /* and what was read off it, which belongs to nothing now */
    n->ctx = NULL;
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

/* The server's maxmemory, or its machine's memory where it has no limit (or will not say):
 * what stats report as capacity; eviction itself is the server's. -EIO when the connection
 * failed; an error reply (CONFIG refused to this user) is no failure. */
static int probe_capacity(struct redis_node *n)
{
    const char *cfg[] = {"CONFIG", "GET", "maxmemory"}, *info[] = {"INFO", "memory"};
    struct resp_value *rep;
    uint64_t bytes = 0;
    const char *t;

    if (redis_call(n->ctx, 3, cfg, NULL, &rep))
        return -EIO;
    if (rep->type == RESP_ARRAY && rep->n == 2 && rep->elem[1]->type == RESP_BULK)
        bytes = strtoull(rep->elem[1]->str, NULL, 10);
    redis_resp_free(rep);
    if (bytes == 0) {
        if (redis_call(n->ctx, 2, info, NULL, &rep))
            return -EIO;
        if (rep->type == RESP_BULK && (t = strstr(rep->str, "total_system_memory:")))
            bytes = strtoull(t + strlen("total_system_memory:"), NULL, 10);
        redis_resp_free(rep);
    }
    n->capacity = bytes;
    return 0;
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
    struct resp_value *rep;
    char text[160];
    int rc = 0;

    if (redis_call(n->ctx, r->user ? 3 : 2, argv, NULL, &rep))
        return -EIO;
    if (rep->type == RESP_ERROR) {
        snprintf(text, sizeof(text), "AUTH%s%s refused by %s:%u: %s", r->user ? " as " : "",
                 r->user ? r->user : "", n->host, n->port, rep->str);
        redis_note_refusal(r, text, true);
        rc = -EACCES;
    }
    redis_resp_free(rep);
    return rc;
}

static int handshake(struct redis_store *r, struct redis_node *n)
{
    int rc;

    if (r->password && (rc = authenticate(r, n)))
        return rc;
    return probe_capacity(n);
}

int redis_conn_ensure(struct redis_store *r, struct redis_node *n)
{
    struct redis_wire_timeouts t = {r->o.connect_timeout_ms, r->o.read_timeout_ms,
                                    r->o.write_timeout_ms};
    char why[sizeof(r->c.last_refusal)];
    int err;

    if (n->ctx)
        return 0;
    if (redis_now_ms() < n->retry_at_ms)
        return n->conn_err;
    if ((err = redis_wire_open(n->host, n->port, r->tls, &t, &n->ctx, why, sizeof(why)))) {
        if (err == -EPROTO) /* TLS refused, or a certificate that does not check out */
            redis_note_refusal(r, why, false);
        backoff(r, n, err);
        return n->conn_err;
    }
    n->ctx->sigpipe_blocked = true; /* the I/O thread runs with every signal blocked */
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
