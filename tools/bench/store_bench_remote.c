/*
 * kvtier-store-bench --remote: how fast the Redis store moves pages to and from a server or a
 * cluster, against redis-benchmark on the same servers in the same run, rep by rep.
 *
 * The store: N pages written with store_write in ops of --batch pages, all ops queued at once
 * (its I/O thread pipelines them in chunks of 64 pages or 16 MiB, split per master), then read
 * back the same way and compared byte for byte (after the clock). Each rep writes under a
 * fingerprint of its own, so every SET lands (NX never finds the page there), and gives its
 * pages a TTL of 10 minutes, so the servers shed them on their own.
 * redis-benchmark: values of the store's value size (page + 104-byte header), pipelined
 * (-P 16), one connection per master (-c: 1, or the masters with --cluster), -n N requests:
 * -t set over a keyspace of 10^9 (new keys, as the store's pages are: a server allocating
 * for a new value is slower than one overwriting), then -t set,get over -r N/4 keys, its GET
 * figure taken (nearly every GET finds its key, as every page read does).
 * Ratio: the store's pages a second over redis-benchmark's requests a second, SET against
 * write and GET against read; goal >= 0.8.
 */
#include "store_bench_remote.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvtier.h"
#include "fio.h"
#include "store/redis/redis.h"

#define PROG "kvtier-store-bench"
#define TTL_S 600
#define TIMEOUT_MS 10000
#define PIPELINE "16"
#define TARGET 0.8

struct figures {
    double write_s[100], read_s[100], set_rps[100], get_rps[100];
    size_t reps, bench_reps;
    uint32_t masters, cluster;
    char note[256];
};

static void page_key(uint64_t seed, uint64_t i, uint8_t *key)
{
    memset(key, 0, STORE_KEY_BYTES);
    memcpy(key, &seed, sizeof(seed));
    memcpy(key + 8, &i, sizeof(i));
    key[31] = 0x7e;
}

/* Queue every op of pages, ops of batch pages, and wait for them all: the seconds it took. */
static double run_ops(struct kvt_store *s, const struct remote_bench_config *c, bool write,
                      uint8_t *keys, uint8_t *data, int *results, uint64_t *ok)
{
    uint64_t nops = (c->pages + c->batch - 1) / c->batch, *ids = calloc(nops, sizeof(*ids));
    struct store_wpage *w = calloc(c->pages, sizeof(*w));
    struct store_rpage *r = calloc(c->pages, sizeof(*r));
    struct store_done d;
    double t0 = cli_now(), t = -1;
    int rc = ids && w && r ? 0 : -ENOMEM;

    for (uint64_t i = 0; i < c->pages; i++) {
        w[i] = (struct store_wpage){.key = keys + i * STORE_KEY_BYTES,
                                    .buf = data + i * c->page_bytes};
        r[i] = (struct store_rpage){.key = keys + i * STORE_KEY_BYTES,
                                    .buf = data + i * c->page_bytes};
    }
    t0 = cli_now();
    for (uint64_t o = 0; o < nops && !rc; o++) {
        uint64_t p = o * c->batch, n = c->pages - p < c->batch ? c->pages - p : c->batch;
        rc = write ? store_write(s, w + p, n, results + p, &ids[o])
                   : store_read(s, r + p, n, results + p, &ids[o], NULL);
    }
    *ok = 0;
    for (uint64_t o = 0; o < nops && !rc; o++) {
        rc = store_wait_for(s, ids[o], -1, &d);
        *ok += d.ok;
    }
    if (!rc)
        t = cli_now() - t0;
    free(ids);
    free(w);
    free(r);
    return t;
}

static void fill(uint8_t *data, const struct remote_bench_config *c, uint64_t rep)
{
    uint64_t x = c->seed * 0x9e3779b97f4a7c15ull + rep;

    for (uint64_t i = 0; i < c->pages * c->page_bytes / 8; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* random bytes: nothing compresses */
        memcpy(data + 8 * i, &x, 8);
    }
}

static int open_store(const struct remote_bench_config *c, uint64_t rep, struct kvt_store **s)
{
    char buf[1024];
    struct store_redis_options o = {.page_bytes = c->page_bytes,
                                    .page_tokens = 16,
                                    .connect_timeout_ms = TIMEOUT_MS,
                                    .read_timeout_ms = TIMEOUT_MS,
                                    .write_timeout_ms = TIMEOUT_MS,
                                    .ttl_s = TTL_S};
    uint64_t fp[4] = {c->seed, rep, 0x6b76746265, 0};

    char err[400];

    if (store_redis_parse_url(c->url, buf, sizeof(buf), &o))
        return 2;
    o.tls_ca = c->tls_ca;
    memcpy(o.fingerprint, fp, sizeof(fp));
    if (store_redis_open_err(&o, s, err, sizeof(err))) {
        fprintf(stderr, PROG ": --remote: %s\n", err[0] ? err : "cannot open the Redis store");
        return 1;
    }
    return 0;
}

