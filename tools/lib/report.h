/* What the benchmarks' reports share: a tiny JSON writer on stdout that keeps the commas and
 * the nesting, so a report says only what it holds, and a timing as JSON. (The text tables
 * stay with each bench: their rows share no format.) */
#ifndef KVT_TOOLS_REPORT_H
#define KVT_TOOLS_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "cli.h"

#define JW_MAX_DEPTH 16

/* A JSON document being written on stdout. Every call names its member's key, or passes NULL
 * inside an array and for the outermost value. */
struct jw {
    int depth;
    bool more[JW_MAX_DEPTH]; /* the open container at each depth has a value already */
    char close[JW_MAX_DEPTH];
};

/* Start a document (nothing is written yet). */
void jw_init(struct jw *w);
/* Open an object or an array; jw_end closes the innermost one. */
void jw_object(struct jw *w, const char *key);
void jw_array(struct jw *w, const char *key);
void jw_end(struct jw *w);

void jw_u64(struct jw *w, const char *key, uint64_t v);
/* v printed with fmt, one printf conversion of a double ("%.6g"); the caller keeps it finite. */
void jw_double(struct jw *w, const char *key, const char *fmt, double v);
void jw_bool(struct jw *w, const char *key, bool v);
/* s escaped; NULL writes null. */
void jw_string(struct jw *w, const char *key, const char *s);
void jw_null(struct jw *w, const char *key);

/* A timing of a copy of bytes: {"median_s", "best_s", "worst_s" (with worst), "median_gbps",
 * "best_gbps"}. */
void rpt_json_timing(struct jw *w, const char *key, const struct cli_timing *t, uint64_t bytes,
                     bool worst);

#endif
