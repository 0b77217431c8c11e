/*
 * The engine with a disk tier under crashes, injected I/O faults and bytes damaged on disk.
 *
 * KV content is a function of the key: the row of token i is drawn from a hash chained over
 * the namespace and tokens 0..i, the layer and K or V (as test_hicache.c does), so every page
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
 * - test_faults: the engine's store is swapped for one opened on the same dir with the fault
 *   seam (struct dstore_options.faults), failing writes (-ENOSPC, -EIO), reads (-EIO), slab
 *   syncs (-EIO) or slab growth (-ENOSPC), always or at random: the device and host keep
 *   serving byte-exact, kvt_poll and kvt_sync return 0, disk_errors grows; with the faults off
 *   again writes succeed and a restart serves from disk.
 * - test_checksum_running: pages damaged in the slab file under a running engine, after their
 *   host copies were evicted, are never served: the request computes them (or takes the
 *   leading pages that are intact), errors are counted, the engine goes on, and after a
 *   restart the pages written again are served from disk.
 *
 * KVT_SEED=<n> reruns a sequence (the kill times of test_crash excepted); the seed is printed.
 */
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

#include "store/disk/layout.h"
#include "engine.h"
#include "store/disk/ops.h"
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

/* ---- failures: cmocka in the test process, _exit in a crash child (harness.h) ---- */

char g_ctx[192]; /* what runs now: the seed, the round; printed with a failure */

#define HARNESS_RUN(ctx) (&(struct harness_run){.prog = "test_disk_engine", .note = (ctx)})

/* ---- keys: seeded families (the content is kv_rows.h's) ---- */

static uint64_t rnd(uint64_t *s)
{
    *s += RNG_GAMMA;
    return rng_mix(*s);
}

static uint32_t below(uint64_t *s, uint32_t n)
{
    return n ? (uint32_t)(rnd(s) % n) : 0;
}

static int chance(uint64_t *s, uint32_t pct)
{
    return below(s, 100) < pct;
}

/* Tokens salt * 1000 + i: one sequence, sharing nothing with a family or another salt. */
static void seq_make(struct seq *q, uint32_t ns, size_t len, uint32_t salt)
{
    q->ns = ns;
    q->len = len;
    for (size_t i = 0; i < len; i++)
        q->tok[i] = 100000 + salt * 1000 + (uint32_t)i;
    seq_hash(q);
}

/* A key of family fam: one of N_BASE base sequences of a namespace, cut to a random length,
 * and now and then leaving the base for one of two branches at a page boundary. Tokens stay
 * below 30000, apart from seq_make's. */
static uint32_t fam_tok(uint64_t fam, uint32_t base, uint32_t variant, size_t i)
{
    return (uint32_t)(rng_mix(fam ^ rng_mix((uint64_t)base << 32 | (uint64_t)variant << 16 | i)) %
                      30000);
}

static void gen_seq(uint64_t fam, uint64_t *rng, struct seq *q)
{
    uint32_t base = below(rng, N_BASE), variant = 0;
    size_t len = PS + below(rng, MAX_TOK - PS + 1), branch = len;

    q->ns = below(rng, N_NS);
    q->len = len;
    if (chance(rng, 30)) {
        variant = 1 + below(rng, 2);
        branch = PS * (size_t)below(rng, (uint32_t)(len / PS) + 1);
    }
    for (size_t i = 0; i < len; i++)
        q->tok[i] = fam_tok(fam, base, i < branch ? 0 : variant, i);
    seq_hash(q);
}

/* ---- engine helpers ---- */

static void check(const kvt_engine *e)
{
    char why[256] = "";

    if (engine_check(e, why, sizeof(why)))
        FAIL(g_ctx, "engine check: %s", why);
    /* The store's slot table too, once its rebuild is done (children, chain ends). */
    if (store_disk_dstore(e->store) && dstore_wait_ready(store_disk_dstore(e->store)) == 0 &&
        slots_check(store_disk_dstore(e->store), why, sizeof(why)))
        FAIL(g_ctx, "store check: %s", why);
}

static struct kvt_stats stats(const kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    EXPECT_RC(g_ctx, kvt_stats(e, &st), 0);
    return st;
}

