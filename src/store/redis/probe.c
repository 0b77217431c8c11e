/*
 * The prober: a thread of the store's own that tries the nodes the I/O thread marked down
 * (refused, failed, silent past a reply's timeout, redirecting in loops), so that no command
 * ever waits on one. Each try is a whole connect and handshake (handshake.c), with the
 * store's timeouts; one that fails is tried again after a doubling wait (backoff_max_ms at
 * most), one that answers hands its connection to the I/O thread, which sends the node
 * commands again from then on. The probes are a list under the store's lock: the I/O thread
 * adds and takes, the prober runs them. The store's close ends a probe under way at once
 * (the cancel eventfd every wait of a probe polls too).
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "store/redis/redis_int.h"

/* A node to try: its own copy of the address, since the I/O thread's node table may grow
 * (and move) while a probe runs. */
struct redis_probe {
    struct redis_probe *next;
    uint16_t node;
    bool replica;
    char *host;
    uint16_t port;
    uint32_t delay_ms; /* before the next try */
    uint64_t due_ms;
    bool running;
    struct redis_wire *wire; /* an answer: the connection, handshake done */
    uint64_t capacity;
};

static void probe_free(struct redis_probe *p)
{
    if (p) {
        redis_wire_close(p->wire);
        free(p->host);
        free(p);
    }
}

static struct timespec realtime_after(uint64_t ms)
{
    struct timespec t;

    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += (time_t)(ms / 1000);
    t.tv_nsec += (long)(ms % 1000) * 1000000;
    if (t.tv_nsec >= 1000000000) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000;
    }
    return t;
}

/* Lock held: the probe to run now, or NULL with *wait_ms until the next is due. */
static struct redis_probe *next_due(struct redis_store *r, uint64_t *wait_ms)
{
    uint64_t now = redis_now_ms();

    *wait_ms = UINT64_MAX;
    for (struct redis_probe *p = r->probes; p; p = p->next) {
        if (p->running || p->wire)
            continue;
        if (p->due_ms <= now)
            return p;
        *wait_ms = p->due_ms - now < *wait_ms ? p->due_ms - now : *wait_ms;
    }
    return NULL;
}

/* Connect and handshake, unlocked: the connection, or NULL. */
static struct redis_wire *try_node(struct redis_store *r, const char *host, uint16_t port,
                                   bool replica, uint64_t *capacity)
{
    struct redis_wire_timeouts t = {r->o.connect_timeout_ms, r->o.read_timeout_ms,
                                    r->o.write_timeout_ms};
    struct redis_wire *w;

    if (redis_wire_open_cancellable(host, port, r->tls, &t, r->cancel_fd, &w, NULL, 0))
        return NULL;
    w->sigpipe_blocked = true; /* the prober runs with every signal blocked */
    if (redis_handshake(r, w, host, port, replica, capacity)) {
        redis_wire_close(w);
        return NULL;
    }
    return w;
}

/* Lock held on entry and exit: run p, then either keep its answer (and wake the I/O
 * thread) or set its next try. */
static void run_probe(struct redis_store *r, struct redis_probe *p)
{
    char *host = p->host;
    uint16_t port = p->port;
    bool replica = p->replica;
    uint64_t capacity = 0;
    struct redis_wire *w;

    p->running = true;
    r->c.probes++;
    pthread_mutex_unlock(&r->lock);
    w = try_node(r, host, port, replica, &capacity); /* p stays: only this thread frees it */
    pthread_mutex_lock(&r->lock);
    p->running = false;
    if (w) {
        p->wire = w;
        p->capacity = capacity;
        r->revived = true;
        pthread_cond_signal(&r->wake);
        return;
    }
    p->due_ms = redis_now_ms() + p->delay_ms;
    p->delay_ms = p->delay_ms * 2 > r->o.backoff_max_ms ? r->o.backoff_max_ms : p->delay_ms * 2;
}

static void *prober_main(void *arg)
{
    struct redis_store *r = arg;
    struct redis_probe *p;
    uint64_t wait_ms;

    pthread_mutex_lock(&r->lock);
    while (!r->probe_stop) {
        if ((p = next_due(r, &wait_ms))) {
            run_probe(r, p);
        } else if (wait_ms == UINT64_MAX) {
            pthread_cond_wait(&r->probe_wake, &r->lock);
        } else {
            struct timespec until = realtime_after(wait_ms);
            pthread_cond_timedwait(&r->probe_wake, &r->lock, &until);
        }
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

int redis_prober_start(struct redis_store *r)
{
    sigset_t all, old;
    int rc;

    if ((r->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
        return -errno;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&r->prober, NULL, prober_main, r);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    r->prober_started = rc == 0;
    return -rc;
}

void redis_prober_stop(struct redis_store *r)
{
    uint64_t one = 1;

    if (r->prober_started) {
        pthread_mutex_lock(&r->lock);
        r->probe_stop = true;
        pthread_cond_signal(&r->probe_wake);
        pthread_mutex_unlock(&r->lock);
        if (write(r->cancel_fd, &one, sizeof(one)) < 0) { /* a probe's waits end at once */
        }
        pthread_join(r->prober, NULL);
        r->prober_started = false;
    }
    for (struct redis_probe *p = r->probes, *next; p; p = next) {
        next = p->next;
        probe_free(p);
    }
    r->probes = NULL;
    if (r->cancel_fd >= 0)
        close(r->cancel_fd);
    r->cancel_fd = -1;
}

int redis_probe_add(struct redis_store *r, uint16_t node, bool replica, uint32_t delay_ms)
{
    const struct redis_node *n = &r->nodes[node];
    struct redis_probe *p = calloc(1, sizeof(*p));

    if (!p || !(p->host = strdup(n->host))) {
        free(p);
        return -ENOMEM;
    }
    p->node = node;
    p->replica = replica;
    p->port = n->port;
    p->delay_ms = delay_ms * 2 > r->o.backoff_max_ms ? r->o.backoff_max_ms : delay_ms * 2;
    p->due_ms = redis_now_ms() + delay_ms;
    pthread_mutex_lock(&r->lock);
    p->next = r->probes;
    r->probes = p;
    pthread_cond_signal(&r->probe_wake);
    pthread_mutex_unlock(&r->lock);
    return 0;
}

bool redis_probe_take(struct redis_store *r, uint16_t node, struct redis_wire **w,
                      uint64_t *capacity)
{
    struct redis_probe **at, *p;

    pthread_mutex_lock(&r->lock);
    for (at = &r->probes; (p = *at) && p->node != node; at = &p->next)
        ;
    if (!p || !p->wire) {
        pthread_mutex_unlock(&r->lock);
        return false;
    }
    *at = p->next;
    pthread_mutex_unlock(&r->lock);
    *w = p->wire;
    *capacity = p->capacity;
    p->wire = NULL;
    probe_free(p);
    return true;
}
