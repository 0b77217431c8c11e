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
 *     with posix_fadvise) and once warm.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvtier.h"
#include "cli.h"
#include "datadir.h"
#include "fio.h"
#include "report.h"
#include "rng.h"
#include "workdir.h"
#include "store/disk/layout.h"
#include "store/disk/store.h"
#include "host/host_pool.h"
#ifdef KVT_HAVE_REDIS
#include "store_bench_remote.h"
#endif

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

static const char *const order_names[] = {"random", "seq"};
static const char *const io_names[] = {"auto", "uring", "psync"};
static const char *const sync_names[] = {"durable", "relaxed"}; /* enum dstore_sync */
enum buffers { BUF_AUTO = 0, BUF_HUGE = 1, BUF_4K = 2 };
static const char *const buffer_names[] = {"auto", "huge", "4k"};

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

/* ---- small helpers ---- */

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, kvt_strerror(rc));
    return -1;
}

/* dstore_open failed on dir: the dir, and the entry of it of the wrong kind when there is one. */
static int open_fail(const char *dir, int rc)
{
    char clip[CLI_PATH_ECHO_MAX + 4], entry[2 * CLI_PATH_ECHO_MAX + 128];
    const char *shown = cli_clip(dir, CLI_PATH_ECHO_MAX, clip);

    if (rc > -4096 && cli_dir_problem(dir, shown, entry, sizeof(entry)))
        fprintf(stderr, "%s: opening the store in %s: %s (%s)\n", PROG, shown, entry,
                kvt_strerror(rc));
    else
        fprintf(stderr, "%s: opening the store in %s: %s\n", PROG, shown, kvt_strerror(rc));
    return -1;
}

/* Progress on a terminal only: a 1M-page build takes a while, and pipes want the report. */
static void progress(const char *fmt, const char *what)
{
    if (isatty(STDERR_FILENO))
        fprintf(stderr, fmt, PROG, what);
}

/* Page i's 32-byte key: four words no other page shares (the store dedups equal keys). */
static void page_key(uint64_t seed, uint64_t i, uint8_t *key)
{
    for (uint64_t w = 0; w < 4; w++) {
        uint64_t v = rng_mix64(seed * RNG_GAMMA + 4 * i + w);

        memcpy(key + 8 * w, &v, 8);
    }
}

/* Bytes a page takes in a slab: its blocks and its head's (disk/layout.h). */
static uint32_t slot_of(uint32_t page_bytes)
{
    struct slot_layout l;

    return layout_init(&l, page_bytes, PAGE_TOKENS, DSTORE_FORMAT_VERSION) ? 0 : l.slot_bytes;
}

/* Bytes the store reads a page with: its whole blocks alone when it has no tail (the tail
 * block then holds only the head, which reads skip), else the whole slot (the body and the
 * tail block, two adjacent I/Os). fio's read moves as much per I/O. */
static uint32_t read_block_of(uint32_t page_bytes)
{
    struct slot_layout l;

    if (layout_init(&l, page_bytes, PAGE_TOKENS, DSTORE_FORMAT_VERSION))
        return 0;
    return l.tail ? l.slot_bytes : l.body;
}

/* Why there is no (more) comparison with fio; the report prints it. */
static void fio_note(struct fio_state *f, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(f->note, sizeof(f->note), fmt, ap);
    va_end(ap);
}

/* ---- buffers ---- */

/* Page-aligned memory the pages are written from and read into, registered with the store
 * (io_uring fixed buffers) as the engine registers its host pool. Position p uses slot
 * p % pages, and no more than pages positions are ever in flight. */
struct ring {
    uint8_t *base;
    size_t bytes;
    uint32_t slot_bytes;
    uint64_t pages;
};

/* Bytes of the mapping at base that huge pages back (/proc/self/smaps' AnonHugePages); 0
 * when it cannot be read. */
static uint64_t huge_bytes_at(const void *base)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[256];
    bool in = false;
    uint64_t kb = 0;

    while (f && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)base >= lo && (uintptr_t)base < hi;
        else if (in && sscanf(line, "AnonHugePages: %" SCNu64 " kB", &kb) == 1)
            break;
    }
    if (f)
        fclose(f);
    return kb * 1024;
}

static int ring_create(struct ring *r, uint32_t slot_bytes, uint64_t pages, bool huge)
{
    uint64_t rng = 0x5eed;
    uint64_t avail = host_memory_available();

    r->slot_bytes = slot_bytes;
    r->pages = pages;
    r->bytes = (size_t)(slot_bytes * pages);
    if (avail && r->bytes > avail / 2) {
        fprintf(stderr,
                "%s: the buffers need %.2f GiB of RAM and %.2f GiB are available: lower "
                "--batch\n",
                PROG, (double)r->bytes / (1ull << 30), (double)avail / (1ull << 30));
        return -1;
    }
    r->base = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->base == MAP_FAILED) {
        r->base = NULL;
        return fail("buffers", -errno);
    }
    if (huge) /* as the engine's host pool (host_pool.c), best effort */
        madvise(r->base, r->bytes, MADV_HUGEPAGE);
    /* Random bytes, as fio writes: a disk that compresses or skips zeros would flatter us. */
    for (size_t i = 0; i + 8 <= r->bytes; i += 8) {
        uint64_t v = rng_next(&rng);

        memcpy(r->base + i, &v, 8);
    }
    return 0;
}

static void ring_destroy(struct ring *r)
{
    if (r->base)
        munmap(r->base, r->bytes);
    r->base = NULL;
}

static uint8_t *ring_page(const struct ring *r, uint64_t pos)
{
    return r->base + (size_t)(pos % r->pages) * r->slot_bytes;
}

/* ---- driving the store ---- */

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

struct inflight {
    uint64_t id;
    uint32_t pages;
    int *results;
};

/* Scratch for building one op's page list. */
struct op_scratch {
    uint8_t *keys;
    struct dstore_wpage *w;
    struct dstore_rpage *r;
};

static uint64_t page_at(const struct pump *p, uint64_t pos)
{
    return p->order ? p->order[pos] : pos;
}

static int pump_submit(const struct pump *p, uint64_t first, struct inflight *f,
                       struct op_scratch *sc)
{
    uint32_t n = (uint32_t)(p->n - first < p->batch ? p->n - first : p->batch);
    int rc;

    for (uint32_t i = 0; i < n; i++) {
        uint64_t page = page_at(p, first + i);
        uint8_t *buf = ring_page(p->ring, first + i), *key = sc->keys + i * DSTORE_KEY_BYTES;

        page_key(p->seed, page, key);
        if (p->write) {
            memcpy(buf, &page, sizeof(page)); /* every page differs, as fio scrambles */
            sc->w[i] = (struct dstore_wpage){.key = key, .buf = buf};
        } else {
            sc->r[i] = (struct dstore_rpage){.key = key, .buf = buf};
        }
    }
    f->pages = n;
    rc = p->write ? dstore_write(p->s, sc->w, n, f->results, &f->id)
                  : dstore_read(p->s, sc->r, n, f->results, &f->id, NULL);
    return rc ? fail(p->write ? "dstore_write" : "dstore_read", rc) : 0;
}

/* Wait for the oldest op; every page of it must have been stored or found. */
static int pump_collect(const struct pump *p, const struct inflight *f)
{
    struct dstore_done d;
    int rc = dstore_wait(p->s, f->id, &d);

    if (rc)
        return fail("dstore_wait", rc);
    if (d.ok == f->pages)
        return 0;
    for (uint32_t i = 0; i < f->pages; i++)
        if (f->results[i])
            return fail(p->write ? "a page write" : "a page read", f->results[i]);
    return fail("an op", -EIO);
}

static int scratch_alloc(struct op_scratch *sc, uint32_t batch)
{
    sc->keys = malloc((size_t)batch * DSTORE_KEY_BYTES);
    sc->w = malloc((size_t)batch * sizeof(*sc->w));
    sc->r = malloc((size_t)batch * sizeof(*sc->r));
    return sc->keys && sc->w && sc->r ? 0 : fail("op scratch", -ENOMEM);
}

