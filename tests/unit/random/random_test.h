/*
 * Randomized test of the engine against a reference model: 100k seeded operations (insert,
 * match, lock, unlock, evict, alloc, free, free groups, request lifecycle), with every
 * invariant checked after every step.
 *
 * The model keeps one entry per device page: who owns it (free, held by the test, owned by a
 * request, cached, pending in a free group) and, for a cached page, its tokens, its parent
 * page and the keys the eviction policy compares. A cached page sits on exactly one device
 * page, so the page number doubles as the node id of the model's trie (page 0, the padding
 * page, stands for a namespace root).
 *
 * After every step: engine_check passes; the allocator's state of every page equals the
 * model's; kvt_stats sizes and counters equal the model's; every match returns the model's
 * longest cached prefix and its slots. Evictions are the engine's choice, but they must be
 * leaves first (the cached set stays prefix-closed), spare every locked page, free what they
 * report, evict enough, and follow the policy's order.
 *
 * KVT_SEED=<n> reruns a sequence; the seed is printed at the start and on failure.
 */
/* One program (meson test `random`) in files by what the model follows: model.c (keys, the
 * model's trie, the checks after every step), evict.c, alloc.c, insert_match.c, requests.c,
 * and run.c (the run, the configurations, main). This header is theirs alone. */
#ifndef KVT_TESTS_UNIT_RANDOM_H
#define KVT_TESTS_UNIT_RANDOM_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine_fixture.h"
#include "harness.h"
#include "rng.h"

#define MAX_PS 4
#define KEY_PAGES 16                          /* longest key, in pages */
#define TOK_MAX (KEY_PAGES * MAX_PS + MAX_PS) /* longest key in tokens, with a partial page */
#define MAX_CONTEXT 128
#define N_REQ 6 /* few request slots, so kvt_req_begin runs out of them */
#define N_LOCKS 16
#define N_HELD 16
#define N_REFS 32
#define N_BASE 8
#define N_NS 3
#define ALPHABET 4 /* few tokens, so keys share prefixes and nodes split */
#define ALLOC_PAGES 12
#define DEFAULT_SEED 0x6b76746965720001ull

enum mstate { M_FREE, M_HELD, M_REQ, M_CACHED, M_PENDING };

/* One device page as the model sees it; the trie fields matter only while it is cached. */
struct mpage {
    uint8_t state; /* enum mstate */
    uint8_t ns;
    uint32_t parent; /* 0: the namespace root */
    uint32_t child, sibling;
    uint32_t tok[MAX_PS];
    uint64_t access, created, hits;
    int32_t prio;
    uint32_t gen; /* bumped each time the page enters the cache: tells a ref's page is gone */
};

struct tkey {
    uint32_t ns;
    int alias; /* default namespace spelled as a non-NULL pointer with ns_len 0 */
    size_t len;
    uint32_t tok[TOK_MAX];
};

/* Slots the test got from kvt_alloc (or kept after an insert): whole page runs. */
struct held {
    int32_t slots[KEY_PAGES * MAX_PS];
    size_t n;
};

struct tlock {
    kvt_node_ref ref;
    uint32_t page; /* model page ending the locked prefix; 0: the root */
    uint32_t count;
};

/* A ref the test saw once, kept to check that a dead or unlocked ref is refused. */
struct oldref {
    kvt_node_ref ref;
    uint32_t page, gen;
};

struct mreq {
    int active;
    struct kvt_req r;
    struct tkey key;      /* prompt and output: what the request will hold when done */
    size_t filled;        /* tokens whose slots are in the row */
    int32_t row[TOK_MAX]; /* mirror of the request's req_to_token row */
    uint32_t lock_page;   /* model page ending the protected prefix; 0: the root */
};

struct cfg {
    const char *name;
    uint32_t ps, device_tokens, policy, hash_pages;
    uint32_t ops;
    int busy_close; /* close without the drain: kvt_close must free what is outstanding */
};

