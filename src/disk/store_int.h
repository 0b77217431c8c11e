/*
 * The block store's private state, shared by its files:
 *   store.c    open, close, the owner's API, ops and their completion
 *   read.c     the read path: lookup, pin, I/O, checksum
 *   slab.c     slab files: scan at open, create and extend, descriptors
 *   commit.c   the committer thread: write batches, deletes, eviction, access times
 *   drop.c     the records reads found bad, dropped together
 *   rebuild.c  the committer's first job: free-slot set and LRU order from the index
 *   share.c    the index's environment, one per dir for every store of the process
 *
 * Locking: one mutex (lock) guards everything below marked "locked": the slot table, the
 * LRU list, the free stack, the job queue, the op list, the slab descriptors and the
 * counters. The slot table's arrays are written without it by the rebuild alone, before
 * ready is set under it; nobody reads them before seeing ready.
 *
 * A global slot g is slot g % slab_slots of slab g / slab_slots; g < nslots always.
 */
#ifndef KVT_DISK_STORE_INT_H
#define KVT_DISK_STORE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "disk/dio.h"
#include "disk/index.h"
#include "disk/layout.h"
#include "disk/store.h"

#define NO_SLOT UINT32_MAX
#define DIRTY_MAX 4096 /* access times a write batch carries, at most; one step of persisting */
#define ACCESS_TXN_MAX 65536   /* access times in one transaction of their own, at most */
#define ACCESS_PERIOD_MS 30000 /* access_period_ms's default */
#define EARLY_MAX 1024         /* hits before the rebuild ended, kept to apply after it */
#define PIPE_BATCHES 4         /* write batches in flight at most (batch.c) */

/* Where a slot stands. A slot is in exactly one state; pins (reads in flight) are apart. */
enum slot_state {
    SLOT_FREE = 0,     /* on the free stack (or, before ready, unknown) */
    SLOT_RESERVED = 1, /* taken by a write batch in flight */
    SLOT_USED = 2,     /* a committed record names it; on the LRU list */
    SLOT_DYING = 3,    /* its record is being deleted: no new pins, not on the LRU */
    SLOT_DEAD = 4,     /* record deleted, still pinned: freed by the last unpin */
};

/* How many used slots name a parent tag. */
struct tag_count {
    uint64_t tag; /* 0: an empty bucket */
    uint32_t count;
};

/* A list of slots through per-slot links (NO_SLOT ends). */
struct slot_list {
    uint32_t *prev, *next;
    uint32_t head, tail;
};

struct dslab {
    int dfd;        /* O_DIRECT descriptor, -1 when none */
    int bfd;        /* buffered descriptor, -1 until needed */
    uint32_t valid; /* slots the file backs now (its size / slot_bytes, capped) */
    bool unflushed; /* the committer's: written since the last flush (relaxed mode) */
};

/* One page of an op: a copy of the caller's description and the I/O that moves it. */
struct dop_page {
    struct dop *op;
    uint8_t key[DSTORE_KEY_BYTES];
    uint8_t parent[DSTORE_KEY_BYTES];
    uint8_t ns[DSTORE_NS_BYTES];
    uint8_t sum[16];
    uint32_t *tokens; /* writes: page_tokens ids, in the op's allocation */
    void *buf;
    void *const *parts; /* or the page's parts (nparts > 0), the caller's */
    uint32_t nparts;
    struct iovec *iov;       /* the body's regions when in parts, in the op's allocation */
    uint8_t *block;          /* the page's tail block (layout.h), in the op's allocation */
    uint32_t slot;           /* global slot, NO_SLOT when none */
    struct dop_page *dup_of; /* writes: an earlier page of the batch with the same key */
    bool dup;                /* writes: stored already (or by dup_of); no I/O */
    int res;                 /* the page's result: 0 or -errno / KVT_E* */
    /* The page's I/O (page_io_prepare): the body, then the tail block, nio of them used. */
    struct dio_req io[2];
    uint32_t nio;
    uint32_t io_left; /* locked: requests not landed yet */
    bool cached;      /* reads: through the page cache, which held the page (DSTORE_CACHED) */
    page_hash *hash;  /* a fused store's (s->fused): the checksum taken as the body passes */
};

struct batch; /* batch.c's: a write batch in flight */

