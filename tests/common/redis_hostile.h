/*
 * A hostile RESP server of a test's own, on loopback: it speaks enough of the protocol to be
 * taken for a Redis server (the handshake, CLUSTER SLOTS, GET, SET, EXISTS, DEL, PING, ASKING),
 * then misbehaves as the test asks:
 * - HOSTILE_TRICKLE: a standalone server whose every reply goes out a byte every gap_ms;
 * - HOSTILE_ASK: a cluster node whose map puts every slot on the node named first (map_port),
 *   answering every one-key command with ASK to peer_port (two of them, each the other's peer,
 *   bounce a command between them for ever);
 * - HOSTILE_TREE: a server that answers its first command with an endless tree of arrays
 *   (redis_hostile_tree), up to tree_bytes on each connection.
 * One thread serves every connection (poll); it counts the one-key commands it received.
 */
#ifndef KVT_TEST_REDIS_HOSTILE_H
#define KVT_TEST_REDIS_HOSTILE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

enum hostile_mode { HOSTILE_TRICKLE, HOSTILE_ASK, HOSTILE_TREE };

struct redis_hostile {
    enum hostile_mode mode; /* set before start */
    unsigned gap_ms;        /* HOSTILE_TRICKLE: between the bytes of a reply */
    uint16_t map_port;      /* HOSTILE_ASK: the master CLUSTER SLOTS names */
    uint16_t peer_port;     /* HOSTILE_ASK: where ASK sends a command */
    size_t tree_bytes;      /* HOSTILE_TREE: what each connection is sent at most */
    uint16_t port;          /* set by start */
    atomic_ulong commands;  /* GET, SET, EXISTS and DEL received */
    atomic_ulong connections;
    atomic_bool stop;
    int lfd;
    pthread_t thread;
};

#define HOSTILE_TREE_DEPTH 8 /* levels of arrays: as deep as the client takes */
#define HOSTILE_TREE_WIDTH 1000

/* The next bytes (up to cap, whole tokens) of a tree of arrays HOSTILE_TREE_DEPTH deep, width
 * elements each, integers at the bottom, depth first: each level and each array within the
 * client's own bounds, the whole width^8 elements. left (HOSTILE_TREE_DEPTH entries): elements
 * still to come of the array open at each level; *level: the deepest open one (-1 before the
 * first). The bytes written. */
size_t redis_hostile_tree(int width, int *left, int *level, char *buf, size_t cap);

/* Listen on a free port (h->port) and serve from a thread of its own: 0 or -errno. */
int redis_hostile_start(struct redis_hostile *h);
/* Stop serving, close every connection, join the thread. */
void redis_hostile_stop(struct redis_hostile *h);

#endif
