/*
 * Hybrid models' recurrent states in the engine (mamba.c; below the device: mamba_tiers.h):
 * the calls engine.c, api.c, stats.c and check.c make. Every call here is for an engine with
 * e->mamba, except engine_mamba_slots, which says 0 without. mamba.c calls down only:
 * mamba_tiers.c, the device's state pool, the tree, the slot layer, the tier below.
 */
#ifndef KVT_ENGINE_MAMBA_H
#define KVT_ENGINE_MAMBA_H

#include "engine/engine_int.h"

/* Options check, then the state pool and request map. */
int engine_mamba_check_options(const struct kvt_options *o);
int engine_mamba_open(kvt_engine *e);
void engine_mamba_close(kvt_engine *e);

/* kvt_match and the match of kvt_req_begin: the device prefix cut to its deepest state. The
 * begin writes that prefix's slots into row, locks it, and gives request row idx its slots
 * (a copy of the state, or zeros). */
int engine_mamba_match(kvt_engine *e, const struct kvt_key *key, int32_t *slots,
                       struct kvt_match *m);
int engine_mamba_begin(kvt_engine *e, int32_t idx, const struct kvt_key *key, int32_t *row,
                       struct kvt_req *req);

/* Where an insert of request row idx ends: its recorded checkpoint, when one lies past
 * protected_len and within key_len; else protected_len (nothing to insert). */
size_t engine_mamba_cache_len(const kvt_engine *e, int32_t idx, size_t protected_len,
                              size_t key_len);

/* The request's checkpoint goes to node (which ends at its recorded position): mid-request a
 * fresh track slot replaces it; at finish (finished 1) the row's slots go, the checkpoint
 * kept when node is not 0. 0, or -EUCLEAN (a slot not where this engine put it). */
int engine_mamba_cached(kvt_engine *e, int32_t idx, kvt_node_ref node, int finished);

/* State slots (1 .. n); 0 without recurrent layers. */
uint32_t engine_mamba_slots(const kvt_engine *e);

/* Each state slot and host copy of a state has the one owner its state says: held[s] and
 * hheld[h] count the tree's nodes naming them. */
int engine_mamba_check(const kvt_engine *e, const uint8_t *held, const uint8_t *hheld, char *why,
                       size_t why_len);
void engine_mamba_stats(const kvt_engine *e, struct kvt_stats *st);

#endif
