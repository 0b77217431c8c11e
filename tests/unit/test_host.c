/* Host tier: the pinned host pool's layouts, its page allocator, and sizing refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "host/host_pool.h"

#define NPAGES 5
#define PAGE_SIZE 4

static const struct kvt_geometry mha = {
    .attention = KVT_ATTN_MHA, .layers = 3, .kv_heads = 2, .head_dim = 8, .dtype_bytes = 2};
static const struct kvt_geometry mha_v = {.attention = KVT_ATTN_MHA,
                                          .layers = 3,
                                          .kv_heads = 2,
                                          .head_dim = 8,
                                          .v_head_dim = 4,
                                          .dtype_bytes = 2};
static const struct kvt_geometry mla = {.attention = KVT_ATTN_MLA,
                                        .layers = 3,
                                        .kv_lora_rank = 6,
                                        .qk_rope_head_dim = 2,
                                        .dtype_bytes = 2};
static const struct kvt_geometry llama8b = {
    .attention = KVT_ATTN_MHA, .layers = 32, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2};

/* ---- layouts ---- */

/* Where the header says a page's rows lie, computed independently of host_pool_rows. */
static size_t expected_offset(const struct host_pool *hp, uint32_t page, uint32_t layer, int which)
{
    size_t ps = hp->page_size, r0 = hp->row[0], r1 = hp->row[1];

    if (hp->layout == HOST_PAGE_FIRST)
        return page * hp->page_bytes + layer * ps * (r0 + r1) + (which ? ps * r0 : 0);
    return layer * hp->npages * ps * (r0 + r1) + (which ? hp->npages * ps * r0 : 0) +
           page * ps * hp->row[which];
}

static int region_id(const struct host_pool *hp, uint32_t page, uint32_t layer, int which)
{
    return (int)((page * hp->layers + layer) * 2 + (uint32_t)which) + 1;
}

static uint8_t pattern(int id, size_t k)
{
    return (uint8_t)(id * 37 + k * 13 + 1);
}

/* Claim the bytes of one region in owner[] (none may be claimed yet) and fill it. */
static void claim_region(const struct host_pool *hp, int *owner, uint32_t page, uint32_t layer,
                         int which)
{
    uint8_t *r = host_pool_rows(hp, page, layer, which);
    size_t len = hp->page_size * hp->row[which], off = (size_t)(r - hp->base);
    int id = region_id(hp, page, layer, which);

    assert_int_equal(off, expected_offset(hp, page, layer, which));
    assert_true(off + len <= hp->bytes);
    for (size_t k = 0; k < len; k++) {
        assert_int_equal(owner[off + k], 0);
        owner[off + k] = id;
        r[k] = pattern(id, k);
    }
}

static void check_region(const struct host_pool *hp, uint32_t page, uint32_t layer, int which)
{
    const uint8_t *r = host_pool_rows(hp, page, layer, which);
    int id = region_id(hp, page, layer, which);

    for (size_t k = 0; k < hp->page_size * hp->row[which]; k++)
        assert_int_equal(r[k], pattern(id, k));
}

static int page_of_id(const struct host_pool *hp, int id)
{
    return (id - 1) / 2 / (int)hp->layers;
}

static void check_tiling(const struct kvt_geometry *g, uint32_t layout)
{
    struct host_pool hp;
    int nwhich = g->attention == KVT_ATTN_MLA ? 1 : 2;

    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, g, PAGE_SIZE, NPAGES, layout), 0);
    assert_int_equal(hp.page_bytes, (size_t)PAGE_SIZE * g->layers * (hp.row[0] + hp.row[1]));
    assert_int_equal(hp.bytes, NPAGES * hp.page_bytes);
    assert_int_equal(hp.row[1] == 0, nwhich == 1);
    int *owner = calloc(hp.bytes, sizeof(int));
    assert_non_null(owner);
    for (uint32_t p = 0; p < NPAGES; p++)
        for (uint32_t l = 0; l < g->layers; l++)
            for (int w = 0; w < nwhich; w++)
                claim_region(&hp, owner, p, l, w);
    for (size_t o = 0; o < hp.bytes; o++) {
        assert_int_not_equal(owner[o], 0); /* the regions tile the pool: no byte unused */
        if (layout == HOST_PAGE_FIRST)     /* a page is one run of page_bytes */
            assert_int_equal(page_of_id(&hp, owner[o]), o / hp.page_bytes);
    }
    for (uint32_t p = 0; p < NPAGES; p++)
        for (uint32_t l = 0; l < g->layers; l++)
            for (int w = 0; w < nwhich; w++)
                check_region(&hp, p, l, w);
    free(owner);
    host_pool_finish(&hp);
}

