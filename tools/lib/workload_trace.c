/*
 * Mooncake traces (workload.h): a trace file read a line at a time, each line a request whose
 * hash_ids name its 512-token blocks.
 */
#include "workload.h"

#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HASH_ID_BITS 40
#define TAG_SHIFT 48
#define OUTPUT_BIT WL_OUTPUT_BIT

/* A minimal JSON reader over one line: enough to find three fields and skip the rest. */
struct cursor {
    const char *p;
    const char *err;
};

static void skip_ws(struct cursor *c)
{
    while (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n')
        c->p++;
}

static bool fail(struct cursor *c, const char *err)
{
    if (!c->err)
        c->err = err;
    return false;
}

static bool expect(struct cursor *c, char ch, const char *err)
{
    skip_ws(c);
    if (*c->p != ch)
        return fail(c, err);
    c->p++;
    return true;
}

/* A string; its unescaped text goes to buf when it fits (keys we look for are short). */
static bool read_string(struct cursor *c, char *buf, size_t cap)
{
    size_t n = 0;

    if (!expect(c, '"', "expected a string"))
        return false;
    for (;;) {
        char ch = *c->p;
        if (ch == '\0')
            return fail(c, "unterminated string");
        c->p++;
        if (ch == '"')
            break;
        if (ch == '\\') {
            ch = *c->p;
            if (ch == '\0')
                return fail(c, "unterminated string");
            c->p++;
            if (ch == 'u') {
                for (int i = 0; i < 4; i++, c->p++)
                    if (!strchr("0123456789abcdefABCDEF", *c->p) || *c->p == '\0')
                        return fail(c, "bad \\u escape in string");
                ch = '?'; /* never part of a key we look for */
            } else if (!strchr("\"\\/bfnrt", ch)) {
                return fail(c, "bad escape in string");
            }
        }
        if (buf && n + 1 < cap)
            buf[n++] = ch;
    }
    if (buf && cap)
        buf[n < cap ? n : cap - 1] = '\0';
    return true;
}

/* A non-negative integer no larger than max. */
static bool read_uint(struct cursor *c, uint64_t max, const char *what, uint64_t *out)
{
    uint64_t v = 0;

    skip_ws(c);
    if (*c->p < '0' || *c->p > '9')
        return fail(c, what);
    while (*c->p >= '0' && *c->p <= '9') {
        uint64_t d = (uint64_t)(*c->p++ - '0');
        if (v > (max - d) / 10)
            return fail(c, what);
        v = v * 10 + d;
    }
    if (*c->p == '.' || *c->p == 'e' || *c->p == 'E')
        return fail(c, what);
    *out = v;
    return true;
}

static bool skip_value(struct cursor *c, int depth);

static bool skip_container(struct cursor *c, int depth, char close)
{
    c->p++;
    skip_ws(c);
    if (*c->p == close) {
        c->p++;
        return true;
    }
    for (;;) {
        if (close == '}' && (!read_string(c, NULL, 0) || !expect(c, ':', "expected ':'")))
            return false;
        if (!skip_value(c, depth + 1))
            return false;
        skip_ws(c);
        if (*c->p == close) {
            c->p++;
            return true;
        }
        if (!expect(c, ',', close == '}' ? "expected ',' or '}'" : "expected ',' or ']'"))
            return false;
    }
}

/* Any JSON value, checked for shape (numbers loosely) but not kept. */
static bool skip_value(struct cursor *c, int depth)
{
    static const char *const words[] = {"true", "false", "null"};

    if (depth > 64)
        return fail(c, "values nested too deeply");
    skip_ws(c);
    char ch = *c->p;
    if (ch == '"')
        return read_string(c, NULL, 0);
    if (ch == '{' || ch == '[')
        return skip_container(c, depth, ch == '{' ? '}' : ']');
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        c->p++;
        while (strchr("0123456789.eE+-", *c->p) && *c->p)
            c->p++;
        return true;
    }
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        size_t n = strlen(words[i]);
        if (strncmp(c->p, words[i], n) == 0) {
            c->p += n;
            return true;
        }
    }
    return fail(c, "expected a JSON value");
}

/* The line being read: the request and which fields it had. */
struct line {
    struct workload *w;
    uint32_t tag;
    struct wl_req r;
    uint32_t nids;
    bool have_ids, have_in, have_out;
};

