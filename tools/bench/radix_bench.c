/*
 * kvtier-radix-bench: match+insert time per page and metadata bytes per cached page of the
 * prefix cache, on a tree of about a million pages built by replaying the Mooncake traces.
 *
 * Each request's tokens are synthesised from its 512-token block ids, so requests that share
 * leading ids share leading tokens, as in the trace. A request is handled as a serving engine
 * finishing it would: kvt_match, kvt_alloc for the pages not cached, kvt_insert. Only match
 * and insert are timed. The same replay runs twice, with and without per-page SHA256, so the
 * cost of hashing is the difference. Nothing is ever evicted: the pool holds the whole tree.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "cli.h"
#include "workload.h"

#define PROG "kvtier-radix-bench"
#define MAX_FILES 64
#define MAX_TRACE_BYTES (256u << 20) /* requests and blocks held, all files together */
/* Memory a page of the tree takes, a little above what it measures (with hashes), to judge
 * whether --pages fits the machine before building it. */
#define TREE_BYTES_PER_PAGE 160
#define TARGET_NS_PER_PAGE 1000.0
#define TARGET_BYTES_PER_PAGE 160.0

static const char *const default_traces[] = {"mooncake_conversation.jsonl",
                                             "mooncake_synthetic.jsonl"};

/* ---- traces ---- */

struct trace_set {
    const char *paths[MAX_FILES];
    size_t file_requests[MAX_FILES];
    size_t nfiles;
    struct workload w;
    size_t *order; /* replay order: round robin over the files */
};

static void die_oom(void)
{
    fprintf(stderr, "%s: out of memory\n", PROG);
    exit(1);
}

static size_t trace_bytes(const struct workload *w)
{
    return w->nreqs * sizeof(*w->reqs) + w->nsegs * sizeof(*w->segs);
}

/* Every request of a file, held for the replays; the blocks of all files together are
 * capped, so a trace with no end (a pipe fed forever) is an error, not a machine out of
 * memory. */
static int load_file(struct trace_set *ts, uint32_t file)
{
    size_t before = ts->w.nreqs;
    char err[512], clip[CLI_PATH_ECHO_MAX + 4];
    struct wl_trace *t;
    int rc;

    if (wl_trace_open(ts->paths[file], file, &t, err, sizeof(err)))
        goto fail;
    while ((rc = wl_trace_next(t, &ts->w, err, sizeof(err))) == 1 &&
           trace_bytes(&ts->w) <= MAX_TRACE_BYTES)
        ;
    wl_trace_close(t);
    if (rc < 0)
        goto fail;
    if (rc == 1) {
        fprintf(stderr,
                "%s: the traces take more than %u MiB in memory (%zu requests, the last of them "
                "from %s): give shorter traces\n",
                PROG, MAX_TRACE_BYTES >> 20, ts->w.nreqs,
                cli_clip(ts->paths[file], CLI_PATH_ECHO_MAX, clip));
        return -1;
    }
    if ((ts->file_requests[file] = ts->w.nreqs - before) == 0) {
        fprintf(stderr, "%s: %s: no requests\n", PROG,
                cli_clip(ts->paths[file], CLI_PATH_ECHO_MAX, clip));
        return -1;
    }
    return 0;
fail:
    fprintf(stderr, "%s: %s\n", PROG, err);
    return -1;
}

/* Interleave the files request by request, each in its own order, so that every trace
 * contributes to a tree that fills up before the first one runs out. */
static void build_order(struct trace_set *ts)
{
    size_t start[MAX_FILES], next[MAX_FILES], k = 0;

    ts->order = malloc(ts->w.nreqs * sizeof(*ts->order));
    if (!ts->order)
        die_oom();
    for (size_t f = 0, s = 0; f < ts->nfiles; s += ts->file_requests[f++]) {
        start[f] = s;
        next[f] = 0;
    }
    while (k < ts->w.nreqs)
        for (size_t f = 0; f < ts->nfiles; f++)
            if (next[f] < ts->file_requests[f])
                ts->order[k++] = start[f] + next[f]++;
}

