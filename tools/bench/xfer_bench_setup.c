/* kvtier-xfer-bench's rig (xfer_bench.h): the pages chosen, the pools and the transfer engine. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_bench.h"
#include "rng.h"

/* ---- choosing the pages ---- */

/* n distinct values of [first, first + count) in random order: a partial Fisher-Yates. */
static int sample(uint64_t *rng, uint32_t first, uint32_t count, uint32_t *out, size_t n)
{
    uint32_t *all = malloc((size_t)count * sizeof(*all));

    if (!all)
        return -ENOMEM;
    for (uint32_t i = 0; i < count; i++)
        all[i] = first + i;
    for (size_t i = 0; i < n; i++) {
        uint32_t j = (uint32_t)i + (uint32_t)rng_below(rng, count - i), t = all[i];

        all[i] = all[j];
        all[j] = t;
        out[i] = all[i];
    }
    free(all);
    return 0;
}

/* Page i continues the run of page i-1: the transfer engine would merge them. */
static bool joins(const struct rig *r, size_t i)
{
    return r->dev_pages[i] == r->dev_pages[i - 1] + 1 &&
           r->host_pages[i] == r->host_pages[i - 1] + 1;
}

static size_t count_runs(const struct rig *r, size_t n)
{
    size_t runs = n ? 1 : 0;

    for (size_t i = 1; i < n; i++)
        runs += !joins(r, i);
    return runs;
}

/* A random draw can still put two neighbours side by side on both pools; swapping a host
 * page away breaks that. Bounded passes: with a pool barely larger than N it may not
 * succeed, and the run count reported says so. */
static void break_runs(struct rig *r, uint64_t *rng, size_t n)
{
    for (int pass = 0; pass < 8 && count_runs(r, n) < n; pass++) {
        for (size_t i = 1; i < n; i++) {
            if (!joins(r, i))
                continue;
            uint32_t j = (uint32_t)rng_below(rng, n), t;

            j = j == i ? (uint32_t)i - 1 : j; /* never with itself, which would break nothing */
            t = r->host_pages[i];
            r->host_pages[i] = r->host_pages[j];
            r->host_pages[j] = t;
        }
    }
}

static int pick_random(struct rig *r, uint64_t *rng)
{
    size_t n = r->cfg->pages;
    uint32_t pool = (uint32_t)r->cfg->pool_pages;
    int rc;

    /* Device page 0 is the padding page, never handed out. */
    if ((rc = sample(rng, 1, pool, r->dev_pages, n)) ||
        (rc = sample(rng, 0, pool, r->host_pages, n)))
        return rc;
    break_runs(r, rng, n);
    return 0;
}

/* Runs of run_pages pages, each at a random whole block of both pools. */
static int pick_runs(struct rig *r, uint64_t *rng)
{
    uint32_t rp = (uint32_t)r->cfg->run_pages, blocks = (uint32_t)(r->cfg->pool_pages / rp);
    size_t n = r->cfg->pages, nruns = (n + rp - 1) / rp;
    uint32_t *blk = malloc(2 * nruns * sizeof(*blk));
    int rc = -ENOMEM;

    if (blk && !(rc = sample(rng, 0, blocks, blk, nruns)) &&
        !(rc = sample(rng, 0, blocks, blk + nruns, nruns))) {
        for (size_t i = 0; i < n; i++) {
            r->dev_pages[i] = 1 + blk[i / rp] * rp + (uint32_t)(i % rp);
            r->host_pages[i] = blk[nruns + i / rp] * rp + (uint32_t)(i % rp);
        }
    }
    free(blk);
    return rc;
}

static int pick_pages(struct rig *r)
{
    uint64_t rng = r->cfg->seed;
    size_t n = r->cfg->pages;
    int rc;

    r->dev_pages = malloc(n * sizeof(*r->dev_pages));
    r->host_pages = malloc(n * sizeof(*r->host_pages));
    if (!r->dev_pages || !r->host_pages)
        return xb_fail("page lists", -ENOMEM);
    rc = r->cfg->scatter == SCATTER_RUNS ? pick_runs(r, &rng) : pick_random(r, &rng);
    if (rc)
        return xb_fail("page lists", rc);
    r->runs = count_runs(r, n);
    return 0;
}

/* ---- setup ---- */

/* Bytes of host RAM the run takes: the host pool, and on sim the "device" pool and the
 * baseline's device buffer too. */
static uint64_t ram_needed(const struct rig *r)
{
    const struct config *cfg = r->cfg;
    uint64_t host = cfg->pool_pages * r->page_bytes;

    if (xb_on_cuda(r))
        return host;
    return host + (cfg->pool_pages + 1) * r->page_bytes + r->bytes;
}

