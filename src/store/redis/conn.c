/*
 * A node's connection on the I/O thread, and whether the node is down. A node is tried on
 * demand the first time (a connect and handshake, each wait bounded); from the first failure
 * on (refused, closed, no whole reply within read_timeout_ms, a write that would not go out,
 * redirections that loop) it is down: the connection is dropped, the prober (probe.c) tries
 * it in the background after a doubling wait, and until a probe answers every command for it
 * fails at once with the error that marked it down, so a dead, hung or trickling server costs
 * the ops in its way (on a cluster, the pages of its slots, which go to their copies) one
 * timeout when it is first seen, then nothing but their misses. A probe's answer is its
 * connection, which the node takes up again; the wait goes back to its start once the node has
 * answered commands again, so a node that answers probes but not commands is tried less and
 * less often.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/redis/redis_int.h"

#define BACKOFF_MIN_MS 20

/* Whether node i is one the store sends commands to now: a master (a replica it reads from)
 * on a cluster, the server that answered on a standalone one, a seed while the mode is
 * unknown. */
static bool serving(const struct redis_store *r, size_t i)
{
    if (!r->mode_known)
        return i < r->n_seeds;
    return r->cluster ? r->nodes[i].master || r->nodes[i].replica_of != NODE_NONE
                      : i == r->standalone;
}

/* Published under the lock: leading_run reads whether any node may answer (none: it answers
 * at once); stats read the capacity (the masters' together on a cluster, over the copies). */
void redis_conn_publish(struct redis_store *r)
{
    uint64_t bytes = 0, value = STORE_REDIS_HEAD_BYTES + r->base.page_bytes;
    uint32_t down = 0;
    bool connected = false, usable = false;

    for (size_t i = 0; i < r->n_nodes; i++) {
        const struct redis_node *n = &r->nodes[i];
        connected |= n->ctx != NULL;
        down += n->down;
        if (serving(r, i) && n->replica_of == NODE_NONE) { /* replicas add no room */
            usable |= !n->down;
            bytes += r->mode_known ? n->capacity : 0;
        }
    }
    pthread_mutex_lock(&r->lock);
    r->usable = usable || r->revived;
    r->c.connected = connected;
    r->c.nodes_down = down;
    r->value_capacity = bytes / value / redis_copies(r);
    pthread_mutex_unlock(&r->lock);
}

void redis_conn_close(struct redis_node *n)
{
    redis_wire_close(n->ctx); /* and what was read off it, which belongs to nothing now */
    n->ctx = NULL;
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

void redis_conn_down(struct redis_store *r, struct redis_node *n, int err, const char *why)
{
    uint16_t i = (uint16_t)(n - r->nodes);

    redis_conn_close(n);
    if (!n->down) {
        n->down = true;
        redis_note_down(r, n->host, n->port, why);
        if (redis_probe_add(r, i, n->replica_of != NODE_NONE, n->backoff_ms))
            n->down = false; /* out of memory: tried on demand again, as if never down */
        n->backoff_ms =
            n->backoff_ms * 2 > r->o.backoff_max_ms ? r->o.backoff_max_ms : n->backoff_ms * 2;
    }
    n->conn_err = err;
    r->map_stale = true; /* a node gone: the cluster may move its slots */
    redis_conn_publish(r);
}

void redis_conn_lost(struct redis_store *r, struct redis_node *n)
{
    drop_sigpipe();
    redis_conn_down(r, n, -EIO, redis_wire_why(n->ctx, -EIO));
}

void redis_conn_answered(struct redis_node *n)
{
    n->backoff_ms = BACKOFF_MIN_MS;
}

/* Node i's probe answered: its connection is the node's from now on. */
static bool take_probe(struct redis_store *r, uint16_t i)
{
    struct redis_node *n = &r->nodes[i];

    if (!redis_probe_take(r, i, &n->ctx, &n->capacity))
        return false;
    n->down = false;
    n->ctx->sigpipe_blocked = true;
    r->map_stale = true; /* back: perhaps as another node's replica now */
    pthread_mutex_lock(&r->lock);
    r->c.connects++;
    pthread_mutex_unlock(&r->lock);
    return true;
}

void redis_conn_adopt(struct redis_store *r)
{
    pthread_mutex_lock(&r->lock);
    r->revived = false;
    pthread_mutex_unlock(&r->lock);
    for (size_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].down)
            take_probe(r, (uint16_t)i);
    redis_conn_publish(r);
}

int redis_conn_ensure(struct redis_store *r, struct redis_node *n)
{
    struct redis_wire_timeouts t = {r->o.connect_timeout_ms, r->o.read_timeout_ms,
                                    r->o.write_timeout_ms};
    char why[sizeof(r->c.last_refusal)];
    bool replica = n->replica_of != NODE_NONE;
    int err;

    if (n->ctx)
        return 0;
    if (n->down) {
        if (!take_probe(r, (uint16_t)(n - r->nodes)))
            return n->conn_err;
        redis_conn_publish(r);
        return 0;
    }
    if ((err = redis_wire_open(n->host, n->port, r->tls, &t, &n->ctx, why, sizeof(why)))) {
        if (err == -EPROTO) /* TLS refused, or a certificate that does not check out */
            redis_note_refusal(r, why, false);
        redis_conn_down(r, n, err, why);
        return err;
    }
    n->ctx->sigpipe_blocked = true; /* the I/O thread runs with every signal blocked */
    if ((err = redis_handshake(r, n->ctx, n->host, n->port, replica, &n->capacity))) {
        snprintf(why, sizeof(why), "handshake: %s",
                 err == -EACCES   ? "AUTH refused"
                 : err == -EPROTO ? "READONLY refused"
                                  : redis_wire_why(n->ctx, err));
        redis_conn_down(r, n, err == -EACCES ? -EACCES : -EIO, why);
        return n->conn_err;
    }
    pthread_mutex_lock(&r->lock);
    r->c.connects++;
    pthread_mutex_unlock(&r->lock);
    redis_conn_publish(r);
    return 0;
}
