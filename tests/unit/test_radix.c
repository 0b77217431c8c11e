/* The radix prefix cache on its own: structure, matching, locks, eviction order, namespaces
 * and page hashes. Pages are plain numbers here; eviction reports them to a recorder. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "radix/radix.h"

#define MAX_FREED 256

struct recorder {
    uint32_t freed[MAX_FREED];
    size_t n;
};

static void record(void *ctx, const uint32_t *pages, size_t n)
{
    struct recorder *r = ctx;

    for (size_t i = 0; i < n && r->n < MAX_FREED; i++)
        r->freed[r->n++] = pages[i];
}

static struct rdx_tree *tree(uint32_t page_size, uint32_t policy, struct recorder *r)
{
    struct rdx_config cfg = {
        .page_size = page_size, .policy = policy, .hash_pages = 1, .free_pages = record, .ctx = r};
    struct rdx_tree *t = NULL;

    memset(cfg.fingerprint, 0xab, sizeof(cfg.fingerprint));
    assert_int_equal(rdx_create(&cfg, &t), 0);
    return t;
}

static void check(const struct rdx_tree *t)
{
    char why[200];
    int rc = rdx_check(t, NULL, why, sizeof(why));

    if (rc)
        fail_msg("tree check: %s", why);
}

/* Insert tokens with pages = token + 100; returns the cached prefix length. */
static size_t put_ns(struct rdx_tree *t, const char *ns, const uint32_t *tok, size_t n,
                     int32_t prio)
{
    uint32_t pages[64];
    struct kvt_key k = {.tokens = tok, .len = n, .ns = ns, .ns_len = ns ? strlen(ns) : 0};
    size_t pre = 999;

    for (size_t i = 0; i < n; i++)
        pages[i] = tok[i] + 100;
    assert_int_equal(rdx_insert(t, &k, pages, prio, &pre), 0);
    check(t);
    return pre;
}

static size_t put(struct rdx_tree *t, const uint32_t *tok, size_t n)
{
    return put_ns(t, NULL, tok, n, 0);
}

static size_t get_ns(struct rdx_tree *t, const char *ns, const uint32_t *tok, size_t n,
                     uint32_t *pages, kvt_node_ref *last)
{
    struct kvt_key k = {.tokens = tok, .len = n, .ns = ns, .ns_len = ns ? strlen(ns) : 0};
    size_t got = 999;
    kvt_node_ref l;

    assert_int_equal(rdx_match(t, &k, pages, &got, last ? last : &l), 0);
    check(t);
    return got;
}

static size_t get(struct rdx_tree *t, const uint32_t *tok, size_t n, kvt_node_ref *last)
{
    return get_ns(t, NULL, tok, n, NULL, last);
}

static void assert_dump(const struct rdx_tree *t, const char *want)
{
    char buf[2048];

    rdx_dump(t, buf, sizeof(buf));
    if (strcmp(buf, want) != 0)
        fail_msg("tree is\n%s\nwant\n%s", buf, want);
}

#define KEY(...) ((const uint32_t[]){__VA_ARGS__}), (sizeof((uint32_t[]){__VA_ARGS__}) / 4)

static void test_insert_sequence(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, KVT_EVICT_LRU, &r);

    (void)state;
    assert_int_equal(put(t, KEY(1, 2, 3)), 0);
    assert_int_equal(put(t, KEY(1, 2, 3, 4, 5)), 3);
    assert_int_equal(put(t, KEY(1, 2, 4, 5, 6, 7)), 2);
    assert_int_equal(put(t, KEY(8, 9, 10, 11, 12)), 0);
    assert_dump(t, "[1,2] pages=[101,102] lock=0\n"
                   "  [3] pages=[103] lock=0\n"
                   "    [4,5] pages=[104,105] lock=0\n"
                   "  [4,5,6,7] pages=[104,105,106,107] lock=0\n"
                   "[8,9,10,11,12] pages=[108,109,110,111,112] lock=0\n");
    struct rdx_sizes s;
    rdx_sizes(t, &s);
    assert_int_equal(s.cached_pages, 14);
    assert_int_equal(s.evictable_pages, 14);
    assert_int_equal(s.nodes, 5);

    uint32_t pages[16];
    assert_int_equal(get_ns(t, NULL, KEY(1, 2, 4, 5, 6, 7, 9), pages, NULL), 6);
    const uint32_t want[] = {101, 102, 104, 105, 106, 107};
    assert_memory_equal(pages, want, sizeof(want));
    assert_int_equal(get(t, KEY(7, 1), NULL), 0);
    rdx_destroy(t);
}

