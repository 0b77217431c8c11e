#include "disk_engine_test.h"

/* ---- store pages of several pages (kvt_options.store_page_tokens) ---- */

#define GROUP 4                   /* pages to a store page */
#define STORE_TOKENS (GROUP * PS) /* 16 */
#define GROUP_BYTES ((uint64_t)LAYERS * 2 * ROW * STORE_TOKENS)
#define GROUP_SLOT fixture_disk_slot(GROUP_BYTES, STORE_TOKENS)

static void grouped_opts(struct kvt_options *o, const char *dir, uint64_t disk_slots)
{
    disk_opts(o, dir, FAULT_HOST_TOKENS, disk_slots * GROUP_SLOT);
    o->store_page_tokens = STORE_TOKENS;
}

/* A run of requests that leaves nothing in the device or the host: each key of its own salt, so
 * the pages of q are evicted above and any later match of q reads the disk. */
static void flush_above(kvt_engine *e)
{
    for (uint32_t salt = 0; salt < 8; salt++) {
        struct seq other;
        seq_make(&other, 1, MAX_TOK, 900 + salt);
        run_req(e, &other, other.len, 1, NULL);
    }
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
}

static void expect_disk(kvt_engine *e, const struct seq *q, size_t want)
{
    struct kvt_key k = seq_key(q, q->len);
    struct kvt_match m = {0};

    EXPECT_RC(g_ctx, kvt_match(e, &k, NULL, &m), 0);
    if (m.device_len + m.host_len + m.disk_len != want || m.disk_len == 0)
        FAIL(g_ctx, "a key of %zu tokens: device %zu host %zu disk %zu, want %zu in all", q->len,
             m.device_len, m.host_len, m.disk_len, want);
}

/* Store pages of 4 pages: a key's whole store pages go down and its rest waits; the key grown
 * takes its first pages from the host copies above for the store page it fills; after a
 * restart a match finds whole store pages, reads one that starts above the tree's part, and
 * every page served is the right KV. A dir of another store page is refused. */
void test_store_pages(void **state)
{
    struct kvt_options o;
    struct seq a, b, c;
    char dir[96];

    (void)state;
    snprintf(g_ctx, sizeof(g_ctx), "store pages of %d pages", GROUP);
    make_data_dir(dir, sizeof(dir));
    grouped_opts(&o, dir, 64);
    seq_make(&b, 0, 12 * PS, 7); /* three store pages */
    seq_make(&a, 0, 10 * PS, 7); /* b's first 10 pages: two store pages and two pages */
    seq_make(&c, 0, 6 * PS, 7);  /* b's first 6 pages */

    kvt_engine *e = open_ok(&o);
    run_req(e, &a, a.len, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_written_tokens == 2 * STORE_TOKENS);
    REQUIRE(g_ctx, stats(e).disk_cached_tokens == 2 * STORE_TOKENS);
    /* b grows a: its store page 2 takes a's pages 8 and 9 from their host copies. */
    run_req(e, &b, b.len, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_written_tokens == 3 * STORE_TOKENS);
    check(e);
    flush_above(e);
    expect_disk(e, &b, b.len);
    kvt_close(e);

    /* A restart: the tree is empty and the store answers by whole store pages. */
    e = open_ok(&o);
    expect_disk(e, &a, 2 * STORE_TOKENS); /* a's last two pages are in b's store page 2 */
    expect_disk(e, &b, b.len);
    struct kvt_match m;
    struct kvt_req r = run_req(e, &c, c.len, 1, &m); /* store page 0 read, pages 4 and 5 computed */
    REQUIRE(g_ctx, m.disk_len == STORE_TOKENS && r.disk_len == STORE_TOKENS);
    /* The tree holds b's first 6 pages: store page 1 starts above them, two of its pages and
     * store page 2 are read. */
    r = run_req(e, &b, b.len, 1, &m);
    REQUIRE(g_ctx, m.disk_len == 6 * PS && r.disk_len == 6 * PS);
    check(e);
    REQUIRE(g_ctx, stats(e).disk_errors == 0);
    kvt_close(e);

    /* The dir holds store pages of 16 tokens: an engine of pages of 4 is another fingerprint. */
    o.store_page_tokens = PS;
    kvt_engine *other = NULL;
    EXPECT_RC(g_ctx, open_engine(&o, &other), KVT_EFINGERPRINT);
    REQUIRE(g_ctx, other == NULL);
    fixture_remove_tree(dir);
}

