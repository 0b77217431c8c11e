/*
 * The store contract (src/store/store.h), checked the same way on every backend built in:
 * the in-memory store, the disk block store, a chain of the two, a view of a shared disk store,
 * and (where the Redis store is built) the Redis store over a redis-server the test starts
 * itself and over a 3-master Redis Cluster likewise. A new backend adds one row to BACKENDS
 * and passes these before the engine ever sees it (docs/tiers.md).
 *
 * Each backend gets a store of CAPACITY pages of PAGE_BYTES, and then:
 * - a chain of pages written in one batch is all there: each page's result 0, the op's
 *   completion counts them, leading_run finds the run and stops at the first absent key;
 * - reads give back the bytes written, byte for byte; an absent key reads -ENOENT and ends
 *   the leading pages a read reports;
 * - completions: poll collects an op once, wait_for a collected op gives -ENOENT, one never
 *   issued -EINVAL, and a timed wait on a finished op collects it;
 * - more pages than the capacity: the store keeps at most its capacity, the newest chain is
 *   whole, and every page it still reads is exact;
 * - stats agree with what was done;
 * - a store that takes pages in parts moves them byte for byte either way.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#include "store/chain.h"
#include "disk/ops.h"
#include "store/mem.h"
#include "store/share.h"
#include "store/store.h"
#ifdef KVT_HAVE_REDIS
#include "redis_cluster.h"
#include "redis_server.h"
#include "store/redis/redis.h"
#endif

#define PAGE_BYTES 6000 /* not a whole number of blocks: the disk store's tail path too */
#define PAGE_TOKENS 4
#define CAPACITY 32
#define CHAIN 12

struct backend {
    const char *name;
    int (*open)(char *dir, struct kvt_store **out);
    bool (*available)(void); /* NULL: always; false: the row is skipped, and says why */
    const char *needs;
};

static int open_mem(char *dir, struct kvt_store **out)
{
    struct store_mem_options o = {
        .page_bytes = PAGE_BYTES, .page_tokens = PAGE_TOKENS, .capacity_pages = CAPACITY};

    (void)dir;
    return store_mem_open(&o, out);
}

