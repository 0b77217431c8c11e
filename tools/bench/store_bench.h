/*
 * kvtier-store-bench: how fast the disk tier's block store moves pages, against fio on the
 * same disk in the same run, and how soon a big data dir serves after open. It prints
 * figures; it passes or fails nothing.
 *
 * (a) Throughput, for every page size x queue depth asked for, rep by rep:
 *     store: a fresh data dir; one warm-up page (so the slab file is created and preallocated
 *     before the clock starts, as fio lays its file out before its own); then N pages written
 *     with dstore_write in ops of --batch pages (the store's max_batch is the same, so one op
 *     is one commit batch: its I/O, one fdatasync, one LMDB transaction), two ops in flight so
 *     the committer always has the next batch queued; then the N pages read back with
 *     dstore_read in ops of --batch pages, enough ops in flight to keep queue_depth page I/Os
 *     in the kernel, in random (or written) order. Buffers come from one page-aligned region
 *     registered with io_uring, as the engine registers its host pool. The store's and fio's
 *     buffers are of the same kind of pages (resolve_buffers): huge pages for both (the
 *     store's by MADV_HUGEPAGE, as the host pool asks; fio's hugetlb pages, reserved
 *     beforehand) or 4 KiB pages for both, never one of each.
 *     fio: io_uring, O_DIRECT (as the store got it), registered buffers (likewise), iodepth
 *     = queue depth, N I/Os on a file of N slots in the same dir: a durable sequential write
 *     of slots (--fdatasync=<batch> --end_fsync=1: a sync per store batch, the last one
 *     included), a plain one (no sync at all), and a randread (or a read striding as the
 *     store's slots do) of the durable file in I/Os of what the store reads a page with
 *     (read_block_of: a page of whole blocks without its head block, as the store reads
 *     it).
 *     Ratio: fio's time over the store's for the same number of I/Os. Target 0.95,
 *     for writes against the durable fio write: like with like. The store's write is durable
 *     when its op completes (data fdatasync'ed, then the index committed), so it pays for
 *     draining the disk's write cache; fio's plain write leaves its bytes in that cache. On a
 *     disk with a volatile cache (a virtual disk in write-back mode) that flush is most of the
 *     cost: 512 MiB took 0.5-0.75 s to flush here, after 0.25-0.5 s to write. fio's
 *     --fdatasync=N alone syncs after every N writes but not after the last ones (with N
 *     pages or fewer it never syncs), hence --end_fsync=1. The plain write is still run and
 *     its ratio printed, to show what durability costs on the disk, but it is not judged.
 *     --disk-sync relaxed opens the store in relaxed mode (no fdatasync per batch; a flush
 *     of slabs and index every 256 MiB or second): its write is then judged against fio's
 *     plain write, like with like again.
 *     Every timed write starts on a quiet disk: syncfs on the work dir before the clock, so no
 *     phase pays for the write cache or the discards (unlinked files) an earlier one left.
 *     What still differs: the store drains each batch before its fdatasync, then commits an
 *     LMDB transaction (more syncs), and only then starts the next batch; it checksums every
 *     page (XXH3-128) on both paths. fio has no index, and its fdatasync is one more op
 *     queued after every N writes.
 *
 * (b) Open: a data dir indexing M pages (4 KiB, or --open-page-bytes) is built (written in
 *     batches of 4096 pages, timed), closed, then opened again and again: the time to
 *     dstore_open, to the first dstore_leading_run that finds all of 64 known keys (ready to
 *     serve; target 200 ms), to one page read back, and to dstore_wait_ready (the background
 *     rebuild done). Each rep opens once cold (the dir's files dropped from the page cache
 *     with posix_fadvise) and once warm. *
 * Its files, each calling only those below it:
 *   store_bench.c             main: which runs, the work dir
 *   store_bench_options.c     the option table, the checks across options, --help
 *   store_bench_report.c      the report, text and JSON
 *   store_bench_throughput.c  (a) throughput, point by point, store and fio rep by rep
 *   store_bench_open.c        (b) open: a dir built, then opened cold and warm
 *   store_bench_fio.c         fio: found, its buffers chosen, its jobs run
 *   store_bench_store.c       the store's side: buffers, ops pumped through it, a rep
 *   store_bench_remote.c      (r) --remote: the Redis store against redis-benchmark
 *   store_bench_restart.c     (r2) --remote-restart: the Redis store's recovery
 */
