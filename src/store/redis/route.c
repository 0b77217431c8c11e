/*
 * Routed batches: one-key commands pipelined per node, the replies read in order. A round
 * appends every command still unanswered to its node's connection (ASKING first where an
 * ASK sent it), flushes every node before reading any reply, so the masters work at once,
 * then reads each node's replies in the order they were sent. A MOVED or ASK reply sends the
 * command to its new node in the next round; past MAX_REDIRECTS it fails (-EIO), and the node
 * that redirected it last is marked down, so a slot bounced between nodes costs its pages a
 * few round trips once, then nothing until a probe finds the node again, never a loop. A node
 * that cannot be reached fails only the commands sent to it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "store/redis/redis_int.h"

/* Redirections of one command (MOVED, ASK, TRYAGAIN), as Redis's own clients allow: an ASK,
 * then a MOVED once the migration ends, and spare ones. */
#define MAX_REDIRECTS 5

#define NAME_MAX_CHARS STORE_REDIS_COPY_KEY_CHARS

/* it's server key (its copy's name for a copy) into name: its length. */
static size_t item_name(const struct redis_store *r, const struct redis_item *it, char *name)
{
    if (it->copy) {
        store_redis_copy_key(r->o.fingerprint, it->key, name);
        return STORE_REDIS_COPY_KEY_CHARS;
    }
    store_redis_key(r->o.fingerprint, it->key, name);
    return STORE_REDIS_KEY_CHARS;
}

/* GET, EXISTS or DEL of it's key (ASKING first when an ASK sent it there). */
static const char *const asking[] = {"ASKING"};

static int append_cmd(struct redis_store *r, struct redis_wire *c, enum redis_cmd cmd,
                      const struct redis_item *it)
{
    static const char *const names[] = {"GET", "SET", "EXISTS", "DEL"};
    char name[NAME_MAX_CHARS + 1];
    const char *argv[] = {names[cmd], name};
    size_t lens[] = {strlen(names[cmd]), item_name(r, it, name)};

    if (it->ask && redis_wire_append(c, 1, asking, NULL))
        return -ENOMEM;
    return redis_wire_append(c, 2, argv, lens);
}

/* Write out node's pipeline, all of it; false (the connection dropped) when that failed. */
static bool flush_node(struct redis_store *r, struct redis_node *n)
{
    if (n->ctx && redis_wire_flush(n->ctx)) {
        redis_conn_lost(r, n);
        return false;
    }
    return true;
}

/* SET key value NX [EX ttl]: written once; a page is a function of its key, so one there
 * already is the same page (or damage, which its next read finds). Sent straight from the
 * page: the framing and the value's header from a small buffer, the page's bytes from where
 * they lie, so only the kernel copies them (or OpenSSL, which must). Through a client
 * library's pipeline (hiredis's, before) a page was copied three times (the value built, the
 * command formatted, the buffer grown and shifted), and writes ran at a third of
 * redis-benchmark's rate. Whatever the pipeline holds (an ASKING, say) goes first, so the
 * order on the wire is the order of the replies read. */
static int send_set(struct redis_store *r, struct redis_node *n, const struct redis_item *it)
{
    char head[256 + STORE_REDIS_HEAD_BYTES], tail[64], name[NAME_MAX_CHARS + 1], ttl[16];
    int ttl_len = snprintf(ttl, sizeof(ttl), "%u", r->o.ttl_s), hl, tl;
    size_t name_len = item_name(r, it, name);

    hl = snprintf(head, 256, "*%d\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%u\r\n", r->o.ttl_s ? 6 : 4,
                  name_len, name, STORE_REDIS_HEAD_BYTES + r->base.page_bytes);
    store_redis_value_head(r->o.fingerprint, it->key, it->page, r->base.page_bytes,
                           (uint8_t *)head + hl);
    tl = r->o.ttl_s ? snprintf(tail, sizeof(tail), "\r\n$2\r\nNX\r\n$2\r\nEX\r\n$%d\r\n%s\r\n",
                               ttl_len, ttl)
                    : snprintf(tail, sizeof(tail), "\r\n$2\r\nNX\r\n");
    struct iovec iov[] = {{head, (size_t)hl + STORE_REDIS_HEAD_BYTES},
                          {(void *)it->page, r->base.page_bytes},
                          {tail, (size_t)tl}};
    if (it->ask && redis_wire_append(n->ctx, 1, asking, NULL))
        return -ENOMEM;
    if (redis_wire_writev(n->ctx, iov, 3)) {
        redis_conn_lost(r, n);
        return -EIO;
    }
    return 0;
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
    int rc;

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
    if ((rc = cmd == CMD_SET ? send_set(r, n, it) : append_cmd(r, n->ctx, cmd, it))) {
        /* Half a command sent or appended: start that node afresh; what it was sent this
         * round fails when the round reads it. */
        n->round_err = -EIO;
        if (n->ctx)
            redis_conn_lost(r, n);
        it->err = rc;
        return;
    }
    it->sent = true;
    n->sent++;
}

