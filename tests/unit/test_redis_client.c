/*
 * The Redis store's own client (src/store/redis/wire.c, resp.c) against a fake server on
 * loopback that answers every connection with bytes the test chose: what a broken, hostile or
 * dying server may send. Whole replies (strings, integers, nil, nested arrays) parse exactly;
 * an array nested too deep, a bulk or an array too large: -EMSGSIZE; a line longer than the
 * buffer, a reply cut off by a closed connection, an unknown type byte: -EIO, never a crash or
 * a read past what arrived. An endless tree of arrays, each level within its own bound, is
 * cut off at the whole reply's bound (-EMSGSIZE) after a few MiB, the client's memory growing
 * by some tens of MiB, not by 14 bytes a byte received; a reply that trickles in a byte at a
 * time fails once the read timeout has passed since it began, however often a byte comes. A
 * command is framed as RESP (the server sees exactly its bytes), and a connect to a port
 * nobody listens on is -ECONNREFUSED. No redis-server needed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "redis_hostile.h"
#include "store/redis/client.h"

/* One connection served: what it received (up to got's size), then reply sent (gap_ms between
 * its bytes: a trickle), or with tree_width set a tree of arrays (redis_hostile_tree's order) until
 * tree_bytes went out, then closed. */
struct fake {
    int lfd;
    uint16_t port;
    pthread_t thread;
    const char *reply;
    size_t reply_len;
    char got[256];
    size_t got_len;
    size_t want; /* bytes to read before replying */
    unsigned gap_ms;
    int tree_width;
    size_t tree_bytes;
    size_t sent; /* bytes the client took before it closed (or all) */
};

/* buf (len bytes) to fd, a byte every gap_ms when set: false once the peer is gone. */
static bool send_all(struct fake *f, int fd, const char *buf, size_t len)
{
    ssize_t k;

    for (size_t done = 0; done < len; done += (size_t)k) {
        if (f->gap_ms)
            usleep(f->gap_ms * 1000);
        if ((k = send(fd, buf + done, f->gap_ms ? 1 : len - done, MSG_NOSIGNAL)) <= 0)
            return false;
        f->sent += (size_t)k;
    }
    return true;
}

static void *serve(void *arg)
{
    struct fake *f = arg;
    int fd = accept(f->lfd, NULL, NULL);
    ssize_t k;

    if (fd < 0)
        return NULL;
    while (f->got_len < f->want &&
           (k = read(fd, f->got + f->got_len, sizeof(f->got) - f->got_len)) > 0)
        f->got_len += (size_t)k;
    if (!f->tree_width) {
        send_all(f, fd, f->reply, f->reply_len);
    } else {
        char buf[1 << 16];
        int left[HOSTILE_TREE_DEPTH], level = -1;
        size_t n;
        while (f->sent < f->tree_bytes &&
               (n = redis_hostile_tree(f->tree_width, left, &level, buf, sizeof(buf))) &&
               send_all(f, fd, buf, n))
            ;
    }
    close(fd);
    return NULL;
}

/* Listen and serve f as it is set up (before its thread starts: it reads f unlocked). */
static void fake_listen(struct fake *f)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);

    assert_true((f->lfd = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(f->lfd, 1), 0);
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&a, &al), 0);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, serve, f), 0);
}

static void fake_start(struct fake *f, const char *reply, size_t len, size_t want)
{
    memset(f, 0, sizeof(*f));
    f->reply = reply;
    f->reply_len = len;
    f->want = want;
    fake_listen(f);
}

static void fake_stop(struct fake *f)
{
    pthread_join(f->thread, NULL);
    close(f->lfd);
}

static const struct redis_wire_timeouts timeouts = {1000, 1000, 1000};

/* Send PING to a fake server answering reply; the whole reply's result into *out. */
static int exchange(const char *reply, size_t len, struct resp_value **out)
{
    const char *ping[] = {"PING"};
    struct redis_wire *w;
    struct fake f;
    int rc;

    fake_start(&f, reply, len, 14);
    assert_int_equal(redis_wire_open("127.0.0.1", f.port, NULL, &timeouts, &w, NULL, 0), 0);
    rc = redis_call(w, 1, ping, NULL, out);
    redis_wire_close(w);
    fake_stop(&f);
    assert_int_equal(f.got_len, 14);
    assert_memory_equal(f.got, "*1\r\n$4\r\nPING\r\n", 14);
    return rc;
}

