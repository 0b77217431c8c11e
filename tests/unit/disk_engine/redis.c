#include "disk_engine_test.h"

#include <stdbool.h>

#include "redis_server.h"
#include "store/redis/redis.h"

/* ---- the engine over the Redis store, on a redis-server of the test's own ---- */

#define R_TIMEOUT_MS 200 /* the store's connect, read and write timeouts */
#define R_EXISTS_MS 100  /* the most a leading run waits */
#define R_BACKOFF_MS 100 /* the longest wait between reconnects */
/* The longest one engine call may block on a stalled server: the exchange already under way
 * on the store's thread (a connect's handshake), then the call's own, each bounded by the
 * read timeout, a leading run's wait, and slack for a sanitizer's slowness. */
#define R_CALL_BOUND_MS (2 * R_TIMEOUT_MS + R_EXISTS_MS + 250)
#define R_CANDIDATES 256 /* keys of a family tried for one the store holds past the host */
#define R_SHARED_REQS 80
#define R_SHARED_HOST_TOKENS (4 * FAULT_HOST_TOKENS)
#define R_STALL_MS 2500 /* how long requests run against a stopped server */
#define R_BACK_MS 5000  /* the most the store takes to serve again once the server is back */
#define R_PAGE_BYTES (LAYERS * 2 * PS * ROW)
#define CHAOS_DAMAGE 300 /* values another client overwrites while requests run */
#define CHAOS_FLUSHES 5
#define CHAOS_MS 4000

/* One server per test (setup starts it, teardown kills it, a failure included). */
struct remote {
    struct redis_server srv;
    uint16_t port;
    uint8_t fp[STORE_REDIS_FP_BYTES]; /* the engines' fingerprint: keys and values carry it */
};

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void remote_opts(struct kvt_options *o, uint32_t policy, uint64_t host_tokens)
{
    disk_opts(o, NULL, host_tokens, 0);
    o->disk_write_policy = policy;
}

/* The fingerprint an engine of these options has: the store must carry the same. */
static void engine_fingerprint(uint8_t fp[STORE_REDIS_FP_BYTES])
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    remote_opts(&o, KVT_DISK_WRITE_THROUGH, FAULT_HOST_TOKENS);
    EXPECT_RC(g_ctx, kvt_open(&o, &e), 0);
    kvt_fingerprint(e, fp);
    kvt_close(e);
}

int redis_setup(void **state)
{
    struct remote *rm;

    *state = NULL;
    if (!redis_server_installed())
        return 0; /* the test says it is skipped */
    if (!(rm = calloc(1, sizeof(*rm))) || redis_server_start(&rm->srv, 0)) {
        free(rm);
        return -1;
    }
    rm->port = rm->srv.port;
    engine_fingerprint(rm->fp);
    *state = rm;
    return 0;
}

int redis_teardown(void **state)
{
    struct remote *rm = *state;

    if (rm) {
        redis_server_stop(&rm->srv); /* SIGKILL: a stopped server too */
        free(rm);
    }
    return 0;
}

static struct remote *remote_or_skip(void **state, const char *test)
{
    if (!*state) {
        printf("test_disk_engine: %s SKIPPED: redis-server is not installed\n", test);
        skip();
    }
    return *state;
}

/* An engine over a Redis store on rm's server. host_tokens 0: FAULT_HOST_TOKENS, a host small
 * enough to evict. short_timeouts: R_TIMEOUT_MS and the like, for a server made to fail;
 * else the store's defaults (seconds), so that a loaded machine's slow reply is no error. */
