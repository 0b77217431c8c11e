#include "store_test.h"

/* ---- a dir in memory (tmpfs): psync, each body's checksum taken as it is copied ---- */

/* A page of several engine steps (DIO_STEP) and a tail beside its head, in 4 parts. */
#define MB_PAGE (3 * DIO_STEP + 2 * LAYOUT_BLOCK + 1000)
#define MB_PARTS 4
#define MB_N 6
/* The buffers: aligned_alloc takes whole multiples of the alignment. */
#define MB_ALLOC ((MB_PAGE + LAYOUT_BLOCK - 1) / LAYOUT_BLOCK * LAYOUT_BLOCK)

struct mem_fx {
    char dir[64];
    struct dstore_options o;
    uint8_t keys[MB_N][KEY];
    uint8_t *pages[MB_N]; /* what was written */
    uint8_t *back;        /* what is read */
};

static struct dstore *mem_open(struct mem_fx *m, uint32_t io)
{
    struct dstore *s = NULL;

    m->o.io = io;
    assert_int_equal(dstore_open(&m->o, &s), 0);
    return s;
}

static struct dstore_stats mem_stats(struct dstore *s)
{
    struct dstore_stats st;

    dstore_stats(s, &st);
    return st;
}

/* Page i written whole (even i) or in MB_PARTS parts (odd i). */
static void mem_put(struct mem_fx *m, struct dstore *s, int from, int to)
{
    for (int i = from; i < to; i++) {
        const void *parts[MB_PARTS];
        struct dstore_wpage w = {.key = m->keys[i], .buf = m->pages[i]};
        int res = 1;

        for (int k = 0; k < MB_PARTS; k++)
            parts[k] = m->pages[i] + (size_t)k * (MB_PAGE / MB_PARTS);
        if (i % 2)
            w = (struct dstore_wpage){.key = m->keys[i], .parts = parts, .nparts = MB_PARTS};
        assert_int_equal(dstore_put(s, &w, 1, &res), 0);
        assert_int_equal(res, 0);
    }
}

/* Page i read back (whole or in parts, as written): its result, the bytes checked when 0. */
static int mem_get(struct mem_fx *m, struct dstore *s, int i)
{
    void *parts[MB_PARTS];
    struct dstore_rpage r = {.key = m->keys[i], .buf = m->back};
    int res = 1;

    if (i % 2) {
        for (int k = 0; k < MB_PARTS; k++) /* the parts in reverse order in memory */
            parts[k] = m->back + (size_t)(MB_PARTS - 1 - k) * (MB_PAGE / MB_PARTS);
        r = (struct dstore_rpage){.key = m->keys[i], .parts = parts, .nparts = MB_PARTS};
    }
    memset(m->back, 0, MB_PAGE);
    assert_int_equal(dstore_get(s, &r, 1, &res), 0);
    if (res)
        return res;
    for (int k = 0; k < MB_PARTS; k++) {
        size_t len = MB_PAGE / MB_PARTS;
        const uint8_t *got = i % 2 ? parts[k] : m->back + (size_t)k * len;

        assert_memory_equal(got, m->pages[i] + (size_t)k * len, len);
    }
    return 0;
}

/* Flip the byte at off of page i where the slab file holds it. */
static void mem_flip(struct mem_fx *m, int i, size_t off)
{
    char path[128];
    struct stat st;
    int fd;

    snprintf(path, sizeof(path), "%s/slabs/0000.slab", m->dir);
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    uint8_t *map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(map != MAP_FAILED);
    uint8_t *at = memmem(map, (size_t)st.st_size, m->pages[i], 4096);
    assert_non_null(at);
    at[off] ^= 0x01;
    munmap(map, (size_t)st.st_size);
    close(fd);
}

/* Fails the first write request it sees (a page's body: it goes first), then none. */
static int fail_first_write(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    _Atomic int *left = arg;

    (void)slab;
    (void)slot;
    return pt == DSTORE_FAULT_WRITE && atomic_fetch_sub(left, 1) > 0 ? -EIO : 0;
}

