/*
 * The Redis/Valkey store: whole KV pages on a standalone Redis or Valkey server or on a Redis
 * Cluster, one value per page, so engines on many hosts share what any of them wrote. The server is
 * a best-effort cache: it may evict (maxmemory policy, TTL) or lose everything (restart, FLUSHALL)
 * at any time, and anything may write to it, so every value read is checked against a header of its
 * own (magic, format, fingerprint, page key, length, XXH3-128: docs/formats.md) and a value
 * failing it is a miss (KVT_ECORRUPT), deleted, never served.
 *
 * Every network exchange happens on the store's I/O thread over its own connections (one per
 * server), in pipelined batches; the owner thread waits on the network only in leading_run
 * (bounded by exists_timeout_ms), wait_for and close. A server that fails, goes away, stops
 * answering (no whole reply within read_timeout_ms) or redirects in loops is marked down the
 * first time: the pages of the ops in its way fail (-EIO, or -ECONNREFUSED while it refuses
 * connections), at once from then on, while a prober thread tries it in the background with
 * a doubling backoff; the store serves from it again once a probe answers.
 *
 * Cluster mode is what the first seed to answer says: a node answering CLUSTER SLOTS makes
 * the store route each page by its key's hash slot to the master the slot map names, batches
 * split per master; MOVED updates the map (and a full refresh follows), ASK is followed with
 * ASKING, a command gets 5 redirections at most. Each page is written twice (copies, on by
 * default): under its key, and under its copy name, whose hash tag puts it in the slot half
 * the map away, on another master. A read or a leading run asks the page's master, and where
 * that master is down (or failed the exchange) its replica (when replica reads are allowed),
 * then the copy; where it says the key is absent (restarted empty, evicted), the copy: with
 * one master of N down every page is still found, so a KV's chain of pages, spread over every
 * master, does not break at its first page on the dead one. While
 * a master is down the map is read again every half second, so a replica promoted in its
 * place (a failover) is used without a restart.
 */
#ifndef KVT_STORE_REDIS_H
#define KVT_STORE_REDIS_H

#include <stdbool.h>
#include <stddef.h>

#include "store/store.h"

#define STORE_REDIS_FP_BYTES 32

#define STORE_REDIS_MAX_SEEDS 16
#define STORE_REDIS_SLOTS 16384

struct store_redis_addr {
    const char *host; /* copied at open */
    uint16_t port;    /* 0: 6379 */
};

struct store_redis_options {
    const char *host;     /* NULL: "127.0.0.1"; copied at open */
    uint16_t port;        /* 0: 6379 */
    const char *user;     /* an ACL user (Redis 6+): AUTH user password; NULL: AUTH password
                             alone (the default user); copied at open */
    const char *password; /* NULL: no AUTH; copied at open */
    uint8_t fingerprint[STORE_REDIS_FP_BYTES]; /* the KV's identity: keys and headers carry it */
    uint32_t page_bytes, page_tokens;
    uint32_t connect_timeout_ms; /* 0: 1000 */
    uint32_t read_timeout_ms;    /* a reply slower than this fails its pages; 0: 2000 */
    uint32_t write_timeout_ms;   /* 0: 2000 */
    uint32_t exists_timeout_ms;  /* the most leading_run waits; 0: read_timeout_ms */
    uint32_t backoff_max_ms;     /* the longest wait between reconnects; 0: 1000 */
    uint32_t ttl_s;              /* seconds a page lives (SET EX); 0: until evicted */
    /* TLS (wire.c): every connection, the server checked against the CAs and its host. */
    bool tls;
    const char *tls_ca;   /* PEM CA file; NULL: the system's */
    const char *tls_cert; /* PEM client certificate chain; NULL: none */
    const char *tls_key;  /* its key; NULL: in tls_cert's file */
    /* Where to start: 0 seeds, host and port alone; else these, tried in order (host and port
     * ignored). Several seeds name one cluster's nodes; the first that answers tells whether
     * it is a cluster, and a standalone server that answers is the one server used. */
    uint32_t n_seeds;
    struct store_redis_addr seeds[STORE_REDIS_MAX_SEEDS];
    /* On a cluster (ignored on a standalone server): */
    uint32_t copies;    /* 0 or 2: each page also under its copy name, on another master; 1:
                           the page's own key only (half the memory; a dead master then breaks
                           the chains through its slots until a failover) */
    bool replica_reads; /* a page whose master is down is read from that master's replica
                           (READONLY), which may lag behind it: a miss, never wrong bytes */
};

/* Start the store's I/O thread; connects on the first op, not here, so a server that is down
 * at open is one that comes later. -EINVAL (a zero page size, a page over 512 MiB, a user
 * without a password, a TLS file that cannot be read or used: store_redis_open_err says
 * which and why), -ENOMEM, or pthread_create's error. */
int store_redis_open(const struct store_redis_options *o, struct kvt_store **out);
/* store_redis_open, with err (len bytes) saying why when it fails. */
int store_redis_open_err(const struct store_redis_options *o, struct kvt_store **out, char *err,
                         size_t len);

