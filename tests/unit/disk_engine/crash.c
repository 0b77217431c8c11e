#include "disk_engine_test.h"

/* ---- crashes ---- */

#define CRASH_HOST_TOKENS 256
/* 384 tokens (96 pages, or store pages of g_store_pages as many fewer): the family does not
 * fit. */
static uint64_t crash_disk_bytes(void)
{
    uint32_t g = g_store_pages;

    return 96 / g * fixture_disk_slot((uint64_t)LAYERS * 2 * ROW * PS * g, PS * g);
}
#define CRASH_PARENT_REQS 16
#define CRASH_MAX_DELAY_US 30000
#define CRASH_FRESH_EVERY 25 /* rounds: a fresh dir, the child killed at any moment */

/* Runs requests over family fam until killed; exits CHILD_FAILED when something is wrong. */
static void crash_child(const struct kvt_options *o, uint64_t fam, uint64_t seed, int ready_fd)
{
    uint64_t rng = seed;
    kvt_engine *e = NULL;

    harness_child_exit = CHILD_FAILED;
    EXPECT_RC(g_ctx, open_engine(o, &e), 0);
    if (write(ready_fd, "r", 1) != 1)
        FAIL(g_ctx, "write to the parent: %s", strerror(errno));
    close(ready_fd);
    for (uint64_t i = 1;; i++) {
        struct seq q;
        gen_seq(fam, &rng, &q);
        size_t prompt = chance(&rng, 70) ? q.len : below(&rng, (uint32_t)q.len + 1);
        run_req(e, &q, prompt, !chance(&rng, 10), NULL);
        if (chance(&rng, 4))
            EXPECT_RC(g_ctx, kvt_sync(e), 0);
        if (chance(&rng, 5))
            EXPECT_RC(g_ctx, kvt_evict(e, PS * (1 + below(&rng, 16)), NULL), 0);
        if (i % 16 == 0)
            check(e);
    }
}

static unsigned crash_rounds(void)
{
    const char *s = getenv("KVT_CRASH_ROUNDS");

    return s && *s ? (unsigned)strtoul(s, NULL, 0) : 200;
}

struct crash_totals {
    unsigned rounds, served_rounds, fresh, early_kills, changed, slowest_round;
    double slowest; /* seconds */
    uint64_t served_tokens, checked_tokens, disk_pages, orphans;
    uint64_t digest; /* of the index as the last parent left it; 0 for a fresh dir */
    struct recs recs;
};

/* The disk tier's sync mode of the child and the parent in round. Durable rounds are durable
 * throughout; relaxed ones flush every few ms in the child (so kills land between and during
 * flushes), and the parent reopens in either mode, so a dir changes mode across a crash. */
static void crash_sync(struct kvt_options *o, uint32_t sync, unsigned round, bool parent)
{
    o->disk_sync = sync;
    if (sync == KVT_DISK_SYNC_RELAXED) {
        o->disk_sync_ms = 1 + round % 7;
        if (parent && round % 2)
            o->disk_sync = KVT_DISK_SYNC_DURABLE;
    }
}

