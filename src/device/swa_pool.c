#include "swa_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* SWA slots are translated this many at a time on the stack: no allocation on the KV path,
 * and a run of slots is split at most once per chunk. */
#define TRANSLATE_CHUNK 256

/* The layer table: full layers numbered in the order given, the rest in model order. */
static int map_layers(struct swa_pool *p, const uint32_t *full_layer_ids, size_t nfull)
{
    uint32_t nswa = 0;

    for (size_t i = 0; i < nfull; i++) {
        uint32_t l = full_layer_ids[i];
        if (l >= p->layers || p->is_swa[l] == 0)
            return -EINVAL; /* out of range, or named twice */
        p->is_swa[l] = 0;
        p->index[l] = (uint32_t)i;
    }
    for (uint32_t l = 0; l < p->layers; l++)
        if (p->is_swa[l])
            p->index[l] = nswa++;
    return 0;
}

static int alloc_tables(struct swa_pool *p, uint32_t layers)
{
    p->layers = layers;
    p->index = calloc(layers, sizeof(*p->index));
    p->is_swa = malloc(layers);
    if (!p->index || !p->is_swa)
        return -ENOMEM;
    memset(p->is_swa, 1, layers);
    return 0;
}

int swa_pool_init(struct swa_pool *p, const struct dev_backend *be, const struct kvt_geometry *g,
                  const uint32_t *full_layer_ids, size_t nfull, const struct swa_alloc *a)
{
    struct kvt_geometry sub;
    uint64_t ps = a->page_size;
    int rc = kv_geometry_check(g);

    memset(p, 0, sizeof(*p));
    if (rc || nfull == 0 || nfull >= g->layers || !full_layer_ids)
        return rc ? rc : -EINVAL;
    if ((rc = alloc_tables(p, g->layers)) || (rc = map_layers(p, full_layer_ids, nfull)))
        goto fail;
    sub = *g;
    sub.layers = (uint32_t)nfull;
    if ((rc = kv_pool_init(&p->full, be, &sub, ((uint64_t)a->full.npages + 1) * ps)))
        goto fail;
    sub.layers = g->layers - (uint32_t)nfull;
    if ((rc = kv_pool_init(&p->swa, be, &sub, ((uint64_t)a->swa.npages + 1) * ps)))
        goto fail;
    return 0;
fail:
    swa_pool_finish(p);
    return rc;
}

void swa_pool_finish(struct swa_pool *p)
{
    kv_pool_finish(&p->full);
    kv_pool_finish(&p->swa);
    free(p->index);
    free(p->is_swa);
    memset(p, 0, sizeof(*p));
}

uint64_t swa_pool_bytes(const struct swa_pool *p)
{
    return kv_pool_bytes(&p->full) + kv_pool_bytes(&p->swa);
}

int swa_pool_layer(const struct swa_pool *p, uint32_t layer, int *is_swa, uint32_t *index)
{
    if (layer >= p->layers)
        return -EINVAL;
    *is_swa = p->is_swa[layer];
    *index = p->index[layer];
    return 0;
}

/* A sliding-window layer's rows, a chunk of translated slots at a time. The host buffers
 * advance by the rows done. */
static int move_swa(const struct swa_pool *p, const struct swa_alloc *a, uint32_t index,
                    const int32_t *full_slots, size_t n, uint8_t *k, uint8_t *v, int to_device)
{
    int32_t slots[TRANSLATE_CHUNK];
    size_t kb = p->swa.row_bytes[0], vb = p->swa.row_bytes[1];

    for (size_t i = 0; i < n; i += TRANSLATE_CHUNK) {
        size_t c = n - i < TRANSLATE_CHUNK ? n - i : TRANSLATE_CHUNK;
        uint8_t *kc = k + i * kb, *vc = v ? v + i * vb : NULL;
        int rc;
        swa_translate_live(a, full_slots + i, c, slots);
        /* A write changes the rows the pool points at, never the struct: the cast is safe. */
        rc = to_device ? kv_pool_write((struct kv_pool *)&p->swa, index, slots, c, kc, vc)
                       : kv_pool_read(&p->swa, index, slots, c, kc, vc);
        if (rc)
            return rc;
    }
    return 0;
}

/* The checks of a move, so that a refused one moves nothing. */
static int check_move(const struct swa_pool *p, const struct swa_alloc *a, uint32_t layer,
                      const int32_t *full_slots, size_t n, const void *k, const void *v)
{
    if (layer >= p->layers || !k || (p->full.row_bytes[1] != 0) != (v != NULL))
        return -EINVAL;
    return p->is_swa[layer] ? swa_check_live(a, full_slots, n) : 0;
}

int swa_pool_write(struct swa_pool *p, const struct swa_alloc *a, uint32_t layer,
                   const int32_t *full_slots, size_t n, const void *k, const void *v)
{
    int rc = check_move(p, a, layer, full_slots, n, k, v);

    if (rc)
        return rc;
    if (!p->is_swa[layer])
        return kv_pool_write(&p->full, p->index[layer], full_slots, n, k, v);
    return move_swa(p, a, p->index[layer], full_slots, n, (uint8_t *)k, (uint8_t *)v, 1);
}

int swa_pool_read(const struct swa_pool *p, const struct swa_alloc *a, uint32_t layer,
                  const int32_t *full_slots, size_t n, void *k, void *v)
{
    int rc = check_move(p, a, layer, full_slots, n, k, v);

    if (rc)
        return rc;
    if (!p->is_swa[layer])
        return kv_pool_read(&p->full, p->index[layer], full_slots, n, k, v);
    return move_swa(p, a, p->index[layer], full_slots, n, k, v, 0);
}