static void disk_opts(struct kvt_options *o, const char *dir, uint64_t host_tokens,
                      uint64_t disk_bytes)
{
    fixture_engine_options(o, LAYERS, HEAD_DIM);
    o->page_size = PS;
    o->device_tokens = DEVICE_TOKENS;
    o->host_tokens = host_tokens;
    o->host_layout = KVT_HOST_PAGE_FIRST;
    o->max_requests = N_REQ;
    o->max_context = MAX_CONTEXT;
    o->disk_dir = dir;
    o->disk_bytes = disk_bytes;
}

/* kvt_open, retrying a while on -EBUSY (a writer that is going away). */
static int open_engine(const struct kvt_options *o, kvt_engine **e)
{
    struct timespec nap = {0, 1000000};
    int rc = -EBUSY;

    for (int i = 0; i < 500 && rc == -EBUSY; i++) {
        rc = kvt_open(o, e);
        if (rc == -EBUSY)
            nanosleep(&nap, NULL);
    }
    return rc;
}

static kvt_engine *open_ok(const struct kvt_options *o)
{
    kvt_engine *e = NULL;

    EXPECT_RC(g_ctx, open_engine(o, &e), 0);
    REQUIRE(g_ctx, e != NULL);
    check(e);
    return e;
}

/* A fresh data dir under TMPDIR or /tmp. */
static void make_data_dir(char *dir, size_t len)
{
    EXPECT_RC(g_ctx, fixture_data_dir(dir, len, "disk-engine"), 0);
}