/* Random families through store pages of several pages on a disk that evicts, and on the
 * in-memory store, with restarts: every page served is checked against its key, and the disk
 * serves after a restart. */
void test_store_pages_random(void **state)
{
    uint64_t base = base_seed();
    struct kvt_options o;
    char dir[96];

    (void)state;
    make_data_dir(dir, sizeof(dir));
    for (int round = 0; round < 3; round++) {
        uint64_t seed = rng_mix(base + (uint64_t)round), fam = rng_mix(seed ^ 3);
        struct tally t = {0}, after = {0};

        snprintf(g_ctx, sizeof(g_ctx),
                 "store pages random round %d seed=%" PRIu64 " (KVT_SEED=%" PRIu64 ")", round, seed,
                 base);
        grouped_opts(&o, dir, 24); /* fewer store pages than the family's: the disk evicts */
        o.disk_write_policy = round == 1 ? KVT_DISK_WRITE_ON_EVICT : KVT_DISK_WRITE_THROUGH;
        kvt_engine *e = open_ok(&o);
        run_family(e, fam, seed, 200, 0, 1, &t);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
        check(e);
        REQUIRE(g_ctx, stats(e).disk_written_tokens > 0 && stats(e).disk_errors == 0);
        kvt_close(e);
        e = open_ok(&o);
        run_family(e, fam, seed ^ 9, 100, 1, 1, &after);
        /* Which prefixes the restart finds on disk first depends on what landed when (the
         * disk evicts): more requests of the family until one is served from it. */
        for (uint64_t k = 0; after.disk_tokens == 0 && k < 8; k++)
            run_family(e, fam, seed ^ (20 + k), 100, 1, 1, &after);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
        check(e);
        REQUIRE(g_ctx, after.disk_tokens > 0 && stats(e).disk_errors == 0);
        kvt_close(e);
    }
    fixture_remove_tree(dir);

    /* The in-memory store, given to the engine: store pages of its own size. */
    struct kvt_store *s = NULL;
    struct tally t = {0};
    kvt_engine *e = NULL;
    grouped_opts(&o, NULL, 0);
    struct store_mem_options mo = {
        .page_bytes = (uint32_t)GROUP_BYTES, .page_tokens = STORE_TOKENS, .capacity_pages = 24};
    snprintf(g_ctx, sizeof(g_ctx), "store pages random, mem store (KVT_SEED=%" PRIu64 ")", base);
    mo.page_bytes /= 2; /* a store of another page size is refused */
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), -EINVAL);
    mo.page_bytes *= 2;
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), 0);
    run_family(e, rng_mix(base ^ 5), base, 300, 0, 1, &t);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    REQUIRE(g_ctx, t.disk_tokens > 0);
    kvt_close(e);
}

/* The store pages of `g` pages of the engine: a disk of slots of that many store pages. */
static void mixed_opts(struct kvt_options *o, const char *dir, uint32_t g, uint64_t slots)
{
    g_store_pages = g; /* disk_opts asks for it, check_disk expects it */
    disk_opts(o, dir, FAULT_HOST_TOKENS,
              slots * fixture_disk_slot((uint64_t)LAYERS * 2 * ROW * PS * g, PS * g));
}

/* Requests of a family, some prefetched first (a fill in flight while others run and write),
 * every page served checked (run_req). */
