#include "store_test.h"

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

void test_faults(void **state)
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
void test_rebuild_failed(void **state)
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
