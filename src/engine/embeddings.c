/*
 * The multimodal embedding cache's entry points (kvtier.h, "multimodal embeddings"): each
 * checks its arguments and hands over to the cache (src/emb/), which api.c opened beside the
 * tiers. The pad tokens that name an item in a key are here too: they need no cache.
 */
#include "engine/embeddings.h"
#include "emb/emb.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static int check_key(const kvt_engine *e, const struct kvt_emb_key *key)
{
    if (!e || !e->emb || !key || !key->hash || (key->ns && key->ns_len > KVT_NS_MAX))
        return -EINVAL;
    return 0;
}

int kvt_emb_put(kvt_engine *e, const struct kvt_emb_key *key, const void *buf, size_t len,
                struct kvt_emb *held)
{
    int rc = check_key(e, key);

    if (rc || !buf || len == 0)
        return rc ? rc : -EINVAL;
    return emb_put(e->emb, key, buf, len, held);
}

int kvt_emb_fetch(kvt_engine *e, const struct kvt_emb_key *key, struct kvt_emb *out)
{
    int rc = check_key(e, key);

    if (rc || !out)
        return rc ? rc : -EINVAL;
    return emb_fetch(e->emb, key, out);
}

int kvt_emb_wait(kvt_engine *e, struct kvt_emb *emb, int timeout_ms)
{
    if (!e || !e->emb || !emb)
        return -EINVAL;
    return emb_wait(e->emb, emb, timeout_ms);
}

int kvt_emb_release(kvt_engine *e, struct kvt_emb *emb)
{
    if (!e || !e->emb || !emb)
        return -EINVAL;
    return emb_release(e->emb, emb);
}

int kvt_emb_read(kvt_engine *e, const struct kvt_emb *emb, size_t offset, void *buf, size_t n)
{
    if (!e || !e->emb || !emb)
        return -EINVAL;
    return emb_read(e->emb, emb, offset, buf, n);
}

int kvt_emb_lookup(kvt_engine *e, const struct kvt_emb_key *key, uint32_t *tier, size_t *len)
{
    int rc = check_key(e, key);

    return rc ? rc : emb_lookup(e->emb, key, tier, len);
}

int kvt_emb_drop(kvt_engine *e, const struct kvt_emb_key *key)
{
    int rc = check_key(e, key);

    return rc ? rc : emb_drop(e->emb, key);
}

int kvt_emb_stats(const kvt_engine *e, struct kvt_emb_stats *st)
{
    struct kvt_emb_stats all;

    if (!e || !e->emb || !st || st->size < sizeof(st->size))
        return -EINVAL;
    size_t size = st->size;
    emb_stats(e->emb, &all);
    if (size > sizeof(all))
        memset((uint8_t *)st + sizeof(all), 0, size - sizeof(all));
    all.size = size < sizeof(all) ? size : sizeof(all);
    memcpy(st, &all, all.size);
    return 0;
}

void engine_emb_poll(kvt_engine *e)
{
    if (e->emb)
        emb_poll(e->emb);
}

void engine_emb_sync(kvt_engine *e)
{
    if (e->emb)
        emb_sync(e->emb);
}

/* 31 bits of a hash word each, bit 31 set: above any vocabulary, and eight in a row name the
 * item by 248 bits of its hash. */
void kvt_emb_pad_tokens(const uint8_t *hash, uint32_t *tokens, size_t n)
{
    if (!hash || !tokens)
        return;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *w = hash + 4 * (i % 8);
        uint32_t v =
            (uint32_t)w[0] | (uint32_t)w[1] << 8 | (uint32_t)w[2] << 16 | (uint32_t)w[3] << 24;
        tokens[i] = 0x80000000u | (v & 0x7fffffffu);
    }
}

/* 8 pad tokens carry the whole of kvt_emb_pad_tokens' 248 bits. */
#define PAD_WORDS 8

size_t kvt_emb_prefix_limit(const size_t *starts, size_t n, size_t matched, uint32_t page_size)
{
    size_t limit = matched;

    if (!page_size || (!starts && n))
        return 0;
    limit -= limit % page_size;
    /* A cut may land in an earlier item's window: again until none does (each item cuts once
     * at most, the limit then at or before its start). */
    for (bool cut = true; cut;) {
        cut = false;
        for (size_t i = 0; i < n; i++)
            if (limit > starts[i] && limit < starts[i] + PAD_WORDS) {
                limit = starts[i] - starts[i] % page_size;
                cut = true;
            }
    }
    return limit;
}
