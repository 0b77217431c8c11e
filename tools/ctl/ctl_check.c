/*
 * verify, gc and evict.
 *
 * verify reads every page through the store's own read path, which checks the checksum,
 * from a read-only open: beside a running engine a page may be evicted and its slot
 * rewritten between our snapshot and the read, so a page that fails is read again and
 * counted only if it fails again while its record is still there.
 *
 * Repairs (verify --repair, gc) scan read-only first and only then open for writing, so
 * the report is the same with or without --repair; deleting a page is always safe, since
 * the disk tier is a cache: the worst a wrong call can do is cost a recomputation.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"

#define READ_BATCH_BYTES (16u << 20)
#define READ_BATCH_MAX 256u
#define DELETE_CHUNK 4096u
#define LIST_MAX 50 /* problem pages listed in text; --json lists all */

static uint64_t mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- reading every page ---- */

struct scan {
    struct ctl_index *ix;
    uint32_t *order; /* pages to read, by slab and slot */
    uint32_t n, batch;
    uint8_t *buf;
    struct dstore_rpage *rp;
    int *res;
    uint64_t done, gone, t0, shown;
    bool tty;
};

static const struct page *cmp_base;

static int cmp_place(const void *x, const void *y)
{
    const struct page *p = &cmp_base[*(const uint32_t *)x], *q = &cmp_base[*(const uint32_t *)y];

    if (p->slab != q->slab)
        return p->slab < q->slab ? -1 : 1;
    return (p->slot > q->slot) - (p->slot < q->slot);
}

static int scan_init(struct scan *sc, struct ctl_index *ix)
{
    uint32_t pb = ix->info.page_bytes;

    memset(sc, 0, sizeof(*sc));
    sc->ix = ix;
    sc->batch = READ_BATCH_BYTES / pb ? READ_BATCH_BYTES / pb : 1;
    if (sc->batch > READ_BATCH_MAX)
        sc->batch = READ_BATCH_MAX;
    sc->order = malloc(((size_t)ix->n + 1) * sizeof(*sc->order));
    sc->rp = malloc(sc->batch * sizeof(*sc->rp));
    sc->res = malloc(sc->batch * sizeof(*sc->res));
    if (!sc->order || !sc->rp || !sc->res ||
        posix_memalign((void **)&sc->buf, 4096, (size_t)sc->batch * pb))
        return -ENOMEM;
    for (uint32_t i = 0; i < ix->n; i++)
        if (!ix->p[i].problems)
            sc->order[sc->n++] = i;
    cmp_base = ix->p;
    qsort(sc->order, sc->n, sizeof(*sc->order), cmp_place);
    sc->tty = isatty(STDERR_FILENO);
    sc->t0 = mono_ns();
    return 0;
}

static void scan_free(struct scan *sc)
{
    free(sc->order);
    free(sc->rp);
    free(sc->res);
    free(sc->buf);
}

static void progress(struct scan *sc, bool end)
{
    uint64_t now = mono_ns();
    double s = (double)(now - sc->t0) / 1e9;
    char b[32];

    if (!sc->tty || (!end && now - sc->shown < 200000000u))
        return;
    sc->shown = now;
    if (end) {
        fputs("\r\033[K", stderr);
        return;
    }
    fprintf(stderr, "\r\033[Kverify: %" PRIu64 "/%u pages (%.0f%%)  %s/s", sc->done, sc->n,
            sc->n ? 100.0 * (double)sc->done / sc->n : 100.0,
            ctl_bytes(s > 0 ? (uint64_t)((double)sc->done * sc->ix->info.page_bytes / s) : 0, b));
}

/* A page that failed: read it alone once more, now; what that says. */
static int reread(struct scan *sc, struct page *p)
{
    struct dstore_rpage rp = {.key = p->key, .buf = sc->buf};
    int res = 0, rc = dstore_get(sc->ix->s, &rp, 1, &res);

    return rc ? rc : res;
}

static void settle(struct scan *sc, struct page *p, int res)
{
    int tries = 0;

    while (ctl_retry(res, &tries))
        res = reread(sc, p);
    if (res == KVT_ECORRUPT)
        res = reread(sc, p);
    if (res == -ENOENT)
        sc->gone++; /* evicted by the engine since our snapshot: not a problem */
    else if (res == KVT_ECORRUPT)
        p->problems |= BAD_CHECKSUM;
    else if (res)
        p->problems |= BAD_IO;
}

