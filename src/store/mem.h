/*
 * The in-memory store: whole pages in a table in memory, least recently used first out when
 * full. Every op completes as it is submitted. The template for a new backend (docs/tiers.md
 * walks through it), and the engine tests' fault seam: a hook fails chosen pages, and a page
 * can be damaged in place, which its next read catches by its checksum.
 */
#ifndef KVT_STORE_MEM_H
#define KVT_STORE_MEM_H

#include "store/store.h"

/* Test seam: asked before each page of a read or write; 0 to go on, or the page's result
 * (a -errno, or KVT_ECORRUPT for a read). */
struct store_mem_faults {
    int (*inject)(void *arg, enum store_op_kind kind, const uint8_t *key);
    void *arg;
};

struct store_mem_options {
    uint32_t page_bytes, page_tokens;
    uint64_t capacity_pages;
    const struct store_mem_faults *faults; /* may be NULL */
};

/* -EINVAL for a zero page size or capacity; -ENOMEM. */
int store_mem_open(const struct store_mem_options *o, struct kvt_store **out);

/* Flip a byte of key's stored page, as a disk might: 0, or -ENOENT when it is not held. */
int store_mem_damage(struct kvt_store *s, const uint8_t *key);

#endif
