/*
 * Hybrid models' recurrent states below the device (mamba_tiers.c): the calls engine.c,
 * api.c, check.c and mamba.c make. Every call here is for an engine with e->mamba, except
 * engine_mamba_host_slots, which says 0 without.
 */
#ifndef KVT_ENGINE_MAMBA_TIERS_H
#define KVT_ENGINE_MAMBA_TIERS_H

#include "engine/engine_int.h"

/* The tree's state settings; with host_pages (the host tier's pool) the host copies of
 * states are made room for, within avail bytes of memory (0: unknown). */
int engine_mamba_tree_config(kvt_engine *e, struct rdx_config *cfg, uint64_t host_pages,
                             uint64_t avail);

/* A free state slot for the track slot that replaces a donated one: 0 or -ENOMEM. */
int engine_mamba_room(kvt_engine *e, size_t n);
/* kvt_prefetch's share: of the n pages past hit that the store below holds, how many to
 * fetch: up to the deepest state kept there (0: none), since KV past a state serves nothing;
 * n without a store. */
size_t engine_mamba_prefetch_pages(kvt_engine *e, const struct kvt_key *key,
                                   const struct rdx_hit *hit, size_t n);

/* How many host copies of states the engine may keep (0: none). */
uint32_t engine_mamba_host_slots(const kvt_engine *e);

#endif
