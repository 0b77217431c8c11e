/*
 * The disk tier: a block store of whole KV pages, named by their 32-byte page hash (opaque
 * here), kept in a data dir on a local disk. docs/formats.md has every byte layout.
 *
 * Data dir (mode 0700):
 *   index/            LMDB environment: "pages" (hash -> record), "slots" (slot -> hash, the
 *                     compact table the rebuild reads) and "meta" (format, geometry,
 *                     fingerprint); index/clean stamps an index its writer closed cleanly
 *   index.damaged/    the last index found damaged, set aside (kept for inspection only)
 *   slabs/NNNN.slab   preallocated data files: a slab head, then slots (disk/layout.h), each
 *                     holding a page and its page head, so the slabs describe themselves
 *   lock              flock'ed by the one process that may write
 *
 * Write order: reserve a slot, write the page and its head, fdatasync the slab (once per
 * batch), then commit the index records (one LMDB transaction per batch: one flush of the
 * index, its meta page made durable by the next commit's flush). An index record therefore
 * never names bytes that were not written; a power cut loses at most pages in flight and the
 * last commit. Slots freed by eviction are reused only after the transaction deleting their
 * records is durable. Reads cost no index write and no sync: their access times are written
 * with a later commit (options: access_period_ms). In relaxed mode (options: sync) nothing is
 * synced per batch: the slabs and the index are flushed every sync_ms or sync_bytes, and after
 * a power cut a record may name bytes that never landed; the checksum below makes it a miss.
 * docs/design.md says what a crash costs in each mode.
 *
 * Reads verify an XXH3-128 checksum of the page; a mismatch is a miss, counts an error and
 * drops the record. Records, lengths and slot numbers read from disk are bounds-checked:
 * they are input, never trusted. So is the index itself: one this process did not find
 * stamped clean is read whole by a child process before LMDB touches it here (trust.h); a
 * damaged one is refused by readers (KVT_ECORRUPT) and, by a writer, set aside and rebuilt
 * from the slabs' page heads in the background. Nothing in the dir is opened through a link,
 * only regular files are used, and no open blocks.
 *
 * Threads: one owner thread calls every function below (as with an LMDB transaction), except
 * where a function says otherwise. Inside, an I/O engine (io_uring, or pread/pwrite threads)
 * moves the bytes and a committer thread owns slot reservation, eviction and every index
 * write; completions are recorded off the owner thread and collected by dstore_poll or
 * dstore_wait.
 *
 * Open is fast whatever the index holds: the committer rebuilds the free-slot set and the LRU
 * order in the background, and reads, existence checks and iteration serve at once. Writes,
 * deletes and evictions queue behind the rebuild.
 */
#ifndef KVT_DISK_STORE_H
#define KVT_DISK_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define DSTORE_KEY_BYTES 32
#define DSTORE_NS_BYTES 32
#define DSTORE_FINGERPRINT_BYTES 32
#define DSTORE_MAX_TOKENS 4096 /* page_tokens at most */

enum dstore_io {
    DSTORE_IO_AUTO = 0,  /* io_uring, or psync when the kernel refuses it or the dir is in
                            memory (tmpfs: its workers take checksums as they copy) */
    DSTORE_IO_URING = 1, /* io_uring or fail (-ENOSYS, -EPERM, ...) */
    DSTORE_IO_PSYNC = 2, /* threads with pread/pwrite */
};

