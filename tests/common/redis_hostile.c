#include "redis_hostile.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "store/redis/redis.h"

#define MAX_CONNS 32
#define IN_BYTES (1u << 20)

struct conn {
    int fd;
    char *in;
    size_t in_len;
    char *out;
    size_t out_len, out_pos, out_cap;
    uint64_t next_ms; /* a trickle's next byte */
    bool tree;        /* HOSTILE_TREE: the tree is being sent */
    int left[HOSTILE_TREE_DEPTH], level;
    size_t tree_sent;
};

size_t redis_hostile_tree(int width, int *left, int *level, char *buf, size_t cap)
{
    size_t n = 0;

    while (n + 32 < cap) {
        if (*level >= 0 && left[*level] == 0) { /* that array is whole */
            if (--*level < 0)
                break;
            continue;
        }
        if (*level >= 0)
            left[*level]--;
        if (*level == HOSTILE_TREE_DEPTH - 1) {
            memcpy(buf + n, ":1\r\n", 4);
            n += 4;
        } else {
            n += (size_t)snprintf(buf + n, 32, "*%d\r\n", width);
            left[++*level] = width;
        }
    }
    return n;
}

static uint64_t now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void out_add(struct conn *c, const char *s, size_t n)
{
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p)
            abort();
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, s, n);
    c->out_len += n;
}

/* One whole command at the front of in: its length (0: not whole yet), its name and its first
 * argument (pointers into in). */
static size_t parse_cmd(const char *in, size_t len, const char **name, size_t *name_len,
                        const char **arg, size_t *arg_len)
{
    const char *p = in, *end = in + len, *cr;
    long n;

    *name = *arg = NULL;
    *name_len = *arg_len = 0;
    if (len < 1 || *p != '*' || !(cr = memmem(p, (size_t)(end - p), "\r\n", 2)))
        return 0;
    n = strtol(p + 1, NULL, 10);
    p = cr + 2;
    for (long i = 0; i < n; i++) {
        if (p >= end || *p != '$' || !(cr = memmem(p, (size_t)(end - p), "\r\n", 2)))
            return 0;
        size_t l = (size_t)strtol(p + 1, NULL, 10);
        p = cr + 2;
        if ((size_t)(end - p) < l + 2)
            return 0;
        if (i == 0)
            *name = p, *name_len = l;
        if (i == 1)
            *arg = p, *arg_len = l;
        p += l + 2;
    }
    return (size_t)(p - in);
}

static bool is(const char *name, size_t len, const char *what)
{
    return len == strlen(what) && !strncasecmp(name, what, len);
}

static void reply_trickle(struct conn *c, const char *name, size_t len)
{
    const char *r = is(name, len, "CLUSTER") ? "-ERR This instance has cluster support disabled\r\n"
                    : is(name, len, "GET")   ? "$-1\r\n"
                    : is(name, len, "EXISTS") ? ":0\r\n"
                    : is(name, len, "PING")   ? "+PONG\r\n"
                                              : "+OK\r\n";
    out_add(c, r, strlen(r));
}

static void reply_ask(struct redis_hostile *h, struct conn *c, const char *name, size_t len,
                      const char *arg, size_t arg_len)
{
    char r[160];
    int n;

    if (is(name, len, "CLUSTER"))
        n = snprintf(r, sizeof(r), "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%u\r\n",
                     h->map_port);
    else if (arg && (is(name, len, "GET") || is(name, len, "SET") || is(name, len, "EXISTS") ||
                     is(name, len, "DEL")))
        n = snprintf(r, sizeof(r), "-ASK %u 127.0.0.1:%u\r\n", store_redis_slot(arg, arg_len),
                     h->peer_port);
    else if (is(name, len, "DBSIZE"))
        n = snprintf(r, sizeof(r), ":0\r\n");
    else if (is(name, len, "PING"))
        n = snprintf(r, sizeof(r), "+PONG\r\n");
    else
        n = snprintf(r, sizeof(r), "+OK\r\n");
    out_add(c, r, (size_t)n);
}

