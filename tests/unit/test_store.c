/*
 * The disk tier's block store: round trips, persistence, refusals, corruption, injected
 * faults, capacity and LRU eviction, and crash consistency under SIGKILL.
 *
 * Every test runs twice: with io_uring (skipped, saying why, where the kernel refuses it)
 * and with the psync engine forced. Page bytes are a function of the page's key, so any
 * page the store serves can be checked without remembering what was written.
 */
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
#include "store/disk/index.h"
#include "store/disk/layout.h"
#include "store/disk/store.h"

#define PAGE 8192 /* bytes per page in most tests: O_DIRECT-sized */
#define TOKENS 4  /* tokens per page */
/* A slot of such a page (disk/layout.h): its two blocks, then a block for its head; the
 * slots of a slab follow the slab's head block. */
#define SLOT (PAGE + LAYOUT_BLOCK)
#define KEY DSTORE_KEY_BYTES

static uint32_t io_kind = DSTORE_IO_PSYNC; /* the variant the group runs */
static int uring_err = 1;                  /* 1: not probed yet; 0: works; else the refusal */

/* ---- helpers ---- */

static void make_key(uint64_t id, uint8_t *key)
{
    for (int i = 0; i < KEY / 8; i++) {
        uint64_t w = rng_mix(id * 4 + (uint64_t)i);

        memcpy(key + 8 * i, &w, 8);
    }
}

/* The bytes of the page named key. */
static void fill_page(const uint8_t *key, uint8_t *buf, size_t len)
{
    uint64_t seed;

    memcpy(&seed, key, 8);
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = rng_mix(seed + i);

        memcpy(buf + i, &w, len - i < 8 ? len - i : 8);
    }
}

static bool page_ok(const uint8_t *key, const uint8_t *buf, size_t len)
{
    uint8_t *want = malloc(len);
    bool ok;

    fill_page(key, want, len);
    ok = memcmp(want, buf, len) == 0;
    free(want);
    return ok;
}

static void tokens_of(uint64_t id, uint32_t *t)
{
    for (int i = 0; i < TOKENS; i++)
        t[i] = (uint32_t)(id * 10 + (uint64_t)i);
}

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

/* The test's data dir and options. */
struct fx {
    char dir[64];
    struct dstore_options o;
    struct dstore *s;
    uint8_t *bufs; /* aligned page buffers */
    size_t nbufs;
};

static void fx_options(struct fx *f)
{
    dstore_options_init(&f->o, sizeof(f->o));
    f->o.dir = f->dir;
    memset(f->o.fingerprint, 0xab, sizeof(f->o.fingerprint));
    f->o.page_bytes = PAGE;
    f->o.page_tokens = TOKENS;
    f->o.disk_bytes = 64ull * SLOT;
    f->o.slab_bytes = 16ull * SLOT;
    f->o.io = io_kind;
    f->o.queue_depth = 8;
    f->o.io_threads = 3;
}

/* Skip the io_uring variant (the group has said why) when the kernel refuses io_uring. */
static void need_io(void)
{
    if (io_kind == DSTORE_IO_URING && uring_err)
        skip();
}

static int fx_setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct slot_layout l;

    if (layout_init(&l, PAGE, TOKENS) || l.slot_bytes != SLOT)
        return -1; /* the tests' arithmetic no longer matches the format */
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvt-store-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    fx_options(f);
    f->nbufs = 32;
    f->bufs = aligned_alloc(4096, f->nbufs * PAGE);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *f = *state;

    dstore_close(f->s);
    rm_rf(f->dir);
    free(f->bufs);
    free(f);
    return 0;
}

/* Close the store now (teardown would, later): for tests whose fault seam lives on their
 * stack, since closing still commits and asks the seam. */
static void fx_close(struct fx *f)
{
    dstore_close(f->s);
    f->s = NULL;
}

static void fx_open(struct fx *f)
{
    need_io();
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
}

static void fx_reopen(struct fx *f)
{
    dstore_close(f->s);
    f->s = NULL;
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
}

static uint8_t *buf_at(struct fx *f, size_t i)
{
    return f->bufs + (i % f->nbufs) * PAGE;
}

/* Write pages ids[0..n) with their keys and bytes from bufs; res[i] their results. No
 * cmocka here: forked children use it too. */
static int put_core(struct dstore *s, uint8_t *bufs, const uint64_t *ids, size_t n, int *res)
{
    uint8_t keys[32][KEY], parent[KEY] = {7};
    uint32_t toks[32][TOKENS];
    struct dstore_wpage w[32];

    if (n > 32)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        make_key(ids[i], keys[i]);
        tokens_of(ids[i], toks[i]);
        fill_page(keys[i], bufs + i * PAGE, PAGE);
        w[i] = (struct dstore_wpage){keys[i], parent, NULL, toks[i], bufs + i * PAGE};
    }
    return dstore_put(s, w, n, res);
}

/* Every result must be want. */
static void put_ids(struct fx *f, const uint64_t *ids, size_t n, int want)
{
    int res[32];

    assert_int_equal(put_core(f->s, f->bufs, ids, n, res), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], want);
}

/* In a forked child: pages first .. first + n - 1, all stored, or an exit code. */
static void child_put(struct dstore *s, uint8_t *bufs, uint64_t first, size_t n)
{
    uint64_t ids[32];
    int res[32];

    for (size_t i = 0; i < n; i++)
        ids[i] = first + i;
    if (put_core(s, bufs, ids, n, res))
        _exit(4);
    for (size_t i = 0; i < n; i++)
        if (res[i])
            _exit(5);
}

static void put_range(struct fx *f, uint64_t first, size_t n)
{
    uint64_t ids[32];

    for (size_t i = 0; i < n; i++)
        ids[i] = first + i;
    put_ids(f, ids, n, 0);
}

/* Read page id: its result; on a hit the bytes must be exact. */
static int get_id(struct fx *f, uint64_t id)
{
    uint8_t key[KEY];
    struct dstore_rpage r = {key, buf_at(f, 0)};
    int res = 1;

    make_key(id, key);
    memset(buf_at(f, 0), 0, PAGE);
    assert_int_equal(dstore_get(f->s, &r, 1, &res), 0);
    if (res == 0)
        assert_true(page_ok(key, buf_at(f, 0), PAGE));
    return res;
}

static bool has_id(struct fx *f, uint64_t id)
{
    uint8_t key[KEY];
    bool here = false;

    make_key(id, key);
    assert_int_equal(dstore_exists(f->s, key, 1, &here), 0);
    return here;
}

static struct dstore_stats stats_of(struct fx *f)
{
    struct dstore_stats st;

    dstore_stats(f->s, &st);
    return st;
}

/* ---- round trips ---- */

