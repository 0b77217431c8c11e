/*
 * ctl_fixture: damages a data dir's index the ways kvtier-ctl must notice, for test_ctl.py
 * (built only for the tests; no engine may have the dir open). The slab files need no
 * helper: the test flips and truncates them itself.
 *
 *   ctl_fixture junk DIR HASH              HASH's record becomes bytes that fail its check
 *   ctl_fixture move DIR HASH SLAB SLOT    HASH's record, still well formed, names SLAB:SLOT
 *   ctl_fixture version DIR N              the meta record claims format version N, its
 *                                          check made again: a record of format N
 *   ctl_fixture metajunk DIR               a byte of the meta record's fingerprint flipped:
 *                                          the record fails its check, the LMDB file is sound
 *   ctl_fixture delete DIR HASH            delete HASH's page through the store (its
 *                                          descendants are left orphaned)
 *   ctl_fixture put DIR HASH PARENT NS T   write a page through the store under the key HASH,
 *                                          whatever its parent and tokens hash to (the store
 *                                          takes any key): parent PARENT, namespace root NS,
 *                                          every token T, bytes of zeros
 *   ctl_fixture tokens DIR HASH N          HASH's record, still well formed, holds N tokens
 *                                          (the first ones kept, then zeros)
 *   ctl_fixture create DIR FP MAP [FORMAT] a new dir as kvtier-bench's tiny geometry makes
 *                                          (pages of 16 tokens, 2 KiB), fingerprint FP (64 hex
 *                                          digits), 16384 slots, its index map MAP bytes (LMDB
 *                                          records it, and readers take it), in data format
 *                                          FORMAT (default: the current one)
 *   ctl_fixture grow DIR MAP N SEED        write N pages as the engine names them (chains of
 *                                          up to 32 from the default namespace's root, tokens
 *                                          drawn from SEED) by a writer whose index map is MAP
 *                                          bytes; a reader of the dir opened on a smaller map
 *                                          finds the index grown past it
 * HASH, PARENT and NS are 64 hex digits. Exit 0 on success, 1 on failure, 2 on bad usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "radix/hash.h"
#include "disk/index.h"
#include "disk/layout.h"
#include "disk/store.h"

#define GROW_BATCH 256u
#define GROW_CHAIN 32u

static int fail(const char *what, int rc)
{
    fprintf(stderr, "ctl_fixture: %s: %s\n", what, kvt_strerror(rc));
    return 1;
}

static int parse_key(const char *hex, uint8_t *key)
{
    if (strlen(hex) != 2 * DSTORE_KEY_BYTES)
        return -1;
    for (int i = 0; i < DSTORE_KEY_BYTES; i++)
        if (sscanf(hex + 2 * i, "%2hhx", &key[i]) != 1)
            return -1;
    return 0;
}

/* Open dir's index for writing and start a transaction. */
static int begin(const char *dir, struct dindex *ix, MDB_txn **txn)
{
    char path[4096];
    int rc;

    snprintf(path, sizeof(path), "%s/index", dir);
    if ((rc = index_open(ix, path, false, 256u << 20)))
        return fail("index_open", rc);
    if ((rc = index_err(mdb_txn_begin(ix->env, NULL, 0, txn)))) {
        index_close(ix);
        return fail("mdb_txn_begin", rc);
    }
    return 0;
}

static int end(struct dindex *ix, MDB_txn *txn, int rc)
{
    if (rc)
        mdb_txn_abort(txn);
    else if ((rc = index_err(mdb_txn_commit(txn))))
        fail("mdb_txn_commit", rc);
    index_close(ix);
    return rc ? 1 : 0;
}

/* Rewrite key's record with f applied to a copy of its value. */
static int rewrite(const char *dir, const uint8_t *key,
                   int (*f)(const uint8_t *key, uint8_t *val, size_t len, char **argv), char **argv)
{
    struct dindex ix = {0};
    MDB_txn *txn;
    MDB_val k = {DSTORE_KEY_BYTES, (void *)key}, v;
    uint8_t *copy = NULL;
    int rc = begin(dir, &ix, &txn);

    if (rc)
        return rc;
    if ((rc = index_err(mdb_get(txn, ix.pages, &k, &v))))
        fail("no such record", rc);
    else if (!(copy = malloc(v.mv_size)))
        rc = -ENOMEM;
    else {
        memcpy(copy, v.mv_data, v.mv_size);
        v.mv_data = copy;
        if (!(rc = f(key, copy, v.mv_size, argv)))
            rc = index_err(mdb_put(txn, ix.pages, &k, &v, 0));
    }
    rc = end(&ix, txn, rc);
    free(copy);
    return rc;
}