static void answer(struct redis_hostile *h, struct conn *c)
{
    const char *name, *arg;
    size_t name_len, arg_len, k, used = 0;

    while ((k = parse_cmd(c->in + used, c->in_len - used, &name, &name_len, &arg, &arg_len))) {
        if (is(name, name_len, "GET") || is(name, name_len, "SET") ||
            is(name, name_len, "EXISTS") || is(name, name_len, "DEL"))
            atomic_fetch_add(&h->commands, 1);
        if (h->mode == HOSTILE_TRICKLE)
            reply_trickle(c, name, name_len);
        else if (h->mode == HOSTILE_ASK)
            reply_ask(h, c, name, name_len, arg, arg_len);
        else if (!c->tree)
            c->tree = true, c->level = -1; /* the first command's answer, never whole */
        used += k;
    }
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
}

static void drop(struct conn *c)
{
    close(c->fd);
    free(c->in);
    free(c->out);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

/* Read what came; false when the connection is gone. */
static bool take_in(struct redis_hostile *h, struct conn *c)
{
    ssize_t k;

    if (c->in_len == IN_BYTES)
        return false;
    if ((k = read(c->fd, c->in + c->in_len, IN_BYTES - c->in_len)) <= 0)
        return false;
    c->in_len += (size_t)k;
    answer(h, c);
    return true;
}

/* Send what is due: all of it, or one byte when its time has come (a trickle). */
static bool give_out(struct redis_hostile *h, struct conn *c)
{
    size_t n = c->out_len - c->out_pos;
    ssize_t k;

    if (!n && c->tree && c->tree_sent < h->tree_bytes) {
        char buf[1 << 16];
        size_t t = redis_hostile_tree(HOSTILE_TREE_WIDTH, c->left, &c->level, buf, sizeof(buf));
        out_add(c, buf, t);
        c->tree_sent += t;
        n = t;
    }
    if (!n)
        return true;
    if (h->gap_ms) {
        if (now_ms() < c->next_ms)
            return true;
        n = 1;
        c->next_ms = now_ms() + h->gap_ms;
    }
    if ((k = send(c->fd, c->out + c->out_pos, n, MSG_NOSIGNAL | MSG_DONTWAIT)) < 0)
        return errno == EAGAIN;
    c->out_pos += (size_t)k;
    if (c->out_pos == c->out_len)
        c->out_pos = c->out_len = 0;
    return true;
}

static void accept_one(struct redis_hostile *h, struct conn *conns)
{
    int fd = accept(h->lfd, NULL, NULL), one = 1;

    if (fd < 0)
        return;
    /* Replies go out as they are made: no Nagle wait behind the client's delayed ACK. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].fd < 0 && (conns[i].in = malloc(IN_BYTES))) {
            conns[i].fd = fd;
            atomic_fetch_add(&h->connections, 1);
            return;
        }
    close(fd);
}

static void *serve(void *arg)
{
    struct redis_hostile *h = arg;
    struct conn conns[MAX_CONNS];
    struct pollfd p[MAX_CONNS + 1];

    for (int i = 0; i < MAX_CONNS; i++)
        conns[i] = (struct conn){.fd = -1};
    while (!atomic_load(&h->stop)) {
        p[0] = (struct pollfd){.fd = h->lfd, .events = POLLIN};
        for (int i = 0; i < MAX_CONNS; i++)
            p[i + 1] = (struct pollfd){.fd = conns[i].fd, .events = POLLIN};
        poll(p, MAX_CONNS + 1, 5);
        if (p[0].revents & POLLIN)
            accept_one(h, conns);
        for (int i = 0; i < MAX_CONNS; i++)
            if (conns[i].fd >= 0 &&
                (((p[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) && !take_in(h, &conns[i])) ||
                 !give_out(h, &conns[i])))
                drop(&conns[i]);
    }
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].fd >= 0)
            drop(&conns[i]);
    return NULL;
}

int redis_hostile_start(struct redis_hostile *h)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    int rc;

    atomic_store(&h->commands, 0);
    atomic_store(&h->connections, 0);
    atomic_store(&h->stop, false);
    if ((h->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return -errno;
    if (bind(h->lfd, (struct sockaddr *)&a, sizeof(a)) || listen(h->lfd, 64) ||
        getsockname(h->lfd, (struct sockaddr *)&a, &al)) {
        rc = -errno;
        close(h->lfd);
        return rc;
    }
    h->port = ntohs(a.sin_port);
    if ((rc = pthread_create(&h->thread, NULL, serve, h))) {
        close(h->lfd);
        return -rc;
    }
    return 0;
}

void redis_hostile_stop(struct redis_hostile *h)
{
    atomic_store(&h->stop, true);
    pthread_join(h->thread, NULL);
    close(h->lfd);
}
