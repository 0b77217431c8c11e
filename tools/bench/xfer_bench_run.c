/* kvtier-xfer-bench's runs (xfer_bench.h): (a) bandwidth against one contiguous copy, (b) a
 * prefill's layers against the ideal pipeline. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_bench.h"

/* ---- (a) bandwidth ---- */

/* Count which path (kernel or dma) the engine took for ops of dir since before[]. */
static void count_paths(struct rig *r, enum xfer_dir dir, const uint64_t before[2])
{
    uint64_t after[2];

    xfer_path_ops(r->x, &after[0], &after[1]);
    r->path_ops[dir][0] += after[0] - before[0];
    r->path_ops[dir][1] += after[1] - before[1];
}

/* One op over the first n pages, submit to completion; checks that every byte counted. */
static int timed_xfer(struct rig *r, enum xfer_dir dir, size_t n, double *seconds)
{
    uint64_t before = xfer_bytes(r->x, dir), id, want = n * r->page_bytes, moved, paths[2];
    double t0;
    int rc;

    xfer_path_ops(r->x, &paths[0], &paths[1]);
    t0 = cli_now();
    rc = xfer_submit(r->x, dir, r->dev_pages, r->host_pages, n, NULL, &id);
    if (rc)
        return xb_fail("xfer_submit", rc);
    rc = xfer_wait(r->x, dir, id);
    *seconds = cli_now() - t0;
    count_paths(r, dir, paths);
    if (rc)
        return xb_fail(dir == XFER_LOAD ? "load" : "backup", rc);
    if ((moved = xfer_bytes(r->x, dir) - before) != want) {
        fprintf(stderr, "%s: the op moved %" PRIu64 " bytes, not %" PRIu64 "\n", PROG, moved, want);
        return -1;
    }
    return 0;
}

static int timed_base(struct rig *r, bool h2d, double *seconds)
{
    double t0 = cli_now();
    int rc = xb_base_copy(r, h2d);

    *seconds = cli_now() - t0;
    return rc;
}

/* One rep of the four copies, interleaved so that drift in the machine hits all alike. */
static int bandwidth_rep(struct rig *r, double t[4])
{
    size_t n = r->cfg->pages;

    if (timed_base(r, true, &t[0]) || timed_xfer(r, XFER_LOAD, n, &t[1]) ||
        timed_base(r, false, &t[2]) || timed_xfer(r, XFER_BACKUP, n, &t[3]))
        return -1;
    return 0;
}

int xb_run_bandwidth(struct rig *r, struct bandwidth *bw)
{
    size_t reps = r->cfg->reps;
    double *t = calloc(4 * reps, sizeof(*t)), warm[4];
    int rc = t ? bandwidth_rep(r, warm) : xb_fail("timings", -ENOMEM); /* the warm-up */

    for (size_t i = 0; i < reps && !rc; i++) {
        double one[4];

        rc = bandwidth_rep(r, one);
        for (int k = 0; k < 4; k++)
            t[k * reps + i] = one[k];
    }
    if (!rc) {
        bw->base_h2d = cli_summarize(t, reps);
        bw->load = cli_summarize(t + reps, reps);
        bw->base_d2h = cli_summarize(t + 2 * reps, reps);
        bw->backup = cli_summarize(t + 3 * reps, reps);
    }
    free(t);
    return rc;
}

/* ---- (b) overlap ---- */

/* A perfect pipeline: layer k's compute starts when its copy has landed and layer k-1's
 * compute is over. With compute >= copy that is L C + T, the target's ideal. */
static double ideal_prefill(uint32_t layers, double copy, double compute)
{
    return copy + compute + (layers - 1) * max_d(copy, compute);
}

/* The forward's side of a prefill: per layer, wait for it, then compute. */
static int prefill_layers(struct rig *r, uint64_t id)
{
    for (uint32_t l = 0; l < r->cfg->g.layers; l++) {
        int rc = xfer_wait_layer(r->x, id, l, xb_compute_stream(r));

        if (rc)
            return xb_fail("xfer_wait_layer", rc);
        if (xb_compute_layer(r))
            return -1;
    }
    return xb_compute_sync(r);
}

/* One prefill, from submitting the load to the end of the last layer's compute. */
static int prefill_once(struct rig *r, size_t n, double *seconds)
{
    uint64_t id, paths[2];
    double t0;
    int rc, wrc;

    xfer_path_ops(r->x, &paths[0], &paths[1]);
    t0 = cli_now();
    rc = xfer_submit(r->x, XFER_LOAD, r->dev_pages, r->host_pages, n, NULL, &id);
    if (rc)
        return xb_fail("xfer_submit", rc);
    count_paths(r, XFER_LOAD, paths);
    rc = prefill_layers(r, id);
    *seconds = cli_now() - t0;
    wrc = xfer_wait(r->x, XFER_LOAD, id); /* also after a failure: the op is still queued */
    if (!rc && wrc)
        return xb_fail("load", wrc);
    return rc;
}

/* Median and best of reps calls of fn after one warm-up. */
static int repeat(struct rig *r, size_t n, int (*fn)(struct rig *, size_t, double *),
                  struct cli_timing *out)
{
    size_t reps = r->cfg->reps;
    double *t = calloc(reps, sizeof(*t)), warm;
    int rc = t ? fn(r, n, &warm) : xb_fail("timings", -ENOMEM);

    for (size_t i = 0; i < reps && !rc; i++)
        rc = fn(r, n, &t[i]);
    if (!rc)
        *out = cli_summarize(t, reps);
    free(t);
    return rc;
}

static int load_once(struct rig *r, size_t n, double *seconds)
{
    return timed_xfer(r, XFER_LOAD, n, seconds);
}

/* Auto compute: AUTO_COMPUTE_FACTOR layer copies, whole microseconds, at least 1. */
static double auto_compute(double layer)
{
    double us = (double)(uint64_t)(layer * AUTO_COMPUTE_FACTOR * 1e6 + 0.999);

    return (us < 1 ? 1 : us) * 1e-6;
}

int xb_run_overlap(struct rig *r, struct overlap *ov)
{
    const struct config *cfg = r->cfg;
    size_t n = cfg->overlap_pages;
    int rc = repeat(r, n, load_once, &ov->load);

    ov->layer = ov->load.median / cfg->g.layers;
    for (size_t i = 0; i < cfg->ncompute && !rc; i++) {
        struct overlap_point *p = &ov->pt[i];

        p->automatic = cfg->compute_us[i] == 0;
        p->asked = p->automatic ? auto_compute(ov->layer) : (double)cfg->compute_us[i] * 1e-6;
        p->compute = r->spin = p->asked;
#ifdef KVT_HAVE_KERNELS
        if (r->burn && xb_burn_point(r, p))
            return -1;
#endif
        p->ideal = ideal_prefill(cfg->g.layers, ov->layer, p->compute);
        rc = repeat(r, n, prefill_once, &p->measured);
    }
    return rc;
}
