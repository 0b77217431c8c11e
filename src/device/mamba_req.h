/*
 * Requests' Mamba state slots (req_to_mamba, as SGLang's HybridReqToTokenPool keeps it):
 * per request row of the request pool, the slot its recurrent state runs in and, with the
 * extra-buffer strategy, one or two track slots. The forward writes the state at each
 * checkpoint position into a track slot (alternating between two under an overlapped
 * scheduler, hence ping-pong), so the running slot is never handed to the cache while the
 * request still advances it.
 *
 * The rows are the request pool's indices; this map does not look at the request pool,
 * the engine keeps the two in step. Every slot named here is USED in the state pool; a slot
 * handed to the cache (donate, or kept at free) is CACHED from then on and the cache's.
 */
#ifndef KVT_DEVICE_MAMBA_REQ_H
#define KVT_DEVICE_MAMBA_REQ_H

#include <stddef.h>
#include <stdint.h>

#include "mamba_pool.h"

#define MAMBA_TRACK_MAX 2
#define MAMBA_NO_SLOT (-1)

/* What a request's free leaves to the cache: nothing, the running slot (no extra buffer:
 * the state at the end of the request is the checkpoint), or one of the track slots. */
enum mamba_keep {
    MAMBA_KEEP_NONE = -1,
    MAMBA_KEEP_TRACK0 = 0,
    MAMBA_KEEP_TRACK1 = 1,
    MAMBA_KEEP_RUNNING = 2
};

struct mamba_req_map {
    struct mamba_pool *pool; /* not owned; outlives the map */
    uint32_t max_reqs;
    uint32_t ntrack;  /* 0 (no extra buffer), 1 or 2 track slots per request */
    int32_t *running; /* per row: the running slot or MAMBA_NO_SLOT */
    int32_t *track;   /* per row: MAMBA_TRACK_MAX entries, MAMBA_NO_SLOT where empty */
};

/* -EINVAL unless max_reqs > 0 and ntrack <= MAMBA_TRACK_MAX; -ENOMEM. */
int mamba_req_init(struct mamba_req_map *m, struct mamba_pool *pool, uint32_t max_reqs,
                   uint32_t ntrack);
void mamba_req_finish(struct mamba_req_map *m);

/* Every row empty again, touching no slot (after mamba_pool_clear). */
void mamba_req_reset(struct mamba_req_map *m);

/* Slots a request without any takes at mamba_req_alloc: 1 + ntrack. */
uint32_t mamba_req_slots_per_req(const struct mamba_req_map *m);

/* Whether row req holds a running slot. */
int mamba_req_holds(const struct mamba_req_map *m, int32_t req);

/* Give row req what it lacks: a running slot unless it holds one (a COW at match or an
 * earlier chunk of a chunked prefill gave it one), and its track slots unless it has them.
 * All or nothing: -ENOMEM takes no slot. New slots are not zeroed (mamba_pool_zero). */
int mamba_req_alloc(struct mamba_req_map *m, int32_t req);

/* Copy-on-write of a checkpoint: row req gets a running slot if it has none, and the whole
 * state of src (a USED or CACHED slot, not one of req's) is copied into it. -ENOMEM when no
 * slot is free, -EINVAL on a bad row or src; on failure a slot taken here is given back. */
int mamba_req_cow(struct mamba_req_map *m, int32_t req, int32_t src);

/* The running slot of row req, or MAMBA_NO_SLOT (also for a row out of range). */
int32_t mamba_req_slot(const struct mamba_req_map *m, int32_t req);

/* Track slot idx of row req, or MAMBA_NO_SLOT. */
int32_t mamba_req_track(const struct mamba_req_map *m, int32_t req, uint32_t idx);

/* Hand track slot idx to the cache as a checkpoint while the request goes on: a fresh slot
 * takes its place, the old one becomes CACHED and is written to *donated. -ENOMEM or
 * -EINVAL change nothing. */
int mamba_req_donate(struct mamba_req_map *m, int32_t req, uint32_t idx, int32_t *donated);

/* Row req's slots go back to the pool, except the one keep names, which becomes CACHED and
 * is written to *kept (when kept is not NULL). -EINVAL, changing nothing, when the row
 * holds no running slot (a double free) or keep names a slot it does not hold. */
int mamba_req_free(struct mamba_req_map *m, int32_t req, enum mamba_keep keep, int32_t *kept);

#endif
