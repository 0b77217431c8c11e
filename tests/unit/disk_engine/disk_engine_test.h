/*
 * The engine with a disk tier under crashes, injected I/O faults and bytes damaged on disk.
 *
 * KV content is a function of the key: the row of token i is drawn from a hash chained over
 * the namespace and tokens 0..i, the layer and K or V (as the hicache tests do), so every page
 * served, from the device, the host or the disk, is checked byte for byte against the key.
 *
 * - test_crash: a child process opens an engine on a data dir and runs requests forever over
 *   a seeded family of keys (shared prefixes, several lengths, two namespaces) through a small
 *   device, host and disk tier, so all three evict; the parent SIGKILLs it after a random
 *   delay, opens an engine on the same dir itself (which must succeed every time) and runs
 *   requests over the same family: every page served (the disk part included) must be
 *   byte-exact, the engine check clean, and no disk error seen. Some rounds start from a fresh
 *   dir and kill the child at any moment from the fork, so a creation is cut short too.
 *   KVT_CRASH_ROUNDS=<n> sets the number of rounds (default 200).
 * - test_crash_relaxed: the same with the disk tier in relaxed mode (kvt_options.disk_sync):
 *   the child flushes every few ms, the parent reopens in relaxed or durable mode by turns.
 *   A SIGKILL is no power cut: every page served is byte-exact and no disk error is seen.
 * - test_crash_grouped: test_crash's kills with store pages of 4 pages (store_page_tokens),
 *   a quarter of the rounds.
 * - test_faults: the engine's store is swapped for one opened on the same dir with the fault
 *   seam (struct dstore_options.faults), failing writes (-ENOSPC, -EIO), reads (-EIO), slab
 *   syncs (-EIO) or slab growth (-ENOSPC), always or at random: the device and host keep
 *   serving byte-exact, kvt_poll and kvt_sync return 0, disk_errors grows; with the faults off
 *   again writes succeed and a restart serves from disk.
 * - test_checksum_running: pages damaged in the slab file under a running engine, after their
 *   host copies were evicted, are never served: the request computes them (or takes the
 *   leading pages that are intact), errors are counted, the engine goes on, and after a
 *   restart the pages written again are served from disk.
 * - test_redis_shared, test_redis_faults, test_redis_evicting (redis.c, where the Redis store
 *   is built; skipped where redis-server is not installed): the engine over the Redis store on a
 * redis-server of the test's own: engines sharing it serve what the others wrote; values
 * overwritten with bad ones, FLUSHALL, the server killed and restarted, stopped and continued, and
 * at its maxmemory evicting, with every page served checked and no engine call blocked past the
 *   store's timeouts.
 *
 * - test_store_pages, test_store_pages_random (grouped.c): store pages of several pages
 *   (kvt_options.store_page_tokens): which pages go down and when, a match by whole store
 *   pages after a restart, a read of a store page that starts above the tree's part, every
 *   page served checked, over a disk that evicts and the in-memory store.
 * - test_store_pages_mixed (grouped.c): store pages of 2, 3 and 4 pages under every prefetch
 *   policy, both write policies, reads of other keys left in flight, host and disk evicting,
 *   restarts; every page served and every record of the dir read back and checked.
 * - test_chain_store_grouped (mem.c): test_chain_store's chain with store pages of 3 pages.
 * - test_faults_grouped (faults.c): test_faults' read and random cases, store pages of 4 pages.
 *
 * KVT_SEED=<n> reruns a sequence (the kill times of test_crash excepted); the seed is printed.
 */
/* One program (meson test `disk_engine`) in a file per test family; this header is theirs
 * alone: helpers.c's keys, engine and request helpers and disk index check, each file's tests
 * for main.c's table. */
#ifndef KVT_TESTS_UNIT_DISK_ENGINE_H
#define KVT_TESTS_UNIT_DISK_ENGINE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "disk/layout.h"
#include "engine/engine.h"
#include "store/chain.h"
#include "disk/ops.h"
#include "store/mem.h"
#include "radix/hash.h"

#define LAYERS 2
#define HEAD_DIM 8
#define DTYPE 2
#define ROW (HEAD_DIM * DTYPE) /* bytes of one K or V row: one KV head */
#define PS 4                   /* tokens per page */
#define MAX_TOK 48             /* longest request */
#define MAX_CONTEXT 64
#define DEVICE_TOKENS 64
#define N_REQ 4
#define N_BASE 6 /* base sequences per namespace in a key family */
#define N_NS 2
#define CHILD_FAILED 3 /* exit status of a crash child that found something wrong */

