/* kvtier-bench's command line (bench.h): the option table, the checks across options, --help. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

const char *const bench_policy_names[5] = {"lru", "lfu", "fifo", "mru", "filo"};
const char *const bench_backend_names[3] = {"auto", "sim", "cuda"};
const char *const bench_write_policy_names[3] = {"write_through", "write_through_selective",
                                                 "write_back"};
const char *const bench_disk_sync_names[2] = {"durable", "relaxed"};

/* ---- command line ---- */

/* --geometry, given the whole config: the geometry, and the argument it came from. */
int bench_parse_geometry(void *field, const char *opt, const char *arg)
{
    struct config *cfg = field;
    struct cli_hybrid h;
    int rc = cli_parse_model(PROG, arg, &cfg->g, &cfg->tp_size, &h);

    (void)opt;
    if (rc == 0) {
        cfg->geometry_arg = arg;
        cfg->mamba = h.mamba;
        cfg->swa_window = h.swa_window;
        cfg->full_every = h.full_every;
    }
    return rc;
}

/* --synthetic: one of the workloads' names. */
/* --shard K/N: the requests at K modulo N, K from 0. */
static int parse_shard(void *field, const char *opt, const char *val)
{
    struct config *cfg = field;
    unsigned k, n;
    int used = 0;

    if (sscanf(val, "%u/%u%n", &k, &n, &used) != 2 || val[used] || n == 0 || k >= n)
        return cli_bad_usage(PROG, "--shard needs K/N with 0 <= K < N", val);
    (void)opt;
    cfg->shard = k;
    cfg->shards = n;
    return 0;
}

static int parse_synthetic(void *field, const char *opt, const char *val)
{
    (void)opt;
    if (!wl_synthetic_about(val))
        return cli_bad_usage(PROG, "--synthetic: unknown workload (see --help)", val);
    *(const char **)field = val;
    return 0;
}

/* Options that take a count, given the whole config: each has its own bounds and message. */
static int parse_count(void *field, const char *opt, const char *val)
{
    struct config *cfg = field;
    uint64_t v;

    if (!cli_parse_u64(val, &v))
        return cli_bad_usage(PROG, "expected a non-negative integer", opt);
    if (strcmp(opt, "--requests") == 0) {
        if (v == 0)
            return cli_bad_usage(PROG, "--requests needs at least 1", val);
        cfg->requests = v;
    } else if (strcmp(opt, "--page-size") == 0) {
        if (v == 0 || v > 256 || (v & (v - 1)))
            return cli_bad_usage(PROG, "--page-size needs a power of two from 1 to 256", val);
        cfg->page_size = (uint32_t)v;
    } else if (strcmp(opt, "--device-tokens") == 0) {
        if (v == 0 || v >= INT32_MAX)
            return cli_bad_usage(PROG, "--device-tokens needs a count from 1 to 2^31-2", val);
        cfg->device_tokens = v;
    } else if (strcmp(opt, "--host-tokens") == 0) {
        if (v >= INT32_MAX)
            return cli_bad_usage(PROG, "--host-tokens needs a count below 2^31", val);
        cfg->host_tokens = v;
    } else if (strcmp(opt, "--disk-tokens") == 0) {
        if (v >= INT32_MAX)
            return cli_bad_usage(PROG, "--disk-tokens needs a count below 2^31", val);
        cfg->disk_tokens = v;
    } else if (strcmp(opt, "--store-page-tokens") == 0) {
        if (v == 0 || v > 4096)
            return cli_bad_usage(PROG, "--store-page-tokens needs a count from 1 to 4096", val);
        cfg->store_page_tokens = v;
    } else if (strcmp(opt, "--seed") == 0) {
        cfg->seed = v;
    } else if (strcmp(opt, "--disk-backlog") == 0) {
        cfg->disk_backlog = v;
        cfg->backlog_set = true;
    } else if (strcmp(opt, "--swa-tokens") == 0) {
        if (v == 0 || v >= INT32_MAX)
            return cli_bad_usage(PROG, "--swa-tokens needs a count from 1 to 2^31-2", val);
        cfg->swa_tokens = v;
    } else if (strcmp(opt, "--mamba-slots") == 0) {
        if (v < 2 || v >= INT32_MAX)
            return cli_bad_usage(PROG, "--mamba-slots needs a count from 2 to 2^31-2", val);
        cfg->mamba_slots = v;
    } else {
        if (v == 0)
            return cli_bad_usage(PROG, "--corrupt-after needs a request number from 1", val);
        cfg->corrupt_after = v;
    }
    return 0;
}

