#include "hicache_test.h"

/* ---- the disk tier ---- */

static void disk_options(struct kvt_options *o, const char *dir)
{
    host_options(o, 4, 64, 256);
    o->disk_dir = dir;
    o->disk_bytes = 1 << 20;
    o->store_page_tokens = o->page_size; /* a store page to a page: what these tests count */
}

/* Flip the first byte of every slot of a slab file (the slot size from its head: bytes 24..27;
 * the slots follow the head's 4 KiB). */
static void damage_slab(const char *dir)
{
    char path[128];
    struct stat st;
    uint8_t sb[4];

    snprintf(path, sizeof(path), "%s/slabs/0000.slab", dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(pread(fd, sb, 4, 24), 4);
    off_t slot = sb[0] | sb[1] << 8 | sb[2] << 16 | (off_t)sb[3] << 24;
    assert_int_equal(slot, fixture_disk_slot(PAGE_BYTES(4), 4));
    for (off_t off = 4096; off < st.st_size; off += slot) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, off), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, off), 1);
    }
    close(fd);
}

/* What was written through to disk is served after a restart, byte-exact, in its own
 * namespace; a dir of another model or page size is refused, and so is a second writer. */
void test_disk_restart(void **state)
{
    struct kvt_options o;
    struct seq a, b;
    struct kvt_match m;
    char dir[64];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 16, 3);
    seq_make(&b, 1, 12, 3); /* the same tokens in another namespace */
    run_request(e, &a, 0, 1);
    run_request(e, &b, 0, 1);
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_stats st = stats(e);
    assert_int_equal(st.disk_written_tokens, 28);
    assert_int_equal(st.disk_cached_tokens, 28);
    assert_int_equal(st.disk_errors, 0);
    assert_int_equal(st.disk_tokens, (1 << 20) / fixture_disk_slot(PAGE_BYTES(4), 4) * 4);
    kvt_engine *second = NULL;
    assert_int_equal(kvt_open(&o, &second), -EBUSY);
    kvt_close(e);

    /* A new engine: the tree is empty, the disk has it all. */
    e = open_with(&o, NULL);
    struct kvt_key key = seq_key(&a, 16);
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.device_len + m.host_len, 0);
    assert_int_equal(m.disk_len, 16);
    struct kvt_req r = run_request(e, &a, 16, 1); /* verifies every row */
    assert_int_equal(r.protected_len, 16);
    assert_int_equal(r.loaded_len, 16);
    assert_int_equal(r.disk_len, 16);
    r = run_request(e, &b, 12, 1);
    assert_int_equal(r.protected_len, 12);
    assert_int_equal(r.disk_len, 12);
    st = stats(e);
    assert_int_equal(st.disk_read_tokens, 28);
    assert_int_equal(st.disk_written_tokens, 0); /* already there: nothing written twice */
    check(e);
    kvt_close(e);

    o.model_id = "another-model";
    OPEN_FAILS(KVT_EFINGERPRINT);
    disk_options(&o, dir);
    o.page_size = o.store_page_tokens = 8;
    OPEN_FAILS(KVT_EFINGERPRINT);
    fixture_remove_tree(dir);
}

/* kvt_poll(e, max) applies at most max completions over transfers and disk ops together. */
void test_poll_budget(void **state)
{
    struct kvt_options o;
    struct seq q[3];
    char dir[64];
    size_t applied = 0;

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    for (uint32_t i = 0; i < 3; i++) {
        seq_make(&q[i], 0, 8, 140 + i);
        run_request(e, &q[i], 0, 1); /* one backup each */
    }
    assert_int_equal(stats(e).ops_in_flight, 3);
    /* Let the backups land, unapplied; applying them starts one disk write each. */
    xfer_wait(host_tier_xfer(e->below), XFER_BACKUP, host_tier_last_op(e->below, XFER_BACKUP));
    assert_int_equal(kvt_poll(e, 3, &applied), 0);
    assert_int_equal(applied, 3);
    assert_int_equal(stats(e).disk_ops_in_flight, 3);
    /* Let the writes complete, uncollected (the store counts a batch's pages as it settles
     * its ops). */
    struct dstore_stats ds;
    for (int i = 0; i < 10000; i++) {
        dstore_stats(store_disk_dstore(e->store), &ds);
        if (ds.writes == 3 * 2)
            break;
        usleep(1000);
    }
    assert_int_equal(ds.writes, 3 * 2);
    for (size_t left = 3; left > 0; left--) {
        assert_int_equal(kvt_poll(e, 1, &applied), 0);
        assert_int_equal(applied, 1);
        assert_int_equal(stats(e).disk_ops_in_flight, left - 1);
    }
    assert_int_equal(kvt_poll(e, 1, &applied), 0);
    assert_int_equal(applied, 0);
    assert_int_equal(stats(e).disk_written_tokens, 3 * 8);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* The disk tier needs a host tier in page_first layout and page hashes; its enums are
 * checked. */
void test_disk_bad_options(void **state)
{
    struct kvt_options o;
    kvt_engine *e;
    char dir[64];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    o.host_tokens = 0;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.host_layout = KVT_HOST_LAYER_FIRST;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.hash_pages = 0;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.disk_write_policy = KVT_DISK_WRITE_ON_EVICT + 1;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.prefetch_policy = KVT_PREFETCH_TIMEOUT + 1;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.disk_io = KVT_DISK_IO_PSYNC + 1;
    OPEN_FAILS(-EINVAL);
    disk_options(&o, dir);
    o.disk_sync = KVT_DISK_SYNC_RELAXED + 1;
    OPEN_FAILS(-EINVAL);
    /* A dir that holds something else is not taken over. */
    char junk[96];
    snprintf(junk, sizeof(junk), "%s/notes.txt", dir);
    FILE *f = fopen(junk, "w");
    assert_non_null(f);
    fputs("not kvtier\n", f);
    fclose(f);
    disk_options(&o, dir);
    OPEN_FAILS(KVT_EFORMAT);
    fixture_remove_tree(dir);
}

/* Damaged pages on disk are never served: the read fails its checksum, the entry goes, the
 * request computes the prefix, and the engine writes it again. */
void test_disk_corruption(void **state)
{
    struct kvt_options o;
    struct seq a;
    char dir[64];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 16, 5);
    run_request(e, &a, 0, 1);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);
    damage_slab(dir);

    e = open_with(&o, NULL);
    struct kvt_req r = run_request(e, &a, 16, 1); /* computes: nothing served from disk */
    assert_int_equal(r.protected_len, 0);
    assert_int_equal(r.disk_len, 0);
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_stats st = stats(e);
    assert_true(st.disk_errors >= 1);
    assert_int_equal(st.disk_read_tokens, 0);
    assert_int_equal(st.disk_written_tokens, 16); /* written again from the new backup */
    check(e);
    kvt_close(e);

    e = open_with(&o, NULL);
    r = run_request(e, &a, 16, 1);
    assert_int_equal(r.disk_len, 16);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* kvt_prefetch reads the disk part ahead; under best_effort a begin takes what has landed.
 * Under write-on-evict nothing reaches the disk until the host evicts it. */