static int read_batch(struct scan *sc, const uint32_t *idx, uint32_t n)
{
    uint32_t pb = sc->ix->info.page_bytes;
    int rc;

    for (uint32_t k = 0; k < n; k++)
        sc->rp[k] =
            (struct dstore_rpage){.key = sc->ix->p[idx[k]].key, .buf = sc->buf + (size_t)k * pb};
    if ((rc = dstore_get(sc->ix->s, sc->rp, n, sc->res)))
        return rc;
    for (uint32_t k = 0; k < n; k++)
        if (sc->res[k])
            settle(sc, &sc->ix->p[idx[k]], sc->res[k]);
    sc->done += n;
    return 0;
}

static int read_all(struct scan *sc)
{
    int rc = 0;

    for (uint32_t i = 0; i < sc->n && !rc; i += sc->batch) {
        rc = read_batch(sc, sc->order + i, sc->n - i < sc->batch ? sc->n - i : sc->batch);
        progress(sc, false);
    }
    progress(sc, true);
    return rc;
}

/* ---- reports ---- */

/* Slot-table entries no record owns; only known when no writer changed the dir meanwhile. */
static uint64_t leaked_slots(const struct ctl_index *ix)
{
    uint64_t owned = 0;

    if (!ix->quiet_dir)
        return 0;
    for (uint32_t i = 0; i < ix->n; i++)
        owned += ix->p[i].owns_slot;
    return ix->slot_entries > owned ? ix->slot_entries - owned : 0;
}

/* The pages with problems (detached pages have none); a long list is cut. */
static void list_text(const struct ctl_index *ix)
{
    char hex[2 * HASH_BYTES + 1];
    uint32_t listed = 0, bad = 0;

    for (uint32_t i = 0; i < ix->n; i++) {
        uint32_t pr = ix->p[i].problems;

        if (!pr || ++bad > LIST_MAX)
            continue;
        ctl_hex(ix->p[i].key, HASH_BYTES, hex);
        printf("  %s  %s\n", hex, problem_name(pr));
        listed++;
    }
    if (bad > listed)
        printf("  ... and %u more (--json lists all)\n", bad - listed);
}

static void list_json(const struct ctl_index *ix)
{
    bool comma = false;

    printf("[");
    for (uint32_t i = 0; i < ix->n; i++) {
        if (!ix->p[i].problems)
            continue;
        printf("%s{\"hash\":", comma ? "," : "");
        ctl_json_hex(ix->p[i].key, HASH_BYTES);
        printf(",\"problem\":\"%s\"}", problem_name(ix->p[i].problems));
        comma = true;
    }
    printf("]");
}

struct verdict {
    const char *dir;
    bool read_pages;        /* verify (pages read) or gc (index only) */
    uint64_t checked, gone; /* pages read; evicted meanwhile */
    bool repaired, dry_run;
    bool drop_detached;     /* gc --detached: detached pages go too */
    uint64_t dropped, left; /* by the repair: pages gone, pages to drop still there */
};

/* Whether the repair drops page p: a problem (but a read error, which may pass: such a page
 * is kept) or, when asked, detached. */
static bool to_drop(const struct page *p, const struct verdict *v)
{
    return (p->problems && !(p->problems & BAD_IO)) || (v->drop_detached && p->detached);
}

/* Pages the repair deals with: those with problems, and detached ones when it drops them. */
static uint64_t to_repair(const struct problem_counts *c, const struct verdict *v)
{
    return c->total + (v->drop_detached ? c->detached : 0);
}

static void detached_text(const struct problem_counts *c, const struct verdict *v)
{
    printf("detached  %" PRIu64, c->detached);
    if (c->detached && !v->drop_detached)
        printf(" (not a problem: intact, but a page above them is not on this disk; an engine "
               "serves them again once it stores that page again)");
    printf("\n");
}