static void test_layout_tiles(void **state)
{
    const struct kvt_geometry *geos[] = {&mha, &mha_v, &mla};
    const uint32_t layouts[] = {HOST_PAGE_FIRST, HOST_LAYER_FIRST};

    (void)state;
    for (size_t l = 0; l < 2; l++)
        for (size_t g = 0; g < 3; g++)
            check_tiling(geos[g], layouts[l]);
}

static void test_row_bytes(void **state)
{
    struct host_pool hp;

    (void)state;
    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, &mha_v, 16, 2, HOST_PAGE_FIRST), 0);
    assert_int_equal(hp.row[0], 2 * 8 * 2);
    assert_int_equal(hp.row[1], 2 * 4 * 2);
    assert_int_equal(hp.page_bytes, 16 * 3 * (32 + 16));
    host_pool_finish(&hp);
    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, &llama8b, 16, 1, HOST_LAYER_FIRST), 0);
    assert_int_equal(hp.page_bytes, 16 * 131072); /* 128 KiB per token over all layers */
    host_pool_finish(&hp);
}

/* ---- allocator ---- */

#define ASSERT_PAGES(got, ...)                                                                     \
    do {                                                                                           \
        const uint32_t want_[] = {__VA_ARGS__};                                                    \
        assert_memory_equal(got, want_, sizeof(want_));                                            \
    } while (0)

static void init_small(struct host_pool *hp, uint64_t npages)
{
    assert_int_equal(host_pool_init(hp, &dev_backend_sim, &mha, PAGE_SIZE, npages, 0), 0);
}

static void test_alloc_order(void **state)
{
    struct host_pool hp;
    uint32_t p[8];

    (void)state;
    init_small(&hp, 8);
    assert_int_equal(host_available(&hp), 8);
    assert_int_equal(host_alloc(&hp, 3, p), 0);
    ASSERT_PAGES(p, 0, 1, 2);
    assert_int_equal(host_alloc(&hp, 2, p), 0);
    ASSERT_PAGES(p, 3, 4);
    assert_int_equal(host_available(&hp), 3);
    assert_int_equal(host_alloc(&hp, 0, p), 0);
    assert_int_equal(host_alloc(&hp, 0, NULL), 0);
    assert_int_equal(host_available(&hp), 3);
    /* Freed pages are reused first, in the order they were given back. */
    const uint32_t back[] = {3, 1};
    assert_int_equal(host_free(&hp, back, 2), 0);
    assert_int_equal(host_available(&hp), 5);
    assert_int_equal(host_alloc(&hp, 4, p), 0);
    ASSERT_PAGES(p, 3, 1, 5, 6);
    host_pool_finish(&hp);
}

/* The allocator's whole state, to show a failed call changed nothing. */
struct snapshot {
    uint8_t state[16];
    uint32_t free[16];
    uint32_t nfree;
};

static void snap(const struct host_pool *hp, struct snapshot *s)
{
    memset(s, 0, sizeof(*s));
    memcpy(s->state, hp->state, hp->npages);
    memcpy(s->free, hp->free, hp->nfree * sizeof(uint32_t));
    s->nfree = hp->nfree;
}

static void assert_unchanged(const struct host_pool *hp, const struct snapshot *before)
{
    struct snapshot now;

    snap(hp, &now);
    assert_memory_equal(&now, before, sizeof(now));
}

static void test_alloc_enomem(void **state)
{
    struct host_pool hp;
    struct snapshot s;
    uint32_t p[16];

    (void)state;
    init_small(&hp, 8);
    assert_int_equal(host_alloc(&hp, 3, p), 0);
    snap(&hp, &s);
    assert_int_equal(host_alloc(&hp, 6, p), -ENOMEM);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_alloc(&hp, SIZE_MAX, p), -ENOMEM);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_alloc(&hp, 1, NULL), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_alloc(&hp, 5, p), 0);
    ASSERT_PAGES(p, 3, 4, 5, 6, 7);
    assert_int_equal(host_available(&hp), 0);
    snap(&hp, &s);
    assert_int_equal(host_alloc(&hp, 1, p), -ENOMEM);
    assert_unchanged(&hp, &s);
    host_pool_finish(&hp);
}

