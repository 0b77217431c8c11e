/* The embedding cache below memory: the engine's disk tier (reads as ops, a restart, damage),
 * an engine that keeps embeddings out of its stores, and a real redis-server shared by two
 * engines. */
#include "emb_test.h"

#include <dirent.h>
#include <pthread.h>

#include "emb/format.h"
#include "engine/engine.h"
#include "disk/ops.h"
#include "disk/store.h"

#ifdef KVT_HAVE_REDIS
#include "redis_server.h"
#endif

#define KIB 1024u

static struct kvt_emb_key key_of(uint8_t *hash, uint64_t id)
{
    item_hash(id, hash);
    return (struct kvt_emb_key){hash, NULL, 0};
}

/* Drop item id from the device and the host, so only the tiers below have it. */
static void drop(kvt_engine *e, uint64_t id)
{
    uint8_t hash[32];
    struct kvt_emb_key k = key_of(hash, id);

    assert_int_equal(kvt_emb_drop(e, &k), 0);
}

/* Reads from the disk are ops: fetch names one, wait lands it (the same bytes), a second
 * fetch meanwhile joins it; afterwards the embedding is on the device and the host again. */
void test_disk_tier(void **state)
{
    const char *dir = *state;
    struct kvt_emb a, b;
    uint8_t hash[32];

    struct emb_cfg cfg = {.device = 64 * KIB, .host = 64 * KIB, .dir = dir};
    kvt_engine *e = emb_engine(&cfg);
    assert_int_equal(put_item(e, NULL, 1, 20 * KIB, NULL), 0);
    assert_int_equal(put_item(e, NULL, 2, 3 * KIB, NULL), 0);
    assert_int_equal(put_item(e, "lora-7", 1, 5 * KIB, NULL), 0);
    /* A drop waits for nothing: while the write reads the host copy it is busy. */
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(cache_stats(e).stored, 3);
    assert_int_equal(cache_stats(e).ops_in_flight, 0);
    drop(e, 1);
    drop(e, 2);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DISK);
    struct kvt_emb_key k = key_of(hash, 1);
    uint32_t tier = 9;
    size_t len = 9;
    assert_int_equal(kvt_emb_lookup(e, &k, &tier, &len), 0);
    assert_int_equal(tier, KVT_EMB_DISK);
    assert_int_equal(len, 0); /* the head is not read by a lookup */
    assert_int_equal(kvt_emb_fetch(e, &k, &a), 0);
    assert_int_equal(a.tier, KVT_EMB_DISK);
    assert_true(a.op != 0);
    assert_null(a.ptr);
    assert_int_equal(kvt_emb_read(e, &a, 0, hash, 1), -EAGAIN);
    /* Joins the read, or finds it landed already (each call applies what has finished). */
    assert_int_equal(kvt_emb_fetch(e, &k, &b), 0);
    assert_true(b.op == a.op || (b.op == 0 && b.ptr && b.len == 20 * KIB));
    assert_int_equal(kvt_emb_drop(e, &k), -EBUSY);
    assert_int_equal(kvt_emb_wait(e, &a, -1), 0);
    assert_int_equal(a.op, 0);
    assert_item(e, &a, 1, 20 * KIB);
    assert_int_equal(kvt_emb_wait(e, &b, 0), 0);
    assert_item(e, &b, 1, 20 * KIB);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    assert_int_equal(kvt_emb_release(e, &b), 0);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DEVICE);
    /* The other namespace's item 1 is another embedding, untouched. */
    assert_int_equal(fetch_item(e, "lora-7", 1, &a), 0);
    assert_int_equal(a.tier, KVT_EMB_DEVICE);
    assert_item(e, &a, 1, 5 * KIB);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    /* A fetch released before its read lands: the embedding lands all the same, unheld. */
    item_hash(2, hash);
    assert_int_equal(kvt_emb_fetch(e, &k, &a), 0);
    assert_int_equal(a.tier, KVT_EMB_DISK);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(where(e, NULL, 2), KVT_EMB_DEVICE);
    struct kvt_emb_stats st = cache_stats(e);
    assert_int_equal(st.hits[KVT_EMB_DISK], 2);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.ops_in_flight, 0);
    kvt_close(e);
}

