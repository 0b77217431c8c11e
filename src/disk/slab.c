/*
 * Slab files: slabs/NNNN.slab, a slab head then slab_slots slots of slot_bytes (layout.h),
 * preallocated whole when a write first needs it (so a write never extends a file and cannot
 * meet ENOSPC midway).
 *
 * Nothing is opened through a symbolic link, and only regular files are used: a FIFO, a
 * device or a link where a slab should be is no slab (its records are out of bounds, misses);
 * a writer that needs the slab replaces the entry with a new file. Opens never block.
 *
 * O_DIRECT is probed on the first slab opened: refused (EINVAL, as tmpfs answers on older
 * kernels), or an alignment from statx that the slot layout or page size cannot meet, and
 * every I/O goes through the page cache instead; so it does for pages below a block, whose
 * slots are a single block (slabs_open). A request whose buffer misses the memory
 * alignment uses the buffered descriptor, opened on first need; both see the same file, and
 * the kernel keeps direct and buffered I/O on it coherent.
 */
#include "store_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
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

/* Whether fd's file lives in memory: tmpfs takes O_DIRECT and copies through its page cache
 * all the same, so a slab there is written as a buffered one (beside the others, async). */
static bool in_memory(int fd)
{
    struct statfs sf;

    return fstatfs(fd, &sf) == 0 && (sf.f_type == TMPFS_MAGIC || sf.f_type == RAMFS_MAGIC);
}

/* Decide once, on the first slab, whether O_DIRECT serves this dir: every slab I/O is whole
 * layout blocks at block offsets, so it does where the device's alignment divides a block. */
static void probe_direct(struct dstore *s, int fd)
{
    uint32_t mem, off;

    if (!dio_align(fd, &mem, &off) || LAYOUT_BLOCK % off || mem > LAYOUT_BLOCK || s->in_memory)
        s->direct = false;
    s->mem_align = mem;
}

static int open_flags(const struct dstore *s)
{
    return (s->ro ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
}

/* openat that accepts a regular file only: -ENOTSUP for anything else (a FIFO
 * is opened without blocking, seen for what it is and closed; a link is never followed). */
static int open_regular(int dirfd, const char *name, int flags)
{
    struct stat st;
    int fd = openat(dirfd, name, flags, 0600);

    if (fd < 0) /* a directory opened for writing answers EISDIR: no regular file either */
        return errno == ELOOP || errno == EISDIR ? -ENOTSUP : -errno;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return -ENOTSUP;
    }
    return fd;
}

static uint32_t valid_slots(const struct dstore *s, uint64_t size)
{
    uint64_t n = layout_slots_in(&s->lay, size);

    return (uint32_t)(n < s->slab_slots ? n : s->slab_slots);
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
        fd = open_regular(s->slabfd, name, open_flags(s) | O_DIRECT | create);
        if (fd == -EINVAL)
            s->direct = false;
        else if (fd < 0)
            return fd;
        else if (!s->mem_align)
            probe_direct(s, fd);
    }
    if (fd >= 0 && s->direct)
        d->dfd = fd;
    else if (fd >= 0)
        close(fd);
    if (d->dfd < 0 && (d->bfd = open_regular(s->slabfd, name, open_flags(s) | create)) < 0) {
        int rc = d->bfd;

        d->bfd = -1;
        return rc;
    }
    if (fstat(d->dfd >= 0 ? d->dfd : d->bfd, &st))
        return -errno;
    d->valid = valid_slots(s, (uint64_t)st.st_size);
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
    /* A name that is no regular file is no slab: its pages are misses. */
    while (!rc && (de = readdir(d)))
        if (parse_name(de->d_name, &slab) && slab < s->nslabs &&
            (rc = slab_open(s, slab, 0)) == -ENOTSUP)
            rc = 0;
    closedir(d);
    return rc;
}

