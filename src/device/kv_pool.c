#include "kv_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Bounds far above any model, low enough that no size computed from them overflows: a row is
 * at most 2^36 bytes and a token over all layers at most 2^49. */
#define MAX_LAYERS 4096
#define MAX_DIM 65536

static int within(uint32_t v, uint32_t lo)
{
    return v >= lo && v <= MAX_DIM;
}

int kv_geometry_check(const struct kvt_geometry *g)
{
    if (!g || g->layers == 0 || g->layers > MAX_LAYERS ||
        (g->dtype_bytes != 1 && g->dtype_bytes != 2 && g->dtype_bytes != 4))
        return -EINVAL;
    /* Fields of the other attention kind must be zero: they would be silently ignored, yet
     * go into the fingerprint. */
    if (g->attention == KVT_ATTN_MHA)
        return within(g->kv_heads, 1) && within(g->head_dim, 1) && within(g->v_head_dim, 0) &&
                       !g->kv_lora_rank && !g->qk_rope_head_dim
                   ? 0
                   : -EINVAL;
    if (g->attention == KVT_ATTN_MLA)
        return within(g->kv_lora_rank, 0) && within(g->qk_rope_head_dim, 0) &&
                       g->kv_lora_rank + g->qk_rope_head_dim > 0 && !g->kv_heads && !g->head_dim &&
                       !g->v_head_dim
                   ? 0
                   : -EINVAL;
    return -EINVAL;
}

size_t kv_row_bytes(const struct kvt_geometry *g, int which)
{
    if (g->attention == KVT_ATTN_MLA)
        return which ? 0 : ((size_t)g->kv_lora_rank + g->qk_rope_head_dim) * g->dtype_bytes;
    size_t dim = which && g->v_head_dim ? g->v_head_dim : g->head_dim;
    return (size_t)g->kv_heads * dim * g->dtype_bytes;
}

int kv_pool_init(struct kv_pool *p, const struct dev_backend *be, const struct kvt_geometry *g,
                 uint64_t rows)
{
    int rc = kv_geometry_check(g);

    memset(p, 0, sizeof(*p));
    if (rc)
        return rc;
    p->be = be;
    p->geo = *g;
    p->rows = rows;
    for (int w = 0; w < 2; w++) {
        p->row_bytes[w] = kv_row_bytes(g, w);
        if (!p->row_bytes[w])
            continue;
        if (rows > SIZE_MAX / p->row_bytes[w]) {
            kv_pool_finish(p);
            return -ENOMEM;
        }
        p->buf[w] = calloc(g->layers, sizeof(void *));
        if (!p->buf[w]) {
            kv_pool_finish(p);
            return -ENOMEM;
        }
        for (uint32_t l = 0; l < g->layers; l++) {
            rc = be->alloc(rows * p->row_bytes[w], &p->buf[w][l]);
            if (rc) {
                kv_pool_finish(p);
                return rc;
            }
        }
    }
    if (be->rows_open && (rc = be->rows_open(p->buf, g->layers, p->row_bytes, &p->batch))) {
        kv_pool_finish(p);
        return rc;
    }
    return 0;
}

void kv_pool_finish(struct kv_pool *p)
{
    if (p->batch)
        p->be->rows_close(p->batch);
    p->batch = NULL;
    for (int w = 0; w < 2; w++) {
        for (uint32_t l = 0; p->buf[w] && l < p->geo.layers; l++)
            p->be->free(p->buf[w][l], p->rows * p->row_bytes[w]);
        free(p->buf[w]);
        p->buf[w] = NULL;
    }
}

uint64_t kv_pool_bytes(const struct kv_pool *p)
{
    return p->rows * (p->row_bytes[0] + p->row_bytes[1]) * p->geo.layers;
}

static int check_rows(const struct kv_pool *p, uint32_t layer, const int32_t *slots, size_t n)
{
    if (layer >= p->geo.layers || (n && !slots))
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (slots[i] < 0 || (uint64_t)slots[i] >= p->rows)
            return -EINVAL;
    return 0;
}

/* Length of the run of consecutive slots starting at slots[i]. */
static size_t run_len(const int32_t *slots, size_t n, size_t i)
{
    size_t r = 1;

    while (i + r < n && slots[i + r] == slots[i] + (int32_t)r)
        r++;
    return r;
}

static int move(const struct kv_pool *p, uint32_t layer, int w, const int32_t *slots, size_t n,
                void *host, int to_device)
{
    size_t rb = p->row_bytes[w];
    uint8_t *dev = p->buf[w][layer], *h = host;

    for (size_t i = 0; i < n;) {
        size_t r = run_len(slots, n, i);
        uint8_t *d = dev + (size_t)slots[i] * rb;
        int rc = to_device ? p->be->to_device(d, h + i * rb, r * rb)
                           : p->be->to_host(h + i * rb, d, r * rb);
        if (rc)
            return rc;
        i += r;
    }
    return 0;
}

/* Both parts of n rows; rows of more than one run by the backend's batched copy where it
 * has one and can have it here. */
static int move_rows(const struct kv_pool *p, uint32_t layer, const int32_t *slots, size_t n,
                     void *k, void *v, int to_device)
{
    int rc = KVT_ENOBACKEND;

    if (p->batch && n && run_len(slots, n, 0) < n)
        rc = p->be->rows_copy(p->batch, layer, slots, n, k, v, to_device);
    if (rc != KVT_ENOBACKEND)
        return rc;
    rc = move(p, layer, 0, slots, n, k, to_device);
    if (rc == 0 && v)
        rc = move(p, layer, 1, slots, n, v, to_device);
    return rc;
}

static int check_buffers(const struct kv_pool *p, const void *k, const void *v)
{
    if (!k)
        return -EINVAL;
    return (p->row_bytes[1] != 0) == (v != NULL) ? 0 : -EINVAL;
}

int kv_pool_write(struct kv_pool *p, uint32_t layer, const int32_t *slots, size_t n, const void *k,
                  const void *v)
{
    int rc = check_rows(p, layer, slots, n);

    if (rc || (rc = check_buffers(p, k, v)))
        return rc;
    return move_rows(p, layer, slots, n, (void *)k, (void *)v, 1);
}

int kv_pool_read(const struct kv_pool *p, uint32_t layer, const int32_t *slots, size_t n, void *k,
                 void *v)
{
    int rc = check_rows(p, layer, slots, n);

    if (rc || (rc = check_buffers(p, k, v)))
        return rc;
    return move_rows(p, layer, slots, n, k, v, 0);
}
