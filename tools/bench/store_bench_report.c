/* kvtier-store-bench's report (store_bench.h): text and JSON. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_bench.h"
#include "report.h"

/* ---- report: text ---- */

static const char *io_name(uint32_t io)
{
    return io == DSTORE_IO_URING ? "io_uring" : io == DSTORE_IO_PSYNC ? "psync" : "?";
}

static void print_text_head(const struct bench *b)
{
    const struct config *cfg = b->cfg;

    printf("%s: work dir %s (%s)%s\n", PROG, b->wd.path, b->wd.fs,
           cfg->keep ? ", kept" : ", removed at the end");
    if (b->fio.usable || b->fio.version[0])
        printf("  fio: %s (%s)\n", b->fio.path, b->fio.version);
    if (b->fio.note[0])
        printf("  note: %s\n", b->fio.note);
}

static void print_store_how(const struct bench *b, const struct point *pt)
{
    printf("  store: %s, %s, %s, %.0f%% of them on huge pages", io_name(pt->io),
           pt->direct ? "O_DIRECT" : "buffered",
           pt->fixed_buffers ? "registered buffers" : "plain buffers",
           pt->buffer_bytes ? 100.0 * (double)pt->huge_bytes / (double)pt->buffer_bytes : 0.0);
    if (pt->fio_ran)
        printf(" (fio's: %s)", b->buffers == BUF_HUGE ? "huge pages, hugetlb" : "4 KiB pages");
    printf("\n");
}

static void print_fio_lines(const struct bench *b, const struct point *pt)
{
    const char *rd = b->cfg->order == ORDER_RANDOM ? "randread" : "read";
    const char *rw[3] = {"write", "write", rd};
    const uint64_t sync[3] = {b->cfg->batch, 0, 0};

    for (int k = 0; k < 3; k++) {
        struct bench_job j;

        sb_job_init(&j, b, pt, rw[k], sync[k]);
        printf("    $");
        for (int i = 0; j.fio.argv[i]; i++)
            printf(" %s", j.fio.argv[i]);
        printf("\n");
    }
}

/* One row: the store's figure, fio's (when it ran: GB/s of the fbytes its job moved), their
 * ratio and the target when judged. */
static void print_row(const char *name, const struct point *pt, const struct cli_timing *st,
                      const struct cli_timing *fio, uint64_t fbytes, bool judged)
{
    uint64_t bytes = pt->pages * pt->page_bytes;
    double r = cli_ratio(fio->median, st->median);

    printf("  %-24s %7.3f (%7.3f) %9.0f", name, cli_gbps(bytes, st->median),
           cli_gbps(bytes, st->best), cli_ratio((double)pt->pages, st->median));
    if (pt->fio_ran)
        printf("   %7.3f (%7.3f) %7.3f", cli_gbps(fbytes, fio->median), cli_gbps(fbytes, fio->best),
               r);
    if (pt->fio_ran && judged)
        printf("   >= %.2f %s", TARGET_RATIO, cli_met(r >= TARGET_RATIO));
    printf("\n");
}

static void print_text_point(const struct bench *b, const struct point *pt)
{
    uint64_t wbytes = sb_job_bytes(pt, "write"), rbytes = sb_job_bytes(pt, "randread");
    char sync[64];

    printf("\npage ");
    cli_print_size(pt->page_bytes);
    printf(" (slot %u B), queue depth %u: %" PRIu64 " pages, ", pt->slot_bytes, pt->queue_depth,
           pt->pages);
    cli_print_size(pt->pages * pt->page_bytes);
    printf(" a run; median (best) of %" PRIu64 " runs\n", b->cfg->reps);
    print_store_how(b, pt);
    printf("  %-24s %-17s %9s", "", "store GB/s", "pages/s");
    if (pt->fio_ran)
        printf("   %-17s %7s   %s", "fio GB/s", "ratio", "target");
    printf("\n");
    /* Like with like: a durable store against fio's durable write, a relaxed one (no sync
     * per batch) against its plain write; the other ratio is printed, not judged. */
    if (b->cfg->sync == DSTORE_SYNC_RELAXED) {
        print_row("write (relaxed)", pt, &pt->write, &pt->fio_write, wbytes, true);
        snprintf(sync, sizeof(sync), "  vs fio durable write");
        if (pt->fio_ran)
            print_row(sync, pt, &pt->write, &pt->fio_sync, wbytes, false);
    } else {
        print_row("write (durable)", pt, &pt->write, &pt->fio_sync, wbytes, true);
        snprintf(sync, sizeof(sync), "  vs fio plain write");
        if (pt->fio_ran)
            print_row(sync, pt, &pt->write, &pt->fio_write, wbytes, false);
    }
    print_row(b->cfg->order == ORDER_RANDOM ? "read (random order)" : "read (written order)", pt,
              &pt->read, &pt->fio_read, rbytes, true);
    if (pt->fio_ran) {
        printf("  fio, each run (durable write, plain write, read; syncfs before each write):\n");
        print_fio_lines(b, pt);
    }
}