static uint64_t base_seed(void)
{
    const char *s = getenv("KVT_SEED");
    struct timespec ts;

    if (s && *s)
        return strtoull(s, NULL, 0);
    clock_gettime(CLOCK_REALTIME, &ts);
    return rng_mix((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (uint64_t)getpid();
}

/* ---- requests ---- */

/* Wait for every layer of the request's load and check its first n rows. */
static void verify(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t n)
{
    int32_t slots[MAX_TOK];

    REQUIRE(g_ctx, n <= q->len);
    if (n == 0)
        return;
    EXPECT_RC(g_ctx, kvt_req_read(e, r, 0, n, slots), 0);
    for (uint32_t l = 0; l < LAYERS; l++) {
        EXPECT_RC(g_ctx, kvt_load_wait_layer(e, r->load_op, l, NULL), 0);
        long bad = check_layer(e, q, 0, n, slots, l);
        if (bad != -1)
            FAIL(g_ctx,
                 "layer %u: token %ld of %zu (ns %u, key of %zu, protected %zu, loaded %zu, "
                 "from disk %zu) has the wrong KV",
                 l, bad, n, q->ns, q->len, r->protected_len, r->loaded_len, r->disk_len);
    }
}

/* Compute tokens [from, to) of q for a begun request: allocate, write the rows, record the
 * slots in its row. */
static void extend(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t from,
                   size_t to)
{
    int32_t out[MAX_TOK], last = -1;
    uint32_t pl = (uint32_t)from, sl = (uint32_t)to;

    if (to <= from)
        return;
    if (from)
        EXPECT_RC(g_ctx, kvt_req_read(e, r, from - 1, 1, &last), 0);
    EXPECT_RC(g_ctx, kvt_alloc_extend(e, 1, &pl, &sl, &last, out, to - from), 0);
    EXPECT_RC(g_ctx, compute_rows(e, q, from, to - from, out), 0);
    EXPECT_RC(g_ctx, kvt_req_write(e, r, from, out, to - from), 0);
}

/* A whole request: match and begin on q's first prompt tokens, check every row it is served,
 * compute the rest of q and check it all, finish (inserting when insert), poll. *m gets the
 * match; returns what kvt_req_begin gave. */
static struct kvt_req run_req(kvt_engine *e, const struct seq *q, size_t prompt, int insert,
                              struct kvt_match *m)
{
    struct kvt_key key = seq_key(q, prompt);
    struct kvt_match mm;
    struct kvt_req r, got;

    if (!m)
        m = &mm;
    *m = (struct kvt_match){0};
    if (prompt) /* an empty key matches nothing (kvt_match refuses it) */
        EXPECT_RC(g_ctx, kvt_match(e, &key, NULL, m), 0);
    REQUIRE(g_ctx, m->device_len % PS == 0 && m->host_len % PS == 0 && m->disk_len % PS == 0);
    REQUIRE(g_ctx, m->device_len + m->host_len + m->disk_len <= prompt / PS * PS);
    EXPECT_RC(g_ctx, kvt_req_begin(e, &key, &r), 0);
    REQUIRE(g_ctx, r.pool_idx >= 0);
    REQUIRE(g_ctx, r.protected_len % PS == 0 && r.protected_len <= prompt / PS * PS);
    REQUIRE(g_ctx, r.protected_len >= m->device_len);
    REQUIRE(g_ctx, r.loaded_len <= r.protected_len && r.disk_len <= r.loaded_len);
    REQUIRE(g_ctx, r.disk_len % PS == 0 && r.disk_len <= m->disk_len);
    got = r;
    verify(e, q, &r, r.protected_len);
    extend(e, q, &r, r.protected_len, q->len);
    verify(e, q, &r, q->len);
    key = seq_key(q, q->len);
    EXPECT_RC(g_ctx, kvt_req_cache_finished(e, &r, &key, 0, insert), 0);
    EXPECT_RC(g_ctx, kvt_poll(e, 0, NULL), 0);
    return got;
}

/* ---- every page the disk index holds, checked against its key ---- */

/* One record of the index: its page hash, its parent's (the namespace's root hash for a first
 * page), its namespace's root hash and its tokens. */
struct rec {
    uint8_t key[DSTORE_KEY_BYTES], parent[DSTORE_KEY_BYTES], ns[DSTORE_NS_BYTES];
    uint32_t tokens[PS];
};

struct recs {
    struct rec *v;
    size_t n, cap;
    uint64_t bad; /* records that failed their checks */
};

static int collect(void *arg, const struct dstore_entry *en)
{
    struct recs *r = arg;

    if (en->status || en->ntokens != PS) {
        r->bad++;
        return 0;
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 128;
        r->v = realloc(r->v, r->cap * sizeof(*r->v));
        REQUIRE(g_ctx, r->v != NULL);
    }
    struct rec *x = &r->v[r->n++];
    memset(x, 0, sizeof(*x));
    memcpy(x->key, en->key, DSTORE_KEY_BYTES);
    if (en->parent)
        memcpy(x->parent, en->parent, DSTORE_KEY_BYTES);
    if (en->ns)
        memcpy(x->ns, en->ns, DSTORE_NS_BYTES);
    memcpy(x->tokens, en->tokens, sizeof(x->tokens));
    return 0;
}

static int rec_cmp(const void *a, const void *b)
{
    return memcmp(a, b, DSTORE_KEY_BYTES); /* the key leads struct rec */
}

/* The records of the index, in key order. */
static void collect_all(kvt_engine *e, struct recs *r)
{
    r->n = 0;
    r->bad = 0;
    EXPECT_RC(g_ctx, dstore_iterate(store_disk_dstore(e->store), collect, r), 0);
    if (r->n > 1)
        qsort(r->v, r->n, sizeof(*r->v), rec_cmp);
}

/* A digest of which pages the index holds. */
static uint64_t index_digest(const struct recs *r)
{
    uint64_t d = r->n;

    for (size_t i = 0; i < r->n; i++) {
        uint64_t w;
        memcpy(&w, r->v[i].key, 8);
        d += rng_mix(w);
    }
    return d;
}

/* The page bytes of the last page of q as the host pool holds them (page_first: per layer the
 * K rows of the page, then its V rows). */
static void expected_page(const struct seq *q, uint8_t *page)
{
    size_t first = q->len - PS;

    for (uint32_t l = 0; l < LAYERS; l++)
        for (int w = 0; w < 2; w++)
            for (size_t t = 0; t < PS; t++)
                fill_row(q->h[first + t], l, w,
                         page + ((size_t)l * 2 + (size_t)w) * PS * ROW + t * ROW);
}

struct disk_check {
    uint64_t pages, orphans; /* read and checked; skipped: a page before them is not held */
};

/* Read every page the index holds straight from the store (on the owner thread, with nothing
 * in flight) and check it against its key: its hash is the chained page hash of its parent and
 * tokens, its namespace one of ours, and its bytes the KV of the tokens of its chain of
 * parents in that namespace. */
static struct disk_check check_disk(kvt_engine *e, struct recs *r)
{
    enum { PAGE_BYTES = LAYERS * 2 * PS * ROW };
    struct disk_check dc = {0};
    static uint8_t got[PAGE_BYTES], want[PAGE_BYTES];
    uint8_t root[N_NS][KVT_HASH_LEN], h[KVT_HASH_LEN];
    struct dstore_stats ds;
    struct page_hasher ph;

    dstore_stats(store_disk_dstore(e->store), &ds);
    REQUIRE(g_ctx, ds.page_bytes == PAGE_BYTES);
    EXPECT_RC(g_ctx, page_hasher_init(&ph), 0);
    for (uint32_t n = 0; n < N_NS; n++)
        EXPECT_RC(
            g_ctx,
            page_hash_root(&ph, e->fingerprint, NS_LEN[n] ? NS_BYTES[n] : NULL, NS_LEN[n], root[n]),
            0);
    collect_all(e, r);
    if (r->bad)
        FAIL(g_ctx, "%" PRIu64 " index records fail their checks", r->bad);
    for (size_t i = 0; i < r->n; i++) {
        const struct rec *x = &r->v[i];
        EXPECT_RC(g_ctx, page_hash_next(&ph, x->parent, x->tokens, PS, h), 0);
        if (memcmp(h, x->key, KVT_HASH_LEN))
            FAIL(g_ctx, "record %zu: its key is not the hash of its parent and tokens", i);
        if (memcmp(x->ns, root[0], KVT_HASH_LEN) && memcmp(x->ns, root[1], KVT_HASH_LEN))
            FAIL(g_ctx, "record %zu: a namespace of nobody's", i);
    }
    for (size_t i = 0; i < r->n; i++) {
        size_t chain[MAX_TOK / PS], depth = 0, cur = i;
        int orphan = 0;
        for (;;) {
            if (depth == MAX_TOK / PS)
                FAIL(g_ctx, "record %zu: a chain of parents longer than any key", i);
            chain[depth++] = cur;
            if (!memcmp(r->v[cur].parent, r->v[cur].ns, KVT_HASH_LEN))
                break;
            const struct rec *p = bsearch(r->v[cur].parent, r->v, r->n, sizeof(*r->v), rec_cmp);
            if (!p) {
                orphan = 1;
                break;
            }
            cur = (size_t)(p - r->v);
        }
        if (orphan) {
            dc.orphans++;
            continue;
        }
        struct seq q = {.ns = memcmp(r->v[chain[depth - 1]].ns, root[0], KVT_HASH_LEN) ? 1 : 0,
                        .len = depth * PS};
        for (size_t d = 0; d < depth; d++)
            memcpy(q.tok + d * PS, r->v[chain[depth - 1 - d]].tokens, PS * sizeof(uint32_t));
        seq_hash(&q);
        expected_page(&q, want);
        struct dstore_rpage rp = {.key = r->v[i].key, .buf = got};
        int res = -1;
        EXPECT_RC(g_ctx, dstore_get(store_disk_dstore(e->store), &rp, 1, &res), 0);
        if (res)
            FAIL(g_ctx, "page %zu of %zu in the index (depth %zu, ns %u) reads as %d (%s)", i, r->n,
                 depth, q.ns, res, kvt_strerror(res));
        if (memcmp(got, want, PAGE_BYTES))
            FAIL(g_ctx, "page %zu of %zu in the index (depth %zu, ns %u) holds the wrong KV", i,
                 r->n, depth, q.ns);
        dc.pages++;
    }
    page_hasher_finish(&ph);
    return dc;
}

/* ---- crashes ---- */

#define CRASH_HOST_TOKENS 256
#define CRASH_DISK_BYTES (96 * 4096) /* 96 slots, 384 tokens: the family does not fit */
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

static void crash_round(const char *dir, unsigned round, uint64_t seed, uint64_t fam, uint64_t *rng,
                        struct crash_totals *t)
{
    struct kvt_options o;
    int pfd[2], status = 0;
    int early = round % CRASH_FRESH_EVERY == 0 || round % 8 == 7;

    /* The child writes through or on eviction by turns; the parent always writes through. */
    disk_opts(&o, dir, CRASH_HOST_TOKENS, CRASH_DISK_BYTES);
    o.disk_write_policy = round % 3 == 2 ? KVT_DISK_WRITE_ON_EVICT : KVT_DISK_WRITE_THROUGH;
    o.disk_io = round % 4 == 1 ? KVT_DISK_IO_PSYNC : KVT_DISK_IO_AUTO;
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
    disk_opts(&o, dir, CRASH_HOST_TOKENS, CRASH_DISK_BYTES);
    o.disk_io = round % 2 ? KVT_DISK_IO_PSYNC : KVT_DISK_IO_AUTO;
    kvt_engine *e = NULL;
    int rc = open_engine(&o, &e);
    if (rc)
        FAIL(g_ctx, "reopen after SIGKILL %u us after %s: %d (%s)", delay_us,
             early ? "the fork" : "the child opened", rc, kvt_strerror(rc));
    check(e);
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

static void test_crash(void **state)
{
    uint64_t seed = base_seed(), rng = seed, fam = rng_mix(seed ^ 0x637261736821ull);
    unsigned rounds = crash_rounds();
    struct crash_totals t = {0};
    char dir[96] = "";
    struct timespec t0, t1;

    (void)state;
    printf("test_disk_engine: crash: seed=%" PRIu64 " (KVT_SEED reruns it), %u rounds "
           "(KVT_CRASH_ROUNDS)\n",
           seed, rounds);
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
        crash_round(dir, round, seed, fam, &rng, &t);
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
    printf("test_disk_engine: crash: %u rounds in %.1f s (slowest: round %u, %.3f s; %u fresh "
           "dirs, %u killed before or while opening, %u found the index changed by the child): "
           "%u served pages from disk, %" PRIu64 " tokens from disk, %" PRIu64
           " cached tokens checked; %" PRIu64 " pages read back from the index (%" PRIu64
           " skipped: parent not held)\n",
           t.rounds, secs, t.slowest_round, t.slowest, t.fresh, t.early_kills, t.changed,
           t.served_rounds, t.served_tokens, t.checked_tokens, t.disk_pages, t.orphans);
    fflush(stdout);
    snprintf(g_ctx, sizeof(g_ctx), "crash seed=%" PRIu64, seed);
    /* It must have served disk pages written by killed children, not only survived. */
    REQUIRE(g_ctx, rounds == 0 || (t.served_rounds > 0 && t.changed > 0 && t.disk_pages > 0));
    g_ctx[0] = 0;
}

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
static void swap_store(kvt_engine *e, const struct dstore_faults *f)
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

#define FAULT_HOST_TOKENS 128
#define FAULT_DISK_BYTES (4 << 20) /* 1024 slots: the disk tier does not evict here */

/* What a run of requests was served. */
struct tally {
    uint64_t reqs, protected_tokens, loaded_tokens, disk_tokens, matched_disk;
};

static void run_family(kvt_engine *e, uint64_t fam, uint64_t seed, int n, int full_prompt,
                       int insert, struct tally *t)
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

static void fault_case(const struct fault_case *fc, uint32_t disk_io, uint64_t seed)
{
    uint64_t fam1 = rng_mix(seed ^ 1), fam2 = rng_mix(seed ^ 2);
    struct fault_ctl ctl = {.seed = seed};
    struct dstore_faults faults = {.inject = inject, .arg = &ctl};
    struct kvt_options o;
    struct tally pre = {0}, a = {0}, b = {0}, after = {0};
    char dir[96];

    snprintf(g_ctx, sizeof(g_ctx), "faults %s io=%s seed=%" PRIu64, fc->name, IO_NAME[disk_io],
             seed);
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
     * (transfer timing): a read fault case goes on until reads were tried. */
    for (uint64_t k = 0;
         fc->point == DSTORE_FAULT_READ && !atomic_load(&ctl.calls[DSTORE_FAULT_READ]) && k < 8;
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

static void test_faults(void **state)
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
            fault_case(&cases[i], io, rng_mix(seed + i));
}

/* ---- another store below the host: the in-memory one, through the store contract ---- */

#define MEM_PAGES 96 /* fewer than the family's pages: the store evicts too */
#define MEM_SEEN 64

/* The mem store's fault seam: fail a share of reads and writes, and note keys read so the
 * test can damage their stored bytes afterwards (the seam runs under the store's lock). */
struct mem_faults {
    uint64_t rng;
    uint32_t pct; /* 0: no faults */
    uint64_t failed;
    uint8_t seen[MEM_SEEN][STORE_KEY_BYTES];
    uint32_t nseen;
    struct store_mem_faults hooks; /* the store keeps a pointer to it */
};

static int mem_inject(void *arg, enum store_op_kind kind, const uint8_t *key)
{
    struct mem_faults *f = arg;
    static const int read_err[] = {-EIO, KVT_ECORRUPT};

    if (kind == STORE_OP_READ && f->nseen < MEM_SEEN)
        memcpy(f->seen[f->nseen++], key, STORE_KEY_BYTES);
    if (!f->pct || !chance(&f->rng, f->pct))
        return 0;
    f->failed++;
    return kind == STORE_OP_WRITE ? -ENOSPC : read_err[below(&f->rng, 2)];
}

static kvt_engine *open_on_mem(struct mem_faults *f, uint32_t policy)
{
    struct kvt_options o;
    struct kvt_store *s = NULL;
    kvt_engine *e = NULL;

    f->hooks = (struct store_mem_faults){.inject = mem_inject, .arg = f};
    disk_opts(&o, NULL, FAULT_HOST_TOKENS, 0);
    o.disk_write_policy = policy;
    struct store_mem_options mo = {
        .page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS),
        .page_tokens = PS,
        .capacity_pages = MEM_PAGES,
        .faults = &f->hooks,
    };
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), 0);
    check(e);
    return e;
}

/* The engine over the in-memory store, with faults and damaged pages: every page served is
 * exact, the store is read from, the errors are counted, and a clean store serves again. */
static void mem_case(uint32_t policy, uint64_t seed)
{
    struct mem_faults f = {.rng = seed, .pct = 20};
    struct tally a = {0}, b = {0};
    uint64_t fam = rng_mix(seed ^ 7);

    snprintf(g_ctx, sizeof(g_ctx), "mem store policy=%u seed=%" PRIu64, policy, seed);
    kvt_engine *e = open_on_mem(&f, policy);
    run_family(e, fam, seed, 150, 0, 1, &a);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, f.failed > 0 && stats(e).disk_errors > 0);
    /* Damage what was read, then read it again: the store's check must catch every one. */
    f.pct = 0;
    for (uint32_t i = 0; i < f.nseen; i++)
        store_mem_damage(e->store, f.seen[i]);
    uint64_t errors = stats(e).disk_errors;
    run_family(e, fam, seed ^ 3, 150, 1, 1, &b);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    REQUIRE(g_ctx, stats(e).disk_errors > errors); /* damaged pages were caught, not served */
    REQUIRE(g_ctx, b.disk_tokens > 0 && stats(e).disk_read_tokens > 0);
    kvt_close(e);
}

