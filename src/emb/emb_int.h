/*
 * The embedding cache's insides (emb.h), shared by its files.
 *
 * An entry is an embedding the cache knows in memory: on the device, on the host, both, or
 * on its way up from the store (filling). Entries are found by digest (format.h) in a chained
 * table and named to callers by handles, (generation << 32) | (index + 1), so a stale hold is
 * told from a live one. Each memory keeps its own LRU list of the entries with a copy there:
 * eviction takes the device's least recently used unheld copy (the host copy stays), and the
 * host's least recently used copy no op is reading or writing (an entry with neither copy is
 * forgotten). A read that fails detaches its entry from the table (FAILED): holders learn it
 * from kvt_emb_wait, and the last one to let go frees it.
 */
#ifndef KVT_EMB_INT_H
#define KVT_EMB_INT_H

#include <stdbool.h>

#include "emb/arena.h"
#include "emb/emb.h"
#include "emb/format.h"

#define EMB_NONE UINT32_MAX
#define EMB_DEVICE_UNIT 256u /* cudaMalloc's alignment */
#define EMB_HOST_UNIT 4096u  /* O_DIRECT's: host copies are the store's buffers */

enum emb_state {
    EMB_FREE = 0,    /* the slot is unused */
    EMB_LIVE = 1,    /* in the table, with a copy on the device or the host */
    EMB_FILLING = 2, /* in the table, its record being read from the store */
    EMB_FAILED = 3,  /* its read missed: out of the table, until its holders let go */
};

struct emb_entry {
    uint8_t digest[32];
    uint8_t item[32], nsd[32];
    uint32_t state, gen;
    uint32_t holds; /* callers' holds: the device copy is not evicted */
    uint32_t pins;  /* ops reading or writing the host copy: it is not evicted */
    uint32_t next;  /* next in its table chain */
    uint32_t tier;  /* where it came from last (enum kvt_emb_tier) */
    uint64_t len;   /* payload bytes; while filling, the most the device extent holds */
    bool on_dev, on_host;
    uint64_t dev_off, dev_len;           /* the device extent (dev_len: bytes asked for) */
    uint64_t host_off, host_len;         /* the host extent: the record, head first */
    uint64_t fill;                       /* filling: the op reading it */
    int fail_rc;                         /* failed: what the read said */
    uint32_t dprev, dnext, hprev, hnext; /* LRU lists: prev is older */
};

struct emb_lru {
    uint32_t oldest, newest;
    uint64_t count;
};

/* A read or write of a record in the store. */
struct emb_op {
    uint64_t id;       /* the cache's (kvt_emb.op) */
    uint64_t store_op; /* the store's */
    uint32_t kind;     /* enum store_op_kind */
    uint32_t entry;    /* a read's entry; a write's when it writes the host copy (pinned) */
    size_t n;          /* chunks */
    int *results;
    uint8_t *buf;   /* the record: the host copy, or stage */
    void *stage;    /* an aligned copy owned by the op; NULL when buf is the host copy */
    uint8_t *rkeys; /* a read's keys (n x 32) */
    struct store_rpage *rpages;
};

struct emb_cache {
    const struct dev_backend *be;
    struct kvt_store *store; /* NULL: none */
    uint64_t chunk;          /* the store's page bytes */
    uint8_t *dev, *host;     /* the two allocations (host NULL: none) */
    struct emb_arena dev_arena, host_arena;
    struct emb_lru dlru, hlru;
    struct emb_entry *e;
    uint32_t n, cap, free_head; /* slots used at least once; free ones chained by next */
    uint32_t *buckets;          /* chain heads by digest */
    uint32_t nbuckets, live;    /* live: entries in the table */
    uint64_t held;              /* entries with holds */
    struct emb_op *ops;
    size_t nops, ops_cap;
    uint64_t last_op;
    struct page_hasher hasher;
    uint8_t root[32];           /* namespace root of every chunk */
    uint8_t (*keys)[32];        /* scratch: a record's chunk keys */
    struct store_wpage *wpages; /* scratch: a write's pages */
    size_t keys_cap;
    struct kvt_emb_stats count;
};