static void test_roundtrip_batched(void **state)
{
    struct fx *f = *state;
    uint8_t keys[6][KEY];
    bool here[6];
    size_t run;

    fx_open(f);
    put_range(f, 1, 4);
    put_range(f, 10, 2);
    for (uint64_t id = 1; id <= 4; id++)
        assert_int_equal(get_id(f, id), 0);
    assert_int_equal(get_id(f, 10), 0);
    assert_int_equal(get_id(f, 5), -ENOENT);
    for (int i = 0; i < 6; i++)
        make_key((uint64_t)(i < 4 ? i + 1 : i == 4 ? 10 : 99), keys[i]);
    assert_int_equal(dstore_exists(f->s, keys[0], 6, here), 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(here[i], i < 5);
    assert_int_equal(dstore_leading_run(f->s, keys[0], 6, &run), 0);
    assert_int_equal(run, 5);
    /* a gap stops the run */
    make_key(99, keys[2]);
    assert_int_equal(dstore_leading_run(f->s, keys[0], 6, &run), 0);
    assert_int_equal(run, 2);

    size_t gone = 0;
    uint8_t del[2][KEY];

    make_key(2, del[0]);
    make_key(77, del[1]); /* never stored */
    assert_int_equal(dstore_delete(f->s, del[0], 2, &gone), 0);
    assert_int_equal(gone, 1);
    assert_int_equal(get_id(f, 2), -ENOENT);
    assert_false(has_id(f, 2));
    assert_int_equal(get_id(f, 3), 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 5);
    assert_int_equal(st.writes, 6);
    assert_int_equal(st.deleted, 1);
    assert_int_equal(st.capacity_slots, 64);
    assert_int_equal(st.free_slots, 64 - 5);
    assert_int_equal(st.io, io_kind);
}

/* Several ops in flight at once, collected by poll in submission order. */
static void test_async_poll(void **state)
{
    struct fx *f = *state;
    uint8_t keys[8][KEY];
    struct dstore_wpage w[8];
    struct dstore_rpage r[8];
    int wres[8], rres[8];
    uint64_t ids[3];
    struct dstore_done done[4];
    size_t got = 0;

    fx_open(f);
    for (int i = 0; i < 8; i++) {
        make_key(100 + (uint64_t)i, keys[i]);
        fill_page(keys[i], buf_at(f, (size_t)i), PAGE);
        w[i] = (struct dstore_wpage){.key = keys[i], .buf = buf_at(f, (size_t)i)};
        r[i] = (struct dstore_rpage){keys[i], buf_at(f, 8 + (size_t)i)};
    }
    assert_int_equal(dstore_write(f->s, w, 4, wres, &ids[0]), 0);
    assert_int_equal(dstore_write(f->s, w + 4, 4, wres + 4, &ids[1]), 0);
    assert_int_equal(ids[1], ids[0] + 1);
    while (got < 2)
        got += dstore_poll(f->s, done + got, 4 - got);
    assert_int_equal(done[0].op, ids[0]);
    assert_int_equal(done[1].op, ids[1]);
    assert_int_equal(done[0].kind, DSTORE_OP_WRITE);
    assert_int_equal(done[0].ok + done[1].ok, 8);
    assert_int_equal(dstore_wait(f->s, ids[0], NULL), -ENOENT); /* collected already */
    assert_int_equal(dstore_wait(f->s, ids[1] + 5, NULL), -EINVAL);

    size_t leading = 99;
    assert_int_equal(dstore_read(f->s, r, 8, rres, &ids[2], &leading), 0);
    assert_int_equal(leading, 8);
    struct dstore_done d;
    assert_int_equal(dstore_wait(f->s, ids[2], &d), 0);
    assert_int_equal(d.kind, DSTORE_OP_READ);
    assert_int_equal(d.pages, 8);
    assert_int_equal(d.ok, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(rres[i], 0);
        assert_true(page_ok(keys[i], buf_at(f, 8 + (size_t)i), PAGE));
    }
    /* The leading pages on their way end at the first one not found (deleted meanwhile). */
    assert_int_equal(dstore_delete(f->s, keys[3], 1, NULL), 0);
    assert_int_equal(dstore_read(f->s, r, 8, rres, &ids[2], &leading), 0);
    assert_int_equal(leading, 3);
    assert_int_equal(dstore_wait(f->s, ids[2], &d), 0);
    assert_int_equal(d.ok, 7);
    assert_int_equal(rres[3], -ENOENT);
    assert_int_equal(stats_of(f).ops_in_flight, 0);
}

/* The same key twice in a batch, and again later: stored once. */
static void test_duplicates(void **state)
{
    struct fx *f = *state;
    uint64_t ids[4] = {5, 6, 5, 6};

    fx_open(f);
    put_ids(f, ids, 4, 0);
    put_ids(f, ids, 1, 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.writes, 2);
    assert_int_equal(st.write_dups, 3);
    assert_int_equal(st.pages, 2);
    assert_int_equal(get_id(f, 5), 0);
}

/* Bad pages fail alone; bad calls are refused whole. */
static void test_bad_input(void **state)
{
    struct fx *f = *state;
    uint8_t key[KEY];
    struct dstore_wpage w[2] = {{.key = NULL, .buf = buf_at(f, 0)}, {.key = key, .buf = NULL}};
    int res[2];
    uint64_t id;
    struct dstore_options o = f->o;

    o.page_bytes = 0;
    assert_int_equal(dstore_open(&o, &f->s), -EINVAL);
    o = f->o;
    o.size = 8;
    assert_int_equal(dstore_open(&o, &f->s), -EINVAL);
    o = f->o;
    o.disk_bytes = 100;
    assert_int_equal(dstore_open(&o, &f->s), -EINVAL);
    fx_open(f);
    make_key(1, key);
    assert_int_equal(dstore_put(f->s, w, 2, res), 0);
    assert_int_equal(res[0], -EINVAL);
    assert_int_equal(res[1], -EINVAL);
    assert_int_equal(dstore_write(f->s, w, 2, NULL, &id), -EINVAL);
    assert_int_equal(dstore_wait(f->s, 0, NULL), -EINVAL);
    assert_int_equal(stats_of(f).pages, 0);
}

/* Records carry what the later tools show: tokens, parent, namespace, times. */
static int visit_count(void *arg, const struct dstore_entry *e)
{
    uint32_t t[TOKENS];
    uint8_t key[KEY];

    assert_int_equal(e->status, 0);
    assert_int_equal(e->ntokens, TOKENS);
    assert_int_equal(e->length, PAGE);
    assert_int_equal(e->parent[0], 7);
    assert_true(e->created_ns > 0 && e->last_access_ns >= e->created_ns);
    for (uint64_t id = 1; id <= 3; id++) {
        make_key(id, key);
        if (!memcmp(key, e->key, KEY)) {
            tokens_of(id, t);
            assert_memory_equal(t, e->tokens, sizeof(t));
        }
    }
    (*(int *)arg)++;
    return 0;
}

static void test_iterate(void **state)
{
    struct fx *f = *state;
    int n = 0;

    fx_open(f);
    put_range(f, 1, 3);
    assert_int_equal(dstore_iterate(f->s, visit_count, &n), 0);
    assert_int_equal(n, 3);
}

/* page_bytes not a multiple of 4 KiB, buffers at odd addresses: buffered I/O, never a
 * failure. */
static void test_unaligned(void **state)
{
    struct fx *f = *state;
    enum { SMALL = 1000 };
    uint8_t *mem = malloc(4 * SMALL + 1), keys[4][KEY];
    struct dstore_wpage w[4];
    struct dstore_rpage r[4];
    int res[4];

    f->o.page_bytes = SMALL;
    fx_open(f);
    for (int i = 0; i < 4; i++) {
        make_key(300 + (uint64_t)i, keys[i]);
        fill_page(keys[i], mem + 1 + i * SMALL, SMALL);
        w[i] = (struct dstore_wpage){.key = keys[i], .buf = mem + 1 + i * SMALL};
        r[i] = (struct dstore_rpage){keys[i], mem + 1 + i * SMALL};
    }
    assert_int_equal(dstore_put(f->s, w, 4, res), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(res[i], 0);
    memset(mem, 0, 4 * SMALL + 1);
    assert_int_equal(dstore_get(f->s, r, 4, res), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(res[i], 0);
        assert_true(page_ok(keys[i], mem + 1 + i * SMALL, SMALL));
    }
    assert_int_equal(stats_of(f).slot_bytes, 4096);
    fx_reopen(f);
    assert_int_equal(dstore_get(f->s, r, 4, res), 0);
    assert_int_equal(res[3], 0);
    free(mem);
}

/* Whether O_DIRECT opens in dir at all (it does on ext4 and xfs; tmpfs on older kernels
 * refuses). */
static bool direct_works(const char *dir)
{
    char path[128];
    int fd;

    snprintf(path, sizeof(path), "%s/probe", dir);
    fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0)
        close(fd);
    unlink(path);
    return fd >= 0;
}

static void test_direct_and_buffered(void **state)
{
    struct fx *f = *state;
    bool direct = direct_works(f->dir);

    fx_open(f);
    put_range(f, 1, 3);
    assert_int_equal(stats_of(f).direct, direct);
    dstore_close(f->s);
    f->s = NULL;
    f->o.flags = DSTORE_BUFFERED;
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_equal(get_id(f, 2), 0);
    put_range(f, 4, 2);
    assert_int_equal(stats_of(f).direct, 0);
    assert_int_equal(get_id(f, 5), 0);
}

/* On tmpfs, when there is one: O_DIRECT may be refused there, and must not matter. */
static void test_tmpfs(void **state)
{
    struct fx *f = *state;
    char dir[64] = "/dev/shm/kvt-store-XXXXXX";

    need_io();
    if (access("/dev/shm", W_OK) || !mkdtemp(dir))
        skip();
    f->o.dir = dir;
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    put_range(f, 1, 4);
    assert_int_equal(get_id(f, 3), 0);
    assert_int_equal(stats_of(f).direct, direct_works(dir));
    dstore_close(f->s);
    f->s = NULL;
    rm_rf(dir);
}

/* Pages inside the registered region go out as fixed-buffer I/O (io_uring only). */
static void test_registered_buffers(void **state)
{
    struct fx *f = *state;
    size_t bytes = 8 * PAGE;
    uint8_t *pool = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t keys[4][KEY];
    struct dstore_wpage w[4];
    struct dstore_rpage r[4];
    int res[4];

    assert_true(pool != MAP_FAILED);
    f->o.register_base = pool;
    f->o.register_bytes = bytes;
    fx_open(f);
    for (int i = 0; i < 4; i++) {
        make_key(400 + (uint64_t)i, keys[i]);
        fill_page(keys[i], pool + i * PAGE, PAGE);
        w[i] = (struct dstore_wpage){.key = keys[i], .buf = pool + i * PAGE};
        r[i] = (struct dstore_rpage){keys[i], pool + (4 + i) * PAGE};
    }
    assert_int_equal(dstore_put(f->s, w, 4, res), 0);
    assert_int_equal(dstore_get(f->s, r, 4, res), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(res[i], 0);
        assert_true(page_ok(keys[i], pool + (4 + i) * PAGE, PAGE));
    }
    struct dstore_stats st = stats_of(f);
    if (io_kind == DSTORE_IO_URING) {
        assert_int_equal(st.fixed_buffers, 1);
        assert_int_equal(st.fixed_ios, 8);
    } else {
        assert_int_equal(st.fixed_ios, 0);
    }
    dstore_close(f->s);
    f->s = NULL;
    munmap(pool, bytes);
}

/* Make io_uring_setup fail with err in this process, as a sandbox or the io_uring_disabled
 * sysctl would. */
static bool refuse_uring(int err)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ((unsigned)err & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(f) / sizeof(f[0]), f};

    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

/* In a child whose kernel refuses io_uring: URING fails with the kernel's answer, AUTO falls
 * back to psync and works. Exit codes say what went wrong. */
static void refused_child(struct fx *f, int err)
{
    struct dstore *s;

    if (!refuse_uring(err))
        _exit(10);
    f->o.io = DSTORE_IO_URING;
    /* a build without io_uring says so before the kernel is asked */
    if (dstore_open(&f->o, &s) != (uring_err == -ENOSYS ? -ENOSYS : -err))
        _exit(11);
    f->o.io = DSTORE_IO_AUTO;
    if (dstore_open(&f->o, &s))
        _exit(12);
    struct dstore_stats st;
    dstore_stats(s, &st);
    if (st.io != DSTORE_IO_PSYNC)
        _exit(13);
    child_put(s, f->bufs, 1, 3);
    dstore_close(s);
    _exit(0);
}

static void test_uring_refused(void **state)
{
    struct fx *f = *state;
    int errs[2] = {ENOSYS, EPERM};

    need_io();
    for (int i = 0; i < 2; i++) {
        int status;
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0)
            refused_child(f, errs[i]);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    /* the pages the fallback wrote are there for any engine */
    fx_open(f);
    assert_int_equal(get_id(f, 3), 0);
    f->o.io = DSTORE_IO_AUTO;
    fx_reopen(f);
    assert_int_equal(stats_of(f).io, uring_err ? DSTORE_IO_PSYNC : DSTORE_IO_URING);
}

/* ---- persistence and refusals ---- */

static void test_restart(void **state)
{
    struct fx *f = *state;

    fx_open(f);
    put_range(f, 1, 10);
    fx_reopen(f);
    /* served before and after the rebuild alike */
    assert_int_equal(get_id(f, 7), 0);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    for (uint64_t id = 1; id <= 10; id++)
        assert_int_equal(get_id(f, id), 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 10);
    assert_int_equal(st.free_slots, 54);
    put_range(f, 11, 2);
    fx_reopen(f);
    assert_int_equal(get_id(f, 12), 0);
    assert_int_equal(get_id(f, 1), 0);
}

static void test_fingerprint(void **state)
{
    struct fx *f = *state;
    struct dstore *other = NULL;

    fx_open(f);
    put_range(f, 1, 2);
    dstore_close(f->s);
    f->s = NULL;
    f->o.fingerprint[5] ^= 1;
    assert_int_equal(dstore_open(&f->o, &other), KVT_EFINGERPRINT);
    f->o.fingerprint[5] ^= 1;
    f->o.page_bytes = PAGE * 2;
    assert_int_equal(dstore_open(&f->o, &other), KVT_EFINGERPRINT);
    f->o.page_bytes = PAGE;
    f->o.page_tokens = TOKENS + 1;
    assert_int_equal(dstore_open(&f->o, &other), KVT_EFINGERPRINT);
    f->o.page_tokens = TOKENS;
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_equal(get_id(f, 2), 0);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[160];
    FILE *fp;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static int count_entries(const char *dir)
{
    char cmd[160];
    int n = 0;
    FILE *p;

    snprintf(cmd, sizeof(cmd), "ls -A %s | wc -l", dir);
    p = popen(cmd, "r");
    assert_non_null(p);
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

/* A dir of someone else's is refused and left untouched. */
static void test_foreign_dir(void **state)
{
    struct fx *f = *state;

    need_io();
    write_file(f->dir, "notes.txt", "not a store\n");
    assert_int_equal(dstore_open(&f->o, &f->s), KVT_EFORMAT);
    assert_int_equal(count_entries(f->dir), 1);
    /* an index/ that is not an LMDB environment */
    rm_rf(f->dir);
    assert_int_equal(mkdir(f->dir, 0700), 0);
    char sub[96];
    snprintf(sub, sizeof(sub), "%s/index", f->dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_file(sub, "data.mdb", "garbage garbage garbage garbage garbage\n");
    assert_int_equal(dstore_open(&f->o, &f->s), KVT_EFORMAT);
    /* read-only never creates */
    rm_rf(f->dir);
    f->o.flags = DSTORE_READONLY;
    assert_int_equal(dstore_open(&f->o, &f->s), -ENOENT);
    assert_int_equal(mkdir(f->dir, 0700), 0);
    assert_int_equal(dstore_open(&f->o, &f->s), KVT_EFORMAT);
    assert_int_equal(count_entries(f->dir), 0);
}

/* Rewrite the meta record with LMDB directly: version, magic. */
static void poke_meta(const char *dir, uint32_t version, const char *magic)
{
    char path[96];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_val k = {6, "format"}, v;
    uint8_t buf[META_BYTES];

    snprintf(path, sizeof(path), "%s/index", dir);
    assert_int_equal(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 2);
    assert_int_equal(mdb_env_open(env, path, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    memcpy(buf, v.mv_data, META_BYTES);
    memcpy(buf, magic, 8);
    memcpy(buf + 8, &version, 4);
    v.mv_data = buf;
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

static void test_format_version(void **state)
{
    struct fx *f = *state;

    fx_open(f);
    put_range(f, 1, 1);
    dstore_close(f->s);
    f->s = NULL;
    poke_meta(f->dir, DSTORE_FORMAT_VERSION + 1, "KVTIERDS");
    assert_int_equal(dstore_open(&f->o, &f->s), KVT_EFORMAT);
    poke_meta(f->dir, DSTORE_FORMAT_VERSION, "NOTOURS!");
    assert_int_equal(dstore_open(&f->o, &f->s), KVT_EFORMAT);
    poke_meta(f->dir, DSTORE_FORMAT_VERSION, "KVTIERDS");
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_equal(get_id(f, 1), 0);
}

static void test_locked(void **state)
{
    struct fx *f = *state;
    struct dstore *second = NULL;

    fx_open(f);
    assert_int_equal(dstore_open(&f->o, &second), -EBUSY);
    assert_null(second);
    put_range(f, 1, 2);
    assert_int_equal(get_id(f, 1), 0);
    fx_reopen(f);
    assert_int_equal(get_id(f, 2), 0);
}

static void *unlock_later(void *arg)
{
    struct timespec t = {0, 20 * 1000000};

    nanosleep(&t, NULL);
    flock(*(int *)arg, LOCK_UN);
    return NULL;
}

/* An inspector's brief shared hold of the lock (kvtier-ctl checks for a writer that way)
 * delays a writer's open; it does not refuse it. */
static void test_lock_probe(void **state)
{
    struct fx *f = *state;
    char path[96];
    pthread_t t;
    int fd;

    fx_open(f);
    put_range(f, 1, 2);
    dstore_close(f->s);
    f->s = NULL;
    snprintf(path, sizeof(path), "%s/lock", f->dir);
    assert_true((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0);
    assert_int_equal(flock(fd, LOCK_SH | LOCK_NB), 0);
    assert_int_equal(pthread_create(&t, NULL, unlock_later, &fd), 0);
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    pthread_join(t, NULL);
    close(fd);
    assert_int_equal(get_id(f, 2), 0);
}

/* DSTORE_AS_FOUND takes the dir's geometry and covers its slab files, numbered from 0000:
 * a stray file with a big number does not count. */
static void test_as_found(void **state)
{
    struct fx *f = *state;
    struct dstore_options o;
    struct dstore_info in;
    struct dstore *s;
    char path[96];
    int fd;

    fx_open(f);
    put_range(f, 1, 20); /* 16 slots a slab: two slab files */
    dstore_close(f->s);
    f->s = NULL;
    snprintf(path, sizeof(path), "%s/slabs/99999.slab", f->dir);
    assert_true((fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600)) >= 0);
    close(fd);
    dstore_options_init(&o, sizeof(o));
    o.dir = f->dir;
    o.disk_bytes = 64ull * SLOT;
    o.flags = DSTORE_AS_FOUND | DSTORE_READONLY;
    assert_int_equal(dstore_open(&o, &s), 0);
    dstore_info(s, &in);
    assert_int_equal(in.page_bytes, PAGE);
    assert_int_equal(in.page_tokens, TOKENS);
    assert_memory_equal(in.fingerprint, f->o.fingerprint, sizeof(in.fingerprint));
    assert_int_equal(in.slab_slots, 16);
    assert_int_equal(in.capacity_slots, 64); /* disk_bytes 64 pages, the files cover 32 */
    dstore_close(s);
    o.disk_bytes = 0;
    o.flags = DSTORE_AS_FOUND;
    assert_int_equal(dstore_open(&o, &s), 0);
    dstore_info(s, &in);
    assert_int_equal(in.capacity_slots, 32);
    dstore_close(s);
}

/* A read-only open beside a writer in another process: reads serve, nothing is written,
 * and a second writer is refused with -EBUSY. */
static void test_readonly(void **state)
{
    struct fx *f = *state;
    int up[2], down[2];
    char c = 0;
    pid_t pid;

    need_io();
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct dstore *s;
        int ok = dstore_open(&f->o, &s) == 0;

        if (ok)
            child_put(s, f->bufs, 1, 5);
        c = ok ? 'y' : 'n';
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(2);
        dstore_close(s);
        _exit(0);
    }
    assert_int_equal(read(up[0], &c, 1), 1);
    assert_int_equal(c, 'y');
    assert_int_equal(dstore_open(&f->o, &f->s), -EBUSY);
    f->o.flags = DSTORE_READONLY;
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    for (uint64_t id = 1; id <= 5; id++)
        assert_int_equal(get_id(f, id), 0);
    assert_true(has_id(f, 3));
    uint8_t key[KEY];
    struct dstore_wpage w = {.key = key, .buf = buf_at(f, 0)};
    int res;
    uint64_t id;
    make_key(9, key);
    assert_int_equal(dstore_write(f->s, &w, 1, &res, &id), -EROFS);
    assert_int_equal(dstore_delete(f->s, key, 1, NULL), -EROFS);
    assert_int_equal(dstore_evict(f->s, 1, NULL), -EROFS);
    assert_int_equal(stats_of(f).pages, 5);
    assert_int_equal(write(down[1], "x", 1), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}

/* ---- corruption ---- */

struct where {
    uint8_t key[KEY];
    uint32_t slab, slot;
    bool found;
};

static int find_entry(void *arg, const struct dstore_entry *e)
{
    struct where *w = arg;

    if (memcmp(e->key, w->key, KEY))
        return 0;
    w->slab = e->slab;
    w->slot = e->slot;
    w->found = true;
    return 1;
}

static struct where locate(struct fx *f, uint64_t id)
{
    struct where w = {0};

    make_key(id, w.key);
    dstore_iterate(f->s, find_entry, &w);
    assert_true(w.found);
    return w;
}

static void slab_path(const struct fx *f, uint32_t slab, char *path, size_t len)
{
    snprintf(path, len, "%s/slabs/%04u.slab", f->dir, slab);
}

static void flip_byte(struct fx *f, struct where w, size_t at)
{
    char path[128];
    uint8_t b;
    int fd;

    slab_path(f, w.slab, path, sizeof(path));
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    off_t off = (off_t)(SLAB_HEAD_BYTES + w.slot * SLOT + at);
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static void test_flipped_bytes(void **state)
{
    struct fx *f = *state;

    fx_open(f);
    put_range(f, 1, 6);
    flip_byte(f, locate(f, 3), 100);
    assert_int_equal(get_id(f, 3), KVT_ECORRUPT);
    assert_int_equal(dstore_flush(f->s), 0);
    assert_false(has_id(f, 3));
    assert_int_equal(get_id(f, 3), -ENOENT);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.err_checksum, 1);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.pages, 5);
    /* the store keeps working, and the slot is usable again */
    put_range(f, 3, 1);
    assert_int_equal(get_id(f, 3), 0);
    /* flipped while closed: found at the next read after reopening */
    flip_byte(f, locate(f, 5), PAGE - 1);
    fx_reopen(f);
    assert_int_equal(get_id(f, 5), KVT_ECORRUPT);
    for (uint64_t id = 1; id <= 6; id++)
        if (id != 5)
            assert_int_equal(get_id(f, id), 0);
}

static void test_truncated_slab(void **state)
{
    struct fx *f = *state;
    char path[128];

    fx_open(f);
    put_range(f, 1, 20); /* slabs of 16 slots: 0000 full, 0001 holds 4 */
    struct where w = locate(f, 10);
    assert_int_equal(w.slab, 0);
    assert_int_equal(w.slot, 9);
    dstore_close(f->s);
    f->s = NULL;
    slab_path(f, 0, path, sizeof(path));
    assert_int_equal(truncate(path, SLAB_HEAD_BYTES + 8 * SLOT), 0); /* slots 8..15 gone */
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_not_equal(get_id(f, 10), 0); /* before or after the rebuild: never served */
    assert_int_equal(dstore_wait_ready(f->s), 0);
    for (uint64_t id = 1; id <= 20; id++) {
        struct where at = {0};

        make_key(id, at.key);
        dstore_iterate(f->s, find_entry, &at);
        bool lost = at.found ? false : true;
        assert_int_equal(get_id(f, id), lost ? -ENOENT : 0);
        assert_int_equal(lost, id >= 9 && id <= 16);
    }
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 12);
    assert_true(st.err_bounds >= 8);
    /* writes refill the truncated slab */
    put_range(f, 100, 10);
    for (uint64_t id = 100; id < 110; id++)
        assert_int_equal(get_id(f, id), 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, SLAB_HEAD_BYTES + 16 * SLOT);
}

/* Junk written into an index record, and checked records that lie, with LMDB directly. */
static void poke_records(const char *dir, const uint8_t *junk_key, const uint8_t *liar_key,
                         const uint8_t *victim_key, const uint8_t *long_key)
{
    static uint8_t longer[REC_HEAD_BYTES + 4 * (TOKENS + 100)];
    char path[96];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_val k = {KEY, (void *)junk_key}, v;
    uint8_t junk[REC_HEAD_BYTES + 4 * TOKENS], rec[REC_HEAD_BYTES + 4 * TOKENS];
    struct drec r, victim;

    snprintf(path, sizeof(path), "%s/index", dir);
    assert_int_equal(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 2);
    assert_int_equal(mdb_env_open(env, path, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "pages", 0, &dbi), 0);
    /* junk of the right size, then of a wrong size */
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    memcpy(junk, v.mv_data, sizeof(junk));
    for (size_t i = 4; i < sizeof(junk); i += 7)
        junk[i] ^= 0x5a;
    v = (MDB_val){sizeof(junk), junk};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    /* a well-formed record that names another page's slot */
    k.mv_data = (void *)victim_key;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(victim_key, v.mv_data, v.mv_size, &victim), 0);
    k.mv_data = (void *)liar_key;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(liar_key, v.mv_data, v.mv_size, &r), 0);
    r.slab = victim.slab;
    r.slot = victim.slot;
    rec_encode(liar_key, &r, NULL, rec);
    v = (MDB_val){sizeof(rec), rec};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    /* a well-formed record with more tokens than the dir's pages have */
    k.mv_data = (void *)long_key;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(long_key, v.mv_data, v.mv_size, &r), 0);
    r.ntokens = TOKENS + 100;
    rec_encode(long_key, &r, NULL, longer);
    v = (MDB_val){sizeof(longer), longer};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

static void test_garbled_index(void **state)
{
    struct fx *f = *state;
    uint8_t junk[KEY], liar[KEY], victim[KEY], longer[KEY];

    fx_open(f);
    put_range(f, 1, 8);
    dstore_close(f->s);
    f->s = NULL;
    make_key(2, junk);
    make_key(4, liar);
    make_key(6, victim);
    make_key(7, longer);
    poke_records(f->dir, junk, liar, victim, longer);
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    /* whatever the rebuild has done yet: never served wrong */
    assert_int_not_equal(get_id(f, 2), 0);
    assert_int_not_equal(get_id(f, 4), 0);
    assert_int_not_equal(get_id(f, 7), 0);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(dstore_flush(f->s), 0);
    assert_false(has_id(f, 2));
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), id == 2 || id == 4 || id == 7 ? -ENOENT : 0);
    struct dstore_stats st = stats_of(f);
    assert_true(st.err_record >= 2);
    assert_int_equal(st.pages, 5);
    /* after a restart the survivors still serve */
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(get_id(f, 8), 0);
    put_range(f, 2, 1);
    assert_int_equal(get_id(f, 2), 0);
}

/* Every page the store claims is byte-exact and every record points at written bytes. */
static void check_all(struct fx *f, uint64_t first, uint64_t last)
{
    for (uint64_t id = first; id <= last; id++) {
        int res = get_id(f, id);

        assert_true(res == 0 || res == -ENOENT);
        assert_int_equal(res == 0, has_id(f, id));
    }
}

/* A lower capacity at open: the pages past it are dropped, oldest first, in transactions
 * the index has room for (a map sized for the smaller capacity once could not hold them);
 * the slab files past it go, and every open after serves what is left without an error. */
static void test_capacity_lowered(void **state)
{
    struct fx *f = *state;
    char path[128];
    struct stat sb;

    fx_open(f); /* 64 slots in slabs of 16 */
    put_range(f, 1, 20);
    put_range(f, 21, 20);
    f->o.disk_bytes = 20ull * SLOT; /* slab 0 whole, 4 slots of slab 1 */
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 20);
    assert_int_equal(st.dropped, 20);
    assert_int_equal(st.err_index + st.err_nospc + st.err_bounds, 0);
    for (uint64_t id = 1; id <= 40; id++)
        assert_int_equal(get_id(f, id), id <= 20 ? 0 : -ENOENT);
    slab_path(f, 2, path, sizeof(path));
    assert_int_equal(stat(path, &sb), -1); /* past the capacity: gone */
    slab_path(f, 1, path, sizeof(path));
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, SLAB_HEAD_BYTES + 4 * SLOT);
    /* it keeps working: writes evict within the new capacity */
    put_range(f, 100, 10);
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    st = stats_of(f);
    assert_int_equal(st.pages, 20);
    assert_int_equal(st.err_index + st.err_nospc + st.err_bounds + st.dropped, 0);
    check_all(f, 1, 110);
}

