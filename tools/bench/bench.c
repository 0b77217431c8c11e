/*
 * kvtier-bench: replay a request trace through the engine the way a serving engine would,
 * and prove that every page served from the cache holds exactly the bytes that were stored.
 *
 * Requests run one after another. Each is matched (up to its last input token, which is
 * always computed, as in SGLang), its cached prefix is read back and checked, the rest of
 * the input is "computed" by writing KV rows into slots from kvt_alloc_extend, its output
 * is decoded a token at a time with kvt_alloc_decode, and it is cached with
 * kvt_req_cache_finished. When the pool is short the bench evicts first, as SGLang's
 * scheduler does.
 *
 * The KV row of a token is a function of the hash of every token up to it, the layer and
 * K or V: no model is needed and every byte is predictable, so any byte served from the
 * cache can be regenerated and compared. A hybrid model's recurrent state after a prefix is
 * made the same way from the prefix's hash, and checked as strictly when a request starts
 * from a cached checkpoint; requests leave checkpoints where SGLang's would (the branching
 * point or the last chunk multiple of the prefill, every track interval of the decode).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "bench_mm.h"
#include "cli.h"
#include "datadir.h"
#include "workload.h"

#define PROG "kvtier-bench"
/* Rows per kv_write/kv_read: at most CHUNK_TOKENS, fewer when a row is large, so a chunk's
 * buffer stays near CHUNK_BYTES; never fewer than a page (both are powers of two, so a chunk
 * is whole pages). */
#define CHUNK_TOKENS 1024
#define CHUNK_BYTES (64u << 20)
#define DEFAULT_SYNTHETIC "mixed"
#define DEFAULT_SYNTHETIC_REQUESTS 1000
#define DEFAULT_DEVICE_TOKENS 32768
/* Disk and remote ops a request may start beside (--disk-backlog): as a server, which never
 * waits for its writes to land, with a bound so the pinned host pages stay few. */
#define DEFAULT_DISK_BACKLOG 64
#define DISK_BACKLOG_S CLI_STR(DEFAULT_DISK_BACKLOG)
/* SGLang's mamba_full_memory_ratio fallback: the state pool is 0.9 of the KV pool's bytes. */
#define MAMBA_MEMORY_RATIO 0.9
#define MAMBA_MIN_SLOTS 4

_Static_assert(WL_MAX_LINE_BYTES == 16u << 20, "--help gives the trace line limit as 16 MiB");

/* ---- configuration ---- */

static const char *const policy_names[] = {"lru", "lfu", "fifo", "mru", "filo"};
static const char *const backend_names[] = {"auto", "sim", "cuda"};
static const char *const write_policy_names[] = {"write_through", "write_through_selective",
                                                 "write_back"};
static const char *const disk_sync_names[] = {"durable", "relaxed"}; /* enum kvt_disk_sync */

struct config {
    const char *trace, *synthetic, *dir, *remote;
    const char *remote_tls_ca, *remote_tls_cert, *remote_tls_key;
    uint64_t requests;      /* 0: the whole trace */
    uint32_t shard, shards; /* --shard K/N: the workload's requests at K modulo N; 0/0: all */
    const char *geometry_arg;
    struct kvt_geometry g;
    uint32_t tp_size;
    struct kvt_mamba mamba; /* a hybrid model's recurrent layers; layers 0: none */
    uint64_t mamba_slots;   /* 0: MAMBA_MEMORY_RATIO of the KV pool */
    uint32_t swa_window;    /* a hybrid model's sliding-window layers; 0: none */
    uint32_t full_every;    /* layers full_every-1, 2*full_every-1, ... are full attention */
    uint64_t swa_tokens;    /* SWA slots; 0: the engine's default */
    uint32_t page_size, backend, policy, write_policy;
    uint64_t device_tokens, host_tokens, disk_tokens, store_page_tokens;
    uint64_t seed;
    uint64_t corrupt_after; /* test seam: damage a cached page after this request (1-based) */
    bool json;
    bool serial;        /* kvt_options.sim_serial */
    bool deterministic; /* --deterministic: serial, and everything lands before a request */
    uint32_t disk_sync;
    uint64_t disk_backlog;     /* --disk-backlog: disk ops a request may start beside; 0: none */
    bool backlog_set;          /* --disk-backlog given */
    struct bench_mm_config mm; /* --synthetic multimodal: the embedding cache (bench_mm.c) */
};

/* ---- counters and state ---- */

struct counters {
    uint64_t requests, tokens_total, hit_device, hit_host, hit_disk, computed, decoded;
    uint64_t hit_remote; /* of what came from below the host, the remote tier's (not disk) */
    uint64_t pages_checked, mismatches;
    uint64_t bytes_compute, bytes_verify;
    uint64_t states_checked, checkpoints; /* hybrid models */
};

/* Tokens served from the cache, every tier. */
static uint64_t served_tokens(const struct counters *c)
{
    return c->hit_device + c->hit_host + c->hit_disk + c->hit_remote;
}

/* The first mismatch, for the report. */
struct mismatch {
    uint64_t request;
    size_t token;
    uint32_t layer;
    int which; /* 0 K, 1 V, 2 a recurrent layer's conv state, 3 its SSM state */
};

/* Where the requests come from: a trace read a line at a time, or a generator. It is gone
 * through twice, once to size the engine and once to replay, and holds only the request at
 * hand, however many there are. */
struct source {
    const struct config *cfg;
    struct wl_trace *trace;
    struct wl_synth *synth;
    uint64_t limit;    /* requests of the workload to go through; 0: every one of the trace */
    uint64_t seen;     /* of them, gone through */
    uint64_t taken;    /* of those, this shard's */
    struct workload w; /* the request at hand */
};

struct bench {
    const struct config *cfg;
    struct source *src;
    uint64_t nreqs, max_tokens; /* the workload's, from the first pass */
    uint64_t slots_taken;       /* slots its requests take in all, whole pages (saturating) */
    kvt_engine *e;
    size_t row[2];    /* bytes of one token's K and V rows in one layer (V 0 for MLA) */
    size_t chunk;     /* rows per kv_write/kv_read */
    uint32_t *tokens; /* the request's input, then its output */
    uint64_t *hash;   /* hash[i]: every token up to and including i */
    int32_t *slots;
    uint8_t *buf[2], *want;
    uint8_t *state[2];         /* one recurrent layer's conv and SSM state (hybrid models) */
    uint32_t *full_ids, nfull; /* sliding-window models: the full-attention layers */
    uint32_t nswa;             /* and how many layers are not */
    char *model_id;            /* the engine's: --geometry, and --seed when not 1 */
    size_t filled;             /* entries of the request's req_to_token row written so far */
    size_t remote_len;         /* tokens the request's match found on the remote tier */
    uint32_t store_pages;      /* tokens a page of the disk and remote tiers holds, as
                                  kvt_open takes them (kvt_store_page_tokens) */
    struct counters c;
    struct kvt_stats st; /* the engine's, at the end of the replay */
    struct mismatch first;
    double seconds;
    struct bench_mm *mm; /* --synthetic multimodal; NULL otherwise */
};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int engine_error(const char *call, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, call, kvt_strerror(rc));
    return -1;
}

static int say(const char *msg)
{
    fprintf(stderr, "%s: %s\n", PROG, msg);
    return -1;
}

/* ---- KV content ---- */

/* Words of a row are mixed from a counter, not chained, so they compute in parallel. */
static void fill_row(uint64_t hash, uint32_t layer, int which, uint8_t *row, size_t n)
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

static void hash_tokens(struct bench *b, size_t from, size_t to)
{
    uint64_t h = from ? b->hash[from - 1] : wl_mix(b->cfg->seed);

    for (size_t i = from; i < to; i++)
        b->hash[i] = h = wl_mix(h ^ b->tokens[i]);
}

/* Write the KV rows of tokens [pos, pos + n) into slots, as a forward pass would. */
static int compute(struct bench *b, const int32_t *slots, size_t pos, size_t n)
{
    for (size_t done = 0; done < n; done += b->chunk) {
        size_t m = n - done < b->chunk ? n - done : b->chunk;
        for (uint32_t l = 0; l < b->cfg->g.layers; l++) {
            for (size_t i = 0; i < m; i++)
                for (int x = 0; x < 2; x++)
                    if (b->row[x])
                        fill_row(b->hash[pos + done + i], l, x, b->buf[x] + i * b->row[x],
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

static void note_mismatch(struct bench *b, size_t token, uint32_t layer, int which)
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
            fill_row(b->hash[pos + i], layer, x, b->want, b->row[x]);
            if (memcmp(b->want, b->buf[x] + i * b->row[x], b->row[x]) != 0) {
                bad[i / ps] = true;
                note_mismatch(b, pos + i, layer, x);
            }
        }
    }
}

/* Whether layer l is a sliding-window layer of a hybrid model. */
static bool swa_layer(const struct bench *b, uint32_t l)
{
    return b->cfg->swa_window && (l + 1) % b->cfg->full_every != 0;
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
                    fill_row(b->hash[pos + i], l, x, b->want, b->row[x]);
                    if (memcmp(b->want, b->buf[x] + i * b->row[x], b->row[x]) != 0)
                        note_mismatch(b, pos + i, l, x);
                }
            b->c.bytes_verify += (uint64_t)m * (b->row[0] + b->row[1]);
        }
    }
    return 0;
}

/* Read back the cached tokens [0, n) from slots and check every byte, page by page. Layer
 * l is read once load op has landed it, as a forward pass would wait per layer. The
 * sliding-window layers are verify_window's. */
static int verify(struct bench *b, const int32_t *slots, size_t n, uint64_t op)
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
static int slide(struct bench *b, const struct kvt_req *req)
{
    int rc = b->cfg->swa_window ? kvt_req_swa_slide(b->e, req, b->filled) : 0;

    return rc ? engine_error("kvt_req_swa_slide", rc) : 0;
}