/* What was put survives a restart, and so do namespaces; what was never put is a miss. */
void test_restart(void **state)
{
    const char *dir = *state;
    struct kvt_emb h;

    struct emb_cfg cfg = {.device = 64 * KIB, .dir = dir};
    kvt_engine *e = emb_engine(&cfg);
    for (uint64_t id = 1; id <= 20; id++)
        assert_int_equal(put_item(e, id % 2 ? NULL : "salt", id, 7 * KIB + id, NULL), 0);
    kvt_close(e);
    e = emb_engine(&cfg);
    assert_int_equal(cache_stats(e).device_embeddings, 0);
    for (uint64_t id = 1; id <= 20; id++) {
        const char *ns = id % 2 ? NULL : "salt";
        assert_int_equal(fetch_item(e, ns, id, &h), 0);
        assert_int_equal(h.tier, KVT_EMB_DISK);
        assert_item(e, &h, id, 7 * KIB + id);
        assert_int_equal(kvt_emb_release(e, &h), 0);
        assert_int_equal(where(e, id % 2 ? "salt" : NULL, id), -ENOENT);
    }
    assert_int_equal(fetch_item(e, NULL, 99, &h), -ENOENT);
    kvt_close(e);
}

/* Flip bytes in every slab file's pages: the records fail the store's checks, and each
 * fetch of them is a miss (KVT_ECORRUPT from wait, the hold gone), never bytes. */
static void damage_slabs(const char *dir)
{
    char path[512];
    struct dirent *d;
    DIR *sd;
    uint64_t slot = fixture_disk_slot(2048, 4); /* the pages are below a block: packed */

    snprintf(path, sizeof(path), "%s/slabs", dir);
    assert_non_null(sd = opendir(path));
    while ((d = readdir(sd)))
        if (strstr(d->d_name, ".slab")) {
            snprintf(path, sizeof(path), "%s/slabs/%s", dir, d->d_name);
            for (uint64_t off = 4096 + 100; off < 4096 + 64 * slot; off += slot)
                assert_int_equal(fixture_flip_bytes(path, off, 8), 0);
        }
    closedir(sd);
}

void test_damaged_on_disk(void **state)
{
    const char *dir = *state;
    struct kvt_emb a;
    uint8_t hash[32];

    struct emb_cfg cfg = {.device = 64 * KIB, .dir = dir};
    kvt_engine *e = emb_engine(&cfg);
    assert_int_equal(put_item(e, NULL, 1, 9 * KIB, NULL), 0);
    assert_int_equal(put_item(e, NULL, 2, 100, NULL), 0);
    kvt_close(e);
    damage_slabs(dir);
    e = emb_engine(&cfg);
    struct kvt_emb_key k = key_of(hash, 1);
    assert_int_equal(kvt_emb_fetch(e, &k, &a), 0);
    assert_int_equal(kvt_emb_wait(e, &a, -1), KVT_ECORRUPT);
    assert_int_equal(a.handle, 0);
    assert_null(a.ptr);
    assert_int_equal(kvt_emb_release(e, &a), -EINVAL); /* nothing left to release */
    assert_int_equal(fetch_item(e, NULL, 2, &a), KVT_ECORRUPT);
    struct kvt_emb_stats st = cache_stats(e);
    assert_int_equal(st.read_errors, 2);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.device_used, 0);
    /* The damaged chunks were dropped from the dir: the next fetch is a plain miss, and the
     * item can be put again and read back whole. */
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(fetch_item(e, NULL, 2, &a), -ENOENT);
    assert_int_equal(put_item(e, NULL, 2, 100, NULL), 0);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_emb_drop(e, &(struct kvt_emb_key){hash, NULL, 0}), -ENOENT);
    item_hash(2, hash);
    assert_int_equal(kvt_emb_drop(e, &(struct kvt_emb_key){hash, NULL, 0}), 0);
    assert_int_equal(fetch_item(e, NULL, 2, &a), 0);
    assert_int_equal(a.tier, KVT_EMB_DISK);
    assert_item(e, &a, 2, 100);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    kvt_close(e);
}