static void test_free_errors(void **state)
{
    struct host_pool hp;
    struct snapshot s;
    uint32_t p[8];

    (void)state;
    init_small(&hp, 8);
    assert_int_equal(host_alloc(&hp, 4, p), 0); /* 0..3 held, 4..7 free */
    snap(&hp, &s);
    /* Each bad list has good pages before the bad one: none of them may be freed. */
    const uint32_t free_page[] = {0, 1, 5};
    const uint32_t out_of_range[] = {0, 2, 8};
    const uint32_t far_out[] = {3, UINT32_MAX};
    const uint32_t twice[] = {0, 1, 2, 1};
    const uint32_t twice_adjacent[] = {3, 3};
    assert_int_equal(host_free(&hp, free_page, 3), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_free(&hp, out_of_range, 3), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_free(&hp, far_out, 2), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_free(&hp, twice, 4), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_free(&hp, twice_adjacent, 2), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_free(&hp, NULL, 1), -EINVAL);
    assert_unchanged(&hp, &s);
    assert_int_equal(host_free(&hp, NULL, 0), 0);
    assert_unchanged(&hp, &s);
    /* The pages are still held: freeing them all works, and a second time does not. */
    assert_int_equal(host_free(&hp, p, 4), 0);
    assert_int_equal(host_available(&hp), 8);
    assert_int_equal(host_free(&hp, p, 1), -EINVAL);
    host_pool_finish(&hp);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every page is either held by the test or on the free stack, exactly once. */
static void check_model(const struct host_pool *hp, const uint8_t *held, size_t nheld)
{
    uint8_t seen[64] = {0};

    assert_int_equal(host_available(hp), hp->npages - nheld);
    for (uint32_t i = 0; i < hp->nfree; i++) {
        uint32_t p = hp->free[i];
        assert_true(p < hp->npages && !held[p] && !seen[p]);
        seen[p] = 1;
    }
    for (uint32_t p = 0; p < hp->npages; p++)
        assert_int_equal(hp->state[p], held[p] ? HOST_PAGE_USED : HOST_PAGE_FREE);
}

static size_t random_free(struct host_pool *hp, uint64_t *rng, uint8_t *held, uint32_t *list,
                          size_t nheld)
{
    uint32_t give[64];
    size_t k = xorshift(rng) % (nheld + 1);

    for (size_t i = 0; i < k; i++) { /* k distinct picks: swap each to the end of list */
        size_t j = xorshift(rng) % (nheld - i);
        give[i] = list[j];
        list[j] = list[nheld - i - 1];
        list[nheld - i - 1] = give[i];
        held[give[i]] = 0;
    }
    assert_int_equal(host_free(hp, give, k), 0);
    return nheld - k;
}

static size_t random_alloc(struct host_pool *hp, uint64_t *rng, uint8_t *held, uint32_t *list,
                           size_t nheld)
{
    uint32_t got[64];
    size_t k = xorshift(rng) % 9;

    if (k > hp->npages - nheld) {
        assert_int_equal(host_alloc(hp, k, got), -ENOMEM);
        return nheld;
    }
    assert_int_equal(host_alloc(hp, k, got), 0);
    for (size_t i = 0; i < k; i++) {
        assert_true(got[i] < hp->npages);
        assert_int_equal(held[got[i]], 0);
        held[got[i]] = 1;
        list[nheld++] = got[i];
    }
    return nheld;
}

static void test_round_trips(void **state)
{
    struct host_pool hp;
    uint8_t held[64] = {0};
    uint32_t list[64];
    size_t nheld = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;

    (void)state;
    init_small(&hp, 64);
    for (int step = 0; step < 5000; step++) {
        if (xorshift(&rng) % 2)
            nheld = random_alloc(&hp, &rng, held, list, nheld);
        else
            nheld = random_free(&hp, &rng, held, list, nheld);
        check_model(&hp, held, nheld);
    }
    assert_int_equal(host_free(&hp, list, nheld), 0);
    assert_int_equal(host_available(&hp), 64);
    host_pool_finish(&hp);
}

/* ---- sizing and errors ---- */

static double seconds_since(const struct timespec *t0)
{
    struct timespec t1;

    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* 2^31 pages of Llama-3-8B at 16 tokens a page is 4 PiB: refused from the sizes alone,
 * without mapping it or allocating the 10 GiB its allocator would take. */
static void test_ehostram(void **state)
{
    struct host_pool hp;
    struct timespec t0;

    (void)state;
    assert_true(host_memory_available() > 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, &llama8b, 16, 1ull << 31, 0),
                     KVT_EHOSTRAM);
    assert_true(seconds_since(&t0) < 1.0);
    assert_null(hp.base);
    assert_null(hp.state);
    assert_null(hp.free);
    host_pool_finish(&hp);
    /* The same with the other layout and twice what is available (room for it to move). */
    uint64_t pages = host_memory_available() / (16 * 131072) * 2 + 1;
    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, &llama8b, 16, pages, 1), KVT_EHOSTRAM);
    assert_null(hp.base);
}

