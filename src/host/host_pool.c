/*
 * The host pool is one anonymous mapping sized at open. It is refused up front when it
 * cannot fit: a pool that overcommits would be killed by the OOM killer (or its cgroup's)
 * in the middle of serving instead of failing at open.
 *
 * The page allocator is a stack: a fresh pool hands out pages 0, 1, 2, ... so that the
 * pages of one request form runs the transfer engine can move in one copy; freed pages are
 * reused first, in the order they were given back, so a run freed together comes back whole.
 */
#include "host_pool.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device/kv_pool.h"

/* ---- memory available ---- */

/* Overridable so the walk can be tried on a made-up hierarchy. */
#ifndef CGROUP_V2_MOUNT
#define CGROUP_V2_MOUNT "/sys/fs/cgroup"
#endif
#ifndef CGROUP_V1_MOUNT
#define CGROUP_V1_MOUNT "/sys/fs/cgroup/memory"
#endif

/* The first line of a small file, newline stripped. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "re");
    int rc = 0;

    if (!f)
        return -ENOENT;
    buf[0] = '\0';
    if (!fgets(buf, (int)len, f))
        rc = -EIO;
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
    return rc;
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;

    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || errno)
        return -EINVAL;
    *v = x;
    return 0;
}

/* A cgroup counter, "no limit" read as UINT64_MAX: v2 writes it "max", v1 as LONG_MAX
 * rounded down to a page, so anything from 2^62 (4 EiB) on is taken as no limit. */
static int read_counter(const char *path, uint64_t *v)
{
    char buf[64];
    int rc = read_line(path, buf, sizeof(buf));

    if (rc)
        return rc;
    if (strcmp(buf, "max") == 0) {
        *v = UINT64_MAX;
        return 0;
    }
    if ((rc = parse_u64(buf, v)))
        return rc;
    if (*v >= UINT64_C(1) << 62)
        *v = UINT64_MAX;
    return 0;
}

/* The number after key in a "key value" file (/proc/meminfo, memory.stat); key includes its
 * separator so that "inactive_file " does not match "total_inactive_file". */
static int read_keyed(const char *path, const char *key, uint64_t *v)
{
    FILE *f = fopen(path, "re");
    char line[256];
    size_t klen = strlen(key);
    int rc = -ENOENT;

    if (!f)
        return -ENOENT;
    while (rc == -ENOENT && fgets(line, sizeof(line), f))
        if (strncmp(line, key, klen) == 0)
            rc = parse_u64(line + klen, v);
    fclose(f);
    return rc;
}