static int make_junk(const uint8_t *key, uint8_t *val, size_t len, char **argv)
{
    (void)key;
    (void)argv;
    for (size_t i = 4; i < len; i += 7)
        val[i] ^= 0x5a; /* the version stays: the record's own check must catch it */
    return 0;
}

static int move_slot(const uint8_t *key, uint8_t *val, size_t len, char **argv)
{
    struct drec r;
    uint32_t *tokens;
    int rc = rec_decode(key, val, len, &r);

    if (rc)
        return fail("rec_decode", rc);
    if (!(tokens = malloc((r.ntokens + 1) * sizeof(*tokens))))
        return -ENOMEM;
    for (uint32_t i = 0; i < r.ntokens; i++)
        memcpy(&tokens[i], r.tokens + 4 * (size_t)i, 4); /* little-endian hosts only */
    r.slab = (uint32_t)strtoul(argv[0], NULL, 10);
    r.slot = (uint32_t)strtoul(argv[1], NULL, 10);
    rec_encode(key, &r, tokens, val);
    free(tokens);
    return 0;
}

/* The meta record with its bytes from at on xor'ed with the n bytes of x; with seal, its check
 * made again (as the kvtier writing such a record would), else left stale. */
static int meta_xor(const char *dir, size_t at, const uint8_t *x, size_t n, bool seal)
{
    struct dindex ix = {0};
    MDB_txn *txn;
    MDB_val k = {6, (void *)"format"}, v;
    uint8_t buf[256];
    int rc = begin(dir, &ix, &txn);

    if (rc)
        return rc;
    if (!(rc = index_err(mdb_get(txn, ix.meta, &k, &v))) && v.mv_size <= sizeof(buf) &&
        at + n <= v.mv_size) {
        memcpy(buf, v.mv_data, v.mv_size);
        for (size_t i = 0; i < n; i++)
            buf[at + i] ^= x[i];
        if (seal)
            meta_seal(buf, v.mv_size);
        v.mv_data = buf;
        rc = index_err(mdb_put(txn, ix.meta, &k, &v, 0));
    }
    return end(&ix, txn, rc);
}

/* The version field (bytes 8-11, little-endian) set to version, in a record whose check holds:
 * what a kvtier of that format wrote. */
static int set_version(const char *dir, uint32_t version)
{
    uint8_t x[4];

    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(version >> (8 * i)) ^ (uint8_t)(DSTORE_FORMAT_VERSION >> (8 * i));
    return meta_xor(dir, 8, x, 4, true);
}

static int open_as_found(const char *dir, struct dstore **s)
{
    struct dstore_options o;
    int rc;

    dstore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.flags = DSTORE_AS_FOUND;
    o.disk_bytes = 0;
    if ((rc = dstore_open(&o, s)))
        return fail("dstore_open", rc);
    return 0;
}

static int delete_page(const char *dir, const uint8_t *key)
{
    struct dstore *s;
    size_t n = 0;
    int rc;

    if ((rc = open_as_found(dir, &s)))
        return 1;
    if ((rc = dstore_delete(s, key, 1, &n)) || n != 1)
        fail("dstore_delete", rc ? rc : -ENOENT);
    dstore_close(s);
    return rc || n != 1;
}