static kvt_engine *open_on_redis(const struct remote *rm, uint32_t policy, uint64_t host_tokens,
                                 bool short_timeouts)
{
    struct kvt_options o;
    struct kvt_store *s = NULL;
    kvt_engine *e = NULL;

    remote_opts(&o, policy, host_tokens ? host_tokens : FAULT_HOST_TOKENS);
    struct store_redis_options ro = {
        .port = rm->port,
        .page_bytes = (uint32_t)(kvt_cell_bytes(&o.geometry) * PS),
        .page_tokens = PS,
    };
    if (short_timeouts) {
        ro.connect_timeout_ms = ro.read_timeout_ms = ro.write_timeout_ms = R_TIMEOUT_MS;
        ro.exists_timeout_ms = R_EXISTS_MS;
        ro.backoff_max_ms = R_BACKOFF_MS;
    }
    memcpy(ro.fingerprint, rm->fp, sizeof(ro.fingerprint));
    REQUIRE(g_ctx, ro.page_bytes == R_PAGE_BYTES);
    EXPECT_RC(g_ctx, store_redis_open(&ro, &s), 0);
    EXPECT_RC(g_ctx, engine_open(&o, s, &e), 0);
    check(e);
    return e;
}

static struct store_redis_counters counters(const kvt_engine *e)
{
    struct store_redis_counters c;

    EXPECT_RC(g_ctx, store_redis_counters(e->store, &c), 0);
    return c;
}

static long long server_cmd(const struct remote *rm, int argc, const char **argv,
                            const size_t *lens)
{
    return redis_server_cmd(&rm->srv, argc, argv, lens);
}

static void flushall(const struct remote *rm)
{
    const char *argv[] = {"FLUSHALL"};

    REQUIRE(g_ctx, server_cmd(rm, 1, argv, NULL) == 0);
}

static long long dbsize(const struct remote *rm)
{
    const char *argv[] = {"DBSIZE"};

    return server_cmd(rm, 1, argv, NULL);
}

/* A number from the server's INFO section (used_memory, evicted_keys); -1 when absent. */
static long long info_field(const struct remote *rm, const char *section, const char *field)
{
    const char *argv[] = {"INFO", section};
    char info[16 << 10];
    long long v = -1;
    char *at;

    if (!redis_server_cmd_str(&rm->srv, 2, argv, info, sizeof(info)) &&
        (at = strstr(info, field)) && at[strlen(field)] == ':')
        v = strtoll(at + strlen(field) + 1, NULL, 10);
    return v;
}

/* ---- values that are not the page their key names ---- */

enum bad_kind { BAD_GARBAGE, BAD_OTHER_FP, BAD_OTHER_KEY, BAD_TRUNCATED, BAD_FLIPPED, BAD_KINDS };

static const char *const BAD_NAME[BAD_KINDS] = {"garbage", "another fingerprint's page",
                                                "another key's page", "a truncated page",
                                                "a page with a flipped bit"};

#define BAD_VALUE_BYTES (STORE_REDIS_HEAD_BYTES + R_PAGE_BYTES)

/* A value of kind k for key into v, its length returned. page is the key's right bytes: all
 * but garbage carry them, so only the value's identity or integrity is wrong. */
static size_t bad_value(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t *key,
                        const uint8_t *page, enum bad_kind k, uint8_t v[BAD_VALUE_BYTES])
{
    static const char garbage[] = "not a page of anybody's";
    uint8_t other_fp[STORE_REDIS_FP_BYTES], other_key[STORE_KEY_BYTES];

    memcpy(other_fp, fp, sizeof(other_fp));
    other_fp[0] ^= 0x80;
    memcpy(other_key, key, sizeof(other_key));
    other_key[STORE_KEY_BYTES - 1] ^= 1;
    switch (k) {
    case BAD_GARBAGE:
        memcpy(v, garbage, sizeof(garbage));
        return sizeof(garbage);
    case BAD_OTHER_FP:
        store_redis_value(other_fp, key, page, R_PAGE_BYTES, v);
        return BAD_VALUE_BYTES;
    case BAD_OTHER_KEY:
        store_redis_value(fp, other_key, page, R_PAGE_BYTES, v);
        return BAD_VALUE_BYTES;
    case BAD_TRUNCATED:
        store_redis_value(fp, key, page, R_PAGE_BYTES, v);
        return BAD_VALUE_BYTES - 1;
    default:
        store_redis_value(fp, key, page, R_PAGE_BYTES, v);
        v[BAD_VALUE_BYTES - 1] ^= 0x10;
        return BAD_VALUE_BYTES;
    }
}

/* SET key's server name to a bad value of kind k, as any client of the server could; 0 on
 * success (no cmocka: the chaos thread calls it too). */
