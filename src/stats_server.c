/*
 * The engine's stats socket: a thread that answers kvtier-ctl on a unix stream socket.
 *
 * The engine is used from one owner thread, so the server never looks at it: the owner
 * publishes a copy of kvt_stats (kvt_poll, kvt_sync) under a lock, and the server formats the
 * last copy. A client writes one line, "stats" or "metrics", and reads the reply until EOF.
 *
 * Clients are not trusted to behave: one poll loop serves them all over non-blocking sockets,
 * each with a deadline for the whole exchange (CLIENT_DEADLINE_MS), at most CLIENTS_MAX at a
 * time. A client past its deadline is closed without a reply; when the table is full, a new
 * client takes the place of the one that came first. So a kvtier-ctl is answered within about
 * a second whatever the others do, and stop waits for none of them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "stats_server.h"

#define REQUEST_MAX 64
/* A client's whole exchange, its request line in and the reply out. */
#define CLIENT_DEADLINE_MS 1000
/* Clients held at a time; past it the oldest makes room (take_slot). */
#define CLIENTS_MAX 32
/* Accepts per turn of the loop, so a flood of connections cannot starve the clients held. */
#define ACCEPT_BATCH 16
/* Listening paused after accept fails for want of fds or memory: the connection stays
 * queued, and poll would report it again at once. */
#define LISTEN_PAUSE_MS 100
/* Unread input dropped before close, at most; see client_close. */
#define DRAIN_MAX 4096

struct client {
    int fd;           /* -1: a free slot */
    int64_t deadline; /* monotonic ms; also the order clients came in */
    size_t got;       /* request bytes so far */
    char req[REQUEST_MAX];
    char *reply; /* NULL while the request comes in */
    size_t len, sent;
};

struct stats_server {
    int fd;
    int wake[2]; /* a byte on wake[1] stops the thread */
    char *path;
    dev_t dev; /* the socket file start made: stop removes that one only */
    ino_t ino;
    pthread_t thread;
    pthread_mutex_t lock;
    struct kvt_stats snap; /* under lock */
    uint64_t snap_ns;
    struct client clients[CLIENTS_MAX]; /* the thread's */
    int64_t listen_paused_until;        /* the thread's; monotonic ms */
};

/* The published fields: the uint64_t members of struct kvt_stats, by name and kind. */
struct stat_field {
    const char *name;
    size_t off;
    bool counter; /* only grows; else a gauge */
    const char *help;
};

#define G(f, h)                                                                                    \
    {                                                                                              \
#f, offsetof(struct kvt_stats, f), false, h                                                \
    }
#define C(f, h)                                                                                    \
    {                                                                                              \
#f, offsetof(struct kvt_stats, f), true, h                                                 \
    }
