#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *cli_clip(const char *s, size_t max, char *buf)
{
    size_t n = max;

    if (!s || strnlen(s, max + 1) <= max)
        return s;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--; /* s[n] continues a character: cut before the character */
    memcpy(buf, s, n);
    strcpy(buf + n, "...");
    return buf;
}

int cli_bad_usage(const char *prog, const char *msg, const char *arg)
{
    char clip[CLI_ECHO_MAX + 4];

    arg = cli_clip(arg, CLI_ECHO_MAX, clip);
    fprintf(stderr, "%s: %s%s%s\n", prog, msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "try '%s --help'\n", prog);
    return 2;
}

bool cli_parse_u64(const char *s, uint64_t *out)
{
    char *end;

    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

bool cli_parse_size(const char *s, uint64_t *out)
{
    static const char units[] = "KMGT";
    const char *u;
    char digits[32];
    size_t len = s ? strlen(s) : 0;
    uint64_t v;

    if (len == 0 || len >= sizeof(digits))
        return false;
    u = strchr(units, s[len - 1]);
    if (!u)
        return cli_parse_u64(s, out);
    memcpy(digits, s, len - 1);
    digits[len - 1] = '\0';
    if (!cli_parse_u64(digits, &v))
        return false;
    for (const char *p = units; p <= u; p++) {
        if (v > UINT64_MAX / 1024)
            return false;
        v *= 1024;
    }
    *out = v;
    return true;
}

void cli_json_string(const char *s)
{
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

bool cli_parse_name(const char *s, const char *const *names, size_t n, uint32_t *out)
{
    for (size_t i = 0; s && i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (uint32_t)i;
            return true;
        }
    }
    return false;
}

int cli_parse_named(const char *prog, const char *opt, const char *val, const char *const *names,
                    size_t n, uint32_t *out)
{
    char msg[128];
    size_t len = 0;

    if (cli_parse_name(val, names, n, out))
        return 0;
    len += (size_t)snprintf(msg, sizeof(msg), "%s needs", opt);
    for (size_t i = 0; i < n && len < sizeof(msg); i++)
        len += (size_t)snprintf(msg + len, sizeof(msg) - len, "%s %s",
                                i ? (i + 1 < n ? "," : " or") : "", names[i]);
    return cli_bad_usage(prog, msg, val);
}

/* ---- geometry ---- */

#define MHA(l, h, d)                                                                               \
    {                                                                                              \
        .attention = KVT_ATTN_MHA, .layers = l, .kv_heads = h, .head_dim = d, .dtype_bytes = 2     \
    }

static const struct cli_preset presets[] = {
    {"tiny", MHA(2, 1, 16), 1, "2 layers, 1 KV head of 16, 16-bit", {{0}, 0, 0}},
    {"llama3-8b", MHA(32, 8, 128), 1, "32 layers, 8 KV heads of 128, bf16", {{0}, 0, 0}},
    {"llama3-70b",
     MHA(80, 1, 128),
     8,
     "one rank of TP 8: 80 layers, 1 of 8 KV heads of 128, bf16",
     {{0}, 0, 0}},
    {"qwen3-235b-a22b", MHA(94, 4, 128), 1, "94 layers, 4 KV heads of 128, bf16", {{0}, 0, 0}},
    {"deepseek-v3",
     {.attention = KVT_ATTN_MLA,
      .layers = 61,
      .kv_lora_rank = 512,
      .qk_rope_head_dim = 64,
      .dtype_bytes = 2},
     1,
     "MLA: 61 layers, latent 512 + rope 64, bf16",
     {{0}, 0, 0}},
    /* Qwen3-Next-80B-A3B (config.json on Hugging Face): 48 layers, every 4th full attention
     * (full_attention_interval 4) with 2 KV heads of 256, the other 36 Gated DeltaNet with
     * 16 key heads and 32 value heads of 128 and a conv kernel of 4. One rank of TP 4: the 2
     * KV heads replicated to 1 per rank; conv channels (2 x 16 x 128 + 32 x 128) / 4 = 2048
     * x (kernel - 1) x bf16 = 12 KiB; the recurrent state 32 / 4 = 8 value heads x 128 x 128
     * x fp32 (SGLang keeps it in fp32) = 512 KiB per layer. */
    {"qwen3-next-80b-a3b",
     MHA(12, 1, 256),
     4,
     "one rank of TP 4: 12 attention layers, 1 KV head of 256, bf16; 36 GDN layers, 12 KiB conv "
     "+ 512 KiB state",
     {{.layers = 36, .conv_bytes = 12288, .ssm_bytes = 524288, .chunk = 64, .track_interval = 256},
      0,
      0}},
    /* GPT-OSS-120B (config.json): 36 layers alternating sliding (window 128) and full
     * attention, starting with sliding, 8 KV heads of 64, bf16 KV; one GPU. */
    {"gpt-oss-120b",
     MHA(36, 8, 64),
     1,
     "36 layers of 8 KV heads of 64, bf16; every 2nd full attention, the rest a 128-token window",
     {{0}, 128, 2}},
    /* Gemma-3-27B (config.json): 62 layers, 16 KV heads of 128, sliding window 1024 with
     * sliding_window_pattern 6 (every 6th layer global), bf16 KV; one GPU. */
    {"gemma-3-27b",
     MHA(62, 16, 128),
     1,
     "62 layers of 16 KV heads of 128, bf16; every 6th full attention, the rest a 1024-token "
     "window",
     {{0}, 1024, 6}},
};
#define NPRESETS (sizeof(presets) / sizeof(presets[0]))

const struct cli_preset *cli_preset_find(const char *name)
{
    for (size_t i = 0; name && i < NPRESETS; i++)
        if (strcmp(name, presets[i].name) == 0)
            return &presets[i];
    return NULL;
}

void cli_print_presets(FILE *f, const char *indent)
{
    for (size_t i = 0; i < NPRESETS; i++)
        fprintf(f, "%s%-16s %s\n", indent, presets[i].name, presets[i].about);
}

/* A hybrid model's key=value of --geometry (into h, when the tool takes them): true when kv
 * is one (*ok says whether its value was good), false when it is none of them. */
static bool hybrid_pair(const char *kv, struct cli_hybrid *h, bool *ok)
{
    static const char *const keys[] = {"mamba_layers", "conv_bytes", "ssm_bytes", "swa_window",
                                       "full_every"};
    const char *eq = strchr(kv, '=');
    uint64_t v;

    for (size_t i = 0; eq && h && i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strlen(keys[i]) != (size_t)(eq - kv) || strncmp(kv, keys[i], (size_t)(eq - kv)))
            continue;
        bool bytes = i == 1 || i == 2;
        *ok = cli_parse_u64(eq + 1, &v) && v <= (bytes ? UINT32_MAX * 4096ull : UINT32_MAX);
        if (!*ok)
            return true;
        if (bytes)
            *(i == 1 ? &h->mamba.conv_bytes : &h->mamba.ssm_bytes) = v;
        else
            *(i == 0 ? &h->mamba.layers : i == 3 ? &h->swa_window : &h->full_every) = (uint32_t)v;
        return true;
    }
    return false;
}

