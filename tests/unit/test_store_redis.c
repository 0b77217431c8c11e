/*
 * The Redis store (src/store/redis/) against a redis-server of each test's own, where the
 * contract test cannot go: what a shared, untrusted, mortal server does to it.
 * - values overwritten with garbage, truncated, with another fingerprint's header, with a
 *   flipped payload byte, or of another type: each read is KVT_ECORRUPT, never bytes; the
 *   bad values are deleted, counted, and the pages can be written again;
 * - FLUSHALL between a write and a read: misses, a leading run of 0, and writes work again;
 * - the server killed: ops fail (-EIO / -ECONNREFUSED) within the timeouts and leading_run
 *   answers 0 at once; a new server on the port and the store serves again;
 * - the server stopped (SIGSTOP): the first op fails within the read timeout, the server is
 *   marked down, and requests then cost nothing (the prober tries it); SIGCONT, served again;
 * - a hostile server that trickles every reply a byte at a time: marked down at its first
 *   reply, requests then cost nothing; two that send every command to each other with ASK:
 *   given up past the redirections, the node marked down, later requests not sent round; one
 *   that answers with an endless tree of arrays: cut off at the whole reply's bounds, said;
 * - a TTL: the page is there, then gone once it expires;
 * - ACL users (AUTH user password): the right user and password (percent-encoded ':', '@', ',')
 *   read and write; a wrong password, or a user without GET and SET, gets misses, counted
 *   (auth_refused, denied, the server's text), and the store goes on.
 * And over a 3-master Redis Cluster of the test's own (redis_cluster.h):
 * - pages and their copies spread over every master (a copy never on its page's), found from
 *   any one seed, read exact;
 * - a slot migrated while the store runs: ASK while its keys move (the map untouched), then
 *   MOVED once the slot is the new node's (the map updated), every read exact;
 * - a master killed: every page still read and the leading run whole (the copies); with
 *   copies=1 its slots' pages fail and the run stops at the first; restarted, it serves again;
 * - a master stopped (SIGSTOP): the first read waits the timeout, every page from its copy;
 *   then requests cost nothing; SIGCONT and it serves again;
 * - with a replica per master, one key a page: a master killed, its pages read from its
 *   replica by a store that may (replica_reads), then, once the replica took over, served
 *   again by the store that could not, without a restart.
 * And over TLS (a server with a TLS port and certificates of the test's own):
 * - the CA given, the server named as its certificate names it (IP 127.0.0.1, DNS localhost):
 *   pages written and read exact;
 * - another CA, a name the certificate does not carry, a plain server behind rediss://, a TLS
 *   port spoken to in plain, a server that wants a client certificate and gets none: every
 *   page fails (counted), none is served, nothing hangs; the reason is kept (last_refusal);
 * - the client certificate given to that server: pages exact;
 * - a CA or certificate file that cannot be read: refused at open, the file named;
 * - a 3-master cluster over TLS (its bus too): pages spread over every master, read exact;
 * - the client writing over TLS to a server that died, on a thread that lets SIGPIPE kill:
 *   -EIO, the process lives.
 * Skipped (exit 77) where redis-server is not installed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "redis_cluster.h"
#include "redis_hostile.h"
#include "redis_server.h"
#include "store/redis/client.h"
#include "store/redis/redis.h"
#include "store/store.h"

#define PAGE_BYTES 4000
#define PAGES 8
#define CLUSTER_PAGES 48 /* enough that every master holds some */
#define MAX_PAGES CLUSTER_PAGES
#define TIMEOUT_MS 300
/* Requests against a hung server, SPACED_GAP_MS apart as an engine's come: before a hung node
 * was known down, each retry waited the timeout again (some 2.4 s for these); now they may
 * take SPACED_BOUND_MS in all (a few ms each; some 250 ms in all under TSan). */
#define SPACED_OPS 20
#define SPACED_GAP_MS 100
#define SPACED_BOUND_MS 900

struct fixture {
    struct redis_server srv;
    struct redis_cluster cl;
    bool cluster;
    struct kvt_store *s;
    struct store_redis_options o;
    char url[256], url_buf[256];
    uint8_t keys[MAX_PAGES][STORE_KEY_BYTES];
    uint8_t *bufs; /* MAX_PAGES pages */
};

static uint64_t now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void make_pages(struct fixture *f, uint32_t seed)
{
    for (uint32_t i = 0; i < MAX_PAGES; i++) {
        memset(f->keys[i], 0, STORE_KEY_BYTES);
        memcpy(f->keys[i], &seed, sizeof(seed));
        memcpy(f->keys[i] + 4, &i, sizeof(i));
        f->keys[i][31] = 0x5a;
        for (size_t b = 0; b < PAGE_BYTES; b++)
            f->bufs[(size_t)i * PAGE_BYTES + b] = (uint8_t)(seed * 31 + i * 7 + b * 13);
    }
}

static void default_options(struct fixture *f, uint32_t ttl_s)
{
    f->o = (struct store_redis_options){.port = f->srv.port,
                                        .page_bytes = PAGE_BYTES,
                                        .page_tokens = 4,
                                        .connect_timeout_ms = TIMEOUT_MS,
                                        .read_timeout_ms = TIMEOUT_MS,
                                        .write_timeout_ms = TIMEOUT_MS,
                                        .backoff_max_ms = 200,
                                        .ttl_s = ttl_s};
    memset(f->o.fingerprint, 0x42, sizeof(f->o.fingerprint));
}

/* On a cluster, the seeds come from f->url as options.remote gives them. */
static int open_store(struct fixture *f, uint32_t ttl_s)
{
    default_options(f, ttl_s);
    if (f->cluster && store_redis_parse_url(f->url, f->url_buf, sizeof(f->url_buf), &f->o))
        return -1;
    return store_redis_open(&f->o, &f->s);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    if (!f || !(f->bufs = malloc((size_t)MAX_PAGES * PAGE_BYTES)) ||
        redis_server_start(&f->srv, 0) || open_store(f, 0))
        return -1;
    make_pages(f, 1);
    *state = f;
    return 0;
}

/* f->s replaced by a store on f->srv opened from url (options.remote's form). */
static void reopen_url(struct fixture *f, const char *fmt)
{
    store_close(f->s);
    f->s = NULL;
    snprintf(f->url, sizeof(f->url), fmt, f->srv.port);
    default_options(f, 0);
    assert_int_equal(store_redis_parse_url(f->url, f->url_buf, sizeof(f->url_buf), &f->o), 0);
    assert_int_equal(store_redis_open(&f->o, &f->s), 0);
}

