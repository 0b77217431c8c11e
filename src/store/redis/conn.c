/*
 * The I/O thread's connection: made on demand, with timeouts on connect, read and write, so
 * no exchange outlasts them, and after a failure not again before a backoff that doubles up
 * to backoff_max_ms. While it waits, pages fail at once with the last error, so a dead
 * server costs the ops in its way nothing but their misses.
 */
#include <errno.h>
#include <signal.h>
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

/* Published under the lock: leading_run reads them to answer at once while the server is
 * down. */
static void set_up(struct redis_store *r, bool up, uint64_t retry_at_ms)
{
    pthread_mutex_lock(&r->lock);
    r->up = up;
    r->c.connected = up;
    r->retry_at_ms = retry_at_ms;
    pthread_mutex_unlock(&r->lock);
}

void redis_conn_close(struct redis_store *r)
{
    if (r->ctx)
        redisFree(r->ctx);
    r->ctx = NULL;
}

static void backoff(struct redis_store *r, int err)
{
    redis_conn_close(r);
    r->conn_err = err;
    set_up(r, false, redis_now_ms() + r->backoff_ms);
    r->backoff_ms =
        r->backoff_ms * 2 > r->o.backoff_max_ms ? r->o.backoff_max_ms : r->backoff_ms * 2;
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

void redis_conn_lost(struct redis_store *r)
{
    drop_sigpipe();
    backoff(r, -EIO);
}

/* A command whose reply must be +OK or a value; NULL on any failure. */
static redisReply *command(struct redis_store *r, int argc, const char **argv)
{
    redisReply *rep = redisCommandArgv(r->ctx, argc, argv, NULL);

    if (rep && rep->type == REDIS_REPLY_ERROR) {
        freeReplyObject(rep);
        return NULL;
    }
    return rep;
}

/* The server's maxmemory in pages, or its machine's memory where it has no limit (or will
 * not say): what stats report as capacity; eviction itself is the server's. */
static void probe_capacity(struct redis_store *r)
{
    const char *cfg[] = {"CONFIG", "GET", "maxmemory"}, *info[] = {"INFO", "memory"};
    uint64_t value = STORE_REDIS_HEAD_BYTES + (uint64_t)r->base.page_bytes, bytes = 0;
    redisReply *rep = command(r, 3, cfg);
    const char *t;

    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_STRING)
        bytes = strtoull(rep->element[1]->str, NULL, 10);
    freeReplyObject(rep);
    if (bytes == 0 && r->ctx && (rep = command(r, 2, info))) {
        if (rep->type == REDIS_REPLY_STRING && (t = strstr(rep->str, "total_system_memory:")))
            bytes = strtoull(t + strlen("total_system_memory:"), NULL, 10);
        freeReplyObject(rep);
    }
    pthread_mutex_lock(&r->lock);
    r->value_capacity = bytes / value;
    pthread_mutex_unlock(&r->lock);
}

static int handshake(struct redis_store *r)
{
    struct timeval wt = tv_of(r->o.write_timeout_ms);
    const char *auth[] = {"AUTH", r->password};
    redisReply *rep;

    if (redisSetTimeout(r->ctx, tv_of(r->o.read_timeout_ms)) != REDIS_OK ||
        setsockopt(r->ctx->fd, SOL_SOCKET, SO_SNDTIMEO, &wt, sizeof(wt)))
        return -EIO;
    redisEnableKeepAlive(r->ctx);
    if (r->password) {
        if (!(rep = command(r, 2, auth)))
            return -EACCES;
        freeReplyObject(rep);
    }
    probe_capacity(r);
    return r->ctx->err ? -EIO : 0;
}

int redis_conn_ensure(struct redis_store *r)
{
    int err;

    if (r->ctx)
        return 0;
    if (redis_now_ms() < r->retry_at_ms)
        return r->conn_err;
    r->ctx = redisConnectWithTimeout(r->host, r->o.port, tv_of(r->o.connect_timeout_ms));
    if (!r->ctx || r->ctx->err) {
        err = r->ctx && strstr(r->ctx->errstr, "refused") ? -ECONNREFUSED : -EIO;
        backoff(r, r->ctx ? err : -ENOMEM);
        return r->conn_err;
    }
    if ((err = handshake(r))) {
        backoff(r, err);
        return err;
    }
    r->backoff_ms = BACKOFF_MIN_MS;
    pthread_mutex_lock(&r->lock);
    r->c.connects++;
    pthread_mutex_unlock(&r->lock);
    set_up(r, true, 0);
    return 0;
}