/* A match that ends inside a node splits it so the prefix ends on a node boundary. */
static void test_split(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, KVT_EVICT_LRU, &r);
    uint8_t whole[5][KVT_HASH_LEN], head[5][KVT_HASH_LEN], tail[5][KVT_HASH_LEN];
    kvt_node_ref last, full;
    size_t n;

    (void)state;
    put(t, KEY(1, 2, 3, 4, 5));
    assert_int_equal(get(t, KEY(1, 2, 3, 4, 5), &full), 5);
    assert_int_equal(rdx_node_hashes(t, full, whole, 5, &n), 0);
    assert_int_equal(n, 5);

    assert_int_equal(get(t, KEY(1, 2, 3, 9), &last), 3);
    assert_dump(t, "[1,2,3] pages=[101,102,103] lock=0\n"
                   "  [4,5] pages=[104,105] lock=0\n");
    assert_int_equal(rdx_node_hashes(t, last, head, 5, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(get(t, KEY(1, 2, 3, 4, 5), &full), 5);
    assert_int_equal(rdx_node_hashes(t, full, tail, 5, &n), 0);
    assert_int_equal(n, 2);
    /* Hashes split at page boundaries: the halves are the whole. */
    assert_memory_equal(head, whole, 3 * KVT_HASH_LEN);
    assert_memory_equal(tail, whole + 3, 2 * KVT_HASH_LEN);
    rdx_destroy(t);
}

static void test_pages(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(4, KVT_EVICT_LRU, &r);
    struct kvt_key odd = {.tokens = (const uint32_t[]){1, 2, 3}, .len = 3};
    uint32_t pages[4] = {0};
    size_t pre;

    (void)state;
    assert_int_equal(rdx_insert(t, &odd, pages, 0, &pre), -EINVAL);
    assert_int_equal(put(t, KEY(1, 2, 3, 4, 1, 2, 3, 4)), 0);
    /* Page granularity: three equal tokens of the second page are no match. */
    assert_int_equal(get(t, KEY(1, 2, 3, 4, 1, 2, 3, 5), NULL), 1);
    /* A key is matched in whole pages: 10 tokens are 2 pages. */
    assert_int_equal(get(t, KEY(1, 2, 3, 4, 1, 2, 3, 4, 1, 2), NULL), 2);
    assert_int_equal(get(t, KEY(1, 2, 3), NULL), 0);
    assert_dump(t, "[1,2,3,4] pages=[101] lock=0\n"
                   "  [1,2,3,4] pages=[102] lock=0\n");
    rdx_destroy(t);
}

static void test_locks(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, KVT_EVICT_LRU, &r);
    struct rdx_sizes s;
    kvt_node_ref leaf, other;

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    put(t, KEY(1, 2, 7));
    put(t, KEY(9));
    get(t, KEY(1, 2, 3, 4), &leaf);
    get(t, KEY(9), &other);
    assert_int_equal(rdx_lock(t, leaf), 0);
    assert_int_equal(rdx_lock(t, leaf), 0);
    rdx_sizes(t, &s);
    assert_int_equal(s.protected_pages, 4); /* [1,2] and [3,4] */
    assert_int_equal(s.evictable_pages, 2);
    check(t);

    /* Evict everything: only the unlocked [7] and [9] can go. */
    assert_int_equal(rdx_evict(t, 100), 2);
    rdx_sizes(t, &s);
    assert_int_equal(s.cached_pages, 4);
    assert_int_equal(rdx_lock(t, other), -EINVAL); /* evicted: its ref is stale */
    assert_int_equal(rdx_unlock(t, leaf), 0);
    assert_int_equal(rdx_evict(t, 100), 0); /* still locked once */
    assert_int_equal(rdx_unlock(t, leaf), 0);
    assert_int_equal(rdx_unlock(t, leaf), -EINVAL); /* below zero */
    rdx_sizes(t, &s);
    assert_int_equal(s.protected_pages, 0);
    assert_int_equal(s.evictable_pages, 4);
    /* The root can be locked and unlocked freely (it is never evicted). */
    assert_int_equal(rdx_lock(t, rdx_root(t)), 0);
    assert_int_equal(rdx_unlock(t, rdx_root(t)), 0);
    assert_int_equal(rdx_unlock(t, 0), -EINVAL);
    assert_int_equal(rdx_unlock(t, leaf + (1ull << 32)), -EINVAL); /* forged generation */
    assert_int_equal(rdx_evict(t, 100), 4);
    rdx_sizes(t, &s);
    assert_int_equal(s.cached_pages, 0);
    assert_int_equal(s.nodes, 0);
    check(t);
    rdx_destroy(t);
}

/* Only a node's own locks can be dropped: an ancestor that is locked because of its child
 * cannot be unlocked through its own ref. */
static void test_unlock_only_own(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(2, KVT_EVICT_LRU, &r);
    kvt_node_ref upper, leaf;

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    get(t, KEY(1, 2), &upper); /* splits: [1,2] -> [3,4] */
    get(t, KEY(1, 2, 3, 4), &leaf);
    assert_int_equal(rdx_lock(t, leaf), 0);
    assert_int_equal(rdx_is_locked(t, upper), 0);
    assert_int_equal(rdx_unlock(t, upper), -EINVAL);
    check(t);
    assert_int_equal(rdx_lock(t, upper), 0);
    assert_int_equal(rdx_unlock(t, leaf), 0);
    assert_int_equal(rdx_unlock(t, leaf), -EINVAL);
    assert_dump(t, "[1,2] pages=[101] lock=1\n"
                   "  [3,4] pages=[102] lock=0\n");
    assert_int_equal(rdx_evict(t, 100), 1); /* [3,4] goes, [1,2] is still locked */
    assert_int_equal(rdx_unlock(t, upper), 0);
    check(t);
    rdx_destroy(t);
}

/* A lock taken on a node survives a split of that node: the new parent inherits it. */
static void test_lock_across_split(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, KVT_EVICT_LRU, &r);
    kvt_node_ref leaf;

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    get(t, KEY(1, 2, 3, 4), &leaf);
    assert_int_equal(rdx_lock(t, leaf), 0);
    put(t, KEY(1, 2, 8));
    assert_dump(t, "[1,2] pages=[101,102] lock=1\n"
                   "  [3,4] pages=[103,104] lock=1\n"
                   "  [8] pages=[108] lock=0\n");
    assert_int_equal(rdx_evict(t, 100), 1);
    assert_int_equal(rdx_unlock(t, leaf), 0);
    check(t);
    assert_int_equal(rdx_evict(t, 100), 4);
    rdx_destroy(t);
}

