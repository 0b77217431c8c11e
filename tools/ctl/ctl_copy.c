/*
 * export and import: copy chosen prefixes from one data dir to another of the same
 * fingerprint. The source is opened read-only (safe beside an engine); the target is
 * opened for writing (its lock) and created with the source's fingerprint and geometry when
 * missing. Pages go top-down, parents before children, each through the store's read path
 * (checksum checked) and write path (slot, bytes, fdatasync, then the index), so a crash
 * mid-copy leaves a target whose every page is whole and whose every chain starts where it
 * started in the source: at a root, or (detached pages) at a page whose parent the source
 * did not hold either.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"

#define COPY_BATCH_BYTES (16u << 20)
#define COPY_BATCH_MAX 256u

/* Why a selected page was not copied. */
enum skip_reason {
    SKIP_BAD_BYTES,  /* its bytes failed their checksum */
    SKIP_READ_ERROR, /* reading it (or its record) failed */
    SKIP_GONE,       /* evicted or deleted since the index was read */
    SKIP_CHANGED,    /* its record changed since the index was read */
    SKIP_BELOW,      /* a page above it was skipped */
    SKIP_REASONS,
};

static const char *const skip_json[SKIP_REASONS] = {"bad_bytes", "read_errors", "gone", "changed",
                                                    "below_skipped"};
static const char *const skip_text[SKIP_REASONS] = {
    "bad bytes (checksum)", "read errors", "evicted since the index was read",
    "changed since the index was read", "below a skipped page"};

struct copy {
    const char *src, *dst;
    const char *src_name, *dst_name; /* for messages: cut when long */
    char src_clip[CLI_PATH_ECHO_MAX + 4], dst_clip[CLI_PATH_ECHO_MAX + 4];
    struct ctl_index *ix;
    struct dstore *w;
    uint32_t *order, n; /* selected pages, parents first */
    uint32_t *level;    /* each page's place below the top of its stored chain */
    bool *failed;       /* not copied: bad bytes, or below such a page */
    uint32_t batch;
    uint8_t *buf;
    uint32_t *tokens; /* batch x page_tokens */
    struct dstore_rpage *rp;
    struct dstore_wpage *wp;
    int *res;
    uint64_t copied, present, skipped;
    uint64_t why[SKIP_REASONS]; /* skipped, by reason */
};

/* ---- the target ---- */

static bool same_model(const struct dstore_info *a, const struct dstore_info *b)
{
    return !memcmp(a->fingerprint, b->fingerprint, HASH_BYTES) && a->page_bytes == b->page_bytes &&
           a->page_tokens == b->page_tokens;
}

static int fingerprint_error(const struct copy *c, const struct dstore_info *t)
{
    char a[2 * HASH_BYTES + 1], b[2 * HASH_BYTES + 1];

    ctl_hex(c->ix->info.fingerprint, HASH_BYTES, a);
    ctl_hex(t->fingerprint, HASH_BYTES, b);
    return ctl_fail("%s holds KV of another model or geometry (fingerprint %.16s.., page %u "
                    "tokens) than %s (fingerprint %.16s.., page %u tokens): refused",
                    c->dst_name, b, t->page_tokens, c->src_name, a, c->ix->info.page_tokens);
}

/* Selected pages the target lacks: each needs a free slot there. */
static int pages_missing(const struct copy *c, uint64_t *missing)
{
    enum { CHUNK = 1024 };
    uint8_t *keys = malloc((size_t)CHUNK * HASH_BYTES);
    bool present[CHUNK];
    int rc = 0;

    if (!keys)
        return -ENOMEM;
    *missing = 0;
    for (uint32_t i = 0; i < c->n && !rc; i += CHUNK) {
        uint32_t m = c->n - i < CHUNK ? c->n - i : CHUNK;

        for (uint32_t k = 0; k < m; k++)
            memcpy(keys + (size_t)k * HASH_BYTES, c->ix->p[c->order[i + k]].key, HASH_BYTES);
        if (!(rc = dstore_exists(c->w, keys, m, present)))
            for (uint32_t k = 0; k < m; k++)
                *missing += !present[k];
    }
    free(keys);
    return rc;
}

/* The copy must fit in the target's free slots: a full store evicts to make room, and would
 * throw out what it holds, or pages just copied, to take the rest. */