static int setup_cluster(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    if (!f || !(f->bufs = malloc((size_t)MAX_PAGES * PAGE_BYTES)) || redis_cluster_start(&f->cl))
        return -1;
    f->cluster = true;
    redis_cluster_url(&f->cl, 0, f->url, sizeof(f->url));
    if (open_store(f, 0))
        return -1;
    make_pages(f, 1);
    *state = f;
    return 0;
}

/* A cluster whose masters each have a replica (node 3 + i copies node i), the store on it
 * with one key a page (copies=1): what a failover brings back is the replica's. */
static int setup_cluster_replicas(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    if (!f || !(f->bufs = malloc((size_t)MAX_PAGES * PAGE_BYTES)))
        return -1;
    f->cl.replicas = true;
    if (redis_cluster_start(&f->cl))
        return -1;
    f->cluster = true;
    redis_cluster_url(&f->cl, 0, f->url, sizeof(f->url));
    strcat(f->url, "?copies=1");
    if (open_store(f, 0))
        return -1;
    make_pages(f, 2);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    store_close(f->s);
    if (f->cluster)
        redis_cluster_stop(&f->cl);
    else
        redis_server_stop(&f->srv);
    free(f->bufs);
    free(f);
    return 0;
}

/* Write the n first pages and wait: each page's result into results. */
static void write_pages(struct fixture *f, size_t n, int *results)
{
    struct store_wpage w[MAX_PAGES];
    struct store_done d;
    uint64_t op = 0;

    for (size_t i = 0; i < n; i++)
        w[i] = (struct store_wpage){.key = f->keys[i], .buf = f->bufs + i * PAGE_BYTES};
    assert_int_equal(store_write(f->s, w, n, results, &op), 0);
    assert_int_equal(store_wait_for(f->s, op, -1, &d), 0);
}

static void write_n_ok(struct fixture *f, size_t n)
{
    int res[MAX_PAGES];

    write_pages(f, n, res);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], 0);
}

static void write_all_ok(struct fixture *f)
{
    write_n_ok(f, PAGES);
}

/* Read the n first pages; a page read 0 must be exact, whatever else happened. Returns how
 * many were read. */
static size_t read_pages(struct fixture *f, size_t n, int *results)
{
    struct store_rpage r[MAX_PAGES];
    struct store_done d;
    uint8_t *got = malloc((size_t)MAX_PAGES * PAGE_BYTES);
    uint64_t op = 0;
    size_t ok = 0;

    assert_non_null(got);
    memset(got, 0xee, (size_t)MAX_PAGES * PAGE_BYTES);
    for (size_t i = 0; i < n; i++)
        r[i] = (struct store_rpage){.key = f->keys[i], .buf = got + i * PAGE_BYTES};
    assert_int_equal(store_read(f->s, r, n, results, &op, NULL), 0);
    assert_int_equal(store_wait_for(f->s, op, -1, &d), 0);
    for (size_t i = 0; i < n; i++)
        if (results[i] == 0) {
            assert_memory_equal(got + i * PAGE_BYTES, f->bufs + i * PAGE_BYTES, PAGE_BYTES);
            ok++;
        }
    assert_int_equal(d.ok, ok);
    free(got);
    return ok;
}

/* Put value (len bytes) under page i's server key, as any client could. */
static void put_raw(struct fixture *f, size_t i, const void *value, size_t len)
{
    char name[STORE_REDIS_KEY_CHARS + 1];
    const char *argv[] = {"SET", name, value};
    size_t lens[] = {3, STORE_REDIS_KEY_CHARS, len};

    store_redis_key(f->o.fingerprint, f->keys[i], name);
    assert_int_equal(redis_server_cmd(&f->srv, 3, argv, lens), 0);
}

static long long key_cmd(struct fixture *f, const char *cmd, size_t i)
{
    char name[STORE_REDIS_KEY_CHARS + 1];
    const char *argv[] = {cmd, name};

    store_redis_key(f->o.fingerprint, f->keys[i], name);
    return redis_server_cmd(&f->srv, 2, argv, NULL);
}

static void test_damaged_values(void **state)
{
    struct fixture *f = *state;
    size_t len = STORE_REDIS_HEAD_BYTES + PAGE_BYTES, run = 0;
    uint8_t *v = malloc(len), other[STORE_REDIS_FP_BYTES];
    struct store_redis_counters c;
    int res[PAGES];

    assert_non_null(v);
    write_all_ok(f);
    put_raw(f, 1, "garbage", 7);
    store_redis_value(f->o.fingerprint, f->keys[2], f->bufs + 2 * PAGE_BYTES, PAGE_BYTES, v);
    put_raw(f, 2, v, len - 1); /* truncated */
    memset(other, 0x43, sizeof(other));
    store_redis_value(other, f->keys[3], f->bufs + 3 * PAGE_BYTES, PAGE_BYTES, v);
    put_raw(f, 3, v, len); /* another fingerprint's page, under ours */
    store_redis_value(f->o.fingerprint, f->keys[5], f->bufs + 5 * PAGE_BYTES, PAGE_BYTES, v);
    put_raw(f, 4, v, len); /* page 5's value under page 4's key */
    store_redis_value(f->o.fingerprint, f->keys[6], f->bufs + 6 * PAGE_BYTES, PAGE_BYTES, v);
    v[len - 1] ^= 1;
    put_raw(f, 6, v, len); /* a flipped payload bit */
    assert_int_equal(key_cmd(f, "DEL", 7), 1);
    const char *sadd[] = {"SADD", NULL, "member"};
    char name[STORE_REDIS_KEY_CHARS + 1];
    store_redis_key(f->o.fingerprint, f->keys[7], name);
    sadd[1] = name;
    assert_int_equal(redis_server_cmd(&f->srv, 3, sadd, NULL), 1); /* another type */

    assert_int_equal(read_pages(f, PAGES, res), 2);
    assert_int_equal(res[0], 0);
    assert_int_equal(res[5], 0);
    for (size_t i = 1; i < PAGES; i++)
        if (i != 5)
            assert_int_equal(res[i], KVT_ECORRUPT);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.corrupt, 6);
    for (size_t i = 1; i < PAGES; i++) /* the bad values are gone */
        assert_int_equal(key_cmd(f, "EXISTS", i), i == 5);
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], PAGES, &run), 0);
    assert_int_equal(run, 1);
    write_all_ok(f); /* written again, and now read exact */
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
    struct store_stats st;
    store_stats(f->s, &st);
    assert_true(st.errors >= 6);
    free(v);
}

