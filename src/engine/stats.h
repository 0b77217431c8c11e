/* The engine's figures (stats.c): kvt_stats, and the stats socket's after each poll. */
#ifndef KVT_ENGINE_STATS_H
#define KVT_ENGINE_STATS_H

#include "engine/engine_int.h"

/* Hand the stats socket (if any) the figures of now; kvt_poll and kvt_sync call it. */
void engine_publish(kvt_engine *e);

#endif
