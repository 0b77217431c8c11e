/* The embedding cache in memory: bad calls, the device budget and its LRU order, holds, the
 * host copies, and records of every size near a chunk's edges. */
#include "emb_test.h"

#define KIB 1024u

/* Every call refuses what the header says, and a refused call changes nothing. */
void test_bad_calls(void **state)
{
    (void)state;
    struct emb_cfg cfg = {.device = 64 * KIB};
    kvt_engine *e = emb_engine(&cfg), *plain;
    struct kvt_options o;
    uint8_t hash[32] = {1}, buf[16] = {0};
    char big_ns[KVT_NS_MAX + 1];
    struct kvt_emb_key k = {hash, NULL, 0}, nohash = {NULL, NULL, 0};
    struct kvt_emb h = {0}, stale;
    struct kvt_emb_stats st = {.size = 4};

    memset(big_ns, 'n', sizeof(big_ns));
    struct kvt_emb_key longns = {hash, big_ns, sizeof(big_ns)};
    /* Options: the other emb_ fields need a device budget; emb_store is an enum. */
    fixture_engine_options(&o, 2, 64);
    o.emb_host_bytes = 4096;
    assert_int_equal(kvt_open(&o, &plain), -EINVAL);
    o.emb_host_bytes = 0;
    o.emb_store = KVT_EMB_STORE_NONE;
    assert_int_equal(kvt_open(&o, &plain), -EINVAL);
    o.emb_device_bytes = 4096;
    o.emb_store = 2;
    assert_int_equal(kvt_open(&o, &plain), -EINVAL);
    /* An engine without an embedding cache refuses every call. */
    fixture_engine_options(&o, 2, 64);
    assert_int_equal(kvt_open(&o, &plain), 0);
    assert_int_equal(kvt_emb_put(plain, &k, buf, 16, NULL), -EINVAL);
    assert_int_equal(kvt_emb_fetch(plain, &k, &h), -EINVAL);
    assert_int_equal(kvt_emb_lookup(plain, &k, NULL, NULL), -EINVAL);
    assert_int_equal(kvt_emb_drop(plain, &k), -EINVAL);
    assert_int_equal(kvt_emb_wait(plain, &h, 0), -EINVAL);
    assert_int_equal(kvt_emb_release(plain, &h), -EINVAL);
    st.size = sizeof(st);
    assert_int_equal(kvt_emb_stats(plain, &st), -EINVAL);
    kvt_close(plain);
    /* NULLs, a key without its hash, a namespace too long, nothing to put. */
    assert_int_equal(kvt_emb_put(NULL, &k, buf, 16, NULL), -EINVAL);
    assert_int_equal(kvt_emb_put(e, NULL, buf, 16, NULL), -EINVAL);
    assert_int_equal(kvt_emb_put(e, &nohash, buf, 16, NULL), -EINVAL);
    assert_int_equal(kvt_emb_put(e, &longns, buf, 16, NULL), -EINVAL);
    assert_int_equal(kvt_emb_put(e, &k, NULL, 16, NULL), -EINVAL);
    assert_int_equal(kvt_emb_put(e, &k, buf, 0, NULL), -EINVAL);
    assert_int_equal(kvt_emb_fetch(e, &k, NULL), -EINVAL);
    assert_int_equal(kvt_emb_fetch(e, &nohash, &h), -EINVAL);
    assert_int_equal(kvt_emb_lookup(e, &longns, NULL, NULL), -EINVAL);
    assert_int_equal(kvt_emb_drop(e, NULL), -EINVAL);
    assert_int_equal(kvt_emb_wait(e, NULL, 0), -EINVAL);
    assert_int_equal(kvt_emb_release(e, NULL), -EINVAL);
    assert_int_equal(kvt_emb_read(e, NULL, 0, buf, 1), -EINVAL);
    st.size = 4;
    assert_int_equal(kvt_emb_stats(e, &st), -EINVAL);
    assert_int_equal(kvt_emb_stats(NULL, &st), -EINVAL);
    /* Nothing cached: a miss everywhere. */
    assert_int_equal(kvt_emb_fetch(e, &k, &h), -ENOENT);
    assert_int_equal(kvt_emb_lookup(e, &k, NULL, NULL), -ENOENT);
    assert_int_equal(kvt_emb_drop(e, &k), -ENOENT);
    /* Holds: none, stale, released twice; reads past the end. */
    assert_int_equal(kvt_emb_wait(e, &h, 0), -EINVAL);
    assert_int_equal(kvt_emb_put(e, &k, buf, 16, &h), 0);
    assert_int_equal(kvt_emb_read(e, &h, 0, NULL, 1), -EINVAL);
    assert_int_equal(kvt_emb_read(e, &h, 8, buf, 9), -EINVAL);
    assert_int_equal(kvt_emb_read(e, &h, 17, buf, 0), -EINVAL);
    assert_int_equal(kvt_emb_read(e, &h, 16, buf, 0), 0);
    assert_int_equal(kvt_emb_drop(e, &k), -EBUSY); /* held */
    stale = h;
    assert_int_equal(kvt_emb_release(e, &h), 0);
    assert_int_equal(h.handle, 0);
    assert_int_equal(kvt_emb_release(e, &h), -EINVAL);
    assert_int_equal(kvt_emb_release(e, &stale), -EINVAL); /* its hold is gone */
    assert_int_equal(kvt_emb_read(e, &stale, 0, buf, 1), -EINVAL);
    stale.handle ^= 1ull << 32; /* another generation of the slot */
    assert_int_equal(kvt_emb_wait(e, &stale, 0), -EINVAL);
    /* Stats: a smaller caller gets its part; a refused call counted nothing. */
    st.size = sizeof(st);
    assert_int_equal(kvt_emb_stats(e, &st), 0);
    assert_int_equal(st.size, sizeof(st));
    assert_int_equal(st.puts, 1);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.device_bytes, 64 * KIB);
    assert_int_equal(st.held, 0);
    kvt_close(e);
}