static void scratch_free(struct op_scratch *sc)
{
    free(sc->keys);
    free(sc->w);
    free(sc->r);
}

/* Submit and collect until every page has moved; *seconds from the first submit to the last
 * collection. After an error the ops still in flight are waited for (their buffers and
 * results are ours) and -1 is returned. */
static int pump_run(const struct pump *p, double *seconds)
{
    struct inflight *f = calloc(p->window, sizeof(*f));
    int *results = malloc((size_t)p->window * p->batch * sizeof(*results));
    struct op_scratch sc = {0};
    uint64_t next = 0;
    size_t head = 0, live = 0;
    int rc = f && results ? scratch_alloc(&sc, p->batch) : fail("ops", -ENOMEM);
    double t0 = cli_now();

    while (!rc && (next < p->n || live)) {
        if (next < p->n && live < p->window) {
            struct inflight *slot = &f[(head + live) % p->window];

            slot->results = results + (size_t)((head + live) % p->window) * p->batch;
            if (!(rc = pump_submit(p, next, slot, &sc))) {
                next += slot->pages;
                live++;
            }
        } else {
            rc = pump_collect(p, &f[head]);
            head = (head + 1) % p->window;
            live--;
        }
    }
    *seconds = cli_now() - t0;
    for (; live; live--, head = (head + 1) % p->window)
        dstore_wait(p->s, f[head].id, NULL);
    scratch_free(&sc);
    free(results);
    free(f);
    return rc;
}

static void store_options(struct dstore_options *o, const char *dir, uint32_t page_bytes)
{
    dstore_options_init(o, sizeof(*o));
    o->dir = dir;
    o->page_bytes = page_bytes;
    o->page_tokens = PAGE_TOKENS;
    memcpy(o->fingerprint, PROG,
           sizeof(PROG) < DSTORE_FINGERPRINT_BYTES ? sizeof(PROG) : DSTORE_FINGERPRINT_BYTES);
}

/* Reads go in READ_OPS ops of half the queue depth each, round robin over twice the queue
 * depth's buffers: enough queued to keep queue_depth I/Os in the kernel while the oldest
 * op is collected, and a footprint near fio's (iodepth buffers of a block each). The
 * footprint matters, not only the buffers' pages: on this machine's virtual disk, random
 * 256 KiB reads into a round robin of 133 MB of buffers ran at 2.7 GB/s, into 8 MiB at 3.8
 * (a bare io_uring reader, the same file and offsets). */
#define READ_OPS 4

static uint32_t read_batch(uint32_t qd)
{
    return qd < 2 ? 1 : qd / 2;
}

/* A random order of n pages (Fisher-Yates), or the order they were written in. */
static uint32_t *read_order(const struct config *cfg, uint64_t n)
{
    uint32_t *o = malloc((size_t)n * sizeof(*o));
    uint64_t rng = cfg->seed;

    if (!o)
        return NULL;
    for (uint64_t i = 0; i < n; i++)
        o[i] = (uint32_t)i;
    for (uint64_t i = n; cfg->order == ORDER_RANDOM && i > 1; i--) {
        uint64_t j = rng_below(&rng, i);
        uint32_t t = o[i - 1];

        o[i - 1] = o[j];
        o[j] = t;
    }
    return o;
}

/* The counters must show exactly what was asked: every page once, no error of any kind. */
static int check_counters(const struct dstore_stats *st, uint64_t writes, uint64_t reads)
{
    uint64_t errors = st->err_checksum + st->err_record + st->err_bounds + st->err_read_io +
                      st->err_write_io + st->err_nospc + st->err_sync + st->err_index;

    if (st->writes == writes && st->write_dups == 0 && st->read_hits == reads &&
        st->bytes_written == writes * st->page_bytes && st->bytes_read == reads * st->page_bytes &&
        errors == 0 && st->evicted == 0)
        return 0;
    fprintf(stderr,
            "%s: the store's counters disagree: %" PRIu64 " writes (%" PRIu64 " wanted), %" PRIu64
            " read hits (%" PRIu64 " wanted), %" PRIu64 " errors, %" PRIu64 " evicted\n",
            PROG, st->writes, writes, st->read_hits, reads, errors, st->evicted);
    return -1;
}

/* The warm-up page: creates and preallocates the slab outside the timing. */
static int warm_up(struct dstore *s, const struct ring *ring, uint64_t seed, uint64_t page)
{
    uint8_t key[DSTORE_KEY_BYTES];
    struct dstore_wpage w = {.key = key, .buf = ring_page(ring, 0)};
    int res = 0, rc;

    page_key(seed, page, key);
    rc = dstore_put(s, &w, 1, &res);
    return rc || res ? fail("warm-up write", rc ? rc : res) : 0;
}

static int store_phases(const struct bench *b, struct point *pt, struct dstore *s,
                        const struct ring *ring, const uint32_t *order, double t[2])
{
    const struct config *cfg = b->cfg;
    struct pump w = {.s = s,
                     .ring = ring,
                     .write = true,
                     .seed = cfg->seed,
                     .n = pt->pages,
                     .batch = (uint32_t)cfg->batch,
                     .window = 2};
    struct pump r = w;
    struct ring rring = *ring;
    struct dstore_stats st;
    int rc;

    r.write = false;
    r.order = order;
    r.batch = read_batch(pt->queue_depth);
    r.window = READ_OPS;
    rring.pages = (uint64_t)r.batch * READ_OPS; /* the ring's first pages */
    if (rring.pages > ring->pages)
        rring.pages = ring->pages;
    r.ring = &rring;
    if ((rc = dstore_wait_ready(s)))
        return fail("dstore_wait_ready", rc);
    if (warm_up(s, ring, cfg->seed, pt->pages))
        return -1;
    workdir_quiesce(b->wd.path);
    if (pump_run(&w, &t[0]) || pump_run(&r, &t[1]))
        return -1;
    dstore_stats(s, &st);
    pt->io = st.io;
    pt->direct = st.direct;
    pt->fixed_buffers = st.fixed_buffers;
    pt->fixed_ios = st.fixed_ios;
    return check_counters(&st, pt->pages + 1, pt->pages);
}

/* One rep of the store: a fresh dir, write, read, close, remove. */
static int store_rep(const struct bench *b, struct point *pt, const struct ring *ring,
                     const uint32_t *order, double t[2])
{
    struct dstore_options o;
    struct dstore *s;
    char dir[PATH_MAX];
    int rc;

    workdir_path(&b->wd, "store", dir, sizeof(dir));
    store_options(&o, dir, pt->page_bytes);
    o.disk_bytes = o.slab_bytes = (pt->pages + 1) * pt->slot_bytes; /* one slab, no eviction */
    o.io = b->cfg->io;
    o.sync = b->cfg->sync;
    o.queue_depth = pt->queue_depth;
    o.max_batch = (uint32_t)b->cfg->batch;
    o.register_base = ring->base;
    o.register_bytes = ring->bytes;
    if ((rc = dstore_open(&o, &s)))
        return open_fail(dir, rc);
    rc = store_phases(b, pt, s, ring, order, t);
    dstore_close(s);
    workdir_rm_tree(dir);
    return rc;
}

/* ---- fio ---- */

static void fio_setup(struct bench *b)
{
    struct fio_state *f = &b->fio;
    char log[PATH_MAX];
    int rc;

    if (b->cfg->no_fio) {
        fio_note(f, "--no-fio: no comparison with fio");
        return;
    }
    if (!fio_find_program(b->cfg->fio, f->path, sizeof(f->path))) {
        fio_note(f, "fio not found (%s); install fio: apt-get install fio. No comparison with fio",
                 b->cfg->fio);
        return;
    }
    workdir_path(&b->wd, "fio-version.log", log, sizeof(log));
    if ((rc = fio_version(f->path, log, f->version, sizeof(f->version))) != 0) {
        fio_note(f, "%s --version failed (%d); no comparison with fio", f->path, rc);
        return;
    }
    f->usable = true;
}

