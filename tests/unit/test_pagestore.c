/*
 * The public page store (include/kvtier_store.h), through the shared library's exports only:
 * pages of one and of several segments round trip byte for byte; runs, deletes and clear; a
 * restart keeps the pages and refuses another fingerprint or page size; asynchronous ops
 * with the eventfd; bad arguments refused before anything changes; a read-only store; damaged
 * slabs give misses, never bytes; three threads calling exists, get and set at once, as
 * SGLang's controller does, never see a wrong byte; stores of one dir in one process
 * (readers beside a writer, on threads, beside the engine's disk tier) share one LMDB
 * environment, so that none breaks another; a touch keeps a page from being evicted first,
 * and relaxed sync keeps pages across a reopen; with a remote (a redis-server of the test's
 * own), a second store on another disk is served what the first wrote, exact, and a server
 * stopped (SIGSTOP) costs hits within the timeout while the disk serves on.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvtier_store.h"

#include "engine_fixture.h"
#ifdef KVT_HAVE_REDIS
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#endif

#define SEG 6000 /* two segments: a page is not a whole number of 4 KiB blocks */
#define PAGE (2 * SEG)
#define NP 48

static const char FP[] = "model=test/weights=r1/dtype=bf16/layout=page_first/tp=0of1";

static void key_of(uint32_t i, uint8_t key[KVT_PAGESTORE_KEY_BYTES])
{
    memset(key, 0, KVT_PAGESTORE_KEY_BYTES);
    memcpy(key, &i, sizeof(i));
    key[31] = 0xc3;
}

/* Page i's bytes: a function of i alone, so any page read can be checked. */
static void bytes_of(uint32_t i, uint8_t *buf)
{
    uint64_t z = (i + 7) * 0x9E3779B97F4A7C15ull;

    for (size_t b = 0; b < PAGE; b++) {
        z ^= z >> 31;
        z *= 0xBF58476D1CE4E5B9ull;
        buf[b] = (uint8_t)(z >> 56);
    }
}

struct fixture {
    char dir[128];
    kvt_pagestore *s;
};

/* A store's options at dir (capacity 0: the default). */
static void options_at(struct kvt_pagestore_options *o, const char *dir, const char *fp,
                       uint64_t page_bytes, uint64_t capacity)
{
    kvt_pagestore_options_init(o, sizeof(*o));
    o->dir = dir;
    o->fingerprint = fp;
    o->fingerprint_len = strlen(fp);
    o->page_bytes = page_bytes;
    o->page_tokens = 16;
    if (capacity)
        o->capacity_bytes = capacity;
}

static int open_at(const char *dir, const char *fp, uint64_t page_bytes, uint64_t capacity,
                   uint32_t ro, kvt_pagestore **s)
{
    struct kvt_pagestore_options o;

    options_at(&o, dir, fp, page_bytes, capacity);
    o.read_only = ro;
    return kvt_pagestore_open(&o, s);
}

static void fx_open(struct fixture *f)
{
    assert_int_equal(fixture_data_dir(f->dir, sizeof(f->dir), "pagestore"), 0);
    assert_int_equal(open_at(f->dir, FP, PAGE, 0, 0, &f->s), 0);
}

static void fx_close(struct fixture *f)
{
    kvt_pagestore_close(f->s);
    fixture_remove_tree(f->dir);
}

/* Pages [first, first + n): keys, the bytes (bufs, n pages) and descriptors. Even pages are
 * two segments (K then V, apart in memory as in SGLang's pool), odd ones one. */
struct batch {
    uint8_t keys[NP][KVT_PAGESTORE_KEY_BYTES];
    uint8_t *bufs;
    struct kvt_segment segs[NP][2];
    struct kvt_page pages[NP];
    int res[NP];
};

static struct batch *batch_new(uint32_t first, uint32_t n, bool fill)
{
    struct batch *b = calloc(1, sizeof(*b));

    assert_non_null(b);
    assert_true(n <= NP);
    b->bufs = calloc(n, 2 * PAGE); /* room for a gap between K and V */
    assert_non_null(b->bufs);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *p = b->bufs + (size_t)i * 2 * PAGE;
        key_of(first + i, b->keys[i]);
        if (fill) {
            bytes_of(first + i, p);
            memmove(p + PAGE + 64, p + SEG, SEG); /* V lives elsewhere */
        }
        bool two = (first + i) % 2 == 0;
        b->segs[i][0] = (struct kvt_segment){p, two ? SEG : PAGE};
        b->segs[i][1] = (struct kvt_segment){p + PAGE + 64, SEG};
        b->pages[i] = (struct kvt_page){.key = b->keys[i],
                                        .parent = i ? b->keys[i - 1] : NULL,
                                        .segs = b->segs[i],
                                        .nsegs = two ? 2 : 1};
        if (!two && fill)
            memcpy(p + SEG, p + PAGE + 64, SEG);
    }
    return b;
}

static void batch_free(struct batch *b)
{
    free(b->bufs);
    free(b);
}

/* Whether page i of b (read) holds page first+i's bytes. */
static bool exact(const struct batch *b, uint32_t first, uint32_t i)
{
    uint8_t want[PAGE], got[PAGE];
    const struct kvt_page *p = &b->pages[i];

    bytes_of(first + i, want);
    memcpy(got, p->segs[0].addr, p->segs[0].len);
    if (p->nsegs == 2)
        memcpy(got + SEG, p->segs[1].addr, SEG);
    return memcmp(got, want, PAGE) == 0;
}