/* What a data dir holds that kvtier did not make is never followed, blocked on or written
 * through: a FIFO, a symbolic link and a device where slab files should be are no slabs (a
 * read-only open does not hang; their pages are misses), and a writer replaces them; a
 * dangling link named lock is replaced, its target never created. */
static void test_not_regular_files(void **state)
{
    struct fx *f = *state;
    char path[128], target[160];
    struct stat sb;

    f->o.slab_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 24); /* slabs 0, 1 and 2 */
    dstore_close(f->s);
    f->s = NULL;
    slab_path(f, 0, path, sizeof(path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    slab_path(f, 1, path, sizeof(path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink("/dev/zero", path), 0);
    snprintf(path, sizeof(path), "%s/lock", f->dir);
    snprintf(target, sizeof(target), "%s.lock-target", f->dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(target, path), 0);

    /* read-only: opens at once, the pages of slabs 0 and 1 are misses, slab 2 serves */
    struct dstore_options ro = f->o;
    ro.flags = DSTORE_READONLY;
    assert_int_equal(dstore_open(&ro, &f->s), 0);
    for (uint64_t id = 1; id <= 24; id++)
        assert_int_equal(get_id(f, id) == 0, id > 16);
    dstore_close(f->s);
    f->s = NULL;

    /* a writer: the junk is replaced, the lock's target never made */
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(stat(target, &sb), -1);
    snprintf(path, sizeof(path), "%s/lock", f->dir);
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    put_range(f, 100, 24);
    for (uint32_t slab = 0; slab < 2; slab++) {
        slab_path(f, slab, path, sizeof(path));
        assert_int_equal(lstat(path, &sb), 0);
        assert_true(S_ISREG(sb.st_mode));
    }
    check_all(f, 1, 124);
    for (uint64_t id = 100; id < 124; id++)
        assert_true(has_id(f, id) || stats_of(f).evicted > 0);
}

static int count_visit(void *arg, const struct dstore_entry *e)
{
    (void)e;
    (*(uint64_t *)arg)++;
    return 0;
}

/* A reader beside a writer that grew the index past the reader's map (MDB_MAP_RESIZED): the
 * reader adopts the larger map between its snapshots and goes on reading, and an iteration
 * begun before the growth finishes on its own snapshot. */
static void test_reader_beside_growth(void **state)
{
    struct fx *f = *state;
    struct dstore *r;
    struct dstore_options ro;
    uint64_t n = 0;

    f->o.disk_bytes = 8192ull * SLOT;
    f->o.map_bytes = 512ull << 10; /* a small map, recorded in the index */
    fx_open(f);
    put_range(f, 1, 8);
    fx_close(f);
    ro = f->o;
    ro.flags = DSTORE_READONLY;
    assert_int_equal(dstore_open(&ro, &r), 0); /* takes the writer's 2 MiB */
    f->o.map_bytes = 64ull << 20;
    fx_open(f);
    for (uint64_t id = 100; id < 100 + 6000; id += 30)
        put_range(f, id, 30); /* the index file grows past 512 KiB */
    struct dstore *w = f->s;
    f->s = r; /* the helpers read through the reader */
    for (uint64_t id = 100; id < 6100; id += 97)
        assert_int_equal(get_id(f, id), 0);
    assert_int_equal(dstore_iterate(r, count_visit, &n), 0);
    assert_int_equal(n, 6008);
    f->s = w;
    dstore_close(r);
}

/* ---- injected faults ---- */

struct inject {
    _Atomic int err[DSTORE_FAULT_POINTS]; /* by fault point: the error to return, 0 none */
    _Atomic int budget;                   /* faults left to inject; negative: no limit */
};

static int inject_fn(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct inject *in = arg;
    int e = atomic_load(&in->err[pt]);

    int left = atomic_load(&in->budget);

    (void)slab;
    (void)slot;
    if (!e || left < 0)
        return e;
    while (left > 0 && !atomic_compare_exchange_weak(&in->budget, &left, left - 1))
        ;
    return left > 0 ? e : 0;
}

static void arm(struct inject *in, enum dstore_fault_point pt, int err, int budget)
{
    atomic_store(&in->budget, budget);
    atomic_store(&in->err[pt], err);
}

static void test_faults(void **state)
{
    struct fx *f = *state;
    struct inject in = {.budget = -1};
    struct dstore_faults faults = {inject_fn, &in};
    uint64_t ids[4] = {1, 2, 3, 4}, three[3] = {20, 21, 22};
    int res[3], failed = 0;

    f->o.faults = &faults;
    fx_open(f);
    /* ENOSPC growing the first slab: nothing stored */
    arm(&in, DSTORE_FAULT_GROW, -ENOSPC, -1);
    put_ids(f, ids, 4, -ENOSPC);
    arm(&in, DSTORE_FAULT_GROW, 0, -1);
    assert_int_equal(stats_of(f).pages, 0);
    put_range(f, 10, 2);
    /* ENOSPC on one page's write: that page alone */
    arm(&in, DSTORE_FAULT_WRITE, -ENOSPC, 1);
    assert_int_equal(put_core(f->s, f->bufs, three, 3, res), 0);
    for (int i = 0; i < 3; i++) {
        assert_true(res[i] == 0 || res[i] == -ENOSPC);
        failed += res[i] != 0;
    }
    assert_int_equal(failed, 1);
    /* EIO on every write */
    arm(&in, DSTORE_FAULT_WRITE, -EIO, -1);
    put_ids(f, ids, 2, -EIO);
    arm(&in, DSTORE_FAULT_WRITE, 0, -1);
    /* EIO on the fdatasync: the batch's pages are not stored */
    arm(&in, DSTORE_FAULT_SYNC, -EIO, -1);
    put_ids(f, ids + 2, 2, -EIO);
    arm(&in, DSTORE_FAULT_SYNC, 0, -1);
    /* EIO on reads: a miss, the record kept */
    arm(&in, DSTORE_FAULT_READ, -EIO, -1);
    assert_int_equal(get_id(f, 10), -EIO);
    arm(&in, DSTORE_FAULT_READ, 0, -1);
    assert_int_equal(get_id(f, 10), 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 4);
    assert_int_equal(st.err_nospc, 5);
    assert_int_equal(st.err_write_io, 2);
    assert_int_equal(st.err_sync, 1);
    assert_int_equal(st.err_read_io, 1);
    assert_int_equal(st.free_slots, 60);
    check_all(f, 1, 30);
    /* nothing half-done survives a restart, and the failed pages can be written now */
    fx_reopen(f);
    check_all(f, 1, 30);
    put_ids(f, ids, 4, 0);
    assert_int_equal(stats_of(f).pages, 8);
    fx_close(f); /* before the faults on this stack go: closing commits */
}

/* A rebuild that fails (an index error at open) leaves the slot table unknown: reads are
 * served by record and checksum, nothing is dropped, writes and deletes fail, and a later
 * open finds every page. */
static void test_rebuild_failed(void **state)
{
    struct fx *f = *state;
    struct inject in = {.budget = -1};
    struct dstore_faults faults = {inject_fn, &in};
    uint64_t more = 40;
    uint8_t key[KEY];
    bool present[1];
    int res[1];

    fx_open(f);
    put_range(f, 1, 8);
    dstore_close(f->s);
    f->s = NULL;
    f->o.faults = &faults;
    arm(&in, DSTORE_FAULT_REBUILD, -EIO, -1);
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_equal(dstore_wait_ready(f->s), -EIO);
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), 0);
    make_key(3, key);
    assert_int_equal(dstore_exists(f->s, key, 1, present), 0);
    assert_true(present[0]);
    assert_int_equal(put_core(f->s, f->bufs, &more, 1, res), 0);
    assert_int_equal(res[0], -EIO);
    assert_int_equal(dstore_delete(f->s, key, 1, NULL), -EIO);
    assert_int_equal(stats_of(f).dropped, 0);
    arm(&in, DSTORE_FAULT_REBUILD, 0, -1);
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    check_all(f, 1, 8);
    assert_int_equal(stats_of(f).pages, 8);
    fx_close(f); /* before the faults on this stack go: closing commits */
}