static void expect_einval(const struct kvt_geometry *g, uint32_t page_size, uint64_t npages,
                          uint32_t layout)
{
    struct host_pool hp;

    memset(&hp, 0xa5, sizeof(hp)); /* init must not rely on a zeroed struct */
    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, g, page_size, npages, layout), -EINVAL);
    assert_null(hp.base);
    host_pool_finish(&hp); /* safe after a failed init */
}

static void test_init_einval(void **state)
{
    struct host_pool hp;
    struct kvt_geometry bad;

    (void)state;
    expect_einval(&mha, PAGE_SIZE, 0, 0);
    expect_einval(&mha, PAGE_SIZE, UINT32_MAX, 0);
    expect_einval(&mha, PAGE_SIZE, 1ull << 32, 0);
    expect_einval(&mha, PAGE_SIZE, UINT64_MAX, 0);
    expect_einval(&mha, 0, 4, 0);
    expect_einval(&mha, PAGE_SIZE, 4, 2);
    expect_einval(&mha, PAGE_SIZE, 4, UINT32_MAX);
    expect_einval(NULL, PAGE_SIZE, 4, 0);
    bad = mha;
    bad.layers = 0;
    expect_einval(&bad, PAGE_SIZE, 4, 0);
    bad = mha;
    bad.dtype_bytes = 3;
    expect_einval(&bad, PAGE_SIZE, 4, 0);
    bad = mha;
    bad.kv_lora_rank = 4; /* an MLA field on an MHA geometry */
    expect_einval(&bad, PAGE_SIZE, 4, 0);
    bad = mla;
    bad.attention = 2;
    expect_einval(&bad, PAGE_SIZE, 4, 0);
    /* Sizes past size_t: a page of 2^78 bytes; then pages of 2^63 bytes, two of them. */
    struct kvt_geometry huge = {.attention = KVT_ATTN_MHA,
                                .layers = 4096,
                                .kv_heads = 65536,
                                .head_dim = 65536,
                                .dtype_bytes = 4};
    expect_einval(&huge, 1u << 31, 1, 0);
    expect_einval(&huge, 1u << 16, 2, 1);
    assert_int_equal(host_pool_init(&hp, NULL, &mha, PAGE_SIZE, 4, 0), -EINVAL);
    assert_int_equal(host_pool_init(NULL, &dev_backend_sim, &mha, PAGE_SIZE, 4, 0), -EINVAL);
}

static void test_memory_available(void **state)
{
    uint64_t avail = host_memory_available();
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);

    (void)state;
    assert_true(avail > 0);
    assert_true(avail <= phys);
}

static void test_finish_twice(void **state)
{
    struct host_pool hp, zero;

    (void)state;
    memset(&zero, 0, sizeof(zero));
    host_pool_finish(&zero);
    init_small(&hp, 4);
    host_pool_finish(&hp);
    assert_null(hp.base);
    assert_int_equal(host_available(&hp), 0);
    host_pool_finish(&hp);
}

/* The VmFlags line of the mapping holding p in /proc/self/smaps, into flags; 0 or -1. */
static int vm_flags(const void *p, char *flags, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, rc = -1;

    while (f && rc && fgets(line, sizeof(line), f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            size_t n = strlen(line + 8);
            if (n >= len)
                n = len - 1;
            memcpy(flags, line + 8, n);
            flags[n] = 0;
            rc = 0;
        }
    }
    if (f)
        fclose(f);
    return rc;
}

/* The pool asks for huge pages (MADV_HUGEPAGE: smaps shows "hg"), so a page of KV is one
 * DMA segment of a disk I/O, not one per 4 KiB; where the kernel has no transparent huge
 * pages there is nothing to ask. */