/* Four one-page leaves, touched so that every policy orders them differently:
 * inserted a, b, c, d (priorities 5, 1, 9, 1); then a, a, c, b, b, b matched. */
static void eviction_order(uint32_t policy, const char *want)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, policy, &r);
    char got[16] = {0};

    put_ns(t, NULL, KEY(10), 5);
    put_ns(t, NULL, KEY(20), 1);
    put_ns(t, NULL, KEY(30), 9);
    put_ns(t, NULL, KEY(40), 1);
    get(t, KEY(10), NULL);
    get(t, KEY(10), NULL);
    get(t, KEY(30), NULL);
    for (int i = 0; i < 3; i++)
        get(t, KEY(20), NULL);
    for (int i = 0; i < 4; i++)
        assert_int_equal(rdx_evict(t, 1), 1);
    assert_int_equal(r.n, 4);
    for (size_t i = 0; i < 4; i++)
        got[i] = (char)('a' + (r.freed[i] - 110) / 10);
    if (strcmp(got, want) != 0)
        fail_msg("policy %u evicted %s, want %s", policy, got, want);
    rdx_destroy(t);
}

static void test_eviction_policies(void **state)
{
    (void)state;
    eviction_order(KVT_EVICT_LRU, "dacb");      /* last access d4 a6 c7 b10 */
    eviction_order(KVT_EVICT_LFU, "dcab");      /* hits d0 c1 a2 b3 */
    eviction_order(KVT_EVICT_FIFO, "abcd");     /* created a1 b2 c3 d4 */
    eviction_order(KVT_EVICT_MRU, "bcad");      /* newest access first */
    eviction_order(KVT_EVICT_FILO, "dcba");     /* newest insertion first */
    eviction_order(KVT_EVICT_PRIORITY, "dbac"); /* priority, then last access */
}

/* A parent whose last child goes becomes a leaf and is evicted within the same call. */
static void test_evict_parents(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, KVT_EVICT_LRU, &r);

    (void)state;
    put(t, KEY(1, 2, 3));
    put(t, KEY(1, 2, 3, 4));
    put(t, KEY(1, 2, 3, 5));
    put(t, KEY(9));
    get(t, KEY(9), NULL);
    assert_int_equal(rdx_evict(t, 5), 5);
    /* [4] and [5] (oldest), then their parent [1,2,3]; [9] was used last and stays. */
    const uint32_t want[] = {104, 105, 101, 102, 103};
    assert_int_equal(r.n, 5);
    assert_memory_equal(r.freed, want, sizeof(want));
    assert_dump(t, "[9] pages=[109] lock=0\n");
    assert_int_equal(rdx_evict(t, 0), 0);
    rdx_destroy(t);
}

static void test_namespaces(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(1, KVT_EVICT_LRU, &r);
    uint8_t ha[1][KVT_HASH_LEN], hb[1][KVT_HASH_LEN];
    kvt_node_ref la, lb;
    uint32_t pages[4];
    size_t n;

    (void)state;
    assert_int_equal(put_ns(t, "lora-a", KEY(1, 2, 3), 0), 0);
    assert_int_equal(put_ns(t, "lora-b", KEY(1, 2, 3), 0), 0);
    assert_int_equal(put_ns(t, NULL, KEY(1, 2), 0), 0);
    assert_int_equal(get_ns(t, "lora-c", KEY(1, 2, 3), pages, NULL), 0);
    assert_int_equal(get_ns(t, "lora-a", KEY(1, 2, 3), pages, &la), 3);
    assert_int_equal(get_ns(t, "lora-b", KEY(1, 2, 3), pages, &lb), 3);
    assert_int_equal(get_ns(t, NULL, KEY(1, 2, 3), pages, NULL), 2);
    /* Same tokens, different namespace: different nodes and different hashes. */
    assert_true(la != lb);
    assert_int_equal(rdx_node_hashes(t, la, ha, 1, &n), 0);
    assert_int_equal(rdx_node_hashes(t, lb, hb, 1, &n), 0);
    assert_memory_not_equal(ha, hb, KVT_HASH_LEN);
    struct rdx_sizes s;
    rdx_sizes(t, &s);
    assert_int_equal(s.nodes, 3);
    assert_int_equal(rdx_evict(t, 100), 8);
    assert_int_equal(get_ns(t, "lora-a", KEY(1, 2, 3), pages, NULL), 0);
    check(t);
    rdx_destroy(t);
}

static void sha256(const void *a, size_t alen, const void *b, size_t blen, uint8_t *out)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();

    assert_non_null(c);
    assert_true(EVP_DigestInit_ex(c, EVP_sha256(), NULL));
    assert_true(EVP_DigestUpdate(c, a, alen));
    assert_true(EVP_DigestUpdate(c, b, blen));
    assert_true(EVP_DigestFinal_ex(c, out, NULL));
    EVP_MD_CTX_free(c);
}

/* h_0 = SHA256("kvtier/1" || fingerprint || ns); h_i = SHA256(h_{i-1} || page tokens LE),
 * computed here independently of the library. */