enum dstore_flags {
    /* Never write: no lock taken, no rebuild, no drops; safe beside a running engine (in
     * another process). Writes, deletes and evictions give -EROFS. */
    DSTORE_READONLY = 1u << 0,
    DSTORE_BUFFERED = 1u << 1, /* never use O_DIRECT */
    /* Open a dir as it was written, for tools that know nothing of its model: the dir's own
     * fingerprint and page geometry are taken (the options' are ignored; page_bytes may be
     * 0), and the capacity is disk_bytes (may be 0) raised to cover the slab files found
     * (numbered from 0000 up to the first gap), at least one slab, so no record of a live
     * slab is out of bounds. Never creates a dir:
     * a missing one gives -ENOENT, an empty one KVT_EFORMAT. */
    DSTORE_AS_FOUND = 1u << 2,
    /* Set the index aside and rebuild it from the slabs' page heads, as an open does by
     * itself when the index is damaged or lost (kvtier-ctl recover). Writers only. */
    DSTORE_RECOVER = 1u << 3,
    /* Keep pages in the page cache: write through it, and read a page from it when it holds
     * the whole slot (cachestat: a copy); a page it lacks is read with O_DIRECT, where the dir
     * takes it, so a cold page costs a device read and leaves nothing cached (no readahead,
     * no second copy). */
    DSTORE_CACHED = 1u << 4,
};

/* When the written bytes and records reach the disk. */
enum dstore_sync {
    /* Each write batch: the slabs' fdatasync before the records commit (one index flush);
     * deletions are durable before their slots are written again. */
    DSTORE_SYNC_DURABLE = 0,
    /* No sync per batch: the slabs and the index are flushed every sync_ms or sync_bytes
     * (whichever comes first), by dstore_flush and at close. */
    DSTORE_SYNC_RELAXED = 1,
};
#define DSTORE_SYNC_MS 1000              /* sync_ms's default */
#define DSTORE_GROUP_WAIT_US 2000        /* group_wait_us's default */
#define DSTORE_SYNC_BYTES (256ull << 20) /* sync_bytes's default */

/* Points where the fault seam is asked; slab and slot name the page (slot is 0 for SYNC and
 * GROW, which concern a whole slab; both are 0 for REBUILD, COMMIT and FLUSH). */
enum dstore_fault_point {
    DSTORE_FAULT_READ = 0,    /* before a page read */
    DSTORE_FAULT_WRITE = 1,   /* before a page write */
    DSTORE_FAULT_SYNC = 2,    /* before the fdatasync of a slab (a write batch, a flush) */
    DSTORE_FAULT_GROW = 3,    /* before a slab file is created or extended */
    DSTORE_FAULT_REBUILD = 4, /* before the rebuild at open reads the slot table */
    DSTORE_FAULT_COMMIT = 5,  /* before the committer commits an index transaction */
    DSTORE_FAULT_FLUSH = 6,   /* before the index is flushed on its own (index_flush) */
};
#define DSTORE_FAULT_POINTS 7

/* Test seam: inject returns 0 to go on, or a -errno the operation then fails with as if the
 * system had returned it. Called from the store's internal threads, concurrently. */
struct dstore_faults {
    int (*inject)(void *arg, enum dstore_fault_point point, uint32_t slab, uint32_t slot);
    void *arg;
};

/* Told when an op completes (any op, once), on the thread that completed it, under the
 * store's lock: it must not call the store. */
struct dstore_notify {
    void (*done)(void *arg);
    void *arg;
};

/* A data dir's format version (docs/formats.md): new dirs are made in the current one; this
 * build opens every one from the oldest (format 3 packs pages below 4 KiB into slots of 64-byte
 * steps, format 2 gave each a block). */
#define DSTORE_FORMAT_VERSION 3
#define DSTORE_FORMAT_OLDEST 2

