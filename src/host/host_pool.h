/*
 * The host tier's KV pool: pinned host memory allocated once at open, holding whole pages of
 * KV for every layer, and a page allocator over it.
 *
 * Layouts (the byte order of the pool):
 * - page_first (default): [page][layer][K rows of the page, then V rows]. One page across all
 *   layers is one contiguous run of page_bytes; it is the disk tier's I/O unit.
 * - layer_first: [layer][K or V][page][rows], as SGLang's layer_first host pool.
 * For MLA there is no V: the latent rows stand where K is.
 *
 * Unlike the device pool there is no padding page: pages 0 .. npages-1 are all usable.
 */
#ifndef KVT_HOST_POOL_H
#define KVT_HOST_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "device/backend.h"

enum host_layout {
    HOST_PAGE_FIRST = 0,
    HOST_LAYER_FIRST = 1,
};

enum host_page_state {
    HOST_PAGE_FREE = 0,
    HOST_PAGE_USED = 1,
};

struct host_pool {
    const struct dev_backend *be;
    uint8_t *base;
    size_t bytes; /* mapped bytes */
    uint32_t layers, page_size, layout;
    size_t row[2];     /* bytes of one token row of K and V in one layer; row[1] 0 for MLA */
    size_t page_bytes; /* one page over all layers, K and V */
    uint32_t npages;
    bool pinned; /* locked in RAM: mlock (sim) or cudaHostRegister (cuda) succeeded */

    /* allocator */
    uint8_t *state; /* enum host_page_state per page */
    uint32_t *free; /* stack of free pages */
    uint32_t nfree;
};

/* Map and pin npages pages of KV for geometry g. Refuses with KVT_EHOSTRAM, before touching
 * any memory, when the pool would not fit in the memory available now (MemAvailable, and the
 * cgroup limit when there is one). With the cuda backend the pages are registered with
 * cudaHostRegister so copies can be asynchronous; on sim they are mlock'ed where the limit
 * allows, and left unpinned (pinned false) where it does not. -EINVAL for a zero size or
 * bad layout. */
int host_pool_init(struct host_pool *hp, const struct dev_backend *be, const struct kvt_geometry *g,
                   uint32_t page_size, uint64_t npages, uint32_t layout);
void host_pool_finish(struct host_pool *hp);

/* The page_size consecutive rows of K (which 0) or V (which 1) of layer in page. */
uint8_t *host_pool_rows(const struct host_pool *hp, uint32_t page, uint32_t layer, int which);

/* Take n free pages into pages[]; -ENOMEM changes nothing. */
int host_alloc(struct host_pool *hp, size_t n, uint32_t *pages);

/* Give back n pages; -EINVAL, freeing none, when any is out of range, free, or named twice. */
int host_free(struct host_pool *hp, const uint32_t *pages, size_t n);

/* Free pages. */
size_t host_available(const struct host_pool *hp);

/* Bytes of memory the system can give now (MemAvailable, capped by the cgroup limit); 0 if
 * unknown. */
uint64_t host_memory_available(void);

#endif