static void run_prefetching(kvt_engine *e, uint64_t fam, uint64_t seed, int n, struct tally *t)
{
    uint64_t rng = seed;

    for (int i = 0; i < n; i++) {
        struct seq q, p;
        gen_seq(fam, &rng, &q);
        if (chance(&rng, 30)) { /* another key's read started, left in flight */
            gen_seq(fam, &rng, &p);
            struct kvt_key k = seq_key(&p, p.len);
            EXPECT_RC(g_ctx, kvt_prefetch(e, &k, NULL), 0);
        }
        size_t prompt = chance(&rng, 70) ? q.len : below(&rng, (uint32_t)q.len + 1);
        struct kvt_req r = run_req(e, &q, prompt, chance(&rng, 90), NULL);
        t->reqs++;
        t->disk_tokens += r.disk_len;
        if (i % 8 == 7)
            check(e);
    }
}

/* Store pages of 2, 3 (not a power of two) and 4 pages, each prefetch policy, both write
 * policies and I/O modes, a host and a disk that both evict, keys that share prefixes ending
 * anywhere in a store page, reads left in flight, restarts: every page served is checked, and
 * after each run every record of the dir is read back and checked (its key the chained hash
 * of its parent and tokens, its parent the store page before it, its bytes their KV). A dir
 * of one store page size is refused by an engine of another. */
void test_store_pages_mixed(void **state)
{
    uint64_t base = base_seed();
    struct recs recs = {0};
    struct kvt_options o;
    char dir[96];

    (void)state;
    g_other_fills = 1;
    for (int round = 0; round < 6; round++) {
        uint64_t seed = rng_mix(base + 77 + (uint64_t)round), fam = rng_mix(seed ^ 5);
        uint32_t g = 2 + (uint32_t)round % 3;
        struct tally t = {0}, after = {0};
        uint64_t read = 0;

        snprintf(g_ctx, sizeof(g_ctx),
                 "store pages mixed round %d, %u pages, seed=%" PRIu64 " (KVT_SEED=%" PRIu64 ")",
                 round, g, seed, base);
        make_data_dir(dir, sizeof(dir));
        mixed_opts(&o, dir, g, 48 / g); /* under the family's store pages: the disk evicts */
        o.disk_write_policy = round % 2 ? KVT_DISK_WRITE_ON_EVICT : KVT_DISK_WRITE_THROUGH;
        o.prefetch_policy = (uint32_t)(round / 2) % 3;
        o.prefetch_timeout_ms = 1;
        o.disk_io = round % 4 == 3 ? KVT_DISK_IO_PSYNC : KVT_DISK_IO_AUTO;
        kvt_engine *e = open_ok(&o);
        run_prefetching(e, fam, seed, 200, &t);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
        check(e);
        struct disk_check dc = check_disk(e, &recs);
        REQUIRE(g_ctx, dc.pages > 0 && stats(e).disk_errors == 0);
        kvt_close(e);
        for (int restart = 0; restart < 2; restart++) {
            e = open_ok(&o);
            run_prefetching(e, fam, seed ^ (9 + (uint64_t)restart), 100, &after);
            EXPECT_RC(g_ctx, kvt_sync(e), 0);
            check(e);
            dc = check_disk(e, &recs);
            REQUIRE(g_ctx, dc.pages > 0 && stats(e).disk_errors == 0);
            read += stats(e).disk_read_tokens;
            kvt_close(e);
        }
        /* Served from the dir after a restart (best effort may serve none of what it read). */
        REQUIRE(g_ctx, read > 0 && (o.prefetch_policy || after.disk_tokens > 0));
        /* Another store page size: another fingerprint. */
        o.store_page_tokens = PS * (g == 2 ? 4 : 2);
        kvt_engine *other = NULL;
        EXPECT_RC(g_ctx, open_engine(&o, &other), KVT_EFINGERPRINT);
        REQUIRE(g_ctx, other == NULL);
        fixture_remove_tree(dir);
    }
    free(recs.v);
}

/* The store page size left to kvt_open (0): chosen by bytes, 64 KiB of KV or more, as
 * kvt_store_page_tokens says; a page of that much already, or a hybrid model, keeps
 * page_size; an explicit size is taken as it is. */