static void test_mem_store(void **state)
{
    uint64_t seed = base_seed();

    (void)state;
    printf("test_disk_engine: mem store: seed=%" PRIu64 " (KVT_SEED reruns it)\n", seed);
    mem_case(KVT_DISK_WRITE_THROUGH, seed);
    mem_case(KVT_DISK_WRITE_ON_EVICT, rng_mix(seed));
}

/* A store for pages of another size than the host's is refused at open. */
static void test_store_geometry(void **state)
{
    struct kvt_options o;
    struct kvt_store *s = NULL;
    kvt_engine *e = (kvt_engine *)1;

    (void)state;
    disk_opts(&o, NULL, FAULT_HOST_TOKENS, 0);
    struct store_mem_options mo = {.page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS) + 1,
                                   .page_tokens = PS,
                                   .capacity_pages = 8};
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), -EINVAL);
    REQUIRE(g_ctx, e == NULL);
}

/* ---- damaged bytes under a running engine ---- */

struct damage {
    const struct seq *q; /* pages of q (found by their first token) ... */
    uint32_t pages;      /* ... whose bit (1 << page) is set get damaged */
    const char *dir;
    uint32_t slot_bytes;
    int done;
};

static int damage_visit(void *arg, const struct dstore_entry *en)
{
    struct damage *d = arg;

    if (en->status || en->ntokens != PS)
        return 0;
    for (uint32_t p = 0; p < d->q->len / PS; p++) {
        if (!(d->pages & 1u << p) || memcmp(en->tokens, d->q->tok + p * PS, PS * 4))
            continue;
        char path[160];
        uint8_t b[16];
        snprintf(path, sizeof(path), "%s/slabs/%04u.slab", d->dir, en->slab);
        int fd = open(path, O_RDWR);
        REQUIRE(g_ctx, fd >= 0);
        off_t off = (off_t)(SLAB_HEAD_BYTES + (uint64_t)en->slot * d->slot_bytes + 100);
        REQUIRE(g_ctx, pread(fd, b, sizeof(b), off) == (ssize_t)sizeof(b));
        for (size_t i = 0; i < sizeof(b); i++)
            b[i] ^= 0xa5;
        REQUIRE(g_ctx, pwrite(fd, b, sizeof(b), off) == (ssize_t)sizeof(b));
        close(fd);
        d->done++;
    }
    return 0;
}

