#include "disk_engine_test.h"

/* ---- injected faults ---- */

#define N_POINTS 4 /* enum dstore_fault_point */

/* What the seam fails: per point an error and the percent of calls that get it. Read by the
 * store's threads, set by the test. */
struct fault_ctl {
    _Atomic int err[N_POINTS];
    _Atomic uint32_t pct[N_POINTS];
    _Atomic uint64_t calls[N_POINTS], hits[N_POINTS];
    _Atomic uint64_t seq;
    uint64_t seed;
};

static int inject(void *arg, enum dstore_fault_point point, uint32_t slab, uint32_t slot)
{
    struct fault_ctl *c = arg;

    (void)slab;
    (void)slot;
    if ((unsigned)point >= N_POINTS)
        return 0;
    atomic_fetch_add(&c->calls[point], 1);
    int err = atomic_load(&c->err[point]);
    uint32_t pct = atomic_load(&c->pct[point]);
    if (!err || (pct < 100 && rng_mix(c->seed + atomic_fetch_add(&c->seq, 1)) % 100 >= pct))
        return 0;
    atomic_fetch_add(&c->hits[point], 1);
    return err;
}

static void faults_off(struct fault_ctl *c)
{
    for (int p = 0; p < N_POINTS; p++)
        atomic_store(&c->err[p], 0);
}

/* Replace the engine's store by one on the same dir with the options disk_open gives, plus
 * the fault seam; right after kvt_open, with nothing in flight. */
void swap_store(kvt_engine *e, const struct dstore_faults *f)
{
    struct dstore_options so;

    struct kvt_store *s = NULL;

    REQUIRE(g_ctx, e->store != NULL && stats(e).disk_ops_in_flight == 0);
    engine_disk_options(e, &so);
    so.faults = f;
    EXPECT_RC(g_ctx, engine_swap_store(e, NULL), 0); /* the dir's lock goes with it */
    EXPECT_RC(g_ctx, store_disk_open(&so, &s), 0);
    EXPECT_RC(g_ctx, engine_swap_store(e, s), 0);
}

struct fault_case {
    const char *name;
    int point; /* enum dstore_fault_point; -1: every point but growth, at random */
    int err;
    uint32_t pct;
    uint32_t write_policy; /* enum kvt_disk_write */
    int prefill;           /* fill the disk without faults first (reads need it) */
};

static const char *const IO_NAME[] = {"auto", "uring", "psync"};

void run_family(kvt_engine *e, uint64_t fam, uint64_t seed, int n, int full_prompt, int insert,
                struct tally *t)
{
    uint64_t rng = seed;

    for (int i = 0; i < n; i++) {
        struct seq q;
        struct kvt_match m;
        gen_seq(fam, &rng, &q);
        size_t prompt = full_prompt || chance(&rng, 70) ? q.len : below(&rng, (uint32_t)q.len + 1);
        struct kvt_req r = run_req(e, &q, prompt, insert, &m);
        t->reqs++;
        t->protected_tokens += r.protected_len;
        t->loaded_tokens += r.loaded_len;
        t->disk_tokens += r.disk_len;
        t->matched_disk += m.disk_len;
        if (i % 8 == 7)
            check(e);
    }
}

