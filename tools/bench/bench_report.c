/* kvtier-bench's report (bench.h): text and JSON. */
#include <inttypes.h>
#include <stdio.h>

#include "bench.h"

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static void print_bytes(uint64_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    size_t u = 0;

    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024;
        u++;
    }
    printf(u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

static const char *backend_in_use(const struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};

    if (!b->e || kvt_stats(b->e, &st))
        return "?";
    return bench_backend_names[st.backend];
}

static void print_source(const struct config *cfg)
{
    if (cfg->trace)
        printf("trace %s", cfg->trace);
    else
        printf("synthetic \"%s\" (seed %" PRIu64 ")", cfg->synthetic, cfg->seed);
    if (cfg->shards)
        printf(", shard %u of %u", cfg->shard, cfg->shards);
}

/* A hybrid model: the KV a KV-only cache would have served, what the checkpoints back, and
 * the work saved per layer kind. */
static void print_hybrid(const struct bench *b)
{
    const struct config *cfg = b->cfg;
    const struct counters *c = &b->c;
    uint64_t kv = b->st.mamba_kv_hit_tokens, state = served_tokens(c);

    printf("  recurrent     %u layers, ", cfg->mamba.layers);
    print_bytes(cfg->mamba.layers * (cfg->mamba.conv_bytes + cfg->mamba.ssm_bytes));
    printf(" a state, %" PRIu64 " slots (", b->st.mamba_slots);
    print_bytes(b->st.mamba_pool_bytes);
    printf("); %" PRIu64 " checkpoints taken, %" PRIu64 " evicted for room\n", c->checkpoints,
           b->st.mamba_evicted_states);
    if (b->st.mamba_host_slots)
        printf("  on the host   %" PRIu64 " states saved beside their KV, %" PRIu64
               " restored, %" PRIu64 " of %" PRIu64 " kept at the end\n",
               b->st.mamba_saved_states, b->st.mamba_restored_states, b->st.mamba_host_states,
               b->st.mamba_host_slots);
    if (cfg->disk_tokens || cfg->remote)
        printf("  below         %" PRIu64 " checkpoints written with their pages, %" PRIu64
               " read back with their KV\n",
               b->st.mamba_stored_states, b->st.mamba_fetched_states);
    printf("  state-backed  %" PRIu64 " of %" PRIu64 " tokens of KV found (%.1f%% lost to "
           "checkpoint alignment and tombstones)\n",
           state, kv, kv ? pct(kv - state, kv) : 0.0);
    printf("  saved         %" PRIu64 " tokens in each of %u attention and %u recurrent layers; "
           "%" PRIu64 " states verified\n",
           state, cfg->g.layers, cfg->mamba.layers, c->states_checked);
}

/* A sliding-window model: the memory the window saves, and what it costs in hits. */
static void print_window(const struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint64_t kv = b->st.swa_kv_hit_tokens, served = served_tokens(&b->c);

    printf("  window        %u tokens: %u full and %u sliding-window layers; SWA pool %" PRIu64
           " tokens; KV pool ",
           cfg->swa_window, b->nfull, b->nswa, b->st.swa_tokens);
    print_bytes(b->st.kv_pool_bytes);
    printf(" (");
    print_bytes((cfg->device_tokens / cfg->page_size + 1) * cfg->page_size *
                kvt_cell_bytes(&cfg->g));
    printf(" without the window)\n");
    printf("  window-backed %" PRIu64 " of %" PRIu64 " tokens of KV found (%.1f%% lost where "
           "the window's KV was freed); released %" PRIu64 ", evicted %" PRIu64 ", revived %" PRIu64
           "\n",
           served, kv, kv ? pct(kv - served, kv) : 0.0, b->st.swa_released_tokens,
           b->st.swa_evicted_tokens, b->st.swa_revived_tokens);
}

