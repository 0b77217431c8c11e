/*
 * The multimodal embedding cache (kvtier.h, "multimodal embeddings") and the share of a store
 * between its users (src/store/share.h).
 *
 * One program (meson test `emb`): cache.c (the device budget, LRU order, holds, the host
 * copies, bad calls), tiers.c (the disk tier, restarts, damage, a real redis-server shared by
 * two engines), pads.c (image tokens in the prefix cache: pad tokens, namespaces, collisions),
 * share.c (views of one store), over the helpers here and in main.c.
 */
#ifndef KVT_TESTS_UNIT_EMB_H
#define KVT_TESTS_UNIT_EMB_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "engine_fixture.h"

/* What an engine of these tests has (0 / NULL: none). */
struct emb_cfg {
    uint64_t device, host; /* the embedding cache's budgets */
    const char *dir;       /* a disk tier (with a host tier of KV) */
    const char *remote;    /* a remote tier (with a host tier of KV) */
    uint32_t store;        /* options.emb_store */
};

/* main.c */
/* A fresh data dir for a test (*state), removed after it, pass or fail. */
int dir_setup(void **state);
int dir_teardown(void **state);
/* tiers.c: the test's redis-server stopped too. */
int remote_teardown(void **state);
void emb_options(const struct emb_cfg *c, struct kvt_options *o);
kvt_engine *emb_engine(const struct emb_cfg *c);
/* Item id's hash and, for len bytes, its embedding's bytes: functions of id alone. */
void item_hash(uint64_t id, uint8_t hash[KVT_EMB_HASH_BYTES]);
void item_bytes(uint64_t id, uint8_t *buf, size_t len);
/* Put item id (len bytes) in namespace ns ("" default); held when out is not NULL. */
int put_item(kvt_engine *e, const char *ns, uint64_t id, size_t len, struct kvt_emb *out);
/* Fetch item id; wait for its read; returns fetch's or wait's result. */
int fetch_item(kvt_engine *e, const char *ns, uint64_t id, struct kvt_emb *out);
/* The held embedding has item id's len bytes, read back from the device. */
void assert_item(kvt_engine *e, const struct kvt_emb *h, uint64_t id, size_t len);
/* Where item id is (enum kvt_emb_tier), or -ENOENT. */
int where(kvt_engine *e, const char *ns, uint64_t id);
struct kvt_emb_stats cache_stats(const kvt_engine *e);

/* cache.c */
void test_bad_calls(void **state);
void test_device_lru(void **state);
void test_holds(void **state);
void test_host_copies(void **state);
void test_sizes(void **state);

/* tiers.c */
void test_disk_tier(void **state);
void test_restart(void **state);
void test_damaged_on_disk(void **state);
void test_mixed_record(void **state);
void test_joined_reads(void **state);
void test_longer_than_budget(void **state);
void test_no_store(void **state);
void test_remote_shared(void **state);

/* pads.c */
void test_pad_tokens(void **state);
void test_image_prefixes(void **state);
void test_namespaces(void **state);
void test_pad_collision(void **state);

/* share.c */
void test_share_routes(void **state);
void test_share_close(void **state);

#endif
