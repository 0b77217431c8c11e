/*
 * Where a page sits in a slab file, and the heads that make slab files self-describing, so
 * that the index can be rebuilt from the slabs alone (docs/formats.md has the byte layouts).
 *
 *   slab file   | slab head (4 KiB) | slot 0 | slot 1 | ... | slot slab_slots-1 |
 *   slot        | body | tail block                                   |
 *   tail block  | the page's last bytes | pad to 8 | page head | zeros to 4 KiB |
 *   packed slot | the page | pad to 8 | page head | zeros to 64 bytes |   (format 3, page < 4 KiB)
 *
 * The body is the page's leading whole 4 KiB blocks: it goes to and from the caller's buffer
 * untouched (O_DIRECT, registered buffers). The rest of the page travels with its page head
 * in the tail block, through a bounce buffer. A page of whole blocks has an empty tail and a
 * tail block holding only the head, which normal reads skip. A page smaller than a block is
 * all tail: in format 2 its slot was a whole block; from format 3 slots of such pages are
 * packed, 64-byte aligned, several to a block (a 2 KiB page of 16 tokens takes 2,304 bytes, not
 * 4,096). Such pages go through the page cache, which does the block I/O; every other I/O is
 * block-aligned in offset and length.
 *
 * A page head names the page (key, parent, namespace, tokens), its checksum, where it was
 * written and the dir's fingerprint; it is checked on its own (magic, position, check digest).
 * A slab head carries the dir's meta (format, fingerprint, page geometry).
 */
#ifndef KVT_DISK_LAYOUT_H
#define KVT_DISK_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "disk/store.h"

#define LAYOUT_BLOCK 4096u    /* the unit of every slab I/O */
#define SLAB_HEAD_BYTES 4096u /* a slab file's first block */
#define PAGE_HEAD_FIXED 160u  /* page head bytes before its tokens */
#define SLAB_HEAD_USED 80u    /* slab head bytes that carry data; the rest are zeros */
#define PACKED_ALIGN 64u      /* a packed slot's alignment */
#define FORMAT_PACKED 3u      /* the first format version that packs pages below a block */

struct slot_layout {
    uint32_t page_bytes, page_tokens;
    uint32_t body;       /* leading page bytes moved straight to and from the caller */
    uint32_t tail;       /* the page bytes after them, carried in the tail block */
    uint32_t head_off;   /* offset of the page head inside the tail block */
    uint32_t tail_bytes; /* the tail block: tail, page head, zeros, whole blocks */
    uint32_t slot_bytes; /* body + tail_bytes */
};

/* The layout for pages of page_bytes with page_tokens tokens in a dir of format version: 0,
 * or -EINVAL when a slot would not fit in 32 bits. */
int layout_init(struct slot_layout *l, uint32_t page_bytes, uint32_t page_tokens, uint32_t version);

/* Byte offset of slot (within its slab) in the slab file. */
static inline uint64_t layout_slot_off(const struct slot_layout *l, uint32_t slot)
{
    return SLAB_HEAD_BYTES + (uint64_t)slot * l->slot_bytes;
}

/* Slots a slab file of size bytes backs whole. */
uint64_t layout_slots_in(const struct slot_layout *l, uint64_t size);

/* What a page head says. tokens points into the buffer it was decoded from (little-endian). */
struct page_head {
    uint8_t key[DSTORE_KEY_BYTES];
    uint8_t parent[DSTORE_KEY_BYTES];
    uint8_t ns[DSTORE_NS_BYTES];
    uint8_t sum[16];  /* XXH3-128 of the page, canonical bytes */
    uint64_t created; /* ns since the epoch */
    uint32_t slab, slot;
    uint32_t length, ntokens;
    uint64_t fp_digest; /* layout_fp_digest of the dir's fingerprint */
    const uint8_t *tokens;
};

/* 64 bits of the fingerprint, as page heads carry it. */
uint64_t layout_fp_digest(const uint8_t fp[DSTORE_FINGERPRINT_BYTES]);

/* Bytes of a page head with ntokens tokens. */
static inline size_t page_head_bytes(uint32_t ntokens)
{
    return PAGE_HEAD_FIXED + 4 * (size_t)ntokens;
}

/* Encode h with tokens (h->ntokens host-order ids; NULL for zeros) into out. */
void page_head_encode(const struct page_head *h, const uint32_t *tokens, uint8_t *out);

/* Decode and check a page head of at most len bytes: 0, or KVT_ECORRUPT (no head there,
 * or a damaged one). */
int page_head_decode(const uint8_t *buf, size_t len, struct page_head *h);

/* Fill a tail block whose first l->tail bytes hold the page's last ones: the rest zeroed and
 * the head. */
void layout_fill_tail(const struct slot_layout *l, const struct page_head *h,
                      const uint32_t *tokens, uint8_t *block);

/* What a slab head says: the dir's meta as the slab was created with it. */
struct slab_head {
    uint32_t version;
    uint32_t slab;
    uint32_t page_bytes, page_tokens, slot_bytes, slab_slots;
    uint8_t fingerprint[DSTORE_FINGERPRINT_BYTES];
    uint64_t created; /* the dir's creation time, ns */
};

/* Encode into out (SLAB_HEAD_BYTES, zero-filled beyond SLAB_HEAD_USED). */
void slab_head_encode(const struct slab_head *h, uint8_t *out);

/* Decode and check: 0, KVT_EFORMAT (no slab head of any version), KVT_ECORRUPT. */
int slab_head_decode(const uint8_t *buf, size_t len, struct slab_head *h);

#endif