static int check_ram(const struct rig *r)
{
    uint64_t need = ram_needed(r), avail = host_memory_available();

    if (avail == 0 || need <= avail)
        return 0;
    fprintf(stderr,
            "%s: this run needs %.1f GiB of RAM and %.1f GiB are available: lower --pages or "
            "--pool-pages\n",
            PROG, (double)need / (1 << 30), (double)avail / (1 << 30));
    return -1;
}

/* Touch every byte now, so that no copy timed later pays for page faults (a fresh mapping
 * reads as the shared zero page and faults on its first write). */
static void fill_sim_pool(struct kv_pool *p)
{
    for (int w = 0; w < 2; w++)
        for (uint32_t l = 0; p->row_bytes[w] && l < p->geo.layers; l++)
            memset(p->buf[w][l], 0x5a + w, p->rows * p->row_bytes[w]);
}

static int open_pools(struct rig *r)
{
    const struct config *cfg = r->cfg;
    struct xfer_config xc = {.io = cfg->io,
                             .seed = cfg->seed,
                             .auto_dma_min_bytes = cfg->dma_min_bytes,
                             .kernel_blocks = (uint32_t)cfg->kernel_blocks,
                             .high_priority_loads = cfg->load_priority == PRIORITY_HIGH,
                             .dma_prefer_overlap = cfg->dma_hint == 1};
    int rc;

    if ((rc = kv_pool_init(&r->dev, r->be, &cfg->g, (cfg->pool_pages + 1) * cfg->page_size)))
        return xb_fail("device pool", rc);
    r->dev_ready = true;
    rc = host_pool_init(&r->host, r->be, &cfg->g, cfg->page_size, cfg->pool_pages, cfg->layout);
    if (rc)
        return xb_fail("host pool", rc);
    r->host_ready = true;
    if (!xb_on_cuda(r))
        fill_sim_pool(&r->dev); /* cuda's alloc has already zeroed (and so mapped) it */
    memset(r->host.base, 0xa5, r->host.bytes);
    if ((rc = xfer_create(&r->dev, &r->host, &xc, &r->x)))
        return xb_fail("xfer_create", rc);
    return 0;
}

/* The baseline's host side is the start of the host pool itself: the same memory, pinned
 * the same way, as the scattered copies use (its contents do not matter here). Its device
 * side is one buffer from the backend, as the pool's are. */
static int open_baseline(struct rig *r)
{
    int rc;

    if ((rc = r->be->alloc(r->bytes, &r->base_dev)))
        return xb_fail("baseline device buffer", rc);
    r->base_host = r->host.base;
    if (!xb_on_cuda(r))
        memset(r->base_dev, 0x5a, r->bytes);
    return xb_stream_create(r);
}

/* 0, -1 after an error (said on stderr), or EXIT_SKIP when cuda was asked for and there is
 * no GPU to run it on. */
int xb_setup(struct rig *r)
{
    const struct config *cfg = r->cfg;
    int rc = dev_backend_select(cfg->backend, &r->be);

    if (rc == KVT_ENOBACKEND) {
        fprintf(stderr,
                "%s: --backend cuda: no CUDA device here, or this build has no CUDA; "
                "nothing measured\n",
                PROG);
        return EXIT_SKIP;
    }
    if (rc)
        return xb_fail("backend", rc);
    r->page_bytes = (size_t)kvt_cell_bytes(&cfg->g) * cfg->page_size;
    r->bytes = cfg->pages * r->page_bytes;
    if (check_ram(r) || pick_pages(r) || open_pools(r) || open_baseline(r))
        return -1;
#ifdef KVT_HAVE_KERNELS
    r->burn = xb_on_cuda(r) && cfg->compute != COMPUTE_HOST;
    if (r->burn && xb_burn_setup(r))
        return -1;
#else
    if (xb_on_cuda(r) && cfg->compute == COMPUTE_KERNEL) {
        fprintf(stderr, "%s: --compute kernel: this build has no CUDA kernels\n", PROG);
        return -1;
    }
#endif
    return 0;
}

void xb_teardown(struct rig *r)
{
    xb_stream_destroy(r);
    xfer_destroy(r->x);
    if (r->base_dev)
        r->be->free(r->base_dev, r->bytes);
    if (r->host_ready)
        host_pool_finish(&r->host);
    if (r->dev_ready)
        kv_pool_finish(&r->dev);
    free(r->dev_pages);
    free(r->host_pages);
}