/* Pages of several steps, with a tail, whole and in parts: exact through the fused path, and
 * the same sums as the other engine takes in a pass of its own (a dir written by one is read by
 * the other); a flipped byte in the body or the tail is a miss; a failed body write fails its
 * page, which is then a miss and can be written again. */
void test_in_memory(void **state)
{
    struct fx *f = *state;
    struct mem_fx m = {.dir = "/dev/shm/kvt-mem-XXXXXX"};
    struct dstore *s;

    if (io_kind == DSTORE_IO_PSYNC || access("/dev/shm", W_OK) || !mkdtemp(m.dir))
        skip(); /* one run is enough: the test picks its engines itself */
    m.o = f->o;
    m.o.dir = m.dir;
    m.o.page_bytes = MB_PAGE;
    m.o.disk_bytes = 64ull * MB_PAGE;
    m.o.slab_bytes = 64ull * MB_PAGE; /* one slab file: mem_flip looks in it */
    m.back = aligned_alloc(LAYOUT_BLOCK, MB_ALLOC);
    assert_non_null(m.back);
    for (int i = 0; i < MB_N; i++) {
        make_key(900 + (uint64_t)i, m.keys[i]);
        m.pages[i] = aligned_alloc(LAYOUT_BLOCK, MB_ALLOC);
        assert_non_null(m.pages[i]);
        fill_page(m.keys[i], m.pages[i], MB_PAGE);
    }
    s = mem_open(&m, DSTORE_IO_AUTO);
    assert_int_equal(mem_stats(s).io, DSTORE_IO_PSYNC);
    mem_put(&m, s, 0, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(mem_get(&m, s, i), 0);
    dstore_close(s);
    if (!uring_err) { /* io_uring sums in a pass: it reads these and writes two more */
        s = mem_open(&m, DSTORE_IO_URING);
        assert_int_equal(mem_stats(s).io, DSTORE_IO_URING);
        for (int i = 0; i < 4; i++)
            assert_int_equal(mem_get(&m, s, i), 0);
        mem_put(&m, s, 4, 6);
        dstore_close(s);
    } else {
        s = mem_open(&m, DSTORE_IO_AUTO);
        mem_put(&m, s, 4, 6);
        dstore_close(s);
    }
    s = mem_open(&m, DSTORE_IO_AUTO);
    for (int i = 0; i < MB_N; i++)
        assert_int_equal(mem_get(&m, s, i), 0);
    dstore_close(s);
    /* a byte past the first step of page 1's body; one of page 2's tail */
    mem_flip(&m, 1, DIO_STEP + 77);
    mem_flip(&m, 2, MB_PAGE - 10);
    s = mem_open(&m, DSTORE_IO_AUTO);
    assert_int_equal(mem_get(&m, s, 1), KVT_ECORRUPT);
    assert_int_equal(mem_get(&m, s, 2), KVT_ECORRUPT);
    assert_int_equal(mem_get(&m, s, 3), 0);
    assert_int_equal(mem_stats(s).err_checksum, 2);
    dstore_close(s);
    /* a failed body: its page fails and is a miss, the next write of it lands */
    _Atomic int left = 1;
    struct dstore_faults faults = {fail_first_write, &left};
    uint8_t key[KEY];
    struct dstore_wpage w = {.key = key, .buf = m.pages[0]};
    int res = 1;

    m.o.faults = &faults;
    s = mem_open(&m, DSTORE_IO_AUTO);
    make_key(990, key);
    assert_int_equal(dstore_put(s, &w, 1, &res), 0);
    assert_int_equal(res, -EIO);
    assert_int_equal(mem_stats(s).err_write_io, 1);
    assert_int_equal(mem_stats(s).pages, MB_N - 2);
    memcpy(m.keys[0], key, KEY); /* page 0's bytes under the new key */
    assert_int_equal(mem_get(&m, s, 0), -ENOENT);
    assert_int_equal(dstore_put(s, &w, 1, &res), 0);
    assert_int_equal(res, 0);
    assert_int_equal(mem_get(&m, s, 0), 0);
    dstore_close(s);
    for (int i = 0; i < MB_N; i++)
        free(m.pages[i]);
    free(m.back);
    rm_rf(m.dir);
}
