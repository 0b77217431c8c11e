/*
 * Where else a page may be read from when its master did not answer (down, failed, hung):
 * that master's replica (when replica reads are allowed: READONLY, its slot's first replica in
 * the map), then the page's copy (its copy name, in the slot half the map away, so on another
 * master: copies are on by default on a cluster), then that copy's master's replica. Each place
 * is one more routed batch of the commands still unsettled, so while every master answers it
 * costs nothing. An answer of "absent" from one place lets the next be asked too (a replica
 * behind its master, a copy evicted), and is the result when none has the page.
 */
#include <stdbool.h>
#include <string.h>

#include "store/redis/redis_int.h"

/* The places after a page's own master, in order. */
static const struct {
    bool copy, replica;
} places[] = {{false, true}, {true, false}, {true, true}};

/* A reply that holds the page (a GET's value, even a bad one) or says it is there. */
static bool found(enum redis_cmd cmd, const struct redis_item *it)
{
    if (!it->answered)
        return false;
    return cmd == CMD_GET ? it->rep.type == RESP_BULK
                          : it->rep.type == RESP_INT && it->rep.integer == 1;
}

static bool place_on(const struct redis_store *r, int p)
{
    return (!places[p].replica || r->slot_replica) && (!places[p].copy || redis_copies(r) == 2);
}

/* Ask place p for items not settled yet: a find settles one; an "absent" is kept as its
 * answer while later places may still find it. */
static void ask_place(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items, size_t n,
                      bool *settled, int p)
{
    uint16_t idx[ITEMS_MAX];
    size_t m = 0;

    for (size_t i = 0; i < n; i++)
        if (!settled[i]) {
            r->alt[m] = (struct redis_item){.key = items[i].key,
                                            .dst = items[i].dst,
                                            .copy = places[p].copy,
                                            .replica = places[p].replica};
            idx[m++] = (uint16_t)i;
        }
    if (m == 0)
        return;
    redis_route_batch(r, cmd, r->alt, m);
    for (size_t j = 0; j < m; j++) {
        struct redis_item *it = &items[idx[j]];
        if (found(cmd, &r->alt[j]) || (r->alt[j].answered && !it->answered))
            *it = r->alt[j];
        settled[idx[j]] = found(cmd, &r->alt[j]);
    }
}

void redis_read_elsewhere(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items,
                          size_t n)
{
    bool settled[ITEMS_MAX];

    for (size_t i = 0; i < n; i++)
        settled[i] = items[i].answered; /* the master said: a hit or a plain miss */
    for (int p = 0; p < (int)(sizeof(places) / sizeof(places[0])); p++)
        if (place_on(r, p))
            ask_place(r, cmd, items, n, settled, p);
}