/* One key=value of --geometry; false for an unknown key or a bad value. */
static bool geometry_pair(const char *kv, struct kvt_geometry *g, uint32_t *tp_size)
{
    static const char *const keys[] = {"layers",      "kv_heads",     "head_dim",
                                       "v_head_dim",  "kv_lora_rank", "qk_rope_head_dim",
                                       "dtype_bytes", "tp_size"};
    static const char *const kinds[] = {"mha", "mla"};
    uint32_t *fields[] = {&g->layers,       &g->kv_heads,         &g->head_dim,    &g->v_head_dim,
                          &g->kv_lora_rank, &g->qk_rope_head_dim, &g->dtype_bytes, tp_size};
    const char *eq = strchr(kv, '=');
    uint64_t v;

    if (!eq)
        return false;
    size_t klen = (size_t)(eq - kv);
    if (klen == 9 && strncmp(kv, "attention", 9) == 0)
        return cli_parse_name(eq + 1, kinds, 2, &g->attention);
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strlen(keys[i]) == klen && strncmp(kv, keys[i], klen) == 0) {
            if (!cli_parse_u64(eq + 1, &v) || v > UINT32_MAX)
                return false;
            *fields[i] = (uint32_t)v;
            return true;
        }
    }
    return false;
}

int cli_parse_model(const char *prog, const char *arg, struct kvt_geometry *g, uint32_t *tp_size,
                    struct cli_hybrid *h)
{
    static const struct kvt_mamba no_mamba = {.chunk = 64, .track_interval = 256};
    char buf[256];
    char *save = NULL, *tok;
    bool ok = true;

