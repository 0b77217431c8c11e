/* kvtier-store-bench --remote: the Redis store (a server or a cluster) against
 * redis-benchmark on the same servers in the same run (store_bench_remote.c). */
#ifndef KVT_STORE_BENCH_REMOTE_H
#define KVT_STORE_BENCH_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

struct remote_bench_config {
    const char *url;             /* options.remote's form */
    const char *redis_benchmark; /* the program: a path, or a name looked up on PATH */
    const char *log;             /* where redis-benchmark's output goes */
    uint32_t page_bytes;
    uint64_t pages, batch, reps, seed;
    bool json;
};

/* Run it and print the report: 0, 1 on an error (a failed op, no server), 2 on a bad URL. */
int remote_bench_run(const struct remote_bench_config *c);

#endif
