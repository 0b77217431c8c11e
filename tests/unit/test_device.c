/* Device tier: slot allocators, KV pool, request pool, sizing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "device/alloc.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/req_pool.h"

#define ASSERT_SLOTS(got, ...)                                                                     \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        assert_memory_equal(got, want_, sizeof(want_));                                            \
    } while (0)

static void test_alloc_basics(void **state)
{
    struct slot_alloc a;
    int32_t s[64];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 32, 4), 0);
    assert_int_equal(slot_available(&a), 32);
    /* Page 0 is the padding page: the first page handed out is page 1 (slots 4..7). */
    assert_int_equal(slot_alloc(&a, 8, s), 0);
    ASSERT_SLOTS(s, 4, 5, 6, 7, 8, 9, 10, 11);
    assert_int_equal(slot_available(&a), 24);
    assert_int_equal(slot_alloc(&a, 0, s), 0); /* zero whole pages: nothing */
    assert_int_equal(slot_alloc(&a, 0, NULL), 0);
    assert_int_equal(slot_available(&a), 24);
    assert_int_equal(slot_alloc(&a, 6, s), -EINVAL); /* not whole pages */
    assert_int_equal(slot_alloc(&a, 4, NULL), -EINVAL);
    assert_int_equal(slot_alloc(&a, 28, s), -ENOMEM);
    assert_int_equal(slot_available(&a), 24);
    assert_int_equal(slot_alloc(&a, 24, s), 0);
    assert_int_equal(slot_available(&a), 0);
    assert_int_equal(slot_alloc(&a, 4, s), -ENOMEM);
    slot_alloc_clear(&a);
    assert_int_equal(slot_available(&a), 32);
    slot_alloc_finish(&a);

    assert_int_equal(slot_alloc_init(&a, 32, 3), -EINVAL);
    assert_int_equal(slot_alloc_init(&a, 3, 4), -EINVAL);
}

/* The free list as SGLang keeps it: the paged allocator returns pages to the front in
 * ascending order, the token allocator appends them in the order given. */
static void test_free_list_example(void **state)
{
    struct slot_alloc a;
    int32_t s[32];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 32, 4), 0);
    assert_int_equal(slot_alloc(&a, 12, s), 0); /* pages 1, 2, 3 */
    const int32_t back[] = {12, 13, 14, 15, 4, 5, 6, 7};
    assert_int_equal(slot_free(&a, back, 8), 0); /* pages 3 and 1 */
    assert_int_equal(slot_alloc(&a, 12, s), 0);
    ASSERT_SLOTS(s, 4, 5, 6, 7, 12, 13, 14, 15, 16, 17, 18, 19); /* 1, 3, then 4 */
    slot_alloc_finish(&a);

    assert_int_equal(slot_alloc_init(&a, 8, 1), 0);
    assert_int_equal(slot_alloc(&a, 4, s), 0);
    ASSERT_SLOTS(s, 1, 2, 3, 4);
    const int32_t back1[] = {3, 1};
    assert_int_equal(slot_free(&a, back1, 2), 0);
    assert_int_equal(slot_alloc(&a, 6, s), 0);
    ASSERT_SLOTS(s, 5, 6, 7, 8, 3, 1);
    slot_alloc_finish(&a);
}

static void test_free_errors(void **state)
{
    struct slot_alloc a;
    int32_t s[16];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 32, 4), 0);
    assert_int_equal(slot_alloc(&a, 8, s), 0); /* 4..11 */
    /* Any slot of a page frees the page, once. */
    const int32_t same_page[] = {5, 6, 5};
    assert_int_equal(slot_free(&a, same_page, 3), 0);
    assert_int_equal(slot_available(&a), 28);
    assert_int_equal(slot_free(&a, same_page, 1), -EINVAL); /* double free */
    const int32_t pad[] = {1}, far[] = {400}, neg[] = {-3};
    assert_int_equal(slot_free(&a, pad, 1), -EINVAL);
    assert_int_equal(slot_free(&a, far, 1), -EINVAL);
    assert_int_equal(slot_free(&a, neg, 1), -EINVAL);
    /* One bad slot rejects the whole call: page 2 stays allocated. */
    const int32_t mixed[] = {8, 4};
    assert_int_equal(slot_free(&a, mixed, 2), -EINVAL);
    assert_int_equal(slot_available(&a), 28);
    assert_int_equal(slot_free(&a, NULL, 0), 0);
    assert_int_equal(slot_free(&a, mixed, 1), 0);
    assert_int_equal(slot_available(&a), 32);
    slot_alloc_finish(&a);
}