    if (strlen(arg) >= sizeof(buf))
        return cli_bad_usage(prog, "--geometry is too long", NULL);
    strcpy(buf, arg);
    *g = (struct kvt_geometry){0};
    *tp_size = 1;
    if (h)
        *h = (struct cli_hybrid){.mamba = no_mamba};
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const struct cli_preset *p = tok == buf ? cli_preset_find(tok) : NULL;

        if (p) {
            *g = p->g;
            *tp_size = p->tp_size;
            if (h) {
                *h = p->hybrid;
                if (!h->mamba.layers)
                    h->mamba = no_mamba;
            }
        } else if (hybrid_pair(tok, h, &ok)) {
            if (!ok)
                return cli_bad_usage(prog, "--geometry: a bad value", tok);
        } else if (!geometry_pair(tok, g, tp_size)) {
            return cli_bad_usage(prog, "--geometry: not a preset or a known key=value", tok);
        }
    }
    if (kvt_cell_bytes(g) == 0 || *tp_size == 0 ||
        (h && h->mamba.layers && (!h->mamba.conv_bytes || !h->mamba.ssm_bytes)) ||
        (h && h->swa_window && (h->full_every < 2 || h->full_every > g->layers)))
        return cli_bad_usage(prog, "--geometry does not describe a valid model (see --help)", arg);
    if (h && !h->mamba.layers)
        h->mamba = no_mamba;
    return 0;
}

int cli_parse_geometry(const char *prog, const char *arg, struct kvt_geometry *g, uint32_t *tp_size)
{
    return cli_parse_model(prog, arg, g, tp_size, NULL);
}

/* ---- the option table ---- */

int cli_parse_count(const char *prog, const char *opt, const char *val, uint64_t lo, uint64_t hi,
                    bool size, uint64_t *out)
{
    char msg[128];
    bool ok = size ? cli_parse_size(val, out) : cli_parse_u64(val, out);

    if (ok && *out >= lo && *out <= hi)
        return 0;
    snprintf(msg, sizeof(msg), "%s needs a whole number from %" PRIu64 " to %" PRIu64, opt, lo, hi);
    return cli_bad_usage(prog, msg, val);
}

/* A comma separated list of up to CLI_MAX_LIST counts within [lo, hi]; no empty items. */
static int parse_list(const char *prog, const char *opt, const char *val, uint64_t lo, uint64_t hi,
                      bool size, struct cli_list *out)
{
    char item[64];
    int rc;

    for (out->n = 0;; val++) {
        size_t len = strcspn(val, ",");

        if (out->n == CLI_MAX_LIST)
            return cli_bad_usage(prog, "too many values (" CLI_STR(CLI_MAX_LIST) " at most)", opt);
        if (len == 0 || len >= sizeof(item))
            return cli_bad_usage(prog, "a list item is empty or too long", opt);
        memcpy(item, val, len);
        item[len] = '\0';
        if ((rc = cli_parse_count(prog, opt, item, lo, hi, size, &out->v[out->n++])))
            return rc;
        val += len;
        if (!*val)
            return 0;
    }
}

static int parse_value(const char *prog, const struct cli_option *o, void *cfg, const char *val)
{
    void *field = (char *)cfg + o->offset;

    switch (o->kind) {
    case CLI_COUNT:
    case CLI_SIZE:
        return cli_parse_count(prog, o->name, val, o->lo, o->hi, o->kind == CLI_SIZE, field);
    case CLI_COUNTS:
    case CLI_SIZES:
        return parse_list(prog, o->name, val, o->lo, o->hi, o->kind == CLI_SIZES, field);
    case CLI_NAME:
        return cli_parse_named(prog, o->name, val, o->names, o->nnames, field);
    case CLI_STRING:
        if (strlen(val) < o->lo)
            return cli_bad_usage(prog, "needs a non-empty value", o->name);
        *(const char **)field = val;
        return 0;
    case CLI_CUSTOM:
        return o->parse(field, o->name, val);
    default:
        abort(); /* the kinds without a value never get here */
    }
}