/* Flip bytes of the pages of q named by the mask in the slab file, under the engine. */
static int damage_pages(kvt_engine *e, const char *dir, const struct seq *q, uint32_t mask)
{
    struct dstore_stats ds;
    struct damage d = {.q = q, .pages = mask, .dir = dir};

    dstore_stats(store_disk_dstore(e->store), &ds);
    d.slot_bytes = ds.slot_bytes;
    EXPECT_RC(g_ctx, dstore_iterate(store_disk_dstore(e->store), damage_visit, &d), 0);
    return d.done;
}

static struct kvt_match match_of(kvt_engine *e, const struct seq *q)
{
    struct kvt_key key = seq_key(q, q->len);
    struct kvt_match m;

    EXPECT_RC(g_ctx, kvt_match(e, &key, NULL, &m), 0);
    return m;
}

static uint64_t checksum_errors(kvt_engine *e)
{
    struct dstore_stats ds;

    dstore_stats(store_disk_dstore(e->store), &ds);
    return ds.err_checksum;
}

static uint64_t dropped_records(kvt_engine *e)
{
    struct dstore_stats ds;

    dstore_stats(store_disk_dstore(e->store), &ds);
    return ds.dropped;
}

/* A commit held in the fault seam until the test lets it go. */
struct commit_gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    bool armed, entered, open;
};