static void test_huge_pages_asked(void **state)
{
    struct host_pool hp;
    char flags[256];

    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK)) {
        skip(); /* a kernel without THP */
        return;
    }
    init_small(&hp, 64);
    assert_int_equal(vm_flags(hp.base, flags, sizeof(flags)), 0);
    if (!strstr(flags, " hg"))
        fail_msg("the host pool's mapping has no MADV_HUGEPAGE: VmFlags%s", flags);
    host_pool_finish(&hp);
}

/* ---- pinning ---- */

static int register_calls, unregister_calls, register_fails;
static void *registered;
static size_t registered_bytes;

static int fake_register(void *ptr, size_t bytes)
{
    register_calls++;
    if (register_fails)
        return KVT_EBACKEND;
    registered = ptr;
    registered_bytes = bytes;
    return 0;
}

static void fake_unregister(void *ptr)
{
    unregister_calls++;
    assert_ptr_equal(ptr, registered);
    registered = NULL;
}

/* A backend with a host_register step (cuda's cudaHostRegister) gets the whole mapping
 * registered, and unregistered at finish; its failure fails init and unmaps. */
static void test_host_register(void **state)
{
    struct dev_backend fake = dev_backend_sim;
    struct host_pool hp;

    (void)state;
    fake.host_register = fake_register;
    fake.host_unregister = fake_unregister;
    assert_int_equal(host_pool_init(&hp, &fake, &mha, PAGE_SIZE, 4, 0), 0);
    assert_int_equal(register_calls, 1);
    assert_ptr_equal(registered, hp.base);
    assert_int_equal(registered_bytes, hp.bytes);
    assert_true(hp.pinned);
    host_pool_finish(&hp);
    assert_int_equal(unregister_calls, 1);
    assert_null(registered);

    register_fails = 1;
    assert_int_equal(host_pool_init(&hp, &fake, &mha, PAGE_SIZE, 4, 0), KVT_EBACKEND);
    assert_int_equal(register_calls, 2);
    assert_int_equal(unregister_calls, 1);
    assert_null(hp.base);
    host_pool_finish(&hp);
    register_fails = 0;
}

/* Turn CAP_IPC_LOCK, under which mlock ignores RLIMIT_MEMLOCK, on or off in the effective
 * set (it stays permitted, so it can come back). Returns whether it is now in effect. */
static int set_ipc_lock(int on)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2];

    if (syscall(SYS_capget, &hdr, data))
        return 0;
    if (on)
        data[0].effective |= (data[0].permitted & (1u << CAP_IPC_LOCK));
    else
        data[0].effective &= ~(1u << CAP_IPC_LOCK);
    syscall(SYS_capset, &hdr, data);
    syscall(SYS_capget, &hdr, data);
    return (data[0].effective >> CAP_IPC_LOCK) & 1;
}

/* Whether mlock succeeds now: not under a zero RLIMIT_MEMLOCK without CAP_IPC_LOCK, except
 * where a sanitizer turns mlock into a no-op that succeeds. */
static bool mlock_works(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bool ok;

    assert_true(p != MAP_FAILED);
    ok = mlock(p, 4096) == 0;
    munmap(p, 4096);
    return ok;
}

/* On sim the pool is mlock'ed when RLIMIT_MEMLOCK allows, and works unpinned when not. */
static void test_mlock(void **state)
{
    struct host_pool hp;
    struct rlimit saved, none;

    (void)state;
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &saved), 0);
    init_small(&hp, 4);
    if (saved.rlim_cur == RLIM_INFINITY || saved.rlim_cur >= (1u << 20) || set_ipc_lock(1))
        assert_true(hp.pinned);
    host_pool_finish(&hp);

    none = saved;
    none.rlim_cur = 0;
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &none), 0);
    int had_cap = set_ipc_lock(1);
    set_ipc_lock(0);
    init_small(&hp, 4);
    assert_int_equal(hp.pinned, mlock_works());
    memset(host_pool_rows(&hp, 3, 2, 1), 0x5a, PAGE_SIZE * hp.row[1]); /* usable all the same */
    host_pool_finish(&hp);
    set_ipc_lock(had_cap);
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &saved), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_tiles),     cmocka_unit_test(test_row_bytes),
        cmocka_unit_test(test_alloc_order),      cmocka_unit_test(test_alloc_enomem),
        cmocka_unit_test(test_free_errors),      cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_ehostram),         cmocka_unit_test(test_init_einval),
        cmocka_unit_test(test_memory_available), cmocka_unit_test(test_finish_twice),
        cmocka_unit_test(test_host_register),    cmocka_unit_test(test_mlock),
        cmocka_unit_test(test_huge_pages_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