static int put_bad(const struct remote *rm, const uint8_t *key, const uint8_t *page,
                   enum bad_kind k)
{
    uint8_t v[BAD_VALUE_BYTES];
    char name[STORE_REDIS_KEY_CHARS + 1];
    const char *argv[] = {"SET", name, (const char *)v};
    size_t lens[] = {3, STORE_REDIS_KEY_CHARS, bad_value(rm->fp, key, page, k, v)};

    store_redis_key(rm->fp, key, name);
    return redis_server_cmd(&rm->srv, 3, argv, lens) == 0 ? 0 : -EIO;
}

/* A value of kind k put on the server under the first page a request reads from it: the read
 * finds it bad, counts it, serves nothing of the run it leads, and the request computes the
 * run (run_req checks every row). */
static void read_bad(const struct remote *rm, kvt_engine *e, uint64_t fam, uint64_t seed,
                     enum bad_kind k)
{
    static uint8_t page[R_PAGE_BYTES];
    uint8_t key[STORE_KEY_BYTES];
    struct kvt_match m = {0};
    uint64_t rng = seed;
    struct seq q;

    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    /* A key whose stored run starts where the device's part ends (see mem.c's read_damaged). */
    for (int i = 0; i < R_CANDIDATES && !(m.disk_len > 0 && m.host_len == 0); i++) {
        struct kvt_key kk;
        gen_seq(fam, &rng, &q);
        kk = seq_key(&q, q.len);
        EXPECT_RC(g_ctx, kvt_match(e, &kk, NULL, &m), 0);
    }
    REQUIRE(g_ctx, m.disk_len > 0 && m.host_len == 0);
    size_t first = m.device_len / PS;
    page_key(e, &q, first, key);
    expected_page(&q, first, page);
    EXPECT_RC(g_ctx, put_bad(rm, key, page, k), 0);
    struct store_redis_counters c0 = counters(e);
    uint64_t errors = stats(e).remote_errors;
    struct kvt_req r = run_req(e, &q, q.len, 1, &m);
    if (!(m.disk_len > 0 && r.disk_len == 0))
        FAIL(g_ctx, "%s under a key: matched %zu tokens from the store, served %zu", BAD_NAME[k],
             m.disk_len, r.disk_len);
    REQUIRE(g_ctx, counters(e).corrupt > c0.corrupt && stats(e).remote_errors > errors);
}

/* ---- test_redis_shared ---- */

/* Every key of n drawn from fam by seed, as engine e (which holds none of it) matches it: all
 * of it in the store, when the engine that wrote them gave up no host backup for want of
 * room (skipped, its backup_skipped_tokens; a page never backed up is never written). */
static void expect_all_stored(kvt_engine *e, const char *who, uint64_t fam, uint64_t seed, int n,
                              uint64_t skipped, uint64_t writer_errors)
{
    uint64_t rng = seed;
    int partial = 0;

    for (int i = 0; i < n; i++) {
        struct seq q;
        struct kvt_match m;
        gen_seq(fam, &rng, &q);
        struct kvt_key k = seq_key(&q, q.len);
        EXPECT_RC(g_ctx, kvt_match(e, &k, NULL, &m), 0);
        REQUIRE(g_ctx, m.device_len == 0 && m.host_len == 0);
        partial += m.disk_len != q.len / PS * PS;
        if (m.disk_len != q.len / PS * PS && !skipped)
            FAIL(g_ctx,
                 "%s: key %d of %zu tokens: %zu of it in the store (writer's errors %" PRIu64 ")",
                 who, i, q.len, m.disk_len, writer_errors);
    }
    if (partial)
        printf("test_disk_engine: redis shared: %s: %d keys of %d partly stored (the writer "
               "skipped %" PRIu64 " tokens' backups)\n",
               who, partial, n, skipped);
}

/* Engine b, holding nothing of fam, runs the keys another engine ran (fam by seed): the run
 * reads from the store, and with whole (every key stored) the first request is served from
 * the store alone. */