static void report_text(const struct ctl_index *ix, const struct verdict *v,
                        const struct problem_counts *c)
{
    char b[32];

    if (v->read_pages)
        printf("%s: %u pages, %" PRIu64 " read (%s), %" PRIu64 " evicted during the scan\n", v->dir,
               ix->n, v->checked, ctl_bytes(v->checked * ix->info.page_bytes, b), v->gone);
    else
        printf("%s: %u pages (records and links checked; verify also reads the pages)\n", v->dir,
               ix->n);
    printf("corrupt   %" PRIu64 "\ndangling  %" PRIu64 "\nstale     %" PRIu64 "\n", c->corrupt,
           c->dangling, c->stale);
    detached_text(c, v);
    if (c->io)
        printf("read errors %" PRIu64 "\n", c->io);
    if (leaked_slots(ix))
        printf("note: %" PRIu64 " slot-table entries have no record; eviction reclaims them\n",
               leaked_slots(ix));
    list_text(ix);
    if (v->repaired)
        printf("repaired: dropped %" PRIu64 " page%s; %" PRIu64 " bad left%s\n", v->dropped,
               v->dropped == 1 ? "" : "s", v->left,
               c->io ? " (pages with read errors are kept: verify again)" : "");
    else if (v->dry_run && to_repair(c, v))
        printf("dry run: %" PRIu64 " page%s would be dropped\n", to_repair(c, v),
               to_repair(c, v) == 1 ? "" : "s");
    printf("%s\n", !c->total ? "OK" : v->repaired && !v->left ? "REPAIRED" : "PROBLEMS FOUND");
}

static void report_json(const struct ctl_index *ix, const struct verdict *v,
                        const struct problem_counts *c)
{
    printf("{\"dir\":");
    cli_json_string(v->dir);
    printf(",\"pages\":%u,\"pages_read\":%" PRIu64 ",\"evicted_during_scan\":%" PRIu64
           ",\"corrupt\":%" PRIu64 ",\"dangling\":%" PRIu64 ",\"stale\":%" PRIu64
           ",\"detached\":%" PRIu64 ",\"read_errors\":%" PRIu64 ",\"problems\":%" PRIu64
           ",\"leaked_slots\":%" PRIu64,
           ix->n, v->checked, v->gone, c->corrupt, c->dangling, c->stale, c->detached, c->io,
           c->total, leaked_slots(ix));
    printf(",\"repaired\":%s,\"dropped\":%" PRIu64 ",\"left\":%" PRIu64 ",\"bad\":",
           v->repaired ? "true" : "false", v->dropped, v->left);
    list_json(ix);
    printf(",\"ok\":%s}\n", !c->total || (v->repaired && !v->left) ? "true" : "false");
}

/* ---- dropping ---- */

/* A full reader table (-EAGAIN) passes: retried as the reads are. */
static int delete_chunk(struct dstore *w, const uint8_t *keys, size_t n)
{
    int rc, tries = 0;

    while (ctl_retry(rc = dstore_delete(w, keys, n, NULL), &tries))
        ;
    return rc;
}

/* Delete the pages the repair drops (to_drop) from dir, opened for writing now; count what
 * went and what is left. */
static int delete_bad(struct dstore *w, const struct ctl_index *ix, struct verdict *v)
{
    uint8_t *keys = malloc((size_t)DELETE_CHUNK * HASH_BYTES);
    bool present;
    size_t n = 0;
    int rc = keys ? 0 : -ENOMEM;

    for (uint32_t i = 0; i <= ix->n && !rc; i++) {
        if (i < ix->n && to_drop(&ix->p[i], v))
            memcpy(keys + HASH_BYTES * n++, ix->p[i].key, HASH_BYTES);
        if (n && (n == DELETE_CHUNK || i == ix->n)) {
            rc = delete_chunk(w, keys, n);
            n = 0;
        }
    }
    for (uint32_t i = 0; i < ix->n && !rc; i++)
        if ((ix->p[i].problems || to_drop(&ix->p[i], v)) &&
            !(rc = dstore_exists(w, ix->p[i].key, 1, &present)))
            present ? v->left++ : v->dropped++;
    v->left += ix->bad_keys; /* keys of the wrong length: the store's API cannot name them */
    free(keys);
    return rc;
}

static int drop_bad(const char *dir, const struct ctl_index *ix, struct verdict *v)
{
    struct dstore *w;
    int rc = ctl_open_rw(dir, 0, &w);

    if (rc)
        return rc;
    rc = delete_bad(w, ix, v);
    dstore_close(w);
    v->repaired = !rc;
    return rc ? ctl_fail("%s: dropping: %s", dir, kvt_strerror(rc)) : 0;
}