static int load_traces(struct trace_set *ts)
{
    for (uint32_t f = 0; f < ts->nfiles; f++)
        if (load_file(ts, f))
            return -1;
    build_order(ts);
    return 0;
}

static bool readable(const char *path)
{
    return access(path, R_OK) == 0;
}

/* The default traces from the first directory that has any of them. */
static int find_default_traces(struct trace_set *ts)
{
    static char paths[4][2][4096];
    const char *dirs[4];
    size_t ndirs = 0;
    const char *env = getenv("KVT_TRACES_DIR");

    if (env && *env)
        dirs[ndirs++] = env;
    dirs[ndirs++] = "../shared/traces";
    dirs[ndirs++] = "shared/traces";
    dirs[ndirs++] = "/work/shared/traces";
    for (size_t d = 0; d < ndirs; d++) {
        for (size_t i = 0; i < 2; i++) {
            snprintf(paths[d][i], sizeof(paths[d][i]), "%s/%s", dirs[d], default_traces[i]);
            if (readable(paths[d][i]))
                ts->paths[ts->nfiles++] = paths[d][i];
        }
        if (ts->nfiles)
            return 0;
    }
    fprintf(stderr, "%s: no trace found: looked for %s and %s in", PROG, default_traces[0],
            default_traces[1]);
    for (size_t d = 0; d < ndirs; d++)
        fprintf(stderr, "%s %s", d ? "," : "", dirs[d]);
    fprintf(stderr, "; give --trace FILE or set KVT_TRACES_DIR\n");
    return -1;
}

/* ---- one replay ---- */

struct config {
    uint64_t target_pages;
    uint32_t page_size;
    bool json;
};

struct run {
    int hash_pages;
    uint64_t timed_ns;
    uint64_t requests, skipped, passes;
    uint64_t key_pages, matched_pages, inserted_pages;
    double wall_s;
    struct kvt_stats st;
};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int open_engine(const struct config *cfg, const struct trace_set *ts, int hash_pages,
                       kvt_engine **e)
{
    struct kvt_options o;
    uint32_t ps = cfg->page_size;
    uint64_t max_req_pages = ts->w.max_input / ps;

    kvt_options_init(&o, sizeof(o));
    /* The smallest geometry: the KV pool costs 2 bytes a token, the tree is what we weigh. */
    o.geometry = (struct kvt_geometry){
        .attention = KVT_ATTN_MHA, .layers = 1, .kv_heads = 1, .head_dim = 1, .dtype_bytes = 1};
    o.page_size = ps;
    o.backend = KVT_BACKEND_SIM;
    /* The replay stops once the tree holds the target, so one request more is the most it
     * can hold: nothing is ever evicted. */
    o.device_tokens = (cfg->target_pages + max_req_pages + 1) * ps;
    o.max_requests = 1;
    o.max_context = (ts->w.max_input + ps - 1) / ps * ps;
    o.hash_pages = (uint32_t)hash_pages;
    int rc = kvt_open(&o, e);
    if (rc)
        fprintf(stderr,
                "%s: kvt_open, for a tree of --pages %" PRIu64
                " of --page-size %u (a pool of %" PRIu64 " tokens, requests of up to %" PRIu64
                "): %s\n",
                PROG, cfg->target_pages, ps, o.device_tokens, (uint64_t)o.max_context,
                kvt_strerror(rc));
    return rc ? -1 : 0;
}

/* Buffers for one request, sized for the longest. */
struct scratch {
    uint32_t *tokens;
    int32_t *slots;
};