static int set_tokens(const char *dir, const uint8_t *key, uint32_t ntokens)
{
    struct dindex ix = {0};
    MDB_txn *txn;
    MDB_val k = {DSTORE_KEY_BYTES, (void *)key}, v;
    struct drec r;
    uint32_t *tokens = NULL;
    uint8_t *val = NULL;
    int rc = begin(dir, &ix, &txn);

    if (rc)
        return rc;
    if ((rc = index_err(mdb_get(txn, ix.pages, &k, &v))))
        fail("no such record", rc);
    else if ((rc = rec_decode(key, v.mv_data, v.mv_size, &r)))
        fail("rec_decode", rc);
    else if (!(tokens = calloc(ntokens + 1, sizeof(*tokens))) ||
             !(val = malloc(rec_bytes(ntokens))))
        rc = -ENOMEM;
    else {
        for (uint32_t i = 0; i < r.ntokens && i < ntokens; i++)
            memcpy(&tokens[i], r.tokens + 4 * (size_t)i, 4); /* little-endian hosts only */
        r.ntokens = ntokens;
        rec_encode(key, &r, tokens, val);
        v = (MDB_val){rec_bytes(ntokens), val};
        rc = index_err(mdb_put(txn, ix.pages, &k, &v, 0));
    }
    rc = end(&ix, txn, rc);
    free(tokens);
    free(val);
    return rc;
}

/* A page under a key of our choosing: argv is PARENT NS T. */
static int put_page(const char *dir, const uint8_t *key, char **argv)
{
    uint8_t parent[DSTORE_KEY_BYTES], ns[DSTORE_NS_BYTES];
    struct dstore_info in;
    struct dstore *s;
    uint32_t *tokens = NULL;
    void *buf = NULL;
    int res = 0, rc;

    if (parse_key(argv[0], parent) || parse_key(argv[1], ns)) {
        fprintf(stderr, "ctl_fixture put: PARENT and NS are 64 hex digits\n");
        return 2;
    }
    if ((rc = open_as_found(dir, &s)))
        return rc;
    dstore_info(s, &in);
    if (!(tokens = malloc(in.page_tokens * sizeof(*tokens))) ||
        posix_memalign(&buf, 4096, in.slot_bytes)) {
        rc = fail("put", -ENOMEM);
    } else {
        struct dstore_wpage w = {
            .key = key, .parent = parent, .ns = ns, .tokens = tokens, .buf = buf};

        for (uint32_t i = 0; i < in.page_tokens; i++)
            tokens[i] = (uint32_t)strtoul(argv[2], NULL, 10);
        memset(buf, 0, in.slot_bytes);
        if ((rc = dstore_put(s, &w, 1, &res)) || res)
            rc = fail("dstore_put", rc ? rc : res);
    }
    dstore_close(s);
    free(tokens);
    free(buf);
    return rc ? 1 : 0;
}

/* Pages to write in one batch: keys chained as the engine chains them, bytes of the key. */
struct grower {
    struct dstore_info in;
    struct page_hasher h;
    uint8_t root[DSTORE_KEY_BYTES];
    uint8_t (*keys)[DSTORE_KEY_BYTES];
    uint32_t *tokens;
    uint8_t *buf;
    struct dstore_wpage w[GROW_BATCH];
    int res[GROW_BATCH];
    uint64_t x; /* the token stream's state */
};

static uint32_t next_token(struct grower *g)
{
    g->x = g->x * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g->x >> 33) % 128000u;
}

/* Page k of the batch: the next in its chain (the first of a chain hangs from the root). */
static int grow_page(struct grower *g, uint32_t k, bool first)
{
    uint32_t pt = g->in.page_tokens;
    uint32_t *t = g->tokens + (size_t)k * pt;
    const uint8_t *parent = first ? g->root : g->keys[k - 1];
    uint8_t *buf = g->buf + (size_t)k * g->in.slot_bytes;

    for (uint32_t i = 0; i < pt; i++)
        t[i] = next_token(g);
    if (page_hash_next(&g->h, parent, t, pt, g->keys[k]))
        return -EIO;
    for (uint32_t i = 0; i < g->in.page_bytes; i++)
        buf[i] = g->keys[k][i % DSTORE_KEY_BYTES];
    g->w[k] = (struct dstore_wpage){
        .key = g->keys[k], .parent = parent, .ns = g->root, .tokens = t, .buf = buf};
    return 0;
}

static int grow_batches(struct dstore *s, struct grower *g, uint64_t n)
{
    int rc = 0;

    for (uint64_t done = 0; done < n && !rc;) {
        uint32_t m = n - done < GROW_BATCH ? (uint32_t)(n - done) : GROW_BATCH;

        for (uint32_t k = 0; k < m && !rc; k++)
            rc = grow_page(g, k, k % GROW_CHAIN == 0);
        if (!rc && !(rc = dstore_put(s, g->w, m, g->res)))
            for (uint32_t k = 0; k < m && !rc; k++)
                rc = g->res[k];
        done += m;
    }
    return rc;
}

