#include "store_test.h"

/* ---- the write pipe's crash order (durable mode) ----
 *
 * Write batches fly while earlier ones sync and commit (src/disk/batch.c). Whatever the
 * timing, no record may reach the index before the bytes it names are durable. A child writes
 * with several ops in flight through a fault seam that holds some page writes back (the psync
 * engine's threads then land later batches first) and that, before each slab's fdatasync,
 * copies the slab as it stands: every byte that sync covers for a record had landed when the
 * sync was asked for, so it is in the copy. Then the seam sleeps a little, so that batches
 * land while the sync runs. The parent kills the child at a random moment and leaves of each
 * slab only its last copy, as a power cut would (a slab never synced keeps its head alone),
 * and the index as the child left it, every commit in. Every record must then name bytes of
 * the copies: each page is served byte-exact or missed, and no checksum fails. A group that
 * took a batch still in flight, or one that landed after its sync was asked for, fails this.
 */

#define ORDER_SLOTS 48
#define ORDER_SLAB_SLOTS 16
#define ORDER_WINDOW 4 /* ops in flight */
#define ORDER_PAGES 6  /* pages per op at most */

struct order_seam {
    char live[96];   /* the dir's slabs/ */
    char copies[96]; /* the slabs as last synced */
    uint64_t seed;
    _Atomic uint64_t calls;
};

static void slab_path(const char *dir, uint32_t slab, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%04u.slab", dir, slab);
}

/* Copy a whole file to to, atomically (a kill mid-copy leaves the last copy whole). */
static bool copy_file(const char *from, const char *to)
{
    char tmp[128];
    struct stat st;
    int in = open(from, O_RDONLY), out;
    bool ok = false;
    uint8_t *buf;

    if (in < 0)
        return false;
    snprintf(tmp, sizeof(tmp), "%s.tmp", to);
    out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out >= 0 && !fstat(in, &st) && (buf = malloc(st.st_size ? (size_t)st.st_size : 1))) {
        ok = pread(in, buf, (size_t)st.st_size, 0) == st.st_size &&
             pwrite(out, buf, (size_t)st.st_size, 0) == st.st_size && !rename(tmp, to);
        free(buf);
    }
    if (out >= 0)
        close(out);
    close(in);
    return ok;
}

/* No cmocka here: it runs in the child, on the store's threads. */
static int order_inject(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct order_seam *o = arg;
    uint64_t r = rng_mix(o->seed + atomic_fetch_add(&o->calls, 1));
    char from[128], to[128];

    (void)slot;
    if (pt == DSTORE_FAULT_WRITE && r % 4 == 0)
        usleep((useconds_t)(200 + r % 3000)); /* held back: later writes land first */
    if (pt == DSTORE_FAULT_SYNC) {
        slab_path(o->live, slab, from, sizeof(from));
        slab_path(o->copies, slab, to, sizeof(to));
        if (!copy_file(from, to))
            _exit(6);
        usleep((useconds_t)(r % 2000)); /* batches land while the sync runs */
    }
    return 0;
}

/* Queue pages first .. first + n - 1 from bufs; no cmocka (the child). */
static int order_write(struct dstore *s, uint8_t *bufs, uint64_t first, size_t n, int *res,
                       uint64_t *op)
{
    uint8_t keys[ORDER_PAGES][KEY], parent[KEY] = {7};
    uint32_t toks[ORDER_PAGES][TOKENS];
    struct dstore_wpage w[ORDER_PAGES];

    for (size_t i = 0; i < n; i++) {
        make_key(first + i, keys[i]);
        tokens_of(first + i, toks[i]);
        fill_page(keys[i], bufs + i * PAGE, PAGE);
        w[i] = (struct dstore_wpage){.key = keys[i],
                                     .parent = parent,
                                     .ns = NULL,
                                     .tokens = toks[i],
                                     .buf = bufs + i * PAGE};
    }
    return dstore_write(s, w, n, res, op);
}

/* The child: ops of fresh pages, ORDER_WINDOW in flight, evicting all along and now and then
 * deleting a page (a delete waits for the pipe to drain). Killed by the parent. */
