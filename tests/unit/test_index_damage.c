/*
 * A damaged index never takes the process down, never serves a wrong byte, and after the
 * recovery every intact page is served again.
 *
 * A data dir of PAGES pages is written once. Each round copies it, damages index/data.mdb or
 * index/lock.mdb (bit flips, truncations, zeroed, swapped or junk pages, the meta pages
 * included; the clean stamp goes with any change to data.mdb, as it would), and then, in a
 * child process so that a crash is seen as one:
 *   1. opens it as kvtier-ctl does (read-only, as found), iterates the index and reads every
 *      page: each one served must be the page of its key;
 *   2. opens it as the engine does (a writer with the dir's fingerprint): a damaged index is
 *      set aside and recovered from the slabs; every page read must be right, and when some
 *      page is not served, the documented recovery (DSTORE_RECOVER, kvtier-ctl recover) must
 *      bring every page back.
 * KVT_DAMAGE_ROUNDS sets the rounds (default 500), KVT_SEED the damages.
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "engine_fixture.h"
#include "rng.h"
#include "disk/layout.h"
#include "disk/store.h"

#define PAGES 1500
#define PAGE_BYTES 2048 /* the tiny geometry's page: all tail, a packed slot */
#define TOKENS 16
#define BATCH 100
#define KEY DSTORE_KEY_BYTES
#define LMDB_PAGE 4096

enum child_exit { OK = 0, WRONG_BYTES = 10, LOST_PAGES = 11, BROKEN = 12 };

static void make_key(uint64_t id, uint8_t *key)
{
    for (int i = 0; i < KEY / 8; i++) {
        uint64_t w = rng_mix(id * 4 + (uint64_t)i + 77);

        memcpy(key + 8 * i, &w, 8);
    }
}

static void fill_page(const uint8_t *key, uint8_t *buf)
{
    uint64_t seed;

    memcpy(&seed, key, 8);
    for (size_t i = 0; i < PAGE_BYTES; i += 8) {
        uint64_t w = rng_mix(seed + i);

        memcpy(buf + i, &w, 8);
    }
}

static void options(struct dstore_options *o, const char *dir, uint32_t flags)
{
    struct slot_layout l;

    assert_int_equal(layout_init(&l, PAGE_BYTES, TOKENS, DSTORE_FORMAT_VERSION), 0);
    dstore_options_init(o, sizeof(*o));
    o->dir = dir;
    memset(o->fingerprint, 0x5c, sizeof(o->fingerprint));
    o->page_bytes = PAGE_BYTES;
    o->page_tokens = TOKENS;
    o->disk_bytes = 2ull * PAGES * l.slot_bytes;
    o->slab_bytes = 1ull * PAGES * l.slot_bytes / 2;
    o->flags = flags;
    if (flags & DSTORE_AS_FOUND)
        o->page_bytes = 0;
}

/* ---- the pristine dir ---- */

static void write_pages(const char *dir)
{
    static uint8_t bufs[BATCH][PAGE_BYTES] __attribute__((aligned(4096)));
    uint8_t keys[BATCH][KEY], parents[BATCH][KEY];
    uint32_t tokens[TOKENS] = {0};
    struct dstore_wpage w[BATCH];
    struct dstore_options o;
    struct dstore *s;
    int res[BATCH];

    options(&o, dir, 0);
    assert_int_equal(dstore_open(&o, &s), 0);
    for (uint64_t first = 0; first < PAGES; first += BATCH) {
        for (size_t i = 0; i < BATCH; i++) {
            make_key(first + i, keys[i]);
            make_key(first + i - 1, parents[i]);
            fill_page(keys[i], bufs[i]);
            w[i] = (struct dstore_wpage){.key = keys[i],
                                         .parent = first + i ? parents[i] : NULL,
                                         .ns = NULL,
                                         .tokens = tokens,
                                         .buf = bufs[i]};
        }
        assert_int_equal(dstore_put(s, w, BATCH, res), 0);
        for (size_t i = 0; i < BATCH; i++)
            assert_int_equal(res[i], 0);
    }
    dstore_close(s); /* stamps the index clean */
}

