/* kvtier-xfer-bench's command line (xfer_bench.h): the option table, --help, the checks between
 * options. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_bench.h"

const char *const xb_backend_names[3] = {"auto", "sim", "cuda"};
const char *const xb_io_names[3] = {"auto", "kernel", "dma"};
const char *const xb_layout_names[2] = {"page_first", "layer_first"};
const char *const xb_scatter_names[2] = {"random", "runs"};
const char *const xb_compute_names[3] = {"auto", "kernel", "host"};
const char *const xb_priority_names[2] = {"high", "default"};
const char *const xb_dma_hint_names[2] = {"none", "overlap"};

/* --compute-us, given the whole config. */
static int parse_compute(void *field, const char *opt, const char *arg)
{
    struct config *cfg = field;
    char buf[512];
    char *save = NULL, *tok;
    uint64_t v;

    (void)opt;
    if (strlen(arg) >= sizeof(buf))
        return cli_bad_usage(PROG, "--compute-us is too long", NULL);
    strcpy(buf, arg);
    cfg->ncompute = 0;
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (cfg->ncompute == MAX_COMPUTE)
            return cli_bad_usage(PROG, "--compute-us takes at most 16 values", arg);
        if (strcmp(tok, "auto") == 0)
            v = 0;
        else if (!cli_parse_u64(tok, &v) || v == 0 || v > 10000000)
            return cli_bad_usage(PROG, "--compute-us needs auto or 1 to 10000000 us", tok);
        cfg->compute_us[cfg->ncompute++] = v;
    }
    if (cfg->ncompute == 0)
        return cli_bad_usage(PROG, "--compute-us needs at least one value", arg);
    return 0;
}

/* --layers and friends: a struct override. */
static int parse_override(void *field, const char *opt, const char *val)
{
    struct override *o = field;
    uint64_t v;
    int rc = cli_parse_count(PROG, opt, val, 1, UINT32_MAX, false, &v);

    o->set = rc == 0;
    o->v = (uint32_t)v;
    return rc;
}

static int parse_page_size(void *field, const char *opt, const char *val)
{
    uint64_t v;

    (void)opt;
    if (!cli_parse_u64(val, &v) || v == 0 || v > 256 || (v & (v - 1)))
        return cli_bad_usage(PROG, "--page-size needs a power of two from 1 to 256", val);
    *(uint32_t *)field = (uint32_t)v;
    return 0;
}

/* --geometry, given the whole config: the geometry and the argument it came from. */
static int parse_geometry(void *field, const char *opt, const char *val)
{
    struct config *cfg = field;

    (void)opt;
    cfg->geometry_arg = val;
    return cli_parse_geometry(PROG, val, &cfg->g, &cfg->tp_size);
}

static void print_presets(FILE *f)
{
    cli_print_presets(f, "                        ");
}

/* The limits keep every page and slot number inside the 32-bit types the engine uses. */
#define MAX_POOL_PAGES (1u << 24)

/* Figures the help quotes, as strings. */
#define OVERLAP_PAGES_S CLI_STR(DEFAULT_OVERLAP_PAGES)
#define KERNEL_BLOCKS_S CLI_STR(XFER_KERNEL_BLOCKS)
#define MAX_COMPUTE_S CLI_STR(MAX_COMPUTE)
#define AUTO_COMPUTE_S CLI_STR(AUTO_COMPUTE_FACTOR)