/* " (page I: why)" for the first page of an op that failed, "" when none did. */
static const char *first_failure(const int *results, uint64_t n)
{
    static char buf[96];

    for (uint64_t i = 0; i < n; i++)
        if (results[i]) {
            snprintf(buf, sizeof(buf), " (page %" PRIu64 ": %s)", i, kvt_strerror(results[i]));
            return buf;
        }
    return "";
}

/* One rep of the store: write, read, check. */
static int store_rep(const struct remote_bench_config *c, uint64_t rep, struct figures *f,
                     uint8_t *keys, uint8_t *data, uint8_t *back, int *results)
{
    struct store_redis_counters rc;
    struct kvt_store *s;
    uint64_t ok = 0;
    int err = open_store(c, rep, &s);

    if (err)
        return err;
    fill(data, c, rep);
    f->write_s[rep] = run_ops(s, c, true, keys, data, results, &ok);
    if (f->write_s[rep] < 0 || ok != c->pages) {
        fprintf(stderr, PROG ": --remote: %" PRIu64 " of %" PRIu64 " pages written%s\n", ok,
                c->pages, first_failure(results, c->pages));
        err = 1;
    }
    memset(back, 0, c->pages * c->page_bytes);
    if (!err && ((f->read_s[rep] = run_ops(s, c, false, keys, back, results, &ok)) < 0 ||
                 ok != c->pages || memcmp(back, data, c->pages * c->page_bytes))) {
        fprintf(stderr, PROG ": --remote: %" PRIu64 " of %" PRIu64 " pages read back exact%s\n", ok,
                c->pages, first_failure(results, c->pages));
        err = 1;
    }
    store_redis_counters(s, &rc);
    f->cluster = rc.cluster;
    f->masters = rc.cluster ? rc.masters : 1;
    store_close(s);
    return err;
}

/* The figure of one test in redis-benchmark's --csv output: "SET","12345.67",... */
static double csv_rps(const char *out, const char *test)
{
    char want[32];
    const char *p;

    snprintf(want, sizeof(want), "\"%s\",\"", test);
    double v = (p = strstr(out, want)) ? strtod(p + strlen(want), NULL) : 0;
    return isfinite(v) ? v : 0; /* "inf": a run shorter than its clock's millisecond */
}

/* redis-benchmark with tests (-t) over keys (-r), its output into the log; the figure of
 * test, or 0 (with a note) when it did not run or gave none. */
static double bench_run(const struct remote_bench_config *c, const char *path, struct figures *f,
                        const char *tests, uint64_t keys, const char *test)
{
    char buf[1024], port[8], clients[8], size[16], n[24], r[24];
    struct store_redis_options o = {0};
    char *argv[32], *out;
    double rps = 0;
    int a = 0, rc;

    store_redis_parse_url(c->url, buf, sizeof(buf), &o);
    snprintf(port, sizeof(port), "%u", o.port ? o.port : 6379u);
    snprintf(clients, sizeof(clients), "%u", f->masters);
    snprintf(size, sizeof(size), "%u", c->page_bytes + STORE_REDIS_HEAD_BYTES);
    snprintf(n, sizeof(n), "%" PRIu64, c->pages);
    snprintf(r, sizeof(r), "%" PRIu64, keys);
    char *fixed[] = {(char *)path,  "-h",   (char *)o.host, "-p", port, "-P", PIPELINE, "-c",
                     clients,       "-d",   size,           "-n", n,    "-r", r,        "-t",
                     (char *)tests, "--csv"};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        argv[a++] = fixed[i];
    if (o.password)
        argv[a++] = "-a", argv[a++] = (char *)o.password;
    if (f->cluster)
        argv[a++] = "--cluster";
    if (o.tls)
        argv[a++] = "--tls";
    if (o.tls && c->tls_ca)
        argv[a++] = "--cacert", argv[a++] = (char *)c->tls_ca;
    argv[a] = NULL;
    if ((rc = fio_spawn_wait(argv, c->log)) != 0 || !(out = fio_slurp(c->log))) {
        snprintf(f->note, sizeof(f->note), "redis-benchmark failed (status %d), see %s", rc,
                 c->log);
        return 0;
    }
    if ((rps = csv_rps(out, test)) <= 0)
        snprintf(f->note, sizeof(f->note),
                 "no %s figure from redis-benchmark (too short a run to time? more --pages)", test);
    free(out);
    return rps;
}

/* redis-benchmark beside the store's rep: SETs of new keys, as every page the store writes
 * is (a keyspace of 10^9), then GETs over N/4 keys set just before (-t set,get), so nearly
 * every GET finds its key as every page read does. False when it cannot run. */