/* Huge pages (hugetlb) free now, and their size; 0 when /proc/meminfo does not say. */
static uint64_t hugetlb_free(uint64_t *page_bytes)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    uint64_t n = 0, kb = 0;

    while (f && fgets(line, sizeof(line), f)) {
        sscanf(line, "HugePages_Free: %" SCNu64, &n);
        sscanf(line, "Hugepagesize: %" SCNu64 " kB", &kb);
    }
    if (f)
        fclose(f);
    *page_bytes = kb * 1024;
    return kb ? n : 0;
}

/* The largest of a list. */
static uint64_t list_max(const struct cli_list *l)
{
    uint64_t m = 0;

    for (size_t i = 0; i < l->n; i++)
        m = l->v[i] > m ? l->v[i] : m;
    return m;
}

/* Which pages the buffers are of, the store's and fio's alike, so that the two are compared
 * like for like: this machine's virtio disk moves 256 KiB from huge pages at nearly twice
 * the speed it does from 4 KiB ones. The store's buffers get huge pages as the engine's host
 * pool does (MADV_HUGEPAGE); fio has no such option, only hugetlb pages (--iomem=shmhuge),
 * which must be reserved beforehand (vm.nr_hugepages). auto: huge pages when fio can have
 * them (or fio does not run), else 4 KiB pages for both. */
static int resolve_buffers(struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint64_t hp = 0, free_pages = hugetlb_free(&hp), need = 0;
    uint64_t per_job =
        (uint64_t)slot_of((uint32_t)list_max(&cfg->page_bytes)) * list_max(&cfg->queue_depth);

    b->buffers = cfg->buffers == BUF_4K ? BUF_4K : BUF_HUGE;
    if (!b->fio.usable || b->buffers == BUF_4K)
        return 0;
    /* fio's buffers: a block per queue slot and a page of alignment, in whole huge pages,
     * plus one for what the kernel rounds. */
    need = hp ? (per_job + 4096 + hp - 1) / hp + 1 : 0;
    if (hp && free_pages >= need)
        return 0;
    if (cfg->buffers == BUF_AUTO) {
        b->buffers = BUF_4K;
        return 0;
    }
    fprintf(stderr,
            "%s: --buffers huge: fio's buffers need %" PRIu64 " huge pages (hugetlb) and %" PRIu64
            " are free: reserve them (sysctl vm.nr_hugepages=%" PRIu64 ") or use --buffers 4k\n",
            PROG, need, free_pages, need);
    return -1;
}

/* ---- fio runs ---- */

/* One fio job of a point and where its output goes. */
struct bench_job {
    struct fio_job fio;
    char file[PATH_MAX], json[PATH_MAX], log[PATH_MAX];
    char rw[32];
};

/* Bytes a job of rw moves: a slot per page written, read_block per page read. */
static uint64_t job_bytes(const struct point *pt, const char *rw)
{
    return pt->pages * (strcmp(rw, "write") ? pt->read_block : pt->slot_bytes);
}

/* rw: write, read or randread; fdatasync: writes between syncs, 0 for none; when not 0 the
 * job also syncs at its end, after the last writes. Writes go a slot at a time, as the store
 * writes a page and its head; reads as the store reads a page: read_block at a time, one
 * I/O per page, over the same span of file (a slot per page). A sequential read skips what
 * the store skips (each slot's head block): fio's rw=read:SKIP. */
static void job_init(struct bench_job *j, const struct bench *b, const struct point *pt,
                     const char *rw, uint64_t fdatasync)
{
    bool read = strcmp(rw, "write") != 0;
    uint32_t skip = pt->slot_bytes - pt->read_block;

    workdir_path(&b->wd, "fio.data", j->file, sizeof(j->file));
    workdir_path(&b->wd, "fio.json", j->json, sizeof(j->json));
    workdir_path(&b->wd, "fio.log", j->log, sizeof(j->log));
    if (!strcmp(rw, "read") && skip)
        snprintf(j->rw, sizeof(j->rw), "read:%u", skip);
    else
        snprintf(j->rw, sizeof(j->rw), "%s", rw);
    fio_job_init(&j->fio,
                 &(struct fio_params){.fio = b->fio.path,
                                      .name = PROG,
                                      .file = j->file,
                                      .rw = j->rw,
                                      .direct = pt->direct,
                                      .fixed_buffers = pt->fixed_buffers,
                                      .huge_buffers = b->buffers == BUF_HUGE,
                                      .block_bytes = read ? pt->read_block : pt->slot_bytes,
                                      .iodepth = pt->queue_depth,
                                      .size = pt->pages * pt->slot_bytes,
                                      .io_size = read ? job_bytes(pt, rw) : 0,
                                      .fdatasync = fdatasync,
                                      .json = j->json});
}

/* Run a job that should move want bytes; its seconds for the point's pages (io_bytes /
 * bw_bytes). On failure the note says why and -1 comes back. */
static int fio_job_run(struct bench *b, struct bench_job *j, const char *dir, uint64_t want,
                       double *seconds)
{
    double io_bytes, bw;
    int rc = fio_spawn_wait(j->fio.argv, j->log);

    if (rc) {
        char line[256];

        fio_first_line(j->log, line, sizeof(line));
        fio_note(&b->fio, "fio exited %d (%s); comparison stopped", rc, line);
        return -1;
    }
    if (fio_read_report(j->json, dir, &io_bytes, &bw) || io_bytes != (double)want) {
        fio_note(&b->fio,
                 "fio's report (%s) lacks a %s bandwidth over the whole size; comparison stopped",
                 j->json, dir);
        return -1;
    }
    *seconds = io_bytes / bw;
    return 0;
}

static int fio_run(struct bench *b, const struct point *pt, const char *rw, uint64_t fdatasync,
                   double *seconds)
{
    struct bench_job j;
    const char *dir = strcmp(rw, "write") ? "read" : "write";

    job_init(&j, b, pt, rw, fdatasync);
    return fio_job_run(b, &j, dir, job_bytes(pt, rw), seconds);
}

/* One rep of fio: a fresh file written plainly; another written durably (an fdatasync per
 * store batch and one at the end), then read. Each write starts on a quiet disk, as the
 * store's does. t: plain write, durable write, read. */
static int fio_rep(struct bench *b, const struct point *pt, double t[3])
{
    const char *rd = b->cfg->order == ORDER_RANDOM ? "randread" : "read";
    char file[PATH_MAX];
    int rc;

    workdir_path(&b->wd, "fio.data", file, sizeof(file));
    unlink(file);
    workdir_quiesce(b->wd.path);
    rc = fio_run(b, pt, "write", 0, &t[0]);
    unlink(file);
    workdir_quiesce(b->wd.path);
    if (!rc)
        rc = fio_run(b, pt, "write", b->cfg->batch, &t[1]);
    if (!rc)
        rc = fio_run(b, pt, rd, 0, &t[2]);
    unlink(file);
    return rc;
}

/* ---- (a) throughput ---- */

struct samples {
    double *v[5]; /* store write, store read, fio write, fio synced write, fio read */
};

static int samples_alloc(struct samples *s, size_t reps)
{
    for (int k = 0; k < 5; k++)
        if (!(s->v[k] = calloc(reps, sizeof(double))))
            return fail("samples", -ENOMEM);
    return 0;
}

static void samples_free(struct samples *s)
{
    for (int k = 0; k < 5; k++)
        free(s->v[k]);
}

/* Reps alternate store and fio, so that drift in the disk hits both alike. */
static int point_reps(struct bench *b, struct point *pt, const struct ring *ring,
                      const uint32_t *order, struct samples *sm)
{
    size_t reps = b->cfg->reps;

    pt->fio_ran = b->fio.usable;
    for (size_t i = 0; i < reps; i++) {
        double st[2], ft[3];

        if (store_rep(b, pt, ring, order, st))
            return -1;
        sm->v[0][i] = st[0];
        sm->v[1][i] = st[1];
        if (pt->fio_ran && fio_rep(b, pt, ft) == 0) {
            for (int k = 0; k < 3; k++)
                sm->v[2 + k][i] = ft[k];
        } else {
            pt->fio_ran = false;
            b->fio.usable = false; /* the note says why; later points skip fio too */
        }
    }
    pt->write = cli_summarize(sm->v[0], reps);
    pt->read = cli_summarize(sm->v[1], reps);
    if (pt->fio_ran) {
        pt->fio_write = cli_summarize(sm->v[2], reps);
        pt->fio_sync = cli_summarize(sm->v[3], reps);
        pt->fio_read = cli_summarize(sm->v[4], reps);
    }
    return 0;
}