/* Match, allocate the pages not cached, insert: what a serving engine does per request. */
static int replay_one(kvt_engine *e, struct run *run, const struct kvt_key *key, uint32_t ps,
                      int32_t *slots)
{
    struct kvt_key whole = *key;
    struct kvt_match m;
    size_t prefix = 0;
    int rc;

    whole.len = key->len / ps * ps;
    uint64_t t0 = now_ns();
    rc = kvt_match(e, key, slots, &m);
    uint64_t t1 = now_ns();
    if (rc) {
        fprintf(stderr, "%s: kvt_match: %s\n", PROG, kvt_strerror(rc));
        return -1;
    }
    if (m.device_len < whole.len &&
        (rc = kvt_alloc(e, whole.len - m.device_len, slots + m.device_len))) {
        fprintf(stderr, "%s: kvt_alloc: %s\n", PROG, kvt_strerror(rc));
        return -1;
    }
    uint64_t t2 = now_ns();
    rc = kvt_insert(e, &whole, slots, 0, &prefix);
    uint64_t t3 = now_ns();
    if (rc) {
        fprintf(stderr, "%s: kvt_insert: %s\n", PROG, kvt_strerror(rc));
        return -1;
    }
    if (prefix != m.device_len) {
        fprintf(stderr, "%s: library fault: kvt_insert found %zu tokens cached, kvt_match %zu\n",
                PROG, prefix, m.device_len);
        return -1;
    }
    run->timed_ns += (t1 - t0) + (t3 - t2);
    run->requests++;
    run->key_pages += whole.len / ps;
    run->matched_pages += m.device_len / ps;
    run->inserted_pages += (whole.len - m.device_len) / ps;
    return 0;
}

/* Replay requests until the tree holds the target; each pass over the traces after the
 * first uses a fresh namespace, so the requests are new again and the tree keeps growing. */
static int replay(kvt_engine *e, const struct config *cfg, const struct trace_set *ts,
                  struct scratch *s, struct run *run)
{
    uint32_t ps = cfg->page_size;
    uint8_t ns[16];

    for (uint64_t pass = 0; run->inserted_pages < cfg->target_pages; pass++) {
        uint64_t before = run->inserted_pages;
        int ns_len = pass ? snprintf((char *)ns, sizeof(ns), "pass%" PRIu64, pass) : 0;
        run->passes = pass + 1;
        for (size_t i = 0; i < ts->w.nreqs && run->inserted_pages < cfg->target_pages; i++) {
            const struct wl_req *r = &ts->w.reqs[ts->order[i]];
            if (r->input_len < ps) {
                run->skipped++;
                continue;
            }
            wl_input_tokens(&ts->w, r, s->tokens);
            struct kvt_key key = {.tokens = s->tokens,
                                  .len = r->input_len,
                                  .ns = pass ? ns : NULL,
                                  .ns_len = (size_t)ns_len};
            if (replay_one(e, run, &key, ps, s->slots))
                return -1;
        }
        if (run->inserted_pages == before) {
            fprintf(stderr, "%s: a pass over the traces added no page (page_size %u)\n", PROG, ps);
            return -1;
        }
    }
    return 0;
}

static int run_bench(const struct config *cfg, const struct trace_set *ts, struct scratch *s,
                     int hash_pages, struct run *run)
{
    kvt_engine *e;
    uint64_t t0 = now_ns();
    int rc;

    memset(run, 0, sizeof(*run));
    run->hash_pages = hash_pages;
    if (open_engine(cfg, ts, hash_pages, &e))
        return -1;
    rc = replay(e, cfg, ts, s, run);
    run->st.size = sizeof(run->st);
    if (rc == 0 && (rc = kvt_stats(e, &run->st)))
        fprintf(stderr, "%s: kvt_stats: %s\n", PROG, kvt_strerror(rc));
    kvt_close(e);
    run->wall_s = (double)(now_ns() - t0) / 1e9;
    return rc ? -1 : 0;
}

/* ---- report ---- */

static double ns_per(const struct run *r, uint64_t pages)
{
    return pages ? (double)r->timed_ns / (double)pages : 0.0;
}

static double bytes_per_page(const struct run *r)
{
    uint64_t pages = r->st.cached_tokens / r->st.page_size;

    return pages ? (double)r->st.tree_bytes / (double)pages : 0.0;
}

static double pages_per_node(const struct run *r)
{
    return r->st.nodes ? (double)(r->st.cached_tokens / r->st.page_size) / (double)r->st.nodes
                       : 0.0;
}

static const char *verdict(double v, double target)
{
    return v <= target ? "PASS" : "MISS";
}

static const char *hash_word(const struct run *r)
{
    return r->hash_pages ? "hash=on " : "hash=off";
}