static int check_room(const struct copy *c, bool grown)
{
    struct dstore_stats st;
    uint64_t missing;
    int rc = pages_missing(c, &missing);

    if (rc)
        return ctl_fail("%s: %s", c->dst_name, kvt_strerror(rc));
    dstore_stats(c->w, &st);
    if (missing <= st.free_slots)
        return 0;
    return ctl_fail("%s: %" PRIu64 " of the %u pages to copy are not there yet, but only %" PRIu64
                    " fit (free slots, of a capacity of %" PRIu64 " slots%s): refused; give a "
                    "larger --capacity (then open the engine on it with disk_bytes at least that) "
                    "or make room with `" PROG " evict`",
                    c->dst_name, missing, c->n, st.free_slots, st.capacity_slots,
                    grown ? ", as --capacity asks" : ", kept as found");
}

/* An existing target: same model, then opened for writing. Its capacity stays as found (what
 * its slab files span) unless --capacity asks for more: the engine that owns the dir opens it
 * with its own disk_bytes and drops every record beyond them. */
static int open_existing(struct copy *c, uint64_t capacity)
{
    struct dstore_info t;
    struct dstore *r;
    int rc = ctl_open_ro(c->dst, true, &r);

    if (rc)
        return rc;
    dstore_info(r, &t);
    dstore_close(r);
    if (!same_model(&c->ix->info, &t))
        return fingerprint_error(c, &t);
    if ((rc = ctl_open_rw(c->dst, capacity, &c->w)))
        return rc;
    if ((rc = check_room(c, capacity != 0)))
        dstore_close(c->w);
    return rc;
}

/* A new target: the source's fingerprint, geometry and slab size. */
static int create_target(struct copy *c, uint64_t capacity)
{
    const struct dstore_info *in = &c->ix->info;
    struct dstore_options o;
    int rc;

    dstore_options_init(&o, sizeof(o));
    o.dir = c->dst;
    memcpy(o.fingerprint, in->fingerprint, HASH_BYTES);
    o.page_bytes = in->page_bytes;
    o.page_tokens = in->page_tokens;
    o.disk_bytes =
        capacity > (uint64_t)c->n * in->slot_bytes ? capacity : (uint64_t)c->n * in->slot_bytes;
    o.slab_bytes = (uint64_t)in->slab_slots * in->slot_bytes;
    if (o.slab_bytes > o.disk_bytes)
        o.slab_bytes = o.disk_bytes; /* as the engine does: no slab larger than the tier */
    if ((rc = dstore_open(&o, &c->w)))
        return ctl_open_error(c->dst, rc, true);
    if ((rc = dstore_wait_ready(c->w))) {
        dstore_close(c->w);
        return ctl_fail("%s: %s", c->dst_name, kvt_strerror(rc));
    }
    ctl_note_rebuilt(c->dst, c->w, false); /* slabs of ours without an index */
    return 0;
}

/* capacity: --capacity, 0 when not given. */
static int open_target(struct copy *c, uint64_t capacity)
{
    char path[4096];

    snprintf(path, sizeof(path), "%s/index/data.mdb", c->dst);
    if (access(path, F_OK) == 0)
        return open_existing(c, capacity);
    if (!capacity)
        capacity = c->ix->info.capacity_slots * c->ix->info.slot_bytes;
    return create_target(c, capacity);
}

/* ---- the copy ---- */

static const uint32_t *level_base;

static int cmp_level(const void *x, const void *y)
{
    uint32_t i = *(const uint32_t *)x, j = *(const uint32_t *)y;
    uint32_t a = level_base[i], b = level_base[j];

    if (a != b)
        return a < b ? -1 : 1;
    return (i > j) - (i < j);
}

/* Each page's place below the top of its chain of stored pages (1 for a page whose parent is
 * its root or is not linked): the depth of a page served now, and an order, parents first,
 * for detached pages too. path is scratch of ix->n + 1; links cannot loop (link_pages), and a
 * walk is bounded all the same. */
static void copy_levels(struct copy *c, uint32_t *path)
{
    const struct page *p = c->ix->p;

    for (uint32_t i = 0; i < c->ix->n; i++) {
        uint32_t len = 0, k = i, base;

        while (!c->level[k] && len <= c->ix->n) {
            path[len++] = k;
            if (p[k].up == NO_PAGE)
                break;
            k = p[k].up;
        }
        base = c->level[k];
        while (len)
            c->level[path[--len]] = ++base;
    }
}

