/*
 * The block store's data dir at open (store_int.h): what the dir is (ours, fresh, a crashed
 * creation, or something else), its creation, the writer's lock, the index's check against
 * the options and its rebuild when it cannot be trusted, and the slot table's memory.
 *
 * A data dir is ours when it has index/data.mdb; a dir holding nothing but what a crashed
 * creation leaves (lock, slabs/, index.new/), or whose index/ lost its data.mdb, is created
 * afresh, its index rebuilt from the slabs when it has any; anything else is refused before
 * a byte of it is touched. Creation builds the index in index.new and renames it
 * into place, so a crash mid-way never leaves an index without its meta record.
 */
#include "store_int.h"
#include "trust.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define LOCK_TRIES 100 /* ms a writer waits out an inspector's look at the lock */

/* ---- the data dir ---- */

enum dir_kind { DIR_OURS, DIR_FRESH, DIR_FOREIGN };

/* Names a fresh dir, or one whose creation crashed, may hold. */
static bool fresh_name(const char *n)
{
    return !strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "lock") || !strcmp(n, "slabs") ||
           !strcmp(n, "index.new") || !strcmp(n, "index.damaged");
}

/* An index/ dir without its data.mdb: the index was lost (deleted, or a copy without it);
 * the slabs, when there are any, still hold every page's head. */