/* A sliding-window model's prompt is cached as soon as its prefill ends (as a chunked
 * prefill's chunks are), before its window moves on, so that the cache holds its
 * sliding-window KV whole and evicts it by the window's LRU order, not the request's
 * decode. The row is read back: the cache may have kept its own copy of our pages. */
static int cache_prompt(struct bench *b, struct kvt_req *req, size_t in)
{
    struct kvt_key key = {.tokens = b->tokens, .len = in};
    int rc;

    if (!b->cfg->swa_window)
        return 0;
    if ((rc = kvt_req_cache_unfinished(b->e, req, &key)))
        return engine_error("kvt_req_cache_unfinished", rc);
    if ((rc = kvt_req_read(b->e, req, 0, b->filled, b->slots)))
        return engine_error("kvt_req_read", rc);
    return slide(b, req);
}

/* ---- recurrent states (hybrid models) ---- */

static bool hybrid(const struct bench *b)
{
    return b->cfg->mamba.layers != 0;
}

static size_t state_part_bytes(const struct bench *b, int part)
{
    return (size_t)(part ? b->cfg->mamba.ssm_bytes : b->cfg->mamba.conv_bytes);
}

/* One recurrent layer's conv (part 0) or SSM (part 1) state after tokens [0, pos): a
 * function of their hash, with layer numbers apart from the KV layers'. */
static void fill_state(const struct bench *b, size_t pos, uint32_t layer, int part, uint8_t *buf)
{
    fill_row(b->hash[pos - 1], 0x10000u + layer, part, buf, state_part_bytes(b, part));
}

/* The forward reached a checkpoint at pos: its state goes to the request's track slot. */
static int checkpoint(struct bench *b, const struct kvt_req *req, size_t pos)
{
    struct kvt_req_mamba m;
    int rc = kvt_req_mamba(b->e, req, &m);

    if (rc)
        return engine_error("kvt_req_mamba", rc);
    for (uint32_t l = 0; l < b->cfg->mamba.layers; l++)
        for (int part = 0; part < 2; part++) {
            fill_state(b, pos, l, part, b->state[part]);
            if ((rc = kvt_mamba_write(b->e, m.track_slot, l, part, b->state[part])))
                return engine_error("kvt_mamba_write", rc);
            b->c.bytes_compute += state_part_bytes(b, part);
        }
    if ((rc = kvt_req_mamba_track(b->e, req, pos, 0)))
        return engine_error("kvt_req_mamba_track", rc);
    b->c.checkpoints++;
    return 0;
}

/* The state the request starts from (a copy of the checkpoint at its cached prefix) must
 * be the state after that prefix, byte for byte. */
static int verify_state(struct bench *b, const struct kvt_req *req)
{
    size_t hit = req->protected_len;
    struct kvt_req_mamba m;
    int rc;

    if (!hybrid(b) || hit == 0)
        return 0;
    if ((rc = kvt_req_mamba(b->e, req, &m)))
        return engine_error("kvt_req_mamba", rc);
    for (uint32_t l = 0; l < b->cfg->mamba.layers; l++)
        for (int part = 0; part < 2; part++) {
            size_t n = state_part_bytes(b, part);
            if ((rc = kvt_mamba_read(b->e, m.slot, l, part, b->state[part])))
                return engine_error("kvt_mamba_read", rc);
            fill_state(b, hit, l, part, b->want);
            if (memcmp(b->want, b->state[part], n) != 0)
                note_mismatch(b, hit - 1, l, 2 + part);
            b->c.bytes_verify += n;
        }
    b->c.states_checked++;
    return 0;
}

/* A checkpoint at `at` handed to the cache at once (as a chunked prefill's progress is), so
 * that later ones do not displace it. The row is read back: the cache may have kept its own
 * copy of our pages. */
static int cache_checkpoint(struct bench *b, struct kvt_req *req, size_t at)
{
    struct kvt_key key = {.tokens = b->tokens, .len = b->filled};
    int rc;

    if (at <= req->protected_len)
        return 0;
    if (checkpoint(b, req, at))
        return -1;
    if ((rc = kvt_req_cache_unfinished(b->e, req, &key)))
        return engine_error("kvt_req_cache_unfinished", rc);
    if ((rc = kvt_req_read(b->e, req, 0, b->filled, b->slots)))
        return engine_error("kvt_req_read", rc);
    return 0;
}

/* After the prefill, checkpoints where a later match can use them: at the branching point
 * the match named (SGLang's mamba_branching_seqlen), then at the last chunk multiple of the
 * input a match can reach (it matches all but the last input token). */
static int prefill_checkpoints(struct bench *b, struct kvt_req *req, size_t in)
{
    struct kvt_req_mamba m;
    int rc;

    if (!hybrid(b))
        return 0;
    if ((rc = kvt_req_mamba(b->e, req, &m)))
        return engine_error("kvt_req_mamba", rc);
    if (m.branch_len && cache_checkpoint(b, req, m.branch_len))
        return -1;
    return cache_checkpoint(b, req, (in - 1) / m.grid * m.grid);
}

/* A decode step that brought the sequence to seq tokens: a checkpoint every decode grid. */
static int decode_checkpoint(struct bench *b, const struct kvt_req *req, size_t seq)
{
    struct kvt_req_mamba m;
    int rc;

    if (!hybrid(b))
        return 0;
    if ((rc = kvt_req_mamba(b->e, req, &m)))
        return engine_error("kvt_req_mamba", rc);
    return seq % m.decode_grid == 0 && seq > req->protected_len ? checkpoint(b, req, seq) : 0;
}

/* ---- one request ---- */

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
    return compute(b, b->slots + hit, hit, in - hit);
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
        if (compute(b, &b->slots[pos], pos, 1) || decode_checkpoint(b, req, pos + 1) ||
            slide(b, req))
            return -1;
    }
    return 0;
}

static size_t round_up(size_t n, uint32_t ps)
{
    return (n + ps - 1) / ps * ps;
}

/* Tokens of r that get KV: the input and every output token but the last, which is
 * sampled and never fed back. */
static size_t kv_tokens(const struct wl_req *r)
{
    return (size_t)r->input_len + (r->output_len ? r->output_len - 1 : 0);
}

static int serve(struct bench *b, const struct wl_req *r, struct kvt_req *req)
{
    size_t in = r->input_len, kv_len = kv_tokens(r), hit = req->protected_len;
    int rc;

    if (hit && (rc = kvt_req_read(b->e, req, 0, hit, b->slots)))
        return engine_error("kvt_req_read", rc);
    if (b->mm && bench_mm_serve(b->mm, &b->src->w, r, hit, b->c.requests + 1))
        return -1;
    if (verify(b, b->slots, hit, req->load_op) || verify_state(b, req) ||
        make_room(b, round_up(kv_len, b->cfg->page_size) - hit) || prefill(b, req, hit, in) ||
        prefill_checkpoints(b, req, in) || cache_prompt(b, req, in) || decode(b, req, in, kv_len))
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

static int run_request(struct bench *b, const struct wl_req *r)
{
    size_t in = r->input_len, kv_len = kv_tokens(r);
    struct kvt_key key = {.tokens = b->tokens, .len = in - 1};
    struct kvt_req req;
    int rc;

    wl_input_tokens(&b->src->w, r, b->tokens);
    for (size_t i = in; i < kv_len; i++)
        b->tokens[i] = wl_output_token(r, (uint32_t)(i - in));
    hash_tokens(b, 0, kv_len);
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

/* Test seam: flip the first byte of every state slot's first conv state (the cached
 * checkpoints among them; no request runs now). The public calls write only a request's own
 * slots, so this goes through the buffer's address, which on the sim backend is host memory. */
static int corrupt_states(struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};
    void *base;
    size_t bytes;
    int rc;

    if (!hybrid(b))
        return 0;
    if ((rc = kvt_stats(b->e, &st)) || (rc = kvt_mamba_buffer(b->e, 0, 0, &base, &bytes)))
        return engine_error("kvt_mamba_buffer", rc);
    if (st.backend != KVT_BACKEND_SIM)
        return say("--corrupt-after: a hybrid model's states are damaged on the sim backend only");
    for (uint64_t s = 1; s <= st.mamba_slots; s++)
        ((uint8_t *)base)[s * bytes] ^= 0x5a;
    return 0;
}

/* Test seam: flip one byte of the first cached page of r's input, as a faulty tier would (and,
 * for a hybrid model, of the checkpoints). */
static int corrupt_cached_page(struct bench *b, const struct wl_req *r)
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
    return corrupt_states(b);
}

/* ---- the workload, a request at a time ---- */

/* Open the source, or go back to its first request; take at most limit (0: all). */
static int source_start(struct source *s, uint64_t limit)
{
    char err[512];
    int rc;

    s->limit = limit;
    s->seen = s->taken = 0;
    if (s->cfg->trace) {
        /* Rewinding a file just opened finds a pipe before a pass is spent on it. */
        if (!s->trace && wl_trace_open(s->cfg->trace, 0, &s->trace, err, sizeof(err)))
            return say(err);
        return wl_trace_rewind(s->trace, err, sizeof(err)) ? say(err) : 0;
    }
    /* A generator starts over from its seed. */
    wl_synth_close(s->synth);
    s->synth = NULL;
    if ((rc = wl_synth_open(s->cfg->synthetic, s->cfg->seed, &s->synth)))
        return engine_error("--synthetic", rc);
    return 0;
}

/* The next request of the workload, this shard's or not: 1; 0 past the last; -1 after saying
 * why. */
static int source_read(struct source *s)
{
    char err[512];
    int rc = 1;

    if (s->limit && s->seen == s->limit)
        return 0;
    wl_clear(&s->w);
    if (s->trace && (rc = wl_trace_next(s->trace, &s->w, err, sizeof(err))) < 0)
        return say(err);
    if (s->synth)
        wl_synth_next(s->synth, &s->w);
    s->seen += rc == 1;
    return rc;
}