#ifndef KVT_STORE_BENCH_H
#define KVT_STORE_BENCH_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "cli.h"
#include "fio.h"
#include "disk/store.h"
#include "workdir.h"

#define PROG "kvtier-store-bench"
/* Llama-3-8B, 16 tokens a page: 32 layers x K,V x 8 KV heads x 128 x 2 bytes x 16 = 2 MiB. */
#define DEFAULT_PAGE_BYTES (2ull << 20)
#define DEFAULT_QUEUE_DEPTH 32
#define DEFAULT_BYTES (2ull << 30)
#define DEFAULT_REMOTE_BYTES (256ull << 20)
#define DEFAULT_BATCH 256 /* the store's own max_batch default */
#define DEFAULT_REPS 3
#define DEFAULT_OPEN_PAGES 100000
#define DEFAULT_OPEN_REPS 5
#define PAGE_TOKENS 16 /* records carry tokens as the engine's do */
#define SLOT_ALIGN 4096u
#define DEFAULT_OPEN_PAGE_BYTES 4096u
#define OPEN_BATCH 4096u
#define OPEN_KEYS 64u
#define INDEX_BYTES_PER_PAGE 1024u /* a generous guess of the LMDB index per page, for space */
#define TARGET_RATIO 0.95
#define TARGET_SERVE_S 0.200

enum read_order { ORDER_RANDOM = 0, ORDER_SEQ = 1 };

/* Names of the config's enums, as the options take them (store_bench_options.c). */
extern const char *const sb_order_names[2];
extern const char *const sb_io_names[3];
extern const char *const sb_sync_names[2]; /* enum dstore_sync */
enum buffers { BUF_AUTO = 0, BUF_HUGE = 1, BUF_4K = 2 };
extern const char *const sb_buffer_names[3];

struct config {
    const char *parent; /* --dir: the work dir is made inside it */
    const char *fio;
    const char *remote, *redis_benchmark; /* --remote: the Redis store instead of (a), (b) */
    const char *remote_tls_ca;            /* --remote rediss://: the CA file */
    struct cli_list down_ms;              /* --remote-restart: its recovery instead */
    const char *redis_server;
    uint64_t backoff_max_ms;
    bool keep, json, no_fio;
    struct cli_list page_bytes, queue_depth;
    uint64_t bytes, pages; /* pages per run when pages_set (0 skips (a)), else bytes / page */
    bool pages_set;
    uint64_t batch, reps, seed, open_pages, open_reps, open_page_bytes;
    uint32_t order, io, sync, buffers;
};

/* One page size x queue depth. */
struct point {
    uint32_t page_bytes, slot_bytes, queue_depth;
    uint32_t read_block; /* bytes the store reads a page with (read_block_of) */
    uint64_t pages;
    struct cli_timing write, read;                   /* the store */
    struct cli_timing fio_write, fio_sync, fio_read; /* fio: plain write, durable write, read */
    bool fio_ran;
    uint32_t io, direct, fixed_buffers; /* what the store ended up using */
    uint64_t fixed_ios;                 /* of the last rep */
    uint64_t huge_bytes, buffer_bytes;  /* of the buffers, on huge pages (the kernel's word) */
};

struct open_result {
    uint64_t pages, keys;
    double build;                                                 /* seconds to write them all */
    struct cli_timing open[2], serve[2], first_read[2], ready[2]; /* [cold, warm] */
};

/* What the run learned about fio. */
struct fio_state {
    bool usable;
    char path[PATH_MAX];
    char version[64];
    char note[512]; /* why there is no comparison, when there is none */
};

struct bench {
    const struct config *cfg;
    struct workdir wd; /* our own dir under --dir; everything goes in it */
    struct fio_state fio;
    uint32_t buffers; /* BUF_HUGE or BUF_4K: the store's and fio's alike */
    struct point *pt;
    size_t npt;
    struct open_result open;
    bool open_ran;
};

/* Page-aligned memory the pages are written from and read into, registered with the store
 * (io_uring fixed buffers) as the engine registers its host pool. Position p uses slot
 * p % pages, and no more than pages positions are ever in flight. */
struct ring {
    uint8_t *base;
    size_t bytes;
    uint32_t slot_bytes;
    uint64_t pages;
};

