/*
 * Slot geometry, page heads and slab heads (see layout.h). Decoders treat their input as
 * untrusted: every length is checked before a field is read, and a head's own check digest
 * covers every byte of it, its tokens included.
 */
#include "layout.h"
#include "le.h"

#include <errno.h>
#include <string.h>
#include <xxhash.h>

#define PAGE_MAGIC "KVTPAGE2"
#define SLAB_MAGIC "KVTSLAB2"
#define HEAD_SEED 0x6b767470616765ull /* "kvtpage": a head check is not a bare XXH3 */

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

int layout_init(struct slot_layout *l, uint32_t page_bytes, uint32_t page_tokens, uint32_t version)
{
    uint64_t tail_bytes, slot;

    if (!page_bytes || page_tokens > DSTORE_MAX_TOKENS)
        return -EINVAL;
    l->page_bytes = page_bytes;
    l->page_tokens = page_tokens;
    l->body = page_bytes / LAYOUT_BLOCK * LAYOUT_BLOCK;
    l->tail = page_bytes - l->body;
    l->head_off = (uint32_t)round_up(l->tail, 8);
    tail_bytes = round_up(l->head_off + page_head_bytes(page_tokens),
                          !l->body && version >= FORMAT_PACKED ? PACKED_ALIGN : LAYOUT_BLOCK);
    slot = l->body + tail_bytes;
    if (slot > UINT32_MAX - LAYOUT_BLOCK)
        return -EINVAL;
    l->tail_bytes = (uint32_t)tail_bytes;
    l->slot_bytes = (uint32_t)slot;
    return 0;
}

uint64_t layout_slots_in(const struct slot_layout *l, uint64_t size)
{
    return size < SLAB_HEAD_BYTES ? 0 : (size - SLAB_HEAD_BYTES) / l->slot_bytes;
}

uint64_t layout_fp_digest(const uint8_t fp[DSTORE_FINGERPRINT_BYTES])
{
    return XXH3_64bits_withSeed(fp, DSTORE_FINGERPRINT_BYTES, HEAD_SEED);
}

/* ---- page heads ---- */

static uint64_t head_check(const uint8_t *buf, size_t len)
{
    return XXH3_64bits_withSeed(buf, len, HEAD_SEED);
}

/* The check digest sits at 152 and covers every other byte of the head. */
static uint64_t page_head_check(const uint8_t *buf, uint32_t ntokens)
{
    uint8_t fixed[PAGE_HEAD_FIXED];

    memcpy(fixed, buf, PAGE_HEAD_FIXED);
    memset(fixed + 152, 0, 8);
    return head_check(fixed, PAGE_HEAD_FIXED) ^
           head_check(buf + PAGE_HEAD_FIXED, 4 * (size_t)ntokens);
}

void page_head_encode(const struct page_head *h, const uint32_t *tokens, uint8_t *out)
{
    memset(out, 0, PAGE_HEAD_FIXED);
    memcpy(out, PAGE_MAGIC, 8);
    memcpy(out + 8, h->key, DSTORE_KEY_BYTES);
    memcpy(out + 40, h->parent, DSTORE_KEY_BYTES);
    memcpy(out + 72, h->ns, DSTORE_NS_BYTES);
    memcpy(out + 104, h->sum, 16);
    put64(out + 120, h->created);
    put32(out + 128, h->slab);
    put32(out + 132, h->slot);
    put32(out + 136, h->length);
    put32(out + 140, h->ntokens);
    put64(out + 144, h->fp_digest);
    for (uint32_t i = 0; i < h->ntokens; i++)
        put32(out + PAGE_HEAD_FIXED + 4 * (size_t)i, tokens ? tokens[i] : 0);
    put64(out + 152, page_head_check(out, h->ntokens));
}

int page_head_decode(const uint8_t *buf, size_t len, struct page_head *h)
{
    uint32_t ntokens;

    if (len < PAGE_HEAD_FIXED || memcmp(buf, PAGE_MAGIC, 8))
        return KVT_ECORRUPT;
    ntokens = get32(buf + 140);
    if (ntokens > DSTORE_MAX_TOKENS || page_head_bytes(ntokens) > len ||
        get64(buf + 152) != page_head_check(buf, ntokens))
        return KVT_ECORRUPT;
    memcpy(h->key, buf + 8, DSTORE_KEY_BYTES);
    memcpy(h->parent, buf + 40, DSTORE_KEY_BYTES);
    memcpy(h->ns, buf + 72, DSTORE_NS_BYTES);
    memcpy(h->sum, buf + 104, 16);
    h->created = get64(buf + 120);
    h->slab = get32(buf + 128);
    h->slot = get32(buf + 132);
    h->length = get32(buf + 136);
    h->ntokens = ntokens;
    h->fp_digest = get64(buf + 144);
    h->tokens = buf + PAGE_HEAD_FIXED;
    return 0;
}

void layout_fill_tail(const struct slot_layout *l, const struct page_head *h,
                      const uint32_t *tokens, uint8_t *block)
{
    memset(block + l->tail, 0, l->tail_bytes - l->tail);
    page_head_encode(h, tokens, block + l->head_off);
}

/* ---- slab heads ---- */

void slab_head_encode(const struct slab_head *h, uint8_t *out)
{
    memset(out, 0, SLAB_HEAD_BYTES);
    memcpy(out, SLAB_MAGIC, 8);
    put32(out + 8, h->version);
    put32(out + 12, h->slab);
    put32(out + 16, h->page_bytes);
    put32(out + 20, h->page_tokens);
    put32(out + 24, h->slot_bytes);
    put32(out + 28, h->slab_slots);
    memcpy(out + 32, h->fingerprint, DSTORE_FINGERPRINT_BYTES);
    put64(out + 64, h->created);
    put64(out + 72, head_check(out, 72));
}

int slab_head_decode(const uint8_t *buf, size_t len, struct slab_head *h)
{
    if (len < SLAB_HEAD_USED || memcmp(buf, SLAB_MAGIC, 6))
        return KVT_EFORMAT;
    if (memcmp(buf, SLAB_MAGIC, 8) || get64(buf + 72) != head_check(buf, 72))
        return KVT_ECORRUPT;
    h->version = get32(buf + 8);
    h->slab = get32(buf + 12);
    h->page_bytes = get32(buf + 16);
    h->page_tokens = get32(buf + 20);
    h->slot_bytes = get32(buf + 24);
    h->slab_slots = get32(buf + 28);
    memcpy(h->fingerprint, buf + 32, DSTORE_FINGERPRINT_BYTES);
    h->created = get64(buf + 64);
    return 0;
}