/* The next request of this shard into *r, valid until the next call: 1; 0 past the last; -1
 * after saying why. */
static int source_next(struct source *s, const struct wl_req **r)
{
    const struct config *cfg = s->cfg;
    int rc;

    while ((rc = source_read(s)) == 1 && cfg->shards && (s->seen - 1) % cfg->shards != cfg->shard)
        ;
    if (rc == 1) {
        s->taken++;
        *r = &s->w.reqs[0];
    }
    return rc;
}

static void source_close(struct source *s)
{
    wl_trace_close(s->trace);
    wl_synth_close(s->synth);
    wl_free(&s->w);
}

static uint64_t request_tokens(const struct wl_req *r)
{
    return (uint64_t)r->input_len + r->output_len;
}

/* The first pass: how many requests there are and the longest, which sizes the engine. */
static int survey(struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint64_t limit = cfg->requests || cfg->trace ? cfg->requests : DEFAULT_SYNTHETIC_REQUESTS;
    char clip[CLI_PATH_ECHO_MAX + 4];
    const struct wl_req *r;
    int rc;

    struct cli_progress pg;

    if (source_start(b->src, limit))
        return -1;
    cli_progress_start(&pg);
    while ((rc = source_next(b->src, &r)) == 1) {
        uint64_t slots = round_up(request_tokens(r), cfg->page_size);
        b->nreqs++;
        if (request_tokens(r) > b->max_tokens)
            b->max_tokens = request_tokens(r);
        b->slots_taken += slots < UINT64_MAX - b->slots_taken ? slots : UINT64_MAX - b->slots_taken;
        if (cli_progress_due(&pg))
            cli_progress_line("sizing the engine: %" PRIu64 " requests of the workload read "
                              "(%.0f/s)",
                              b->nreqs, (double)b->nreqs / cli_progress_seconds(&pg));
    }
    cli_progress_end(&pg);
    if (rc == 0 && b->nreqs == 0) {
        fprintf(stderr, "%s: %s: no requests\n", PROG,
                cli_clip(cfg->trace, CLI_PATH_ECHO_MAX, clip));
        return -1;
    }
    return rc;
}

/* The second pass reads the trace again: it must still be the trace the engine was sized
 * for, or the request buffers would not hold it. */
static int trace_changed(const struct bench *b)
{
    char clip[CLI_PATH_ECHO_MAX + 4];

    fprintf(stderr, "%s: %s changed while it was replayed (it is read twice)\n", PROG,
            cli_clip(b->cfg->trace, CLI_PATH_ECHO_MAX, clip));
    return -1;
}

/* ---- progress ---- */

static void progress(const struct bench *b, const struct cli_progress *pg)
{
    double s = cli_progress_seconds(pg);

    cli_progress_line(
        "%" PRIu64 "/%" PRIu64 " requests  %.0f req/s  %.1f%% of input tokens hit", b->c.requests,
        b->nreqs, s > 0 ? (double)b->c.requests / s : 0.0,
        b->c.tokens_total ? 100.0 * (double)served_tokens(&b->c) / (double)b->c.tokens_total : 0.0);
}

/* One request of the second pass: 1 served, 0 past the last, -1 on an error (said). */
static int replay_one(struct bench *b)
{
    const struct wl_req *r;
    int rc = source_next(b->src, &r);

    if (rc == 0 && b->c.requests != b->nreqs)
        return trace_changed(b);
    if (rc != 1)
        return rc;
    if (request_tokens(r) > b->max_tokens)
        return trace_changed(b);
    if (run_request(b, r) || (b->c.requests == b->cfg->corrupt_after && corrupt_cached_page(b, r)))
        return -1;
    return 1;
}

static int replay(struct bench *b)
{
    uint64_t t0 = now_ns();
    struct cli_progress pg;
    int rc = source_start(b->src, b->src->limit); /* the same requests the survey went through */

    cli_progress_start(&pg);
    while (rc == 0 && (rc = replay_one(b)) == 1) {
        rc = 0;
        if (cli_progress_due(&pg))
            progress(b, &pg);
    }
    cli_progress_end(&pg);
    /* With a backlog the last requests' disk ops are still flying: they count in the time. */
    if (rc == 0 && b->cfg->disk_backlog && (rc = kvt_sync(b->e)))
        return engine_error("kvt_sync", rc);
    b->seconds = (double)(now_ns() - t0) / 1e9;
    /* The figures once every transfer has landed, outside the time: a load the last request
     * waited for layer by layer may still be finishing its bookkeeping (its bytes counted at
     * completion, after its last layer's mark), and a report that raced it would vary. */
    b->st.size = sizeof(b->st);
    if (rc == 0 && ((rc = kvt_sync(b->e)) || (rc = kvt_stats(b->e, &b->st))))
        return engine_error("kvt_stats", rc);
    return rc;
}

/* ---- kvt_open's errors, told in terms of the options given ---- */

/* Tokens of a page of the disk and remote tiers that --store-page-tokens asks for (when it
 * is left to kvt_open, which chooses by bytes, the least it can be). */
static uint64_t store_page_tokens(const struct config *cfg)
{
    return cfg->store_page_tokens ? cfg->store_page_tokens : cfg->page_size;
}

/* Bytes of the disk tier's slab files for --disk-tokens (docs/formats.md): a page below 4 KiB
 * takes its bytes and its head (160 bytes and 4 a token) in 64-byte steps, a larger one its
 * whole blocks and one more for the rest and the head. */
static uint64_t disk_bytes(const struct config *cfg, uint64_t ps)
{
    uint64_t page = kvt_cell_bytes(&cfg->g) * ps, head = 160 + 4 * ps, slot;

    if (page < 4096)
        slot = ((page + 7) / 8 * 8 + head + 63) / 64 * 64;
    else
        slot = page / 4096 * 4096 + ((page % 4096 + 7) / 8 * 8 + head + 4095) / 4096 * 4096;
    return (cfg->disk_tokens + ps - 1) / ps * slot;
}

/* What is wrong with --dir for an error of the data dir, and what to do; NULL for
 * KVT_EFINGERPRINT, -ENOSPC and -EDQUOT (dir_error words them) and for errors of other
 * parts. */
static const char *dir_problem(int rc)
{
    switch (rc) {
    case KVT_EFORMAT:
        return "not a kvtier data dir (it holds other files), or one a newer kvtier wrote: give "
               "a new or empty dir, or a kvtier data dir";
    case KVT_ECORRUPT:
        return "its index is damaged: look with kvtier-ctl verify, or use another --dir";
    case -EBUSY:
        return "another process (an engine, or another kvtier-bench) has it open: wait for it "
               "to end, or use another --dir";
    case -ENOENT:
        return "its parent dir does not exist (only the last part of the path is created): "
               "create the parent first";
    case -ENOTDIR:
        return "it, or a dir on its path, is not a directory: give a directory's path";
    case -EACCES:
    case -EPERM:
        return "permission denied: give a dir this user may create and write";
    case -EROFS:
        return "on a read-only file system: give a dir on a writable one";
    case -ENAMETOOLONG:
        return "the path is too long";
    case -ELOOP:
        return "too many symbolic links on its path";
    case -EIO:
        return "an I/O error reading or writing it: check the disk, or use another --dir";
    default:
        return NULL;
    }
}

/* Whether rc is an error of the data dir, which dir_error words. */
static bool is_dir_error(const struct config *cfg, int rc)
{
    char entry[2 * CLI_PATH_ECHO_MAX + 128];

    return dir_problem(rc) || rc == KVT_EFINGERPRINT || rc == -ENOSPC || rc == -EDQUOT ||
           (rc > -4096 && cli_dir_problem(cfg->dir, cfg->dir, entry, sizeof(entry)));
}

/* The options of kvt_open that name a path or a server, for an error none of them explains:
 * which ones this run gave, in buf. */
static const char *open_paths(const struct config *cfg, char *buf, size_t len)
{
    char clip[CLI_PATH_ECHO_MAX + 4];
    size_t n = 0;

    buf[0] = '\0';
    if (cfg->dir)
        n += (size_t)snprintf(buf + n, len - n, " --dir %s",
                              cli_clip(cfg->dir, CLI_PATH_ECHO_MAX, clip));
    if (cfg->remote && n < len)
        n += (size_t)snprintf(buf + n, len - n, " --remote %s",
                              cli_clip(cfg->remote, CLI_PATH_ECHO_MAX, clip));
    if (cfg->remote_tls_ca && n < len)
        n += (size_t)snprintf(buf + n, len - n, " --remote-tls-ca %s",
                              cli_clip(cfg->remote_tls_ca, CLI_PATH_ECHO_MAX, clip));
    if (cfg->remote_tls_cert && n < len)
        snprintf(buf + n, len - n, " --remote-tls-cert %s",
                 cli_clip(cfg->remote_tls_cert, CLI_PATH_ECHO_MAX, clip));
    return buf;
}

