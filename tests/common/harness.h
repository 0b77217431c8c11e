/*
 * The failure reporter the unit tests share: REQUIRE and EXPECT_RC check like cmocka's
 * asserts but print what reproduces the failure (a randomized run's seed, configuration, step
 * and operation) and, in a forked child that has no cmocka test to fail, exit with a status
 * the parent reads instead of longjmp-ing into a copy of the parent's stack.
 *
 * A program defines HARNESS_RUN(s): from the first argument of its REQUIRE, EXPECT_RC and
 * FAIL, a `const struct harness_run *` naming the run (a compound literal built from its
 * state, usually). Include after cmocka.h and kvtier.h.
 */
#ifndef KVT_TESTS_HARNESS_H
#define KVT_TESTS_HARNESS_H

#include <stdint.h>

/* Exit status of a test that cannot run here (no GPU, no io_uring): meson counts it skipped. */
#define T_EXIT_SKIP 77

/* What a failure names besides its line. Fields left NULL are not printed. */
struct harness_run {
    const char *prog;   /* "test_random": the first word of every failure */
    const char *config; /* a randomized run's configuration; with it seed, step and op print */
    uint64_t seed, step;
    const char *op;   /* the operation under way */
    const char *note; /* anything else that places the failure: "crash seed=... round 3" */
};

/* Nonzero in a forked child: a failure there prints and _exits with this status. */
extern int harness_child_exit;

/* Prints "PROG FAILED: <the run> line LINE: <message>" to stderr and fails the cmocka test
 * (reported at file:line), or exits a child; does not return. */
void harness_fail(const struct harness_run *r, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));

#define FAIL(s, ...) harness_fail(HARNESS_RUN(s), __FILE__, __LINE__, __VA_ARGS__)

#define REQUIRE(s, cond)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            FAIL(s, "%s", #cond);                                                                  \
    } while (0)

#define EXPECT_RC(s, call, want)                                                                   \
    do {                                                                                           \
        int rc_ = (call), want_ = (want);                                                          \
        if (rc_ != want_)                                                                          \
            FAIL(s, "%s gave %d (%s), expected %d", #call, rc_, kvt_strerror(rc_), want_);         \
    } while (0)

#endif