static void print_open_row(const char *name, const struct open_result *o, int kind)
{
    printf("  %-5s %8.2f (%8.2f) %8.2f (%8.2f) %8.2f (%8.2f) %9.1f (%9.1f)\n", name,
           o->open[kind].median * 1e3, o->open[kind].worst * 1e3, o->serve[kind].median * 1e3,
           o->serve[kind].worst * 1e3, o->first_read[kind].median * 1e3,
           o->first_read[kind].worst * 1e3, o->ready[kind].median * 1e3,
           o->ready[kind].worst * 1e3);
}

static void print_text_open(const struct bench *b)
{
    const struct open_result *o = &b->open;

    printf("\nopen: %" PRIu64 " pages of %" PRIu64 " bytes, built in %.2f s (%.0f pages/s); "
           "ms from dstore_open, median (worst) of %" PRIu64 "\n",
           o->pages, b->cfg->open_page_bytes, o->build,
           o->build > 0 ? (double)o->pages / o->build : 0.0, b->cfg->open_reps);
    printf("  %-5s %-19s %-19s %-19s %-21s\n", "", "open returned", "serve (64 keys)",
           "+ one page read", "ready (rebuild done)");
    print_open_row("cold", o, 0);
    print_open_row("warm", o, 1);
    printf("  serve <= %.0f ms: cold %s, warm %s\n", TARGET_SERVE_S * 1e3,
           cli_met(o->serve[0].median <= TARGET_SERVE_S),
           cli_met(o->serve[1].median <= TARGET_SERVE_S));
}

/* ---- report: JSON ---- */

static void print_json_fio(struct jw *w, const struct bench *b, const struct point *pt)
{
    uint64_t fbytes = pt->pages * pt->slot_bytes;

    if (!pt->fio_ran) {
        jw_null(w, "fio");
        jw_null(w, "ratio");
        return;
    }
    jw_object(w, "fio");
    jw_u64(w, "bytes", fbytes);
    /* What the read moved: read_block a page (the timings' GB/s all count bytes, the file). */
    jw_u64(w, "read_block_bytes", pt->read_block);
    jw_u64(w, "read_bytes", sb_job_bytes(pt, "randread"));
    jw_u64(w, "fdatasync_every", b->cfg->batch);
    rpt_json_timing(w, "write", &pt->fio_write, fbytes, true);
    rpt_json_timing(w, "write_fdatasync", &pt->fio_sync, fbytes, true);
    rpt_json_timing(w, "read", &pt->fio_read, fbytes, true);
    jw_end(w);
    jw_object(w, "ratio");
    jw_double(w, "write", "%.6g", cli_ratio(pt->fio_write.median, pt->write.median));
    jw_double(w, "write_vs_fdatasync", "%.6g", cli_ratio(pt->fio_sync.median, pt->write.median));
    jw_double(w, "read", "%.6g", cli_ratio(pt->fio_read.median, pt->read.median));
    /* The target judges write_vs_fdatasync (durable against durable) or, for a relaxed store,
     * write (no sync against none), and read. */
    jw_array(w, "judged");
    jw_string(w, NULL, b->cfg->sync == DSTORE_SYNC_RELAXED ? "write" : "write_vs_fdatasync");
    jw_string(w, NULL, "read");
    jw_end(w);
    jw_end(w);
}