static int dir_error(const struct bench *b, int rc)
{
    const struct config *cfg = b->cfg;
    char clip[CLI_PATH_ECHO_MAX + 4], size[32], entry[2 * CLI_PATH_ECHO_MAX + 128];
    const char *dir = cli_clip(cfg->dir, CLI_PATH_ECHO_MAX, clip), *what = dir_problem(rc);

    /* A bare errno about a file in the dir: which one, when one is of the wrong kind. */
    if (rc > -4096 && rc != -EBUSY && cli_dir_problem(cfg->dir, dir, entry, sizeof(entry)))
        fprintf(stderr, "%s: --dir %s: %s (%s): remove it, or use another --dir\n", PROG, dir,
                entry, kvt_strerror(rc));
    else if (what)
        fprintf(stderr, "%s: --dir %s: %s\n", PROG, dir, what);
    else if (rc == KVT_EFINGERPRINT)
        fprintf(stderr,
                "%s: --dir %s holds the KV of another model, geometry, page size or seed than "
                "this run's (--geometry %s, --page-size %u, --seed %" PRIu64 "): use another "
                "--dir, or the --geometry, --page-size and --seed it was written with\n",
                PROG, dir, cfg->geometry_arg, cfg->page_size, cfg->seed);
    else if (rc == -ENOSPC || rc == -EDQUOT)
        fprintf(stderr,
                "%s: --dir %s: no room on its file system for the %s of slab files "
                "--disk-tokens %" PRIu64 " takes: free some, or lower --disk-tokens\n",
                PROG, dir, cli_size(disk_bytes(cfg, b->store_pages), size), cfg->disk_tokens);
    return -1;
}

/* kvt_open refused the options (Invalid argument), past what parse_args checks: every
 * size given. */
static int invalid_error(const struct config *cfg)
{
    fprintf(stderr,
            "%s: kvt_open refused these options (invalid argument): --geometry %s, "
            "--page-size %u, --device-tokens %" PRIu64 ", --host-tokens %" PRIu64
            ", --disk-tokens %" PRIu64 "\n",
            PROG, cfg->geometry_arg, cfg->page_size, cfg->device_tokens, cfg->host_tokens,
            cfg->disk_tokens);
    return -1;
}

/* kvt_open's error rc, named by the option that most likely caused it, with what to do. */
static int open_error(const struct bench *b, int rc)
{
    const struct config *cfg = b->cfg;
    uint64_t cell = kvt_cell_bytes(&cfg->g);
    char size[32];

    if (cfg->dir && is_dir_error(cfg, rc))
        return dir_error(b, rc);
    switch (rc) {
    case KVT_EHOSTRAM:
        fprintf(stderr,
                "%s: --host-tokens %" PRIu64 ": a host pool of %s does not fit in the memory "
                "available now: lower --host-tokens\n",
                PROG, cfg->host_tokens, cli_size(cfg->host_tokens * cell, size));
        return -1;
    case KVT_EHOSTSIZE:
        fprintf(stderr,
                "%s: --host-tokens %" PRIu64 " must be larger than the device pool "
                "(--device-tokens %" PRIu64 ") in whole pages of %u tokens\n",
                PROG, cfg->host_tokens, cfg->device_tokens, cfg->page_size);
        return -1;
    case KVT_ENOBACKEND:
        if (cfg->remote) {
            fprintf(stderr,
                    "%s: --remote: not built in (kvtier was built without the Redis store)\n",
                    PROG);
            return -1;
        }
        /* fall through */
    case KVT_EBACKEND:
        fprintf(stderr, "%s: --backend %s: %s%s\n", PROG, backend_names[cfg->backend],
                kvt_strerror(rc), rc == KVT_ENOBACKEND ? ": use --backend sim" : "");
        return -1;
    case -ENOMEM:
        /* The device pool is the likeliest; the disk tier's index maps its share too. */
        fprintf(stderr,
                "%s: out of memory opening the engine, for a device pool of %s (--device-tokens "
                "%" PRIu64 " of %" PRIu64 " bytes, --geometry %s)%s: lower --device-tokens%s\n",
                PROG, cli_size(cfg->device_tokens * cell, size), cfg->device_tokens, cell,
                cfg->geometry_arg, cfg->dir ? " and the index of the disk tier" : "",
                cfg->dir ? " or --disk-tokens" : "");
        return -1;
    case -EINVAL:
        if (cfg->remote_tls_ca || cfg->remote_tls_cert) {
            fprintf(stderr,
                    "%s: --remote-tls-ca, --remote-tls-cert or --remote-tls-key: a file holds no "
                    "usable PEM certificate or key (or the key is not the certificate's)\n",
                    PROG);
            return -1;
        }
        return invalid_error(cfg);
    default: {
        char paths[4 * CLI_PATH_ECHO_MAX + 96];

        open_paths(cfg, paths, sizeof(paths));
        fprintf(stderr, "%s: kvt_open: %s%s%s%s\n", PROG, kvt_strerror(rc),
                *paths ? " (opening the engine with" : "", paths, *paths ? ")" : "");
        return -1;
    }
    }
}

/* ---- setup ---- */

/* The sim backend's device pool is host memory, mapped at open and touched as slots are
 * written: what the replay will touch (the pool, or every slot its requests take when that
 * is less) must fit in this machine's RAM, or the run would end killed for memory. */
static int check_sim_memory(const struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};
    uint64_t cell = kvt_cell_bytes(&b->cfg->g), ram, touched;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    char a[32], c[32];

    if (kvt_stats(b->e, &st) || st.backend != KVT_BACKEND_SIM || pages <= 0 || page <= 0)
        return 0;
    ram = (uint64_t)pages * (uint64_t)page;
    touched = b->slots_taken < UINT64_MAX / cell ? b->slots_taken * cell : UINT64_MAX;
    if (touched > st.kv_pool_bytes)
        touched = st.kv_pool_bytes;
    if (touched <= ram)
        return 0;
    fprintf(
        stderr,
        "%s: the sim backend keeps the device pool in host memory, and this run could fill up to "
        "%s of it (--device-tokens %" PRIu64 " of %" PRIu64 " bytes, --geometry %s) on a "
        "machine with %s: lower --device-tokens or --requests, or pick a smaller "
        "--geometry\n",
        PROG, cli_size(touched, a), b->cfg->device_tokens, cell, b->cfg->geometry_arg,
        cli_size(ram, c));
    return -1;
}

/* Before anything is allocated for it: the longest request must fit the device pool. */
static int check_fit(const struct bench *b)
{
    uint32_t ps = b->cfg->page_size;
    uint64_t pool = b->cfg->device_tokens / ps * ps;

    if (b->max_tokens + ps > INT32_MAX) {
        fprintf(stderr, "%s: a request of %" PRIu64 " tokens is too long\n", PROG, b->max_tokens);
        return -1;
    }
    if (pool < round_up(b->max_tokens, ps)) {
        fprintf(stderr,
                "%s: the longest request needs %zu slots, --device-tokens %" PRIu64
                " gives %" PRIu64 " (whole pages of %u): raise --device-tokens\n",
                PROG, round_up(b->max_tokens, ps), b->cfg->device_tokens, pool, ps);
        return -1;
    }
    return 0;
}

/* State slots: --mamba-slots, or as many as MAMBA_MEMORY_RATIO of the KV pool's bytes hold
 * (MAMBA_MIN_SLOTS at least: two for the request, the rest checkpoints). */
static uint64_t mamba_slots(const struct config *cfg)
{
    uint64_t state = cfg->mamba.layers * (cfg->mamba.conv_bytes + cfg->mamba.ssm_bytes);
    uint64_t n;

    if (!cfg->mamba.layers)
        return 0;
    if (cfg->mamba_slots)
        return cfg->mamba_slots;
    n = (uint64_t)(MAMBA_MEMORY_RATIO * (double)cfg->device_tokens *
                   (double)kvt_cell_bytes(&cfg->g) / (double)state);
    return n < MAMBA_MIN_SLOTS ? MAMBA_MIN_SLOTS : n > INT32_MAX - 1 ? INT32_MAX - 1 : n;
}

/* The KV bytes are a function of the tokens and --seed (hash_tokens), so a seed other than the
 * default one is part of the model id: a dir or a remote tier holding another seed's KV is
 * another fingerprint's (a dir refused, a remote tier other keys), never pages that fail the
 * verifier. Seed 1 keeps the id --geometry alone, as dirs written before it was added have. */
static int make_model_id(struct bench *b)
{
    const struct config *cfg = b->cfg;
    size_t len = strlen(cfg->geometry_arg) + 32;

    if (!(b->model_id = malloc(len)))
        return -1;
    if (cfg->seed == 1)
        snprintf(b->model_id, len, "%s", cfg->geometry_arg);
    else
        snprintf(b->model_id, len, "%s;kv-seed=%" PRIu64, cfg->geometry_arg, cfg->seed);
    return 0;
}

static int open_engine(struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint32_t ps = cfg->page_size;
    struct kvt_options o;

    kvt_options_init(&o, sizeof(o));
    o.geometry = cfg->g;
    o.page_size = ps;
    o.backend = cfg->backend;
    o.sim_serial = cfg->serial;
    o.device_tokens = cfg->device_tokens;
    o.max_requests = 1;
    o.max_context = (uint32_t)round_up(b->max_tokens, ps);
    o.evict_policy = cfg->policy;
    if (make_model_id(b)) {
        fprintf(stderr, "%s: out of memory\n", PROG);
        return -1;
    }
    o.model_id = b->model_id;
    o.tp_size = cfg->tp_size;
    o.host_tokens = cfg->host_tokens;
    o.write_policy = cfg->write_policy;
    o.mamba = cfg->mamba;
    o.mamba.slots = (uint32_t)mamba_slots(cfg);
    if (cfg->swa_window)
        o.swa = (struct kvt_swa){cfg->swa_window, b->nfull, b->full_ids, cfg->swa_tokens};
    o.store_page_tokens = (uint32_t)cfg->store_page_tokens;
    /* Without a disk or remote tier there is no store page; 0: kvt_open refuses the options
     * and says so. */
    b->store_pages = cfg->disk_tokens || cfg->remote ? kvt_store_page_tokens(&o) : ps;
    if (!b->store_pages)
        b->store_pages = ps;
    if (cfg->disk_tokens) {
        o.disk_dir = cfg->dir;
        o.disk_bytes = disk_bytes(cfg, b->store_pages);
        o.disk_sync = cfg->disk_sync;
    }
    o.remote = cfg->remote;
    o.remote_tls_ca = cfg->remote_tls_ca;
    o.remote_tls_cert = cfg->remote_tls_cert;
    o.remote_tls_key = cfg->remote_tls_key;
    if (bench_mm_wanted(cfg->synthetic))
        bench_mm_options(&cfg->mm, cfg->device_tokens * kvt_cell_bytes(&cfg->g), &o);
    int rc = kvt_open(&o, &b->e);
    if (rc)
        return open_error(b, rc);
    if (check_sim_memory(b))
        return -1;
    if (kvt_available(b->e) < o.max_context) {
        fprintf(stderr,
                "%s: the longest request needs %u slots, the device pool has %zu: raise "
                "--device-tokens%s\n",
                PROG, o.max_context, kvt_available(b->e),
                cfg->swa_window ? " or --swa-tokens" : "");
        return -1;
    }
    return 0;
}

