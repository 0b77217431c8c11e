#include "store_test.h"

/* ---- the flushes each sync mode makes ---- */

/* The fault seam as a counter: slab fdatasyncs, index commits, index flushes of their own; and
 * an error to give the index flushes when armed. */
struct tally {
    atomic_uint syncs, commits, flushes;
    _Atomic int flush_err;
};

static int count(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct tally *t = arg;

    (void)slab;
    (void)slot;
    if (pt == DSTORE_FAULT_SYNC)
        atomic_fetch_add(&t->syncs, 1);
    else if (pt == DSTORE_FAULT_COMMIT)
        atomic_fetch_add(&t->commits, 1);
    else if (pt == DSTORE_FAULT_FLUSH)
        atomic_fetch_add(&t->flushes, 1);
    return pt == DSTORE_FAULT_FLUSH ? atomic_load(&t->flush_err) : 0;
}

struct counts {
    unsigned syncs, commits, flushes;
};

static struct counts counts_of(struct tally *t)
{
    return (struct counts){atomic_load(&t->syncs), atomic_load(&t->commits),
                           atomic_load(&t->flushes)};
}

/* Slabs of 16 slots: a batch of 8 fresh pages falls in one slab. */
static void open_counted(struct fx *f, struct dstore_faults *faults, uint32_t sync)
{
    f->o.faults = faults;
    f->o.sync = sync;
    f->o.disk_bytes = 16ull * SLOT;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
}

/* Durable: a batch is one slab fdatasync and one commit (whose own flush is LMDB's, inside
 * it); an eviction, a delete and dstore_flush each flush the index once more. */
void test_durable_flushes(void **state)
{
    struct fx *f = *state;
    struct tally t = {0};
    struct dstore_faults faults = {count, &t};
    struct counts c0, c;
    uint8_t key[KEY];

    open_counted(f, &faults, DSTORE_SYNC_DURABLE);
    c0 = counts_of(&t);
    for (uint64_t id = 1; id <= 16; id += 8)
        put_range(f, id, 8);
    c = counts_of(&t);
    assert_int_equal(c.syncs - c0.syncs, 2);
    assert_int_equal(c.commits - c0.commits, 2);
    assert_int_equal(c.flushes - c0.flushes, 0);
    put_range(f, 17, 8); /* the store is full: an eviction first, flushed before reuse */
    c0 = c;
    c = counts_of(&t);
    assert_int_equal(c.syncs - c0.syncs, 1);
    assert_int_equal(c.commits - c0.commits, 2);
    assert_int_equal(c.flushes - c0.flushes, 1);
    make_key(17, key);
    assert_int_equal(dstore_delete(f->s, key, 1, NULL), 0);
    assert_int_equal(dstore_flush(f->s), 0);
    c0 = c;
    c = counts_of(&t);
    assert_int_equal(c.flushes - c0.flushes, 2);
    assert_int_equal(c.syncs - c0.syncs, 0);
    check_all(f, 1, 24);
    fx_close(f);
    f->o.faults = NULL;
}

/* Relaxed: no slab fdatasync and no index flush per batch, not even with an eviction; the slabs
 * written and the index go together at a flush: dstore_flush, sync_bytes, sync_ms, close. */
void test_relaxed_flushes(void **state)
{
    struct fx *f = *state;
    struct tally t = {0};
    struct dstore_faults faults = {count, &t};
    struct counts c0, c;

    f->o.sync_ms = 3600000;
    f->o.sync_bytes = UINT64_MAX;
    open_counted(f, &faults, DSTORE_SYNC_RELAXED);
    c0 = counts_of(&t);
    for (uint64_t id = 1; id <= 24; id += 8) /* the last batch evicts */
        put_range(f, id, 8);
    assert_int_equal(dstore_drain(f->s), 0);
    c = counts_of(&t);
    assert_int_equal(c.syncs - c0.syncs, 0);
    assert_int_equal(c.flushes - c0.flushes, 0);
    assert_int_equal(dstore_flush(f->s), 0);
    c0 = c;
    c = counts_of(&t);
    assert_int_equal(c.syncs - c0.syncs, 1); /* slab 0 only: 16 slots */
    assert_int_equal(c.flushes - c0.flushes, 1);
    check_all(f, 1, 24);

    /* sync_bytes: two batches of 8 pages make a flush */
    fx_close(f);
    f->o.sync_bytes = 16ull * SLOT;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    c0 = counts_of(&t);
    put_range(f, 30, 8);
    assert_int_equal(dstore_drain(f->s), 0);
    assert_int_equal(counts_of(&t).flushes, c0.flushes);
    put_range(f, 40, 8);
    assert_int_equal(dstore_drain(f->s), 0);
    assert_int_equal(counts_of(&t).flushes, c0.flushes + 1);

    /* sync_ms: an idle committer wakes for it */
    fx_close(f);
    f->o.sync_bytes = UINT64_MAX;
    f->o.sync_ms = 20;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    c0 = counts_of(&t);
    put_range(f, 50, 8);
    for (int i = 0; i < 500 && counts_of(&t).flushes == c0.flushes; i++)
        usleep(10000);
    c = counts_of(&t);
    assert_int_equal(c.flushes, c0.flushes + 1);
    assert_int_equal(c.syncs, c0.syncs + 1);

    /* close: the slabs written since the last flush */
    put_range(f, 60, 8);
    c0 = counts_of(&t);
    fx_close(f);
    assert_true(counts_of(&t).syncs >= c0.syncs + 1);
    f->o.faults = NULL;
    fx_open(f);
    check_all(f, 1, 70);
}

