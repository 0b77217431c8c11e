#include "redis_cluster.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define SLOTS 16384

int redis_cluster_home(unsigned slot)
{
    return (int)(slot * REDIS_CLUSTER_NODES / SLOTS);
}

int redis_cluster_size(const struct redis_cluster *c)
{
    return c->replicas ? 2 * REDIS_CLUSTER_NODES : REDIS_CLUSTER_NODES;
}

/* A command answered +OK (or NOKEY: a MIGRATE of a key gone already). */
static int cmd(const struct redis_server *s, int argc, const char **argv)
{
    char out[256];

    return redis_server_cmd_str(s, argc, argv, out, sizeof(out)) == 0 &&
                   (!strcmp(out, "OK") || !strcmp(out, "NOKEY"))
               ? 0
               : -1;
}

/* Node i's id, its own config epoch (so no two claim the same), and its range of slots (a
 * replica: none yet). */
static int prepare(struct redis_cluster *c, int i)
{
    char epoch[16], lo[16], hi[16];
    const char *myid[] = {"CLUSTER", "MYID"}, *ep[] = {"CLUSTER", "SET-CONFIG-EPOCH", epoch};
    const char *add[] = {"CLUSTER", "ADDSLOTSRANGE", lo, hi};

    snprintf(epoch, sizeof(epoch), "%d", i + 1);
    snprintf(lo, sizeof(lo), "%d", i * SLOTS / REDIS_CLUSTER_NODES);
    snprintf(hi, sizeof(hi), "%d", (i + 1) * SLOTS / REDIS_CLUSTER_NODES - 1);
    if (redis_server_cmd_str(&c->node[i], 2, myid, c->id[i], sizeof(c->id[i])))
        return -1;
    if (i >= REDIS_CLUSTER_NODES)
        return 0;
    return cmd(&c->node[i], 3, ep) || cmd(&c->node[i], 4, add) ? -1 : 0;
}

static int meet(const struct redis_cluster *c, int i, int j)
{
    char port[8], bus[8];
    const char *m[] = {"CLUSTER", "MEET", "127.0.0.1", port, bus};

    snprintf(port, sizeof(port), "%u", c->node[j].port);
    snprintf(bus, sizeof(bus), "%u", c->node[j].bus_port);
    return cmd(&c->node[i], 5, m);
}

/* Every node sees the whole map, every slot covered, every node known. */
static int wait_ok(const struct redis_cluster *c)
{
    const char *info[] = {"CLUSTER", "INFO"};
    char out[2048], known[32];
    int ok = 0, n = redis_cluster_size(c);

    snprintf(known, sizeof(known), "cluster_known_nodes:%d\r", n);
    for (int t = 0; t < 1000 && ok < n; t++, usleep(10000))
        for (ok = 0; ok < n; ok++)
            if (redis_server_cmd_str(&c->node[ok], 2, info, out, sizeof(out)) ||
                !strstr(out, "cluster_state:ok") || !strstr(out, "cluster_slots_ok:16384") ||
                !strstr(out, known))
                break;
    return ok == n ? 0 : -ETIMEDOUT;
}

/* Node r copies master m: REPLICATE once r knows m, then until its link to m is up. */
static int replicate(const struct redis_cluster *c, int r, int m)
{
    const char *rep[] = {"CLUSTER", "REPLICATE", c->id[m]}, *info[] = {"INFO", "replication"};
    char out[4096];

    for (int t = 0; t < 500 && cmd(&c->node[r], 3, rep); t++)
        usleep(10000); /* it may not know m yet */
    for (int t = 0; t < 1000; t++, usleep(10000))
        if (!redis_server_cmd_str(&c->node[r], 2, info, out, sizeof(out)) &&
            strstr(out, "master_link_status:up"))
            return 0;
    return -1;
}