static int gate_commit(void *arg, enum dstore_fault_point point, uint32_t slab, uint32_t slot)
{
    struct commit_gate *g = arg;

    (void)slab;
    (void)slot;
    if (point != DSTORE_FAULT_COMMIT)
        return 0;
    pthread_mutex_lock(&g->m);
    if (g->armed) {
        g->entered = true;
        pthread_cond_broadcast(&g->cv);
        while (!g->open)
            pthread_cond_wait(&g->cv, &g->m);
    }
    pthread_mutex_unlock(&g->m);
    return 0;
}

struct sync_call {
    kvt_engine *e;
    atomic_bool done;
};

static void *call_sync(void *arg)
{
    struct sync_call *c = arg;

    EXPECT_RC(g_ctx, kvt_sync(c->e), 0);
    atomic_store(&c->done, true);
    return NULL;
}

/* kvt_sync waits for the drops of records that reads found bad, which the store queues in
 * the background: when it returns, the dir no longer names those bytes. The drops are held
 * at their commit to see it wait. */
static void test_sync_waits_for_drops(void **state)
{
    struct commit_gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false,
                            false};
    struct dstore_faults faults = {.inject = gate_commit, .arg = &g};
    struct sync_call call = {0};
    struct kvt_options o;
    struct seq a;
    pthread_t t;
    char dir[96];

    (void)state;
    snprintf(g_ctx, sizeof(g_ctx), "sync-drops");
    make_data_dir(dir, sizeof(dir));
    disk_opts(&o, dir, FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    kvt_engine *e = open_ok(&o);
    seq_make(&a, 1, 16, 7);
    run_req(e, &a, 16, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    kvt_close(e);
    /* Only the disk holds a now; no write follows a read (on_evict), so only drops queue. */
    o.disk_write_policy = KVT_DISK_WRITE_ON_EVICT;
    e = open_ok(&o);
    swap_store(e, &faults);
    REQUIRE(g_ctx, damage_pages(e, dir, &a, 0xf) == 4);
    uint64_t dropped0 = dropped_records(e);
    g.armed = true;
    run_req(e, &a, 16, 1, NULL); /* reads fail their checksums: drops queue, the first held */
    pthread_mutex_lock(&g.m);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.m);
    pthread_mutex_unlock(&g.m);
    call.e = e;
    REQUIRE(g_ctx, pthread_create(&t, NULL, call_sync, &call) == 0);
    usleep(200 * 1000);
    REQUIRE(g_ctx, !atomic_load(&call.done)); /* held behind the drop */
    pthread_mutex_lock(&g.m);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.m);
    REQUIRE(g_ctx, pthread_join(t, NULL) == 0);
    REQUIRE(g_ctx, atomic_load(&call.done));
    REQUIRE(g_ctx, dropped_records(e) == dropped0 + 4);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
    g_ctx[0] = 0;
}

