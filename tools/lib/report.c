#include "report.h"

#include <stdio.h>
#include <stdlib.h>

void jw_init(struct jw *w)
{
    w->depth = 0;
    w->more[0] = false;
}

/* The comma before a value, when it is not the first of its container, and its key. */
static void member(struct jw *w, const char *key)
{
    if (w->more[w->depth])
        putchar(',');
    w->more[w->depth] = true;
    if (key)
        printf("\"%s\":", key);
}

static void open_container(struct jw *w, const char *key, char open, char close)
{
    member(w, key);
    if (w->depth + 1 >= JW_MAX_DEPTH)
        abort(); /* a report's shape is fixed in its code: this is a bug, not input */
    putchar(open);
    w->depth++;
    w->more[w->depth] = false;
    w->close[w->depth] = close;
}

void jw_object(struct jw *w, const char *key)
{
    open_container(w, key, '{', '}');
}

void jw_array(struct jw *w, const char *key)
{
    open_container(w, key, '[', ']');
}

void jw_end(struct jw *w)
{
    putchar(w->close[w->depth]);
    w->depth--;
}

void jw_u64(struct jw *w, const char *key, uint64_t v)
{
    member(w, key);
    printf("%llu", (unsigned long long)v);
}

void jw_double(struct jw *w, const char *key, const char *fmt, double v)
{
    member(w, key);
    printf(fmt, v);
}

void jw_bool(struct jw *w, const char *key, bool v)
{
    member(w, key);
    fputs(v ? "true" : "false", stdout);
}

void jw_string(struct jw *w, const char *key, const char *s)
{
    member(w, key);
    cli_json_string(s);
}

void jw_null(struct jw *w, const char *key)
{
    member(w, key);
    fputs("null", stdout);
}

void rpt_json_timing(struct jw *w, const char *key, const struct cli_timing *t, uint64_t bytes,
                     bool worst)
{
    jw_object(w, key);
    jw_double(w, "median_s", "%.9g", t->median);
    jw_double(w, "best_s", "%.9g", t->best);
    if (worst)
        jw_double(w, "worst_s", "%.9g", t->worst);
    jw_double(w, "median_gbps", "%.6g", cli_gbps(bytes, t->median));
    jw_double(w, "best_gbps", "%.6g", cli_gbps(bytes, t->best));
    jw_end(w);
}
