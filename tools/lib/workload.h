/*
 * Request workloads for the benchmarks: Mooncake traces and seeded synthetic generators.
 *
 * A request's input is a list of segments, each a run of tokens named by a 64-bit id. The
 * token at offset o of segment id is a pure function of (id, o), so two requests whose
 * inputs start with the same segments share those leading tokens exactly, and nothing else.
 * A trace's 512-token blocks are segments; so are the system prompts, turns and documents
 * of the synthetic workloads. A request's output tokens are one more segment (output_id):
 * a chat's next turn quotes the previous answer by naming that segment in its input.
 */
#ifndef KVT_TOOLS_WORKLOAD_H
#define KVT_TOOLS_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"

#define WL_BLOCK_TOKENS 512            /* tokens per Mooncake hash id */
#define WL_MAX_INPUT_LENGTH (1u << 24) /* tokens; keeps request sizes in 32 bits */
#define WL_MAX_OUTPUT_LENGTH (1u << 20)
#define WL_VOCAB 128000 /* synthetic token ids lie in [0, WL_VOCAB) */
/* Segment ids: a request's output, a synthetic workload's text, an image (its tokens are the
 * image's pad tokens, kvt_emb_pad_tokens of wl_image_hash; workload_mm.c). */
#define WL_OUTPUT_BIT (1ull << 63)
#define WL_SYNTH_BIT (1ull << 62)
#define WL_IMAGE_BIT (1ull << 61)

struct wl_seg {
    uint64_t id;
    uint32_t len;
};

struct wl_req {
    size_t first_seg; /* index in workload.segs */
    uint32_t nsegs;
    uint32_t input_len;  /* sum of the segments' lengths */
    uint32_t output_len; /* tokens the request decodes */
    uint64_t output_id;  /* segment id of its output tokens */
};

struct workload {
    struct wl_req *reqs;
    size_t nreqs, reqs_cap;
    struct wl_seg *segs;
    size_t nsegs, segs_cap;
    uint32_t max_input;  /* longest input */
    uint64_t max_tokens; /* longest input + output */
};

#define WL_MAX_LINE_BYTES (16u << 20) /* a longer trace line is an error, never read whole */

/* A Mooncake JSONL trace (input_length, output_length, hash_ids) read a line at a time: it
 * holds one line (at most WL_MAX_LINE_BYTES), however long the trace. */
struct wl_trace;

/* Open the trace at path (kept, not copied: it must outlive the reader). tag (< 256) goes
 * into every segment id so that the same hash id in two files names different text. 0, or
 * -1 with a message in err. */
int wl_trace_open(const char *path, uint32_t tag, struct wl_trace **out, char *err, size_t err_len);
/* Append the trace's next request to w: 1; 0 past the last one; -1 with a message naming the
 * line (and column) in err. */
int wl_trace_next(struct wl_trace *t, struct workload *w, char *err, size_t err_len);
/* Read the trace again from its first line: 0, or -1 with a message in err (a pipe cannot). */
int wl_trace_rewind(struct wl_trace *t, char *err, size_t err_len);
/* NULL is a no-op. */
void wl_trace_close(struct wl_trace *t);

/* Names of the synthetic workloads, NULL-terminated, and a line on each. */
extern const char *const wl_synthetic_names[];
const char *wl_synthetic_about(const char *name);

/* A synthetic workload, generated a request at a time from its seed: the same name and seed
 * give the same requests. What it keeps is bounded (the chats and documents under way), however
 * many requests are drawn. It makes WL_SYNTH_MAX_REQUESTS at most: each takes up to three
 * segment ids from a 62-bit counter, and a reader's u64 token counts (under 2^15 tokens a
 * request) hold 2^49 of them; 2^40, 35 years at a thousand a second, is well inside both. */
#define WL_SYNTH_MAX_REQUESTS (1ull << 40)
struct wl_synth;

/* 0, -EINVAL for an unknown name, or -ENOMEM. */
int wl_synth_open(const char *name, uint64_t seed, struct wl_synth **out);
/* Append the workload's next request to w. */
void wl_synth_next(struct wl_synth *s, struct workload *w);
/* NULL is a no-op. */
void wl_synth_close(struct wl_synth *s);

/* The input tokens of r into tokens (r->input_len entries). */
void wl_input_tokens(const struct workload *w, const struct wl_req *r, uint32_t *tokens);

/* Token i of r's output. */
uint32_t wl_output_token(const struct wl_req *r, uint32_t i);

/* Append a request of the n segments and an output of out_len tokens, whose segment is named
 * WL_OUTPUT_BIT | serial; that segment (for a later turn to quote). */
struct wl_seg wl_add_request(struct workload *w, const struct wl_seg *segs, size_t n,
                             uint32_t out_len, uint64_t serial);

/* The 32 bytes naming image segment id (its content hash, as a serving engine would take). */
void wl_image_hash(uint64_t id, uint8_t hash[32]);

/* ---- for the readers and generators (workload_trace.c, _synth.c, _mm.c) ---- */

/* p grown (doubling) to hold need elements of elem bytes, *cap updated; exits on no memory. */
void *wl_grow(void *p, size_t *cap, size_t need, size_t elem);
/* Append a segment, and a request whose segments were appended before it. */
void wl_add_seg(struct workload *w, uint64_t id, uint32_t len);
void wl_add_req(struct workload *w, const struct wl_req *r);

/* ---- the multimodal workload (workload_mm.c) ---- */

/* The "multimodal" generator behind wl_synth_*: images among the text of requests. */
struct wl_mm;
struct wl_mm *wl_mm_open(uint64_t seed);
void wl_mm_next(struct wl_mm *m, struct workload *w);
void wl_mm_close(struct wl_mm *m);
extern const char wl_mm_about[];

/* Forget w's requests and segments, keeping its memory for the next ones. */
void wl_clear(struct workload *w);
void wl_free(struct workload *w);

/* A 64-bit mixer (one splitmix64 step from state x): consecutive inputs give unrelated
 * outputs. */
static inline uint64_t wl_mix(uint64_t x)
{
    return rng_mix64(x + RNG_GAMMA);
}

#endif