static int copy_init(struct copy *c)
{
    const struct dstore_info *in = &c->ix->info;

    c->batch = COPY_BATCH_BYTES / in->page_bytes ? COPY_BATCH_BYTES / in->page_bytes : 1;
    if (c->batch > COPY_BATCH_MAX)
        c->batch = COPY_BATCH_MAX;
    c->order = malloc(((size_t)c->ix->n + 1) * sizeof(*c->order));
    c->level = calloc((size_t)c->ix->n + 1, sizeof(*c->level));
    c->failed = calloc((size_t)c->ix->n + 1, sizeof(*c->failed));
    c->tokens = malloc((size_t)c->batch * (in->page_tokens + 1) * sizeof(uint32_t));
    c->rp = malloc(c->batch * sizeof(*c->rp));
    c->wp = malloc(c->batch * sizeof(*c->wp));
    c->res = malloc(c->batch * sizeof(*c->res));
    if (!c->order || !c->level || !c->failed || !c->tokens || !c->rp || !c->wp || !c->res ||
        posix_memalign((void **)&c->buf, 4096, (size_t)c->batch * in->page_bytes))
        return -ENOMEM;
    return 0;
}

/* The selected pages, parents first (c->order serves as scratch before). */
static void copy_order(struct copy *c, const bool *sel)
{
    copy_levels(c, c->order);
    for (uint32_t i = 0; i < c->ix->n; i++)
        if (sel[i])
            c->order[c->n++] = i;
    level_base = c->level;
    qsort(c->order, c->n, sizeof(*c->order), cmp_level);
}

static void copy_free(struct copy *c)
{
    free(c->order);
    free(c->level);
    free(c->failed);
    free(c->tokens);
    free(c->rp);
    free(c->wp);
    free(c->res);
    free(c->buf);
}

struct tokens_out {
    uint32_t *tokens; /* page_tokens of room */
    uint32_t page_tokens;
};

/* The record is read again, from a newer snapshot than the index: it may have changed. */
static int take_tokens(void *arg, const struct dstore_entry *e)
{
    const struct tokens_out *out = arg;

    if (e->status || e->ntokens != out->page_tokens)
        return KVT_ECORRUPT;
    memcpy(out->tokens, e->tokens, (size_t)e->ntokens * sizeof(uint32_t));
    return 0;
}

static void skip(struct copy *c, uint32_t i, enum skip_reason why)
{
    c->failed[i] = true;
    c->skipped++;
    c->why[why]++;
}

/* Why a read (rc from dstore_get) or a lookup of the record (from dstore_lookup) failed. */
static enum skip_reason read_failure(int rc, bool lookup)
{
    if (rc == -ENOENT)
        return SKIP_GONE;
    if (rc == KVT_ECORRUPT)
        return lookup ? SKIP_CHANGED : SKIP_BAD_BYTES;
    return SKIP_READ_ERROR;
}

/* Page k of the batch again, alone, while its read says the snapshot could not be taken, and
 * once more after bad bytes: beside a live engine, the slot may have been evicted and written
 * again between the snapshot and the read, which a new snapshot tells (gone), as verify's
 * reread does. */
static int read_again(struct copy *c, uint32_t i, uint32_t k)
{
    struct dstore_rpage rp = {.key = c->ix->p[i].key,
                              .buf = c->buf + (size_t)k * c->ix->info.page_bytes};
    int res = c->res[k], tries = 0, rc;
    bool reread = res == KVT_ECORRUPT;

    while (ctl_retry(res, &tries) || reread) {
        reread = false;
        if ((rc = dstore_get(c->ix->s, &rp, 1, &res)))
            res = rc;
    }
    return res;
}

static int lookup_tokens(struct copy *c, const struct page *p, struct tokens_out *out)
{
    int rc, tries = 0;

    while (ctl_retry(rc = dstore_lookup(c->ix->s, p->key, take_tokens, out), &tries))
        ;
    return rc;
}

