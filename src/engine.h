/* The engine's private side: what tests and tools inside the project may see. */
#ifndef KVT_ENGINE_H
#define KVT_ENGINE_H

#include "kvtier.h"
#include "device/alloc.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/req_pool.h"
#include "radix/radix.h"

#define KVT_PAGE_SIZE_MAX 256

struct kvt_engine {
    struct kvt_options opts;
    char *model_id;
    uint8_t fingerprint[KVT_HASH_LEN];
    const struct dev_backend *be;
    struct kv_pool kv;
    struct slot_alloc alloc;
    struct req_pool reqs;
    struct rdx_tree *tree;
    uint32_t *pages; /* scratch: one entry per page of the longest key */
    struct {
        uint64_t match_calls, match_query_tokens, match_hit_tokens;
        uint64_t inserted_tokens, evicted_tokens;
    } count;
};

/* Check every invariant across tree and allocator: each page is free, held by a caller,
 * pending in a free group, or cached by exactly one node; tree sizes add up. 0, or
 * -EUCLEAN with the reason in why. For tests; walks everything. */
int kvt_engine_check(const kvt_engine *e, char *why, size_t why_len);

#endif
