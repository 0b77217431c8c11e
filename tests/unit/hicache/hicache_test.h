/*
 * The host tier (HiCache) through the public API: load-back at request start, per-layer
 * waits, write-through and selective backups, load_back_min, device pressure, bad input,
 * and a seeded random run with random completion delays.
 *
 * KV content is a function of the token prefix: the row of token i is drawn from a hash
 * chained over the namespace and tokens 0..i (as tools/bench/bench_kv.c does), so any page, served
 * from the device or loaded back from the host, can be checked byte for byte against the key
 * it is cached under.
 *
 * The random run keeps a few requests in flight on a small device pool and a host pool
 * somewhat larger, so both tiers are under pressure, and swaps the transfer engine for one
 * whose worker sleeps a random 0..max_delay_us before each op (the xfer_config test seam), so
 * completions arrive late and in varied order relative to the owner thread. After every step
 * engine_check passes and the device and host pages add up.
 *
 * KVT_SEED=<n> reruns a sequence; the seed is printed at the start and on failure.
 */
/* One program (meson test `hicache`; tests/gpu builds it again as gpu_hicache with
 * TEST_BACKEND=KVT_BACKEND_CUDA) in files by what they test: helpers.c, the focused tests in
 * load_backup.c (loads and backups) and pressure.c (pressure, closing, sizing, bad input),
 * random_run.c, disk.c (the disk tier below the host) and main.c. This header is theirs alone. */
#ifndef KVT_TESTS_UNIT_HICACHE_H
#define KVT_TESTS_UNIT_HICACHE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "host/host_tier.h"
#include "disk/ops.h"

/* tests/gpu builds these files again with TEST_BACKEND=KVT_BACKEND_CUDA. */
#ifndef TEST_BACKEND
#define TEST_BACKEND KVT_BACKEND_SIM
#endif

#define LAYERS 2
#define HEAD_DIM 8
#define DTYPE 2
#define ROW (HEAD_DIM * DTYPE) /* bytes of one K or V row: one KV head */
/* A page of ps tokens: the K and V rows of every layer. */
#define PAGE_BYTES(ps) ((uint64_t)LAYERS * 2 * ROW * (ps))
#define MAX_TOK 48 /* longest request */
#define MAX_CONTEXT 64
#define N_REQ 4 /* request slots, and requests in flight at most */
#define N_BASE 6
#define N_NS 2
#define ALPHABET 4 /* few tokens, so keys share prefixes */
#define DEFAULT_SEED 0x6869636163686501ull

#include "engine_fixture.h"
#include "harness.h"
#include "kv_rows.h"

/* kvt_open with o fails with want and leaves e NULL. */
#define OPEN_FAILS(want)                                                                           \
    do {                                                                                           \
        e = (kvt_engine *)1;                                                                       \
        assert_int_equal(kvt_open(&o, &e), (want));                                                \
        assert_null(e);                                                                            \
    } while (0)

struct rcfg {
    const char *name;
    uint32_t ps, device_tokens, host_tokens;
    uint32_t layout, write_policy, write_threshold, load_back_min, evict_policy;
    uint32_t max_delay_us;
    uint32_t reuse; /* percent of new tokens that follow the base: how often keys repeat */
    uint32_t ops;
    int pressure;      /* the device is small enough that kvt_alloc_extend must hit -ENOMEM */
    int host_pressure; /* enough is backed up that the host pool must evict */
    int disk;          /* with a disk tier in a fresh data dir */
    uint32_t disk_write_policy, prefetch_policy;
};

/* helpers.c */
void check(const kvt_engine *e);
struct kvt_stats stats(const kvt_engine *e);
void host_options(struct kvt_options *o, uint32_t ps, uint64_t dev, uint64_t host);
void make_data_dir(char *dir, size_t len);
int set_xfer(kvt_engine *e, const struct xfer_config *xc);
kvt_engine *open_with(const struct kvt_options *o, const struct xfer_config *xc);
int drain(kvt_engine *e);
void seq_make(struct seq *q, uint32_t ns, size_t len, uint32_t salt);
void verify_req(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t n);
int extend(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t from, size_t to);
struct kvt_req run_request(kvt_engine *e, const struct seq *q, size_t prompt, int insert);
void evict_all(kvt_engine *e);
void assert_pools_add_up(const kvt_engine *e);

/* load_backup.c */
void test_layer_wait(void **state);
void test_match_pending_load(void **state);
void test_write_through(void **state);
void test_selective(void **state);
void test_write_back(void **state);
void test_load_back_min(void **state);

/* pressure.c */
void test_device_pressure(void **state);
void test_ref_dies_with_device_copy(void **state);
void test_load_back_no_room(void **state);
void test_pressure_waits_for_load(void **state);
void test_close_busy(void **state);
void test_unfinished_pending_load(void **state);
void test_host_sizing(void **state);
void test_bad_input(void **state);
void test_no_host(void **state);

/* random_run.c */
void run(const struct rcfg *cfg);
void test_random_page1(void **state);
void test_random_page4(void **state);

/* disk.c */
void test_disk_restart(void **state);
void test_poll_budget(void **state);
void test_disk_bad_options(void **state);
void test_disk_corruption(void **state);
void test_disk_prefetch_and_on_evict(void **state);
void test_random_disk(void **state);

#endif
