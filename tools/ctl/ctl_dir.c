/*
 * Opening a data dir for the offline commands, and recover.
 *
 * Read-only commands open the dir read-only; a damaged index (the store checks one that was
 * not stamped clean in a child process first) is then refused with KVT_ECORRUPT, and they say
 * what is wrong and what to do. Commands that write open the dir as an engine does, and the
 * store sets a damaged index aside (index.damaged) and rebuilds it from the page heads in the
 * slabs; they say so. recover forces that rebuild (DSTORE_RECOVER).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"
#include "datadir.h"
#include "disk/index.h"

#define LMDB_PAGE 4096 /* the page size of the index's LMDB file (the host's, on x86-64) */
#define RETRIES 20     /* tries of a call whose snapshot could not be taken: about 1 s */

/* Only a regular file opened through no link can be the lock a writer holds: a FIFO would
 * block the open, and a link would test some other file's lock. */
bool ctl_dir_locked(const char *dir)
{
    char path[4096];
    struct stat st;
    int fd;
    bool locked;

    snprintf(path, sizeof(path), "%s/lock", dir);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0)
        return false;
    locked = !fstat(fd, &st) && S_ISREG(st.st_mode) && flock(fd, LOCK_SH | LOCK_NB) != 0 &&
             errno == EWOULDBLOCK;
    close(fd); /* releases the shared lock at once */
    return locked;
}

bool ctl_retry(int rc, int *tries)
{
    struct timespec pause = {0, 1000000L << (*tries < 6 ? *tries : 6)};

    if (rc != -EAGAIN || *tries >= RETRIES)
        return false;
    ++*tries;
    nanosleep(&pause, NULL);
    return true;
}

/* ---- why a dir could not be opened ---- */

/* KVT_EFORMAT says "not ours, or another format": tell which from the index as the store's
 * open judged it (index_verdict). Only an intact meta record names a format; a damaged index
 * is refused as not ours only when no slab there has a head of this format. name is dir as
 * messages show it. */
static int format_error(const char *dir, const char *name)
{
    enum index_verdict verdict;
    uint32_t version = 0;
    int rc = dstore_examine_index(dir, &verdict, &version);

    if (rc == KVT_EFORMAT)
        return ctl_fail("%s: not a kvtier data dir (it has no index/data.mdb)", name);
    if (rc)
        return ctl_fail("%s: %s/index/data.mdb could not be read: %s", name, name,
                        kvt_strerror(rc));
    if (verdict == INDEX_OTHER && version > DSTORE_FORMAT_VERSION)
        return ctl_fail("%s: data format version %u is newer than this kvtier-ctl reads (%u); "
                        "use the kvtier that wrote it",
                        name, version, DSTORE_FORMAT_VERSION);
    if (verdict == INDEX_OTHER && version == 1)
        return ctl_fail("%s: data format version 1, written by kvtier before 0.2, which this "
                        "version (format %u) does not read; the dir is a cache: remove it and "
                        "the engine starts a new one (or read it with the kvtier that wrote it)",
                        name, DSTORE_FORMAT_VERSION);
    if (verdict == INDEX_OTHER)
        return ctl_fail("%s: data format version %u, which this kvtier-ctl (format %u) does "
                        "not read",
                        name, version, DSTORE_FORMAT_VERSION);
    if (verdict == INDEX_UNSOUND || verdict == INDEX_BAD_RECORD)
        return ctl_fail("%s: %s/index/data.mdb is damaged, and no slab file there has a head of "
                        "data format %u to rebuild it from: not a usable data dir; it is a "
                        "cache: remove it",
                        name, name, DSTORE_FORMAT_VERSION);
    if (verdict == INDEX_OURS)
        return ctl_fail("%s: not a usable kvtier data dir (format %u, but slabs/ is missing or "
                        "holds slabs of another format)",
                        name, DSTORE_FORMAT_VERSION);
    return ctl_fail("%s: %s/index/data.mdb is not a kvtier index (another program's LMDB "
                    "environment, or one that lost kvtier's databases), and no slab file there "
                    "has a head of data format %u to rebuild it from",
                    name, name, DSTORE_FORMAT_VERSION);
}

/* What a meta record or slab head says of its dir, for a message: "pages of N tokens, SIZE,
 * fingerprint HEX, created TIME". */