/* A record the dir holds in part (a chunk deleted) is a miss (-ENOENT) found by its head; one
 * whose chunks come from two puts of different bytes under one hash (each chunk sound, the
 * whole not) fails the record's own checksum (KVT_ECORRUPT). */
void test_mixed_record(void **state)
{
    const char *dir = *state;
    struct dstore_options so;
    struct dstore *ds;
    struct page_hasher ph;
    uint8_t hash[32], nsd[32] = {0}, digest[32], key[32];
    size_t deleted = 0;
    struct kvt_emb h;

    struct emb_cfg cfg = {.device = 64 * KIB, .dir = dir};
    kvt_engine *e = emb_engine(&cfg);
    assert_int_equal(put_item(e, NULL, 1, 5000, NULL), 0); /* 3 chunks */
    engine_disk_options(e, &so);
    kvt_close(e);
    /* Chunk 1 of item 1 out of the dir. */
    item_hash(1, hash);
    assert_int_equal(page_hasher_init(&ph), 0);
    assert_int_equal(emb_digest(&ph, nsd, hash, digest), 0);
    assert_int_equal(emb_chunk_key(&ph, digest, 1, key), 0);
    page_hasher_finish(&ph);
    assert_int_equal(dstore_open(&so, &ds), 0);
    assert_int_equal(dstore_delete(ds, key, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    dstore_close(ds);
    e = emb_engine(&cfg);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DISK);
    assert_int_equal(fetch_item(e, NULL, 1, &h), -ENOENT);
    assert_int_equal(cache_stats(e).read_errors, 0);
    /* Other bytes of the same length under the same hash: chunks 0 and 2 are there already
     * (the store keeps them), chunk 1 is the new one's. */
    uint8_t *other = malloc(5000);
    assert_non_null(other);
    item_bytes(2, other, 5000);
    struct kvt_emb_key k = {hash, NULL, 0};
    assert_int_equal(kvt_emb_put(e, &k, other, 5000, NULL), 0);
    free(other);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(kvt_emb_drop(e, &k), 0);
    assert_int_equal(fetch_item(e, NULL, 1, &h), KVT_ECORRUPT);
    assert_int_equal(cache_stats(e).read_errors, 1);
    kvt_close(e);
}

/* Reads held at a gate (the disk store's fault seam) until the test opens it, then let
 * through or failed with -EIO. */
struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool open;
    int rc;
};

static int gate_read(void *arg, enum dstore_fault_point point, uint32_t slab, uint32_t slot)
{
    struct gate *g = arg;
    int rc;

    (void)slab;
    (void)slot;
    if (point != DSTORE_FAULT_READ)
        return 0;
    pthread_mutex_lock(&g->lock);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    rc = g->rc;
    pthread_mutex_unlock(&g->lock);
    return rc;
}