/* Page k of the batch, read into its buffer already: its write, or false to skip it. */
static bool prepare_write(struct copy *c, uint32_t i, uint32_t k, uint32_t *tokens)
{
    const struct page *p = &c->ix->p[i];
    struct tokens_out out = {tokens, c->ix->info.page_tokens};
    int rc;

    if (c->res[k] && (c->res[k] = read_again(c, i, k))) {
        skip(c, i, read_failure(c->res[k], false));
        return false;
    }
    if (p->up != NO_PAGE && c->failed[p->up]) {
        skip(c, i, SKIP_BELOW);
        return false;
    }
    if ((rc = lookup_tokens(c, p, &out))) {
        skip(c, i, read_failure(rc, true));
        return false;
    }
    c->wp[k] = (struct dstore_wpage){.key = p->key,
                                     .parent = p->parent,
                                     .ns = c->ix->ns[p->ns].root,
                                     .tokens = tokens,
                                     .buf = c->buf + (size_t)k * c->ix->info.page_bytes};
    return true;
}

static int copy_batch(struct copy *c, const uint32_t *idx, uint32_t n)
{
    const struct dstore_info *in = &c->ix->info;
    uint32_t m = 0;
    int rc;

    for (uint32_t k = 0; k < n; k++)
        c->rp[k] = (struct dstore_rpage){.key = c->ix->p[idx[k]].key,
                                         .buf = c->buf + (size_t)k * in->page_bytes};
    if ((rc = dstore_get(c->ix->s, c->rp, n, c->res)))
        return rc;
    for (uint32_t k = 0; k < n; k++)
        if (prepare_write(c, idx[k], k, c->tokens + (size_t)k * in->page_tokens))
            c->wp[m++] = c->wp[k];
    if (!m)
        return 0;
    if ((rc = dstore_put(c->w, c->wp, m, c->res)))
        return rc;
    for (uint32_t k = 0; k < m; k++) {
        if (c->res[k] && !rc)
            rc = c->res[k]; /* the target is full or failing: stop after this batch */
        c->copied += !c->res[k];
    }
    return rc;
}

/* Batches never mix levels, so a parent has landed (or failed) before its children go. */
static int copy_all(struct copy *c)
{
    struct dstore_stats before, after;
    int rc = 0;

    dstore_stats(c->w, &before);
    for (uint32_t i = 0; i < c->n && !rc;) {
        uint32_t n = 1, d = c->level[c->order[i]];

        while (i + n < c->n && n < c->batch && c->level[c->order[i + n]] == d)
            n++;
        rc = copy_batch(c, c->order + i, n);
        i += n;
    }
    dstore_stats(c->w, &after);
    c->present = after.write_dups - before.write_dups;
    c->copied -= c->present;
    return rc;
}

static void report_json(const struct copy *c)
{
    printf("{\"from\":");
    cli_json_string(c->src);
    printf(",\"to\":");
    cli_json_string(c->dst);
    printf(",\"selected\":%u,\"copied\":%" PRIu64 ",\"already_there\":%" PRIu64
           ",\"skipped\":%" PRIu64 ",\"skipped_why\":{",
           c->n, c->copied, c->present, c->skipped);
    for (int r = 0; r < SKIP_REASONS; r++)
        printf("%s\"%s\":%" PRIu64, r ? "," : "", skip_json[r], c->why[r]);
    printf("},\"bytes\":%" PRIu64 "}\n", c->copied * c->ix->info.page_bytes);
}

static void report(const struct copy *c, bool json)
{
    const char *sep = " (";
    char b[32];

    if (json) {
        report_json(c);
        return;
    }
    printf("%s -> %s: %u pages selected, %" PRIu64 " copied (%s), %" PRIu64
           " already there, %" PRIu64 " skipped",
           c->src, c->dst, c->n, c->copied, ctl_bytes(c->copied * c->ix->info.page_bytes, b),
           c->present, c->skipped);
    for (int r = 0; r < SKIP_REASONS; r++) {
        if (c->why[r]) {
            printf("%s%" PRIu64 " %s", sep, c->why[r], skip_text[r]);
            sep = ", ";
        }
    }
    printf("%s\n", c->skipped ? ")" : "");
}

/* After the report: a copy that left selected pages behind did not do what it was asked. */
static int copy_status(const struct copy *c)
{
    if (!c->skipped)
        return 0;
    return ctl_fail("%" PRIu64 " of the %u pages selected were not copied (why: see the report)",
                    c->skipped, c->n);
}