static void test_flushall(void **state)
{
    struct fixture *f = *state;
    const char *flush[] = {"FLUSHALL"};
    size_t run = 0;
    int res[PAGES];

    write_all_ok(f);
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], PAGES, &run), 0);
    assert_int_equal(run, PAGES);
    assert_int_equal(redis_server_cmd(&f->srv, 1, flush, NULL), 0);
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], PAGES, &run), 0);
    assert_int_equal(run, 0);
    assert_int_equal(read_pages(f, PAGES, res), 0);
    for (size_t i = 0; i < PAGES; i++)
        assert_int_equal(res[i], -ENOENT);
    write_all_ok(f);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
}

/* An op's wait, timed: it must end within the timeouts whatever the server does. */
static uint64_t timed_read(struct fixture *f, int *res)
{
    uint64_t t0 = now_ms();

    assert_int_equal(read_pages(f, PAGES, res), 0);
    return now_ms() - t0;
}

static void test_server_killed(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    uint16_t port = f->srv.port;
    uint64_t t0, ms;
    size_t run = 1, got = 0;
    int res[PAGES];

    write_all_ok(f);
    redis_server_stop(&f->srv);
    ms = timed_read(f, res);
    assert_true(ms < 3 * TIMEOUT_MS);
    for (size_t i = 0; i < PAGES; i++)
        assert_true(res[i] == -EIO || res[i] == -ECONNREFUSED);
    write_pages(f, PAGES, res);
    for (size_t i = 0; i < PAGES; i++)
        assert_true(res[i] == -EIO || res[i] == -ECONNREFUSED);
    t0 = now_ms();
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], PAGES, &run), 0);
    assert_int_equal(run, 0);
    assert_true(now_ms() - t0 < 2 * TIMEOUT_MS);
    /* A new, empty server where the old one was: the store comes back to it. */
    assert_int_equal(redis_server_start(&f->srv, port), 0);
    for (t0 = now_ms(); now_ms() - t0 < 5000 && got < PAGES; usleep(50000)) {
        write_pages(f, PAGES, res);
        got = read_pages(f, PAGES, res);
    }
    assert_int_equal(got, PAGES);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_true(c.connects >= 2);
    assert_int_equal(c.connected, 1);
    assert_true(c.failed >= 2 * PAGES);
}

/* Pages read while the server is stopped fail; the leading run finds nothing. */
static void expect_nothing(struct fixture *f)
{
    size_t run = 1;
    int res[PAGES];

    assert_int_equal(read_pages(f, PAGES, res), 0);
    for (size_t i = 0; i < PAGES; i++)
        assert_true(res[i] == -EIO || res[i] == -ECONNREFUSED);
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], PAGES, &run), 0);
    assert_int_equal(run, 0);
}

/* The server stopped (SIGSTOP), as a hung one: the first exchange waits out the read timeout
 * and marks it down; from then on requests fail at once (each retry waited the timeout again
 * before: seconds for these), while the prober tries it in the background. SIGCONT: a probe
 * answers and the store serves again. */
static void test_server_stopped(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    uint64_t first, spent = 0;
    int res[PAGES];

    write_all_ok(f);
    assert_int_equal(kill(f->srv.pid, SIGSTOP), 0);
    first = timed_read(f, res);
    for (int k = 0; k < SPACED_OPS && spent < 20 * TIMEOUT_MS; k++) {
        uint64_t t0 = now_ms();
        expect_nothing(f);
        spent += now_ms() - t0;
        usleep(SPACED_GAP_MS * 1000);
    }
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(kill(f->srv.pid, SIGCONT), 0);
    printf("test_store_redis: server stopped: first read %" PRIu64 " ms, then %d requests %" PRIu64
           " ms in all; %" PRIu64 " probes, %s\n",
           first, SPACED_OPS, spent, c.probes, c.last_error);
    assert_true(first < 4 * TIMEOUT_MS);
    assert_true(spent < SPACED_BOUND_MS);
    assert_int_equal(c.nodes_down, 1);
    assert_true(c.probes >= 1);
    assert_non_null(strstr(c.last_error, "no whole reply"));
    for (uint64_t t0 = now_ms(); now_ms() - t0 < 5000 && read_pages(f, PAGES, res) < PAGES;)
        usleep(50000);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.nodes_down, 0);
}

/* A server that sends its replies a byte every 100 ms: no single read ever waits the 300 ms
 * timeout, yet no reply is whole within it. It is marked down at its first reply, and
 * requests then cost nothing (before, each waited out whole replies: seconds each). */
static void test_trickling_server(void **state)
{
    struct fixture *f = *state;
    struct redis_hostile h = {.mode = HOSTILE_TRICKLE, .gap_ms = 100};
    struct store_redis_counters c;
    uint64_t spent = 0;
    int res[PAGES];

    assert_int_equal(redis_hostile_start(&h), 0);
    store_close(f->s);
    default_options(f, 0);
    f->o.port = h.port;
    assert_int_equal(store_redis_open(&f->o, &f->s), 0);
    for (int k = 0; k < SPACED_OPS && spent < 20 * TIMEOUT_MS; k++) {
        uint64_t t0 = now_ms();
        write_pages(f, PAGES, res);
        expect_nothing(f);
        spent += now_ms() - t0;
        usleep(SPACED_GAP_MS * 1000);
    }
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    store_close(f->s); /* a probe under way is cancelled */
    f->s = NULL;
    redis_hostile_stop(&h);
    printf("test_store_redis: trickling server: %d requests %" PRIu64 " ms in all; %" PRIu64
           " probes, %s\n",
           SPACED_OPS, spent, c.probes, c.last_error);
    assert_true(spent < 4 * TIMEOUT_MS);
    assert_int_equal(c.hits, 0);
    assert_int_equal(c.nodes_down, 1);
    assert_non_null(strstr(c.last_error, "no whole reply"));
}

static long max_rss_mib(void)
{
    struct rusage u;

    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss >> 10;
}

/* A server that answers the handshake's first command with a tree of arrays without end
 * (every level within its own bound): the reply is cut off at the client's bounds on the
 * whole reply, some MiB in, the node marked down saying so, every page a miss. Before, the
 * client took all it was sent, some 14 bytes of memory a byte. */
