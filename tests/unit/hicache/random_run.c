#include "hicache_test.h"

/* ---- the random run ---- */

struct rreq {
    int active;
    struct kvt_req r;
    struct seq q; /* every token the request will hold */
    size_t filled;
    int32_t row[MAX_TOK]; /* mirror of its req_to_token row, [0, filled) */
    int served;           /* its prefix was read once load_op landed it (its first forward) */
};

struct rsim {
    kvt_engine *e;
    const struct rcfg *cfg;
    uint32_t ps;
    uint64_t seed, rng, step;
    const char *op;
    uint32_t base[N_BASE][MAX_TOK];
    struct seq last; /* the last request begun, and its prompt length */
    size_t last_prompt;
    struct rreq req[N_REQ];
    /* what the run exercised */
    uint64_t begins, loaded_begins, waited_other, enomem, full, unfinished, finished;
    uint64_t matches, match_checked, rows_checked, polls, applied, evicts, tail_loaded;
    uint64_t prefetched; /* tokens kvt_prefetch started reading */
    uint64_t decodes, dropped;
};

#define HARNESS_RUN(s)                                                                             \
    (&(struct harness_run){.prog = "test_hicache",                                                 \
                           .config = (s)->cfg->name,                                               \
                           .seed = (s)->seed,                                                      \
                           .step = (s)->step,                                                      \
                           .op = (s)->op})

static uint64_t rnd(struct rsim *s)
{
    return rng_mix(s->rng += 0x632BE59BD9B4E019ull);
}

static uint32_t below(struct rsim *s, uint32_t n)
{
    return (uint32_t)(rnd(s) % n);
}

static int chance(struct rsim *s, uint32_t pct)
{
    return below(s, 100) < pct;
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

static struct kvt_stats rstats(struct rsim *s)
{
    struct kvt_stats st = {.size = sizeof(st)};

    EXPECT_RC(s, kvt_stats(s->e, &st), 0);
    return st;
}

/* Bases branch off each other, so keys share prefixes at every depth. */
static void make_bases(struct rsim *s)
{
    for (uint32_t b = 0; b < N_BASE; b++) {
        uint32_t from = b ? below(s, b) : 0, cut = b ? below(s, MAX_TOK) : 0;
        for (uint32_t i = 0; i < MAX_TOK; i++)
            s->base[b][i] = i < cut ? s->base[from][i] : below(s, ALPHABET);
    }
}

/* Invariants after every step: the engine's own check, and the pages add up: every device
 * slot is free, cached, or owned by a request past its protected prefix (whole pages), and
 * every host page is free or holds a copy. */
static void check_all(struct rsim *s)
{
    char why[256] = "";
    int rc = engine_check(s->e, why, sizeof(why));

    if (rc)
        FAIL(s, "engine_check: %d %s", rc, why);
    struct kvt_stats st = rstats(s);
    uint64_t owned = 0, ps = s->ps;
    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active)
            owned += (s->req[i].filled + ps - 1) / ps * ps - s->req[i].r.protected_len;
    if (st.device_free_tokens + st.cached_tokens + owned != st.device_tokens)
        FAIL(s, "device: %" PRIu64 " free + %" PRIu64 " cached + %" PRIu64 " owned != %" PRIu64,
             st.device_free_tokens, st.cached_tokens, owned, st.device_tokens);
    if (st.host_free_tokens + st.host_cached_tokens != st.host_tokens)
        FAIL(s, "host: %" PRIu64 " free + %" PRIu64 " cached != %" PRIu64, st.host_free_tokens,
             st.host_cached_tokens, st.host_tokens);
}

/* Check rows [0, n) of a request (its row mirror), waiting for each layer of op first. */
static void verify_rows(struct rsim *s, const struct seq *q, const int32_t *slots, size_t n,
                        uint64_t op)
{
    for (uint32_t l = 0; l < LAYERS; l++) {
        EXPECT_RC(s, kvt_load_wait_layer(s->e, op, l, NULL), 0);
        long bad = check_layer(s->e, q, 0, n, slots, l);
        if (bad != -1)
            FAIL(s,
                 "layer %u: token %ld of %zu (slot %d) has the wrong KV (op %" PRIu64
                 ", load done %" PRIu64 ")",
                 l, bad, n, bad >= 0 ? slots[bad] : -1, op,
                 xfer_done(host_tier_xfer(s->e->below), XFER_LOAD));
    }
    s->rows_checked += n;
}

