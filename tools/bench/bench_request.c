/* kvtier-bench's requests (bench.h): one request served from match to cache, and the test
 * seam that damages a cached page. */
#include <inttypes.h>
#include <stdio.h>

#include "bench.h"

/* Make room for tokens more slots, evicting cached prefixes as the scheduler would. */
static int make_room(struct bench *b, size_t tokens)
{
    size_t avail = kvt_available(b->e), evicted = 0;

    if (avail >= tokens)
        return 0;
    int rc = kvt_evict(b->e, tokens - avail, &evicted);
    if (rc)
        return engine_error("kvt_evict", rc);
    if (kvt_available(b->e) < tokens) {
        fprintf(stderr, "%s: request %" PRIu64 " needs %zu slots; only %zu can be freed\n", PROG,
                b->c.requests + 1, tokens, kvt_available(b->e));
        return -1;
    }
    return 0;
}

static int prefill(struct bench *b, const struct kvt_req *req, size_t hit, size_t in)
{
    uint32_t prefix = (uint32_t)hit, seq = (uint32_t)in;
    int32_t last = hit ? b->slots[hit - 1] : -1;
    int rc;

    if (in == hit)
        return 0;
    if ((rc = kvt_alloc_extend(b->e, 1, &prefix, &seq, &last, b->slots + hit, in - hit)))
        return engine_error("kvt_alloc_extend", rc);
    if ((rc = kvt_req_write(b->e, req, hit, b->slots + hit, in - hit)))
        return engine_error("kvt_req_write", rc);
    b->filled = in;
    return bench_compute(b, b->slots + hit, hit, in - hit);
}

/* Decode tokens [in, kv_len): one slot and one KV row per step. */
static int decode(struct bench *b, struct kvt_req *req, size_t in, size_t kv_len)
{
    for (size_t pos = in; pos < kv_len; pos++) {
        uint32_t seq = (uint32_t)pos + 1;
        int rc = kvt_alloc_decode(b->e, 1, &seq, &b->slots[pos - 1], &b->slots[pos]);
        if (rc)
            return engine_error("kvt_alloc_decode", rc);
        if ((rc = kvt_req_write(b->e, req, pos, &b->slots[pos], 1)))
            return engine_error("kvt_req_write", rc);
        b->filled = pos + 1;
        if (bench_compute(b, &b->slots[pos], pos, 1) || bench_decode_checkpoint(b, req, pos + 1) ||
            bench_slide(b, req))
            return -1;
    }
    return 0;
}

static int serve(struct bench *b, const struct wl_req *r, struct kvt_req *req)
{
    size_t in = r->input_len, kv_len = kv_tokens(r), hit = req->protected_len;
    int rc;

    if (hit && (rc = kvt_req_read(b->e, req, 0, hit, b->slots)))
        return engine_error("kvt_req_read", rc);
    if (b->mm && bench_mm_serve(b->mm, &b->src->w, r, hit, b->c.requests + 1))
        return -1;
    if (bench_verify(b, b->slots, hit, req->load_op) || bench_verify_state(b, req) ||
        make_room(b, round_up(kv_len, b->cfg->page_size) - hit) || prefill(b, req, hit, in) ||
        bench_prefill_checkpoints(b, req, in) || bench_cache_prompt(b, req, in) ||
        decode(b, req, in, kv_len))
        return -1;
    b->c.hit_device += hit - req->loaded_len;
    b->c.hit_host += req->loaded_len - req->disk_len;
    size_t remote = b->remote_len < req->disk_len ? b->remote_len : req->disk_len;
    b->c.hit_disk += req->disk_len - remote;
    b->c.hit_remote += remote;
    b->c.computed += in - hit;
    b->c.decoded += kv_len - in;
    return 0;
}

/* The engine's remote hits so far: what a request's match took from the remote tier is the
 * growth across its kvt_req_begin (disk_len holds the disk's and the remote's together). */
static uint64_t remote_hits(struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};

    return b->cfg->remote && kvt_stats(b->e, &st) == 0 ? st.remote_hit_tokens : 0;
}

/* By default every transfer lands before the next request, so which nodes can be evicted
 * never depends on timing and a replay is reproducible. --disk-backlog N lets the disk tier's
 * ops go on beside the request while at most N fly, as a serving engine would (it does not
 * wait for its disk writes): then what lands when, and so the hits, may vary a little from run
 * to run; every page served is verified all the same. */
static int settle_before(struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};
    int rc;

    if (b->cfg->disk_backlog) {
        if ((rc = kvt_poll(b->e, SIZE_MAX, NULL)) || (rc = kvt_stats(b->e, &st)))
            return engine_error("kvt_poll", rc);
        if (st.disk_ops_in_flight <= b->cfg->disk_backlog)
            return 0;
    }
    if ((rc = kvt_sync(b->e)))
        return engine_error("kvt_sync", rc);
    return 0;
}

int bench_run_request(struct bench *b, const struct wl_req *r)
{
    size_t in = r->input_len, kv_len = kv_tokens(r);
    struct kvt_key key = {.tokens = b->tokens, .len = in - 1};
    struct kvt_req req;
    int rc;

    wl_input_tokens(&b->src->w, r, b->tokens);
    for (size_t i = in; i < kv_len; i++)
        b->tokens[i] = wl_output_token(r, (uint32_t)(i - in));
    bench_hash_tokens(b, 0, kv_len);
    if ((rc = settle_before(b)))
        return rc;
    if (b->mm && bench_mm_key(b->mm, &b->src->w, r, &key))
        return -1;
    uint64_t remote_before = remote_hits(b);
    if ((rc = kvt_req_begin(b->e, &key, &req)))
        return engine_error("kvt_req_begin", rc);
    b->remote_len = remote_hits(b) - remote_before;
    b->filled = req.protected_len;
    /* Whatever happened, hand the request back: on failure without inserting. */
    int failed = serve(b, r, &req);
    key.len = b->filled;
    if ((rc = kvt_req_cache_finished(b->e, &req, &key, 0, !failed)))
        return engine_error("kvt_req_cache_finished", rc);
    if (b->mm)
        bench_mm_release(b->mm);
    b->c.requests++;
    b->c.tokens_total += in;
    return failed;
}

/* Test seam: flip one byte of the first cached page of r's input, as a faulty tier would (and,
 * for a hybrid model, of the checkpoints). */
int bench_corrupt_cached_page(struct bench *b, const struct wl_req *r)
{
    struct kvt_key key = {.tokens = b->tokens, .len = r->input_len};
    struct kvt_match m;
    int rc;

    wl_input_tokens(&b->src->w, r, b->tokens);
    if ((rc = kvt_match(b->e, &key, b->slots, &m)))
        return engine_error("kvt_match", rc);
    if (m.device_len == 0) {
        fprintf(stderr, "%s: --corrupt-after: request %" PRIu64 " left nothing cached\n", PROG,
                b->c.requests);
        return -1;
    }
    /* A full-attention layer: a sliding-window layer's first rows are read only in a window. */
    uint32_t l = b->full_ids ? b->full_ids[0] : 0;
    if ((rc = kvt_kv_read(b->e, l, b->slots, 1, b->buf[0], b->row[1] ? b->buf[1] : NULL)))
        return engine_error("kvt_kv_read", rc);
    b->buf[0][0] ^= 0x5a;
    if ((rc = kvt_kv_write(b->e, l, b->slots, 1, b->buf[0], b->row[1] ? b->buf[1] : NULL)))
        return engine_error("kvt_kv_write", rc);
    return bench_corrupt_states(b);
}
