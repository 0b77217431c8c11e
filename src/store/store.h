/*
 * The store contract: what the tier below the host asks of a store of whole KV pages named by
 * 32-byte page hashes. It has the shape of SGLang's HiCacheStorage: leading_run is
 * batch_exists (the run of keys present from the first), read is batch_get, write is
 * batch_set, by page key into host pages, with a result per page.
 *
 *   struct kvt_store --ops--> disk  (disk/ops.c over the block store, disk/store.h)
 *                             mem   (store/mem.c: pages in memory, the template for a backend
 *                                    and the engine tests' fault seam)
 *                             chain (store/chain.c: stores in order, nearest first)
 *
 * A backend fills in one struct store_ops and embeds struct kvt_store first in its own
 * state; nothing above this file names a backend, and a backend includes nothing of the
 * engine (docs/tiers.md says how to write one).
 *
 * Ops are asynchronous: read and write queue a batch and return its id (ids grow from 1,
 * shared by reads and writes); poll collects what has completed, wait_for blocks for one op.
 * A page's buffer stays the caller's, untouched by the store after the op completes, and
 * valid until then. One owner thread calls every function except stats, which any thread may.
 *
 * Where a page came from: a store on another machine says so (ops->remote), and a chain,
 * which holds stores of both kinds, splits its figures by kind (store_done's split,
 * store_stats' remote_errors, run_remote), so the tier above counts the remote tier's hits,
 * reads, writes and errors apart from the disk's.
 */
#ifndef KVT_STORE_H
#define KVT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_KEY_BYTES 32
#define STORE_NS_BYTES 32

/* The most parts a page may come in, for a store that takes parts (ops->parts). */
#define STORE_MAX_PARTS 64

/* One page to write. key, parent, ns and tokens are copied at submit. */
struct store_wpage {
    const uint8_t *key;     /* STORE_KEY_BYTES */
    const uint8_t *parent;  /* the previous page's key; NULL: a first page */
    const uint8_t *ns;      /* STORE_NS_BYTES; NULL: zeros (the default namespace) */
    const uint32_t *tokens; /* the page's tokens; NULL: zeros */
    const void *buf;        /* the page's bytes */
    /* Or, nparts > 0 (only to a store with ops->parts): the page in nparts parts of
     * page_bytes / nparts bytes each, in order (nparts divides page_bytes, at most
     * STORE_MAX_PARTS); buf is then unused. Valid, like buf, until the op completes. */
    const void *const *parts;
    uint32_t nparts;
};

/* One page to read: buf (or, nparts > 0, the parts, as store_wpage's) holds the page where
 * its result is 0. */
struct store_rpage {
    const uint8_t *key;
    void *buf;
    void *const *parts;
    uint32_t nparts;
};

enum store_op_kind {
    STORE_OP_READ = 0,
    STORE_OP_WRITE = 1,
};

/* A completed op; per-page results are in the array given at submit: writes 0 stored (or
 * already there), -ENOSPC (no room, or a batch larger than the store), another -errno;
 * reads 0, -ENOENT (a miss), KVT_ECORRUPT (failed a check: a miss), -EIO. */
struct store_done {
    uint64_t op;
    uint32_t kind; /* enum store_op_kind */
    uint32_t pages;
    uint32_t ok; /* pages whose result is 0 */
    /* Set by a chain (split 1); any other store leaves them 0, and its pages are all of its
     * own kind (ops->remote). Reads: of the leading pages read (result 0 from the first
     * on), near_ok a near store (the disk) served, remote_ok a remote one. Writes: the pages
     * a near store kept, and those a remote one kept (a page kept by both counts in both). */
    uint32_t split;
    uint32_t near_ok, remote_ok;
};