static void served_from_store(kvt_engine *b, uint64_t fam, uint64_t seed, int n, bool whole)
{
    struct tally t = {0};
    struct kvt_match m;
    uint64_t rng = seed;
    struct seq q;

    gen_seq(fam, &rng, &q);
    struct kvt_req r = run_req(b, &q, q.len, 1, &m);
    if (whole && !(r.disk_len > 0 && r.disk_len == r.protected_len && r.disk_len == m.disk_len))
        FAIL(g_ctx,
             "a key the store holds whole (%zu tokens): matched %zu there, served %zu "
             "of it and %zu in all",
             q.len, m.disk_len, r.disk_len, r.protected_len);
    run_family(b, fam, seed, n, 1, 1, &t);
    EXPECT_RC(g_ctx, kvt_sync(b), 0);
    check(b);
    REQUIRE(g_ctx, t.disk_tokens > 0 && counters(b).hits > 0);
    /* Found, read and counted as the remote's; nothing as a disk's, and nothing failed. */
    struct kvt_stats st = stats(b);
    if (!(st.remote_hit_tokens > 0 && st.remote_read_tokens > 0 && st.disk_hit_tokens == 0 &&
          st.disk_read_tokens == 0 && st.disk_errors == 0))
        FAIL(g_ctx,
             "served from the remote: remote hit %" PRIu64 " read %" PRIu64 ", disk hit %" PRIu64
             " read %" PRIu64 " errors %" PRIu64,
             st.remote_hit_tokens, st.remote_read_tokens, st.disk_hit_tokens, st.disk_read_tokens,
             st.disk_errors);
}

/* Two engines on one server, both open, then a third after them: each is served from the
 * store what the others wrote (its own device and host empty of it), every byte checked; A
 * writes through, B on its host's evictions. */
void test_redis_shared(void **state)
{
    struct remote *rm = remote_or_skip(state, "redis shared");
    uint64_t seed = base_seed(), fam1 = rng_mix(seed ^ 21), fam2 = rng_mix(seed ^ 22);
    struct tally ta = {0}, tb = {0};

    snprintf(g_ctx, sizeof(g_ctx), "redis shared seed=%" PRIu64 " (KVT_SEED reruns it)", seed);
    printf("test_disk_engine: %s\n", g_ctx);
    /* A's host is large, so it rarely has to skip a backup (and so a write). */
    kvt_engine *a = open_on_redis(rm, KVT_DISK_WRITE_THROUGH, R_SHARED_HOST_TOKENS, false);
    run_family(a, fam1, seed, R_SHARED_REQS, 1, 1, &ta);
    EXPECT_RC(g_ctx, kvt_sync(a), 0);
    uint64_t skipped = stats(a).backup_skipped_tokens, errors = stats(a).remote_errors;
    /* What the server kept counts as the remote's, not as a disk's (there is none). */
    REQUIRE(g_ctx, stats(a).remote_written_tokens > 0 && dbsize(rm) > 0);
    REQUIRE(g_ctx, stats(a).disk_written_tokens == 0);

    kvt_engine *b = open_on_redis(rm, KVT_DISK_WRITE_ON_EVICT, 0, false);
    expect_all_stored(b, "B", fam1, seed, R_SHARED_REQS, skipped, errors);
    served_from_store(b, fam1, seed, R_SHARED_REQS, !skipped);
    run_family(b, fam2, seed ^ 1, R_SHARED_REQS, 1, 1, &tb); /* B's own keys, written on evict */
    EXPECT_RC(g_ctx, kvt_sync(b), 0);
    REQUIRE(g_ctx, stats(b).remote_written_tokens > 0);
    served_from_store(a, fam2, seed ^ 1, R_SHARED_REQS, false);
    REQUIRE(g_ctx, stats(a).remote_errors == 0 && stats(b).remote_errors == 0);
    kvt_close(a);
    kvt_close(b);

    kvt_engine *c = open_on_redis(rm, KVT_DISK_WRITE_THROUGH, 0, false);
    expect_all_stored(c, "C", fam1, seed, R_SHARED_REQS, skipped, errors);
    served_from_store(c, fam1, seed, R_SHARED_REQS / 2, !skipped);
    REQUIRE(g_ctx, stats(c).remote_errors == 0);
    kvt_close(c);
}

