/*
 * One connection to a Redis or Valkey server, plain TCP or TLS (OpenSSL). The socket is
 * non-blocking and every wait is a poll with a deadline: the connect (connect_ms), the TLS
 * handshake and each reply (read_ms for the whole reply, however slowly its bytes trickle in:
 * resp.c starts the clock when a reply begins), each write call (write_ms for all of it). A
 * wait ends early, -ECANCELED, when the wire's cancel fd turns readable (the store's close ends
 * a probe that way). A socket timeout per read would not do: a server that sends a byte a
 * second never lets one run out.
 *
 * Commands are framed here (RESP arrays of bulk strings) into an output buffer that a flush
 * writes out; replies are read through the wire's input buffer by resp.c. The store's I/O
 * thread and kvtier-ctl use it alike; neither needs a client library.
 *
 * TLS: the peer's certificate must chain to the trusted CAs (the system's, or a file) and name
 * the host the URL names (a DNS name, or an IP address in its subjectAltName); a server that
 * asks for a client certificate gets the one configured. TLS 1.2 at least.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "store/redis/redis_int.h"

#define OUT_MIN_BYTES 4096
#define TLS_FLUSH_BYTES (1u << 20) /* a TLS connection's pipeline is written out past this */

/* OpenSSL writes to the socket with write(2), which raises SIGPIPE on a connection the peer
 * closed; plain sends pass MSG_NOSIGNAL. Around each TLS call SIGPIPE is blocked on this
 * thread and one it raised is taken back, so a dead server costs an error, never the process
 * (kvtier-ctl, an application thread), whatever its signal handling. */
struct quiet {
    sigset_t old;
    bool skip; /* the thread blocks SIGPIPE for good (the store's I/O thread) */
};

static void quiet_begin(const struct redis_wire *w, struct quiet *q)
{
    sigset_t pipe;

    if ((q->skip = w->sigpipe_blocked))
        return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &q->old);
}

static void quiet_end(struct quiet *q)
{
    struct timespec zero = {0, 0};
    sigset_t pipe, pending;

    if (q->skip)
        return;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    if (!sigismember(&q->old, SIGPIPE) && sigpending(&pending) == 0 &&
        sigismember(&pending, SIGPIPE))
        sigtimedwait(&pipe, NULL, &zero);
    pthread_sigmask(SIG_SETMASK, &q->old, NULL);
}

uint64_t redis_now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* The time a transfer of bytes may take past its timeout: 1 ms a 64 KiB (64 MB/s at the
 * least), so a large page on a slow link is not taken for a hung server. */
static uint64_t allowance_ms(size_t bytes)
{
    return bytes >> 16;
}

void redis_wire_reply_start(struct redis_wire *w, size_t bytes)
{
    w->deadline_ms = redis_now_ms() + w->read_ms + allowance_ms(bytes);
}

void redis_wire_reply_extend(struct redis_wire *w, size_t bytes)
{
    w->deadline_ms += allowance_ms(bytes);
}

/* Wait until fd is ready for events, until deadline (CLOCK_MONOTONIC ms) at most: 0, or
 * -ETIMEDOUT, -ECANCELED (cancel turned readable) or -EIO. */
static int wait_fd(int fd, int cancel, short events, uint64_t deadline)
{
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = cancel, .events = POLLIN}};
    uint64_t now;
    int k;

    for (;;) {
        if ((now = redis_now_ms()) >= deadline)
            return -ETIMEDOUT;
        k = poll(p, cancel >= 0 ? 2 : 1,
                 deadline - now > INT32_MAX ? INT32_MAX : (int)(deadline - now));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -EIO;
        if (k > 0 && cancel >= 0 && p[1].revents)
            return -ECANCELED;
        if (k > 0)
            return 0; /* ready, or an error or hangup the next call reports */
    }
}

static int wire_wait(struct redis_wire *w, short events, uint64_t deadline)
{
    int rc = wait_fd(w->fd, w->cancel_fd, events, deadline);

    if (rc)
        w->err = rc;
    return rc;
}

static void say(char *err, size_t len, const char *fmt, const char *a, uint16_t port,
                const char *why)
{
    if (err && len)
        snprintf(err, len, fmt, a, port, why);
}

/* OpenSSL's last error as text (the verify result first, when that is what failed). */
static const char *tls_why(SSL *ssl, char *buf, size_t len)
{
    long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
    unsigned long e = ERR_get_error();

    if (v != X509_V_OK)
        snprintf(buf, len, "certificate: %s", X509_verify_cert_error_string(v));
    else if (e)
        ERR_error_string_n(e, buf, len);
    else
        snprintf(buf, len, "handshake failed (%s)", errno ? strerror(errno) : "closed");
    ERR_clear_error();
    return buf;
}