/* ---- table.c ---- */
int emb_table_init(struct emb_cache *c);
void emb_table_finish(struct emb_cache *c);
/* The live or filling entry of digest; EMB_NONE. */
uint32_t emb_table_find(const struct emb_cache *c, const uint8_t *digest);
/* A new live entry for digest (no copies yet), in the table: its index, or EMB_NONE (no
 * memory). */
uint32_t emb_table_add(struct emb_cache *c, const uint8_t *digest, const uint8_t *item,
                       const uint8_t *nsd);
/* Out of the table; the slot is freed when no holder is left (else it waits, FAILED). */
void emb_table_detach(struct emb_cache *c, uint32_t i, int rc);
/* The entry a handle names, held; EMB_NONE. */
uint32_t emb_table_held(const struct emb_cache *c, uint64_t handle);
uint64_t emb_table_handle(const struct emb_cache *c, uint32_t i);
void emb_table_hold(struct emb_cache *c, uint32_t i);
/* Drop a hold; a failed entry's last frees its slot. */
void emb_table_unhold(struct emb_cache *c, uint32_t i);
/* LRU lists: which 0 device, 1 host. */
void emb_lru_remove(struct emb_cache *c, int which, uint32_t i);
void emb_lru_touch(struct emb_cache *c, int which, uint32_t i); /* to newest (insert if absent) */

/* ---- room.c ---- */
/* Bytes a record of len payload bytes takes on the host: whole chunks with a store. */
uint64_t emb_room_record_bytes(const struct emb_cache *c, uint64_t len);
/* A device extent of len bytes for entry i, evicting unheld copies least recently used first
 * when there is no hole: 0, or -ENOMEM having evicted nothing. */
int emb_room_device(struct emb_cache *c, uint32_t i, uint64_t len);
/* A host extent of bytes for entry i, evicting likewise (unpinned copies): 0, -ENOMEM. */
int emb_room_host(struct emb_cache *c, uint32_t i, uint64_t bytes);
/* A host copy of entry i's record (x->len bytes of payload): 0, -ENOMEM. */
int emb_room_host_record(struct emb_cache *c, uint32_t i, const void *payload);
/* Drop entry i's device or host copy; an entry left with neither leaves the table. */
void emb_room_drop_device(struct emb_cache *c, uint32_t i);
void emb_room_drop_host(struct emb_cache *c, uint32_t i);
/* Copy the host copy's payload onto the device extent: 0 or KVT_EBACKEND. */
int emb_room_host_to_device(struct emb_cache *c, uint32_t i);

/* ---- below.c ---- */
/* Apply what the store finished, without waiting (at most max ops: bounded work per call). */
void emb_below_poll(struct emb_cache *c, size_t max);
/* Wait up to timeout_ms for op and apply it: 0, -ETIMEDOUT. */
int emb_below_wait(struct emb_cache *c, uint64_t op, int timeout_ms);
/* Write entry i's record (its host copy, or a staged record of payload) unless the store has
 * it whole. Failures cost only the copy below. */
void emb_below_write(struct emb_cache *c, uint32_t i, const void *payload);
/* Chunks of digest's record the store holds from the first; whether a remote store holds
 * any of them. */
size_t emb_below_run(struct emb_cache *c, const uint8_t *digest, bool *remote);
/* Start reading run chunks of entry i's record (filling, its device extent taken): 0 and the
 * op in its fill, or -ENOMEM. */
int emb_below_read(struct emb_cache *c, uint32_t i, size_t run);
/* Wait for every op and apply them. */
void emb_below_sync(struct emb_cache *c);
void emb_below_finish(struct emb_cache *c);

#endif