/* ---- where the dirs lie ---- */

/* The nearest of path and its ancestors (by name) that exists, into anc (PATH_MAX), and its
 * stat; *exists says whether that is path itself. */
static int nearest_existing(const char *path, char *anc, struct stat *st, bool *exists)
{
    if (strlen(path) >= PATH_MAX)
        return -ENAMETOOLONG;
    strcpy(anc, path);
    *exists = true;
    while (stat(anc, st)) {
        char *slash = strrchr(anc, '/');
        if (errno != ENOENT)
            return -errno;
        *exists = false;
        if (!slash)
            strcpy(anc, ".");
        else if (slash == anc)
            anc[1] = '\0';
        else
            *slash = '\0';
    }
    return 0;
}

static bool same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Whether the dir at path is top or lies below it. Its ancestors are walked by "..", from
 * the dir itself, so symbolic links, ".." in the path and bind mounts are all seen through. */
static bool lies_within(const char *path, const struct stat *top)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), up;
    struct stat st, parent;
    bool within = false;

    for (int depth = 0; fd >= 0 && depth < PATH_MAX && !fstat(fd, &st); depth++) {
        if ((within = same_file(&st, top)))
            break;
        up = openat(fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        close(fd);
        fd = up;
        if (fd < 0 || fstat(fd, &parent) || same_file(&parent, &st))
            break; /* the root: its ".." is itself */
    }
    if (fd >= 0)
        close(fd);
    return within;
}

/* A data dir must not hold another: the target is refused when it is the source, lies inside
 * it (it would be created there) or holds it. 0, or the usage status after saying why. */
static int check_apart(const struct copy *c)
{
    const char *what = NULL;
    char anc[PATH_MAX];
    struct stat s, d;
    bool exists;

    if (stat(c->src, &s) || !S_ISDIR(s.st_mode) || nearest_existing(c->dst, anc, &d, &exists))
        return 0; /* opening them says what is wrong */
    if (exists && same_file(&s, &d))
        what = "the target is the source itself";
    else if (lies_within(anc, &s))
        what = "the target lies inside the source";
    else if (exists && S_ISDIR(d.st_mode) && lies_within(c->src, &d))
        what = "the source lies inside the target";
    if (!what)
        return 0;
    ctl_fail("copying %s into %s: %s: refused (a data dir must not hold another, nor be copied "
             "into itself); give a target outside the source",
             c->src_name, c->dst_name, what);
    return 2;
}

static int copy_dirs(const char *src, const char *dst, const struct ctl_args *a)
{
    struct copy c = {.src = src, .dst = dst};
    struct ctl_index ix;
    struct dstore *s;
    bool *sel = NULL;
    int rc;

    c.src_name = cli_clip(src, CLI_PATH_ECHO_MAX, c.src_clip);
    c.dst_name = cli_clip(dst, CLI_PATH_ECHO_MAX, c.dst_clip);
    if ((rc = check_apart(&c)))
        return rc;
    if (ctl_dir_locked(dst))
        return ctl_open_error(dst, -EBUSY, true);
    if ((rc = ctl_load(src, false, &s, &ix)))
        return rc;
    c.ix = &ix;
    if (!(sel = calloc((size_t)ix.n + 1, 1)) || copy_init(&c))
        rc = ctl_fail("out of memory");
    else if (!(rc = index_select(&ix, a, true, sel))) {
        copy_order(&c, sel);
        if (!(rc = open_target(&c, a->capacity))) {
            if ((rc = copy_all(&c)))
                rc = ctl_fail("copying into %s stopped after %" PRIu64 " of the %u pages "
                              "selected were copied (%" PRIu64 " already there, %" PRIu64
                              " skipped): %s",
                              c.dst_name, c.copied, c.n, c.present, c.skipped, kvt_strerror(rc));
            dstore_close(c.w);
            if (!rc) {
                report(&c, a->json);
                rc = copy_status(&c);
            }
        }
    }
    copy_free(&c);
    free(sel);
    ctl_unload(s, &ix);
    return rc;
}

int cmd_export(const struct ctl_args *a)
{
    return copy_dirs(a->pos[0], a->pos[1], a);
}

int cmd_import(const struct ctl_args *a)
{
    return copy_dirs(a->pos[1], a->pos[0], a);
}