static uint64_t point_pages(const struct config *cfg, uint64_t page_bytes)
{
    uint64_t n = cfg->pages_set ? cfg->pages : cfg->bytes / page_bytes;

    return n ? n : 1;
}

static int run_point(struct bench *b, struct point *pt)
{
    const struct config *cfg = b->cfg;
    /* Writes keep two ops of a batch in flight; reads use the first pages (read_batch). */
    uint64_t rpages = (uint64_t)read_batch(pt->queue_depth) * READ_OPS;
    uint64_t ring_pages = 2 * cfg->batch > rpages ? 2 * cfg->batch : rpages;
    struct ring ring = {0};
    struct samples sm = {{0}};
    uint32_t *order = NULL;
    char what[96];
    int rc = -1;

    if (ring_pages > pt->pages + 1)
        ring_pages = pt->pages + 1; /* every position has its own buffer */
    snprintf(what, sizeof(what), "%u B pages, queue depth %u", pt->page_bytes, pt->queue_depth);
    progress("%s: throughput with %s\n", what);
    if (workdir_check_space(&b->wd, PROG,
                            (pt->pages + 1) * pt->slot_bytes + pt->pages * INDEX_BYTES_PER_PAGE,
                            "lower --bytes or --pages, or pick another --dir"))
        return -1;
    if (!(order = read_order(cfg, pt->pages)))
        rc = fail("read order", -ENOMEM);
    else if (!samples_alloc(&sm, cfg->reps) &&
             !ring_create(&ring, pt->slot_bytes, ring_pages, b->buffers == BUF_HUGE)) {
        pt->buffer_bytes = ring.bytes;
        pt->huge_bytes = huge_bytes_at(ring.base); /* touched by now: filled with random bytes */
        rc = point_reps(b, pt, &ring, order, &sm);
    }
    ring_destroy(&ring);
    samples_free(&sm);
    free(order);
    return rc;
}

static int run_throughput(struct bench *b)
{
    const struct config *cfg = b->cfg;

    if (!cfg->pages_set || cfg->pages) {
        b->npt = cfg->page_bytes.n * cfg->queue_depth.n;
        if (!(b->pt = calloc(b->npt, sizeof(*b->pt))))
            return fail("points", -ENOMEM);
    }
    for (size_t i = 0; i < b->npt; i++) {
        struct point *pt = &b->pt[i];

        pt->page_bytes = (uint32_t)cfg->page_bytes.v[i / cfg->queue_depth.n];
        pt->slot_bytes = slot_of(pt->page_bytes);
        pt->read_block = read_block_of(pt->page_bytes);
        pt->queue_depth = (uint32_t)cfg->queue_depth.v[i % cfg->queue_depth.n];
        pt->pages = point_pages(cfg, pt->page_bytes);
        if (run_point(b, pt))
            return -1;
    }
    return 0;
}

/* ---- (b) open ---- */

static void open_options(struct dstore_options *o, const char *dir, const struct config *cfg)
{
    store_options(o, dir, (uint32_t)cfg->open_page_bytes);
    o->disk_bytes = cfg->open_pages * slot_of((uint32_t)cfg->open_page_bytes);
    o->io = cfg->io;
}

/* Write open_pages pages in big batches; the time from open to close. */
static int open_build(struct bench *b, const char *dir)
{
    const struct config *cfg = b->cfg;
    struct dstore_options o;
    struct ring ring = {0};
    struct dstore *s = NULL;
    struct pump p = {.write = true, .seed = cfg->seed, .n = cfg->open_pages, .window = 2};
    struct dstore_stats st;
    double t0 = cli_now(), t;
    int rc;

    p.batch = cfg->open_pages < OPEN_BATCH ? (uint32_t)cfg->open_pages : OPEN_BATCH;
    if (ring_create(&ring, (uint32_t)cfg->open_page_bytes, 2ull * p.batch, true))
        return -1;
    open_options(&o, dir, cfg);
    o.max_batch = p.batch;
    o.register_base = ring.base;
    o.register_bytes = ring.bytes;
    if ((rc = dstore_open(&o, &s)))
        rc = open_fail(dir, rc);
    p.s = s;
    p.ring = &ring;
    if (!rc && (rc = dstore_wait_ready(s)))
        rc = fail("dstore_wait_ready (build)", rc);
    if (!rc && !(rc = pump_run(&p, &t))) {
        dstore_stats(s, &st);
        rc = check_counters(&st, cfg->open_pages, 0);
    }
    dstore_close(s);
    b->open.build = cli_now() - t0;
    ring_destroy(&ring);
    return rc;
}

/* The 64 keys asked for: spread over the pages, as a request's prefix would not be. */
static void open_keys(const struct config *cfg, uint8_t *keys, uint64_t nkeys)
{
    for (uint64_t i = 0; i < nkeys; i++)
        page_key(cfg->seed, i * (cfg->open_pages / nkeys), keys + i * DSTORE_KEY_BYTES);
}

/* Poll leading_run until it finds every key; it should at once (reads do not wait for the
 * rebuild), but if not, the time it took is the figure. */
static int serve_keys(struct dstore *s, const uint8_t *keys, uint64_t nkeys)
{
    size_t run = 0;
    int rc;

    for (int tries = 0; tries < 100000; tries++) {
        if ((rc = dstore_leading_run(s, keys, nkeys, &run)))
            return fail("dstore_leading_run", rc);
        if (run == nkeys)
            return 0;
        usleep(100);
    }
    fprintf(stderr, "%s: leading_run found %zu of %" PRIu64 " keys\n", PROG, run, nkeys);
    return -1;
}

static int read_one(struct dstore *s, const uint8_t *key, void *buf)
{
    struct dstore_rpage r = {.key = key, .buf = buf};
    int res = 0, rc = dstore_get(s, &r, 1, &res);

    return rc || res ? fail("first read", rc ? rc : res) : 0;
}

/* One open, timed: t = open, serve, first read, ready (seconds from before dstore_open). */
static int open_once(const struct bench *b, const char *dir, const uint8_t *keys, void *buf,
                     bool cold, double t[4])
{
    struct dstore_options o;
    struct dstore *s;
    double t0;
    int rc;

    open_options(&o, dir, b->cfg);
    if (cold)
        workdir_drop_cache(dir);
    t0 = cli_now();
    if ((rc = dstore_open(&o, &s)))
        return open_fail(dir, rc);
    t[0] = cli_now() - t0;
    rc = serve_keys(s, keys, b->open.keys);
    t[1] = cli_now() - t0;
    if (!rc)
        rc = read_one(s, keys, buf);
    t[2] = cli_now() - t0;
    if (!rc && (rc = dstore_wait_ready(s)))
        rc = fail("dstore_wait_ready", rc);
    t[3] = cli_now() - t0;
    dstore_close(s);
    return rc;
}

/* reps opens of each kind, cold then warm; t[kind][figure][rep]. */
static int open_reps(struct bench *b, const char *dir, double *t)
{
    size_t reps = b->cfg->open_reps;
    uint8_t keys[OPEN_KEYS * DSTORE_KEY_BYTES];
    void *buf = NULL;
    int rc =
        posix_memalign(&buf, SLOT_ALIGN, b->cfg->open_page_bytes) ? fail("buffer", -ENOMEM) : 0;

    open_keys(b->cfg, keys, b->open.keys);
    for (size_t i = 0; i < reps && !rc; i++) {
        for (int cold = 1; cold >= 0 && !rc; cold--) {
            double one[4];

            rc = open_once(b, dir, keys, buf, cold, one);
            for (int k = 0; k < 4; k++)
                t[((size_t)(1 - cold) * 4 + k) * reps + i] = one[k];
        }
    }
    free(buf);
    return rc;
}