/* ---- files ---- */

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void copy_dir(const char *from, const char *to)
{
    char cmd[512];

    rm_rf(to);
    snprintf(cmd, sizeof(cmd), "cp -a '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

static uint64_t rnd(uint64_t *state, uint64_t n)
{
    *state = rng_mix(*state);
    return n ? *state % n : 0;
}

/* ---- damages ---- */

enum damage_kind {
    FLIPS,       /* 1 to 64 random bits anywhere */
    TRUNC_PAGE,  /* shorter by one page */
    TRUNC_ANY,   /* cut at a random length */
    ZERO_PAGES,  /* 1 to 4 pages zeroed */
    SWAP_PAGES,  /* two pages swapped */
    JUNK_PAGE,   /* a page of random bytes */
    META_JUNK,   /* random bytes in a meta page (page 0 or 1) */
    LOCK_DAMAGE, /* lock.mdb garbled or truncated */
    NO_STAMP,    /* nothing damaged, the stamp removed: the walk must pass it */
    KINDS
};

static const char *const kind_names[KINDS] = {"flips",      "trunc-page", "trunc-any",
                                              "zero-pages", "swap-pages", "junk-page",
                                              "meta-junk",  "lock",       "no-stamp"};

static void rw_at(int fd, void *buf, size_t len, off_t off, bool write)
{
    ssize_t n = write ? pwrite(fd, buf, len, off) : pread(fd, buf, len, off);

    assert_true(n >= 0);
}

static void junk(uint8_t *buf, size_t len, uint64_t *rs)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)rnd(rs, 256);
}

static void damage_pages(int fd, off_t size, enum damage_kind k, uint64_t *rs)
{
    uint64_t pages = (uint64_t)size / LMDB_PAGE;
    uint8_t a[LMDB_PAGE], b[LMDB_PAGE];
    off_t p = (off_t)rnd(rs, pages) * LMDB_PAGE, q = (off_t)rnd(rs, pages) * LMDB_PAGE;

    switch (k) {
    case ZERO_PAGES:
        memset(a, 0, sizeof(a));
        for (uint64_t i = 0, n = 1 + rnd(rs, 4); i < n; i++)
            rw_at(fd, a, sizeof(a), (off_t)rnd(rs, pages) * LMDB_PAGE, true);
        break;
    case SWAP_PAGES:
        rw_at(fd, a, sizeof(a), p, false);
        rw_at(fd, b, sizeof(b), q, false);
        rw_at(fd, a, sizeof(a), q, true);
        rw_at(fd, b, sizeof(b), p, true);
        break;
    case JUNK_PAGE:
        junk(a, sizeof(a), rs);
        rw_at(fd, a, sizeof(a), p, true);
        break;
    case META_JUNK: {
        size_t len = 1 + rnd(rs, 64);
        off_t at = (off_t)(rnd(rs, 2) * LMDB_PAGE + rnd(rs, LMDB_PAGE - len));

        junk(a, len, rs);
        rw_at(fd, a, len, at, true);
        break;
    }
    default:
        break;
    }
}

static void flip_bits(int fd, off_t size, uint64_t *rs)
{
    for (uint64_t i = 0, n = 1 + rnd(rs, 64); i < n; i++) {
        off_t at = (off_t)rnd(rs, (uint64_t)size);
        uint8_t c;

        rw_at(fd, &c, 1, at, false);
        c ^= (uint8_t)(1u << rnd(rs, 8));
        rw_at(fd, &c, 1, at, true);
    }
}

static void damage_lock(const char *dir, uint64_t *rs)
{
    char path[256];
    uint8_t buf[256];
    struct stat st;
    int fd;

    snprintf(path, sizeof(path), "%s/index/lock.mdb", dir);
    if ((fd = open(path, O_RDWR)) < 0)
        return;
    assert_int_equal(fstat(fd, &st), 0);
    if (rnd(rs, 3) == 0) {
        assert_int_equal(ftruncate(fd, (off_t)rnd(rs, (uint64_t)st.st_size)), 0);
    } else if (st.st_size > 0) {
        junk(buf, sizeof(buf), rs);
        rw_at(fd, buf, sizeof(buf), (off_t)rnd(rs, (uint64_t)st.st_size), true);
    }
    close(fd);
}

