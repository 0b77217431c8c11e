#include "workdir.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "kvtier.h"

#define SPACE_MARGIN (64ull << 20) /* what a check of free space leaves to everything else */

static void fs_name(const char *path, char *out, size_t len)
{
    static const struct {
        unsigned long magic;
        const char *name;
    } known[] = {{0xEF53, "ext4"},      {0x58465342, "xfs"},     {0x9123683E, "btrfs"},
                 {0x01021994, "tmpfs"}, {0x794c7630, "overlay"}, {0x6969, "nfs"},
                 {0x2FC12FC1, "zfs"},   {0xF2F52010, "f2fs"}};
    struct statfs sf;

    snprintf(out, len, "unknown");
    if (statfs(path, &sf))
        return;
    snprintf(out, len, "0x%lx", (unsigned long)sf.f_type);
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if ((unsigned long)sf.f_type == known[i].magic)
            snprintf(out, len, "%s", known[i].name);
}

int workdir_make(struct workdir *w, const char *prog, const char *parent)
{
    int n = snprintf(w->path, sizeof(w->path), "%s/%s.XXXXXX", parent, prog);

    if (n < 0 || (size_t)n >= sizeof(w->path) - WORKDIR_NAME_ROOM) {
        w->path[0] = '\0';
        fprintf(stderr, "%s: --dir: %s\n", prog, kvt_strerror(-ENAMETOOLONG));
        return -1;
    }
    if (!mkdtemp(w->path)) {
        w->path[0] = '\0';
        fprintf(stderr, "%s: cannot make a dir in %s: %s\n", prog, parent, strerror(errno));
        return -1;
    }
    fs_name(w->path, w->fs, sizeof(w->fs));
    return 0;
}

void workdir_path(const struct workdir *w, const char *name, char *out, size_t len)
{
    int n = snprintf(out, len, "%s/%s", w->path, name);

    if (n < 0 || (size_t)n >= len)
        abort();
}

static uint64_t free_bytes(const char *path)
{
    struct statvfs sv;

    return statvfs(path, &sv) ? 0 : (uint64_t)sv.f_bavail * sv.f_frsize;
}

int workdir_check_space(const struct workdir *w, const char *prog, uint64_t need, const char *hint)
{
    uint64_t have = free_bytes(w->path);

    if (have >= need + SPACE_MARGIN)
        return 0;
    fprintf(stderr, "%s: this needs %.2f GiB free in %s and %.2f GiB are: %s\n", prog,
            (double)(need + SPACE_MARGIN) / (1ull << 30), w->path, (double)have / (1ull << 30),
            hint);
    return -1;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) ? -1 : 0;
}

void workdir_rm_tree(const char *path)
{
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int drop_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    int fd;

    (void)st;
    (void)ftw;
    if (flag != FTW_F || (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return 0;
}

void workdir_drop_cache(const char *path)
{
    nftw(path, drop_one, 16, FTW_PHYS);
}

void workdir_quiesce(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    if (fd < 0)
        return;
    syncfs(fd);
    close(fd);
}