static int finish(struct ctl_index *ix, struct verdict *v, bool json, bool repair)
{
    struct problem_counts c;
    int rc = 0;

    index_count_problems(ix, &c);
    if (repair && to_repair(&c, v))
        rc = drop_bad(v->dir, ix, v);
    if (json)
        report_json(ix, v, &c);
    else
        report_text(ix, v, &c);
    if (rc)
        return rc;
    return !c.total || (v->repaired && !v->left) ? 0 : 1;
}

static int locked_error(const char *dir)
{
    return ctl_open_error(dir, -EBUSY, true);
}

int cmd_verify(const struct ctl_args *a)
{
    struct verdict v = {.dir = a->pos[0], .read_pages = true};
    struct ctl_index ix;
    struct dstore *s;
    struct scan sc;
    int rc;

    if (a->repair && ctl_dir_locked(v.dir))
        return locked_error(v.dir);
    if ((rc = ctl_load(v.dir, a->repair, &s, &ix)))
        return rc;
    if ((rc = scan_init(&sc, &ix)))
        rc = ctl_fail("out of memory");
    else if ((rc = read_all(&sc)) || (rc = index_relink(&ix)))
        rc = ctl_fail("%s: reading pages: %s", v.dir, kvt_strerror(rc));
    v.checked = sc.done - sc.gone; /* read: not the pages evicted meanwhile */
    v.gone = sc.gone;
    scan_free(&sc);
    dstore_close(s); /* before a repair opens the dir for writing */
    if (!rc)
        rc = finish(&ix, &v, a->json, a->repair);
    index_free(&ix);
    return rc;
}

int cmd_gc(const struct ctl_args *a)
{
    struct verdict v = {.dir = a->pos[0], .dry_run = a->dry_run, .drop_detached = a->detached};
    struct ctl_index ix;
    struct dstore *s;
    int rc;

    if (!a->dry_run && ctl_dir_locked(v.dir))
        return locked_error(v.dir);
    if ((rc = ctl_load(v.dir, !a->dry_run, &s, &ix)))
        return rc;
    dstore_close(s);
    rc = finish(&ix, &v, a->json, !a->dry_run);
    index_free(&ix);
    /* gc succeeds when it left nothing bad; a dry run when it ran. */
    return a->dry_run && rc == 1 ? 0 : rc;
}

/* ---- evict ---- */

int cmd_evict(const struct ctl_args *a)
{
    const char *dir = a->pos[0];
    struct dstore_stats st;
    struct dstore_info in;
    struct dstore *w;
    uint64_t before, want, evicted = 0;
    size_t n = 1;
    int rc = ctl_open_rw(dir, 0, &w);
    char b[32];

    if (rc)
        return rc;
    dstore_info(w, &in);
    dstore_stats(w, &st);
    before = st.pages;
    want = a->to_bytes / in.page_bytes;
    while (!rc && n && st.pages > want) {
        int tries = 0;
        while (ctl_retry(rc = dstore_evict(w, (size_t)(st.pages - want), &n), &tries))
            ;
        evicted += n;
        dstore_stats(w, &st);
    }
    dstore_close(w);
    if (rc)
        return ctl_fail("%s: evicting: %s", dir, kvt_strerror(rc));
    if (a->json) {
        printf("{\"dir\":");
        cli_json_string(dir);
        printf(",\"pages_before\":%" PRIu64 ",\"evicted\":%" PRIu64 ",\"pages\":%" PRIu64
               ",\"bytes\":%" PRIu64 ",\"target_bytes\":%" PRIu64 "}\n",
               before, evicted, st.pages, st.pages * in.page_bytes, a->to_bytes);
    } else {
        printf("%s: evicted %" PRIu64 " of %" PRIu64 " pages; %" PRIu64 " left (%s)\n", dir,
               evicted, before, st.pages, ctl_bytes(st.pages * in.page_bytes, b));
    }
    return st.pages > want
               ? ctl_fail("%s: could not evict down to %" PRIu64 " bytes", dir, a->to_bytes)
               : 0;
}
