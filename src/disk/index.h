/*
 * The disk tier's index: an LMDB environment under <dir>/index with three databases, and the
 * byte formats of what they hold (docs/formats.md). Everything here is decoded as untrusted
 * input.
 *
 * "meta", one record under the key "format" (80 bytes, little-endian):
 *   0 magic "KVTIERDS" | 8 format version | 12 page_bytes | 16 page_tokens | 20 slot_bytes |
 *   24 slab_slots | 28 zero | 32 fingerprint[32] | 64 created ns | 72 XXH3-64 of bytes 0..71
 * Every format's record starts with the magic and its version and ends with such a check
 * (index_verdict). Versions DSTORE_FORMAT_OLDEST .. DSTORE_FORMAT_VERSION are ours (store.h).
 *
 * "pages", key = 32-byte page hash, value (128 + 4 * ntokens bytes, little-endian):
 *   0 record version | 4 slab | 8 slot | 12 length | 16 XXH3-128 of the page (canonical) |
 *   32 parent hash | 64 namespace | 96 created ns | 104 last access ns | 112 ntokens |
 *   116 zero | 120 XXH3-64 of key and bytes 0..119 and the tokens | 128 tokens (u32 each)
 * The record's own check catches junk before any field is used.
 *
 * "slots", the compact table the rebuild at open reads instead of the records: key = global
 * slot (u32, MDB_INTEGERKEY), value (48 bytes) = page hash | last access ns | the parent's
 * key_tag (little-endian). It is written in the same transactions as the records, so the two
 * always agree unless something outside kvtier changed the files; where they disagree, reads
 * miss.
 */
#ifndef KVT_DISK_INDEX_H
#define KVT_DISK_INDEX_H

#include <lmdb.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "disk/store.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t: a page's running checksum (page_hash) */
#include <xxhash.h>

typedef XXH3_state_t page_hash; /* 64-byte aligned */

#define DSTORE_RECORD_VERSION 1
#define META_BYTES 80
#define REC_HEAD_BYTES 128
#define SLOT_ENTRY_BYTES 48

struct dmeta {
    uint32_t version;
    uint32_t page_bytes, page_tokens;
    uint32_t slot_bytes, slab_slots;
    uint8_t fingerprint[DSTORE_FINGERPRINT_BYTES];
    uint64_t created;
};

/* A decoded record. tokens points into the value it was decoded from (little-endian u32s,
 * possibly unaligned). */
struct drec {
    uint32_t slab, slot, length;
    uint8_t sum[16];
    uint8_t parent[DSTORE_KEY_BYTES];
    uint8_t ns[DSTORE_NS_BYTES];
    uint64_t created, last_access;
    uint32_t ntokens;
    const uint8_t *tokens;
};

struct dindex {
    MDB_env *env;
    MDB_dbi pages, meta, slots;
};

/* The -errno or KVT_E* code for an LMDB result. */
int index_err(int mdb_rc);

/* Create an environment at path (a new, empty dir) holding only the meta record. */
int index_create(const char *path, const struct dmeta *m, size_t mapsize);

/* What an index holds, as its open judges it. Every format's meta record starts with the magic
 * and the version and ends with its check (8 bytes: XXH3-64, seed "kvtier", of the bytes before
 * it), so only a record whose check holds can say the index is of another format: one failing
 * it is damage, whatever its magic and version say. A file kvtier made always has the three
 * databases and the record, so one missing them is damage too. */
enum index_verdict {
    INDEX_UNSOUND,    /* not an LMDB file LMDB may read (it failed the walk, trust.h) */
    INDEX_UNNAMED,    /* a sound LMDB file without our databases or the meta record */
    INDEX_BAD_RECORD, /* a meta record failing its check */
    INDEX_FOREIGN,    /* an intact meta record with another magic */
    INDEX_OTHER,      /* an intact meta record of ours naming another format version */
    INDEX_OURS,       /* an intact meta record of this format, and our databases */
};

/* Open the environment at path and its databases, with a map of mapsize bytes (0: the size
 * the writer recorded). An index of another format (INDEX_FOREIGN, INDEX_OTHER), or a path
 * that is not an LMDB environment: KVT_EFORMAT; one without our databases or with a meta
 * record failing its check: KVT_ECORRUPT. Only an index trust.h vouches for may be opened. */
int index_open(struct dindex *ix, const char *path, bool readonly, size_t mapsize);

/* Judge the index at path read-only, as index_open does: 0 and *verdict (never
 * INDEX_UNSOUND) and *version (the record's version field, 0 when it has none), or what
 * index_open says of an environment LMDB refuses, or -errno. */
int index_examine(const char *path, enum index_verdict *verdict, uint32_t *version);