static void print_workloads(FILE *f)
{
    for (size_t i = 0; wl_synthetic_names[i]; i++)
        fprintf(f, "                          %-6s %s\n", wl_synthetic_names[i],
                wl_synthetic_about(wl_synthetic_names[i]));
}

static void print_presets(FILE *f)
{
    cli_print_presets(f, "                          ");
}

/* Figures the help quotes, as strings. */
#define SYNTHETIC_REQUESTS_S CLI_STR(DEFAULT_SYNTHETIC_REQUESTS)
#define DEVICE_TOKENS_S CLI_STR(DEFAULT_DEVICE_TOKENS)

#define OFF(f) offsetof(struct config, f)
static const struct cli_option options[] = {
    {.kind = CLI_TEXT, .help = "\nWorkload (default: --synthetic " DEFAULT_SYNTHETIC "):\n"},
    {"--trace", CLI_STRING, OFF(trace), .arg = "FILE",
     .help = "a Mooncake trace: JSON lines with input_length,\n"
             "output_length and hash_ids (512-token blocks), at most\n"
             "16 MiB a line. It is read twice, a line at a time (once\n"
             "to size the engine, once to replay), so it must be a\n"
             "file, not a pipe"},
    {"--synthetic", CLI_CUSTOM, OFF(synthetic), .parse = parse_synthetic, .arg = "NAME",
     .help = "a generated workload:", .more = print_workloads},
    {"--requests", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "replay the first N requests of a trace (default all), or\n"
             "generate N (default " SYNTHETIC_REQUESTS_S ", at most 2^40); one is held at\n"
             "a time"},
    {"--shard", CLI_CUSTOM, .parse = parse_shard, .arg = "K/N",
     .help = "replay only the workload's requests at K modulo N (K from\n"
             "0), so that N processes split one workload between them\n"
             "(--requests counts the workload's, before the split)"},
    {"--seed", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "seeds the synthetic workload and the KV content (default\n"
             "1); a dir or remote tier holding another seed's KV is\n"
             "another model's to this run"},
    {.kind = CLI_TEXT, .help = "\nEngine:\n"},
    {"--geometry", CLI_CUSTOM, .parse = bench_parse_geometry, .arg = "G",
     .help = "a preset, or key=value pairs, or a preset then pairs, comma\n"
             "separated (keys: attention=mha|mla, layers, kv_heads,\n"
             "head_dim, v_head_dim, kv_lora_rank, qk_rope_head_dim,\n"
             "dtype_bytes, tp_size; a hybrid model's recurrent layers:\n"
             "mamba_layers, conv_bytes, ssm_bytes, per layer and rank;\n"
             "sliding-window layers: swa_window and full_every, every\n"
             "full_every-th layer full attention; mamba_layers=0 or\n"
             "swa_window=0 drops them). Default tiny. Presets:",
     .more = print_presets},
    {"--mamba-slots", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "a hybrid model's state slots (two for the running\n"
             "request, the rest cached checkpoints); default as many as\n"
             "0.9 of the device KV pool's bytes hold (SGLang's\n"
             "mamba_full_memory_ratio), 4 at least"},
    {"--swa-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "a sliding-window model's SWA slots (its window layers' KV\n"
             "pool); default 0.8 of --device-tokens (SGLang's\n"
             "swa_full_tokens_ratio)"},
    {"--page-size", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "tokens per page, a power of two up to 256 (default 16)"},
    {"--device-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "device KV pool size in tokens (default " DEVICE_TOKENS_S "), below 2^31\n"
             "with a page of padding; the sim backend keeps it in host\n"
             "memory, and a run that could fill more of it than this\n"
             "machine's RAM is refused"},
    {"--host-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "host tier size in tokens, larger than the device pool\n"
             "and fitting in the memory free now; 0 (default): none"},
    {"--write-policy", CLI_NAME, OFF(write_policy), CLI_NAMES(bench_write_policy_names), .arg = "P",
     .help = "when the host tier gets a copy: write_through (at insert,\n"
             "the default), write_through_selective (once a prefix is\n"
             "hit twice) or write_back (when the device evicts it)"},
    {"--disk-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "disk tier size in tokens; needs a host tier and --dir, and\n"
             "pages (--page-size tokens) under 4 GiB"},
    {"--dir", CLI_STRING, OFF(dir), .arg = "PATH",
     .help = "the disk tier's data dir: created if missing (its parent\n"
             "must exist), reused if it holds pages of the same geometry\n"
             "and page size; refused while another process has it open"},
    {"--remote", CLI_STRING, OFF(remote), .arg = "URL",
     .help = "a shared remote tier, redis://[[USER]:PASSWORD@]HOST[:PORT] of a\n"
             "standalone Redis or Valkey server or of a Redis Cluster\n"
             "node, or a comma-separated list of such URLs (a\n"
             "cluster's seeds: redis://h1:p1,redis://h2:p2); below the\n"
             "disk tier (or the host tier); needs --host-tokens. Its\n"
             "hits are counted apart (tokens_hit.remote). rediss:// in\n"
             "place of redis:// speaks TLS, the server's certificate\n"
             "checked against the system's CAs (or --remote-tls-ca) and\n"
             "the URL's host"},
    {"--remote-tls-ca", CLI_STRING, OFF(remote_tls_ca), .arg = "FILE",
     .help = "rediss://: PEM CA certificates to check the server's against"},
    {"--remote-tls-cert", CLI_STRING, OFF(remote_tls_cert), .arg = "FILE",
     .help = "rediss://: a PEM client certificate, for a server that asks"},
    {"--remote-tls-key", CLI_STRING, OFF(remote_tls_key), .arg = "FILE",
     .help = "its private key (default: in --remote-tls-cert's file)"},
    {"--disk-sync", CLI_NAME, OFF(disk_sync), CLI_NAMES(bench_disk_sync_names), .arg = "S",
     .help = "durable (default: each write batch synced) or relaxed\n"
             "(synced every second or 256 MiB; a power cut may lose\n"
             "the pages since, never serve wrong bytes)"},
    {"--store-page-tokens", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "tokens per page of the disk and remote tiers, a multiple\n"
             "of --page-size up to 4096. Each page costs those tiers a\n"
             "record whatever its size, so by default kvt_open chooses\n"
             "them by bytes: 64 KiB or more (the tiny geometry's 2 KiB\n"
             "pages: 512 tokens; a page that large already: --page-size;\n"
             "hybrid geometries: --page-size). What is left at a\n"
             "request's end short of one is not written below (it goes\n"
             "with its page once a later request fills it). Several\n"
             "pages to one: not with hybrid geometries"},
    {"--disk-backlog", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "let the disk and remote tiers' reads and writes go on\n"
             "while a request runs, up to N in flight (past that the\n"
             "bench waits for all), as a server does, which never waits\n"
             "for its writes (default " DISK_BACKLOG_S "; 0: all land before\n"
             "each request). The hits may then differ a little from run\n"
             "to run (what is on disk when depends on the disk's speed);\n"
             "--deterministic for counts that repeat"},
    {"--emb-device-bytes", CLI_SIZE, OFF(mm.device_bytes), 1, UINT64_MAX, .arg = "SIZE",
     .help = "--synthetic multimodal: the embedding cache's device\n"
             "budget (K, M, G suffixes; default a quarter of the KV\n"
             "pool's bytes, 1M at least)"},
    {"--emb-host-bytes", CLI_SIZE, OFF(mm.host_bytes), 1, UINT64_MAX, .arg = "SIZE",
     .help = "--synthetic multimodal: host memory for embeddings\n"
             "(default none); with --dir or --remote they go there too"},
    {"--emb-token-bytes", CLI_COUNT, OFF(mm.token_bytes), 1, 1u << 20, .arg = "N",
     .help = "--synthetic multimodal: an embedding's bytes per image\n"
             "token, the model's hidden size times its element size\n"
             "(default an eighth of a token's KV, 16 at least)"},
    {"--emb-store", CLI_NAME, OFF(mm.store), 0, 0, bench_mm_store_names, 2, .arg = "S",
     .help = "--synthetic multimodal: all (default: embeddings go to the\n"
             "disk and remote tiers too, when there are) or none"},
    {"--backend", CLI_NAME, OFF(backend), CLI_NAMES(bench_backend_names), .arg = "B",
     .help = "auto, sim or cuda (default auto)"},
    {"--evict-policy", CLI_NAME, OFF(policy), CLI_NAMES(bench_policy_names), .arg = "P",
     .help = "lru, lfu, fifo, mru or filo (default lru)"},
    {"--serial", CLI_FLAG, OFF(serial),
     .help = "sim backend: copy each transfer as it is submitted (what\n"
             "lands when otherwise varies, as on a GPU)"},
    {"--deterministic", CLI_FLAG, OFF(deterministic),
     .help = "counts that repeat exactly, for tests: --serial, and every\n"
             "transfer and disk op lands before the next request\n"
             "(--disk-backlog 0; a disk tier then costs every request\n"
             "its writes' flushes)"},
    {.kind = CLI_TEXT, .help = "\nOutput:\n"},
    {"--json", CLI_FLAG, OFF(json), .help = "one JSON object on stdout instead of the report"},
    {"--corrupt-after", CLI_CUSTOM, .parse = parse_count, .arg = "N",
     .help = "testing: after request N, flip a byte of a cached page;\n"
             "a later hit on it must fail verification"},
    {"--help", CLI_HELP, .help = "print this and exit"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [--trace FILE | --synthetic NAME] [options]\n"
            "\n"
            "Replay requests through kvtier as a serving engine would (match, extend, compute,\n"
            "decode, cache) and check every byte of every page served from the cache against\n"
            "what was stored. Prints tokens served per tier, tokens recomputed, pages verified\n"
            "and mismatches. Any mismatch fails the run.\n",
            PROG);
    cli_print_options(f, options, CLI_COUNT_OF(options), 24);
    fprintf(f, "\n"
               "A progress line is shown on stderr when it is a terminal.\n"
               "Exit status: 0 on success, 1 on an error or a verification failure, 2 on bad "
               "usage.\n");
}