static void test_hash_chain(void **state)
{
    struct recorder r = {0};
    struct rdx_tree *t = tree(2, KVT_EVICT_LRU, &r);
    uint8_t head[8 + KVT_HASH_LEN], h[KVT_HASH_LEN], got[2][KVT_HASH_LEN];
    const uint8_t le[2][8] = {{1, 0, 0, 0, 0x02, 0x01, 0, 0}, {3, 0, 0, 0, 0, 0, 0, 0x80}};
    kvt_node_ref last;
    size_t n;

    (void)state;
    put_ns(t, "t1", KEY(1, 0x102, 3, 0x80000000u), 0);
    assert_int_equal(get_ns(t, "t1", KEY(1, 0x102, 3, 0x80000000u), NULL, &last), 2);
    assert_int_equal(rdx_node_hashes(t, last, got, 2, &n), 0);
    assert_int_equal(n, 2);
    memcpy(head, "kvtier/1", 8);
    memset(head + 8, 0xab, KVT_HASH_LEN);
    sha256(head, sizeof(head), "t1", 2, h);
    sha256(h, KVT_HASH_LEN, le[0], 8, h);
    assert_memory_equal(got[0], h, KVT_HASH_LEN);
    sha256(h, KVT_HASH_LEN, le[1], 8, h);
    assert_memory_equal(got[1], h, KVT_HASH_LEN);
    rdx_destroy(t);
}

static void test_bad_input(void **state)
{
    struct recorder r = {0};
    struct rdx_config cfg = {.page_size = 3};
    struct rdx_tree *t = NULL;
    char big[RDX_NS_MAX + 1] = {0}; /* past what the tree takes */
    struct kvt_key k = {
        .tokens = (const uint32_t[]){1}, .len = 1, .ns = big, .ns_len = sizeof(big)};
    uint32_t page = 1;
    size_t n;
    kvt_node_ref last;

    (void)state;
    assert_int_equal(rdx_create(&cfg, &t), -EINVAL);
    cfg.page_size = 4;
    cfg.policy = 99;
    assert_int_equal(rdx_create(&cfg, &t), -EINVAL);
    t = tree(1, KVT_EVICT_LRU, &r);
    assert_int_equal(rdx_insert(t, &k, &page, 0, &n), -EINVAL);
    assert_int_equal(rdx_match(t, &k, NULL, &n, &last), -EINVAL);
    k.ns_len = 0;
    k.tokens = NULL;
    assert_int_equal(rdx_insert(t, &k, &page, 0, &n), -EINVAL);
    check(t);
    rdx_destroy(t);
    rdx_destroy(NULL);
}

/* ---- host copies (HiRadix) ---- */

struct tiers {
    struct recorder dev, host;
};

static void record_host(void *ctx, const uint32_t *pages, size_t n)
{
    record(&((struct tiers *)ctx)->host, pages, n);
}

static void record_dev(void *ctx, const uint32_t *pages, size_t n)
{
    record(&((struct tiers *)ctx)->dev, pages, n);
}

static struct rdx_tree *hitree(struct tiers *r)
{
    struct rdx_config cfg = {.page_size = 1,
                             .policy = KVT_EVICT_LRU,
                             .hash_pages = 1,
                             .host_tier = 1,
                             .free_pages = record_dev,
                             .free_host_pages = record_host,
                             .ctx = r};
    struct rdx_tree *t = NULL;

    assert_int_equal(rdx_create(&cfg, &t), 0);
    return t;
}

static struct rdx_hit hit_of(struct rdx_tree *t, const uint32_t *tok, size_t n, uint32_t *dev,
                             uint32_t *host)
{
    struct kvt_key k = {.tokens = tok, .len = n};
    struct rdx_hit h;

    assert_int_equal(rdx_match_tiers(t, &k, dev, host, &h), 0);
    check(t);
    return h;
}

/* Back up the chain ending at ref with host pages 500 + device page; returns the op's page
 * count. */
static size_t back_up(struct rdx_tree *t, kvt_node_ref ref, uint64_t op)
{
    uint32_t host[64], dev[64];
    size_t n = 999;

    assert_int_equal(rdx_backup_span(t, ref, &n), 0);
    for (size_t i = 0; i < n; i++)
        host[i] = 900 + (uint32_t)i;
    assert_int_equal(rdx_attach_host(t, ref, host, n, dev, op), 0);
    check(t);
    return n;
}

