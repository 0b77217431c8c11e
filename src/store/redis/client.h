/*
 * A Redis client of the store's own, for the store's I/O thread and for kvtier-ctl: one
 * connection (wire.c), plain TCP or TLS, each wait bounded by a deadline (a whole reply's,
 * a whole write's); commands framed into its output buffer and written by a flush; replies
 * read through its input buffer, a reply's first line alone (the store's batches, resp.c) or
 * whole, arrays too, within bounds on the whole reply.
 */
#ifndef KVT_STORE_REDIS_CLIENT_H
#define KVT_STORE_REDIS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <openssl/ssl.h>

#define RESP_BUF_BYTES (64u << 10)

/* One connection (wire.c): a socket, TLS on it or not, and its buffers. */
struct redis_wire {
    int fd;
    SSL *ssl; /* NULL: plain TCP */
    char *in; /* RESP_BUF_BYTES: bytes read, not yet parsed (resp.c) */
    size_t in_pos, in_len;
    char *out; /* commands appended, not yet written */
    size_t out_len, out_cap;
    /* Set by a caller whose thread keeps SIGPIPE blocked: TLS calls then skip blocking it
     * around themselves (a write to a closed connection must raise nothing that kills). */
    bool sigpipe_blocked;
    uint32_t read_ms, write_ms;
    uint64_t deadline_ms; /* the reply being read must be whole by then (CLOCK_MONOTONIC) */
    int cancel_fd;        /* -1, or an fd whose turning readable ends every wait */
    int err;              /* why the last wait or transfer failed: -ETIMEDOUT, -ECANCELED,
                             -ECONNRESET (closed or failed) */
};

struct redis_wire_timeouts {
    uint32_t connect_ms, read_ms, write_ms; /* each above 0 (0 would not bound the wait) */
};

enum resp_type { RESP_STATUS, RESP_ERROR, RESP_INT, RESP_NIL, RESP_BULK, RESP_ARRAY };

/* A whole reply (redis_resp_read): arrays hold their elements. */
struct resp_value {
    enum resp_type type;
    long long integer; /* RESP_INT's value; a bulk's length; an array's count */
    char *str;         /* a status's, an error's or a bulk's bytes, NUL-terminated */
    struct resp_value **elem;
    size_t n;
};

/* Bounds on a whole reply (redis_resp_read): no command of ours is answered with more. Past
 * them the reply is -EMSGSIZE. Elements are counted over the whole tree, and bytes over every
 * string in it plus 64 for each element, so an endless array of arrays costs at most that,
 * whatever each level says. */
#define RESP_MAX_DEPTH 8
#define RESP_MAX_BULK (64u << 20)
#define RESP_MAX_ELEMENTS (1u << 20)
#define RESP_MAX_BYTES (RESP_MAX_BULK + (16u << 20))
#define RESP_BOUNDS_TEXT "8 levels, 1048576 elements, 80 MiB in all"

/* A reply as resp.c reads it: its type, its first line (truncated) and number. */
struct resp_reply {
    enum resp_type type;
    long long integer; /* RESP_INT's value, RESP_BULK's length */
    char line[160];    /* after the type byte: a status's or an error's text */
};

/* wire.c. A client TLS context: the CAs in ca (NULL: the system's), a client certificate
 * chain in cert and its key in key (NULL: in cert's file) when cert is given. -EINVAL with
 * the file and OpenSSL's reason in err. */
int redis_tls_ctx(const char *ca, const char *cert, const char *key, SSL_CTX **out, char *err,
                  size_t len);
void redis_tls_ctx_free(SSL_CTX *c);
/* Connect to host:port (TLS over it when tls is given, the peer checked against host): 0,
 * -ECONNREFUSED, -EIO (no answer, a timeout), -EPROTO (TLS refused or the peer's
 * certificate did not check out) or -ENOMEM; err says why. */
int redis_wire_open(const char *host, uint16_t port, SSL_CTX *tls,
                    const struct redis_wire_timeouts *t, struct redis_wire **out, char *err,
                    size_t len);
/* redis_wire_open, every wait of the connection (its connect and handshake too) ended at once,
 * -ECANCELED, when cancel_fd (an eventfd, say) turns readable. */
int redis_wire_open_cancellable(const char *host, uint16_t port, SSL_CTX *tls,
                                const struct redis_wire_timeouts *t, int cancel_fd,
                                struct redis_wire **out, char *err, size_t len);
void redis_wire_close(struct redis_wire *w); /* NULL: a no-op */
/* Up to len bytes (at least one); -1 when the peer closed, failed or the reply's deadline (or,
 * outside a reply, read_ms) ran out. */
ssize_t redis_wire_read(struct redis_wire *w, void *buf, size_t len);
/* Frame a command (argv[i] of lens[i] bytes; lens NULL: strings) into the output buffer. */
int redis_wire_append(struct redis_wire *w, int argc, const char *const *argv, const size_t *lens);
/* A reply begins: it must be whole within read_ms from now, plus 1 ms for each 64 KiB of
 * bytes (what the reply is known to hold; 0 when not). resp.c calls it. */
void redis_wire_reply_start(struct redis_wire *w, size_t bytes);
/* The reply turned out to hold bytes more: its time grows as reply_start's does. */
void redis_wire_reply_extend(struct redis_wire *w, size_t bytes);
/* Why a call on w failed with rc, as text (a timeout, a closed connection, a reply past the
 * bounds, ...); w may be NULL. */
const char *redis_wire_why(const struct redis_wire *w, int rc);
/* Write out what was appended: 0 or -EIO. */
int redis_wire_flush(struct redis_wire *w);
/* What was appended, then the pieces of iov (consumed: iov is changed): on plain TCP written
 * now, straight from where they lie; over TLS appended, written by a flush (or once the
 * pipeline passes 1 MiB). 0, -ENOMEM or -EIO. */
int redis_wire_writev(struct redis_wire *w, struct iovec *iov, int n);

/* The next reply, whole, within the read timeout: 0, -ENOMEM, -EMSGSIZE (past RESP_MAX_*),
 * or -EIO (the connection failed or timed out: w->err says which); free it with
 * redis_resp_free. */
int redis_resp_read(struct redis_wire *w, struct resp_value **out);
void redis_resp_free(struct resp_value *v);
/* One command and its whole reply. */
int redis_call(struct redis_wire *w, int argc, const char *const *argv, const size_t *lens,
               struct resp_value **out);
/* One command on a plain connection of its own, closed after the reply (tests and tools). */
int redis_call_once(const char *host, uint16_t port, const struct redis_wire_timeouts *t, int argc,
                    const char *const *argv, const size_t *lens, struct resp_value **out);

#endif