struct dop {
    struct dop *next; /* the live list: submitted, not yet collected; locked */
    struct dstore *s;
    struct batch *batch; /* writes: the batch running it, set when that starts */
    uint64_t id;
    uint32_t kind; /* enum dstore_op_kind */
    uint32_t n, pending, ok;
    bool done;
    int *results;
    uint8_t *blocks;   /* the pages' tail blocks, block-aligned; NULL when none are needed */
    struct iovec *iov; /* the bodies' regions of its pages in parts, in this allocation */
    page_hash *hashes; /* the pages' running checksums (s->fused); NULL when not */
    struct dop_page pages[];
};

enum djob_kind {
    JOB_WRITE = 0, /* a write op: batched with the writes queued right behind it */
    JOB_DELETE,    /* keys given by the owner; synchronous */
    JOB_EVICT,     /* count pages of LRU; synchronous */
    JOB_FLUSH,     /* nothing but the access times; synchronous */
    JOB_BARRIER,   /* nothing: done once every job queued before it is; synchronous */
};

struct djob {
    struct djob *next;
    enum djob_kind kind;
    struct dop *op; /* JOB_WRITE */
    uint8_t *keys;  /* JOB_DELETE: n keys */
    size_t n;       /* JOB_DELETE: keys; JOB_EVICT: pages at most */
    /* synchronous jobs: the owner waits for done */
    bool done;
    int rc;
    size_t result;
};

/* A record a read found bad, waiting for the committer to drop it (drop.c). */
struct drop_req {
    uint8_t key[DSTORE_KEY_BYTES];
    uint64_t digest; /* with NO_SLOT: value_digest of the bad record */
    uint32_t g;      /* the slot the bad bytes came from, or NO_SLOT */
    bool held;       /* nothing but the drop (or a delete) can free g */
};

/* An access time on its way to the index. */
struct touched {
    uint32_t g;
    uint8_t key[DSTORE_KEY_BYTES];
    uint64_t atime;
};

struct early_touch {
    uint32_t g;
    uint8_t key[DSTORE_KEY_BYTES];
};

struct dstore {
    struct dstore_options o;
    char *dir;
    bool ro;
    bool created;       /* this open created the dir's index */
    bool recovering;    /* the index was rebuilt empty: the committer recovers it from slabs */
    bool index_walked;  /* the index was read whole by a child before this process opened it */
    bool index_foreign; /* its meta record was another dir's: no slab head agreed with it */
    int dirfd, slabfd, lockfd; /* the data dir, slabs/, the lock file */
    struct dindex ix;          /* the environment this process's stores of the dir share */
    struct share *share;       /* share.c's entry for the dir */
    bool share_joined;         /* a read-only store that found the environment open already */
    MDB_txn *rtxn;             /* the owner's read transaction, reset between calls */
    MDB_txn *ctxn;             /* the committer's */

    struct dmeta meta; /* the dir's meta record as read at open */
    /* the dir's geometry, from meta */
    uint32_t page_bytes, page_tokens, slot_bytes, slab_slots;
    struct slot_layout lay; /* where a page's bytes and head sit in its slot */
    uint64_t fp_digest;     /* of the dir's fingerprint, as page heads carry it */
    uint64_t nslots;        /* capacity in slots */
    uint32_t nslabs;        /* slabs covering nslots */
    bool direct;            /* O_DIRECT works and slot offsets meet its alignment */
    bool in_memory;         /* the slabs are on tmpfs: grown sparse, allocated as written */
    /* In memory, on the psync engine, pages of a body: each body's checksum is taken as the
     * engine copies it (dio_req.each), step by step, while the bytes are in the cache, not in
     * a pass of its own (batch.c, read.c). */
    bool fused;
    bool no_cachestat; /* locked: the kernel refused cachestat (DSTORE_CACHED) */
    bool relaxed;      /* the committer's: relaxed commits since the stamp's revoke */
    uint32_t mem_align;

    struct dio *io;
    pthread_t committer;
    bool committer_started;

    pthread_mutex_t lock;
    pthread_cond_t job_cv;  /* the committer: a job arrived, a batch landed, or stop */
    pthread_cond_t done_cv; /* an op or a synchronous job finished; the rebuild ended */

    struct dslab *slabs; /* locked */