void bench_print_text(const struct bench *b)
{
    const struct config *cfg = b->cfg;
    const struct counters *c = &b->c;
    uint64_t cell = kvt_cell_bytes(&cfg->g);

    printf("%s: %" PRIu64 " requests of ", PROG, c->requests);
    print_source(cfg);
    printf("\n  engine        geometry %s (%" PRIu64
           " B/token), page %u, %s eviction, %s backend\n",
           cfg->geometry_arg, cell, cfg->page_size, bench_policy_names[cfg->policy],
           backend_in_use(b));
    printf("  tiers         device %" PRIu64 " tokens (", cfg->device_tokens);
    print_bytes(cfg->device_tokens * cell);
    printf("); host ");
    if (cfg->host_tokens) {
        printf("%" PRIu64 " tokens (", cfg->host_tokens);
        print_bytes(cfg->host_tokens * cell);
        printf(b->st.host_pinned ? ", pinned)" : ", not pinned)");
    } else {
        printf("none");
    }
    if (cfg->disk_tokens) {
        printf("; disk %" PRIu64 " tokens in %s (", b->st.disk_tokens, cfg->dir);
        print_bytes(b->st.disk_tokens * cell);
        printf(", %s, %s", b->st.disk_io == KVT_DISK_IO_URING ? "io_uring" : "pread/pwrite",
               bench_disk_sync_names[cfg->disk_sync]);
        if (b->store_pages != cfg->page_size)
            printf(", pages of %" PRIu32 " tokens", b->store_pages);
        printf(")\n");
    } else {
        printf("; disk none\n");
    }
    if (cfg->remote)
        printf("                remote %s\n", cfg->remote);
    uint64_t served = served_tokens(c);
    printf("  input tokens  %" PRIu64 "\n", c->tokens_total);
    printf("  from cache    %" PRIu64 " (%.1f%%): device %" PRIu64 ", host %" PRIu64
           ", disk %" PRIu64,
           served, pct(served, c->tokens_total), c->hit_device, c->hit_host, c->hit_disk);
    if (cfg->remote)
        printf(", remote %" PRIu64, c->hit_remote);
    printf("\n");
    printf("  recomputed    %" PRIu64 " (%.1f%%): %.2fx less prefill than without a cache\n",
           c->computed, pct(c->computed, c->tokens_total),
           c->computed ? (double)c->tokens_total / (double)c->computed : 0.0);
    if (hybrid(b))
        print_hybrid(b);
    if (cfg->swa_window)
        print_window(b);
    if (b->mm)
        bench_mm_print(b->mm);
    printf("  verified      %" PRIu64 " pages served from cache, %" PRIu64 " mismatches\n",
           c->pages_checked, c->mismatches);
    printf("  data moved    compute -> device ");
    print_bytes(c->bytes_compute);
    printf(", device -> verifier ");
    print_bytes(c->bytes_verify);
    if (cfg->host_tokens) {
        printf(",\n                device -> host ");
        print_bytes(b->st.d2h_bytes);
        printf(", host -> device ");
        print_bytes(b->st.h2d_bytes);
    }
    if (cfg->disk_tokens) {
        printf(",\n                host -> disk ");
        print_bytes(b->st.disk_written_bytes);
        printf(", disk -> host ");
        print_bytes(b->st.disk_read_bytes);
    }
    printf("\n  evicted       %" PRIu64 " tokens from the device", b->st.evicted_tokens);
    if (cfg->host_tokens)
        printf(", %" PRIu64 " from the host", b->st.host_evicted_tokens);
    printf("\n");
    if (cfg->disk_tokens && b->st.disk_errors)
        printf("  disk errors   %" PRIu64 " (pages found damaged or not written: not served)\n",
               b->st.disk_errors);
    if (cfg->remote && b->st.remote_errors)
        printf("  remote errors %" PRIu64 " (pages failed, refused or found damaged: not served;"
               " kvtier-ctl remote stat URL says why)\n",
               b->st.remote_errors);
    printf("  time          %.2f s, %.0f input tokens/s (%" PRIu64 " decode steps)\n", b->seconds,
           b->seconds > 0 ? (double)c->tokens_total / b->seconds : 0.0, c->decoded);
}

static void print_json_config(const struct bench *b)
{
    const struct config *cfg = b->cfg;

    printf("\"config\":{\"trace\":");
    cli_json_string(cfg->trace);
    printf(",\"synthetic\":");
    cli_json_string(cfg->synthetic);
    printf(",\"seed\":%" PRIu64 ",\"shard\":", cfg->seed);
    if (cfg->shards)
        printf("\"%u/%u\"", cfg->shard, cfg->shards);
    else
        printf("null");
    printf(",\"geometry\":");
    cli_json_string(cfg->geometry_arg);
    printf(",\"cell_bytes\":%" PRIu64 ",\"page_size\":%u,\"device_tokens\":%" PRIu64
           ",\"host_tokens\":%" PRIu64 ",\"disk_tokens\":%" PRIu64 ",\"dir\":",
           kvt_cell_bytes(&cfg->g), cfg->page_size, cfg->device_tokens, cfg->host_tokens,
           cfg->disk_tokens);
    cli_json_string(cfg->dir);
    if (cfg->remote) {
        printf(",\"remote\":");
        cli_json_string(cfg->remote);
    }
    printf(",\"disk_backlog\":%" PRIu64 ",\"deterministic\":%s,\"store_page_tokens\":%" PRIu32,
           cfg->disk_backlog, cfg->deterministic ? "true" : "false", b->store_pages);
    printf(",\"backend\":\"%s\",\"evict_policy\":\"%s\",\"write_policy\":\"%s\"}",
           backend_in_use(b), bench_policy_names[cfg->policy],
           bench_write_policy_names[cfg->write_policy]);
}

