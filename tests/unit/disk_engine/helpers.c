#include "disk_engine_test.h"

/* ---- the failure context ---- */

char g_ctx[192]; /* what runs now: the seed, the round; printed with a failure */

/* ---- keys: seeded families (the content is kv_rows.h's) ---- */

static uint64_t rnd(uint64_t *s)
{
    *s += RNG_GAMMA;
    return rng_mix(*s);
}

uint32_t below(uint64_t *s, uint32_t n)
{
    return n ? (uint32_t)(rnd(s) % n) : 0;
}

int chance(uint64_t *s, uint32_t pct)
{
    return below(s, 100) < pct;
}

/* Tokens salt * 1000 + i: one sequence, sharing nothing with a family or another salt. */
void seq_make(struct seq *q, uint32_t ns, size_t len, uint32_t salt)
{
    q->ns = ns;
    q->len = len;
    for (size_t i = 0; i < len; i++)
        q->tok[i] = 100000 + salt * 1000 + (uint32_t)i;
    seq_hash(q);
}

/* A key of family fam: one of N_BASE base sequences of a namespace, cut to a random length,
 * and now and then leaving the base for one of two branches at a page boundary. Tokens stay
 * below 30000, apart from seq_make's. */
static uint32_t fam_tok(uint64_t fam, uint32_t base, uint32_t variant, size_t i)
{
    return (uint32_t)(rng_mix(fam ^ rng_mix((uint64_t)base << 32 | (uint64_t)variant << 16 | i)) %
                      30000);
}

void gen_seq(uint64_t fam, uint64_t *rng, struct seq *q)
{
    uint32_t base = below(rng, N_BASE), variant = 0;
    size_t len = PS + below(rng, MAX_TOK - PS + 1), branch = len;

    q->ns = below(rng, N_NS);
    q->len = len;
    if (chance(rng, 30)) {
        variant = 1 + below(rng, 2);
        branch = PS * (size_t)below(rng, (uint32_t)(len / PS) + 1);
    }
    for (size_t i = 0; i < len; i++)
        q->tok[i] = fam_tok(fam, base, i < branch ? 0 : variant, i);
    seq_hash(q);
}

/* ---- engine helpers ---- */

void check(const kvt_engine *e)
{
    char why[256] = "";

    if (engine_check(e, why, sizeof(why)))
        FAIL(g_ctx, "engine check: %s", why);
    /* The store's slot table too, once its rebuild is done (children, chain ends). */
    if (store_disk_dstore(e->store) && dstore_wait_ready(store_disk_dstore(e->store)) == 0 &&
        slots_check(store_disk_dstore(e->store), why, sizeof(why)))
        FAIL(g_ctx, "store check: %s", why);
}

struct kvt_stats stats(const kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    EXPECT_RC(g_ctx, kvt_stats(e, &st), 0);
    return st;
}

void disk_opts(struct kvt_options *o, const char *dir, uint64_t host_tokens, uint64_t disk_bytes)
{
    fixture_engine_options(o, LAYERS, HEAD_DIM);
    o->page_size = PS;
    o->device_tokens = DEVICE_TOKENS;
    o->host_tokens = host_tokens;
    o->host_layout = KVT_HOST_PAGE_FIRST;
    o->max_requests = N_REQ;
    o->max_context = MAX_CONTEXT;
    o->disk_dir = dir;
    o->disk_bytes = disk_bytes;
    o->store_page_tokens = PS * (g_store_pages > 1 ? g_store_pages : 1); /* not by bytes */
}

/* kvt_open, retrying a while on -EBUSY (a writer that is going away). */
int open_engine(const struct kvt_options *o, kvt_engine **e)
{
    struct timespec nap = {0, 1000000};
    int rc = -EBUSY;

    for (int i = 0; i < 500 && rc == -EBUSY; i++) {
        rc = kvt_open(o, e);
        if (rc == -EBUSY)
            nanosleep(&nap, NULL);
    }
    return rc;
}

kvt_engine *open_ok(const struct kvt_options *o)
{
    kvt_engine *e = NULL;

    EXPECT_RC(g_ctx, open_engine(o, &e), 0);
    REQUIRE(g_ctx, e != NULL);
    check(e);
    return e;
}

/* A fresh data dir under TMPDIR or /tmp. */
void make_data_dir(char *dir, size_t len)
{
    EXPECT_RC(g_ctx, fixture_data_dir(dir, len, "disk-engine"), 0);
}

