/*
 * The invariant check across the tree, the device allocator and the tiers below (engine.h),
 * for tests: one walk of the tree counts the owners of every page, and each part checks its
 * own against those counts (the slot layer, the hybrid parts, the tier below).
 */
#include "engine/engine.h"
#include "engine/mamba.h"
#include "engine/mamba_tiers.h"
#include "engine/swa.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- invariants, for tests ---- */

/* How many nodes hold each page of one tier; pages outside [lo, hi] are errors. */
struct page_count {
    uint8_t *count;
    uint32_t lo, hi;
    int bad;
};

static void count_one(struct page_count *pc, uint32_t page)
{
    if (page < pc->lo || page > pc->hi || pc->count[page]++ != 0)
        pc->bad = 1;
}

struct owners {
    struct page_count dev, host, mamba, mhost;
};

static void count_device_page(void *ctx, uint32_t page)
{
    count_one(&((struct owners *)ctx)->dev, page);
}

static void count_host_page(void *ctx, uint32_t page)
{
    count_one(&((struct owners *)ctx)->host, page);
}

static void count_state_slot(void *ctx, uint32_t slot)
{
    count_one(&((struct owners *)ctx)->mamba, slot);
}

static void count_host_state(void *ctx, uint32_t hslot)
{
    count_one(&((struct owners *)ctx)->mhost, hslot);
}

/* Pages of the first tier below that the tree may hold: 0 when it keeps none there. */
static uint32_t below_tree_pages(const kvt_engine *e)
{
    return e->below ? e->below->ops->tree_pages(e->below) : 0;
}

/* One walk of the tree counts the owners of every device page and of every page of the tier
 * below whose copies the tree records (the host's). */
int engine_check(const kvt_engine *e, char *why, size_t why_len)
{
    uint32_t nbelow = below_tree_pages(e);
    uint32_t nstates = engine_mamba_slots(e), nhost = engine_mamba_host_slots(e);
    uint32_t npages = engine_slots_pages(&e->slots);
    struct owners o = {.dev = {.lo = 1, .hi = npages},
                       .host = {.lo = 0, .hi = nbelow ? nbelow - 1 : 0},
                       .mamba = {.lo = 1, .hi = nstates},
                       .mhost = {.lo = 1, .hi = nhost}};
    struct rdx_page_visitor v = {.device = count_device_page, .ctx = &o};
    int rc = -ENOMEM;

    o.dev.count = calloc((size_t)npages + 1, 1);
    o.host.count = calloc(nbelow ? nbelow : 1, 1);
    o.mamba.count = calloc((size_t)nstates + 1, 1);
    o.mhost.count = calloc((size_t)nhost + 1, 1);
    if (!o.dev.count || !o.host.count || !o.mamba.count || !o.mhost.count)
        goto out;
    if (nbelow)
        v.host = count_host_page;
    if (nstates)
        v.mamba = count_state_slot;
    if (nhost)
        v.mamba_host = count_host_state;
    rc = rdx_check(e->tree, &v, why, why_len);
    if (rc == 0 && (o.dev.bad || o.host.bad || o.mamba.bad || o.mhost.bad)) {
        snprintf(why, why_len, "a page is held by two nodes or is out of range");
        rc = -EUCLEAN;
    }
    if (rc == 0)
        rc = engine_slots_check(&e->slots, o.dev.count, why, why_len);
    if (rc == 0 && nbelow)
        rc = e->below->ops->check(e->below, o.host.count, why, why_len);
    if (rc == 0 && nstates)
        rc = engine_mamba_check(e, o.mamba.count, o.mhost.count, why, why_len);
    if (rc == 0 && e->swa)
        rc = engine_swa_check(e, why, why_len);
out:
    free(o.dev.count);
    free(o.host.count);
    free(o.mamba.count);
    free(o.mhost.count);
    return rc;
}