void test_disk_prefetch_and_on_evict(void **state)
{
    struct kvt_options o;
    struct seq a, k[6];
    char dir[64];
    size_t tokens = 0;

    (void)state;
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    kvt_engine *e = open_with(&o, NULL);
    seq_make(&a, 0, 16, 6);
    run_request(e, &a, 0, 1);
    assert_int_equal(kvt_sync(e), 0);
    kvt_close(e);

    disk_options(&o, dir);
    o.prefetch_policy = KVT_PREFETCH_BEST_EFFORT;
    e = open_with(&o, NULL);
    struct kvt_key key = seq_key(&a, 16);
    assert_int_equal(kvt_prefetch(e, &key, &tokens), 0);
    assert_int_equal(tokens, 16);
    assert_int_equal(kvt_prefetch(e, &key, &tokens), 0);
    assert_int_equal(tokens, 0); /* already under way */
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_match m;
    assert_int_equal(kvt_match(e, &key, NULL, &m), 0);
    assert_int_equal(m.host_len, 16);
    assert_int_equal(m.disk_len, 0);
    struct kvt_req r = run_request(e, &a, 16, 1);
    assert_int_equal(r.loaded_len, 16);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);

    /* write on evict: a host pool of 80 tokens must evict to hold six 16-token keys. */
    make_data_dir(dir, sizeof(dir));
    disk_options(&o, dir);
    o.host_tokens = 80;
    o.disk_write_policy = KVT_DISK_WRITE_ON_EVICT;
    e = open_with(&o, NULL);
    for (int i = 0; i < 4; i++) {
        seq_make(&k[i], 0, 16, 40 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(stats(e).disk_written_tokens, 0);
    for (int i = 4; i < 6; i++) {
        seq_make(&k[i], 0, 16, 40 + (uint32_t)i);
        run_request(e, &k[i], 0, 1);
    }
    assert_int_equal(kvt_sync(e), 0);
    struct kvt_stats st = stats(e);
    assert_true(st.host_evicted_tokens > 0);
    assert_int_equal(st.disk_written_tokens, st.host_evicted_tokens);
    /* The oldest went to disk and comes back from there. */
    evict_all(e);
    r = run_request(e, &k[0], 16, 1);
    assert_int_equal(r.disk_len, 16);
    check(e);
    kvt_close(e);
    fixture_remove_tree(dir);
}

/* The disk tier under the same random load: host eviction leaves pages only on disk, later
 * begins read them back (or take what landed), and every row served is checked. */
void test_random_disk(void **state)
{
    static const struct rcfg cfgs[] = {
        {.name = "ps4-disk-wt-wait",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 192,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .max_delay_us = 300,
         .reuse = 60,
         .ops = 15000,
         .host_pressure = 1,
         .pressure = 1,
         .disk = 1,
         .disk_write_policy = KVT_DISK_WRITE_THROUGH,
         .prefetch_policy = KVT_PREFETCH_WAIT_COMPLETE},
        {.name = "ps1-disk-wb-onevict-best",
         .ps = 1,
         .device_tokens = 96,
         .host_tokens = 128,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_BACK,
         .max_delay_us = 200,
         .reuse = 60,
         .ops = 15000,
         .host_pressure = 1,
         .pressure = 1,
         .disk = 1,
         .disk_write_policy = KVT_DISK_WRITE_ON_EVICT,
         .prefetch_policy = KVT_PREFETCH_BEST_EFFORT},
        {.name = "ps4-disk-sel-timeout",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 160,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH_SELECTIVE,
         .write_threshold = 1,
         .max_delay_us = 300,
         .reuse = 80,
         .ops = 15000,
         .host_pressure = 1,
         .disk = 1,
         .disk_write_policy = KVT_DISK_WRITE_THROUGH,
         .prefetch_policy = KVT_PREFETCH_TIMEOUT},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}
