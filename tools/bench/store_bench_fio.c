/* kvtier-store-bench's fio (store_bench.h): found, its buffers chosen to match the store's,
 * its jobs run on a file beside the store's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdarg.h>
#include <unistd.h>

#include "store_bench.h"

/* Why there is no (more) comparison with fio; the report prints it. */
static void fio_note(struct fio_state *f, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(f->note, sizeof(f->note), fmt, ap);
    va_end(ap);
}

/* ---- fio ---- */

void sb_fio_setup(struct bench *b)
{
    struct fio_state *f = &b->fio;
    char log[PATH_MAX];
    int rc;

    if (b->cfg->no_fio) {
        fio_note(f, "--no-fio: no comparison with fio");
        return;
    }
    if (!fio_find_program(b->cfg->fio, f->path, sizeof(f->path))) {
        fio_note(f, "fio not found (%s); install fio: apt-get install fio. No comparison with fio",
                 b->cfg->fio);
        return;
    }
    workdir_path(&b->wd, "fio-version.log", log, sizeof(log));
    if ((rc = fio_version(f->path, log, f->version, sizeof(f->version))) != 0) {
        fio_note(f, "%s --version failed (%d); no comparison with fio", f->path, rc);
        return;
    }
    f->usable = true;
}

/* Huge pages (hugetlb) free now, and their size; 0 when /proc/meminfo does not say. */
static uint64_t hugetlb_free(uint64_t *page_bytes)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    uint64_t n = 0, kb = 0;

    while (f && fgets(line, sizeof(line), f)) {
        sscanf(line, "HugePages_Free: %" SCNu64, &n);
        sscanf(line, "Hugepagesize: %" SCNu64 " kB", &kb);
    }
    if (f)
        fclose(f);
    *page_bytes = kb * 1024;
    return kb ? n : 0;
}

/* The largest of a list. */
static uint64_t list_max(const struct cli_list *l)
{
    uint64_t m = 0;

    for (size_t i = 0; i < l->n; i++)
        m = l->v[i] > m ? l->v[i] : m;
    return m;
}

/* Which pages the buffers are of, the store's and fio's alike, so that the two are compared
 * like for like: this machine's virtio disk moves 256 KiB from huge pages at nearly twice
 * the speed it does from 4 KiB ones. The store's buffers get huge pages as the engine's host
 * pool does (MADV_HUGEPAGE); fio has no such option, only hugetlb pages (--iomem=shmhuge),
 * which must be reserved beforehand (vm.nr_hugepages). auto: huge pages when fio can have
 * them (or fio does not run), else 4 KiB pages for both. */
int sb_resolve_buffers(struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint64_t hp = 0, free_pages = hugetlb_free(&hp), need = 0;
    uint64_t per_job =
        (uint64_t)sb_slot_of((uint32_t)list_max(&cfg->page_bytes)) * list_max(&cfg->queue_depth);

    b->buffers = cfg->buffers == BUF_4K ? BUF_4K : BUF_HUGE;
    if (!b->fio.usable || b->buffers == BUF_4K)
        return 0;
    /* fio's buffers: a block per queue slot and a page of alignment, in whole huge pages,
     * plus one for what the kernel rounds. */
    need = hp ? (per_job + 4096 + hp - 1) / hp + 1 : 0;
    if (hp && free_pages >= need)
        return 0;
    if (cfg->buffers == BUF_AUTO) {
        b->buffers = BUF_4K;
        return 0;
    }
    fprintf(stderr,
            "%s: --buffers huge: fio's buffers need %" PRIu64 " huge pages (hugetlb) and %" PRIu64
            " are free: reserve them (sysctl vm.nr_hugepages=%" PRIu64 ") or use --buffers 4k\n",
            PROG, need, free_pages, need);
    return -1;
}

/* ---- fio runs ---- */

/* Bytes a job of rw moves: a slot per page written, read_block per page read. */
uint64_t sb_job_bytes(const struct point *pt, const char *rw)
{
    return pt->pages * (strcmp(rw, "write") ? pt->read_block : pt->slot_bytes);
}