static void test_endless_reply(void **state)
{
    struct fixture *f = *state;
    struct redis_hostile h = {.mode = HOSTILE_TREE, .tree_bytes = 48u << 20};
    struct store_redis_counters c;
    long rss0 = max_rss_mib();
    int res[PAGES];

    assert_int_equal(redis_hostile_start(&h), 0);
    store_close(f->s);
    default_options(f, 0);
    f->o.port = h.port;
    f->o.read_timeout_ms = 5000; /* the bound, not the time, is what cuts it off */
    assert_int_equal(store_redis_open(&f->o, &f->s), 0);
    write_pages(f, PAGES, res);
    for (size_t i = 0; i < PAGES; i++)
        assert_true(res[i] < 0);
    expect_nothing(f);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    store_close(f->s); /* a probe under way is cancelled */
    f->s = NULL;
    redis_hostile_stop(&h);
    printf("test_store_redis: endless reply: %s; peak RSS +%ld MiB\n", c.last_error,
           max_rss_mib() - rss0);
    assert_int_equal(c.nodes_down, 1);
    assert_non_null(strstr(c.last_error, "a reply past the client's bounds"));
#ifndef __SANITIZE_THREAD__ /* whose shadow memory grows with every byte the client touches */
    assert_true(max_rss_mib() - rss0 < 384);
#endif
}

/* Two nodes that send every command to each other with ASK, for ever. A command gives up past
 * its redirections, the node that sent it last is marked down, and later requests do not
 * bounce again (before, every page of every request went round the loop). */
static void test_redirect_loop(void **state)
{
    struct fixture *f = *state;
    struct redis_hostile a = {.mode = HOSTILE_ASK}, b = {.mode = HOSTILE_ASK};
    struct store_redis_counters c;
    uint64_t spent = 0, commands;
    int res[PAGES];

    assert_int_equal(redis_hostile_start(&a), 0);
    assert_int_equal(redis_hostile_start(&b), 0);
    a.map_port = b.map_port = a.port;
    a.peer_port = b.port;
    b.peer_port = a.port;
    store_close(f->s);
    default_options(f, 0);
    f->o.port = a.port;
    f->o.backoff_max_ms = 1000; /* the default's: a node found looping is tried again slowly */
    assert_int_equal(store_redis_open(&f->o, &f->s), 0);
    for (int k = 0; k < SPACED_OPS && spent < 20 * TIMEOUT_MS; k++) {
        uint64_t t0 = now_ms();
        write_pages(f, PAGES, res);
        for (size_t i = 0; i < PAGES; i++)
            assert_int_equal(res[i], -EIO);
        expect_nothing(f);
        spent += now_ms() - t0;
        usleep(SPACED_GAP_MS * 1000);
    }
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    store_close(f->s);
    f->s = NULL;
    commands = atomic_load(&a.commands) + atomic_load(&b.commands);
    redis_hostile_stop(&a);
    redis_hostile_stop(&b);
    printf("test_store_redis: redirect loop: %d requests %" PRIu64 " ms, %" PRIu64
           " commands seen, %" PRIu64 " given up, %" PRIu64 " probes, %s\n",
           SPACED_OPS, spent, commands, c.redirect_loops, c.probes, c.last_error);
    assert_true(c.redirect_loops >= PAGES);
    assert_true(c.marked_down >= 1);
    assert_non_null(strstr(c.last_error, "redirected"));
    assert_true(spent < 10 * TIMEOUT_MS); /* nothing waits: the loop is on loopback */
    /* Every request's three commands a page, each sent 6 times round the loop, would be
     * SPACED_OPS * 3 * PAGES * 6; the first request's are, and a few more each time a probe
     * finds the node again, not most. */
    assert_true(commands < (uint64_t)SPACED_OPS * 3 * PAGES * 6 / 2);
}

static void test_ttl(void **state)
{
    struct fixture *f = *state;
    long long ttl;
    int res[PAGES];

    store_close(f->s);
    f->s = NULL;
    assert_int_equal(open_store(f, 1), 0);
    write_all_ok(f);
    ttl = key_cmd(f, "TTL", 0);
    assert_true(ttl >= 0 && ttl <= 1);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
    usleep(2100 * 1000);
    assert_int_equal(read_pages(f, PAGES, res), 0);
    for (size_t i = 0; i < PAGES; i++)
        assert_int_equal(res[i], -ENOENT);
}

/* ---- over a cluster ---- */

static unsigned page_slot(const struct fixture *f, size_t i)
{
    char name[STORE_REDIS_KEY_CHARS + 1];

    store_redis_key(f->o.fingerprint, f->keys[i], name);
    return store_redis_slot(name, STORE_REDIS_KEY_CHARS);
}

/* The master page i lives on, as the cluster was formed. */
static int page_node(const struct fixture *f, size_t i)
{
    return redis_cluster_home(page_slot(f, i));
}

static long long node_cmd(struct fixture *f, int node, int argc, const char **argv)
{
    return redis_server_cmd(&f->cl.node[node], argc, argv, NULL);
}

static void expect_counters(struct fixture *f, struct store_redis_counters *c)
{
    assert_int_equal(store_redis_counters(f->s, c), 0);
    assert_int_equal(c->cluster, 1);
}

/* The master page i's copy lives on, as the cluster was formed: never page i's own. */
static int copy_node(const struct fixture *f, size_t i)
{
    return redis_cluster_home(STORE_REDIS_COPY_SLOT(page_slot(f, i)));
}

/* CLUSTER_PAGES written and read exact, every master holding some of them, and each page's
 * copy, under its copy name, on another master than the page. */
static void spread_over_masters(struct fixture *f)
{
    const char *dbsize[] = {"DBSIZE"};
    char name[STORE_REDIS_COPY_KEY_CHARS + 1];
    const char *exists[] = {"EXISTS", name};
    long long total = 0, on;
    int res[MAX_PAGES];

    write_n_ok(f, CLUSTER_PAGES);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    for (int k = 0; k < REDIS_CLUSTER_NODES; k++) {
        assert_true((on = node_cmd(f, k, 1, dbsize)) > 0);
        total += on;
    }
    assert_int_equal(total, 2 * CLUSTER_PAGES);
    for (size_t i = 0; i < CLUSTER_PAGES; i++) {
        store_redis_copy_key(f->o.fingerprint, f->keys[i], name);
        assert_int_equal(store_redis_slot(name, STORE_REDIS_COPY_KEY_CHARS),
                         STORE_REDIS_COPY_SLOT(page_slot(f, i)));
        assert_int_not_equal(copy_node(f, i), page_node(f, i));
        assert_int_equal(node_cmd(f, copy_node(f, i), 2, exists), 1);
    }
}