#include "engine_fixture.h"
#include "harness.h"
#include "kv_rows.h"

/* Failures: cmocka in the test process, _exit in a crash child (harness.h), naming g_ctx. */
#define HARNESS_RUN(ctx) (&(struct harness_run){.prog = "test_disk_engine", .note = (ctx)})

#define FAULT_HOST_TOKENS 128
/* The slot a page takes in the disk tier's slabs: its K and V rows of every layer, and its head. */
#define DISK_SLOT fixture_disk_slot((uint64_t)LAYERS * 2 * ROW * PS, PS)
#define FAULT_DISK_BYTES (1024 * DISK_SLOT) /* 1024 slots: the disk tier does not evict here */

struct recs {
    struct rec *v;
    size_t n, cap;
    uint64_t bad; /* records that failed their checks */
};

struct disk_check {
    uint64_t pages, orphans; /* read and checked; skipped: a page before them is not held */
};

/* What a run of requests was served. */
struct tally {
    uint64_t reqs, protected_tokens, loaded_tokens, disk_tokens, matched_disk;
};

extern char g_ctx[192]; /* what runs now: the seed, the round; printed with a failure */
/* The engine's pages to a store page that disk_opts asks for and check_disk expects (1: the
 * default; a test that sets it resets it in its teardown), at most MAX_STORE_PAGES. */
#define MAX_STORE_PAGES 4
extern uint32_t g_store_pages;
/* The longest one engine call of run_req took, in microseconds (a test of a stalled store
 * resets it and bounds it by the store's timeouts). */
extern uint64_t g_slowest_call_us;
/* Set by a test that leaves reads of other keys in flight: run_req then does not bound a
 * request's disk_len by its kvt_match's (a read landing between them may bring more). */
extern int g_other_fills;

/* helpers.c */
uint32_t below(uint64_t *s, uint32_t n);
int chance(uint64_t *s, uint32_t pct);
void seq_make(struct seq *q, uint32_t ns, size_t len, uint32_t salt);
void gen_seq(uint64_t fam, uint64_t *rng, struct seq *q);
void check(const kvt_engine *e);
struct kvt_stats stats(const kvt_engine *e);
void disk_opts(struct kvt_options *o, const char *dir, uint64_t host_tokens, uint64_t disk_bytes);
int open_engine(const struct kvt_options *o, kvt_engine **e);
kvt_engine *open_ok(const struct kvt_options *o);
void make_data_dir(char *dir, size_t len);
uint64_t base_seed(void);
struct kvt_req run_req(kvt_engine *e, const struct seq *q, size_t prompt, int insert,
                       struct kvt_match *m);
void page_key(const kvt_engine *e, const struct seq *q, size_t i, uint8_t key[KVT_HASH_LEN]);
void expected_page(const struct seq *q, size_t i, uint8_t *page);
uint64_t index_digest(const struct recs *r);
struct disk_check check_disk(kvt_engine *e, struct recs *r);

/* crash.c */
void test_crash(void **state);
void test_crash_relaxed(void **state);
void test_crash_grouped(void **state);
int store_pages_reset(void **state);

/* faults.c */
void swap_store(kvt_engine *e, const struct dstore_faults *f);
void test_faults_grouped(void **state);
void run_family(kvt_engine *e, uint64_t fam, uint64_t seed, int n, int full_prompt, int insert,
                struct tally *t);
void test_faults(void **state);

/* mem.c */
void test_mem_store(void **state);
void test_chain_store(void **state);
void test_chain_store_grouped(void **state);
void test_store_geometry(void **state);

/* grouped.c */
void test_store_pages(void **state);
void test_store_pages_random(void **state);
void test_store_pages_mixed(void **state);
void test_store_pages_auto_size(void **state);
void test_store_pages_auto_compat(void **state);

/* damage.c */
void test_sync_waits_for_drops(void **state);
void test_checksum_running(void **state);

#ifdef KVT_HAVE_REDIS
/* redis.c: setup starts a redis-server (none where it is not installed: the tests say they
 * are skipped), teardown kills it */
int redis_setup(void **state);
int redis_teardown(void **state);
void test_redis_shared(void **state);
void test_redis_faults(void **state);
void test_redis_evicting(void **state);
#endif

#endif
