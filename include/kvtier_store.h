/*
 * kvtier's page store: the engine's disk tier on its own, for a serving engine that keeps its
 * own GPU and host tiers (SGLang's HiCache L3, through python/kvtier/sglang.py).
 *
 * A store is a data dir of whole KV pages named by 32-byte keys (SGLang's page hashes, or any
 * hash of the page's prefix). It is the format of the engine's disk tier: the same slab files,
 * page heads, checksums, index and write order, so kvtier-ctl reads, checks and repairs dirs
 * written through either. Every page read is checked; a page that fails is a miss, never
 * bytes. A dir remembers a fingerprint (the bytes the caller gives: model, weights revision,
 * dtype, layout, TP rank, anything that makes KV differ) and is refused to any other.
 *
 * A page is one or more segments of caller memory, together page_bytes long (SGLang's MHA
 * pages are two, K and V; MLA one; layer_first 2 x layers): on write the segments are
 * gathered, on read scattered back, in order. One-segment pages move without a copy.
 *
 * Conventions are kvtier.h's: 0 or a negated errno / KVT_E* code, errno never set.
 * Threads: every call may come from any thread at any time, concurrently (SGLang asks exists,
 * get and set from three threads at once); close excepted, which must be the last call.
 * Blocking: kvt_pagestore_get, _set, _delete and _wait block until their pages are done;
 * nothing else waits for I/O.
 */
#ifndef KVTIER_STORE_H
#define KVTIER_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_PAGESTORE_KEY_BYTES 32

typedef struct kvt_pagestore kvt_pagestore;

struct kvt_pagestore_options {
    size_t size;     /* sizeof(struct kvt_pagestore_options); set by kvt_pagestore_options_init */
    const char *dir; /* the data dir; created (0700) when missing, unless read_only */
    const void *fingerprint; /* the caller's identity of the KV (hashed); required */
    size_t fingerprint_len;
    uint64_t page_bytes;     /* bytes of one page, all its segments; 1 .. 2^31 */
    uint32_t page_tokens;    /* tokens a page covers, recorded in its head; 0 .. 4096 */
    uint64_t capacity_bytes; /* disk space for pages; the oldest go past it; default 1 GiB */
    uint32_t disk_io;        /* enum kvt_disk_io; default auto */
    uint32_t read_only;      /* 1: never writes the dir (beside a writer, or a dir on
                                read-only media); set and delete answer -EROFS */
    uint32_t sync; /* (since 0.8) enum kvt_disk_sync: DURABLE (the default: a set returns once its
                      pages are fdatasync'd and indexed) or RELAXED (the data and the index are
                      flushed every second or 256 MiB and at close: a power cut may lose
                      pages written since, each then a miss, never wrong bytes) */
    /* (since 0.8) A Redis or Valkey server below the disk, shared by every store of the same
     * fingerprint that names it: "redis://[[USER]:PASSWORD@]HOST[:PORT]", a cluster's seeds
     * comma-separated, or "rediss://..." (TLS, the server checked against the system's CAs).
     * A set writes each page to the disk and to the server (a page is stored when either kept
     * it); a get reads each page from the disk, or from the server where the disk lacks it,
     * checked there as on the disk. A server that is down, slow or emptied costs only hits:
     * its part of an op fails within remote_timeout_ms. NULL: the disk alone. In a build
     * without the Redis store (-Dredis=disabled) any remote is KVT_ENOBACKEND. */
    const char *remote;
    uint32_t remote_timeout_ms; /* connect, read and write timeouts, and the longest an exists
                                   waits for the server; 0: 1000 */
    uint32_t remote_ttl_s;      /* seconds a page lives on the server; 0: until it evicts it */
    /* (since 0.9) Pages above 128 KiB: 0 (the default) writes them through the page cache and
     * reads them from it while it holds them (a copy, as SGLang's file backend reads), else
     * with O_DIRECT; 1 (bypass) writes and reads them with O_DIRECT only, as vLLM's fs tier
     * does (no second copy beside an engine's own CPU tier; faster writes where the page cache's
     * flushes would bound them). Pages of 128 KiB or less always go through the page cache. */
    uint32_t page_cache_bypass;
};

/* Defaults into o, size bytes of it (sizeof(*o)). */
void kvt_pagestore_options_init(struct kvt_pagestore_options *o, size_t size);

/* Open (or create) the store at o->dir. Blocks: reads the index head and starts the
 * background rebuild; a dir damaged or left by a crash is checked and recovered first.
 * Errors: -EINVAL (a missing or out-of-range option, a size field of a newer struct with
 * fields this build does not know set), KVT_EFINGERPRINT (the dir holds another
 * fingerprint's pages or another page size), KVT_EFORMAT (not a kvtier dir), -EBUSY (another
 * writer holds it; or, for a writer, a store of this process has the dir open), -ENOMEM, or
 * the error of the file system or of io_uring.
 * Stores of one dir in one process share its index (LMDB allows a process one environment per
 * file): a read-only store opened beside a writer, or beside another reader, of the same dir
 * in this process joins it, and any of them may close first; a writer opened while a store of
 * this process has the dir open is refused (-EBUSY), so open the writer first. The engine's
 * disk tier (kvt_open with disk_dir) is such a writer too. */
int kvt_pagestore_open(const struct kvt_pagestore_options *o, kvt_pagestore **out);

