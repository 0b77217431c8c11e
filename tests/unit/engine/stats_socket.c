#include "engine_test.h"

/* ---- the stats socket ---- */

/* Send one request line to the socket at path; the whole reply, NUL-terminated. */
static void ask(const char *path, const char *req, char *out, size_t cap)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    size_t n = 0;
    ssize_t r;

    assert_true(fd >= 0);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    while (n + 1 < cap && (r = read(fd, out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = '\0';
    close(fd);
}

/* The engine serves the figures of its last poll as JSON and as Prometheus text, on a socket
 * only its owner may use; a second engine cannot take a live socket; close removes it. */
void test_stats_socket(void **state)
{
    char dir[64], path[96], want[96], reply[16384];
    struct kvt_options o;
    kvt_engine *e = NULL, *other = NULL;
    struct stat st;

    (void)state;
    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "sock"), 0);
    snprintf(path, sizeof(path), "%s/stats.sock", dir);
    base_options(&o);
    o.stats_socket = path;
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(kvt_open(&o, &other), -EADDRINUSE);
    assert_null(other);

    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "{\"kvtier\":1,\"time_ns\":"));
    assert_non_null(strstr(reply, "\"device_tokens\":64,"));
    assert_non_null(strstr(reply, "\"match_calls\":0,"));
    /* Figures move at the next poll, not before. */
    struct kvt_key key = {.tokens = (const uint32_t[]){1, 2, 3, 4}, .len = 4};
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "\"match_calls\":0,"));
    assert_int_equal(kvt_poll(e, 0, NULL), 0);
    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "\"match_calls\":1,"));

    ask(path, "metrics\n", reply, sizeof(reply));
    snprintf(want, sizeof(want), "\nkvtier_device_tokens %u\n", 64u);
    assert_non_null(strstr(reply, want));
    assert_non_null(strstr(reply, "# TYPE kvtier_match_calls counter\nkvtier_match_calls 1\n"));
    assert_non_null(strstr(reply, "# TYPE kvtier_cached_tokens gauge\n"));
    ask(path, "bogus\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "error: unknown request"));
    /* Clients that leave before the reply: the server's write fails, and that must not
     * raise SIGPIPE in this process (it would end the test). */
    for (int i = 0; i < 200; i++) {
        int c = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un ca = {.sun_family = AF_UNIX};
        snprintf(ca.sun_path, sizeof(ca.sun_path), "%s", path);
        assert_int_equal(connect(c, (struct sockaddr *)&ca, sizeof(ca)), 0);
        assert_int_equal(write(c, "metrics\n", 8), 8);
        close(c);
    }
    ask(path, "stats\n", reply, sizeof(reply));
    assert_non_null(strstr(reply, "\"match_calls\":1,"));

    kvt_close(e);
    assert_int_equal(stat(path, &st), -1);
    /* A socket file left behind by a dead process is taken over. */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    close(fd);
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_close(e);
    rmdir(dir);
}