static const struct stat_field fields[] = {
    G(device_tokens, "usable KV slots of the device pool"),
    G(device_free_tokens, "device slots the allocator can hand out"),
    G(kv_pool_bytes, "bytes of KV buffers on the device"),
    G(cached_tokens, "tokens the prefix cache holds on the device"),
    G(evictable_tokens, "cached device tokens in unlocked nodes"),
    G(protected_tokens, "cached device tokens in locked nodes"),
    G(nodes, "prefix-cache nodes"),
    G(tree_bytes, "heap bytes of prefix-cache metadata"),
    G(req_slots_free, "free request slots"),
    C(match_calls, "matches and request begins"),
    C(match_query_tokens, "page-aligned tokens asked for by matches"),
    C(match_hit_tokens, "tokens matches found on the device"),
    C(inserted_tokens, "tokens added to the prefix cache"),
    C(evicted_tokens, "tokens evicted from the device"),
    G(host_tokens, "token capacity of the host tier"),
    G(host_free_tokens, "free host slots"),
    G(host_cached_tokens, "tokens with a host copy"),
    G(host_pinned, "1 when the host pool is locked in RAM"),
    C(host_hit_tokens, "tokens matched on the host past the device prefix"),
    C(loaded_tokens, "tokens loaded back host to device"),
    C(backed_up_tokens, "tokens backed up device to host"),
    C(backup_skipped_tokens, "backups given up for lack of host room"),
    C(host_evicted_tokens, "tokens dropped from the host tier"),
    C(h2d_bytes, "bytes copied host to device"),
    C(d2h_bytes, "bytes copied device to host"),
    G(ops_in_flight, "transfers not yet applied"),
    G(disk_tokens, "token capacity of the disk tier"),
    G(disk_cached_tokens, "tokens the disk index holds"),
    C(disk_hit_tokens, "tokens found on disk past the host part of a match"),
    C(disk_read_tokens, "tokens read disk to host"),
    C(disk_written_tokens, "tokens written host to disk"),
    C(disk_errors, "disk pages found damaged, failed I/O, full disk"),
    C(disk_read_bytes, "bytes read from disk"),
    C(disk_written_bytes, "bytes written to disk"),
    G(disk_ops_in_flight, "disk reads and writes not yet applied"),
    G(disk_index_rebuilt, "1 when the disk index was damaged or lost at open and is rebuilt"),
    C(disk_recovered_tokens, "tokens the rebuild of the disk index brought back"),
    C(disk_skipped_tokens, "tokens not written to disk: a chain longer than the tier"),
    G(mamba_slots, "Mamba state slots"),
    G(mamba_free_slots, "free Mamba state slots"),
    G(mamba_cached_states, "Mamba checkpoints the prefix cache holds"),
    C(mamba_kv_hit_tokens, "device KV matches found; match_hit_tokens is the state-backed part"),
    C(mamba_evicted_states, "Mamba checkpoints evicted to make room for states"),
    G(mamba_pool_bytes, "bytes of the Mamba state pool on the device"),
    G(swa_tokens, "SWA slots of the sliding-window layers"),
    G(swa_free_tokens, "free SWA slots"),
    G(swa_cached_tokens, "cached tokens whose sliding-window KV is still held"),
    C(swa_kv_hit_tokens,
      "device KV matches found; match_hit_tokens is the part a live window backs"),
    C(swa_evicted_tokens, "sliding-window KV the cache freed while its full KV stayed"),
    C(swa_released_tokens, "sliding-window KV requests freed as their window moved on"),
    C(swa_revived_tokens, "SWA tombstones given a request's fresh sliding-window KV back"),
    G(mamba_host_slots, "host copies of Mamba states the host may keep"),
    G(mamba_host_states, "host copies of Mamba states held"),
    C(mamba_saved_states, "Mamba states copied to the host as they left the device"),
    C(mamba_restored_states, "host copies of Mamba states brought back onto the device"),
    C(mamba_stored_states, "Mamba checkpoints written to the store below (disk, remote)"),
    C(mamba_fetched_states, "Mamba states read back from the store below with their KV"),
    C(remote_hit_tokens, "tokens found on the remote tier past the host and disk"),
    C(remote_read_tokens, "tokens read remote to host"),
    C(remote_written_tokens, "tokens the remote tier kept"),
    C(remote_errors, "remote pages failed: damaged, refused, failed commands, dead servers"),
};
#undef G
#undef C
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static uint64_t field(const struct kvt_stats *st, size_t i)
{
    uint64_t v;

    memcpy(&v, (const char *)st + fields[i].off, sizeof(v));
    return v;
}

