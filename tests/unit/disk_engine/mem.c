#include "disk_engine_test.h"

/* ---- another store below the host: the in-memory one, through the store contract ---- */

#define MEM_PAGES 96 /* fewer than the family's pages: the store evicts too */
#define MEM_SEEN 64
#define MEM_CANDIDATES 256 /* keys of the family tried for one the store holds past the host */

/* The mem store's fault seam: fail a share of reads and writes, and note keys read so the
 * test can damage their stored bytes afterwards (the seam runs under the store's lock). Each
 * key is noted once: damage flips a byte, so a key damaged twice would be whole again. */
struct mem_faults {
    uint64_t rng;
    uint32_t pct; /* 0: no faults */
    uint64_t failed;
    uint8_t seen[MEM_SEEN][STORE_KEY_BYTES];
    uint32_t nseen;
    struct store_mem_faults hooks; /* the store keeps a pointer to it */
};

static bool seen_before(const struct mem_faults *f, const uint8_t *key)
{
    for (uint32_t i = 0; i < f->nseen; i++)
        if (!memcmp(f->seen[i], key, STORE_KEY_BYTES))
            return true;
    return false;
}

static int mem_inject(void *arg, enum store_op_kind kind, const uint8_t *key)
{
    struct mem_faults *f = arg;
    static const int read_err[] = {-EIO, KVT_ECORRUPT};

    if (kind == STORE_OP_READ && f->nseen < MEM_SEEN && !seen_before(f, key))
        memcpy(f->seen[f->nseen++], key, STORE_KEY_BYTES);
    if (!f->pct || !chance(&f->rng, f->pct))
        return 0;
    f->failed++;
    return kind == STORE_OP_WRITE ? -ENOSPC : read_err[below(&f->rng, 2)];
}

static kvt_engine *open_on_mem(struct mem_faults *f, uint32_t policy)
{
    struct kvt_options o;
    struct kvt_store *s = NULL;
    kvt_engine *e = NULL;

    f->hooks = (struct store_mem_faults){.inject = mem_inject, .arg = f};
    disk_opts(&o, NULL, FAULT_HOST_TOKENS, 0);
    o.disk_write_policy = policy;
    struct store_mem_options mo = {
        .page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS),
        .page_tokens = PS,
        .capacity_pages = MEM_PAGES,
        .faults = &f->hooks,
    };
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), 0);
    check(e);
    return e;
}

/* A page damaged right before a request reads it from the store: the read catches it and counts
 * it, nothing of the run it leads is served, and the request computes the run (run_req checks
 * every row). Made certain here because the pages damaged after the first run are reached by
 * chance: the store evicts its least recently used pages, and what the host holds, so what is
 * read from the store, follows when its backups land. */
static void read_damaged(kvt_engine *e, uint64_t fam, uint64_t seed)
{
    static uint8_t page[LAYERS * 2 * PS * ROW];
    uint8_t key[STORE_KEY_BYTES];
    struct kvt_match m = {0};
    uint64_t rng = seed ^ 5, op, errors;
    struct seq q;
    int res = -1;

    REQUIRE(g_ctx, e->store->page_bytes == sizeof(page));
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    /* A key whose store run starts where the device's part ends: with host pages between, the
     * room the read makes in the host may evict them, and the read is dropped with its parent. */
    for (int i = 0; i < MEM_CANDIDATES && !(m.disk_len > 0 && m.host_len == 0); i++) {
        struct kvt_key k;
        gen_seq(fam, &rng, &q);
        k = seq_key(&q, q.len);
        EXPECT_RC(g_ctx, kvt_match(e, &k, NULL, &m), 0);
    }
    REQUIRE(g_ctx, m.disk_len > 0 && m.host_len == 0);
    size_t first = m.device_len / PS; /* the page the request reads first */
    page_key(e, &q, first, key);
    expected_page(&q, first, page);
    EXPECT_RC(g_ctx, store_mem_damage(e->store, key), 0);
    /* A write of a page the store holds is an access (bytes untouched): it goes first in the
     * LRU order, so the pages the request's room in the host writes down on evict cannot push it
     * out before the read. The op is ours to collect, not the tier's. */
    EXPECT_RC(g_ctx,
              store_write(e->store, &(struct store_wpage){.key = key, .buf = page}, 1, &res, &op),
              0);
    EXPECT_RC(g_ctx, store_wait_for(e->store, op, 0, NULL), 0);
    REQUIRE(g_ctx, res == 0);
    errors = stats(e).disk_errors;
    struct kvt_req r = run_req(e, &q, q.len, 1, &m);
    REQUIRE(g_ctx, m.disk_len > 0 && r.disk_len == 0);
    REQUIRE(g_ctx, stats(e).disk_errors == errors + 1);
}