/* Both replays must build the same tree: hashing changes no structure. */
static int check_same(const struct run *a, const struct run *b)
{
    if (a->requests == b->requests && a->key_pages == b->key_pages &&
        a->matched_pages == b->matched_pages && a->inserted_pages == b->inserted_pages &&
        a->st.nodes == b->st.nodes && a->st.cached_tokens == b->st.cached_tokens)
        return 0;
    fprintf(stderr,
            "%s: library fault: hash=on and hash=off built different trees "
            "(nodes %" PRIu64 " vs %" PRIu64 ", cached tokens %" PRIu64 " vs %" PRIu64 ")\n",
            PROG, a->st.nodes, b->st.nodes, a->st.cached_tokens, b->st.cached_tokens);
    return -1;
}

static void print_text(const struct config *cfg, const struct trace_set *ts,
                       const struct run runs[2], double total_s)
{
    const struct run *on = &runs[0];
    uint64_t pages = on->st.cached_tokens / cfg->page_size;

    printf("%s: page_size %u, target %" PRIu64 " pages\n", PROG, cfg->page_size, cfg->target_pages);
    for (size_t f = 0; f < ts->nfiles; f++)
        printf("%-13s %s (%zu request%s)\n", f ? "" : "traces", ts->paths[f], ts->file_requests[f],
               ts->file_requests[f] == 1 ? "" : "s");
    printf("replayed      %" PRIu64 " requests in %" PRIu64 " pass%s (%" PRIu64
           " shorter than a page skipped)\n",
           on->requests, on->passes, on->passes == 1 ? "" : "es", on->skipped);
    printf("key pages     %" PRIu64 ": %" PRIu64 " matched (%.1f%%), %" PRIu64 " inserted\n",
           on->key_pages, on->matched_pages,
           on->key_pages ? 100.0 * (double)on->matched_pages / (double)on->key_pages : 0.0,
           on->inserted_pages);
    printf("tree          %" PRIu64 " pages, %" PRIu64 " nodes, %.1f pages/node\n\n", pages,
           on->st.nodes, pages_per_node(on));
    for (int i = 0; i < 2; i++) {
        double v = ns_per(&runs[i], runs[i].key_pages);
        printf("match+insert  %s %8.1f ns/page   (target <= %.0f)  %s\n", hash_word(&runs[i]), v,
               TARGET_NS_PER_PAGE, verdict(v, TARGET_NS_PER_PAGE));
    }
    for (int i = 0; i < 2; i++)
        printf("per new page  %s %8.1f ns/inserted page\n", hash_word(&runs[i]),
               ns_per(&runs[i], runs[i].inserted_pages));
    printf("hashing       %+17.1f ns/inserted page (hash=on minus hash=off)\n",
           ns_per(&runs[0], on->inserted_pages) - ns_per(&runs[1], runs[1].inserted_pages));
    for (int i = 0; i < 2; i++) {
        double v = bytes_per_page(&runs[i]);
        printf("metadata      %s %8.1f B/page    (target <= %.0f)  %s   (%" PRIu64 " tree bytes)\n",
               hash_word(&runs[i]), v, TARGET_BYTES_PER_PAGE, verdict(v, TARGET_BYTES_PER_PAGE),
               runs[i].st.tree_bytes);
    }
    printf("seconds       timed %.3f (hash=on) %.3f (hash=off); runs %.2f + %.2f; total %.2f\n",
           (double)runs[0].timed_ns / 1e9, (double)runs[1].timed_ns / 1e9, runs[0].wall_s,
           runs[1].wall_s, total_s);
}

static void json_run(const struct run *r)
{
    double ns = ns_per(r, r->key_pages), b = bytes_per_page(r);

    printf("{\"hash_pages\":%d,\"timed_s\":%.6f,\"wall_s\":%.3f,\"ns_per_page\":%.2f,"
           "\"ns_per_inserted_page\":%.2f,\"tree_bytes\":%" PRIu64 ",\"cached_pages\":%" PRIu64
           ",\"nodes\":%" PRIu64 ",\"pages_per_node\":%.2f,\"bytes_per_page\":%.2f,"
           "\"time_pass\":%s,\"memory_pass\":%s}",
           r->hash_pages, (double)r->timed_ns / 1e9, r->wall_s, ns, ns_per(r, r->inserted_pages),
           r->st.tree_bytes, r->st.cached_tokens / r->st.page_size, r->st.nodes, pages_per_node(r),
           b, ns <= TARGET_NS_PER_PAGE ? "true" : "false",
           b <= TARGET_BYTES_PER_PAGE ? "true" : "false");
}