static void put_range(kvt_pagestore *s, uint32_t first, uint32_t n)
{
    struct batch *b = batch_new(first, n, true);

    assert_int_equal(kvt_pagestore_set(s, b->pages, n, b->res), 0);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(b->res[i], 0);
    batch_free(b);
}

/* Read [first, first + n): how many came back exact; every page is exact or a miss. */
static uint32_t get_range(kvt_pagestore *s, uint32_t first, uint32_t n, int *res)
{
    struct batch *b = batch_new(first, n, false);
    uint32_t ok = 0;

    assert_int_equal(kvt_pagestore_get(s, b->pages, n, b->res), 0);
    for (uint32_t i = 0; i < n; i++) {
        if (res)
            res[i] = b->res[i];
        if (b->res[i] == 0) {
            assert_true(exact(b, first, i));
            ok++;
        } else {
            assert_true(b->res[i] == -ENOENT || b->res[i] == KVT_ECORRUPT);
        }
    }
    batch_free(b);
    return ok;
}

static size_t run_of(kvt_pagestore *s, uint32_t first, uint32_t n)
{
    uint8_t keys[NP][KVT_PAGESTORE_KEY_BYTES];
    size_t run = 999;

    for (uint32_t i = 0; i < n; i++)
        key_of(first + i, keys[i]);
    assert_int_equal(kvt_pagestore_exists(s, &keys[0][0], n, &run), 0);
    return run;
}

static void test_round_trip(void **state)
{
    struct fixture f;
    struct kvt_pagestore_stats st = {.size = sizeof(st)};
    uint8_t keys[2][KVT_PAGESTORE_KEY_BYTES];
    size_t deleted = 0;

    (void)state;
    fx_open(&f);
    put_range(f.s, 0, 32);
    assert_int_equal(run_of(f.s, 0, 32), 32);
    assert_int_equal(run_of(f.s, 30, 4), 2);
    assert_int_equal(get_range(f.s, 0, 32, NULL), 32);
    assert_int_equal(kvt_pagestore_stats(f.s, &st), 0);
    assert_int_equal(st.pages, 32);
    assert_int_equal(st.page_bytes, PAGE);
    assert_int_equal(st.get_hits, 32);
    assert_int_equal(st.errors, 0);
    put_range(f.s, 0, 4); /* again: stored already */
    assert_int_equal(kvt_pagestore_stats(f.s, &st), 0);
    assert_int_equal(st.set_dups, 4);
    key_of(5, keys[0]);
    key_of(99, keys[1]);
    assert_int_equal(kvt_pagestore_delete(f.s, &keys[0][0], 2, &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_int_equal(run_of(f.s, 0, 32), 5);
    assert_int_equal(kvt_pagestore_clear(f.s), 0);
    assert_int_equal(run_of(f.s, 0, 32), 0);
    assert_int_equal(kvt_pagestore_stats(f.s, &st), 0);
    assert_int_equal(st.pages, 0);
    fx_close(&f);
}

static void test_restart_and_fingerprint(void **state)
{
    struct fixture f;
    kvt_pagestore *other = (kvt_pagestore *)1;

    (void)state;
    fx_open(&f);
    put_range(f.s, 100, 20);
    kvt_pagestore_close(f.s);
    assert_int_equal(open_at(f.dir, "another model", PAGE, 0, 0, &other), KVT_EFINGERPRINT);
    assert_null(other);
    assert_int_not_equal(open_at(f.dir, FP, PAGE + 4096, 0, 0, &other), 0);
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 0, &f.s), 0);
    assert_int_equal(run_of(f.s, 100, 20), 20);
    assert_int_equal(get_range(f.s, 100, 20, NULL), 20);
    fx_close(&f);
}

static void test_async_and_eventfd(void **state)
{
    struct fixture f;
    struct batch *w, *r;
    uint64_t op = 0, op2 = 0;
    size_t ok = 0;

    (void)state;
    fx_open(&f);
    int efd = kvt_pagestore_event_fd(f.s);
    assert_true(efd >= 0);
    w = batch_new(200, 16, true);
    assert_int_equal(kvt_pagestore_submit_set(f.s, w->pages, 16, w->res, &op), 0);
    struct pollfd p = {efd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 10000), 1); /* readable once an op completed */
    uint64_t count = 0;
    assert_int_equal(read(efd, &count, sizeof(count)), (ssize_t)sizeof(count));
    assert_true(count >= 1);
    assert_int_equal(kvt_pagestore_wait(f.s, op, -1, &ok), 0);
    assert_int_equal(ok, 16);
    assert_int_equal(kvt_pagestore_wait(f.s, op, 0, &ok), -ENOENT);
    assert_int_equal(kvt_pagestore_wait(f.s, op + 100, 0, &ok), -EINVAL);
    r = batch_new(200, 16, false);
    assert_int_equal(kvt_pagestore_submit_get(f.s, r->pages, 16, r->res, &op2), 0);
    assert_int_equal(kvt_pagestore_wait(f.s, op2, -1, &ok), 0);
    assert_int_equal(ok, 16);
    for (uint32_t i = 0; i < 16; i++)
        assert_true(exact(r, 200, i));
    batch_free(w);
    batch_free(r);
    fx_close(&f);
}

