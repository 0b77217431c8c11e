/*
 * The Redis store's insides, shared by its files: ops.c (the contract, on the owner thread), hint.c
 * (keys last seen stored), io.c (the I/O thread: batches and leading runs), conn.c (the connection
 * and its backoff), value.c (the value format). The lock guards the queues, the leading-run
 * request, the hint table and the counters; the connection and the scratch buffer are the I/O
 * thread's alone.
 */
#ifndef KVT_STORE_REDIS_INT_H
#define KVT_STORE_REDIS_INT_H

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdbool.h>

#include "store/redis/redis.h"

/* A submitted op: its keys copied, its buffers the caller's until it completes. */
struct redis_op {
    uint64_t id;
    uint32_t kind; /* enum store_op_kind */
    uint32_t n;
    uint32_t ok;
    int *results;
    uint8_t *keys; /* n keys, back to back */
    void **bufs;   /* n pages: read into, or written from */
    struct redis_op *next;
};

enum exists_state { EX_IDLE, EX_QUEUED, EX_RUNNING, EX_DONE };

/* The one leading-run request: the owner thread fills it and waits, the I/O thread answers.
 * One the owner gave up on (abandoned) is finished by the thread and answers nobody. */
struct exists_req {
    uint8_t *keys;
    size_t n, cap, run;
    enum exists_state state;
    bool abandoned;
};

#define HINT_BITS 12
#define HINT_SLOTS (1u << HINT_BITS)

struct redis_store {
    struct kvt_store base;
    struct store_redis_options o;
    char *host, *password;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;                    /* the I/O thread: work, or stop */
    pthread_cond_t done;                    /* the owner: an op or a leading run is done */
    struct redis_op *queue, *queue_tail;    /* submitted, oldest first; the head may be running */
    struct redis_op *done_head, *done_tail; /* completed, not yet collected */
    uint64_t last_id, queued, completed;
    bool stop;
    bool up;              /* the thread holds a connection */
    uint64_t retry_at_ms; /* without one, no connect before this */
    struct exists_req ex;
    /* Keys last seen stored (a SET, a GET or EXISTS that found it), by their first bytes:
     * what a read reports as its leading pages without asking the server. A hint only. */
    uint8_t (*hint)[STORE_KEY_BYTES];
    struct store_stats st;
    struct store_redis_counters c;
    /* The I/O thread's own. */
    redisContext *ctx;
    uint32_t backoff_ms;
    int conn_err;            /* what pages fail with while no connection can be made */
    uint8_t *scratch;        /* one value being built */
    uint64_t value_capacity; /* pages the server's memory holds, from its maxmemory */
};

uint64_t redis_now_ms(void);

/* value.c: 0, or KVT_ECORRUPT when v is not key's page of this store's fingerprint. */
int redis_value_check(const struct redis_store *r, const uint8_t *key, const uint8_t *v,
                      size_t len);

/* conn.c, on the I/O thread: 0 with r->ctx usable, or the error pages fail with now. */
int redis_conn_ensure(struct redis_store *r);
/* The connection failed mid-exchange: drop it and wait before the next. */
void redis_conn_lost(struct redis_store *r);
void redis_conn_close(struct redis_store *r);

/* io.c */
void *redis_io_main(void *arg);

/* hint.c, with the lock held. */
void redis_hint_set(struct redis_store *r, const uint8_t *key, bool present);
bool redis_hint_has(struct redis_store *r, const uint8_t *key);

#endif
