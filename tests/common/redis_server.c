#include "redis_server.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* A cluster node keeps serving its slots while another master is down
 * (cluster-require-full-coverage no), and calls one down after 2 s without an answer. */
static void exec_server(const struct redis_server *rs)
{
    char port[8], bus[8], log[160];
    int null = open("/dev/null", O_RDWR);

    snprintf(port, sizeof(port), "%u", rs->port);
    snprintf(bus, sizeof(bus), "%u", rs->bus_port);
    snprintf(log, sizeof(log), "%s/redis.log", rs->dir);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
    }
    if (rs->cluster)
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir",
               rs->dir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", log,
               "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", "--cluster-enabled",
               "yes", "--cluster-port", bus, "--cluster-config-file", "nodes.conf",
               "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no",
               (char *)NULL);
    else
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--dir",
               rs->dir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", log,
               "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", (char *)NULL);
    _exit(127);
}

long long redis_server_cmd(const struct redis_server *rs, int argc, const char **argv,
                           const size_t *lens)
{
    struct timeval tv = {.tv_sec = 2};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", rs->port, tv);
    redisReply *rep = NULL;
    long long v = -1;

    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK)
        rep = redisCommandArgv(c, argc, argv, lens);
    if (rep && rep->type == REDIS_REPLY_INTEGER)
        v = rep->integer;
    else if (rep && rep->type == REDIS_REPLY_STATUS)
        v = 0;
    if (rep)
        freeReplyObject(rep);
    if (c)
        redisFree(c);
    return v;
}

int redis_server_cmd_str(const struct redis_server *rs, int argc, const char **argv, char *out,
                         size_t len)
{
    struct timeval tv = {.tv_sec = 2};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", rs->port, tv);
    redisReply *rep = NULL;
    int rc = -1;

    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK)
        rep = redisCommandArgv(c, argc, argv, NULL);
    if (rep && (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS ||
                rep->type == REDIS_REPLY_ERROR)) {
        snprintf(out, len, "%.*s", (int)rep->len, rep->str);
        rc = 0;
    }
    if (rep)
        freeReplyObject(rep);
    if (c)
        redisFree(c);
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
