#include "store_test.h"

/* ---- helpers ---- */

uint32_t io_kind = DSTORE_IO_PSYNC; /* the variant the group runs */
int uring_err = 1;                  /* 1: not probed yet; 0: works; else the refusal */

void make_key(uint64_t id, uint8_t *key)
{
    for (int i = 0; i < KEY / 8; i++) {
        uint64_t w = rng_mix(id * 4 + (uint64_t)i);

        memcpy(key + 8 * i, &w, 8);
    }
}

/* The bytes of the page named key. */
void fill_page(const uint8_t *key, uint8_t *buf, size_t len)
{
    uint64_t seed;

    memcpy(&seed, key, 8);
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = rng_mix(seed + i);

        memcpy(buf + i, &w, len - i < 8 ? len - i : 8);
    }
}

bool page_ok(const uint8_t *key, const uint8_t *buf, size_t len)
{
    uint8_t *want = malloc(len);
    bool ok;

    fill_page(key, want, len);
    ok = memcmp(want, buf, len) == 0;
    free(want);
    return ok;
}

int readback_visit(void *arg, const struct dstore_entry *e)
{
    struct readback *c = arg;
    struct dstore_rpage r = {.key = e->key, .buf = buf_at(c->f, 1)};
    int res = 1;

    if (c->intact)
        assert_int_equal(e->status, 0);
    assert_int_equal(dstore_get(c->f->s, &r, 1, &res), 0);
    assert_true(res == 0 || res == -ENOENT);
    if (res == 0) {
        assert_true(page_ok(e->key, buf_at(c->f, 1), page_len));
        c->served++;
    }
    return 0;
}

void tokens_of(uint64_t id, uint32_t *t)
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

void rm_rf(const char *path)
{
    nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

uint32_t page_len = PAGE;

void fx_options(struct fx *f)
{
    dstore_options_init(&f->o, sizeof(f->o));
    f->o.dir = f->dir;
    memset(f->o.fingerprint, 0xab, sizeof(f->o.fingerprint));
    f->o.page_bytes = page_len = PAGE;
    f->o.page_tokens = TOKENS;
    f->o.disk_bytes = 64ull * SLOT;
    f->o.slab_bytes = 16ull * SLOT;
    f->o.io = io_kind;
    f->o.queue_depth = 8;
    f->o.io_threads = 3;
}

/* Skip the io_uring variant (the group has said why) when the kernel refuses io_uring. */
void need_io(void)
{
    if (io_kind == DSTORE_IO_URING && uring_err)
        skip();
}

int fx_setup(void **state)
{
    struct fx *f = calloc(1, sizeof(*f));
    struct slot_layout l;

    if (layout_init(&l, PAGE, TOKENS, DSTORE_FORMAT_VERSION) || l.slot_bytes != SLOT)
        return -1; /* the tests' arithmetic no longer matches the format */
    if (fixture_data_dir(f->dir, sizeof(f->dir), "store"))
        return -1;
    fx_options(f);
    f->nbufs = 32;
    f->bufs = aligned_alloc(4096, f->nbufs * PAGE);
    *state = f;
    return 0;
}

int fx_teardown(void **state)
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
void fx_close(struct fx *f)
{
    dstore_close(f->s);
    f->s = NULL;
}

void fx_open(struct fx *f)
{
    need_io();
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
}

void fx_reopen(struct fx *f)
{
    dstore_close(f->s);
    f->s = NULL;
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
}

uint8_t *buf_at(struct fx *f, size_t i)
{
    return f->bufs + (i % f->nbufs) * PAGE;
}

/* Write pages ids[0..n) with their keys and bytes from bufs; res[i] their results. No
 * cmocka here: forked children use it too. */
int put_core(struct dstore *s, uint8_t *bufs, const uint64_t *ids, size_t n, int *res)
{
    uint8_t keys[32][KEY], parent[KEY] = {7};
    uint32_t toks[32][TOKENS];
    struct dstore_wpage w[32];

    if (n > 32)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        make_key(ids[i], keys[i]);
        tokens_of(ids[i], toks[i]);
        fill_page(keys[i], bufs + i * PAGE, page_len);
        w[i] = (struct dstore_wpage){.key = keys[i],
                                     .parent = parent,
                                     .ns = NULL,
                                     .tokens = toks[i],
                                     .buf = bufs + i * PAGE};
    }
    return dstore_put(s, w, n, res);
}

/* Every result must be want. */
void put_ids(struct fx *f, const uint64_t *ids, size_t n, int want)
{
    int res[32];

    assert_int_equal(put_core(f->s, f->bufs, ids, n, res), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(res[i], want);
}

/* In a forked child: pages first .. first + n - 1, all stored, or an exit code. */
void child_put(struct dstore *s, uint8_t *bufs, uint64_t first, size_t n)
{
    uint64_t ids[32] = {0}; /* gcc cannot see n > 0 across files */
    int res[32];

    for (size_t i = 0; i < n; i++)
        ids[i] = first + i;
    if (put_core(s, bufs, ids, n, res))
        _exit(4);
    for (size_t i = 0; i < n; i++)
        if (res[i])
            _exit(5);
}

void put_range(struct fx *f, uint64_t first, size_t n)
{
    uint64_t ids[32];

    for (size_t i = 0; i < n; i++)
        ids[i] = first + i;
    put_ids(f, ids, n, 0);
}

/* Read page id: its result; on a hit the bytes must be exact. */
int get_id(struct fx *f, uint64_t id)
{
    uint8_t key[KEY];
    struct dstore_rpage r = {.key = key, .buf = buf_at(f, 0)};
    int res = 1;

    make_key(id, key);
    memset(buf_at(f, 0), 0, PAGE);
    assert_int_equal(dstore_get(f->s, &r, 1, &res), 0);
    if (res == 0)
        assert_true(page_ok(key, buf_at(f, 0), page_len));
    return res;
}

bool has_id(struct fx *f, uint64_t id)
{
    uint8_t key[KEY];
    bool here = false;

    make_key(id, key);
    assert_int_equal(dstore_exists(f->s, key, 1, &here), 0);
    return here;
}

struct dstore_stats stats_of(struct fx *f)
{
    struct dstore_stats st;

    dstore_stats(f->s, &st);
    return st;
}