static void test_bad_arguments(void **state)
{
    struct fixture f;
    struct kvt_pagestore_options o;
    kvt_pagestore *s = NULL, *ro = NULL;
    struct batch *b;
    size_t run = 0;

    (void)state;
    fx_open(&f);
    kvt_pagestore_options_init(&o, sizeof(o));
    assert_int_equal(kvt_pagestore_open(&o, &s), -EINVAL); /* no dir, no fingerprint */
    assert_int_equal(kvt_pagestore_open(NULL, &s), -EINVAL);
    o.dir = f.dir;
    o.page_bytes = PAGE;
    assert_int_equal(kvt_pagestore_open(&o, &s), -EINVAL); /* no fingerprint */
    o.fingerprint = FP;
    o.fingerprint_len = strlen(FP);
    o.page_bytes = (1ull << 31) + 1; /* past the largest page */
    assert_int_equal(kvt_pagestore_open(&o, &s), -EINVAL);
    o.page_bytes = PAGE;
    o.page_tokens = 4097;
    assert_int_equal(kvt_pagestore_open(&o, &s), -EINVAL);
    o.page_tokens = 0;
    o.disk_io = 7;
    assert_int_equal(kvt_pagestore_open(&o, &s), -EINVAL);
    o.disk_io = 0;
    o.size = sizeof(o) + 8; /* a newer caller's struct: its unknown fields must be zero */
    struct {
        struct kvt_pagestore_options o;
        uint64_t more;
    } newer = {o, 1};
    assert_int_equal(kvt_pagestore_open(&newer.o, &s), -EINVAL);
    assert_null(s);
    b = batch_new(300, 4, true);
    b->segs[0][1].len = SEG - 1; /* the segments no longer add up to a page */
    assert_int_equal(kvt_pagestore_set(f.s, b->pages, 4, b->res), -EINVAL);
    assert_int_equal(run_of(f.s, 300, 4), 0); /* nothing of the batch was stored */
    b->segs[0][1].len = SEG;
    b->pages[2].key = NULL;
    assert_int_equal(kvt_pagestore_get(f.s, b->pages, 4, b->res), -EINVAL);
    assert_int_equal(kvt_pagestore_exists(f.s, NULL, 2, &run), -EINVAL);
    assert_int_equal(kvt_pagestore_exists(NULL, b->keys[0], 1, &run), -EINVAL);
    b->pages[2].key = b->keys[2];
    assert_int_equal(kvt_pagestore_set(f.s, b->pages, 4, b->res), 0);
    /* A read-only view beside the writer serves, and refuses to write. */
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 1, &ro), 0);
    assert_int_equal(kvt_pagestore_set(ro, b->pages, 4, b->res), -EROFS);
    assert_int_equal(kvt_pagestore_clear(ro), -EROFS);
    assert_int_equal(get_range(ro, 300, 4, NULL), 4);
    kvt_pagestore_close(ro);
    batch_free(b);
    kvt_pagestore_close(NULL);
    fx_close(&f);
}

/* A segment of no bytes may have no address: nothing is copied for it (UBSan: no memcpy from
 * NULL), and the page round trips through the other two. */
static void test_empty_segment(void **state)
{
    struct fixture f;
    uint8_t key[KVT_PAGESTORE_KEY_BYTES], page[PAGE], k[SEG], v[SEG];
    int res = 1;

    (void)state;
    fx_open(&f);
    key_of(777, key);
    bytes_of(777, page);
    memcpy(k, page, SEG);
    memcpy(v, page + SEG, SEG);
    struct kvt_segment segs[3] = {{k, SEG}, {NULL, 0}, {v, SEG}};
    struct kvt_page p = {.key = key, .segs = segs, .nsegs = 3};
    assert_int_equal(kvt_pagestore_set(f.s, &p, 1, &res), 0);
    assert_int_equal(res, 0);
    memset(k, 0, SEG);
    memset(v, 0, SEG);
    assert_int_equal(kvt_pagestore_get(f.s, &p, 1, &res), 0);
    assert_int_equal(res, 0);
    assert_memory_equal(k, page, SEG);
    assert_memory_equal(v, page + SEG, SEG);
    fx_close(&f);
}

/* Damaged slab bytes: every page read is exact or a miss, and the damage is found. */
static void test_damaged_slab(void **state)
{
    struct fixture f;
    char path[192];
    int res[NP], bad = 0;

    (void)state;
    fx_open(&f);
    put_range(f.s, 400, NP);
    kvt_pagestore_close(f.s);
    snprintf(path, sizeof(path), "%s/slabs/0000.slab", f.dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t junk[8192];
    memset(junk, 0x5a, sizeof(junk));
    for (off_t at = 64 << 10; at < (off_t)NP * PAGE; at += 5 * PAGE)
        assert_int_equal(pwrite(fd, junk, sizeof(junk), at), (ssize_t)sizeof(junk));
    close(fd);
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 0, &f.s), 0);
    uint32_t ok = get_range(f.s, 400, NP, res);
    for (uint32_t i = 0; i < NP; i++)
        bad += res[i] != 0;
    assert_true(bad > 0);
    assert_int_equal(ok + bad, NP);
    fx_close(&f);
}

/* ---- three threads, as SGLang's controller: exists, get, set ---- */

struct hammer {
    kvt_pagestore *s;
    int role;
    uint32_t rounds;
    uint32_t exact, misses, runs;
    _Atomic uint32_t *latest; /* the writer's last range written */
    _Atomic bool *done;       /* the writer is through */
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;

    if (h->role == 0) {
        for (uint32_t r = 0; r < h->rounds; r++) {
            uint32_t first = r * 7 % 64 * 8;
            put_range(h->s, first, 16);
            atomic_store(h->latest, first);
        }
        atomic_store(h->done, true);
        return NULL;
    }
    while (!atomic_load(h->done)) {
        uint32_t first = atomic_load(h->latest);
        if (h->role == 1) {
            int res[16];
            uint32_t ok = get_range(h->s, first, 16, res);
            h->exact += ok;
            h->misses += 16 - ok;
        } else {
            h->runs += run_of(h->s, first, 16) > 0;
        }
    }
    return NULL;
}