static void order_child(struct fx *f, uint64_t round)
{
    uint8_t *bufs = aligned_alloc(4096, (size_t)ORDER_WINDOW * ORDER_PAGES * PAGE);
    int res[ORDER_WINDOW][ORDER_PAGES];
    uint64_t ops[ORDER_WINDOW], next = round * 1000000;
    size_t head = 0, live = 0;
    struct dstore *s;
    uint8_t key[KEY];

    if (!bufs || dstore_open(&f->o, &s))
        _exit(3);
    for (uint64_t n = 0;; n++) {
        size_t k = (head + live) % ORDER_WINDOW, pages = 1 + n % ORDER_PAGES;

        if (live == ORDER_WINDOW) {
            if (dstore_wait(s, ops[head], NULL))
                _exit(4);
            head = (head + 1) % ORDER_WINDOW;
            live--;
            k = (head + live) % ORDER_WINDOW;
        }
        if (order_write(s, bufs + k * ORDER_PAGES * PAGE, next, pages, res[k], &ops[k]))
            _exit(5);
        next += pages;
        live++;
        if (n % 13 == 12) {
            make_key(next - 1, key);
            dstore_delete(s, key, 1, NULL);
        }
    }
}

/* What a power cut leaves of the slabs: each as last synced; one never synced, its head. */
static void order_cut(struct fx *f, const struct order_seam *o)
{
    for (uint32_t slab = 0; slab < ORDER_SLOTS / ORDER_SLAB_SLOTS; slab++) {
        char live[128], copy[128];
        struct stat st;
        int fd;

        slab_path(o->live, slab, live, sizeof(live));
        slab_path(o->copies, slab, copy, sizeof(copy));
        if (stat(live, &st))
            continue;
        if (copy_file(copy, live))
            continue;
        fd = open(live, O_WRONLY);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, LAYOUT_BLOCK), 0);
        assert_int_equal(ftruncate(fd, st.st_size), 0);
        close(fd);
    }
    (void)f;
}

/* The slabs as they stand, all durable (the parent closed the store cleanly): the copies
 * a child starts from. */
static void order_baseline(const struct order_seam *o)
{
    for (uint32_t slab = 0; slab < ORDER_SLOTS / ORDER_SLAB_SLOTS; slab++) {
        char live[128], copy[128];

        slab_path(o->live, slab, live, sizeof(live));
        slab_path(o->copies, slab, copy, sizeof(copy));
        if (!copy_file(live, copy))
            unlink(copy);
    }
}

void test_pipe_order(void **state)
{
    struct fx *f = *state;
    const char *env = getenv("KVT_ORDER_ROUNDS");
    int rounds = env ? atoi(env) : 40;
    struct order_seam seam = {.seed = (uint64_t)time(NULL)};
    struct dstore_faults faults = {order_inject, &seam};
    uint64_t rng = seam.seed;
    size_t total = 0;

    need_io();
    snprintf(seam.live, sizeof(seam.live), "%s/slabs", f->dir);
    snprintf(seam.copies, sizeof(seam.copies), "%s.synced", f->dir);
    assert_int_equal(mkdir(seam.copies, 0700), 0);
    print_message("pipe order: %d rounds, seed %llu\n", rounds, (unsigned long long)seam.seed);
    f->o.disk_bytes = ORDER_SLOTS * SLOT;
    f->o.slab_bytes = ORDER_SLAB_SLOTS * SLOT;
    for (int round = 0; round < rounds; round++) {
        struct readback c = {f, false, 0};
        struct dstore_stats st;
        int status;
        pid_t pid;

        order_baseline(&seam);
        f->o.faults = &faults;
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            order_child(f, (uint64_t)round + 1);
        usleep((useconds_t)(5000 + rng_mix(rng++) % 60000));
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status)); /* it never stops on its own */
        order_cut(f, &seam);
        f->o.faults = NULL;
        assert_int_equal(dstore_open(&f->o, &f->s), 0);
        assert_int_equal(dstore_wait_ready(f->s), 0);
        assert_int_equal(dstore_iterate(f->s, readback_visit, &c), 0);
        dstore_stats(f->s, &st);
        assert_int_equal(st.err_checksum, 0); /* a record named bytes not synced */
        total += c.served;
        dstore_close(f->s);
        f->s = NULL;
    }
    rm_rf(seam.copies);
    print_message("pipe order: %zu pages verified, 0 checksum failures\n", total);
    assert_true(total > 0);
}

/* ---- a key written again while its first write flies ---- */

struct hold_seam {
    _Atomic int state; /* 0: hold the next write; 1: holding it; 2: released */
};

static int hold_inject(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct hold_seam *h = arg;
    int want = 0;

    (void)slab;
    (void)slot;
    if (pt != DSTORE_FAULT_WRITE || !atomic_compare_exchange_strong(&h->state, &want, 1))
        return 0;
    while (atomic_load(&h->state) == 1)
        usleep(1000);
    return 0;
}

/* Two ops of the same key, the second queued while the first one's batch is in flight: the
 * second must find the page stored (one write, one dup, one record), as it would had the first
 * committed before it started; a second batch writing the key beside the first would leave
 * two slots holding it. */