static void crash_round(const char *dir, unsigned round, uint64_t seed, uint64_t fam, uint64_t *rng,
                        uint32_t sync, struct crash_totals *t)
{
    struct kvt_options o;
    int pfd[2], status = 0;
    int early = round % CRASH_FRESH_EVERY == 0 || round % 8 == 7;

    /* The child writes through or on eviction by turns; the parent always writes through. */
    disk_opts(&o, dir, CRASH_HOST_TOKENS, crash_disk_bytes());
    o.disk_write_policy = round % 3 == 2 ? KVT_DISK_WRITE_ON_EVICT : KVT_DISK_WRITE_THROUGH;
    o.disk_io = round % 4 == 1 ? KVT_DISK_IO_PSYNC : KVT_DISK_IO_AUTO;
    crash_sync(&o, sync, round, false);
    REQUIRE(g_ctx, pipe(pfd) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    REQUIRE(g_ctx, pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        crash_child(&o, fam, rng_mix(seed ^ rng_mix(round + 1)), pfd[1]);
        _exit(CHILD_FAILED); /* not reached */
    }
    close(pfd[1]);
    /* Mostly the child is killed while it serves; some rounds at any moment from the fork,
     * while it opens (or creates) the dir. */
    if (!early) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        char c;
        if (poll(&p, 1, 10000) == 1 && read(pfd[0], &c, 1) != 1)
            early = 1; /* it went away before opening: waitpid says why */
    }
    uint32_t delay_us = below(rng, CRASH_MAX_DELAY_US + 1);
    struct timespec nap = {0, (long)delay_us * 1000};
    nanosleep(&nap, NULL);
    kill(pid, SIGKILL);
    REQUIRE(g_ctx, waitpid(pid, &status, 0) == pid);
    close(pfd[0]);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
        FAIL(g_ctx, "the child did not die of SIGKILL: status 0x%x (exit %d)", (unsigned)status,
             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    t->early_kills += early;

    /* Reopen the dir the child died in and serve the family from it. */
    disk_opts(&o, dir, CRASH_HOST_TOKENS, crash_disk_bytes());
    o.disk_io = round % 2 ? KVT_DISK_IO_PSYNC : KVT_DISK_IO_AUTO;
    crash_sync(&o, sync, round, true);
    kvt_engine *e = NULL;
    int rc = open_engine(&o, &e);
    if (rc)
        FAIL(g_ctx, "reopen after SIGKILL %u us after %s: %d (%s)", delay_us,
             early ? "the fork" : "the child opened", rc, kvt_strerror(rc));
    check(e);
    struct dstore_options so;
    engine_disk_options(e, &so); /* the mode the options asked for reached the store */
    REQUIRE(g_ctx, so.sync == (o.disk_sync == KVT_DISK_SYNC_RELAXED ? DSTORE_SYNC_RELAXED
                                                                    : DSTORE_SYNC_DURABLE));
    REQUIRE(g_ctx, so.sync_ms == o.disk_sync_ms);
    /* Every page the index holds reads back byte-exact; and the child changed the index. */
    struct disk_check dc = check_disk(e, &t->recs);
    t->disk_pages += dc.pages;
    t->orphans += dc.orphans;
    t->changed += index_digest(&t->recs) != t->digest;
    size_t served = 0;
    for (int i = 0; i < CRASH_PARENT_REQS; i++) {
        struct seq q;
        gen_seq(fam, rng, &q);
        struct kvt_req r = run_req(e, &q, q.len, chance(rng, 50), NULL);
        served += r.disk_len;
        t->checked_tokens += r.protected_len;
        if (i % 4 == 3)
            check(e);
    }
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    struct kvt_stats st = stats(e);
    if (st.disk_errors)
        FAIL(g_ctx, "%" PRIu64 " disk errors after a SIGKILL (no power cut: none expected)",
             st.disk_errors);
    REQUIRE(g_ctx, st.disk_read_tokens >= served);
    dc = check_disk(e, &t->recs); /* and what this engine wrote on top */
    t->digest = index_digest(&t->recs);
    kvt_close(e);
    t->served_rounds += served > 0;
    t->served_tokens += served;
    t->rounds++;
}

static void crash_run(uint32_t sync, unsigned rounds)
{
    uint64_t seed = base_seed(), rng = seed, fam = rng_mix(seed ^ 0x637261736821ull);
    struct crash_totals t = {0};
    char dir[96] = "";
    struct timespec t0, t1;
    const char *mode = g_store_pages > 1               ? "durable, store pages of 4 pages"
                       : sync == KVT_DISK_SYNC_RELAXED ? "relaxed"
                                                       : "durable";

    printf("test_disk_engine: crash (%s): seed=%" PRIu64 " (KVT_SEED reruns it), %u rounds "
           "(KVT_CRASH_ROUNDS)\n",
           mode, seed, rounds);
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned round = 0; round < rounds; round++) {
        snprintf(g_ctx, sizeof(g_ctx), "crash seed=%" PRIu64 " round %u", seed, round);
        if (round % CRASH_FRESH_EVERY == 0) {
            if (dir[0])
                fixture_remove_tree(dir);
            make_data_dir(dir, sizeof(dir));
            t.fresh++;
            t.digest = 0;
        }
        struct timespec r0, r1;
        clock_gettime(CLOCK_MONOTONIC, &r0);
        crash_round(dir, round, seed, fam, &rng, sync, &t);
        clock_gettime(CLOCK_MONOTONIC, &r1);
        double rs = (double)(r1.tv_sec - r0.tv_sec) + (double)(r1.tv_nsec - r0.tv_nsec) / 1e9;
        if (rs > t.slowest) {
            t.slowest = rs;
            t.slowest_round = round;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (dir[0])
        fixture_remove_tree(dir);
    free(t.recs.v);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("test_disk_engine: crash (%s): %u rounds in %.1f s (slowest: round %u, %.3f s; %u fresh "
           "dirs, %u killed before or while opening, %u found the index changed by the child): "
           "%u served pages from disk, %" PRIu64 " tokens from disk, %" PRIu64
           " cached tokens checked; %" PRIu64 " pages read back from the index (%" PRIu64
           " skipped: parent not held); 0 wrong bytes served\n",
           mode, t.rounds, secs, t.slowest_round, t.slowest, t.fresh, t.early_kills, t.changed,
           t.served_rounds, t.served_tokens, t.checked_tokens, t.disk_pages, t.orphans);
    fflush(stdout);
    snprintf(g_ctx, sizeof(g_ctx), "crash seed=%" PRIu64, seed);
    /* It must have served disk pages written by killed children, not only survived. */
    REQUIRE(g_ctx, rounds == 0 || (t.served_rounds > 0 && t.changed > 0 && t.disk_pages > 0));
    g_ctx[0] = 0;
}

void test_crash(void **state)
{
    (void)state;
    crash_run(KVT_DISK_SYNC_DURABLE, crash_rounds());
}

void test_crash_relaxed(void **state)
{
    (void)state;
    crash_run(KVT_DISK_SYNC_RELAXED, crash_rounds());
}

/* Store pages of several pages (kvt_options.store_page_tokens) through the same kills: a
 * quarter of the rounds, every record of the index and every page served byte-exact. */
void test_crash_grouped(void **state)
{
    (void)state;
    g_store_pages = MAX_STORE_PAGES;
    crash_run(KVT_DISK_SYNC_DURABLE, (crash_rounds() + 3) / 4);
}

/* The teardown of the tests that set g_store_pages or g_other_fills, which runs when they fail
 * too: the tests after them keep pages of one page and the bound of run_req. */
int store_pages_reset(void **state)
{
    (void)state;
    g_store_pages = 1;
    g_other_fills = 0;
    return 0;
}