static bool read_hash_ids(struct cursor *c, struct line *ln)
{
    const char *what = "hash_ids holds something other than an integer below 2^40";

    if (!expect(c, '[', "hash_ids is not an array"))
        return false;
    ln->r.first_seg = ln->w->nsegs;
    skip_ws(c);
    if (*c->p == ']') {
        c->p++;
        return true;
    }
    for (;;) {
        uint64_t id;
        if (!read_uint(c, (1ull << MAX_HASH_ID_BITS) - 1, what, &id))
            return false;
        if (ln->nids == WL_MAX_INPUT_LENGTH / WL_BLOCK_TOKENS)
            return fail(c, "hash_ids is longer than input_length allows");
        wl_add_seg(ln->w, (uint64_t)ln->tag << TAG_SHIFT | id, WL_BLOCK_TOKENS);
        ln->nids++;
        skip_ws(c);
        if (*c->p == ']') {
            c->p++;
            return true;
        }
        if (!expect(c, ',', "expected ',' or ']' in hash_ids"))
            return false;
    }
}

static bool read_length(struct cursor *c, bool *have, const char *dup, uint64_t max,
                        const char *bad, uint32_t *out)
{
    uint64_t v;

    if (*have)
        return fail(c, dup);
    *have = true;
    if (!read_uint(c, max, bad, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

/* One field of the object: hash_ids, input_length and output_length are kept. */
static bool read_field(struct cursor *c, struct line *ln)
{
    char key[32];

    if (!read_string(c, key, sizeof(key)) || !expect(c, ':', "expected ':' after a key"))
        return false;
    if (strcmp(key, "hash_ids") == 0) {
        if (ln->have_ids)
            return fail(c, "duplicate key hash_ids");
        ln->have_ids = true;
        return read_hash_ids(c, ln);
    }
    if (strcmp(key, "input_length") == 0)
        return read_length(c, &ln->have_in, "duplicate key input_length", WL_MAX_INPUT_LENGTH,
                           "input_length is not an integer in [0, 2^24]", &ln->r.input_len);
    if (strcmp(key, "output_length") == 0)
        return read_length(c, &ln->have_out, "duplicate key output_length", WL_MAX_OUTPUT_LENGTH,
                           "output_length is not an integer in [0, 2^20]", &ln->r.output_len);
    return skip_value(c, 1);
}

static bool check_line(struct cursor *c, struct line *ln)
{
    uint64_t n = ln->nids, len = ln->r.input_len;

    if (!ln->have_ids)
        return fail(c, "no hash_ids");
    if (!ln->have_in)
        return fail(c, "no input_length");
    if (n == 0)
        return fail(c, "hash_ids is empty");
    /* The last block is partial: 1 to 512 tokens. */
    if (len <= (n - 1) * WL_BLOCK_TOKENS || len > n * WL_BLOCK_TOKENS)
        return fail(c, "input_length does not fit hash_ids (512 tokens per id, last partial)");
    ln->w->segs[ln->w->nsegs - 1].len = (uint32_t)(len - (n - 1) * WL_BLOCK_TOKENS);
    ln->r.nsegs = (uint32_t)n;
    return true;
}

static bool parse_line(struct cursor *c, struct line *ln)
{
    if (!expect(c, '{', "expected a JSON object"))
        return false;
    skip_ws(c);
    if (*c->p != '}') {
        for (;;) {
            if (!read_field(c, ln))
                return false;
            skip_ws(c);
            if (*c->p == '}')
                break;
            if (!expect(c, ',', "expected ',' or '}'"))
                return false;
        }
    }
    c->p++;
    skip_ws(c);
    if (*c->p != '\0')
        return fail(c, "text after the object");
    return check_line(c, ln);
}

static bool blank(const char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
        s++;
    return *s == '\0';
}

static int errorf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* Parse one non-blank line into a request; -1 with err set. */
static int read_line(struct workload *w, uint32_t tag, const char *text, size_t lineno,
                     const char *path, char *err, size_t err_len)
{
    size_t segs_before = w->nsegs;
    struct line ln = {.w = w, .tag = tag};
    struct cursor c = {.p = text};

    if (!parse_line(&c, &ln)) {
        w->nsegs = segs_before;
        return errorf(err, err_len, "%s:%zu:%zu: %s", path, lineno, (size_t)(c.p - text) + 1,
                      c.err);
    }
    ln.r.output_id = OUTPUT_BIT | (uint64_t)tag << TAG_SHIFT | lineno;
    wl_add_req(w, &ln.r);
    return 0;
}

struct wl_trace {
    const char *path;                 /* for fopen */
    const char *name;                 /* for messages: path, cut when long */
    char clip[CLI_PATH_ECHO_MAX + 4]; /* what name points to when cut */
    FILE *f;
    uint32_t tag;
    char *line; /* the line being parsed, NUL-terminated; never longer than the limit */
    size_t cap, lineno;
};

int wl_trace_open(const char *path, uint32_t tag, struct wl_trace **out, char *err, size_t err_len)
{
    char clip[CLI_PATH_ECHO_MAX + 4];
    const char *name = cli_clip(path, CLI_PATH_ECHO_MAX, clip);
    struct wl_trace *t;

    if (tag > 255)
        return errorf(err, err_len, "%s: trace tag %u is above 255", name, tag);
    if (!(t = calloc(1, sizeof(*t))))
        return errorf(err, err_len, "%s: out of memory", name);
    t->path = path;
    t->name = cli_clip(path, CLI_PATH_ECHO_MAX, t->clip);
    t->tag = tag;
    if (!(t->f = fopen(path, "r"))) {
        errorf(err, err_len, "%s: %s", name, strerror(errno));
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void wl_trace_close(struct wl_trace *t)
{
    if (!t)
        return;
    fclose(t->f);
    free(t->line);
    free(t);
}

int wl_trace_rewind(struct wl_trace *t, char *err, size_t err_len)
{
    if (fseek(t->f, 0, SEEK_SET))
        return errorf(err, err_len,
                      "%s: cannot be read again from the start (%s): give a "
                      "regular file, not a pipe",
                      t->name, strerror(errno));
    t->lineno = 0;
    return 0;
}

/* Room for need bytes of line (at most the limit and its NUL). */
static int grow_line(struct wl_trace *t, size_t need, char *err, size_t err_len)
{
    size_t cap = t->cap ? t->cap : 4096;

    if (need <= t->cap)
        return 0;
    while (cap < need)
        cap *= 2;
    if (cap > WL_MAX_LINE_BYTES + 1)
        cap = WL_MAX_LINE_BYTES + 1;
    char *line = realloc(t->line, cap);
    if (!line)
        return errorf(err, err_len, "%s:%zu: out of memory", t->name, t->lineno);
    t->line = line;
    t->cap = cap;
    return 0;
}

/* The next line, its newline dropped, into t->line: 1; 0 at the end of the file; -1 with
 * err set. A NUL byte or a line over the limit fails as soon as it is read, so a file with
 * no newline (/dev/zero) costs at most the limit. */
static int next_line(struct wl_trace *t, char *err, size_t err_len)
{
    size_t n = 0;
    int ch;

    t->lineno++;
    while ((ch = getc_unlocked(t->f)) != EOF && ch != '\n') {
        if (ch == '\0')
            return errorf(err, err_len, "%s:%zu: NUL byte in line", t->name, t->lineno);
        if (n == WL_MAX_LINE_BYTES)
            return errorf(err, err_len, "%s:%zu: line longer than %u bytes", t->name, t->lineno,
                          WL_MAX_LINE_BYTES);
        if (grow_line(t, n + 2, err, err_len))
            return -1;
        t->line[n++] = (char)ch;
    }
    if (ch == EOF && ferror(t->f))
        return errorf(err, err_len, "%s:%zu: read error: %s", t->name, t->lineno, strerror(errno));
    if (ch == EOF && n == 0)
        return 0;
    if (grow_line(t, n + 1, err, err_len))
        return -1;
    t->line[n] = '\0';
    return 1;
}

int wl_trace_next(struct wl_trace *t, struct workload *w, char *err, size_t err_len)
{
    int rc;

    while ((rc = next_line(t, err, err_len)) == 1)
        if (!blank(t->line))
            return read_line(w, t->tag, t->line, t->lineno, t->name, err, err_len) ? -1 : 1;
    return rc;
}