    /* slot table, indexed by global slot (slots.c) */
    uint8_t *state;
    uint16_t *pins;                    /* locked */
    uint8_t (*skey)[DSTORE_KEY_BYTES]; /* the key a RESERVED/USED/DYING slot holds */
    uint64_t *atime;                   /* last access, ns */
    uint64_t *ptag;                    /* the parent's key_tag; 0 for none */
    uint32_t *kids;                    /* used slots whose parent this one is */
    struct slot_list lru;              /* locked: every used slot, most recent at the head */
    uint32_t *ends;    /* locked: the used slots without stored children, a min-heap on atime */
    uint32_t *end_pos; /* each slot's place in it, plus 1; 0: not a chain end */
    uint32_t nends;
    uint32_t *map;             /* locked: key_tag -> used slot, open addressing */
    uint64_t map_size;         /* buckets, a power of two */
    uint32_t map_shift;        /* 64 - log2(map_size) */
    uint64_t tags_shadowed;    /* locked: used slots not in the map (their tag's entry is
                                * another key's) */
    struct tag_count *waiting; /* locked: children of parents not stored, by tag */
    uint64_t wait_size, wait_used;
    uint32_t wait_shift;
    uint32_t *freestk;         /* free slots, lowest on top after the rebuild */
    uint64_t nfree;            /* locked */
    uint8_t *dirty_bit;        /* the slot's access time awaits persisting */
    uint32_t *dirty;           /* locked: those slots, each once (nslots of room) */
    uint32_t ndirty;           /* locked */
    uint64_t dirty_since;      /* locked: mono_ns() when the oldest of them was touched */
    struct early_touch *early; /* locked: hits served before ready, oldest first */
    uint32_t nearly;
    bool ready;     /* locked: the rebuild finished */
    int broken;     /* locked: the rebuild's failure; writes fail with it */
    uint64_t clock; /* locked: the last time stamp handed out */

    /* the committer's, relaxed mode: page bytes written since the last flush, and since when
     * (mono_ns(); 0: nothing waits) */
    uint64_t unflushed_bytes, unflushed_since;

    struct touched *touched; /* the committer's: DIRTY_MAX access times being persisted */
    uint8_t *recbuf;         /* the committer's: one encoded record */

    struct djob *jhead, *jtail; /* locked */
    struct drop_req *drops;     /* locked: drops waiting, ndrops of drops_cap */
    size_t ndrops, drops_cap;
    uint64_t drops_since; /* locked: mono_ns() when the oldest of them was noted */
    bool drops_unheld;    /* locked: one of them holds no slot: it runs before any write */
    bool stop;            /* locked: the committer drains and exits */
    /* the committer's (read under the lock): write batches in flight, oldest first */
    struct batch *pipe, *pipe_tail;
    uint32_t piped;       /* batches in the pipe */
    uint64_t piped_pages; /* their pages */

    struct dop *ohead, *otail; /* locked: live ops in submission order */
    uint64_t last_id;          /* locked */
    uint64_t live;             /* locked */

    struct dstore_stats st; /* locked: the counters; gauges are filled by dstore_stats */
};

/* A monotonic clock in ns, the one the condition variables wait on. */
static inline uint64_t mono_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* ---- share.c: one environment per dir per process ---- */

struct share;
/* Right after the dir is opened: a writer reserves the dir for its open (-EBUSY when a store
 * of this process has it open); a read-only store joins the environment open already
 * (share_joined, s->ix set; it waits while another store is opening it), or reserves it. */
int share_join(struct dstore *s);
/* The store that reserved the dir opened s->ix: the next ones join it. */
void share_ready(struct dstore *s);
/* Leave (the environment closes with its last store); instead of index_close. */
void share_leave(struct dstore *s);
/* Whether a store of this process has the dir at dirfd open. */
bool share_busy(int dirfd);
/* A snapshot of the shared environment, begun or renewed (*txn given), and its end; a
 * read-only store adopts a map its writer grew only while no other snapshot of the dir's is
 * live in the process. */
int share_read(struct dstore *s, MDB_txn **txn, bool renew);
void share_read_end(struct dstore *s);
/* The meta record of a joined environment (a short transaction of its own, never beside a
 * remap). */
int share_read_meta(struct dstore *s, struct dmeta *m);

/* ---- snapshot.c ---- */

