#include "redis_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/redis/client.h"

bool redis_server_installed(void)
{
    return system("command -v redis-server >/dev/null 2>&1") == 0;
}

/* A port the kernel calls free now; the server binds it a moment later. */
static uint16_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    uint16_t port = 0;

    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

const char *redis_server_file(const struct redis_server *rs, const char *file, char *out,
                              size_t len)
{
    snprintf(out, len, "%s/%s", rs->cert_dir[0] ? rs->cert_dir : rs->dir, file);
    return out;
}

/* The test's CA, the server's certificate and a client's, and a CA that signed none of them;
 * EC keys, so it takes a fraction of a second. 0, or -1 when openssl(1) failed. */
static int make_certs(const struct redis_server *rs)
{
    static const char script[] =
        "(cd '%s' && K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes' &&"
        " openssl req -x509 $K -keyout ca.key -out ca.crt -days 2 -subj /CN=kvtier-test-ca &&"
        " openssl req -x509 $K -keyout other-ca.key -out other-ca.crt -days 2"
        " -subj /CN=kvtier-other-ca &&"
        " openssl req $K -keyout server.key -out server.csr -subj /CN=localhost &&"
        " printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext &&"
        " openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
        " -out server.crt -days 2 -extfile san.ext &&"
        " openssl req $K -keyout client.key -out client.csr -subj /CN=kvtier-test-client &&"
        " openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
        " -out client.crt -days 2) >/dev/null 2>&1";
    char cmd[sizeof(script) + 256];

    snprintf(cmd, sizeof(cmd), script, rs->dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* A cluster node keeps serving its slots while another master is down
 * (cluster-require-full-coverage no), and calls one down after 2 s without an answer. A TLS
 * node of a cluster speaks TLS on its bus too (tls-cluster), so the slot map names TLS ports. */
static void exec_server(const struct redis_server *rs)
{
    char port[8], bus[8], log[160], tls_port[8], cert[160], key[160], ca[160];
    const char *argv[48] = {
        "redis-server", "--port",    port, "--bind",       "127.0.0.1", "--dir",
        rs->dir,        "--save",    "",   "--appendonly", "no",        "--daemonize",
        "no",           "--logfile", log,  "--maxmemory",  "64mb",      "--maxmemory-policy",
        "allkeys-lru"};
    const char *cluster[] = {"--cluster-enabled",
                             "yes",
                             "--cluster-port",
                             bus,
                             "--cluster-config-file",
                             "nodes.conf",
                             "--cluster-node-timeout",
                             "2000",
                             "--cluster-require-full-coverage",
                             "no"};
    const char *tls[] = {"--tls-port",         tls_port,
                         "--tls-cert-file",    cert,
                         "--tls-key-file",     key,
                         "--tls-ca-cert-file", ca,
                         "--tls-auth-clients", rs->tls_auth_clients ? "yes" : "no",
                         "--tls-cluster",      rs->cluster ? "yes" : "no"};
    size_t n = 19;
    int null = open("/dev/null", O_RDWR);

    snprintf(port, sizeof(port), "%u", rs->port);
    snprintf(bus, sizeof(bus), "%u", rs->bus_port);
    snprintf(tls_port, sizeof(tls_port), "%u", rs->tls_port);
    snprintf(log, sizeof(log), "%s/redis.log", rs->dir);
    redis_server_file(rs, "server.crt", cert, sizeof(cert));
    redis_server_file(rs, "server.key", key, sizeof(key));
    redis_server_file(rs, "ca.crt", ca, sizeof(ca));
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    for (size_t i = 0; rs->cluster && i < sizeof(cluster) / sizeof(cluster[0]); i++)
        argv[n++] = cluster[i];
    for (size_t i = 0; rs->tls && i < sizeof(tls) / sizeof(tls[0]); i++)
        argv[n++] = tls[i];
    argv[n] = NULL;
    execvp("redis-server", (char *const *)argv);
    _exit(127);
}

/* One command on a fresh plain connection to the server's port; NULL when none came. */
static struct resp_value *call(const struct redis_server *rs, int argc, const char **argv,
                               const size_t *lens)
{
    const struct redis_wire_timeouts t = {2000, 2000, 2000};
    struct resp_value *rep;

    redis_call_once("127.0.0.1", rs->port, &t, argc, argv, lens, &rep);
    return rep;
}

long long redis_server_cmd(const struct redis_server *rs, int argc, const char **argv,
                           const size_t *lens)
{
    struct resp_value *rep = call(rs, argc, argv, lens);
    long long v = !rep                       ? -1
                  : rep->type == RESP_INT    ? rep->integer
                  : rep->type == RESP_STATUS ? 0
                                             : -1;

    redis_resp_free(rep);
    return v;
}

int redis_server_cmd_str(const struct redis_server *rs, int argc, const char **argv, char *out,
                         size_t len)
{
    struct resp_value *rep = call(rs, argc, argv, NULL);
    int rc = -1;

    if (rep && (rep->type == RESP_BULK || rep->type == RESP_STATUS || rep->type == RESP_ERROR)) {
        snprintf(out, len, "%s", rep->str);
        rc = 0;
    }
    redis_resp_free(rep);
    return rc;
}

/* Fork the server on rs->port in rs->dir and wait until it answers PING. */
static int launch(struct redis_server *rs)
{
    const char *ping[] = {"PING"};

    if (!rs->port || (rs->pid = fork()) < 0)
        return -EADDRNOTAVAIL;
    if (rs->pid == 0)
        exec_server(rs);
    for (int i = 0; i < 500; i++) {
        if (redis_server_cmd(rs, 1, ping, NULL) == 0)
            return 0;
        if (waitpid(rs->pid, NULL, WNOHANG) == rs->pid) { /* it died: the port was taken */
            rs->pid = 0;
            break;
        }
        usleep(10000);
    }
    return -ETIMEDOUT;
}

int redis_server_start(struct redis_server *rs, uint16_t port)
{
    const char *tmp = getenv("TMPDIR");
    int rc;

    snprintf(rs->dir, sizeof(rs->dir), "%s/kvt-redis-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(rs->dir))
        return -errno;
    rs->port = port ? port : free_port();
    while (rs->cluster && (!rs->bus_port || rs->bus_port == rs->port))
        rs->bus_port = free_port();
    while (rs->tls && (!rs->tls_port || rs->tls_port == rs->port))
        rs->tls_port = free_port();
    if (rs->tls && !rs->cert_dir[0] && make_certs(rs)) {
        redis_server_stop(rs);
        return -ENOEXEC;
    }
    if ((rc = launch(rs)))
        redis_server_stop(rs);
    return rc;
}

int redis_server_restart(struct redis_server *rs)
{
    int rc = launch(rs);

    if (rc)
        redis_server_kill(rs);
    return rc;
}

void redis_server_kill(struct redis_server *rs)
{
    if (rs->pid > 0) {
        kill(rs->pid, SIGKILL);
        waitpid(rs->pid, NULL, 0);
    }
    rs->pid = 0;
}

void redis_server_stop(struct redis_server *rs)
{
    char cmd[160];

    redis_server_kill(rs);
    if (*rs->dir) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rs->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "redis_server: could not remove %s\n", rs->dir);
        *rs->dir = '\0';
    }
}
