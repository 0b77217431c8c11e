/*
 * Routed batches: one-key commands pipelined per node, the replies read in order. A round
 * appends every command still unanswered to its node's connection (ASKING first where an
 * ASK sent it), flushes every node before reading any reply, so the masters work at once,
 * then reads each node's replies in the order they were sent. A MOVED or ASK reply sends the
 * command to its new node in the next round; after MAX_ROUNDS it fails (-EIO), so a slot
 * bounced between nodes costs its pages, never a loop. A node that cannot be reached fails
 * only the commands sent to it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "store/redis/redis_int.h"

#define MAX_ROUNDS 5 /* an ASK, then a MOVED after the migration ends, and spare rounds */

static int append_cmd(struct redis_store *r, redisContext *c, enum redis_cmd cmd,
                      const struct redis_item *it)
{
    static const char *const names[] = {"GET", "SET", "EXISTS", "DEL"};
    char name[STORE_REDIS_KEY_CHARS + 1], ttl[16];
    const char *argv[] = {names[cmd], name, (const char *)r->scratch, "NX", "EX", ttl};
    size_t lens[] = {strlen(names[cmd]),
                     STORE_REDIS_KEY_CHARS,
                     STORE_REDIS_HEAD_BYTES + (size_t)r->base.page_bytes,
                     2,
                     2,
                     0};
    int argc = 2;

    if (it->ask && redisAppendCommand(c, "ASKING") != REDIS_OK)
        return -ENOMEM;
    store_redis_key(r->o.fingerprint, it->key, name);
    if (cmd == CMD_SET) {
        /* SET key value NX [EX ttl]: written once; a page is a function of its key, so one
         * there already is the same page (or damage, which its next read finds). */
        store_redis_value(r->o.fingerprint, it->key, it->page, r->base.page_bytes, r->scratch);
        lens[5] = (size_t)snprintf(ttl, sizeof(ttl), "%u", r->o.ttl_s);
        argc = r->o.ttl_s ? 6 : 4;
    }
    return redisAppendCommandArgv(c, argc, argv, lens) == REDIS_OK ? 0 : -ENOMEM;
}

static void start_round(struct redis_store *r)
{
    for (size_t i = 0; i < r->n_nodes; i++) {
        r->nodes[i].round_err = 1;
        r->nodes[i].sent = 0;
    }
}

/* Append item it to its node, connecting first when this round has not. */
static void send_item(struct redis_store *r, enum redis_cmd cmd, struct redis_item *it)
{
    struct redis_node *n;

    if (it->node == NODE_NONE) {
        it->err = redis_unrouted_err(r);
        return;
    }
    n = &r->nodes[it->node];
    if (n->round_err == 1)
        n->round_err = redis_conn_ensure(r, n);
    if (n->round_err) {
        it->err = n->round_err;
        return;
    }
    if (append_cmd(r, n->ctx, cmd, it)) { /* half a pipeline: start that node afresh */
        n->round_err = -EIO;
        redis_conn_lost(r, n);
        it->err = -ENOMEM;
        return;
    }
    it->sent = true;
    n->sent++;
}

/* Write out every node's pipeline before reading any: the masters then work in parallel. */
static void flush_nodes(struct redis_store *r)
{
    int done;

    for (size_t i = 0; i < r->n_nodes; i++) {
        struct redis_node *n = &r->nodes[i];
        for (done = !n->sent || !n->ctx; !done;)
            if (redisBufferWrite(n->ctx, &done) != REDIS_OK) {
                redis_conn_lost(r, n);
                break;
            }
    }
}

/* One reply off node's connection; NULL (the connection dropped) when none comes. */
static redisReply *next_reply(struct redis_store *r, uint16_t node)
{
    redisReply *rep = NULL;

    if (!r->nodes[node].ctx)
        return NULL;
    if (redisGetReply(r->nodes[node].ctx, (void **)&rep) != REDIS_OK || !rep) {
        redis_conn_lost(r, &r->nodes[node]);
        return NULL;
    }
    return rep;
}

/* Read it's reply (after its ASKING's); a redirect or TRYAGAIN leaves it for the next round. */
static void read_item(struct redis_store *r, struct redis_item *it, uint64_t *moved,
                      uint64_t *asked)
{
    uint16_t from = it->node, to;
    redisReply *rep = NULL;
    int kind;

    it->sent = false;
    if (it->ask && (rep = next_reply(r, from)))
        freeReplyObject(rep);
    if ((it->ask && !rep) || !(rep = next_reply(r, from))) {
        it->err = -EIO;
        return;
    }
    if ((kind = redis_redirect(r, rep, from, &to))) {
        freeReplyObject(rep);
        it->node = to;
        it->ask = kind == 2;
        *(kind == 1 ? moved : asked) += 1;
        return;
    }
    it->ask = false;
    if (rep->type == REDIS_REPLY_ERROR && !strncmp(rep->str, "TRYAGAIN", 8)) {
        freeReplyObject(rep); /* a key of a multi-key command mid-migration: once more */
        return;
    }
    it->rep = rep;
}

static bool pending(const struct redis_item *it)
{
    return !it->rep && !it->err;
}

void redis_route_batch(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items,
                       size_t n)
{
    char name[STORE_REDIS_KEY_CHARS + 1];
    uint64_t moved = 0, asked = 0;
    size_t sent = 1;

    redis_cluster_update(r);
    for (size_t i = 0; i < n; i++) {
        struct redis_item *it = &items[i];
        store_redis_key(r->o.fingerprint, it->key, name);
        it->slot = store_redis_slot(name, STORE_REDIS_KEY_CHARS);
        it->node = redis_route(r, it->slot);
        it->rep = NULL, it->err = 0, it->ask = false, it->sent = false;
    }
    for (int round = 0; round < MAX_ROUNDS && sent; round++) {
        start_round(r);
        sent = 0;
        for (size_t i = 0; i < n; i++)
            if (pending(&items[i]))
                send_item(r, cmd, &items[i]);
        flush_nodes(r);
        for (size_t i = 0; i < n; i++)
            if (items[i].sent && ++sent)
                read_item(r, &items[i], &moved, &asked);
    }
    for (size_t i = 0; i < n; i++)
        if (pending(&items[i]))
            items[i].err = -EIO; /* redirected too many times */
    pthread_mutex_lock(&r->lock);
    r->c.moved += moved;
    r->c.asked += asked;
    pthread_mutex_unlock(&r->lock);
}

void redis_items_release(struct redis_item *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (items[i].rep)
            freeReplyObject(items[i].rep);
        items[i].rep = NULL;
    }
}