static void test_free_group(void **state)
{
    struct slot_alloc a;
    int32_t s[16];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 16, 4), 0);
    assert_int_equal(slot_alloc(&a, 12, s), 0);
    assert_int_equal(slot_free_group_end(&a), -EINVAL);
    assert_int_equal(slot_free_group_begin(&a), 0);
    assert_int_equal(slot_free_group_begin(&a), -EINVAL);
    assert_int_equal(slot_free(&a, s + 8, 4), 0);
    assert_int_equal(slot_free(&a, s, 4), 0);
    assert_int_equal(slot_free(&a, s, 1), -EINVAL); /* already pending */
    assert_int_equal(slot_available(&a), 4);        /* held back until the group ends */
    assert_int_equal(slot_free_group_end(&a), 0);
    assert_int_equal(slot_available(&a), 12);
    assert_int_equal(slot_alloc(&a, 8, s), 0);
    ASSERT_SLOTS(s, 4, 5, 6, 7, 12, 13, 14, 15);
    slot_alloc_finish(&a);
}

/* The alloc_extend example: page_size 4, a request of 6 tokens extended by 7. Its prefix
 * holds page 1 and half of page 2 (last_loc 9); the 7 new tokens fill the old partial page
 * (10, 11), one whole new page (page 3) and one token of a new partial page (page 4). */
static void test_alloc_extend_example(void **state)
{
    struct slot_alloc a;
    int32_t first[6], out[7];
    uint32_t pre = 0, seq = 6;
    int32_t none = -1;

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 64, 4), 0);
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &seq, &none, first, 6), 0);
    ASSERT_SLOTS(first, 4, 5, 6, 7, 8, 9);
    pre = 6;
    seq = 13;
    int32_t last = first[5];
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &seq, &last, out, 7), 0);
    ASSERT_SLOTS(out, 10, 11, 12, 13, 14, 15, 16);
    assert_int_equal(slot_available(&a), 64 - 16);
    slot_alloc_finish(&a);
}

/* A batch: new pages are taken from the free list in request order. */
static void test_alloc_extend_batch(void **state)
{
    struct slot_alloc a;
    int32_t s[8], out[32];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 64, 4), 0);
    assert_int_equal(slot_alloc(&a, 8, s), 0); /* pages 1, 2 */
    const int32_t back[] = {8};
    assert_int_equal(slot_free(&a, back, 1), 0); /* free list: 2, 3, 4, ... */
    /* r0: 2 tokens on page 1 (last_loc 5) -> 11 tokens; r1: empty -> 5 tokens;
     * r2: 4 tokens (a full page, last_loc 7) -> 5. */
    uint32_t pre[] = {2, 0, 4}, seq[] = {11, 5, 5};
    int32_t last[] = {5, -1, 7};
    assert_int_equal(slot_alloc_extend(&a, 3, pre, seq, last, out, 9 + 5 + 1), 0);
    ASSERT_SLOTS(out, 6, 7, 8, 9, 10, 11, 12, 13, 14, /* r0: 6,7 then page 2, page 3 */
                 16, 17, 18, 19, 20,                  /* r1: page 4, then page 5 */
                 24);                                 /* r2: page 6 */
    slot_alloc_finish(&a);
}

