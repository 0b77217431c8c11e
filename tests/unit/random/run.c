#include "random_test.h"

/* ---- the run ---- */

enum {
    OP_INSERT,
    OP_MATCH,
    OP_UNLOCK,
    OP_BAD_REF,
    OP_LOCK_OLD,
    OP_EVICT,
    OP_ALLOC,
    OP_FREE,
    OP_GROUP,
    OP_REQ_BEGIN,
    OP_REQ_EXTEND,
    OP_REQ_UNFINISHED,
    OP_REQ_FINISH,
    OP_MISUSE,
    OP_COUNT
};

static const struct {
    const char *name;
    void (*fn)(struct sim *s);
    uint32_t weight;
} OPS[OP_COUNT] = {
    [OP_INSERT] = {"insert", op_insert, 14},
    [OP_MATCH] = {"match", op_match, 16},
    [OP_UNLOCK] = {"unlock", op_unlock, 7},
    [OP_BAD_REF] = {"bad_ref", op_bad_ref, 3},
    [OP_LOCK_OLD] = {"lock_old", op_lock_old, 2},
    [OP_EVICT] = {"evict", op_evict, 6},
    [OP_ALLOC] = {"alloc", op_alloc, 10},
    [OP_FREE] = {"free", op_free, 10},
    [OP_GROUP] = {"group", op_group, 3},
    [OP_REQ_BEGIN] = {"req_begin", op_req_begin, 7},
    [OP_REQ_EXTEND] = {"req_extend", op_req_extend, 14},
    [OP_REQ_UNFINISHED] = {"req_unfinished", op_req_unfinished, 4},
    [OP_REQ_FINISH] = {"req_finish", op_req_finish, 5},
    [OP_MISUSE] = {"misuse", op_misuse, 2},
};

static void one_step(struct sim *s)
{
    static uint32_t total;
    uint32_t r;

    if (!total)
        for (int i = 0; i < OP_COUNT; i++)
            total += OPS[i].weight;
    r = below(s, total);
    for (int i = 0; i < OP_COUNT; i++) {
        if (r < OPS[i].weight) {
            s->op = OPS[i].name;
            OPS[i].fn(s);
            return;
        }
        r -= OPS[i].weight;
    }
}

/* Hand everything back; then the device must be entirely free. */
static void drain(struct sim *s)
{
    s->op = "drain";
    if (s->group_open) {
        EXPECT_RC(s, kvt_free_group_end(s->e), 0);
        s->group_open = 0;
        for (uint32_t p = 1; p <= s->npages; p++)
            if (s->pg[p].state == M_PENDING)
                s->pg[p].state = M_FREE;
    }
    while (s->nlocks)
        op_unlock(s);
    while (s->nheld) {
        free_slots(s, s->held[0].slots, s->held[0].n);
        held_compact(s);
    }
    do_evict(s, SIZE_MAX);
    check_all(s);
    for (size_t i = 0; i < N_REQ; i++) {
        struct mreq *q = &s->req[i];
        if (!q->active)
            continue;
        req_finish(s, q, chance(s, 50), 0);
        check_all(s);
    }
    do_evict(s, SIZE_MAX);
    check_all(s);
    REQUIRE(s, kvt_available(s->e) == (size_t)s->npages * s->ps);
    REQUIRE(s, stats(s).cached_tokens == 0 && stats(s).nodes == 0);
}

/* What the run exercised, so a change that stops it reaching eviction or -ENOMEM shows. */
static void print_summary(const struct sim *s)
{
    printf("test_random: %s: inserted %" PRIu64 " evicted %" PRIu64 " hit %" PRIu64 "/%" PRIu64
           " tokens, most cached %" PRIu64 "/%u pages in %" PRIu64 " nodes, %" PRIu64
           " requests, %" PRIu64 " -ENOMEM, %" PRIu64 " refused calls\n",
           s->cfg->name, s->inserted * s->ps, s->evicted * s->ps, s->m_hit, s->m_query,
           s->max_cached, s->npages, s->max_nodes, s->finished, s->enomem, s->refused);
}

static uint64_t base_seed(void)
{
    const char *env = getenv("KVT_SEED");

    return env && *env ? strtoull(env, NULL, 0) : DEFAULT_SEED;
}

void run(const struct cfg *cfg)
{
    struct kvt_options o;
    struct sim *s = calloc(1, sizeof(*s));

    assert_non_null(s);
    s->cfg = cfg;
    s->seed = base_seed();
    /* Each configuration draws its own sequence from the one seed. */
    s->rng = s->seed;
    for (const char *c = cfg->name; *c; c++)
        s->rng = (s->rng ^ (uint8_t)*c) * 0x100000001B3ull;
    s->ps = cfg->ps;
    s->npages = cfg->device_tokens / cfg->ps;
    printf("test_random: %s: seed=%" PRIu64 " (KVT_SEED reruns it), %u ops\n", cfg->name, s->seed,
           cfg->ops);
    fflush(stdout);

    fixture_engine_options(&o, 1, 4);
    o.page_size = cfg->ps;
    o.device_tokens = cfg->device_tokens;
    o.max_requests = N_REQ;
    o.max_context = MAX_CONTEXT;
    o.evict_policy = cfg->policy;
    o.hash_pages = cfg->hash_pages;
    assert_int_equal(kvt_open(&o, &s->e), 0);

    s->pg = calloc(s->npages + 1, sizeof(*s->pg));
    s->mark = calloc(s->npages + 1, sizeof(*s->mark));
    s->gone = calloc(s->npages + 1, sizeof(*s->gone));
    s->scratch = calloc(s->npages + 1, sizeof(*s->scratch));
    assert_true(s->pg && s->mark && s->gone && s->scratch);
    make_bases(s);
    check_all(s);
    for (s->step = 0; s->step < cfg->ops; s->step++) {
        one_step(s);
        check_all(s);
    }
    if (!cfg->busy_close) {
        drain(s);
        print_summary(s);
    }
    kvt_close(s->e); /* busy_close: with locks, requests, held slots, maybe a free group */
    free(s->pg);
    free(s->mark);
    free(s->gone);
    free(s->scratch);
    free(s);
}

static void test_random_page1(void **state)
{
    static const struct cfg cfgs[] = {
        {"ps1-lru", 1, 256, KVT_EVICT_LRU, 0, 100000, 0},
        {"ps1-lfu-hashed", 1, 256, KVT_EVICT_LFU, 1, 100000, 0},
        {"ps1-priority", 1, 256, KVT_EVICT_PRIORITY, 0, 100000, 0},
        {"ps1-mru", 1, 256, KVT_EVICT_MRU, 0, 30000, 0}, /* order unchecked: fewer ops */
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

static void test_random_page4(void **state)
{
    static const struct cfg cfgs[] = {
        {"ps4-lru", 4, 1024, KVT_EVICT_LRU, 0, 100000, 0},
        {"ps4-filo-hashed", 4, 1024, KVT_EVICT_FILO, 1, 100000, 0},
        {"ps4-lfu", 4, 1024, KVT_EVICT_LFU, 0, 100000, 0},
        {"ps4-fifo", 4, 1024, KVT_EVICT_FIFO, 0, 30000, 0}, /* order unchecked: fewer ops */
        {"ps4-busy-close", 4, 1024, KVT_EVICT_LRU, 1, 3000, 1},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++)
        run(&cfgs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_page1),
        cmocka_unit_test(test_random_page4),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