static int run_open(struct bench *b)
{
    const struct config *cfg = b->cfg;
    size_t reps = cfg->open_reps;
    double *t;
    char dir[PATH_MAX];
    int rc;

    if (!cfg->open_pages)
        return 0;
    b->open.pages = cfg->open_pages;
    b->open.keys = cfg->open_pages < OPEN_KEYS ? cfg->open_pages : OPEN_KEYS;
    if (workdir_check_space(&b->wd, PROG,
                            cfg->open_pages *
                                (slot_of((uint32_t)cfg->open_page_bytes) + INDEX_BYTES_PER_PAGE),
                            "lower --open-pages, or pick another --dir"))
        return -1;
    workdir_path(&b->wd, "open", dir, sizeof(dir));
    progress("%s: building the open test's dir in %s\n", dir);
    if (open_build(b, dir))
        return -1;
    if (!(t = calloc(8 * reps, sizeof(*t))))
        return fail("samples", -ENOMEM);
    progress("%s: timing opens of %s\n", dir);
    if (!(rc = open_reps(b, dir, t))) {
        for (int kind = 0; kind < 2; kind++) {
            double *k = t + (size_t)kind * 4 * reps;

            b->open.open[kind] = cli_summarize(k, reps);
            b->open.serve[kind] = cli_summarize(k + reps, reps);
            b->open.first_read[kind] = cli_summarize(k + 2 * reps, reps);
            b->open.ready[kind] = cli_summarize(k + 3 * reps, reps);
        }
        b->open_ran = true;
    }
    free(t);
    return rc;
}

/* ---- report: text ---- */

static const char *io_name(uint32_t io)
{
    return io == DSTORE_IO_URING ? "io_uring" : io == DSTORE_IO_PSYNC ? "psync" : "?";
}

static void print_text_head(const struct bench *b)
{
    const struct config *cfg = b->cfg;

    printf("%s: work dir %s (%s)%s\n", PROG, b->wd.path, b->wd.fs,
           cfg->keep ? ", kept" : ", removed at the end");
    if (b->fio.usable || b->fio.version[0])
        printf("  fio: %s (%s)\n", b->fio.path, b->fio.version);
    if (b->fio.note[0])
        printf("  note: %s\n", b->fio.note);
}

static void print_store_how(const struct bench *b, const struct point *pt)
{
    printf("  store: %s, %s, %s, %.0f%% of them on huge pages", io_name(pt->io),
           pt->direct ? "O_DIRECT" : "buffered",
           pt->fixed_buffers ? "registered buffers" : "plain buffers",
           pt->buffer_bytes ? 100.0 * (double)pt->huge_bytes / (double)pt->buffer_bytes : 0.0);
    if (pt->fio_ran)
        printf(" (fio's: %s)", b->buffers == BUF_HUGE ? "huge pages, hugetlb" : "4 KiB pages");
    printf("\n");
}

static void print_fio_lines(const struct bench *b, const struct point *pt)
{
    const char *rd = b->cfg->order == ORDER_RANDOM ? "randread" : "read";
    const char *rw[3] = {"write", "write", rd};
    const uint64_t sync[3] = {b->cfg->batch, 0, 0};

    for (int k = 0; k < 3; k++) {
        struct bench_job j;

        job_init(&j, b, pt, rw[k], sync[k]);
        printf("    $");
        for (int i = 0; j.fio.argv[i]; i++)
            printf(" %s", j.fio.argv[i]);
        printf("\n");
    }
}

/* One row: the store's figure, fio's (when it ran: GB/s of the fbytes its job moved), their
 * ratio and the target when judged. */
static void print_row(const char *name, const struct point *pt, const struct cli_timing *st,
                      const struct cli_timing *fio, uint64_t fbytes, bool judged)
{
    uint64_t bytes = pt->pages * pt->page_bytes;
    double r = cli_ratio(fio->median, st->median);

    printf("  %-24s %7.3f (%7.3f) %9.0f", name, cli_gbps(bytes, st->median),
           cli_gbps(bytes, st->best), cli_ratio((double)pt->pages, st->median));
    if (pt->fio_ran)
        printf("   %7.3f (%7.3f) %7.3f", cli_gbps(fbytes, fio->median), cli_gbps(fbytes, fio->best),
               r);
    if (pt->fio_ran && judged)
        printf("   >= %.2f %s", TARGET_RATIO, cli_met(r >= TARGET_RATIO));
    printf("\n");
}

static void print_text_point(const struct bench *b, const struct point *pt)
{
    uint64_t wbytes = job_bytes(pt, "write"), rbytes = job_bytes(pt, "randread");
    char sync[64];

    printf("\npage ");
    cli_print_size(pt->page_bytes);
    printf(" (slot %u B), queue depth %u: %" PRIu64 " pages, ", pt->slot_bytes, pt->queue_depth,
           pt->pages);
    cli_print_size(pt->pages * pt->page_bytes);
    printf(" a run; median (best) of %" PRIu64 " runs\n", b->cfg->reps);
    print_store_how(b, pt);
    printf("  %-24s %-17s %9s", "", "store GB/s", "pages/s");
    if (pt->fio_ran)
        printf("   %-17s %7s   %s", "fio GB/s", "ratio", "target");
    printf("\n");
    /* Like with like: a durable store against fio's durable write, a relaxed one (no sync
     * per batch) against its plain write; the other ratio is printed, not judged. */
    if (b->cfg->sync == DSTORE_SYNC_RELAXED) {
        print_row("write (relaxed)", pt, &pt->write, &pt->fio_write, wbytes, true);
        snprintf(sync, sizeof(sync), "  vs fio durable write");
        if (pt->fio_ran)
            print_row(sync, pt, &pt->write, &pt->fio_sync, wbytes, false);
    } else {
        print_row("write (durable)", pt, &pt->write, &pt->fio_sync, wbytes, true);
        snprintf(sync, sizeof(sync), "  vs fio plain write");
        if (pt->fio_ran)
            print_row(sync, pt, &pt->write, &pt->fio_write, wbytes, false);
    }
    print_row(b->cfg->order == ORDER_RANDOM ? "read (random order)" : "read (written order)", pt,
              &pt->read, &pt->fio_read, rbytes, true);
    if (pt->fio_ran) {
        printf("  fio, each run (durable write, plain write, read; syncfs before each write):\n");
        print_fio_lines(b, pt);
    }
}

static void print_open_row(const char *name, const struct open_result *o, int kind)
{
    printf("  %-5s %8.2f (%8.2f) %8.2f (%8.2f) %8.2f (%8.2f) %9.1f (%9.1f)\n", name,
           o->open[kind].median * 1e3, o->open[kind].worst * 1e3, o->serve[kind].median * 1e3,
           o->serve[kind].worst * 1e3, o->first_read[kind].median * 1e3,
           o->first_read[kind].worst * 1e3, o->ready[kind].median * 1e3,
           o->ready[kind].worst * 1e3);
}

static void print_text_open(const struct bench *b)
{
    const struct open_result *o = &b->open;

    printf("\nopen: %" PRIu64 " pages of %" PRIu64 " bytes, built in %.2f s (%.0f pages/s); "
           "ms from dstore_open, median (worst) of %" PRIu64 "\n",
           o->pages, b->cfg->open_page_bytes, o->build,
           o->build > 0 ? (double)o->pages / o->build : 0.0, b->cfg->open_reps);
    printf("  %-5s %-19s %-19s %-19s %-21s\n", "", "open returned", "serve (64 keys)",
           "+ one page read", "ready (rebuild done)");
    print_open_row("cold", o, 0);
    print_open_row("warm", o, 1);
    printf("  serve <= %.0f ms: cold %s, warm %s\n", TARGET_SERVE_S * 1e3,
           cli_met(o->serve[0].median <= TARGET_SERVE_S),
           cli_met(o->serve[1].median <= TARGET_SERVE_S));
}

/* ---- report: JSON ---- */

