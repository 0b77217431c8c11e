#include "store_test.h"

/* ---- access times: kept in memory, written lazily ---- */

/* More pages than the 1,024 access times that once made the committer commit on its own. */
#define READ_PAGES 1088

/* The fault seam as a counter of the store's flushes: index commits and slab fdatasyncs. */
struct flushes {
    atomic_uint commits, syncs;
};

static int count_flush(void *arg, enum dstore_fault_point pt, uint32_t slab, uint32_t slot)
{
    struct flushes *c = arg;

    (void)slab;
    (void)slot;
    if (pt == DSTORE_FAULT_COMMIT)
        atomic_fetch_add(&c->commits, 1);
    else if (pt == DSTORE_FAULT_SYNC)
        atomic_fetch_add(&c->syncs, 1);
    return 0;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Reads, and writes of pages stored already, flush nothing: their access times wait for a
 * commit that happens anyway, or for close, which commits them once. */
void test_reads_cost_no_flush(void **state)
{
    struct fx *f = *state;
    struct flushes c = {0};
    struct dstore_faults faults = {count_flush, &c};
    unsigned commits, syncs;

    f->o.faults = &faults;
    f->o.access_period_ms = 3600000; /* however slow the run, no period ends in it */
    f->o.disk_bytes = READ_PAGES * SLOT;
    f->o.slab_bytes = READ_PAGES / 2 * SLOT;
    fx_open(f);
    for (uint64_t id = 1; id <= READ_PAGES; id += 32)
        put_range(f, id, 32);
    assert_int_equal(dstore_drain(f->s), 0);
    commits = atomic_load(&c.commits);
    syncs = atomic_load(&c.syncs);
    for (int round = 0; round < 2; round++)
        for (uint64_t id = 1; id <= READ_PAGES; id++)
            assert_int_equal(get_id(f, id), 0);
    put_range(f, 1, 32); /* stored already: accesses, no record to write */
    assert_int_equal(stats_of(f).write_dups, 32);
    assert_int_equal(dstore_drain(f->s), 0);
    assert_int_equal(atomic_load(&c.commits), commits);
    assert_int_equal(atomic_load(&c.syncs), syncs);
    fx_close(f);
    assert_int_equal(atomic_load(&c.commits), commits + 1);
    assert_int_equal(atomic_load(&c.syncs), syncs);
    f->o.faults = NULL;
}

/* Access times that no write carried reach the index at a clean close: the eviction order
 * after a reopen follows the reads. */
void test_access_order_after_close(void **state)
{
    struct fx *f = *state;
    uint64_t read[4] = {3, 1, 5, 7};

    f->o.disk_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 8);
    for (int i = 0; i < 4; i++)
        assert_int_equal(get_id(f, read[i]), 0);
    fx_reopen(f);        /* nothing written since the reads */
    put_range(f, 20, 4); /* the pages never read go: 2, 4, 6, 8 */
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(has_id(f, id), id % 2 == 1);
    put_range(f, 30, 1); /* then the oldest read: 3 */
    assert_false(has_id(f, 3));
    assert_true(has_id(f, 1) && has_id(f, 5) && has_id(f, 7));
    check_all(f, 1, 40);
}

static int last_access(void *arg, const struct dstore_entry *e)
{
    uint64_t *t = arg;

    t[0] = e->created_ns;
    t[1] = e->last_access_ns;
    return 0;
}

/* *created, *accessed: the record of page id as the index holds it now. */
static void record_times(struct fx *f, uint64_t id, uint64_t *created, uint64_t *accessed)
{
    uint8_t key[KEY];
    uint64_t t[2] = {0, 0};

    make_key(id, key);
    assert_int_equal(dstore_lookup(f->s, key, last_access, t), 0);
    *created = t[0];
    *accessed = t[1];
}