static void test_three_threads(void **state)
{
    struct fixture f;
    struct hammer h[3];
    pthread_t t[3];

    (void)state;
    assert_int_equal(fixture_data_dir(f.dir, sizeof(f.dir), "pagestore"), 0);
    /* Room for about 300 of the 512 pages touched: eviction runs beside the readers. */
    assert_int_equal(open_at(f.dir, FP, PAGE, 300ull * 16384, 0, &f.s), 0);
    _Atomic uint32_t latest = 0;
    _Atomic bool done = false;
    put_range(f.s, 0, 16);
    for (int i = 0; i < 3; i++) {
        h[i] =
            (struct hammer){.s = f.s, .role = i, .rounds = 120, .latest = &latest, .done = &done};
        assert_int_equal(pthread_create(&t[i], NULL, hammer_main, &h[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    assert_true(h[1].exact > 0 && h[2].runs > 0);
    printf("test_pagestore: three threads: %u pages read exact, %u misses, %u runs found\n",
           h[1].exact, h[1].misses, h[2].runs);
    fx_close(&f);
}

static uint64_t stat_of(kvt_pagestore *s, int which)
{
    struct kvt_pagestore_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_pagestore_stats(s, &st), 0);
    return which == 0 ? st.capacity_pages : which == 1 ? st.pages : st.evicted;
}

/* A store of a few pages, relaxed: page 0 touched is kept when the next page needs room, and
 * the oldest untouched one goes; everything is there again after a reopen. */
static void test_touch_and_relaxed_sync(void **state)
{
    struct kvt_pagestore_options o;
    struct fixture f;
    uint8_t keys[2][KVT_PAGESTORE_KEY_BYTES];
    size_t touched = 99;
    uint64_t cap;

    (void)state;
    assert_int_equal(fixture_data_dir(f.dir, sizeof(f.dir), "pagestore"), 0);
    kvt_pagestore_options_init(&o, sizeof(o));
    o.dir = f.dir;
    o.fingerprint = FP;
    o.fingerprint_len = strlen(FP);
    o.page_bytes = PAGE;
    o.capacity_bytes = 6 * 16384;
    o.sync = 2;
    assert_int_equal(kvt_pagestore_open(&o, &f.s), -EINVAL);
    o.sync = KVT_DISK_SYNC_RELAXED;
    assert_int_equal(kvt_pagestore_open(&o, &f.s), 0);
    cap = stat_of(f.s, 0);
    assert_true(cap >= 3 && cap < NP);
    for (uint32_t i = 0; i < cap; i++)
        put_range(f.s, i, 1); /* one at a time: no parents, plain LRU order */
    key_of(0, keys[0]);
    key_of(1000, keys[1]);
    assert_int_equal(kvt_pagestore_touch(f.s, &keys[0][0], 2, &touched), 0);
    assert_int_equal(touched, 1);
    assert_int_equal(kvt_pagestore_touch(NULL, &keys[0][0], 1, NULL), -EINVAL);
    put_range(f.s, (uint32_t)cap, 1);
    assert_int_equal(stat_of(f.s, 2), 1);
    assert_int_equal(run_of(f.s, 0, 1), 1); /* touched: kept */
    assert_int_equal(run_of(f.s, 1, 1), 0); /* the least recently used went */
    assert_int_equal(run_of(f.s, 2, (uint32_t)cap - 1), cap - 1);
    kvt_pagestore_close(f.s);
    assert_int_equal(kvt_pagestore_open(&o, &f.s), 0);
    assert_int_equal(stat_of(f.s, 1), cap);
    assert_int_equal(get_range(f.s, 2, (uint32_t)cap - 1, NULL), cap - 1);
    assert_int_equal(get_range(f.s, 0, 1, NULL), 1);
    fx_close(&f);
}

#ifdef KVT_HAVE_REDIS
static int open_remote_at(const char *dir, const char *url, kvt_pagestore **s)
{
    struct kvt_pagestore_options o;

    kvt_pagestore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.fingerprint = FP;
    o.fingerprint_len = strlen(FP);
    o.page_bytes = PAGE;
    o.page_tokens = 16;
    o.remote = url;
    o.remote_timeout_ms = 300;
    return kvt_pagestore_open(&o, s);
}

static uint64_t ms_now(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* A free loopback port: bound, read back, let go. */
static uint16_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static bool answers(uint16_t port)
{
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    char buf[16] = {0};
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
              write(fd, "PING\r\n", 6) == 6 && read(fd, buf, sizeof(buf) - 1) > 0 &&
              strncmp(buf, "+PONG", 5) == 0;

    if (fd >= 0)
        close(fd);
    return ok;
}

/* A redis-server of the test's own, without persistence; 0 when none is installed. */
static pid_t start_redis(uint16_t port)
{
    char p[8];
    pid_t pid;

    if (system("command -v redis-server > /dev/null 2>&1") != 0)
        return 0;
    snprintf(p, sizeof(p), "%u", port);
    if ((pid = fork()) == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", "/tmp", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100 && !answers(port); i++)
        usleep(50000);
    assert_true(answers(port));
    return pid;
}

static void test_remote(void **state)
{
    struct kvt_pagestore_stats st = {.size = sizeof(st)};
    struct fixture a, b;
    uint8_t keys[1][KVT_PAGESTORE_KEY_BYTES];
    char url[64], dir_b[160];
    uint16_t port = free_port();
    pid_t srv = start_redis(port);
    size_t run = 0;
    uint64_t t0;

    (void)state;
    if (!srv)
        skip();
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u", port);
    assert_int_equal(fixture_data_dir(a.dir, sizeof(a.dir), "pagestore"), 0);
    snprintf(dir_b, sizeof(dir_b), "%s/b", a.dir);
    assert_int_equal(open_remote_at(a.dir, url, &a.s), 0);
    assert_int_equal(open_remote_at(dir_b, url, &b.s), 0);
    put_range(a.s, 0, 16);
    /* b's disk has none of them: the server has every one, checked. */
    key_of(0, keys[0]);
    assert_int_equal(kvt_pagestore_exists_local(b.s, &keys[0][0], 1, &run), 0);
    assert_int_equal(run, 0);
    assert_int_equal(kvt_pagestore_exists_local(a.s, &keys[0][0], 1, &run), 0);
    assert_int_equal(run, 1);
    assert_int_equal(run_of(b.s, 0, 16), 16);
    assert_int_equal(get_range(b.s, 0, 16, NULL), 16);
    assert_int_equal(kvt_pagestore_stats(b.s, &st), 0);
    assert_int_equal(st.remote, 1);
    assert_int_equal(st.remote_reads, 16);
    assert_int_equal(st.get_hits, 0);
    /* A hung server: what the disk holds is served, the rest are misses, all in bounded time. */
    assert_int_equal(kill(srv, SIGSTOP), 0);
    t0 = ms_now();
    assert_int_equal(run_of(b.s, 100, 4), 0);
    assert_int_equal(get_range(b.s, 100, 4, NULL), 0);
    put_range(a.s, 200, 4); /* kept by the disk, so stored */
    assert_int_equal(get_range(a.s, 200, 4, NULL), 4);
    assert_int_equal(get_range(a.s, 0, 16, NULL), 16);
    assert_true(ms_now() - t0 < 10 * 300);
    assert_int_equal(kill(srv, SIGCONT), 0);
    kvt_pagestore_close(b.s);
    kvt_pagestore_close(a.s);
    fixture_remove_tree(a.dir);
    kill(srv, SIGKILL);
    waitpid(srv, NULL, 0);
}
#endif

/* ---- stores of one dir in one process: one LMDB environment ---- */

/* A read-only store opened and closed beside the writer in the same process leaves the writer
 * whole (LMDB allows one environment of a file per process: a second one's close once dropped
 * the writer's locks, and its exists and get failed ever after); readers outlive the writer;
 * a writer opened beside a reader is refused, and opens once the reader is gone. */
static void test_reader_beside_writer(void **state)
{
    struct fixture f;
    kvt_pagestore *r1 = NULL, *r2 = NULL, *w = (kvt_pagestore *)1;

    (void)state;
    fx_open(&f);
    put_range(f.s, 0, 16);
    for (int round = 0; round < 2; round++) { /* the reader closes first, twice */
        assert_int_equal(open_at(f.dir, FP, PAGE, 0, 1, &r1), 0);
        assert_int_equal(get_range(r1, 0, 16, NULL), 16);
        kvt_pagestore_close(r1);
        assert_int_equal(run_of(f.s, 0, 16), 16);
        assert_int_equal(get_range(f.s, 0, 16, NULL), 16);
        put_range(f.s, 16 + 8 * (uint32_t)round, 8);
    }
    /* Another fingerprint beside the writer: refused, and the writer goes on. */
    assert_int_equal(open_at(f.dir, "another model", PAGE, 0, 1, &r1), KVT_EFINGERPRINT);
    assert_int_equal(get_range(f.s, 0, 32, NULL), 32);
    /* Two readers; the writer closes first, then one reader: the other still reads. */
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 1, &r1), 0);
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 1, &r2), 0);
    kvt_pagestore_close(f.s);
    assert_int_equal(get_range(r1, 0, 32, NULL), 32);
    kvt_pagestore_close(r1);
    assert_int_equal(run_of(r2, 0, 32), 32);
    assert_int_equal(get_range(r2, 0, 32, NULL), 32);
    /* A reader first: a writer of the dir is refused while it is open, and not after. */
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 0, &w), -EBUSY);
    assert_null(w);
    kvt_pagestore_close(r2);
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 0, &f.s), 0);
    assert_int_equal(get_range(f.s, 0, 32, NULL), 32);
    put_range(f.s, 32, 8);
    assert_int_equal(run_of(f.s, 0, 40), 40);
    fx_close(&f);
}