static void damage(const char *dir, enum damage_kind k, uint64_t *rs)
{
    char path[256];
    struct stat st;
    int fd;

    if (k == LOCK_DAMAGE)
        return damage_lock(dir, rs);
    snprintf(path, sizeof(path), "%s/index/clean", dir);
    unlink(path); /* a stamp never survives a change to data.mdb (its times change) */
    if (k == NO_STAMP)
        return;
    snprintf(path, sizeof(path), "%s/index/data.mdb", dir);
    assert_true((fd = open(path, O_RDWR)) >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    if (k == FLIPS)
        flip_bits(fd, st.st_size, rs);
    else if (k == TRUNC_PAGE)
        assert_int_equal(ftruncate(fd, st.st_size - LMDB_PAGE), 0);
    else if (k == TRUNC_ANY)
        assert_int_equal(ftruncate(fd, (off_t)rnd(rs, (uint64_t)st.st_size)), 0);
    else
        damage_pages(fd, st.st_size, k, rs);
    close(fd);
}

/* ---- the child's checks ---- */

struct served {
    uint64_t pages, wrong, missing;
};

/* Read every page of the pristine dir's: each one served must be its key's. */
static void read_all(struct dstore *s, struct served *sv)
{
    static uint8_t bufs[BATCH][PAGE_BYTES] __attribute__((aligned(4096)));
    uint8_t keys[BATCH][KEY];
    struct dstore_rpage r[BATCH];
    uint8_t want[PAGE_BYTES];
    int res[BATCH];

    *sv = (struct served){0};
    for (uint64_t first = 0; first < PAGES; first += BATCH) {
        for (size_t i = 0; i < BATCH; i++) {
            make_key(first + i, keys[i]);
            r[i] = (struct dstore_rpage){.key = keys[i], .buf = bufs[i]};
        }
        if (dstore_get(s, r, BATCH, res)) {
            sv->missing += BATCH;
            continue;
        }
        for (size_t i = 0; i < BATCH; i++) {
            fill_page(keys[i], want);
            if (res[i]) {
                sv->missing++;
                continue;
            }
            sv->pages++;
            sv->wrong += memcmp(want, bufs[i], PAGE_BYTES) != 0;
        }
    }
}

static int count_entry(void *arg, const struct dstore_entry *e)
{
    (void)e;
    (*(uint64_t *)arg)++;
    return 0;
}

/* kvtier-ctl's way in: read-only, as found. A damaged index is refused, never crashes. */
static int as_inspector(const char *dir)
{
    struct dstore_options o;
    struct dstore *s;
    struct served sv;
    uint64_t n = 0;

    options(&o, dir, DSTORE_READONLY | DSTORE_AS_FOUND);
    if (dstore_open(&o, &s))
        return OK;
    dstore_iterate(s, count_entry, &n);
    read_all(s, &sv);
    dstore_close(s);
    return sv.wrong ? WRONG_BYTES : OK;
}

/* The engine's way in, then the documented recovery when any page is not served. */
static int as_writer(const char *dir, bool *recovered)
{
    struct dstore_options o;
    struct dstore *s;
    struct dstore_stats st;
    struct served sv;
    int rc;

    options(&o, dir, 0);
    if ((rc = dstore_open(&o, &s)) || (rc = dstore_wait_ready(s))) {
        fprintf(stderr, "the engine's open: %s\n", kvt_strerror(rc));
        return BROKEN;
    }
    read_all(s, &sv);
    dstore_stats(s, &st);
    *recovered = st.index_rebuilt;
    dstore_close(s);
    if (sv.wrong)
        return WRONG_BYTES;
    if (!sv.missing)
        return OK;
    options(&o, dir, DSTORE_AS_FOUND | DSTORE_RECOVER);
    if ((rc = dstore_open(&o, &s)) || (rc = dstore_wait_ready(s))) {
        fprintf(stderr, "the recovery's open: %s\n", kvt_strerror(rc));
        return BROKEN;
    }
    read_all(s, &sv);
    dstore_close(s);
    return sv.wrong ? WRONG_BYTES : sv.missing ? LOST_PAGES : OK;
}

struct tally {
    uint64_t rounds, crashes, wrong, lost, broken, recovered_auto, false_alarms, by_kind[KINDS];
};

/* Run fn in a child; a signal is a crash. Its exit code otherwise. */
static int in_child(int (*fn)(const char *, bool *), const char *dir, bool *flag, int *sig)
{
    int pipefd[2], status;
    uint8_t b = 0;
    pid_t pid;

    assert_int_equal(pipe(pipefd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
        bool f = false;
        int rc;

        /* cmocka's handlers would turn a crash into a failed test and go on in the child */
        for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
            signal(fatal[i], SIG_DFL);
        rc = fn(dir, &f);

        b = f;
        if (write(pipefd[1], &b, 1) != 1)
            _exit(BROKEN);
        _exit(rc);
    }
    close(pipefd[1]);
    if (read(pipefd[0], &b, 1) == 1)
        *flag = b;
    close(pipefd[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int inspector_fn(const char *dir, bool *flag)
{
    (void)flag;
    return as_inspector(dir);
}

static void tally_one(struct tally *t, int rc, int sig, enum damage_kind k, uint64_t round)
{
    if (sig || rc < 0) {
        t->crashes++;
        fprintf(stderr, "round %" PRIu64 " (%s): crashed, signal %d\n", round, kind_names[k], sig);
    } else if (rc == WRONG_BYTES) {
        t->wrong++;
    } else if (rc == LOST_PAGES) {
        t->lost++;
    } else if (rc == BROKEN) {
        t->broken++;
    } else if (rc) {
        t->crashes++;
    }
    if (rc)
        fprintf(stderr, "round %" PRIu64 " (%s): exit %d\n", round, kind_names[k], rc);
}

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);

    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static void test_damaged_index(void **state)
{
    char root[64], pristine[96], work[96];
    uint64_t rounds = env_u64("KVT_DAMAGE_ROUNDS", 500);
    uint64_t only = env_u64("KVT_DAMAGE_ONLY", UINT64_MAX); /* run that round's checks alone */
    uint64_t seed = env_u64("KVT_SEED", (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    uint64_t rs = seed;
    struct tally t = {0};
    time_t t0 = time(NULL);

    (void)state;
    assert_int_equal(fixture_data_dir(root, sizeof(root), "damage"), 0);
    snprintf(pristine, sizeof(pristine), "%s/d", root);
    snprintf(work, sizeof(work), "%s/work", root);
    write_pages(pristine);
    for (uint64_t i = 0; i < rounds; i++) {
        enum damage_kind k = (enum damage_kind)rnd(&rs, KINDS);
        bool rec = false;
        int sig, rc;

        copy_dir(pristine, work);
        damage(work, k, &rs);
        if (only != UINT64_MAX && i != only)
            continue;
        t.by_kind[k]++;
        rc = in_child(inspector_fn, work, &rec, &sig);
        tally_one(&t, rc, sig, k, i);
        rc = in_child(as_writer, work, &rec, &sig);
        tally_one(&t, rc, sig, k, i);
        t.recovered_auto += rec;
        /* a sound index (only the stamp gone, or LMDB's lock file, which it rebuilds) is
         * walked and kept, never set aside */
        t.false_alarms += rec && (k == NO_STAMP || k == LOCK_DAMAGE);
        t.rounds++;
    }
    printf("test_index_damage: seed %" PRIu64 " (KVT_SEED reruns it): %" PRIu64
           " damaged indexes in %ld s (",
           seed, t.rounds, (long)(time(NULL) - t0));
    for (int k = 0; k < KINDS; k++)
        printf("%s%s %" PRIu64, k ? ", " : "", kind_names[k], t.by_kind[k]);
    printf("): %" PRIu64 " crashes, %" PRIu64 " wrong pages, %" PRIu64
           " rounds with pages lost after recovery, %" PRIu64 " failed opens; %" PRIu64
           " set aside and recovered by the engine's open, %" PRIu64
           " of them sound (false alarms)\n",
           t.crashes, t.wrong, t.lost, t.broken, t.recovered_auto, t.false_alarms);
    if (only == UINT64_MAX) { /* one round alone leaves its dirs to look at */
        fixture_remove_tree(root);
    } else {
        fixture_keep_tree(root);
        printf("test_index_damage: round %" PRIu64 ": %s, from %s\n", only, work, pristine);
    }
    assert_int_equal(t.crashes, 0);
    assert_int_equal(t.wrong, 0);
    assert_int_equal(t.lost, 0);
    assert_int_equal(t.broken, 0);
    assert_int_equal(t.false_alarms, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_damaged_index)};

    return cmocka_run_group_tests(tests, NULL, NULL);
}
