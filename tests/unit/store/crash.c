#include "store_test.h"

/* ---- crash consistency ---- */

#define CRASH_SLOTS 48

/* The child: writes batches of fresh pages forever (evicting all along), now and then
 * deleting one. Killed by the parent. */
static void crash_child(struct fx *f, uint64_t round)
{
    struct dstore *s;
    uint8_t key[KEY];

    if (dstore_open(&f->o, &s))
        _exit(3);
    for (uint64_t n = 0;; n++) {
        uint64_t first = round * 1000000 + n * 8;

        child_put(s, f->bufs, first, 1 + n % 8);
        if (n % 5 == 4) {
            make_key(first, key);
            dstore_delete(s, key, 1, NULL);
        }
    }
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Rounds of a child killed while it writes, the dir reopened and every record read back. */
static void crash_rounds(struct fx *f, const char *mode)
{
    const char *env = getenv("KVT_CRASH_ROUNDS");
    int rounds = env ? atoi(env) : 100;
    uint64_t seed = now_ns(), rng = seed;
    size_t total = 0;

    need_io();
    print_message("crash test (%s): %d rounds, seed %llu\n", mode, rounds,
                  (unsigned long long)seed);
    f->o.disk_bytes = CRASH_SLOTS * SLOT;
    f->o.stripes = DSTORE_STRIPES; /* as users open it: several slabs growing at once */
    for (int round = 0; round < rounds; round++) {
        struct readback c = {f, true, 0};
        int status;
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0)
            crash_child(f, (uint64_t)round + 1);
        usleep((useconds_t)(1000 + rng_mix(rng++) % 40000)); /* open, rebuild, batches */
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status)); /* it never stops on its own */
        assert_int_equal(dstore_open(&f->o, &f->s), 0);
        assert_int_equal(dstore_wait_ready(f->s), 0);
        assert_int_equal(dstore_iterate(f->s, readback_visit, &c), 0);
        total += c.served;
        dstore_close(f->s);
        f->s = NULL;
    }
    print_message("crash test (%s): %zu pages verified, 0 wrong\n", mode, total);
    assert_true(total > 0);
}

void test_crash(void **state)
{
    crash_rounds(*state, "durable");
}

/* The same in relaxed mode, with flushes now and then within a child's life: a SIGKILL leaves
 * the page cache to the disk, so every record still names its bytes. */
void test_crash_relaxed(void **state)
{
    struct fx *f = *state;

    f->o.sync = DSTORE_SYNC_RELAXED;
    f->o.sync_ms = 5;
    crash_rounds(f, "relaxed");
}
