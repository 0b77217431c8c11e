/*
 * A Redis Cluster of a test's own: three masters on loopback, each a redis_server in a temp
 * dir, the 16384 slots split in three ranges, formed by hand (ADDSLOTSRANGE, MEET) so only
 * redis-server is needed; with replicas set, a replica for each master too (node 3 + i copies
 * node i), in sync before start returns. Nodes answer while another is down
 * (cluster-require-full-coverage no); a master silent for 2 s is failed over to its replica.
 */
#ifndef KVT_TEST_REDIS_CLUSTER_H
#define KVT_TEST_REDIS_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include "redis_server.h"

#define REDIS_CLUSTER_NODES 3

struct redis_cluster {
    struct redis_server node[2 * REDIS_CLUSTER_NODES]; /* the masters, then their replicas */
    char id[2 * REDIS_CLUSTER_NODES][48];              /* CLUSTER MYID */
    bool tls;      /* set before start: every node TLS too, its bus as well (tls-cluster), with node
                      0's certificates (redis_server_file of node 0 names them) */
    bool replicas; /* set before start: a replica for each master */
};

/* The nodes c has: REDIS_CLUSTER_NODES, twice that with replicas. */
int redis_cluster_size(const struct redis_cluster *c);

/* Start the nodes and form the cluster; 0 once every node says cluster_state:ok (10 s at
 * most) and every replica is in sync with its master, else -errno with everything stopped. */
int redis_cluster_start(struct redis_cluster *c);

/* Stop every node and remove its dir. */
void redis_cluster_stop(struct redis_cluster *c);

/* "redis://127.0.0.1:P0,redis://127.0.0.1:P1,..." into out (rediss:// and the TLS ports on a
 * TLS cluster); first: the node listed first. */
void redis_cluster_url(const struct redis_cluster *c, int first, char *out, size_t len);

/* The node that holds slot as the cluster was formed (before any migration). */
int redis_cluster_home(unsigned slot);

/* Until node i is a master (a replica promoted by a failover): 0, or -1 after ms. */
int redis_cluster_wait_master(const struct redis_cluster *c, int i, unsigned ms);

/* FLUSHALL on every node: 0, or -1 when one did not answer. */
int redis_cluster_flush(const struct redis_cluster *c);

/* Move slot from node a to node b, as redis-cli --cluster reshard does it, in two steps:
 * begin (SETSLOT IMPORTING on b, MIGRATING on a), then keys moved one at a time with
 * redis_cluster_migrate_key, then end (SETSLOT NODE b on every node). 0 or -1. */
int redis_cluster_slot_begin(const struct redis_cluster *c, unsigned slot, int a, int b);
int redis_cluster_migrate_key(const struct redis_cluster *c, const char *key, int a, int b);
int redis_cluster_slot_end(const struct redis_cluster *c, unsigned slot, int b);

#endif