/* Sizes that depend on each other: the device pool and its padding page stay below 2^31
 * slots, and a page fits the disk tier's 32-bit page size (in a 4 KiB-aligned slot). */
static int check_sizes(const struct config *cfg)
{
    uint64_t most = (uint64_t)(INT32_MAX / cfg->page_size) * cfg->page_size - 1;
    uint64_t page = kvt_cell_bytes(&cfg->g) * cfg->page_size;
    char msg[160], size[32];

    if (cfg->device_tokens > most) {
        snprintf(msg, sizeof(msg), "--device-tokens is at most %" PRIu64 " with --page-size %u",
                 most, cfg->page_size);
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->store_page_tokens % cfg->page_size) {
        snprintf(msg, sizeof(msg), "--store-page-tokens must be a multiple of --page-size (%u)",
                 cfg->page_size);
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->store_page_tokens && (cfg->mamba.layers || cfg->swa_window))
        return cli_bad_usage(PROG,
                             "--store-page-tokens: not with a hybrid --geometry (its states "
                             "and window copies are kept a page at a time)",
                             NULL);
    page = kvt_cell_bytes(&cfg->g) * store_page_tokens(cfg);
    if (cfg->disk_tokens && page > UINT32_MAX - 4095) {
        snprintf(msg, sizeof(msg),
                 "--disk-tokens: pages of %s (--geometry, --page-size, --store-page-tokens) "
                 "are larger than the disk tier takes (4 GiB less 4 KiB)",
                 cli_size(page, size));
        return cli_bad_usage(PROG, msg, NULL);
    }
    return 0;
}