struct dstore_options {
    size_t size;     /* sizeof(struct dstore_options); set by dstore_options_init */
    const char *dir; /* the data dir; created (0700) when missing unless read-only */
    uint8_t fingerprint[DSTORE_FINGERPRINT_BYTES]; /* a dir with another one is refused */
    uint32_t page_bytes;                           /* bytes of one page: the I/O unit */
    uint32_t page_tokens; /* tokens recorded per page, at most DSTORE_MAX_TOKENS */
    uint64_t disk_bytes;  /* capacity of the slabs; default 1 GiB */
    uint64_t slab_bytes;  /* bytes per slab file when the dir is created; default 1 GiB */
    uint32_t flags;       /* enum dstore_flags */
    uint32_t io;          /* enum dstore_io; default AUTO */
    uint32_t queue_depth; /* page I/Os in flight at most (io_uring); default 64 */
    uint32_t io_threads;  /* psync workers; 0 (the default): 4, or one a CPU (4 to 16) for a
                             dir in memory, where every I/O is a copy by the CPU */
    uint32_t max_batch;   /* pages per write batch (one fdatasync + one commit); default 256 */
    /* Memory to register with io_uring as fixed buffers (the host pool); may be NULL. Must
     * stay mapped until dstore_close. */
    void *register_base;
    size_t register_bytes;
    const struct dstore_faults *faults; /* test seam; NULL in production */
    uint64_t map_bytes; /* test seam: a writer's index map; 0 (production): sized for the
                           capacity */
    const struct dstore_notify *notify; /* may be NULL */
    /* Access times (hints for the eviction order after a restart) ride on write batches'
     * commits; ones that wait this long for one get a commit of their own. 0: 30 s. A crash
     * loses those not committed yet, never a page or a record. */
    uint32_t access_period_ms;
    uint32_t sync; /* enum dstore_sync; default DURABLE */
    /* Relaxed mode: a flush of the slabs and the index once the oldest unflushed write is
     * this old (0: DSTORE_SYNC_MS), or once this many page bytes wait (0: DSTORE_SYNC_BYTES). */
    uint32_t sync_ms;
    uint64_t sync_bytes;
    uint32_t format; /* test seam: the format version a new dir is made in (0: the current;
                        DSTORE_FORMAT_OLDEST up to it); an existing dir keeps its own */
    /* Slabs written beside each other (0 or 1: one at a time, lowest slot first). Writes
     * through the page cache (tmpfs, small pages) copy one file at a time: with stripes, free
     * slots are taken from each of a group of that many slabs in turn, and a new dir's slabs
     * hold at most a stripes'th of the capacity (not under DSTORE_STRIPE_SLAB_MIN). */
    uint32_t stripes;
    /* Durable mode: a batch whose I/O has landed waits up to this long for the batches in
     * flight behind it to land, so they share its fdatasync and commit (0: DSTORE_GROUP_WAIT_US).
     * It never waits for writes not yet submitted. */
    uint32_t group_wait_us;
};

/* What the page store and the engine's disk tier stripe over, and the smallest slab that
 * striping makes (a capacity of 200 GiB stays at 200 files of 1 GiB, not thousands). */
#define DSTORE_STRIPES 4
#define DSTORE_STRIPE_SLAB_MIN (256ull << 20)

/* The most parts a page may come in (dstore_wpage.parts). */
#define DSTORE_MAX_PARTS 64

/* One page of a write batch. key, parent, ns and tokens are copied at submit; buf must stay
 * valid and unchanged until the op completes. */
struct dstore_wpage {
    const uint8_t *key;     /* DSTORE_KEY_BYTES */
    const uint8_t *parent;  /* DSTORE_KEY_BYTES; NULL: none (a first page) */
    const uint8_t *ns;      /* DSTORE_NS_BYTES; NULL: zeros (the default namespace) */
    const uint32_t *tokens; /* page_tokens ids; NULL: zeros */
    const void *buf;        /* page_bytes */
    /* Or, nparts > 0: the page in nparts parts of page_bytes / nparts bytes each, in order
     * (nparts divides page_bytes; at most DSTORE_MAX_PARTS), written from where they are,
     * as one vectored I/O; buf is then unused. The array and the parts stay valid and
     * unchanged until the op completes. */
    const void *const *parts;
    uint32_t nparts;
};

/* One page of a read batch. key is copied at submit; buf (page_bytes) is written by the
 * store until the op completes, and holds the page only where the page's result is 0. */
struct dstore_rpage {
    const uint8_t *key;
    void *buf;
    void *const *parts; /* or, nparts > 0: the page's parts, as dstore_wpage's */
    uint32_t nparts;
};