static void test_host_residency(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    uint32_t dev[8], host[8];
    const uint64_t op = RDX_OP_BACKUP | 1;

    (void)state;
    assert_int_equal(put(t, KEY(1, 2, 3)), 0);
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3), NULL, NULL);
    assert_int_equal(back_up(t, h.dev_last, op), 3);
    assert_dump(t, "[1,2,3] pages=[101,102,103] host=[900,901,902] lock=0\n");
    /* Being backed up: neither evictable nor backed up again. */
    assert_int_equal(rdx_evict(t, 3), 0);
    assert_int_equal(back_up(t, h.dev_last, op + 1), 0);
    assert_int_equal(rdx_op_done(t, h.dev_last, op, 0), 0);
    check(t);

    /* Device eviction keeps the node on the host. */
    assert_int_equal(rdx_evict(t, 3), 3);
    check(t);
    assert_int_equal(r.dev.n, 3);
    assert_int_equal(r.host.n, 0);
    assert_dump(t, "[1,2,3] pages=- host=[900,901,902] lock=0\n");
    h = hit_of(t, KEY(1, 2, 3, 4), dev, host);
    assert_int_equal(h.dev_pages, 0);
    assert_int_equal(h.host_pages, 3);
    assert_int_equal(host[0], 900);
    assert_int_equal(host[2], 902);
    assert_int_equal(h.dev_last, rdx_root(t));

    /* Load back into new device pages; the match sees the pending load. */
    assert_int_equal(rdx_attach_device(t, h.host_last, (const uint32_t[]){7, 8}, 2, 5), -EINVAL);
    assert_int_equal(rdx_attach_device(t, h.host_last, (const uint32_t[]){7, 8, 9}, 3, 5), 0);
    check(t);
    h = hit_of(t, KEY(1, 2, 3), dev, NULL);
    assert_int_equal(h.dev_pages, 3);
    assert_int_equal(h.pending, 5);
    assert_int_equal(dev[0], 7);
    assert_int_equal(rdx_evict(t, 3), 0); /* being filled */
    assert_int_equal(rdx_op_done(t, h.dev_last, 5, 0), 0);
    h = hit_of(t, KEY(1, 2, 3), NULL, NULL);
    assert_int_equal(h.pending, 0);

    /* Host eviction takes only host-only nodes. */
    assert_int_equal(rdx_evict_host(t, 3), 0);
    assert_int_equal(rdx_evict(t, 3), 3);
    assert_int_equal(rdx_evict_host(t, 3), 3);
    check(t);
    assert_int_equal(r.host.n, 3);
    assert_int_equal(r.host.freed[0], 900);
    assert_dump(t, "");
    rdx_destroy(t);
}

static void test_host_insert_adopts(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);

    (void)state;
    put(t, KEY(1, 2));
    struct rdx_hit h = hit_of(t, KEY(1, 2), NULL, NULL);
    back_up(t, h.dev_last, RDX_OP_BACKUP | 1);
    rdx_op_done(t, h.dev_last, RDX_OP_BACKUP | 1, 0);
    assert_int_equal(put(t, KEY(1, 2, 3, 4)), 2);
    h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    back_up(t, h.dev_last, RDX_OP_BACKUP | 2);
    rdx_op_done(t, h.dev_last, RDX_OP_BACKUP | 2, 0);
    assert_int_equal(rdx_evict(t, 4), 4);
    check(t);
    /* The host holds [1,2][3,4]; inserting [1,2,3,4,5] recomputed gives the host nodes
     * device copies from the key and adds the new page. Nothing was on the device. */
    assert_int_equal(put(t, KEY(1, 2, 3, 4, 5)), 0);
    assert_dump(t, "[1,2] pages=[101,102] host=[900,901] lock=0\n"
                   "  [3,4] pages=[103,104] host=[900,901] lock=0\n"
                   "    [5] pages=[105] lock=0\n");
    /* A key ending inside a host node splits it and adopts the first part only. */
    assert_int_equal(rdx_evict(t, 5), 5);
    assert_int_equal(put(t, KEY(1, 2, 3)), 0);
    assert_dump(t, "[1,2] pages=[101,102] host=[900,901] lock=0\n"
                   "  [3] pages=[103] host=[900] lock=0\n"
                   "    [4] pages=- host=[901] lock=0\n");
    rdx_destroy(t);
}

static void test_host_failed_backup_and_split(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    uint64_t op = RDX_OP_BACKUP | 9;

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    back_up(t, h.dev_last, op);
    /* A match splits the node being backed up; both halves stay marked. */
    struct rdx_hit half = hit_of(t, KEY(1, 2), NULL, NULL);
    assert_int_equal(half.pending, 0); /* a backup is not something a request waits for */
    assert_int_equal(rdx_evict(t, 4), 0);
    /* The op fails: the host copies it was making go, from the ref up. */
    assert_int_equal(rdx_op_done(t, h.dev_last, op, 1), 0);
    check(t);
    assert_int_equal(r.host.n, 4);
    assert_dump(t, "[1,2] pages=[101,102] lock=0\n"
                   "  [3,4] pages=[103,104] lock=0\n");
    /* Without host copies eviction deletes, leaf first. */
    assert_int_equal(rdx_evict(t, 4), 4);
    check(t);
    assert_dump(t, "");
    rdx_destroy(t);
}

/* A backup that fails takes with it the host copies made below its nodes while it ran: a
 * later backup of a child (it lands, but under a node that lost its copy) and a fill from disk
 * that landed. Host copies form a subtree at the top whatever the order of ends. */
static void test_host_failed_backup_below(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    struct kvt_key k = {.tokens = KEY(1, 2, 5, 6)};
    const uint64_t a = RDX_OP_BACKUP | 1, b = RDX_OP_BACKUP | 2, fill = RDX_OP_DISK | 1;
    kvt_node_ref leaf = 0;

    (void)state;
    put(t, KEY(1, 2));
    struct rdx_hit p = hit_of(t, KEY(1, 2), NULL, NULL);
    assert_int_equal(back_up(t, p.dev_last, a), 2);
    put(t, KEY(1, 2, 3, 4));
    struct rdx_hit c = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    assert_int_equal(back_up(t, c.dev_last, b), 2); /* [3,4] alone: [1,2] has its copy */
    assert_int_equal(
        rdx_attach_fill(t, &k, p.dev_last, 2, (const uint32_t[]){70, 71}, 2, fill, &leaf), 0);
    assert_int_equal(rdx_fill_done(t, leaf, fill, 2), 0);
    check(t);

    /* a fails: [1,2]'s copy goes, and the landed fill with it (it has no other copy here). */
    assert_int_equal(rdx_op_done(t, p.dev_last, a, 1), 0);
    check(t);
    assert_dump(t, "[1,2] pages=[101,102] lock=0\n"
                   "  [3,4] pages=[103,104] host=[900,901] lock=0\n");
    /* b lands below a node without a host copy: its copy goes too. */
    assert_int_equal(rdx_op_done(t, c.dev_last, b, 0), 0);
    check(t);
    assert_dump(t, "[1,2] pages=[101,102] lock=0\n"
                   "  [3,4] pages=[103,104] lock=0\n");
    assert_int_equal(r.host.n, 6);
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    assert_int_equal(h.host_pages, 0);
    rdx_destroy(t);
}