/* The device keeps what its budget holds and evicts least recently used first: a fetch or a
 * repeated put makes an embedding the newest. */
void test_device_lru(void **state)
{
    (void)state;
    struct emb_cfg cfg = {.device = 64 * KIB};
    kvt_engine *e = emb_engine(&cfg);
    struct kvt_emb h;

    for (uint64_t id = 1; id <= 4; id++)
        assert_int_equal(put_item(e, NULL, id, 16 * KIB, NULL), 0);
    assert_int_equal(cache_stats(e).device_used, 64 * KIB);
    assert_int_equal(fetch_item(e, NULL, 1, &h), 0); /* 1 becomes the newest */
    assert_int_equal(h.tier, KVT_EMB_DEVICE);
    assert_int_equal(h.op, 0);
    assert_item(e, &h, 1, 16 * KIB);
    assert_int_equal(kvt_emb_release(e, &h), 0);
    assert_int_equal(put_item(e, NULL, 3, 16 * KIB, NULL), 0); /* present: 3 is newer */
    assert_int_equal(cache_stats(e).put_present, 1);
    /* Order now, oldest first: 2, 4, 1, 3. A fifth evicts 2, a sixth 4. */
    assert_int_equal(put_item(e, NULL, 5, 16 * KIB, NULL), 0);
    assert_int_equal(where(e, NULL, 2), -ENOENT);
    assert_int_equal(where(e, NULL, 4), KVT_EMB_DEVICE);
    assert_int_equal(put_item(e, NULL, 6, 16 * KIB, NULL), 0);
    assert_int_equal(where(e, NULL, 4), -ENOENT);
    for (uint64_t id = 1; id <= 6; id++)
        if (id != 2 && id != 4) {
            assert_int_equal(fetch_item(e, NULL, id, &h), 0);
            assert_item(e, &h, id, 16 * KIB);
            assert_int_equal(kvt_emb_release(e, &h), 0);
        }
    struct kvt_emb_stats st = cache_stats(e);
    assert_int_equal(st.evicted_device, 2);
    assert_int_equal(st.device_embeddings, 4);
    /* One that needs two slots' room evicts least recently used first until a hole fits:
     * 1 (at 0) and 3 (at 32 KiB) leave no 32 KiB hole, 5 (at 16 KiB, where 2 was) joins
     * them; 6 stays. */
    assert_int_equal(put_item(e, NULL, 7, 32 * KIB, NULL), 0);
    assert_int_equal(where(e, NULL, 1), -ENOENT);
    assert_int_equal(where(e, NULL, 3), -ENOENT);
    assert_int_equal(where(e, NULL, 5), -ENOENT);
    assert_int_equal(where(e, NULL, 6), KVT_EMB_DEVICE);
    assert_int_equal(cache_stats(e).evicted_device, 5);
    /* Dropped: gone from the device, its room free. */
    assert_int_equal(where(e, NULL, 7), KVT_EMB_DEVICE);
    uint8_t hash[32];
    item_hash(7, hash);
    struct kvt_emb_key k = {hash, NULL, 0};
    assert_int_equal(kvt_emb_drop(e, &k), 0);
    assert_int_equal(where(e, NULL, 7), -ENOENT);
    assert_int_equal(cache_stats(e).device_used, 16 * KIB);
    kvt_close(e);
}

