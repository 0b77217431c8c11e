/*
 * Slab files: slabs/NNNN.slab, each slab_slots slots of slot_bytes, preallocated whole when
 * a write first needs it (so a write never extends a file and cannot meet ENOSPC midway).
 *
 * O_DIRECT is probed on the first slab opened: refused (EINVAL, as tmpfs answers on older
 * kernels), or an alignment from statx that the slot layout or page size cannot meet, and
 * every I/O goes through the page cache instead. A request whose buffer misses the memory
 * alignment uses the buffered descriptor, opened on first need; both see the same file, and
 * the kernel keeps direct and buffered I/O on it coherent.
 */
#include "store_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_ALIGN 4096u
#define MAX_FOUND_SLABS 1000000u /* slabs_found looks no further */

static void slab_name(uint32_t slab, char *buf, size_t len)
{
    snprintf(buf, len, "%04u.slab", slab);
}

/* A name slab_name would give, and so one number per file; the slab's number. */
static bool parse_name(const char *n, uint32_t *slab)
{
    size_t digits = strspn(n, "0123456789");
    char canon[32];

    if (digits < 4 || digits > 9 || strcmp(n + digits, ".slab"))
        return false;
    *slab = (uint32_t)strtoul(n, NULL, 10);
    slab_name(*slab, canon, sizeof(canon));
    return strcmp(canon, n) == 0;
}

/* The alignment statx reports for direct I/O on fd; false when direct I/O is unsupported. */
static bool dio_align(int fd, uint32_t *mem, uint32_t *off)
{
    *mem = *off = DEFAULT_ALIGN;
#ifdef STATX_DIOALIGN
    struct statx sx;

    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (!sx.stx_dio_mem_align || !sx.stx_dio_offset_align)
            return false;
        *mem = sx.stx_dio_mem_align;
        *off = sx.stx_dio_offset_align;
    }
#endif
    return true;
}

/* Decide once, on the first slab, whether O_DIRECT serves this dir. */
static void probe_direct(struct dstore *s, int fd)
{
    uint32_t mem, off;

    if (!dio_align(fd, &mem, &off) || s->slot_bytes % off || s->page_bytes % off)
        s->direct = false;
    s->mem_align = mem;
}

static int open_flags(const struct dstore *s)
{
    return (s->ro ? O_RDONLY : O_RDWR) | O_CLOEXEC;
}

/* Open (or create) one slab's descriptors and learn how many slots it backs. */
static int slab_open(struct dstore *s, uint32_t slab, int create)
{
    struct dslab *d = &s->slabs[slab];
    char name[32];
    struct stat st;
    int fd = -1;

    slab_name(slab, name, sizeof(name));
    if (s->direct) {
        fd = openat(s->slabfd, name, open_flags(s) | O_DIRECT | create, 0600);
        if (fd < 0 && errno == EINVAL)
            s->direct = false;
        else if (fd < 0)
            return -errno;
        else if (!s->mem_align)
            probe_direct(s, fd);
    }
    if (fd >= 0 && s->direct)
        d->dfd = fd;
    else if (fd >= 0)
        close(fd);
    if (d->dfd < 0 && (d->bfd = openat(s->slabfd, name, open_flags(s) | create, 0600)) < 0)
        return -errno;
    if (fstat(d->dfd >= 0 ? d->dfd : d->bfd, &st))
        return -errno;
    d->valid = (uint32_t)((uint64_t)st.st_size / s->slot_bytes < s->slab_slots
                              ? (uint64_t)st.st_size / s->slot_bytes
                              : s->slab_slots);
    return 0;
}

static int scan_slabs(struct dstore *s)
{
    struct dirent *de;
    DIR *d;
    int fd = dup(s->slabfd), rc = 0;
    uint32_t slab;

    if (fd < 0)
        return -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    while (!rc && (de = readdir(d)))
        if (parse_name(de->d_name, &slab) && slab < s->nslabs)
            rc = slab_open(s, slab, 0);
    closedir(d);
    return rc;
}

int slabs_open(struct dstore *s)
{
    s->direct = !(s->o.flags & DSTORE_BUFFERED);
    s->slabfd = openat(s->dirfd, "slabs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->slabfd < 0)
        return errno == ENOENT ? KVT_EFORMAT : -errno;
    s->slabs = calloc(s->nslabs, sizeof(*s->slabs));
    if (!s->slabs)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->nslabs; i++)
        s->slabs[i].dfd = s->slabs[i].bfd = -1;
    return scan_slabs(s);
}