/* One stream of ops: n pages in ops of batch, at most window ops in flight. */
struct pump {
    struct dstore *s;
    const struct ring *ring;
    bool write;
    uint64_t seed;
    const uint32_t *order; /* page of each position; NULL: the position itself */
    uint64_t n;
    uint32_t batch, window;
};

/* Reads go in READ_OPS ops of half the queue depth each, round robin over twice the queue
 * depth's buffers: enough queued to keep queue_depth I/Os in the kernel while the oldest
 * op is collected, and a footprint near fio's (iodepth buffers of a block each). The
 * footprint matters, not only the buffers' pages: on this machine's virtual disk, random
 * 256 KiB reads into a round robin of 133 MB of buffers ran at 2.7 GB/s, into 8 MiB at 3.8
 * (a bare io_uring reader, the same file and offsets). */
#define READ_OPS 4

static inline uint32_t read_batch(uint32_t qd)
{
    return qd < 2 ? 1 : qd / 2;
}

/* ---- the command line (store_bench_options.c) ---- */

void sb_config_defaults(struct config *cfg);
/* The options into cfg: 0 to go on, -1 after --help, else the exit status. */
int sb_parse_args(struct config *cfg, int argc, char **argv);

/* ---- the report (store_bench_report.c) ---- */

void sb_print_report(const struct bench *b);

/* ---- the runs: (a) store_bench_throughput.c, (b) store_bench_open.c ---- */

int sb_run_throughput(struct bench *b);
int sb_run_open(struct bench *b);

/* ---- fio (store_bench_fio.c) ---- */

/* Find fio and its version; without one, b->fio.note says why. */
void sb_fio_setup(struct bench *b);
/* Which buffers the store and fio both get (b->buffers): 0, or -1 after saying why. */
int sb_resolve_buffers(struct bench *b);
/* One fio job of a point and where its output goes. */
struct bench_job {
    struct fio_job fio;
    char file[PATH_MAX], json[PATH_MAX], log[PATH_MAX];
    char rw[32];
};

/* Bytes a job of rw moves: a slot per page written, read_block per page read. */
uint64_t sb_job_bytes(const struct point *pt, const char *rw);
/* The job of rw (write, read or randread) at point pt; fdatasync: writes between syncs. */
void sb_job_init(struct bench_job *j, const struct bench *b, const struct point *pt, const char *rw,
                 uint64_t fdatasync);
/* One rep of fio's three jobs for point pt: times in t (plain write, durable write, read). */
int sb_fio_rep(struct bench *b, const struct point *pt, double t[3]);

/* ---- the store's side (store_bench_store.c) ---- */

/* "PROG: what: error" on stderr: -1. */
int sb_fail(const char *what, int rc);
/* dstore_open failed on dir: the dir, and the entry of it of the wrong kind when there is
 * one: -1. */
int sb_open_fail(const char *dir, int rc);
/* Progress on a terminal only (fmt takes PROG, then what). */
void sb_progress(const char *fmt, const char *what);
/* Page i's 32-byte key: four words no other page shares (the store dedups equal keys). */
void sb_page_key(uint64_t seed, uint64_t i, uint8_t *key);
/* Bytes a page takes in a slab, and the bytes the store reads a page with. */
uint32_t sb_slot_of(uint32_t page_bytes);
uint32_t sb_read_block_of(uint32_t page_bytes);
/* Bytes of the mapping at base that huge pages back; 0 when it cannot be read. */
uint64_t sb_huge_bytes_at(const void *base);
int sb_ring_create(struct ring *r, uint32_t slot_bytes, uint64_t pages, bool huge);
void sb_ring_destroy(struct ring *r);
/* Run p's ops to the end: its seconds, 0; or -1 after saying why. */
int sb_pump_run(const struct pump *p, double *seconds);
void sb_store_options(struct dstore_options *o, const char *dir, uint32_t page_bytes);
/* The counters must show exactly what was asked: 0, or -1 after saying why. */
int sb_check_counters(const struct dstore_stats *st, uint64_t writes, uint64_t reads);
/* A random order of n pages, or the order they were written in (NULL: no memory). */
uint32_t *sb_read_order(const struct config *cfg, uint64_t n);
/* One rep of the store at point pt (written, then read in order): times in t. */
int sb_store_rep(const struct bench *b, struct point *pt, const struct ring *ring,
                 const uint32_t *order, double t[2]);

#endif
