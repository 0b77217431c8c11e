#include "disk_engine_test.h"

/* ---- damaged bytes under a running engine ---- */

struct damage {
    const struct seq *q; /* pages of q (found by their first token) ... */
    uint32_t pages;      /* ... whose bit (1 << page) is set get damaged */
    const char *dir;
    uint32_t slot_bytes;
    int done;
};

static int damage_visit(void *arg, const struct dstore_entry *en)
{
    struct damage *d = arg;

    if (en->status || en->ntokens != PS)
        return 0;
    for (uint32_t p = 0; p < d->q->len / PS; p++) {
        if (!(d->pages & 1u << p) || memcmp(en->tokens, d->q->tok + p * PS, PS * 4))
            continue;
        char path[160];
        uint8_t b[16];
        snprintf(path, sizeof(path), "%s/slabs/%04u.slab", d->dir, en->slab);
        int fd = open(path, O_RDWR);
        REQUIRE(g_ctx, fd >= 0);
        off_t off = (off_t)(SLAB_HEAD_BYTES + (uint64_t)en->slot * d->slot_bytes + 100);
        REQUIRE(g_ctx, pread(fd, b, sizeof(b), off) == (ssize_t)sizeof(b));
        for (size_t i = 0; i < sizeof(b); i++)
            b[i] ^= 0xa5;
        REQUIRE(g_ctx, pwrite(fd, b, sizeof(b), off) == (ssize_t)sizeof(b));
        close(fd);
        d->done++;
    }
    return 0;
}

/* Flip bytes of the pages of q named by the mask in the slab file, under the engine. */
static int damage_pages(kvt_engine *e, const char *dir, const struct seq *q, uint32_t mask)
{
    struct dstore_stats ds;
    struct damage d = {.q = q, .pages = mask, .dir = dir};

    dstore_stats(store_disk_dstore(e->store), &ds);
    d.slot_bytes = ds.slot_bytes;
    EXPECT_RC(g_ctx, dstore_iterate(store_disk_dstore(e->store), damage_visit, &d), 0);
    return d.done;
}

static struct kvt_match match_of(kvt_engine *e, const struct seq *q)
{
    struct kvt_key key = seq_key(q, q->len);
    struct kvt_match m;

    EXPECT_RC(g_ctx, kvt_match(e, &key, NULL, &m), 0);
    return m;
}

static uint64_t checksum_errors(kvt_engine *e)
{
    struct dstore_stats ds;

    dstore_stats(store_disk_dstore(e->store), &ds);
    return ds.err_checksum;
}

static uint64_t dropped_records(kvt_engine *e)
{
    struct dstore_stats ds;

    dstore_stats(store_disk_dstore(e->store), &ds);
    return ds.dropped;
}

/* A commit held in the fault seam until the test lets it go. */
struct commit_gate {
    pthread_mutex_t m;
    pthread_cond_t cv;
    bool armed, entered, open;
};

static int gate_commit(void *arg, enum dstore_fault_point point, uint32_t slab, uint32_t slot)
{
    struct commit_gate *g = arg;

    (void)slab;
    (void)slot;
    if (point != DSTORE_FAULT_COMMIT)
        return 0;
    pthread_mutex_lock(&g->m);
    if (g->armed) {
        g->entered = true;
        pthread_cond_broadcast(&g->cv);
        while (!g->open)
            pthread_cond_wait(&g->cv, &g->m);
    }
    pthread_mutex_unlock(&g->m);
    return 0;
}

struct sync_call {
    kvt_engine *e;
    atomic_bool done;
};

static void *call_sync(void *arg)
{
    struct sync_call *c = arg;

    EXPECT_RC(g_ctx, kvt_sync(c->e), 0);
    atomic_store(&c->done, true);
    return NULL;
}

/* kvt_sync waits for the drops of records that reads found bad, which the store queues in
 * the background: when it returns, the dir no longer names those bytes. The drops are held
 * at their commit to see it wait. */
void test_sync_waits_for_drops(void **state)
{
    struct commit_gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false,
                            false};
    struct dstore_faults faults = {.inject = gate_commit, .arg = &g};
    struct sync_call call = {0};
    struct kvt_options o;
    struct seq a;
    pthread_t t;
    char dir[96];

    (void)state;
    snprintf(g_ctx, sizeof(g_ctx), "sync-drops");
    make_data_dir(dir, sizeof(dir));
    disk_opts(&o, dir, FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    kvt_engine *e = open_ok(&o);
    seq_make(&a, 1, 16, 7);
    run_req(e, &a, 16, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    kvt_close(e);
    /* Only the disk holds a now; no write follows a read (on_evict), so only drops queue. */
    o.disk_write_policy = KVT_DISK_WRITE_ON_EVICT;
    e = open_ok(&o);
    swap_store(e, &faults);
    REQUIRE(g_ctx, damage_pages(e, dir, &a, 0xf) == 4);
    uint64_t dropped0 = dropped_records(e);
    g.armed = true;
    run_req(e, &a, 16, 1, NULL); /* reads fail their checksums: drops queue, the first held */
    pthread_mutex_lock(&g.m);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.m);
    pthread_mutex_unlock(&g.m);
    call.e = e;
    REQUIRE(g_ctx, pthread_create(&t, NULL, call_sync, &call) == 0);
    usleep(200 * 1000);
    REQUIRE(g_ctx, !atomic_load(&call.done)); /* held behind the drop */
    pthread_mutex_lock(&g.m);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.m);
    REQUIRE(g_ctx, pthread_join(t, NULL) == 0);
    REQUIRE(g_ctx, atomic_load(&call.done));
    REQUIRE(g_ctx, dropped_records(e) == dropped0 + 4);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
    g_ctx[0] = 0;
}