static void print_json_fio(struct jw *w, const struct bench *b, const struct point *pt)
{
    uint64_t fbytes = pt->pages * pt->slot_bytes;

    if (!pt->fio_ran) {
        jw_null(w, "fio");
        jw_null(w, "ratio");
        return;
    }
    jw_object(w, "fio");
    jw_u64(w, "bytes", fbytes);
    /* What the read moved: read_block a page (the timings' GB/s all count bytes, the file). */
    jw_u64(w, "read_block_bytes", pt->read_block);
    jw_u64(w, "read_bytes", job_bytes(pt, "randread"));
    jw_u64(w, "fdatasync_every", b->cfg->batch);
    rpt_json_timing(w, "write", &pt->fio_write, fbytes, true);
    rpt_json_timing(w, "write_fdatasync", &pt->fio_sync, fbytes, true);
    rpt_json_timing(w, "read", &pt->fio_read, fbytes, true);
    jw_end(w);
    jw_object(w, "ratio");
    jw_double(w, "write", "%.6g", cli_ratio(pt->fio_write.median, pt->write.median));
    jw_double(w, "write_vs_fdatasync", "%.6g", cli_ratio(pt->fio_sync.median, pt->write.median));
    jw_double(w, "read", "%.6g", cli_ratio(pt->fio_read.median, pt->read.median));
    /* The target judges write_vs_fdatasync (durable against durable) or, for a relaxed store,
     * write (no sync against none), and read. */
    jw_array(w, "judged");
    jw_string(w, NULL, b->cfg->sync == DSTORE_SYNC_RELAXED ? "write" : "write_vs_fdatasync");
    jw_string(w, NULL, "read");
    jw_end(w);
    jw_end(w);
}

static void print_json_point(struct jw *w, const struct bench *b, const struct point *pt)
{
    uint64_t bytes = pt->pages * pt->page_bytes;

    jw_object(w, NULL);
    jw_u64(w, "page_bytes", pt->page_bytes);
    jw_u64(w, "slot_bytes", pt->slot_bytes);
    jw_u64(w, "queue_depth", pt->queue_depth);
    jw_u64(w, "pages", pt->pages);
    jw_u64(w, "bytes", bytes);
    jw_object(w, "store");
    jw_string(w, "io", io_name(pt->io));
    jw_bool(w, "direct", pt->direct);
    jw_bool(w, "fixed_buffers", pt->fixed_buffers);
    jw_u64(w, "fixed_ios", pt->fixed_ios);
    jw_u64(w, "buffer_bytes", pt->buffer_bytes);
    jw_u64(w, "huge_page_bytes", pt->huge_bytes);
    rpt_json_timing(w, "write", &pt->write, bytes, true);
    rpt_json_timing(w, "read", &pt->read, bytes, true);
    jw_double(w, "write_pages_per_s", "%.6g", cli_ratio((double)pt->pages, pt->write.median));
    jw_double(w, "read_pages_per_s", "%.6g", cli_ratio((double)pt->pages, pt->read.median));
    jw_end(w);
    print_json_fio(w, b, pt);
    jw_double(w, "target_ratio", "%.2f", TARGET_RATIO);
    jw_end(w);
}

static void print_json_config(struct jw *w, const struct bench *b)
{
    const struct config *cfg = b->cfg;

    jw_object(w, "config");
    jw_string(w, "work_dir", b->wd.path);
    jw_string(w, "fs", b->wd.fs);
    jw_bool(w, "keep", cfg->keep);
    jw_u64(w, "reps", cfg->reps);
    jw_u64(w, "batch", cfg->batch);
    jw_string(w, "read_order", order_names[cfg->order]);
    jw_string(w, "io", io_names[cfg->io]);
    jw_string(w, "disk_sync", sync_names[cfg->sync]);
    jw_string(w, "buffers", buffer_names[b->buffers]);
    jw_u64(w, "seed", cfg->seed);
    jw_u64(w, "page_tokens", PAGE_TOKENS);
    jw_string(w, "fio", b->fio.version[0] ? b->fio.version : NULL);
    jw_string(w, "fio_note", b->fio.note[0] ? b->fio.note : NULL);
    jw_end(w);
}

static void print_json_open_kind(struct jw *w, const char *name, const struct open_result *o,
                                 int kind)
{
    jw_object(w, name);
    rpt_json_timing(w, "open", &o->open[kind], 0, true);
    rpt_json_timing(w, "serve", &o->serve[kind], 0, true);
    rpt_json_timing(w, "first_read", &o->first_read[kind], 0, true);
    rpt_json_timing(w, "ready", &o->ready[kind], 0, true);
    jw_end(w);
}

static void print_json_open(struct jw *w, const struct bench *b)
{
    const struct open_result *o = &b->open;

    if (!b->open_ran) {
        jw_null(w, "open");
        return;
    }
    jw_object(w, "open");
    jw_u64(w, "pages", o->pages);
    jw_u64(w, "page_bytes", b->cfg->open_page_bytes);
    jw_u64(w, "keys", o->keys);
    jw_u64(w, "reps", b->cfg->open_reps);
    jw_double(w, "build_s", "%.6g", o->build);
    jw_double(w, "build_pages_per_s", "%.6g", cli_ratio((double)o->pages, o->build));
    print_json_open_kind(w, "cold", o, 0);
    print_json_open_kind(w, "warm", o, 1);
    jw_double(w, "target_serve_s", "%.3f", TARGET_SERVE_S);
    jw_end(w);
}

static void print_report(const struct bench *b)
{
    struct jw w;

    if (!b->cfg->json) {
        print_text_head(b);
        for (size_t i = 0; i < b->npt; i++)
            print_text_point(b, &b->pt[i]);
        if (b->open_ran)
            print_text_open(b);
        return;
    }
    jw_init(&w);
    jw_object(&w, NULL);
    print_json_config(&w, b);
    jw_array(&w, "throughput");
    for (size_t i = 0; i < b->npt; i++)
        print_json_point(&w, b, &b->pt[i]);
    jw_end(&w);
    print_json_open(&w, b);
    jw_end(&w);
    putchar('\n');
}

/* ---- command line ---- */

#define MAX_PAGES (1ull << 31) /* positions are 32-bit in the read order */

/* --pages, given the whole config: also says that pages, not bytes, size the runs. */
static int parse_pages(void *cfg, const char *opt, const char *val)
{
    struct config *c = cfg;

    c->pages_set = true;
    return cli_parse_count(PROG, opt, val, 0, MAX_PAGES, false, &c->pages);
}

