/*
 * The Redis store's insides, shared by its files: ops.c (the contract, on the owner thread), hint.c
 * (keys last seen stored), io.c (the I/O thread: ops and leading runs, a page's copy and its
 * master's replica tried where its master is down), route.c (pipelined batches of one-key
 * commands, split per node, redirects followed), resp.c (their replies, a GET's page read
 * straight into the host page), cluster.c (the nodes and the slot map), conn.c (a node's
 * connection, and whether it is down), probe.c (the prober thread, which tries the nodes
 * that are down), handshake.c (a new connection's first words), wire.c (a connection, plain or
 * TLS), slot.c (hash slots), value.c (the value format and the key names). The lock guards the
 * queues, the leading-run request, the hint table, the probes and the counters; the nodes,
 * their connections, the slot map and the batch's items are the I/O thread's alone.
 */
#ifndef KVT_STORE_REDIS_INT_H
#define KVT_STORE_REDIS_INT_H

#include <pthread.h>
#include <stdbool.h>

#include "store/redis/client.h"
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

/* A server: a seed, a master of the slot map, a replica read from, or a node a redirect
 * named. */
struct redis_node {
    char *host;
    uint16_t port;
    struct redis_wire *ctx; /* NULL: not connected */
    uint32_t backoff_ms;    /* the wait before its first probe, next time it is down */
    int conn_err;           /* what pages fail with while it is down */
    bool down;              /* known down: no command goes to it, the prober tries it */
    bool master;            /* holds slots in the map */
    uint16_t replica_of;    /* a replica read from (READONLY): its master; else NODE_NONE */
    uint64_t capacity;      /* its maxmemory (or machine's memory) in bytes, from its handshake */
    size_t sent;            /* commands pipelined on it and not yet answered (route.c) */
    int round_err;          /* route.c: this round's connect result, or 1 while not tried */
};

#define NODE_NONE UINT16_MAX

/* One command of a routed batch (route.c): its key and page, where it goes, what came back. */
struct redis_item {
    const uint8_t *key;
    const void *page; /* SET's bytes */
    void *dst;        /* GET's: where the page lands */
    uint16_t slot, node;
    uint16_t from; /* the node that answered it last (NODE_NONE: none yet) */
    bool copy;     /* the page's copy (its key's copy name), not the page's own key */
    bool replica;  /* to the replica of the slot's master (reads from replicas) */
    bool ask;      /* send ASKING first: the slot is being imported there */
    bool sent;     /* pipelined in this round, its reply not yet read */
    bool answered; /* rep holds its reply; else err says why there is none */
    struct resp_reply rep;
    int page_rc; /* a GET answered with a value: 0 (the page landed whole and checked) or
                    KVT_ECORRUPT */
    int err;
};

enum redis_cmd { CMD_GET, CMD_SET, CMD_EXISTS, CMD_DEL };

#define ITEMS_MAX 256 /* the most items one batch takes */

#define HINT_BITS 12
#define HINT_SLOTS (1u << HINT_BITS)

struct redis_store {
    struct kvt_store base;
    struct store_redis_options o;
    char *user, *password;
    SSL_CTX *tls; /* NULL: plain TCP */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;                    /* the I/O thread: work, or stop */
    pthread_cond_t done;                    /* the owner: an op or a leading run is done */
    struct redis_op *queue, *queue_tail;    /* submitted, oldest first; the head may be running */
    struct redis_op *done_head, *done_tail; /* completed, not yet collected */
    uint64_t last_id, queued, completed;
    bool stop;
    bool usable; /* some node the store sends to is not known down: leading_run asks */
    struct exists_req ex;
    /* Keys last seen stored (a SET, a GET or EXISTS that found it), by their first bytes:
     * what a read reports as its leading pages without asking the server. A hint only. */
    uint8_t (*hint)[STORE_KEY_BYTES];
    struct store_stats st;
    struct store_redis_counters c;
    uint64_t value_capacity; /* pages the servers' memory holds, from their maxmemory */
    /* The I/O thread's own. */
    struct redis_node *nodes; /* the seeds first, in order */
    size_t n_nodes, n_seeds, nodes_cap;
    bool mode_known; /* a seed answered: cluster or not */
    bool cluster;
    size_t standalone;        /* without a cluster, the node that answered */
    uint16_t *slot_node;      /* STORE_REDIS_SLOTS entries: the master of each slot */
    uint16_t *slot_replica;   /* with replica reads: each slot's replica read from; else NULL */
    bool map_stale;           /* a redirect or a dead node: read the map again */
    uint64_t map_read_ms;     /* when it was last read (or tried) */
    struct redis_item *items; /* ITEMS_MAX */
    struct redis_item *alt;   /* ITEMS_MAX: a batch asked elsewhere (alt.c), or of DELs */
    uint32_t n_masters;       /* masters in the map */
    /* The prober (probe.c); its list under the lock. */
    pthread_t prober;
    bool prober_started, probe_stop;
    pthread_cond_t probe_wake;
    struct redis_probe *probes;
    bool revived;  /* a probe answered: the I/O thread takes its connection up */
    int cancel_fd; /* an eventfd the close writes: a probe's waits end */
};

/* wire.c: CLOCK_MONOTONIC in ms. */
uint64_t redis_now_ms(void);

/* The copies of each page written: 2 on a cluster of two masters or more unless the options
 * say 1 (the URL's copies=1); 1 on a standalone server, where a copy would share the page's
 * fate. */
