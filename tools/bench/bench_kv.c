/* kvtier-bench's KV content (bench.h): rows made from the tokens' hashes, written as a forward
 * pass would, read back and compared byte for byte; a sliding-window model's window. */
#include <string.h>

#include "bench.h"

/* Words of a row are mixed from a counter, not chained, so they compute in parallel. */
void bench_fill_row(uint64_t hash, uint32_t layer, int which, uint8_t *row, size_t n)
{
    uint64_t s = wl_mix(hash + wl_mix((uint64_t)layer << 1 | (uint64_t)which)), w;
    size_t i;

    for (i = 0; i + 8 <= n; i += 8) {
        w = wl_mix(s + i);
        memcpy(row + i, &w, 8);
    }
    if (i < n) {
        w = wl_mix(s + i);
        memcpy(row + i, &w, n - i);
    }
}

void bench_hash_tokens(struct bench *b, size_t from, size_t to)
{
    uint64_t h = from ? b->hash[from - 1] : wl_mix(b->cfg->seed);

    for (size_t i = from; i < to; i++)
        b->hash[i] = h = wl_mix(h ^ b->tokens[i]);
}

/* Write the KV rows of tokens [pos, pos + n) into slots, as a forward pass would. */
int bench_compute(struct bench *b, const int32_t *slots, size_t pos, size_t n)
{
    for (size_t done = 0; done < n; done += b->chunk) {
        size_t m = n - done < b->chunk ? n - done : b->chunk;
        for (uint32_t l = 0; l < b->cfg->g.layers; l++) {
            for (size_t i = 0; i < m; i++)
                for (int x = 0; x < 2; x++)
                    if (b->row[x])
                        bench_fill_row(b->hash[pos + done + i], l, x, b->buf[x] + i * b->row[x],
                                       b->row[x]);
            int rc =
                kvt_kv_write(b->e, l, slots + done, m, b->buf[0], b->row[1] ? b->buf[1] : NULL);
            if (rc)
                return engine_error("kvt_kv_write", rc);
        }
    }
    b->c.bytes_compute += (uint64_t)n * b->cfg->g.layers * (b->row[0] + b->row[1]);
    return 0;
}

void bench_note_mismatch(struct bench *b, size_t token, uint32_t layer, int which)
{
    if (b->c.mismatches++ == 0)
        b->first = (struct mismatch){b->c.requests + 1, token, layer, which};
}

/* Compare m rows read back for tokens [pos, pos + m) of layer; marks bad pages. */
static void compare_rows(struct bench *b, size_t pos, size_t m, uint32_t layer, bool *bad)
{
    uint32_t ps = b->cfg->page_size;

    for (size_t i = 0; i < m; i++) {
        for (int x = 0; x < 2; x++) {
            if (!b->row[x] || bad[i / ps])
                continue;
            bench_fill_row(b->hash[pos + i], layer, x, b->want, b->row[x]);
            if (memcmp(b->want, b->buf[x] + i * b->row[x], b->row[x]) != 0) {
                bad[i / ps] = true;
                bench_note_mismatch(b, pos + i, layer, x);
            }
        }
    }
}

/* Sliding-window layers of the cached tokens [0, n): a forward reads only their last window,
 * the only rows the cache keeps for them; every byte of those is checked. */
static int verify_window(struct bench *b, const int32_t *slots, size_t n)
{
    size_t from = n > b->cfg->swa_window ? n - b->cfg->swa_window : 0;

    for (uint32_t l = 0; b->cfg->swa_window && l < b->cfg->g.layers; l++) {
        if (!swa_layer(b, l))
            continue;
        for (size_t pos = from; pos < n; pos += b->chunk) {
            size_t m = n - pos < b->chunk ? n - pos : b->chunk;
            int rc = kvt_kv_read(b->e, l, slots + pos, m, b->buf[0], b->row[1] ? b->buf[1] : NULL);
            if (rc)
                return engine_error("kvt_kv_read", rc);
            for (size_t i = 0; i < m; i++)
                for (int x = 0; x < 2; x++) {
                    if (!b->row[x])
                        continue;
                    bench_fill_row(b->hash[pos + i], l, x, b->want, b->row[x]);
                    if (memcmp(b->want, b->buf[x] + i * b->row[x], b->row[x]) != 0)
                        bench_note_mismatch(b, pos + i, l, x);
                }
            b->c.bytes_verify += (uint64_t)m * (b->row[0] + b->row[1]);
        }
    }
    return 0;
}

/* Read back the cached tokens [0, n) from slots and check every byte, page by page. Layer
 * l is read once load op has landed it, as a forward pass would wait per layer. The
 * sliding-window layers are verify_window's. */
int bench_verify(struct bench *b, const int32_t *slots, size_t n, uint64_t op)
{
    bool bad[CHUNK_TOKENS]; /* per page of the chunk */

    for (size_t done = 0; done < n; done += b->chunk) {
        size_t m = n - done < b->chunk ? n - done : b->chunk;
        memset(bad, 0, sizeof(bad));
        for (uint32_t l = 0; l < b->cfg->g.layers; l++) {
            int rc = kvt_load_wait_layer(b->e, op, l, NULL);
            if (rc)
                return engine_error("kvt_load_wait_layer", rc);
            if (swa_layer(b, l))
                continue;
            rc = kvt_kv_read(b->e, l, slots + done, m, b->buf[0], b->row[1] ? b->buf[1] : NULL);
            if (rc)
                return engine_error("kvt_kv_read", rc);
            compare_rows(b, done, m, l, bad);
        }
    }
    b->c.pages_checked += n / b->cfg->page_size;
    b->c.bytes_verify += (uint64_t)n * (b->cfg->g.layers - b->nswa) * (b->row[0] + b->row[1]);
    return verify_window(b, slots, n);
}

/* The request has b->filled tokens: its sliding-window KV that the window left goes. */
int bench_slide(struct bench *b, const struct kvt_req *req)
{
    int rc = b->cfg->swa_window ? kvt_req_swa_slide(b->e, req, b->filled) : 0;

    return rc ? engine_error("kvt_req_swa_slide", rc) : 0;
}

/* A sliding-window model's prompt is cached as soon as its prefill ends (as a chunked
 * prefill's chunks are), before its window moves on, so that the cache holds its
 * sliding-window KV whole and evicts it by the window's LRU order, not the request's
 * decode. The row is read back: the cache may have kept its own copy of our pages. */
int bench_cache_prompt(struct bench *b, struct kvt_req *req, size_t in)
{
    struct kvt_key key = {.tokens = b->tokens, .len = in};
    int rc;

    if (!b->cfg->swa_window)
        return 0;
    if ((rc = kvt_req_cache_unfinished(b->e, req, &key)))
        return engine_error("kvt_req_cache_unfinished", rc);
    if ((rc = kvt_req_read(b->e, req, 0, b->filled, b->slots)))
        return engine_error("kvt_req_read", rc);
    return bench_slide(b, req);
}