/* ---- capacity and eviction ---- */

/* A batch that names a stored page and needs every other slot: the eviction that makes room
 * must not take the page the batch reports as stored. */
static void test_evict_keeps_batch_dup(void **state)
{
    struct fx *f = *state;
    uint64_t ids[9] = {1, 10, 11, 12, 13, 14, 15, 16, 17};
    int res[9], nospc = 0;

    f->o.disk_bytes = f->o.slab_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 8); /* full */
    assert_int_equal(put_core(f->s, f->bufs, ids, 9, res), 0);
    assert_int_equal(res[0], 0);
    assert_int_equal(get_id(f, 1), 0);
    for (int i = 1; i < 9; i++) {
        assert_true(res[i] == 0 || res[i] == -ENOSPC);
        nospc += res[i] == -ENOSPC;
        assert_int_equal(get_id(f, ids[i]), res[i] ? -ENOENT : 0);
    }
    assert_int_equal(nospc, 1); /* eight slots: page 1 and seven new ones */
    fx_reopen(f);
    assert_int_equal(get_id(f, 1), 0);
}

static void test_lru_eviction(void **state)
{
    struct fx *f = *state;

    f->o.disk_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 8);
    assert_int_equal(stats_of(f).free_slots, 0);
    /* access order now: 3, 1, 5, 7 most recent; untouched 2, 4, 6, 8 are oldest by write */
    uint64_t touched[4] = {3, 1, 5, 7};
    for (int i = 0; i < 4; i++)
        assert_int_equal(get_id(f, touched[i]), 0);
    put_range(f, 20, 3); /* evicts 2, 4, 6 */
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(has_id(f, id), !(id == 2 || id == 4 || id == 6));
    size_t ev = 0;
    assert_int_equal(dstore_evict(f->s, 2, &ev), 0); /* 8, then 3 */
    assert_int_equal(ev, 2);
    assert_false(has_id(f, 8));
    assert_false(has_id(f, 3));
    assert_true(has_id(f, 1));
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.evicted, 5);
    assert_int_equal(st.pages, 6);
    assert_int_equal(st.free_slots, 2);
    /* the order survives a restart: 1 then 5 are the oldest now */
    fx_reopen(f);
    assert_int_equal(get_id(f, 1), 0); /* 1 becomes the newest */
    put_range(f, 30, 3);               /* two free slots, then evicts 5 */
    assert_false(has_id(f, 5));
    assert_true(has_id(f, 1));
    assert_true(has_id(f, 7));
    check_all(f, 1, 40);
}