/* Write out every node's pipeline before reading any: the masters then work in parallel. */
static void flush_nodes(struct redis_store *r)
{
    for (size_t i = 0; i < r->n_nodes; i++)
        if (r->nodes[i].sent)
            flush_node(r, &r->nodes[i]);
}

/* The reply's bytes after its first line: a GET's page into it->dst, any other bulk dropped.
 * 0, or -EIO with the connection to drop. */
static int read_body(struct redis_store *r, struct redis_node *n, enum redis_cmd cmd,
                     struct redis_item *it, const struct resp_reply *rep)
{
    int rc;

    if (rep->type != RESP_BULK)
        return 0;
    rc = cmd == CMD_GET ? redis_resp_page(r, n->ctx, rep, it->key, it->dst)
                        : redis_resp_skip(n->ctx, rep);
    if (rc == -EIO)
        return -EIO;
    it->page_rc = rc;
    return 0;
}

/* Read it's reply (after its ASKING's); a redirect or TRYAGAIN leaves it for the next round. */
static void read_item(struct redis_store *r, enum redis_cmd cmd, struct redis_item *it,
                      uint64_t *moved, uint64_t *asked)
{
    uint16_t from = it->node, to;
    struct redis_node *n = &r->nodes[from];
    struct resp_reply rep;
    int kind;

    it->sent = false;
    if (!n->ctx) { /* dropped earlier in the round */
        it->err = -EIO;
        return;
    }
    if ((it->ask && (redis_resp_head(n->ctx, &rep) || redis_resp_skip(n->ctx, &rep))) ||
        redis_resp_head(n->ctx, &rep) || read_body(r, n, cmd, it, &rep)) {
        redis_conn_lost(r, n);
        it->err = -EIO;
        return;
    }
    it->from = from;
    if (rep.type == RESP_ERROR && (kind = redis_redirect(r, rep.line, from, &to))) {
        it->node = to; /* n is stale now: the nodes may have moved */
        it->ask = kind == 2;
        *(kind == 1 ? moved : asked) += 1;
        return;
    }
    it->ask = false;
    if (rep.type == RESP_ERROR && !strncmp(rep.line, "TRYAGAIN", 8))
        return; /* a key of a multi-key command mid-migration: once more */
    redis_conn_answered(n);
    it->rep = rep;
    it->answered = true;
}

static bool pending(const struct redis_item *it)
{
    return !it->answered && !it->err;
}

/* Commands still unanswered after MAX_REDIRECTS fail, and each node that redirected one last
 * is marked down: the next commands for its slots fail at once (or go to their copies)
 * rather than bounce again. */
static void give_up(struct redis_store *r, struct redis_item *items, size_t n)
{
    char why[96];
    uint64_t loops = 0;

    snprintf(why, sizeof(why), "a command redirected more than %d times", MAX_REDIRECTS);
    for (size_t i = 0; i < n; i++) {
        if (!pending(&items[i]))
            continue;
        items[i].err = -EIO;
        loops++;
        if (items[i].from != NODE_NONE && !r->nodes[items[i].from].down)
            redis_conn_down(r, &r->nodes[items[i].from], -EIO, why);
    }
    pthread_mutex_lock(&r->lock);
    r->c.redirect_loops += loops;
    pthread_mutex_unlock(&r->lock);
}

void redis_route_batch(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items,
                       size_t n)
{
    char name[NAME_MAX_CHARS + 1];
    uint64_t moved = 0, asked = 0;
    size_t sent = 1;

    redis_cluster_update(r);
    for (size_t i = 0; i < n; i++) {
        struct redis_item *it = &items[i];
        it->slot = store_redis_slot(name, item_name(r, it, name));
        it->node = it->replica ? redis_route_replica(r, it->slot) : redis_route(r, it->slot);
        it->from = NODE_NONE;
        it->answered = false, it->err = 0, it->ask = false, it->sent = false, it->page_rc = 0;
    }
    for (int round = 0; round <= MAX_REDIRECTS && sent; round++) {
        start_round(r);
        sent = 0;
        for (size_t i = 0; i < n; i++)
            if (pending(&items[i]))
                send_item(r, cmd, &items[i]);
        flush_nodes(r);
        for (size_t i = 0; i < n; i++)
            if (items[i].sent && ++sent)
                read_item(r, cmd, &items[i], &moved, &asked);
    }
    give_up(r, items, n);
    pthread_mutex_lock(&r->lock);
    r->c.moved += moved;
    r->c.asked += asked;
    pthread_mutex_unlock(&r->lock);
}
