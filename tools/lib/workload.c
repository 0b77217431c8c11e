/*
 * Workloads (workload.h): the requests and their segments, and the tokens they stand for.
 * The readers and generators that fill them lie above this file: workload_trace.c (Mooncake
 * traces), workload_synth.c (the synthetic workloads) and workload_mm.c (the multimodal one).
 */
#include "workload.h"
#include "kvtier.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUTPUT_BIT WL_OUTPUT_BIT

static void die_oom(void)
{
    fprintf(stderr, "out of memory\n");
    exit(1);
}

void *wl_grow(void *p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return p;
    size_t ncap = *cap ? *cap * 2 : 1024;
    while (ncap < need)
        ncap *= 2;
    p = realloc(p, ncap * elem);
    if (!p)
        die_oom();
    *cap = ncap;
    return p;
}

void wl_add_seg(struct workload *w, uint64_t id, uint32_t len)
{
    w->segs = wl_grow(w->segs, &w->segs_cap, w->nsegs + 1, sizeof(*w->segs));
    w->segs[w->nsegs++] = (struct wl_seg){.id = id, .len = len};
}

void wl_add_req(struct workload *w, const struct wl_req *r)
{
    w->reqs = wl_grow(w->reqs, &w->reqs_cap, w->nreqs + 1, sizeof(*w->reqs));
    w->reqs[w->nreqs++] = *r;
    if (r->input_len > w->max_input)
        w->max_input = r->input_len;
    if ((uint64_t)r->input_len + r->output_len > w->max_tokens)
        w->max_tokens = (uint64_t)r->input_len + r->output_len;
}

struct wl_seg wl_add_request(struct workload *w, const struct wl_seg *segs, size_t n,
                             uint32_t out_len, uint64_t serial)
{
    struct wl_req r = {.first_seg = w->nsegs, .nsegs = (uint32_t)n, .output_len = out_len};

    for (size_t i = 0; i < n; i++) {
        wl_add_seg(w, segs[i].id, segs[i].len);
        r.input_len += segs[i].len;
    }
    r.output_id = OUTPUT_BIT | serial;
    wl_add_req(w, &r);
    return (struct wl_seg){.id = r.output_id, .len = out_len};
}

void wl_clear(struct workload *w)
{
    w->nreqs = w->nsegs = 0;
    w->max_input = 0;
    w->max_tokens = 0;
}

void wl_free(struct workload *w)
{
    free(w->reqs);
    free(w->segs);
    memset(w, 0, sizeof(*w));
}

/* ---- tokens ---- */

static uint32_t seg_token(uint64_t seed, uint32_t off)
{
    return (uint32_t)(wl_mix(seed + off) % WL_VOCAB);
}

void wl_input_tokens(const struct workload *w, const struct wl_req *r, uint32_t *tokens)
{
    for (uint32_t s = 0; s < r->nsegs; s++) {
        const struct wl_seg *g = &w->segs[r->first_seg + s];
        uint64_t seed = wl_mix(g->id);
        if (g->id & WL_IMAGE_BIT && !(g->id & OUTPUT_BIT)) {
            uint8_t hash[32];
            wl_image_hash(g->id, hash);
            kvt_emb_pad_tokens(hash, tokens, g->len);
            tokens += g->len;
            continue;
        }
        for (uint32_t off = 0; off < g->len; off++)
            *tokens++ = seg_token(seed, off);
    }
}

uint32_t wl_output_token(const struct wl_req *r, uint32_t i)
{
    return seg_token(wl_mix(r->output_id), i);
}

/* The image's 32 bytes: what a serving engine would hash the image's content to. */
#define IMAGE_TAG 0x696d616765ull /* "image" */

void wl_image_hash(uint64_t id, uint8_t hash[32])
{
    for (int i = 0; i < 4; i++) {
        uint64_t w = wl_mix(wl_mix(id ^ IMAGE_TAG) + (uint64_t)i);
        memcpy(hash + 8 * i, &w, 8);
    }
}