#define OFF(f) offsetof(struct config, f)
static const struct cli_option options[] = {
    {.kind = CLI_TEXT, .help = "\nThroughput:\n"},
    {"--page-bytes", CLI_SIZES, OFF(page_bytes), 512, 256ull << 20, .arg = "LIST",
     .help = "page sizes, comma separated, 512 B to 256M, suffixes K, M, G\n"
             "(default 2M: Llama-3-8B, 16 tokens a page); a multiple of\n"
             "4K keeps the store on O_DIRECT and equal to fio's block"},
    {"--queue-depth", CLI_COUNTS, OFF(queue_depth), 1, 4096, .arg = "LIST",
     .help = "I/Os in flight (the store's queue_depth, fio's iodepth),\n"
             "comma separated, 1 to 4096 (default " CLI_STR(DEFAULT_QUEUE_DEPTH) ")"},
    {"--bytes", CLI_SIZE, OFF(bytes), 1, 1ull << 44, .arg = "SIZE",
     .help = "bytes per run of each point (default 2G); pages = SIZE / page"},
    {"--pages", CLI_CUSTOM, .parse = parse_pages, .arg = "N",
     .help = "pages per run instead (0: skip the throughput part)"},
    {"--batch", CLI_COUNT, OFF(batch), 1, 65536, .arg = "N",
     .help = "pages per op and per commit batch (the store's max_batch;\n"
             "default " CLI_STR(DEFAULT_BATCH) ", the store's default); fio syncs every N writes"},
    {"--reps", CLI_COUNT, OFF(reps), 1, 100, .arg = "N",
     .help = "runs of each point, store and fio alternating; medians and\n"
             "bests are reported (default " CLI_STR(DEFAULT_REPS) ")"},
    {"--read-order", CLI_NAME, OFF(order), CLI_NAMES(order_names), .arg = "O",
     .help = "random (default; fio randread) or seq (the written order;\nfio read)"},
    {"--io", CLI_NAME, OFF(io), CLI_NAMES(io_names), .arg = "M",
     .help = "the store's I/O engine: auto, uring or psync (default auto)"},
    {"--buffers", CLI_NAME, OFF(buffers), CLI_NAMES(buffer_names), .arg = "B",
     .help = "the store's and fio's buffers alike: huge (huge pages: the\n"
             "store's as the engine's host pool asks, MADV_HUGEPAGE;\n"
             "fio's hugetlb pages, which must be reserved beforehand:\n"
             "sysctl vm.nr_hugepages), 4k (4 KiB pages both), or auto\n"
             "(default: huge when fio can have them, else 4k)"},
    {"--disk-sync", CLI_NAME, OFF(sync), CLI_NAMES(sync_names), .arg = "S",
     .help = "durable (default: an fdatasync per batch, judged against\n"
             "fio's durable write) or relaxed (no sync per batch, a flush\n"
             "every 256 MiB or second; judged against fio's plain write)"},
    {"--fio", CLI_STRING, OFF(fio), 1, .arg = "PATH",
     .help = "the fio to run (default: fio on PATH)"},
    {"--no-fio", CLI_FLAG, OFF(no_fio), .help = "do not run fio"},
    {.kind = CLI_TEXT, .help = "\nOpen:\n"},
    {"--open-pages", CLI_COUNT, OFF(open_pages), 0, 1ull << 30, .arg = "N",
     .help =
         "pages the open test's dir indexes (default " CLI_STR(DEFAULT_OPEN_PAGES) "; 0: skip)"},
    {"--open-page-bytes", CLI_SIZE, OFF(open_page_bytes), 512, 256ull << 20, .arg = "SIZE",
     .help = "the open test's page size (default 4K; 2K is the tiny\ngeometry's)"},
    {"--open-reps", CLI_COUNT, OFF(open_reps), 1, 100, .arg = "N",
     .help = "opens of each kind, cold and warm (default " CLI_STR(DEFAULT_OPEN_REPS) ")"},
    {.kind = CLI_TEXT, .help = "\nRemote (instead of (a) and (b)):\n"},
    {"--remote", CLI_STRING, OFF(remote), 1, .arg = "URL",
     .help = "the Redis store on this server or cluster (options.remote's\n"
             "form: redis://HOST:PORT, or a cluster's seeds\n"
             "redis://h1:p1,redis://h2:p2) against redis-benchmark:\n"
             "--page-bytes (its first), --pages or --bytes (default\n"
             "256 MiB), --batch, --reps, --seed apply; rediss:// over TLS\n"
             "(redis-benchmark over TLS too)"},
    {"--remote-tls-ca", CLI_STRING, OFF(remote_tls_ca), 1, .arg = "FILE",
     .help = "rediss://: the PEM CA certificates to check the server's\n"
             "against, for the store and redis-benchmark (default: the\n"
             "system's)"},
    {"--redis-benchmark", CLI_STRING, OFF(redis_benchmark), 1, .arg = "PATH",
     .help = "the redis-benchmark program (default: redis-benchmark on PATH)"},
    {"--remote-restart", CLI_COUNTS, OFF(down_ms), 1, 600000, .arg = "MS,...",
     .help = "the Redis store's recovery on a redis-server of its own,\n"
             "killed and started again while ops run (r2), down this\n"
             "long, a rep each (e.g. 100,300,1000,3000); --page-bytes\n"
             "(its first; default 64 KiB here), --batch (at most 256;\n"
             "default 8 here), --reps apply"},
    {"--backoff-max-ms", CLI_COUNT, OFF(backoff_max_ms), 1, 60000, .arg = "MS",
     .help = "the store's longest wait between reconnects (default 1000,\nas kvt_open's)"},
    {"--redis-server", CLI_STRING, OFF(redis_server), 1, .arg = "PATH",
     .help = "the redis-server program (default: redis-server on PATH)"},
    {.kind = CLI_TEXT, .help = "\nCommon:\n"},
    {"--dir", CLI_STRING, OFF(parent), 1, .arg = "PATH",
     .help = "where the work dir is made (default /tmp); the file system\nmeasured"},
    {"--keep", CLI_FLAG, OFF(keep), .help = "keep the work dir"},
    {"--seed", CLI_COUNT, OFF(seed), 0, UINT64_MAX, .arg = "N",
     .help = "seeds the keys and the read order (default 1)"},
    {"--json", CLI_FLAG, OFF(json), .help = "one JSON object on stdout instead of the text report"},
    {"--help", CLI_HELP, .help = "print this and exit"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "\n"
            "Measure kvtier's disk block store and print figures (a benchmark: timing never\n"
            "fails a run). Everything is written in a fresh dir made under --dir and removed\n"
            "at the end (--keep keeps the open test's dir and fio's last report).\n"
            "\n"
            "(a) Throughput, for each page size x queue depth: pages written with\n"
            "    dstore_write (ops of --batch pages = one commit batch each: I/O, one\n"
            "    fdatasync, one LMDB transaction; two ops in flight) into a fresh data dir,\n"
            "    then read back with dstore_read (ops of --batch pages, enough in flight for\n"
            "    queue-depth I/Os), from page-aligned buffers registered with io_uring. In the\n"
            "    same run, rep by rep, fio on a file in the same dir, as many I/Os as the store\n"
            "    has pages, iodepth = the queue depth:\n"
            "      fio --name=%s --filename=DIR/fio.data --ioengine=io_uring --direct=1\n"
            "          --fixedbufs=1 [--iomem=shmhuge] --fallocate=native --bs=BS\n"
            "          --iodepth=QD --rw=RW\n"
            "          --size=PAGES*SLOT [--io_size=PAGES*BS] --fdatasync=K [--end_fsync=1]\n"
            "          --output=DIR/fio.json --output-format=json\n"
            "    SLOT is what a page takes in the store's slab: its whole 4 KiB blocks, then a\n"
            "    block with the rest of it and its head (4 KiB pages: 8 KiB; 2 MiB: 2 MiB +\n"
            "    4 KiB). Writes, BS=SLOT (the store writes the page and its head): RW=write\n"
            "    K=--batch and --end_fsync=1 (durable: an fdatasync per store batch and one\n"
            "    after the last writes, as the store syncs every batch before its op\n"
            "    completes), and RW=write K=0 (plain: nothing synced, the bytes may still sit\n"
            "    in the disk's write cache). The read, on the durable file, is the store's:\n"
            "    BS = the bytes the store reads a page with (a page of whole blocks alone, its\n"
            "    head block skipped: 4 KiB for 4 KiB pages, 2 MiB for 2 MiB; else the whole\n"
            "    slot, which the store reads as two adjacent I/Os), PAGES I/Os over the same\n"
            "    PAGES*SLOT bytes of file: RW=randread (random offsets, each read once), or\n"
            "    with --read-order seq RW=read:SKIP (SLOT-BS skipped after each read, the\n"
            "    store's stride). --direct and --fixedbufs follow what the store got (O_DIRECT\n"
            "    on both sides: no page cache; the store's index is its own cost); the\n"
            "    buffers are of the same pages on both sides (--buffers: huge pages, fio's\n"
            "    hugetlb ones, or 4 KiB pages), and the report says which. Every\n"
            "    timed write, the store's and fio's, starts after a syncfs of the work dir, so\n"
            "    none pays for the write cache or discards an earlier one left.\n"
            "    Ratio = fio's time / the store's for as many I/Os (store pages/s over fio\n"
            "    I/Os/s); target >= %.2f against the durable write and the read, like against\n"
            "    like. fio's GB/s are of the bytes its job moved (in the JSON every fio timing\n"
            "    counts fio.bytes, PAGES*SLOT; fio.read_bytes is what the read moved). The\n"
            "    ratio against the plain write is printed too (what durability costs on this\n"
            "    disk), not judged.\n"
            "    With --disk-sync relaxed the store syncs no batch (it flushes every 256 MiB\n"
            "    or second) and its write is judged against fio's plain write instead.\n"
            "    Without fio a note says so and (a) reports the store alone (install fio:\n"
            "    apt-get install fio).\n"
            "(b) Open: a data dir indexing --open-pages pages of --open-page-bytes is built\n"
            "    (timed), then opened --open-reps times cold (its files dropped from the\n"
            "    page cache) and warm: ms to dstore_open, to a dstore_leading_run finding\n"
            "    all of 64 known keys (ready to serve; target <= %.0f ms), to one page read,\n"
            "    and to dstore_wait_ready (the background rebuild done).\n"
            "    The issue's figure, ten million pages of the tiny geometry (2 KiB pages in\n"
            "    2,304-byte slots: 25 GiB of slabs and index; it asks for 31 GiB free):\n"
            "      %s --pages 0 --open-pages 10000000 --open-page-bytes 2K\n"
            "(r) --remote URL: the Redis store instead (a server or a cluster; it writes pages\n"
            "    under fingerprints of its own, with a 10-minute TTL): N pages written with\n"
            "    store_write in ops of --batch pages, all queued at once, then read back and\n"
            "    compared; in the same run, rep by rep, redis-benchmark -t set,get on the same\n"
            "    servers with the same value size, -P 16, a connection per master, N requests\n"
            "    over N/4 random keys. Ratio = store op/s / redis-benchmark op/s, SET against\n"
            "    write, GET against read; goal >= 0.8.\n"
            "(r2) --remote-restart MS,...: the Redis store's recovery. A redis-server of its own\n"
            "    on a free loopback port and one store on it (timeouts 1000 ms as kvt_open's);\n"
            "    ops run back to back (--batch pages written under new keys, then read back and\n"
            "    compared) while the server is killed, left down MS, and started again\n"
            "    empty. Reported per rep, in ms from its start: its PING, the store's first\n"
            "    whole write and first whole read, and the ops that failed from the kill on.\n"
            "    Bound: the reconnect backoff, 20 ms doubling to --backoff-max-ms.\n",
            PROG, PROG, TARGET_RATIO, TARGET_SERVE_S * 1e3, PROG);
    cli_print_options(f, options, CLI_COUNT_OF(options), 22);
    fprintf(f, "\n"
               "Exit status: 0 when the figures were measured (with or without fio), 1 on an\n"
               "error (a failed store op, no space, no memory), 2 on bad usage.\n");
}