static struct rreq *pick(struct rsim *s, int (*ok)(const struct rsim *, const struct rreq *))
{
    size_t n = 0, idx[N_REQ];

    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active && (!ok || ok(s, &s->req[i])))
            idx[n++] = i;
    return n ? &s->req[idx[below(s, (uint32_t)n)]] : NULL;
}

static int can_extend(const struct rsim *s, const struct rreq *q)
{
    (void)s;
    return q->filled < q->q.len;
}

static int can_unfinish(const struct rsim *s, const struct rreq *q)
{
    return q->filled / s->ps * s->ps > q->r.protected_len;
}

/* A key: a prefix of a base (now and then with a token changed), then new tokens. */
static void gen_seq(struct rsim *s, struct seq *q, size_t *prompt)
{
    const uint32_t *b = s->base[below(s, N_BASE)];

    q->ns = chance(s, 75) ? 0 : 1;
    *prompt = chance(s, 3) ? 0 : 1 + below(s, MAX_TOK - 4);
    q->len = *prompt + below(s, (uint32_t)min_sz(16, MAX_TOK - *prompt) + 1);
    if (q->len == 0)
        q->len = 1;
    memcpy(q->tok, b, *prompt * sizeof(uint32_t));
    for (size_t i = *prompt; i < q->len; i++)
        q->tok[i] = chance(s, s->cfg->reuse) ? b[i] : below(s, ALPHABET);
    if (*prompt && chance(s, (100 - s->cfg->reuse) * 2 / 5))
        q->tok[below(s, (uint32_t)*prompt)] = below(s, ALPHABET);
    seq_hash(q);
}

/* A forward over the request's rows: wait for its load, layer by layer, and read them. */
static void serve(struct rsim *s, struct rreq *q)
{
    verify_rows(s, &q->q, q->row, q->filled, q->r.load_op);
    q->served = 1;
}

static void do_begin(struct rsim *s)
{
    struct rreq *q = NULL;
    size_t prompt;

    for (size_t i = 0; i < N_REQ && !q; i++)
        if (!s->req[i].active)
            q = &s->req[i];
    if (!q) {
        /* Every slot taken: kvt_req_begin refuses, changing nothing. */
        struct seq t;
        struct kvt_req r;
        s->op = "begin-full";
        gen_seq(s, &t, &prompt);
        struct kvt_key key = seq_key(&t, prompt);
        REQUIRE(s, kvt_req_available(s->e) == 0);
        EXPECT_RC(s, kvt_req_begin(s->e, &key, &r), -ENOMEM);
        s->full++;
        return;
    }
    s->op = "begin";
    if (s->last.len && chance(s, 25)) {
        /* The same prompt again (parallel sampling, a retry): it meets the prefix the last
         * request may still be loading. */
        q->q = s->last;
        prompt = s->last_prompt;
        for (size_t i = prompt; i < q->q.len; i++)
            q->q.tok[i] = below(s, ALPHABET);
        seq_hash(&q->q);
    } else {
        gen_seq(s, &q->q, &prompt);
    }
    s->last = q->q;
    s->last_prompt = prompt;
    struct kvt_key key = seq_key(&q->q, prompt);
    struct kvt_req *r = &q->r;
    EXPECT_RC(s, kvt_req_begin(s->e, &key, r), 0);
    uint32_t ps = s->ps;
    REQUIRE(s, r->pool_idx >= 0);
    REQUIRE(s, r->protected_len % ps == 0 && r->protected_len <= prompt / ps * ps);
    REQUIRE(s, r->loaded_len % ps == 0 && r->loaded_len <= r->protected_len);
    REQUIRE(s, r->loaded_len == 0 || r->loaded_len >= s->cfg->load_back_min);
    REQUIRE(s, r->loaded_len == 0 || r->load_op != 0);
    q->active = 1;
    q->filled = r->protected_len;
    EXPECT_RC(s, kvt_req_read(s->e, r, 0, q->filled, q->row), 0);
    s->begins++;
    s->loaded_begins += r->loaded_len != 0;
    s->waited_other += r->loaded_len == 0 && r->load_op != 0;
    /* The forward: wait for each layer, then read the prefix it is served. Half the time it
     * comes later (at the request's next step), so loads stay in flight across steps and
     * other requests meet prefixes still being filled. */
    q->served = 0;
    if (chance(s, 50))
        serve(s, q);
}

