/*
 * The disk tier's block store: round trips, persistence, refusals, corruption, injected
 * faults, capacity and LRU eviction, crash consistency under SIGKILL and a simulated power
 * cut (durable and relaxed modes), the write pipe's crash order, the flushes each mode makes,
 * and access times written lazily.
 *
 * Every test runs twice: with io_uring (skipped, saying why, where the kernel refuses it)
 * and with the psync engine forced. Page bytes are a function of the page's key, so any
 * page the store serves can be checked without remembering what was written.
 *
 * One program (meson test `store`) in files by what they test; this header is theirs alone:
 * the fixture and helpers (helpers.c), each file's tests for main.c's table.
 */
#ifndef KVT_TESTS_UNIT_STORE_H
#define KVT_TESTS_UNIT_STORE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rng.h"
#include "disk/index.h"
#include "disk/layout.h"
#include "disk/dio.h"
#include "disk/store.h"
#include "engine_fixture.h"

#define PAGE 8192 /* bytes per page in most tests: O_DIRECT-sized */
#define TOKENS 4  /* tokens per page */
/* A slot of such a page (disk/layout.h): its two blocks, then a block for its head; the
 * slots of a slab follow the slab's head block. */
#define SLOT (PAGE + LAYOUT_BLOCK)

#define KEY DSTORE_KEY_BYTES

/* The test's data dir and options. */
struct fx {
    char dir[64];
    struct dstore_options o;
    struct dstore *s;
    uint8_t *bufs; /* aligned page buffers */
    size_t nbufs;
};

extern uint32_t io_kind;  /* the variant the group runs */
extern uint32_t page_len; /* the pages the helpers write and check: f->o.page_bytes, at most
                             PAGE (buffers stay PAGE apart); fx_options sets PAGE */
extern int uring_err;     /* 1: not probed yet; 0: works; else the refusal */

/* helpers.c */
void make_key(uint64_t id, uint8_t *key);
void fill_page(const uint8_t *key, uint8_t *buf, size_t len);
bool page_ok(const uint8_t *key, const uint8_t *buf, size_t len);
void tokens_of(uint64_t id, uint32_t *t);
void rm_rf(const char *path);
void fx_options(struct fx *f);
void need_io(void);
int fx_setup(void **state);
int fx_teardown(void **state);
void fx_close(struct fx *f);
void fx_open(struct fx *f);
void fx_reopen(struct fx *f);
uint8_t *buf_at(struct fx *f, size_t i);
int put_core(struct dstore *s, uint8_t *bufs, const uint64_t *ids, size_t n, int *res);
void put_ids(struct fx *f, const uint64_t *ids, size_t n, int want);
void child_put(struct dstore *s, uint8_t *bufs, uint64_t first, size_t n);
void put_range(struct fx *f, uint64_t first, size_t n);
int get_id(struct fx *f, uint64_t id);
bool has_id(struct fx *f, uint64_t id);
struct dstore_stats stats_of(struct fx *f);
/* Reading back every record after a crash: a record is served byte-exact or missed, never
 * wrong; with intact, every record must be whole too. dstore_iterate's visitor. */
struct readback {
    struct fx *f;
    bool intact;
    size_t served;
};
int readback_visit(void *arg, const struct dstore_entry *e);

/* roundtrip.c */
void test_roundtrip_batched(void **state);
void test_buffered_round_trip(void **state);
void test_async_poll(void **state);
void test_duplicates(void **state);
void test_duplicates_shared_tag(void **state);
void test_small_pages_buffered(void **state);
void test_bad_input(void **state);
void test_iterate(void **state);
void test_unaligned(void **state);
void test_direct_and_buffered(void **state);
void test_tmpfs(void **state);
void test_registered_buffers(void **state);
void test_uring_refused(void **state);

/* memory.c */
void test_in_memory(void **state);

/* persistence.c */
void test_restart(void **state);
void test_relaxed_stamp(void **state);
void test_lost_index(void **state);
void test_hollow_index(void **state);
void test_fingerprint(void **state);
void test_foreign_dir(void **state);
void test_format_version(void **state);
void test_packed_slots(void **state);
void test_format2_dir(void **state);
void test_meta_damaged(void **state);
void test_meta_flipped(void **state);
void test_meta_flipped_no_slabs(void **state);
void test_locked(void **state);
void test_lock_probe(void **state);
void test_as_found(void **state);
void test_readonly(void **state);

/* corruption.c */
void test_flipped_bytes(void **state);
void test_truncated_slab(void **state);
void test_garbled_index(void **state);
void check_all(struct fx *f, uint64_t first, uint64_t last);
void test_capacity_lowered(void **state);
void test_not_regular_files(void **state);
void test_reader_beside_growth(void **state);

/* faults.c */
void test_faults(void **state);
void test_rebuild_failed(void **state);

/* capacity.c */
void test_evict_keeps_batch_dup(void **state);
void test_lru_eviction(void **state);
void test_evict_ahead(void **state);
void test_chain_ends_first(void **state);
void test_batch_larger_than_store(void **state);
void test_pinned_slot(void **state);
void test_wait_timeout(void **state);

/* crash.c */
void test_crash(void **state);
void test_crash_relaxed(void **state);

/* order.c */
void test_pipe_order(void **state);
void test_pipe_same_key(void **state);
void test_group_commit(void **state);
void test_reads_before_writes(void **state);
void test_parts(void **state);
void test_parts_adjacent(void **state);
void test_disk_use(void **state);
void test_disk_use_big_pages(void **state);
void test_stripes(void **state);

/* sync.c */
void test_durable_flushes(void **state);
void test_relaxed_flushes(void **state);
void test_flush_fails_no_reuse(void **state);
void test_bad_reads_drop_together(void **state);
void test_bad_slots_before_eviction(void **state);

/* powercut.c */
void test_power_cut_relaxed(void **state);
void test_power_cut_durable(void **state);
void test_power_cut_packed(void **state);

/* access.c */
void test_reads_cost_no_flush(void **state);
void test_access_order_after_close(void **state);
void test_access_period(void **state);
void test_access_slot_only(void **state);
void test_access_crash(void **state);
void test_access_crash_relaxed(void **state);

#endif