static bool bench_rep(const struct remote_bench_config *c, const char *path, struct figures *f)
{
    uint64_t keys = c->pages / 4 ? c->pages / 4 : 1;

    f->set_rps[f->bench_reps] = bench_run(c, path, f, "set", 1000000000, "SET");
    f->get_rps[f->bench_reps] =
        f->set_rps[f->bench_reps] > 0 ? bench_run(c, path, f, "set,get", keys, "GET") : 0;
    if (f->get_rps[f->bench_reps] <= 0)
        return false;
    f->bench_reps++;
    return true;
}

static double best_rate(const double *s, size_t n, uint64_t count, bool seconds)
{
    double best = 0;

    for (size_t i = 0; i < n; i++) {
        double r = seconds ? (s[i] > 0 ? (double)count / s[i] : 0) : s[i];
        best = r > best ? r : best;
    }
    return best;
}

static void report(const struct remote_bench_config *c, const struct figures *f)
{
    double w = best_rate(f->write_s, f->reps, c->pages, true);
    double r = best_rate(f->read_s, f->reps, c->pages, true);
    double set = best_rate(f->set_rps, f->bench_reps, 0, false);
    double get = best_rate(f->get_rps, f->bench_reps, 0, false);
    double mb = (c->page_bytes + STORE_REDIS_HEAD_BYTES) / 1e6;

    if (c->json) {
        printf("{\"remote\":");
        cli_json_string(c->url);
        printf(",\"cluster\":%s,\"masters\":%u,\"page_bytes\":%u,\"pages\":%" PRIu64
               ",\"batch\":%" PRIu64 ",\"reps\":%" PRIu64 ",\"write_pages_s\":%.1f,"
               "\"read_pages_s\":%.1f,\"redis_benchmark\":{\"set_rps\":%.1f,\"get_rps\":%.1f,"
               "\"pipeline\":" PIPELINE ",\"clients\":%u},\"ratio_write\":%.3f,"
               "\"ratio_read\":%.3f,\"note\":",
               f->cluster ? "true" : "false", f->masters, c->page_bytes, c->pages, c->batch,
               c->reps, w, r, set, get, f->masters, cli_ratio(w, set), cli_ratio(r, get));
        cli_json_string(f->note);
        printf("}\n");
        return;
    }
    printf("kvtier-store-bench --remote %s\n", c->url);
    printf("  servers     %s, %u master%s\n", f->cluster ? "a Redis Cluster" : "one server",
           f->masters, f->masters == 1 ? "" : "s");
    printf("  pages       %" PRIu64 " of %u B (values %u B), ops of %" PRIu64 ", best of %" PRIu64
           " reps\n",
           c->pages, c->page_bytes, c->page_bytes + STORE_REDIS_HEAD_BYTES, c->batch, c->reps);
    printf("  redis-benchmark -P " PIPELINE " -c %u -d %u -n %" PRIu64
           "%s%s: -t set -r 1000000000 (new keys), then -t set,get -r %" PRIu64 " (GET)\n",
           f->masters, c->page_bytes + STORE_REDIS_HEAD_BYTES, c->pages,
           f->cluster ? " --cluster" : "", strncmp(c->url, "rediss://", 9) ? "" : " --tls",
           c->pages / 4 ? c->pages / 4 : 1);
    printf("\n  %-8s %12s %10s %16s %8s\n", "", "store op/s", "MB/s", "redis-bench op/s", "ratio");
    printf("  %-8s %12.0f %10.1f %16.0f %8.2f  (goal >= %.1f)\n", "write", w, w * mb, set,
           cli_ratio(w, set), TARGET);
    printf("  %-8s %12.0f %10.1f %16.0f %8.2f\n", "read", r, r * mb, get, cli_ratio(r, get));
    if (f->note[0])
        printf("  note: %s\n", f->note);
}

int remote_bench_run(const struct remote_bench_config *c)
{
    size_t bytes = c->pages * c->page_bytes;
    uint8_t *keys = malloc(c->pages * STORE_KEY_BYTES), *data = malloc(bytes),
            *back = malloc(bytes);
    int *results = malloc(c->pages * sizeof(int)), rc = 0;
    struct figures *f = calloc(1, sizeof(*f));
    char path[4096];
    bool bench_ok = fio_find_program(c->redis_benchmark, path, sizeof(path));

    if (!keys || !data || !back || !results || !f) {
        rc = 1;
        goto out;
    }
    if (!bench_ok)
        snprintf(f->note, sizeof(f->note), "redis-benchmark not found (%s): no comparison",
                 c->redis_benchmark);
    for (uint64_t i = 0; i < c->pages; i++)
        page_key(c->seed, i, keys + i * STORE_KEY_BYTES);
    for (uint64_t rep = 0; rep < c->reps && rep < 100 && !rc; rep++, f->reps++) {
        rc = store_rep(c, rep, f, keys, data, back, results);
        bench_ok = !rc && bench_ok && bench_rep(c, path, f);
    }
    if (!rc)
        report(c, f);
out:
    free(keys);
    free(data);
    free(back);
    free(results);
    free(f);
    return rc;
}