void slabs_close(struct dstore *s)
{
    for (uint32_t i = 0; s->slabs && i < s->nslabs; i++) {
        if (s->slabs[i].dfd >= 0)
            close(s->slabs[i].dfd);
        if (s->slabs[i].bfd >= 0)
            close(s->slabs[i].bfd);
    }
    free(s->slabs);
    s->slabs = NULL;
    if (s->slabfd >= 0)
        close(s->slabfd);
    s->slabfd = -1;
}

int slab_fd_locked(struct dstore *s, uint32_t slab, const void *buf)
{
    struct dslab *d = &s->slabs[slab];
    char name[32];

    if (d->dfd >= 0 && s->direct && (uintptr_t)buf % s->mem_align == 0)
        return d->dfd;
    if (d->bfd < 0) {
        slab_name(slab, name, sizeof(name));
        d->bfd = openat(s->slabfd, name, open_flags(s), 0600);
    }
    return d->bfd;
}

static int fault(struct dstore *s, enum dstore_fault_point pt, uint32_t slab)
{
    const struct dstore_faults *f = s->o.faults;

    return f && f->inject ? f->inject(f->arg, pt, slab, 0) : 0;
}

/* Allocate the whole file; a file system without fallocate gets a sparse one. */
static int preallocate(int fd, uint64_t len)
{
    if (fallocate(fd, 0, 0, (off_t)len) == 0)
        return 0;
    if (errno != EOPNOTSUPP)
        return -errno;
    return ftruncate(fd, (off_t)len) ? -errno : 0;
}

int slab_ready(struct dstore *s, uint32_t slab)
{
    struct dslab *d = &s->slabs[slab];
    bool created = false;
    int fd, rc;

    if (d->valid == s->slab_slots)
        return 0;
    if ((rc = fault(s, DSTORE_FAULT_GROW, slab)))
        return rc;
    pthread_mutex_lock(&s->lock);
    if (d->dfd < 0 && d->bfd < 0) {
        rc = slab_open(s, slab, O_CREAT);
        created = true;
    }
    fd = d->dfd >= 0 ? d->dfd : d->bfd;
    pthread_mutex_unlock(&s->lock);
    if (!rc)
        rc = preallocate(fd, (uint64_t)s->slab_slots * s->slot_bytes);
    /* The new name must outlive a power cut as the records that will point into it. */
    if (!rc && created && fsync(s->slabfd))
        rc = -errno;
    if (rc)
        return rc;
    pthread_mutex_lock(&s->lock);
    d->valid = s->slab_slots;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int slab_sync(struct dstore *s, uint32_t slab)
{
    struct dslab *d = &s->slabs[slab];
    int fd, rc = fault(s, DSTORE_FAULT_SYNC, slab);

    if (rc)
        return rc;
    pthread_mutex_lock(&s->lock);
    fd = d->dfd >= 0 ? d->dfd : d->bfd;
    pthread_mutex_unlock(&s->lock);
    if (fd < 0)
        return -EIO;
    /* Per file, not per descriptor: one call covers writes through either. */
    return fdatasync(fd) ? -errno : 0;
}

int slabs_found(struct dstore *s, uint32_t *count)
{
    struct stat st;
    char name[32];
    int fd = openat(s->dirfd, "slabs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    *count = 0;
    if (fd < 0)
        return errno == ENOENT ? KVT_EFORMAT : -errno;
    /* The store makes slabs in order; counting stops at the first gap, so a stray file with a
     * big number cannot blow the capacity up. */
    for (;; (*count)++) {
        slab_name(*count, name, sizeof(name));
        if (fstatat(fd, name, &st, 0) || !S_ISREG(st.st_mode) || *count == MAX_FOUND_SLABS)
            break;
    }
    close(fd);
    return 0;
}

void slab_refresh(struct dstore *s, uint32_t slab)
{
    char name[32];
    struct stat st;
    uint64_t slots;

    if (!s->ro || slab >= s->nslabs)
        return;
    slab_name(slab, name, sizeof(name));
    if (fstatat(s->slabfd, name, &st, 0))
        return;
    slots = (uint64_t)st.st_size / s->slot_bytes;
    pthread_mutex_lock(&s->lock);
    s->slabs[slab].valid = (uint32_t)(slots < s->slab_slots ? slots : s->slab_slots);
    pthread_mutex_unlock(&s->lock);
}