static void test_alloc_extend_errors(void **state)
{
    struct slot_alloc a;
    int32_t s[8], out[64];
    uint32_t pre = 2, seq = 11;
    int32_t last = 5;

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 16, 4), 0);
    assert_int_equal(slot_alloc(&a, 4, s), 0); /* page 1 */
    int32_t bad_last = 6;                      /* (6 + 1) % 4 != 2 */
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &seq, &bad_last, out, 9), -EINVAL);
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &seq, &last, out, 8), -EINVAL);
    assert_int_equal(slot_alloc_extend(&a, 0, &pre, &seq, &last, out, 9), -EINVAL);
    assert_int_equal(slot_alloc_extend(&a, 0, NULL, NULL, NULL, NULL, 0), 0); /* nothing */
    assert_int_equal(slot_available(&a), 12);
    uint32_t short_seq = 2;
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &short_seq, &last, out, 0), -EINVAL);
    int32_t foreign = 9; /* a partial page the caller does not hold */
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &seq, &foreign, out, 9), -EINVAL);
    /* 3 pages free, 3 needed for 2 -> 16: fits; 2 -> 17 would need 4: nothing changes. */
    int32_t huge = INT32_MAX, padding = 3;
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &seq, &huge, out, 9), -EINVAL);
    uint32_t aligned = 4, empty = 0, after = 5;
    assert_int_equal(slot_alloc_extend(&a, 1, &aligned, &after, &padding, out, 1), -EINVAL);
    assert_int_equal(slot_alloc_extend(&a, 1, &empty, &after, &padding, out, 5), -EINVAL);
    uint32_t big = 17;
    assert_int_equal(slot_alloc_extend(&a, 1, &pre, &big, &last, out, 15), -ENOMEM);
    assert_int_equal(slot_available(&a), 12);
    assert_int_equal(slot_alloc(&a, 4, s), 0);
    ASSERT_SLOTS(s, 8, 9, 10, 11); /* the free list is as it was */
    slot_alloc_finish(&a);
}

static void test_alloc_decode(void **state)
{
    struct slot_alloc a;
    int32_t s[8], out[3];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 16, 4), 0);
    assert_int_equal(slot_alloc(&a, 8, s), 0); /* pages 1, 2 */
    /* r0 has 2 tokens (last 5): token 3 goes to 6. r1 has 4 (last 11): a new page. r2 has
     * none: a new page. */
    uint32_t seq[] = {3, 5, 1};
    int32_t last[] = {5, 11, -1};
    assert_int_equal(slot_alloc_decode(&a, 3, seq, last, out), 0);
    ASSERT_SLOTS(out, 6, 12, 16);
    assert_int_equal(slot_available(&a), 0);
    assert_int_equal(slot_alloc_decode(&a, 1, &seq[1], &last[1], out), -ENOMEM);
    int32_t bad = 4;
    assert_int_equal(slot_alloc_decode(&a, 1, &seq[0], &bad, out), -EINVAL);
    uint32_t zero = 0;
    assert_int_equal(slot_alloc_decode(&a, 1, &zero, &last[2], out), -EINVAL);
    assert_int_equal(slot_alloc_decode(&a, 0, NULL, NULL, NULL), 0); /* nothing to do */
    slot_alloc_finish(&a);
}

static void test_ownership(void **state)
{
    struct slot_alloc a;
    int32_t s[8];
    uint32_t pages[2];

    (void)state;
    assert_int_equal(slot_alloc_init(&a, 16, 4), 0);
    assert_int_equal(slot_alloc(&a, 8, s), 0);
    assert_int_equal(slot_pages_of(&a, s, 8, pages), 0);
    assert_int_equal(pages[0], 1);
    assert_int_equal(pages[1], 2);
    int32_t torn[] = {4, 5, 7, 6};
    assert_int_equal(slot_pages_of(&a, torn, 4, pages), -EINVAL);
    int32_t shifted[] = {5, 6, 7, 8};
    assert_int_equal(slot_pages_of(&a, shifted, 4, pages), -EINVAL);
    assert_int_equal(slot_pages_of(&a, s, 6, pages), -EINVAL);

    uint32_t twice[] = {1, 1};
    assert_int_equal(slot_claim(&a, twice, 2), -EINVAL);
    assert_true(slot_all_in_state(&a, s, 8, PAGE_USED)); /* rolled back */
    uint32_t both[] = {1, 2};
    assert_int_equal(slot_claim(&a, both, 2), 0);
    assert_int_equal(slot_free(&a, s, 4), -EINVAL); /* cached pages are not the caller's */
    slot_release_cached(&a, both, 1);
    assert_int_equal(slot_available(&a), 12);
    slot_unclaim(&a, both + 1, 1);
    assert_int_equal(slot_free(&a, s + 4, 4), 0);
    assert_int_equal(slot_available(&a), 16);
    slot_alloc_finish(&a);
}