/* A load-back that fails gives up the device pages it filled; the parent it hung under is a
 * device leaf again, and eviction reaches it. */
static void test_host_failed_load_parent_evictable(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    const uint64_t load = 7;

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    back_up(t, h.dev_last, RDX_OP_BACKUP | 1);
    assert_int_equal(rdx_op_done(t, h.dev_last, RDX_OP_BACKUP | 1, 0), 0);
    hit_of(t, KEY(1, 2), NULL, NULL);     /* splits: [1,2] then [3,4] */
    assert_int_equal(rdx_evict(t, 2), 2); /* [3,4] leaves the device */
    h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    assert_int_equal(h.dev_pages, 2);
    assert_int_equal(h.host_pages, 2);
    assert_int_equal(rdx_attach_device(t, h.host_last, (const uint32_t[]){7, 8}, 2, load), 0);
    assert_int_equal(rdx_op_done(t, h.host_last, load, 1), 0);
    check(t);
    assert_dump(t, "[1,2] pages=[101,102] host=[900,901] lock=0\n"
                   "  [3,4] pages=- host=[902,903] lock=0\n");
    /* [1,2] has no child on the device: a device leaf, evicted on demand. */
    assert_int_equal(rdx_evict(t, 2), 2);
    check(t);
    rdx_destroy(t);
}

/* ---- the disk tier ---- */

/* Page hashes of a key from the tree agree with the hashes of the nodes holding it, from the
 * root and from a node, and a ref that does not end the key's prefix is refused. */
static void test_disk_key_hashes(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    uint8_t want[4][KVT_HASH_LEN], got[4][KVT_HASH_LEN];
    size_t n = 0;
    struct kvt_key k = {.tokens = KEY(1, 2, 3, 4)};

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    assert_int_equal(rdx_node_hashes(t, h.dev_last, want, 4, &n), 0);
    assert_int_equal(rdx_key_hashes(t, &k, rdx_root(t), 0, 4, got), 0);
    assert_memory_equal(got, want, sizeof(want));
    h = hit_of(t, KEY(1, 2), NULL, NULL); /* splits: [1,2] then [3,4] */
    assert_int_equal(rdx_key_hashes(t, &k, h.dev_last, 2, 2, got), 0);
    assert_memory_equal(got, want[2], 2 * KVT_HASH_LEN);
    assert_int_equal(rdx_key_hashes(t, &k, h.dev_last, 1, 2, got), -EINVAL);
    assert_int_equal(rdx_key_hashes(t, &k, h.dev_last, 2, 3, got), -EINVAL);
    struct kvt_key other = {.tokens = KEY(1, 9, 3, 4)};
    assert_int_equal(rdx_key_hashes(t, &other, h.dev_last, 2, 2, got), -EINVAL);
    /* Another namespace chains from another root. */
    struct kvt_key ns = {.tokens = KEY(1, 2, 3, 4), .ns = "lora", .ns_len = 4};
    assert_int_equal(rdx_key_hashes(t, &ns, rdx_root(t), 0, 4, got), 0);
    assert_memory_not_equal(got, want, KVT_HASH_LEN);
    rdx_destroy(t);
}

/* A fill from disk: a host-only leaf that is neither matched, extended nor evicted until it
 * lands; then an ordinary host node, on disk. A partial fill keeps what landed. */
