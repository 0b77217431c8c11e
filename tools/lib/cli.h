/* Command-line pieces the tools share. */
#ifndef KVT_TOOLS_CLI_H
#define KVT_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"

/* Bytes of an argument an error message quotes: an option's value, and a path. */
#define CLI_ECHO_MAX 64
#define CLI_PATH_ECHO_MAX 256

/* s cut to its first max bytes (at a UTF-8 character boundary) and "..." when longer, for an
 * error message: s itself, or buf (max + 4 bytes) holding the cut. NULL stays NULL. */
const char *cli_clip(const char *s, size_t max, char *buf);

/* Print "prog: msg: arg" (arg cut to CLI_ECHO_MAX bytes) and a hint to try --help on stderr;
 * returns 2, the usage status. */
int cli_bad_usage(const char *prog, const char *msg, const char *arg);

/* A decimal count, digits only; false for anything else or an overflow. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* A byte count: digits, then optionally K, M, G or T (powers of 1024); false for anything
 * else or an overflow. */
bool cli_parse_size(const char *s, uint64_t *out);

/* s as a JSON string on stdout; NULL prints null. */
void cli_json_string(const char *s);

/* s's index in names[0 .. n-1] into *out; false when it is none of them. */
bool cli_parse_name(const char *s, const char *const *names, size_t n, uint32_t *out);

/* cli_parse_name for option opt, or bad usage listing the names ("--io needs auto, uring or
 * psync"): 0, or the bad-usage status. */
int cli_parse_named(const char *prog, const char *opt, const char *val, const char *const *names,
                    size_t n, uint32_t *out);

/* What a hybrid model has beside its attention layers. */
struct cli_hybrid {
    struct kvt_mamba mamba; /* recurrent layers (layers 0: none) */
    uint32_t swa_window;    /* sliding-window layers' window (0: none) */
    uint32_t full_every;    /* with a window: the last layer of every full_every is full
                               attention (layers full_every-1, 2*full_every-1, ...) */
};

/* A model's KV geometry under a short name, for --geometry. */
struct cli_preset {
    const char *name;
    struct kvt_geometry g;
    uint32_t tp_size; /* the tensor-parallel size the geometry is one rank of */
    const char *about;
    struct cli_hybrid hybrid;
};

/* The preset called name, or NULL. The table is static and lives as long as the program. */
const struct cli_preset *cli_preset_find(const char *name);

/* One line per preset ("<indent>name  about") on f, for --help. */
void cli_print_presets(FILE *f, const char *indent);

/* A --geometry argument: a preset, key=value pairs, or a preset then pairs, comma separated
 * (keys: attention=mha|mla, layers, kv_heads, head_dim, v_head_dim, kv_lora_rank,
 * qk_rope_head_dim, dtype_bytes, tp_size). Fills *g and *tp_size (1 unless given) and
 * returns 0 when the result is a valid model; otherwise says why on stderr and returns 2,
 * leaving *g and *tp_size unspecified. */
int cli_parse_geometry(const char *prog, const char *arg, struct kvt_geometry *g,
                       uint32_t *tp_size);

/* cli_parse_geometry that also takes a hybrid model's layers into *h (keys mamba_layers,
 * conv_bytes, ssm_bytes, swa_window, full_every; a hybrid preset's own), which
 * cli_parse_geometry refuses as keys and leaves out of a preset (its KV part only). */
int cli_parse_model(const char *prog, const char *arg, struct kvt_geometry *g, uint32_t *tp_size,
                    struct cli_hybrid *h);

/* ---- the option table: one parser and one usage printer for every tool's options ---- */

#define CLI_MAX_LIST 8 /* values a list option takes */

/* What an option takes, and the type of the config field it sets. */
enum cli_kind {
    CLI_TEXT,   /* no option: help is printed as it stands (a heading, a line for several) */
    CLI_HELP,   /* --help: printed with the others; the parser takes --help and -h itself */
    CLI_FLAG,   /* no value; sets a bool */
    CLI_COUNT,  /* a uint64_t from lo to hi, digits only */
    CLI_SIZE,   /* a uint64_t from lo to hi, digits then optionally K, M, G or T */
    CLI_COUNTS, /* up to CLI_MAX_LIST CLI_COUNT values, comma separated: a struct cli_list */
    CLI_SIZES,  /* likewise of CLI_SIZE values */
    CLI_NAME,   /* one of names: its index, a uint32_t */
    CLI_STRING, /* the value itself, a const char *, at least lo bytes long */
    CLI_CUSTOM, /* parse sets what it likes */
};