void test_pipe_same_key(void **state)
{
    struct fx *f = *state;
    struct hold_seam hold = {0};
    struct dstore_faults faults = {hold_inject, &hold};
    uint8_t key[KEY], parent[KEY] = {7};
    uint32_t toks[TOKENS];
    struct dstore_wpage w = {
        .key = key, .parent = parent, .ns = NULL, .tokens = toks, .buf = buf_at(f, 0)};
    uint64_t op[2];
    int res[2] = {1, 1};

    f->o.faults = &faults;
    fx_open(f);
    make_key(42, key);
    tokens_of(42, toks);
    fill_page(key, buf_at(f, 0), PAGE);
    assert_int_equal(dstore_write(f->s, &w, 1, &res[0], &op[0]), 0);
    while (atomic_load(&hold.state) != 1)
        usleep(1000); /* the first batch is in flight, its write held */
    assert_int_equal(dstore_write(f->s, &w, 1, &res[1], &op[1]), 0);
    usleep(50000); /* time for the committer to take the second op */
    atomic_store(&hold.state, 2);
    assert_int_equal(dstore_wait(f->s, op[0], NULL), 0);
    assert_int_equal(dstore_wait(f->s, op[1], NULL), 0);
    assert_int_equal(res[0], 0);
    assert_int_equal(res[1], 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.writes, 1);
    assert_int_equal(st.write_dups, 1);
    assert_int_equal(st.pages, 1);
    assert_int_equal(get_id(f, 42), 0);
    fx_close(f);
}

/* ---- reads ahead of writes in the I/O engine's queue ---- */

struct held {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool holding, released;
    char order[16]; /* requests by name ('w' + k or 'r' + k) as they completed */
    int n;
};

/* The first request an engine thread takes waits here until released. */
static int hold_first(void *arg, enum dstore_fault_point point, uint32_t slab, uint32_t slot)
{
    struct held *h = arg;

    (void)point;
    (void)slab;
    (void)slot;
    pthread_mutex_lock(&h->mu);
    if (!h->holding) {
        h->holding = true;
        pthread_cond_broadcast(&h->cv);
        while (!h->released)
            pthread_cond_wait(&h->cv, &h->mu);
    }
    pthread_mutex_unlock(&h->mu);
    return 0;
}

static struct held *g_held;

static void note_done(struct dio_req *r)
{
    pthread_mutex_lock(&g_held->mu);
    g_held->order[g_held->n++] = (char)(uintptr_t)r->ctx;
    pthread_cond_broadcast(&g_held->cv);
    pthread_mutex_unlock(&g_held->mu);
}

/* The queue's order alone: reads first, each kind in order, a short transfer's rest ahead of
 * its kind. And through the psync engine with one worker, its first write held: reads
 * submitted after three more writes complete before them. */
void test_reads_before_writes(void **state)
{
    struct fx *f = *state;
    struct dio_req q[6] = {0};
    struct dio_q dq = {0};
    const char *names = "WRwrXY";
    char got[8] = {0};

    for (int i = 0; i < 6; i++) {
        q[i].write = names[i] == 'W' || names[i] == 'w' || names[i] == 'X';
        q[i].ctx = (void *)(uintptr_t)names[i];
    }
    dio_q_push(&dq, &q[0]);       /* W */
    dio_q_push(&dq, &q[1]);       /* R */
    dio_q_push(&dq, &q[2]);       /* w */
    dio_q_push(&dq, &q[3]);       /* r */
    dio_q_push_front(&dq, &q[4]); /* X: a write continued, ahead of the writes */
    dio_q_push_front(&dq, &q[5]); /* Y: a read continued, ahead of everything */
    for (int i = 0; i < 6; i++)
        got[i] = (char)(uintptr_t)dio_q_pop(&dq)->ctx;
    assert_string_equal(got, "YRrXWw");
    assert_null(dio_q_pop(&dq));
    assert_null(dq.head);
    assert_null(dq.tail);
    assert_null(dq.rlast);

    /* The engine. */
    char path[512];
    static uint8_t buf[6][4096] __attribute__((aligned(4096)));
    struct held h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct dstore_faults faults = {hold_first, &h};
    struct dio_config cfg = {.kind = DSTORE_IO_PSYNC, .threads = 1, .faults = &faults};
    struct dio *io;
    int fd;

    snprintf(path, sizeof(path), "%s/file", f->dir);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 6 * 4096), 0);
    g_held = &h;
    assert_int_equal(dio_create(&cfg, &io), 0);
    memset(q, 0, sizeof(q));
    for (int i = 0; i < 6; i++)
        q[i] = (struct dio_req){.complete = note_done,
                                .ctx = (void *)(uintptr_t) "wwwwrr"[i],
                                .buf = buf[i],
                                .off = (uint64_t)i * 4096,
                                .len = 4096,
                                .fd = fd,
                                .write = i < 4};
    dio_submit(io, &q[0]); /* the worker takes it and is held */
    pthread_mutex_lock(&h.mu);
    while (!h.holding)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    q[1].next = &q[2];
    q[2].next = &q[3];
    dio_submit(io, &q[1]); /* three writes queued */
    q[4].next = &q[5];
    dio_submit(io, &q[4]); /* then two reads */
    pthread_mutex_lock(&h.mu);
    h.released = true;
    pthread_cond_broadcast(&h.cv);
    while (h.n < 6)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    assert_string_equal(h.order, "wrrwww");
    for (int i = 0; i < 6; i++)
        assert_int_equal(q[i].res, 0);
    dio_destroy(io);
    close(fd);
    g_held = NULL;
}