int redis_cluster_wait_master(const struct redis_cluster *c, int i, unsigned ms)
{
    const char *info[] = {"INFO", "replication"};
    char out[4096];

    for (unsigned t = 0; t < ms / 20; t++, usleep(20000))
        if (!redis_server_cmd_str(&c->node[i], 2, info, out, sizeof(out)) &&
            strstr(out, "role:master"))
            return 0;
    return -1;
}

int redis_cluster_start(struct redis_cluster *c)
{
    bool tls = c->tls, replicas = c->replicas;
    int rc = 0, n;

    memset(c, 0, sizeof(*c));
    c->tls = tls;
    c->replicas = replicas;
    n = redis_cluster_size(c);
    for (int i = 0; i < n && !rc; i++) {
        c->node[i].cluster = true;
        c->node[i].tls = tls;
        if (tls && i > 0) /* one CA for the cluster: node 0's certificates for every node */
            snprintf(c->node[i].cert_dir, sizeof(c->node[i].cert_dir), "%s", c->node[0].dir);
        if (!(rc = redis_server_start(&c->node[i], 0)))
            rc = prepare(c, i) ? -EIO : 0;
    }
    for (int i = 1; i < n && !rc; i++)
        rc = meet(c, 0, i) ? -EIO : 0;
    for (int i = REDIS_CLUSTER_NODES; i < n && !rc; i++)
        rc = replicate(c, i, i - REDIS_CLUSTER_NODES) ? -EIO : 0;
    if (!rc)
        rc = wait_ok(c);
    if (rc)
        redis_cluster_stop(c);
    return rc;
}

void redis_cluster_stop(struct redis_cluster *c)
{
    for (int i = 0; i < redis_cluster_size(c); i++)
        redis_server_stop(&c->node[i]);
}

void redis_cluster_url(const struct redis_cluster *c, int first, char *out, size_t len)
{
    size_t used = 0;

    out[0] = '\0';
    for (int k = 0; k < REDIS_CLUSTER_NODES && used < len; k++) {
        const struct redis_server *n = &c->node[(first + k) % REDIS_CLUSTER_NODES];
        used += (size_t)snprintf(out + used, len - used, "%s%s://127.0.0.1:%u", k ? "," : "",
                                 c->tls ? "rediss" : "redis", c->tls ? n->tls_port : n->port);
    }
}

int redis_cluster_flush(const struct redis_cluster *c)
{
    const char *flush[] = {"FLUSHALL"};

    for (int i = 0; i < REDIS_CLUSTER_NODES; i++) /* the replicas follow */
        if (cmd(&c->node[i], 1, flush))
            return -1;
    return 0;
}

static int setslot(const struct redis_server *s, unsigned slot, const char *how, const char *id)
{
    char sl[16];
    const char *argv[] = {"CLUSTER", "SETSLOT", sl, how, id};

    snprintf(sl, sizeof(sl), "%u", slot);
    return cmd(s, 5, argv);
}

int redis_cluster_slot_begin(const struct redis_cluster *c, unsigned slot, int a, int b)
{
    return setslot(&c->node[b], slot, "IMPORTING", c->id[a]) ||
                   setslot(&c->node[a], slot, "MIGRATING", c->id[b])
               ? -1
               : 0;
}

int redis_cluster_migrate_key(const struct redis_cluster *c, const char *key, int a, int b)
{
    char port[8];
    const char *argv[] = {"MIGRATE", "127.0.0.1", port, key, "0", "5000"};

    snprintf(port, sizeof(port), "%u", c->node[b].port);
    return cmd(&c->node[a], 6, argv);
}

int redis_cluster_slot_end(const struct redis_cluster *c, unsigned slot, int b)
{
    int rc = setslot(&c->node[b], slot, "NODE", c->id[b]);

    for (int i = 0; i < REDIS_CLUSTER_NODES && !rc; i++)
        rc = i == b ? 0 : setslot(&c->node[i], slot, "NODE", c->id[b]);
    return rc;
}
