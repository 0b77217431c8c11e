/* The engine's stats socket for kvtier-ctl (include/kvtier.h, options.stats_socket). */
#ifndef KVT_STATS_SERVER_H
#define KVT_STATS_SERVER_H

#include "kvtier.h"

struct stats_server;

/* Listen on a unix socket at path (mode 0600) and serve from a thread. A stale socket file is
 * replaced; -EADDRINUSE when a live server answers there, -EEXIST (left alone) when the path
 * is anything but a socket. */
int stats_server_start(const char *path, struct stats_server **out);

/* Publish the figures the server hands out next; owner thread. NULL is a no-op. */
void stats_server_publish(struct stats_server *sv, const struct kvt_stats *st);

/* Stop the thread at once, whatever its clients do, and remove the socket file if it is still
 * the one start made. NULL is a no-op. */
void stats_server_stop(struct stats_server *sv);

#endif