uint64_t base_seed(void)
{
    const char *s = getenv("KVT_SEED");
    struct timespec ts;

    if (s && *s)
        return strtoull(s, NULL, 0);
    clock_gettime(CLOCK_REALTIME, &ts);
    return rng_mix((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (uint64_t)getpid();
}

/* ---- requests ---- */

uint64_t g_slowest_call_us; /* see disk_engine_test.h */
int g_other_fills;          /* see disk_engine_test.h */

static uint64_t clock_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* rc of an engine call begun at t0 (its arguments are evaluated before this runs), noting
 * how long it took. */
static int timed(uint64_t t0, int rc)
{
    uint64_t us = clock_us() - t0;

    if (us > g_slowest_call_us)
        g_slowest_call_us = us;
    return rc;
}

/* Wait for every layer of the request's load and check its first n rows. */
static void verify(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t n)
{
    int32_t slots[MAX_TOK];

    REQUIRE(g_ctx, n <= q->len);
    if (n == 0)
        return;
    EXPECT_RC(g_ctx, kvt_req_read(e, r, 0, n, slots), 0);
    for (uint32_t l = 0; l < LAYERS; l++) {
        uint64_t t0 = clock_us();
        EXPECT_RC(g_ctx, timed(t0, kvt_load_wait_layer(e, r->load_op, l, NULL)), 0);
        long bad = check_layer(e, q, 0, n, slots, l);
        if (bad != -1)
            FAIL(g_ctx,
                 "layer %u: token %ld of %zu (ns %u, key of %zu, protected %zu, loaded %zu, "
                 "from disk %zu) has the wrong KV",
                 l, bad, n, q->ns, q->len, r->protected_len, r->loaded_len, r->disk_len);
    }
}

/* Compute tokens [from, to) of q for a begun request: allocate, write the rows, record the
 * slots in its row. */
static void extend(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t from,
                   size_t to)
{
    int32_t out[MAX_TOK], last = -1;
    uint32_t pl = (uint32_t)from, sl = (uint32_t)to;

    if (to <= from)
        return;
    if (from)
        EXPECT_RC(g_ctx, kvt_req_read(e, r, from - 1, 1, &last), 0);
    uint64_t t0 = clock_us();
    EXPECT_RC(g_ctx, timed(t0, kvt_alloc_extend(e, 1, &pl, &sl, &last, out, to - from)), 0);
    EXPECT_RC(g_ctx, compute_rows(e, q, from, to - from, out), 0);
    EXPECT_RC(g_ctx, kvt_req_write(e, r, from, out, to - from), 0);
}

/* A whole request: match and begin on q's first prompt tokens, check every row it is served,
 * compute the rest of q and check it all, finish (inserting when insert), poll. *m gets the
 * match; returns what kvt_req_begin gave. */
struct kvt_req run_req(kvt_engine *e, const struct seq *q, size_t prompt, int insert,
                       struct kvt_match *m)
{
    struct kvt_key key = seq_key(q, prompt);
    struct kvt_match mm;
    struct kvt_req r, got;
    uint64_t t0 = clock_us();

    if (!m)
        m = &mm;
    *m = (struct kvt_match){0};
    if (prompt) /* an empty key matches nothing (kvt_match refuses it) */
        EXPECT_RC(g_ctx, timed(t0, kvt_match(e, &key, NULL, m)), 0);
    REQUIRE(g_ctx, m->device_len % PS == 0 && m->host_len % PS == 0 && m->disk_len % PS == 0);
    REQUIRE(g_ctx, m->device_len + m->host_len + m->disk_len <= prompt / PS * PS);
    t0 = clock_us();
    EXPECT_RC(g_ctx, timed(t0, kvt_req_begin(e, &key, &r)), 0);
    REQUIRE(g_ctx, r.pool_idx >= 0);
    REQUIRE(g_ctx, r.protected_len % PS == 0 && r.protected_len <= prompt / PS * PS);
    REQUIRE(g_ctx, r.protected_len >= m->device_len);
    REQUIRE(g_ctx, r.loaded_len <= r.protected_len && r.disk_len <= r.loaded_len);
    /* Reads of other keys landing between the two calls may bring more (their pages of a
     * shared prefix past what this key's whole store pages held). */
    REQUIRE(g_ctx, r.disk_len % PS == 0 && (g_other_fills || r.disk_len <= m->disk_len));
    got = r;
    verify(e, q, &r, r.protected_len);
    extend(e, q, &r, r.protected_len, q->len);
    verify(e, q, &r, q->len);
    key = seq_key(q, q->len);
    t0 = clock_us();
    EXPECT_RC(g_ctx, timed(t0, kvt_req_cache_finished(e, &r, &key, 0, insert)), 0);
    t0 = clock_us();
    EXPECT_RC(g_ctx, timed(t0, kvt_poll(e, 0, NULL)), 0);
    return got;
}

/* The key a store holds page i of q by: the chained page hash from its namespace's root. */
void page_key(const kvt_engine *e, const struct seq *q, size_t i, uint8_t key[KVT_HASH_LEN])
{
    uint8_t prev[KVT_HASH_LEN];
    struct page_hasher ph;

    REQUIRE(g_ctx, (i + 1) * PS <= q->len);
    EXPECT_RC(g_ctx, page_hasher_init(&ph), 0);
    EXPECT_RC(g_ctx,
              page_hash_root(&ph, e->fingerprint, NS_LEN[q->ns] ? NS_BYTES[q->ns] : NULL,
                             NS_LEN[q->ns], key),
              0);
    for (size_t p = 0; p <= i; p++) {
        memcpy(prev, key, KVT_HASH_LEN);
        EXPECT_RC(g_ctx, page_hash_next(&ph, prev, q->tok + p * PS, PS, key), 0);
    }
    page_hasher_finish(&ph);
}

/* ---- every page the disk index holds, checked against its key ---- */

/* One record of the index: its page hash, its parent's (the namespace's root hash for a first
 * page), its namespace's root hash and its tokens. */
struct rec {
    uint8_t key[DSTORE_KEY_BYTES], parent[DSTORE_KEY_BYTES], ns[DSTORE_NS_BYTES];
    uint32_t tokens[PS * MAX_STORE_PAGES];
};

uint32_t g_store_pages = 1;

static int collect(void *arg, const struct dstore_entry *en)
{
    struct recs *r = arg;

    if (en->status || en->ntokens != PS * g_store_pages) {
        r->bad++;
        return 0;
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 128;
        r->v = realloc(r->v, r->cap * sizeof(*r->v));
        REQUIRE(g_ctx, r->v != NULL);
    }
    struct rec *x = &r->v[r->n++];
    memset(x, 0, sizeof(*x));
    memcpy(x->key, en->key, DSTORE_KEY_BYTES);
    if (en->parent)
        memcpy(x->parent, en->parent, DSTORE_KEY_BYTES);
    if (en->ns)
        memcpy(x->ns, en->ns, DSTORE_NS_BYTES);
    memcpy(x->tokens, en->tokens, PS * g_store_pages * sizeof(uint32_t));
    return 0;
}

static int rec_cmp(const void *a, const void *b)
{
    return memcmp(a, b, DSTORE_KEY_BYTES); /* the key leads struct rec */
}

/* The records of the index, in key order. */
static void collect_all(kvt_engine *e, struct recs *r)
{
    r->n = 0;
    r->bad = 0;
    EXPECT_RC(g_ctx, dstore_iterate(store_disk_dstore(e->store), collect, r), 0);
    if (r->n > 1)
        qsort(r->v, r->n, sizeof(*r->v), rec_cmp);
}

/* A digest of which pages the index holds. */
uint64_t index_digest(const struct recs *r)
{
    uint64_t d = r->n;

    for (size_t i = 0; i < r->n; i++) {
        uint64_t w;
        memcpy(&w, r->v[i].key, 8);
        d += rng_mix(w);
    }
    return d;
}

/* The bytes of page i of q as the host pool holds them (page_first: per layer the K rows of
 * the page, then its V rows). */
void expected_page(const struct seq *q, size_t i, uint8_t *page)
{
    size_t first = i * PS;

    for (uint32_t l = 0; l < LAYERS; l++)
        for (int w = 0; w < 2; w++)
            for (size_t t = 0; t < PS; t++)
                fill_row(q->h[first + t], l, w,
                         page + ((size_t)l * 2 + (size_t)w) * PS * ROW + t * ROW);
}

/* Read every page the index holds straight from the store (on the owner thread, with nothing
 * in flight) and check it against its key: its hash is the chained page hash of its parent and
 * tokens (chained over each of the engine's pages of a store page of g_store_pages), its
 * namespace one of ours, and its bytes the KV of the tokens of its chain of parents in that
 * namespace. */
struct disk_check check_disk(kvt_engine *e, struct recs *r)
{
    enum { PAGE_BYTES = LAYERS * 2 * PS * ROW };
    const uint32_t g = g_store_pages, spt = PS * g; /* a store page's tokens */
    struct disk_check dc = {0};
    static uint8_t got[PAGE_BYTES * MAX_STORE_PAGES], want[PAGE_BYTES * MAX_STORE_PAGES];
    uint8_t root[N_NS][KVT_HASH_LEN], h[KVT_HASH_LEN];
    struct dstore_stats ds;
    struct page_hasher ph;

    dstore_stats(store_disk_dstore(e->store), &ds);
    REQUIRE(g_ctx, g >= 1 && g <= MAX_STORE_PAGES && ds.page_bytes == PAGE_BYTES * g);
    EXPECT_RC(g_ctx, page_hasher_init(&ph), 0);
    for (uint32_t n = 0; n < N_NS; n++)
        EXPECT_RC(
            g_ctx,
            page_hash_root(&ph, e->fingerprint, NS_LEN[n] ? NS_BYTES[n] : NULL, NS_LEN[n], root[n]),
            0);
    collect_all(e, r);
    if (r->bad)
        FAIL(g_ctx, "%" PRIu64 " index records fail their checks", r->bad);
    for (size_t i = 0; i < r->n; i++) {
        const struct rec *x = &r->v[i];
        memcpy(h, x->parent, KVT_HASH_LEN);
        for (uint32_t k = 0; k < g; k++)
            EXPECT_RC(g_ctx, page_hash_next(&ph, h, x->tokens + k * PS, PS, h), 0);
        if (memcmp(h, x->key, KVT_HASH_LEN))
            FAIL(g_ctx, "record %zu: its key is not the hash of its parent and tokens", i);
        if (memcmp(x->ns, root[0], KVT_HASH_LEN) && memcmp(x->ns, root[1], KVT_HASH_LEN))
            FAIL(g_ctx, "record %zu: a namespace of nobody's", i);
    }
    for (size_t i = 0; i < r->n; i++) {
        size_t chain[MAX_TOK / PS], depth = 0, cur = i;
        int orphan = 0;
        for (;;) {
            if (depth == MAX_TOK / spt)
                FAIL(g_ctx, "record %zu: a chain of parents longer than any key", i);
            chain[depth++] = cur;
            if (!memcmp(r->v[cur].parent, r->v[cur].ns, KVT_HASH_LEN))
                break;
            const struct rec *p = bsearch(r->v[cur].parent, r->v, r->n, sizeof(*r->v), rec_cmp);
            if (!p) {
                orphan = 1;
                break;
            }
            cur = (size_t)(p - r->v);
        }
        if (orphan) {
            dc.orphans++;
            continue;
        }
        struct seq q = {.ns = memcmp(r->v[chain[depth - 1]].ns, root[0], KVT_HASH_LEN) ? 1 : 0,
                        .len = depth * spt};
        for (size_t d = 0; d < depth; d++)
            memcpy(q.tok + d * spt, r->v[chain[depth - 1 - d]].tokens, spt * sizeof(uint32_t));
        seq_hash(&q);
        for (uint32_t k = 0; k < g; k++) /* the store page's pages of the engine, in order */
            expected_page(&q, (depth - 1) * g + k, want + k * PAGE_BYTES);
        struct dstore_rpage rp = {.key = r->v[i].key, .buf = got};
        int res = -1;
        EXPECT_RC(g_ctx, dstore_get(store_disk_dstore(e->store), &rp, 1, &res), 0);
        if (res)
            FAIL(g_ctx, "page %zu of %zu in the index (depth %zu, ns %u) reads as %d (%s)", i, r->n,
                 depth, q.ns, res, kvt_strerror(res));
        if (memcmp(got, want, (size_t)PAGE_BYTES * g))
            FAIL(g_ctx, "page %zu of %zu in the index (depth %zu, ns %u) holds the wrong KV", i,
                 r->n, depth, q.ns);
        dc.pages++;
    }
    page_hasher_finish(&ph);
    return dc;
}