static void print_json(const struct config *cfg, const struct trace_set *ts,
                       const struct run runs[2], double total_s)
{
    const struct run *on = &runs[0];

    printf("{\"page_size\":%u,\"target_pages\":%" PRIu64 ",\"traces\":[", cfg->page_size,
           cfg->target_pages);
    for (size_t f = 0; f < ts->nfiles; f++) {
        printf("%s{\"path\":", f ? "," : "");
        cli_json_string(ts->paths[f]);
        printf(",\"requests\":%zu}", ts->file_requests[f]);
    }
    printf("],\"requests\":%" PRIu64 ",\"passes\":%" PRIu64 ",\"skipped\":%" PRIu64
           ",\"key_pages\":%" PRIu64 ",\"matched_pages\":%" PRIu64 ",\"inserted_pages\":%" PRIu64
           ",\"targets\":{\"ns_per_page\":%.0f,\"bytes_per_page\":%.0f},\"runs\":[",
           on->requests, on->passes, on->skipped, on->key_pages, on->matched_pages,
           on->inserted_pages, TARGET_NS_PER_PAGE, TARGET_BYTES_PER_PAGE);
    json_run(&runs[0]);
    putchar(',');
    json_run(&runs[1]);
    printf("],\"hash_ns_per_inserted_page\":%.2f,\"seconds\":%.3f}\n",
           ns_per(&runs[0], runs[0].inserted_pages) - ns_per(&runs[1], runs[1].inserted_pages),
           total_s);
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [--trace FILE]... [--pages N] [--page-size N] [--json] [--help]\n"
            "\n"
            "Replay Mooncake request traces (JSON lines with input_length and hash_ids) into\n"
            "the kvtier prefix cache until it holds about N pages, timing kvt_match plus\n"
            "kvt_insert per request (not the slot allocation or token synthesis). The replay\n"
            "runs three times: once to warm up the heap (not reported), then with per-page\n"
            "SHA256 (hash_pages 1) and without (0). It prints ns per key page, ns per inserted\n"
            "page, the hashing cost and the tree's metadata bytes per cached page, against\n"
            "targets of %.0f ns/page and %.0f B/page. Requests shorter than a page are skipped.\n"
            "Files are replayed round robin, request by request; once all are used up they are\n"
            "replayed again in a new namespace. Nothing is evicted. A MISS is a figure, not an\n"
            "error: the exit status is 0.\n"
            "\n"
            "  --trace FILE     a trace file (repeatable); default %s and\n"
            "                   %s from $KVT_TRACES_DIR, ../shared/traces,\n"
            "                   shared/traces or /work/shared/traces, the first that has any.\n"
            "                   The traces are held in memory: at most %u MiB of requests,\n"
            "                   lines of at most 16 MiB\n"
            "  --pages N        tree size to reach, in pages (default 1000000), below 2^30\n"
            "                   tokens; refused when the tree and its pool (about %d bytes a\n"
            "                   page, and 2 a token) could not fit in this machine's RAM\n"
            "  --page-size N    tokens per page, a power of two up to 256 (default 16)\n"
            "  --json           print one JSON object instead of text\n"
            "  --help           print this and exit\n"
            "\n"
            "Exit status: 0 on success, 1 on error, 2 on bad usage.\n",
            PROG, TARGET_NS_PER_PAGE, TARGET_BYTES_PER_PAGE, default_traces[0], default_traces[1],
            MAX_TRACE_BYTES >> 20, TREE_BYTES_PER_PAGE);
}