/* ---- a group waits for the batches in flight behind it ---- */

struct late_seam {
    _Atomic int64_t first; /* the first page's slot (-1: none yet) */
    _Atomic int held;      /* 1 once a write of another page was held */
};

/* The first write of a page other than the first one written waits 100 ms: the psync engine's
 * other threads land the rest meanwhile, so the first batch lands while the second flies. */
static int late_inject(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct late_seam *l = arg;
    int64_t me = (int64_t)slab << 32 | slot, none = -1;
    int no = 0;

    if (pt != DSTORE_FAULT_WRITE)
        return 0;
    if (atomic_compare_exchange_strong(&l->first, &none, me) || me == atomic_load(&l->first))
        return 0;
    if (atomic_compare_exchange_strong(&l->held, &no, 1))
        usleep(100000);
    return 0;
}

static double secs_since(const struct timespec *t0)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Four one-page batches queued at once, the second one's write held: the first lands alone,
 * and must wait for the other three (group_wait_us is far longer than the hold here) so that
 * all four share one fdatasync of their slab and one commit. A lone batch never waits for the
 * window: a write waited for alone completes at once. */
void test_group_commit(void **state)
{
    struct fx *f = *state;
    struct late_seam late = {-1, 0};
    struct dstore_faults faults = {late_inject, &late};
    uint8_t keys[5][KEY], parent[KEY] = {9};
    uint32_t toks[5][TOKENS];
    struct dstore_wpage w[5];
    struct dstore_stats a, b;
    struct timespec t0;
    uint64_t op[5];
    int res[5];

    f->o.io = DSTORE_IO_PSYNC; /* one thread held, the others go on */
    f->o.max_batch = 1;        /* each op a batch */
    f->o.group_wait_us = 5000000;
    f->o.faults = &faults;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    for (int i = 0; i < 5; i++) {
        make_key(700 + (uint64_t)i, keys[i]);
        tokens_of(700 + (uint64_t)i, toks[i]);
        fill_page(keys[i], buf_at(f, (size_t)i), PAGE);
        w[i] = (struct dstore_wpage){
            .key = keys[i], .parent = parent, .tokens = toks[i], .buf = buf_at(f, (size_t)i)};
        res[i] = 1;
    }
    a = stats_of(f);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dstore_write(f->s, &w[i], 1, &res[i], &op[i]), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dstore_wait(f->s, op[i], NULL), 0);
        assert_int_equal(res[i], 0);
    }
    b = stats_of(f);
    assert_int_equal(atomic_load(&late.held), 1);
    assert_int_equal(b.writes - a.writes, 4);
    assert_int_equal(b.groups - a.groups, 1);
    assert_int_equal(b.commits - a.commits, 1);
    assert_int_equal(b.slab_syncs - a.slab_syncs, 1); /* four slots of one slab */
    assert_int_equal(b.index_flushes - a.index_flushes, 0);

    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(dstore_write(f->s, &w[4], 1, &res[4], &op[4]), 0);
    assert_int_equal(dstore_wait(f->s, op[4], NULL), 0);
    assert_int_equal(res[4], 0);
    assert_true(secs_since(&t0) < 2.5); /* not the 5 s window */
    a = stats_of(f);
    assert_int_equal(a.groups - b.groups, 1);
    assert_int_equal(a.commits - b.commits, 1);
    for (int i = 0; i < 5; i++)
        assert_int_equal(get_id(f, 700 + (uint64_t)i), 0);
    fx_close(f);
}