/* A held embedding is never evicted; when holds fill the budget a put is refused and evicts
 * nothing; one larger than the whole budget is refused (SGLang's rule) and evicts nothing. */
void test_holds(void **state)
{
    (void)state;
    struct emb_cfg cfg = {.device = 64 * KIB};
    kvt_engine *e = emb_engine(&cfg);
    struct kvt_emb h1, h2, h3, h;

    assert_int_equal(put_item(e, NULL, 1, 16 * KIB, &h1), 0);
    assert_int_equal(put_item(e, NULL, 2, 16 * KIB, NULL), 0);
    assert_int_equal(put_item(e, NULL, 3, 16 * KIB, &h3), 0);
    assert_int_equal(put_item(e, NULL, 4, 16 * KIB, NULL), 0);
    /* 1 is the oldest but held: 2 goes, then 4. */
    assert_int_equal(put_item(e, NULL, 5, 16 * KIB, NULL), 0);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DEVICE);
    assert_int_equal(where(e, NULL, 2), -ENOENT);
    assert_int_equal(put_item(e, NULL, 6, 16 * KIB, &h), 0);
    assert_int_equal(where(e, NULL, 4), -ENOENT);
    assert_int_equal(where(e, NULL, 5), KVT_EMB_DEVICE);
    /* 1, 3, 6 held, 5 not: 32 KiB cannot be had without a held one; nothing is evicted. */
    assert_int_equal(put_item(e, NULL, 7, 32 * KIB, NULL), -ENOMEM);
    assert_int_equal(where(e, NULL, 5), KVT_EMB_DEVICE);
    assert_int_equal(where(e, NULL, 7), -ENOENT);
    assert_int_equal(cache_stats(e).held, 3);
    /* Larger than the whole budget: refused, nothing evicted. */
    assert_int_equal(put_item(e, NULL, 8, 64 * KIB + 1, NULL), -E2BIG);
    assert_int_equal(where(e, NULL, 5), KVT_EMB_DEVICE);
    assert_int_equal(cache_stats(e).refused, 2);
    /* Held twice (put, then fetch): one release leaves it held. */
    assert_int_equal(fetch_item(e, NULL, 1, &h2), 0);
    assert_int_equal(kvt_emb_release(e, &h1), 0);
    assert_int_equal(kvt_emb_release(e, &h3), 0);
    assert_int_equal(kvt_emb_release(e, &h), 0);
    assert_int_equal(put_item(e, NULL, 9, 48 * KIB, NULL), 0);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DEVICE);
    assert_item(e, &h2, 1, 16 * KIB);
    assert_int_equal(kvt_emb_release(e, &h2), 0);
    assert_int_equal(cache_stats(e).held, 0);
    kvt_close(e);
}

