#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

int harness_child_exit;

void harness_fail(const struct harness_run *r, const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s FAILED%s: ", r->prog, harness_child_exit ? " in a child" : "");
    if (r->config)
        fprintf(stderr, "seed=%" PRIu64 " config=%s step=%" PRIu64 " op=%s ", r->seed, r->config,
                r->step, r->op ? r->op : "-");
    if (r->note && *r->note)
        fprintf(stderr, "%s: ", r->note);
    fprintf(stderr, "line %d: ", line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (harness_child_exit) {
        fflush(stderr);
        _exit(harness_child_exit);
    }
    _fail(file, line);
    abort(); /* not reached: _fail longjmps out of the test */
}