/* Read snapshots of the index for the owner: begun and ended, or the owner's rtxn renewed and
 * reset. A read-only store adopts a map its writer grew when no other snapshot is live. */
int snapshot_begin(struct dstore *s, MDB_txn **txn);
void snapshot_end(struct dstore *s, MDB_txn *txn);
int snapshot_renew(struct dstore *s);
void snapshot_reset(struct dstore *s);

/* ---- queue.c: jobs and op completion, under the lock ---- */

/* One more page of op finished; completes the op when it was the last. */
void op_page_done_locked(struct dstore *s, struct dop *op);
/* Queue a job for the committer. */
void job_push_locked(struct dstore *s, struct djob *j);
/* Free a list of jobs taken off the queue (their keys; not their ops). */
void job_free_all(struct djob *jobs);

/* ---- records.c: the index's records ---- */

/* Look up and check key's record in txn: 0 and *r, -ENOENT, or KVT_ECORRUPT / bounds
 * errors (counted). *digest gets the raw value's digest where one was read. */
int lookup_record(struct dstore *s, MDB_txn *txn, const uint8_t *key, struct drec *r,
                  uint64_t *digest);
/* Whether r names a slot the slabs back now (locked). */
bool record_in_bounds_locked(const struct dstore *s, const struct drec *r);
/* A write transaction (committer); a failure is counted. */
int txn_begin(struct dstore *s, MDB_txn **txn);
/* Commit txn (through the fault seam); a failure is counted, the txn gone either way. */
int txn_commit(struct dstore *s, MDB_txn *txn);
/* Count a failed index write: the disk full, or anything else LMDB said. */
void count_index_error(struct dstore *s, int rc);
/* Flush the index: every commit so far durable (a failure is counted). */
int flush_index(struct dstore *s);
/* txn_commit for a transaction that deletes records: in durable mode the index is flushed
 * too, so the slots it frees may be written again once it returns 0. */
int txn_commit_freeing(struct dstore *s, MDB_txn *txn);

/* Which of key's records to delete: the one naming a slot, the one with a digest, any. */
struct rec_match {
    uint32_t g; /* NO_SLOT: by digest, or any */
    uint64_t digest;
    bool any;
};

/* Delete key's record when it is junk or matches m. *slot gets the slot the record named,
 * NO_SLOT when none. -ENOENT when nothing was deleted. */
int delete_record(struct dstore *s, MDB_txn *txn, const uint8_t *key, struct rec_match m,
                  uint32_t *slot);

/* ---- slots.c: the slot table, under the lock ---- */

/* A strictly increasing wall-clock time stamp (ns). */
uint64_t stamp_locked(struct dstore *s);
/* g holds a committed record now (or again): on both lists, in the parent's count. */
void slot_use_locked(struct dstore *s, uint32_t g, uint64_t parent_tag);
/* A used g stops taking readers (DYING): off the lists, out of its parent's count. */
void slot_unuse_locked(struct dstore *s, uint32_t g);
/* A DYING g is used again (a deletion that did not commit). */
void slot_revive_locked(struct dstore *s, uint32_t g);
/* g leaves its record behind; free it unless a read still holds it. */
void slot_release_locked(struct dstore *s, uint32_t g);
/* Drop one pin of slot g; the last pin of a dead slot frees it. */
void unpin_locked(struct dstore *s, uint32_t g);
/* A page of g was just used (read or rewritten). */
void touch_locked(struct dstore *s, uint32_t g);
/* key was read from g before the rebuild ended; applied once it has. */
void touch_early_locked(struct dstore *s, uint32_t g, const uint8_t *key);
/* Up to want unpinned victims, chain ends first, oldest first; each now DYING. */
size_t pick_victims_locked(struct dstore *s, size_t want, uint32_t *victims);
/* The used slot holding the key of this tag, or NO_SLOT. */
uint32_t tag_find_locked(const struct dstore *s, uint64_t tag);
/* True when the slot table alone shows that no used slot holds key; false when it cannot
 * tell (the table not known, a tag shadowed) or a used slot may hold it. */
