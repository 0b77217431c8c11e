#include "mamba_req.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int mamba_req_init(struct mamba_req_map *m, struct mamba_pool *pool, uint32_t max_reqs,
                   uint32_t ntrack)
{
    memset(m, 0, sizeof(*m));
    if (!pool || max_reqs == 0 || max_reqs > INT32_MAX || ntrack > MAMBA_TRACK_MAX)
        return -EINVAL;
    m->pool = pool;
    m->max_reqs = max_reqs;
    m->ntrack = ntrack;
    m->running = malloc((size_t)max_reqs * sizeof(int32_t));
    m->track = malloc((size_t)max_reqs * MAMBA_TRACK_MAX * sizeof(int32_t));
    if (!m->running || !m->track) {
        mamba_req_finish(m);
        return -ENOMEM;
    }
    mamba_req_reset(m);
    return 0;
}

void mamba_req_finish(struct mamba_req_map *m)
{
    free(m->running);
    free(m->track);
    memset(m, 0, sizeof(*m));
}

void mamba_req_reset(struct mamba_req_map *m)
{
    for (uint32_t i = 0; i < m->max_reqs; i++)
        m->running[i] = MAMBA_NO_SLOT;
    for (size_t i = 0; i < (size_t)m->max_reqs * MAMBA_TRACK_MAX; i++)
        m->track[i] = MAMBA_NO_SLOT;
}

uint32_t mamba_req_slots_per_req(const struct mamba_req_map *m)
{
    return 1 + m->ntrack;
}

static int row_ok(const struct mamba_req_map *m, int32_t req)
{
    return req >= 0 && (uint32_t)req < m->max_reqs;
}

static int32_t *track_row(const struct mamba_req_map *m, int32_t req)
{
    return m->track + (size_t)req * MAMBA_TRACK_MAX;
}

int mamba_req_holds(const struct mamba_req_map *m, int32_t req)
{
    return row_ok(m, req) && m->running[req] != MAMBA_NO_SLOT;
}

/* Track slots are taken all at once, at the row's first alloc (which may follow a COW that
 * gave it the running slot alone), and given back together, so a row has all ntrack of them
 * or none. */
static uint32_t missing_slots(const struct mamba_req_map *m, int32_t req)
{
    uint32_t n = mamba_req_holds(m, req) ? 0 : 1;

    if (m->ntrack && track_row(m, req)[0] == MAMBA_NO_SLOT)
        n += m->ntrack;
    return n;
}

int mamba_req_alloc(struct mamba_req_map *m, int32_t req)
{
    int32_t got[1 + MAMBA_TRACK_MAX];
    uint32_t n, k = 0;
    int rc;

    if (!row_ok(m, req))
        return -EINVAL;
    n = missing_slots(m, req);
    rc = mamba_pool_alloc(m->pool, n, got);
    if (rc)
        return rc;
    if (m->running[req] == MAMBA_NO_SLOT)
        m->running[req] = got[k++];
    for (uint32_t t = 0; k < n; t++)
        track_row(m, req)[t] = got[k++];
    return 0;
}

static int is_own_track(const struct mamba_req_map *m, int32_t req, int32_t s)
{
    for (uint32_t t = 0; t < m->ntrack; t++)
        if (track_row(m, req)[t] == s)
            return 1;
    return 0;
}

static int holds_state(const struct mamba_pool *p, int32_t s)
{
    int st = mamba_pool_slot_state(p, s);

    return st == MAMBA_SLOT_USED || st == MAMBA_SLOT_CACHED;
}

int mamba_req_cow(struct mamba_req_map *m, int32_t req, int32_t src)
{
    int took = 0, rc;

    /* Checked before a slot is taken, so a refused call leaves the free list's order as it
     * was. A request's own track slot holds its latest tracked state, not a checkpoint. */
    if (!row_ok(m, req) || is_own_track(m, req, src) || src == m->running[req] ||
        !holds_state(m->pool, src))
        return -EINVAL;
    if (m->running[req] == MAMBA_NO_SLOT) {
        rc = mamba_pool_alloc(m->pool, 1, &m->running[req]);
        if (rc)
            return rc;
        took = 1;
    }
    rc = mamba_pool_copy(m->pool, &src, &m->running[req], 1);
    if (rc && took) {
        mamba_pool_free(m->pool, &m->running[req], 1);
        m->running[req] = MAMBA_NO_SLOT;
    }
    return rc;
}

