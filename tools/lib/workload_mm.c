/*
 * The "multimodal" synthetic workload (workload.h): requests with images, as a vision-language
 * model's server sees them. An image is a segment of its own (WL_IMAGE_BIT | its number)
 * whose tokens are its pad tokens (kvt_emb_pad_tokens of its hash), as many as the encoder
 * gives it (256 to 2,048); the same image has the same hash, tokens and size wherever it
 * appears. Images are drawn from a catalogue with a skew (the first ones are the popular
 * ones: product photos, shared screenshots, a meme), so they repeat across requests and
 * sessions, after the same text (the KV of the whole prefix is shared) and after other text
 * (only the embedding is).
 *
 * Half the requests are turns of chats about images (16 at a time, behind 4 shared system
 * prompts, 2-6 turns, 1-2 images in the first turn and one in a third of the later ones, each
 * turn quoting the conversation so far); the other half are one-shot tasks (one of 8
 * instructions, an image, a short question): caption, describe, read the text in it.
 */
#include "workload.h"

#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define MM_IMAGES 2000 /* the catalogue */
#define MM_PROMPTS 4   /* chats' system prompts */
#define MM_TASKS 8     /* one-shot instructions */
#define MM_SESSIONS 16 /* chats under way at once */
#define MM_MAX_SEGS 64 /* a chat's history is cut to its system prompt and the last turns */
#define MM_IMAGE_TAG 0x696d616765ull /* "image": seeds the catalogue as it names images */

const char wl_mm_about[] =
    "vision-language requests: chats about images (16 at a time, 4 system prompts, 2-6 "
    "turns) and one-shot image tasks (8 instructions), half each; images of 256-2048 tokens "
    "from a catalogue of 2000, the first ones the popular ones";

/* Image tokens by size class: Qwen-VL-like grids from 16x16 to 32x64 patches (merged). */
static const uint32_t image_tokens[] = {256, 324, 400, 576, 729, 784, 1024, 1296, 1600, 2048};

struct mm_session {
    uint32_t turns_left;
    struct wl_seg hist[MM_MAX_SEGS];
    size_t nhist;
};

struct wl_mm {
    uint64_t rng, next_id;
    struct wl_seg prompts[MM_PROMPTS], tasks[MM_TASKS];
    struct mm_session s[MM_SESSIONS];
};

static uint32_t pick(struct wl_mm *m, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(wl_mix(m->rng++) % ((uint64_t)hi - lo + 1));
}

static struct wl_seg text(struct wl_mm *m, uint32_t lo, uint32_t hi)
{
    return (struct wl_seg){.id = WL_SYNTH_BIT | m->next_id++, .len = pick(m, lo, hi)};
}

/* An image of the catalogue, popular ones first: u^3 of a uniform u puts half the draws on
 * the first eighth. Its size is a function of its number. */
static struct wl_seg image(struct wl_mm *m)
{
    double u = (double)(wl_mix(m->rng++) >> 11) / (double)(1ull << 53);
    uint64_t k = (uint64_t)(u * u * u * MM_IMAGES);
    uint64_t id = WL_IMAGE_BIT | k;
    size_t cls = wl_mix(id) % (sizeof(image_tokens) / sizeof(image_tokens[0]));

    return (struct wl_seg){.id = id, .len = image_tokens[cls]};
}

static void chat_turn(struct wl_mm *m, struct workload *w)
{
    struct mm_session *s = &m->s[pick(m, 0, MM_SESSIONS - 1)];
    uint32_t images = 0;

    if (s->turns_left == 0 || s->nhist + 6 > MM_MAX_SEGS) {
        s->hist[0] = m->prompts[pick(m, 0, MM_PROMPTS - 1)];
        s->nhist = 1;
        s->turns_left = pick(m, 2, 6);
        images = pick(m, 1, 2);
    } else {
        images = pick(m, 0, 2) == 0;
    }
    s->hist[s->nhist++] = text(m, 16, 96);
    for (uint32_t i = 0; i < images; i++)
        s->hist[s->nhist++] = image(m);
    s->hist[s->nhist++] = text(m, 8, 64);
    s->hist[s->nhist] = wl_add_request(w, s->hist, s->nhist, pick(m, 64, 384), m->next_id++);
    s->nhist++;
    s->turns_left--;
}

static void task(struct wl_mm *m, struct workload *w)
{
    struct wl_seg segs[3] = {m->tasks[pick(m, 0, MM_TASKS - 1)], image(m), text(m, 8, 48)};

    wl_add_request(w, segs, 3, pick(m, 32, 192), m->next_id++);
}

struct wl_mm *wl_mm_open(uint64_t seed)
{
    struct wl_mm *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    m->rng = wl_mix(seed ^ MM_IMAGE_TAG);
    for (size_t i = 0; i < MM_PROMPTS; i++)
        m->prompts[i] = text(m, 256, 1024);
    for (size_t i = 0; i < MM_TASKS; i++)
        m->tasks[i] = text(m, 64, 256);
    return m;
}

void wl_mm_next(struct wl_mm *m, struct workload *w)
{
    if (pick(m, 0, 1))
        chat_turn(m, w);
    else
        task(m, w);
}

void wl_mm_close(struct wl_mm *m)
{
    free(m);
}