static uint64_t wall_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- formatting (into a FILE over the client's socket) ---- */

static void put_json(FILE *f, const struct kvt_stats *st, uint64_t ns)
{
    fprintf(f, "{\"kvtier\":1,\"time_ns\":%" PRIu64 ",\"stats\":{", ns);
    fprintf(f, "\"backend\":%u,\"page_size\":%u,\"disk_io\":%u", st->backend, st->page_size,
            st->disk_io);
    for (size_t i = 0; i < NFIELDS; i++)
        fprintf(f, ",\"%s\":%" PRIu64, fields[i].name, field(st, i));
    fputs("}}\n", f);
}

static void put_metrics(FILE *f, const struct kvt_stats *st)
{
    for (size_t i = 0; i < NFIELDS; i++) {
        const char *n = fields[i].name, *type = fields[i].counter ? "counter" : "gauge";
        fprintf(f, "# HELP kvtier_%s %s\n# TYPE kvtier_%s %s\nkvtier_%s %" PRIu64 "\n", n,
                fields[i].help, n, type, n, field(st, i));
    }
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void put_reply(struct stats_server *sv, FILE *f, const char *req)
{
    struct kvt_stats st;
    uint64_t ns;

    pthread_mutex_lock(&sv->lock);
    st = sv->snap;
    ns = sv->snap_ns;
    pthread_mutex_unlock(&sv->lock);
    if (strcmp(req, "stats") == 0)
        put_json(f, &st, ns);
    else if (strcmp(req, "metrics") == 0)
        put_metrics(f, &st);
    else
        fprintf(f, "error: unknown request \"%s\" (stats or metrics)\n", req);
}

/* ---- one client ---- */

static void client_close(struct client *c)
{
    char sink[512];
    size_t n = 0;
    ssize_t r;

    /* Input left unread would reach the client as ECONNRESET after the reply, in place of
     * EOF (an over-long request, say); drop what is there. */
    while (n < DRAIN_MAX && (r = recv(c->fd, sink, sizeof(sink), MSG_DONTWAIT)) > 0)
        n += (size_t)r;
    close(c->fd);
    free(c->reply);
    *c = (struct client){.fd = -1};
}

/* As much of the reply as the client takes now; closes it when all went, or on error.
 * MSG_NOSIGNAL: a client that went away must not take the engine's process with it. */
static void client_write(struct client *c)
{
    while (c->sent < c->len) {
        ssize_t w = send(c->fd, c->reply + c->sent, c->len - c->sent, MSG_NOSIGNAL);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (w <= 0)
            break;
        c->sent += (size_t)w;
    }
    client_close(c);
}

static void client_answer(struct stats_server *sv, struct client *c)
{
    FILE *f = open_memstream(&c->reply, &c->len);

    if (!f) {
        client_close(c);
        return;
    }
    c->req[strcspn(c->req, "\r\n")] = '\0';
    put_reply(sv, f, c->req);
    if (fclose(f) != 0 || !c->reply) {
        client_close(c);
        return;
    }
    client_write(c);
}

/* Takes what the client sent; answers once a line, EOF or a full buffer is in. */
static void client_read(struct stats_server *sv, struct client *c)
{
    ssize_t r = recv(c->fd, c->req + c->got, sizeof(c->req) - 1 - c->got, 0);

    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (r < 0 || (r == 0 && c->got == 0)) {
        client_close(c);
        return;
    }
    c->got += (size_t)r;
    c->req[c->got] = '\0';
    if (r == 0 || strchr(c->req, '\n') || c->got + 1 == sizeof(c->req))
        client_answer(sv, c);
}

/* ---- the thread ---- */

/* A slot for a new client: a free one, else the one of the client that came first, closed
 * without a reply. Those that stay are the ones that send nothing, so the newest is the one
 * most likely to be a kvtier-ctl about to ask. */
static struct client *take_slot(struct stats_server *sv)
{
    struct client *oldest = &sv->clients[0];

    for (int i = 0; i < CLIENTS_MAX; i++) {
        struct client *c = &sv->clients[i];
        if (c->fd < 0)
            return c;
        if (c->deadline < oldest->deadline)
            oldest = c;
    }
    client_close(oldest);
    return oldest;
}

static void accept_clients(struct stats_server *sv, int64_t now)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(sv->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                sv->listen_paused_until = now + LISTEN_PAUSE_MS;
            return;
        }
        struct client *c = take_slot(sv);
        *c = (struct client){.fd = fd, .deadline = now + CLIENT_DEADLINE_MS};
        /* One that wrote before it was accepted is answered without another poll. */
        client_read(sv, c);
    }
}

/* Closes the clients past their deadline; the ms to the next deadline, -1 for none. */
static int expire_clients(struct stats_server *sv, int64_t now)
{
    int64_t next = sv->listen_paused_until > now ? sv->listen_paused_until - now : -1;

    for (int i = 0; i < CLIENTS_MAX; i++) {
        struct client *c = &sv->clients[i];
        if (c->fd < 0)
            continue;
        if (c->deadline <= now)
            client_close(c);
        else if (next < 0 || c->deadline - now < next)
            next = c->deadline - now;
    }
    return (int)next;
}

/* p[0] the wake pipe, p[1] the listener (ignored while paused), p[2 + i] client slot i. */
static void fill_pollfds(const struct stats_server *sv, struct pollfd *p, int64_t now)
{
    p[0] = (struct pollfd){.fd = sv->wake[0], .events = POLLIN};
    p[1] = (struct pollfd){.fd = sv->listen_paused_until > now ? -1 : sv->fd, .events = POLLIN};
    for (int i = 0; i < CLIENTS_MAX; i++) {
        const struct client *c = &sv->clients[i];
        p[2 + i] = (struct pollfd){.fd = c->fd, .events = c->reply ? POLLOUT : POLLIN};
    }
}

static void *serve(void *arg)
{
    struct stats_server *sv = arg;
    struct pollfd p[2 + CLIENTS_MAX];

    for (;;) {
        int64_t now = mono_ms();
        int timeout = expire_clients(sv, now);

        fill_pollfds(sv, p, now);
        if (poll(p, 2 + CLIENTS_MAX, timeout) < 0 && errno != EINTR)
            break;
        if (p[0].revents)
            break;
        for (int i = 0; i < CLIENTS_MAX; i++) {
            struct client *c = &sv->clients[i];
            if (p[2 + i].revents && c->reply)
                client_write(c);
            else if (p[2 + i].revents)
                client_read(sv, c);
        }
        if (p[1].revents & POLLIN)
            accept_clients(sv, mono_ms());
    }
    for (int i = 0; i < CLIENTS_MAX; i++)
        if (sv->clients[i].fd >= 0)
            client_close(&sv->clients[i]);
    return NULL;
}

/* ---- the socket file ---- */

