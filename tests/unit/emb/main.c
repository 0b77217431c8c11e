/* The emb test program's table and shared helpers (emb_test.h). */
#include "emb_test.h"

#include "rng.h"

void emb_options(const struct emb_cfg *c, struct kvt_options *o)
{
    /* 2 layers of one head of 64: pages of 4 tokens are 2 KiB, the chunks of a record. */
    fixture_engine_options(o, 2, 64);
    o->device_tokens = 256;
    o->emb_device_bytes = c->device;
    o->emb_host_bytes = c->host;
    o->emb_store = c->store;
    if (c->dir || c->remote) {
        o->host_tokens = 512;
        o->disk_dir = c->dir;
        o->disk_bytes = 4 << 20;
        o->remote = c->remote;
        o->store_page_tokens = o->page_size; /* chunks of a page, as the cases count them */
    }
}

kvt_engine *emb_engine(const struct emb_cfg *c)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    emb_options(c, &o);
    int rc = kvt_open(&o, &e);
    if (rc)
        fail_msg("kvt_open: %s", kvt_strerror(rc));
    return e;
}

void item_hash(uint64_t id, uint8_t hash[KVT_EMB_HASH_BYTES])
{
    for (int i = 0; i < 4; i++) {
        uint64_t w = rng_mix(id * 4 + (uint64_t)i + 0x5eed);
        memcpy(hash + 8 * i, &w, 8);
    }
}

void item_bytes(uint64_t id, uint8_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = rng_mix(id ^ (i * 0x9e3779b97f4a7c15ull));
        memcpy(buf + i, &w, len - i < 8 ? len - i : 8);
    }
}

static struct kvt_emb_key key_of(const char *ns, const uint8_t *hash)
{
    return (struct kvt_emb_key){hash, ns, ns ? strlen(ns) : 0};
}

int put_item(kvt_engine *e, const char *ns, uint64_t id, size_t len, struct kvt_emb *out)
{
    uint8_t hash[KVT_EMB_HASH_BYTES];
    uint8_t *buf = malloc(len ? len : 1);
    struct kvt_emb_key k = key_of(ns, hash);

    assert_non_null(buf);
    item_hash(id, hash);
    item_bytes(id, buf, len);
    int rc = kvt_emb_put(e, &k, buf, len, out);
    free(buf);
    return rc;
}

int fetch_item(kvt_engine *e, const char *ns, uint64_t id, struct kvt_emb *out)
{
    uint8_t hash[KVT_EMB_HASH_BYTES];
    struct kvt_emb_key k = key_of(ns, hash);
    int rc;

    item_hash(id, hash);
    if ((rc = kvt_emb_fetch(e, &k, out)))
        return rc;
    return kvt_emb_wait(e, out, -1);
}

void assert_item(kvt_engine *e, const struct kvt_emb *h, uint64_t id, size_t len)
{
    uint8_t *want = malloc(len), *got = malloc(len);

    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(h->len, len);
    assert_non_null(h->ptr);
    item_bytes(id, want, len);
    assert_int_equal(kvt_emb_read(e, h, 0, got, len), 0);
    assert_memory_equal(got, want, len);
    free(want);
    free(got);
}

int where(kvt_engine *e, const char *ns, uint64_t id)
{
    uint8_t hash[KVT_EMB_HASH_BYTES];
    struct kvt_emb_key k = key_of(ns, hash);
    uint32_t tier;

    item_hash(id, hash);
    int rc = kvt_emb_lookup(e, &k, &tier, NULL);
    return rc ? rc : (int)tier;
}

struct kvt_emb_stats cache_stats(const kvt_engine *e)
{
    struct kvt_emb_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_emb_stats(e, &st), 0);
    return st;
}

int dir_setup(void **state)
{
    char *dir = malloc(128);

    if (!dir || fixture_data_dir(dir, 128, "emb")) {
        free(dir);
        return -1;
    }
    *state = dir;
    return 0;
}

int dir_teardown(void **state)
{
    fixture_remove_tree(*state);
    free(*state);
    return 0;
}

#define WITH_DIR(t) cmocka_unit_test_setup_teardown(t, dir_setup, dir_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_device_lru),
        cmocka_unit_test(test_holds),
        cmocka_unit_test(test_host_copies),
        WITH_DIR(test_sizes),
        WITH_DIR(test_disk_tier),
        WITH_DIR(test_restart),
        WITH_DIR(test_damaged_on_disk),
        WITH_DIR(test_mixed_record),
        WITH_DIR(test_joined_reads),
        WITH_DIR(test_longer_than_budget),
        WITH_DIR(test_no_store),
        cmocka_unit_test_setup_teardown(test_remote_shared, dir_setup, remote_teardown),
        cmocka_unit_test(test_pad_tokens),
        cmocka_unit_test(test_image_prefixes),
        cmocka_unit_test(test_namespaces),
        cmocka_unit_test(test_pad_collision),
        WITH_DIR(test_share_routes),
        WITH_DIR(test_share_close),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
