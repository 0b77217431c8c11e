#include "store_test.h"

#include <linux/magic.h>
#include <sys/vfs.h>

/* ---- round trips ---- */

void test_roundtrip_batched(void **state)
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

/* A dir opened buffered (no O_DIRECT, its alignment never probed) writes, reads and reopens. */
void test_buffered_round_trip(void **state)
{
    struct fx *f = *state;

    f->o.flags |= DSTORE_BUFFERED;
    fx_open(f);
    assert_int_equal(stats_of(f).direct, 0);
    put_range(f, 1, 8);
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), 0);
    fx_reopen(f);
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), 0);
    assert_int_equal(get_id(f, 9), -ENOENT);
}

/* Several ops in flight at once, collected by poll in submission order. */
void test_async_poll(void **state)
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
        r[i] = (struct dstore_rpage){.key = keys[i], .buf = buf_at(f, 8 + (size_t)i)};
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
void test_duplicates(void **state)
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

/* Write the page of key (bytes from its key) and want its result. */
static void put_key(struct fx *f, const uint8_t *key, int want)
{
    uint8_t parent[KEY] = {7};
    uint32_t toks[TOKENS] = {0};
    struct dstore_wpage w = {
        .key = key, .parent = parent, .ns = NULL, .tokens = toks, .buf = buf_at(f, 0)};
    int res = 1;

    fill_page(key, buf_at(f, 0), PAGE);
    assert_int_equal(dstore_put(f->s, &w, 1, &res), 0);
    assert_int_equal(res, want);
}

/* Keys whose first 8 bytes (the slot table's tag) agree: the tag map holds one of them, and
 * a batch must still find the other stored (the map alone cannot say it is new). */
void test_duplicates_shared_tag(void **state)
{
    struct fx *f = *state;
    uint8_t a[KEY], b[KEY], c[KEY];

    fx_open(f);
    make_key(1, a);
    memcpy(b, a, KEY);
    b[KEY - 1] ^= 1;
    memcpy(c, a, KEY);
    c[KEY - 2] ^= 1;
    put_key(f, a, 0);
    put_key(f, b, 0);
    put_key(f, b, 0); /* b is not in the tag map: found through the index */
    put_key(f, a, 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.writes, 2);
    assert_int_equal(st.write_dups, 2);
    assert_int_equal(st.pages, 2);
    /* With a's entry gone, b is still not in the map, and still found. */
    assert_int_equal(dstore_delete(f->s, a, 1, NULL), 0);
    put_key(f, b, 0);
    put_key(f, c, 0); /* the tag's entry now, a new page */
    put_key(f, c, 0);
    st = stats_of(f);
    assert_int_equal(st.writes, 3);
    assert_int_equal(st.write_dups, 4);
    assert_int_equal(st.pages, 2);
    /* Once b goes the map is whole again; pages written again are found through it. */
    assert_int_equal(dstore_delete(f->s, b, 1, NULL), 0);
    put_key(f, a, 0);
    put_key(f, a, 0);
    put_key(f, c, 0);
    st = stats_of(f);
    assert_int_equal(st.writes, 4);
    assert_int_equal(st.write_dups, 6);
    assert_int_equal(st.pages, 2);
    fx_reopen(f); /* the rebuild links them again: both known after it */
    put_key(f, a, 0);
    put_key(f, c, 0);
    st = stats_of(f);
    assert_int_equal(st.writes, 0);
    assert_int_equal(st.write_dups, 2);
    assert_int_equal(st.pages, 2);
}

/* Bad pages fail alone; bad calls are refused whole. */
void test_bad_input(void **state)
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

void test_iterate(void **state)
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
void test_unaligned(void **state)
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
        r[i] = (struct dstore_rpage){.key = keys[i], .buf = mem + 1 + i * SMALL};
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
    /* packed: the page, its head (160 + 4 x 4 token bytes), in 64-byte steps */
    assert_int_equal(stats_of(f).slot_bytes, 1216);
    fx_reopen(f);
    assert_int_equal(dstore_get(f->s, r, 4, res), 0);
    assert_int_equal(res[3], 0);
    free(mem);
}

/* Whether dir is in memory (tmpfs), where the store neither goes direct nor (under AUTO)
 * uses io_uring: TMPDIR may put the tests there. */
