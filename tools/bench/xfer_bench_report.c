/* kvtier-xfer-bench's report (xfer_bench.h): text and JSON. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_bench.h"
#include "report.h"

static double target_ratio(const struct rig *r)
{
    return xb_on_cuda(r) ? TARGET_RATIO_GPU : TARGET_RATIO_SIM;
}

static void print_text_config(const struct rig *r)
{
    const struct config *cfg = r->cfg;
    const struct kvt_geometry *g = &cfg->g;

    printf("%s: %s backend, io %s%s, host layout %s (%s)\n", PROG, r->be->name,
           xb_io_names[cfg->io], xb_on_cuda(r) ? "" : " (sim ignores it)",
           xb_layout_names[cfg->layout], r->host.pinned ? "pinned" : "not pinned");
    printf("  geometry  %s: %u layers, ", cfg->geometry_arg, g->layers);
    if (g->attention == KVT_ATTN_MLA)
        printf("MLA latent %u + rope %u", g->kv_lora_rank, g->qk_rope_head_dim);
    else
        printf("%u KV heads of %u", g->kv_heads, g->head_dim);
    printf(", %u-byte elements; page %u tokens = ", g->dtype_bytes, cfg->page_size);
    cli_print_size(r->page_bytes);
    printf("\n  pages     %" PRIu64 " of %" PRIu64 " in each pool, ", cfg->pages, cfg->pool_pages);
    if (cfg->scatter == SCATTER_RUNS)
        printf("in runs of %" PRIu64, cfg->run_pages);
    else
        printf("scattered at random");
    printf(" (seed %" PRIu64 "): %zu runs\n", cfg->seed, r->runs);
    if (xb_on_cuda(r))
        printf("  streams   loads at %s priority; kernel path at most %" PRIu64
               " blocks of 8 warps per layer%s; copy-engine hint %s\n",
               xb_priority_names[cfg->load_priority],
               cfg->kernel_blocks ? cfg->kernel_blocks : (uint64_t)XFER_KERNEL_BLOCKS,
               cfg->kernel_blocks ? "" : " (the engine's default)",
               xb_dma_hint_names[cfg->dma_hint]);
    if (xb_on_cuda(r))
        printf("  paths     loads: %" PRIu64 " by kernel, %" PRIu64 " by dma; backups: %" PRIu64
               " by kernel, %" PRIu64 " by dma\n",
               r->path_ops[XFER_LOAD][0], r->path_ops[XFER_LOAD][1], r->path_ops[XFER_BACKUP][0],
               r->path_ops[XFER_BACKUP][1]);
}

static void print_text_dir(const char *name, const struct cli_timing *x, const struct cli_timing *b,
                           uint64_t bytes, double target)
{
    double rm = cli_ratio(b->median, x->median), rb = cli_ratio(b->best, x->best);

    printf("  %-13s %6.2f (%6.2f) GB/s  %6.2f (%6.2f) GB/s  %5.3f (%5.3f)  >= %.2f %s\n", name,
           cli_gbps(bytes, x->median), cli_gbps(bytes, x->best), cli_gbps(bytes, b->median),
           cli_gbps(bytes, b->best), rm, rb, target, cli_met(rm >= target));
}

static void print_text_bandwidth(const struct rig *r, const struct bandwidth *bw)
{
    printf("\n(a) bandwidth: ");
    cli_print_size(r->bytes);
    printf(" per op, median (best) of %" PRIu64 " after a warm-up\n", r->cfg->reps);
    printf("    one copy: %s\n",
           xb_on_cuda(r) ? "one cudaMemcpyAsync between the host pool and a device buffer"
                         : "one memcpy between the host pool and a buffer, one thread");
    printf("  %-13s %-22s %-22s %-15s %s\n", "", "scattered", "one copy", "ratio", "target");
    print_text_dir("load (H2D)", &bw->load, &bw->base_h2d, r->bytes, target_ratio(r));
    print_text_dir("backup (D2H)", &bw->backup, &bw->base_d2h, r->bytes, target_ratio(r));
}

static void print_text_overlap(const struct rig *r, const struct overlap *ov)
{
    const struct config *cfg = r->cfg;
    uint64_t bytes = cfg->overlap_pages * r->page_bytes;

    printf("\n(b) overlap: prefill of %u layers over %" PRIu64 " pages (", cfg->g.layers,
           cfg->overlap_pages);
    cli_print_size(bytes);
    printf("), median of %" PRIu64 " after a warm-up\n", cfg->reps);
    printf("  one layer's copy %.1f us (", ov->layer * 1e6);
    cli_print_size(bytes / cfg->g.layers);
    printf(", whole load %.2f ms at %.2f GB/s)\n", ov->load.median * 1e3,
           cli_gbps(bytes, ov->load.median));
    if (r->burn)
        printf(
            "  compute   a kernel of waves of %d SMs x %d blocks of %d threads, each block about "
            "%.0f us;\n            compute/layer is its time alone, for %u layers in a row\n",
            r->sms, r->burn_per_sm, XC_THREADS_OR_0, BURN_BLOCK_US, cfg->g.layers);
    else if (xb_on_cuda(r))
        printf("  compute   a host function busy-waiting on the compute stream (no SM taken)\n");
    printf("  %-16s %12s %12s %10s %13s   %s\n", "compute/layer", "measured", "ideal", "overhead",
           "copy/compute", "target");
    for (size_t i = 0; i < cfg->ncompute; i++) {
        const struct overlap_point *p = &ov->pt[i];
        double over = 100 * (cli_ratio(p->measured.median, p->ideal) - 1);

        printf("  %9.1f us%-5s %9.2f ms %9.2f ms %+9.2f%% %13.3f   <= %.0f%% %s\n",
               p->compute * 1e6, p->automatic ? " auto" : "", p->measured.median * 1e3,
               p->ideal * 1e3, over, cli_ratio(ov->layer, p->compute), TARGET_OVERHEAD_PCT,
               cli_met(over <= TARGET_OVERHEAD_PCT));
    }
}

static void print_json_geometry(struct jw *w, const struct config *cfg)
{
    const struct kvt_geometry *g = &cfg->g;

    jw_string(w, "geometry", cfg->geometry_arg);
    jw_string(w, "attention", g->attention == KVT_ATTN_MLA ? "mla" : "mha");
    jw_u64(w, "layers", g->layers);
    jw_u64(w, "kv_heads", g->kv_heads);
    jw_u64(w, "head_dim", g->head_dim);
    jw_u64(w, "v_head_dim", g->v_head_dim ? g->v_head_dim : g->head_dim);
    jw_u64(w, "kv_lora_rank", g->kv_lora_rank);
    jw_u64(w, "qk_rope_head_dim", g->qk_rope_head_dim);
    jw_u64(w, "dtype_bytes", g->dtype_bytes);
}

static void print_json_paths(struct jw *w, const struct rig *r)
{
    static const char *const dirs[2] = {[XFER_LOAD] = "load", [XFER_BACKUP] = "backup"};

    jw_object(w, "path_ops");
    for (int d = 0; d < 2; d++) {
        jw_object(w, dirs[d]);
        jw_u64(w, "kernel", r->path_ops[d][0]);
        jw_u64(w, "dma", r->path_ops[d][1]);
        jw_end(w);
    }
    jw_end(w);
}

static void print_json_config(struct jw *w, const struct rig *r)
{
    const struct config *cfg = r->cfg;

    jw_object(w, "config");
    jw_string(w, "backend", r->be->name);
    jw_string(w, "io", xb_io_names[cfg->io]);
    jw_string(w, "load_priority", xb_priority_names[cfg->load_priority]);
    jw_u64(w, "kernel_blocks", cfg->kernel_blocks ? cfg->kernel_blocks : XFER_KERNEL_BLOCKS);
    jw_string(w, "dma_hint", xb_dma_hint_names[cfg->dma_hint]);
    jw_string(w, "layout", xb_layout_names[cfg->layout]);
    jw_bool(w, "host_pinned", r->host.pinned);
    print_json_geometry(w, cfg);
    jw_u64(w, "page_size", cfg->page_size);
    jw_u64(w, "page_bytes", r->page_bytes);
    jw_u64(w, "pages", cfg->pages);
    jw_u64(w, "pool_pages", cfg->pool_pages);
    jw_string(w, "scatter", xb_scatter_names[cfg->scatter]);
    if (cfg->scatter == SCATTER_RUNS)
        jw_u64(w, "run_pages", cfg->run_pages);
    else
        jw_null(w, "run_pages");
    jw_u64(w, "runs", r->runs);
    jw_u64(w, "reps", cfg->reps);
    jw_u64(w, "seed", cfg->seed);
    jw_u64(w, "dma_min_bytes", cfg->dma_min_bytes);
    print_json_paths(w, r);
    jw_end(w);
}

static void print_json_ratio(struct jw *w, const char *name, const struct cli_timing *x,
                             const struct cli_timing *b)
{
    jw_object(w, name);
    jw_double(w, "median", "%.6g", cli_ratio(b->median, x->median));
    jw_double(w, "best", "%.6g", cli_ratio(b->best, x->best));
    jw_end(w);
}

static void print_json_bandwidth(struct jw *w, const struct rig *r, const struct bandwidth *bw)
{
    jw_object(w, "bandwidth");
    jw_u64(w, "bytes", r->bytes);
    jw_string(w, "baseline", xb_on_cuda(r) ? "cudaMemcpyAsync" : "memcpy");
    rpt_json_timing(w, "load", &bw->load, r->bytes, false);
    rpt_json_timing(w, "backup", &bw->backup, r->bytes, false);
    rpt_json_timing(w, "baseline_h2d", &bw->base_h2d, r->bytes, false);
    rpt_json_timing(w, "baseline_d2h", &bw->base_d2h, r->bytes, false);
    print_json_ratio(w, "load_ratio", &bw->load, &bw->base_h2d);
    print_json_ratio(w, "backup_ratio", &bw->backup, &bw->base_d2h);
    jw_double(w, "target_ratio", "%.2f", target_ratio(r));
    jw_end(w);
}

static void print_json_point(struct jw *w, const struct overlap *ov, const struct overlap_point *p)
{
    jw_object(w, NULL);
    jw_double(w, "compute_us", "%.3f", p->compute * 1e6);
    jw_double(w, "asked_us", "%.3f", p->asked * 1e6);
    jw_u64(w, "compute_blocks", p->burn_blocks);
    jw_bool(w, "auto", p->automatic);
    jw_double(w, "measured_s", "%.9g", p->measured.median);
    jw_double(w, "best_s", "%.9g", p->measured.best);
    jw_double(w, "ideal_s", "%.9g", p->ideal);
    jw_double(w, "overhead_pct", "%.4f", 100 * (cli_ratio(p->measured.median, p->ideal) - 1));
    jw_double(w, "copy_compute_ratio", "%.6g", cli_ratio(ov->layer, p->compute));
    jw_end(w);
}

static void print_json_overlap(struct jw *w, const struct rig *r, const struct overlap *ov)
{
    const struct config *cfg = r->cfg;
    uint64_t bytes = cfg->overlap_pages * r->page_bytes;

    jw_object(w, "overlap");
    jw_u64(w, "layers", cfg->g.layers);
    jw_u64(w, "pages", cfg->overlap_pages);
    jw_u64(w, "bytes", bytes);
    jw_u64(w, "layer_bytes", bytes / cfg->g.layers);
    rpt_json_timing(w, "load", &ov->load, bytes, false);
    jw_double(w, "layer_copy_s", "%.9g", ov->layer);
    jw_string(w, "compute", r->burn ? "kernel" : xb_on_cuda(r) ? "host" : "busy-wait");
    jw_double(w, "target_overhead_pct", "%.1f", TARGET_OVERHEAD_PCT);
    jw_array(w, "points");
    for (size_t i = 0; i < cfg->ncompute; i++)
        print_json_point(w, ov, &ov->pt[i]);
    jw_end(w);
    jw_end(w);
}

void xb_print_report(const struct rig *r, const struct bandwidth *bw, const struct overlap *ov)
{
    struct jw w;

    if (!r->cfg->json) {
        print_text_config(r);
        print_text_bandwidth(r, bw);
        print_text_overlap(r, ov);
        return;
    }
    jw_init(&w);
    jw_object(&w, NULL);
    print_json_config(&w, r);
    print_json_bandwidth(&w, r, bw);
    print_json_overlap(&w, r, ov);
    jw_end(&w);
    putchar('\n');
}