static void test_cluster_spread(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    struct store_stats st;
    size_t run = 0;
    int res[MAX_PAGES];

    spread_over_masters(f);
    expect_counters(f, &c);
    assert_int_equal(c.masters, REDIS_CLUSTER_NODES);
    assert_int_equal(c.moved + c.asked, 0);
    assert_int_equal(c.copies, 2);
    assert_int_equal(c.copy_sets, CLUSTER_PAGES);
    assert_int_equal(c.copy_reads, 0); /* every master up: each page read from its own key */
    store_stats(f->s, &st);
    assert_int_equal(st.pages, CLUSTER_PAGES); /* DBSIZE of every master, over the copies */
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], CLUSTER_PAGES, &run), 0);
    assert_int_equal(run, CLUSTER_PAGES);
    /* One URL naming one node is enough: it answers as a cluster and names the others. */
    store_close(f->s);
    f->s = NULL;
    snprintf(f->url, sizeof(f->url), "redis://127.0.0.1:%u", f->cl.node[2].port);
    assert_int_equal(open_store(f, 0), 0);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    expect_counters(f, &c);
    assert_int_equal(c.masters, REDIS_CLUSTER_NODES);
}

/* Give pages first..first+n-1 keys of the same slot as page 0's. */
static void keys_in_slot(struct fixture *f, unsigned slot, size_t first, size_t n)
{
    for (size_t i = first; i < first + n; i++)
        for (uint32_t t = 0; page_slot(f, i) != slot; t++)
            memcpy(f->keys[i] + 8, &t, sizeof(t));
}

static void migrate_pages(struct fixture *f, size_t first, size_t n, int a, int b)
{
    char name[STORE_REDIS_KEY_CHARS + 1];

    for (size_t i = first; i < first + n; i++) {
        store_redis_key(f->o.fingerprint, f->keys[i], name);
        assert_int_equal(redis_cluster_migrate_key(&f->cl, name, a, b), 0);
    }
}

/* A slot moves from a to b while the store runs, as a reshard does: while it migrates, keys
 * moved already answer ASK from a (followed once, the map kept), the others are still a's;
 * once it is b's, a answers MOVED and the map learns it. Every read stays exact. */
static void test_cluster_migration(void **state)
{
    struct fixture *f = *state;
    unsigned slot = page_slot(f, 0);
    int a = redis_cluster_home(slot), b = (a + 1) % REDIS_CLUSTER_NODES;
    struct store_redis_counters c;
    size_t run = 0;
    int res[MAX_PAGES];

    keys_in_slot(f, slot, 1, 3); /* pages 0..3 share the slot */
    write_n_ok(f, CLUSTER_PAGES);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    assert_int_equal(redis_cluster_slot_begin(&f->cl, slot, a, b), 0);
    migrate_pages(f, 0, 2, a, b);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    expect_counters(f, &c);
    assert_true(c.asked >= 2); /* pages 0 and 1, asked of b */
    assert_int_equal(c.moved, 0);
    write_n_ok(f, 4); /* SET NX through ASK too: there already */
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], CLUSTER_PAGES, &run), 0);
    assert_int_equal(run, CLUSTER_PAGES);
    migrate_pages(f, 2, 2, a, b);
    assert_int_equal(redis_cluster_slot_end(&f->cl, slot, b), 0);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    expect_counters(f, &c);
    assert_true(c.moved >= 1);
    uint64_t moved = c.moved, refreshes = c.map_refreshes;
    usleep(150 * 1000); /* past the map's refresh interval */
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    expect_counters(f, &c);
    assert_int_equal(c.moved, moved); /* the map knows the slot's new node now */
    assert_true(c.map_refreshes > 1 && c.map_refreshes <= refreshes + 1);
    assert_int_equal(redis_cluster_home(slot), a);
    const char *dbsize[] = {"DBSIZE"};
    long long before = node_cmd(f, b, 1, dbsize);
    store_close(f->s); /* a new store, its first map read with the slot on b */
    f->s = NULL;
    assert_int_equal(open_store(f, 0), 0);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    expect_counters(f, &c);
    assert_int_equal(c.moved + c.asked, 0);
    assert_int_equal(node_cmd(f, b, 1, dbsize), before);
}

/* Read every page: those of node down fail (-EIO or -ECONNREFUSED), the others are exact.
 * Returns how many were node down's. */
static size_t read_without(struct fixture *f, int down)
{
    int res[MAX_PAGES];
    size_t on = 0;

    for (size_t i = 0; i < CLUSTER_PAGES; i++)
        on += page_node(f, i) == down;
    assert_true(on > 0);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES - on);
    for (size_t i = 0; i < CLUSTER_PAGES; i++)
        if (page_node(f, i) == down)
            assert_true(res[i] == -EIO || res[i] == -ECONNREFUSED);
        else
            assert_int_equal(res[i], 0);
    return on;
}

/* Every page read exact although a master is down, then the leading run whole: the pages of
 * its slots come from their copies. Returns how long the read took, in ms. (The first
 * exchange with a hung master waits out the read timeout; a leading run waits no longer than
 * that, so it comes second.) */
static uint64_t read_all_timed(struct fixture *f)
{
    uint64_t t0 = now_ms(), ms;
    size_t run = 0;
    int res[MAX_PAGES];

    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    ms = now_ms() - t0;
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], CLUSTER_PAGES, &run), 0);
    assert_int_equal(run, CLUSTER_PAGES);
    return ms;
}

/* Until every page is written and read exact (10 s at most). */
static void until_served(struct fixture *f)
{
    int res[MAX_PAGES];
    size_t got = 0;

    for (uint64_t t0 = now_ms(); now_ms() - t0 < 10000 && got < CLUSTER_PAGES; usleep(50000)) {
        write_pages(f, CLUSTER_PAGES, res);
        got = read_pages(f, CLUSTER_PAGES, res);
    }
    assert_int_equal(got, CLUSTER_PAGES);
}

/* f->s replaced by a store on the cluster from f->url with suffix appended ("?copies=1"). */
static void reopen_cluster(struct fixture *f, const char *suffix)
{
    store_close(f->s);
    f->s = NULL;
    redis_cluster_url(&f->cl, 0, f->url, sizeof(f->url));
    strncat(f->url, suffix, sizeof(f->url) - strlen(f->url) - 1);
    assert_int_equal(open_store(f, 0), 0);
}