/* Durable: an eviction whose flush fails frees no slot (the batch that needed it finds no room),
 * nothing wrong is served, and once flushes work again the slots come back. */
void test_flush_fails_no_reuse(void **state)
{
    struct fx *f = *state;
    struct tally t = {0};
    struct dstore_faults faults = {count, &t};
    uint64_t ids[8] = {17, 18, 19, 20, 21, 22, 23, 24};
    char why[128];

    open_counted(f, &faults, DSTORE_SYNC_DURABLE);
    put_range(f, 1, 8);
    put_range(f, 9, 8);
    atomic_store(&t.flush_err, -EIO);
    put_ids(f, ids, 8, -ENOSPC);
    assert_true(stats_of(f).err_sync >= 1);
    check_all(f, 1, 24);
    atomic_store(&t.flush_err, 0);
    put_range(f, 17, 8);
    check_all(f, 1, 24);
    for (uint64_t id = 17; id <= 24; id++)
        assert_int_equal(get_id(f, id), 0);
    assert_int_equal(slots_check(f->s, why, sizeof(why)), 0);
    fx_close(f);
    f->o.faults = NULL;
}

/* Zero the slots of slab 0 from slot first on, n of them, head blocks and all. */
static void zero_slots(struct fx *f, uint32_t first, uint32_t n)
{
    char path[128];
    uint8_t *zeros = calloc(n, SLOT);
    int fd;

    snprintf(path, sizeof(path), "%s/slabs/0000.slab", f->dir);
    assert_non_null(zeros);
    assert_true((fd = open(path, O_WRONLY)) >= 0);
    assert_int_equal(pwrite(fd, zeros, (size_t)n * SLOT, SLAB_HEAD_BYTES + (off_t)first * SLOT),
                     (ssize_t)n * SLOT);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    free(zeros);
}

/* Reads that find bad pages drop their records together: a zeroed slab costs a few commits
 * and index flushes, not one (and two fdatasyncs) per bad page. Whether the bad pages come in
 * one read or one at a time between the writes that replace them, a flush of the committer's
 * own comes per 100 ms at most (the run is far shorter than 32 of those), and every slot
 * comes back. */
void test_bad_reads_drop_together(void **state)
{
    struct fx *f = *state;
    struct tally t = {0};
    struct dstore_faults faults = {count, &t};
    struct dstore_rpage r[32];
    uint8_t keys[32][KEY];
    int res[32];
    struct counts c0, c;
    char why[128];

    f->o.faults = &faults;
    f->o.disk_bytes = 64ull * SLOT;
    f->o.slab_bytes = 64ull * SLOT;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    put_range(f, 1, 32);
    put_range(f, 33, 32);
    zero_slots(f, 0, 64);

    c0 = counts_of(&t); /* 32 bad pages in one read */
    for (size_t i = 0; i < 32; i++) {
        make_key(1 + i, keys[i]);
        r[i] = (struct dstore_rpage){.key = keys[i], .buf = buf_at(f, i)};
    }
    assert_int_equal(dstore_get(f->s, r, 32, res), 0);
    for (size_t i = 0; i < 32; i++)
        assert_int_equal(res[i], KVT_ECORRUPT);
    assert_int_equal(dstore_drain(f->s), 0);
    c = counts_of(&t);
    assert_int_equal(stats_of(f).dropped, 32);
    assert_true(c.flushes - c0.flushes <= 2);
    assert_true(c.commits - c0.commits <= 2);

    c0 = c; /* 32 more, one at a time, each followed by a write of a new page */
    for (uint64_t id = 33; id <= 64; id++) {
        assert_int_equal(get_id(f, id), KVT_ECORRUPT);
        put_range(f, 100 + id, 1);
    }
    assert_int_equal(dstore_drain(f->s), 0);
    c = counts_of(&t);
    assert_int_equal(stats_of(f).dropped, 64);
    assert_true(c.flushes - c0.flushes <= 8);
    for (uint64_t id = 1; id <= 64; id++)
        assert_false(has_id(f, id));
    put_range(f, 200, 32); /* the dropped pages' slots hold new pages */
    check_all(f, 133, 164);
    check_all(f, 200, 231);
    assert_int_equal(stats_of(f).pages, 64);
    assert_int_equal(slots_check(f->s, why, sizeof(why)), 0);
    fx_close(f);
    f->o.faults = NULL;
}

/* A write that needs room right after reads found bad pages takes their slots (their drops run
 * first) rather than evicting good pages, and never fails for want of room. */
void test_bad_slots_before_eviction(void **state)
{
    struct fx *f = *state;
    char why[128];

    f->o.disk_bytes = 16ull * SLOT;
    f->o.slab_bytes = 16ull * SLOT;
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    put_range(f, 1, 16); /* full */
    zero_slots(f, 0, 8);
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), KVT_ECORRUPT);
    put_range(f, 100, 8); /* all stored: put_range checks each result */
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.evicted, 0);
    assert_int_equal(st.dropped, 8);
    check_all(f, 9, 16);
    for (uint64_t id = 9; id <= 16; id++)
        assert_true(has_id(f, id));
    check_all(f, 100, 107);
    assert_int_equal(slots_check(f->s, why, sizeof(why)), 0);
}