static bool lost_index(int dirfd, const char *n)
{
    struct stat st;

    return !strcmp(n, "index") && fstatat(dirfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
           S_ISDIR(st.st_mode);
}

static int classify(int dirfd, enum dir_kind *kind)
{
    struct dirent *de;
    struct stat st;
    DIR *d;
    int fd;

    if (fstatat(dirfd, "index/data.mdb", &st, AT_SYMLINK_NOFOLLOW) == 0) {
        *kind = DIR_OURS; /* what kind of file it is, index_files_ok tells */
        return 0;
    }
    if ((fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    *kind = DIR_FRESH;
    while ((de = readdir(d)))
        if (!fresh_name(de->d_name) && !lost_index(fd, de->d_name))
            *kind = DIR_FOREIGN;
    closedir(d);
    return 0;
}

/* What a crashed creation left in index.new. */
static void remove_partial_index(int dirfd)
{
    unlinkat(dirfd, "index.new/data.mdb", 0);
    unlinkat(dirfd, "index.new/lock.mdb", 0);
    unlinkat(dirfd, "index.new", AT_REMOVEDIR);
}

/* The writer's map: the index's pages for the capacity, with room for a B-tree's half-full
 * pages, copy-on-write and the old pages a long reader (kvtier-ctl beside the engine) keeps,
 * and never less than four times the file as found (a dir written with a larger capacity
 * must still have room for the deletes that shrink it). Address space only: the file grows
 * as pages are used. */
static size_t map_bytes(const struct dstore *s, uint64_t file_bytes)
{
    uint64_t per = rec_bytes(s->page_tokens) + SLOT_ENTRY_BYTES + 128;
    uint64_t want = 8 * per * s->nslots;

    if (s->o.map_bytes)
        return (size_t)s->o.map_bytes;
    if (want < 4 * file_bytes)
        want = 4 * file_bytes;
    want += 256 * MIB;
    if (want < GIB)
        want = GIB;
    return (size_t)((want + MIB - 1) / MIB * MIB);
}

static char *dir_path(const struct dstore *s, const char *name)
{
    size_t len = strlen(s->dir) + strlen(name) + 2;
    char *p = malloc(len);

    if (p)
        snprintf(p, len, "%s/%s", s->dir, name);
    return p;
}

/* The dir's geometry for a new store, from the options. */
static void geometry_new(struct dstore *s, struct dmeta *m)
{
    uint64_t slab_slots = s->o.slab_bytes / s->slot_bytes, share;

    if (s->o.stripes > 1) { /* so that a capacity of one slab still spans a stripe */
        share = (s->nslots + s->o.stripes - 1) / s->o.stripes;
        if (share < DSTORE_STRIPE_SLAB_MIN / s->slot_bytes)
            share = DSTORE_STRIPE_SLAB_MIN / s->slot_bytes;
        slab_slots = share < slab_slots ? share : slab_slots;
    }
    memset(m, 0, sizeof(*m));
    m->version = s->o.format ? s->o.format : DSTORE_FORMAT_VERSION;
    m->page_bytes = s->page_bytes;
    m->page_tokens = s->page_tokens;
    m->slot_bytes = s->slot_bytes;
    m->slab_slots =
        (uint32_t)(slab_slots ? slab_slots > UINT32_MAX / 2 ? UINT32_MAX / 2 : slab_slots : 1);
    memcpy(m->fingerprint, s->o.fingerprint, DSTORE_FINGERPRINT_BYTES);
    pthread_mutex_lock(&s->lock);
    m->created = stamp_locked(s);
    pthread_mutex_unlock(&s->lock);
}

/* Build an index holding only meta m in index.new, and move it into place. */
static int index_install(struct dstore *s, const struct dmeta *m)
{
    char *path;
    int rc;

    remove_partial_index(s->dirfd);
    if (mkdirat(s->dirfd, "index.new", 0700))
        return -errno;
    if (!(path = dir_path(s, "index.new")))
        return -ENOMEM;
    rc = index_create(path, m, s->o.map_bytes ? s->o.map_bytes : GIB);
    free(path);
    if (rc)
        return rc;
    if (renameat(s->dirfd, "index.new", s->dirfd, "index"))
        return -errno;
    s->created = true;
    return fsync(s->dirfd) ? -errno : 0;
}

/* An index there is moved to index.damaged (replacing the one before), for a new one. */
static int set_aside_index(struct dstore *s);

static int dir_create(struct dstore *s)
{
    struct dmeta m;
    int rc;

    if (mkdirat(s->dirfd, "slabs", 0700) && errno != EEXIST)
        return -errno;
    if ((rc = set_aside_index(s))) /* an index/ without its data.mdb and no slab: nothing lost */
        return rc;
    geometry_new(s, &m);
    return index_install(s, &m);
}

/* Empty index.damaged (files only: it is ours) and remove it. */
static int remove_damaged(int data_dirfd)
{
    int fd = openat(data_dirfd, "index.damaged", O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    struct dirent *de;
    DIR *d;

    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP)) /* not even a dir: junk */
        return unlinkat(data_dirfd, "index.damaged", 0) ? -errno : 0;
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            unlinkat(fd, de->d_name, 0);
    closedir(d);
    return unlinkat(data_dirfd, "index.damaged", AT_REMOVEDIR) ? -errno : 0;
}

/* The meta of a dir whose index is lost, from a slab's head; the options' geometry must be
 * the dir's unless the dir is taken as found. */
static int meta_from_slabs(struct dstore *s, struct dmeta *m)
{
    struct slab_head h;
    int rc = slabs_first_head(s->dirfd, &h);

    if (rc)
        return rc;
    if (h.version < DSTORE_FORMAT_OLDEST || h.version > DSTORE_FORMAT_VERSION)
        return KVT_EFORMAT;
    if (!(s->o.flags & DSTORE_AS_FOUND) &&
        (memcmp(h.fingerprint, s->o.fingerprint, DSTORE_FINGERPRINT_BYTES) ||
         h.page_bytes != s->page_bytes || h.page_tokens != s->page_tokens))
        return KVT_EFINGERPRINT;
    *m = (struct dmeta){.version = h.version,
                        .page_bytes = h.page_bytes,
                        .page_tokens = h.page_tokens,
                        .slot_bytes = h.slot_bytes,
                        .slab_slots = h.slab_slots,
                        .created = h.created};
    memcpy(m->fingerprint, h.fingerprint, DSTORE_FINGERPRINT_BYTES);
    return 0;
}

/* The writer's answer to an index it cannot trust, or lost: set it aside (index.damaged, the
 * last one only) and start an empty one that the committer fills from the slabs' heads. */
static int set_aside_index(struct dstore *s)
{
    struct stat st;
    int rc;

    if (fstatat(s->dirfd, "index", &st, AT_SYMLINK_NOFOLLOW))
        return errno == ENOENT ? 0 : -errno;
    if ((rc = remove_damaged(s->dirfd)))
        return rc;
    return renameat(s->dirfd, "index", s->dirfd, "index.damaged") ? -errno : 0;
}

static int index_rebuild(struct dstore *s)
{
    struct dmeta m;
    int rc = meta_from_slabs(s, &m);

    if (rc || (rc = set_aside_index(s)))
        return rc;
    if ((rc = index_install(s, &m)))
        return rc;
    s->recovering = true;
    return 0;
}

/* The lock file, a regular file opened through no link and without blocking: the fd, or
 * -ELOOP (a link), -ENOTSUP (not a regular file), or another -errno. */
static int open_lock_file(int dirfd)
{
    struct stat st;
    int fd = openat(dirfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);

    if (fd < 0) /* a directory opened for writing answers EISDIR: no regular file either */
        return errno == EISDIR ? -ENOTSUP : -errno;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return -ENOTSUP;
    }
    return fd;
}

/* Only one writer per dir: a second open (here or in another process) gets -EBUSY. */
/* The writer's lock. An inspector checking whether a writer is there holds the lock shared
 * for a moment, so a refusal is retried for LOCK_TRIES ms before it means another writer. */
static int take_lock(struct dstore *s)
{
    const struct timespec ms = {0, 1000000};
    int rc = open_lock_file(s->dirfd);

    /* A link, a FIFO or an empty directory where the lock file should be is junk in our dir:
     * it is replaced. A directory with anything in it is left alone (-ENOTEMPTY). */
    if (rc == -ELOOP || rc == -ENOTSUP) {
        if (unlinkat(s->dirfd, "lock", 0) &&
            (errno != EISDIR || unlinkat(s->dirfd, "lock", AT_REMOVEDIR)))
            return -errno;
        rc = open_lock_file(s->dirfd);
    }
    if (rc < 0)
        return rc;
    s->lockfd = rc;
    for (int i = 0; flock(s->lockfd, LOCK_EX | LOCK_NB); i++) {
        if (errno != EWOULDBLOCK)
            return -errno;
        if (i == LOCK_TRIES)
            return -EBUSY;
        nanosleep(&ms, NULL);
    }
    return 0;
}

/* Classify before locking, so a foreign dir is refused untouched; again after, since a
 * creation may have finished in between. */
int dir_prepare(struct dstore *s)
{
    struct slab_head h;
    enum dir_kind kind;
    int rc;

    bool create = !s->ro && !(s->o.flags & DSTORE_AS_FOUND);

    if (create && mkdir(s->dir, 0700) && errno != EEXIST)
        return -errno;
    s->dirfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0)
        return -errno;
    if ((rc = share_join(s)) || s->share_joined)
        return rc; /* a store of this process has the dir open: its index is checked */
    if ((rc = classify(s->dirfd, &kind)))
        return rc;
    if (kind == DIR_FOREIGN || (s->ro && kind != DIR_OURS))
        return kind == DIR_FRESH && slabs_first_head(s->dirfd, &h) == 0 ? KVT_ECORRUPT
                                                                        : KVT_EFORMAT;
    if (s->ro)
        return 0;
    if ((rc = take_lock(s)) || (rc = classify(s->dirfd, &kind)))
        return rc;
    if (kind == DIR_FOREIGN)
        return KVT_EFORMAT;
    /* Slabs of ours without an index: it was lost (or set aside by a crashed rebuild). */
    if (kind == DIR_FRESH && slabs_first_head(s->dirfd, &h) == 0)
        return index_rebuild(s);
    if (kind == DIR_FRESH)
        return create ? dir_create(s) : KVT_EFORMAT;
    return s->o.flags & DSTORE_RECOVER ? index_rebuild(s) : 0;
}

