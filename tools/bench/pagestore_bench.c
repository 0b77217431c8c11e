/*
 * kvtier-pagestore-bench: pages/s and GB/s of the public page store (kvtier_store.h) as a
 * serving engine's L3 backend uses it: batches of pages of one or more segments, set and then
 * got back, one call per batch, on one thread. It is the C baseline the Python bench
 * (python/bench_pagestore.py) runs in the same session: the same workload through the Python
 * package must come within 10% of it.
 *
 * Each rep opens a fresh dir, sets --pages pages in batches of --batch (new keys: no page is
 * stored already), closes and reopens the dir (the gets go to the files, as after a restart;
 * the kernel's page cache may still hold them), then gets them back in the same batches. The
 * last batch read is checked against what was set, outside the timed part.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "datadir.h"
#include "kvtier_store.h"
#include "rng.h"

#define PROG "kvtier-pagestore-bench"
#define DEFAULT_PAGE_BYTES 65536
#define DEFAULT_SEGMENTS 2
#define DEFAULT_BATCH 128
#define DEFAULT_PAGES 2048
#define DEFAULT_REPS 3
#define MAX_SEGMENTS 256

struct config {
    const char *dir;
    uint64_t page_bytes, segments, batch, pages, reps;
    bool json, help;
};

static const struct cli_option options[] = {
    {"--dir", CLI_STRING, offsetof(struct config, dir), 1, 0, .arg = "DIR",
     .help = "where to make the data dirs (default /dev/shm, else /tmp); each rep's dir is\n"
             "removed after it"},
    {"--page-bytes", CLI_SIZE, offsetof(struct config, page_bytes), 1, 1u << 30, .arg = "SIZE",
     .help = "bytes of one page (default " CLI_STR(DEFAULT_PAGE_BYTES) ")"},
    {"--segments", CLI_COUNT, offsetof(struct config, segments), 1, MAX_SEGMENTS, .arg = "N",
     .help = "segments per page, as SGLang's MHA page_first has 2 (default " CLI_STR(
         DEFAULT_SEGMENTS) ")"},
    {"--batch", CLI_COUNT, offsetof(struct config, batch), 1, 4096, .arg = "N",
     .help = "pages per call (default " CLI_STR(DEFAULT_BATCH) ", SGLang's most)"},
    {"--pages", CLI_COUNT, offsetof(struct config, pages), 1, 1u << 24, .arg = "N",
     .help = "pages set and got per rep (default " CLI_STR(DEFAULT_PAGES) ")"},
    {"--reps", CLI_COUNT, offsetof(struct config, reps), 1, 100, .arg = "N",
     .help = "repetitions; medians are reported (default " CLI_STR(DEFAULT_REPS) ")"},
    {"--json", CLI_FLAG, offsetof(struct config, json), .help = "one JSON object on stdout"},
    {"--help", CLI_HELP, 0, .help = "this text"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n\n"
            "Set and get pages through kvtier's public page store, one thread, a call per\n"
            "batch; print pages/s and GB/s of each (the baseline of the Python bench).\n\n",
            PROG);
    cli_print_options(f, options, CLI_COUNT_OF(options), 22);
}

static void fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, kvt_strerror(rc));
    exit(1);
}

struct run {
    const struct config *c;
    uint8_t *mem;  /* pages * page_bytes: what is set */
    uint8_t *back; /* batch * page_bytes: where gets land */
    uint8_t (*keys)[KVT_PAGESTORE_KEY_BYTES];
    struct kvt_segment *segs; /* batch * segments */
    struct kvt_page *pp;      /* batch */
    int *res;
};

/* Batch b's descriptors over base (page i of the batch at base + i * page_bytes). */
static void describe(struct run *r, size_t first, size_t n, uint8_t *base)
{
    uint64_t seg = r->c->page_bytes / r->c->segments;

    for (size_t i = 0; i < n; i++) {
        struct kvt_segment *s = &r->segs[i * r->c->segments];
        for (uint64_t k = 0; k < r->c->segments; k++) {
            uint64_t len = k + 1 < r->c->segments ? seg : r->c->page_bytes - k * seg;
            s[k] = (struct kvt_segment){base + i * r->c->page_bytes + k * seg, len};
        }
        r->pp[i] = (struct kvt_page){r->keys[first + i], first + i ? r->keys[first + i - 1] : NULL,
                                     s, (uint32_t)r->c->segments};
    }
}

static kvt_pagestore *open_dir(const struct config *c, const char *dir)
{
    struct kvt_pagestore_options o;
    kvt_pagestore *s = NULL;
    int rc;

    kvt_pagestore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.fingerprint = PROG;
    o.fingerprint_len = strlen(PROG);
    o.page_bytes = c->page_bytes;
    o.capacity_bytes = (c->pages + c->batch) * (c->page_bytes + (64u << 10));
    if ((rc = kvt_pagestore_open(&o, &s))) {
        char clip[CLI_PATH_ECHO_MAX + 4], entry[2 * CLI_PATH_ECHO_MAX + 128];
        const char *shown = cli_clip(dir, CLI_PATH_ECHO_MAX, clip);

        if (rc > -4096 && cli_dir_problem(dir, shown, entry, sizeof(entry)))
            fail(entry, rc);
        fail(shown, rc);
    }
    return s;
}