#define OFF(f) offsetof(struct config, f)
static const struct cli_option options[] = {
    {.kind = CLI_TEXT, .help = "\nGeometry:\n"},
    {"--geometry", CLI_CUSTOM, .parse = parse_geometry, .arg = "G",
     .help = "a preset, key=value pairs, or a preset then pairs, comma\n"
             "separated (keys: attention=mha|mla, layers, kv_heads,\n"
             "head_dim, v_head_dim, kv_lora_rank, qk_rope_head_dim,\n"
             "dtype_bytes, tp_size). Default " DEFAULT_GEOMETRY ". Presets:",
     .more = print_presets},
    {.kind = CLI_TEXT,
     .help = "  --layers N, --kv-heads N, --head-dim N, --dtype-bytes N\n"
             "                      override one field of the geometry (after --geometry,\n"
             "                      wherever they stand)\n"},
    {"--layers", CLI_CUSTOM, OFF(layers), .parse = parse_override},
    {"--kv-heads", CLI_CUSTOM, OFF(kv_heads), .parse = parse_override},
    {"--head-dim", CLI_CUSTOM, OFF(head_dim), .parse = parse_override},
    {"--dtype-bytes", CLI_CUSTOM, OFF(dtype_bytes), .parse = parse_override},
    {"--page-size", CLI_CUSTOM, OFF(page_size), .parse = parse_page_size, .arg = "N",
     .help = "tokens per page, a power of two up to 256 (default 16)"},
    {.kind = CLI_TEXT, .help = "\nPages:\n"},
    {"--pages", CLI_COUNT, OFF(pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "pages per op in (a) (default " CLI_STR(DEFAULT_PAGES) ")"},
    {"--pool-pages", CLI_COUNT, OFF(pool_pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "usable pages in each pool, at least --pages (default 1.5 x\n"
             "--pages); the device pool has one more, its padding page"},
    {"--scatter", CLI_NAME, OFF(scatter), CLI_NAMES(xb_scatter_names), .arg = "S",
     .help = "random (default): pages at random places, no two\n"
             "neighbours in the list consecutive in both pools, so\n"
             "nothing coalesces;\n"
             "runs: runs of --run-pages pages at random places"},
    {"--run-pages", CLI_COUNT, OFF(run_pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "pages per run with --scatter runs (default " CLI_STR(DEFAULT_RUN_PAGES) ")"},
    {"--seed", CLI_COUNT, OFF(seed), 0, UINT64_MAX, .arg = "N",
     .help = "seeds the choice of pages (default 1)"},
    {"--overlap-pages", CLI_COUNT, OFF(overlap_pages), 1, MAX_POOL_PAGES, .arg = "N",
     .help = "the request's pages in (b), the first N of (a)'s (default\n" OVERLAP_PAGES_S
             ", or --pages when fewer)"},
    {"--compute-us", CLI_CUSTOM, .parse = parse_compute, .arg = "LIST",
     .help = "compute per layer in (b), microseconds, comma separated,\n"
             "up to " MAX_COMPUTE_S " values; auto is " AUTO_COMPUTE_S
             " x one layer's copy as measured\n"
             "(default auto)"},
    {"--reps", CLI_COUNT, OFF(reps), 1, 1000, .arg = "N",
     .help = "timed repetitions of each measurement after a warm-up;\n"
             "medians and bests are reported (default " CLI_STR(DEFAULT_REPS) ")"},
    {.kind = CLI_TEXT, .help = "\nEngine:\n"},
    {"--backend", CLI_NAME, OFF(backend), CLI_NAMES(xb_backend_names), .arg = "B",
     .help = "auto, sim or cuda (default auto: cuda when there is a GPU)"},
    {"--io", CLI_NAME, OFF(io), CLI_NAMES(xb_io_names), .arg = "M",
     .help = "auto, kernel or dma: how cuda copies (sim ignores it;\ndefault auto)"},
    {"--dma-min-bytes", CLI_COUNT, OFF(dma_min_bytes), 0, UINT64_MAX, .arg = "N",
     .help = "with --io auto on cuda: an op whose copies average at\n"
             "least N bytes goes by the copy engine, a shorter one by\n"
             "the kernels (default 0: the engine's own threshold)"},
    {"--kernel-blocks", CLI_COUNT, OFF(kernel_blocks), 0, 4096, .arg = "N",
     .help = "cuda kernel path: blocks of 8 warps per layer of a copy at\n"
             "most (default 0: the engine's, " KERNEL_BLOCKS_S ";\n"
             "4096: one warp per page part)"},
    {"--load-priority", CLI_NAME, OFF(load_priority), CLI_NAMES(xb_priority_names), .arg = "P",
     .help = "cuda: high (default, as the engine's host tier) or\n"
             "default, the load stream's priority"},
    {"--dma-hint", CLI_NAME, OFF(dma_hint), CLI_NAMES(xb_dma_hint_names), .arg = "H",
     .help = "cuda copy engine: none (default) or overlap, which asks\n"
             "cudaMemcpyBatchAsync to prefer overlapping compute"},
    {"--compute", CLI_NAME, OFF(compute), CLI_NAMES(xb_compute_names), .arg = "C",
     .help = "cuda: what (b)'s compute is: kernel, a kernel of FMA\n"
             "chains over every SM in waves of about 20 us blocks;\n"
             "host, a host function busy-waiting on the compute\n"
             "stream (it takes no SM); auto (default): kernel where\n"
             "this build has the kernels. sim: always a busy-wait"},
    {"--layout", CLI_NAME, OFF(layout), CLI_NAMES(xb_layout_names), .arg = "L",
     .help = "host pool layout: page_first (default) or layer_first"},
    {.kind = CLI_TEXT, .help = "\nOutput:\n"},
    {"--json", CLI_FLAG, OFF(json), .help = "one JSON object on stdout instead of the text report"},
    {"--help", CLI_HELP, .help = "print this and exit"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "\n"
            "Measure kvtier's transfer engine and print figures (a benchmark: timing never\n"
            "fails a run).\n"
            "(a) bandwidth: N pages scattered over the device and host pools are loaded\n"
            "    (host -> device) and backed up (device -> host), each as one op, against one\n"
            "    contiguous copy of the same bytes on the same backend in the same run (sim:\n"
            "    one memcpy on one thread; cuda: one cudaMemcpyAsync between the pinned host\n"
            "    pool and a device buffer). Target: scattered / one copy >= %.2f on sim,\n"
            "    >= %.2f on a GPU.\n"
            "(b) overlap: a prefill of L layers, each waiting for its layer of a load and then\n"
            "    computing C us (sim: a busy-wait on this thread; cuda: a kernel over every SM,\n"
            "    see --compute, C then measured alone in the same run), against the ideal\n"
            "    T + C + (L-1) max(T, C) (L C + T when C >= T), T one layer's copy measured in\n"
            "    the same run.\n"
            "    Target: within %.0f%% of the ideal.\n",
            PROG, TARGET_RATIO_SIM, TARGET_RATIO_GPU, TARGET_OVERHEAD_PCT);
    cli_print_options(f, options, CLI_COUNT_OF(options), 22);
    fprintf(f,
            "\n"
            "Exit status: 0 when the figures were measured, 1 on an error, 2 on bad usage, %d\n"
            "when --backend cuda is asked for and there is no GPU (or no CUDA in this build).\n",
            EXIT_SKIP);
}

/* The overrides, then the geometry as a whole must still be a model. */
static int apply_overrides(struct config *cfg)
{
    struct override *o[] = {&cfg->layers, &cfg->kv_heads, &cfg->head_dim, &cfg->dtype_bytes};
    uint32_t *f[] = {&cfg->g.layers, &cfg->g.kv_heads, &cfg->g.head_dim, &cfg->g.dtype_bytes};

    for (size_t i = 0; i < 4; i++)
        if (o[i]->set)
            *f[i] = o[i]->v;
    if (kv_geometry_check(&cfg->g))
        return cli_bad_usage(PROG,
                             "the geometry with --layers/--kv-heads/--head-dim/"
                             "--dtype-bytes is not a valid model",
                             NULL);
    return 0;
}

/* Defaults that depend on other options, and the checks between options. */
static int finish_config(struct config *cfg)
{
    int rc = apply_overrides(cfg);

    if (rc)
        return rc;
    if (!cfg->pool_pages)
        cfg->pool_pages = cfg->pages + cfg->pages / 2 > MAX_POOL_PAGES
                              ? MAX_POOL_PAGES
                              : cfg->pages + cfg->pages / 2;
    if (!cfg->overlap_pages)
        cfg->overlap_pages =
            cfg->pages < DEFAULT_OVERLAP_PAGES ? cfg->pages : DEFAULT_OVERLAP_PAGES;
    if (cfg->pool_pages < cfg->pages)
        return cli_bad_usage(PROG, "--pool-pages must be at least --pages", NULL);
    if (cfg->overlap_pages > cfg->pages)
        return cli_bad_usage(PROG, "--overlap-pages must be at most --pages", NULL);
    if ((cfg->pool_pages + 1) * cfg->page_size >= INT32_MAX)
        return cli_bad_usage(PROG, "--pool-pages x --page-size must stay below 2^31 slots", NULL);
    if (cfg->scatter == SCATTER_RUNS &&
        (cfg->pages + cfg->run_pages - 1) / cfg->run_pages > cfg->pool_pages / cfg->run_pages)
        return cli_bad_usage(PROG, "--pool-pages has too few blocks of --run-pages for --pages",
                             NULL);
    if (!cfg->ncompute)
        cfg->ncompute = 1; /* compute_us[0] is 0: auto */
    return 0;
}

int xb_parse_args(struct config *cfg, int argc, char **argv)
{
    int rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), cfg, argc, argv, usage);

    return rc ? rc : finish_config(cfg);
}