#define CREATE_SLOTS 16384

static int create(const char *dir, const char *fp, uint64_t map, uint32_t format)
{
    struct dstore_options o;
    struct slot_layout l;
    struct dstore *s;
    int rc;

    dstore_options_init(&o, sizeof(o));
    o.dir = dir;
    if (parse_key(fp, o.fingerprint))
        return 2;
    o.page_bytes = 2048;
    o.page_tokens = 16;
    o.format = format;
    if (layout_init(&l, o.page_bytes, o.page_tokens, format ? format : DSTORE_FORMAT_VERSION))
        return 2;
    o.disk_bytes = o.slab_bytes = CREATE_SLOTS * (uint64_t)l.slot_bytes;
    o.map_bytes = map;
    if ((rc = dstore_open(&o, &s)) || (rc = dstore_wait_ready(s)))
        return fail("dstore_open", rc);
    dstore_close(s);
    return 0;
}

static int grow(const char *dir, uint64_t map, uint64_t n, uint64_t seed)
{
    struct dstore_options o;
    struct grower g = {.x = seed};
    struct dstore *s;
    int rc;

    dstore_options_init(&o, sizeof(o));
    o.dir = dir;
    o.flags = DSTORE_AS_FOUND;
    o.disk_bytes = 0;
    o.map_bytes = map;
    if ((rc = dstore_open(&o, &s)))
        return fail("dstore_open", rc);
    dstore_info(s, &g.in);
    g.keys = malloc(GROW_BATCH * sizeof(*g.keys));
    g.tokens = malloc((size_t)GROW_BATCH * g.in.page_tokens * sizeof(*g.tokens));
    if (!g.keys || !g.tokens ||
        posix_memalign((void **)&g.buf, 4096, (size_t)GROW_BATCH * g.in.slot_bytes))
        rc = -ENOMEM;
    else if (!(rc = page_hasher_init(&g.h))) {
        if (!(rc = page_hash_root(&g.h, g.in.fingerprint, NULL, 0, g.root)))
            rc = grow_batches(s, &g, n);
        page_hasher_finish(&g.h);
    }
    dstore_close(s);
    free(g.keys);
    free(g.tokens);
    free(g.buf);
    return rc ? fail("grow", rc) : 0;
}

int main(int argc, char **argv)
{
    uint8_t key[DSTORE_KEY_BYTES];
    const char *cmd = argc > 2 ? argv[1] : "";

    if (!strcmp(cmd, "create") && (argc == 5 || argc == 6))
        return create(argv[2], argv[3], strtoull(argv[4], NULL, 10),
                      argc == 6 ? (uint32_t)strtoul(argv[5], NULL, 10) : 0);
    if (!strcmp(cmd, "grow") && argc == 6)
        return grow(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10),
                    strtoull(argv[5], NULL, 10));
    if (!strcmp(cmd, "metajunk") && argc == 3)
        return meta_xor(argv[2], 40, (const uint8_t[]){0x5a}, 1, false);
    if (!strcmp(cmd, "version") && argc == 4)
        return set_version(argv[2], (uint32_t)strtoul(argv[3], NULL, 10));
    if (argc < 4 || parse_key(argv[3], key)) {
        fprintf(stderr, "usage: ctl_fixture "
                        "junk|move|version|metajunk|delete|put|tokens|create|grow DIR ...\n");
        return 2;
    }
    if (!strcmp(cmd, "junk") && argc == 4)
        return rewrite(argv[2], key, make_junk, argv + 4);
    if (!strcmp(cmd, "move") && argc == 6)
        return rewrite(argv[2], key, move_slot, argv + 4);
    if (!strcmp(cmd, "delete") && argc == 4)
        return delete_page(argv[2], key);
    if (!strcmp(cmd, "put") && argc == 7)
        return put_page(argv[2], key, argv + 4);
    if (!strcmp(cmd, "tokens") && argc == 5)
        return set_tokens(argv[2], key, (uint32_t)strtoul(argv[4], NULL, 10));
    fprintf(stderr, "ctl_fixture: unknown command or wrong arguments: %s\n", cmd);
    return 2;
}