/* One pass over every batch: set (or get); its seconds. */
static double pass(struct run *r, kvt_pagestore *s, bool set)
{
    const struct config *c = r->c;
    double t = cli_now();

    for (size_t at = 0; at < c->pages; at += c->batch) {
        size_t n = c->pages - at < c->batch ? c->pages - at : c->batch;
        describe(r, at, n, set ? r->mem + at * c->page_bytes : r->back);
        int rc =
            set ? kvt_pagestore_set(s, r->pp, n, r->res) : kvt_pagestore_get(s, r->pp, n, r->res);
        if (rc)
            fail(set ? "set" : "get", rc);
        for (size_t i = 0; i < n; i++)
            if (r->res[i])
                fail(set ? "a page's set" : "a page's get", r->res[i]);
    }
    return cli_now() - t;
}

/* Every page got back is the page set (the last batch's pages are in back). */
static void check_last_batch(struct run *r)
{
    const struct config *c = r->c;
    size_t first = (c->pages - 1) / c->batch * c->batch;

    if (memcmp(r->back, r->mem + first * c->page_bytes, (c->pages - first) * c->page_bytes)) {
        fprintf(stderr, "%s: a page read back differs from the page stored\n", PROG);
        exit(1);
    }
}

static void rep(struct run *r, const char *base, uint64_t n, double *set_s, double *get_s)
{
    char dir[512];
    kvt_pagestore *s;

    snprintf(dir, sizeof(dir), "%s/kvt-pagestore-bench-%d-%" PRIu64, base, (int)getpid(), n);
    for (size_t i = 0; i < r->c->pages; i++) {
        uint64_t k[4] = {n, i, 0x6b7674, 1};
        memcpy(r->keys[i], k, sizeof(k));
    }
    s = open_dir(r->c, dir);
    *set_s = pass(r, s, true);
    kvt_pagestore_close(s);
    s = open_dir(r->c, dir);
    *get_s = pass(r, s, false);
    check_last_batch(r);
    kvt_pagestore_clear(s);
    kvt_pagestore_close(s);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "%s: could not remove %s\n", PROG, dir);
}

static void report(const struct config *c, struct cli_timing set, struct cli_timing get)
{
    uint64_t bytes = c->pages * c->page_bytes;
    double set_pps = c->pages / set.median, get_pps = c->pages / get.median;

    if (c->json) {
        printf("{\"page_bytes\": %" PRIu64 ", \"segments\": %" PRIu64 ", \"batch\": %" PRIu64
               ", \"pages\": %" PRIu64 ", \"reps\": %" PRIu64 ", \"set\": {\"pages_per_s\": %.1f,"
               " \"gbps\": %.4f, \"median_s\": %.6f}, \"get\": {\"pages_per_s\": %.1f, \"gbps\":"
               " %.4f, \"median_s\": %.6f}}\n",
               c->page_bytes, c->segments, c->batch, c->pages, c->reps, set_pps,
               cli_gbps(bytes, set.median), set.median, get_pps, cli_gbps(bytes, get.median),
               get.median);
        return;
    }
    printf("%" PRIu64 " pages of %" PRIu64 " bytes in %" PRIu64 " segments, %" PRIu64
           " per call, median of %" PRIu64 ":\n",
           c->pages, c->page_bytes, c->segments, c->batch, c->reps);
    printf("  set  %10.0f pages/s  %7.3f GB/s\n", set_pps, cli_gbps(bytes, set.median));
    printf("  get  %10.0f pages/s  %7.3f GB/s\n", get_pps, cli_gbps(bytes, get.median));
}

int main(int argc, char **argv)
{
    struct config c = {.page_bytes = DEFAULT_PAGE_BYTES,
                       .segments = DEFAULT_SEGMENTS,
                       .batch = DEFAULT_BATCH,
                       .pages = DEFAULT_PAGES,
                       .reps = DEFAULT_REPS};
    int rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), &c, argc, argv, usage);
    double set_t[100], get_t[100];

    if (rc)
        return rc < 0 ? 0 : rc;
    if (c.segments > c.page_bytes)
        return cli_bad_usage(PROG, "--segments is more than the page's bytes", "");
    const char *base = c.dir ? c.dir : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    struct run r = {.c = &c,
                    .mem = malloc(c.pages * c.page_bytes),
                    .back = malloc(c.batch * c.page_bytes),
                    .keys = malloc(c.pages * KVT_PAGESTORE_KEY_BYTES),
                    .segs = malloc(c.batch * c.segments * sizeof(struct kvt_segment)),
                    .pp = malloc(c.batch * sizeof(struct kvt_page)),
                    .res = malloc(c.batch * sizeof(int))};
    if (!r.mem || !r.back || !r.keys || !r.segs || !r.pp || !r.res)
        fail("memory for the pages", -ENOMEM);
    uint64_t z = 1;
    memset(r.back, 1, c.batch * c.page_bytes); /* its pages faulted in before any timing */
    for (size_t i = 0; i < c.pages * c.page_bytes / 8; i++) {
        uint64_t v = rng_next(&z);
        memcpy(r.mem + i * 8, &v, 8);
    }
    for (uint64_t i = 0; i < c.reps; i++)
        rep(&r, base, i, &set_t[i], &get_t[i]);
    report(&c, cli_summarize(set_t, c.reps), cli_summarize(get_t, c.reps));
    free(r.mem);
    free(r.back);
    free(r.keys);
    free(r.segs);
    free(r.pp);
    free(r.res);
    return 0;
}
