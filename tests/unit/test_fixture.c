/*
 * The shared test fixture's data dirs (tests/common/engine_fixture.h): a dir a test made and
 * did not remove (it failed before its cleanup) is removed when the process exits, and only by
 * the process that made it (a forked child's exit leaves its parent's alone); a dir kept on
 * purpose stays. Each case runs in a forked child whose exit is the thing checked.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvtier.h"
#include "engine_fixture.h"

static bool exists(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0;
}

/* A child that makes a dir (with a file in it), keeps it when asked, and exits with status
 * 3, as a test that failed would; the dir's path comes back through shared memory. */
static void child_makes(char *shared, bool keep)
{
    pid_t pid = fork();
    int status;

    assert_true(pid >= 0);
    if (pid == 0) {
        char file[160];

        if (fixture_data_dir(shared, 128, "fixture-test"))
            _exit(4);
        snprintf(file, sizeof(file), "%s/f", shared);
        if (mkdir(file, 0700))
            _exit(5);
        if (keep)
            fixture_keep_tree(shared);
        exit(3); /* exit, not _exit: the handlers run */
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 3);
}

static void test_left_dirs_removed_at_exit(void **state)
{
    char *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    (void)state;
    assert_true(shared != MAP_FAILED);
    child_makes(shared, false);
    assert_true(shared[0] == '/');
    assert_false(exists(shared)); /* the child's exit removed what it left */
    child_makes(shared, true);
    assert_true(exists(shared)); /* kept on purpose */
    fixture_remove_tree(shared);
    assert_false(exists(shared));
    munmap(shared, 4096);
}

static void test_child_exit_spares_the_parent(void **state)
{
    char dir[128];
    pid_t pid;
    int status;

    (void)state;
    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "fixture-test"), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        exit(0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(exists(dir)); /* the child's exit left the parent's dir alone */
    fixture_remove_tree(dir);
    assert_false(exists(dir));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_left_dirs_removed_at_exit),
        cmocka_unit_test(test_child_exit_spares_the_parent),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
