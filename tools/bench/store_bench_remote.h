/* kvtier-store-bench --remote: the Redis store (a server or a cluster) against
 * redis-benchmark on the same servers in the same run (store_bench_remote.c). */
#ifndef KVT_STORE_BENCH_REMOTE_H
#define KVT_STORE_BENCH_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct remote_bench_config {
    const char *url;             /* options.remote's form */
    const char *redis_benchmark; /* the program: a path, or a name looked up on PATH */
    const char *log;             /* where redis-benchmark's output goes */
    const char *tls_ca;          /* rediss://: the CA file, for the store and redis-benchmark */
    uint32_t page_bytes;
    uint64_t pages, batch, reps, seed;
    bool json;
};

/* Run it and print the report: 0, 1 on an error (a failed op, no server), 2 on a bad URL. */
int remote_bench_run(const struct remote_bench_config *c);

/* kvtier-store-bench --remote-restart: the time the Redis store takes to serve again after
 * its server restarts (store_bench_restart.c). */
struct restart_bench_config {
    const char *redis_server; /* the program: a path, or a name looked up on PATH */
    const char *dir;          /* the server's dir (its log) */
    uint32_t page_bytes;
    uint64_t batch;          /* pages an op writes and reads back, at most 256 */
    uint64_t reps;           /* times each down time is tried */
    const uint64_t *down_ms; /* how long the server stays down, one rep each */
    size_t n_down;
    uint32_t backoff_max_ms; /* the store's */
    bool json;
};

/* Run it and print the report: 0, or 1 on an error (no redis-server, a store that did not
 * serve again within 30 s). */
int restart_bench_run(const struct restart_bench_config *c);

#endif