/* DSTORE_AS_FOUND: the dir's fingerprint and page geometry become the options'. */
static int adopt_meta(struct dstore *s, const struct dmeta *m)
{
    if (!m->page_bytes || m->page_tokens > DSTORE_MAX_TOKENS)
        return KVT_ECORRUPT;
    memcpy(s->o.fingerprint, m->fingerprint, DSTORE_FINGERPRINT_BYTES);
    s->o.page_bytes = s->page_bytes = m->page_bytes;
    s->o.page_tokens = s->page_tokens = m->page_tokens;
    return 0;
}

/* DSTORE_AS_FOUND: the capacity covers every slab file, so none of their records is out of
 * bounds (and a writer's rebuild drops none of them). */
static int capacity_as_found(struct dstore *s)
{
    uint32_t files;
    int rc = slabs_found(s, &files);

    if (rc)
        return rc;
    if (!files)
        files = 1;
    if ((uint64_t)files * s->slab_slots > s->nslots)
        s->nslots = (uint64_t)files * s->slab_slots;
    return 0;
}

/* The options' geometry must be the dir's; its own layout (slots, slabs) is taken as is. */
static int check_meta(struct dstore *s, const struct dmeta *m)
{
    bool as_found = s->o.flags & DSTORE_AS_FOUND;
    int rc;

    if (as_found && (rc = adopt_meta(s, m)))
        return rc;
    if (memcmp(m->fingerprint, s->o.fingerprint, DSTORE_FINGERPRINT_BYTES) ||
        m->page_bytes != s->page_bytes || m->page_tokens != s->page_tokens)
        return KVT_EFINGERPRINT;
    if (layout_init(&s->lay, m->page_bytes, m->page_tokens, m->version) || !m->slab_slots ||
        m->slot_bytes != s->lay.slot_bytes)
        return KVT_ECORRUPT;
    s->meta = *m;
    s->fp_digest = layout_fp_digest(m->fingerprint);
    s->slot_bytes = m->slot_bytes;
    s->slab_slots = m->slab_slots;
    s->nslots = s->o.disk_bytes / s->slot_bytes;
    if (as_found && (rc = capacity_as_found(s)))
        return rc;
    if (s->nslots >= NO_SLOT)
        s->nslots = NO_SLOT - 1;
    if (!s->nslots)
        return -EINVAL;
    s->nslabs = (uint32_t)((s->nslots + s->slab_slots - 1) / s->slab_slots);
    return 0;
}

