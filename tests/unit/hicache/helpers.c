#include "hicache_test.h"

/* ---- helpers for the focused tests ---- */

void check(const kvt_engine *e)
{
    char why[256] = "";

    if (engine_check(e, why, sizeof(why)))
        fail_msg("engine check: %s", why);
}

struct kvt_stats stats(const kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_stats(e, &st), 0);
    return st;
}

void host_options(struct kvt_options *o, uint32_t ps, uint64_t dev, uint64_t host)
{
    fixture_engine_options(o, LAYERS, HEAD_DIM);
    o->backend = TEST_BACKEND;
    o->page_size = ps;
    o->device_tokens = dev;
    o->host_tokens = host;
    o->max_requests = N_REQ;
    o->max_context = MAX_CONTEXT;
}

/* A fresh data dir for a disk tier, under TMPDIR or /tmp. */
void make_data_dir(char *dir, size_t len)
{
    assert_int_equal(fixture_data_dir(dir, len, "hicache"), 0);
}

/* Swap in a transfer engine with the test seams; only right after kvt_open, with nothing in
 * flight. */
int set_xfer(kvt_engine *e, const struct xfer_config *xc)
{
    return host_tier_set_xfer(e->below, xc);
}

kvt_engine *open_with(const struct kvt_options *o, const struct xfer_config *xc)
{
    kvt_engine *e = NULL;

    assert_int_equal(kvt_open(o, &e), 0);
    assert_non_null(e);
    if (xc)
        assert_int_equal(set_xfer(e, xc), 0);
    check(e);
    return e;
}

/* Apply every transfer: kvt_poll until nothing is in flight (bounded, 10 s). */
int drain(kvt_engine *e)
{
    struct timespec nap = {0, 50000};

    for (int i = 0; i < 200000; i++) {
        struct kvt_stats st = {.size = sizeof(st)};
        int rc = kvt_poll(e, 0, NULL);
        if (rc)
            return rc;
        if (kvt_stats(e, &st))
            return -EINVAL;
        if (st.ops_in_flight == 0)
            return 0;
        nanosleep(&nap, NULL);
    }
    return -ETIMEDOUT;
}

void seq_make(struct seq *q, uint32_t ns, size_t len, uint32_t salt)
{
    q->ns = ns;
    q->len = len;
    for (size_t i = 0; i < len; i++)
        q->tok[i] = salt * 1000 + (uint32_t)i;
    seq_hash(q);
}

/* Wait for every layer of op and check the request's first n rows. */
void verify_req(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t n)
{
    int32_t slots[MAX_TOK];

    assert_true(n <= MAX_TOK);
    if (n == 0)
        return;
    assert_int_equal(kvt_req_read(e, r, 0, n, slots), 0);
    for (uint32_t l = 0; l < LAYERS; l++) {
        assert_int_equal(kvt_load_wait_layer(e, r->load_op, l, NULL), 0);
        long bad = check_layer(e, q, 0, n, slots, l);
        if (bad != -1)
            fail_msg("layer %u: token %ld of %zu has the wrong KV", l, bad, n);
    }
}

/* Compute tokens [from, to) of q for a begun request: allocate, write the rows, record the
 * slots in its row. */
int extend(kvt_engine *e, const struct seq *q, const struct kvt_req *r, size_t from, size_t to)
{
    int32_t out[MAX_TOK], last = -1;
    uint32_t pl = (uint32_t)from, sl = (uint32_t)to;

    if (to <= from)
        return 0;
    if (from)
        assert_int_equal(kvt_req_read(e, r, from - 1, 1, &last), 0);
    int rc = kvt_alloc_extend(e, 1, &pl, &sl, &last, out, to - from);
    if (rc)
        return rc;
    assert_int_equal(compute_rows(e, q, from, to - from, out), 0);
    assert_int_equal(kvt_req_write(e, r, from, out, to - from), 0);
    return 0;
}

/* A whole request: begin on q's first prompt tokens, check what it got, compute the rest of
 * q, and finish (inserting when insert). Returns what kvt_req_begin gave. */
struct kvt_req run_request(kvt_engine *e, const struct seq *q, size_t prompt, int insert)
{
    struct kvt_key key = seq_key(q, prompt);
    struct kvt_req r, got;

    assert_int_equal(kvt_req_begin(e, &key, &r), 0);
    got = r;
    verify_req(e, q, &r, r.protected_len);
    assert_int_equal(extend(e, q, &r, r.protected_len, q->len), 0);
    verify_req(e, q, &r, q->len);
    key = seq_key(q, q->len);
    assert_int_equal(kvt_req_cache_finished(e, &r, &key, 0, insert), 0);
    check(e);
    return got;
}

void evict_all(kvt_engine *e)
{
    size_t ev = 0;

    assert_int_equal(kvt_evict(e, SIZE_MAX / 2, &ev), 0);
    assert_int_equal(stats(e).cached_tokens, 0);
    check(e);
}

/* Device and host pages add up: free + cached (+ what requests own) is the pool. */
void assert_pools_add_up(const kvt_engine *e)
{
    struct kvt_stats st = stats(e);

    assert_int_equal(st.device_free_tokens + st.cached_tokens, st.device_tokens);
    assert_int_equal(st.host_free_tokens + st.host_cached_tokens, st.host_tokens);
}