/* 0 to go on, else the exit status. */
static int parse_args(int argc, char **argv, struct config *cfg, struct trace_set *ts)
{
    uint64_t v;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        } else if (strcmp(a, "--json") == 0) {
            cfg->json = true;
        } else if (strcmp(a, "--trace") == 0) {
            if (!val)
                return cli_bad_usage(PROG, "--trace needs a file", NULL);
            if (ts->nfiles == MAX_FILES)
                return cli_bad_usage(PROG, "too many --trace files", val);
            ts->paths[ts->nfiles++] = val;
            i++;
        } else if (strcmp(a, "--pages") == 0) {
            if (!cli_parse_u64(val, &v) || v == 0 || v > (uint64_t)INT32_MAX / 2)
                return cli_bad_usage(PROG, "--pages needs a count from 1 to 2^30", val);
            cfg->target_pages = v;
            i++;
        } else if (strcmp(a, "--page-size") == 0) {
            if (!cli_parse_u64(val, &v) || v == 0 || v > 256 || (v & (v - 1)))
                return cli_bad_usage(PROG, "--page-size needs a power of two from 1 to 256", val);
            cfg->page_size = (uint32_t)v;
            i++;
        } else {
            return cli_bad_usage(PROG, "unknown argument", a);
        }
    }
    return 0;
}

/* Replay with and without hashing and print the figures; 0 or -1. */
static int bench(const struct config *cfg, const struct trace_set *ts, uint64_t t0)
{
    struct scratch s;
    struct run runs[2];
    int rc;

    s.tokens = malloc((size_t)ts->w.max_input * sizeof(*s.tokens));
    s.slots = malloc((size_t)ts->w.max_input * sizeof(*s.slots));
    if (!s.tokens || !s.slots)
        die_oom();
    /* A first, discarded replay pays the page faults of growing the heap, which would
     * otherwise land on whichever run goes first and skew the hashing cost. */
    rc = run_bench(cfg, ts, &s, 1, &runs[0]) || run_bench(cfg, ts, &s, 1, &runs[0]) ||
         run_bench(cfg, ts, &s, 0, &runs[1]) || check_same(&runs[0], &runs[1]);
    if (rc == 0) {
        double total_s = (double)(now_ns() - t0) / 1e9;
        if (cfg->json)
            print_json(cfg, ts, runs, total_s);
        else
            print_text(cfg, ts, runs, total_s);
    }
    free(s.tokens);
    free(s.slots);
    return rc ? -1 : 0;
}

/* The tree and its pool (2 bytes a token) live in memory while a replay builds them: a
 * --pages this machine cannot hold is refused before it is tried. */
static int check_memory(const struct config *cfg)
{
    uint64_t need = cfg->target_pages * (TREE_BYTES_PER_PAGE + 2ull * cfg->page_size), ram;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    char a[32], b[32], msg[160];

    if (pages <= 0 || page <= 0 || need <= (ram = (uint64_t)pages * (uint64_t)page))
        return 0;
    snprintf(msg, sizeof(msg),
             "--pages: a tree of %" PRIu64 " pages and its pool take about %s, more than this "
             "machine's %s",
             cfg->target_pages, cli_size(need, a), cli_size(ram, b));
    return cli_bad_usage(PROG, msg, NULL);
}

int main(int argc, char **argv)
{
    struct config cfg = {.target_pages = 1000000, .page_size = 16};
    struct trace_set ts = {0};
    uint64_t t0 = now_ns();
    int rc = parse_args(argc, argv, &cfg, &ts);

    if (rc)
        return rc < 0 ? 0 : rc;
    /* The pool is sized (target + longest request) pages; keep slots below 2^31. */
    if ((cfg.target_pages + 1) * cfg.page_size >= (uint64_t)INT32_MAX / 2)
        return cli_bad_usage(PROG, "--pages times --page-size must stay below 2^30 tokens", NULL);
    if ((rc = check_memory(&cfg)))
        return rc;
    if (ts.nfiles == 0 && find_default_traces(&ts))
        return 1;
    rc = load_traces(&ts) || bench(&cfg, &ts, t0);
    free(ts.order);
    wl_free(&ts.w);
    return rc ? 1 : 0;
}