/* What the store saw, for tests and tools; page counts unless named otherwise. */
struct store_redis_counters {
    uint64_t gets, hits, misses;
    uint64_t corrupt;        /* values that failed their checks: misses, deleted */
    uint64_t failed;         /* pages failed by the network or the server */
    uint64_t sets, set_dups; /* pages written, and of those there already (NX) */
    uint64_t connects;       /* connections made */
    uint64_t exists_late;    /* leading_run calls answered 0 for want of time or a server */
    uint32_t connected;      /* 1: the I/O thread holds a connection now (to any node) */
    /* Cluster mode (all 0 on a standalone server). */
    uint32_t cluster;       /* 1: the seeds answered as a cluster */
    uint32_t masters;       /* masters in the slot map */
    uint64_t moved, asked;  /* pages redirected by MOVED, and by ASK */
    uint64_t map_refreshes; /* slot maps read (CLUSTER SLOTS) */
    /* Refusals: pages fail with -EACCES (misses, counted in failed), the store goes on. */
    uint64_t auth_refused;  /* handshakes whose AUTH the server refused (WRONGPASS, ...) */
    uint64_t denied;        /* pages refused for want of a permission (NOPERM) */
    char last_refusal[160]; /* the server's text of the last refusal; "" when none */
    /* Nodes down (refused, failed, hung, trickling, redirecting in loops), probed apart. */
    uint32_t nodes_down;     /* known down now */
    uint64_t marked_down;    /* times a node was marked down */
    uint64_t probes;         /* tries of down nodes (a connect and a handshake each) */
    uint64_t redirect_loops; /* commands given up after MAX_REDIRECTS redirections */
    char last_error[200];    /* the last node marked down, host:port and why; "" when none */
    /* Copies and replicas (cluster). */
    uint32_t copies;        /* copies of a page written: 2, or 1 (standalone, or copies=1) */
    uint64_t copy_sets;     /* copies written (beside sets, the pages' own) */
    uint64_t copy_reads;    /* pages read from their copy, their own key's master down */
    uint64_t replica_reads; /* pages read from a replica, their master down */
};

/* -EINVAL when s is not a Redis store. */
int store_redis_counters(struct kvt_store *s, struct store_redis_counters *c);

/* The server key of a page: "kvt:<fingerprint hex>:<key hex>"; out holds
 * STORE_REDIS_KEY_CHARS + 1 bytes. For tests and tools that look at the server directly. */
#define STORE_REDIS_KEY_CHARS (4 + 2 * STORE_REDIS_FP_BYTES + 1 + 2 * STORE_KEY_BYTES)
void store_redis_key(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t key[STORE_KEY_BYTES],
                     char *out);
/* The name of a page's copy on a cluster: its key, then ":copy{T}", T five hex digits whose
 * CRC16 puts the copy in slot (the key's slot + 8192) mod 16384; the same value as the
 * page's. out holds STORE_REDIS_COPY_KEY_CHARS + 1 bytes. */
#define STORE_REDIS_COPY_SUFFIX ":copy{"
#define STORE_REDIS_COPY_KEY_CHARS (STORE_REDIS_KEY_CHARS + 6 + 5 + 1)
void store_redis_copy_key(const uint8_t fp[STORE_REDIS_FP_BYTES],
                          const uint8_t key[STORE_KEY_BYTES], char *out);
/* The slot a copy goes to: half the slots away from its page's. */
#define STORE_REDIS_COPY_SLOT(slot)                                                                \
    ((uint16_t)(((slot) + STORE_REDIS_SLOTS / 2) % STORE_REDIS_SLOTS))

/* The value a page is stored as: STORE_REDIS_HEAD_BYTES of header, then the page. */
#define STORE_REDIS_HEAD_BYTES 104
void store_redis_value(const uint8_t fp[STORE_REDIS_FP_BYTES], const uint8_t key[STORE_KEY_BYTES],
                       const void *page, uint32_t page_bytes, uint8_t *out);
/* Its header alone (STORE_REDIS_HEAD_BYTES into out), for a value sent from the page itself. */
void store_redis_value_head(const uint8_t fp[STORE_REDIS_FP_BYTES],
                            const uint8_t key[STORE_KEY_BYTES], const void *page,
                            uint32_t page_bytes, uint8_t *out);

/* options.remote into o's seeds, host, port, user, password, tls, copies and replica_reads,
 * which point into buf (len bytes, valid while buf is); o's other fields are left alone. One
 * URL, "redis://[[USER]:PASSWORD@]HOST[:PORT]", or a comma-separated list of them, the seeds
 * of one cluster (up to STORE_REDIS_MAX_SEEDS; "redis://" may be left off after the first; a
 * user and password given on several must be the same), then "?NAME=VALUE&..." for the whole
 * list: copies=1|2, replica_reads=yes|no. "rediss://" asks for TLS: every seed's scheme must
 * then be "rediss://" or left off. USER and PASSWORD are percent-decoded (%XX; ':' in USER,
 * ',' in either must be written so; '@' and ':' may stand as they are in
 * PASSWORD). host and port are the first seed's. 0 or -EINVAL. */
int store_redis_parse_url(const char *url, char *buf, size_t len, struct store_redis_options *o);

/* 0 when v (len bytes) is key's page of fingerprint fp, page_bytes long, whole and
 * unchanged (every header field and the checksum); else KVT_ECORRUPT. */
int store_redis_value_check(const uint8_t fp[STORE_REDIS_FP_BYTES],
                            const uint8_t key[STORE_KEY_BYTES], uint32_t page_bytes,
                            const uint8_t *v, size_t len);

/* The hash slot of a server key, Redis Cluster's: CRC16 of the key (or of its {hash tag})
 * modulo STORE_REDIS_SLOTS. */
uint16_t store_redis_slot(const char *key, size_t len);
/* Five hex digits into out (no NUL) whose CRC16 modulo STORE_REDIS_SLOTS is slot: a hash tag
 * that puts a key in slot. */
void store_redis_slot_tag(uint16_t slot, char *out);

#endif