/* Rows per chunk: CHUNK_TOKENS, halved while a buffer would pass CHUNK_BYTES, but a page at
 * least. */
static size_t chunk_tokens(size_t row, uint32_t ps)
{
    size_t n = CHUNK_TOKENS;

    while (n > ps && n * row > CHUNK_BYTES)
        n /= 2;
    return n;
}

/* The request's tokens, hashes and slots (the longest request's worth, which the device
 * pool holds: check_fit) and a chunk of K and V rows. */
static int alloc_buffers(struct bench *b)
{
    size_t n = (size_t)b->max_tokens, want = b->row[0] > b->row[1] ? b->row[0] : b->row[1];
    size_t row = want;

    for (int part = 0; hybrid(b) && part < 2; part++) {
        b->state[part] = malloc(state_part_bytes(b, part));
        if (!b->state[part])
            return say("out of memory for a recurrent layer's state");
        if (state_part_bytes(b, part) > want)
            want = state_part_bytes(b, part);
    }
    b->chunk = chunk_tokens(row, b->cfg->page_size);
    b->tokens = malloc(n * sizeof(*b->tokens));
    b->hash = malloc(n * sizeof(*b->hash));
    b->slots = malloc(n * sizeof(*b->slots));
    for (int x = 0; x < 2; x++)
        b->buf[x] = malloc(b->chunk * b->row[x] + 1);
    b->want = malloc(want);
    if (b->tokens && b->hash && b->slots && b->buf[0] && b->buf[1] && b->want)
        return 0;
    fprintf(stderr,
            "%s: out of memory for the buffers of requests of %zu tokens and chunks of %zu rows "
            "of %zu bytes (--geometry %s)\n",
            PROG, n, b->chunk, want, b->cfg->geometry_arg);
    return -1;
}

static int setup(struct bench *b)
{
    const struct kvt_geometry *g = &b->cfg->g;

    if (g->attention == KVT_ATTN_MLA) {
        b->row[0] = (size_t)(g->kv_lora_rank + g->qk_rope_head_dim) * g->dtype_bytes;
    } else {
        b->row[0] = (size_t)g->kv_heads * g->head_dim * g->dtype_bytes;
        b->row[1] =
            (size_t)g->kv_heads * (g->v_head_dim ? g->v_head_dim : g->head_dim) * g->dtype_bytes;
    }
    if (b->cfg->swa_window) {
        b->full_ids = malloc(g->layers * sizeof(*b->full_ids));
        if (!b->full_ids)
            return say("out of memory");
        for (uint32_t l = 0; l < g->layers; l++)
            if (!swa_layer(b, l))
                b->full_ids[b->nfull++] = l;
        b->nswa = g->layers - b->nfull;
    }
    if (check_fit(b) || open_engine(b))
        return -1;
    if (bench_mm_wanted(b->cfg->synthetic) &&
        bench_mm_open(&b->cfg->mm, kvt_cell_bytes(g), b->cfg->page_size, b->e, &b->mm))
        return -1;
    return alloc_buffers(b);
}

static void teardown(struct bench *b)
{
    bench_mm_close(b->mm); /* its holds go before the engine */
    kvt_close(b->e);
    free(b->tokens);
    free(b->hash);
    free(b->slots);
    free(b->buf[0]);
    free(b->buf[1]);
    free(b->want);
    free(b->state[0]);
    free(b->state[1]);
    free(b->full_ids);
    free(b->model_id);
}