static void finish(struct rsim *s, struct rreq *q, int insert)
{
    struct kvt_key key = seq_key(&q->q, q->filled);

    /* A request dropped before its first forward (a client gone) is let go with its load
     * still in flight; otherwise its rows are read once more. */
    if (q->served || insert || !chance(s, 30))
        serve(s, q);
    else
        s->dropped++;
    EXPECT_RC(s, kvt_req_cache_finished(s->e, &q->r, &key, (int32_t)below(s, 3), insert), 0);
    REQUIRE(s, q->r.pool_idx == -1);
    q->active = 0;
    s->finished++;
}

static void do_extend(struct rsim *s, struct rreq *q)
{
    int32_t out[MAX_TOK];
    uint32_t pl = (uint32_t)q->filled;
    uint32_t sl = pl + 1 + below(s, (uint32_t)min_sz(q->q.len - q->filled, 16));
    int32_t last = pl ? q->row[pl - 1] : -1;
    size_t n = sl - pl;

    s->op = "extend";
    if (!q->served)
        serve(s, q);
    struct kvt_stats before = rstats(s);
    size_t need = (sl + s->ps - 1) / s->ps - (pl + s->ps - 1) / s->ps;
    int rc;
    if (n == 1 && pl && chance(s, 50)) {
        s->op = "decode"; /* one token: the decode path, which evicts by itself too */
        rc = kvt_alloc_decode(s->e, 1, &sl, &last, out);
        s->decodes += rc == 0;
    } else {
        rc = kvt_alloc_extend(s->e, 1, &pl, &sl, &last, out, n);
    }
    if (rc == -ENOMEM) {
        /* Allowed only when eviction could not cover the need, and then nothing went. */
        struct kvt_stats st = rstats(s);
        if (need * s->ps <= before.device_free_tokens + before.evictable_tokens)
            FAIL(s,
                 "allocating %u -> %u: -ENOMEM with %" PRIu64 " tokens evictable, %" PRIu64
                 " free, %" PRIu64 " ops in flight",
                 pl, sl, before.evictable_tokens, before.device_free_tokens, st.ops_in_flight);
        REQUIRE(s, st.evicted_tokens == before.evicted_tokens &&
                       st.cached_tokens == before.cached_tokens);
        s->enomem++;
        s->op = "extend-abort";
        finish(s, q, 0);
        return;
    }
    EXPECT_RC(s, rc, 0);
    if (pl % s->ps)
        REQUIRE(s, out[0] == last + 1);
    EXPECT_RC(s, compute_rows(s->e, &q->q, pl, n, out), 0);
    EXPECT_RC(s, kvt_req_write(s->e, &q->r, pl, out, n), 0);
    memcpy(q->row + pl, out, n * sizeof(int32_t));
    q->filled = sl;
}

static void do_unfinished(struct rsim *s, struct rreq *q)
{
    struct kvt_key key = seq_key(&q->q, q->filled);

    s->op = "unfinished";
    if (!q->served && chance(s, 50))
        serve(s, q);
    EXPECT_RC(s, kvt_req_cache_unfinished(s->e, &q->r, &key), 0);
    REQUIRE(s, q->r.protected_len == q->filled / s->ps * s->ps);
    EXPECT_RC(s, kvt_req_read(s->e, &q->r, 0, q->filled, q->row), 0);
    s->unfinished++;
    /* The row may now point at pages another request's load is still filling: the
     * request's load_op names it, and serve waits for it per layer. */
    serve(s, q);
}

