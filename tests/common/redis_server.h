/*
 * A redis-server of a test's own: on loopback, on a free port (or a given one, to restart
 * one where a store expects it), in a temp dir, without persistence, with maxmemory and LRU
 * eviction so a store's capacity is the server's. Built where hiredis is.
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
};

/* redis-server is on PATH. */
bool redis_server_installed(void);

/* Start one and wait until it answers PING (5 s at most); port 0: a free one. 0 or -errno. */
int redis_server_start(struct redis_server *rs, uint16_t port);

/* Kill it (SIGKILL: as a crash would), reap it and remove its dir. */
void redis_server_stop(struct redis_server *rs);

/* Send one command (argv, argc) and return its reply's integer, or -1 on an error reply or
 * none; for FLUSHALL, DEBUG and the like. Values with binary bytes go through lens. */
long long redis_server_cmd(const struct redis_server *rs, int argc, const char **argv,
                           const size_t *lens);

#endif
