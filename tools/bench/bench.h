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
 *
 * Its files, each calling only those below it:
 *   bench.c          main: parse, survey, set up, replay, report
 *   bench_options.c  the command line: options, their checks, --help
 *   bench_replay.c   the workload, a request at a time: the source (a trace or a generator),
 *                    the survey that sizes the engine, the replay
 *   bench_request.c  one request: match, verify, prefill, decode, cache; the test seams
 *   bench_states.c   a hybrid model's recurrent states: checkpoints taken and checked
 *   bench_kv.c       KV content: rows made from the tokens' hashes, written, read back and
 *                    compared; a sliding-window model's window
 *   bench_open.c     the engine opened from the options, its errors told in their terms
 *   bench_report.c   the report, text and JSON
 *   bench_mm.c       --synthetic multimodal: the embedding cache (bench_mm.h)
 */
#ifndef KVT_BENCH_H
#define KVT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvtier.h"
#include "bench_mm.h"
#include "cli.h"
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

/* ---- configuration ---- */

/* Names of the config's enums, as the options take them (bench_options.c). */
extern const char *const bench_policy_names[5];       /* enum kvt_evict_policy */
extern const char *const bench_backend_names[3];      /* enum kvt_backend */
extern const char *const bench_write_policy_names[3]; /* enum kvt_write_policy */
extern const char *const bench_disk_sync_names[2];    /* enum kvt_disk_sync */

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
static inline uint64_t served_tokens(const struct counters *c)
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

/* ---- helpers every part uses ---- */

static inline int engine_error(const char *call, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", PROG, call, kvt_strerror(rc));
    return -1;
}

static inline int say(const char *msg)
{
    fprintf(stderr, "%s: %s\n", PROG, msg);
    return -1;
}

static inline size_t round_up(size_t n, uint32_t ps)
{
    return (n + ps - 1) / ps * ps;
}

/* Tokens of r that get KV: the input and every output token but the last, which is
 * sampled and never fed back. */
static inline size_t kv_tokens(const struct wl_req *r)
{
    return (size_t)r->input_len + (r->output_len ? r->output_len - 1 : 0);
}

static inline bool hybrid(const struct bench *b)
{
    return b->cfg->mamba.layers != 0;
}

/* Whether layer l is a sliding-window layer of a hybrid model. */
static inline bool swa_layer(const struct bench *b, uint32_t l)
{
    return b->cfg->swa_window && (l + 1) % b->cfg->full_every != 0;
}

static inline size_t state_part_bytes(const struct bench *b, int part)
{
    return (size_t)(part ? b->cfg->mamba.ssm_bytes : b->cfg->mamba.conv_bytes);
}

/* Tokens of a page of the disk and remote tiers that --store-page-tokens asks for (when it
 * is left to kvt_open, which chooses by bytes, the least it can be). */
static inline uint64_t store_page_tokens(const struct config *cfg)
{
    return cfg->store_page_tokens ? cfg->store_page_tokens : cfg->page_size;
}

/* ---- the command line (bench_options.c) ---- */

/* --geometry into cfg: 0, or the bad-usage status after saying why. */
int bench_parse_geometry(void *cfg, const char *opt, const char *arg);
/* 0 to go on, -1 after --help, else the exit status. */
int bench_parse_args(int argc, char **argv, struct config *cfg);

/* ---- the workload (bench_replay.c) ---- */

/* The first pass: how many requests there are and the longest, which sizes the engine. */
int bench_survey(struct bench *b);
/* The second pass: every request served: 0, or -1 after saying why. */
int bench_replay(struct bench *b);
void bench_source_close(struct source *s);

/* ---- one request (bench_request.c) ---- */

/* Serve r from start to finish: 0, or -1 after saying why (its mismatches are counted). */
int bench_run_request(struct bench *b, const struct wl_req *r);
/* Test seam: flip one byte of the first cached page of r's input, as a faulty tier would
 * (and, for a hybrid model, of the checkpoints). */
int bench_corrupt_cached_page(struct bench *b, const struct wl_req *r);

/* ---- recurrent states (bench_states.c) ---- */

/* The state the request starts from (a copy of the checkpoint at its cached prefix) must
 * be the state after that prefix, byte for byte. */
int bench_verify_state(struct bench *b, const struct kvt_req *req);
/* After the prefill, checkpoints where a later match can use them. */
int bench_prefill_checkpoints(struct bench *b, struct kvt_req *req, size_t in);
/* A decode step that brought the sequence to seq tokens: a checkpoint every decode grid. */
int bench_decode_checkpoint(struct bench *b, const struct kvt_req *req, size_t seq);
/* Test seam: flip the first byte of every state slot's first conv state. */
int bench_corrupt_states(struct bench *b);

/* ---- KV content (bench_kv.c) ---- */

/* Rows of a token: a function of hash, layer and which (K 0, V 1; states 2, 3). */
void bench_fill_row(uint64_t hash, uint32_t layer, int which, uint8_t *row, size_t n);
void bench_hash_tokens(struct bench *b, size_t from, size_t to);
/* Write the KV rows of tokens [pos, pos + n) into slots, as a forward pass would. */
int bench_compute(struct bench *b, const int32_t *slots, size_t pos, size_t n);
void bench_note_mismatch(struct bench *b, size_t token, uint32_t layer, int which);
/* Read back the cached tokens [0, n) from slots (after load op) and check every byte. */
int bench_verify(struct bench *b, const int32_t *slots, size_t n, uint64_t op);
/* The request has b->filled tokens: its sliding-window KV that the window left goes. */
int bench_slide(struct bench *b, const struct kvt_req *req);
/* A sliding-window model's prompt cached as soon as its prefill ends. */
int bench_cache_prompt(struct bench *b, struct kvt_req *req, size_t in);

/* ---- the engine (bench_open.c) ---- */

/* The engine for the workload surveyed, and the buffers of its requests: 0, or -1 after
 * saying why (in terms of the options). */
int bench_setup(struct bench *b);
void bench_teardown(struct bench *b);

/* ---- the report (bench_report.c) ---- */

void bench_print_text(const struct bench *b);
void bench_print_json(const struct bench *b);
void bench_report_mismatch(const struct bench *b);

#endif