enum dstore_op_kind {
    DSTORE_OP_READ = 0,
    DSTORE_OP_WRITE = 1,
};

/* A completed op. Per-page results are in the caller's results array given at submit:
 * writes: 0 stored (or already present), -ENOSPC, -EIO, -EINVAL (bad page), other -errno;
 * reads: 0 hit, -ENOENT miss, KVT_ECORRUPT (failed a check: dropped, a miss), -EIO. */
struct dstore_done {
    uint64_t op;
    uint32_t kind;  /* enum dstore_op_kind */
    uint32_t pages; /* pages in the op */
    uint32_t ok;    /* pages whose result is 0 */
    /* The store contract's split of a chain's pages by kind (store/store.h): a block store's
     * pages are all its own, so these stay 0; here so the structs stay one. */
    uint32_t split, near_ok, remote_ok;
};

struct dstore_stats {
    uint64_t pages;          /* records in the index */
    uint64_t bytes;          /* pages * page_bytes */
    uint64_t capacity_slots; /* disk_bytes / slot_bytes */
    uint64_t free_slots;     /* slots a write can take without evicting (0 until ready) */
    uint32_t page_bytes, slot_bytes;
    uint32_t io;            /* enum dstore_io in use: URING or PSYNC */
    uint32_t direct;        /* 1 when O_DIRECT is in use */
    uint32_t fixed_buffers; /* 1 when the registered region is in use */
    uint32_t ready;         /* 1 once the background rebuild has finished */
    uint64_t ops_in_flight; /* submitted ops not yet collected by poll or wait */
    uint64_t reads, read_hits, writes, write_dups; /* pages; dups were already stored */
    uint64_t bytes_read, bytes_written;
    uint64_t fixed_ios;                 /* page I/Os carried by registered buffers */
    uint64_t cache_reads;               /* DSTORE_CACHED: read hits the page cache held whole */
    uint64_t evicted, deleted, dropped; /* pages: LRU, by request, found bad */
    uint64_t too_many; /* pages refused: a write batch held more new pages than the store has
                          slots (not an error: the first ones went in) */
    /* errors by kind */
    uint64_t err_checksum; /* page bytes failed their checksum */
    uint64_t err_record;   /* index record failed its checks */
    uint64_t err_bounds;   /* record names a slot outside the slabs */
    uint64_t err_read_io, err_write_io, err_nospc, err_sync, err_index;
    /* the index at open */
    uint32_t index_walked;    /* 1: not stamped clean, so a child read it whole before use */
    uint32_t index_rebuilt;   /* 1: it could not be trusted (or was lost) and was set aside */
    uint32_t index_foreign;   /* 1: the reason was that it was another dir's (its meta record
                                 agreed with no slab head) */
    uint64_t recovered;       /* pages whose records came back from the slabs' page heads */
    uint64_t recover_scanned; /* slots whose heads recovery read */
    /* what the index and the slabs cost the writer */
    uint64_t commits;       /* index transactions committed */
    uint64_t slab_syncs;    /* fdatasyncs of a slab file */
    uint64_t index_flushes; /* flushes of the index on its own (after a commit that deletes) */
    uint64_t groups;        /* groups of write batches retired (one commit at most each) */
};

/* What iteration shows of one record. Pointers are valid during the callback only. */
struct dstore_entry {
    const uint8_t *key, *parent, *ns;
    const uint32_t *tokens;
    uint32_t ntokens;
    uint32_t slab, slot, length;
    uint8_t checksum[16];                /* XXH3-128, canonical (big-endian) bytes */
    uint64_t created_ns, last_access_ns; /* wall clock, ns since the epoch */
    int status;         /* 0; KVT_ECORRUPT for a record that failed its checks (only key is set) */
    uint32_t key_bytes; /* length of key: DSTORE_KEY_BYTES unless the index holds junk */
    /* The key the slot table gives this record's slot, read in the same snapshot; NULL when
     * it gives the slot to nobody (or the record named no valid slot). A record whose slot
     * belongs to another key is never served: the store drops it when a read finds it. */
    const uint8_t *slot_owner;
};

