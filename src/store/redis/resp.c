/*
 * Replies read off a node's socket by the store itself, for the routed batches (route.c):
 * a reply's first line from a small buffer of the node's, and a GET's value straight into
 * the page it is for. hiredis's reader copies a value twice (into its buffer, then into a
 * reply object) and reads 16 KiB at a time; with the check and the copy into the page that
 * was four passes over every page and sixteen wakeups, and reads ran at 0.4 of
 * redis-benchmark's rate. Here the kernel copies a page's bytes into the page and the
 * checksum reads them once. Only the header (104 bytes) goes through the buffer, and it is
 * checked before a byte of the payload lands, so a value of another key, fingerprint or size
 * never reaches the page; one that fails only its checksum has (its result says so).
 *
 * hiredis still writes the commands and reads the replies of the one-off exchanges (the
 * handshake, DBSIZE, CLUSTER SLOTS); a round reads every reply it asked for, so neither
 * reader leaves the other's bytes behind.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtier.h"
#include "store/redis/redis_int.h"

/* More bytes into the node's buffer (after compacting it); -EIO when none come. */
static int fill(struct redis_node *n)
{
    ssize_t k;

    if (n->rb_pos) {
        memmove(n->rb, n->rb + n->rb_pos, n->rb_len - n->rb_pos);
        n->rb_len -= n->rb_pos;
        n->rb_pos = 0;
    }
    if (n->rb_len == RESP_BUF_BYTES)
        return -EIO; /* a line longer than the buffer: not a reply of ours */
    do
        k = read(n->ctx->fd, n->rb + n->rb_len, RESP_BUF_BYTES - n->rb_len);
    while (k < 0 && errno == EINTR);
    if (k <= 0)
        return -EIO; /* closed, or the read timeout (SO_RCVTIMEO) ran out */
    n->rb_len += (size_t)k;
    return 0;
}

int redis_resp_head(struct redis_node *n, struct resp_reply *rep)
{
    char *line, *cr;
    size_t len;

    while (!(cr = memmem(n->rb + n->rb_pos, n->rb_len - n->rb_pos, "\r\n", 2)))
        if (fill(n))
            return -EIO;
    line = n->rb + n->rb_pos;
    len = (size_t)(cr - line);
    n->rb_pos += len + 2;
    if (len < 1)
        return -EIO;
    memset(rep, 0, sizeof(*rep));
    snprintf(rep->line, sizeof(rep->line), "%.*s", (int)(len - 1), line + 1);
    switch (line[0]) {
    case '+':
        rep->type = RESP_STATUS;
        return 0;
    case '-':
        rep->type = RESP_ERROR;
        return 0;
    case ':':
        rep->type = RESP_INT;
        rep->integer = strtoll(rep->line, NULL, 10);
        return 0;
    case '$':
        rep->integer = strtoll(rep->line, NULL, 10);
        rep->type = rep->integer < 0 ? RESP_NIL : RESP_BULK;
        return 0;
    default:
        return -EIO; /* arrays and the rest: no command of ours answers so */
    }
}

/* The next len bytes of the stream into dst (NULL: dropped): what the buffer holds first,
 * the rest straight off the socket. */
static int take(struct redis_node *n, void *dst, size_t len)
{
    size_t have = n->rb_len - n->rb_pos, k = have < len ? have : len;
    ssize_t got;

    if (dst)
        memcpy(dst, n->rb + n->rb_pos, k);
    n->rb_pos += k;
    for (size_t done = k; done < len; done += (size_t)got) {
        if (!dst) { /* dropping: through the buffer */
            n->rb_pos = n->rb_len;
            if (fill(n))
                return -EIO;
            got = (ssize_t)(n->rb_len < len - done ? n->rb_len : len - done);
            n->rb_pos = (size_t)got;
            continue;
        }
        do
            got = read(n->ctx->fd, (char *)dst + done, len - done);
        while (got < 0 && errno == EINTR);
        if (got <= 0)
            return -EIO;
    }
    return 0;
}

int redis_resp_skip(struct redis_node *n, const struct resp_reply *rep)
{
    return rep->type == RESP_BULK ? take(n, NULL, (size_t)rep->integer + 2) : 0;
}

int redis_resp_page(struct redis_store *r, struct redis_node *n, const struct resp_reply *rep,
                    const uint8_t *key, void *page)
{
    uint8_t head[STORE_REDIS_HEAD_BYTES], crlf[2];

    if ((size_t)rep->integer != STORE_REDIS_HEAD_BYTES + (size_t)r->base.page_bytes)
        return redis_resp_skip(n, rep) ? -EIO : KVT_ECORRUPT;
    if (take(n, head, sizeof(head)))
        return -EIO;
    if (redis_head_check(r, key, head))
        return take(n, NULL, r->base.page_bytes + 2) ? -EIO : KVT_ECORRUPT;
    if (take(n, page, r->base.page_bytes) || take(n, crlf, 2))
        return -EIO;
    return redis_payload_check(r, head, page);
}
