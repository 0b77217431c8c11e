#include "mamba_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bounds far above any model (Qwen3-Next's SSM state is about 1 MiB a layer), low enough
 * that a slot's bytes over all layers fit in 64 bits with room to spare. */
#define MAX_LAYERS 4096
#define MAX_PART_BYTES (1ull << 32)

/* A slot named earlier in the batch being checked: how a duplicate is seen in one pass. */
#define SLOT_MARK 0xff

int mamba_geometry_check(const struct mamba_geometry *g)
{
    if (!g || g->layers == 0 || g->layers > MAX_LAYERS)
        return -EINVAL;
    if (g->conv_bytes == 0 || g->conv_bytes > MAX_PART_BYTES)
        return -EINVAL;
    return g->ssm_bytes && g->ssm_bytes <= MAX_PART_BYTES ? 0 : -EINVAL;
}

uint64_t mamba_slot_bytes(const struct mamba_geometry *g)
{
    return (g->conv_bytes + g->ssm_bytes) * g->layers;
}

static uint64_t part_bytes(const struct mamba_pool *p, enum mamba_part part)
{
    return part == MAMBA_CONV ? p->geo.conv_bytes : p->geo.ssm_bytes;
}

static size_t buffer_bytes(const struct mamba_pool *p, enum mamba_part part)
{
    return (size_t)(((uint64_t)p->nslots + 1) * part_bytes(p, part));
}

static int alloc_buffers(struct mamba_pool *p)
{
    for (int w = 0; w < 2; w++) {
        if (((uint64_t)p->nslots + 1) > SIZE_MAX / part_bytes(p, (enum mamba_part)w))
            return -ENOMEM;
        p->buf[w] = calloc(p->geo.layers, sizeof(void *));
        if (!p->buf[w])
            return -ENOMEM;
        for (uint32_t l = 0; l < p->geo.layers; l++) {
            int rc = p->be->alloc(buffer_bytes(p, (enum mamba_part)w), &p->buf[w][l]);
            if (rc)
                return rc;
        }
    }
    return 0;
}

int mamba_pool_init(struct mamba_pool *p, const struct dev_backend *be,
                    const struct mamba_geometry *g, uint32_t nslots)
{
    int rc = mamba_geometry_check(g);

    memset(p, 0, sizeof(*p));
    if (rc || !be || nslots == 0 || nslots >= INT32_MAX)
        return rc ? rc : -EINVAL;
    p->be = be;
    p->geo = *g;
    p->nslots = nslots;
    p->state = malloc((size_t)nslots + 1);
    p->ring = malloc((size_t)nslots * sizeof(uint32_t));
    p->bounce = malloc(g->conv_bytes > g->ssm_bytes ? g->conv_bytes : g->ssm_bytes);
    rc = p->state && p->ring && p->bounce ? alloc_buffers(p) : -ENOMEM;
    if (rc) {
        mamba_pool_finish(p);
        return rc;
    }
    mamba_pool_clear(p);
    return 0;
}

void mamba_pool_finish(struct mamba_pool *p)
{
    for (int w = 0; w < 2; w++) {
        for (uint32_t l = 0; p->buf[w] && l < p->geo.layers; l++)
            if (p->buf[w][l])
                p->be->free(p->buf[w][l], buffer_bytes(p, (enum mamba_part)w));
        free(p->buf[w]);
    }
    free(p->state);
    free(p->ring);
    free(p->bounce);
    memset(p, 0, sizeof(*p));
}

void mamba_pool_clear(struct mamba_pool *p)
{
    p->state[0] = MAMBA_SLOT_RESERVED;
    memset(p->state + 1, MAMBA_SLOT_FREE, p->nslots);
    for (uint32_t i = 0; i < p->nslots; i++)
        p->ring[i] = i + 1;
    p->head = 0;
    p->nfree = p->nslots;
}

uint32_t mamba_pool_available(const struct mamba_pool *p)
{
    return p->nfree;
}

uint64_t mamba_pool_bytes(const struct mamba_pool *p)
{
    return ((uint64_t)p->nslots + 1) * mamba_slot_bytes(&p->geo);
}

static int in_range(const struct mamba_pool *p, int32_t s)
{
    return s >= 0 && (uint32_t)s <= p->nslots;
}

int mamba_pool_slot_state(const struct mamba_pool *p, int32_t s)
{
    return in_range(p, s) ? p->state[s] : -EINVAL;
}

int mamba_pool_alloc(struct mamba_pool *p, size_t n, int32_t *slots)
{
    if (n && !slots)
        return -EINVAL;
    if (n > p->nfree)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = p->ring[p->head];
        p->head = (p->head + 1) % p->nslots;
        p->nfree--;
        p->state[s] = MAMBA_SLOT_USED;
        slots[i] = (int32_t)s;
    }
    return 0;
}

/* Every slot in range, in state from and named once: the check of a batch, leaving the
 * states as they were whatever the answer. */
static int batch_in_state(struct mamba_pool *p, const int32_t *slots, size_t n, uint8_t from)
{
    size_t i;
    int rc = 0;

    if (n && !slots)
        return -EINVAL;
    for (i = 0; i < n; i++) {
        if (!in_range(p, slots[i]) || p->state[slots[i]] != from) {
            rc = -EINVAL;
            break;
        }
        p->state[slots[i]] = SLOT_MARK;
    }
    while (i-- > 0)
        p->state[slots[i]] = from;
    return rc;
}