static void do_match(struct rsim *s)
{
    struct seq t;
    size_t prompt;
    struct kvt_match m;
    int32_t slots[MAX_TOK];

    s->op = "match";
    gen_seq(s, &t, &prompt);
    if (t.len == 0)
        return;
    struct kvt_key key = seq_key(&t, t.len);
    EXPECT_RC(s, kvt_match(s->e, &key, slots, &m), 0);
    REQUIRE(s, m.device_len % s->ps == 0 && m.host_len % s->ps == 0);
    REQUIRE(s, m.device_len + m.host_len + m.disk_len <= t.len / s->ps * s->ps);
    REQUIRE(s, m.disk_len % s->ps == 0 && (s->cfg->disk || m.disk_len == 0));
    REQUIRE(s, m.last_node != 0);
    s->matches++;
    /* A match locks nothing: its pages are right only while no load may still fill them. */
    uint64_t issued = host_tier_last_op(s->e->below, XFER_LOAD);
    if (xfer_done(host_tier_xfer(s->e->below), XFER_LOAD) >= issued) {
        verify_rows(s, &t, slots, m.device_len, 0);
        s->match_checked++;
    }
}

/* Start reading a key's disk part; a later begin of it finds it on the host or waits. */
static void do_prefetch(struct rsim *s)
{
    struct seq t;
    size_t prompt, tokens = 1;

    s->op = "prefetch";
    gen_seq(s, &t, &prompt);
    struct kvt_key key = seq_key(&t, t.len);
    EXPECT_RC(s, kvt_prefetch(s->e, &key, &tokens), 0);
    REQUIRE(s, tokens % s->ps == 0 && (s->cfg->disk || tokens == 0));
    s->prefetched += tokens;
}

static void one_step(struct rsim *s)
{
    uint32_t r = below(s, 100);
    struct rreq *q;

    s->op = NULL;
    if (r < 22) {
        do_begin(s);
    } else if (r < 52) {
        if ((q = pick(s, can_extend)))
            do_extend(s, q);
        else
            do_begin(s);
    } else if (r < 64) {
        if ((q = pick(s, NULL))) {
            s->op = "finish";
            finish(s, q, chance(s, 85));
        } else {
            do_begin(s);
        }
    } else if (r < 68) {
        if ((q = pick(s, can_unfinish)))
            do_unfinished(s, q);
    } else if (r < 78) {
        size_t applied = 0;
        s->op = "poll";
        EXPECT_RC(s, kvt_poll(s->e, below(s, 4), &applied), 0);
        s->polls++;
        s->applied += applied;
    } else if (r < 83) {
        size_t want = chance(s, 10) ? SIZE_MAX / 2 : 1 + below(s, 3 * s->ps), got = 0;
        s->op = "evict";
        EXPECT_RC(s, kvt_evict(s->e, want, &got), 0);
        REQUIRE(s, got % s->ps == 0);
        s->evicts++;
    } else if (r < 91) {
        do_match(s);
    } else if (r < 93) {
        do_prefetch(s);
    } else if ((q = pick(s, NULL))) {
        s->op = "verify";
        serve(s, q);
    }
}

static uint64_t base_seed(void)
{
    const char *env = getenv("KVT_SEED");

    return env && *env ? strtoull(env, NULL, 0) : DEFAULT_SEED;
}

/* Finish everything, let every transfer land, and check that nothing leaked; then serve
 * every base key again from an empty device, all of it from the host. */
