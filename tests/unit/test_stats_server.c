/*
 * The stats socket against hostile clients (trickling, idle, flooding, never reading) and
 * hostile paths (a file, dir, symlink, fifo or live server already there).
 *
 * Time bounds are generous on purpose: "promptly" is PROMPT_MS on a slow shared machine, where
 * a server that serves one client at a time takes tens of seconds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "engine_fixture.h"
#include "stats_server.h"

#define PROMPT_MS 3000      /* a good client's answer, kvt_close: well past the server's 1 s */
#define ASK_TIMEOUT_MS 8000 /* past this the server held us up; give up rather than hang */
#define TRICKLE_US 900000   /* a byte every 0.9 s: under the old per-read timeout of 1 s */
#define TRICKLE_BYTES 12    /* ~11 s of trickling at most, so a failing run ends */

/* The process umask at the last bind(), through -Wl,--wrap=bind: the server must not change
 * it, since other threads of the process create files meanwhile. */
static atomic_uint umask_at_bind;

int __real_bind(int fd, const struct sockaddr *a, socklen_t len);
int __wrap_bind(int fd, const struct sockaddr *a, socklen_t len);
int __wrap_bind(int fd, const struct sockaddr *a, socklen_t len)
{
    mode_t m = umask(0);

    umask(m);
    atomic_store(&umask_at_bind, (unsigned)m);
    return __real_bind(fd, a, len);
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sock_addr(const char *path, struct sockaddr_un *a)
{
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    snprintf(a->sun_path, sizeof(a->sun_path), "%s", path);
}

/* A client connected to path; connect may wait at most wait_ms (a full backlog). -1 when
 * it could not connect. */
static int dial(const char *path, int wait_ms, int flags)
{
    struct sockaddr_un a;
    struct timeval tv = {wait_ms / 1000, (wait_ms % 1000) * 1000};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);

    assert_true(fd >= 0);
    sock_addr(path, &a);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
        return fd;
    close(fd);
    return -1;
}

/* Reads fd to EOF within deadline; true when EOF came. */
static bool read_to_eof(int fd, char *out, size_t cap, int64_t deadline)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    size_t n = 0;
    ssize_t r = 1;

    while (r > 0) {
        int64_t left = deadline - now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) != 1)
            break;
        r = read(fd, out + n, cap - 1 - n);
        n += r > 0 ? (size_t)r : 0;
    }
    out[n] = '\0';
    return r == 0;
}

/* Asks path one question like kvtier-ctl; the ms the whole answer took, or -1 when it did
 * not come within ASK_TIMEOUT_MS. */
static int64_t ask(const char *path, const char *req, char *out, size_t cap)
{
    int64_t t0 = now_ms();
    int fd = dial(path, ASK_TIMEOUT_MS, 0);
    bool done;

    out[0] = '\0';
    if (fd < 0)
        return -1;
    done = send(fd, req, strlen(req), MSG_NOSIGNAL) == (ssize_t)strlen(req) &&
           read_to_eof(fd, out, cap, t0 + ASK_TIMEOUT_MS);
    close(fd);
    return done ? now_ms() - t0 : -1;
}

