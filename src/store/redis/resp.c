/*
 * Replies read off a connection (wire.c), for the routed batches (route.c): a reply's first
 * line from the connection's small buffer, and a GET's value straight into the page it is
 * for. A client library's reader (hiredis's, which the store used before) copies a value twice
 * (into its buffer, then into a reply object) and reads 16 KiB at a time; with the check and the
 * copy into the page that was four passes over every page and sixteen wakeups, and reads ran at 0.4
 * of redis-benchmark's rate. Here the kernel copies a page's bytes into the page and the checksum
 * reads them once. Only the header (104 bytes) goes through the buffer, and it is checked before a
 * byte of the payload lands, so a value of another key, fingerprint or size never reaches the page;
 * one that fails only its checksum has (its result says so).
 *
 * The one-off exchanges (the handshake, DBSIZE, CLUSTER SLOTS, and kvtier-ctl's commands)
 * read whole replies, arrays too, as trees (redis_resp_read) through the same buffer, within
 * bounds on the whole tree (client.h): each level's own bound alone would let a hostile
 * server nest arrays of a million arrays, and an array header of a few bytes cost a client
 * some hundred bytes of memory.
 *
 * Every reply is bounded in time as a whole: its clock starts at its first line (wire.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "store/redis/redis_int.h"

/* More bytes into the wire's buffer (after compacting it); -EIO when none come. */
static int fill(struct redis_wire *w)
{
    ssize_t k;

    if (w->in_pos) {
        memmove(w->in, w->in + w->in_pos, w->in_len - w->in_pos);
        w->in_len -= w->in_pos;
        w->in_pos = 0;
    }
    if (w->in_len == RESP_BUF_BYTES)
        return -EIO; /* a line longer than the buffer: not a reply of ours */
    if ((k = redis_wire_read(w, w->in + w->in_len, RESP_BUF_BYTES - w->in_len)) < 0)
        return -EIO; /* closed, or the read timeout (SO_RCVTIMEO) ran out */
    w->in_len += (size_t)k;
    return 0;
}

/* The next line, without its CRLF: *line points into the buffer until the next read. */
static int next_line(struct redis_wire *w, char **line, size_t *len)
{
    char *cr;

    while (!(cr = memmem(w->in + w->in_pos, w->in_len - w->in_pos, "\r\n", 2)))
        if (fill(w))
            return -EIO;
    *line = w->in + w->in_pos;
    *len = (size_t)(cr - *line);
    w->in_pos += *len + 2;
    return *len < 1 ? -EIO : 0;
}

/* A reply's (or an element's) first line. */
static int parse_head(struct redis_wire *w, struct resp_reply *rep)
{
    char *line;
    size_t len;

    if (next_line(w, &line, &len))
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
    case '*':
        rep->integer = strtoll(rep->line, NULL, 10);
        rep->type = rep->integer < 0 ? RESP_NIL : RESP_ARRAY;
        return 0;
    default:
        return -EIO; /* RESP3's types: no connection of ours asks for them */
    }
}

int redis_resp_head(struct redis_wire *w, struct resp_reply *rep)
{
    redis_wire_reply_start(w, 0);
    return parse_head(w, rep);
}

/* The next len bytes of the stream into dst (NULL: dropped): what the buffer holds first,
 * the rest straight off the connection. */
static int take(struct redis_wire *w, void *dst, size_t len)
{
    size_t have = w->in_len - w->in_pos, k = have < len ? have : len;
    ssize_t got;

    if (dst)
        memcpy(dst, w->in + w->in_pos, k);
    w->in_pos += k;
    for (size_t done = k; done < len; done += (size_t)got) {
        if (!dst) { /* dropping: through the buffer */
            w->in_pos = w->in_len;
            if (fill(w))
                return -EIO;
            got = (ssize_t)(w->in_len < len - done ? w->in_len : len - done);
            w->in_pos = (size_t)got;
            continue;
        }
        if ((got = redis_wire_read(w, (char *)dst + done, len - done)) < 0)
            return -EIO;
    }
    return 0;
}

int redis_resp_skip(struct redis_wire *w, const struct resp_reply *rep)
{
    return rep->type == RESP_BULK ? take(w, NULL, (size_t)rep->integer + 2) : 0;
}

