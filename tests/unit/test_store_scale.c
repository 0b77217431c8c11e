/*
 * The block store at the scale of a real disk tier: the shared trace's 30,500 blocks of 512
 * tokens in pages of 16 tokens (about 1M pages) of the tiny geometry's 2 KiB.
 *
 * A store of 2^20 slots is filled and written past full (chains of pages, as the engine
 * writes them), so eviction runs for every batch; its index must hold, with no index error
 * and no page refused. It restarts and serves what it kept, evicts on request, and is reopened
 * with an eighth of the capacity, which drops the excess without an error.
 *
 * It needs about 6 GiB on /dev/shm (or /tmp): without, it is skipped (exit 77) saying so. Its
 * own suite ("scale"), run with the plain build only. KVT_SCALE_PAGES sets the capacity.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "disk/layout.h"
#include "disk/store.h"

#define PAGE_BYTES 2048
#define TOKENS 16
#define BATCH 4096
#define CHAIN 32 /* pages per chain: a conversation's prefix */

static uint64_t capacity = 1u << 20;
static char dir[128]; /* removed at exit, whatever the outcome: it holds GiBs */

static void remove_dir(void)
{
    char cmd[256];

    if (dir[0]) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "test_store_scale: could not remove %s\n", dir);
    }
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "test_store_scale: %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void make_key(uint64_t id, uint8_t *key)
{
    for (int i = 0; i < 4; i++) {
        uint64_t w = mix(id * 4 + (uint64_t)i + 1);

        memcpy(key + 8 * i, &w, 8);
    }
}

static void fill_page(uint64_t id, uint8_t *buf)
{
    for (size_t i = 0; i < PAGE_BYTES; i += 8) {
        uint64_t w = mix(id * 1000003 + i);

        memcpy(buf + i, &w, 8);
    }
}

static double now_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Room for the slabs and the index, on a RAM file system first. */
static const char *pick_dir(void)
{
    static const char *const dirs[] = {"/dev/shm", "/tmp"};
    uint64_t want = capacity * 4096 * 3 / 2 + (1ull << 30);

    for (size_t i = 0; i < 2; i++) {
        struct statvfs v;

        if (statvfs(dirs[i], &v) == 0 && (uint64_t)v.f_bavail * v.f_frsize >= want)
            return dirs[i];
    }
    printf("test_store_scale: skipped: no file system with %.1f GiB free (/dev/shm, /tmp)\n",
           (double)want / (1 << 30));
    exit(T_EXIT_SKIP);
}

static void options(struct dstore_options *o, const char *dir, uint64_t slots)
{
    struct slot_layout l;

    CHECK(layout_init(&l, PAGE_BYTES, TOKENS, DSTORE_FORMAT_VERSION) == 0 && l.slot_bytes == 2304);
    dstore_options_init(o, sizeof(*o));
    o->dir = dir;
    memset(o->fingerprint, 0x3d, sizeof(o->fingerprint));
    o->page_bytes = PAGE_BYTES;
    o->page_tokens = TOKENS;
    o->disk_bytes = slots * l.slot_bytes;
    o->max_batch = BATCH;
}

static struct dstore *open_store(const char *dir, uint64_t slots)
{
    struct dstore_options o;
    struct dstore *s;
    int rc;

    options(&o, dir, slots);
    if ((rc = dstore_open(&o, &s))) {
        fprintf(stderr, "test_store_scale: open: %s\n", kvt_strerror(rc));
        exit(1);
    }
    CHECK(dstore_wait_ready(s) == 0);
    return s;
}

/* Pages first .. first + n - 1, in chains of CHAIN; every result must be 0. */
static void write_pages(struct dstore *s, uint64_t first, uint64_t n, uint8_t *bufs)
{
    static uint8_t keys[BATCH][32], parents[BATCH][32];
    static struct dstore_wpage w[BATCH];
    static int res[BATCH];
    uint32_t tokens[TOKENS] = {0};

    for (uint64_t at = 0; at < n; at += BATCH) {
        size_t k = n - at < BATCH ? (size_t)(n - at) : BATCH;

        for (size_t i = 0; i < k; i++) {
            uint64_t id = first + at + i;

            make_key(id, keys[i]);
            make_key(id - 1, parents[i]);
            fill_page(id, bufs + i * PAGE_BYTES);
            w[i] = (struct dstore_wpage){.key = keys[i],
                                         .parent = id % CHAIN ? parents[i] : NULL,
                                         .ns = NULL,
                                         .tokens = tokens,
                                         .buf = bufs + i * PAGE_BYTES};
        }
        CHECK(dstore_put(s, w, k, res) == 0);
        for (size_t i = 0; i < k; i++)
            CHECK(res[i] == 0);
    }
}

