/*
 * The nodes and the slot map, on the I/O thread. The seeds are the first nodes; the first to
 * answer CLUSTER SLOTS decides the mode for good: an error reply (cluster support disabled)
 * makes it the one standalone server, a map makes the store a cluster client. The map is read
 * again, from any node that answers, when it went stale (a MOVED, a node lost) and at most
 * every REFRESH_MIN_MS, so a flood of redirects costs one read of it, not one each; and every
 * REFRESH_DOWN_MS while a master of it is down, so that a replica promoted in its place (a
 * failover) is found without a redirect to tell of it. With replica reads allowed the map
 * keeps each slot's first replica too (replica_of: the master it copies).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis/redis_int.h"

#define REFRESH_MIN_MS 100
#define REFRESH_DOWN_MS 500
#define BACKOFF_START_MS 20

uint16_t redis_node_find(struct redis_store *r, const char *host, size_t host_len, uint16_t port)
{
    struct redis_node *grown, *n;

    for (size_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].port == port && strlen(r->nodes[i].host) == host_len &&
            !memcmp(r->nodes[i].host, host, host_len))
            return (uint16_t)i;
    if (r->n_nodes == NODE_NONE)
        return NODE_NONE;
    if (r->n_nodes == r->nodes_cap) {
        size_t cap = r->nodes_cap ? 2 * r->nodes_cap : 8;
        if (!(grown = realloc(r->nodes, cap * sizeof(*grown))))
            return NODE_NONE;
        r->nodes = grown;
        r->nodes_cap = cap;
    }
    n = &r->nodes[r->n_nodes];
    *n = (struct redis_node){
        .port = port, .backoff_ms = BACKOFF_START_MS, .round_err = 1, .replica_of = NODE_NONE};
    if (!(n->host = strndup(host, host_len)))
        return NODE_NONE;
    return (uint16_t)r->n_nodes++;
}

void redis_nodes_free(struct redis_store *r)
{
    for (size_t i = 0; i < r->n_nodes; i++) {
        redis_conn_close(&r->nodes[i]);
        free(r->nodes[i].host);
    }
    free(r->nodes);
    r->nodes = NULL;
    r->n_nodes = 0;
}

/* A host in a reply; "" or "?" (the node does not know its address) is the asked node's. */
static void host_of(const struct redis_store *r, uint16_t from, const char *h, size_t len,
                    const char **host, size_t *host_len)
{
    bool unknown = len == 0 || (len == 1 && h[0] == '?');

    *host = unknown ? r->nodes[from].host : h;
    *host_len = unknown ? strlen(r->nodes[from].host) : len;
}

/* A node of an entry of CLUSTER SLOTS, [host, port, id...], as a node of ours. */
static int entry_node(struct redis_store *r, uint16_t from, const struct resp_value *m,
                      uint16_t *node)
{
    const char *host;
    size_t host_len;

    if (m->type != RESP_ARRAY || m->n < 2 || m->elem[0]->type != RESP_BULK ||
        m->elem[1]->type != RESP_INT || m->elem[1]->integer < 1 || m->elem[1]->integer > 65535)
        return -EIO;
    host_of(r, from, m->elem[0]->str, (size_t)m->elem[0]->integer, &host, &host_len);
    *node = redis_node_find(r, host, host_len, (uint16_t)m->elem[1]->integer);
    return *node == NODE_NONE ? -ENOMEM : 0;
}

/* One entry of CLUSTER SLOTS: [start, end, [host, port, id...], replicas...] into map (and
 * its first replica into replicas, when reads from replicas are allowed). */
static int map_range(struct redis_store *r, uint16_t from, const struct resp_value *e,
                     uint16_t *map, uint16_t *replicas)
{
    uint16_t node, replica = NODE_NONE;
    int rc;

    if (e->type != RESP_ARRAY || e->n < 3 || e->elem[0]->type != RESP_INT ||
        e->elem[1]->type != RESP_INT)
        return -EIO;
    long long lo = e->elem[0]->integer, hi = e->elem[1]->integer;
    if (lo < 0 || hi >= STORE_REDIS_SLOTS || lo > hi)
        return -EIO;
    if ((rc = entry_node(r, from, e->elem[2], &node)))
        return rc;
    if (replicas && e->n > 3 && (rc = entry_node(r, from, e->elem[3], &replica)))
        return rc;
    for (long long s = lo; s <= hi; s++) {
        map[s] = node;
        if (replicas)
            replicas[s] = replica != node ? replica : NODE_NONE;
    }
    return 0;
}

/* Each node's part from the map: master, or the replica of which master it is read from. */
static void mark_roles(struct redis_store *r)
{
    for (size_t i = 0; i < r->n_nodes; i++) {
        r->nodes[i].master = false;
        r->nodes[i].replica_of = NODE_NONE;
    }
    for (size_t s = 0; s < STORE_REDIS_SLOTS; s++) {
        if (r->slot_node[s] != NODE_NONE)
            r->nodes[r->slot_node[s]].master = true;
        if (r->slot_replica && r->slot_replica[s] != NODE_NONE)
            r->nodes[r->slot_replica[s]].replica_of = r->slot_node[s];
    }
    r->n_masters = 0;
    for (size_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].master) {
            r->nodes[i].replica_of = NODE_NONE; /* a master now, whatever another range says */
            r->n_masters++;
        }
}