/* Pages first .. first + n - 1 as one chain: each page's parent is the one before. */
static void put_chain(struct fx *f, uint64_t first, size_t n)
{
    uint8_t keys[32][KEY];
    uint32_t toks[32][TOKENS];
    struct dstore_wpage w[32];
    int res[32];

    assert_true(n <= 32);
    for (size_t i = 0; i < n; i++) {
        make_key(first + i, keys[i]);
        tokens_of(first + i, toks[i]);
        fill_page(keys[i], buf_at(f, i), PAGE);
        w[i] = (struct dstore_wpage){keys[i], i ? keys[i - 1] : NULL, NULL, toks[i], buf_at(f, i)};
    }
    assert_int_equal(dstore_put(f->s, w, n, res), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], 0);
}

/* Eviction takes chain ends first: a page whose parent went could only be served once an
 * engine held that parent again, so the chain is shortened from its end, never cut at its
 * root. The order is rebuilt from the index after a restart. */
static void test_chain_ends_first(void **state)
{
    struct fx *f = *state;

    f->o.disk_bytes = 8ull * SLOT;
    fx_open(f);
    put_chain(f, 1, 6);  /* 1 <- 2 <- ... <- 6, the oldest pages */
    put_range(f, 50, 2); /* two pages of no stored chain, newer: the store is full */
    put_range(f, 60, 2); /* room for two: the chain's end goes, 6, then 5 */
    for (uint64_t id = 1; id <= 6; id++)
        assert_int_equal(has_id(f, id), id <= 4);
    assert_true(has_id(f, 50) && has_id(f, 51) && has_id(f, 60) && has_id(f, 61));
    fx_reopen(f);
    put_range(f, 70, 3); /* after a restart: 4, 3 and 2, still from the end */
    for (uint64_t id = 1; id <= 4; id++)
        assert_int_equal(has_id(f, id), id == 1);
    /* A chain end the engine reads stays; a leaf of no chain, older, goes instead. */
    assert_int_equal(get_id(f, 1), 0);
    put_range(f, 80, 1);
    assert_true(has_id(f, 1));
    assert_false(has_id(f, 50));
    check_all(f, 1, 90);
    char why[128];
    assert_int_equal(slots_check(f->s, why, sizeof(why)), 0);
}