static inline uint32_t redis_copies(const struct redis_store *r)
{
    return r->cluster && r->o.copies != 1 && r->n_masters > 1 ? 2 : 1;
}

/* value.c: 0, or KVT_ECORRUPT when a value's header (its checksum aside) is not key's of this
 * store, or when the payload does not match the header's checksum. */
int redis_head_check(const struct redis_store *r, const uint8_t *key, const uint8_t *head);
int redis_payload_check(const struct redis_store *r, const uint8_t *head, const uint8_t *payload);

/* resp.c; -EIO when the connection failed (the caller drops it). */
/* The next reply's first line; a bulk's bytes are left for redis_resp_page or _skip. */
int redis_resp_head(struct redis_wire *w, struct resp_reply *rep);
/* Drop a bulk reply's bytes. */
int redis_resp_skip(struct redis_wire *w, const struct resp_reply *rep);
/* A GET's value into page: 0 when it is key's page, whole and unchanged; KVT_ECORRUPT when
 * not (the header is checked before the payload lands, the checksum after). */
int redis_resp_page(struct redis_store *r, struct redis_wire *w, const struct resp_reply *rep,
                    const uint8_t *key, void *page);
/* conn.c, on the I/O thread: 0 with node's ctx usable, or the error pages fail with now (at
 * once while the node is down). */
int redis_conn_ensure(struct redis_store *r, struct redis_node *n);
/* The connection failed mid-exchange (closed, timed out): the node is down. */
void redis_conn_lost(struct redis_store *r, struct redis_node *n);
/* Mark n down (err: what its pages fail with; why: for last_error) and have it probed. */
void redis_conn_down(struct redis_store *r, struct redis_node *n, int err, const char *why);
/* n answered a command: the next time it is down, its first probe comes soon again. */
void redis_conn_answered(struct redis_node *n);
/* Take up the connections of nodes whose probes answered. */
void redis_conn_adopt(struct redis_store *r);
void redis_conn_close(struct redis_node *n);
/* Publish whether any node may answer, the nodes down, and the capacity. */
void redis_conn_publish(struct redis_store *r);

/* handshake.c: AUTH (when a password is set), READONLY (replica), the server's memory into
 * *capacity: 0, -EACCES (AUTH refused), -EPROTO (READONLY refused), or the call's error. */
int redis_handshake(struct redis_store *r, struct redis_wire *w, const char *host, uint16_t port,
                    bool replica, uint64_t *capacity);
/* The server refused us (text: what it said); auth: at AUTH, else a command (NOPERM). Takes
 * the lock. */
void redis_note_refusal(struct redis_store *r, const char *text, bool auth);
/* A node marked down, and why (last_error, marked_down). Takes the lock. */
void redis_note_down(struct redis_store *r, const char *host, uint16_t port, const char *why);

/* probe.c. Start and stop the prober (stop frees every probe); on the owner thread. */
int redis_prober_start(struct redis_store *r);
void redis_prober_stop(struct redis_store *r);
/* On the I/O thread: probe node (a replica: READONLY too) from delay_ms on, until it answers.
 * Takes the lock. */
int redis_probe_add(struct redis_store *r, uint16_t node, bool replica, uint32_t delay_ms);
/* On the I/O thread: node's probe answered: its connection (handshake done) and capacity, the
 * probe gone. Takes the lock. */
bool redis_probe_take(struct redis_store *r, uint16_t node, struct redis_wire **w,
                      uint64_t *capacity);

/* cluster.c, on the I/O thread. */
/* The node host:port, added when new; NODE_NONE when out of memory. */
uint16_t redis_node_find(struct redis_store *r, const char *host, size_t host_len, uint16_t port);
/* Find out the mode, or read the slot map again when it is stale and a refresh is due. */
void redis_cluster_update(struct redis_store *r);
/* Where slot's commands go now: NODE_NONE when no node is known for it. */
uint16_t redis_route(const struct redis_store *r, uint16_t slot);
/* The replica slot's reads may go to (replica reads allowed); else NODE_NONE. */
uint16_t redis_route_replica(const struct redis_store *r, uint16_t slot);
/* A MOVED or ASK error (its text in err): 1 (MOVED) or 2 (ASK) with *node its target (the
 * slot map updated on MOVED); 0 when it is no redirect. from: the node that answered. */
int redis_redirect(struct redis_store *r, const char *err, uint16_t from, uint16_t *node);
/* What pages of a slot no node serves fail with. */
int redis_unrouted_err(const struct redis_store *r);
void redis_nodes_free(struct redis_store *r);

/* route.c: run items[0..n) as cmd, pipelined per node, redirects followed (at most
 * MAX_REDIRECTS each: past them the item fails -EIO and the node that sent the last is marked
 * down); each item ends answered or with an err. The counters of redirects are added under
 * the lock. */
void redis_route_batch(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items,
                       size_t n);

/* alt.c: items[0..n) of cmd (GET or EXISTS) that their master did not settle (no answer, or
 * an "absent" from a place asked after it), asked of the page's other places in turn; an item
 * found elsewhere is replaced by that place's. */
void redis_read_elsewhere(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items,
                          size_t n);

/* io.c */
void *redis_io_main(void *arg);

/* hint.c, with the lock held. */
void redis_hint_set(struct redis_store *r, const uint8_t *key, bool present);
bool redis_hint_has(struct redis_store *r, const uint8_t *key);

#endif