static void print_json_point(struct jw *w, const struct bench *b, const struct point *pt)
{
    uint64_t bytes = pt->pages * pt->page_bytes;

    jw_object(w, NULL);
    jw_u64(w, "page_bytes", pt->page_bytes);
    jw_u64(w, "slot_bytes", pt->slot_bytes);
    jw_u64(w, "queue_depth", pt->queue_depth);
    jw_u64(w, "pages", pt->pages);
    jw_u64(w, "bytes", bytes);
    jw_object(w, "store");
    jw_string(w, "io", io_name(pt->io));
    jw_bool(w, "direct", pt->direct);
    jw_bool(w, "fixed_buffers", pt->fixed_buffers);
    jw_u64(w, "fixed_ios", pt->fixed_ios);
    jw_u64(w, "buffer_bytes", pt->buffer_bytes);
    jw_u64(w, "huge_page_bytes", pt->huge_bytes);
    rpt_json_timing(w, "write", &pt->write, bytes, true);
    rpt_json_timing(w, "read", &pt->read, bytes, true);
    jw_double(w, "write_pages_per_s", "%.6g", cli_ratio((double)pt->pages, pt->write.median));
    jw_double(w, "read_pages_per_s", "%.6g", cli_ratio((double)pt->pages, pt->read.median));
    jw_end(w);
    print_json_fio(w, b, pt);
    jw_double(w, "target_ratio", "%.2f", TARGET_RATIO);
    jw_end(w);
}

static void print_json_config(struct jw *w, const struct bench *b)
{
    const struct config *cfg = b->cfg;

    jw_object(w, "config");
    jw_string(w, "work_dir", b->wd.path);
    jw_string(w, "fs", b->wd.fs);
    jw_bool(w, "keep", cfg->keep);
    jw_u64(w, "reps", cfg->reps);
    jw_u64(w, "batch", cfg->batch);
    jw_string(w, "read_order", sb_order_names[cfg->order]);
    jw_string(w, "io", sb_io_names[cfg->io]);
    jw_string(w, "disk_sync", sb_sync_names[cfg->sync]);
    jw_string(w, "buffers", sb_buffer_names[b->buffers]);
    jw_u64(w, "seed", cfg->seed);
    jw_u64(w, "page_tokens", PAGE_TOKENS);
    jw_string(w, "fio", b->fio.version[0] ? b->fio.version : NULL);
    jw_string(w, "fio_note", b->fio.note[0] ? b->fio.note : NULL);
    jw_end(w);
}

static void print_json_open_kind(struct jw *w, const char *name, const struct open_result *o,
                                 int kind)
{
    jw_object(w, name);
    rpt_json_timing(w, "open", &o->open[kind], 0, true);
    rpt_json_timing(w, "serve", &o->serve[kind], 0, true);
    rpt_json_timing(w, "first_read", &o->first_read[kind], 0, true);
    rpt_json_timing(w, "ready", &o->ready[kind], 0, true);
    jw_end(w);
}

static void print_json_open(struct jw *w, const struct bench *b)
{
    const struct open_result *o = &b->open;

    if (!b->open_ran) {
        jw_null(w, "open");
        return;
    }
    jw_object(w, "open");
    jw_u64(w, "pages", o->pages);
    jw_u64(w, "page_bytes", b->cfg->open_page_bytes);
    jw_u64(w, "keys", o->keys);
    jw_u64(w, "reps", b->cfg->open_reps);
    jw_double(w, "build_s", "%.6g", o->build);
    jw_double(w, "build_pages_per_s", "%.6g", cli_ratio((double)o->pages, o->build));
    print_json_open_kind(w, "cold", o, 0);
    print_json_open_kind(w, "warm", o, 1);
    jw_double(w, "target_serve_s", "%.3f", TARGET_SERVE_S);
    jw_end(w);
}

void sb_print_report(const struct bench *b)
{
    struct jw w;

    if (!b->cfg->json) {
        print_text_head(b);
        for (size_t i = 0; i < b->npt; i++)
            print_text_point(b, &b->pt[i]);
        if (b->open_ran)
            print_text_open(b);
        return;
    }
    jw_init(&w);
    jw_object(&w, NULL);
    print_json_config(&w, b);
    jw_array(&w, "throughput");
    for (size_t i = 0; i < b->npt; i++)
        print_json_point(&w, b, &b->pt[i]);
    jw_end(&w);
    print_json_open(&w, b);
    jw_end(&w);
    putchar('\n');
}