/* A batch of more new pages than the store has slots: its first pages go in, the rest are
 * refused as too many (not as a full disk: no error is counted), and the store keeps
 * serving. */
static void test_batch_larger_than_store(void **state)
{
    struct fx *f = *state;
    uint64_t ids[10];
    int res[10];

    f->o.disk_bytes = 4ull * SLOT;
    fx_open(f);
    put_range(f, 1, 2);
    for (int i = 0; i < 10; i++)
        ids[i] = 100 + (uint64_t)i;
    assert_int_equal(put_core(f->s, f->bufs, ids, 10, res), 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(res[i], i < 4 ? 0 : -ENOSPC);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.err_nospc, 0);
    assert_int_equal(st.too_many, 6);
    assert_int_equal(st.pages, 4);
    for (uint64_t id = 100; id < 104; id++)
        assert_int_equal(get_id(f, id), 0);
    put_range(f, 200, 2); /* a batch that fits evicts the oldest */
    assert_int_equal(stats_of(f).err_nospc, 0);
    check_all(f, 1, 210);
}

/* A read held inside the fault seam until the test lets it go: its slot stays pinned. */
struct gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    bool armed, entered, open;
};

static int gate_fn(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct gate *g = arg;

    (void)slab;
    (void)slot;
    if (pt != DSTORE_FAULT_READ)
        return 0;
    pthread_mutex_lock(&g->m);
    if (g->armed) {
        g->armed = false;
        g->entered = true;
        pthread_cond_broadcast(&g->cv);
        while (!g->open)
            pthread_cond_wait(&g->cv, &g->m);
    }
    pthread_mutex_unlock(&g->m);
    return 0;
}