/* options.remote's form: redis:// (or rediss://) first, and every later item of the list the
 * same scheme or none at all (the engine's parser checks the rest). */
static bool remote_url_ok(const char *url)
{
    const char *scheme = !strncmp(url, "rediss://", 9) ? "rediss://" : "redis://";
    size_t n = strlen(scheme);

    if (strncmp(url, scheme, n) != 0)
        return false;
    for (const char *item = strchr(url, ','); item; item = strchr(item + 1, ','))
        if (strncmp(item + 1, scheme, n) != 0 && strstr(item + 1, "://") &&
            (!strchr(item + 1, ',') || strstr(item + 1, "://") < strchr(item + 1, ',')))
            return false;
    return true;
}

/* The --remote-tls-* files: with rediss:// only, and each one readable. */
static int check_tls_files(const struct config *cfg)
{
    const char *names[] = {"--remote-tls-ca", "--remote-tls-cert", "--remote-tls-key"};
    const char *files[] = {cfg->remote_tls_ca, cfg->remote_tls_cert, cfg->remote_tls_key};
    bool tls = cfg->remote && !strncmp(cfg->remote, "rediss://", 9);
    char msg[320];

    for (size_t i = 0; i < 3; i++) {
        if (files[i] && !tls)
            snprintf(msg, sizeof(msg), "%s needs a rediss:// --remote", names[i]);
        else if (files[i] && access(files[i], R_OK))
            snprintf(msg, sizeof(msg), "%s: cannot read %.200s: %s", names[i], files[i],
                     strerror(errno));
        else
            continue;
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->remote_tls_key && !cfg->remote_tls_cert)
        return cli_bad_usage(PROG, "--remote-tls-key needs --remote-tls-cert", NULL);
    return 0;
}

