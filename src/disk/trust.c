/*
 * Whether the index may be handed to LMDB. LMDB maps its file and follows the page numbers
 * and offsets it finds there: a damaged B-tree (a truncated file, a garbled branch page, junk
 * in a meta page) takes the process down with SIGSEGV, SIGBUS or an assertion. So before this
 * process opens an index it did not close itself, a child process opens it and reads all of
 * it (every page of every database, the free list, every key looked up again): a crash costs
 * the child. The child reads a snapshot like any reader (a writer beside it in another process
 * cannot pull pages from under it). The verdict comes back through a pipe, so an application
 * that reaps every child itself cannot hide it.
 *
 * An index the writer closed cleanly carries a stamp (index/clean): the file's identity, size
 * and times, and a digest of its meta pages, as they were after the last commit. A stamp that
 * still matches the file means nobody wrote it since, and the walk is skipped: a clean restart
 * opens at once. Any write changes the times and every commit the meta pages.
 *
 * The child first checks the file's structure as bytes (lmdb_check.c: what LMDB's writes
 * assume of every page, which reading alone would not show), then opens it with LMDB and
 * reads it through: every record, every key searched for again.
 */
#include "trust.h"
#include "le.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <lmdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "disk/index.h"
#include "disk/lmdb_check.h"

#define STAMP_NAME "index/clean"
#define STAMP_TMP "index/clean.new"
#define STAMP_MAGIC "KVTCLEAN"
#define STAMP_BYTES 64
#define META_SPAN 8192u     /* LMDB's two meta pages (4 KiB pages) */
#define PROBE_BASE_MS 30000 /* the child's time, plus PROBE_MS_PER_GIB per GiB of index */
#define PROBE_MS_PER_GIB 60000
#define DBS 3
#define NO_VERDICT INT_MIN /* neither an errno (> 0) nor an LMDB code (< 0) */

static const char *const db_names[DBS] = {"meta", "pages", "slots"};

/* ---- the files ---- */

static bool regular_at(int dirfd, const char *name, struct stat *st)
{
    return fstatat(dirfd, name, st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st->st_mode);
}

/* index/ a real dir, data.mdb a regular file holding at least its meta pages, lock.mdb a
 * regular file or absent (LMDB makes it). Nothing here is a link. */