/* The same of the data dir at dir, walked first when trust.h asks for it (INDEX_UNSOUND when
 * the walk finds it damaged): 0, KVT_EFORMAT when it has no index/data.mdb, or -errno. For
 * kvtier-ctl's messages; read-only, no lock; -EBUSY while a store of this process has the dir
 * open (LMDB allows one environment of a file per process). */
int dstore_examine_index(const char *dir, enum index_verdict *verdict, uint32_t *version);

/* A read-only transaction, begun or renewed. The writer in another process may have grown
 * the index past this process's map (MDB_MAP_RESIZED): with remap, which the caller may ask
 * only while no other transaction of the environment is live in the process, the map is
 * grown to the writer's size and the call retried; without, -EAGAIN. */
int index_read_begin(struct dindex *ix, MDB_txn **txn, bool remap);
int index_read_renew(struct dindex *ix, MDB_txn *txn, bool remap);

/* Grow the map (no transaction of the environment may be live in the process). */
int index_set_mapsize(struct dindex *ix, size_t bytes);

/* A writer's commits from now on: MDB_NOMETASYNC (relaxed false: one flush per commit, the
 * meta page durable with the next) or MDB_NOSYNC (relaxed: no flush). */
int index_set_sync(struct dindex *ix, bool relaxed);

/* Flush the file, meta pages included: every commit so far is durable once it returns 0. */
int index_flush(struct dindex *ix);

/* Bytes of the file at path; 0 when it cannot be seen. */
uint64_t index_file_bytes(const char *path);

/* Close; a zeroed dindex is a no-op. */
void index_close(struct dindex *ix);

/* Read and decode the meta record: KVT_EFORMAT for an intact one of another format,
 * KVT_ECORRUPT for one that fails its check or is missing. */
int index_read_meta(struct dindex *ix, struct dmeta *m);

/* The format version of the meta record of the index at path (read-only; only "meta" is
 * needed), whatever it is, unjudged: KVT_EFORMAT when there is no record of ours,
 * KVT_ECORRUPT when it is too short to carry one. */
int index_peek_version(const char *path, uint32_t *version);

/* Set the check a meta record of len bytes ends with, as the kvtier writing it does (tests
 * forge the record of another format with it). */
void meta_seal(uint8_t *rec, size_t len);

size_t rec_bytes(uint32_t ntokens);

/* Encode r (with tokens, r->ntokens host-order ids, NULL for zeros) for key into out,
 * rec_bytes(r->ntokens) long. */
void rec_encode(const uint8_t *key, const struct drec *r, const uint32_t *tokens, uint8_t *out);

/* Decode and check a value read for key: 0, or KVT_ECORRUPT. */
int rec_decode(const uint8_t *key, const void *val, size_t len, struct drec *r);

/* The XXH3-128 of a page in canonical byte order. */
void page_checksum(const void *buf, size_t len, uint8_t out[16]);
/* The same sum over a page in n parts of len bytes each, in order. */
void page_checksum_parts(const void *const *parts, size_t n, size_t len, uint8_t out[16]);
/* The same sum taken as the page's bytes pass, in order: start, add each run, end. */
void page_hash_start(page_hash *h);
void page_hash_add(page_hash *h, const void *bytes, size_t n);
void page_hash_end(page_hash *h, uint8_t out[16]);

/* Record in txn that global slot g holds key (whose parent is parent, NULL for none), last
 * accessed at atime. */
int slot_put(struct dindex *ix, MDB_txn *txn, uint32_t g, const uint8_t *key, uint64_t atime,
             const uint8_t *parent);
/* The same with the parent's key_tag (0 for none), as slot_decode gives it. */
int slot_put_tag(struct dindex *ix, MDB_txn *txn, uint32_t g, const uint8_t *key, uint64_t atime,
                 uint64_t ptag);

/* Forget slot g in txn; a slot not in the table is no error. */
int slot_del(struct dindex *ix, MDB_txn *txn, uint32_t g);

/* A slot-table entry. */
struct slot_entry {
    uint32_t g;
    const uint8_t *key; /* into the value */
    uint64_t atime;
    uint64_t parent; /* key_tag of the parent's key; 0 for none */
};

/* Decode a slot-table entry: 0, or KVT_ECORRUPT for one of the wrong shape. */
int slot_decode(const MDB_val *k, const MDB_val *v, struct slot_entry *e);

/* The 64 bits of a key the slot table keeps of a parent: enough to find it among the slots
 * (a clash only misplaces an eviction preference, never a byte). 0 stands for no parent. */
uint64_t key_tag(const uint8_t *key);

/* key_tag of a parent key, 0 for the all-zero key that stands for none. */
uint64_t parent_tag(const uint8_t *parent);

/* A 64-bit digest of a raw value, to recognise it again later. */
uint64_t value_digest(const void *val, size_t len);

#endif