static void test_checksum_running(void **state)
{
    struct kvt_options o;
    struct seq a, b, fill;
    struct kvt_match m;
    char dir[96];

    (void)state;
    snprintf(g_ctx, sizeof(g_ctx), "checksum");
    make_data_dir(dir, sizeof(dir));
    disk_opts(&o, dir, FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    kvt_engine *e = open_ok(&o);
    seq_make(&a, 1, 16, 1);
    seq_make(&b, 0, 16, 2);
    run_req(e, &a, 0, 1, NULL);
    run_req(e, &b, 0, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_cached_tokens == 32);

    /* Evict the device copies, then push the host copies out with other keys until a and b
     * are only on disk. */
    EXPECT_RC(g_ctx, kvt_evict(e, SIZE_MAX / 2, NULL), 0);
    uint32_t salt = 10;
    for (int tries = 0; tries < 20; tries++) {
        struct kvt_match ma = match_of(e, &a), mb = match_of(e, &b);
        if (ma.device_len + ma.host_len + mb.device_len + mb.host_len == 0)
            break;
        for (int i = 0; i < 3; i++, salt++) {
            seq_make(&fill, salt % 2, MAX_TOK, salt);
            run_req(e, &fill, 0, 1, NULL);
        }
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
    }
    m = match_of(e, &a);
    REQUIRE(g_ctx, m.device_len == 0 && m.host_len == 0 && m.disk_len == 16);
    m = match_of(e, &b);
    REQUIRE(g_ctx, m.device_len == 0 && m.host_len == 0 && m.disk_len == 16);
    check(e);

    /* Every page of a damaged, and the third page of b. */
    REQUIRE(g_ctx, damage_pages(e, dir, &a, 0xf) == 4);
    REQUIRE(g_ctx, damage_pages(e, dir, &b, 1u << 2) == 1);
    struct kvt_stats st0 = stats(e);
    uint64_t bad0 = checksum_errors(e), dropped0 = dropped_records(e);

    struct kvt_req r = run_req(e, &a, 16, 1, &m); /* computes it all */
    REQUIRE(g_ctx, m.disk_len == 16);
    REQUIRE(g_ctx, r.protected_len == 0 && r.disk_len == 0);
    REQUIRE(g_ctx, checksum_errors(e) > bad0);
    r = run_req(e, &b, 16, 1, &m); /* the two pages before the damaged one come from disk */
    REQUIRE(g_ctx, m.disk_len == 16);
    REQUIRE(g_ctx, r.protected_len == 8 && r.disk_len == 8);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    struct kvt_stats st1 = stats(e);
    printf("test_disk_engine: checksum: %" PRIu64 " checksum errors, disk errors %" PRIu64
           " -> %" PRIu64 ", read %" PRIu64 " -> %" PRIu64 " tokens\n",
           checksum_errors(e) - bad0, st0.disk_errors, st1.disk_errors, st0.disk_read_tokens,
           st1.disk_read_tokens);
    REQUIRE(g_ctx, checksum_errors(e) - bad0 == 5);
    REQUIRE(g_ctx, st1.disk_errors >= st0.disk_errors + 5);
    REQUIRE(g_ctx, st1.disk_read_tokens == st0.disk_read_tokens + 8);
    /* kvt_sync returned: the records of the bad pages are dropped already, not still queued. */
    REQUIRE(g_ctx, dropped_records(e) == dropped0 + 5);

    /* The engine goes on: the same keys and others, from the device and host now. */
    for (int i = 0; i < 6; i++, salt++) {
        seq_make(&fill, salt % 2, MAX_TOK, salt);
        run_req(e, &fill, MAX_TOK, 1, NULL);
        run_req(e, i % 2 ? &a : &b, 16, 1, NULL);
    }
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    kvt_close(e);

    /* The damaged pages were dropped and written again: a restart serves a and b whole, and
     * every page the index holds is right. */
    e = open_ok(&o);
    struct recs recs = {0};
    struct disk_check dc = check_disk(e, &recs);
    free(recs.v);
    REQUIRE(g_ctx, dc.pages >= 8 && dc.orphans == 0);
    r = run_req(e, &a, 16, 1, NULL);
    REQUIRE(g_ctx, r.protected_len == 16 && r.disk_len == 16);
    r = run_req(e, &b, 16, 1, NULL);
    REQUIRE(g_ctx, r.protected_len == 16 && r.disk_len == 16);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_errors == 0);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
    g_ctx[0] = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checksum_running),     cmocka_unit_test(test_faults),
        cmocka_unit_test(test_sync_waits_for_drops), cmocka_unit_test(test_mem_store),
        cmocka_unit_test(test_store_geometry),       cmocka_unit_test(test_crash),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
