/*
 * kvtier-bench's multimodal part (--synthetic multimodal): each request's images get their
 * embeddings from the engine's embedding cache (kvt_emb_*) or from the "encoder" (bytes made
 * from the image's hash, as KV rows are made from the prefix's), every embedding served is
 * read back and compared byte for byte, and the report says what each tier served and how
 * much encoder work that saved.
 */
#ifndef KVT_BENCH_MM_H
#define KVT_BENCH_MM_H

#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"
#include "workload.h"

struct bench_mm_config {
    uint64_t device_bytes; /* --emb-device-bytes; 0: a quarter of the KV pool's bytes */
    uint64_t host_bytes;   /* --emb-host-bytes; 0: none */
    uint64_t token_bytes;  /* --emb-token-bytes; 0: an eighth of a token's KV, 16 at least */
    uint32_t store;        /* --emb-store: enum kvt_emb_store */
};

extern const char *const bench_mm_store_names[]; /* "all", "none": enum kvt_emb_store */

struct bench_mm;

/* Whether the workload named is the multimodal one. */
bool bench_mm_wanted(const char *synthetic);
/* Options given without the multimodal workload: 0, or the bad-usage status after saying so. */
int bench_mm_check_args(const struct bench_mm_config *c, const char *synthetic);
/* The engine's embedding options for a KV pool of kv_bytes. */
void bench_mm_options(const struct bench_mm_config *c, uint64_t kv_bytes, struct kvt_options *o);
/* 0, or -1 after saying why. */
int bench_mm_open(const struct bench_mm_config *c, uint64_t cell_bytes, uint32_t page_size,
                  kvt_engine *e, struct bench_mm **out);
void bench_mm_close(struct bench_mm *m);

/* Before kvt_req_begin: cut key->len so that the prefix it may match never ends fewer than 8
 * tokens into an image (kvt_emb_prefix_limit over kvt_match). 0, or -1 after saying why. */
int bench_mm_key(struct bench_mm *m, const struct workload *w, const struct wl_req *r,
                 struct kvt_key *key);
/* After kvt_req_begin, before the prefill: every image of r not inside the cached prefix
 * (hit tokens) gets its embedding, held until bench_mm_release. 0, or -1 after saying why. */
int bench_mm_serve(struct bench_mm *m, const struct workload *w, const struct wl_req *r, size_t hit,
                   uint64_t request);
void bench_mm_release(struct bench_mm *m);

/* Embeddings served whose bytes were not the image's. */
uint64_t bench_mm_mismatches(const struct bench_mm *m);
void bench_mm_print(const struct bench_mm *m);
/* "multimodal":{...}, (with its comma) inside the report's object. */
void bench_mm_json(const struct bench_mm *m);

#endif
