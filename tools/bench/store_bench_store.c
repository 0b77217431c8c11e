/* kvtier-store-bench's store side (store_bench.h): page-aligned buffers, ops pumped through the
 * store with a window in flight, and one rep of a point, write then read. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "store_bench.h"
#include "rng.h"
#include "datadir.h"
#include "host/host_pool.h"
#include "disk/layout.h"

/* ---- small helpers ---- */

int sb_fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, what, kvt_strerror(rc));
    return -1;
}

/* dstore_open failed on dir: the dir, and the entry of it of the wrong kind when there is one. */
int sb_open_fail(const char *dir, int rc)
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
void sb_progress(const char *fmt, const char *what)
{
    if (isatty(STDERR_FILENO))
        fprintf(stderr, fmt, PROG, what);
}

/* Page i's 32-byte key: four words no other page shares (the store dedups equal keys). */
void sb_page_key(uint64_t seed, uint64_t i, uint8_t *key)
{
    for (uint64_t w = 0; w < 4; w++) {
        uint64_t v = rng_mix64(seed * RNG_GAMMA + 4 * i + w);

        memcpy(key + 8 * w, &v, 8);
    }
}

/* Bytes a page takes in a slab: its blocks and its head's (disk/layout.h). */
uint32_t sb_slot_of(uint32_t page_bytes)
{
    struct slot_layout l;

    return layout_init(&l, page_bytes, PAGE_TOKENS, DSTORE_FORMAT_VERSION) ? 0 : l.slot_bytes;
}

/* Bytes the store reads a page with: its whole blocks alone when it has no tail (the tail
 * block then holds only the head, which reads skip), else the whole slot (the body and the
 * tail block, two adjacent I/Os). fio's read moves as much per I/O. */
uint32_t sb_read_block_of(uint32_t page_bytes)
{
    struct slot_layout l;

    if (layout_init(&l, page_bytes, PAGE_TOKENS, DSTORE_FORMAT_VERSION))
        return 0;
    return l.tail ? l.slot_bytes : l.body;
}

/* ---- buffers ---- */

/* Bytes of the mapping at base that huge pages back (/proc/self/smaps' AnonHugePages); 0
 * when it cannot be read. */
uint64_t sb_huge_bytes_at(const void *base)
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

int sb_ring_create(struct ring *r, uint32_t slot_bytes, uint64_t pages, bool huge)
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
        return sb_fail("buffers", -errno);
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

void sb_ring_destroy(struct ring *r)
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

        sb_page_key(p->seed, page, key);
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
    return rc ? sb_fail(p->write ? "dstore_write" : "dstore_read", rc) : 0;
}

/* Wait for the oldest op; every page of it must have been stored or found. */
static int pump_collect(const struct pump *p, const struct inflight *f)
{
    struct dstore_done d;
    int rc = dstore_wait(p->s, f->id, &d);

    if (rc)
        return sb_fail("dstore_wait", rc);
    if (d.ok == f->pages)
        return 0;
    for (uint32_t i = 0; i < f->pages; i++)
        if (f->results[i])
            return sb_fail(p->write ? "a page write" : "a page read", f->results[i]);
    return sb_fail("an op", -EIO);
}

static int scratch_alloc(struct op_scratch *sc, uint32_t batch)
{
    sc->keys = malloc((size_t)batch * DSTORE_KEY_BYTES);
    sc->w = malloc((size_t)batch * sizeof(*sc->w));
    sc->r = malloc((size_t)batch * sizeof(*sc->r));
    return sc->keys && sc->w && sc->r ? 0 : sb_fail("op scratch", -ENOMEM);
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
int sb_pump_run(const struct pump *p, double *seconds)
{
    struct inflight *f = calloc(p->window, sizeof(*f));
    int *results = malloc((size_t)p->window * p->batch * sizeof(*results));
    struct op_scratch sc = {0};
    uint64_t next = 0;
    size_t head = 0, live = 0;
    int rc = f && results ? scratch_alloc(&sc, p->batch) : sb_fail("ops", -ENOMEM);
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

void sb_store_options(struct dstore_options *o, const char *dir, uint32_t page_bytes)
{
    dstore_options_init(o, sizeof(*o));
    o->dir = dir;
    o->page_bytes = page_bytes;
    o->page_tokens = PAGE_TOKENS;
    memcpy(o->fingerprint, PROG,
           sizeof(PROG) < DSTORE_FINGERPRINT_BYTES ? sizeof(PROG) : DSTORE_FINGERPRINT_BYTES);
}

/* A random order of n pages (Fisher-Yates), or the order they were written in. */
uint32_t *sb_read_order(const struct config *cfg, uint64_t n)
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
int sb_check_counters(const struct dstore_stats *st, uint64_t writes, uint64_t reads)
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

    sb_page_key(seed, page, key);
    rc = dstore_put(s, &w, 1, &res);
    return rc || res ? sb_fail("warm-up write", rc ? rc : res) : 0;
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
        return sb_fail("dstore_wait_ready", rc);
    if (warm_up(s, ring, cfg->seed, pt->pages))
        return -1;
    workdir_quiesce(b->wd.path);
    if (sb_pump_run(&w, &t[0]) || sb_pump_run(&r, &t[1]))
        return -1;
    dstore_stats(s, &st);
    pt->io = st.io;
    pt->direct = st.direct;
    pt->fixed_buffers = st.fixed_buffers;
    pt->fixed_ios = st.fixed_ios;
    return sb_check_counters(&st, pt->pages + 1, pt->pages);
}

/* One rep of the store: a fresh dir, write, read, close, remove. */
int sb_store_rep(const struct bench *b, struct point *pt, const struct ring *ring,
                 const uint32_t *order, double t[2])
{
    struct dstore_options o;
    struct dstore *s;
    char dir[PATH_MAX];
    int rc;

    workdir_path(&b->wd, "store", dir, sizeof(dir));
    sb_store_options(&o, dir, pt->page_bytes);
    o.disk_bytes = o.slab_bytes = (pt->pages + 1) * pt->slot_bytes; /* one slab, no eviction */
    o.io = b->cfg->io;
    o.sync = b->cfg->sync;
    o.queue_depth = pt->queue_depth;
    o.max_batch = (uint32_t)b->cfg->batch;
    o.register_base = ring->base;
    o.register_bytes = ring->bytes;
    if ((rc = dstore_open(&o, &s)))
        return sb_open_fail(dir, rc);
    rc = store_phases(b, pt, s, ring, order, t);
    dstore_close(s);
    workdir_rm_tree(dir);
    return rc;
}