struct sim {
    kvt_engine *e;
    const struct cfg *cfg;
    uint32_t ps, npages;
    uint64_t seed, rng, step, clock, epoch;
    const char *op;
    struct mpage *pg;
    uint64_t *mark;    /* == epoch: locked, after mark_locked */
    uint64_t *gone;    /* == epoch: taken by the eviction being checked */
    uint32_t *scratch; /* npages entries */
    uint32_t root[N_NS];
    uint32_t base[N_BASE][TOK_MAX];
    struct held held[N_HELD];
    size_t nheld;
    struct tlock locks[N_LOCKS];
    size_t nlocks;
    struct oldref refs[N_REFS];
    size_t nrefs, refs_next;
    struct mreq req[N_REQ];
    struct kvt_req stale; /* a copy of the last finished request: dead once finished */
    int have_stale;
    int group_open;
    uint64_t m_calls, m_query, m_hit, inserted, evicted;       /* expected kvt_stats counters */
    uint64_t enomem, refused, finished, max_cached, max_nodes; /* what the run exercised */
};

/* Namespaces are bytes, not strings: the third extends the second past a NUL. */
static const char NS_BYTES[N_NS][9] = {"", "lora-7", "lora-7\0x"};
static const size_t NS_LEN[N_NS] = {0, 6, 8};

/* Failures name the seed, configuration, step and operation (harness.h). */
#define HARNESS_RUN(s)                                                                             \
    (&(struct harness_run){.prog = "test_random",                                                  \
                           .config = (s)->cfg->name,                                               \
                           .seed = (s)->seed,                                                      \
                           .step = (s)->step,                                                      \
                           .op = (s)->op})

/* model.c */
uint32_t below(struct sim *s, uint32_t n);
int chance(struct sim *s, uint32_t pct);
size_t min_sz(size_t a, size_t b);
struct kvt_key kkey(const struct tkey *k, size_t len);
void make_bases(struct sim *s);
void gen_key(struct sim *s, struct tkey *k, int aligned);
size_t model_prefix(const struct sim *s, const struct tkey *k, size_t len, uint32_t *path);
void prefix_key(const struct sim *s, uint32_t p, struct tkey *k);
void path_slots(const struct sim *s, const uint32_t *path, size_t np, int32_t *slots);
uint32_t page_of(const struct sim *s, int32_t slot);
void model_unlink(struct sim *s, uint32_t p);
void model_release(struct sim *s, uint32_t p);
void model_insert(struct sim *s, const struct tkey *k, size_t np, uint32_t *path, size_t c,
                  const int32_t *slots, int32_t prio);
void model_rematch(struct sim *s, const uint32_t *path, size_t c);
void model_match(struct sim *s, const uint32_t *path, size_t c, size_t len);
size_t mark_locked(struct sim *s);
size_t count_state(const struct sim *s, int state);
void remember_ref(struct sim *s, kvt_node_ref ref, uint32_t page);
int engine_state(const struct sim *s, uint32_t p);
struct kvt_stats stats(const struct sim *s);
void same_stats(struct sim *s, const struct kvt_stats *a);
void check_all(struct sim *s);

/* evict.c */
size_t learn_eviction(struct sim *s, size_t want);
void do_evict(struct sim *s, size_t tokens);
void op_evict(struct sim *s);

/* alloc.c */
int alloc_pages(struct sim *s, size_t pages, int32_t *slots, int may_evict);
void free_slots(struct sim *s, const int32_t *slots, size_t n);
void adopt(struct sim *s, const int32_t *slots, size_t n);
void held_compact(struct sim *s);
void op_alloc(struct sim *s);
int32_t bad_slot(struct sim *s);
void op_free(struct sim *s);
void op_group(struct sim *s);

/* insert_match.c */
void op_insert(struct sim *s);
void op_match(struct sim *s);
void op_unlock(struct sim *s);
void op_bad_ref(struct sim *s);
void op_lock_old(struct sim *s);

/* requests.c */
void op_req_begin(struct sim *s);
void op_req_extend(struct sim *s);
void op_req_unfinished(struct sim *s);
void req_finish(struct sim *s, struct mreq *q, int insert, int32_t prio);
void op_req_finish(struct sim *s);
void op_misuse(struct sim *s);

/* run.c */
void run(const struct cfg *cfg);

#endif