bool tag_absent_locked(const struct dstore *s, const uint8_t *key);
/* Empty the LRU list and the chain ends (before the rebuild links them). */
void lists_reset_locked(struct dstore *s);
/* The rebuild: the n used slots, oldest first, into the map, the counts and the lists. */
void slots_link_all(struct dstore *s, const uint32_t *by_age, uint64_t n);
/* A free slot no reader still holds, or NO_SLOT. */
uint32_t pop_free_locked(struct dstore *s);
/* A live slot g of key stops taking readers; whether it was live. */
bool kill_locked(struct dstore *s, uint32_t g, const uint8_t *key);

/* ---- read.c ---- */

/* Submit op's page reads; *leading (may be NULL): the first pages found and on their way. */
int read_submit(struct dstore *s, struct dop *op, const struct dstore_rpage *pages,
                size_t *leading);

/* ---- slab.c ---- */

/* Open slabs/ and the slab files found in it; O_DIRECT probed on the first. */
int slabs_open(struct dstore *s);
void slabs_close(struct dstore *s);
/* Make slab back slot (created, grown past it): the committer, before writing it. */
int slab_ready(struct dstore *s, uint32_t slab, uint32_t slot);
/* Under the lock: the descriptor for a page I/O on slab from/into buf; -1 when none. */
int slab_fd_locked(struct dstore *s, uint32_t slab, const void *buf);
/* Fill p's requests for its page at global slot g (p->buf or p->parts, p->block set): the
 * body (vectored over the parts) and, for writes or a page with a tail, the tail block. -EIO
 * when a descriptor cannot be had. */
int page_io_prepare(struct dstore *s, struct dop_page *p, uint32_t g, bool write,
                    void (*complete)(struct dio_req *r));
/* A page's buffer, or its parts, into p (the parts' body regions from *iov on, which moves
 * past them); false when there are none or the parts are not whole. */
bool page_take_bytes(struct dstore *s, struct dop_page *p, void *buf, void *const *parts,
                     uint32_t nparts, struct iovec **iov);
/* Bytes [from, from + len) of p's page copied out of it (gather) or into it (scatter),
 * whether it is one buffer or parts. */
void page_gather(const struct dstore *s, const struct dop_page *p, size_t from, size_t len,
                 uint8_t *out);
void page_scatter(const struct dstore *s, struct dop_page *p, size_t from, size_t len,
                  const uint8_t *in);
/* The checksum of p's whole page (page_checksum), one buffer or parts. */
void page_sum(const struct dstore *s, const struct dop_page *p, uint8_t out[16]);
/* A fused store's dio_req.each for a page's body: its bytes into the page's running sum. */
void page_body_step(struct dio_req *r, const void *bytes, size_t n);
/* Under the lock: one request of a page landed; the page once all of them have, else NULL.
 * Its result (the first failed request's) is in p->res. */
struct dop_page *page_io_landed_locked(struct dio_req *r);
/* fdatasync one slab (through the fault seam). */
int slab_sync(struct dstore *s, uint32_t slab);
/* *count = how many slab files there are from 0000 on, up to the first one missing. */
int slabs_found(struct dstore *s, uint32_t *count);
/* A writer, once the records past a lowered capacity are dropped: slab files past it go, and
 * the last is cut to the capacity. */
void slabs_trim(struct dstore *s);
/* Read-only stores: learn again how many slots slab's file backs (it may have grown). */
void slab_refresh(struct dstore *s, uint32_t slab);
/* The head of a slab file of the dir at dirfd (any one that is whole): 0, or KVT_EFORMAT
 * when there is none (no slab of ours). */
int slabs_first_head(int dirfd, struct slab_head *h);
/* Whether any whole slab head of the dir at dirfd describes the dir m does (*agrees; an
 * index copied from another dir names pages none of them holds), the first one found into
 * *first: 0, or KVT_EFORMAT when there is no whole head. */
int slabs_against_meta(int dirfd, const struct dmeta *m, struct slab_head *first, bool *agrees);

/* Under the lock: whether the slot table (state, keys, LRU) can be trusted. Before the
 * rebuild it is being written; after a failed one it is partial, and reads then go by the
 * records and checksums alone, as a read-only store does, and nothing is dropped. */
static inline bool table_known_locked(const struct dstore *s)
{
    return s->ready && !s->broken;
}

/* ---- lru.c: access times and eviction (the committer) ---- */