struct store_stats {
    uint64_t capacity_pages;
    uint64_t pages;  /* pages held */
    uint64_t errors; /* failed checks, I/O errors, a full disk: each a miss or a page lost */
    uint64_t bytes_read, bytes_written;
    uint64_t in_flight;     /* ops submitted and not yet collected */
    uint64_t too_many;      /* pages refused: a batch held more than the whole store */
    uint64_t recovered;     /* pages whose records were rebuilt at open (disk) */
    uint32_t index_rebuilt; /* 1: the store's index was rebuilt at open (disk) */
    uint32_t io;            /* enum kvt_disk_io in use (disk); 0 otherwise */
    uint64_t remote_errors; /* of errors, a remote store's (ops->remote: all of them) */
};

struct kvt_store;

struct store_ops {
    const char *name;
    bool remote; /* the pages live on another machine (a Redis server), not on this one's disk */
    bool parts;  /* takes pages in parts (store_wpage.parts), moving them without a copy */
    /* *run = how many of the first keys (n, back to back) are all present. */
    int (*leading_run)(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run);
    /* Queue n page reads; *leading (may be NULL) = the first pages found and on their way,
     * which nothing evicts before they land. */
    int (*read)(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                uint64_t *op, size_t *leading);
    int (*write)(struct kvt_store *s, const struct store_wpage *pages, size_t n, int *results,
                 uint64_t *op);
    /* Collect up to max completed ops, oldest first, without blocking; how many. */
    size_t (*poll)(struct kvt_store *s, struct store_done *done, size_t max);
    /* Block until op completes, up to timeout_ms (negative: no limit), and collect it:
     * -ETIMEDOUT (left to collect later), -ENOENT (collected already), -EINVAL (never issued). */
    int (*wait_for)(struct kvt_store *s, uint64_t op, int timeout_ms, struct store_done *done);
    /* Wait until what the store does in the background for ops already collected is done
     * (the drops of bad pages a read found). */
    int (*drain)(struct kvt_store *s);
    void (*stats)(struct kvt_store *s, struct store_stats *st);
    /* Optional (NULL: the store is all one kind): of the first `pages` of the run the last
     * leading_run answered, how many a remote store holds (a chain's, nearest first). */
    size_t (*run_remote)(struct kvt_store *s, size_t pages);
    /* Wait for every op, then free everything; the buffers of ops in flight must stay valid
     * until it returns. */
    void (*close)(struct kvt_store *s);
};

/* Each backend's state starts with this. */
struct kvt_store {
    const struct store_ops *ops;
    uint32_t page_bytes;  /* bytes of one page */
    uint32_t page_tokens; /* tokens one page covers */
};

static inline int store_leading_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    return s->ops->leading_run(s, keys, n, run);
}

static inline int store_read(struct kvt_store *s, const struct store_rpage *pages, size_t n,
                             int *results, uint64_t *op, size_t *leading)
{
    return s->ops->read(s, pages, n, results, op, leading);
}

static inline int store_write(struct kvt_store *s, const struct store_wpage *pages, size_t n,
                              int *results, uint64_t *op)
{
    return s->ops->write(s, pages, n, results, op);
}

static inline size_t store_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    return s->ops->poll(s, done, max);
}

static inline int store_wait_for(struct kvt_store *s, uint64_t op, int timeout_ms,
                                 struct store_done *done)
{
    return s->ops->wait_for(s, op, timeout_ms, done);
}

static inline int store_drain(struct kvt_store *s)
{
    return s->ops->drain(s);
}

static inline void store_stats(struct kvt_store *s, struct store_stats *st)
{
    s->ops->stats(s, st);
}

/* Of the first pages of the last leading run, those a remote store holds. */
static inline size_t store_run_remote(struct kvt_store *s, size_t pages)
{
    if (s->ops->run_remote)
        return s->ops->run_remote(s, pages);
    return s->ops->remote ? pages : 0;
}

/* NULL is a no-op. */
static inline void store_close(struct kvt_store *s)
{
    if (s)
        s->ops->close(s);
}

#endif