/* The engine over the in-memory store, with faults and damaged pages: every page served is
 * exact, the store is read from, the errors are counted, and a clean store serves again.
 * seed is the case's own, drawn from base: the KVT_SEED that reruns it. */
static void mem_case(uint32_t policy, uint64_t seed, uint64_t base)
{
    struct mem_faults f = {.rng = seed, .pct = 20};
    struct tally a = {0}, b = {0};
    uint64_t fam = rng_mix(seed ^ 7);

    snprintf(g_ctx, sizeof(g_ctx), "mem store policy=%u seed=%" PRIu64 " (KVT_SEED=%" PRIu64 ")",
             policy, seed, base);
    kvt_engine *e = open_on_mem(&f, policy);
    run_family(e, fam, seed, 150, 0, 1, &a);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    REQUIRE(g_ctx, f.failed > 0 && stats(e).disk_errors > 0);
    f.pct = 0;
    uint64_t errors = stats(e).disk_errors;
    read_damaged(e, fam, seed);
    /* Damage what was read, then read it again: the store's check must catch every one a read
     * reaches (run_req checks every row served). Whether one is reached is chance; that one
     * was, read_damaged made sure. */
    for (uint32_t i = 0; i < f.nseen; i++)
        store_mem_damage(e->store, f.seen[i]);
    run_family(e, fam, seed ^ 3, 150, 1, 1, &b);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    REQUIRE(g_ctx, stats(e).disk_errors > errors); /* damaged pages were caught, not served */
    REQUIRE(g_ctx, b.disk_tokens > 0 && stats(e).disk_read_tokens > 0);
    kvt_close(e);
}

void test_mem_store(void **state)
{
    uint64_t seed = base_seed();

    (void)state;
    printf("test_disk_engine: mem store: seed=%" PRIu64 " (KVT_SEED reruns it)\n", seed);
    mem_case(KVT_DISK_WRITE_THROUGH, seed, seed);
    mem_case(KVT_DISK_WRITE_ON_EVICT, rng_mix(seed), seed);
}

/* ---- a chain below the host: a small mem store with faults before a disk store ---- */

struct chain_run {
    struct kvt_store *near, *far; /* the chain's, reached for their stats */
    char dir[128];
};

static kvt_engine *open_on_chain(struct mem_faults *f, uint32_t policy, struct chain_run *c)
{
    struct kvt_options o;
    struct dstore_options so;
    struct kvt_store *s[2] = {NULL, NULL}, *chain = NULL;
    kvt_engine *e = NULL;

    f->hooks = (struct store_mem_faults){.inject = mem_inject, .arg = f};
    make_data_dir(c->dir, sizeof(c->dir));
    disk_opts(&o, NULL, FAULT_HOST_TOKENS, 0);
    o.disk_write_policy = policy;
    struct store_mem_options mo = {
        .page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS * g_store_pages),
        .page_tokens = PS * g_store_pages,
        .capacity_pages = MEM_PAGES / 4 / g_store_pages,
        .faults = &f->hooks,
    };
    dstore_options_init(&so, sizeof(so));
    so.dir = c->dir;
    so.page_bytes = mo.page_bytes;
    so.page_tokens = mo.page_tokens;
    so.disk_bytes = FAULT_DISK_BYTES;
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s[0]), 0);
    EXPECT_RC(g_ctx, store_disk_open(&so, &s[1]), 0);
    EXPECT_RC(g_ctx, store_chain_open(s, 2, &chain), 0);
    EXPECT_RC(g_ctx, engine_open(&o, chain, &e), 0);
    c->near = s[0];
    c->far = s[1];
    check(e);
    return e;
}

