/*
 * What every new connection says first, on the I/O thread (conn.c) and on the prober's
 * (probe.c) alike: AUTH when the URL has a password, READONLY on a replica the store reads
 * from, then the server's memory for stats' capacity. And the notes tools read afterwards: the
 * server's text of the last refusal, and why a node was last marked down.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis/redis_int.h"

/* What the server said when it refused us, kept for tools (store_redis_counters). */
void redis_note_refusal(struct redis_store *r, const char *text, bool auth)
{
    pthread_mutex_lock(&r->lock);
    snprintf(r->c.last_refusal, sizeof(r->c.last_refusal), "%s", text);
    r->c.auth_refused += auth;
    pthread_mutex_unlock(&r->lock);
}

/* The server's maxmemory, or its machine's memory where it has no limit (or will not say):
 * what stats report as capacity; eviction itself is the server's. -EIO when the connection
 * failed; an error reply (CONFIG refused to this user) is no failure. */
static int probe_capacity(struct redis_wire *w, uint64_t *capacity)
{
    const char *cfg[] = {"CONFIG", "GET", "maxmemory"}, *info[] = {"INFO", "memory"};
    struct resp_value *rep;
    uint64_t bytes = 0;
    const char *t;
    int rc;

    if ((rc = redis_call(w, 3, cfg, NULL, &rep)))
        return rc;
    if (rep->type == RESP_ARRAY && rep->n == 2 && rep->elem[1]->type == RESP_BULK)
        bytes = strtoull(rep->elem[1]->str, NULL, 10);
    redis_resp_free(rep);
    if (bytes == 0) {
        if ((rc = redis_call(w, 2, info, NULL, &rep)))
            return rc;
        if (rep->type == RESP_BULK && (t = strstr(rep->str, "total_system_memory:")))
            bytes = strtoull(t + strlen("total_system_memory:"), NULL, 10);
        redis_resp_free(rep);
    }
    *capacity = bytes;
    return 0;
}

/* AUTH [user] password: 0, -EACCES when refused (a wrong password, an unknown or disabled
 * user), or the call's error. */
static int authenticate(struct redis_store *r, struct redis_wire *w, const char *host,
                        uint16_t port)
{
    const char *argv[] = {"AUTH", r->user ? r->user : r->password, r->password};
    struct resp_value *rep;
    char text[160];
    int rc;

    if ((rc = redis_call(w, r->user ? 3 : 2, argv, NULL, &rep)))
        return rc;
    if (rep->type == RESP_ERROR) {
        snprintf(text, sizeof(text), "AUTH%s%s refused by %s:%u: %s", r->user ? " as " : "",
                 r->user ? r->user : "", host, port, rep->str);
        redis_note_refusal(r, text, true);
        rc = -EACCES;
    }
    redis_resp_free(rep);
    return rc;
}

/* READONLY: a replica then serves reads of its master's slots instead of redirecting them. */
static int readonly(struct redis_wire *w)
{
    const char *argv[] = {"READONLY"};
    struct resp_value *rep;
    int rc;

    if ((rc = redis_call(w, 1, argv, NULL, &rep)))
        return rc;
    rc = rep->type == RESP_ERROR ? -EPROTO : 0;
    redis_resp_free(rep);
    return rc;
}

int redis_handshake(struct redis_store *r, struct redis_wire *w, const char *host, uint16_t port,
                    bool replica, uint64_t *capacity)
{
    int rc;

    if (r->password && (rc = authenticate(r, w, host, port)))
        return rc;
    if (replica && (rc = readonly(w)))
        return rc;
    return probe_capacity(w, capacity);
}

void redis_note_down(struct redis_store *r, const char *host, uint16_t port, const char *why)
{
    pthread_mutex_lock(&r->lock);
    snprintf(r->c.last_error, sizeof(r->c.last_error), "%s:%u: %s", host, port, why);
    r->c.marked_down++;
    pthread_mutex_unlock(&r->lock);
}