static const struct cli_option *find_option(const struct cli_option *opts, size_t n,
                                            const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (opts[i].name && opts[i].kind != CLI_HELP && !strcmp(opts[i].name, name))
            return &opts[i];
    return NULL;
}

int cli_parse_args(const char *prog, const struct cli_option *opts, size_t n, void *cfg, int argc,
                   char **argv, void (*usage)(FILE *f))
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const struct cli_option *o;
        int rc;

        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return -1;
        }
        if (!(o = find_option(opts, n, a)))
            return cli_bad_usage(prog, "unknown option", a);
        if (o->kind == CLI_FLAG) {
            *(bool *)((char *)cfg + o->offset) = true;
            continue;
        }
        if (i + 1 >= argc)
            return cli_bad_usage(prog, "option needs a value", a);
        if ((rc = parse_value(prog, o, cfg, argv[++i])))
            return rc;
    }
    return 0;
}

/* One option's lines: the first beside its name, the others under it. */
static void print_option(FILE *f, const struct cli_option *o, int width)
{
    char label[64];
    const char *line = o->help;

    snprintf(label, sizeof(label), "%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    for (int first = 1; *line; first = 0) {
        int len = (int)strcspn(line, "\n");

        if (first)
            fprintf(f, "  %-*s %.*s\n", width - 3, label, len, line);
        else
            fprintf(f, "%*s%.*s\n", width, "", len, line);
        line += len + (line[len] == '\n');
    }
}

void cli_print_options(FILE *f, const struct cli_option *opts, size_t n, int width)
{
    for (size_t i = 0; i < n; i++) {
        if (opts[i].kind == CLI_TEXT)
            fputs(opts[i].help, f);
        else if (opts[i].help)
            print_option(f, &opts[i], width);
        if (opts[i].more)
            opts[i].more(f);
    }
}

/* ---- for the benchmarks ---- */

double cli_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

struct cli_timing cli_summarize(double *t, size_t n)
{
    qsort(t, n, sizeof(*t), cmp_double);
    return (struct cli_timing){.median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2,
                               .best = t[0],
                               .worst = t[n - 1]};
}

double cli_gbps(uint64_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / seconds / 1e9 : 0.0;
}

double cli_ratio(double a, double b)
{
    return b > 0 ? a / b : 0.0;
}

const char *cli_met(bool ok)
{
    return ok ? "met" : "MISSED";
}

const char *cli_size(uint64_t n, char *buf)
{
    if (n >= (1ull << 30))
        snprintf(buf, 32, "%.2f GiB", (double)n / (1ull << 30));
    else if (n >= (1ull << 20))
        snprintf(buf, 32, "%.1f MiB", (double)n / (1ull << 20));
    else
        snprintf(buf, 32, "%.1f KiB", (double)n / 1024);
    return buf;
}

void cli_print_size(uint64_t n)
{
    char buf[32];

    fputs(cli_size(n, buf), stdout);
}

/* ---- progress ---- */

void cli_progress_start(struct cli_progress *p)
{
    p->tty = isatty(STDERR_FILENO);
    p->t0 = p->shown = cli_now();
}

bool cli_progress_due(struct cli_progress *p)
{
    double now;

    if (!p->tty || (now = cli_now()) - p->shown < CLI_PROGRESS_MS / 1000.0)
        return false;
    p->shown = now;
    return true;
}

void cli_progress_line(const char *fmt, ...)
{
    va_list ap;

    fputs("\r\033[K", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

double cli_progress_seconds(const struct cli_progress *p)
{
    return cli_now() - p->t0;
}

void cli_progress_end(const struct cli_progress *p)
{
    if (p->tty)
        fputs("\r\033[K", stderr);
}