static void test_whole_replies(void **state)
{
    /* As CLUSTER SLOTS answers: [[0, 5460, ["127.0.0.1", 7000, "id"]], ...], a nil inside. */
    static const char slots[] =
        "*2\r\n"
        "*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$2\r\nid\r\n"
        "*3\r\n:5461\r\n:16383\r\n$-1\r\n";
    struct resp_value *v;

    (void)state;
    assert_int_equal(exchange(slots, sizeof(slots) - 1, &v), 0);
    assert_int_equal(v->type, RESP_ARRAY);
    assert_int_equal(v->n, 2);
    assert_int_equal(v->elem[0]->elem[1]->integer, 5460);
    assert_int_equal(v->elem[0]->elem[2]->elem[0]->type, RESP_BULK);
    assert_int_equal(v->elem[0]->elem[2]->elem[0]->integer, 9);
    assert_string_equal(v->elem[0]->elem[2]->elem[0]->str, "127.0.0.1");
    assert_int_equal(v->elem[0]->elem[2]->elem[1]->integer, 7000);
    assert_int_equal(v->elem[1]->elem[2]->type, RESP_NIL);
    redis_resp_free(v);
    /* A bulk with a NUL and CRLF inside it: its length decides, not its bytes. */
    assert_int_equal(exchange("$6\r\na\0b\r\nc\r\n", 12, &v), 0);
    assert_int_equal(v->type, RESP_BULK);
    assert_int_equal(v->integer, 6);
    assert_memory_equal(v->str, "a\0b\r\nc", 6);
    redis_resp_free(v);
    assert_int_equal(exchange("-ERR no\r\n", 9, &v), 0);
    assert_int_equal(v->type, RESP_ERROR);
    assert_string_equal(v->str, "ERR no");
    redis_resp_free(v);
    assert_int_equal(exchange("*0\r\n", 4, &v), 0);
    assert_int_equal(v->type, RESP_ARRAY);
    assert_int_equal(v->n, 0);
    redis_resp_free(v);
}

static void test_hostile_replies(void **state)
{
    char deep[64 * 4 + 8], *long_line;
    struct resp_value *v = (struct resp_value *)1;
    size_t n = 0;

    (void)state;
    for (int i = 0; i < 64; i++)
        n += (size_t)snprintf(deep + n, sizeof(deep) - n, "*1\r\n");
    n += (size_t)snprintf(deep + n, sizeof(deep) - n, ":1\r\n");
    assert_int_equal(exchange(deep, n, &v), -EMSGSIZE); /* nested past RESP_MAX_DEPTH */
    assert_null(v);
    assert_int_equal(exchange("$1099511627776\r\n", 16, &v), -EMSGSIZE); /* a TiB bulk */
    assert_int_equal(exchange("*1099511627776\r\n", 16, &v), -EMSGSIZE); /* a huge array */
    assert_int_equal(exchange("$10\r\nabc", 8, &v), -EIO);               /* cut off: closed */
    assert_int_equal(exchange("*3\r\n:1\r\n", 8, &v), -EIO);             /* elements missing */
    assert_int_equal(exchange("!7\r\nabcdefg\r\n", 13, &v), -EIO);       /* RESP3 type */
    assert_int_equal(exchange("\r\n", 2, &v), -EIO);                     /* an empty line */
    assert_int_equal(exchange("", 0, &v), -EIO);                         /* closed at once */
    assert_null(v);
    long_line = malloc(RESP_BUF_BYTES + 16);
    assert_non_null(long_line);
    long_line[0] = '+';
    memset(long_line + 1, 'x', RESP_BUF_BYTES + 8);
    assert_int_equal(exchange(long_line, RESP_BUF_BYTES + 9, &v), -EIO); /* no CRLF in reach */
    free(long_line);
}