/* Returns 0 to go on, anything else to stop the iteration (and is returned by it). */
typedef int (*dstore_visit_fn)(void *arg, const struct dstore_entry *e);

struct dstore;

/* Fill *o with defaults; size must be sizeof(struct dstore_options). */
void dstore_options_init(struct dstore_options *o, size_t size);

/* Open or create the data dir o->dir. -EBUSY when another process (or another open in this
 * one) has it for writing; KVT_EFORMAT for a dir that is not kvtier's or has another format;
 * KVT_EFINGERPRINT for another fingerprint or page geometry; KVT_ECORRUPT for a damaged meta
 * record, or a damaged index opened read-only (a writer recovers it instead); -EINVAL for bad
 * options. Returns before the background rebuild (and any recovery) finishes. */
int dstore_open(const struct dstore_options *o, struct dstore **out);

/* Wait for every op and queued job, persist access times, stop the threads and close.
 * Buffers of ops still in flight must stay valid until this returns. NULL is a no-op. */
void dstore_close(struct dstore *s);

/* Block until the background rebuild has finished; its result (0, or the error that makes
 * writes fail). */
int dstore_wait_ready(struct dstore *s);

/* Queue a batch of n page writes; *op gets its id (ids grow from 1, shared with reads).
 * results[i] is written when the op completes and must stay valid until then. */
int dstore_write(struct dstore *s, const struct dstore_wpage *pages, size_t n, int *results,
                 uint64_t *op);

/* Queue a batch of n page reads: the index is looked up now (a page missing now is a miss),
 * the bytes land later. results as for dstore_write. *leading (may be NULL) gets how many of
 * the first pages were found and are on their way: nothing can evict them before they land
 * (a check may still fail them); the pages after are misses, or on their way past a miss. */
int dstore_read(struct dstore *s, const struct dstore_rpage *pages, size_t n, int *results,
                uint64_t *op, size_t *leading);

/* Collect up to max completed ops, oldest submitted first, without blocking; how many. A
 * collected op is forgotten. */
size_t dstore_poll(struct dstore *s, struct dstore_done *done, size_t max);

/* Block until op completes and collect it into *done (may be NULL). -ENOENT for an op
 * already collected, -EINVAL for one never issued. */
int dstore_wait(struct dstore *s, uint64_t op, struct dstore_done *done);

/* dstore_wait, giving up after timeout_ms (negative: never) with -ETIMEDOUT, the op left
 * to collect later. Any thread may wait for an op, beside the owner's other calls, as long
 * as nobody else collects that op. */
int dstore_wait_for(struct dstore *s, uint64_t op, int timeout_ms, struct dstore_done *done);

/* dstore_write + dstore_wait. */
int dstore_put(struct dstore *s, const struct dstore_wpage *pages, size_t n, int *results);

/* dstore_read + dstore_wait. */
int dstore_get(struct dstore *s, const struct dstore_rpage *pages, size_t n, int *results);

/* present[i] = whether keys[i] (n keys of DSTORE_KEY_BYTES, back to back) has a valid
 * record now. */
int dstore_exists(struct dstore *s, const uint8_t *keys, size_t n, bool *present);

/* *run = how many of the first keys are all present (stops at the first miss). */
int dstore_leading_run(struct dstore *s, const uint8_t *keys, size_t n, size_t *run);

/* Delete the records of n keys and free their slots; waits until the deletion has
 * committed (behind writes queued before it). *deleted (may be NULL) = how many existed. */
int dstore_delete(struct dstore *s, const uint8_t *keys, size_t n, size_t *deleted);

/* Evict up to max_pages least recently accessed pages; waits until committed. *evicted (may
 * be NULL) = how many went. Writes also evict on their own when the store is full. */
int dstore_evict(struct dstore *s, size_t max_pages, size_t *evicted);

