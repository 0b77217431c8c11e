/*
 * Sliding-window layers in the engine (swa.c): the calls engine.c, api.c, stats.c and
 * check.c make. Every call here is for an engine with e->swa, except engine_swa_from,
 * engine_swa_cached, engine_req_relock and engine_req_unlock, which serve every engine.
 * swa.c calls down only: the slot layer (slots.h), the tree, the tier below.
 */
#ifndef KVT_ENGINE_SWA_H
#define KVT_ENGINE_SWA_H

#include "engine/engine_int.h"

int engine_swa_check_options(const struct kvt_options *o);
/* The SWA slots and the request rows' window state, after the options' full layers. */
int engine_swa_open(kvt_engine *e, uint64_t full_tokens);
void engine_swa_tree_config(kvt_engine *e, struct rdx_config *cfg);
void engine_swa_close(kvt_engine *e);

/* Of the n pages of key's store run after hit, the prefix a sliding-window match may use;
 * *win the pages of it to read with their window copies. */
size_t engine_swa_store_pages(kvt_engine *e, const struct kvt_key *key, const struct rdx_hit *hit,
                              size_t n, size_t *win);
int engine_swa_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots, struct kvt_match *m);
int engine_swa_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                     struct kvt_req *req);
/* Where request row idx's SWA KV is freed below (its inserts' SWA tombstones end); 0
 * without sliding-window layers. */
uint64_t engine_swa_from(const kvt_engine *e, int32_t idx);
/* Request row idx's protected prefix grew to protected_len (the cache's SWA KV from there). */
void engine_swa_cached(kvt_engine *e, int32_t idx, size_t protected_len);

/* A request's node lock moves (from -> to) or goes; with sliding-window layers it is a
 * window lock (rdx_swa_lock) whose span the engine keeps per request row. */
int engine_req_relock(kvt_engine *e, int32_t idx, kvt_node_ref from, kvt_node_ref to);
int engine_req_unlock(kvt_engine *e, int32_t idx, kvt_node_ref node);

/* Room for pages SWA slots once the full side has it: check decides (-ENOMEM), room evicts
 * SWA KV alone. */
int engine_swa_room_check(const kvt_engine *e, size_t pages);
int engine_swa_room(kvt_engine *e, size_t pages);

/* The figures of the window (the slot layer adds the SWA pool's own). */
void engine_swa_stats(const kvt_engine *e, struct kvt_stats *st);
/* The pair allocator's invariants against the tree's count of pages holding SWA KV. */
int engine_swa_check(const kvt_engine *e, char *why, size_t why_len);

#endif
