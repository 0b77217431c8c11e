#include "req_pool.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int req_pool_init(struct req_pool *r, uint32_t max_reqs, uint32_t max_context)
{
    memset(r, 0, sizeof(*r));
    if (max_reqs == 0 || max_context == 0 || max_reqs > INT32_MAX)
        return -EINVAL;
    r->max_reqs = max_reqs;
    r->max_context = max_context;
    r->map = calloc((size_t)max_reqs * max_context, sizeof(int32_t));
    r->free_list = malloc(max_reqs * sizeof(uint32_t));
    r->in_use = calloc(max_reqs, 1);
    r->filled = calloc(max_reqs, sizeof(uint32_t));
    r->gen = malloc(max_reqs * sizeof(uint32_t));
    if (!r->map || !r->free_list || !r->in_use || !r->filled || !r->gen) {
        req_pool_finish(r);
        return -ENOMEM;
    }
    /* Pop order 0, 1, 2, ... as in SGLang's free_slots list. */
    for (uint32_t i = 0; i < max_reqs; i++) {
        r->free_list[i] = max_reqs - 1 - i;
        r->gen[i] = 1;
    }
    r->nfree = max_reqs;
    return 0;
}

void req_pool_finish(struct req_pool *r)
{
    free(r->map);
    free(r->free_list);
    free(r->in_use);
    free(r->filled);
    free(r->gen);
    memset(r, 0, sizeof(*r));
}

int req_pool_alloc(struct req_pool *r, int32_t *idx)
{
    if (r->nfree == 0)
        return -ENOMEM;
    uint32_t i = r->free_list[--r->nfree];
    r->in_use[i] = 1;
    r->filled[i] = 0;
    *idx = (int32_t)i;
    return 0;
}

int req_pool_in_use(const struct req_pool *r, int32_t idx)
{
    return idx >= 0 && (uint32_t)idx < r->max_reqs && r->in_use[idx];
}

uint32_t req_pool_gen(const struct req_pool *r, int32_t idx)
{
    return r->gen[idx];
}

int req_pool_live(const struct req_pool *r, int32_t idx, uint32_t gen)
{
    return req_pool_in_use(r, idx) && r->gen[idx] == gen;
}

int req_pool_free(struct req_pool *r, int32_t idx)
{
    if (!req_pool_in_use(r, idx))
        return -EINVAL;
    r->in_use[idx] = 0;
    if (++r->gen[idx] == 0)
        r->gen[idx] = 1;
    r->free_list[r->nfree++] = (uint32_t)idx;
    return 0;
}

static int check_range(const struct req_pool *r, int32_t idx, size_t start, size_t n)
{
    if (!req_pool_in_use(r, idx) || start > r->max_context || n > r->max_context - start)
        return -EINVAL;
    return 0;
}

int req_pool_write(struct req_pool *r, int32_t idx, size_t start, const int32_t *slots, size_t n)
{
    int rc = check_range(r, idx, start, n);

    if (rc || (n && !slots) || start > r->filled[idx])
        return rc ? rc : -EINVAL;
    memcpy(r->map + (size_t)idx * r->max_context + start, slots, n * sizeof(int32_t));
    if (start + n > r->filled[idx])
        r->filled[idx] = (uint32_t)(start + n);
    return 0;
}

size_t req_pool_filled(const struct req_pool *r, int32_t idx)
{
    return req_pool_in_use(r, idx) ? r->filled[idx] : 0;
}

int req_pool_read(const struct req_pool *r, int32_t idx, size_t start, size_t n, int32_t *out)
{
    int rc = check_range(r, idx, start, n);

    if (rc || (n && !out))
        return rc ? rc : -EINVAL;
    memcpy(out, r->map + (size_t)idx * r->max_context + start, n * sizeof(int32_t));
    return 0;
}

const int32_t *req_pool_row(const struct req_pool *r, int32_t idx)
{
    return r->map + (size_t)idx * r->max_context;
}