/* Count the pages of n keys as accessed now (the LRU order, and the access time persisted
 * lazily), as read hits do, without reading them; keys not stored are skipped. *touched (may
 * be NULL) = how many were. A read-only store touches nothing. */
int dstore_touch(struct dstore *s, const uint8_t *keys, size_t n, size_t *touched);

/* Wait until every job queued so far has been applied and access times are persisted (a
 * commit when any wait), then make all of it durable: the index flushed and, in relaxed
 * mode, the slabs written since the last flush. */
int dstore_flush(struct dstore *s);

/* Wait until every job queued so far has been applied: the drops of records that reads found
 * bad among them (no access time is persisted, nothing is synced). */
int dstore_drain(struct dstore *s);

/* Call fn for every record of the index, in key order, from a snapshot. */
int dstore_iterate(struct dstore *s, dstore_visit_fn fn, void *arg);

/* Counters; may be called from any thread. */
void dstore_stats(struct dstore *s, struct dstore_stats *st);

/* ---- for inspectors (kvtier-ctl) ---- */

/* What a data dir is, from its meta record and its slab files as found at open. */
struct dstore_info {
    uint32_t format_version;
    uint8_t fingerprint[DSTORE_FINGERPRINT_BYTES];
    uint32_t page_bytes, page_tokens;
    uint32_t slot_bytes; /* page_bytes rounded up to the I/O alignment */
    uint32_t slab_slots; /* slots per slab file */
    uint32_t slabs;      /* slab files the capacity spans */
    uint32_t slab_files; /* of those, files found */
    uint64_t capacity_slots;
    uint64_t backed_slots; /* slots the slab files back (their sizes, rounded down) */
    uint64_t created_ns;   /* when the dir was created, wall clock */
};

void dstore_info(struct dstore *s, struct dstore_info *info);

/* *version = the format version of the data dir at dir, whatever it is, without judging it:
 * 0 when the dir holds a kvtier index (of any version), KVT_EFORMAT when it does not (or its
 * index is not an LMDB environment), KVT_ECORRUPT for a meta record of ours too short to
 * carry a version; -errno for a system error. Read-only, no lock. */
int dstore_peek_version(const char *dir, uint32_t *version);

/* What a meta record or a slab head says of the dir it belongs to. */
struct dstore_dir_id {
    uint32_t version, page_bytes, page_tokens;
    uint8_t fingerprint[DSTORE_FINGERPRINT_BYTES];
    uint64_t created_ns;
};

/* Whether the index of the data dir at dir is another dir's (an index copied over this one's):
 * 1 when its meta record agrees with no whole slab head there, with what the record says in
 * *index and what the first slab head says in *slabs; 0 when one agrees or there is no whole
 * head to compare; KVT_EFORMAT, KVT_ECORRUPT (the index's own damage), -EBUSY (a store of this
 * process has the dir open) or -errno. Read-only, no lock. */
int dstore_index_foreign(const char *dir, struct dstore_dir_id *index, struct dstore_dir_id *slabs);

/* dstore_iterate from the first key not below from (DSTORE_KEY_BYTES; NULL: the first). */
int dstore_iterate_from(struct dstore *s, const uint8_t *from, dstore_visit_fn fn, void *arg);

/* Call fn for key's record alone: its result, or -ENOENT when the index has none. */
int dstore_lookup(struct dstore *s, const uint8_t *key, dstore_visit_fn fn, void *arg);

/* Whether e (a valid entry) names a slot the slab files back now, with a page's length. A
 * slab file that grew since open is looked at again. */
bool dstore_entry_in_bounds(struct dstore *s, const struct dstore_entry *e);

/* For tests: the in-memory slot table's invariants (tags, children counts, chain ends): 0,
 * or -EUCLEAN with the first broken one in why. Writers only, once ready. */
int slots_check(struct dstore *s, char *why, size_t len);

/* Entries in the slot table (one per stored page, unless something outside kvtier changed
 * the index). */
uint64_t dstore_slot_entries(struct dstore *s);

#endif
