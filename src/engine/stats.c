/*
 * The engine's figures: kvt_stats for the owner and the same figures handed to the live
 * stats socket after each poll and sync. Each part fills its own fields through its stats
 * call: the slot layer (engine_slots_stats), the hybrid parts, each tier (tier_ops.stats); the
 * engine knows no tier by name here either.
 */
#include "engine/mamba.h"
#include "engine/stats.h"
#include "engine/swa.h"
#include "stats_server.h"

#include <errno.h>
#include <string.h>

static void fill_stats(const kvt_engine *e, struct kvt_stats *st)
{
    struct rdx_sizes s;
    uint32_t ps;

    ps = e->opts.page_size;
    rdx_sizes(e->tree, &s);
    memset(st, 0, sizeof(*st));
    st->size = sizeof(*st);
    st->backend = e->be->kind;
    st->page_size = ps;
    st->cached_tokens = s.cached_pages * ps;
    st->evictable_tokens = s.evictable_pages * ps;
    st->protected_tokens = s.protected_pages * ps;
    st->nodes = s.nodes;
    st->tree_bytes = s.bytes;
    st->req_slots_free = e->reqs.nfree;
    st->match_calls = e->count.match_calls;
    st->match_query_tokens = e->count.match_query_tokens;
    st->match_hit_tokens = e->count.match_hit_tokens;
    st->inserted_tokens = e->count.inserted_tokens;
    st->evicted_tokens = e->count.evicted_tokens;
    engine_slots_stats(&e->slots, st);
    tier_stats(e->below, st);
    engine_mamba_stats(e, st);
    engine_swa_stats(e, st);
}

void engine_publish(kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    if (!e->stats)
        return;
    fill_stats(e, &st);
    stats_server_publish(e->stats, &st);
}

/* An older caller's struct is shorter: it gets the fields it has. A newer caller's is longer:
 * the fields this library does not know are zeroed, and st->size says where ours end. */
int kvt_stats(const kvt_engine *e, struct kvt_stats *out)
{
    struct kvt_stats full;

    if (!e || !out || out->size < sizeof(out->size))
        return -EINVAL;
    size_t size = out->size;
    fill_stats(e, &full);
    if (size > sizeof(full))
        memset((uint8_t *)out + sizeof(full), 0, size - sizeof(full));
    full.size = size < sizeof(full) ? size : sizeof(full);
    memcpy(out, &full, full.size);
    return 0;
}