/* ---- test_redis_faults ---- */

/* Another client's doings while requests run: FLUSHALL now and then, and values overwritten
 * with bad ones under keys of the family's pages (precomputed: keys and their bytes). */
struct chaos {
    const struct remote *rm;
    uint8_t (*keys)[STORE_KEY_BYTES];
    uint8_t (*pages)[R_PAGE_BYTES];
    size_t n;
    uint64_t rng;
    atomic_bool stop;
    atomic_uint flushes, damaged;
};

static void chaos_keys(struct chaos *ch, kvt_engine *e, uint64_t fam, uint64_t seed, int seqs)
{
    uint64_t rng = seed;

    ch->keys = malloc((size_t)seqs * (MAX_TOK / PS) * sizeof(*ch->keys));
    ch->pages = malloc((size_t)seqs * (MAX_TOK / PS) * sizeof(*ch->pages));
    REQUIRE(g_ctx, ch->keys && ch->pages);
    for (int i = 0; i < seqs; i++) {
        struct seq q;
        gen_seq(fam, &rng, &q);
        for (size_t p = 0; p < q.len / PS; p++, ch->n++) {
            page_key(e, &q, p, ch->keys[ch->n]);
            expected_page(&q, p, ch->pages[ch->n]);
        }
    }
}

/* The chaos thread: no cmocka here; a command that fails is counted as not done. */
static void *chaos_main(void *arg)
{
    struct chaos *ch = arg;
    const char *flush[] = {"FLUSHALL"};

    while (!atomic_load(&ch->stop)) {
        struct timespec nap = {0, (long)(200 + below(&ch->rng, 800)) * 1000};
        nanosleep(&nap, NULL);
        if (chance(&ch->rng, 2)) {
            if (redis_server_cmd(&ch->rm->srv, 1, flush, NULL) == 0)
                atomic_fetch_add(&ch->flushes, 1);
            continue;
        }
        size_t i = below(&ch->rng, (uint32_t)ch->n);
        enum bad_kind k = (enum bad_kind)below(&ch->rng, BAD_KINDS);
        if (put_bad(ch->rm, ch->keys[i], ch->pages[i], k) == 0)
            atomic_fetch_add(&ch->damaged, 1);
    }
    return NULL;
}

/* Requests over fam while another client flushes the server and overwrites values, until it
 * has done CHAOS_DAMAGE overwrites and CHAOS_FLUSHES flushes (CHAOS_MS at most). */
static void run_under_chaos(const struct remote *rm, kvt_engine *e, uint64_t fam, uint64_t seed)
{
    struct chaos ch = {.rm = rm, .rng = seed};
    struct tally t = {0};
    uint64_t t0 = now_ms();
    pthread_t th;

    chaos_keys(&ch, e, fam, seed, 64);
    REQUIRE(g_ctx, pthread_create(&th, NULL, chaos_main, &ch) == 0);
    for (uint64_t i = 0;
         (atomic_load(&ch.damaged) < CHAOS_DAMAGE || atomic_load(&ch.flushes) < CHAOS_FLUSHES) &&
         now_ms() - t0 < CHAOS_MS;
         i++)
        run_family(e, fam, seed + i, 10, 0, 1, &t);
    atomic_store(&ch.stop, true);
    pthread_join(th, NULL);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    printf("test_disk_engine: redis chaos: %u flushes, %u values overwritten; %" PRIu64
           " tokens from the store, %" PRIu64 " bad values caught\n",
           atomic_load(&ch.flushes), atomic_load(&ch.damaged), t.disk_tokens, counters(e).corrupt);
    REQUIRE(g_ctx, atomic_load(&ch.damaged) > 0 && atomic_load(&ch.flushes) > 0);
    free(ch.keys);
    free(ch.pages);
}

/* Requests over fam until the store has served a page again (hits past c0's), R_BACK_MS at
 * most: the server is back. */