/* Access times that wait access_period_ms for a commit get one of their own, once. */
void test_access_period(void **state)
{
    struct fx *f = *state;
    struct flushes c = {0};
    struct dstore_faults faults = {count_flush, &c};
    uint64_t created, accessed, start;
    unsigned commits;

    f->o.faults = &faults;
    f->o.access_period_ms = 50;
    f->o.disk_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 8);
    assert_int_equal(dstore_drain(f->s), 0);
    commits = atomic_load(&c.commits);
    start = mono_ms();
    assert_int_equal(get_id(f, 3), 0); /* one access: one commit, whatever the timing */
    while (atomic_load(&c.commits) == commits && mono_ms() - start < 10000)
        usleep(5000);
    assert_true(mono_ms() - start >= 50);
    assert_int_equal(dstore_drain(f->s), 0); /* the commit seen starting has ended */
    assert_int_equal(atomic_load(&c.commits), commits + 1);
    record_times(f, 3, &created, &accessed);
    assert_true(accessed > created);
    record_times(f, 2, &created, &accessed);
    assert_true(accessed == created);
    usleep(100000); /* nothing waits: no more commits */
    fx_close(f);
    assert_int_equal(atomic_load(&c.commits), commits + 1);
    f->o.faults = NULL;
}

/* A crash loses access times not committed yet, never a page or a record. */
static void access_crash(struct fx *f)
{
    int fds[2], status;
    char ready;
    pid_t pid;

    need_io();
    f->o.disk_bytes = 8ull * SLOT;
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct dstore *s;
        uint8_t key[KEY];
        int res;

        if (dstore_open(&f->o, &s))
            _exit(3);
        child_put(s, f->bufs, 1, 8);
        for (uint64_t id = 8; id >= 1; id--) {
            struct dstore_rpage r = {.key = key, .buf = f->bufs};

            make_key(id, key);
            if (dstore_get(s, &r, 1, &res) || res)
                _exit(6);
        }
        if (write(fds[1], "r", 1) != 1)
            _exit(7);
        for (;;)
            pause(); /* killed with its access times still in memory */
    }
    close(fds[1]);
    assert_int_equal(read(fds[0], &ready, 1), 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), 0);
    put_range(f, 20, 2); /* the store still evicts and writes */
    assert_int_equal(stats_of(f).pages, 8);
    check_all(f, 1, 30);
    char why[128];
    assert_int_equal(slots_check(f->s, why, sizeof(why)), 0);
}

void test_access_crash(void **state)
{
    access_crash(*state);
}

/* Relaxed mode: nothing the child wrote was flushed, and a SIGKILL still loses no page. */
void test_access_crash_relaxed(void **state)
{
    struct fx *f = *state;

    f->o.sync = DSTORE_SYNC_RELAXED;
    f->o.sync_ms = 3600000;
    access_crash(f);
}

/* The record of page id, raw from the index of the closed dir: its created and last-access
 * fields. */
static void raw_record_times(struct fx *f, uint64_t id, uint64_t *created, uint64_t *accessed)
{
    char path[96];
    uint8_t key[KEY];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_val k = {KEY, key}, v;
    struct drec r;

    make_key(id, key);
    snprintf(path, sizeof(path), "%s/index", f->dir);
    assert_int_equal(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 3);
    assert_int_equal(mdb_env_open(env, path, MDB_RDONLY, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "pages", 0, &dbi), 0);
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(key, v.mv_data, v.mv_size, &r), 0);
    *created = r.created;
    *accessed = r.last_access;
    mdb_txn_abort(txn);
    mdb_env_close(env);
}

/* An access rewrites the page's slot-table entry, not its record (which carries the page's
 * tokens, an index page of its own): the record keeps its write time, what the store shows is
 * the access, and after a restart too. */
void test_access_slot_only(void **state)
{
    struct fx *f = *state;
    uint64_t created, accessed, raw_created, raw_accessed;

    f->o.disk_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 8);
    assert_int_equal(get_id(f, 3), 0);
    assert_int_equal(dstore_flush(f->s), 0); /* the access committed */
    record_times(f, 3, &created, &accessed);
    assert_true(accessed > created);
    fx_close(f);
    raw_record_times(f, 3, &raw_created, &raw_accessed);
    assert_int_equal(raw_created, created);
    assert_int_equal(raw_accessed, created);
    fx_open(f);
    record_times(f, 3, &raw_created, &raw_accessed);
    assert_int_equal(raw_created, created);
    assert_int_equal(raw_accessed, accessed);
}
