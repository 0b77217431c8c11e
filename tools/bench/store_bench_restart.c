/*
 * kvtier-store-bench --remote-restart: how long the Redis store takes to serve again after its
 * server restarts. The tool runs a redis-server of its own (on a free loopback port, no
 * persistence, in the work dir) and one store on it, opened as kvt_open opens options.remote
 * (timeouts of 1000 ms, backoff_max_ms as given). Each rep: ops run back to back (an op: a
 * write of --batch pages under new keys, then their read, checked byte for byte) while the
 * server is killed (SIGKILL), left down for a while, and started again on its port, empty. The
 * clock starts when the new server is started; the figures are the time from then to its
 * PING, to the store's first write whose pages were all kept and its first read that got them
 * all back, and the ops that failed from the kill on. What bounds it: after a failed connect the
 * I/O thread waits 20 ms before the next, doubling up to backoff_max_ms, and pages fail at once
 * meanwhile; so the first op that succeeds is the first after the wait that was running at the
 * restart (at most backoff_max_ms once the outage outlasted the doublings).
 */
#include "store_bench_remote.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fio.h"
#include "store/redis/client.h"
#include "store/redis/redis.h"

#define PROG "kvtier-store-bench"
#define STORE_TIMEOUT_MS 1000 /* kvt_open's remote_timeout_ms default */
#define SERVE_WAIT_S 30.0     /* the most a rep waits for the store to serve again */
#define MAX_SAMPLES 256

struct server {
    char path[4096], dir[4096];
    uint16_t port;
    pid_t pid;
};

/* One rep's figures (seconds from the new server's PING). */
struct sample {
    uint32_t down_ms;
    double ready_s;      /* from the start of the new server to its PING */
    double since_kill_s; /* from the kill to the new server's PING */
    double write_s, read_s;
    uint64_t failed_ops;   /* ops (a write and its read) that failed from the kill on */
    uint64_t failed_after; /* of them, those after the new server's start */
};

static void sleep_ms(double ms)
{
    struct timespec t = {(time_t)(ms / 1000),
                         (long)((ms - (double)(time_t)(ms / 1000) * 1000) * 1e6)};

    nanosleep(&t, NULL);
}

static bool answers_ping(uint16_t port)
{
    const struct redis_wire_timeouts t = {200, 200, 200};
    const char *ping[] = {"PING"};
    struct resp_value *rep;
    bool ok;

    redis_call_once("127.0.0.1", port, &t, 1, ping, NULL, &rep);
    ok = rep && rep->type == RESP_STATUS;
    redis_resp_free(rep);
    return ok;
}

/* Start the server on its port; 0 once it answers PING (10 s at most). */
static int server_start(struct server *s)
{
    char port[8];

    snprintf(port, sizeof(port), "%u", s->port);
    if ((s->pid = fork()) < 0)
        return -errno;
    if (s->pid == 0) {
        char *argv[] = {s->path,  "--port",    port,           "--bind", "127.0.0.1",
                        "--save", "",          "--appendonly", "no",     "--dir",
                        s->dir,   "--logfile", "redis.log",    NULL};
        execv(s->path, argv);
        _exit(127);
    }
    for (double t0 = cli_now(); cli_now() - t0 < 10; sleep_ms(0.5))
        if (answers_ping(s->port))
            return 0;
    return -ETIMEDOUT;
}