static void dir_id_text(const struct dstore_dir_id *id, char *buf, size_t len)
{
    char fp[2 * DSTORE_FINGERPRINT_BYTES + 1], b[32];
    time_t sec = (time_t)(id->created_ns / 1000000000ull);
    struct tm tm;

    ctl_hex(id->fingerprint, DSTORE_FINGERPRINT_BYTES, fp);
    fp[SHORT_HEX] = '\0';
    gmtime_r(&sec, &tm);
    snprintf(buf, len, "pages of %u tokens, %s; fingerprint %s...; created ", id->page_tokens,
             ctl_bytes(id->page_bytes, b), fp);
    strftime(buf + strlen(buf), len - strlen(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Whether dir's index is another dir's (its meta record agrees with no slab head): what each
 * says, into buf. */
static bool foreign_detail(const char *dir, char *buf, size_t len)
{
    struct dstore_dir_id ix, slabs;
    char a[160], b[160];

    if (dstore_index_foreign(dir, &ix, &slabs) != 1)
        return false;
    dir_id_text(&ix, a, sizeof(a));
    dir_id_text(&slabs, b, sizeof(b));
    snprintf(buf, len,
             "it is another dir's index: its meta record names %s, and no slab file here "
             "agrees (they hold %s)",
             a, b);
    return true;
}

/* What is wrong with dir's index, which the store found damaged (KVT_ECORRUPT), as its file
 * shows it, into buf. */
static void damage_detail(const char *dir, char *buf, size_t len)
{
    enum index_verdict verdict = INDEX_UNSOUND;
    char path[4096];
    struct stat st;
    uint32_t version;

    snprintf(path, sizeof(path), "%s/index/data.mdb", dir);
    if (lstat(path, &st))
        snprintf(buf, len, "it is missing");
    else if (!S_ISREG(st.st_mode))
        snprintf(buf, len, "it is not a regular file");
    else if (st.st_size < 2 * LMDB_PAGE || st.st_size % LMDB_PAGE)
        snprintf(buf, len, "%lld bytes: not whole LMDB pages, cut short", (long long)st.st_size);
    else if (dstore_examine_index(dir, &verdict, &version) || verdict == INDEX_UNSOUND)
        snprintf(buf, len, "its LMDB structure failed the check kvtier runs on it");
    else if (verdict == INDEX_UNNAMED)
        snprintf(buf, len, "kvtier's databases or its meta record are missing from it");
    else if (verdict == INDEX_OURS && foreign_detail(dir, buf, len))
        return;
    else
        snprintf(buf, len, "its meta record fails its checks");
}

static int damage_error(const char *dir, const char *name)
{
    char what[512];
    const char *is;

    damage_detail(dir, what, sizeof(what));
    is = !strcmp(what, "it is missing")                             ? "lost"
         : !strncmp(what, "it is another", strlen("it is another")) ? "not this dir's"
                                                                    : "damaged";
    return ctl_fail("%s: %s/index/data.mdb is %s (%s); the pages are in %s/slabs, each with a "
                    "head that names it: run `" PROG " recover %s` to rebuild the index from "
                    "them (an engine opening the dir does the same)",
                    name, name, is, what, name, name);
}

int ctl_open_error(const char *path, int rc, bool writing)
{
    char clip[CLI_PATH_ECHO_MAX + 4], entry[2 * CLI_PATH_ECHO_MAX + 128];
    const char *dir = cli_clip(path, CLI_PATH_ECHO_MAX, clip);

    /* A bare errno about a file in the dir: which one, when one is of the wrong kind. */
    if (rc > -4096 && rc != -EBUSY && cli_dir_problem(path, dir, entry, sizeof(entry)))
        return ctl_fail("%s: cannot open: %s (%s): remove it", dir, entry, kvt_strerror(rc));
    switch (rc) {
    case KVT_EFORMAT:
        return format_error(path, dir);
    case KVT_ECORRUPT:
        return damage_error(path, dir);
    case -EBUSY:
        return ctl_fail("%s: locked: another process (a running engine?) has it open for "
                        "writing; stop it to %s, or use a read-only command (stat, ls, show, "
                        "tree, verify, export from it), which work beside it",
                        dir, writing ? "write" : "use it");
    case -ENOENT:
        return ctl_fail("%s: no such data dir", dir);
    case -ENOTDIR:
        return ctl_fail("%s: not a directory", dir);
    default:
        return ctl_fail("%s: cannot open: %s", dir, kvt_strerror(rc));
    }
}

/* ---- opening ---- */

static int open_store(const char *dir, uint32_t flags, uint64_t disk_bytes, struct dstore **out)
{
    struct dstore_options o;

    dstore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.flags = DSTORE_AS_FOUND | flags;
    o.disk_bytes = disk_bytes;
    o.page_bytes = 0;
    return dstore_open(&o, out);
}

/* Whether dir has an index (of any kind) now: what a rebuild would set aside. */
static bool has_index(const char *dir)
{
    char path[4096];
    struct stat st;

    snprintf(path, sizeof(path), "%s/index", dir);
    return lstat(path, &st) == 0;
}

void ctl_note_rebuilt(const char *dir, struct dstore *s, bool had_index)
{
    char clip[CLI_PATH_ECHO_MAX + 4];
    const char *name = cli_clip(dir, CLI_PATH_ECHO_MAX, clip);
    struct dstore_stats st;

    dstore_stats(s, &st);
    if (!st.index_rebuilt)
        return;
    if (had_index && st.index_foreign)
        fprintf(stderr,
                PROG ": note: %s: the index was another dir's (its meta record agreed with no "
                     "slab file's head): set aside as %s/index.damaged and rebuilt from the "
                     "slabs with %" PRIu64 " pages\n",
                name, name, st.recovered);
    else if (had_index)
        fprintf(stderr,
                PROG ": note: %s: the index was damaged: set aside as %s/index.damaged and "
                     "rebuilt from the slabs with %" PRIu64 " pages\n",
                name, name, st.recovered);
    else
        fprintf(stderr,
                PROG ": note: %s: the index was missing: rebuilt from the slabs with %" PRIu64
                     " pages\n",
                name, st.recovered);
}

int ctl_open_rw(const char *dir, uint64_t disk_bytes, struct dstore **out)
{
    bool had_index = has_index(dir);
    int rc = open_store(dir, 0, disk_bytes, out);

    if (rc)
        return ctl_open_error(dir, rc, true);
    if ((rc = dstore_wait_ready(*out))) {
        dstore_close(*out);
        return ctl_fail("%s: the index could not be scanned for writing: %s", dir,
                        kvt_strerror(rc));
    }
    ctl_note_rebuilt(dir, *out, had_index);
    return 0;
}

int ctl_open_ro(const char *dir, bool heal, struct dstore **out)
{
    struct dstore *w;
    int rc = open_store(dir, DSTORE_READONLY, 0, out);

    if (rc == KVT_ECORRUPT && heal) {
        if ((rc = ctl_open_rw(dir, 0, &w)))
            return rc;
        dstore_close(w);
        rc = open_store(dir, DSTORE_READONLY, 0, out);
    }
    return rc ? ctl_open_error(dir, rc, false) : 0;
}

/* ---- recover ---- */

/* Open dir for writing with the index set aside and rebuilt from the slabs, and wait until the
 * rebuild has committed: its figures into *st. 0, or an exit status after saying why. */
static int rebuild_index(const char *dir, struct dstore_stats *st)
{
    struct dstore *s;
    int rc = open_store(dir, DSTORE_RECOVER, 0, &s);

    if (rc)
        return ctl_open_error(dir, rc, true);
    if ((rc = dstore_wait_ready(s)))
        rc = ctl_fail("%s: rebuilding the index: %s", dir, kvt_strerror(rc));
    else
        dstore_stats(s, st);
    dstore_close(s);
    return rc;
}

static void recover_json(const char *dir, const struct dstore_stats *st, bool had_index)
{
    char aside[4096 + 16];

    snprintf(aside, sizeof(aside), "%s/index.damaged", dir);
    printf("{\"dir\":");
    cli_json_string(dir);
    printf(",\"slots_scanned\":%" PRIu64 ",\"pages_recovered\":%" PRIu64 ",\"pages\":%" PRIu64
           ",\"index_errors\":%" PRIu64 ",\"set_aside\":",
           st->recover_scanned, st->recovered, st->pages, st->err_index);
    if (had_index)
        cli_json_string(aside);
    else
        printf("null");
    printf("}\n");
}

static void recover_text(const char *dir, const struct dstore_stats *st, bool had_index)
{
    printf("%s: %" PRIu64 " slots scanned, %" PRIu64 " pages recovered from their heads; the "
           "index holds %" PRIu64 " pages\n",
           dir, st->recover_scanned, st->recovered, st->pages);
    if (had_index)
        printf("the old index was set aside as %s/index.damaged (kept for inspection only; the "
               "next recovery replaces it)\n",
               dir);
    else
        printf("there was no index to set aside\n");
}

int cmd_recover(const struct ctl_args *a)
{
    const char *dir = a->pos[0];
    char clip[CLI_PATH_ECHO_MAX + 4];
    const char *name = cli_clip(dir, CLI_PATH_ECHO_MAX, clip);
    struct dstore_stats st;
    bool had_index = has_index(dir);
    int rc;

    if (ctl_dir_locked(dir))
        return ctl_fail("%s: locked: a running engine has the dir open; stop it first (an "
                        "engine's own open already rebuilds a damaged index)",
                        name);
    if ((rc = rebuild_index(dir, &st)))
        return rc;
    if (a->json)
        recover_json(dir, &st, had_index);
    else
        recover_text(dir, &st, had_index);
    if (st.err_index)
        return ctl_fail("%s: the rebuild met %" PRIu64 " index errors: pages it could not put "
                        "back are missing; verify, then recover again",
                        name, st.err_index);
    return 0;
}
