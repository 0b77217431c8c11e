/*
 * The Redis store's own client (src/store/redis/wire.c, resp.c) against a fake server on
 * loopback that answers every connection with bytes the test chose: what a broken, hostile or
 * dying server may send. Whole replies (strings, integers, nil, nested arrays) parse exactly;
 * an array nested too deep, a bulk or an array too large, a line longer than the buffer, a
 * reply cut off by a closed connection, an unknown type byte: -EIO, never a crash or a read
 * past what arrived. A command is framed as RESP (the server sees exactly its bytes), and a
 * connect to a port nobody listens on is -ECONNREFUSED. No redis-server needed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store/redis/client.h"

/* One connection served: what it received (up to got's size), then reply sent, then closed. */
struct fake {
    int lfd;
    uint16_t port;
    pthread_t thread;
    const char *reply;
    size_t reply_len;
    char got[256];
    size_t got_len;
    size_t want; /* bytes to read before replying */
};

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
    for (size_t done = 0; done < f->reply_len; done += (size_t)k)
        if ((k = send(fd, f->reply + done, f->reply_len - done, MSG_NOSIGNAL)) <= 0)
            break;
    close(fd);
    return NULL;
}

static void fake_start(struct fake *f, const char *reply, size_t len, size_t want)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);

    memset(f, 0, sizeof(*f));
    f->reply = reply;
    f->reply_len = len;
    f->want = want;
    assert_true((f->lfd = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(f->lfd, 1), 0);
    assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&a, &al), 0);
    f->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&f->thread, NULL, serve, f), 0);
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
    assert_int_equal(exchange(deep, n, &v), -EIO); /* nested past RESP_MAX_DEPTH */
    assert_null(v);
    assert_int_equal(exchange("$1099511627776\r\n", 16, &v), -EIO); /* a TiB bulk */
    assert_int_equal(exchange("*1099511627776\r\n", 16, &v), -EIO); /* a huge array */
    assert_int_equal(exchange("$10\r\nabc", 8, &v), -EIO);          /* cut off: closed */
    assert_int_equal(exchange("*3\r\n:1\r\n", 8, &v), -EIO);        /* elements missing */
    assert_int_equal(exchange("!7\r\nabcdefg\r\n", 13, &v), -EIO);  /* RESP3 type */
    assert_int_equal(exchange("\r\n", 2, &v), -EIO);                /* an empty line */
    assert_int_equal(exchange("", 0, &v), -EIO);                    /* closed at once */
    assert_null(v);
    long_line = malloc(RESP_BUF_BYTES + 16);
    assert_non_null(long_line);
    long_line[0] = '+';
    memset(long_line + 1, 'x', RESP_BUF_BYTES + 8);
    assert_int_equal(exchange(long_line, RESP_BUF_BYTES + 9, &v), -EIO); /* no CRLF in reach */
    free(long_line);
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
        cmocka_unit_test(test_whole_replies),
        cmocka_unit_test(test_hostile_replies),
        cmocka_unit_test(test_framing_and_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