int redis_tls_ctx(const char *ca, const char *cert, const char *key, SSL_CTX **out, char *err,
                  size_t len)
{
    SSL_CTX *c = SSL_CTX_new(TLS_client_method());
    char why[200];
    const char *what = "TLS";

    if (!c)
        goto fail;
    SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER, NULL);
    /* Non-blocking sockets: a write may stop part way and go on from a buffer moved since. */
    SSL_CTX_set_mode(c, SSL_MODE_AUTO_RETRY | SSL_MODE_ENABLE_PARTIAL_WRITE |
                            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    what = ca ? ca : "the system's CA certificates";
    if (ca ? SSL_CTX_load_verify_locations(c, ca, NULL) != 1
           : SSL_CTX_set_default_verify_paths(c) != 1)
        goto fail;
    what = cert;
    if (cert && SSL_CTX_use_certificate_chain_file(c, cert) != 1)
        goto fail;
    what = key ? key : cert;
    if (cert && (SSL_CTX_use_PrivateKey_file(c, key ? key : cert, SSL_FILETYPE_PEM) != 1 ||
                 SSL_CTX_check_private_key(c) != 1))
        goto fail;
    *out = c;
    return 0;
fail:
    if (err && len)
        snprintf(err, len, "%s: %s", what ? what : "TLS", tls_why(NULL, why, sizeof(why)));
    SSL_CTX_free(c);
    return -EINVAL;
}

void redis_tls_ctx_free(SSL_CTX *c)
{
    SSL_CTX_free(c);
}

/* A connected non-blocking TCP socket to host:port within ms: the first address that
 * answers. */
static int tcp_connect(const char *host, uint16_t port, uint32_t ms, int cancel, int *fd_out,
                       char *err, size_t len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *a;
    uint64_t deadline = redis_now_ms() + ms;
    char service[8];
    int rc = -EIO, fd = -1, e;

    snprintf(service, sizeof(service), "%u", port);
    if ((e = getaddrinfo(host, service, &hints, &res))) {
        say(err, len, "%s:%u: %s", host, port, gai_strerror(e));
        return -EIO;
    }
    for (a = res; a && rc; a = a->ai_next) {
        socklen_t sl = sizeof(e);

        if ((fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         a->ai_protocol)) < 0)
            continue;
        e = connect(fd, a->ai_addr, a->ai_addrlen) ? errno : 0;
        if (e == EINPROGRESS) {
            int w = wait_fd(fd, cancel, POLLOUT, deadline);
            e = w == -ECANCELED                                            ? ECANCELED
                : w == 0 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) ? e
                                                                           : ETIMEDOUT;
        }
        if (e == 0) {
            rc = 0;
            break;
        }
        rc = e == ECONNREFUSED ? -ECONNREFUSED : e == ECANCELED ? -ECANCELED : -EIO;
        say(err, len, "%s:%u: %s", host, port, strerror(e));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    *fd_out = fd;
    return fd < 0 ? rc : 0;
}

/* Keepalive on, Nagle off (commands go as pipelined writes). */
static int tune(int fd)
{
    int one = 1;

    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
        return -EIO;
    return 0;
}

/* What an SSL call that returned n asks for: 0 done (n > 0), POLLIN or POLLOUT to wait for,
 * or -1 failed. */
static int tls_wants(SSL *ssl, int n)
{
    if (n > 0)
        return 0;
    switch (SSL_get_error(ssl, n)) {
    case SSL_ERROR_WANT_READ:
        return POLLIN;
    case SSL_ERROR_WANT_WRITE:
        return POLLOUT;
    default:
        ERR_clear_error();
        return -1;
    }
}

/* The TLS handshake on fd, the peer checked against host (a name or an address), within
 * read_ms. */