void bench_print_json(const struct bench *b)
{
    const struct counters *c = &b->c;
    const struct kvt_stats *st = &b->st;

    printf("{\"requests\":%" PRIu64 ",\"tokens_total\":%" PRIu64, c->requests, c->tokens_total);
    printf(",\"tokens_hit\":{\"device\":%" PRIu64 ",\"host\":%" PRIu64 ",\"disk\":%" PRIu64,
           c->hit_device, c->hit_host, c->hit_disk);
    if (b->cfg
            ->remote) /* the remote tier's, apart from the disk's (runs without stay as recorded) */
        printf(",\"remote\":%" PRIu64, c->hit_remote);
    printf("}");
    printf(",\"tokens_computed\":%" PRIu64 ",\"tokens_decoded\":%" PRIu64
           ",\"tokens_evicted\":{\"device\":%" PRIu64 ",\"host\":%" PRIu64 "}",
           c->computed, c->decoded, st->evicted_tokens, st->host_evicted_tokens);
    printf(",\"bytes\":{\"compute_to_device\":%" PRIu64 ",\"device_to_verify\":%" PRIu64
           ",\"device_to_host\":%" PRIu64 ",\"host_to_device\":%" PRIu64
           ",\"host_to_disk\":%" PRIu64 ",\"disk_to_host\":%" PRIu64 "}",
           c->bytes_compute, c->bytes_verify, st->d2h_bytes, st->h2d_bytes, st->disk_written_bytes,
           st->disk_read_bytes);
    printf(",\"disk_errors\":%" PRIu64, st->disk_errors);
    if (b->cfg->remote)
        printf(",\"remote_errors\":%" PRIu64, st->remote_errors);
    printf(",\"seconds\":%.3f,\"tokens_per_second\":%.0f", b->seconds,
           b->seconds > 0 ? (double)c->tokens_total / b->seconds : 0.0);
    printf(",\"verify\":{\"pages_checked\":%" PRIu64 ",\"mismatches\":%" PRIu64 "},",
           c->pages_checked, c->mismatches);
    if (hybrid(b))
        printf("\"mamba\":{\"layers\":%u,\"slots\":%" PRIu64 ",\"kv_hit_tokens\":%" PRIu64
               ",\"state_hit_tokens\":%" PRIu64 ",\"checkpoints\":%" PRIu64
               ",\"evicted_states\":%" PRIu64 ",\"states_checked\":%" PRIu64
               ",\"host_slots\":%" PRIu64 ",\"saved_states\":%" PRIu64
               ",\"restored_states\":%" PRIu64 ",\"stored_states\":%" PRIu64
               ",\"fetched_states\":%" PRIu64 "},",
               b->cfg->mamba.layers, st->mamba_slots, st->mamba_kv_hit_tokens, served_tokens(c),
               c->checkpoints, st->mamba_evicted_states, c->states_checked, st->mamba_host_slots,
               st->mamba_saved_states, st->mamba_restored_states, st->mamba_stored_states,
               st->mamba_fetched_states);
    if (b->cfg->swa_window)
        printf("\"swa\":{\"window\":%u,\"full_layers\":%u,\"swa_tokens\":%" PRIu64
               ",\"kv_pool_bytes\":%" PRIu64 ",\"kv_hit_tokens\":%" PRIu64
               ",\"window_hit_tokens\":%" PRIu64 ",\"released_tokens\":%" PRIu64
               ",\"evicted_tokens\":%" PRIu64 ",\"revived_tokens\":%" PRIu64 "},",
               b->cfg->swa_window, b->nfull, st->swa_tokens, st->kv_pool_bytes,
               st->swa_kv_hit_tokens, served_tokens(c), st->swa_released_tokens,
               st->swa_evicted_tokens, st->swa_revived_tokens);
    if (b->mm)
        bench_mm_json(b->mm);
    print_json_config(b);
    printf("}\n");
}

void bench_report_mismatch(const struct bench *b)
{
    static const char *const what[] = {"K", "V", "conv state", "SSM state"};
    const struct mismatch *m = &b->first;
    uint32_t ps = b->cfg->page_size;

    fprintf(stderr,
            "%s: VERIFY FAILED: %" PRIu64 " page%s served from the device cache differ from what "
            "was stored; the first: request %" PRIu64 ", tokens %zu-%zu, layer %u, %s\n",
            PROG, b->c.mismatches, b->c.mismatches == 1 ? "" : "s", m->request, m->token / ps * ps,
            m->token / ps * ps + ps - 1, m->layer, what[m->which]);
}