static bool in_memory_dir(const char *dir)
{
    struct statfs sf;

    return statfs(dir, &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}

/* Whether the store goes O_DIRECT in dir: where O_DIRECT opens at all (it does on ext4 and
 * xfs; tmpfs on older kernels refuses) and the dir is not in memory. */
static bool direct_works(const char *dir)
{
    char path[128];
    int fd;

    if (in_memory_dir(dir))
        return false;

    snprintf(path, sizeof(path), "%s/probe", dir);
    fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd >= 0)
        close(fd);
    unlink(path);
    return fd >= 0;
}

void test_direct_and_buffered(void **state)
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

/* Pages below a block (a slot of one block) go through the page cache wherever O_DIRECT
 * works; they are synced like any (a reopen serves them) and read back exact. */
void test_small_pages_buffered(void **state)
{
    struct fx *f = *state;
    uint8_t key[KEY], *buf = buf_at(f, 0);
    uint32_t toks[TOKENS] = {0};
    uint8_t parent[KEY] = {7};

    f->o.page_bytes = 2048;
    fx_open(f);
    make_key(9, key);
    fill_page(key, buf, 2048);
    struct dstore_wpage w = {.key = key, .parent = parent, .ns = NULL, .tokens = toks, .buf = buf};
    int res = 1;
    assert_int_equal(dstore_put(f->s, &w, 1, &res), 0);
    assert_int_equal(res, 0);
    assert_int_equal(stats_of(f).direct, 0);
    fx_reopen(f);
    assert_int_equal(stats_of(f).direct, 0);
    memset(buf, 0, 2048);
    struct dstore_rpage r = {.key = key, .buf = buf};
    assert_int_equal(dstore_get(f->s, &r, 1, &res), 0);
    assert_int_equal(res, 0);
    assert_true(page_ok(key, buf, 2048));
}

/* On tmpfs, when there is one: O_DIRECT may be refused there, and must not matter; where it
 * is taken it is a copy through the page cache all the same, so the store writes buffered
 * (its writes then go beside each other, one slab file each), into slabs grown sparse. */
void test_tmpfs(void **state)
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
    assert_int_equal(stats_of(f).direct, 0);
    /* Grown sparse: the memory is taken as pages are written, not a growth step (1 MiB)
     * ahead under the file's lock. */
    char slab[128];
    struct stat st;
    snprintf(slab, sizeof(slab), "%s/slabs/0000.slab", dir);
    assert_int_equal(stat(slab, &st), 0);
    assert_true(st.st_size >= (off_t)(SLAB_HEAD_BYTES + 4 * SLOT));
    assert_true((uint64_t)st.st_blocks * 512 <= SLAB_HEAD_BYTES + 4 * SLOT);
    dstore_close(f->s);
    f->s = NULL;
    rm_rf(dir);
}

/* Pages inside the registered region go out as fixed-buffer I/O (io_uring only). */
void test_registered_buffers(void **state)
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
        r[i] = (struct dstore_rpage){.key = keys[i], .buf = pool + (4 + i) * PAGE};
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

void test_uring_refused(void **state)
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
    assert_int_equal(stats_of(f).io,
                     uring_err || in_memory_dir(f->dir) ? DSTORE_IO_PSYNC : DSTORE_IO_URING);
}

/* Pages in parts (dstore_wpage.parts): 32 parts of 2 KiB, scattered through aligned memory in
 * reverse order, go out and come back as one vectored I/O each, O_DIRECT where it works (the
 * parts are on 512 bytes), with the page's checksum over the parts in order; parts off 512
 * bytes go through the page cache; a reopen serves the pages whole. */