/* Pages first .. first + n - 1 read back: how many were served (each byte-exact). */
static uint64_t read_pages(struct dstore *s, uint64_t first, uint64_t n, uint8_t *bufs)
{
    static uint8_t keys[BATCH][32], want[PAGE_BYTES];
    static struct dstore_rpage r[BATCH];
    static int res[BATCH];
    uint64_t served = 0;

    for (uint64_t at = 0; at < n; at += BATCH) {
        size_t k = n - at < BATCH ? (size_t)(n - at) : BATCH;

        for (size_t i = 0; i < k; i++) {
            make_key(first + at + i, keys[i]);
            r[i] = (struct dstore_rpage){.key = keys[i], .buf = bufs + i * PAGE_BYTES};
        }
        CHECK(dstore_get(s, r, k, res) == 0);
        for (size_t i = 0; i < k; i++) {
            CHECK(res[i] == 0 || res[i] == -ENOENT);
            if (res[i])
                continue;
            fill_page(first + at + i, want);
            CHECK(memcmp(want, bufs + i * PAGE_BYTES, PAGE_BYTES) == 0);
            served++;
        }
    }
    return served;
}

static void no_errors(struct dstore *s, const char *when)
{
    struct dstore_stats st;

    dstore_stats(s, &st);
    printf("test_store_scale: %s: %" PRIu64 " pages of %" PRIu64 " slots, %" PRIu64
           " evicted, %" PRIu64 " dropped; errors: index %" PRIu64 ", full %" PRIu64
           ", bounds %" PRIu64 ", record %" PRIu64 ", too many %" PRIu64 "\n",
           when, st.pages, st.capacity_slots, st.evicted, st.dropped, st.err_index, st.err_nospc,
           st.err_bounds, st.err_record, st.too_many);
    CHECK(st.err_index == 0 && st.err_nospc == 0 && st.err_record == 0 && st.too_many == 0);
    CHECK(st.err_bounds == 0); /* a capacity lowered on purpose drops pages, without an error */
    CHECK(st.err_write_io == 0 && st.err_sync == 0 && st.err_checksum == 0);
}

int main(void)
{
    const char *env = getenv("KVT_SCALE_PAGES"), *base;
    uint8_t *bufs;
    double t0;

    if (env && *env)
        capacity = strtoull(env, NULL, 0);
    base = pick_dir();
    snprintf(dir, sizeof(dir), "%s/kvt-scale-%d", base, (int)getpid());
    atexit(remove_dir);
    CHECK((bufs = aligned_alloc(4096, (size_t)BATCH * PAGE_BYTES)) != NULL);

    /* Fill, then a quarter more: every batch past full evicts. */
    uint64_t total = capacity + capacity / 4;
    t0 = now_s();
    struct dstore *s = open_store(dir, capacity);
    write_pages(s, 0, total, bufs);
    printf("test_store_scale: %" PRIu64 " pages written into %" PRIu64 " slots in %.1f s (%s)\n",
           total, capacity, now_s() - t0, base);
    no_errors(s, "written past full");
    struct dstore_stats st;
    dstore_stats(s, &st);
    CHECK(st.pages == capacity && st.evicted == total - capacity);
    dstore_close(s);

    /* A restart serves what was kept: the newest pages, every one byte-exact. */
    t0 = now_s();
    s = open_store(dir, capacity);
    uint64_t recent = capacity / 4, served = read_pages(s, total - recent, recent, bufs);
    printf("test_store_scale: restart: ready in %.2f s; the newest %" PRIu64 " pages: %" PRIu64
           " served\n",
           now_s() - t0, recent, served);
    CHECK(served == recent);
    size_t evicted = 0;
    CHECK(dstore_evict(s, capacity / 8, &evicted) == 0 && evicted == capacity / 8);
    write_pages(s, total, BATCH, bufs); /* room made above: no eviction */
    no_errors(s, "after evict and more writes");
    dstore_close(s);

    /* An eighth of the capacity: the excess goes, oldest first, without an index error. */
    t0 = now_s();
    s = open_store(dir, capacity / 8);
    dstore_stats(s, &st);
    printf("test_store_scale: reopened with %" PRIu64 " slots in %.2f s\n", capacity / 8,
           now_s() - t0);
    no_errors(s, "capacity lowered");
    CHECK(st.pages <= capacity / 8 && st.pages > 0 && st.dropped > 0);
    served = read_pages(s, total - recent, recent + BATCH, bufs);
    CHECK(served <= st.pages);
    dstore_close(s);
    free(bufs);
    return 0;
}
