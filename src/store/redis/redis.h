/*
 * The Redis/Valkey store: whole KV pages on a standalone Redis or Valkey server, one value per
 * page, so engines on many hosts share what any of them wrote. The server is a best-effort
 * cache: it may evict (maxmemory policy, TTL) or lose everything (restart, FLUSHALL) at any
 * time, and anything may write to it, so every value read is checked against a header of its
 * own (magic, format, fingerprint, page key, length, XXH3-128: docs/formats.md) and a value
 * failing it is a miss (KVT_ECORRUPT), deleted, never served.
 *
 * Every network exchange happens on the store's I/O thread over its own connection, in
 * pipelined batches; the owner thread waits on the network only in leading_run (bounded by
 * exists_timeout_ms), wait_for and close. A server that fails or goes away fails the pages
 * of the ops in its way (-EIO, or -ECONNREFUSED while it refuses connections); the thread
 * reconnects with a doubling backoff and the store serves again when the server is back.
 */
#ifndef KVT_STORE_REDIS_H
#define KVT_STORE_REDIS_H

#include "store/store.h"

#define STORE_REDIS_FP_BYTES 32

struct store_redis_options {
    const char *host;                          /* NULL: "127.0.0.1"; copied at open */
    uint16_t port;                             /* 0: 6379 */
    const char *password;                      /* NULL: no AUTH; copied at open */
    uint8_t fingerprint[STORE_REDIS_FP_BYTES]; /* the KV's identity: keys and headers carry it */
    uint32_t page_bytes, page_tokens;
    uint32_t connect_timeout_ms; /* 0: 1000 */
    uint32_t read_timeout_ms;    /* a reply slower than this fails its pages; 0: 2000 */
    uint32_t write_timeout_ms;   /* 0: 2000 */
    uint32_t exists_timeout_ms;  /* the most leading_run waits; 0: read_timeout_ms */
    uint32_t backoff_max_ms;     /* the longest wait between reconnects; 0: 1000 */
    uint32_t ttl_s;              /* seconds a page lives (SET EX); 0: until evicted */
};

/* Start the store's I/O thread; connects on the first op, not here, so a server that is down
 * at open is one that comes later. -EINVAL (a zero page size, a page over 512 MiB), -ENOMEM,
 * or pthread_create's error. */
int store_redis_open(const struct store_redis_options *o, struct kvt_store **out);

/* What the store saw, for tests and tools; page counts unless named otherwise. */
struct store_redis_counters {
    uint64_t gets, hits, misses;
    uint64_t corrupt;        /* values that failed their checks: misses, deleted */
    uint64_t failed;         /* pages failed by the network or the server */
    uint64_t sets, set_dups; /* pages written, and of those there already (NX) */
    uint64_t connects;       /* connections made */
    uint64_t exists_late;    /* leading_run calls answered 0 for want of time or a server */
    uint32_t connected;      /* 1: the I/O thread holds a connection now */
};

/* -EINVAL when s is not a Redis store. */
int store_redis_counters(struct kvt_store *s, struct store_redis_counters *c);

/* The server key of a page: "kvt:<fingerprint hex>:<key hex>"; out holds
 * STORE_REDIS_KEY_CHARS + 1 bytes. For tests and tools that look at the server directly. */
#define STORE_REDIS_KEY_CHARS (4 + 2 * STORE_REDIS_FP_BYTES + 1 + 2 * STORE_KEY_BYTES)
void store_redis_key(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t key[STORE_KEY_BYTES],
                     char *out);

/* The value a page is stored as: STORE_REDIS_HEAD_BYTES of header, then the page. */
#define STORE_REDIS_HEAD_BYTES 104
void store_redis_value(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t key[STORE_KEY_BYTES],
                       const void *page, uint32_t page_bytes, uint8_t *out);

/* "redis://[:PASSWORD@]HOST[:PORT]" (options.remote) into o's host, port and password, which
 * point into buf (len bytes, valid while buf is); o's other fields are left alone. 0 or
 * -EINVAL. */
int store_redis_parse_url(const char *url, char *buf, size_t len, struct store_redis_options *o);

/* 0 when v (len bytes) is key's page of fingerprint fp, page_bytes long, whole and
 * unchanged (every header field and the checksum); else KVT_ECORRUPT. */
int store_redis_value_check(const uint8_t fp[STORE_REDIS_FP_BYTES],
                            const uint8_t key[STORE_KEY_BYTES], uint32_t page_bytes,
                            const uint8_t *v, size_t len);

#endif
