/*
 * What is wrong with a data dir's entries, for the tools' messages: an open that fails with a
 * bare errno ("Is a directory", "File exists") says nothing of which file it was about. The
 * names and kinds are docs/formats.md's: lock a regular file; index/, index.new/ and
 * index.damaged/ directories of regular files; slabs/ a directory of NNNN.slab regular files.
 */
#include "datadir.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What an entry of mode m is, as a message says it. */
static const char *kind_of(mode_t m)
{
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISLNK(m))
        return "a symbolic link (kvtier opens none)";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISCHR(m) || S_ISBLK(m))
        return "a device";
    return "a regular file";
}

/* Whether name under dirfd is absent or of the kind wanted (a directory or a regular file);
 * else what it is, with what kvtier keeps there, into buf. */
static bool entry_ok(int dirfd, const char *dir, const char *name, bool want_dir, const char *what,
                     char *buf, size_t len)
{
    struct stat st;

    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW))
        return true;
    if (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))
        return true;
    snprintf(buf, len, "%s/%s is %s, where kvtier keeps %s", dir, name, kind_of(st.st_mode), what);
    return false;
}

/* A slab file's name: digits, then ".slab". */
static bool slab_name(const char *n)
{
    size_t digits = strspn(n, "0123456789");

    return digits >= 4 && !strcmp(n + digits, ".slab");
}

static bool slabs_ok(int dirfd, const char *dir, char *buf, size_t len)
{
    int fd = openat(dirfd, "slabs", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    char name[300];
    struct dirent *de;
    bool ok = true;
    DIR *d;

    if (fd < 0)
        return true;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return true;
    }
    while (ok && (de = readdir(d)))
        if (slab_name(de->d_name)) {
            snprintf(name, sizeof(name), "slabs/%s", de->d_name);
            ok = entry_ok(dirfd, dir, name, false, "a slab file", buf, len);
        }
    closedir(d);
    return ok;
}

const char *cli_dir_problem(const char *dir, const char *shown, char *buf, size_t len)
{
    static const struct {
        const char *name;
        bool dir;
        const char *what;
    } entries[] = {
        {"lock", false, "the lock file a writer holds"},
        {"index", true, "its index (a directory)"},
        {"index/data.mdb", false, "the index's file"},
        {"index/lock.mdb", false, "the index's lock file"},
        {"index.new", true, "an index being made (a directory)"},
        {"index.new/data.mdb", false, "the file of an index being made"},
        {"index.new/lock.mdb", false, "the lock file of an index being made"},
        {"index.damaged", true, "an index set aside (a directory)"},
        {"slabs", true, "its slab files (a directory)"},
    };
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    bool ok = true;

    if (dirfd < 0)
        return NULL; /* the dir itself: the open's own error says it */
    for (size_t i = 0; ok && i < sizeof(entries) / sizeof(entries[0]); i++)
        ok = entry_ok(dirfd, shown, entries[i].name, entries[i].dir, entries[i].what, buf, len);
    if (ok)
        ok = slabs_ok(dirfd, shown, buf, len);
    close(dirfd);
    return ok ? NULL : buf;
}