/* Eviction passes over a slot a read holds; a delete frees it only once the read is done. */
static void test_pinned_slot(void **state)
{
    struct fx *f = *state;
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, false, false};
    struct dstore_faults faults = {gate_fn, &g};
    uint8_t key[KEY];
    struct dstore_rpage r = {key, buf_at(f, 8)};
    uint64_t op;
    size_t n = 0;
    int res = 1;

    f->o.faults = &faults;
    f->o.disk_bytes = 4ull * SLOT;
    fx_open(f);
    put_range(f, 1, 4); /* page 1 is the least recently used */
    make_key(1, key);
    assert_int_equal(dstore_read(f->s, &r, 1, &res, &op, NULL), 0);
    pthread_mutex_lock(&g.m);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.m);
    pthread_mutex_unlock(&g.m);
    assert_int_equal(dstore_evict(f->s, 1, &n), 0);
    assert_int_equal(n, 1);
    assert_true(has_id(f, 1));
    assert_false(has_id(f, 2));
    assert_int_equal(dstore_delete(f->s, key, 1, &n), 0);
    assert_int_equal(n, 1);
    assert_false(has_id(f, 1));
    assert_int_equal(stats_of(f).free_slots, 1); /* page 1's slot waits for the read */
    pthread_mutex_lock(&g.m);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.m);
    assert_int_equal(dstore_wait(f->s, op, NULL), 0);
    assert_int_equal(res, 0);
    assert_true(page_ok(key, buf_at(f, 8), PAGE));
    assert_int_equal(stats_of(f).free_slots, 2);
    put_range(f, 10, 2);
    assert_int_equal(stats_of(f).evicted, 1);
    check_all(f, 1, 12);
    assert_int_equal(stats_of(f).pages, 4);
    fx_close(f); /* before the faults on this stack go: closing commits */
}