/* Rows of 16 bytes of K and 8 of V. */
static const struct kvt_geometry small_mha = {.attention = KVT_ATTN_MHA,
                                              .layers = 2,
                                              .kv_heads = 2,
                                              .head_dim = 4,
                                              .v_head_dim = 2,
                                              .dtype_bytes = 2};

static void test_kv_pool(void **state)
{
    struct kvt_geometry mha = small_mha;
    struct kvt_geometry mla = {.attention = KVT_ATTN_MLA,
                               .layers = 3,
                               .kv_lora_rank = 8,
                               .qk_rope_head_dim = 4,
                               .dtype_bytes = 1};
    struct kv_pool p;
    uint8_t k[4 * 16], v[4 * 8], back_k[4 * 16], back_v[4 * 8];
    const int32_t slots[] = {9, 4, 5, 6};

    (void)state;
    assert_int_equal(kv_row_bytes(&mha, 0), 16);
    assert_int_equal(kv_row_bytes(&mha, 1), 8);
    assert_int_equal(kv_row_bytes(&mla, 0), 12);
    assert_int_equal(kv_row_bytes(&mla, 1), 0);
    assert_int_equal(kv_pool_init(&p, &dev_backend_sim, &mha, 12), 0);
    assert_int_equal(kv_pool_bytes(&p), 12 * (16 + 8) * 2);
    for (size_t i = 0; i < sizeof(k); i++)
        k[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(v); i++)
        v[i] = (uint8_t)(i * 5 + 3);
    assert_int_equal(kv_pool_write(&p, 1, slots, 4, k, v), 0);
    assert_int_equal(kv_pool_read(&p, 1, slots, 4, back_k, back_v), 0);
    assert_memory_equal(k, back_k, sizeof(k));
    assert_memory_equal(v, back_v, sizeof(v));
    assert_int_equal(kv_pool_read(&p, 0, slots, 4, back_k, back_v), 0); /* other layer: 0 */
    assert_int_equal(back_k[0] | back_k[63] | back_v[0], 0);
    const int32_t out_of_pool[] = {12};
    assert_int_equal(kv_pool_write(&p, 0, out_of_pool, 1, k, v), -EINVAL);
    assert_int_equal(kv_pool_write(&p, 2, slots, 1, k, v), -EINVAL);
    assert_int_equal(kv_pool_write(&p, 0, slots, 1, k, NULL), -EINVAL);
    kv_pool_finish(&p);

    assert_int_equal(kv_pool_init(&p, &dev_backend_sim, &mla, 8), 0);
    assert_int_equal(kv_pool_write(&p, 2, slots + 1, 3, k, NULL), 0);
    assert_int_equal(kv_pool_read(&p, 2, slots + 1, 3, back_k, NULL), 0);
    assert_memory_equal(k, back_k, 3 * 12);
    assert_int_equal(kv_pool_write(&p, 2, slots + 1, 3, k, v), -EINVAL); /* MLA has no V */
    kv_pool_finish(&p);

    struct kvt_geometry bad = mha;
    bad.dtype_bytes = 3;
    assert_int_equal(kv_pool_init(&p, &dev_backend_sim, &bad, 8), -EINVAL);
}

/* A backend with batched row copies, on host memory (the seam the cuda backend's kernel path
 * sits behind): counts what the pool hands it, and can refuse as cuda does where its kernels
 * cannot run. */
struct dev_rows {
    void **bufs[2];
    size_t row_bytes[2];
};
static struct {
    int opened, closed, copies, refuse;
} rows_seen;

static int rows_open(void **const bufs[2], uint32_t layers, const size_t row_bytes[2],
                     struct dev_rows **out)
{
    static struct dev_rows r;