/* With host memory, what the device evicts stays on the host and comes back from there (the
 * same bytes); the host evicts least recently used first too. */
void test_host_copies(void **state)
{
    (void)state;
    struct emb_cfg cfg = {.device = 32 * KIB, .host = 96 * KIB};
    kvt_engine *e = emb_engine(&cfg);
    struct kvt_emb h;

    for (uint64_t id = 1; id <= 4; id++)
        assert_int_equal(put_item(e, NULL, id, 16 * KIB - 200, NULL), 0);
    /* Device: 3, 4. Host (a record takes 16 KiB there): 1 .. 4 with room for 6. */
    assert_int_equal(where(e, NULL, 1), KVT_EMB_HOST);
    assert_int_equal(where(e, NULL, 2), KVT_EMB_HOST);
    assert_int_equal(where(e, NULL, 4), KVT_EMB_DEVICE);
    assert_int_equal(fetch_item(e, NULL, 1, &h), 0);
    assert_int_equal(h.tier, KVT_EMB_HOST);
    assert_int_equal(h.op, 0);
    assert_item(e, &h, 1, 16 * KIB - 200);
    assert_int_equal(kvt_emb_release(e, &h), 0);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DEVICE);
    assert_int_equal(where(e, NULL, 3), KVT_EMB_HOST); /* made room for 1 */
    /* Host LRU order, oldest first: 2, 3, 4, 1; two more records evict 2 and 3. */
    assert_int_equal(put_item(e, NULL, 5, 16 * KIB - 200, NULL), 0);
    assert_int_equal(put_item(e, NULL, 6, 16 * KIB - 200, NULL), 0);
    assert_int_equal(put_item(e, NULL, 7, 16 * KIB - 200, NULL), 0);
    assert_int_equal(put_item(e, NULL, 8, 16 * KIB - 200, NULL), 0);
    assert_int_equal(where(e, NULL, 2), -ENOENT);
    assert_int_equal(where(e, NULL, 3), -ENOENT);
    assert_int_equal(where(e, NULL, 4), KVT_EMB_HOST);
    struct kvt_emb_stats st = cache_stats(e);
    assert_int_equal(st.hits[KVT_EMB_HOST], 1);
    assert_int_equal(st.evicted_host, 2);
    assert_int_equal(st.host_embeddings, 6);
    for (uint64_t id = 4; id <= 8; id++) {
        assert_int_equal(fetch_item(e, NULL, id, &h), 0);
        assert_item(e, &h, id, 16 * KIB - 200);
        assert_int_equal(kvt_emb_release(e, &h), 0);
    }
    kvt_close(e);
}

/* Records whose head and payload end just before, at and just after a chunk's edge, and of
 * one byte, come back exact through every tier (the host; the disk after a restart). */
void test_sizes(void **state)
{
    const char *dir = *state;
    const size_t chunk = 2048, head = 128;
    const size_t sizes[] = {
        1, chunk - head - 1, chunk - head, chunk - head + 1, 3 * chunk - head, 5 * chunk + 17};
    const size_t n = sizeof(sizes) / sizeof(sizes[0]);
    struct kvt_emb h;

    struct emb_cfg cfg = {.device = 64 * KIB, .host = 64 * KIB, .dir = dir};
    kvt_engine *e = emb_engine(&cfg);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(put_item(e, NULL, 100 + i, sizes[i], NULL), 0);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(cache_stats(e).stored, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(fetch_item(e, NULL, 100 + i, &h), 0);
        assert_item(e, &h, 100 + i, sizes[i]);
        assert_int_equal(kvt_emb_release(e, &h), 0);
    }
    kvt_close(e);
    e = emb_engine(&cfg);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(fetch_item(e, NULL, 100 + i, &h), 0);
        assert_int_equal(h.tier, KVT_EMB_DISK);
        assert_item(e, &h, 100 + i, sizes[i]);
        assert_int_equal(kvt_emb_release(e, &h), 0);
    }
    kvt_close(e);
}
