#include "mamba_ckpt.h"

#include <errno.h>

/* Grids past this are no model's and would let prefix + grid arithmetic near overflow. */
#define MAX_GRID (1ull << 31)

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static uint64_t lcm(uint64_t a, uint64_t b)
{
    return a / gcd(a, b) * b;
}

static int pow2(uint32_t v)
{
    return v && !(v & (v - 1));
}

void mamba_ckpt_rules_default(struct mamba_ckpt_rules *r, uint32_t page_size)
{
    r->chunk = MAMBA_FLA_CHUNK;
    r->track_interval = MAMBA_TRACK_INTERVAL_DEF;
    r->page_size = page_size;
}

int mamba_ckpt_rules_check(const struct mamba_ckpt_rules *r)
{
    if (!r || !pow2(r->chunk) || !pow2(r->page_size))
        return -EINVAL;
    if (r->track_interval == 0 || r->track_interval % r->chunk)
        return -EINVAL;
    return mamba_ckpt_decode_grid(r) < MAX_GRID ? 0 : -EINVAL;
}

uint64_t mamba_ckpt_grid(const struct mamba_ckpt_rules *r)
{
    /* A page larger than the chunk moves the cache's state grid to the page (SGLang's
     * mamba_cache_chunk_size); the lcm keeps the depth page aligned whatever the sizes. */
    uint64_t cache_chunk = r->chunk > r->page_size ? r->chunk : r->page_size;

    return lcm(cache_chunk, r->page_size);
}

uint64_t mamba_ckpt_decode_grid(const struct mamba_ckpt_rules *r)
{
    return lcm(mamba_ckpt_grid(r), r->track_interval);
}

uint64_t mamba_ckpt_prefill_track(const struct mamba_ckpt_rules *r, uint64_t prefix_len,
                                  uint64_t extend_len)
{
    uint64_t grid = mamba_ckpt_grid(r);

    return extend_len >= grid ? prefix_len + extend_len / grid * grid : 0;
}

int mamba_ckpt_decode_due(const struct mamba_ckpt_rules *r, uint64_t seq_len)
{
    return seq_len > 0 && seq_len % mamba_ckpt_decode_grid(r) == 0;
}

uint64_t mamba_ckpt_branching(const struct mamba_ckpt_rules *r, uint64_t kv_hit, uint64_t state_len)
{
    uint64_t grid = mamba_ckpt_grid(r), aligned = kv_hit / grid * grid;

    return aligned > state_len ? aligned : 0;
}

uint64_t mamba_ckpt_effective(uint64_t kv_hit, const uint64_t *ckpts, size_t n)
{
    uint64_t best = 0;

    for (size_t i = 0; ckpts && i < n; i++)
        if (ckpts[i] <= kv_hit && ckpts[i] > best)
            best = ckpts[i];
    return best;
}