/* A reader opened before its writer made the first slab (so the dir's O_DIRECT alignment was
 * never probed for it) reads the pages written after it opened: SGLang's MLA reader ranks
 * open the writer's dir as soon as its index is there. */
static void test_reader_before_first_slab(void **state)
{
    struct fixture f;
    kvt_pagestore *r = NULL;

    (void)state;
    fx_open(&f);
    assert_int_equal(open_at(f.dir, FP, PAGE, 0, 1, &r), 0);
    assert_int_equal(run_of(r, 0, 8), 0);
    put_range(f.s, 0, 8);
    assert_int_equal(run_of(r, 0, 8), 8);
    assert_int_equal(get_range(r, 0, 8, NULL), 8);
    kvt_pagestore_close(r);
    fx_close(&f);
}

/* Bytes of path's file the page cache holds. */
static size_t cached_bytes(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = 0;

    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    size_t pages = ((size_t)st.st_size + pg - 1) / pg;
    unsigned char *vec = calloc(pages, 1);

    assert_true(m != MAP_FAILED && vec);
    assert_int_equal(mincore(m, (size_t)st.st_size, vec), 0);
    for (size_t i = 0; i < pages; i++)
        n += vec[i] & 1;
    munmap(m, (size_t)st.st_size);
    free(vec);
    close(fd);
    return n * pg;
}

