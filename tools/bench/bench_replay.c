/* kvtier-bench's workload (bench.h): the source of requests (a trace read a line at a time,
 * or a generator), the survey that sizes the engine, and the replay. */
#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "bench.h"

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the workload, a request at a time ---- */

/* Open the source, or go back to its first request; take at most limit (0: all). */
static int source_start(struct source *s, uint64_t limit)
{
    char err[512];
    int rc;

    s->limit = limit;
    s->seen = s->taken = 0;
    if (s->cfg->trace) {
        /* Rewinding a file just opened finds a pipe before a pass is spent on it. */
        if (!s->trace && wl_trace_open(s->cfg->trace, 0, &s->trace, err, sizeof(err)))
            return say(err);
        return wl_trace_rewind(s->trace, err, sizeof(err)) ? say(err) : 0;
    }
    /* A generator starts over from its seed. */
    wl_synth_close(s->synth);
    s->synth = NULL;
    if ((rc = wl_synth_open(s->cfg->synthetic, s->cfg->seed, &s->synth)))
        return engine_error("--synthetic", rc);
    return 0;
}

/* The next request of the workload, this shard's or not: 1; 0 past the last; -1 after saying
 * why. */
static int source_read(struct source *s)
{
    char err[512];
    int rc = 1;

    if (s->limit && s->seen == s->limit)
        return 0;
    wl_clear(&s->w);
    if (s->trace && (rc = wl_trace_next(s->trace, &s->w, err, sizeof(err))) < 0)
        return say(err);
    if (s->synth)
        wl_synth_next(s->synth, &s->w);
    s->seen += rc == 1;
    return rc;
}

/* The next request of this shard into *r, valid until the next call: 1; 0 past the last; -1
 * after saying why. */
static int source_next(struct source *s, const struct wl_req **r)
{
    const struct config *cfg = s->cfg;
    int rc;

    while ((rc = source_read(s)) == 1 && cfg->shards && (s->seen - 1) % cfg->shards != cfg->shard)
        ;
    if (rc == 1) {
        s->taken++;
        *r = &s->w.reqs[0];
    }
    return rc;
}

void bench_source_close(struct source *s)
{
    wl_trace_close(s->trace);
    wl_synth_close(s->synth);
    wl_free(&s->w);
}

static uint64_t request_tokens(const struct wl_req *r)
{
    return (uint64_t)r->input_len + r->output_len;
}

/* The first pass: how many requests there are and the longest, which sizes the engine. */
int bench_survey(struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint64_t limit = cfg->requests || cfg->trace ? cfg->requests : DEFAULT_SYNTHETIC_REQUESTS;
    char clip[CLI_PATH_ECHO_MAX + 4];
    const struct wl_req *r;
    int rc;

    struct cli_progress pg;

    if (source_start(b->src, limit))
        return -1;
    cli_progress_start(&pg);
    while ((rc = source_next(b->src, &r)) == 1) {
        uint64_t slots = round_up(request_tokens(r), cfg->page_size);
        b->nreqs++;
        if (request_tokens(r) > b->max_tokens)
            b->max_tokens = request_tokens(r);
        b->slots_taken += slots < UINT64_MAX - b->slots_taken ? slots : UINT64_MAX - b->slots_taken;
        if (cli_progress_due(&pg))
            cli_progress_line("sizing the engine: %" PRIu64 " requests of the workload read "
                              "(%.0f/s)",
                              b->nreqs, (double)b->nreqs / cli_progress_seconds(&pg));
    }
    cli_progress_end(&pg);
    if (rc == 0 && b->nreqs == 0) {
        fprintf(stderr, "%s: %s: no requests\n", PROG,
                cli_clip(cfg->trace, CLI_PATH_ECHO_MAX, clip));
        return -1;
    }
    return rc;
}

/* The second pass reads the trace again: it must still be the trace the engine was sized
 * for, or the request buffers would not hold it. */
static int trace_changed(const struct bench *b)
{
    char clip[CLI_PATH_ECHO_MAX + 4];

    fprintf(stderr, "%s: %s changed while it was replayed (it is read twice)\n", PROG,
            cli_clip(b->cfg->trace, CLI_PATH_ECHO_MAX, clip));
    return -1;
}

/* ---- progress ---- */

static void progress(const struct bench *b, const struct cli_progress *pg)
{
    double s = cli_progress_seconds(pg);

    cli_progress_line(
        "%" PRIu64 "/%" PRIu64 " requests  %.0f req/s  %.1f%% of input tokens hit", b->c.requests,
        b->nreqs, s > 0 ? (double)b->c.requests / s : 0.0,
        b->c.tokens_total ? 100.0 * (double)served_tokens(&b->c) / (double)b->c.tokens_total : 0.0);
}

/* One request of the second pass: 1 served, 0 past the last, -1 on an error (said). */
static int replay_one(struct bench *b)
{
    const struct wl_req *r;
    int rc = source_next(b->src, &r);

    if (rc == 0 && b->c.requests != b->nreqs)
        return trace_changed(b);
    if (rc != 1)
        return rc;
    if (request_tokens(r) > b->max_tokens)
        return trace_changed(b);
    if (bench_run_request(b, r) ||
        (b->c.requests == b->cfg->corrupt_after && bench_corrupt_cached_page(b, r)))
        return -1;
    return 1;
}

int bench_replay(struct bench *b)
{
    uint64_t t0 = now_ns();
    struct cli_progress pg;
    int rc = source_start(b->src, b->src->limit); /* the same requests the survey went through */

    cli_progress_start(&pg);
    while (rc == 0 && (rc = replay_one(b)) == 1) {
        rc = 0;
        if (cli_progress_due(&pg))
            progress(b, &pg);
    }
    cli_progress_end(&pg);
    /* With a backlog the last requests' disk ops are still flying: they count in the time. */
    if (rc == 0 && b->cfg->disk_backlog && (rc = kvt_sync(b->e)))
        return engine_error("kvt_sync", rc);
    b->seconds = (double)(now_ns() - t0) / 1e9;
    /* The figures once every transfer has landed, outside the time: a load the last request
     * waited for layer by layer may still be finishing its bookkeeping (its bytes counted at
     * completion, after its last layer's mark), and a report that raced it would vary. */
    b->st.size = sizeof(b->st);
    if (rc == 0 && ((rc = kvt_sync(b->e)) || (rc = kvt_stats(b->e, &b->st))))
        return engine_error("kvt_stats", rc);
    return rc;
}