int index_files_ok(int dirfd)
{
    struct stat st;

    if (fstatat(dirfd, "index", &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
        return KVT_ECORRUPT;
    if (!regular_at(dirfd, "index/data.mdb", &st) || (uint64_t)st.st_size < META_SPAN)
        return KVT_ECORRUPT;
    if (fstatat(dirfd, "index/lock.mdb", &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
        return KVT_ECORRUPT;
    return 0;
}

/* ---- the clean stamp ---- */

static uint64_t ns_of(struct timespec t)
{
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* What a stamp records of data.mdb now: 0 and out filled, or -errno. */
static int stamp_of_file(int dirfd, uint8_t out[STAMP_BYTES])
{
    struct stat st;
    uint8_t meta[META_SPAN];
    int fd = openat(dirfd, "index/data.mdb", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    int rc = 0;

    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode))
        rc = -EINVAL;
    else if (pread(fd, meta, sizeof(meta), 0) != (ssize_t)sizeof(meta))
        rc = -EIO;
    close(fd);
    if (rc)
        return rc;
    memset(out, 0, STAMP_BYTES);
    memcpy(out, STAMP_MAGIC, 8);
    put64(out + 8, (uint64_t)st.st_dev);
    put64(out + 16, (uint64_t)st.st_ino);
    put64(out + 24, (uint64_t)st.st_size);
    put64(out + 32, ns_of(st.st_mtim));
    put64(out + 40, ns_of(st.st_ctim));
    put64(out + 48, XXH3_64bits(meta, sizeof(meta)));
    put64(out + 56, XXH3_64bits(out, 56));
    return 0;
}

static bool stamp_matches(int dirfd)
{
    uint8_t want[STAMP_BYTES], got[STAMP_BYTES + 1];
    int fd = openat(dirfd, STAMP_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    ssize_t n;

    if (fd < 0)
        return false;
    n = read(fd, got, sizeof(got));
    close(fd);
    return n == STAMP_BYTES && stamp_of_file(dirfd, want) == 0 &&
           memcmp(want, got, STAMP_BYTES) == 0;
}

void index_stamp_clean(int dirfd)
{
    uint8_t buf[STAMP_BYTES];
    int fd;

    if (stamp_of_file(dirfd, buf))
        return;
    fd = openat(dirfd, STAMP_TMP, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return;
    /* A stamp lost to a crash only costs the next open a walk. */
    if (write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf) && close(fd) == 0)
        renameat(dirfd, STAMP_TMP, dirfd, STAMP_NAME);
    else
        close(fd);
}

void index_stamp_remove(int dirfd)
{
    unlinkat(dirfd, STAMP_NAME, 0);
}

int index_stamp_revoke(int dirfd)
{
    int fd, rc = 0;

    if (unlinkat(dirfd, STAMP_NAME, 0) && errno != ENOENT)
        return -errno;
    /* Even when there was none now: an earlier removal may not have reached the disk. */
    fd = openat(dirfd, "index", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    if (fsync(fd))
        rc = -errno;
    close(fd);
    return rc;
}

/* ---- the walk, in the child ---- */

/* Every byte of a record is read; every key is found again by a search from the root, which
 * goes through the branch pages the cursor's descent skipped. */
static int walk_db(MDB_txn *txn, MDB_dbi dbi, uint64_t *sink)
{
    MDB_cursor *c;
    MDB_val k, v, again;
    MDB_stat ms;
    uint64_t n = 0;
    int rc = mdb_cursor_open(txn, dbi, &c);

    if (rc)
        return rc;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        *sink ^= XXH3_64bits(k.mv_data, k.mv_size) ^ XXH3_64bits(v.mv_data, v.mv_size);
        if ((rc = mdb_get(txn, dbi, &k, &again)))
            break;
        if (again.mv_data != v.mv_data || again.mv_size != v.mv_size) {
            rc = MDB_CORRUPTED;
            break;
        }
        n++;
    }
    mdb_cursor_close(c);
    if (rc != MDB_NOTFOUND)
        return rc;
    if ((rc = mdb_stat(txn, dbi, &ms)))
        return rc;
    return ms.ms_entries == n ? 0 : MDB_CORRUPTED;
}

/* The free list: each value a count and that many page numbers, every one a page the file
 * holds and not a meta page. A bad one would be handed to a writer as free. */
static int walk_free(MDB_txn *txn, size_t next_pgno)
{
    MDB_cursor *c;
    MDB_val k, v;
    int rc = mdb_cursor_open(txn, 0, &c);

    if (rc)
        return rc;
    for (rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); !rc; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        const size_t *ids = v.mv_data;
        size_t n;

        if (v.mv_size < sizeof(size_t) || v.mv_size % sizeof(size_t))
            return MDB_CORRUPTED;
        memcpy(&n, ids, sizeof(n));
        if (n != v.mv_size / sizeof(size_t) - 1)
            return MDB_CORRUPTED;
        for (size_t i = 1; i <= n; i++) {
            size_t id;

            memcpy(&id, ids + i, sizeof(id));
            if (id < 2 || id >= next_pgno)
                return MDB_CORRUPTED;
        }
    }
    mdb_cursor_close(c);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static int walk_all(MDB_env *env)
{
    MDB_envinfo info;
    MDB_txn *txn;
    MDB_dbi dbi;
    uint64_t sink = 0;
    int rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);

    if (rc)
        return rc;
    if (!(rc = mdb_env_info(env, &info)))
        rc = walk_free(txn, info.me_last_pgno + 1);
    /* The main database (the names) first; databases a newer format may add are not ours to
     * open, and a missing one of ours is for the open to report. */
    if (!rc && !(rc = mdb_dbi_open(txn, NULL, 0, &dbi)))
        rc = walk_db(txn, dbi, &sink);
    for (int i = 0; i < DBS && !rc; i++) {
        rc = mdb_dbi_open(txn, db_names[i], i == 2 ? MDB_INTEGERKEY : 0, &dbi);
        if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
            rc = 0;
        else if (!rc)
            rc = walk_db(txn, dbi, &sink);
    }
    mdb_txn_abort(txn);
    return rc;
}

/* A map for the file as found: the file and room beyond it. LMDB grows it to the pages its
 * meta names, so a meta claiming more than that cannot be mapped; that the system could map
 * this much is checked first, so an open that then fails for want of memory is the meta's
 * fault, not the system's. 0, or ENOMEM when the system cannot. */
static int probe_map(const char *path, size_t *bytes)
{
    char data[4096];
    struct stat st;
    void *p;

    snprintf(data, sizeof(data), "%s/data.mdb", path);
    if (stat(data, &st))
        return errno;
    *bytes = (size_t)st.st_size + (1ull << 30);
    p = mmap(NULL, *bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return ENOMEM;
    munmap(p, *bytes);
    return 0;
}

/* The file's structure, read as bytes before LMDB sees it (lmdb_check.h). */
static int check_structure(const char *path)
{
    char data[4096];
    struct stat st;
    void *map;
    int fd, rc;

    snprintf(data, sizeof(data), "%s/data.mdb", path);
    if ((fd = open(data, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)) < 0)
        return errno;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        close(fd);
        return MDB_CORRUPTED;
    }
    map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return ENOMEM;
    rc = lmdb_check(map, (size_t)st.st_size);
    munmap(map, (size_t)st.st_size);
    return rc == -ENOMEM ? ENOMEM : rc ? MDB_CORRUPTED : 0;
}

/* The child's verdict: 0, or an LMDB or errno code. */
static int probe_child(const char *path)
{
    MDB_env *env;
    size_t map;
    int rc = check_structure(path);

    if (rc || (rc = probe_map(path, &map)) || (rc = mdb_env_create(&env)))
        return rc;
    rc = mdb_env_set_maxdbs(env, DBS);
    if (!rc)
        rc = mdb_env_set_mapsize(env, map);
    if (!rc)
        rc = mdb_env_open(env, path, MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD, 0600);
    if (rc == ENOMEM)
        rc = MDB_CORRUPTED; /* probe_map showed the system can map what the file holds */
    if (!rc)
        rc = walk_all(env);
    mdb_env_close(env);
    return rc;
}

/* ---- the walk, from the parent ---- */

static void child_main(const char *path, int out)
{
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC), rc;

    /* The application's handlers (a crash reporter, a runtime's) must not catch a crash
     * here and carry on as the application: a crash ends the child, and that is the answer. */
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
        signal(fatal[i], SIG_DFL);
    if (devnull >= 0)
        dup2(devnull, STDERR_FILENO); /* LMDB's assertions, a sanitizer's report */
    rc = probe_child(path);
    if (write(out, &rc, sizeof(rc)) != (ssize_t)sizeof(rc))
        _exit(1);
    _exit(0);
}

/* The child's code, or NO_VERDICT when it died or ran out of time. */
static int await_verdict(pid_t pid, int in, int timeout_ms)
{
    struct pollfd p = {.fd = in, .events = POLLIN};
    int verdict = NO_VERDICT, status, n;

    do
        n = poll(&p, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    if (n > 0 && read(in, &verdict, sizeof(verdict)) != (ssize_t)sizeof(verdict))
        verdict = NO_VERDICT;
    if (n <= 0)
        kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return verdict;
}

static int probe_timeout_ms(int dirfd)
{
    struct stat st;
    uint64_t gib = 0;

    if (fstatat(dirfd, "index/data.mdb", &st, AT_SYMLINK_NOFOLLOW) == 0)
        gib = (uint64_t)st.st_size >> 30;
    return (int)(PROBE_BASE_MS + (gib < 30 ? gib : 30) * PROBE_MS_PER_GIB);
}

static int verdict_to_rc(int v)
{
    switch (v) {
    case 0:
        return 0;
    case ENOMEM:
    case EACCES:
    case EPERM:
    case EMFILE:
    case ENFILE:
        return -v; /* the system's refusal, not the file's damage */
    default:
        return KVT_ECORRUPT;
    }
}

int index_probe(int dirfd, const char *path)
{
    int pipefd[2], rc;
    pid_t pid;

    if (pipe2(pipefd, O_CLOEXEC))
        return -errno;
    pid = fork();
    if (pid == 0) {
        close(pipefd[0]);
        child_main(path, pipefd[1]);
    }
    close(pipefd[1]);
    rc = pid < 0 ? -errno : verdict_to_rc(await_verdict(pid, pipefd[0], probe_timeout_ms(dirfd)));
    close(pipefd[0]);
    return rc;
}

int index_trust(int dirfd, const char *path, bool *walked)
{
    int rc = index_files_ok(dirfd);

    *walked = false;
    if (rc || stamp_matches(dirfd))
        return rc;
    *walked = true;
    return index_probe(dirfd, path);
}
