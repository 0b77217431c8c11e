/* Pool sizing, as SGLang's profile_max_num_token: a budget divided by the cell size. */
#include "kvtier.h"
#include "kv_pool.h"

uint64_t kvt_cell_bytes(const struct kvt_geometry *g)
{
    if (kv_geometry_check(g))
        return 0;
    return ((uint64_t)kv_row_bytes(g, 0) + kv_row_bytes(g, 1)) * g->layers;
}

uint64_t kvt_max_tokens(const struct kvt_geometry *g, uint32_t page_size, uint64_t bytes)
{
    uint64_t cell = kvt_cell_bytes(g), rows;

    if (cell == 0 || page_size == 0 || (page_size & (page_size - 1)))
        return 0;
    rows = bytes / cell;
    /* The pool holds page_size more rows than slots: the padding page. */
    if (rows <= page_size)
        return 0;
    return (rows - page_size) / page_size * page_size;
}