/* rw: write, read or randread; fdatasync: writes between syncs, 0 for none; when not 0 the
 * job also syncs at its end, after the last writes. Writes go a slot at a time, as the store
 * writes a page and its head; reads as the store reads a page: read_block at a time, one
 * I/O per page, over the same span of file (a slot per page). A sequential read skips what
 * the store skips (each slot's head block): fio's rw=read:SKIP. */
void sb_job_init(struct bench_job *j, const struct bench *b, const struct point *pt, const char *rw,
                 uint64_t fdatasync)
{
    bool read = strcmp(rw, "write") != 0;
    uint32_t skip = pt->slot_bytes - pt->read_block;

    workdir_path(&b->wd, "fio.data", j->file, sizeof(j->file));
    workdir_path(&b->wd, "fio.json", j->json, sizeof(j->json));
    workdir_path(&b->wd, "fio.log", j->log, sizeof(j->log));
    if (!strcmp(rw, "read") && skip)
        snprintf(j->rw, sizeof(j->rw), "read:%u", skip);
    else
        snprintf(j->rw, sizeof(j->rw), "%s", rw);
    fio_job_init(&j->fio,
                 &(struct fio_params){.fio = b->fio.path,
                                      .name = PROG,
                                      .file = j->file,
                                      .rw = j->rw,
                                      .direct = pt->direct,
                                      .fixed_buffers = pt->fixed_buffers,
                                      .huge_buffers = b->buffers == BUF_HUGE,
                                      .block_bytes = read ? pt->read_block : pt->slot_bytes,
                                      .iodepth = pt->queue_depth,
                                      .size = pt->pages * pt->slot_bytes,
                                      .io_size = read ? sb_job_bytes(pt, rw) : 0,
                                      .fdatasync = fdatasync,
                                      .json = j->json});
}

/* Run a job that should move want bytes; its seconds for the point's pages (io_bytes /
 * bw_bytes). On failure the note says why and -1 comes back. */
static int fio_job_run(struct bench *b, struct bench_job *j, const char *dir, uint64_t want,
                       double *seconds)
{
    double io_bytes, bw;
    int rc = fio_spawn_wait(j->fio.argv, j->log);

    if (rc) {
        char line[256];

        fio_first_line(j->log, line, sizeof(line));
        fio_note(&b->fio, "fio exited %d (%s); comparison stopped", rc, line);
        return -1;
    }
    if (fio_read_report(j->json, dir, &io_bytes, &bw) || io_bytes != (double)want) {
        fio_note(&b->fio,
                 "fio's report (%s) lacks a %s bandwidth over the whole size; comparison stopped",
                 j->json, dir);
        return -1;
    }
    *seconds = io_bytes / bw;
    return 0;
}

static int fio_run(struct bench *b, const struct point *pt, const char *rw, uint64_t fdatasync,
                   double *seconds)
{
    struct bench_job j;
    const char *dir = strcmp(rw, "write") ? "read" : "write";

    sb_job_init(&j, b, pt, rw, fdatasync);
    return fio_job_run(b, &j, dir, sb_job_bytes(pt, rw), seconds);
}

/* One rep of fio: a fresh file written plainly; another written durably (an fdatasync per
 * store batch and one at the end), then read. Each write starts on a quiet disk, as the
 * store's does. t: plain write, durable write, read. */
int sb_fio_rep(struct bench *b, const struct point *pt, double t[3])
{
    const char *rd = b->cfg->order == ORDER_RANDOM ? "randread" : "read";
    char file[PATH_MAX];
    int rc;

    workdir_path(&b->wd, "fio.data", file, sizeof(file));
    unlink(file);
    workdir_quiesce(b->wd.path);
    rc = fio_run(b, pt, "write", 0, &t[0]);
    unlink(file);
    workdir_quiesce(b->wd.path);
    if (!rc)
        rc = fio_run(b, pt, "write", b->cfg->batch, &t[1]);
    if (!rc)
        rc = fio_run(b, pt, rd, 0, &t[2]);
    unlink(file);
    return rc;
}