    (void)layers;
    for (int w = 0; w < 2; w++) {
        r.bufs[w] = bufs[w];
        r.row_bytes[w] = row_bytes[w];
    }
    rows_seen.opened++;
    *out = &r;
    return 0;
}

static int rows_copy(struct dev_rows *r, uint32_t layer, const int32_t *slots, size_t n, void *k,
                     void *v, int to_device)
{
    uint8_t *host[2] = {k, v};

    rows_seen.copies++;
    if (rows_seen.refuse)
        return KVT_ENOBACKEND;
    for (int w = 0; w < 2 && r->bufs[w]; w++)
        for (size_t i = 0; i < n; i++) {
            uint8_t *d = (uint8_t *)r->bufs[w][layer] + (size_t)slots[i] * r->row_bytes[w];
            uint8_t *h = host[w] + i * r->row_bytes[w];
            memcpy(to_device ? d : h, to_device ? h : d, r->row_bytes[w]);
        }
    return 0;
}

static void rows_close(struct dev_rows *r)
{
    (void)r;
    rows_seen.closed++;
}

/* Rows of one run go as one copy per part; rows of several by the backend's batched copy,
 * and by a copy per run when it refuses. Every way, the same bytes. */
static void test_kv_pool_batched(void **state)
{
    struct dev_backend be = dev_backend_sim;
    struct kvt_geometry mha = small_mha;
    const int32_t run[] = {4, 5, 6}, scattered[] = {9, 2, 3, 7}, other[] = {7, 2, 9, 3};
    uint8_t k[4 * 16], v[4 * 8], back_k[4 * 16], back_v[4 * 8];
    struct kv_pool p;

    (void)state;
    be.rows_open = rows_open;
    be.rows_copy = rows_copy;
    be.rows_close = rows_close;
    for (size_t i = 0; i < sizeof(k); i++)
        k[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(v); i++)
        v[i] = (uint8_t)(i * 5 + 3);
    for (int refuse = 0; refuse < 2; refuse++) {
        memset(&rows_seen, 0, sizeof(rows_seen));
        rows_seen.refuse = refuse;
        assert_int_equal(kv_pool_init(&p, &be, &mha, 12), 0);
        assert_int_equal(rows_seen.opened, 1);
        assert_int_equal(kv_pool_write(&p, 1, run, 3, k, v), 0);
        assert_int_equal(kv_pool_read(&p, 1, run, 3, back_k, back_v), 0);
        assert_int_equal(rows_seen.copies, 0);
        assert_memory_equal(back_k, k, 3 * 16);
        assert_memory_equal(back_v, v, 3 * 8);
        assert_int_equal(kv_pool_write(&p, 0, scattered, 4, k, v), 0);
        assert_int_equal(rows_seen.copies, 1);
        /* Read back in another order, each row checked against where it was written. */
        assert_int_equal(kv_pool_read(&p, 0, other, 4, back_k, back_v), 0);
        assert_int_equal(rows_seen.copies, 2);
        for (int i = 0; i < 4; i++) {
            int at = other[i] == 9 ? 0 : other[i] == 2 ? 1 : other[i] == 3 ? 2 : 3;
            assert_memory_equal(back_k + i * 16, k + at * 16, 16);
            assert_memory_equal(back_v + i * 8, v + at * 8, 8);
        }
        /* The rows read one at a time (one run each) agree with the batched write. */
        for (int i = 0; i < 4; i++) {
            assert_int_equal(kv_pool_read(&p, 0, scattered + i, 1, back_k, back_v), 0);
            assert_memory_equal(back_k, k + i * 16, 16);
            assert_memory_equal(back_v, v + i * 8, 8);
        }
        assert_int_equal(rows_seen.copies, 2);
        kv_pool_finish(&p);
        assert_int_equal(rows_seen.closed, 1);
    }
}

