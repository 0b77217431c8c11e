/*
 * Where else a page may be read from when its master did not have it. A master that did not
 * answer (down, failed, hung) leaves the page to: that master's replica (when replica reads
 * are allowed: READONLY, its slot's first replica in the map), then the page's copy (its copy
 * name, in the slot half the map away, so on another master: copies are on by default on a
 * cluster), then that copy's master's replica. A master that answered "absent" (restarted
 * empty, flushed, or its key evicted) leaves it to the copy and the copy's replica only (its
 * own replica copies what it has), as does one answering an error that says nothing of the key
 * (CLUSTERDOWN while it rejoins, LOADING). Each place is one more routed batch of the commands
 * still unsettled, so while every master answers and has its pages it costs nothing; a leading run
 * that ends at a page no key holds costs one more round trip. An "absent" from one place lets
 * the next be asked too, and is the result when none has the page.
 */
#include <stdbool.h>
#include <string.h>

#include "store/redis/redis_int.h"

/* The places after a page's own master, in order. */
static const struct {
    bool copy, replica;
} places[] = {{false, true}, {true, false}, {true, true}};

#define N_PLACES (sizeof(places) / sizeof(places[0]))

/* A reply that holds the page (a GET's value, even a bad one) or says it is there. */
static bool found(enum redis_cmd cmd, const struct redis_item *it)
{
    if (!it->answered)
        return false;
    return cmd == CMD_GET ? it->rep.type == RESP_BULK
                          : it->rep.type == RESP_INT && it->rep.integer == 1;
}

/* A reply that says the key is not there (a GET's nil, an EXISTS of 0), or an error that says
 * nothing of it (CLUSTERDOWN, LOADING, BUSY...: a node not serving yet). Another type's value
 * (WRONGTYPE) and a refusal (NOPERM, NOAUTH) are answers. */
static bool absent(enum redis_cmd cmd, const struct redis_item *it)
{
    const char *e = it->rep.line;

    if (it->answered && it->rep.type == RESP_ERROR)
        return strncmp(e, "WRONGTYPE", 9) && strncmp(e, "NOPERM", 6) && strncmp(e, "NOAUTH", 6);
    return it->answered && (cmd == CMD_GET ? it->rep.type == RESP_NIL
                                           : it->rep.type == RESP_INT && it->rep.integer == 0);
}

static bool place_on(const struct redis_store *r, size_t p)
{
    return (!places[p].replica || r->slot_replica) && (!places[p].copy || redis_copies(r) == 2);
}

/* Ask place p for the items still wanted: a find settles one; an "absent" is kept as its
 * answer while later places may still find it. A replica is asked only for the items its
 * master did not answer (master_said[i]: the master of the name asked last answered). */
static void ask_place(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items, size_t n,
                      bool *want, bool *master_said, size_t p)
{
    uint16_t idx[ITEMS_MAX];
    size_t m = 0;

    for (size_t i = 0; i < n; i++)
        if (want[i] && !(places[p].replica && master_said[i])) {
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
        want[idx[j]] = !found(cmd, &r->alt[j]);
        if (!places[p].replica)
            master_said[idx[j]] = r->alt[j].answered;
    }
}

void redis_read_elsewhere(struct redis_store *r, enum redis_cmd cmd, struct redis_item *items,
                          size_t n)
{
    bool want[ITEMS_MAX], master_said[ITEMS_MAX];

    for (size_t i = 0; i < n; i++) {
        want[i] = !items[i].answered || absent(cmd, &items[i]);
        master_said[i] = items[i].answered;
    }
    for (size_t p = 0; p < N_PLACES; p++)
        if (place_on(r, p))
            ask_place(r, cmd, items, n, want, master_said, p);
}