static void drain_and_check(struct rsim *s)
{
    s->op = "drain";
    for (size_t i = 0; i < N_REQ; i++)
        if (s->req[i].active) {
            finish(s, &s->req[i], chance(s, 50));
            check_all(s);
        }
    EXPECT_RC(s, drain(s->e), 0);
    check_all(s);
    struct kvt_stats st = rstats(s);
    REQUIRE(s, st.ops_in_flight == 0);
    REQUIRE(s, st.device_free_tokens + st.cached_tokens == st.device_tokens);
    REQUIRE(s, st.host_free_tokens + st.host_cached_tokens == st.host_tokens);
    REQUIRE(s, st.protected_tokens == 0 && st.req_slots_free == N_REQ);

    /* Every cached device page holds the KV of its key. */
    s->op = "final-match";
    for (uint32_t b = 0; b < N_BASE; b++)
        for (uint32_t ns = 0; ns < N_NS; ns++) {
            struct seq t = {.ns = ns, .len = MAX_TOK};
            struct kvt_match m;
            int32_t slots[MAX_TOK];
            memcpy(t.tok, s->base[b], sizeof(t.tok));
            seq_hash(&t);
            struct kvt_key key = seq_key(&t, MAX_TOK);
            EXPECT_RC(s, kvt_match(s->e, &key, slots, &m), 0);
            verify_rows(s, &t, slots, m.device_len, 0);
        }

    /* Empty the device; every base key the host still holds is loaded back and checked. */
    s->op = "final-load";
    EXPECT_RC(s, drain(s->e), 0);
    size_t ev = 0;
    EXPECT_RC(s, kvt_evict(s->e, SIZE_MAX / 2, &ev), 0);
    st = rstats(s);
    REQUIRE(s, st.cached_tokens == 0 && st.device_free_tokens == st.device_tokens);
    check_all(s);
    for (uint32_t b = 0; b < N_BASE; b++)
        for (uint32_t ns = 0; ns < N_NS; ns++) {
            struct rreq *q = &s->req[0];
            q->q = (struct seq){.ns = ns, .len = MAX_TOK};
            memcpy(q->q.tok, s->base[b], sizeof(q->q.tok));
            seq_hash(&q->q);
            struct kvt_key key = seq_key(&q->q, MAX_TOK);
            EXPECT_RC(s, kvt_req_begin(s->e, &key, &q->r), 0);
            q->active = 1;
            q->filled = q->r.protected_len;
            EXPECT_RC(s, kvt_req_read(s->e, &q->r, 0, q->filled, q->row), 0);
            s->tail_loaded += q->r.loaded_len;
            verify_rows(s, &q->q, q->row, q->filled, q->r.load_op);
            check_all(s);
            finish(s, q, 1);
            check_all(s);
        }
    EXPECT_RC(s, drain(s->e), 0);
    check_all(s);
    st = rstats(s);
    REQUIRE(s, st.device_free_tokens + st.cached_tokens == st.device_tokens);
    REQUIRE(s, st.host_free_tokens + st.host_cached_tokens == st.host_tokens);
}

static void print_summary(struct rsim *s)
{
    struct kvt_stats st = rstats(s);

    printf("test_hicache: %s: %" PRIu64 " requests (%" PRIu64 " loaded back, %" PRIu64
           " waited on another's load, %" PRIu64 " -ENOMEM, %" PRIu64 " unfinished, %" PRIu64
           " dropped unserved, %" PRIu64 " decodes), loaded %" PRIu64 " backed up %" PRIu64
           " skipped %" PRIu64 " host-evicted %" PRIu64 " host-hit %" PRIu64 " evicted %" PRIu64
           " tokens, %" PRIu64 " rows checked, %" PRIu64 "/%" PRIu64 " matches checked\n",
           s->cfg->name, s->finished, s->loaded_begins, s->waited_other, s->enomem, s->unfinished,
           s->dropped, s->decodes, st.loaded_tokens, st.backed_up_tokens, st.backup_skipped_tokens,
           st.host_evicted_tokens, st.host_hit_tokens, st.evicted_tokens, s->rows_checked,
           s->match_checked, s->matches);
    if (s->cfg->disk)
        printf("test_hicache: %s: disk: written %" PRIu64 " hit %" PRIu64 " read %" PRIu64
               " prefetched %" PRIu64 " tokens, %" PRIu64 " held now, %" PRIu64 " errors\n",
               s->cfg->name, st.disk_written_tokens, st.disk_hit_tokens, st.disk_read_tokens,
               s->prefetched, st.disk_cached_tokens, st.disk_errors);
    fflush(stdout);
}