static void served_again(kvt_engine *e, uint64_t fam, uint64_t seed, uint64_t hits0)
{
    uint64_t t0 = now_ms();
    struct tally t = {0};

    for (uint64_t i = 0; counters(e).hits <= hits0 || t.disk_tokens == 0; i++) {
        if (now_ms() - t0 > R_BACK_MS)
            FAIL(g_ctx, "the store serves nothing %d ms after the server came back", R_BACK_MS);
        run_family(e, fam, seed + i, 20, 0, 1, &t);
    }
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
}

/* The server killed mid-run: the device and host serve, errors are counted; restarted empty
 * on its port: pages written since are served from it. */
static void server_killed(struct remote *rm, kvt_engine *e, uint64_t fam, uint64_t seed)
{
    uint64_t errors = stats(e).remote_errors;
    struct tally t = {0};

    redis_server_stop(&rm->srv);
    run_family(e, fam, seed, 100, 0, 1, &t);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    REQUIRE(g_ctx, t.protected_tokens > 0 && stats(e).remote_errors > errors);
    REQUIRE(g_ctx, counters(e).connected == 0);
    EXPECT_RC(g_ctx, redis_server_start(&rm->srv, rm->port), 0);
    /* The server started empty: every hit from here is of a page written after it. */
    served_again(e, fam, seed ^ 5, counters(e).hits);
    REQUIRE(g_ctx, counters(e).connected == 1);
}

/* Another engine on the stopped server, fresh: a few requests (their writes queue behind the
 * stalled exchange), then kvt_close, whose store runs what is queued first: how long the
 * close took, in ms. */
static uint64_t closed_on_stopped(const struct remote *rm, uint64_t fam, uint64_t seed)
{
    kvt_engine *o = open_on_redis(rm, KVT_DISK_WRITE_THROUGH, 0, true);
    struct tally t = {0};
    uint64_t t0;

    run_family(o, fam, seed ^ 9, 10, 0, 1, &t);
    t0 = now_ms();
    kvt_close(o);
    return now_ms() - t0;
}

/* The server stopped (SIGSTOP) mid-run: ops fail within the store's timeouts, no engine call
 * blocks longer than they allow, the device and host serve; SIGCONT and the store serves
 * again. */
static void server_stopped(struct remote *rm, kvt_engine *e, uint64_t fam, uint64_t seed)
{
    uint64_t errors = stats(e).remote_errors, t0, sync_ms;
    struct tally t = {0};

    REQUIRE(g_ctx, kill(rm->srv.pid, SIGSTOP) == 0);
    g_slowest_call_us = 0;
    t0 = now_ms();
    for (uint64_t i = 0; now_ms() - t0 < R_STALL_MS; i++)
        run_family(e, fam, seed + i, 1, 0, 1, &t);
    t0 = now_ms();
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    sync_ms = now_ms() - t0;
    struct store_redis_counters c = counters(e);
    uint64_t slowest_ms = g_slowest_call_us / 1000, close_ms = closed_on_stopped(rm, fam, seed);
    REQUIRE(g_ctx, kill(rm->srv.pid, SIGCONT) == 0);
    printf("test_disk_engine: redis stopped: %" PRIu64 " requests, slowest call %" PRIu64
           " ms, sync %" PRIu64 " ms, close %" PRIu64 " ms (bound %d ms), %" PRIu64
           " pages failed\n",
           t.reqs, slowest_ms, sync_ms, close_ms, R_CALL_BOUND_MS, c.failed);
    if (slowest_ms > R_CALL_BOUND_MS || sync_ms > R_CALL_BOUND_MS || close_ms > R_CALL_BOUND_MS)
        FAIL(g_ctx,
             "an engine call blocked %" PRIu64 " ms on a stopped server (sync %" PRIu64
             " ms, close %" PRIu64 " ms; the store's timeouts allow %d)",
             slowest_ms, sync_ms, close_ms, R_CALL_BOUND_MS);
    check(e);
    REQUIRE(g_ctx, t.protected_tokens > 0 && stats(e).remote_errors > errors);
    served_again(e, fam, seed ^ 7, c.hits);
}