/* The index failed a check of ours (the walk, its databases, its meta record's own check):
 * it proves nothing, so the slabs tell. A slab head of this format (and fingerprint, unless
 * the dir is taken as found) says the dir is ours and the index damaged: a reader reports it
 * (KVT_ECORRUPT), the writer sets the index aside and rebuilds it (0). Without one the dir is
 * nobody's we know, or another format's, and is left as it is. */
static int index_damaged(struct dstore *s)
{
    struct dmeta m;
    int rc = meta_from_slabs(s, &m);

    if (rc)
        return rc;
    return s->ro ? KVT_ECORRUPT : index_rebuild(s);
}

/* An index whose meta record no slab head agrees with (fingerprint, page geometry, creation)
 * is another dir's, copied over this one's: its records name slots that hold other pages, and
 * reading them would only find every page bad and drop it. It is damaged as far as this dir
 * goes (KVT_ECORRUPT): the slabs, whose heads name every page, rebuild it. A dir without a
 * whole slab head yet has nothing to tell. */
static int index_foreign(struct dstore *s, const struct dmeta *m)
{
    struct slab_head h;
    bool agrees;

    if (slabs_against_meta(s->dirfd, m, &h, &agrees) || agrees)
        return 0;
    s->index_foreign = true;
    return KVT_ECORRUPT;
}

/* A durable writer's commits skip the meta page's own sync (the next commit's covers it). A
 * relaxed writer's commits are synced whole until its first write transaction revokes the
 * clean stamp, and synced by its flushes only after that (records.c: relax). */
static int writer_sync_mode(struct dstore *s)
{
    return s->o.sync == DSTORE_SYNC_RELAXED ? 0 : index_set_sync(&s->ix, false);
}

/* Open the index at path with its map for the open (a reader takes the writer's; a writer
 * sizes it once the capacity is known) and read its meta record; closed again on failure. */
static int index_open_meta(struct dstore *s, const char *path, uint64_t file, struct dmeta *m)
{
    int rc = index_open(&s->ix, path, s->ro,
                        s->ro            ? 0
                        : s->o.map_bytes ? s->o.map_bytes
                                         : GIB + 4 * file);

    if (!rc && (rc = index_read_meta(&s->ix, m)))
        index_close(&s->ix);
    return rc;
}

/* The walk reads every record but cannot judge their bytes, and lets through an index that
 * lacks our databases or meta record (a power cut in relaxed mode can leave a main tree whose
 * root is another tree's page with as many entries, whole in itself). That, or a record
 * failing its own check (a bit flipped in its magic or version included), is damage like any
 * other (index_damaged): only an intact record says another format. */
static int open_or_recover(struct dstore *s, const char *path, uint64_t file, struct dmeta *m)
{
    int rc = index_open_meta(s, path, file, m);

    if (!rc && !s->created && !s->recovering && (rc = index_foreign(s, m)))
        index_close(&s->ix);
    if (rc == KVT_ECORRUPT && !s->created && !(rc = index_damaged(s)))
        rc = index_open_meta(s, path, file, m);
    return rc;
}