/* A timed wait gives up and leaves the op to collect. */
static void test_wait_timeout(void **state)
{
    struct fx *f = *state;
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, false, false};
    struct dstore_faults faults = {gate_fn, &g};
    uint8_t key[KEY];
    struct dstore_rpage r = {key, buf_at(f, 8)};
    struct dstore_done d;
    uint64_t op;
    int res = 1;

    f->o.faults = &faults;
    fx_open(f);
    put_range(f, 1, 1);
    make_key(1, key);
    assert_int_equal(dstore_read(f->s, &r, 1, &res, &op, NULL), 0);
    assert_int_equal(dstore_wait_for(f->s, op, 5, &d), -ETIMEDOUT);
    assert_int_equal(dstore_poll(f->s, &d, 1), 0);
    pthread_mutex_lock(&g.m);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.m);
    assert_int_equal(dstore_wait_for(f->s, op, -1, &d), 0);
    assert_int_equal(d.ok, 1);
    assert_int_equal(res, 0);
    fx_close(f); /* before the faults on this stack go: closing commits */
}

/* ---- crash consistency ---- */

#define CRASH_SLOTS 48

/* The child: writes batches of fresh pages forever (evicting all along), now and then
 * deleting one. Killed by the parent. */
static void crash_child(struct fx *f, uint64_t round)
{
    struct dstore *s;
    uint8_t key[KEY];

    if (dstore_open(&f->o, &s))
        _exit(3);
    for (uint64_t n = 0;; n++) {
        uint64_t first = round * 1000000 + n * 8;

        child_put(s, f->bufs, first, 1 + n % 8);
        if (n % 5 == 4) {
            make_key(first, key);
            dstore_delete(s, key, 1, NULL);
        }
    }
}

struct crash_check {
    struct fx *f;
    size_t served;
};

static int crash_visit(void *arg, const struct dstore_entry *e)
{
    struct crash_check *c = arg;
    struct dstore_rpage r = {e->key, buf_at(c->f, 1)};
    int res = 1;

    assert_int_equal(e->status, 0);
    assert_int_equal(dstore_get(c->f->s, &r, 1, &res), 0);
    assert_true(res == 0 || res == -ENOENT);
    if (res == 0) {
        assert_true(page_ok(e->key, buf_at(c->f, 1), PAGE));
        c->served++;
    }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void test_crash(void **state)
{
    struct fx *f = *state;
    const char *env = getenv("KVT_CRASH_ROUNDS");
    int rounds = env ? atoi(env) : 100;
    uint64_t seed = now_ns(), rng = seed;
    size_t total = 0;

    need_io();
    print_message("crash test: %d rounds, seed %llu\n", rounds, (unsigned long long)seed);
    f->o.disk_bytes = CRASH_SLOTS * SLOT;
    for (int round = 0; round < rounds; round++) {
        struct crash_check c = {f, 0};
        int status;
        pid_t pid = fork();

        assert_true(pid >= 0);
        if (pid == 0)
            crash_child(f, (uint64_t)round + 1);
        usleep((useconds_t)(1000 + rng_mix(rng++) % 40000)); /* open, rebuild, batches */
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status)); /* it never stops on its own */
        assert_int_equal(dstore_open(&f->o, &f->s), 0);
        assert_int_equal(dstore_wait_ready(f->s), 0);
        assert_int_equal(dstore_iterate(f->s, crash_visit, &c), 0);
        total += c.served;
        dstore_close(f->s);
        f->s = NULL;
    }
    print_message("crash test: %zu pages verified\n", total);
    assert_true(total > 0);
}

/* ---- the two variants ---- */

static int probe_uring(void)
{
    char dir[64] = "/tmp/kvt-store-probe-XXXXXX";
    struct fx f = {0};
    int rc;

    if (!mkdtemp(dir))
        return -errno;
    snprintf(f.dir, sizeof(f.dir), "%s", dir);
    fx_options(&f);
    f.o.io = DSTORE_IO_URING;
    rc = dstore_open(&f.o, &f.s);
    dstore_close(f.s);
    rm_rf(dir);
    return rc;
}

static int use_uring(void **state)
{
    (void)state;
    io_kind = DSTORE_IO_URING;
    if (uring_err == 1)
        uring_err = probe_uring();
    if (uring_err)
        print_message("io_uring refused by this kernel or sandbox (%s): the io_uring variant "
                      "is skipped\n",
                      strerror(-uring_err));
    return 0;
}

static int use_psync(void **state)
{
    (void)state;
    io_kind = DSTORE_IO_PSYNC;
    return 0;
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_roundtrip_batched),
        T(test_async_poll),
        T(test_duplicates),
        T(test_bad_input),
        T(test_iterate),
        T(test_unaligned),
        T(test_direct_and_buffered),
        T(test_tmpfs),
        T(test_registered_buffers),
        T(test_uring_refused),
        T(test_restart),
        T(test_fingerprint),
        T(test_foreign_dir),
        T(test_format_version),
        T(test_locked),
        T(test_lock_probe),
        T(test_as_found),
        T(test_readonly),
        T(test_flipped_bytes),
        T(test_truncated_slab),
        T(test_garbled_index),
        T(test_faults),
        T(test_rebuild_failed),
        T(test_evict_keeps_batch_dup),
        T(test_lru_eviction),
        T(test_chain_ends_first),
        T(test_batch_larger_than_store),
        T(test_capacity_lowered),
        T(test_reader_beside_growth),
        T(test_not_regular_files),
        T(test_pinned_slot),
        T(test_wait_timeout),
        T(test_crash),
    };
    int failed = 0;

    failed += cmocka_run_group_tests_name("store_uring", tests, use_uring, NULL);
    failed += cmocka_run_group_tests_name("store_psync", tests, use_psync, NULL);
    return failed;
}
