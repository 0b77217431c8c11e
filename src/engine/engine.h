/*
 * The engine's private side (src/engine/): the public engine of kvtier.h over the device tier
 * and the prefix tree, with the chain of tiers below it built at open. Its files, each
 * calling only those below it:
 *
 *   api.c         options, open/close (the chain is built here), versions, errors
 *   engine.c      the prefix cache: match, insert, eviction and room on the device,
 *                 allocation, KV data, requests
 *   check.c       the invariant check across tree, slots and tiers (tests)
 *   stats.c       the figures: kvt_stats, and the stats socket's after each poll
 *   embeddings.c  the multimodal embedding cache's calls (the cache: src/emb/)
 *   swa.c         sliding-window layers (swa.h): a match up to its last window, window locks,
 *                 slides, SWA tombstones, the window's room and its load-back
 *   mamba.c       recurrent states (mamba.h): state slots, copy on write at match,
 *                 checkpoints handed to the tree, the public calls
 *   mamba_tiers.c their room, host copies, states in the store below (mamba_int.h)
 *   slots.c       the slot layer (slots.h): the allocator and KV pools behind every slot
 *                 call, full attention alone or with the sliding-window pair
 *
 * engine_int.h holds the state they share; the calls of each file are in its own header
 * (this one: api.c's, engine.c's and check.c's; embeddings.h, stats.h, swa.h, mamba.h,
 * mamba_tiers.h, slots.h), so a file including the state never includes the calls of a file
 * above it.
 */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "engine/engine_int.h"

/* kvt_open with the store below the host given (NULL: the one the options name): the test
 * seam for stores with faults, and the way in for a backend not built in. The engine owns
 * store from the call on, whatever it returns. */
int engine_open(const struct kvt_options *opts, struct kvt_store *store, kvt_engine **out);

/* The options of the disk store the engine opened (tests open it again with faults). */
void engine_disk_options(const kvt_engine *e, struct dstore_options *so);

/* Replace the store below the host by s (test seam: right after open, nothing in flight);
 * the old one is closed first. s NULL only closes it (to open another writer on its dir):
 * call again with a store before the engine is used. -EINVAL without a store tier. */
int engine_swap_store(kvt_engine *e, struct kvt_store *s);

/* Evict pages device pages, storing below first what the tier below keeps of evictions, and
 * waiting for the ops in flight when that is not enough: the pages evicted. */
size_t engine_evict(kvt_engine *e, size_t pages);

/* Make pages device pages free, evicting as engine_evict does when there are too few: 0, or
 * -ENOMEM having changed nothing when eviction could not free enough. */
int engine_room_for(kvt_engine *e, size_t pages);
/* engine_room_for with sliding-window layers taking fewer pages on the SWA side (a load-back
 * pairs only the pages of its window). */
int engine_room_split(kvt_engine *e, size_t pages, size_t swa_pages);

/* Check every invariant across tree and allocators (check.c): each device page is free, held
 * by a caller, pending in a free group, or cached by exactly one node; each page a tier below
 * keeps in the tree is held once; tree sizes add up. 0, or -EUCLEAN with the reason in why.
 * For tests; walks everything. */
int engine_check(const kvt_engine *e, char *why, size_t why_len);

#endif