int32_t mamba_req_slot(const struct mamba_req_map *m, int32_t req)
{
    return row_ok(m, req) ? m->running[req] : MAMBA_NO_SLOT;
}

int32_t mamba_req_track(const struct mamba_req_map *m, int32_t req, uint32_t idx)
{
    return row_ok(m, req) && idx < m->ntrack ? track_row(m, req)[idx] : MAMBA_NO_SLOT;
}

int mamba_req_donate(struct mamba_req_map *m, int32_t req, uint32_t idx, int32_t *donated)
{
    int32_t old = mamba_req_track(m, req, idx), fresh;
    int rc;

    if (old == MAMBA_NO_SLOT || !donated)
        return -EINVAL;
    rc = mamba_pool_alloc(m->pool, 1, &fresh);
    if (rc)
        return rc;
    rc = mamba_pool_claim(m->pool, &old, 1);
    if (rc) {
        mamba_pool_free(m->pool, &fresh, 1);
        return rc;
    }
    track_row(m, req)[idx] = fresh;
    *donated = old;
    return 0;
}

/* The slot keep names in row req, or MAMBA_NO_SLOT when it names none the row holds. */
static int32_t kept_slot(const struct mamba_req_map *m, int32_t req, enum mamba_keep keep)
{
    if (keep == MAMBA_KEEP_RUNNING)
        return m->running[req];
    if (keep == MAMBA_KEEP_TRACK0 || keep == MAMBA_KEEP_TRACK1)
        return mamba_req_track(m, req, (uint32_t)keep);
    return MAMBA_NO_SLOT;
}

/* The row's slots, running first; 0 when one of them is not USED in the pool (the map and
 * the pool went out of step: nothing may be moved). */
static uint32_t row_slots(const struct mamba_req_map *m, int32_t req, int32_t *out)
{
    uint32_t n = 0;

    out[n++] = m->running[req];
    for (uint32_t t = 0; t < m->ntrack; t++)
        if (track_row(m, req)[t] != MAMBA_NO_SLOT)
            out[n++] = track_row(m, req)[t];
    for (uint32_t i = 0; i < n; i++)
        if (mamba_pool_slot_state(m->pool, out[i]) != MAMBA_SLOT_USED)
            return 0;
    return n;
}

int mamba_req_free(struct mamba_req_map *m, int32_t req, enum mamba_keep keep, int32_t *kept)
{
    int32_t held[1 + MAMBA_TRACK_MAX], back[1 + MAMBA_TRACK_MAX], keep_slot;
    uint32_t n, nback = 0;
    int rc;

    if (!mamba_req_holds(m, req))
        return -EINVAL;
    keep_slot = kept_slot(m, req, keep);
    n = row_slots(m, req, held);
    if (n == 0 || (keep != MAMBA_KEEP_NONE && keep_slot == MAMBA_NO_SLOT))
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (held[i] != keep_slot)
            back[nback++] = held[i];
    /* The free checks its batch whole and changes nothing on -EINVAL; the kept slot is in
     * no batch of it, so it is still USED after and its claim cannot fail. */
    rc = mamba_pool_free(m->pool, back, nback);
    if (rc)
        return rc;
    if (keep_slot != MAMBA_NO_SLOT)
        mamba_pool_claim(m->pool, &keep_slot, 1);
    if (kept)
        *kept = keep_slot;
    m->running[req] = MAMBA_NO_SLOT;
    for (uint32_t t = 0; t < MAMBA_TRACK_MAX; t++)
        track_row(m, req)[t] = MAMBA_NO_SLOT;
    return 0;
}