/* fn(path, arg) for each slab file of dir; the sum of what it returned. */
static size_t each_slab(const char *dir, size_t (*fn)(const char *path, void *arg), void *arg)
{
    char path[512];
    struct dirent *e;
    size_t n = 0;
    DIR *d;

    snprintf(path, sizeof(path), "%s/slabs", dir);
    assert_non_null(d = opendir(path));
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".slab")) {
            snprintf(path, sizeof(path), "%s/slabs/%s", dir, e->d_name);
            n += fn(path, arg);
        }
    closedir(d);
    return n;
}

/* A slab's bytes the page cache holds; with *drop, dropped from it first. */
static size_t slab_cached(const char *path, void *drop)
{
    if (*(bool *)drop) {
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        close(fd);
    }
    return cached_bytes(path);
}

/* Bytes of dir's slab files the page cache holds; with drop, drop them from it first. */
static size_t slabs_cached(const char *dir, bool drop)
{
    return each_slab(dir, slab_cached, &drop);
}

/* n pages of pb bytes written to a store in dir, then read back exact, then read back again
 * after the slabs are dropped from the page cache; what the cache held after each step and
 * how many reads it served (stats.cache_reads). */
struct cached_run {
    size_t after_write, after_drop, after_cold_read;
    uint64_t hot_cache_reads, cold_cache_reads;
};

static void get_exact(kvt_pagestore *s, struct kvt_page *pages, uint8_t *buf, uint32_t pb,
                      uint32_t n)
{
    int res[8];

    memset(buf, 0, (size_t)pb * n);
    assert_int_equal(kvt_pagestore_get(s, pages, n, res), 0);
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(res[i], 0);
        for (size_t b = 0; b < pb; b++)
            assert_int_equal(buf[(size_t)i * pb + b], (uint8_t)(i * 31 + b / 4096));
    }
}

static struct cached_run write_read_cached(const char *dir, uint32_t pb, uint32_t n,
                                           uint32_t disk_io, bool bypass)
{
    struct kvt_pagestore_options o;
    struct kvt_pagestore_stats st = {.size = sizeof(st)};
    struct cached_run run;
    kvt_pagestore *s = NULL;
    uint8_t *buf = NULL, keys[8][KVT_PAGESTORE_KEY_BYTES];
    struct kvt_segment segs[8];
    struct kvt_page pages[8];
    int res[8];

    assert_true(n <= 8);
    assert_int_equal(posix_memalign((void **)&buf, 4096, (size_t)pb * n), 0);
    for (size_t b = 0; b < (size_t)pb * n; b++)
        buf[b] = (uint8_t)(b / pb * 31 + b % pb / 4096);
    options_at(&o, dir, FP, pb, 64ull << 20);
    o.disk_io = disk_io;
    o.page_cache_bypass = bypass;
    assert_int_equal(kvt_pagestore_open(&o, &s), 0);
    for (uint32_t i = 0; i < n; i++) {
        key_of(i, keys[i]);
        segs[i] = (struct kvt_segment){.addr = buf + (size_t)i * pb, .len = pb};
        pages[i] = (struct kvt_page){.key = keys[i], .segs = &segs[i], .nsegs = 1};
    }
    assert_int_equal(kvt_pagestore_set(s, pages, n, res), 0);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(res[i], 0);
    run.after_write = slabs_cached(dir, false);
    get_exact(s, pages, buf, pb, n);
    assert_int_equal(kvt_pagestore_stats(s, &st), 0);
    run.hot_cache_reads = st.cache_reads;
    run.after_drop = slabs_cached(dir, true);
    get_exact(s, pages, buf, pb, n);
    assert_int_equal(kvt_pagestore_stats(s, &st), 0);
    run.cold_cache_reads = st.cache_reads - run.hot_cache_reads;
    run.after_cold_read = slabs_cached(dir, false);
    kvt_pagestore_close(s);
    fixture_remove_tree(dir);
    free(buf);
    return run;
}

/* 64 bytes of junk every 64 KiB of a slab file past its first 32 KiB (the slab's head):
 * every page of 64 KiB or more is damaged, its slab head is not. */
static size_t damage_slab(const char *path, void *arg)
{
    uint8_t junk[64];
    struct stat st;
    int fd = open(path, O_RDWR);

    (void)arg;
    memset(junk, 0xa5, sizeof(junk));
    assert_true(fd >= 0 && fstat(fd, &st) == 0);
    for (off_t at = 32 << 10; at + 64 <= st.st_size; at += 64 << 10)
        assert_int_equal(pwrite(fd, junk, sizeof(junk), at), 64);
    close(fd);
    return 0;
}

/* One page of BIG bytes in n segments of one length (aligned, or 64 bytes off alignment) or
 * in three unequal ones, over buf. */
#define BIG (512u << 10)
static struct kvt_page shaped(uint8_t *key, struct kvt_segment *segs, uint8_t *buf, uint32_t n,
                              bool off)
{
    size_t at = off ? 64 : 0;

    for (uint32_t k = 0; k < n; k++) {                                  /* 4 KiB apart */
        segs[k].len = n == 3 ? (k ? (BIG - 4096) / 2 : 4096) : BIG / n; /* 3: unequal */
        segs[k].addr = buf + at;
        at += segs[k].len + 4096;
    }
    return (struct kvt_page){.key = key, .segs = segs, .nsegs = n};
}