struct cli_list {
    uint64_t v[CLI_MAX_LIST];
    size_t n;
};

/* One row of a tool's table (static, like the strings it points to); fields a kind does not
 * use stay 0. The field at offset must have the kind's type: nothing can check that. */
struct cli_option {
    const char *name; /* "--reps"; NULL for CLI_TEXT */
    enum cli_kind kind;
    size_t offset;            /* of the field in the tool's config (CLI_CUSTOM: 0 for all of it) */
    uint64_t lo, hi;          /* bounds of a count, or lo: the shortest string */
    const char *const *names; /* CLI_NAME */
    size_t nnames;            /* CLI_NAME */
    /* CLI_CUSTOM: given cfg + offset; 0, or the bad-usage status after saying why */
    int (*parse)(void *field, const char *opt, const char *val);
    const char *arg;       /* for usage: what the value is ("N", "LIST") */
    const char *help;      /* for usage: lines, the first beside the name; NULL: unlisted */
    void (*more)(FILE *f); /* for usage: printed after help (a list of presets) */
};

#define CLI_COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
/* A CLI_NAME row's names: CLI_NAMES(io_names). */
#define CLI_NAMES(a) .names = (a), .nnames = CLI_COUNT_OF(a)
/* A macro's value as a string, for help text: CLI_STR(DEFAULT_REPS) is "3". */
#define CLI_STR(x) CLI_STR_(x)
#define CLI_STR_(x) #x

/* val as a count (size: with K/M/G/T) from lo to hi into *out: 0, or bad usage ("--reps
 * needs a whole number from 1 to 100"). */
int cli_parse_count(const char *prog, const char *opt, const char *val, uint64_t lo, uint64_t hi,
                    bool size, uint64_t *out);

/* argv against the table, setting fields of cfg: 0 to go on, -1 after printing usage on stdout
 * for --help or -h, else the bad-usage status (an unknown option, a missing or bad value). */
int cli_parse_args(const char *prog, const struct cli_option *opts, size_t n, void *cfg, int argc,
                   char **argv, void (*usage)(FILE *f));

/* The table's options on f, in its order: "  NAME ARG" padded to column width, then the help
 * (its further lines at that column). */
void cli_print_options(FILE *f, const struct cli_option *opts, size_t n, int width);

/* ---- for the benchmarks ---- */

struct cli_timing {
    double median, best, worst; /* seconds */
};

/* CLOCK_MONOTONIC in seconds. */
double cli_now(void);
/* Median, best and worst of n > 0 samples; sorts them. */
struct cli_timing cli_summarize(double *t, size_t n);
/* bytes / seconds in GB/s (10^9), 0 for no time. */
double cli_gbps(uint64_t bytes, double seconds);
/* a / b, 0 when b is not positive. */
double cli_ratio(double a, double b);
/* "met" or "MISSED", for a target. */
const char *cli_met(bool ok);
/* A progress line on stderr when it is a terminal (pipes get nothing): rewritten in place at
 * most every CLI_PROGRESS_MS, and cleared at the end, so the report that follows stands
 * alone. The tools' long phases share it. */
#define CLI_PROGRESS_MS 250
struct cli_progress {
    bool tty;
    double t0, shown; /* cli_now() at the start, and at the last line */
};

void cli_progress_start(struct cli_progress *p);
/* Whether a line is due (a terminal, and CLI_PROGRESS_MS since the last one): the caller then
 * prints it with cli_progress_line. */
bool cli_progress_due(struct cli_progress *p);
/* The line, in place of the last one. */
void cli_progress_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Seconds since the start. */
double cli_progress_seconds(const struct cli_progress *p);
/* Clear the line (a terminal only). */
void cli_progress_end(const struct cli_progress *p);

/* n bytes as "1.50 GiB", "3.0 MiB" or "12.0 KiB" in buf (32 bytes); buf. */
const char *cli_size(uint64_t n, char *buf);
/* cli_size on stdout. */
void cli_print_size(uint64_t n);

#endif