static long max_rss_kib(void)
{
    struct rusage u;

    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

static uint64_t now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

#define ENDLESS_BYTES (48u << 20) /* what the hostile server offers: the client must stop early */

/* A tree of arrays 8 levels deep, 1000 wide at each (every level and every array within its
 * own bounds), 48 MiB of it sent (it would take 1000^8 elements). Before the whole reply had
 * bounds the client took all it was sent, some 16 bytes of memory for each 4-byte element,
 * and failed only when the server closed. */
static void test_endless_tree(void **state)
{
    const char *ping[] = {"PING"};
    struct resp_value *v = NULL;
    struct redis_wire *w;
    struct fake f;
    long rss0 = max_rss_kib();
    int rc;

    (void)state;
    memset(&f, 0, sizeof(f));
    f.want = 14;
    f.tree_width = 1000;
    f.tree_bytes = ENDLESS_BYTES;
    fake_listen(&f);
    assert_int_equal(redis_wire_open("127.0.0.1", f.port, NULL, &timeouts, &w, NULL, 0), 0);
    rc = redis_call(w, 1, ping, NULL, &v);
    redis_wire_close(w); /* the fake's next send fails: it stops */
    fake_stop(&f);
    long grown_mib = (max_rss_kib() - rss0) >> 10;
    printf("test_redis_client: endless tree: rc %d, %zu KiB taken of %u MiB offered, peak RSS "
           "+%ld MiB\n",
           rc, f.sent >> 10, ENDLESS_BYTES >> 20, grown_mib);
    redis_resp_free(v);
    assert_int_equal(rc, -EMSGSIZE);
    assert_null(v);
    assert_non_null(strstr(redis_wire_why(NULL, -EMSGSIZE), "bounds"));
    assert_true(f.sent < ENDLESS_BYTES / 3); /* about 4 MiB: 1M elements */
#ifndef __SANITIZE_THREAD__ /* whose shadow memory grows with every byte the client touches */
    assert_true(grown_mib < 384);
#endif
}

/* A reply of 40 bytes sent a byte every 75 ms: each read gets a byte well within the 1 s
 * timeout, the whole reply would take 3 s. It fails once a second has passed since it began. */
static void test_trickled_reply(void **state)
{
    static const char slow[] = "+PONG-PONG-PONG-PONG-PONG-PONG-PONG-PO\r\n";
    const char *ping[] = {"PING"};
    struct resp_value *v = NULL;
    struct redis_wire *w;
    struct fake f;
    uint64_t t0;
    int rc;

    (void)state;
    memset(&f, 0, sizeof(f));
    f.reply = slow;
    f.reply_len = sizeof(slow) - 1;
    f.want = 14;
    f.gap_ms = 75;
    fake_listen(&f);
    assert_int_equal(redis_wire_open("127.0.0.1", f.port, NULL, &timeouts, &w, NULL, 0), 0);
    t0 = now_ms();
    rc = redis_call(w, 1, ping, NULL, &v);
    uint64_t ms = now_ms() - t0;
    int err = w->err;
    redis_wire_close(w); /* the fake's next byte fails: it stops */
    fake_stop(&f);
    printf("test_redis_client: trickled reply: rc %d after %" PRIu64 " ms (%zu bytes came)\n", rc,
           ms, f.sent);
    redis_resp_free(v);
    assert_int_equal(rc, -EIO);
    assert_int_equal(err, -ETIMEDOUT);
    assert_true(ms >= 900 && ms < 2500);
}

static void test_framing_and_refused(void **state)
{
    const char *argv[] = {"SET", "k", "v\r\n\0x"};
    const size_t lens[] = {3, 1, 5};
    struct redis_wire *w;
    struct resp_value *v;
    struct fake f;
    int port;

    (void)state;
    fake_start(&f, "+OK\r\n", 5, 31);
    assert_int_equal(redis_wire_open("127.0.0.1", f.port, NULL, &timeouts, &w, NULL, 0), 0);
    assert_int_equal(redis_call(w, 3, argv, lens, &v), 0);
    assert_int_equal(v->type, RESP_STATUS);
    redis_resp_free(v);
    redis_wire_close(w);
    fake_stop(&f);
    assert_int_equal(f.got_len, 31);
    assert_memory_equal(f.got, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\r\n\0x\r\n", 31);
    /* The fake's port, closed now: nobody listens there. */
    port = f.port;
    assert_int_equal(redis_wire_open("127.0.0.1", (uint16_t)port, NULL, &timeouts, &w, NULL, 0),
                     -ECONNREFUSED);
    assert_null(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_replies),       cmocka_unit_test(test_hostile_replies),
        cmocka_unit_test(test_endless_tree),        cmocka_unit_test(test_trickled_reply),
        cmocka_unit_test(test_framing_and_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
