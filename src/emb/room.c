/*
 * The embedding cache's memories (emb_int.h): extents of the device and host allocations,
 * made by evicting least recently used copies when there is no hole; the copy from host to
 * device. A request that eviction cannot meet is refused before anything is evicted.
 */
#include "emb/emb_int.h"

#include <errno.h>
#include <stdlib.h>

uint64_t emb_room_record_bytes(const struct emb_cache *c, uint64_t len)
{
    uint64_t bytes = EMB_HEAD_BYTES + len;

    return c->store ? emb_chunks(len, c->chunk) * c->chunk : bytes;
}

void emb_room_drop_device(struct emb_cache *c, uint32_t i)
{
    struct emb_entry *x = &c->e[i];

    emb_lru_remove(c, 0, i);
    x->on_dev = false;
    emb_arena_free(&c->dev_arena, x->dev_off, x->dev_len);
    if (!x->on_host && x->state == EMB_LIVE)
        emb_table_detach(c, i, -ENOENT);
}

void emb_room_drop_host(struct emb_cache *c, uint32_t i)
{
    struct emb_entry *x = &c->e[i];

    emb_lru_remove(c, 1, i);
    x->on_host = false;
    emb_arena_free(&c->host_arena, x->host_off, x->host_len);
    if (!x->on_dev && x->state == EMB_LIVE)
        emb_table_detach(c, i, -ENOENT);
}

/* Whether a copy in memory which may go now: a filling entry's extents are its read's. */
static bool evictable(const struct emb_cache *c, int which, uint32_t i)
{
    if (c->e[i].state != EMB_LIVE)
        return false;
    return which ? c->e[i].pins == 0 : c->e[i].holds == 0;
}

/* Whether evicting every evictable copy of which (but skip) would leave a hole of len. */
static int could_fit(struct emb_cache *c, int which, uint32_t skip, uint64_t len, bool *fits)
{
    const struct emb_lru *l = which ? &c->hlru : &c->dlru;
    struct emb_arena *a = which ? &c->host_arena : &c->dev_arena;
    struct emb_extent *v = malloc((l->count ? l->count : 1) * sizeof(*v));
    size_t n = 0;
    int rc;

    if (!v)
        return -ENOMEM;
    for (uint32_t i = l->oldest; i != EMB_NONE; i = which ? c->e[i].hnext : c->e[i].dnext)
        if (i != skip && evictable(c, which, i))
            v[n++] = which ? (struct emb_extent){c->e[i].host_off, c->e[i].host_len}
                           : (struct emb_extent){c->e[i].dev_off, c->e[i].dev_len};
    rc = emb_arena_would_fit(a, v, n, len, fits);
    free(v);
    return rc;
}

/* The least recently used copy of which that may go, but skip; EMB_NONE. */
static uint32_t victim(const struct emb_cache *c, int which, uint32_t skip)
{
    const struct emb_lru *l = which ? &c->hlru : &c->dlru;

    for (uint32_t i = l->oldest; i != EMB_NONE; i = which ? c->e[i].hnext : c->e[i].dnext)
        if (i != skip && evictable(c, which, i))
            return i;
    return EMB_NONE;
}

/* An extent of len in which's arena, evicting for it when there is no hole. */
static int take(struct emb_cache *c, int which, uint32_t i, uint64_t len, uint64_t *off)
{
    struct emb_arena *a = which ? &c->host_arena : &c->dev_arena;
    bool fits = false;
    uint32_t v;
    int rc = emb_arena_alloc(a, len, off);

    if (rc != -ENOSPC)
        return rc;
    if (len > a->bytes || (rc = could_fit(c, which, i, len, &fits)) || !fits)
        return rc ? rc : -ENOMEM;
    while ((rc = emb_arena_alloc(a, len, off)) == -ENOSPC &&
           (v = victim(c, which, i)) != EMB_NONE) {
        if (which) {
            emb_room_drop_host(c, v);
            c->count.evicted_host++;
        } else {
            emb_room_drop_device(c, v);
            c->count.evicted_device++;
        }
    }
    return rc == -ENOSPC ? -ENOMEM : rc;
}

int emb_room_device(struct emb_cache *c, uint32_t i, uint64_t len)
{
    struct emb_entry *x = &c->e[i];
    int rc = take(c, 0, i, len, &x->dev_off);

    if (rc)
        return rc;
    x->dev_len = len;
    emb_lru_touch(c, 0, i);
    x->on_dev = true;
    return 0;
}

int emb_room_host(struct emb_cache *c, uint32_t i, uint64_t bytes)
{
    struct emb_entry *x = &c->e[i];
    int rc = c->host ? take(c, 1, i, bytes, &x->host_off) : -ENOMEM;

    if (rc)
        return rc;
    x->host_len = bytes;
    emb_lru_touch(c, 1, i);
    x->on_host = true;
    return 0;
}

int emb_room_host_record(struct emb_cache *c, uint32_t i, const void *payload)
{
    struct emb_entry *x = &c->e[i];
    uint64_t bytes = emb_room_record_bytes(c, x->len);
    int rc = emb_room_host(c, i, bytes);

    if (rc == 0)
        emb_record_write(c->host + x->host_off, (size_t)bytes, x->item, x->nsd, payload, x->len);
    return rc;
}

int emb_room_host_to_device(struct emb_cache *c, uint32_t i)
{
    struct emb_entry *x = &c->e[i];

    return c->be->to_device(c->dev + x->dev_off, c->host + x->host_off + EMB_HEAD_BYTES,
                            (size_t)x->len);
}