static void gate_set(struct gate *g, bool open, int rc)
{
    pthread_mutex_lock(&g->lock);
    g->open = open;
    g->rc = rc;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

/* Two fetches of an embedding whose read is under way share it: both land, or both miss
 * (-EIO, the record kept: an I/O error is not damage); a hold let go before its read lands
 * leaves nothing behind. */
void test_joined_reads(void **state)
{
    const char *dir = *state;
    struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, true, 0};
    struct dstore_faults faults = {gate_read, &g};
    struct dstore_options so;
    struct kvt_options o;
    struct kvt_store *s;
    kvt_engine *e;
    struct kvt_emb a, b;
    uint8_t hash[32];

    struct emb_cfg cfg = {.device = 64 * KIB, .dir = dir};
    e = emb_engine(&cfg);
    assert_int_equal(put_item(e, NULL, 1, 6000, NULL), 0);
    assert_int_equal(put_item(e, NULL, 2, 700, NULL), 0);
    engine_disk_options(e, &so);
    kvt_close(e);
    so.faults = &faults;
    assert_int_equal(store_disk_open(&so, &s), 0);
    emb_options(&cfg, &o);
    assert_int_equal(engine_open(&o, s, &e), 0);
    struct kvt_emb_key k = key_of(hash, 1);
    gate_set(&g, false, 0);
    assert_int_equal(kvt_emb_fetch(e, &k, &a), 0);
    assert_int_equal(kvt_emb_fetch(e, &k, &b), 0);
    assert_true(a.op != 0);
    assert_int_equal(b.op, a.op);
    assert_int_equal(kvt_emb_wait(e, &a, 0), -ETIMEDOUT);
    assert_int_equal(kvt_emb_wait(e, &a, 20), -ETIMEDOUT);
    assert_int_equal(cache_stats(e).ops_in_flight, 1);
    gate_set(&g, true, 0);
    assert_int_equal(kvt_emb_wait(e, &a, -1), 0);
    assert_int_equal(kvt_emb_wait(e, &b, -1), 0);
    assert_item(e, &a, 1, 6000);
    assert_item(e, &b, 1, 6000);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    assert_int_equal(kvt_emb_release(e, &b), 0);
    /* Failed reads: both holders learn it; one let go first learns nothing. */
    assert_int_equal(kvt_emb_drop(e, &k), 0);
    gate_set(&g, false, -EIO);
    assert_int_equal(kvt_emb_fetch(e, &k, &a), 0);
    assert_int_equal(kvt_emb_fetch(e, &k, &b), 0);
    assert_int_equal(b.op, a.op);
    assert_int_equal(kvt_emb_release(e, &b), 0);
    gate_set(&g, true, -EIO);
    assert_int_equal(kvt_emb_wait(e, &a, -1), -EIO);
    assert_int_equal(a.handle, 0);
    struct kvt_emb_stats st = cache_stats(e);
    assert_int_equal(st.read_errors, 1);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.device_used, 0);
    item_hash(2, hash); /* in no memory of this engine: the disk's */
    assert_int_equal(kvt_emb_drop(e, &k), -ENOENT);
    gate_set(&g, false, -EIO);
    assert_int_equal(kvt_emb_fetch(e, &k, &a), 0);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    gate_set(&g, true, -EIO);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(cache_stats(e).device_used, 0);
    assert_int_equal(where(e, NULL, 2), KVT_EMB_DISK); /* the record stays */
    gate_set(&g, true, 0);
    assert_int_equal(fetch_item(e, NULL, 2, &a), 0);
    assert_item(e, &a, 2, 700);
    assert_int_equal(kvt_emb_release(e, &a), 0);
    kvt_close(e);
}

/* A record longer than this engine's device budget (another engine with a larger one wrote
 * it, in as many chunks as the budget's) is a miss, never a copy past the device extent. */
void test_longer_than_budget(void **state)
{
    const char *dir = *state;
    struct kvt_emb h;

    struct emb_cfg big = {.device = 64 * KIB, .dir = dir}, small = {.device = 32 * KIB, .dir = dir};
    kvt_engine *e = emb_engine(&big);
    assert_int_equal(put_item(e, NULL, 1, 33000, NULL), 0); /* 17 chunks, as 32 KiB's */
    assert_int_equal(put_item(e, NULL, 2, 32 * KIB, NULL), 0);
    kvt_close(e);
    e = emb_engine(&small);
    assert_int_equal(where(e, NULL, 1), KVT_EMB_DISK);
    assert_int_equal(fetch_item(e, NULL, 1, &h), -ENOENT);
    assert_int_equal(cache_stats(e).device_used, 0);
    assert_int_equal(fetch_item(e, NULL, 2, &h), 0); /* the whole budget: served */
    assert_item(e, &h, 2, 32 * KIB);
    assert_int_equal(kvt_emb_release(e, &h), 0);
    kvt_close(e);
}