void test_parts(void **state)
{
    enum { PB = 65536, NP = 32, PL = PB / NP, N = 3 };
    struct fx *f = *state;
    uint8_t keys[N][KEY], *whole = NULL, *pool = NULL;
    void *parts[N][NP], *back[N][NP];
    uint32_t toks[TOKENS] = {0};
    struct dstore_wpage w[N];
    struct dstore_rpage r[N];
    int res[N];
    bool direct = direct_works(f->dir);

    f->o.page_bytes = PB;
    fx_open(f);
    assert_int_equal(posix_memalign((void **)&whole, 4096, N * PB), 0);
    assert_int_equal(posix_memalign((void **)&pool, 4096, 2 * N * PB + 512), 0);
    for (int i = 0; i < N; i++) {
        make_key(700 + (uint64_t)i, keys[i]);
        fill_page(keys[i], whole + i * PB, PB);
        for (int k = 0; k < NP; k++) {
            /* reversed, and the read side shifted half a part: no two parts adjacent in order */
            parts[i][k] = pool + ((size_t)i * NP + (NP - 1 - (size_t)k)) * PL;
            back[i][k] = pool + N * PB + 512 + ((size_t)i * NP + (NP - 1 - (size_t)k)) * PL;
            memcpy(parts[i][k], whole + i * PB + k * PL, PL);
        }
        w[i] = (struct dstore_wpage){
            .key = keys[i], .tokens = toks, .parts = (const void *const *)parts[i], .nparts = NP};
    }
    /* back[] sits 512 bytes off 4 KiB, still on 512: O_DIRECT where the disk takes 512 */
    assert_int_equal(dstore_put(f->s, w, N, res), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(res[i], 0);
    assert_int_equal(stats_of(f).direct, direct);
    for (int i = 0; i < N; i++)
        r[i] = (struct dstore_rpage){.key = keys[i], .parts = back[i], .nparts = NP};
    assert_int_equal(dstore_get(f->s, r, N, res), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i], 0);
        for (int k = 0; k < NP; k++)
            assert_memory_equal(back[i][k], whole + i * PB + k * PL, PL);
    }
    /* Parts off 512 bytes: the page cache carries them, the bytes the same. */
    for (int k = 0; k < NP; k++)
        back[0][k] = (uint8_t *)back[0][k] + 1;
    fx_reopen(f);
    for (int i = 0; i < N; i++)
        memset(back[i][0], 0, PL);
    r[0] = (struct dstore_rpage){.key = keys[0], .parts = back[0], .nparts = NP};
    r[1] = (struct dstore_rpage){.key = keys[1], .buf = whole + PB}; /* whole, after parts */
    memset(whole + PB, 0, PB);
    assert_int_equal(dstore_get(f->s, r, 2, res), 0);
    assert_int_equal(res[0], 0);
    assert_int_equal(res[1], 0);
    assert_true(page_ok(keys[1], whole + PB, PB));
    for (int k = 0; k < NP; k++) {
        uint8_t want[PL];
        fill_page(keys[0], whole, PB);
        memcpy(want, whole + k * PL, PL);
        assert_memory_equal(back[0][k], want, PL);
    }
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.err_checksum + st.err_read_io + st.err_write_io, 0);
    free(whole);
    free(pool);
}

/* Parts in runs that lie back to back in memory (as a host pool's pages often do) go to the
 * disk as one region a run: the bytes land where each part says, both ways. */
void test_parts_adjacent(void **state)
{
    enum { PB = 65536, NP = 32, PL = PB / NP, RUN = 4 };
    struct fx *f = *state;
    uint8_t key[KEY], *whole = NULL, *pool = NULL;
    void *parts[NP], *back[NP];
    uint32_t toks[TOKENS] = {0};
    size_t span = (size_t)(NP / RUN) * (RUN + 1) * PL; /* a part's gap after every run */
    int res;

    f->o.page_bytes = PB;
    fx_open(f);
    assert_int_equal(posix_memalign((void **)&whole, 4096, PB), 0);
    assert_int_equal(posix_memalign((void **)&pool, 4096, 2 * span), 0);
    memset(pool, 0xa5, 2 * span);
    make_key(800, key);
    fill_page(key, whole, PB);
    for (int k = 0; k < NP; k++) {
        size_t at = ((size_t)(k / RUN) * (RUN + 1) + (size_t)(k % RUN)) * PL;

        parts[k] = pool + at;
        back[k] = pool + span + at;
        memcpy(parts[k], whole + (size_t)k * PL, PL);
    }
    struct dstore_wpage w = {
        .key = key, .tokens = toks, .parts = (const void *const *)parts, .nparts = NP};
    struct dstore_rpage r = {.key = key, .parts = back, .nparts = NP};

    assert_int_equal(dstore_put(f->s, &w, 1, &res), 0);
    assert_int_equal(res, 0);
    fx_reopen(f);
    assert_int_equal(dstore_get(f->s, &r, 1, &res), 0);
    assert_int_equal(res, 0);
    for (int k = 0; k < NP; k++)
        assert_memory_equal(back[k], whole + (size_t)k * PL, PL);
    for (int g = 0; g < NP / RUN; g++) /* the gaps untouched */
        for (size_t b = 0; b < PL; b++)
            assert_int_equal(pool[span + ((size_t)g * (RUN + 1) + RUN) * PL + b], 0xa5);
    free(whole);
    free(pool);
}