int redis_resp_page(struct redis_store *r, struct redis_wire *w, const struct resp_reply *rep,
                    const uint8_t *key, void *page)
{
    uint8_t head[STORE_REDIS_HEAD_BYTES], crlf[2];

    if ((size_t)rep->integer != STORE_REDIS_HEAD_BYTES + (size_t)r->base.page_bytes)
        return redis_resp_skip(w, rep) ? -EIO : KVT_ECORRUPT;
    redis_wire_reply_extend(w, (size_t)rep->integer); /* a page of the size asked for */
    if (take(w, head, sizeof(head)))
        return -EIO;
    if (redis_head_check(r, key, head))
        return take(w, NULL, r->base.page_bytes + 2) ? -EIO : KVT_ECORRUPT;
    if (take(w, page, r->base.page_bytes) || take(w, crlf, 2))
        return -EIO;
    return redis_payload_check(r, head, page);
}

/* ---- whole replies, for the one-off exchanges ---- */

void redis_resp_free(struct resp_value *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++)
        redis_resp_free(v->elem[i]);
    free(v->elem);
    free(v->str);
    free(v);
}

/* What is left of a whole reply's bounds: elements, and bytes (strings, 64 an element). */
struct budget {
    size_t elements, bytes;
};

#define ELEMENT_BYTES 64

static int charge(struct budget *b, unsigned long long elements, unsigned long long bytes)
{
    if (elements > b->elements || bytes > b->bytes)
        return -EMSGSIZE;
    b->elements -= elements;
    b->bytes -= bytes;
    return 0;
}

/* An array's or a bulk's declared size is charged when its header comes, before anything is
 * allocated for it; the element itself with its parent's count. */
static int charge_head(struct budget *b, const struct resp_reply *h)
{
    unsigned long long n = (unsigned long long)h->integer;

    if (h->type == RESP_BULK)
        return n > RESP_MAX_BULK ? -EMSGSIZE : charge(b, 0, n + 2);
    if (h->type == RESP_ARRAY)
        return charge(b, n, n * ELEMENT_BYTES);
    return charge(b, 0, strlen(h->line) + 1);
}

static int read_value(struct redis_wire *w, unsigned depth, struct budget *b,
                      struct resp_value **out)
{
    struct resp_reply h;
    struct resp_value *v;
    int rc;

    *out = NULL;
    if (depth > RESP_MAX_DEPTH)
        return -EMSGSIZE;
    if (parse_head(w, &h))
        return -EIO;
    if ((rc = charge_head(b, &h)))
        return rc;
    if (!(v = calloc(1, sizeof(*v))))
        return -ENOMEM;
    v->type = h.type;
    v->integer = h.integer;
    *out = v;
    switch (h.type) {
    case RESP_STATUS:
    case RESP_ERROR:
        return (v->str = strdup(h.line)) ? 0 : -ENOMEM;
    case RESP_BULK:
        redis_wire_reply_extend(w, (size_t)h.integer); /* a page (verify's GET) takes longer */
        if (!(v->str = malloc((size_t)h.integer + 2)))
            return -ENOMEM;
        if (take(w, v->str, (size_t)h.integer + 2))
            return -EIO;
        v->str[h.integer] = '\0';
        return 0;
    case RESP_ARRAY:
        if (h.integer && !(v->elem = calloc((size_t)h.integer, sizeof(*v->elem))))
            return -ENOMEM;
        for (; v->n < (size_t)h.integer; v->n++)
            if ((rc = read_value(w, depth + 1, b, &v->elem[v->n]))) {
                v->n++; /* what the element got is freed with the rest */
                return rc;
            }
        return 0;
    default:
        return 0;
    }
}

int redis_resp_read(struct redis_wire *w, struct resp_value **out)
{
    struct budget b = {RESP_MAX_ELEMENTS, RESP_MAX_BYTES};
    int rc;

    redis_wire_reply_start(w, 0);
    if ((rc = read_value(w, 0, &b, out))) {
        redis_resp_free(*out);
        *out = NULL;
    }
    return rc;
}

int redis_call_once(const char *host, uint16_t port, const struct redis_wire_timeouts *t, int argc,
                    const char *const *argv, const size_t *lens, struct resp_value **out)
{
    struct redis_wire *w;
    int rc;

    *out = NULL;
    if ((rc = redis_wire_open(host, port, NULL, t, &w, NULL, 0)))
        return rc;
    rc = redis_call(w, argc, argv, lens, out);
    redis_wire_close(w);
    return rc;
}

int redis_call(struct redis_wire *w, int argc, const char *const *argv, const size_t *lens,
               struct resp_value **out)
{
    *out = NULL;
    if (redis_wire_append(w, argc, argv, lens))
        return -ENOMEM;
    if (redis_wire_flush(w))
        return -EIO;
    return redis_resp_read(w, out);
}