/* Whether a server answers at a: 0 when none does (a stale socket file, or none at all),
 * -EADDRINUSE when one does, else the -errno that kept us from knowing. */
static int probe(const struct sockaddr_un *a)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), rc = 0;

    if (fd < 0)
        return -errno;
    if (connect(fd, (const struct sockaddr *)a, sizeof(*a)))
        rc = -errno;
    close(fd);
    /* EAGAIN: its backlog is full; EPROTOTYPE: a datagram server. Both are alive. */
    if (rc == 0 || rc == -EAGAIN || rc == -EPROTOTYPE)
        return -EADDRINUSE;
    return rc == -ECONNREFUSED || rc == -ENOENT ? 0 : rc;
}

/* Room at a's path for a new socket: nothing there, or a stale socket, removed. Anything else
 * stays as it is: -EADDRINUSE for a live server, -EEXIST for what is not a socket. */
static int clear_path(const struct sockaddr_un *a)
{
    struct stat st, again;
    int rc;

    if (lstat(a->sun_path, &st))
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISSOCK(st.st_mode))
        return -EEXIST;
    if ((rc = probe(a)))
        return rc;
    /* Only the file probed: one put in its place since is someone else's. */
    if (lstat(a->sun_path, &again))
        return errno == ENOENT ? 0 : -errno;
    if (again.st_dev != st.st_dev || again.st_ino != st.st_ino)
        return -EEXIST;
    return unlink(a->sun_path) && errno != ENOENT ? -errno : 0;
}

static int listen_on(struct stats_server *sv)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    struct stat st;
    int fd, rc;

    if (strlen(sv->path) >= sizeof(a.sun_path))
        return -ENAMETOOLONG;
    strcpy(a.sun_path, sv->path);
    if ((rc = clear_path(&a)))
        return rc;
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
        return -errno;
    /* bind gives the file the socket's mode less the umask: 0600, for its owner. The umask
     * is left alone; it is the whole process's, and other threads create files meanwhile. */
    if (fchmod(fd, 0600) || bind(fd, (struct sockaddr *)&a, sizeof(a))) {
        rc = -errno;
        goto close_fd;
    }
    if (lstat(sv->path, &st) || listen(fd, SOMAXCONN)) {
        rc = -errno;
        goto unlink_file;
    }
    sv->fd = fd;
    sv->dev = st.st_dev;
    sv->ino = st.st_ino;
    return 0;
unlink_file:
    unlink(sv->path);
close_fd:
    close(fd);
    return rc;
}

/* The socket file, if it is still the one listen_on made. */
static void remove_socket_file(const struct stats_server *sv)
{
    struct stat st;

    if (lstat(sv->path, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == sv->dev &&
        st.st_ino == sv->ino)
        unlink(sv->path);
}

/* ---- lifetime ---- */

static void server_free(struct stats_server *sv)
{
    if (sv->fd >= 0)
        close(sv->fd);
    for (int i = 0; i < 2; i++)
        if (sv->wake[i] >= 0)
            close(sv->wake[i]);
    pthread_mutex_destroy(&sv->lock);
    free(sv->path);
    free(sv);
}

int stats_server_start(const char *path, struct stats_server **out)
{
    struct stats_server *sv = calloc(1, sizeof(*sv));
    int rc;

    if (!sv)
        return -ENOMEM;
    sv->fd = sv->wake[0] = sv->wake[1] = -1;
    for (int i = 0; i < CLIENTS_MAX; i++)
        sv->clients[i].fd = -1;
    pthread_mutex_init(&sv->lock, NULL);
    if (!(sv->path = strdup(path)))
        rc = -ENOMEM;
    else if ((rc = listen_on(sv)) == 0 && pipe2(sv->wake, O_CLOEXEC))
        rc = -errno;
    if (rc == 0 && (rc = -pthread_create(&sv->thread, NULL, serve, sv)) == 0) {
        *out = sv;
        return 0;
    }
    if (sv->fd >= 0)
        remove_socket_file(sv);
    server_free(sv);
    return rc;
}

void stats_server_publish(struct stats_server *sv, const struct kvt_stats *st)
{
    if (!sv)
        return;
    pthread_mutex_lock(&sv->lock);
    sv->snap = *st;
    sv->snap_ns = wall_ns();
    pthread_mutex_unlock(&sv->lock);
}

void stats_server_stop(struct stats_server *sv)
{
    if (!sv)
        return;
    /* A pipe with room for a byte cannot refuse it; the thread then leaves its loop at once,
     * whatever its clients are doing. */
    while (write(sv->wake[1], "x", 1) < 0 && errno == EINTR)
        ;
    pthread_join(sv->thread, NULL);
    remove_socket_file(sv);
    server_free(sv);
}