void test_checksum_running(void **state)
{
    struct kvt_options o;
    struct seq a, b, fill;
    struct kvt_match m;
    char dir[96];

    (void)state;
    snprintf(g_ctx, sizeof(g_ctx), "checksum");
    make_data_dir(dir, sizeof(dir));
    disk_opts(&o, dir, FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    kvt_engine *e = open_ok(&o);
    seq_make(&a, 1, 16, 1);
    seq_make(&b, 0, 16, 2);
    run_req(e, &a, 0, 1, NULL);
    run_req(e, &b, 0, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_cached_tokens == 32);

    /* Evict the device copies, then push the host copies out with other keys until a and b
     * are only on disk. */
    EXPECT_RC(g_ctx, kvt_evict(e, SIZE_MAX / 2, NULL), 0);
    uint32_t salt = 10;
    for (int tries = 0; tries < 20; tries++) {
        struct kvt_match ma = match_of(e, &a), mb = match_of(e, &b);
        if (ma.device_len + ma.host_len + mb.device_len + mb.host_len == 0)
            break;
        for (int i = 0; i < 3; i++, salt++) {
            seq_make(&fill, salt % 2, MAX_TOK, salt);
            run_req(e, &fill, 0, 1, NULL);
        }
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
    }
    m = match_of(e, &a);
    REQUIRE(g_ctx, m.device_len == 0 && m.host_len == 0 && m.disk_len == 16);
    m = match_of(e, &b);
    REQUIRE(g_ctx, m.device_len == 0 && m.host_len == 0 && m.disk_len == 16);
    check(e);

    /* Every page of a damaged, and the third page of b. */
    REQUIRE(g_ctx, damage_pages(e, dir, &a, 0xf) == 4);
    REQUIRE(g_ctx, damage_pages(e, dir, &b, 1u << 2) == 1);
    struct kvt_stats st0 = stats(e);
    uint64_t bad0 = checksum_errors(e), dropped0 = dropped_records(e);

    struct kvt_req r = run_req(e, &a, 16, 1, &m); /* computes it all */
    REQUIRE(g_ctx, m.disk_len == 16);
    REQUIRE(g_ctx, r.protected_len == 0 && r.disk_len == 0);
    REQUIRE(g_ctx, checksum_errors(e) > bad0);
    r = run_req(e, &b, 16, 1, &m); /* the two pages before the damaged one come from disk */
    REQUIRE(g_ctx, m.disk_len == 16);
    REQUIRE(g_ctx, r.protected_len == 8 && r.disk_len == 8);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    struct kvt_stats st1 = stats(e);
    printf("test_disk_engine: checksum: %" PRIu64 " checksum errors, disk errors %" PRIu64
           " -> %" PRIu64 ", read %" PRIu64 " -> %" PRIu64 " tokens\n",
           checksum_errors(e) - bad0, st0.disk_errors, st1.disk_errors, st0.disk_read_tokens,
           st1.disk_read_tokens);
    REQUIRE(g_ctx, checksum_errors(e) - bad0 == 5);
    REQUIRE(g_ctx, st1.disk_errors >= st0.disk_errors + 5);
    REQUIRE(g_ctx, st1.disk_read_tokens == st0.disk_read_tokens + 8);
    /* kvt_sync returned: the records of the bad pages are dropped already, not still queued. */
    REQUIRE(g_ctx, dropped_records(e) == dropped0 + 5);

    /* The engine goes on: the same keys and others, from the device and host now. */
    for (int i = 0; i < 6; i++, salt++) {
        seq_make(&fill, salt % 2, MAX_TOK, salt);
        run_req(e, &fill, MAX_TOK, 1, NULL);
        run_req(e, i % 2 ? &a : &b, 16, 1, NULL);
    }
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    kvt_close(e);

    /* The damaged pages were dropped and written again: a restart serves a and b whole, and
     * every page the index holds is right. */
    e = open_ok(&o);
    struct recs recs = {0};
    struct disk_check dc = check_disk(e, &recs);
    free(recs.v);
    REQUIRE(g_ctx, dc.pages >= 8 && dc.orphans == 0);
    r = run_req(e, &a, 16, 1, NULL);
    REQUIRE(g_ctx, r.protected_len == 16 && r.disk_len == 16);
    r = run_req(e, &b, 16, 1, NULL);
    REQUIRE(g_ctx, r.protected_len == 16 && r.disk_len == 16);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_errors == 0);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
    g_ctx[0] = 0;
}