static void push_back(struct mamba_pool *p, uint32_t s)
{
    p->ring[(p->head + p->nfree) % p->nslots] = s;
    p->nfree++;
}

static int move_batch(struct mamba_pool *p, const int32_t *slots, size_t n, uint8_t from,
                      uint8_t to)
{
    int rc = batch_in_state(p, slots, n, from);

    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        p->state[slots[i]] = to;
        if (to == MAMBA_SLOT_FREE)
            push_back(p, (uint32_t)slots[i]);
    }
    return 0;
}

int mamba_pool_free(struct mamba_pool *p, const int32_t *slots, size_t n)
{
    return move_batch(p, slots, n, MAMBA_SLOT_USED, MAMBA_SLOT_FREE);
}

int mamba_pool_claim(struct mamba_pool *p, const int32_t *slots, size_t n)
{
    return move_batch(p, slots, n, MAMBA_SLOT_USED, MAMBA_SLOT_CACHED);
}

int mamba_pool_release(struct mamba_pool *p, const int32_t *slots, size_t n)
{
    return move_batch(p, slots, n, MAMBA_SLOT_CACHED, MAMBA_SLOT_FREE);
}

static int holds_state(const struct mamba_pool *p, int32_t s)
{
    return in_range(p, s) && (p->state[s] == MAMBA_SLOT_USED || p->state[s] == MAMBA_SLOT_CACHED);
}

static uint8_t *part_addr(const struct mamba_pool *p, int32_t s, uint32_t layer,
                          enum mamba_part part)
{
    return (uint8_t *)p->buf[part][layer] + (size_t)s * part_bytes(p, part);
}

/* A copy's batch: sources hold a state, destinations are distinct USED slots none of which
 * is read in the same batch (a later pair would read what an earlier one wrote). While the
 * destinations are marked a source among them no longer reads as holding a state. */
static int copy_check(struct mamba_pool *p, const int32_t *src, const int32_t *dst, size_t n)
{
    int rc = batch_in_state(p, dst, n, MAMBA_SLOT_USED);

    if (rc || (n && !src))
        return rc ? rc : -EINVAL;
    for (size_t i = 0; i < n; i++)
        p->state[dst[i]] = SLOT_MARK;
    for (size_t i = 0; i < n && rc == 0; i++)
        if (!holds_state(p, src[i]))
            rc = -EINVAL;
    for (size_t i = 0; i < n; i++)
        p->state[dst[i]] = MAMBA_SLOT_USED;
    return rc;
}

/* Device to device through host staging: the backend has only host<->device copies, and
 * a COW copy is one slot per request admitted, not a hot path. */
static int copy_part(struct mamba_pool *p, int32_t src, int32_t dst, uint32_t layer,
                     enum mamba_part part)
{
    size_t n = (size_t)part_bytes(p, part);
    int rc = p->be->to_host(p->bounce, part_addr(p, src, layer, part), n);

    return rc ? rc : p->be->to_device(part_addr(p, dst, layer, part), p->bounce, n);
}

int mamba_pool_copy(struct mamba_pool *p, const int32_t *src, const int32_t *dst, size_t n)
{
    int rc = copy_check(p, src, dst, n);

    for (size_t i = 0; rc == 0 && i < n; i++)
        for (uint32_t l = 0; rc == 0 && l < p->geo.layers; l++) {
            rc = copy_part(p, src[i], dst[i], l, MAMBA_CONV);
            if (rc == 0)
                rc = copy_part(p, src[i], dst[i], l, MAMBA_SSM);
        }
    return rc;
}

static int zero_part(struct mamba_pool *p, int32_t s, uint32_t layer, enum mamba_part part)
{
    size_t n = (size_t)part_bytes(p, part);

    memset(p->bounce, 0, n);
    return p->be->to_device(part_addr(p, s, layer, part), p->bounce, n);
}

int mamba_pool_zero(struct mamba_pool *p, const int32_t *slots, size_t n)
{
    int rc = batch_in_state(p, slots, n, MAMBA_SLOT_USED);

    for (size_t i = 0; rc == 0 && i < n; i++)
        for (uint32_t l = 0; rc == 0 && l < p->geo.layers; l++) {
            rc = zero_part(p, slots[i], l, MAMBA_CONV);
            if (rc == 0)
                rc = zero_part(p, slots[i], l, MAMBA_SSM);
        }
    return rc;
}

static int part_check(const struct mamba_pool *p, int32_t s, uint32_t layer, enum mamba_part part,
                      const void *buf)
{
    if (!buf || layer >= p->geo.layers || (part != MAMBA_CONV && part != MAMBA_SSM))
        return -EINVAL;
    return holds_state(p, s) ? 0 : -EINVAL;
}

int mamba_pool_write(struct mamba_pool *p, int32_t s, uint32_t layer, enum mamba_part part,
                     const void *buf)
{
    int rc = part_check(p, s, layer, part, buf);

    if (rc)
        return rc;
    return p->be->to_device(part_addr(p, s, layer, part), buf, (size_t)part_bytes(p, part));
}

int mamba_pool_read(const struct mamba_pool *p, int32_t s, uint32_t layer, enum mamba_part part,
                    void *buf)
{
    int rc = part_check(p, s, layer, part, buf);

    if (rc)
        return rc;
    return p->be->to_host(buf, part_addr(p, s, layer, part), (size_t)part_bytes(p, part));
}
