/* kvtier-store-bench (b) open (store_bench.h): a data dir built, then opened cold and warm until
 * it serves. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "store_bench.h"

static void open_options(struct dstore_options *o, const char *dir, const struct config *cfg)
{
    sb_store_options(o, dir, (uint32_t)cfg->open_page_bytes);
    o->disk_bytes = cfg->open_pages * sb_slot_of((uint32_t)cfg->open_page_bytes);
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
    if (sb_ring_create(&ring, (uint32_t)cfg->open_page_bytes, 2ull * p.batch, true))
        return -1;
    open_options(&o, dir, cfg);
    o.max_batch = p.batch;
    o.register_base = ring.base;
    o.register_bytes = ring.bytes;
    if ((rc = dstore_open(&o, &s)))
        rc = sb_open_fail(dir, rc);
    p.s = s;
    p.ring = &ring;
    if (!rc && (rc = dstore_wait_ready(s)))
        rc = sb_fail("dstore_wait_ready (build)", rc);
    if (!rc && !(rc = sb_pump_run(&p, &t))) {
        dstore_stats(s, &st);
        rc = sb_check_counters(&st, cfg->open_pages, 0);
    }
    dstore_close(s);
    b->open.build = cli_now() - t0;
    sb_ring_destroy(&ring);
    return rc;
}

/* The 64 keys asked for: spread over the pages, as a request's prefix would not be. */
static void open_keys(const struct config *cfg, uint8_t *keys, uint64_t nkeys)
{
    for (uint64_t i = 0; i < nkeys; i++)
        sb_page_key(cfg->seed, i * (cfg->open_pages / nkeys), keys + i * DSTORE_KEY_BYTES);
}

/* Poll leading_run until it finds every key; it should at once (reads do not wait for the
 * rebuild), but if not, the time it took is the figure. */
static int serve_keys(struct dstore *s, const uint8_t *keys, uint64_t nkeys)
{
    size_t run = 0;
    int rc;

    for (int tries = 0; tries < 100000; tries++) {
        if ((rc = dstore_leading_run(s, keys, nkeys, &run)))
            return sb_fail("dstore_leading_run", rc);
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

    return rc || res ? sb_fail("first read", rc ? rc : res) : 0;
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
        return sb_open_fail(dir, rc);
    t[0] = cli_now() - t0;
    rc = serve_keys(s, keys, b->open.keys);
    t[1] = cli_now() - t0;
    if (!rc)
        rc = read_one(s, keys, buf);
    t[2] = cli_now() - t0;
    if (!rc && (rc = dstore_wait_ready(s)))
        rc = sb_fail("dstore_wait_ready", rc);
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
        posix_memalign(&buf, SLOT_ALIGN, b->cfg->open_page_bytes) ? sb_fail("buffer", -ENOMEM) : 0;

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

int sb_run_open(struct bench *b)
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
                                (sb_slot_of((uint32_t)cfg->open_page_bytes) + INDEX_BYTES_PER_PAGE),
                            "lower --open-pages, or pick another --dir"))
        return -1;
    workdir_path(&b->wd, "open", dir, sizeof(dir));
    sb_progress("%s: building the open test's dir in %s\n", dir);
    if (open_build(b, dir))
        return -1;
    if (!(t = calloc(8 * reps, sizeof(*t))))
        return sb_fail("samples", -ENOMEM);
    sb_progress("%s: timing opens of %s\n", dir);
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