static int tls_start(struct redis_wire *w, SSL_CTX *tls, const char *host, uint16_t port, char *err,
                     size_t len)
{
    unsigned char addr[16];
    bool is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
    uint64_t deadline = redis_now_ms() + w->read_ms;
    char why[200];
    struct quiet q;
    int want, rc;

    if (!(w->ssl = SSL_new(tls)) || SSL_set_fd(w->ssl, w->fd) != 1)
        goto fail;
    if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(w->ssl), host) != 1
              : SSL_set_tlsext_host_name(w->ssl, host) != 1 || SSL_set1_host(w->ssl, host) != 1)
        goto fail;
    do {
        errno = 0;
        quiet_begin(w, &q);
        rc = SSL_connect(w->ssl);
        want = rc == 1 ? 0 : tls_wants(w->ssl, rc);
        quiet_end(&q);
    } while (want > 0 && wire_wait(w, (short)want, deadline) == 0);
    if (rc == 1)
        return 0;
    if (want > 0) { /* the peer said nothing in time, or the wait was cancelled */
        say(err, len, "%s:%u: TLS: %s", host, port,
            w->err == -ECANCELED ? "cancelled" : "no handshake within the read timeout");
        return w->err == -ECANCELED ? -ECANCELED : -EPROTO;
    }
fail:
    say(err, len, "%s:%u: TLS: %s", host, port, tls_why(w->ssl, why, sizeof(why)));
    return -EPROTO;
}

int redis_wire_open(const char *host, uint16_t port, SSL_CTX *tls,
                    const struct redis_wire_timeouts *t, struct redis_wire **out, char *err,
                    size_t len)
{
    return redis_wire_open_cancellable(host, port, tls, t, -1, out, err, len);
}

int redis_wire_open_cancellable(const char *host, uint16_t port, SSL_CTX *tls,
                                const struct redis_wire_timeouts *t, int cancel_fd,
                                struct redis_wire **out, char *err, size_t len)
{
    struct redis_wire *w = calloc(1, sizeof(*w));
    int rc;

    *out = NULL;
    if (!w || !(w->in = malloc(RESP_BUF_BYTES))) {
        free(w);
        return -ENOMEM;
    }
    w->fd = -1;
    w->cancel_fd = cancel_fd;
    w->read_ms = t->read_ms;
    w->write_ms = t->write_ms;
    if ((rc = tcp_connect(host, port, t->connect_ms, w->cancel_fd, &w->fd, err, len)))
        goto fail;
    rc = -EIO;
    if (tune(w->fd)) {
        say(err, len, "%s:%u: %s", host, port, strerror(errno));
        goto fail;
    }
    if (tls && (rc = tls_start(w, tls, host, port, err, len)))
        goto fail;
    *out = w;
    return 0;
fail:
    redis_wire_close(w);
    return rc;
}

void redis_wire_close(struct redis_wire *w)
{
    if (!w)
        return;
    if (w->ssl) {
        SSL_free(w->ssl); /* no close_notify: the peer may be gone, and nothing waits for it */
        ERR_clear_error();
    }
    if (w->fd >= 0)
        close(w->fd);
    free(w->in);
    free(w->out);
    free(w);
}