/* 0 to go on, -1 after --help, else the exit status. */
int bench_parse_args(int argc, char **argv, struct config *cfg)
{
    int rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), cfg, argc, argv, usage);

    if (rc)
        return rc;
    if (cfg->trace && cfg->synthetic)
        return cli_bad_usage(PROG, "give --trace or --synthetic, not both", NULL);
    if (!cfg->trace && !cfg->synthetic)
        cfg->synthetic = DEFAULT_SYNTHETIC;
    if (cfg->synthetic && cfg->requests > WL_SYNTH_MAX_REQUESTS) {
        char msg[96];

        snprintf(msg, sizeof(msg),
                 "--requests: a synthetic workload makes at most %llu (2^40) "
                 "requests",
                 WL_SYNTH_MAX_REQUESTS);
        return cli_bad_usage(PROG, msg, NULL);
    }
    if (cfg->host_tokens && cfg->host_tokens <= cfg->device_tokens)
        return cli_bad_usage(PROG, "--host-tokens must be larger than --device-tokens", NULL);
    if (cfg->disk_tokens && !cfg->host_tokens)
        return cli_bad_usage(PROG, "--disk-tokens needs a host tier (--host-tokens)", NULL);
    if (cfg->remote && !cfg->host_tokens)
        return cli_bad_usage(PROG, "--remote needs a host tier (--host-tokens)", NULL);
    if (cfg->remote && !remote_url_ok(cfg->remote))
        return cli_bad_usage(PROG,
                             "--remote needs a redis://[[USER]:PASSWORD@]HOST[:PORT] URL "
                             "(rediss:// for TLS) or a comma-separated list of them",
                             cfg->remote);
    if ((rc = check_tls_files(cfg)) || (rc = bench_mm_check_args(&cfg->mm, cfg->synthetic)))
        return rc;
    if (!cfg->disk_tokens != !cfg->dir)
        return cli_bad_usage(PROG, "--disk-tokens and --dir go together", NULL);
    if (cfg->mamba_slots && !cfg->mamba.layers)
        return cli_bad_usage(PROG, "--mamba-slots needs a hybrid --geometry (mamba_layers)", NULL);
    if (cfg->swa_tokens && !cfg->swa_window)
        return cli_bad_usage(PROG, "--swa-tokens needs a sliding-window --geometry (swa_window)",
                             NULL);
    if (cfg->mamba.layers && cfg->swa_window)
        return cli_bad_usage(PROG,
                             "--geometry: recurrent and sliding-window layers together are "
                             "not supported yet",
                             NULL);
    if (cfg->deterministic && cfg->backlog_set && cfg->disk_backlog)
        return cli_bad_usage(PROG,
                             "--deterministic waits for every disk op before a request: not "
                             "with --disk-backlog",
                             NULL);
    if (cfg->deterministic)
        cfg->serial = true;
    else if (!cfg->backlog_set)
        cfg->disk_backlog = DEFAULT_DISK_BACKLOG;
    return check_sizes(cfg);
}