static void fill_shaped(const struct kvt_page *p, uint32_t seed)
{
    for (uint32_t k = 0, at = 0; k < p->nsegs; k++)
        for (uint32_t b = 0; b < p->segs[k].len; b++, at++)
            ((uint8_t *)p->segs[k].addr)[b] = (uint8_t)((at * 2654435761u + seed) >> 13);
}

static bool same_shaped(const struct kvt_page *p, uint32_t seed)
{
    for (uint32_t k = 0, at = 0; k < p->nsegs; k++)
        for (uint32_t b = 0; b < p->segs[k].len; b++, at++)
            if (((uint8_t *)p->segs[k].addr)[b] != (uint8_t)((at * 2654435761u + seed) >> 13))
                return false;
    return true;
}

/* A page is the same bytes whatever segments carry it: pages of segments of one length go to
 * the block store as its parts (vectored, direct where aligned), others through a bounce page,
 * and each shape reads back what every other shape wrote; a damaged page is a miss in every
 * shape. */
static void test_segment_shapes(void **state)
{
    static const struct {
        uint32_t n;
        bool off;
    } shapes[] = {{1, false}, {2, false}, {2, true}, {4, false}, {64, false}, {3, false}};
    const size_t ns = sizeof(shapes) / sizeof(shapes[0]);
    uint8_t keys[6][KVT_PAGESTORE_KEY_BYTES], *buf[2];
    struct kvt_segment segs[2][64];
    char dir[128];
    kvt_pagestore *s = NULL;
    int res;

    (void)state;
    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "pagestore-shapes"), 0);
    assert_int_equal(open_at(dir, FP, BIG, 64ull << 20, 0, &s), 0);
    for (int b = 0; b < 2; b++)
        assert_int_equal(posix_memalign((void **)&buf[b], 4096, 2 * BIG + 65 * 4096 + 64), 0);
    for (size_t w = 0; w < ns; w++) {
        struct kvt_page p = shaped(keys[w], segs[0], buf[0], shapes[w].n, shapes[w].off);
        key_of(9000 + (uint32_t)w, keys[w]);
        fill_shaped(&p, (uint32_t)w);
        assert_int_equal(kvt_pagestore_set(s, &p, 1, &res), 0);
        assert_int_equal(res, 0);
    }
    for (size_t w = 0; w < ns; w++)
        for (size_t r = 0; r < ns; r++) {
            struct kvt_page p = shaped(keys[w], segs[1], buf[1], shapes[r].n, shapes[r].off);
            memset(buf[1], 0, 2 * BIG + 65 * 4096 + 64);
            assert_int_equal(kvt_pagestore_get(s, &p, 1, &res), 0);
            assert_int_equal(res, 0);
            assert_true(same_shaped(&p, (uint32_t)w));
        }
    kvt_pagestore_close(s);
    each_slab(dir, damage_slab, NULL);
    assert_int_equal(open_at(dir, FP, BIG, 64ull << 20, 0, &s), 0);
    for (size_t r = 0; r < ns; r++) {
        struct kvt_page p = shaped(keys[r], segs[1], buf[1], shapes[r].n, shapes[r].off);
        assert_int_equal(kvt_pagestore_get(s, &p, 1, &res), 0);
        assert_int_not_equal(res, 0);
    }
    kvt_pagestore_close(s);
    free(buf[0]);
    free(buf[1]);
    fixture_remove_tree(dir);
}

/* Whether this kernel answers cachestat(2) (Linux 6.5) for the file at path, as the store
 * asks it (a sandbox may refuse it: EPERM). */
static bool has_cachestat(const char *path)
{
    struct {
        uint64_t off, len;
    } range = {0, 4096};
    uint64_t cs[5];
    int fd = open(path, O_RDONLY);
    long rc;

    assert_true(fd >= 0);
    rc = syscall(451 /* __NR_cachestat */, fd, &range, cs, 0);
    close(fd);
    return rc == 0;
}

/* Every page is written through the page cache, so what was just written is read as a copy
 * from memory (as SGLang's file backend reads). Pages of 128 KiB or less go
 * through it both ways; a larger page the cache lacks is read direct, where the file system
 * takes O_DIRECT (tmpfs does not: there every byte is in memory anyway), and leaves nothing
 * cached; with page_cache_bypass, such pages go direct both ways. Each with both I/O engines;
 * every read exact. */
static void test_pages_cached(void **state)
{
    static const uint32_t ios[] = {KVT_DISK_IO_URING, KVT_DISK_IO_PSYNC};
    char base[128], dir[160], probe[160];
    bool direct;
    int fd;

    (void)state;
    assert_int_equal(fixture_data_dir(base, sizeof(base), "pagestore-cached"), 0);
    snprintf(probe, sizeof(probe), "%s/probe", base);
    fd = open(probe, O_CREAT | O_WRONLY | O_DIRECT, 0600);
    direct = fd >= 0;
    if (fd >= 0)
        close(fd);
    for (int k = 0; k < 2; k++) {
        snprintf(dir, sizeof(dir), "%s/small%d", base, k);
        struct cached_run r = write_read_cached(dir, 64u << 10, 8, ios[k], false);
        print_message("test_pages_cached io %u: 8 pages of 64 KiB: %zu bytes cached\n", ios[k],
                      r.after_write);
        assert_true(r.after_write >= 8 * (64u << 10));
        snprintf(dir, sizeof(dir), "%s/large%d", base, k);
        r = write_read_cached(dir, 256u << 10, 8, ios[k], false);
        print_message("test_pages_cached io %u: 8 pages of 256 KiB: %zu bytes cached after the "
                      "write, %zu dropped, %zu after a cold read; reads from the cache %llu hot, "
                      "%llu cold\n",
                      ios[k], r.after_write, r.after_drop, r.after_cold_read,
                      (unsigned long long)r.hot_cache_reads,
                      (unsigned long long)r.cold_cache_reads);
        assert_true(r.after_write >= 8 * (256u << 10));
        if (!direct)
            continue;
        /* A kernel without cachestat (before 6.5) reads every page above 128 KiB direct. */
        assert_int_equal(r.hot_cache_reads, has_cachestat(probe) ? 8 : 0);
        assert_int_equal(r.cold_cache_reads, 0);
        assert_true(r.after_cold_read < 2 * (256u << 10));
        /* page_cache_bypass: direct both ways, nothing cached, no read from the cache */
        snprintf(dir, sizeof(dir), "%s/bypass%d", base, k);
        r = write_read_cached(dir, 256u << 10, 8, ios[k], true);
        assert_true(r.after_write < 2 * (256u << 10));
        assert_int_equal(r.hot_cache_reads, 0);
    }
    fixture_remove_tree(base);
}