/* A master killed: a KV's pages, spread over every master, are all still found and read (the
 * dead one's from their copies), so its chain does not break at its first page there; writes
 * are kept (by their copies). With copies=1 the dead master's pages fail and the leading run
 * stops at the first. Restarted, empty: served again. */
static void test_cluster_master_killed(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    int down = 1;
    size_t on = 0, run = 0, first = CLUSTER_PAGES;

    for (size_t i = CLUSTER_PAGES; i-- > 0;)
        if (page_node(f, i) == down)
            first = i, on++;
    write_n_ok(f, CLUSTER_PAGES);
    redis_server_kill(&f->cl.node[down]);
    assert_true(read_all_timed(f) < 3 * TIMEOUT_MS);
    read_all_timed(f); /* and again, the master known down */
    expect_counters(f, &c);
    assert_true(c.copy_reads >= 2 * on);
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.nodes_down, 1);
    assert_int_equal(c.masters, REDIS_CLUSTER_NODES); /* no replica took its slots */
    write_n_ok(f, CLUSTER_PAGES);
    /* One key a page: the dead master's pages are lost, a chain breaks at the first. */
    reopen_cluster(f, "?copies=1");
    read_without(f, down);
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], CLUSTER_PAGES, &run), 0);
    assert_int_equal(run, first);
    expect_counters(f, &c);
    assert_int_equal(c.copies, 1);
    assert_true(c.failed >= on);
    /* Back on its port with its nodes.conf (and none of its data): served again, writes too,
     * and with copies every page is found before any is written again (its own key absent
     * now, its copy there). */
    assert_int_equal(redis_server_restart(&f->cl.node[down]), 0);
    reopen_cluster(f, "");
    read_all_timed(f);
    expect_counters(f, &c);
    assert_true(c.copy_reads >= on);
    assert_int_equal(c.failed, 0);
    until_served(f);
    reopen_cluster(f, "?copies=1");
    until_served(f);
    expect_counters(f, &c);
    assert_int_equal(c.connected, 1);
}

/* SPACED_OPS reads of every page (a leading run, then the read), SPACED_GAP_MS apart, as an
 * engine's requests come: the time they took in all, in ms. Pages that are served must be
 * exact (read_pages checks); want: the pages each must find. */
static uint64_t spaced_reads(struct fixture *f, size_t n, size_t want)
{
    uint64_t spent = 0;
    size_t run = 0;
    int res[MAX_PAGES];

    for (int k = 0; k < SPACED_OPS; k++) {
        uint64_t t0 = now_ms();
        assert_int_equal(store_leading_run(f->s, &f->keys[0][0], n, &run), 0);
        assert_int_equal(read_pages(f, n, res), want);
        assert_int_equal(run, want);
        spent += now_ms() - t0;
        if (spent > 20 * TIMEOUT_MS)
            fail_msg("%d spaced reads took %" PRIu64 " ms: a request waits on a stopped node",
                     k + 1, spent);
        usleep(SPACED_GAP_MS * 1000);
    }
    return spent;
}

/* A master stopped (SIGSTOP): the first exchange with it waits out the read timeout, its
 * pages coming from their copies; from then on it is known down, and requests cost nothing
 * more (before, each retry waited the timeout again). SIGCONT: served from it again. */
static void test_cluster_master_stopped(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    int down = 2;
    uint64_t first, spent;

    write_n_ok(f, CLUSTER_PAGES);
    assert_int_equal(kill(f->cl.node[down].pid, SIGSTOP), 0);
    first = read_all_timed(f);
    spent = spaced_reads(f, CLUSTER_PAGES, CLUSTER_PAGES);
    expect_counters(f, &c);
    assert_int_equal(kill(f->cl.node[down].pid, SIGCONT), 0);
    printf("test_store_redis: a master stopped: first read %" PRIu64 " ms, then %d reads %" PRIu64
           " ms in all; %" PRIu64 " probes, %s\n",
           first, SPACED_OPS, spent, c.probes, c.last_error);
    assert_true(first < 4 * TIMEOUT_MS);
    assert_true(spent < SPACED_BOUND_MS);
    assert_int_equal(c.nodes_down, 1);
    assert_non_null(strstr(c.last_error, "no whole reply"));
    assert_int_equal(c.failed, 0);
    until_served(f);
    for (uint64_t t0 = now_ms(); now_ms() - t0 < 5000 && c.nodes_down; usleep(50000))
        expect_counters(f, &c);
    assert_int_equal(c.nodes_down, 0);
}

/* Until every page is read exact, nothing written meanwhile (10 s at most): the pages the
 * store wrote before are served again. */
static uint64_t until_read_all(struct fixture *f)
{
    uint64_t t0 = now_ms();
    int res[MAX_PAGES];

    while (read_pages(f, CLUSTER_PAGES, res) < CLUSTER_PAGES && now_ms() - t0 < 10000)
        usleep(50000);
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    return now_ms() - t0;
}

/* A master with a replica killed, the store keeping one key a page: its pages fail, and a
 * store that may read from replicas reads them from its replica meanwhile. The replica takes
 * over (a failover, some seconds later): the store finds the new master on its own (the map
 * read again while a master is down) and serves every page written before, no restart. */
static void test_cluster_failover(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    struct kvt_store *s = f->s, *rs = NULL;
    char url[300], buf[300];
    const char *wait[] = {"WAIT", "1", "2000"};
    int down = 1, res[MAX_PAGES];
    uint64_t back_ms;

    write_n_ok(f, CLUSTER_PAGES);
    for (int k = 0; k < REDIS_CLUSTER_NODES; k++) /* every page on its replica too */
        assert_int_equal(node_cmd(f, k, 3, wait), 1);
    snprintf(url, sizeof(url), "%s&replica_reads=yes", f->url);
    default_options(f, 0);
    assert_int_equal(store_redis_parse_url(url, buf, sizeof(buf), &f->o), 0);
    assert_true(f->o.replica_reads);
    assert_int_equal(store_redis_open(&f->o, &rs), 0);
    f->s = rs;
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    redis_server_kill(&f->cl.node[down]);
    /* Before the failover: the replica serves its master's pages to the store that may. */
    assert_int_equal(read_pages(f, CLUSTER_PAGES, res), CLUSTER_PAGES);
    assert_int_equal(store_redis_counters(rs, &c), 0);
    assert_true(c.replica_reads > 0);
    assert_int_equal(c.failed, 0);
    f->s = s;
    read_without(f, down);
    assert_int_equal(redis_cluster_wait_master(&f->cl, REDIS_CLUSTER_NODES + down, 15000), 0);
    back_ms = until_read_all(f);
    expect_counters(f, &c);
    printf("test_store_redis: failover: every page served %" PRIu64
           " ms after the replica took over; %" PRIu64 " map reads\n",
           back_ms, c.map_refreshes);
    assert_int_equal(c.masters, REDIS_CLUSTER_NODES);
    write_n_ok(f, CLUSTER_PAGES);
    store_close(rs);
}