/* The map from a CLUSTER SLOTS reply; the nodes it names are the masters from now on. */
static int apply_map(struct redis_store *r, uint16_t from, const struct resp_value *rep)
{
    size_t bytes = STORE_REDIS_SLOTS * sizeof(uint16_t);
    uint16_t *map = malloc(2 * bytes), *replicas = r->slot_replica ? map + STORE_REDIS_SLOTS : NULL;
    int rc = 0;

    if (!map)
        return -ENOMEM;
    for (size_t s = 0; s < 2 * STORE_REDIS_SLOTS; s++)
        map[s] = NODE_NONE;
    for (size_t i = 0; i < rep->n && !rc; i++)
        rc = map_range(r, from, rep->elem[i], map, replicas);
    if (rc == 0) { /* half an answer leaves the old map */
        memcpy(r->slot_node, map, bytes);
        if (replicas)
            memcpy(r->slot_replica, replicas, bytes);
        mark_roles(r);
    }
    free(map);
    return rc;
}

/* CLUSTER SLOTS on node i: 0 with the map applied, 1 when it is no cluster, or -errno. */
static int read_slots(struct redis_store *r, uint16_t i)
{
    const char *argv[] = {"CLUSTER", "SLOTS"};
    struct resp_value *rep;
    int rc = redis_call(r->nodes[i].ctx, 2, argv, NULL, &rep);

    if (rc) {
        char why[200];
        snprintf(why, sizeof(why), "CLUSTER SLOTS: %s", redis_wire_why(r->nodes[i].ctx, rc));
        redis_conn_down(r, &r->nodes[i], -EIO, why);
        return rc;
    }
    rc = rep->type == RESP_ERROR ? 1 : rep->type == RESP_ARRAY ? apply_map(r, i, rep) : -EIO;
    redis_resp_free(rep);
    return rc;
}

static void publish_map(struct redis_store *r)
{
    uint32_t masters = 0;

    for (size_t i = 0; i < r->n_nodes; i++)
        masters += r->nodes[i].master;
    pthread_mutex_lock(&r->lock);
    r->c.cluster = r->cluster;
    r->c.masters = masters;
    r->c.copies = redis_copies(r);
    r->c.map_refreshes += r->cluster;
    pthread_mutex_unlock(&r->lock);
    redis_conn_publish(r);
}

/* Ask node i; true when it answered (the mode is known, and on a cluster the map read). */
static bool ask_node(struct redis_store *r, uint16_t i)
{
    int rc;

    if (redis_conn_ensure(r, &r->nodes[i]) || (rc = read_slots(r, i)) < 0)
        return false;
    if (rc == 1 && r->mode_known && r->cluster)
        return false; /* a node that left the cluster: not one to take a map from */
    if (!r->mode_known) {
        r->mode_known = true;
        r->cluster = rc == 0;
        r->standalone = i;
    }
    r->map_stale = false;
    for (size_t k = 0; r->cluster && k < r->n_nodes; k++)
        if (!r->nodes[k].master && r->nodes[k].replica_of == NODE_NONE && k != i)
            redis_conn_close(&r->nodes[k]); /* sockets to the nodes read from only */
    publish_map(r);
    return true;
}

static bool master_down(const struct redis_store *r)
{
    for (size_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].master && r->nodes[i].down)
            return true;
    return false;
}

void redis_cluster_update(struct redis_store *r)
{
    uint64_t now = redis_now_ms(), since = now - r->map_read_ms;

    if (r->mode_known && (!r->cluster || since < REFRESH_MIN_MS ||
                          (!r->map_stale && (since < REFRESH_DOWN_MS || !master_down(r)))))
        return;
    r->map_read_ms = now;
    /* Nodes already connected first: a refresh costs one round trip, not a connect. */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < r->n_nodes; i++)
            if ((r->nodes[i].ctx != NULL) == (pass == 0) && ask_node(r, (uint16_t)i))
                return;
}

uint16_t redis_route(const struct redis_store *r, uint16_t slot)
{
    if (!r->mode_known)
        return NODE_NONE;
    return r->cluster ? r->slot_node[slot] : (uint16_t)r->standalone;
}

uint16_t redis_route_replica(const struct redis_store *r, uint16_t slot)
{
    return r->mode_known && r->cluster && r->slot_replica ? r->slot_replica[slot] : NODE_NONE;
}

int redis_unrouted_err(const struct redis_store *r)
{
    int err = r->n_nodes ? r->nodes[0].conn_err : 0;

    return !r->mode_known && err ? err : -EIO;
}

int redis_redirect(struct redis_store *r, const char *err, uint16_t from, uint16_t *node)
{
    const char *p, *colon, *host;
    size_t host_len;
    int kind;
    char *end;

    kind = !strncmp(err, "MOVED ", 6) ? 1 : !strncmp(err, "ASK ", 4) ? 2 : 0;
    if (!kind)
        return 0;
    unsigned long slot = strtoul(err + (kind == 1 ? 6 : 4), &end, 10);
    if (*end != ' ' || slot >= STORE_REDIS_SLOTS || !(colon = strrchr(p = end + 1, ':')))
        return 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (*end || port == 0 || port > 65535)
        return 0;
    host_of(r, from, p, (size_t)(colon - p), &host, &host_len);
    if ((*node = redis_node_find(r, host, host_len, (uint16_t)port)) == NODE_NONE)
        return 0;
    if (kind == 1 && r->nodes[from].replica_of == NODE_NONE) {
        /* The slot is there for good: the map learns it, the rest may follow. (A replica's
         * MOVED says only that it copies another master.) */
        r->slot_node[slot] = *node;
        r->nodes[*node].master = true;
        r->nodes[*node].replica_of = NODE_NONE;
        r->map_stale = true;
    }
    return kind;
}