static void config_defaults(struct config *cfg)
{
    *cfg = (struct config){.parent = "/tmp",
                           .fio = "fio",
                           .bytes = DEFAULT_BYTES,
                           .batch = DEFAULT_BATCH,
                           .reps = DEFAULT_REPS,
                           .seed = 1,
                           .open_pages = DEFAULT_OPEN_PAGES,
                           .open_page_bytes = DEFAULT_OPEN_PAGE_BYTES,
                           .open_reps = DEFAULT_OPEN_REPS,
                           .page_bytes = {.v = {DEFAULT_PAGE_BYTES}, .n = 1},
                           .queue_depth = {.v = {DEFAULT_QUEUE_DEPTH}, .n = 1}};
}

static void finish(struct bench *b)
{
    char path[PATH_MAX];

    if (!b->wd.path[0])
        return;
    if (b->cfg->keep) {
        workdir_path(&b->wd, "fio.data", path, sizeof(path)); /* never worth keeping */
        unlink(path);
    } else {
        workdir_rm_tree(b->wd.path);
    }
    free(b->pt);
}

/* --remote-restart: the Redis store's recovery after a restart (store_bench_restart.c). */
static int run_restart(const struct config *cfg)
{
#ifdef KVT_HAVE_REDIS
    struct workdir wd = {0};
    bool batch_set = cfg->batch != DEFAULT_BATCH;
    struct restart_bench_config rc = {
        .redis_server = cfg->redis_server ? cfg->redis_server : "redis-server",
        .page_bytes =
            cfg->page_bytes.v[0] != DEFAULT_PAGE_BYTES ? (uint32_t)cfg->page_bytes.v[0] : 65536,
        .batch = batch_set ? cfg->batch : 8,
        .reps = cfg->reps,
        .down_ms = cfg->down_ms.v,
        .n_down = cfg->down_ms.n,
        .backoff_max_ms = cfg->backoff_max_ms ? (uint32_t)cfg->backoff_max_ms : 1000,
        .json = cfg->json};
    int err;

    if (rc.batch > 256)
        return cli_bad_usage(PROG, "--remote-restart takes --batch up to 256", NULL);
    if (workdir_make(&wd, PROG, cfg->parent))
        return 1;
    rc.dir = wd.path;
    err = restart_bench_run(&rc);
    if (!cfg->keep)
        workdir_rm_tree(wd.path);
    return err;
#else
    (void)cfg;
    fprintf(stderr,
            "%s: --remote-restart: not built in (kvtier was built without the Redis store)\n",
            PROG);
    return 1;
#endif
}

/* --remote: the Redis store against redis-benchmark (store_bench_remote.c). */
static int run_remote(const struct config *cfg)
{
#ifdef KVT_HAVE_REDIS
    struct workdir wd = {0};
    uint64_t page = cfg->page_bytes.v[0];
    uint64_t bytes = cfg->bytes == DEFAULT_BYTES ? DEFAULT_REMOTE_BYTES : cfg->bytes;
    struct remote_bench_config rc = {.url = cfg->remote,
                                     .redis_benchmark = cfg->redis_benchmark ? cfg->redis_benchmark
                                                                             : "redis-benchmark",
                                     .page_bytes = (uint32_t)page,
                                     .pages = cfg->pages_set ? cfg->pages : bytes / page,
                                     .batch = cfg->batch,
                                     .reps = cfg->reps,
                                     .seed = cfg->seed,
                                     .json = cfg->json,
                                     .tls_ca = cfg->remote_tls_ca};
    bool tls = !strncmp(cfg->remote, "rediss://", 9);
    char log[PATH_MAX];
    int err;

    if ((!tls && strncmp(cfg->remote, "redis://", 8)) || rc.pages == 0)
        return cli_bad_usage(
            PROG, "--remote needs a redis:// URL (rediss:// for TLS) and at least one page",
            cfg->remote);
    if (cfg->remote_tls_ca && !tls)
        return cli_bad_usage(PROG, "--remote-tls-ca needs a rediss:// --remote", NULL);
    if (workdir_make(&wd, PROG, cfg->parent))
        return 1;
    workdir_path(&wd, "redis-benchmark.log", log, sizeof(log));
    rc.log = log;
    err = remote_bench_run(&rc);
    if (!cfg->keep)
        workdir_rm_tree(wd.path);
    return err;
#else
    (void)cfg;
    fprintf(stderr, "%s: --remote: not built in (kvtier was built without the Redis store)\n",
            PROG);
    return 1;
#endif
}

int main(int argc, char **argv)
{
    struct config cfg;
    struct bench b = {.cfg = &cfg};
    int rc;

    config_defaults(&cfg);
    if ((rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), &cfg, argc, argv, usage)))
        return rc < 0 ? 0 : rc;
    if (cfg.redis_benchmark && !cfg.remote)
        return cli_bad_usage(PROG, "--redis-benchmark goes with --remote", NULL);
    if (cfg.remote_tls_ca && !cfg.remote)
        return cli_bad_usage(PROG, "--remote-tls-ca goes with --remote", NULL);
    if ((cfg.backoff_max_ms || cfg.redis_server) && !cfg.down_ms.n)
        return cli_bad_usage(PROG, "--backoff-max-ms and --redis-server go with --remote-restart",
                             NULL);
    if (cfg.down_ms.n && cfg.remote)
        return cli_bad_usage(PROG, "--remote-restart runs a server of its own: no --remote", NULL);
    if (cfg.down_ms.n)
        return run_restart(&cfg);
    if (cfg.remote)
        return run_remote(&cfg);
    if (workdir_make(&b.wd, PROG, cfg.parent))
        return 1;
    fio_setup(&b);
    if (resolve_buffers(&b)) {
        finish(&b);
        return 1;
    }
    if (cfg.json && b.fio.note[0] && !cfg.no_fio)
        fprintf(stderr, "%s: note: %s\n", PROG, b.fio.note);
    rc = run_throughput(&b) || run_open(&b) ? 1 : 0;
    if (!rc)
        print_report(&b);
    finish(&b);
    return rc;
}