static void acl_setuser(struct fixture *f, const char *user, const char *pass_rule,
                        const char *cmds)
{
    const char *argv[] = {"ACL", "SETUSER", user, "on", pass_rule, "~kvt:*", "+@all", cmds};

    assert_int_equal(redis_server_cmd(&f->srv, cmds ? 8 : 7, argv, NULL), 0);
}

/* Every page of the n first fails with -EACCES, written or read; nothing is found. */
static void expect_refused(struct fixture *f, size_t n)
{
    int res[MAX_PAGES];
    size_t run = 1;

    write_pages(f, n, res);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], -EACCES);
    assert_int_equal(read_pages(f, n, res), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], -EACCES);
    assert_int_equal(store_leading_run(f->s, &f->keys[0][0], n, &run), 0);
    assert_int_equal(run, 0);
}

static void test_acl_users(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    struct store_stats st;
    int res[MAX_PAGES];

    acl_setuser(f, "kv", ">p:w@d,1", NULL);
    acl_setuser(f, "nocmd", ">pw", "-get");
    assert_int_equal(redis_server_cmd(&f->srv, 7,
                                      (const char *[]){"ACL", "SETUSER", "nocmd", "-set", "-exists",
                                                       "-del", "-dbsize"},
                                      NULL),
                     0);
    /* The right user and password, ':', '@' and ',' percent-encoded. */
    reopen_url(f, "redis://kv:p%%3Aw%%40d%%2C1@127.0.0.1:%u");
    assert_string_equal(f->o.user, "kv");
    write_all_ok(f);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.auth_refused + c.denied + c.failed, 0);
    assert_string_equal(c.last_refusal, "");
    /* A wrong password: AUTH refused, every page a miss, counted; the store goes on. */
    reopen_url(f, "redis://kv:nope@127.0.0.1:%u");
    expect_refused(f, PAGES);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_true(c.auth_refused >= 1);
    assert_int_equal(c.hits, 0);
    assert_true(c.failed >= 2 * PAGES);
    assert_non_null(strstr(c.last_refusal, "AUTH as kv refused"));
    assert_non_null(strstr(c.last_refusal, "WRONGPASS"));
    store_stats(f->s, &st);
    assert_true(st.errors >= 2 * PAGES);
    /* A user without GET, SET and EXISTS: AUTH works, each command is refused (NOPERM). */
    reopen_url(f, "redis://nocmd:pw@127.0.0.1:%u");
    expect_refused(f, PAGES);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.auth_refused, 0);
    assert_int_equal(c.denied, 2 * PAGES);
    assert_int_equal(c.connected, 1);
    assert_non_null(strstr(c.last_refusal, "NOPERM"));
    /* The pages the right user wrote are still there for it. */
    reopen_url(f, "redis://kv:p%%3Aw%%40d%%2C1@127.0.0.1:%u");
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
}

/* ---- TLS ---- */

static int setup_tls(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    if (!f || !(f->bufs = malloc((size_t)MAX_PAGES * PAGE_BYTES)))
        return -1;
    f->srv.tls = true;
    f->srv.tls_auth_clients = false;
    if (redis_server_start(&f->srv, 0) || open_store(f, 0))
        return -1;
    make_pages(f, 3);
    *state = f;
    return 0;
}

/* f->s replaced by a TLS store on host:port trusting ca (a file of the server's dir), with
 * cert and key (files there too) when given. */
static void reopen_tls(struct fixture *f, const char *host, uint16_t port, const char *ca,
                       const char *cert)
{
    char ca_path[256], cert_path[256], key_path[256], err[400];

    store_close(f->s);
    f->s = NULL;
    default_options(f, 0);
    f->o.host = host;
    f->o.port = port;
    f->o.tls = true;
    f->o.tls_ca = redis_server_file(&f->srv, ca, ca_path, sizeof(ca_path));
    if (cert) {
        f->o.tls_cert = redis_server_file(&f->srv, cert, cert_path, sizeof(cert_path));
        f->o.tls_key = redis_server_file(&f->srv, "client.key", key_path, sizeof(key_path));
    }
    assert_int_equal(store_redis_open_err(&f->o, &f->s, err, sizeof(err)), 0);
}

/* Nothing gets through: writes and reads fail, nothing is served, the store says why. */
static void expect_unreachable(struct fixture *f, const char *why)
{
    struct store_redis_counters c;
    int res[MAX_PAGES];
    uint64_t t0 = now_ms();

    write_pages(f, PAGES, res);
    for (size_t i = 0; i < PAGES; i++)
        assert_true(res[i] < 0);
    assert_int_equal(read_pages(f, PAGES, res), 0);
    for (size_t i = 0; i < PAGES; i++)
        assert_true(res[i] < 0);
    assert_true(now_ms() - t0 < 20 * TIMEOUT_MS); /* each exchange bounded by its timeout */
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.hits, 0);
    assert_true(c.failed >= 2 * PAGES);
    assert_int_equal(c.connected, 0);
    if (why)
        assert_non_null(strstr(c.last_refusal, why));
}

static void test_tls(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;
    int res[MAX_PAGES];

    /* The server's CA, the server named by the IP address its certificate lists. */
    reopen_tls(f, "127.0.0.1", f->srv.tls_port, "ca.crt", NULL);
    write_all_ok(f);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.failed, 0);
    assert_int_equal(c.connected, 1);
    /* By the DNS name it lists: the same pages, read over a new connection. */
    reopen_tls(f, "localhost", f->srv.tls_port, "ca.crt", NULL);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
    /* The pages went over TLS to the same database the plain port serves. */
    assert_int_equal(key_cmd(f, "EXISTS", 0), 1);
    /* A CA that did not sign the server's certificate. */
    reopen_tls(f, "127.0.0.1", f->srv.tls_port, "other-ca.crt", NULL);
    expect_unreachable(f, "certificate");
    /* A name the certificate does not carry ("127.1" is 127.0.0.1 to the resolver). */
    reopen_tls(f, "127.1", f->srv.tls_port, "ca.crt", NULL);
    expect_unreachable(f, "certificate");
    /* rediss:// to the plain port: the server answers no handshake. */
    reopen_tls(f, "127.0.0.1", f->srv.port, "ca.crt", NULL);
    expect_unreachable(f, "TLS");
    /* redis:// to the TLS port: the server drops what is no handshake. */
    store_close(f->s);
    default_options(f, 0);
    f->o.port = f->srv.tls_port;
    assert_int_equal(store_redis_open(&f->o, &f->s), 0);
    expect_unreachable(f, NULL);
}