/* seed is the case's own, drawn from base: the KVT_SEED that reruns it. */
static void fault_case(const struct fault_case *fc, uint32_t disk_io, uint64_t seed, uint64_t base)
{
    uint64_t fam1 = rng_mix(seed ^ 1), fam2 = rng_mix(seed ^ 2);
    struct fault_ctl ctl = {.seed = seed};
    struct dstore_faults faults = {.inject = inject, .arg = &ctl};
    struct kvt_options o;
    struct tally pre = {0}, a = {0}, b = {0}, after = {0};
    char dir[96];

    snprintf(g_ctx, sizeof(g_ctx), "faults %s io=%s seed=%" PRIu64 " (KVT_SEED=%" PRIu64 ")",
             fc->name, IO_NAME[disk_io], seed, base);
    make_data_dir(dir, sizeof(dir));
    disk_opts(&o, dir, FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    o.disk_write_policy = fc->write_policy;
    o.disk_io = disk_io;
    kvt_engine *e;
    if (fc->prefill) {
        e = open_ok(&o);
        run_family(e, fam1, seed ^ 11, 40, 0, 1, &pre);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
        struct kvt_stats st = stats(e);
        REQUIRE(g_ctx, st.disk_written_tokens > 0 && st.disk_errors == 0);
        kvt_close(e);
    }

    /* Faults on: the device and host serve, nothing bad comes back from the disk. */
    for (int p = 0; p < N_POINTS; p++) {
        int on = fc->point < 0 ? p != DSTORE_FAULT_GROW : p == fc->point;
        atomic_store(&ctl.err[p], on ? fc->err : 0);
        atomic_store(&ctl.pct[p], fc->pct);
    }
    e = open_ok(&o);
    swap_store(e, &faults);
    struct kvt_stats st0 = stats(e);
    run_family(e, fam1, seed ^ 12, 60, 0, 1, &a);
    /* Whether a request reads from disk depends on what the host tier evicted meanwhile
     * (transfer timing): a read fault case goes on until a read was failed (one that fails
     * a share of the calls may let the few reads of a busy machine's run all through). */
    for (uint64_t k = 0;
         fc->point == DSTORE_FAULT_READ && !atomic_load(&ctl.hits[DSTORE_FAULT_READ]) && k < 16;
         k++)
        run_family(e, fam1, seed ^ (20 + k), 60, 0, 1, &a);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    if (fc->point < 0) {
        /* At random: a restart in the middle reads back what the faults let through. */
        kvt_close(e);
        e = open_ok(&o);
        swap_store(e, &faults);
        st0 = stats(e);
        run_family(e, fam1, seed ^ 13, 60, 0, 1, &a);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
        check(e);
    }
    struct kvt_stats st1 = stats(e);
    uint64_t hits = 0;
    for (int p = 0; p < N_POINTS; p++)
        hits += atomic_load(&ctl.hits[p]);
    printf("test_disk_engine: faults %s io=%s (%s): %" PRIu64 " injected; served %" PRIu64
           " tokens (%" PRIu64 " loaded from the host, %" PRIu64 " from disk, %" PRIu64
           " matched on disk); disk errors %" PRIu64 ", written %" PRIu64 ", read %" PRIu64
           ", cached %" PRIu64 " -> %" PRIu64 "\n",
           fc->name, IO_NAME[disk_io], IO_NAME[st1.disk_io], hits, a.protected_tokens,
           a.loaded_tokens, a.disk_tokens, a.matched_disk, st1.disk_errors, st1.disk_written_tokens,
           st1.disk_read_tokens, st0.disk_cached_tokens, st1.disk_cached_tokens);
    fflush(stdout);
    REQUIRE(g_ctx, hits > 0);
    REQUIRE(g_ctx, st1.disk_errors > st0.disk_errors);
    REQUIRE(g_ctx, st1.loaded_tokens > st0.loaded_tokens);       /* the host tier kept serving */
    REQUIRE(g_ctx, st1.match_hit_tokens > st0.match_hit_tokens); /* and the device */
    if (fc->point == DSTORE_FAULT_READ && fc->pct == 100) {
        REQUIRE(g_ctx, a.matched_disk > 0); /* reads were tried */
        REQUIRE(g_ctx, a.disk_tokens == 0 && st1.disk_read_tokens == st0.disk_read_tokens);
    }
    if (fc->point >= 0 && fc->point != DSTORE_FAULT_READ && fc->pct == 100)
        REQUIRE(g_ctx, st1.disk_cached_tokens <= st0.disk_cached_tokens); /* nothing new stored */

    /* Faults off: writes succeed again. */
    faults_off(&ctl);
    run_family(e, fam2, seed ^ 14, 40, 1, 1, &b);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    struct kvt_stats st2 = stats(e);
    REQUIRE(g_ctx, st2.disk_written_tokens > st1.disk_written_tokens);
    REQUIRE(g_ctx, st2.disk_cached_tokens > st1.disk_cached_tokens);
    kvt_close(e);

    /* A restart serves from disk what was written once the faults were gone; whatever the
     * faults let through is byte-exact. */
    e = open_ok(&o);
    struct recs recs = {0};
    struct disk_check dc = check_disk(e, &recs);
    free(recs.v);
    REQUIRE(g_ctx, dc.pages > 0);
    run_family(e, fam2, seed ^ 14, 40, 1, 0, &after);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    struct kvt_stats st3 = stats(e);
    REQUIRE(g_ctx, after.disk_tokens > 0);
    REQUIRE(g_ctx, st3.disk_errors == 0);
    run_family(e, fam1, seed ^ 15, 20, 0, 1, &after);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    REQUIRE(g_ctx, stats(e).disk_errors == 0);
    kvt_close(e);
    fixture_remove_tree(dir);
    g_ctx[0] = 0;
}

void test_faults(void **state)
{
    static const struct fault_case cases[] = {
        {"write-enospc", DSTORE_FAULT_WRITE, -ENOSPC, 100, KVT_DISK_WRITE_THROUGH, 1},
        {"write-enospc-on-evict", DSTORE_FAULT_WRITE, -ENOSPC, 100, KVT_DISK_WRITE_ON_EVICT, 1},
        {"write-eio", DSTORE_FAULT_WRITE, -EIO, 100, KVT_DISK_WRITE_THROUGH, 1},
        {"read-eio", DSTORE_FAULT_READ, -EIO, 100, KVT_DISK_WRITE_THROUGH, 1},
        {"sync-eio", DSTORE_FAULT_SYNC, -EIO, 100, KVT_DISK_WRITE_THROUGH, 1},
        {"grow-enospc", DSTORE_FAULT_GROW, -ENOSPC, 100, KVT_DISK_WRITE_THROUGH, 0},
        {"random-eio", -1, -EIO, 25, KVT_DISK_WRITE_THROUGH, 1},
        {"random-eio-on-evict", -1, -EIO, 25, KVT_DISK_WRITE_ON_EVICT, 1},
    };
    uint64_t seed = base_seed();

    (void)state;
    printf("test_disk_engine: faults: seed=%" PRIu64 " (KVT_SEED reruns it)\n", seed);
    /* With io_uring where the kernel gives it (auto), and with pread/pwrite threads. */
    for (uint32_t io = KVT_DISK_IO_AUTO; io <= KVT_DISK_IO_PSYNC; io += 2)
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
            fault_case(&cases[i], io, rng_mix(seed + i), seed);
}

/* Store pages of 4 pages (kvt_options.store_page_tokens) through the random faults and a
 * read fault: a failed store page fails all of its pages, and what the faults let through is
 * byte-exact (check_disk chains each record over its pages). Half the calls fail: a store
 * page is a quarter of the I/Os, and the run after the restart must still meet faults. */
void test_faults_grouped(void **state)
{
    static const struct fault_case cases[] = {
        {"grouped-read-eio", DSTORE_FAULT_READ, -EIO, 100, KVT_DISK_WRITE_THROUGH, 1},
        {"grouped-random-eio", -1, -EIO, 50, KVT_DISK_WRITE_THROUGH, 1},
        {"grouped-random-eio-on-evict", -1, -EIO, 50, KVT_DISK_WRITE_ON_EVICT, 1},
    };
    uint64_t seed = base_seed();

    (void)state;
    g_store_pages = MAX_STORE_PAGES;
    printf("test_disk_engine: faults, store pages of %d pages: seed=%" PRIu64
           " (KVT_SEED reruns it)\n",
           MAX_STORE_PAGES, seed);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        fault_case(&cases[i], KVT_DISK_IO_AUTO, rng_mix(seed + 100 + i), seed);
}
