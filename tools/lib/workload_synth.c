/*
 * The synthetic workloads (workload.h): seeded generators of chats and document questions,
 * and the multimodal one behind the same calls (workload_mm.c).
 */
#include "workload.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define SYNTH_BIT WL_SYNTH_BIT

#define CHAT_PROMPTS 8 /* system prompts shared by every chat */
#define CHAT_ACTIVE 16 /* chats under way at once, their turns interleaved */
#define DOC_INSTRUCTIONS 2
#define DOC_ACTIVE 4 /* documents being asked about at once */

const char *const wl_synthetic_names[] = {"chat", "docqa", "mixed", "multimodal", NULL};

static const char *const synthetic_about[] = {
    "multi-turn chats behind 8 shared system prompts (256-2048 tokens); 16 chats at a time, "
    "2-8 turns each; every turn quotes the whole conversation so far",
    "long documents (4-24k tokens) behind 2 shared instructions, each asked 4-16 short "
    "questions; 4 documents at a time",
    "chat and docqa requests interleaved at random, half each",
    wl_mm_about,
};

const char *wl_synthetic_about(const char *name)
{
    for (size_t i = 0; wl_synthetic_names[i]; i++)
        if (strcmp(name, wl_synthetic_names[i]) == 0)
            return synthetic_about[i];
    return NULL;
}

struct chat {
    uint32_t turns_left;
    struct wl_seg *hist; /* the system prompt, then user turns and answers so far */
    size_t nhist, cap;
};

struct doc {
    struct wl_seg text;
    uint32_t instruction, questions_left;
};

struct synth {
    struct workload *w;
    uint64_t rng, next_id;
    struct wl_seg prompts[CHAT_PROMPTS], instructions[DOC_INSTRUCTIONS];
    struct chat chats[CHAT_ACTIVE];
    struct doc docs[DOC_ACTIVE];
};

static uint32_t pick(struct synth *s, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(wl_mix(s->rng++) % ((uint64_t)hi - lo + 1));
}

static struct wl_seg new_seg(struct synth *s, uint32_t lo, uint32_t hi)
{
    return (struct wl_seg){.id = SYNTH_BIT | s->next_id++, .len = pick(s, lo, hi)};
}

/* Append a request made of segs and an output of out_len tokens; its output segment. */
static struct wl_seg emit(struct synth *s, const struct wl_seg *segs, size_t n, uint32_t out_len)
{
    return wl_add_request(s->w, segs, n, out_len, s->next_id++);
}

static void chat_turn(struct synth *s)
{
    struct chat *c = &s->chats[pick(s, 0, CHAT_ACTIVE - 1)];

    c->hist = wl_grow(c->hist, &c->cap, c->nhist + 2, sizeof(*c->hist));
    if (c->turns_left == 0) {
        /* The lower-numbered prompts are the popular ones. */
        uint32_t a = pick(s, 0, CHAT_PROMPTS - 1), b = pick(s, 0, CHAT_PROMPTS - 1);
        c->hist[0] = s->prompts[a < b ? a : b];
        c->nhist = 1;
        c->turns_left = pick(s, 2, 8);
    }
    c->hist[c->nhist++] = new_seg(s, 32, 512);
    c->hist[c->nhist] = emit(s, c->hist, c->nhist, pick(s, 64, 768));
    c->nhist++;
    c->turns_left--;
}

static void doc_question(struct synth *s)
{
    struct doc *d = &s->docs[pick(s, 0, DOC_ACTIVE - 1)];

    if (d->questions_left == 0) {
        d->text = new_seg(s, 4096, 24576);
        d->instruction = pick(s, 0, DOC_INSTRUCTIONS - 1);
        d->questions_left = pick(s, 4, 16);
    }
    struct wl_seg segs[3] = {s->instructions[d->instruction], d->text, new_seg(s, 16, 128)};
    emit(s, segs, 3, pick(s, 32, 256));
    d->questions_left--;
}

struct wl_synth {
    struct synth s;
    int kind;         /* index in wl_synthetic_names */
    struct wl_mm *mm; /* "multimodal" (workload_mm.c) */
};

int wl_synth_open(const char *name, uint64_t seed, struct wl_synth **out)
{
    struct wl_synth *g;
    int kind = -1;

    for (int i = 0; wl_synthetic_names[i]; i++)
        if (strcmp(name, wl_synthetic_names[i]) == 0)
            kind = i;
    if (kind < 0)
        return -EINVAL;
    if (!(g = calloc(1, sizeof(*g))))
        return -ENOMEM;
    g->kind = kind;
    if (!strcmp(name, "multimodal") && !(g->mm = wl_mm_open(seed))) {
        free(g);
        return -ENOMEM;
    }
    g->s.rng = wl_mix(seed);
    for (size_t i = 0; i < CHAT_PROMPTS; i++)
        g->s.prompts[i] = new_seg(&g->s, 256, 2048);
    for (size_t i = 0; i < DOC_INSTRUCTIONS; i++)
        g->s.instructions[i] = new_seg(&g->s, 192, 192);
    *out = g;
    return 0;
}

void wl_synth_next(struct wl_synth *g, struct workload *w)
{
    bool chat = g->kind == 0 || (g->kind == 2 && pick(&g->s, 0, 1) == 0);

    if (g->mm) {
        wl_mm_next(g->mm, w);
        return;
    }
    g->s.w = w;
    if (chat)
        chat_turn(&g->s);
    else
        doc_question(&g->s);
}

void wl_synth_close(struct wl_synth *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < CHAT_ACTIVE; i++)
        free(g->s.chats[i].hist);
    wl_mm_close(g->mm);
    free(g);
}