int slabs_open(struct dstore *s)
{
    /* A page below a block has no body: its slot is one block. Direct, each such write is a
     * device I/O of 4 KiB on its batch's path (a profile of 0.8 saw ext4 run them one at a
     * time, in io_uring workers waiting on the file's lock); through the page cache it costs a
     * copy, and the batch's fdatasync (durable) or the flush (relaxed) takes them to the disk in
     * runs. */
    s->direct = !(s->o.flags & DSTORE_BUFFERED) && s->lay.body != 0;
    s->slabfd = openat(s->dirfd, "slabs", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (s->slabfd < 0)
        return errno == ENOENT ? KVT_EFORMAT : -errno;
    s->in_memory = in_memory(s->slabfd);
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

/* The descriptor for an I/O of slab: the O_DIRECT one where the memory allows it. */
static int slab_fd_for_locked(struct dstore *s, uint32_t slab, bool aligned)
{
    struct dslab *d = &s->slabs[slab];
    char name[32];

    if (d->dfd >= 0 && s->direct && aligned)
        return d->dfd;
    if (d->bfd < 0) { /* on first need; a reader's slab may be newer than its open */
        slab_name(slab, name, sizeof(name));
        d->bfd = open_regular(s->slabfd, name, open_flags(s));
        d->bfd = d->bfd < 0 ? -1 : d->bfd;
    }
    return d->bfd;
}

/* mem_align is 0 until a slab is opened direct: never, in a buffered dir, and not yet in a
 * reader that opened before its writer made the first slab (its later slabs are opened
 * buffered on first need). Either way no I/O goes direct. */
static bool buf_aligned(const struct dstore *s, const void *buf)
{
    return s->direct && s->mem_align && (uintptr_t)buf % s->mem_align == 0;
}

int slab_fd_locked(struct dstore *s, uint32_t slab, const void *buf)
{
    return slab_fd_for_locked(s, slab, buf_aligned(s, buf));
}

/* Whether O_DIRECT takes these regions: every address and length on mem_align. */
static bool iov_aligned(const struct dstore *s, const struct iovec *iov, uint32_t n)
{
    if (!s->direct || !s->mem_align)
        return false;
    for (uint32_t i = 0; i < n; i++)
        if ((uintptr_t)iov[i].iov_base % s->mem_align || iov[i].iov_len % s->mem_align)
            return false;
    return true;
}

/* ---- a page's I/O ---- */

static void io_fill(struct dio_req *r, struct dop_page *p, uint64_t off, void *buf, uint32_t len)
{
    memset(r, 0, sizeof(*r));
    r->ctx = p;
    r->buf = buf;
    r->off = off;
    r->len = len;
}

/* Walk bytes [from, from + len) of p's page part by part: fn(ctx, the part's bytes, their
 * offset in the range, how many). */
static void page_walk(const struct dstore *s, const struct dop_page *p, size_t from, size_t len,
                      void (*fn)(void *ctx, uint8_t *at, size_t done, size_t n), void *ctx)
{
    size_t part = p->nparts ? s->page_bytes / p->nparts : s->page_bytes, done = 0;

    while (done < len) {
        size_t k = (from + done) / part, in = (from + done) % part;
        size_t n = part - in < len - done ? part - in : len - done;
        uint8_t *base = p->nparts ? (uint8_t *)p->parts[k] : (uint8_t *)p->buf;

        fn(ctx, base + (p->nparts ? in : from + done), done, n);
        done += n;
    }
}

static void gather_one(void *ctx, uint8_t *at, size_t done, size_t n)
{
    memcpy((uint8_t *)ctx + done, at, n);
}

static void scatter_one(void *ctx, uint8_t *at, size_t done, size_t n)
{
    memcpy(at, (const uint8_t *)ctx + done, n);
}

/* Parts that lie back to back in memory go as one region: fewer segments to pin and describe
 * to the device (the 2,000-request replay's system time 2.2 - 2.8 s -> 1.7 - 1.8 s). */
static void iov_one(void *ctx, uint8_t *at, size_t done, size_t n)
{
    struct dio_req *r = ctx;
    struct iovec *last = r->niov ? &r->iov[r->niov - 1] : NULL;

    (void)done;
    if (last && (uint8_t *)last->iov_base + last->iov_len == at)
        last->iov_len += n;
    else
        r->iov[r->niov++] = (struct iovec){at, n};
}

/* Whether a page's parts are whole: a count that divides the page, and no NULL among them. */
static bool parts_ok(const struct dstore *s, const void *const *parts, uint32_t n)
{
    if (n > DSTORE_MAX_PARTS || s->page_bytes % n || !parts)
        return false;
    for (uint32_t i = 0; i < n; i++)
        if (!parts[i])
            return false;
    return true;
}

bool page_take_bytes(struct dstore *s, struct dop_page *p, void *buf, void *const *parts,
                     uint32_t nparts, struct iovec **iov)
{
    if (nparts) {
        if (!parts_ok(s, (const void *const *)parts, nparts))
            return false;
        p->parts = parts;
        p->nparts = nparts;
        p->iov = *iov;
        *iov += nparts;
        return true;
    }
    p->buf = buf;
    return buf != NULL;
}

void page_gather(const struct dstore *s, const struct dop_page *p, size_t from, size_t len,
                 uint8_t *out)
{
    page_walk(s, p, from, len, gather_one, out);
}

void page_scatter(const struct dstore *s, struct dop_page *p, size_t from, size_t len,
                  const uint8_t *in)
{
    page_walk(s, p, from, len, scatter_one, (void *)in);
}

void page_sum(const struct dstore *s, const struct dop_page *p, uint8_t out[16])
{
    if (p->nparts)
        page_checksum_parts((const void *const *)p->parts, p->nparts, s->page_bytes / p->nparts,
                            out);
    else
        page_checksum(p->buf, s->page_bytes, out);
}

void page_body_step(struct dio_req *r, const void *bytes, size_t n)
{
    struct dop_page *p = r->ctx;

    page_hash_add(p->hash, bytes, n);
}

/* cachestat(2) (Linux 6.5), which Debian 12's headers lack. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct kvt_cachestat_range {
    uint64_t off, len;
};
struct kvt_cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* DSTORE_CACHED: whether the page cache holds the whole slot at off of slab (then its read
 * is a copy from it; else a device read, direct, that leaves nothing cached). A read of the
 * cache alone (RWF_NOWAIT) cannot tell instead: it starts readahead when it misses. A kernel
 * without cachestat (ENOSYS) reads direct, as if nothing were cached; pages evicted between
 * the look and the read are read through the cache, blocking. */
static bool slot_cached_locked(struct dstore *s, uint32_t slab, uint64_t off)
{
    struct kvt_cachestat_range r = {off, s->slot_bytes};
    struct kvt_cachestat cs;
    int fd = s->slabs[slab].dfd >= 0 ? s->slabs[slab].dfd : s->slabs[slab].bfd;

    if (fd < 0 || s->no_cachestat)
        return false;
    if (syscall(__NR_cachestat, fd, &r, &cs, 0)) {
        s->no_cachestat = errno == ENOSYS || errno == EPERM;
        return false;
    }
    return cs.nr_cache * (uint64_t)sysconf(_SC_PAGESIZE) >= s->slot_bytes;
}

/* Reads through the page cache of at least this much go to io_uring's workers too, beside
 * each other (a copy inline in the engine's thread is one at a time); a smaller one costs
 * less than the hand-over. */
#define ASYNC_READ_MIN (256u << 10)

int page_io_prepare(struct dstore *s, struct dop_page *p, uint32_t g, bool write,
                    void (*complete)(struct dio_req *r))
{
    const struct slot_layout *l = &s->lay;
    uint32_t slab = g / s->slab_slots, slot = g % s->slab_slots;
    uint64_t off = layout_slot_off(l, slot);
    bool cached = s->o.flags & DSTORE_CACHED;

    p->nio = 0;
    p->cached = false;
    if (l->body)
        io_fill(&p->io[p->nio++], p, off, p->buf, l->body);
    if (l->body && p->nparts) { /* the body straight from (into) the parts */
        p->io[0].iov = p->iov;
        page_walk(s, p, 0, l->body, iov_one, &p->io[0]);
    }
    if (write || l->tail)
        io_fill(&p->io[p->nio++], p, off + l->body, p->block, l->tail_bytes);
    pthread_mutex_lock(&s->lock);
    if (cached && !write)
        p->cached = slot_cached_locked(s, slab, off);
    for (uint32_t i = 0; i < p->nio; i++) {
        struct dio_req *r = &p->io[i];
        bool aligned = r->niov ? iov_aligned(s, r->iov, r->niov) : buf_aligned(s, r->buf);

        r->fd = slab_fd_for_locked(s, slab, aligned && !(cached && (write || p->cached)));
        r->write = write;
        r->async = r->fd == s->slabs[slab].bfd && (write || r->len >= ASYNC_READ_MIN);
        r->slab = slab;
        r->slot = slot;
        r->complete = complete;
        if (i)
            p->io[i - 1].next = r;
    }
    p->io_left = p->nio;
    pthread_mutex_unlock(&s->lock);
    for (uint32_t i = 0; i < p->nio; i++)
        if (p->io[i].fd < 0)
            return -EIO;
    return 0;
}

struct dop_page *page_io_landed_locked(struct dio_req *r)
{
    struct dop_page *p = r->ctx;

    if (r->res && !p->res)
        p->res = r->res;
    return --p->io_left == 0 ? p : NULL;
}

static int fault(struct dstore *s, enum dstore_fault_point pt, uint32_t slab)
{
    const struct dstore_faults *f = s->o.faults;

    return f && f->inject ? f->inject(f->arg, pt, slab, 0) : 0;
}

/* Allocate the file's bytes [from, to), what a growth adds (from 0 each time, the file system
 * walked every extent already there: a 1 GiB slab grown in 500 steps wrote 15% slower); a
 * file system without fallocate gets a sparse file, and so does tmpfs, whose fallocate
 * allocates the memory under the file's lock, which the writes into the slab then wait for
 * (a write into a hole allocates the same memory; a failed one fails its page). */
static int preallocate(const struct dstore *s, int fd, uint64_t from, uint64_t to)
{
    if (s->in_memory)
        return ftruncate(fd, (off_t)to) ? -errno : 0;
    if (fallocate(fd, 0, (off_t)from, (off_t)(to - from)) == 0)
        return 0;
    if (errno != EOPNOTSUPP)
        return -errno;
    return ftruncate(fd, (off_t)to) ? -errno : 0;
}

/* The slab's head, so that the slab describes itself (recovery reads it). */
static int write_head(struct dstore *s, uint32_t slab, int fd)
{
    struct slab_head h = {
        .version = s->meta.version,
        .slab = slab,
        .page_bytes = s->page_bytes,
        .page_tokens = s->page_tokens,
        .slot_bytes = s->slot_bytes,
        .slab_slots = s->slab_slots,
        .created = s->meta.created,
    };
    void *buf;
    ssize_t n;

    if (posix_memalign(&buf, LAYOUT_BLOCK, SLAB_HEAD_BYTES))
        return -ENOMEM;
    memcpy(h.fingerprint, s->meta.fingerprint, DSTORE_FINGERPRINT_BYTES);
    slab_head_encode(&h, buf);
    n = pwrite(fd, buf, SLAB_HEAD_BYTES, 0);
    free(buf);
    if (n == (ssize_t)SLAB_HEAD_BYTES)
        return 0;
    return n < 0 ? -errno : -EIO;
}

/* Create the slab's file; an entry of that name that is no regular file (a FIFO, a link, a
 * device, an empty directory) is junk in our dir and is replaced; a directory with anything
 * in it is left alone (-ENOTEMPTY), and the pages the slab would hold are not written. */
static int slab_create_locked(struct dstore *s, uint32_t slab)
{
    char name[32];
    int rc = slab_open(s, slab, O_CREAT);

    if (rc != -ENOTSUP)
        return rc;
    slab_name(slab, name, sizeof(name));
    if (unlinkat(s->slabfd, name, 0) && errno != ENOENT &&
        (errno != EISDIR || unlinkat(s->slabfd, name, AT_REMOVEDIR)))
        return -errno;
    return slab_open(s, slab, O_CREAT | O_EXCL);
}

/* Slots of slab within the capacity: slab_slots, fewer for a last slab the capacity cuts. */
static uint32_t slab_capacity(const struct dstore *s, uint32_t slab)
{
    uint64_t first = (uint64_t)slab * s->slab_slots;

    return s->nslots - first < s->slab_slots ? (uint32_t)(s->nslots - first) : s->slab_slots;
}

/* A slab grows by GROW_MIN_BYTES of slots (a stripes'th of it, where slabs grow side by side)
 * or a 64th of what it holds, whichever is more, so that its file follows the data (within
 * 1 MiB, or 1.6% of a large slab) rather than taking the whole slab at the first write: a
 * store of 30 MB of pages took a 1 GiB file. Slots above that step grow one at a time until
 * a 64th is more: a slot past the data was a third more than 3 pages of 8 MiB. */
#define GROW_MIN_BYTES (1u << 20)

/* Slots the slab's file is to back for slot to be written: slot's and the step past it. */
static uint32_t grow_to(const struct dstore *s, uint32_t slab, uint32_t slot)
{
    uint64_t stripes = s->o.stripes > 1 ? s->o.stripes : 1;
    uint64_t valid = s->slabs[slab].valid, step = GROW_MIN_BYTES / stripes / s->slot_bytes;
    uint64_t want = slot + 1 > valid ? slot + 1 : valid, cap = slab_capacity(s, slab);

    step = step > valid / 64 ? step : valid / 64;
    want += step;
    return (uint32_t)(want < cap ? want : cap);
}

int slab_ready(struct dstore *s, uint32_t slab, uint32_t slot)
{
    struct dslab *d = &s->slabs[slab];
    uint32_t cap;
    bool created = false;
    int fd, rc;

    if (slot < d->valid)
        return 0;
    cap = grow_to(s, slab, slot);
    if ((rc = fault(s, DSTORE_FAULT_GROW, slab)))
        return rc;
    pthread_mutex_lock(&s->lock);
    if (d->dfd < 0 && d->bfd < 0) {
        rc = slab_create_locked(s, slab);
        created = true;
    }
    fd = d->dfd >= 0 ? d->dfd : d->bfd;
    pthread_mutex_unlock(&s->lock);
    if (!rc && (created || d->valid == 0))
        rc = write_head(s, slab, d->bfd >= 0 ? d->bfd : fd);
    if (!rc)
        rc = preallocate(s, fd, d->valid ? layout_slot_off(&s->lay, d->valid) : 0,
                         layout_slot_off(&s->lay, cap));
    /* The new name must outlive a power cut as the records that will point into it (its new
     * size goes with the batch's fdatasync, before them). */
    if (!rc && created && fsync(s->slabfd))
        rc = -errno;
    if (rc)
        return rc;
    pthread_mutex_lock(&s->lock);
    d->valid = cap;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* After a capacity was lowered and the records beyond it dropped: the slab files past it go,
 * and the last one is cut to what the capacity keeps of it, so the disk gets its space back.
 * Best effort: what stays is outside the capacity and never read. */
void slabs_trim(struct dstore *s)
{
    uint32_t last = s->nslabs - 1, slab;
    struct dslab *d = &s->slabs[last];
    struct dirent *de;
    int fd = dup(s->slabfd);
    DIR *dir;

    if (fd >= 0 && (dir = fdopendir(fd))) {
        rewinddir(dir); /* a dup shares the position the last scan left */
        while ((de = readdir(dir)))
            if (parse_name(de->d_name, &slab) && slab >= s->nslabs)
                unlinkat(s->slabfd, de->d_name, 0);
        closedir(dir);
    } else if (fd >= 0) {
        close(fd);
    }
    pthread_mutex_lock(&s->lock);
    fd = d->dfd >= 0 ? d->dfd : d->bfd;
    if (fd >= 0 && d->valid > slab_capacity(s, last) &&
        ftruncate(fd, (off_t)layout_slot_off(&s->lay, slab_capacity(s, last))) == 0)
        d->valid = slab_capacity(s, last);
    pthread_mutex_unlock(&s->lock);
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
    if (fdatasync(fd))
        return -errno;
    pthread_mutex_lock(&s->lock);
    s->st.slab_syncs++;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int slabs_found(struct dstore *s, uint32_t *count)
{
    struct stat st;
    char name[32];
    int fd = openat(s->dirfd, "slabs", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);

    *count = 0;
    if (fd < 0)
        return errno == ENOENT ? KVT_EFORMAT : -errno;
    /* The store makes slabs in order; counting stops at the first gap, so a stray file with a
     * big number cannot blow the capacity up. */
    for (;; (*count)++) {
        slab_name(*count, name, sizeof(name));
        if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode) ||
            *count == MAX_FOUND_SLABS)
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
    if (fstatat(s->slabfd, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
        return;
    slots = valid_slots(s, (uint64_t)st.st_size);
    pthread_mutex_lock(&s->lock);
    s->slabs[slab].valid = (uint32_t)slots;
    pthread_mutex_unlock(&s->lock);
}

/* ---- slab heads, for a dir whose index is lost ---- */

static int read_slab_head(int slabfd, const char *name, struct slab_head *h)
{
    uint8_t buf[SLAB_HEAD_USED];
    int fd = open_regular(slabfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), rc;

    if (fd < 0)
        return fd;
    rc = pread(fd, buf, sizeof(buf), 0) == (ssize_t)sizeof(buf)
             ? slab_head_decode(buf, sizeof(buf), h)
             : KVT_ECORRUPT;
    close(fd);
    return rc;
}

/* Whether a slab head describes the dir a meta record does: each carries the dir's meta. */
static bool head_agrees(const struct slab_head *h, const struct dmeta *m)
{
    return h->version == m->version && h->page_bytes == m->page_bytes &&
           h->page_tokens == m->page_tokens && h->slot_bytes == m->slot_bytes &&
           h->slab_slots == m->slab_slots && h->created == m->created &&
           !memcmp(h->fingerprint, m->fingerprint, DSTORE_FINGERPRINT_BYTES);
}

/* The whole slab heads of the dir at data_dirfd: the first one found into *h; with want, on
 * until one agrees with it (*agrees). 0, or KVT_EFORMAT when there is no whole head. */
static int scan_heads(int data_dirfd, const struct dmeta *want, struct slab_head *h, bool *agrees)
{
    int fd = openat(data_dirfd, "slabs", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    bool found = false, done = false;
    struct slab_head one;
    struct dirent *de;
    uint32_t slab;
    DIR *d;

    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR || errno == ELOOP ? KVT_EFORMAT : -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    while (!done && (de = readdir(d))) {
        if (!parse_name(de->d_name, &slab) || read_slab_head(dirfd(d), de->d_name, &one) ||
            one.slab != slab)
            continue;
        if (!found)
            *h = one;
        found = true;
        done = !want || (*agrees = head_agrees(&one, want));
    }
    closedir(d);
    return found ? 0 : KVT_EFORMAT;
}

int slabs_first_head(int data_dirfd, struct slab_head *h)
{
    /* Any slab's head will do: each carries the dir's meta. */
    return scan_heads(data_dirfd, NULL, h, NULL);
}

int slabs_against_meta(int data_dirfd, const struct dmeta *m, struct slab_head *first, bool *agrees)
{
    *agrees = false;
    return scan_heads(data_dirfd, m, first, agrees);
}