struct opener {
    const char *dir;
    int rc;
    uint32_t exact;
};

static void *open_read_close(void *arg)
{
    struct opener *o = arg;
    kvt_pagestore *r = NULL;

    for (int i = 0; i < 20 && !o->rc; i++) {
        if ((o->rc = open_at(o->dir, FP, PAGE, 0, 1, &r)))
            break;
        o->exact += get_range(r, 0, 16, NULL);
        kvt_pagestore_close(r);
    }
    return NULL;
}

/* Readers opened and closed on four threads at once beside a writer that keeps writing and
 * reading: none fails, the writer never does. */
static void test_readers_on_threads(void **state)
{
    struct fixture f;
    struct opener o[4];
    pthread_t t[4];

    (void)state;
    fx_open(&f);
    put_range(f.s, 0, 16);
    for (int i = 0; i < 4; i++) {
        o[i] = (struct opener){.dir = f.dir};
        assert_int_equal(pthread_create(&t[i], NULL, open_read_close, &o[i]), 0);
    }
    for (uint32_t r = 0; r < 20; r++) {
        put_range(f.s, 16 + r % 4 * 8, 8);
        assert_int_equal(get_range(f.s, 0, 16, NULL), 16);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(o[i].rc, 0);
        assert_int_equal(o[i].exact, 20 * 16);
    }
    assert_int_equal(run_of(f.s, 0, 48), 48);
    fx_close(&f);
}

/* The engine's disk tier and a page store of the same dir in one process: a reader beside
 * the engine (another fingerprint: refused) leaves the engine's disk tier whole; a page store
 * open on the dir keeps the engine out (-EBUSY) until it closes. */
static void test_engine_beside_page_store(void **state)
{
    struct kvt_options o;
    struct kvt_stats st = {.size = sizeof(st)};
    kvt_engine *e = NULL;
    kvt_pagestore *r = NULL;
    char dir[128];
    uint32_t tokens[16];
    int32_t slots[16];

    (void)state;
    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "pagestore-engine"), 0);
    fixture_engine_options(&o, 2, 8);
    o.host_tokens = 256;
    o.disk_dir = dir;
    o.disk_bytes = 1 << 20;
    o.disk_write_policy = KVT_DISK_WRITE_THROUGH;
    o.store_page_tokens = o.page_size; /* a store page to a page: the keys below count them */
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(open_at(dir, FP, PAGE, 0, 1, &r), KVT_EFINGERPRINT);
    for (uint32_t round = 0; round < 2; round++) {
        struct kvt_key key = {.tokens = tokens, .len = 16};
        for (uint32_t i = 0; i < 16; i++)
            tokens[i] = round * 100 + i;
        assert_int_equal(kvt_alloc(e, 16, slots), 0);
        size_t cached = 99;
        assert_int_equal(kvt_insert(e, &key, slots, 0, &cached), 0);
        assert_int_equal(cached, 0);
        assert_int_equal(kvt_sync(e), 0);
    }
    assert_int_equal(kvt_stats(e, &st), 0);
    assert_true(st.disk_written_tokens == 32 && st.disk_cached_tokens == 32);
    assert_int_equal(st.disk_errors, 0);
    kvt_close(e);
    e = NULL;
    assert_int_equal(open_at(dir, "another model", PAGE, 0, 1, &r), KVT_EFINGERPRINT);
    fixture_remove_tree(dir);

    assert_int_equal(fixture_data_dir(dir, sizeof(dir), "pagestore-engine"), 0);
    assert_int_equal(open_at(dir, FP, PAGE, 0, 0, &r), 0);
    put_range(r, 0, 4);
    kvt_pagestore_close(r);
    assert_int_equal(open_at(dir, FP, PAGE, 0, 1, &r), 0);
    assert_int_equal(kvt_open(&o, &e), -EBUSY);
    assert_int_equal(get_range(r, 0, 4, NULL), 4);
    kvt_pagestore_close(r);
    fixture_remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_restart_and_fingerprint),
        cmocka_unit_test(test_async_and_eventfd),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_damaged_slab),
        cmocka_unit_test(test_empty_segment),
        cmocka_unit_test(test_three_threads),
        cmocka_unit_test(test_reader_beside_writer),
        cmocka_unit_test(test_readers_on_threads),
        cmocka_unit_test(test_engine_beside_page_store),
        cmocka_unit_test(test_reader_before_first_slab),
        cmocka_unit_test(test_pages_cached),
        cmocka_unit_test(test_segment_shapes),
        cmocka_unit_test(test_touch_and_relaxed_sync),
#ifdef KVT_HAVE_REDIS
        cmocka_unit_test(test_remote),
#endif
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
