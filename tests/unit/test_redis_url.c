/*
 * store_redis_parse_url (src/store/redis/url.c), the one parser of options.remote,
 * kvtier-bench --remote and kvtier-ctl remote: hosts and ports, a password alone
 * (":PASSWORD@", the default user), an ACL user ("USER:PASSWORD@"), percent-decoding of both,
 * cluster seed lists with one user and password, rediss:// (TLS), the store's options after
 * '?' (copies, replica_reads; a '?' in a password is no query) and the URLs it refuses. No
 * server needed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "store/redis/redis.h"

struct parsed {
    char buf[512];
    struct store_redis_options o;
};

static int parse(const char *url, struct parsed *p)
{
    memset(p, 0, sizeof(*p));
    return store_redis_parse_url(url, p->buf, sizeof(p->buf), &p->o);
}

static void expect_auth(const struct parsed *p, const char *user, const char *password)
{
    if (user)
        assert_string_equal(p->o.user, user);
    else
        assert_null(p->o.user);
    if (password)
        assert_string_equal(p->o.password, password);
    else
        assert_null(p->o.password);
}

static void test_host_port(void **state)
{
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://db.example:6380", &p), 0);
    assert_string_equal(p.o.host, "db.example");
    assert_int_equal(p.o.port, 6380);
    assert_int_equal(p.o.n_seeds, 1);
    expect_auth(&p, NULL, NULL);
    assert_int_equal(parse("redis://10.0.0.1", &p), 0);
    assert_int_equal(p.o.port, 0); /* the store's default, 6379 */
}

static void test_password_alone(void **state)
{
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://:s3cret@h:1", &p), 0);
    expect_auth(&p, NULL, "s3cret");
    assert_string_equal(p.o.host, "h");
    /* '@' and ':' may stand as they are in a password: the last '@' ends it. */
    assert_int_equal(parse("redis://:a@b:c@h:2", &p), 0);
    expect_auth(&p, NULL, "a@b:c");
    assert_int_equal(p.o.port, 2);
}

static void test_acl_user(void **state)
{
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://kv:pw@h:7000", &p), 0);
    expect_auth(&p, "kv", "pw");
    assert_string_equal(p.o.host, "h");
    assert_int_equal(p.o.port, 7000);
    /* The first ':' ends the user: the rest is the password's. */
    assert_int_equal(parse("redis://kv:p:w@h", &p), 0);
    expect_auth(&p, "kv", "p:w");
}

static void test_percent_decoding(void **state)
{
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://k%3Av:p%40%3a%2C%25x@h:1", &p), 0);
    expect_auth(&p, "k:v", "p@:,%x");
    /* A '%' without two hex digits after it is itself. */
    assert_int_equal(parse("redis://:50%-off%4@h", &p), 0);
    expect_auth(&p, NULL, "50%-off%4");
    /* A NUL could not go in AUTH. */
    assert_int_equal(parse("redis://:a%00b@h", &p), -EINVAL);
}

static void test_seed_list(void **state)
{
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://kv:p%2Cw@a:1,redis://kv:p%2Cw@b:2,c:3", &p), 0);
    assert_int_equal(p.o.n_seeds, 3);
    expect_auth(&p, "kv", "p,w");
    assert_string_equal(p.o.seeds[1].host, "b");
    assert_int_equal(p.o.seeds[2].port, 3);
    /* One cluster, one user and password. */
    assert_int_equal(parse("redis://kv:pw@a:1,redis://other:pw@b:2", &p), -EINVAL);
    assert_int_equal(parse("redis://kv:pw@a:1,redis://:pw@b:2", &p), -EINVAL);
    assert_int_equal(parse("redis://:pw@a:1,redis://:other@b:2", &p), -EINVAL);
}

/* rediss:// asks for TLS, for every seed: a later seed may repeat the scheme or leave it off,
 * not name the other one. */
static void test_tls_scheme(void **state)
{
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://a:1", &p), 0);
    assert_false(p.o.tls);
    assert_int_equal(parse("rediss://kv:pw@a:1,rediss://kv:pw@b:2,c:3", &p), 0);
    assert_true(p.o.tls);
    assert_int_equal(p.o.n_seeds, 3);
    expect_auth(&p, "kv", "pw");
    assert_string_equal(p.o.seeds[1].host, "b");
    assert_int_equal(parse("rediss://a:1,redis://b:2", &p), -EINVAL);
    assert_int_equal(parse("redis://a:1,rediss://b:2", &p), -EINVAL);
    assert_int_equal(parse("redisss://a:1", &p), -EINVAL);
    assert_int_equal(parse("rediss://", &p), -EINVAL);
}

static void test_options(void **state)
{
    static const char *bad[] = {
        "redis://h:1?copies=3",
        "redis://h:1?copies=",
        "redis://h:1?copies",
        "redis://h:1?ttl=5",
        "redis://h:1?replica_reads=maybe",
        "redis://h:1?copies=1&",
    };
    struct parsed p;

    (void)state;
    assert_int_equal(parse("redis://a:1,b:2?copies=1&replica_reads=yes", &p), 0);
    assert_int_equal(p.o.n_seeds, 2);
    assert_int_equal(p.o.seeds[1].port, 2);
    assert_int_equal(p.o.copies, 1);
    assert_true(p.o.replica_reads);
    assert_int_equal(parse("redis://a:1?replica_reads=no&copies=2", &p), 0);
    assert_int_equal(p.o.copies, 2);
    assert_false(p.o.replica_reads);
    assert_int_equal(parse("redis://a:1", &p), 0);
    assert_int_equal(p.o.copies, 0); /* the store's default: 2 on a cluster */
    /* A '?' before the last '@' is the password's. */
    assert_int_equal(parse("redis://:pa?ss@h:1", &p), 0);
    expect_auth(&p, NULL, "pa?ss");
    assert_int_equal(parse("redis://:pa?ss@h:1?copies=1", &p), 0);
    expect_auth(&p, NULL, "pa?ss");
    assert_int_equal(p.o.copies, 1);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        print_message("%s\n", bad[i]);
        assert_int_equal(parse(bad[i], &p), -EINVAL);
    }
}

static void test_refused(void **state)
{
    static const char *bad[] = {
        "http://h:1",   "redis://",    "redis://h:99999", "redis://h:0",
        "redis://h:",   "redis://u@h", "redis://u:@h",    "redis://:@h",
        "redis://:pw@", "redis://h/0", "redis://h:1,",
    };
    struct parsed p;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        print_message("%s\n", bad[i]);
        assert_int_equal(parse(bad[i], &p), -EINVAL);
    }
    /* A failed parse leaves the options as they were. */
    p.o.port = 42;
    assert_int_equal(store_redis_parse_url("redis://u@h", p.buf, sizeof(p.buf), &p.o), -EINVAL);
    assert_int_equal(p.o.port, 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_port),  cmocka_unit_test(test_password_alone),
        cmocka_unit_test(test_acl_user),   cmocka_unit_test(test_percent_decoding),
        cmocka_unit_test(test_seed_list),  cmocka_unit_test(test_refused),
        cmocka_unit_test(test_tls_scheme), cmocka_unit_test(test_options),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