/* ---- report ---- */

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static void print_bytes(uint64_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    size_t u = 0;

    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    printf(u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static const char *backend_in_use(const struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};

    if (!b->e || kvt_stats(b->e, &st))
        return "?";
    return backend_names[st.backend];
}

static void print_source(const struct config *cfg)
{
    if (cfg->trace)
        printf("trace %s", cfg->trace);
    else
        printf("synthetic \"%s\" (seed %" PRIu64 ")", cfg->synthetic, cfg->seed);
    if (cfg->shards)
        printf(", shard %u of %u", cfg->shard, cfg->shards);
}

/* A hybrid model: the KV a KV-only cache would have served, what the checkpoints back, and
 * the work saved per layer kind. */
static void print_hybrid(const struct bench *b)
{
    const struct config *cfg = b->cfg;
    const struct counters *c = &b->c;
    uint64_t kv = b->st.mamba_kv_hit_tokens, state = served_tokens(c);

    printf("  recurrent     %u layers, ", cfg->mamba.layers);
    print_bytes(cfg->mamba.layers * (cfg->mamba.conv_bytes + cfg->mamba.ssm_bytes));
    printf(" a state, %" PRIu64 " slots (", b->st.mamba_slots);
    print_bytes(b->st.mamba_pool_bytes);
    printf("); %" PRIu64 " checkpoints taken, %" PRIu64 " evicted for room\n", c->checkpoints,
           b->st.mamba_evicted_states);
    if (b->st.mamba_host_slots)
        printf("  on the host   %" PRIu64 " states saved beside their KV, %" PRIu64
               " restored, %" PRIu64 " of %" PRIu64 " kept at the end\n",
               b->st.mamba_saved_states, b->st.mamba_restored_states, b->st.mamba_host_states,
               b->st.mamba_host_slots);
    if (cfg->disk_tokens || cfg->remote)
        printf("  below         %" PRIu64 " checkpoints written with their pages, %" PRIu64
               " read back with their KV\n",
               b->st.mamba_stored_states, b->st.mamba_fetched_states);
    printf("  state-backed  %" PRIu64 " of %" PRIu64 " tokens of KV found (%.1f%% lost to "
           "checkpoint alignment and tombstones)\n",
           state, kv, kv ? pct(kv - state, kv) : 0.0);
    printf("  saved         %" PRIu64 " tokens in each of %u attention and %u recurrent layers; "
           "%" PRIu64 " states verified\n",
           state, cfg->g.layers, cfg->mamba.layers, c->states_checked);
}

/* A sliding-window model: the memory the window saves, and what it costs in hits. */
static void print_window(const struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint64_t kv = b->st.swa_kv_hit_tokens, served = served_tokens(&b->c);

    printf("  window        %u tokens: %u full and %u sliding-window layers; SWA pool %" PRIu64
           " tokens; KV pool ",
           cfg->swa_window, b->nfull, b->nswa, b->st.swa_tokens);
    print_bytes(b->st.kv_pool_bytes);
    printf(" (");
    print_bytes((cfg->device_tokens / cfg->page_size + 1) * cfg->page_size *
                kvt_cell_bytes(&cfg->g));
    printf(" without the window)\n");
    printf("  window-backed %" PRIu64 " of %" PRIu64 " tokens of KV found (%.1f%% lost where "
           "the window's KV was freed); released %" PRIu64 ", evicted %" PRIu64 ", revived %" PRIu64
           "\n",
           served, kv, kv ? pct(kv - served, kv) : 0.0, b->st.swa_released_tokens,
           b->st.swa_evicted_tokens, b->st.swa_revived_tokens);
}

static void print_text(const struct bench *b)
{
    const struct config *cfg = b->cfg;
    const struct counters *c = &b->c;
    uint64_t cell = kvt_cell_bytes(&cfg->g);

    printf("%s: %" PRIu64 " requests of ", PROG, c->requests);
    print_source(cfg);
    printf("\n  engine        geometry %s (%" PRIu64
           " B/token), page %u, %s eviction, %s backend\n",
           cfg->geometry_arg, cell, cfg->page_size, policy_names[cfg->policy], backend_in_use(b));
    printf("  tiers         device %" PRIu64 " tokens (", cfg->device_tokens);
    print_bytes(cfg->device_tokens * cell);
    printf("); host ");
    if (cfg->host_tokens) {
        printf("%" PRIu64 " tokens (", cfg->host_tokens);
        print_bytes(cfg->host_tokens * cell);
        printf(b->st.host_pinned ? ", pinned)" : ", not pinned)");
    } else {
        printf("none");
    }
    if (cfg->disk_tokens) {
        printf("; disk %" PRIu64 " tokens in %s (", b->st.disk_tokens, cfg->dir);
        print_bytes(b->st.disk_tokens * cell);
        printf(", %s, %s", b->st.disk_io == KVT_DISK_IO_URING ? "io_uring" : "pread/pwrite",
               disk_sync_names[cfg->disk_sync]);
        if (b->store_pages != cfg->page_size)
            printf(", pages of %" PRIu32 " tokens", b->store_pages);
        printf(")\n");
    } else {
        printf("; disk none\n");
    }
    if (cfg->remote)
        printf("                remote %s\n", cfg->remote);
    uint64_t served = served_tokens(c);
    printf("  input tokens  %" PRIu64 "\n", c->tokens_total);
    printf("  from cache    %" PRIu64 " (%.1f%%): device %" PRIu64 ", host %" PRIu64
           ", disk %" PRIu64,
           served, pct(served, c->tokens_total), c->hit_device, c->hit_host, c->hit_disk);
    if (cfg->remote)
        printf(", remote %" PRIu64, c->hit_remote);
    printf("\n");
    printf("  recomputed    %" PRIu64 " (%.1f%%): %.2fx less prefill than without a cache\n",
           c->computed, pct(c->computed, c->tokens_total),
           c->computed ? (double)c->tokens_total / (double)c->computed : 0.0);
    if (hybrid(b))
        print_hybrid(b);
    if (cfg->swa_window)
        print_window(b);
    if (b->mm)
        bench_mm_print(b->mm);
    printf("  verified      %" PRIu64 " pages served from cache, %" PRIu64 " mismatches\n",
           c->pages_checked, c->mismatches);
    printf("  data moved    compute -> device ");
    print_bytes(c->bytes_compute);
    printf(", device -> verifier ");
    print_bytes(c->bytes_verify);
    if (cfg->host_tokens) {
        printf(",\n                device -> host ");
        print_bytes(b->st.d2h_bytes);
        printf(", host -> device ");
        print_bytes(b->st.h2d_bytes);
    }
    if (cfg->disk_tokens) {
        printf(",\n                host -> disk ");
        print_bytes(b->st.disk_written_bytes);
        printf(", disk -> host ");
        print_bytes(b->st.disk_read_bytes);
    }
    printf("\n  evicted       %" PRIu64 " tokens from the device", b->st.evicted_tokens);
    if (cfg->host_tokens)
        printf(", %" PRIu64 " from the host", b->st.host_evicted_tokens);
    printf("\n");
    if (cfg->disk_tokens && b->st.disk_errors)
        printf("  disk errors   %" PRIu64 " (pages found damaged or not written: not served)\n",
               b->st.disk_errors);
    if (cfg->remote && b->st.remote_errors)
        printf("  remote errors %" PRIu64 " (pages failed, refused or found damaged: not served;"
               " kvtier-ctl remote stat URL says why)\n",
               b->st.remote_errors);
    printf("  time          %.2f s, %.0f input tokens/s (%" PRIu64 " decode steps)\n", b->seconds,
           b->seconds > 0 ? (double)c->tokens_total / b->seconds : 0.0, c->decoded);
}

static void print_json_config(const struct bench *b)
{
    const struct config *cfg = b->cfg;

    printf("\"config\":{\"trace\":");
    cli_json_string(cfg->trace);
    printf(",\"synthetic\":");
    cli_json_string(cfg->synthetic);
    printf(",\"seed\":%" PRIu64 ",\"shard\":", cfg->seed);
    if (cfg->shards)
        printf("\"%u/%u\"", cfg->shard, cfg->shards);
    else
        printf("null");
    printf(",\"geometry\":");
    cli_json_string(cfg->geometry_arg);
    printf(",\"cell_bytes\":%" PRIu64 ",\"page_size\":%u,\"device_tokens\":%" PRIu64
           ",\"host_tokens\":%" PRIu64 ",\"disk_tokens\":%" PRIu64 ",\"dir\":",
           kvt_cell_bytes(&cfg->g), cfg->page_size, cfg->device_tokens, cfg->host_tokens,
           cfg->disk_tokens);
    cli_json_string(cfg->dir);
    if (cfg->remote) {
        printf(",\"remote\":");
        cli_json_string(cfg->remote);
    }
    printf(",\"disk_backlog\":%" PRIu64 ",\"deterministic\":%s,\"store_page_tokens\":%" PRIu32,
           cfg->disk_backlog, cfg->deterministic ? "true" : "false", b->store_pages);
    printf(",\"backend\":\"%s\",\"evict_policy\":\"%s\",\"write_policy\":\"%s\"}",
           backend_in_use(b), policy_names[cfg->policy], write_policy_names[cfg->write_policy]);
}

static void print_json(const struct bench *b)
{
    const struct counters *c = &b->c;
    const struct kvt_stats *st = &b->st;

    printf("{\"requests\":%" PRIu64 ",\"tokens_total\":%" PRIu64, c->requests, c->tokens_total);
    printf(",\"tokens_hit\":{\"device\":%" PRIu64 ",\"host\":%" PRIu64 ",\"disk\":%" PRIu64,
           c->hit_device, c->hit_host, c->hit_disk);
    if (b->cfg
            ->remote) /* the remote tier's, apart from the disk's (runs without stay as recorded) */
        printf(",\"remote\":%" PRIu64, c->hit_remote);
    printf("}");
    printf(",\"tokens_computed\":%" PRIu64 ",\"tokens_decoded\":%" PRIu64
           ",\"tokens_evicted\":{\"device\":%" PRIu64 ",\"host\":%" PRIu64 "}",
           c->computed, c->decoded, st->evicted_tokens, st->host_evicted_tokens);
    printf(",\"bytes\":{\"compute_to_device\":%" PRIu64 ",\"device_to_verify\":%" PRIu64
           ",\"device_to_host\":%" PRIu64 ",\"host_to_device\":%" PRIu64
           ",\"host_to_disk\":%" PRIu64 ",\"disk_to_host\":%" PRIu64 "}",
           c->bytes_compute, c->bytes_verify, st->d2h_bytes, st->h2d_bytes, st->disk_written_bytes,
           st->disk_read_bytes);
    printf(",\"disk_errors\":%" PRIu64, st->disk_errors);
    if (b->cfg->remote)
        printf(",\"remote_errors\":%" PRIu64, st->remote_errors);
    printf(",\"seconds\":%.3f,\"tokens_per_second\":%.0f", b->seconds,
           b->seconds > 0 ? (double)c->tokens_total / b->seconds : 0.0);
    printf(",\"verify\":{\"pages_checked\":%" PRIu64 ",\"mismatches\":%" PRIu64 "},",
           c->pages_checked, c->mismatches);
    if (hybrid(b))
        printf("\"mamba\":{\"layers\":%u,\"slots\":%" PRIu64 ",\"kv_hit_tokens\":%" PRIu64
               ",\"state_hit_tokens\":%" PRIu64 ",\"checkpoints\":%" PRIu64
               ",\"evicted_states\":%" PRIu64 ",\"states_checked\":%" PRIu64
               ",\"host_slots\":%" PRIu64 ",\"saved_states\":%" PRIu64
               ",\"restored_states\":%" PRIu64 ",\"stored_states\":%" PRIu64
               ",\"fetched_states\":%" PRIu64 "},",
               b->cfg->mamba.layers, st->mamba_slots, st->mamba_kv_hit_tokens, served_tokens(c),
               c->checkpoints, st->mamba_evicted_states, c->states_checked, st->mamba_host_slots,
               st->mamba_saved_states, st->mamba_restored_states, st->mamba_stored_states,
               st->mamba_fetched_states);
    if (b->cfg->swa_window)
        printf("\"swa\":{\"window\":%u,\"full_layers\":%u,\"swa_tokens\":%" PRIu64
               ",\"kv_pool_bytes\":%" PRIu64 ",\"kv_hit_tokens\":%" PRIu64
               ",\"window_hit_tokens\":%" PRIu64 ",\"released_tokens\":%" PRIu64
               ",\"evicted_tokens\":%" PRIu64 ",\"revived_tokens\":%" PRIu64 "},",
               b->cfg->swa_window, b->nfull, st->swa_tokens, st->kv_pool_bytes,
               st->swa_kv_hit_tokens, served_tokens(c), st->swa_released_tokens,
               st->swa_evicted_tokens, st->swa_revived_tokens);
    if (b->mm)
        bench_mm_json(b->mm);
    print_json_config(b);
    printf("}\n");
}

static void report_mismatch(const struct bench *b)
{
    static const char *const what[] = {"K", "V", "conv state", "SSM state"};
    const struct mismatch *m = &b->first;
    uint32_t ps = b->cfg->page_size;

    fprintf(stderr,
            "%s: VERIFY FAILED: %" PRIu64 " page%s served from the device cache differ from what "
            "was stored; the first: request %" PRIu64 ", tokens %zu-%zu, layer %u, %s\n",
            PROG, b->c.mismatches, b->c.mismatches == 1 ? "" : "s", m->request, m->token / ps * ps,
            m->token / ps * ps + ps - 1, m->layer, what[m->which]);
}

/* ---- command line ---- */

/* --geometry, given the whole config: the geometry, and the argument it came from. */
static int parse_geometry(void *field, const char *opt, const char *arg)
{
    struct config *cfg = field;
    struct cli_hybrid h;
    int rc = cli_parse_model(PROG, arg, &cfg->g, &cfg->tp_size, &h);

    (void)opt;
    if (rc == 0) {
        cfg->geometry_arg = arg;
        cfg->mamba = h.mamba;
        cfg->swa_window = h.swa_window;
        cfg->full_every = h.full_every;
    }
    return rc;
}

/* --synthetic: one of the workloads' names. */
/* --shard K/N: the requests at K modulo N, K from 0. */
static int parse_shard(void *field, const char *opt, const char *val)
{
    struct config *cfg = field;
    unsigned k, n;
    int used = 0;

    if (sscanf(val, "%u/%u%n", &k, &n, &used) != 2 || val[used] || n == 0 || k >= n)
        return cli_bad_usage(PROG, "--shard needs K/N with 0 <= K < N", val);
    (void)opt;
    cfg->shard = k;
    cfg->shards = n;
    return 0;
}

static int parse_synthetic(void *field, const char *opt, const char *val)
{
    (void)opt;
    if (!wl_synthetic_about(val))
        return cli_bad_usage(PROG, "--synthetic: unknown workload (see --help)", val);
    *(const char **)field = val;
    return 0;
}

/* Options that take a count, given the whole config: each has its own bounds and message. */
static int parse_count(void *field, const char *opt, const char *val)
{
    struct config *cfg = field;
    uint64_t v;

    if (!cli_parse_u64(val, &v))
        return cli_bad_usage(PROG, "expected a non-negative integer", opt);
    if (strcmp(opt, "--requests") == 0) {
        if (v == 0)
            return cli_bad_usage(PROG, "--requests needs at least 1", val);
        cfg->requests = v;
    } else if (strcmp(opt, "--page-size") == 0) {
        if (v == 0 || v > 256 || (v & (v - 1)))
            return cli_bad_usage(PROG, "--page-size needs a power of two from 1 to 256", val);
        cfg->page_size = (uint32_t)v;
    } else if (strcmp(opt, "--device-tokens") == 0) {
        if (v == 0 || v >= INT32_MAX)
            return cli_bad_usage(PROG, "--device-tokens needs a count from 1 to 2^31-2", val);
        cfg->device_tokens = v;
    } else if (strcmp(opt, "--host-tokens") == 0) {
        if (v >= INT32_MAX)
            return cli_bad_usage(PROG, "--host-tokens needs a count below 2^31", val);
        cfg->host_tokens = v;
    } else if (strcmp(opt, "--disk-tokens") == 0) {
        if (v >= INT32_MAX)
            return cli_bad_usage(PROG, "--disk-tokens needs a count below 2^31", val);
        cfg->disk_tokens = v;
    } else if (strcmp(opt, "--store-page-tokens") == 0) {
        if (v == 0 || v > 4096)
            return cli_bad_usage(PROG, "--store-page-tokens needs a count from 1 to 4096", val);
        cfg->store_page_tokens = v;
    } else if (strcmp(opt, "--seed") == 0) {
        cfg->seed = v;
    } else if (strcmp(opt, "--disk-backlog") == 0) {
        cfg->disk_backlog = v;
        cfg->backlog_set = true;
    } else if (strcmp(opt, "--swa-tokens") == 0) {
        if (v == 0 || v >= INT32_MAX)
            return cli_bad_usage(PROG, "--swa-tokens needs a count from 1 to 2^31-2", val);
        cfg->swa_tokens = v;
    } else if (strcmp(opt, "--mamba-slots") == 0) {
        if (v < 2 || v >= INT32_MAX)
            return cli_bad_usage(PROG, "--mamba-slots needs a count from 2 to 2^31-2", val);
        cfg->mamba_slots = v;
    } else {
        if (v == 0)
            return cli_bad_usage(PROG, "--corrupt-after needs a request number from 1", val);
        cfg->corrupt_after = v;
    }
    return 0;
}

static void print_workloads(FILE *f)
{
    for (size_t i = 0; wl_synthetic_names[i]; i++)
        fprintf(f, "                          %-6s %s\n", wl_synthetic_names[i],
                wl_synthetic_about(wl_synthetic_names[i]));
}

static void print_presets(FILE *f)
{
    cli_print_presets(f, "                          ");
}

/* Figures the help quotes, as strings. */
#define SYNTHETIC_REQUESTS_S CLI_STR(DEFAULT_SYNTHETIC_REQUESTS)
#define DEVICE_TOKENS_S CLI_STR(DEFAULT_DEVICE_TOKENS)

#define OFF(f) offsetof(struct config, f)
static const struct cli_option options[] = {
    {.kind = CLI_TEXT, .help = "\nWorkload (default: --synthetic " DEFAULT_SYNTHETIC "):\n"},
    {"--trace", CLI_STRING, OFF(trace), .arg = "FILE",
     .help = "a Mooncake trace: JSON lines with input_length,\n"
             "output_length and hash_ids (512-token blocks), at most\n"
             "16 MiB a line. It is read twice, a line at a time (once\n"
             "to size the engine, once to replay), so it must be a\n"
             "file, not a pipe"},
    {"--synthetic", CLI_CUSTOM, OFF(synthetic), .parse = parse_synthetic, .arg = "NAME",
     .help = "a generated workload:", .more = print_workloads},
    {"--requests", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "replay the first N requests of a trace (default all), or\n"
             "generate N (default " SYNTHETIC_REQUESTS_S ", at most 2^40); one is held at\n"
             "a time"},
    {"--shard", CLI_CUSTOM, .parse = parse_shard, .arg = "K/N",
     .help = "replay only the workload's requests at K modulo N (K from\n"
             "0), so that N processes split one workload between them\n"
             "(--requests counts the workload's, before the split)"},
    {"--seed", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "seeds the synthetic workload and the KV content (default\n"
             "1); a dir or remote tier holding another seed's KV is\n"
             "another model's to this run"},
    {.kind = CLI_TEXT, .help = "\nEngine:\n"},
    {"--geometry", CLI_CUSTOM, .parse = parse_geometry, .arg = "G",
     .help = "a preset, or key=value pairs, or a preset then pairs, comma\n"
             "separated (keys: attention=mha|mla, layers, kv_heads,\n"
             "head_dim, v_head_dim, kv_lora_rank, qk_rope_head_dim,\n"
             "dtype_bytes, tp_size; a hybrid model's recurrent layers:\n"
             "mamba_layers, conv_bytes, ssm_bytes, per layer and rank;\n"
             "sliding-window layers: swa_window and full_every, every\n"
             "full_every-th layer full attention; mamba_layers=0 or\n"
             "swa_window=0 drops them). Default tiny. Presets:",
     .more = print_presets},
    {"--mamba-slots", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "a hybrid model's state slots (two for the running\n"
             "request, the rest cached checkpoints); default as many as\n"
             "0.9 of the device KV pool's bytes hold (SGLang's\n"
             "mamba_full_memory_ratio), 4 at least"},
    {"--swa-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "a sliding-window model's SWA slots (its window layers' KV\n"
             "pool); default 0.8 of --device-tokens (SGLang's\n"
             "swa_full_tokens_ratio)"},
    {"--page-size", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "tokens per page, a power of two up to 256 (default 16)"},
    {"--device-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "device KV pool size in tokens (default " DEVICE_TOKENS_S "), below 2^31\n"
             "with a page of padding; the sim backend keeps it in host\n"
             "memory, and a run that could fill more of it than this\n"
             "machine's RAM is refused"},
    {"--host-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "host tier size in tokens, larger than the device pool\n"
             "and fitting in the memory free now; 0 (default): none"},
    {"--write-policy", CLI_NAME, OFF(write_policy), CLI_NAMES(write_policy_names), .arg = "P",
     .help = "when the host tier gets a copy: write_through (at insert,\n"
             "the default), write_through_selective (once a prefix is\n"
             "hit twice) or write_back (when the device evicts it)"},
    {"--disk-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "disk tier size in tokens; needs a host tier and --dir, and\n"
             "pages (--page-size tokens) under 4 GiB"},
    {"--dir", CLI_STRING, OFF(dir), .arg = "PATH",
     .help = "the disk tier's data dir: created if missing (its parent\n"
             "must exist), reused if it holds pages of the same geometry\n"
             "and page size; refused while another process has it open"},
    {"--remote", CLI_STRING, OFF(remote), .arg = "URL",
     .help = "a shared remote tier, redis://[[USER]:PASSWORD@]HOST[:PORT] of a\n"
             "standalone Redis or Valkey server or of a Redis Cluster\n"
             "node, or a comma-separated list of such URLs (a\n"
             "cluster's seeds: redis://h1:p1,redis://h2:p2); below the\n"
             "disk tier (or the host tier); needs --host-tokens. Its\n"
             "hits are counted apart (tokens_hit.remote). rediss:// in\n"
             "place of redis:// speaks TLS, the server's certificate\n"
             "checked against the system's CAs (or --remote-tls-ca) and\n"
             "the URL's host"},
    {"--remote-tls-ca", CLI_STRING, OFF(remote_tls_ca), .arg = "FILE",
     .help = "rediss://: PEM CA certificates to check the server's against"},
    {"--remote-tls-cert", CLI_STRING, OFF(remote_tls_cert), .arg = "FILE",
     .help = "rediss://: a PEM client certificate, for a server that asks"},
    {"--remote-tls-key", CLI_STRING, OFF(remote_tls_key), .arg = "FILE",
     .help = "its private key (default: in --remote-tls-cert's file)"},
    {"--disk-sync", CLI_NAME, OFF(disk_sync), CLI_NAMES(disk_sync_names), .arg = "S",
     .help = "durable (default: each write batch synced) or relaxed\n"
             "(synced every second or 256 MiB; a power cut may lose\n"
             "the pages since, never serve wrong bytes)"},
    {"--store-page-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "tokens per page of the disk and remote tiers, a multiple\n"
             "of --page-size up to 4096. Each page costs those tiers a\n"
             "record whatever its size, so by default kvt_open chooses\n"
             "them by bytes: 64 KiB or more (the tiny geometry's 2 KiB\n"
             "pages: 512 tokens; a page that large already: --page-size;\n"
             "hybrid geometries: --page-size). What is left at a\n"
             "request's end short of one is not written below (it goes\n"
             "with its page once a later request fills it). Several\n"
             "pages to one: not with hybrid geometries"},
    {"--disk-backlog", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "let the disk and remote tiers' reads and writes go on\n"
             "while a request runs, up to N in flight (past that the\n"
             "bench waits for all), as a server does, which never waits\n"
             "for its writes (default " DISK_BACKLOG_S "; 0: all land before\n"
             "each request). The hits may then differ a little from run\n"
             "to run (what is on disk when depends on the disk's speed);\n"
             "--deterministic for counts that repeat"},
    {"--emb-device-bytes", CLI_SIZE, OFF(mm.device_bytes), 1, UINT64_MAX, .arg = "SIZE",
     .help = "--synthetic multimodal: the embedding cache's device\n"
             "budget (K, M, G suffixes; default a quarter of the KV\n"
             "pool's bytes, 1M at least)"},
    {"--emb-host-bytes", CLI_SIZE, OFF(mm.host_bytes), 1, UINT64_MAX, .arg = "SIZE",
     .help = "--synthetic multimodal: host memory for embeddings\n"
             "(default none); with --dir or --remote they go there too"},
    {"--emb-token-bytes", CLI_COUNT, OFF(mm.token_bytes), 1, 1u << 20, .arg = "N",
     .help = "--synthetic multimodal: an embedding's bytes per image\n"
             "token, the model's hidden size times its element size\n"
             "(default an eighth of a token's KV, 16 at least)"},
    {"--emb-store", CLI_NAME, OFF(mm.store), 0, 0, bench_mm_store_names, 2, .arg = "S",
     .help = "--synthetic multimodal: all (default: embeddings go to the\n"
             "disk and remote tiers too, when there are) or none"},
    {"--backend", CLI_NAME, OFF(backend), CLI_NAMES(backend_names), .arg = "B",
     .help = "auto, sim or cuda (default auto)"},
    {"--evict-policy", CLI_NAME, OFF(policy), CLI_NAMES(policy_names), .arg = "P",
     .help = "lru, lfu, fifo, mru or filo (default lru)"},
    {"--serial", CLI_FLAG, OFF(serial),
     .help = "sim backend: copy each transfer as it is submitted (what\n"
             "lands when otherwise varies, as on a GPU)"},
    {"--deterministic", CLI_FLAG, OFF(deterministic),
     .help = "counts that repeat exactly, for tests: --serial, and every\n"
             "transfer and disk op lands before the next request\n"
             "(--disk-backlog 0; a disk tier then costs every request\n"
             "its writes' flushes)"},
    {.kind = CLI_TEXT, .help = "\nOutput:\n"},
    {"--json", CLI_FLAG, OFF(json), .help = "one JSON object on stdout instead of the report"},
    {"--corrupt-after", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "testing: after request N, flip a byte of a cached page;\n"
             "a later hit on it must fail verification"},
    {"--help", CLI_HELP, .help = "print this and exit"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [--trace FILE | --synthetic NAME] [options]\n"
            "\n"
            "Replay requests through kvtier as a serving engine would (match, extend, compute,\n"
            "decode, cache) and check every byte of every page served from the cache against\n"
            "what was stored. Prints tokens served per tier, tokens recomputed, pages verified\n"
            "and mismatches. Any mismatch fails the run.\n",
            PROG);
    cli_print_options(f, options, CLI_COUNT_OF(options), 24);
    fprintf(f, "\n"
               "A progress line is shown on stderr when it is a terminal.\n"
               "Exit status: 0 on success, 1 on an error or a verification failure, 2 on bad "
               "usage.\n");
}

/* Sizes that depend on each other: the device pool and its padding page stay below 2^31
 * slots, and a page fits the disk tier's 32-bit page size (in a 4 KiB-aligned slot). */
static int check_sizes(const struct config *cfg)
{
    uint64_t most = (uint64_t)(INT32_MAX / cfg->page_size) * cfg->page_size - 1;
    uint64_t page = kvt_cell_bytes(&cfg->g) * cfg->page_size;
    char msg[160], size[32];

    if (cfg->device_tokens > most) {
        snprintf(msg, sizeof(msg), "--device-tokens is at most %" PRIu64 " with --page-size %u",
                 most, cfg->page_size);
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->store_page_tokens % cfg->page_size) {
        snprintf(msg, sizeof(msg), "--store-page-tokens must be a multiple of --page-size (%u)",
                 cfg->page_size);
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->store_page_tokens && (cfg->mamba.layers || cfg->swa_window))
        return cli_bad_usage(PROG,
                             "--store-page-tokens: not with a hybrid --geometry (its states "
                             "and window copies are kept a page at a time)",
                             NULL);
    page = kvt_cell_bytes(&cfg->g) * store_page_tokens(cfg);
    if (cfg->disk_tokens && page > UINT32_MAX - 4095) {
        snprintf(msg, sizeof(msg),
                 "--disk-tokens: pages of %s (--geometry, --page-size, --store-page-tokens) "
                 "are larger than the disk tier takes (4 GiB less 4 KiB)",
                 cli_size(page, size));
        return cli_bad_usage(PROG, msg, NULL);
    }
    return 0;
}

/* options.remote's form: redis:// (or rediss://) first, and every later item of the list the
 * same scheme or none at all (the engine's parser checks the rest). */
static bool remote_url_ok(const char *url)
{
    const char *scheme = !strncmp(url, "rediss://", 9) ? "rediss://" : "redis://";
    size_t n = strlen(scheme);

    if (strncmp(url, scheme, n) != 0)
        return false;
    for (const char *item = strchr(url, ','); item; item = strchr(item + 1, ','))
        if (strncmp(item + 1, scheme, n) != 0 && strstr(item + 1, "://") &&
            (!strchr(item + 1, ',') || strstr(item + 1, "://") < strchr(item + 1, ',')))
            return false;
    return true;
}

/* The --remote-tls-* files: with rediss:// only, and each one readable. */
static int check_tls_files(const struct config *cfg)
{
    const char *names[] = {"--remote-tls-ca", "--remote-tls-cert", "--remote-tls-key"};
    const char *files[] = {cfg->remote_tls_ca, cfg->remote_tls_cert, cfg->remote_tls_key};
    bool tls = cfg->remote && !strncmp(cfg->remote, "rediss://", 9);
    char msg[320];

    for (size_t i = 0; i < 3; i++) {
        if (files[i] && !tls)
            snprintf(msg, sizeof(msg), "%s needs a rediss:// --remote", names[i]);
        else if (files[i] && access(files[i], R_OK))
            snprintf(msg, sizeof(msg), "%s: cannot read %.200s: %s", names[i], files[i],
                     strerror(errno));
        else
            continue;
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->remote_tls_key && !cfg->remote_tls_cert)
        return cli_bad_usage(PROG, "--remote-tls-key needs --remote-tls-cert", NULL);
    return 0;
}

/* 0 to go on, -1 after --help, else the exit status. */
static int parse_args(int argc, char **argv, struct config *cfg)
{
    int rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), cfg, argc, argv, usage);

    if (rc)
        return rc;
    if (cfg->trace && cfg->synthetic)
        return cli_bad_usage(PROG, "give --trace or --synthetic, not both", NULL);
    if (!cfg->trace && !cfg->synthetic)
        cfg->synthetic = DEFAULT_SYNTHETIC;
    if (cfg->synthetic && cfg->requests > WL_SYNTH_MAX_REQUESTS) {
        char msg[96];

        snprintf(msg, sizeof(msg),
                 "--requests: a synthetic workload makes at most %llu (2^40) "
                 "requests",
                 WL_SYNTH_MAX_REQUESTS);
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->host_tokens && cfg->host_tokens <= cfg->device_tokens)
        return cli_bad_usage(PROG, "--host-tokens must be larger than --device-tokens", NULL);
    if (cfg->disk_tokens && !cfg->host_tokens)
        return cli_bad_usage(PROG, "--disk-tokens needs a host tier (--host-tokens)", NULL);
    if (cfg->remote && !cfg->host_tokens)
        return cli_bad_usage(PROG, "--remote needs a host tier (--host-tokens)", NULL);
    if (cfg->remote && !remote_url_ok(cfg->remote))
        return cli_bad_usage(PROG,
                             "--remote needs a redis://[[USER]:PASSWORD@]HOST[:PORT] URL "
                             "(rediss:// for TLS) or a comma-separated list of them",
                             cfg->remote);
    if ((rc = check_tls_files(cfg)) || (rc = bench_mm_check_args(&cfg->mm, cfg->synthetic)))
        return rc;
    if (!cfg->disk_tokens != !cfg->dir)
        return cli_bad_usage(PROG, "--disk-tokens and --dir go together", NULL);
    if (cfg->mamba_slots && !cfg->mamba.layers)
        return cli_bad_usage(PROG, "--mamba-slots needs a hybrid --geometry (mamba_layers)", NULL);
    if (cfg->swa_tokens && !cfg->swa_window)
        return cli_bad_usage(PROG, "--swa-tokens needs a sliding-window --geometry (swa_window)",
                             NULL);
    if (cfg->mamba.layers && cfg->swa_window)
        return cli_bad_usage(PROG,
                             "--geometry: recurrent and sliding-window layers together are "
                             "not supported yet",
                             NULL);
    if (cfg->deterministic && cfg->backlog_set && cfg->disk_backlog)
        return cli_bad_usage(PROG,
                             "--deterministic waits for every disk op before a request: not "
                             "with --disk-backlog",
                             NULL);
    if (cfg->deterministic)
        cfg->serial = true;
    else if (!cfg->backlog_set)
        cfg->disk_backlog = DEFAULT_DISK_BACKLOG;
    return check_sizes(cfg);
}

int main(int argc, char **argv)
{
    struct config cfg = {.page_size = 16, .device_tokens = DEFAULT_DEVICE_TOKENS, .seed = 1};
    struct source src = {.cfg = &cfg};
    struct bench b = {.cfg = &cfg, .src = &src};
    int rc = parse_geometry(&cfg, "--geometry", "tiny");

    if (rc == 0)
        rc = parse_args(argc, argv, &cfg);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (survey(&b)) {
        rc = 1;
    } else if (cfg.corrupt_after > b.nreqs) {
        rc = cli_bad_usage(PROG, "--corrupt-after names a request past the last one", NULL);
    } else if (setup(&b) == 0 && replay(&b) == 0) {
        if (cfg.json)
            print_json(&b);
        else
            print_text(&b);
        if (b.c.mismatches) {
            report_mismatch(&b);
            rc = 1;
        }
        if (bench_mm_mismatches(b.mm)) {
            fprintf(stderr, "%s: VERIFY FAILED: embeddings served differ from the images'\n", PROG);
            rc = 1;
        }
    } else {
        rc = 1;
    }
    teardown(&b);
    source_close(&src);
    return rc;
}