/* A read-only store of a dir this process has open: the environment is there, checked. */
static int index_joined(struct dstore *s)
{
    struct dmeta m;
    int rc = share_read_meta(s, &m);

    if (rc || (rc = check_meta(s, &m)) || (rc = share_read(s, &s->rtxn, false)))
        return rc;
    snapshot_reset(s);
    return 0;
}

int index_prepare(struct dstore *s)
{
    struct dmeta m;
    char *path;
    uint64_t file;
    int rc;

    if (s->share_joined)
        return index_joined(s);
    if (!(path = dir_path(s, "index/data.mdb")))
        return -ENOMEM;
    file = index_file_bytes(path);
    path[strlen(path) - strlen("/data.mdb")] = '\0';
    if (!s->created && (rc = index_trust(s->dirfd, path, &s->index_walked)) &&
        (rc != KVT_ECORRUPT || (rc = index_damaged(s))))
        goto free_path;
    rc = open_or_recover(s, path, file, &m);
    if (rc || (rc = check_meta(s, &m)))
        goto free_path;
    if (!s->ro &&
        ((rc = index_set_mapsize(&s->ix, map_bytes(s, file))) || (rc = writer_sync_mode(s))))
        goto free_path;
    share_ready(s); /* before the first snapshot, which counts on the entry */
    if ((rc = share_read(s, &s->rtxn, false)))
        goto free_path;
    snapshot_reset(s);
free_path:
    free(path);
    return rc;
}

/* ---- the slot table ---- */

/* The tag map's size: a power of two at least twice the slots, so runs stay short. */
static int map_alloc(struct dstore *s)
{
    uint64_t size = 2;
    uint32_t bits = 1;

    while (size < 2 * s->nslots) {
        size <<= 1;
        bits++;
    }
    s->map_size = size;
    s->map_shift = 64 - bits;
    s->map = malloc(size * sizeof(*s->map));
    return s->map ? 0 : -ENOMEM;
}

int table_alloc(struct dstore *s)
{
    size_t n = (size_t)s->nslots;

    s->state = calloc(n, 1);
    s->pins = calloc(n, sizeof(*s->pins));
    s->skey = calloc(n, DSTORE_KEY_BYTES);
    s->atime = calloc(n, sizeof(*s->atime));
    s->ptag = calloc(n, sizeof(*s->ptag));
    s->kids = calloc(n, sizeof(*s->kids));
    s->lru.prev = malloc(n * sizeof(uint32_t));
    s->lru.next = malloc(n * sizeof(uint32_t));
    s->ends = malloc(n * sizeof(uint32_t));
    s->end_pos = calloc(n, sizeof(uint32_t));
    s->freestk = malloc(n * sizeof(*s->freestk));
    s->dirty_bit = calloc(n, 1);
    s->dirty = malloc(n * sizeof(*s->dirty));
    s->early = malloc(EARLY_MAX * sizeof(*s->early));
    s->touched = malloc(DIRTY_MAX * sizeof(*s->touched));
    s->recbuf = malloc(rec_bytes(s->page_tokens));
    if (!s->early || !s->touched || !s->recbuf || !s->state || !s->pins || !s->skey || !s->atime ||
        !s->ptag || !s->kids || !s->lru.prev || !s->lru.next || !s->ends || !s->end_pos ||
        !s->freestk || !s->dirty_bit || !s->dirty || map_alloc(s))
        return -ENOMEM;
    return 0;
}

void table_init(struct dstore *s)
{
    memset(s->map, 0xff, s->map_size * sizeof(*s->map)); /* NO_SLOT everywhere */
    lists_reset_locked(s);
}

void table_free(struct dstore *s)
{
    free(s->state);
    free(s->pins);
    free(s->skey);
    free(s->atime);
    free(s->ptag);
    free(s->kids);
    free(s->lru.prev);
    free(s->lru.next);
    free(s->ends);
    free(s->end_pos);
    free(s->map);
    free(s->waiting);
    free(s->freestk);
    free(s->dirty_bit);
    free(s->dirty);
    free(s->early);
    free(s->touched);
    free(s->recbuf);
}