static int open_disk(char *dir, struct kvt_store **out)
{
    struct dstore_options o;
    const char *tmp = getenv("TMPDIR");

    snprintf(dir, 96, "%s/kvt-contract-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return -errno;
    dstore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.page_bytes = PAGE_BYTES;
    o.page_tokens = PAGE_TOKENS;
    o.disk_bytes = (uint64_t)CAPACITY * (PAGE_BYTES / 4096 + 2) * 4096; /* page + head */
    return store_disk_open(&o, out);
}

/* A small mem store before a disk store: a chain's reads come from both. */
static int open_chain(char *dir, struct kvt_store **out)
{
    struct store_mem_options o = {
        .page_bytes = PAGE_BYTES, .page_tokens = PAGE_TOKENS, .capacity_pages = CAPACITY / 4};
    struct kvt_store *s[2] = {NULL, NULL};
    int rc = store_mem_open(&o, &s[0]);

    if (rc == 0 && (rc = open_disk(dir, &s[1])) == 0 && (rc = store_chain_open(s, 2, out)) == 0)
        return 0;
    store_close(s[0]);
    store_close(s[1]);
    return rc;
}

/* One view of a disk store shared with another user (the engine's embedding cache), which
 * submits nothing and is closed first: the view alone must keep the contract. */
static int open_share(char *dir, struct kvt_store **out)
{
    struct kvt_store *s, *v[2];
    int rc = open_disk(dir, &s);

    if (rc == 0 && (rc = store_share_open(s, 2, v)) != 0)
        store_close(s);
    if (rc == 0) {
        store_close(v[1]);
        *out = v[0];
    }
    return rc;
}

#ifdef KVT_HAVE_REDIS
/* One server for the program, emptied at each open: stats' pages are the server's keys. */
static struct redis_server contract_server;

static void stop_contract_server(void)
{
    redis_server_stop(&contract_server);
}

static int open_redis(char *dir, struct kvt_store **out)
{
    struct store_redis_options o = {.page_bytes = PAGE_BYTES, .page_tokens = PAGE_TOKENS};
    const char *flush[] = {"FLUSHALL"};
    int rc;

    (void)dir;
    if (!contract_server.pid) {
        if ((rc = redis_server_start(&contract_server, 0)))
            return rc;
        atexit(stop_contract_server);
    } else if (redis_server_cmd(&contract_server, 1, flush, NULL) != 0) {
        return -EIO;
    }
    o.port = contract_server.port;
    memset(o.fingerprint, 0x3c, sizeof(o.fingerprint));
    return store_redis_open(&o, out);
}

/* A 3-master cluster of its own, its seeds through options.remote's parser, emptied at each
 * open like the standalone server. */
static struct redis_cluster contract_cluster;
static bool contract_cluster_up;

static void stop_contract_cluster(void)
{
    redis_cluster_stop(&contract_cluster);
}

static int open_redis_cluster(char *dir, struct kvt_store **out)
{
    struct store_redis_options o = {.page_bytes = PAGE_BYTES, .page_tokens = PAGE_TOKENS};
    char url[256], buf[256];
    int rc;

    (void)dir;
    if (!contract_cluster_up) {
        if ((rc = redis_cluster_start(&contract_cluster)))
            return rc;
        contract_cluster_up = true;
        atexit(stop_contract_cluster);
    } else if (redis_cluster_flush(&contract_cluster)) {
        return -EIO;
    }
    redis_cluster_url(&contract_cluster, 0, url, sizeof(url));
    if ((rc = store_redis_parse_url(url, buf, sizeof(buf), &o)))
        return rc;
    memset(o.fingerprint, 0x3c, sizeof(o.fingerprint));
    return store_redis_open(&o, out); /* it copies the seeds */
}
#endif

static const struct backend BACKENDS[] = {
    {"mem", open_mem, NULL, NULL},
    {"disk", open_disk, NULL, NULL},
    {"chain", open_chain, NULL, NULL},
    {"share", open_share, NULL, NULL},
#ifdef KVT_HAVE_REDIS
    {"redis", open_redis, redis_server_installed, "redis-server on PATH"},
    {"redis-cluster", open_redis_cluster, redis_server_installed, "redis-server on PATH"},
#endif
};

/* Page i of chain c: its key (a made-up hash) and its bytes. */
static void key_of(uint32_t c, uint32_t i, uint8_t key[STORE_KEY_BYTES])
{
    memset(key, 0, STORE_KEY_BYTES);
    for (int b = 0; b < 4; b++) {
        key[b] = (uint8_t)(c >> (8 * b));
        key[4 + b] = (uint8_t)(i >> (8 * b));
    }
    key[31] = 0xa5;
}

static void bytes_of(uint32_t c, uint32_t i, uint8_t *buf)
{
    uint64_t z = ((uint64_t)c << 32 | i) * 0x9E3779B97F4A7C15ull;

    for (size_t b = 0; b < PAGE_BYTES; b++) {
        z ^= z >> 29;
        z *= 0xBF58476D1CE4E5B9ull;
        buf[b] = (uint8_t)(z >> 56);
    }
}

struct chain {
    uint8_t keys[CHAIN][STORE_KEY_BYTES];
    uint8_t *bufs; /* CHAIN pages */
};

static void chain_make(struct chain *ch, uint32_t c)
{
    ch->bufs = malloc((size_t)CHAIN * PAGE_BYTES);
    assert_non_null(ch->bufs);
    for (uint32_t i = 0; i < CHAIN; i++) {
        key_of(c, i, ch->keys[i]);
        bytes_of(c, i, ch->bufs + (size_t)i * PAGE_BYTES);
    }
}

/* Write a chain in one batch and wait for it: every page stored. */
static void write_chain(struct kvt_store *s, struct chain *ch)
{
    struct store_wpage w[CHAIN];
    int results[CHAIN];
    struct store_done d;
    uint64_t op = 0;

    for (uint32_t i = 0; i < CHAIN; i++)
        w[i] = (struct store_wpage){.key = ch->keys[i],
                                    .parent = i ? ch->keys[i - 1] : NULL,
                                    .buf = ch->bufs + (size_t)i * PAGE_BYTES};
    assert_int_equal(store_write(s, w, CHAIN, results, &op), 0);
    assert_true(op > 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    assert_int_equal(d.op, op);
    assert_int_equal(d.kind, STORE_OP_WRITE);
    assert_int_equal(d.pages, CHAIN);
    assert_int_equal(d.ok, CHAIN);
    for (uint32_t i = 0; i < CHAIN; i++)
        assert_int_equal(results[i], 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), -ENOENT); /* collected once */
}

/* Read pages [0, n) of a chain; *leading the run the store reported. Returns the number of
 * pages read exactly; a page whose result is 0 must be exact. */
static size_t read_chain(struct kvt_store *s, struct chain *ch, size_t n, size_t *leading)
{
    struct store_rpage r[CHAIN];
    int results[CHAIN];
    struct store_done d;
    uint64_t op = 0;
    uint8_t *got = malloc((size_t)CHAIN * PAGE_BYTES);
    size_t ok = 0;

    assert_non_null(got);
    for (size_t i = 0; i < n; i++)
        r[i] = (struct store_rpage){.key = ch->keys[i], .buf = got + i * PAGE_BYTES};
    assert_int_equal(store_read(s, r, n, results, &op, leading), 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    assert_int_equal(d.kind, STORE_OP_READ);
    for (size_t i = 0; i < n; i++) {
        assert_true(results[i] == 0 || results[i] == -ENOENT);
        if (results[i] == 0) {
            assert_memory_equal(got + i * PAGE_BYTES, ch->bufs + i * PAGE_BYTES, PAGE_BYTES);
            ok++;
        }
    }
    assert_int_equal(d.ok, ok);
    free(got);
    return ok;
}

/* The disk backend's dir, made by its open; "" for the others. */
static void remove_dir(const char *dir)
{
    char cmd[160];

    if (!*dir)
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void check_chain(const struct backend *b)
{
    struct kvt_store *s = NULL;
    struct chain ch;
    char dir[96] = "";
    size_t run = 0, lead = 0;

    assert_int_equal(b->open(dir, &s), 0);
    assert_int_equal(s->page_bytes, PAGE_BYTES);
    chain_make(&ch, 1);
    write_chain(s, &ch);
    assert_int_equal(store_leading_run(s, &ch.keys[0][0], CHAIN, &run), 0);
    assert_int_equal(run, CHAIN);
    /* An absent key ends the run. */
    uint8_t keys[CHAIN][STORE_KEY_BYTES];
    memcpy(keys, ch.keys, sizeof(keys));
    key_of(99, 5, keys[5]);
    assert_int_equal(store_leading_run(s, &keys[0][0], CHAIN, &run), 0);
    assert_int_equal(run, 5);
    assert_int_equal(read_chain(s, &ch, CHAIN, &lead), CHAIN);
    assert_int_equal(lead, CHAIN);
    /* A read of an absent page: -ENOENT, and it ends the leading pages. */
    key_of(99, 0, ch.keys[0]);
    assert_int_equal(read_chain(s, &ch, 3, &lead), 2);
    assert_int_equal(lead, 0);
    struct store_stats st;
    store_stats(s, &st);
    assert_int_equal(st.pages, CHAIN);
    assert_int_equal(st.in_flight, 0);
    assert_true(st.capacity_pages >= CAPACITY);
    assert_true(st.bytes_written >= (uint64_t)CHAIN * PAGE_BYTES);
    assert_true(st.bytes_read >= (uint64_t)(CHAIN + 2) * PAGE_BYTES);
    store_close(s);
    free(ch.bufs);
    remove_dir(dir);
}

/* Completions: poll collects each op once; wait_for tells issued from collected. */
static void check_completions(const struct backend *b)
{
    struct kvt_store *s = NULL;
    struct store_wpage w;
    struct store_done d[4];
    uint8_t key[STORE_KEY_BYTES], *buf = malloc(PAGE_BYTES);
    char dir[96] = "";
    uint64_t op = 0;
    int res = 1;
    size_t got = 0;

    assert_non_null(buf);
    assert_int_equal(b->open(dir, &s), 0);
    key_of(7, 0, key);
    bytes_of(7, 0, buf);
    w = (struct store_wpage){.key = key, .buf = buf};
    assert_int_equal(store_write(s, &w, 1, &res, &op), 0);
    for (int i = 0; i < 100000 && got == 0; i++) {
        got = store_poll(s, d, 4);
        if (!got)
            usleep(100);
    }
    assert_int_equal(got, 1);
    assert_int_equal(d[0].op, op);
    assert_int_equal(res, 0);
    assert_int_equal(store_poll(s, d, 4), 0);
    assert_int_equal(store_wait_for(s, op, 0, d), -ENOENT);
    assert_int_equal(store_wait_for(s, op + 1000, 0, d), -EINVAL);
    assert_int_equal(store_drain(s), 0);
    store_close(s);
    free(buf);
    remove_dir(dir);
}

/* Past capacity: the store keeps at most its capacity, the newest chain whole and exact. */
static void check_capacity(const struct backend *b)
{
    struct kvt_store *s = NULL;
    struct chain ch[CAPACITY / CHAIN + 2];
    uint32_t nch = sizeof(ch) / sizeof(ch[0]);
    char dir[96] = "";
    size_t run = 0, lead = 0;
    struct store_stats st;

    assert_int_equal(b->open(dir, &s), 0);
    for (uint32_t c = 0; c < nch; c++) {
        chain_make(&ch[c], 10 + c);
        write_chain(s, &ch[c]);
    }
    store_stats(s, &st);
    assert_true(st.pages <= st.capacity_pages);
    assert_true(st.pages >= CHAIN);
    assert_int_equal(store_leading_run(s, &ch[nch - 1].keys[0][0], CHAIN, &run), 0);
    assert_int_equal(run, CHAIN);
    for (uint32_t c = 0; c < nch; c++)
        read_chain(s, &ch[c], CHAIN, &lead); /* what is still there is exact */
    assert_int_equal(read_chain(s, &ch[nch - 1], CHAIN, &lead), CHAIN);
    store_close(s);
    for (uint32_t c = 0; c < nch; c++)
        free(ch[c].bufs);
    remove_dir(dir);
}

/* Pages in parts (ops->parts): written from parts and read back whole, written whole and
 * read into parts, byte for byte; parts that are not whole fail their page alone. A store
 * without parts says so (the store tier then stages its pages). */
static void check_parts(const struct backend *b)
{
    enum { NP = 3, PART = PAGE_BYTES / NP };
    struct kvt_store *s = NULL;
    struct chain ch;
    char dir[96] = "";
    void *mem[CHAIN][NP];
    uint8_t *got = malloc(PAGE_BYTES);
    struct store_wpage w[CHAIN];
    struct store_rpage r[CHAIN];
    int results[CHAIN];
    struct store_done d;
    uint64_t op;

    assert_int_equal(b->open(dir, &s), 0);
    if (!s->ops->parts) {
        printf("test_store_contract: %s takes no parts\n", b->name);
        store_close(s);
        remove_dir(dir);
        free(got);
        return;
    }
    chain_make(&ch, 40);
    for (uint32_t i = 0; i < CHAIN; i++) /* apart from each other, each of its own allocation */
        for (uint32_t k = 0; k < NP; k++) {
            mem[i][k] = malloc(PART);
            memcpy(mem[i][k], ch.bufs + (size_t)i * PAGE_BYTES + k * PART, PART);
        }
    /* The first half written in parts, the rest whole. */
    for (uint32_t i = 0; i < CHAIN; i++)
        w[i] = i < CHAIN / 2 ? (struct store_wpage){.key = ch.keys[i],
                                                    .parent = i ? ch.keys[i - 1] : NULL,
                                                    .parts = (const void *const *)mem[i],
                                                    .nparts = NP}
                             : (struct store_wpage){.key = ch.keys[i],
                                                    .parent = ch.keys[i - 1],
                                                    .buf = ch.bufs + (size_t)i * PAGE_BYTES};
    assert_int_equal(store_write(s, w, CHAIN, results, &op), 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    assert_int_equal(d.ok, CHAIN);
    for (uint32_t i = 0; i < CHAIN; i++) /* the parts' memory scrubbed: reads must fill it */
        for (uint32_t k = 0; k < NP; k++)
            memset(mem[i][k], 0xA5, PART);
    size_t lead = 0;
    assert_int_equal(read_chain(s, &ch, CHAIN, &lead), CHAIN); /* whole reads of all */
    for (uint32_t i = 0; i < CHAIN; i++)
        r[i] = (struct store_rpage){.key = ch.keys[i], .parts = mem[i], .nparts = NP};
    assert_int_equal(store_read(s, r, CHAIN, results, &op, &lead), 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    assert_int_equal(d.ok, CHAIN);
    for (uint32_t i = 0; i < CHAIN; i++) {
        assert_int_equal(results[i], 0);
        for (uint32_t k = 0; k < NP; k++)
            assert_memory_equal(mem[i][k], ch.bufs + (size_t)i * PAGE_BYTES + k * PART, PART);
    }
    /* Parts that are not whole: a count that does not divide the page, a NULL part. */
    void *parts_bad[NP] = {mem[0][0], NULL, mem[0][2]};
    r[0] = (struct store_rpage){.key = ch.keys[0], .parts = mem[0], .nparts = 7};
    r[1] = (struct store_rpage){.key = ch.keys[1], .parts = parts_bad, .nparts = NP};
    r[2] = (struct store_rpage){.key = ch.keys[2], .buf = got};
    assert_int_equal(store_read(s, r, 3, results, &op, NULL), 0);
    assert_int_equal(store_wait_for(s, op, -1, &d), 0);
    assert_int_equal(results[0], -EINVAL);
    assert_int_equal(results[1], -EINVAL);
    assert_int_equal(results[2], 0);
    assert_memory_equal(got, ch.bufs + 2 * (size_t)PAGE_BYTES, PAGE_BYTES);
    store_close(s);
    for (uint32_t i = 0; i < CHAIN; i++)
        for (uint32_t k = 0; k < NP; k++)
            free(mem[i][k]);
    free(ch.bufs);
    free(got);
    remove_dir(dir);
}

static void test_contract(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(BACKENDS) / sizeof(BACKENDS[0]); i++) {
        if (BACKENDS[i].available && !BACKENDS[i].available()) {
            printf("test_store_contract: %s SKIPPED: needs %s\n", BACKENDS[i].name,
                   BACKENDS[i].needs);
            continue;
        }
        printf("test_store_contract: %s\n", BACKENDS[i].name);
        check_chain(&BACKENDS[i]);
        check_completions(&BACKENDS[i]);
        check_capacity(&BACKENDS[i]);
        check_parts(&BACKENDS[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