void run(const struct rcfg *cfg)
{
    struct kvt_options o;
    struct rsim *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    s->cfg = cfg;
    s->ps = cfg->ps;
    s->seed = base_seed();
    s->rng = s->seed;
    for (const char *c = cfg->name; *c; c++)
        s->rng = (s->rng ^ (uint8_t)*c) * 0x100000001B3ull;
    printf("test_hicache: %s: seed=%" PRIu64 " (KVT_SEED reruns it), %u ops\n", cfg->name, s->seed,
           cfg->ops);
    fflush(stdout);

    host_options(&o, cfg->ps, cfg->device_tokens, cfg->host_tokens);
    char dir[64] = "";
    if (cfg->disk) {
        make_data_dir(dir, sizeof(dir));
        o.disk_dir = dir;
        o.disk_write_policy = cfg->disk_write_policy;
        /* 512 slots: the disk tier evicts too */
        o.disk_bytes = 512 * fixture_disk_slot(PAGE_BYTES(cfg->ps), cfg->ps);
        o.prefetch_policy = cfg->prefetch_policy;
        o.store_page_tokens = cfg->ps; /* a store page to a page, as the slots above */
    }
    o.host_layout = cfg->layout;
    o.write_policy = cfg->write_policy;
    o.write_threshold = cfg->write_threshold;
    o.load_back_min = cfg->load_back_min;
    o.evict_policy = cfg->evict_policy;
    EXPECT_RC(s, kvt_open(&o, &s->e), 0);
    struct xfer_config xc = {.max_delay_us = cfg->max_delay_us, .seed = rnd(s)};
    EXPECT_RC(s, set_xfer(s->e, &xc), 0);
    make_bases(s);
    check_all(s);
    for (s->step = 0; s->step < cfg->ops; s->step++) {
        one_step(s);
        check_all(s);
    }
    drain_and_check(s);
    print_summary(s);

    /* The run must have exercised the host tier, not just the device. */
    struct kvt_stats st = rstats(s);
    s->op = "coverage";
    REQUIRE(s, st.loaded_tokens > 0 && s->loaded_begins > 0);
    REQUIRE(s, st.backed_up_tokens > 0);
    REQUIRE(s, st.host_hit_tokens > 0);
    REQUIRE(s, st.host_evicted_tokens > 0 || !s->cfg->host_pressure);
    REQUIRE(s, st.evicted_tokens > 0);
    REQUIRE(s, s->unfinished > 0 && s->match_checked > 0);
    /* Not required: how often a begin meets another's load still in flight depends on
     * timing (a sanitizer's slowdown); test_layer_wait checks that case deterministically. */
    REQUIRE(s, s->enomem > 0 || !s->cfg->pressure);
    REQUIRE(s, s->tail_loaded > 0);
    REQUIRE(s, !cfg->disk || (st.disk_written_tokens > 0 && st.disk_read_tokens > 0 &&
                              st.disk_hit_tokens > 0 && s->prefetched > 0 && st.disk_errors == 0));
    kvt_close(s->e);
    if (cfg->disk)
        fixture_remove_tree(dir);
    free(s);
}

/* Write-through fills the host, so the host pool is what runs out; selective backs up only
 * what is hit again, so its keys repeat more and its host pool is smaller. */
void test_random_page1(void **state)
{
    static const struct rcfg cfgs[] = {
        {.name = "ps1-wt-pagefirst",
         .ps = 1,
         .device_tokens = 96,
         .host_tokens = 384,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .max_delay_us = 300,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps1-sel-layerfirst",
         .ps = 1,
         .device_tokens = 128,
         .host_tokens = 144,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_THROUGH_SELECTIVE,
         .write_threshold = 1,
         .max_delay_us = 300,
         .reuse = 90,
         .ops = 25000},
        {.name = "ps1-wb-pagefirst",
         .ps = 1,
         .device_tokens = 96,
         .host_tokens = 192,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_BACK,
         .max_delay_us = 300,
         .reuse = 60,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

void test_random_page4(void **state)
{
    static const struct rcfg cfgs[] = {
        {.name = "ps4-wt-layerfirst",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 512,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .max_delay_us = 1000,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps4-sel-pagefirst",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 160,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH_SELECTIVE,
         .write_threshold = 2,
         .max_delay_us = 500,
         .reuse = 90,
         .ops = 25000,
         .host_pressure = 1},
        {.name = "ps4-wt-min8-lfu",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 512,
         .layout = KVT_HOST_PAGE_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .load_back_min = 8,
         .evict_policy = KVT_EVICT_LFU,
         .max_delay_us = 100,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps4-wb-layerfirst-mru",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 256,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_BACK,
         .evict_policy = KVT_EVICT_MRU,
         .max_delay_us = 500,
         .reuse = 60,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
        {.name = "ps4-wt-nodelay",
         .ps = 4,
         .device_tokens = 128,
         .host_tokens = 384,
         .layout = KVT_HOST_LAYER_FIRST,
         .write_policy = KVT_WRITE_THROUGH,
         .reuse = 50,
         .ops = 25000,
         .host_pressure = 1,
         .pressure = 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}