static void server_kill(struct server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

/* A free loopback port: the kernel's pick for a socket bound to port 0; 0 on failure. */
static uint16_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    uint16_t port = 0;

    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static int open_store(const struct restart_bench_config *c, uint16_t port, struct kvt_store **s)
{
    struct store_redis_options o = {.port = port,
                                    .page_bytes = c->page_bytes,
                                    .page_tokens = 16,
                                    .connect_timeout_ms = STORE_TIMEOUT_MS,
                                    .read_timeout_ms = STORE_TIMEOUT_MS,
                                    .write_timeout_ms = STORE_TIMEOUT_MS,
                                    .backoff_max_ms = c->backoff_max_ms};

    memset(o.fingerprint, 0x5e, sizeof(o.fingerprint));
    return store_redis_open(&o, s);
}

/* The op's buffers: batch keys and pages, and room to read them back. */
struct op_bufs {
    uint8_t *keys, *data, *back;
    int *results;
    uint64_t next_key;
};

/* Write batch pages under new keys and wait; true when every page was kept. */
static bool write_op(struct kvt_store *s, const struct restart_bench_config *c, struct op_bufs *b)
{
    struct store_wpage w[256];
    struct store_done d;
    uint64_t id;

    for (uint64_t i = 0; i < c->batch; i++) {
        uint64_t k = b->next_key++;
        memset(b->keys + i * STORE_KEY_BYTES, 0, STORE_KEY_BYTES);
        memcpy(b->keys + i * STORE_KEY_BYTES, &k, sizeof(k));
        memcpy(b->data + i * c->page_bytes, &k, sizeof(k)); /* each page its own bytes */
        w[i] = (struct store_wpage){.key = b->keys + i * STORE_KEY_BYTES,
                                    .buf = b->data + i * c->page_bytes};
    }
    return store_write(s, w, c->batch, b->results, &id) == 0 &&
           store_wait_for(s, id, -1, &d) == 0 && d.ok == c->batch;
}

/* Read the pages write_op wrote back; true when all came back exact. */
static bool read_op(struct kvt_store *s, const struct restart_bench_config *c, struct op_bufs *b)
{
    struct store_rpage r[256];
    struct store_done d;
    uint64_t id;

    memset(b->back, 0, c->batch * c->page_bytes);
    for (uint64_t i = 0; i < c->batch; i++)
        r[i] = (struct store_rpage){.key = b->keys + i * STORE_KEY_BYTES,
                                    .buf = b->back + i * c->page_bytes};
    return store_read(s, r, c->batch, b->results, &id, NULL) == 0 &&
           store_wait_for(s, id, -1, &d) == 0 && d.ok == c->batch &&
           !memcmp(b->back, b->data, c->batch * c->page_bytes);
}

/* Ops until both a write and a read succeeded after t0, or SERVE_WAIT_S; each op failing
 * counted. */
static int until_served(struct kvt_store *s, const struct restart_bench_config *c,
                        struct op_bufs *b, double t0, struct sample *x)
{
    x->write_s = x->read_s = -1;
    while (x->read_s < 0) {
        if (cli_now() - t0 > SERVE_WAIT_S)
            return -ETIMEDOUT;
        bool w = write_op(s, c, b);
        if (w && x->write_s < 0)
            x->write_s = cli_now() - t0;
        bool r = w && read_op(s, c, b);
        if (r)
            x->read_s = cli_now() - t0;
        x->failed_ops += !r;
        x->failed_after += !r;
        if (!r)
            sleep_ms(0.2); /* an engine's next op comes soon, not at once */
    }
    return 0;
}

/* One rep: the server killed while ops run, down for down_ms, started again. */
static int restart_rep(const struct restart_bench_config *c, struct server *srv,
                       struct kvt_store *s, struct op_bufs *b, uint32_t down_ms, struct sample *x)
{
    double t_kill, t_start;
    int rc;

    *x = (struct sample){.down_ms = down_ms};
    for (int i = 0; i < 20; i++) /* served before: the connection is up */
        if (!write_op(s, c, b) || !read_op(s, c, b))
            return -EIO;
    server_kill(srv);
    t_kill = cli_now();
    while (cli_now() - t_kill < down_ms / 1e3) { /* the engine goes on meanwhile */
        bool ok = write_op(s, c, b) && read_op(s, c, b);
        x->failed_ops += !ok;
        sleep_ms(0.2);
    }
    t_start = cli_now();
    if ((rc = server_start(srv)))
        return rc;
    x->ready_s = cli_now() - t_start;
    x->since_kill_s = cli_now() - t_kill;
    return until_served(s, c, b, t_start, x);
}

/* The wait the backoff still had to run when the new server answered: the store's connects
 * come at 20, 60, 140, ... ms after the kill (gaps doubling from 20 ms to backoff_max_ms),
 * taking the first failed op as the kill. What the first op after the restart waits for, at
 * most, before its connect. */
static double backoff_left_s(const struct restart_bench_config *c, double since_kill_s)
{
    double at = 0, gap = 0.020, max = c->backoff_max_ms / 1e3;

    while (at <= since_kill_s) {
        at += gap;
        gap = gap * 2 > max ? max : gap * 2;
    }
    return at - since_kill_s;
}

/* From the new server's start: its PING, then the wait the backoff still had. */
static double bound_s(const struct restart_bench_config *c, const struct sample *x)
{
    return x->ready_s + backoff_left_s(c, x->since_kill_s);
}

static void report(const struct restart_bench_config *c, const struct sample *x, size_t n)
{
    if (c->json) {
        printf("{\"page_bytes\":%u,\"batch\":%" PRIu64 ",\"backoff_max_ms\":%u,\"samples\":[",
               c->page_bytes, c->batch, c->backoff_max_ms);
        for (size_t i = 0; i < n; i++)
            printf("%s{\"down_ms\":%u,\"ping_ms\":%.1f,\"bound_ms\":%.1f,"
                   "\"first_write_ms\":%.1f,\"first_read_ms\":%.1f,\"failed_ops\":%" PRIu64
                   ",\"failed_after_start\":%" PRIu64 "}",
                   i ? "," : "", x[i].down_ms, x[i].ready_s * 1e3, bound_s(c, &x[i]) * 1e3,
                   x[i].write_s * 1e3, x[i].read_s * 1e3, x[i].failed_ops, x[i].failed_after);
        printf("]}\n");
        return;
    }
    printf("kvtier-store-bench --remote-restart: a redis-server of its own, killed and started\n"
           "again while ops run (an op: %" PRIu64 " pages of %u B written, then read back);\n"
           "backoff 20 ms doubling to %u ms\n\n",
           c->batch, c->page_bytes, c->backoff_max_ms);
    printf("  %8s %8s %9s %15s %14s %11s %12s\n", "down ms", "PING ms", "bound ms",
           "first write ms", "first read ms", "failed ops", "after start");
    for (size_t i = 0; i < n; i++)
        printf("  %8u %8.1f %9.1f %15.1f %14.1f %11" PRIu64 " %12" PRIu64 "\n", x[i].down_ms,
               x[i].ready_s * 1e3, bound_s(c, &x[i]) * 1e3, x[i].write_s * 1e3, x[i].read_s * 1e3,
               x[i].failed_ops, x[i].failed_after);
    printf("\n  ms from starting the new server (empty, on the old port). PING: when it answered;\n"
           "  bound: the store's first connect due after that (connects at 20, 60, 140, ... ms\n"
           "  from the kill, the gaps doubling to the backoff max), what the first write waits\n"
           "  for at most, its own time aside; one that came while the server was starting and\n"
           "  already listening finds it sooner. Failed ops: from the kill on (an op failing\n"
           "  fast while the backoff runs), and of them after the new server's start.\n");
}

static int run_reps(const struct restart_bench_config *c, struct server *srv, struct kvt_store *s,
                    struct op_bufs *b, struct sample *x, size_t *n)
{
    int rc = 0;

    *n = 0;
    for (uint64_t rep = 0; rep < c->reps && !rc; rep++)
        for (size_t i = 0; i < c->n_down && *n < MAX_SAMPLES && !rc; i++) {
            rc = restart_rep(c, srv, s, b, c->down_ms[i], &x[*n]);
            *n += rc == 0;
        }
    if (rc)
        fprintf(stderr, PROG ": --remote-restart: %s\n",
                rc == -ETIMEDOUT ? "the store did not serve again within 30 s, or the server "
                                   "did not start"
                                 : strerror(-rc));
    return rc;
}

int restart_bench_run(const struct restart_bench_config *c)
{
    struct server srv = {.port = free_port()};
    struct op_bufs b = {.next_key = 1};
    struct sample *x = calloc(MAX_SAMPLES, sizeof(*x));
    struct kvt_store *s = NULL;
    size_t n = 0;
    int rc = 1;

    if (!srv.port || !fio_find_program(c->redis_server, srv.path, sizeof(srv.path))) {
        fprintf(stderr, PROG ": --remote-restart: %s not found\n", c->redis_server);
        free(x);
        return 1;
    }
    snprintf(srv.dir, sizeof(srv.dir), "%s", c->dir);
    b.keys = malloc(c->batch * STORE_KEY_BYTES);
    b.data = calloc(c->batch, c->page_bytes);
    b.back = malloc(c->batch * c->page_bytes);
    b.results = malloc(c->batch * sizeof(int));
    if (x && b.keys && b.data && b.back && b.results && server_start(&srv) == 0 &&
        open_store(c, srv.port, &s) == 0 && run_reps(c, &srv, s, &b, x, &n) == 0) {
        report(c, x, n);
        rc = 0;
    }
    store_close(s);
    server_kill(&srv);
    free(b.keys);
    free(b.data);
    free(b.back);
    free(b.results);
    free(x);
    return rc;
}
