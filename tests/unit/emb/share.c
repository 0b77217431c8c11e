/* Views of one store (src/store/share.h): each view collects its own ops and only those,
 * whichever view's poll or wait_for met them at the store; closing one view waits for its
 * ops and leaves the other working; the last one closes the store. Over the in-memory store
 * (ops done at submission) and the disk store (ops done by its threads, in any order). */
#include "emb_test.h"

#include "disk/ops.h"
#include "store/mem.h"
#include "store/share.h"

#define PB 4096
#define OPS 64

static int open_disk(const char *dir, struct kvt_store **out)
{
    struct dstore_options o;

    dstore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.page_bytes = PB;
    o.page_tokens = 4;
    o.disk_bytes = 8 << 20;
    return store_disk_open(&o, out);
}

static void page_key(uint8_t *key, uint32_t i)
{
    memset(key, 0, 32);
    memcpy(key, &i, 4);
    key[31] = 0x77;
}

/* Submit op i through view v: even ops write page i, odd ones read page i - 1 back. */
struct pending {
    uint64_t id;
    int view;
    bool seen;
    int results[1];
    uint8_t key[32];
    uint8_t buf[PB];
};

static void submit(struct kvt_store *v, struct pending *p, uint32_t i)
{
    page_key(p->key, i % 2 ? i - 1 : i);
    if (i % 2 == 0) {
        memset(p->buf, (int)i, PB);
        struct store_wpage w = {
            .key = p->key, .parent = NULL, .ns = NULL, .tokens = NULL, .buf = p->buf};
        assert_int_equal(store_write(v, &w, 1, p->results, &p->id), 0);
    } else {
        struct store_rpage r = {.key = p->key, .buf = p->buf};
        assert_int_equal(store_read(v, &r, 1, p->results, &p->id, NULL), 0);
    }
}

/* A completion d collected by view v: one of v's, seen once. */
static void seen(struct pending *ops, size_t n, int v, const struct store_done *d)
{
    for (size_t i = 0; i < n; i++)
        if (ops[i].id == d->op) {
            assert_int_equal(ops[i].view, v);
            assert_false(ops[i].seen);
            ops[i].seen = true;
            return;
        }
    fail_msg("op %llu was never submitted", (unsigned long long)d->op);
}

static void run_views(struct kvt_store *const v[2])
{
    struct pending *ops = calloc(OPS, sizeof(*ops));
    struct store_done d[8];
    size_t got, left = OPS;

    assert_non_null(ops);
    for (uint32_t i = 0; i < OPS; i++) {
        ops[i].view = (int)(i / 2 % 3 == 0); /* writes and their reads, mostly view 0 */
        submit(v[ops[i].view], &ops[i], i);
        /* Wait for the op through its view (a read needs its write landed): it may have been
         * met by the other view's poll, which keeps it for this one. */
        got = store_poll(v[!ops[i].view], d, 8);
        for (size_t k = 0; k < got; k++)
            seen(ops, OPS, !ops[i].view, &d[k]), left--;
        if (!ops[i].seen) {
            assert_int_equal(store_wait_for(v[ops[i].view], ops[i].id, -1, d), 0);
            seen(ops, OPS, ops[i].view, d);
            left--;
        }
        assert_int_equal(ops[i].results[0], 0);
        if (i % 2 == 1)
            assert_int_equal(ops[i].buf[PB - 1], (uint8_t)(i - 1));
        /* Collected: gone for either view. */
        assert_int_equal(store_wait_for(v[!ops[i].view], ops[i].id, 0, d), -ENOENT);
    }
    /* What is left comes out through its own view's polls. */
    for (int spins = 0; left && spins < 100000; spins++)
        for (int k = 0; k < 2; k++) {
            got = store_poll(v[k], d, 8);
            for (size_t j = 0; j < got; j++)
                seen(ops, OPS, k, &d[j]), left--;
        }
    assert_int_equal(left, 0);
    assert_int_equal(store_wait_for(v[0], ops[0].id, 0, d), -ENOENT);
    assert_int_equal(store_wait_for(v[0], 1u << 30, 0, d), -EINVAL);
    /* In flight through view 0: never issued through view 1. */
    ops[0].seen = false;
    submit(v[0], &ops[0], 0);
    assert_int_equal(store_wait_for(v[1], ops[0].id, 0, d), -EINVAL);
    assert_int_equal(store_wait_for(v[0], ops[0].id, -1, d), 0);
    assert_int_equal(d->op, ops[0].id);
    free(ops);
}

void test_share_routes(void **state)
{
    struct store_mem_options mo = {.page_bytes = PB, .page_tokens = 4, .capacity_pages = OPS};
    struct kvt_store *s, *v[2];
    const char *dir = *state;

    assert_int_equal(store_share_open(NULL, 2, v), -EINVAL);
    assert_int_equal(store_mem_open(&mo, &s), 0);
    assert_int_equal(store_share_open(s, 1, v), -EINVAL);
    assert_int_equal(store_share_open(s, STORE_SHARE_MAX + 1, v), -EINVAL);
    assert_int_equal(store_share_open(s, 2, v), 0);
    assert_int_equal(v[0]->page_bytes, PB);
    assert_string_equal(v[1]->ops->name, s->ops->name);
    run_views(v);
    store_close(v[0]);
    store_close(v[1]);
    assert_int_equal(open_disk(dir, &s), 0);
    assert_int_equal(store_share_open(s, 2, v), 0);
    run_views(v);
    store_close(v[1]);
    store_close(v[0]);
}

/* Closing a view with its ops in flight waits for them (their buffers are free after); the
 * other view goes on, and closing it closes the store. */
void test_share_close(void **state)
{
    struct kvt_store *s, *v[2];
    struct pending *ops = calloc(8, sizeof(*ops));
    struct store_done d;
    const char *dir = *state;
    size_t run = 0;

    assert_non_null(ops);
    assert_int_equal(open_disk(dir, &s), 0);
    assert_int_equal(store_share_open(s, 2, v), 0);
    for (uint32_t i = 0; i < 4; i++) {
        ops[i].view = 1;
        submit(v[1], &ops[i], 2 * i);
    }
    submit(v[0], &ops[4], 8);
    store_close(v[1]); /* waits for its four writes */
    memset(ops, 0xee, 4 * sizeof(*ops));
    assert_int_equal(store_wait_for(v[0], ops[4].id, -1, &d), 0);
    uint8_t keys[5][32];
    for (uint32_t i = 0; i < 5; i++)
        page_key(keys[i], 2 * i);
    assert_int_equal(store_leading_run(v[0], keys[0], 5, &run), 0);
    assert_int_equal(run, 5);
    store_close(v[0]);
    free(ops);
}
