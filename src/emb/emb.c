/*
 * The embedding cache's calls (emb.h). Each applies what the store below has finished first
 * (a bounded number of ops), so reads land and write copies are let go without a poll of
 * their own.
 */
#include "emb/emb_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "host/host_pool.h"

#define POLL_MAX 64 /* ops applied per call */

/* ---- open / close ---- */

static int open_host(struct emb_cache *c, uint64_t bytes)
{
    void *p;
    int rc;

    if (bytes > host_memory_available())
        return KVT_EHOSTRAM;
    if ((rc = emb_arena_init(&c->host_arena, bytes, EMB_HOST_UNIT)))
        return rc;
    p = mmap(NULL, c->host_arena.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -ENOMEM;
    c->host = p;
    /* Pinned where the backend pins (cuda), so the copies up are from page-locked memory. */
    if (c->be->host_register && (rc = c->be->host_register(p, c->host_arena.bytes))) {
        munmap(p, c->host_arena.bytes);
        c->host = NULL;
        return rc;
    }
    return 0;
}

int emb_open(const struct emb_config *cfg, struct emb_cache **out)
{
    struct emb_cache *c = calloc(1, sizeof(*c));
    int rc;

    *out = NULL;
    if (!c) {
        store_close(cfg->store);
        return -ENOMEM;
    }
    c->be = cfg->be;
    c->store = cfg->store;
    c->chunk = c->store ? c->store->page_bytes : 0;
    if ((rc = page_hasher_init(&c->hasher)) || (rc = emb_root(&c->hasher, c->root)) ||
        (rc = emb_table_init(c)) ||
        (rc = emb_arena_init(&c->dev_arena, cfg->device_bytes, EMB_DEVICE_UNIT)) ||
        (rc = c->be->alloc(c->dev_arena.bytes, (void **)&c->dev)) ||
        (cfg->host_bytes && (rc = open_host(c, cfg->host_bytes)))) {
        emb_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void emb_close(struct emb_cache *c)
{
    if (!c)
        return;
    emb_below_finish(c); /* every op lands before the memories go */
    store_close(c->store);
    if (c->host) {
        if (c->be->host_unregister)
            c->be->host_unregister(c->host);
        munmap(c->host, c->host_arena.bytes);
    }
    if (c->dev)
        c->be->free(c->dev, c->dev_arena.bytes);
    emb_arena_finish(&c->dev_arena);
    emb_arena_finish(&c->host_arena);
    emb_table_finish(c);
    page_hasher_finish(&c->hasher);
    free(c);
}

/* ---- helpers ---- */

static void poll(struct emb_cache *c)
{
    if (c->nops)
        emb_below_poll(c, POLL_MAX);
}

static int name(struct emb_cache *c, const struct kvt_emb_key *key, uint8_t *nsd, uint8_t *digest)
{
    int rc = emb_ns_digest(&c->hasher, key->ns, key->ns ? key->ns_len : 0, nsd);

    return rc ? rc : emb_digest(&c->hasher, nsd, key->hash, digest);
}

/* Hold entry i (on the device, landed or not) for out. */
static void give(struct emb_cache *c, uint32_t i, struct kvt_emb *out)
{
    struct emb_entry *x = &c->e[i];
    bool landed = x->state == EMB_LIVE;

    emb_table_hold(c, i);
    *out = (struct kvt_emb){.handle = emb_table_handle(c, i),
                            .op = landed ? 0 : x->fill,
                            .ptr = landed ? c->dev + x->dev_off : NULL,
                            .len = landed ? (size_t)x->len : 0,
                            .tier = x->tier};
}

/* Mark entry i used: the newest in each memory holding it. */
static void touch(struct emb_cache *c, uint32_t i)
{
    if (c->e[i].on_dev)
        emb_lru_touch(c, 0, i);
    if (c->e[i].on_host)
        emb_lru_touch(c, 1, i);
}

/* Entry i, on the host only, onto the device too. */
static int up_from_host(struct emb_cache *c, uint32_t i)
{
    int rc = emb_room_device(c, i, c->e[i].len);

    if (rc)
        return rc;
    if ((rc = emb_room_host_to_device(c, i))) {
        emb_room_drop_device(c, i);
        return rc;
    }
    return 0;
}

/* ---- put ---- */

/* A new entry for the caller's bytes: device, host, store. */
static int put_new(struct emb_cache *c, const uint8_t *digest, const uint8_t *nsd,
                   const struct kvt_emb_key *key, const void *buf, size_t len, uint32_t *out)
{
    uint32_t i = emb_table_add(c, digest, key->hash, nsd);
    int rc;

    if (i == EMB_NONE)
        return -ENOMEM;
    c->e[i].len = len;
    c->e[i].tier = KVT_EMB_DEVICE;
    if ((rc = emb_room_device(c, i, len))) {
        emb_table_detach(c, i, rc);
        return rc;
    }
    if ((rc = c->be->to_device(c->dev + c->e[i].dev_off, buf, len))) {
        emb_room_drop_device(c, i);
        return rc;
    }
    if (c->host)
        (void)emb_room_host_record(c, i, buf); /* no room on the host: the device copy serves */
    emb_below_write(c, i, buf);
    c->count.puts++;
    c->count.put_bytes += len;
    *out = i;
    return 0;
}

int emb_put(struct emb_cache *c, const struct kvt_emb_key *key, const void *buf, size_t len,
            struct kvt_emb *held)
{
    uint8_t nsd[32], digest[32];
    uint32_t i;
    int rc;

    poll(c);
    if (len > c->dev_arena.bytes) {
        c->count.refused++;
        return -E2BIG;
    }
    if ((rc = name(c, key, nsd, digest)))
        return rc;
    if ((i = emb_table_find(c, digest)) != EMB_NONE) {
        if (c->e[i].state == EMB_FILLING)
            return -EBUSY;
        if (!c->e[i].on_dev && (rc = up_from_host(c, i)))
            return rc;
        c->count.put_present++;
    } else if ((rc = put_new(c, digest, nsd, key, buf, len, &i))) {
        c->count.refused += rc == -ENOMEM;
        return rc;
    }
    touch(c, i);
    if (held)
        give(c, i, held);
    return 0;
}

/* ---- fetch, wait, release, read ---- */

/* Entry i's record from the store (run chunks of it there): a new filling entry holding a
 * device extent for the most those chunks can hold, and its read. */
static int fetch_below(struct emb_cache *c, const uint8_t *digest, const uint8_t *nsd,
                       const struct kvt_emb_key *key, size_t run, bool remote, uint32_t *out)
{
    uint32_t i = emb_table_add(c, digest, key->hash, nsd);
    uint64_t most = run * c->chunk - EMB_HEAD_BYTES;
    int rc;

    if (i == EMB_NONE)
        return -ENOMEM;
    c->e[i].state = EMB_FILLING;
    c->e[i].len = most < c->dev_arena.bytes ? most : c->dev_arena.bytes;
    c->e[i].tier = remote ? KVT_EMB_REMOTE : KVT_EMB_DISK;
    if ((rc = emb_room_device(c, i, c->e[i].len)) == 0 && (rc = emb_below_read(c, i, run)) != 0) {
        emb_room_drop_device(c, i);
        rc = rc == -ENOMEM ? rc : -EIO; /* the store refused the read: as a failed one */
    }
    if (rc) {
        emb_table_detach(c, i, rc);
        return rc;
    }
    *out = i;
    return 0;
}

int emb_fetch(struct emb_cache *c, const struct kvt_emb_key *key, struct kvt_emb *out)
{
    uint8_t nsd[32], digest[32];
    uint32_t i;
    size_t run;
    bool remote;
    int rc;

    poll(c);
    c->count.fetches++;
    if ((rc = name(c, key, nsd, digest)))
        return rc;
    if ((i = emb_table_find(c, digest)) != EMB_NONE && c->e[i].state == EMB_LIVE) {
        uint32_t tier = c->e[i].on_dev ? KVT_EMB_DEVICE : KVT_EMB_HOST;
        if (tier == KVT_EMB_HOST && (rc = up_from_host(c, i)))
            return rc;
        c->e[i].tier = tier;
        c->count.hits[tier]++;
        touch(c, i);
    } else if (i == EMB_NONE) {
        if ((run = emb_below_run(c, digest, &remote)) == 0) {
            c->count.misses++;
            return -ENOENT;
        }
        if ((rc = fetch_below(c, digest, nsd, key, run, remote, &i)))
            return rc;
    } /* else a read of it is under way: joined */
    give(c, i, out);
    return 0;
}

int emb_wait(struct emb_cache *c, struct kvt_emb *emb, int timeout_ms)
{
    uint32_t i = emb_table_held(c, emb->handle);
    int rc;

    if (i == EMB_NONE)
        return -EINVAL;
    poll(c);
    /* A wait that returns 0 has applied the read (or found it applied): landed or failed. */
    if (c->e[i].state == EMB_FILLING && (rc = emb_below_wait(c, c->e[i].fill, timeout_ms)))
        return rc;
    if (c->e[i].state == EMB_FILLING)
        return -ETIMEDOUT; /* cannot happen: never an address whose bytes have not landed */
    if (c->e[i].state == EMB_FAILED) {
        rc = c->e[i].fail_rc;
        emb_table_unhold(c, i);
        *emb = (struct kvt_emb){0};
        return rc;
    }
    emb->op = 0;
    emb->ptr = c->dev + c->e[i].dev_off;
    emb->len = (size_t)c->e[i].len;
    emb->tier = c->e[i].tier;
    return 0;
}

int emb_release(struct emb_cache *c, struct kvt_emb *emb)
{
    uint32_t i = emb_table_held(c, emb->handle);

    if (i == EMB_NONE)
        return -EINVAL;
    emb_table_unhold(c, i);
    emb->handle = 0;
    poll(c);
    return 0;
}

int emb_read(struct emb_cache *c, const struct kvt_emb *emb, size_t offset, void *buf, size_t n)
{
    uint32_t i = emb_table_held(c, emb->handle);

    if (i == EMB_NONE)
        return -EINVAL;
    if (c->e[i].state != EMB_LIVE)
        return -EAGAIN;
    if (offset > c->e[i].len || n > c->e[i].len - offset || (n && !buf))
        return -EINVAL;
    return n ? c->be->to_host(buf, c->dev + c->e[i].dev_off + offset, n) : 0;
}

/* ---- lookup, drop, stats ---- */

int emb_lookup(struct emb_cache *c, const struct kvt_emb_key *key, uint32_t *tier, size_t *len)
{
    uint8_t nsd[32], digest[32];
    uint32_t i, t;
    size_t l = 0;
    bool remote;
    int rc;

    poll(c);
    if ((rc = name(c, key, nsd, digest)))
        return rc;
    if ((i = emb_table_find(c, digest)) != EMB_NONE) {
        const struct emb_entry *x = &c->e[i];
        t = x->state == EMB_FILLING ? x->tier : x->on_dev ? KVT_EMB_DEVICE : KVT_EMB_HOST;
        l = x->state == EMB_FILLING ? 0 : (size_t)x->len;
    } else if (emb_below_run(c, digest, &remote)) {
        t = remote ? KVT_EMB_REMOTE : KVT_EMB_DISK;
    } else {
        return -ENOENT;
    }
    if (tier)
        *tier = t;
    if (len)
        *len = l;
    return 0;
}

int emb_drop(struct emb_cache *c, const struct kvt_emb_key *key)
{
    uint8_t nsd[32], digest[32];
    uint32_t i;
    int rc;

    poll(c);
    if ((rc = name(c, key, nsd, digest)))
        return rc;
    if ((i = emb_table_find(c, digest)) == EMB_NONE)
        return -ENOENT;
    struct emb_entry *x = &c->e[i];
    if (x->state != EMB_LIVE || x->holds || x->pins)
        return -EBUSY;
    bool host = x->on_host;
    if (x->on_dev)
        emb_room_drop_device(c, i); /* leaves the table here when there is no host copy */
    if (host)
        emb_room_drop_host(c, i);
    return 0;
}

void emb_poll(struct emb_cache *c)
{
    if (c->nops)
        emb_below_poll(c, SIZE_MAX);
}

void emb_sync(struct emb_cache *c)
{
    emb_below_sync(c);
}

void emb_stats(const struct emb_cache *c, struct kvt_emb_stats *st)
{
    *st = c->count;
    st->size = sizeof(*st);
    st->device_bytes = c->dev_arena.bytes;
    st->device_used = c->dev_arena.used;
    st->device_embeddings = c->dlru.count;
    st->held = c->held;
    st->host_bytes = c->host ? c->host_arena.bytes : 0;
    st->host_used = c->host ? c->host_arena.used : 0;
    st->host_embeddings = c->hlru.count;
}
