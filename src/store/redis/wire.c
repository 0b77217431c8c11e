/*
 * One connection to a Redis or Valkey server, plain TCP or TLS (OpenSSL), blocking with a
 * timeout on every wait: the connect (non-blocking connect, then poll), and each read and
 * write (SO_RCVTIMEO, SO_SNDTIMEO, which bound OpenSSL's reads and writes on the socket too).
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

static struct timeval tv_of(uint32_t ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
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
    SSL_CTX_set_mode(c, SSL_MODE_AUTO_RETRY);
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

/* A connected TCP socket to host:port within ms: the first address that answers. */
static int tcp_connect(const char *host, uint16_t port, uint32_t ms, int *fd_out, char *err,
                       size_t len)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *a;
    char service[8];
    int rc = -EIO, fd = -1, e;

    snprintf(service, sizeof(service), "%u", port);
    if ((e = getaddrinfo(host, service, &hints, &res))) {
        say(err, len, "%s:%u: %s", host, port, gai_strerror(e));
        return -EIO;
    }
    for (a = res; a && rc; a = a->ai_next) {
        struct pollfd p;
        socklen_t sl = sizeof(e);

        if ((fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                         a->ai_protocol)) < 0)
            continue;
        e = connect(fd, a->ai_addr, a->ai_addrlen) ? errno : 0;
        if (e == EINPROGRESS) {
            p = (struct pollfd){.fd = fd, .events = POLLOUT};
            e = poll(&p, 1, (int)ms) == 1 && !getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl)
                    ? e
                    : ETIMEDOUT;
        }
        if (e == 0) {
            rc = 0;
            break;
        }
        rc = e == ECONNREFUSED ? -ECONNREFUSED : -EIO;
        say(err, len, "%s:%u: %s", host, port, strerror(e));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    *fd_out = fd;
    return fd < 0 ? rc : 0;
}

/* Blocking from here on, each wait bounded; Nagle off (commands go as pipelined writes). */
static int tune(int fd, uint32_t read_ms, uint32_t write_ms)
{
    struct timeval rt = tv_of(read_ms), wt = tv_of(write_ms);
    int one = 1;

    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) ||
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt)) ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wt, sizeof(wt)) ||
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)))
        return -EIO;
    return 0;
}

/* The TLS handshake on fd, the peer checked against host (a name or an address). */
static int tls_start(struct redis_wire *w, SSL_CTX *tls, const char *host, uint16_t port, char *err,
                     size_t len)
{
    unsigned char addr[16];
    bool is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
    char why[200];
    struct quiet q;
    int ok;

    if (!(w->ssl = SSL_new(tls)) || SSL_set_fd(w->ssl, w->fd) != 1)
        goto fail;
    if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(w->ssl), host) != 1
              : SSL_set_tlsext_host_name(w->ssl, host) != 1 || SSL_set1_host(w->ssl, host) != 1)
        goto fail;
    errno = 0;
    quiet_begin(w, &q);
    ok = SSL_connect(w->ssl) == 1;
    quiet_end(&q);
    if (ok)
        return 0;
fail:
    say(err, len, "%s:%u: TLS: %s", host, port, tls_why(w->ssl, why, sizeof(why)));
    return -EPROTO;
}

int redis_wire_open(const char *host, uint16_t port, SSL_CTX *tls,
                    const struct redis_wire_timeouts *t, struct redis_wire **out, char *err,
                    size_t len)
{
    struct redis_wire *w = calloc(1, sizeof(*w));
    int rc;

    *out = NULL;
    if (!w || !(w->in = malloc(RESP_BUF_BYTES))) {
        free(w);
        return -ENOMEM;
    }
    w->fd = -1;
    if ((rc = tcp_connect(host, port, t->connect_ms, &w->fd, err, len)))
        goto fail;
    rc = -EIO;
    if (tune(w->fd, t->read_ms, t->write_ms)) {
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

ssize_t redis_wire_read(struct redis_wire *w, void *buf, size_t len)
{
    ssize_t k;

    if (w->ssl) {
        struct quiet q;
        int n;

        quiet_begin(w, &q); /* a read may write too (a TLS 1.3 key update's answer) */
        n = SSL_read(w->ssl, buf, len > INT32_MAX ? INT32_MAX : (int)len);
        quiet_end(&q);
        if (n <= 0)
            ERR_clear_error();
        return n > 0 ? n : -1;
    }
    do
        k = read(w->fd, buf, len);
    while (k < 0 && errno == EINTR);
    return k > 0 ? k : -1; /* closed, failed, or the read timeout ran out */
}

/* len bytes of buf, all of them; the send timeout bounds each wait. */
static int write_all(struct redis_wire *w, const void *buf, size_t len)
{
    for (size_t done = 0; done < len;) {
        ssize_t k;
        if (w->ssl) {
            size_t part = len - done > INT32_MAX ? INT32_MAX : len - done;
            struct quiet q;
            int n;

            quiet_begin(w, &q);
            n = SSL_write(w->ssl, (const char *)buf + done, (int)part);
            quiet_end(&q);
            if (n <= 0) {
                ERR_clear_error();
                return -EIO;
            }
            k = n;
        } else if ((k = send(w->fd, (const char *)buf + done, len - done, MSG_NOSIGNAL)) < 0) {
            if (errno == EINTR)
                continue;
            return -EIO;
        }
        done += (size_t)k;
    }
    return 0;
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
    int rc = w->out_len ? write_all(w, w->out, w->out_len) : 0;

    w->out_len = 0;
    return rc;
}

int redis_wire_writev(struct redis_wire *w, struct iovec *iov, int n)
{
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
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
    while (m.msg_iovlen) { /* plain: the kernel gathers the pieces, nothing copied here */
        if ((k = sendmsg(w->fd, &m, MSG_NOSIGNAL)) < 0) {
            if (errno == EINTR)
                continue;
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