void test_store_pages_auto_size(void **state)
{
    struct kvt_options o;
    const uint64_t page = (uint64_t)LAYERS * 2 * ROW * PS; /* 256 bytes */

    (void)state;
    disk_opts(&o, "/nonexistent", FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    o.store_page_tokens = 0;
    o.max_context = 4096;
    assert_int_equal(kvt_store_page_tokens(&o), (64 << 10) / page * PS); /* 1024 */
    o.geometry.head_dim = 64 << 10;                                      /* a page of 2 MiB */
    assert_int_equal(kvt_store_page_tokens(&o), PS);
    o.geometry.head_dim = 1024; /* 32 KiB: two of them */
    assert_int_equal(kvt_store_page_tokens(&o), 2 * PS);
    o.geometry.head_dim = 1; /* 16 bytes a page: as many as a store page may hold */
    assert_int_equal(kvt_store_page_tokens(&o), 4096);
    o.max_context = 4096 + 3 * PS; /* at most 4096 still */
    assert_int_equal(kvt_store_page_tokens(&o), 4096);
    o.max_context = 30; /* and no longer than a key: whole pages of it */
    assert_int_equal(kvt_store_page_tokens(&o), 28);
    o.max_context = MAX_CONTEXT;
    o.geometry.head_dim = HEAD_DIM;
    o.store_page_tokens = 3 * PS;
    assert_int_equal(kvt_store_page_tokens(&o), 3 * PS);
    o.store_page_tokens = 3; /* not a multiple of page_size: kvt_open refuses it */
    assert_int_equal(kvt_store_page_tokens(&o), 0);
    o.store_page_tokens = 0;
    static const uint32_t full[] = {0};
    o.swa = (struct kvt_swa){.window = 8, .nfull = 1, .full_layers = full};
    assert_int_equal(kvt_store_page_tokens(&o), PS);
}

/* An engine left to choose: a dir it writes carries its choice (an engine of store pages of
 * page_size is another fingerprint there); a dir written with store pages of page_size, the
 * default before 0.9, is opened with those and serves what it holds. */
void test_store_pages_auto_compat(void **state)
{
    struct kvt_options o;
    struct seq a;
    char dir[96];

    (void)state;
    snprintf(g_ctx, sizeof(g_ctx), "store pages left to kvt_open");
    make_data_dir(dir, sizeof(dir));
    disk_opts(&o, dir, FAULT_HOST_TOKENS, FAULT_DISK_BYTES);
    o.store_page_tokens = 0;
    kvt_engine *e = open_ok(&o);
    REQUIRE(g_ctx, e->opts.store_page_tokens == kvt_store_page_tokens(&o) &&
                       e->opts.store_page_tokens == MAX_CONTEXT);
    kvt_close(e);
    o.store_page_tokens = PS;
    kvt_engine *other = NULL;
    EXPECT_RC(g_ctx, open_engine(&o, &other), KVT_EFINGERPRINT);
    fixture_remove_tree(dir);

    /* A dir of pages of page_size: written, then opened by an engine left to choose. */
    make_data_dir(dir, sizeof(dir));
    seq_make(&a, 0, 10 * PS, 11);
    e = open_ok(&o);
    run_req(e, &a, a.len, 1, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, stats(e).disk_written_tokens == a.len);
    kvt_close(e);
    o.store_page_tokens = 0;
    e = open_ok(&o);
    REQUIRE(g_ctx, e->opts.store_page_tokens == PS);
    expect_disk(e, &a, a.len);
    struct kvt_req r = run_req(e, &a, a.len, 1, NULL); /* every row checked */
    REQUIRE(g_ctx, r.disk_len == a.len && stats(e).disk_errors == 0);
    check(e);
    kvt_close(e);
    /* Another model is still refused, whatever the page size tried. */
    o.model_id = "another-model";
    EXPECT_RC(g_ctx, open_engine(&o, &other), KVT_EFINGERPRINT);
    REQUIRE(g_ctx, other == NULL);
    fixture_remove_tree(dir);
}