/* One read attempt: bytes (> 0), 0 to wait for what *events says, or -1 (closed, failed). */
static ssize_t read_some(struct redis_wire *w, void *buf, size_t len, short *events)
{
    ssize_t k;

    if (w->ssl) {
        struct quiet q;
        int n, want;

        quiet_begin(w, &q); /* a read may write too (a TLS 1.3 key update's answer) */
        n = SSL_read(w->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
        want = tls_wants(w->ssl, n);
        quiet_end(&q);
        *events = (short)want;
        return n > 0 ? n : want > 0 ? 0 : -1;
    }
    *events = POLLIN;
    do
        k = read(w->fd, buf, len);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    return k > 0 ? k : -1;
}

ssize_t redis_wire_read(struct redis_wire *w, void *buf, size_t len)
{
    uint64_t deadline = w->deadline_ms ? w->deadline_ms : redis_now_ms() + w->read_ms;
    short events;
    ssize_t k;

    while ((k = read_some(w, buf, len, &events)) == 0)
        if (wire_wait(w, events, deadline))
            return -1;
    if (k < 0)
        w->err = -ECONNRESET;
    return k;
}

/* One write attempt: bytes written (> 0), 0 to wait for what *events says, or -1. */
static ssize_t write_some(struct redis_wire *w, const void *buf, size_t len, short *events)
{
    ssize_t k;

    if (w->ssl) {
        struct quiet q;
        int n, want;

        quiet_begin(w, &q);
        n = SSL_write(w->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
        want = tls_wants(w->ssl, n);
        quiet_end(&q);
        *events = (short)want;
        return n > 0 ? n : want > 0 ? 0 : -1;
    }
    *events = POLLOUT;
    do
        k = send(w->fd, buf, len, MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    return k > 0 ? k : -1;
}

/* len bytes of buf, all of them, by deadline. */
static int write_all(struct redis_wire *w, const void *buf, size_t len, uint64_t deadline)
{
    short events;
    ssize_t k;

    for (size_t done = 0; done < len; done += (size_t)(k > 0 ? k : 0)) {
        if ((k = write_some(w, (const char *)buf + done, len - done, &events)) < 0) {
            w->err = -ECONNRESET;
            return -EIO;
        }
        if (k == 0 && wire_wait(w, events, deadline))
            return -EIO;
    }
    return 0;
}

static uint64_t write_deadline(const struct redis_wire *w, size_t bytes)
{
    return redis_now_ms() + w->write_ms + allowance_ms(bytes);
}

static int reserve(struct redis_wire *w, size_t more)
{
    size_t cap = w->out_cap ? w->out_cap : OUT_MIN_BYTES;
    char *p;

    if (w->out_len + more <= w->out_cap)
        return 0;
    while (cap < w->out_len + more)
        cap *= 2;
    if (!(p = realloc(w->out, cap)))
        return -ENOMEM;
    w->out = p;
    w->out_cap = cap;
    return 0;
}

int redis_wire_append(struct redis_wire *w, int argc, const char *const *argv, const size_t *lens)
{
    size_t need = 16; /* "*N\r\n", N an int */
    int k;

    for (int i = 0; i < argc; i++) /* "$L\r\n" (L at most 20 digits), the bytes, "\r\n" */
        need += 32 + (lens ? lens[i] : strlen(argv[i]));
    if (reserve(w, need))
        return -ENOMEM;
    k = snprintf(w->out + w->out_len, need, "*%d\r\n", argc);
    w->out_len += (size_t)k;
    for (int i = 0; i < argc; i++) {
        size_t l = lens ? lens[i] : strlen(argv[i]);
        k = snprintf(w->out + w->out_len, 32, "$%zu\r\n", l);
        w->out_len += (size_t)k;
        memcpy(w->out + w->out_len, argv[i], l);
        memcpy(w->out + w->out_len + l, "\r\n", 2);
        w->out_len += l + 2;
    }
    return 0;
}

int redis_wire_flush(struct redis_wire *w)
{
    int rc = w->out_len ? write_all(w, w->out, w->out_len, write_deadline(w, w->out_len)) : 0;

    w->out_len = 0;
    return rc;
}

int redis_wire_writev(struct redis_wire *w, struct iovec *iov, int n)
{
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    size_t bytes = w->out_len;
    uint64_t deadline;
    ssize_t k;

    if (w->ssl) { /* OpenSSL copies to encrypt anyway: into the pipeline, one record per
                     TLS_FLUSH_BYTES rather than one (and a syscall) per piece */
        for (int i = 0; i < n; i++) {
            if (reserve(w, iov[i].iov_len))
                return -ENOMEM;
            memcpy(w->out + w->out_len, iov[i].iov_base, iov[i].iov_len);
            w->out_len += iov[i].iov_len;
        }
        return w->out_len >= TLS_FLUSH_BYTES ? redis_wire_flush(w) : 0;
    }
    if (redis_wire_flush(w))
        return -EIO;
    for (int i = 0; i < n; i++)
        bytes += iov[i].iov_len;
    deadline = write_deadline(w, bytes);
    while (m.msg_iovlen) { /* plain: the kernel gathers the pieces, nothing copied here */
        if ((k = sendmsg(w->fd, &m, MSG_NOSIGNAL)) < 0) {
            if (errno == EINTR)
                continue;
            if ((errno == EAGAIN || errno == EWOULDBLOCK) && !wire_wait(w, POLLOUT, deadline))
                continue;
            w->err = w->err ? w->err : -ECONNRESET;
            return -EIO;
        }
        for (; m.msg_iovlen && (size_t)k >= m.msg_iov->iov_len; m.msg_iov++, m.msg_iovlen--)
            k -= (ssize_t)m.msg_iov->iov_len;
        if (m.msg_iovlen) {
            m.msg_iov->iov_base = (char *)m.msg_iov->iov_base + k;
            m.msg_iov->iov_len -= (size_t)k;
        }
    }
    return 0;
}

const char *redis_wire_why(const struct redis_wire *w, int rc)
{
    if (rc == -EMSGSIZE)
        return "a reply past the client's bounds (" RESP_BOUNDS_TEXT ")";
    if (rc == -ENOMEM)
        return "out of memory";
    switch (w ? w->err : 0) {
    case -ETIMEDOUT:
        return "no whole reply within the timeout";
    case -ECANCELED:
        return "cancelled";
    case -ECONNRESET:
        return "the connection was closed or failed";
    default:
        return "the connection failed";
    }
}