static void test_tls_client_cert(void **state)
{
    struct fixture *f = *state;
    int res[MAX_PAGES];

    /* A server that wants a client certificate: none given, no connection. */
    store_close(f->s);
    f->s = NULL;
    redis_server_stop(&f->srv);
    f->srv = (struct redis_server){.tls = true, .tls_auth_clients = true};
    assert_int_equal(redis_server_start(&f->srv, 0), 0);
    reopen_tls(f, "127.0.0.1", f->srv.tls_port, "ca.crt", NULL);
    expect_unreachable(f, NULL);
    /* The client certificate the test's CA signed: pages exact. */
    reopen_tls(f, "127.0.0.1", f->srv.tls_port, "ca.crt", "client.crt");
    write_all_ok(f);
    assert_int_equal(read_pages(f, PAGES, res), PAGES);
}

/* A cluster over TLS (tls-cluster: its slot map names TLS ports to a TLS client): pages
 * spread over every master through rediss:// seeds, read exact. */
static int setup_tls_cluster(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    char ca[256], err[400];

    if (!f || !(f->bufs = malloc((size_t)MAX_PAGES * PAGE_BYTES)))
        return -1;
    f->cl.tls = true;
    if (redis_cluster_start(&f->cl))
        return -1;
    f->cluster = true;
    redis_cluster_url(&f->cl, 1, f->url, sizeof(f->url));
    default_options(f, 0);
    if (store_redis_parse_url(f->url, f->url_buf, sizeof(f->url_buf), &f->o) || !f->o.tls)
        return -1;
    f->o.tls_ca = redis_server_file(&f->cl.node[0], "ca.crt", ca, sizeof(ca));
    if (store_redis_open_err(&f->o, &f->s, err, sizeof(err)))
        return -1;
    make_pages(f, 4);
    *state = f;
    return 0;
}

static void test_tls_cluster(void **state)
{
    struct fixture *f = *state;
    struct store_redis_counters c;

    spread_over_masters(f);
    assert_int_equal(store_redis_counters(f->s, &c), 0);
    assert_int_equal(c.cluster, 1);
    assert_int_equal(c.masters, REDIS_CLUSTER_NODES);
    assert_int_equal(c.failed, 0);
    assert_true(c.connects >= REDIS_CLUSTER_NODES);
}

/* The client on an application thread (SIGPIPE not blocked, its default action to kill):
 * writing over TLS to a server that died is -EIO, not the end of the process. */
static void test_tls_dead_server_sigpipe(void **state)
{
    struct fixture *f = *state;
    const struct redis_wire_timeouts t = {1000, 1000, 1000};
    size_t big = 1 << 20, lens[] = {3, 1, big};
    char ca[256], *value = calloc(1, big);
    const char *argv[] = {"SET", "k", value};
    struct redis_wire *w;
    SSL_CTX *tls;
    int rc = 0;

    assert_non_null(value);
    signal(SIGPIPE, SIG_DFL); /* as a program that never touched it has it */
    assert_int_equal(redis_tls_ctx(redis_server_file(&f->srv, "ca.crt", ca, sizeof(ca)), NULL, NULL,
                                   &tls, NULL, 0),
                     0);
    assert_int_equal(redis_wire_open("127.0.0.1", f->srv.tls_port, tls, &t, &w, NULL, 0), 0);
    redis_server_kill(&f->srv);
    /* Past the first failure (a reset), a write raises SIGPIPE where nothing stops it. */
    for (int i = 0; i < 16; i++)
        rc = rc ? rc : redis_wire_append(w, 3, argv, lens) ? -ENOMEM : redis_wire_flush(w);
    for (int i = 0; i < 4; i++) {
        struct iovec iov = {value, big};
        assert_int_equal(redis_wire_writev(w, &iov, 1), -EIO);
    }
    assert_int_equal(rc, -EIO);
    redis_wire_close(w);
    redis_tls_ctx_free(tls);
    free(value);
}

static void test_tls_bad_files(void **state)
{
    struct fixture *f = *state;
    struct kvt_store *s = NULL;
    char err[400], path[256];

    default_options(f, 0);
    f->o.tls = true;
    f->o.tls_ca = "/nonexistent/ca.crt";
    assert_int_equal(store_redis_open_err(&f->o, &s, err, sizeof(err)), -EINVAL);
    assert_null(s);
    assert_non_null(strstr(err, "/nonexistent/ca.crt"));
    /* A certificate file that holds a CA's certificate and no key. */
    f->o.tls_ca = NULL;
    f->o.tls_cert = redis_server_file(&f->srv, "ca.crt", path, sizeof(path));
    assert_int_equal(store_redis_open_err(&f->o, &s, err, sizeof(err)), -EINVAL);
    assert_null(s);
    assert_non_null(strstr(err, "ca.crt"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_damaged_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flushall, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_server_stopped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trickling_server, setup, teardown),
        cmocka_unit_test_setup_teardown(test_redirect_loop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endless_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ttl, setup, teardown),
        cmocka_unit_test_setup_teardown(test_acl_users, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_spread, setup_cluster, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_migration, setup_cluster, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_master_killed, setup_cluster, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_master_stopped, setup_cluster, teardown),
        cmocka_unit_test_setup_teardown(test_cluster_failover, setup_cluster_replicas, teardown),
        cmocka_unit_test_setup_teardown(test_tls, setup_tls, teardown),
        cmocka_unit_test_setup_teardown(test_tls_client_cert, setup_tls, teardown),
        cmocka_unit_test_setup_teardown(test_tls_bad_files, setup_tls, teardown),
        cmocka_unit_test_setup_teardown(test_tls_dead_server_sigpipe, setup_tls, teardown),
        cmocka_unit_test_setup_teardown(test_tls_cluster, setup_tls_cluster, teardown),
    };

    if (!redis_server_installed()) {
        printf("test_store_redis: SKIPPED: redis-server is not installed\n");
        return 77;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
