/*
 * What every tier shares (tier.h): the storing eviction, which the device (for the host
 * tier) and the host tier (for the store tier) run alike, and the chain's NULL-safe calls.
 */
#include "tier.h"

#include <errno.h>

size_t tier_evict_storing(struct tier *below, struct rdx_tree *tree, tier_evict_fn fn, size_t pages)
{
    kvt_node_ref defer[TIER_STORE_BATCH];
    size_t done = 0, n = 0;

    for (int round = 0; round < TIER_STORE_ROUNDS && done < pages; round++) {
        size_t started = 0;

        done += fn(tree, pages - done, defer, TIER_STORE_BATCH, &n);
        for (size_t i = 0; i < n; i++)
            started += (size_t)below->ops->store(below, defer[i]);
        if (started == 0)
            break;
        tier_settle(below); /* the next round evicts them, now stored below */
    }
    return done;
}

size_t tier_poll(struct tier *t, size_t max)
{
    return t ? t->ops->poll(t, max) : 0;
}

void tier_sync(struct tier *t)
{
    if (t)
        t->ops->sync(t);
}

void tier_settle(struct tier *t)
{
    if (t)
        (t->ops->settle ? t->ops->settle : t->ops->sync)(t);
}

size_t tier_find(struct tier *t, const struct kvt_key *key, const struct rdx_hit *hit)
{
    return t ? t->ops->find(t, key, hit) : 0;
}

void tier_matched(struct tier *t, const struct rdx_hit *hit, size_t found)
{
    if (t)
        t->ops->matched(t, hit, found);
}

/* The tier of t's chain that keeps states: one whose ops have them. */
static struct tier *state_keeper(struct tier *t)
{
    while (t && !t->ops->put_state)
        t = t->below;
    return t;
}

int tier_put_state(struct tier *t, const uint8_t *hash, const void *buf, size_t bytes)
{
    return (t = state_keeper(t)) ? t->ops->put_state(t, hash, buf, bytes) : 0;
}

bool tier_has_state(struct tier *t, const uint8_t *hash, size_t bytes)
{
    return (t = state_keeper(t)) && t->ops->has_state(t, hash, bytes);
}

int tier_get_state(struct tier *t, const uint8_t *hash, void *buf, size_t bytes)
{
    return (t = state_keeper(t)) ? t->ops->get_state(t, hash, buf, bytes) : -ENOENT;
}

bool tier_wants_evicted(const struct tier *t)
{
    return t && t->ops->wants_evicted(t);
}

int tier_failed(const struct tier *t)
{
    int rc = 0;

    for (; t && !rc; t = t->below)
        rc = t->ops->failed(t);
    return rc;
}

void tier_stats(const struct tier *t, struct kvt_stats *st)
{
    for (; t; t = t->below)
        t->ops->stats(t, st);
}

void tier_stop_chain(struct tier *t)
{
    for (; t; t = t->below)
        t->ops->stop(t);
}

void tier_close_chain(struct tier *t)
{
    while (t) {
        struct tier *below = t->below;

        t->ops->close(t);
        t = below;
    }
}