/* The engine over a chain: the near store fails a share of its reads and writes and loses
 * pages to its small size, the far store keeps them. Every page served is exact, the near
 * store's failures are counted misses, and pages come from the far store. (A damaged page is
 * a miss in the store it is read from: test_store_chain.) seed is the case's own, drawn from
 * base: the KVT_SEED that reruns it. */
static void chain_case(uint32_t policy, uint64_t seed, uint64_t base)
{
    struct mem_faults f = {.rng = seed, .pct = 20};
    struct tally a = {0}, b = {0};
    struct chain_run c;
    struct store_stats far;
    uint64_t fam = rng_mix(seed ^ 11);

    snprintf(g_ctx, sizeof(g_ctx), "chain policy=%u seed=%" PRIu64 " (KVT_SEED=%" PRIu64 ")",
             policy, seed, base);
    kvt_engine *e = open_on_chain(&f, policy, &c);
    run_family(e, fam, seed, 150, 0, 1, &a);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    /* Which calls reach the near store depends on what the host evicted meanwhile: more of
     * the family until one of them failed. */
    for (uint64_t k = 0; (f.failed == 0 || stats(e).disk_errors == 0) && k < 8; k++) {
        run_family(e, fam, seed ^ (40 + k), 150, 0, 1, &a);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
    }
    REQUIRE(g_ctx, f.failed > 0 && stats(e).disk_errors > 0);
    run_family(e, fam, seed ^ 3, 150, 1, 1, &b);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    store_stats(c.far, &far);
    /* Whether the near store lost a page the second run asks for depends on what landed
     * when: more requests of the family until one comes from the far store. */
    for (uint64_t k = 0; (b.disk_tokens == 0 || far.bytes_read == 0) && k < 8; k++) {
        run_family(e, fam, seed ^ (20 + k), 150, 1, 1, &b);
        EXPECT_RC(g_ctx, kvt_sync(e), 0);
        store_stats(c.far, &far);
    }
    check(e);
    REQUIRE(g_ctx, b.disk_tokens > 0 && far.bytes_read > 0);
    kvt_close(e);
    fixture_remove_tree(c.dir);
}

void test_chain_store(void **state)
{
    uint64_t seed = base_seed();

    (void)state;
    printf("test_disk_engine: chain: seed=%" PRIu64 " (KVT_SEED reruns it)\n", seed);
    chain_case(KVT_DISK_WRITE_THROUGH, seed, seed);
    chain_case(KVT_DISK_WRITE_ON_EVICT, rng_mix(seed), seed);
}

/* The same with store pages of 3 pages (kvt_options.store_page_tokens): a near store's
 * failures and losses fall on whole store pages, a read split between the stores keeps the
 * pages of the store pages that landed from the first on. */
void test_chain_store_grouped(void **state)
{
    uint64_t seed = base_seed();

    (void)state;
    g_store_pages = 3;
    printf("test_disk_engine: chain, store pages of 3 pages: seed=%" PRIu64
           " (KVT_SEED reruns it)\n",
           seed);
    chain_case(KVT_DISK_WRITE_THROUGH, seed, seed);
    chain_case(KVT_DISK_WRITE_ON_EVICT, rng_mix(seed), seed);
}

/* A store for pages of another size than the host's is refused at open. */
void test_store_geometry(void **state)
{
    struct kvt_options o;
    struct kvt_store *s = NULL;
    kvt_engine *e = (kvt_engine *)1;

    (void)state;
    disk_opts(&o, NULL, FAULT_HOST_TOKENS, 0);
    struct store_mem_options mo = {.page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS) + 1,
                                   .page_tokens = PS,
                                   .capacity_pages = 8};
    EXPECT_RC(g_ctx, store_mem_open(&mo, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), -EINVAL);
    REQUIRE(g_ctx, e == NULL);
}
