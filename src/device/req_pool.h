/* The request pool: request slots and the req_to_token map (max_reqs x max_context int32). */
#ifndef KVT_DEVICE_REQ_POOL_H
#define KVT_DEVICE_REQ_POOL_H

#include <stddef.h>
#include <stdint.h>

struct req_pool {
    uint32_t max_reqs, max_context;
    int32_t *map;        /* req_to_token, row-major */
    uint32_t *free_list; /* a stack of free rows */
    uint32_t nfree;
    uint8_t *in_use;
    uint32_t *filled; /* per row: entries written so far, without holes */
    uint32_t *gen;    /* per row: moves on each free, never 0, so a stale handle is caught */
};

int req_pool_init(struct req_pool *r, uint32_t max_reqs, uint32_t max_context);
void req_pool_finish(struct req_pool *r);
int req_pool_alloc(struct req_pool *r, int32_t *idx); /* -ENOMEM when full */
int req_pool_free(struct req_pool *r, int32_t idx);   /* -EINVAL unless in use */
int req_pool_in_use(const struct req_pool *r, int32_t idx);
/* The generation of row idx (in range): what a handle to its current holder carries. */
uint32_t req_pool_gen(const struct req_pool *r, int32_t idx);
/* Whether idx is in use by the holder of generation gen. */
int req_pool_live(const struct req_pool *r, int32_t idx, uint32_t gen);
/* Write n entries from start; start must not leave a hole past what the row holds. */
int req_pool_write(struct req_pool *r, int32_t idx, size_t start, const int32_t *slots, size_t n);
/* Entries of the row written since the slot was taken. */
size_t req_pool_filled(const struct req_pool *r, int32_t idx);
int req_pool_read(const struct req_pool *r, int32_t idx, size_t start, size_t n, int32_t *out);
const int32_t *req_pool_row(const struct req_pool *r, int32_t idx);

#endif