/* Wait for every op, make what was written durable, close. NULL is a no-op. */
void kvt_pagestore_close(kvt_pagestore *s);

/* One region of a page in caller memory. */
struct kvt_segment {
    void *addr;
    size_t len;
};

/* One page: its key, its parent's key (the page before it in its sequence; NULL for a first
 * page or when unknown: eviction then treats it as the start of a chain) and its segments,
 * whose lengths add up to page_bytes. The segments are read by set and written by get; they
 * stay the caller's and must stay valid until the call (or the submitted op) completes. */
struct kvt_page {
    const uint8_t *key;
    const uint8_t *parent;
    const struct kvt_segment *segs;
    uint32_t nsegs;
};

/* *run = how many of the n keys (back to back, 32 bytes each), from the first, are all
 * stored: SGLang's batch_exists. With a remote, keys the disk lacks are asked of the server,
 * which may take up to remote_timeout_ms (a server that does not answer: not stored).
 * Errors: -EINVAL. */
int kvt_pagestore_exists(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *run);

/* The same run on this machine's disk alone: never waits for the network (since 0.8). */
int kvt_pagestore_exists_local(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *run);

/* Read n pages into their segments. results[i]: 0 (the page's bytes are in its segments),
 * -ENOENT (not stored), KVT_ECORRUPT (failed its checks: a miss, dropped from the dir), -EIO.
 * A page whose result is not 0 has its segments in an unspecified state. Blocks.
 * Errors (nothing read): -EINVAL (a NULL key or segment, segments not adding up to
 * page_bytes), -ENOMEM. */
int kvt_pagestore_get(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results);

/* Store n pages. results[i]: 0 (stored, or stored already), -ENOSPC (no room: a batch
 * larger than the store keeps its first pages), another -errno. Blocks until the pages are
 * durable (sync RELAXED: written and indexed). Errors: as get, and -EROFS for a read-only store. */
int kvt_pagestore_set(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results);

/* The same, without waiting: *op names the op, which kvt_pagestore_wait collects. The
 * segments (and results) must stay valid until then. */
int kvt_pagestore_submit_get(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results,
                             uint64_t *op);
int kvt_pagestore_submit_set(kvt_pagestore *s, const struct kvt_page *pages, size_t n, int *results,
                             uint64_t *op);

/* Wait up to timeout_ms (negative: no limit; 0: do not wait) for op, then collect it:
 * *ok = its pages whose result is 0. Errors: -ETIMEDOUT (not done yet; wait again),
 * -ENOENT (collected already), -EINVAL (never submitted). */
int kvt_pagestore_wait(kvt_pagestore *s, uint64_t op, int timeout_ms, size_t *ok);

/* A descriptor that becomes readable when a submitted op completes (read it to rearm; an
 * eventfd counting completions), for a caller's poll loop. Valid until close. With a remote,
 * an op whose server part ends last may complete without a count: such a loop also waits
 * with a timeout (kvt_pagestore_wait with 0 tells). */
int kvt_pagestore_event_fd(kvt_pagestore *s);

/* Count the pages of n keys as used now, as a read of them would (eviction takes the least
 * recently used first); keys not stored are skipped. *touched (may be NULL) = how many were
 * stored. No I/O: the access times reach the index with a later commit. Errors: -EINVAL, an
 * index error. A read-only store counts nothing (0). */
int kvt_pagestore_touch(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *touched);

/* Delete the pages of n keys; *deleted = how many were stored. Blocks. Errors: -EINVAL,
 * -EROFS, -ENOMEM, an index error. */
int kvt_pagestore_delete(kvt_pagestore *s, const uint8_t *keys, size_t n, size_t *deleted);

/* Delete every page (SGLang's clear). Blocks. Errors: as delete. */
int kvt_pagestore_clear(kvt_pagestore *s);

struct kvt_pagestore_stats {
    size_t size;             /* sizeof(struct kvt_pagestore_stats); set by the caller */
    uint64_t pages;          /* pages stored */
    uint64_t capacity_pages; /* pages the capacity holds */
    uint64_t page_bytes;
    uint64_t gets, get_hits; /* pages asked for and found */
    uint64_t sets, set_dups; /* pages given, and of those stored already */
    uint64_t bytes_read, bytes_written;
    uint64_t evicted, deleted;
    uint64_t errors;    /* checksums, records, I/O, a full disk: each a miss or a page lost */
    uint64_t recovered; /* pages whose index records were rebuilt from the slabs at open */
    uint32_t disk_io;   /* enum kvt_disk_io in use */
    uint32_t read_only;
    /* (since 0.8) The remote (options.remote; 0 without one); the counters above count the
     * disk alone. */
    uint32_t remote;        /* 1: a server below the disk */
    uint64_t remote_reads;  /* pages a get read from the server (the disk lacked them) */
    uint64_t remote_errors; /* of errors, the server's: failed checks, pages an op failed */
    /* (since 0.9) Of get_hits from the disk, pages the page cache held whole: a copy, no
     * device read (pages above 128 KiB are read direct when the cache lacks them; smaller
     * pages always go through the cache, and are not counted here). */
    uint64_t cache_reads;
};

/* Counters and gauges of now into st (st->size bytes of it). Errors: -EINVAL. */
int kvt_pagestore_stats(kvt_pagestore *s, struct kvt_pagestore_stats *st);

#ifdef __cplusplus
}
#endif

#endif