/* Access times are hints for the order after a restart, kept in memory (the order in this
 * process never waits for them) and written lazily: never a transaction, nor a sync, of their
 * own per read. */
/* Write up to max of the access times waiting into txn: 0, or the index error that stopped
 * it (the txn is then unusable; the times taken are lost, nothing else). */
int persist_access(struct dstore *s, MDB_txn *txn, size_t max);
/* Up to ACCESS_TXN_MAX of them in a transaction of their own; whether more wait (false after
 * a failure). */
bool flush_access(struct dstore *s);
/* Under the lock: the mono_ns() time at which the access times waiting will have waited
 * access_period_ms for a commit to carry them, and get one of their own; UINT64_MAX when
 * none wait. */
uint64_t access_due_locked(const struct dstore *s);
/* Evict up to want of the oldest unpinned pages in one transaction; *evicted: how many. */
int evict_oldest(struct dstore *s, size_t want, size_t *evicted);

/* ---- flush.c: relaxed mode's flushes (the committer) ---- */

/* A write batch put bytes pages into slab without syncing it: they wait for a flush. */
void flush_note(struct dstore *s, uint32_t slab, uint64_t bytes);
/* Under the lock: the mono_ns() time the next flush falls due; UINT64_MAX when none waits. */
uint64_t flush_due_locked(const struct dstore *s);
/* fdatasync the slabs written since the last flush; 0 or the first failure (counted). */
int flush_slabs(struct dstore *s);
/* flush_slabs, then the index: everything committed so far is durable when it returns 0. */
int flush_all(struct dstore *s);

/* ---- batch.c: write batches in a pipe (the committer) ---- */

/* Under the lock: whether a batch of pages may start now beside those in flight. */
bool batch_room_locked(const struct dstore *s, size_t pages);
/* Under the lock: whether the oldest batch in flight has landed (all its I/O done). */
bool batch_landed_locked(const struct dstore *s);
/* Under the lock, with batch_landed_locked: whether the landed batches retire now, or wait
 * for those in flight behind them until *until (mono_ns). */
bool batch_retire_now_locked(const struct dstore *s, uint64_t *until);
/* Start a list of write jobs as one batch: slots reserved, writes submitted, into the pipe
 * (the pipe drains first where it must). The jobs are the batch's from then on. */
void batch_start(struct dstore *s, struct djob *jobs);
/* Sync, commit and complete the landed batches at the head of the pipe, as one group. */
void batch_retire(struct dstore *s);
/* Wait for every batch in flight and retire them all. */
void batch_drain(struct dstore *s);

/* ---- drop.c: records found bad, dropped together ---- */

/* Under the lock: note that a read found key's record bad: its bytes, read from slot g, or
 * (NO_SLOT) the record itself, whose value_digest was digest. */
void drop_note_locked(struct dstore *s, const uint8_t *key, uint32_t g, uint64_t digest);
/* Under the lock: the mono_ns() time the drops waiting fall due; UINT64_MAX when none wait. */
uint64_t drops_due_locked(const struct dstore *s);
/* The committer: every drop waiting, in one transaction (flushed in durable mode). */
void drops_run(struct dstore *s);

/* ---- commit.c ---- */

int committer_start(struct dstore *s);
/* Drain the queue, persist access times, and join. */
void committer_stop(struct dstore *s);
/* Queue a synchronous job and wait for it; its rc. */
int job_run(struct dstore *s, struct djob *j);

/* ---- recover.c ---- */

/* The committer's first step when the index was set aside: records and slot entries from
 * the slabs' page heads. 0, or the index error that stopped it (what was committed stays). */
int recover(struct dstore *s);

/* ---- rebuild.c ---- */

/* The committer's first step: slot table, free stack and LRU from the index; bad records
 * dropped. Sets ready (and broken on failure). */
void rebuild(struct dstore *s);

/* ---- the data dir at open (dir.c) ---- */

int dir_prepare(struct dstore *s);   /* classify, create or refuse the dir; take the lock */
int index_prepare(struct dstore *s); /* open, check or rebuild the index; adopt its meta */
/* The slot table and its maps: table_alloc at open takes the memory, which the committer
 * fills first (table_init, then the rebuild), so an open's time does not grow with the dir. */
int table_alloc(struct dstore *s);
void table_init(struct dstore *s);
void table_free(struct dstore *s);

#endif