/* emb_store NONE: the disk tier keeps KV, not embeddings; a restart finds none. */
void test_no_store(void **state)
{
    const char *dir = *state;
    struct kvt_emb h;

    struct emb_cfg cfg = {.device = 64 * KIB, .dir = dir, .store = KVT_EMB_STORE_NONE};
    kvt_engine *e = emb_engine(&cfg);
    assert_int_equal(put_item(e, NULL, 1, 4 * KIB, NULL), 0);
    assert_int_equal(kvt_sync(e), 0);
    assert_int_equal(cache_stats(e).stored, 0);
    kvt_close(e);
    e = emb_engine(&cfg);
    assert_int_equal(fetch_item(e, NULL, 1, &h), -ENOENT);
    kvt_close(e);
}

/* Two engines on one redis-server: what one puts, the other reads from the remote tier (the
 * same bytes); with a disk tier too, the disk serves what it has and the remote the rest. */
#ifdef KVT_HAVE_REDIS
static struct redis_server rs; /* stopped by remote_teardown, pass or fail */

int remote_teardown(void **state)
{
    if (rs.pid)
        redis_server_stop(&rs);
    memset(&rs, 0, sizeof(rs));
    return dir_teardown(state);
}
#else
int remote_teardown(void **state)
{
    return dir_teardown(state);
}
#endif

void test_remote_shared(void **state)
{
    const char *dir = *state;
#ifdef KVT_HAVE_REDIS
    char url[64];
    struct kvt_emb h;

    if (!redis_server_installed())
        skip();
    assert_int_equal(redis_server_start(&rs, 0), 0);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%u", rs.port);
    struct emb_cfg ca = {.device = 64 * KIB, .remote = url};
    struct emb_cfg cb = {.device = 64 * KIB, .dir = dir, .remote = url};
    kvt_engine *a = emb_engine(&ca), *b = emb_engine(&cb);
    assert_int_equal(put_item(a, NULL, 1, 12 * KIB, NULL), 0);
    assert_int_equal(put_item(b, NULL, 2, 3 * KIB, NULL), 0);
    assert_int_equal(kvt_sync(a), 0);
    assert_int_equal(kvt_sync(b), 0);
    assert_int_equal(cache_stats(a).stored, 1);
    assert_int_equal(where(b, NULL, 1), KVT_EMB_REMOTE);
    assert_int_equal(fetch_item(b, NULL, 1, &h), 0);
    assert_int_equal(h.tier, KVT_EMB_REMOTE);
    assert_item(b, &h, 1, 12 * KIB);
    assert_int_equal(kvt_emb_release(b, &h), 0);
    assert_int_equal(fetch_item(a, NULL, 2, &h), 0);
    assert_int_equal(h.tier, KVT_EMB_REMOTE);
    assert_item(a, &h, 2, 3 * KIB);
    assert_int_equal(kvt_emb_release(a, &h), 0);
    /* b's own put went to its disk as well: after a restart the disk serves it. */
    kvt_close(b);
    b = emb_engine(&cb);
    assert_int_equal(fetch_item(b, NULL, 2, &h), 0);
    assert_int_equal(h.tier, KVT_EMB_DISK);
    assert_item(b, &h, 2, 3 * KIB);
    assert_int_equal(kvt_emb_release(b, &h), 0);
    assert_int_equal(cache_stats(b).hits[KVT_EMB_DISK], 1);
    /* An emptied server costs only hits. */
    const char *flush[] = {"FLUSHALL"};
    uint8_t hash[32];
    assert_int_equal(redis_server_cmd(&rs, 1, flush, NULL), 0);
    assert_int_equal(kvt_emb_drop(a, &(struct kvt_emb_key){(item_hash(2, hash), hash), NULL, 0}),
                     0);
    assert_int_equal(fetch_item(a, NULL, 2, &h), -ENOENT);
    assert_int_equal(where(a, NULL, 1), KVT_EMB_DEVICE);
    kvt_close(a);
    kvt_close(b);
#else
    (void)dir;
    skip();
#endif
}