/* The engine over the Redis store while the server misbehaves: values overwritten with bad
 * ones (each kind caught for certain, then at random while another client also flushes the
 * server), the server killed and restarted empty, the server stopped and continued. Every
 * page served is exact (run_req checks every row), kvt_poll and kvt_sync return 0 throughout,
 * and the store serves again after each. seed is the case's own, drawn from base. */
static void faults_case(struct remote *rm, uint32_t policy, uint64_t seed, uint64_t base)
{
    uint64_t fam = rng_mix(seed ^ 31);
    struct tally t = {0};

    snprintf(g_ctx, sizeof(g_ctx), "redis faults policy=%u seed=%" PRIu64 " (KVT_SEED=%" PRIu64 ")",
             policy, seed, base);
    flushall(rm);
    kvt_engine *e = open_on_redis(rm, policy, 0, true);
    run_family(e, fam, seed, 150, 0, 1, &t);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    /* Errors are not ruled out here: a reply slower than the short timeouts on a loaded
     * machine is one. */
    REQUIRE(g_ctx, t.disk_tokens > 0);
    for (int k = 0; k < BAD_KINDS; k++)
        read_bad(rm, e, fam, seed ^ (uint64_t)(40 + k), (enum bad_kind)k);
    run_under_chaos(rm, e, fam, seed ^ 2);
    flushall(rm);
    /* Fresh families: their pages are new, so the store is written to while it fails. */
    server_killed(rm, e, rng_mix(seed ^ 32), seed ^ 3);
    server_stopped(rm, e, rng_mix(seed ^ 33), seed ^ 4);
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    kvt_close(e);
}

void test_redis_faults(void **state)
{
    struct remote *rm = remote_or_skip(state, "redis faults");
    uint64_t seed = base_seed();

    printf("test_disk_engine: redis faults: seed=%" PRIu64 " (KVT_SEED reruns it)\n", seed);
    faults_case(rm, KVT_DISK_WRITE_THROUGH, seed, seed);
    faults_case(rm, KVT_DISK_WRITE_ON_EVICT, rng_mix(seed), seed);
}

/* ---- test_redis_evicting ---- */

/* A server at its maxmemory, evicting (allkeys-lru) under the engine's writes: pages it
 * dropped are misses, never errors, and every page served is exact. */
void test_redis_evicting(void **state)
{
    struct remote *rm = remote_or_skip(state, "redis evicting");
    uint64_t seed = base_seed(), fam = rng_mix(seed ^ 51);
    struct tally t = {0};
    char max[32];
    const char *cfg[] = {"CONFIG", "SET", "maxmemory", max};

    snprintf(g_ctx, sizeof(g_ctx), "redis evicting seed=%" PRIu64 " (KVT_SEED reruns it)", seed);
    printf("test_disk_engine: %s\n", g_ctx);
    long long used = info_field(rm, "memory", "used_memory");
    REQUIRE(g_ctx, used > 0);
    /* Room for some hundreds of pages: the unique keys below are thousands. */
    snprintf(max, sizeof(max), "%lld", used + (256 << 10));
    REQUIRE(g_ctx, server_cmd(rm, 4, cfg, NULL) == 0);
    kvt_engine *e = open_on_redis(rm, KVT_DISK_WRITE_THROUGH, 0, false);
    for (uint32_t i = 0; i < 300; i++) {
        struct seq q;
        seq_make(&q, i % N_NS, MAX_TOK, i);
        run_req(e, &q, q.len, 1, NULL);
        if (i % 20 == 19)
            run_family(e, fam, seed + i, 20, 0, 1, &t);
    }
    EXPECT_RC(g_ctx, kvt_sync(e), 0);
    check(e);
    struct store_redis_counters c = counters(e);
    long long evicted = info_field(rm, "stats", "evicted_keys");
    printf("test_disk_engine: redis evicting: %lld keys evicted, %" PRIu64 " hits, %" PRIu64
           " misses, %" PRIu64 " tokens from the store\n",
           evicted, c.hits, c.misses, t.disk_tokens);
    REQUIRE(g_ctx, evicted > 0 && c.hits > 0);
    REQUIRE(g_ctx, c.failed == 0 && c.corrupt == 0 && stats(e).remote_errors == 0);
    kvt_close(e);
}
