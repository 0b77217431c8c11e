#include "store_test.h"

#include <dirent.h>
#include <inttypes.h>

/* ---- capacity and eviction ---- */

/* A batch that names a stored page and needs every other slot: the eviction that makes room
 * must not take the page the batch reports as stored. */
void test_evict_keeps_batch_dup(void **state)
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

void test_lru_eviction(void **state)
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
        w[i] = (struct dstore_wpage){.key = keys[i],
                                     .parent = i ? keys[i - 1] : NULL,
                                     .ns = NULL,
                                     .tokens = toks[i],
                                     .buf = buf_at(f, i)};
    }
    assert_int_equal(dstore_put(f->s, w, n, res), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], 0);
}

/* Eviction takes chain ends first: a page whose parent went could only be served once an
 * engine held that parent again, so the chain is shortened from its end, never cut at its
 * root. The order is rebuilt from the index after a restart. */
void test_chain_ends_first(void **state)
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
void test_batch_larger_than_store(void **state)
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
void test_pinned_slot(void **state)
{
    struct fx *f = *state;
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, false, false};
    struct dstore_faults faults = {gate_fn, &g};
    uint8_t key[KEY];
    struct dstore_rpage r = {.key = key, .buf = buf_at(f, 8)};
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
void test_wait_timeout(void **state)
{
    struct fx *f = *state;
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, false, false};
    struct dstore_faults faults = {gate_fn, &g};
    uint8_t key[KEY];
    struct dstore_rpage r = {.key = key, .buf = buf_at(f, 8)};
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

/* Bytes a tree of files takes on the disk (st_blocks). */
static uint64_t du(const char *path)
{
    struct stat st;
    uint64_t sum = 0;
    DIR *d;

    if (lstat(path, &st))
        return 0;
    sum = (uint64_t)st.st_blocks * 512;
    if (!S_ISDIR(st.st_mode) || !(d = opendir(path)))
        return sum;
    for (struct dirent *e; (e = readdir(d));) {
        char sub[512];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        sum += du(sub);
    }
    closedir(d);
    return sum;
}

/* After n pages of pb bytes in a store of 1 GiB: the dir takes within 10% of the pages'
 * bytes and the index's. */
static void disk_use_after(struct fx *f, uint32_t pb, uint32_t n)
{
    uint8_t *buf = NULL, key[KEY];
    uint32_t toks[TOKENS] = {0};
    char index[96];
    int res;

    f->o.page_bytes = pb;
    f->o.disk_bytes = f->o.slab_bytes = 1ull << 30;
    f->o.stripes = DSTORE_STRIPES; /* as the page store and the engine open it */
    fx_open(f);
    assert_int_equal(posix_memalign((void **)&buf, 4096, pb), 0);
    for (uint64_t i = 0; i < n; i++) {
        make_key(5000 + i, key);
        fill_page(key, buf, pb);
        struct dstore_wpage w = {.key = key, .tokens = toks, .buf = buf};
        assert_int_equal(dstore_put(f->s, &w, 1, &res), 0);
        assert_int_equal(res, 0);
    }
    fx_close(f);
    snprintf(index, sizeof(index), "%s/index", f->dir);
    uint64_t used = du(f->dir), stored = (uint64_t)n * pb, ix = du(index);
    print_message("test_disk_use: %u pages of %u bytes: %" PRIu64 " bytes stored, index %" PRIu64
                  ", dir %" PRIu64 "\n",
                  n, pb, stored, ix, used);
    assert_true(used <= (stored + ix) * 11 / 10);
    free(buf);
}

/* The slab files follow the data: after 30 MB of 64 KiB pages, not the 1 GiB a whole slab
 * would take. */
void test_disk_use(void **state)
{
    disk_use_after(*state, 65536, 480);
}

/* Nor a slot past the data for pages above the growth step: 3 pages of 8 MiB took 4 slots. */
void test_disk_use_big_pages(void **state)
{
    disk_use_after(*state, 8u << 20, 3);
}

/* Slab files in f's dir. */
static unsigned slab_files(struct fx *f)
{
    char path[512];
    unsigned n = 0;
    DIR *d;

    snprintf(path, sizeof(path), "%s/slabs", f->dir);
    assert_non_null(d = opendir(path));
    for (struct dirent *e; (e = readdir(d));)
        n += strstr(e->d_name, ".slab") != NULL;
    closedir(d);
    return n;
}

/* With stripes, a batch's pages go to each slab of a group in turn (a write through the page
 * cache copies one file at a time), the next group only once those are full; and a new dir's
 * slabs hold a stripes'th of the capacity, so that one of a single slab's size still has a
 * stripe's worth of files. */
void test_stripes(void **state)
{
    struct fx *f = *state;
    struct dstore_info info;

    f->o.stripes = 4;
    f->o.disk_bytes = 64ull * SLOT;
    f->o.slab_bytes = 8ull * SLOT; /* under DSTORE_STRIPE_SLAB_MIN: taken as is */
    fx_open(f);
    put_range(f, 1, 4);
    assert_int_equal(slab_files(f), 4);
    put_range(f, 5, 28); /* the first group's 32 slots */
    assert_int_equal(slab_files(f), 4);
    put_range(f, 33, 1);
    assert_int_equal(slab_files(f), 5);
    fx_reopen(f);
    for (uint64_t id = 1; id <= 33; id++)
        assert_int_equal(get_id(f, id), 0);
    fx_close(f);
    rm_rf(f->dir);

    f->o.disk_bytes = 2ull << 30;
    f->o.slab_bytes = 1ull << 30;
    fx_open(f);
    dstore_info(f->s, &info);
    assert_int_equal(info.slab_slots, ((2ull << 30) / SLOT + 3) / 4);
    assert_int_equal(info.slabs, 4);
}

/* A batch that must evict frees room for the next one too (a 256th of the store here,
 * max_batch at most): evictions, a commit and a flush of the index each, come once per that many
 * pages rather than once per batch. The oldest go, as ever. */
void test_evict_ahead(void **state)
{
    struct fx *f = *state;
    struct dstore_stats a, b;

    f->o.disk_bytes = 512ull * SLOT;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    for (uint64_t id = 1; id <= 512; id += 32)
        put_range(f, id, 32);
    a = stats_of(f);
    assert_int_equal(a.capacity_slots, 512);
    assert_int_equal(a.free_slots, 0);
    put_range(f, 1000, 1); /* evicts 1, and 2 and 3 ahead */
    b = stats_of(f);
    assert_int_equal(b.evicted - a.evicted, 3);
    assert_int_equal(b.free_slots, 2);
    assert_int_equal(b.index_flushes - a.index_flushes, 1);
    for (uint64_t id = 1; id <= 4; id++)
        assert_int_equal(has_id(f, id), id == 4);
    put_range(f, 1001, 2); /* into the room made ahead: no eviction */
    a = stats_of(f);
    assert_int_equal(a.evicted, b.evicted);
    assert_int_equal(a.index_flushes, b.index_flushes);
    assert_int_equal(a.free_slots, 0);
    put_range(f, 1003, 1);
    assert_int_equal(stats_of(f).evicted - a.evicted, 3);
    assert_true(has_id(f, 7));
    assert_false(has_id(f, 6));
    check_all(f, 1, 1010);
}