/* a then b into path; a truncated path would name another file. */
static int join(char *path, const char *a, const char *b)
{
    int n = snprintf(path, PATH_MAX, "%s%s", a, b);

    return n >= 0 && n < PATH_MAX ? 0 : -ENAMETOOLONG;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* Room left under the limit of the cgroup in dir. Usage counts the cgroup's page cache; its
 * inactive file pages are reclaimed before the cgroup goes out of memory, so like
 * MemAvailable (and the kubelet's working set) they count as room. */
static int cgroup_room(const char *dir, const char *const names[3], uint64_t *room)
{
    char path[PATH_MAX];
    uint64_t limit, usage, inactive = 0;

    if (join(path, dir, names[0]) || read_counter(path, &limit) || limit == UINT64_MAX)
        return -ENOENT;
    if (join(path, dir, names[1]) || read_counter(path, &usage))
        return -ENOENT;
    if (join(path, dir, "/memory.stat") == 0) /* optional: without it usage counts whole */
        read_keyed(path, names[2], &inactive);
    usage -= min_u64(inactive, usage);
    *room = limit > usage ? limit - usage : 0;
    return 0;
}

/* Whether the comma-separated list holds tok. */
static int has_token(const char *list, const char *tok)
{
    size_t n = strlen(tok);

    for (const char *p = list; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, tok, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

/* The path of this process's cgroup in the hierarchy holding controller ("" for v2), from
 * /proc/self/cgroup lines "id:controllers:path"; "/" when not found. */
static void own_cgroup(const char *controller, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    char line[PATH_MAX + 256];

    snprintf(out, len, "/");
    while (f && fgets(line, sizeof(line), f)) {
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        if (!path)
            continue;
        *path++ = '\0';
        ctl++;
        path[strcspn(path, "\n")] = '\0';
        int match = *controller ? has_token(ctl, controller) : *ctl == '\0';
        if (match && *path == '/') {
            snprintf(out, len, "%s", path);
            break;
        }
    }
    if (f)
        fclose(f);
}

/* Every ancestor's limit applies, and inside a container without a cgroup namespace the
 * process's path does not exist under the mount, which is the container's own cgroup: walk
 * from the process's cgroup up to the mount, capping *avail with each limit found. */
static int cgroup_cap(const char *mount, const char *controller, const char *const names[3],
                      uint64_t *avail)
{
    char rel[PATH_MAX], dir[PATH_MAX];
    uint64_t room;
    int found = -ENOENT;

    own_cgroup(controller, rel, sizeof(rel));
    for (;;) {
        if (join(dir, mount, rel) == 0 && cgroup_room(dir, names, &room) == 0) {
            *avail = min_u64(*avail, room);
            found = 0;
        }
        if (strcmp(rel, "/") == 0)
            break;
        char *slash = strrchr(rel, '/'); /* rel starts with '/' */
        slash[slash == rel] = '\0';
    }
    return found;
}

/* Like host_memory_available, but telling "none left" (0 bytes, 0 returned) from
 * "unknown" (-ENOENT). */
static int memory_available(uint64_t *out)
{
    static const char *const v2[3] = {"/memory.max", "/memory.current", "inactive_file "};
    static const char *const v1[3] = {"/memory.limit_in_bytes", "/memory.usage_in_bytes",
                                      "total_inactive_file "};
    uint64_t avail = UINT64_MAX, kb;
    int known = 0;

    if (read_keyed("/proc/meminfo", "MemAvailable:", &kb) == 0 && kb <= UINT64_MAX / 1024) {
        avail = kb * 1024;
        known = 1;
    }
    known |= cgroup_cap(CGROUP_V2_MOUNT, "", v2, &avail) == 0;
    known |= cgroup_cap(CGROUP_V1_MOUNT, "memory", v1, &avail) == 0;
    if (!known)
        return -ENOENT;
    *out = avail;
    return 0;
}

uint64_t host_memory_available(void)
{
    uint64_t avail;

    return memory_available(&avail) == 0 ? avail : 0;
}

/* ---- pool ---- */

static int mul_size(size_t *acc, uint64_t factor)
{
    if (factor && *acc > SIZE_MAX / factor)
        return -EINVAL;
    *acc *= (size_t)factor;
    return 0;
}

static int check_args(const struct dev_backend *be, const struct kvt_geometry *g,
                      uint32_t page_size, uint64_t npages, uint32_t layout)
{
    if (!be || page_size == 0 || npages == 0 || npages > UINT32_MAX - 1)
        return -EINVAL;
    if (layout != HOST_PAGE_FIRST && layout != HOST_LAYER_FIRST)
        return -EINVAL;
    return kv_geometry_check(g);
}

/* row[], page_bytes and bytes; -EINVAL when a size does not fit in size_t. */
static int compute_sizes(struct host_pool *hp, const struct kvt_geometry *g)
{
    hp->row[0] = kv_row_bytes(g, 0);
    hp->row[1] = kv_row_bytes(g, 1);
    hp->page_bytes = hp->row[0];
    if (hp->page_bytes > SIZE_MAX - hp->row[1])
        return -EINVAL;
    hp->page_bytes += hp->row[1];
    if (mul_size(&hp->page_bytes, hp->page_size) || mul_size(&hp->page_bytes, hp->layers))
        return -EINVAL;
    hp->bytes = hp->page_bytes;
    if (mul_size(&hp->bytes, hp->npages))
        return -EINVAL;
    /* The allocator's arrays must be addressable too (a concern on 32-bit hosts only). */
    size_t stack = hp->npages;
    return mul_size(&stack, sizeof(uint32_t));
}

/* Pinned memory is what makes device copies asynchronous (cuda) and keeps the pool out of
 * swap (sim). On sim, RLIMIT_MEMLOCK is often far below a pool's size; the pool then works
 * unpinned, only slower under memory pressure, so that is not an error. */
static int pin(struct host_pool *hp)
{
    if (hp->be->host_register) {
        int rc = hp->be->host_register(hp->base, hp->bytes);
        if (rc)
            return rc;
        hp->pinned = true;
        return 0;
    }
    hp->pinned = mlock(hp->base, hp->bytes) == 0;
    if (!hp->pinned) /* a failure while faulting pages in can leave part of it locked */
        munlock(hp->base, hp->bytes);
    return 0;
}

static void unpin(struct host_pool *hp)
{
    if (!hp->pinned)
        return;
    if (hp->be->host_register) {
        if (hp->be->host_unregister)
            hp->be->host_unregister(hp->base);
    } else {
        munlock(hp->base, hp->bytes);
    }
    hp->pinned = false;
}

/* Free stack with page 0 on top, so a fresh pool hands out 0, 1, 2, ... */
static int allocator_init(struct host_pool *hp)
{
    hp->state = calloc(hp->npages, 1); /* HOST_PAGE_FREE is 0 */
    hp->free = malloc((size_t)hp->npages * sizeof(uint32_t));
    if (!hp->state || !hp->free)
        return -ENOMEM;
    for (uint32_t i = 0; i < hp->npages; i++)
        hp->free[i] = hp->npages - 1 - i;
    hp->nfree = hp->npages;
    return 0;
}

static int map_pool(struct host_pool *hp)
{
    uint64_t avail;
    void *p;

    /* Refuse before mapping: a mapping larger than RAM succeeds under overcommit and fails
     * only when touched. */
    if (memory_available(&avail) == 0 && hp->bytes > avail)
        return KVT_EHOSTRAM;
    p = mmap(NULL, hp->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -ENOMEM;
    /* A child of this process (the disk tier's index check, or the application's own) must
     * not share pinned pages copy-on-write: a write here would move a page the device or the
     * disk is copying to or from. The child never needs the pool. */
    madvise(p, hp->bytes, MADV_DONTFORK);
    /* Huge pages where the kernel has them (best effort: the pool works without): a page of
     * KV then lies in few physical runs, so a disk read or write of it is one DMA segment
     * where 4 KiB pages made 64 for 256 KiB (a virtio disk read 256 KiB pages at 2.5 GB/s
     * against 1.5; docs/measurements.md), and copies miss the TLB less. */
    madvise(p, hp->bytes, MADV_HUGEPAGE);
    hp->base = p;
    return 0;
}

int host_pool_init(struct host_pool *hp, const struct dev_backend *be, const struct kvt_geometry *g,
                   uint32_t page_size, uint64_t npages, uint32_t layout)
{
    int rc;

    if (!hp)
        return -EINVAL;
    memset(hp, 0, sizeof(*hp)); /* so that host_pool_finish is safe after a failure */
    if ((rc = check_args(be, g, page_size, npages, layout)))
        return rc;
    hp->be = be;
    hp->layers = g->layers;
    hp->page_size = page_size;
    hp->layout = layout;
    hp->npages = (uint32_t)npages;
    if ((rc = compute_sizes(hp, g)) || (rc = map_pool(hp)) || (rc = pin(hp)) ||
        (rc = allocator_init(hp)))
        goto fail;
    return 0;

fail:
    host_pool_finish(hp);
    return rc;
}

void host_pool_finish(struct host_pool *hp)
{
    if (!hp)
        return;
    if (hp->base) {
        unpin(hp);
        munmap(hp->base, hp->bytes);
    }
    free(hp->state);
    free(hp->free);
    memset(hp, 0, sizeof(*hp));
}

uint8_t *host_pool_rows(const struct host_pool *hp, uint32_t page, uint32_t layer, int which)
{
    size_t run = (size_t)hp->page_size * (hp->row[0] + hp->row[1]); /* one page, one layer */
    size_t off;

    assert(hp->base && page < hp->npages && layer < hp->layers);
    assert(which == 0 || (which == 1 && hp->row[1]));
    if (hp->layout == HOST_PAGE_FIRST) {
        off = page * hp->page_bytes + layer * run;
        return hp->base + off + (which ? (size_t)hp->page_size * hp->row[0] : 0);
    }
    off = layer * (hp->npages * run); /* all pages of one layer, K then V */
    if (which)
        off += (size_t)hp->npages * hp->page_size * hp->row[0];
    return hp->base + off + (size_t)page * hp->page_size * hp->row[which];
}

int host_alloc(struct host_pool *hp, size_t n, uint32_t *pages)
{
    if (n && !pages)
        return -EINVAL;
    if (n > hp->nfree)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t p = hp->free[--hp->nfree];
        hp->state[p] = HOST_PAGE_USED;
        pages[i] = p;
    }
    return 0;
}

/* Mark the pages free, undoing the marks made so far at the first that is out of range or
 * already free: a page named twice is found free the second time, so duplicates are caught
 * without a scratch set. */
static int mark_free(struct host_pool *hp, const uint32_t *pages, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (pages[i] >= hp->npages || hp->state[pages[i]] != HOST_PAGE_USED) {
            while (i-- > 0)
                hp->state[pages[i]] = HOST_PAGE_USED;
            return -EINVAL;
        }
        hp->state[pages[i]] = HOST_PAGE_FREE;
    }
    return 0;
}

int host_free(struct host_pool *hp, const uint32_t *pages, size_t n)
{
    int rc;

    if (n && !pages)
        return -EINVAL;
    if ((rc = mark_free(hp, pages, n)))
        return rc;
    /* Pushed in reverse so the next host_alloc hands them back in the order given: a run
     * freed together comes back as the same run. */
    for (size_t i = n; i-- > 0;)
        hp->free[hp->nfree++] = pages[i];
    return 0;
}

size_t host_available(const struct host_pool *hp)
{
    return hp->nfree;
}
