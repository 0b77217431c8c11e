/*
 * A redis-server of a test's own: on loopback, on a free port (or a given one, to restart
 * one where a store expects it), in a temp dir, without persistence, with maxmemory and LRU
 * eviction so a store's capacity is the server's. Built with the Redis store. With tls set, it
 * listens for TLS on a second port too, with certificates made for the test (openssl(1)).
 */
#ifndef KVT_TEST_REDIS_SERVER_H
#define KVT_TEST_REDIS_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct redis_server {
    pid_t pid;
    uint16_t port;
    char dir[128];
    bool cluster;      /* set before start: a cluster node (nodes.conf in its dir) */
    uint16_t bus_port; /* a cluster node's bus (cluster-port): a free one too, not port + 10000 */
    /* Set before start: TLS on tls_port (port stays plain, for the test's own commands), its
     * certificate (subjectAltName DNS:localhost, IP:127.0.0.1) signed by a CA of the test's,
     * in dir: ca.crt, client.crt and client.key (signed by the same CA), other-ca.crt (a CA
     * that signed nothing here). tls_auth_clients: a client certificate is required. */
    bool tls, tls_auth_clients;
    uint16_t tls_port;
    char cert_dir[128]; /* set before start: take the certificates from here (another
                           server's dir, as a cluster's nodes share a CA), none made */
};

/* The path of file (ca.crt, client.crt, ...) among rs's certificates, into out (len bytes). */
const char *redis_server_file(const struct redis_server *rs, const char *file, char *out,
                              size_t len);

/* redis-server is on PATH. */
bool redis_server_installed(void);

/* Start one and wait until it answers PING (5 s at most); port 0: a free one. 0 or -errno. */
int redis_server_start(struct redis_server *rs, uint16_t port);

/* Kill it (SIGKILL: as a crash would), reap it and remove its dir. */
void redis_server_stop(struct redis_server *rs);

/* Kill it (SIGKILL) and reap it, keeping its dir (a cluster node's nodes.conf) for
 * redis_server_restart. */
void redis_server_kill(struct redis_server *rs);

/* Start a killed one again, on its port, in its dir; 0 once it answers PING, or -errno. */
int redis_server_restart(struct redis_server *rs);

/* Send one command (argv, argc) and return its reply's integer, or -1 on an error reply or
 * none; for FLUSHALL, DEBUG and the like. Values with binary bytes go through lens. */
long long redis_server_cmd(const struct redis_server *rs, int argc, const char **argv,
                           const size_t *lens);

/* One command's reply as text (a status, a string or an error) into out (len bytes); 0, or -1
 * when no such reply came. */
int redis_server_cmd_str(const struct redis_server *rs, int argc, const char **argv, char *out,
                         size_t len);

#endif