static void test_req_pool(void **state)
{
    struct req_pool r;
    int32_t a, b, c, row[4];
    const int32_t slots[] = {7, 8, 9};

    (void)state;
    assert_int_equal(req_pool_init(&r, 2, 4), 0);
    assert_int_equal(req_pool_alloc(&r, &a), 0);
    assert_int_equal(req_pool_alloc(&r, &b), 0);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(req_pool_alloc(&r, &c), -ENOMEM);
    assert_int_equal(req_pool_write(&r, b, 1, slots, 3), -EINVAL); /* a hole at 0 */
    assert_int_equal(req_pool_write(&r, b, 0, slots, 1), 0);
    assert_int_equal(req_pool_write(&r, b, 1, slots, 3), 0);
    assert_int_equal(req_pool_filled(&r, b), 4);
    assert_int_equal(req_pool_read(&r, b, 1, 3, row), 0);
    assert_memory_equal(row, slots, sizeof(slots));
    assert_int_equal(req_pool_write(&r, b, 2, slots, 3), -EINVAL); /* past max_context */
    assert_int_equal(req_pool_free(&r, a), 0);
    assert_int_equal(req_pool_free(&r, a), -EINVAL);
    assert_int_equal(req_pool_write(&r, a, 0, slots, 1), -EINVAL); /* not in use */
    assert_int_equal(req_pool_free(&r, 7), -EINVAL);
    assert_int_equal(req_pool_alloc(&r, &c), 0);
    assert_int_equal(c, a);
    /* The row's next holder has another generation: the previous one's handle is dead. */
    uint32_t first = req_pool_gen(&r, c);
    assert_true(req_pool_live(&r, c, first));
    assert_int_equal(req_pool_free(&r, c), 0);
    assert_false(req_pool_live(&r, c, first));
    assert_int_equal(req_pool_alloc(&r, &c), 0);
    assert_int_equal(c, a);
    assert_false(req_pool_live(&r, c, first));
    assert_true(req_pool_live(&r, c, req_pool_gen(&r, c)));
    assert_false(req_pool_live(&r, c, 0));
    req_pool_finish(&r);
}

/* Sizing as SGLang's profile_max_num_token: budget / cell size, minus the padding page,
 * aligned down to the page size. */
static void test_sizing(void **state)
{
    struct kvt_geometry llama8b = {
        .attention = KVT_ATTN_MHA, .layers = 32, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2};
    struct kvt_geometry dsv3 = {.attention = KVT_ATTN_MLA,
                                .layers = 61,
                                .kv_lora_rank = 512,
                                .qk_rope_head_dim = 64,
                                .dtype_bytes = 2};

    (void)state;
    assert_int_equal(kvt_cell_bytes(&llama8b), 131072); /* 128 KiB per token */
    assert_int_equal(kvt_cell_bytes(&dsv3), 61 * 576 * 2);
    /* 40 GiB of Llama-3-8B KV: 327680 rows, 16 of them the padding page. */
    assert_int_equal(kvt_max_tokens(&llama8b, 16, 40ull << 30), 327664);
    assert_int_equal(kvt_max_tokens(&llama8b, 64, 40ull << 30), 327616);
    assert_int_equal(kvt_max_tokens(&dsv3, 64, 1ull << 30) % 64, 0);
    assert_int_equal(kvt_max_tokens(&dsv3, 64, 1ull << 30), (1073741824 / 70272 - 64) / 64 * 64);
    assert_int_equal(kvt_max_tokens(&llama8b, 16, 16 * 131072), 0); /* only the padding */
    assert_int_equal(kvt_max_tokens(&llama8b, 12, 1ull << 30), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_basics),
        cmocka_unit_test(test_free_list_example),
        cmocka_unit_test(test_free_errors),
        cmocka_unit_test(test_free_group),
        cmocka_unit_test(test_alloc_extend_example),
        cmocka_unit_test(test_alloc_extend_batch),
        cmocka_unit_test(test_alloc_extend_errors),
        cmocka_unit_test(test_alloc_decode),
        cmocka_unit_test(test_ownership),
        cmocka_unit_test(test_kv_pool),
        cmocka_unit_test(test_kv_pool_batched),
        cmocka_unit_test(test_req_pool),
        cmocka_unit_test(test_sizing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