/* A good client's stats within PROMPT_MS, whatever the others do. */
static void assert_answered(const char *path)
{
    char reply[4096];
    int64_t ms = ask(path, "stats\n", reply, sizeof(reply));

    assert_in_range(ms, 0, PROMPT_MS);
    assert_non_null(strstr(reply, "{\"kvtier\":1,\"time_ns\":"));
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    assert_non_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* ---- a client that trickles its request, from a thread ---- */

struct trickler {
    const char *path;
    pthread_t thread;
    atomic_int stop;
    atomic_int sent;
};

static void *trickle(void *arg)
{
    struct trickler *t = arg;
    int fd = dial(t->path, 1000, 0);

    for (int i = 0; fd >= 0 && i < TRICKLE_BYTES && !atomic_load(&t->stop); i++) {
        if (send(fd, "s", 1, MSG_NOSIGNAL) != 1)
            break;
        atomic_fetch_add(&t->sent, 1);
        usleep(TRICKLE_US);
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void trickler_start(struct trickler *t, const char *path)
{
    *t = (struct trickler){.path = path};
    assert_int_equal(pthread_create(&t->thread, NULL, trickle, t), 0);
    /* Let the server take it in first: a one-client-at-a-time server is then busy with it. */
    while (atomic_load(&t->sent) == 0)
        usleep(1000);
    usleep(200000);
}

static void trickler_stop(struct trickler *t)
{
    atomic_store(&t->stop, 1);
    pthread_join(t->thread, NULL);
}

/* Waits for the trickler to end on its own: when the server cuts it off, or after
 * TRICKLE_BYTES. */
static void trickler_join(struct trickler *t)
{
    pthread_join(t->thread, NULL);
}

/* ---- fixtures ---- */

struct fixture {
    char dir[64];
    char path[96]; /* a socket's path: 108 bytes at most */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));

    if (!f)
        return -1;
    if (fixture_data_dir(f->dir, sizeof(f->dir), "stats"))
        return -1;
    snprintf(f->path, sizeof(f->path), "%s/stats.sock", f->dir);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;

    fixture_remove_tree(f->dir);
    free(f);
    return 0;
}

static void engine_options(struct kvt_options *o, const char *path)
{
    fixture_engine_options(o, 2, 4);
    o->stats_socket = path;
}

static struct stats_server *server_start(const char *path)
{
    struct stats_server *sv = NULL;
    struct kvt_stats st = {.size = sizeof(st), .device_tokens = 64};

    assert_int_equal(stats_server_start(path, &sv), 0);
    stats_server_publish(sv, &st);
    return sv;
}

/* ---- clients ---- */

/* A regression: one client that trickled its request held the thread for a minute. */
static void test_trickler_does_not_hold_others(void **state)
{
    struct fixture *f = *state;
    struct stats_server *sv = server_start(f->path);
    struct trickler t;

    trickler_start(&t, f->path);
    assert_answered(f->path);
    assert_answered(f->path);
    /* The trickler is cut off at its deadline, not let run to the end. */
    trickler_join(&t);
    assert_in_range(atomic_load(&t.sent), 1, TRICKLE_BYTES - 1);
    stats_server_stop(sv);
}

/* A regression: kvt_close waited for a trickling client. */
static void test_close_while_trickling(void **state)
{
    struct fixture *f = *state;
    struct kvt_options o;
    kvt_engine *e = NULL;
    struct trickler t[3];
    int64_t t0;

    engine_options(&o, f->path);
    assert_int_equal(kvt_open(&o, &e), 0);
    for (int i = 0; i < 3; i++)
        trickler_start(&t[i], f->path);
    t0 = now_ms();
    kvt_close(e);
    assert_in_range(now_ms() - t0, 0, PROMPT_MS);
    for (int i = 0; i < 3; i++)
        trickler_stop(&t[i]);
}

/* A regression: 20 idle clients made every kvtier-ctl stat --live fail. The idle ones are closed
 * at their deadline, not kept. */
static void test_idle_clients(void **state)
{
    struct fixture *f = *state;
    struct stats_server *sv = server_start(f->path);
    int idle[40], n = 0;
    char buf[64];

    for (int i = 0; i < 40; i++)
        if ((idle[n] = dial(f->path, 0, SOCK_NONBLOCK)) >= 0)
            n++;
    assert_answered(f->path);
    assert_int_equal(n, 40);
    for (int i = 0; i < n; i++) {
        assert_true(read_to_eof(idle[i], buf, sizeof(buf), now_ms() + PROMPT_MS));
        close(idle[i]);
    }
    stats_server_stop(sv);
}

/* Hundreds of connections: idle, trickling a partial line, asking and never reading, leaving
 * at once. Good clients are answered throughout; nothing leaks once the server stops. */
static void test_many_clients(void **state)
{
    struct fixture *f = *state;
    enum { N = 400 };
    static int c[N];
    int fds = count_fds(), n = 0;
    struct stats_server *sv = server_start(f->path);
    char reply[16384];

    for (int i = 0; i < N; i++) {
        int fd = dial(f->path, 0, SOCK_NONBLOCK);

        if (fd >= 0 && i % 4 == 3)
            close(fd); /* gone before the server looks */
        else if (fd >= 0)
            c[n++] = fd;
        if (fd >= 0 && i % 4 == 1)
            send(fd, "sta", 3, MSG_NOSIGNAL);
        if (fd >= 0 && i % 4 == 2)
            send(fd, "metrics\n", 8, MSG_NOSIGNAL); /* and never read */
        if (i % 50 == 0)
            assert_answered(f->path);
    }
    assert_in_range(n, N * 3 / 4 - 10, N);
    assert_in_range(ask(f->path, "metrics\n", reply, sizeof(reply)), 0, PROMPT_MS);
    assert_non_null(strstr(reply, "\nkvtier_device_tokens 64\n"));
    assert_in_range(ask(f->path, "bogus\n", reply, sizeof(reply)), 0, PROMPT_MS);
    assert_non_null(strstr(reply, "error: unknown request \"bogus\""));
    int64_t t0 = now_ms();
    stats_server_stop(sv);
    assert_in_range(now_ms() - t0, 0, PROMPT_MS);
    for (int i = 0; i < n; i++)
        close(c[i]);
    assert_int_equal(count_fds(), fds);
}

/* A request cut short by the client's EOF is still answered; one longer than a request can
 * be gets the error, not silence. */
static void test_odd_requests(void **state)
{
    struct fixture *f = *state;
    struct stats_server *sv = server_start(f->path);
    char reply[4096], longreq[200];
    int fd = dial(f->path, 1000, 0);

    assert_true(fd >= 0);
    assert_int_equal(send(fd, "stats", 5, MSG_NOSIGNAL), 5);
    shutdown(fd, SHUT_WR);
    assert_true(read_to_eof(fd, reply, sizeof(reply), now_ms() + PROMPT_MS));
    assert_non_null(strstr(reply, "{\"kvtier\":1,"));
    close(fd);
    memset(longreq, 'x', sizeof(longreq) - 2);
    longreq[sizeof(longreq) - 2] = '\n';
    longreq[sizeof(longreq) - 1] = '\0';
    assert_in_range(ask(f->path, longreq, reply, sizeof(reply)), 0, PROMPT_MS);
    assert_non_null(strstr(reply, "error: unknown request"));
    stats_server_stop(sv);
}

/* ---- the path ---- */

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");

    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static void assert_file_holds(const char *path, const char *text)
{
    char buf[64] = "";
    FILE *fp = fopen(path, "r");

    assert_non_null(fp);
    assert_non_null(fgets(buf, sizeof(buf), fp));
    fclose(fp);
    assert_string_equal(buf, text);
}

/* kvt_open's answer for a stats_socket at path; an engine it opened is closed. */
static int open_at(const char *path)
{
    struct kvt_options o;
    kvt_engine *e = NULL;
    int rc;

    engine_options(&o, path);
    rc = kvt_open(&o, &e);
    kvt_close(e);
    return rc;
}

static mode_t kind_at(const char *path)
{
    struct stat st;

    assert_int_equal(lstat(path, &st), 0);
    return st.st_mode & S_IFMT;
}

/* A regression: a regular file at stats_socket was deleted. Nothing but a stale socket is
 * replaced; anything else is refused with -EEXIST and left as it was. */
static void test_path_not_a_socket(void **state)
{
    struct fixture *f = *state;
    char target[80];

    write_file(f->path, "keep me\n");
    assert_int_equal(open_at(f->path), -EEXIST);
    assert_file_holds(f->path, "keep me\n");
    unlink(f->path);

    assert_int_equal(mkdir(f->path, 0700), 0);
    assert_int_equal(open_at(f->path), -EEXIST);
    assert_int_equal(kind_at(f->path), S_IFDIR);
    rmdir(f->path);

    assert_int_equal(mkfifo(f->path, 0600), 0);
    assert_int_equal(open_at(f->path), -EEXIST);
    assert_int_equal(kind_at(f->path), S_IFIFO);
    unlink(f->path);

    snprintf(target, sizeof(target), "%s/target", f->dir);
    write_file(target, "the target\n");
    assert_int_equal(symlink(target, f->path), 0);
    assert_int_equal(open_at(f->path), -EEXIST);
    assert_int_equal(kind_at(f->path), S_IFLNK);
    assert_file_holds(target, "the target\n");
    unlink(f->path);
}

/* A live server at the path, kvtier's or not, is refused with -EADDRINUSE and keeps
 * answering; a stale socket is replaced. */
static void test_path_socket(void **state)
{
    struct fixture *f = *state;
    struct sockaddr_un a;
    int srv = socket(AF_UNIX, SOCK_STREAM, 0), c;

    sock_addr(f->path, &a);
    assert_int_equal(bind(srv, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(srv, 4), 0);
    assert_int_equal(open_at(f->path), -EADDRINUSE);
    assert_true((c = dial(f->path, 1000, 0)) >= 0);
    close(c);
    close(srv); /* now stale */
    assert_int_equal(kind_at(f->path), S_IFSOCK);

    struct kvt_options o;
    kvt_engine *e = NULL, *other = NULL;
    engine_options(&o, f->path);
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_answered(f->path);
    assert_int_equal(kvt_open(&o, &other), -EADDRINUSE);
    assert_null(other);
    assert_answered(f->path);
    kvt_close(e);
    assert_int_equal(access(f->path, F_OK), -1);
}

/* A datagram socket someone serves there is in use too. */
static void test_path_dgram_socket(void **state)
{
    struct fixture *f = *state;
    struct sockaddr_un a;
    int srv = socket(AF_UNIX, SOCK_DGRAM, 0);

    sock_addr(f->path, &a);
    assert_int_equal(bind(srv, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(open_at(f->path), -EADDRINUSE);
    assert_int_equal(kind_at(f->path), S_IFSOCK);
    close(srv);
}

static void test_path_errors(void **state)
{
    struct fixture *f = *state;
    char path[160];

    snprintf(path, sizeof(path), "%s/no-such-dir/stats.sock", f->dir);
    assert_int_equal(open_at(path), -ENOENT);
    memset(path, 'x', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    assert_int_equal(open_at(path), -ENAMETOOLONG);
}

/* Close removes its own socket only: a file put in its place meanwhile stays. */
static void test_close_keeps_a_replacement(void **state)
{
    struct fixture *f = *state;
    struct kvt_options o;
    kvt_engine *e = NULL;

    engine_options(&o, f->path);
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(unlink(f->path), 0);
    write_file(f->path, "someone else's\n");
    kvt_close(e);
    assert_file_holds(f->path, "someone else's\n");
}

/* The socket is its owner's (0600), and the process umask is left alone to get there. */
static void test_socket_mode(void **state)
{
    struct fixture *f = *state;
    mode_t old = umask(022);
    struct stats_server *sv = server_start(f->path);
    struct stat st;

    assert_int_equal(atomic_load(&umask_at_bind), 022);
    assert_int_equal(lstat(f->path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0600);
    stats_server_stop(sv);
    umask(old);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_trickler_does_not_hold_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_while_trickling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_odd_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_not_a_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_dgram_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_keeps_a_replacement, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_mode, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