static void test_disk_fill(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    struct kvt_key k = {.tokens = KEY(1, 2, 3, 4, 5, 6)};
    kvt_node_ref leaf = 0;
    const uint64_t op = RDX_OP_DISK | 1;

    (void)state;
    put(t, KEY(1, 2));
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4, 5, 6), NULL, NULL);
    const uint32_t host[] = {70, 71, 72, 73};
    /* Under a node without a host copy: refused, host copies grow from the top. */
    assert_int_equal(rdx_attach_fill(t, &k, h.host_last, 2, host, 4, op, &leaf), -EINVAL);
    back_up(t, h.dev_last, RDX_OP_BACKUP | 1);
    assert_int_equal(rdx_attach_fill(t, &k, h.host_last, 2, host, 4, 5, &leaf), -EINVAL);
    assert_int_equal(rdx_attach_fill(t, &k, h.host_last, 2, host, 4, op, &leaf), 0);
    check(t);
    assert_dump(t, "[1,2] pages=[101,102] host=[900,901] lock=0\n"
                   "  [3,4,5,6] pages=- host=[70,71,72,73] disk lock=0\n");
    assert_int_equal(rdx_attach_fill(t, &k, h.host_last, 2, host, 4, op + 1, &leaf), -EEXIST);
    h = hit_of(t, KEY(1, 2, 3, 4, 5, 6), NULL, NULL);
    assert_int_equal(h.host_pages, 0); /* not landed: not matched */
    struct kvt_key longer = {.tokens = KEY(1, 2, 3, 4, 5, 6, 7)};
    size_t pre = 0;
    uint32_t pages[7] = {0};
    assert_int_equal(rdx_insert(t, &longer, pages, 0, &pre), -EBUSY);
    assert_int_equal(rdx_evict_host(t, 4), 0);
    assert_int_equal(rdx_fill_done(t, leaf, op + 1, 4), -EINVAL);

    /* Three of four pages landed: the fourth goes with its host page. */
    assert_int_equal(rdx_fill_done(t, leaf, op, 3), 0);
    check(t);
    assert_dump(t, "[1,2] pages=[101,102] host=[900,901] lock=0\n"
                   "  [3,4,5] pages=- host=[70,71,72] disk lock=0\n");
    assert_int_equal(r.host.n, 1);
    assert_int_equal(r.host.freed[0], 73);
    h = hit_of(t, KEY(1, 2, 3, 4, 5, 6), NULL, NULL);
    assert_int_equal(h.dev_pages, 2);
    assert_int_equal(h.host_pages, 3);

    /* A fill of which nothing landed leaves nothing. */
    assert_int_equal(
        rdx_attach_fill(t, &k, h.host_last, 5, (const uint32_t[]){80}, 1, op + 2, &leaf), 0);
    assert_int_equal(rdx_fill_done(t, leaf, op + 2, 0), 0);
    check(t);
    assert_int_equal(r.host.n, 2);
    assert_int_equal(r.host.freed[1], 80);
    /* Nodes from the disk keep their hashes in the chain. */
    uint8_t want[6][KVT_HASH_LEN], got[3][KVT_HASH_LEN];
    size_t n = 0;
    assert_int_equal(rdx_key_hashes(t, &k, rdx_root(t), 0, 6, want), 0);
    assert_int_equal(rdx_node_hashes(t, h.host_last, got, 3, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(got, want[2], 3 * KVT_HASH_LEN);
    rdx_destroy(t);
}

/* A disk write covers the chain's host copies not yet on disk, top-down, holds them until it
 * is done, and marks on disk only the nodes whose every page was stored. */
static void test_disk_write(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    struct rdx_disk_page pg[8];
    const uint64_t op = RDX_OP_DISK | 1;
    size_t n = 0;

    (void)state;
    put(t, KEY(1, 2, 3, 4));
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    back_up(t, h.dev_last, RDX_OP_BACKUP | 1);
    assert_int_equal(rdx_disk_span(t, h.dev_last, &n), 0);
    assert_int_equal(n, 0); /* the backup has not landed */
    rdx_op_done(t, h.dev_last, RDX_OP_BACKUP | 1, 0);
    struct rdx_hit top = hit_of(t, KEY(1, 2), NULL, NULL); /* split: [1,2] [3,4] */
    assert_int_equal(rdx_disk_span(t, h.dev_last, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(rdx_attach_disk(t, h.dev_last, op, pg, 3), -EINVAL);
    assert_int_equal(rdx_attach_disk(t, h.dev_last, op, pg, 4), 0);
    check(t);
    uint8_t hashes[4][KVT_HASH_LEN];
    struct kvt_key k = {.tokens = KEY(1, 2, 3, 4)};
    assert_int_equal(rdx_key_hashes(t, &k, rdx_root(t), 0, 4, hashes), 0);
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(pg[i].hash, hashes[i], KVT_HASH_LEN);
        assert_int_equal(pg[i].tokens[0], (uint32_t)i + 1);
        assert_int_equal(pg[i].host_page, 900 + (uint32_t)i);
        if (i)
            assert_memory_equal(pg[i].parent, hashes[i - 1], KVT_HASH_LEN);
    }
    assert_int_equal(rdx_disk_span(t, h.dev_last, &n), 0);
    assert_int_equal(n, 0); /* being written */
    /* While written, the host copies stay even when the device copies go. */
    assert_int_equal(rdx_evict(t, 4), 4);
    assert_int_equal(rdx_evict_host(t, 4), 0);
    /* Page 3 failed: [1,2] is on disk, [3,4] is not and can be written again. */
    assert_int_equal(rdx_disk_done(t, h.dev_last, op, (const int[]){0, 0, -EIO, 0}, 3), -EINVAL);
    assert_int_equal(rdx_disk_done(t, h.dev_last, op, (const int[]){0, 0, -EIO, 0}, 4), 0);
    check(t);
    assert_dump(t, "[1,2] pages=- host=[900,901] disk lock=0\n"
                   "  [3,4] pages=- host=[902,903] lock=0\n");
    assert_int_equal(rdx_disk_span(t, h.dev_last, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(rdx_disk_span(t, top.dev_last, &n), 0);
    assert_int_equal(n, 0);

    /* Host eviction that wants disk copies first names [3,4], then [1,2] goes at once. */
    kvt_node_ref defer[4];
    size_t nd = 0;
    assert_int_equal(rdx_evict_host_written(t, 4, defer, 4, &nd), 0);
    assert_int_equal(nd, 1);
    /* The same node: its device copy went, so the ref the tree names it by now is newer. */
    assert_int_equal((uint32_t)defer[0], (uint32_t)h.dev_last);
    assert_int_equal(rdx_attach_disk(t, defer[0], op + 1, pg, 2), 0);
    assert_int_equal(rdx_disk_done(t, h.dev_last, op + 1, (const int[]){0, 0}, 2), 0);
    assert_int_equal(rdx_evict_host_written(t, 4, defer, 4, &nd), 4);
    assert_int_equal(nd, 0);
    check(t);
    assert_dump(t, "");
    rdx_destroy(t);
}

/* A store page of several pages (rdx_disk_head): the pages before a disk write's span back to
 * a multiple of the store page, from the host copies above it, top-down; -EAGAIN while one of
 * those copies has not landed. */
static void test_disk_head(void **state)
{
    struct tiers r = {0};
    struct rdx_tree *t = hitree(&r);
    struct rdx_disk_page pg[8];
    uint8_t hashes[6][KVT_HASH_LEN];
    struct kvt_key k = {.tokens = KEY(1, 2, 3, 4, 5, 6)};
    const uint64_t op = RDX_OP_DISK | 1;
    size_t n = 0, head = 99;
    uint64_t first = 99;

    (void)state;
    put(t, KEY(1, 2, 3, 4, 5, 6));
    struct rdx_hit h = hit_of(t, KEY(1, 2, 3, 4, 5, 6), NULL, NULL);
    back_up(t, h.dev_last, RDX_OP_BACKUP | 1);
    assert_int_equal(rdx_op_done(t, h.dev_last, RDX_OP_BACKUP | 1, 0), 0);
    struct rdx_hit top = hit_of(t, KEY(1, 2, 3), NULL, NULL); /* split: [1,2,3] [4,5,6] */
    assert_int_equal(rdx_attach_disk(t, top.dev_last, op, pg, 3), 0);
    assert_int_equal(rdx_disk_done(t, top.dev_last, op, (const int[]){0, 0, 0}, 3), 0);
    assert_int_equal(rdx_disk_span(t, h.dev_last, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(rdx_key_hashes(t, &k, rdx_root(t), 0, 6, hashes), 0);

    /* Store pages of 4: the span's first starts at page 0, three pages above it. */
    assert_int_equal(rdx_disk_head(t, h.dev_last, 3, 4, pg, &head, &first), 0);
    assert_int_equal(first, 3);
    assert_int_equal(head, 3);
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(pg[i].hash, hashes[i], KVT_HASH_LEN);
        assert_int_equal(pg[i].tokens[0], (uint32_t)i + 1);
        assert_int_equal(pg[i].host_page, 900 + (uint32_t)i);
        if (i)
            assert_memory_equal(pg[i].parent, hashes[i - 1], KVT_HASH_LEN);
    }
    /* Of 2: page 2 alone; of 3 or 1: none. */
    assert_int_equal(rdx_disk_head(t, h.dev_last, 3, 2, pg, &head, &first), 0);
    assert_int_equal(head, 1);
    assert_memory_equal(pg[0].hash, hashes[2], KVT_HASH_LEN);
    assert_memory_equal(pg[0].parent, hashes[1], KVT_HASH_LEN);
    assert_int_equal(rdx_disk_head(t, h.dev_last, 3, 3, pg, &head, &first), 0);
    assert_int_equal(head, 0);
    assert_int_equal(rdx_disk_head(t, h.dev_last, 3, 1, pg, &head, &first), 0);
    assert_int_equal(head, 0);
    /* A span that does not end nodes whole, or longer than the key: refused. */
    assert_int_equal(rdx_disk_head(t, h.dev_last, 4, 4, pg, &head, &first), -EINVAL);
    assert_int_equal(rdx_disk_head(t, h.dev_last, 7, 4, pg, &head, &first), -EINVAL);
    assert_int_equal(rdx_disk_head(t, h.dev_last, 3, 0, pg, &head, &first), -EINVAL);
    rdx_destroy(t);

    /* The node above still being backed up: its host copy is not all there. */
    t = hitree(&r);
    put(t, KEY(1, 2));
    struct rdx_hit up = hit_of(t, KEY(1, 2), NULL, NULL);
    back_up(t, up.dev_last, RDX_OP_BACKUP | 1);
    put(t, KEY(1, 2, 3, 4));
    h = hit_of(t, KEY(1, 2, 3, 4), NULL, NULL);
    assert_int_equal(back_up(t, h.dev_last, RDX_OP_BACKUP | 2), 2);
    assert_int_equal(rdx_op_done(t, h.dev_last, RDX_OP_BACKUP | 2, 0), 0);
    assert_int_equal(rdx_disk_span(t, h.dev_last, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(rdx_disk_head(t, h.dev_last, 2, 4, pg, &head, &first), -EAGAIN);
    assert_int_equal(head, 0);
    assert_int_equal(first, 2);
    assert_int_equal(rdx_op_done(t, up.dev_last, RDX_OP_BACKUP | 1, 0), 0);
    assert_int_equal(rdx_disk_head(t, h.dev_last, 2, 4, pg, &head, &first), 0);
    assert_int_equal(head, 2);
    rdx_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_insert_sequence),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_locks),
        cmocka_unit_test(test_lock_across_split),
        cmocka_unit_test(test_unlock_only_own),
        cmocka_unit_test(test_eviction_policies),
        cmocka_unit_test(test_evict_parents),
        cmocka_unit_test(test_namespaces),
        cmocka_unit_test(test_hash_chain),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_host_residency),
        cmocka_unit_test(test_host_insert_adopts),
        cmocka_unit_test(test_host_failed_backup_and_split),
        cmocka_unit_test(test_host_failed_backup_below),
        cmocka_unit_test(test_host_failed_load_parent_evictable),
        cmocka_unit_test(test_disk_key_hashes),
        cmocka_unit_test(test_disk_fill),
        cmocka_unit_test(test_disk_write),
        cmocka_unit_test(test_disk_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
