/*
 * The index's formats and environment (see index.h).
 *
 * LMDB flags: MDB_NOTLS, so a read transaction is tied to its handle rather than a thread
 * (the owner and the committer each keep their own); MDB_NORDAHEAD, since lookups are random
 * and read-ahead would only evict useful pages. An index is created with fully synchronous
 * commits; a writer then commits with MDB_NOMETASYNC (durable mode: each commit flushes the
 * file once, and its meta page reaches the disk with the next commit's flush or
 * index_flush, so a power cut may undo the last commit and never breaks the tree) or
 * MDB_NOSYNC (relaxed mode: nothing is flushed but by index_flush, and a power cut may leave
 * a tree the open's walk (trust.c) finds damaged). Which commits must be durable before the
 * store goes on is the store's business (records.c).
 */
#include "index.h"
#include "le.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#ifdef KVT_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* XXH3_128bits: the widest vector unit this CPU has */
#endif

#define META_KEY "format"
#define META_MAGIC "KVTIERDS"
#define CHECK_SEED 0x6b7674696572ull /* "kvtier": a record check is not a bare XXH3 */

/* ---- checksums ---- */

void page_checksum(const void *buf, size_t len, uint8_t out[16])
{
    XXH128_canonical_t c;

    XXH128_canonicalFromHash(&c, XXH3_128bits(buf, len));
    memcpy(out, c.digest, 16);
}

void page_checksum_parts(const void *const *parts, size_t n, size_t len, uint8_t out[16])
{
    XXH3_state_t st;
    XXH128_canonical_t c;

    XXH3_128bits_reset(&st);
    for (size_t i = 0; i < n; i++)
        XXH3_128bits_update(&st, parts[i], len);
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
    memcpy(out, c.digest, 16);
}

void page_hash_start(page_hash *h)
{
    XXH3_128bits_reset(h);
}

void page_hash_add(page_hash *h, const void *bytes, size_t n)
{
    XXH3_128bits_update(h, bytes, n);
}

void page_hash_end(page_hash *h, uint8_t out[16])
{
    XXH128_canonical_t c;

    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h));
    memcpy(out, c.digest, 16);
}

uint64_t value_digest(const void *val, size_t len)
{
    return XXH3_64bits(val, len);
}

/* The record's check covers its key, so a valid value stored under another key fails. */
static uint64_t rec_check(const uint8_t *key, const uint8_t *val, size_t len)
{
    XXH3_state_t st;
    uint8_t zero[8] = {0};

    XXH3_INITSTATE(&st);
    XXH3_64bits_reset_withSeed(&st, CHECK_SEED);
    XXH3_64bits_update(&st, key, DSTORE_KEY_BYTES);
    XXH3_64bits_update(&st, val, 120);
    XXH3_64bits_update(&st, zero, sizeof(zero));
    XXH3_64bits_update(&st, val + REC_HEAD_BYTES, len - REC_HEAD_BYTES);
    return XXH3_64bits_digest(&st);
}

/* ---- records ---- */

size_t rec_bytes(uint32_t ntokens)
{
    return REC_HEAD_BYTES + (size_t)ntokens * 4;
}

void rec_encode(const uint8_t *key, const struct drec *r, const uint32_t *tokens, uint8_t *out)
{
    size_t len = rec_bytes(r->ntokens);

    memset(out, 0, REC_HEAD_BYTES);
    put32(out, DSTORE_RECORD_VERSION);
    put32(out + 4, r->slab);
    put32(out + 8, r->slot);
    put32(out + 12, r->length);
    memcpy(out + 16, r->sum, 16);
    memcpy(out + 32, r->parent, DSTORE_KEY_BYTES);
    memcpy(out + 64, r->ns, DSTORE_NS_BYTES);
    put64(out + 96, r->created);
    put64(out + 104, r->last_access);
    put32(out + 112, r->ntokens);
    for (uint32_t i = 0; i < r->ntokens; i++)
        put32(out + REC_HEAD_BYTES + 4 * (size_t)i, tokens ? tokens[i] : 0);
    put64(out + 120, rec_check(key, out, len));
}

int rec_decode(const uint8_t *key, const void *val, size_t len, struct drec *r)
{
    const uint8_t *v = val;

    if (len < REC_HEAD_BYTES || get32(v) != DSTORE_RECORD_VERSION)
        return KVT_ECORRUPT;
    r->ntokens = get32(v + 112);
    if (r->ntokens > DSTORE_MAX_TOKENS || len != rec_bytes(r->ntokens))
        return KVT_ECORRUPT;
    if (get64(v + 120) != rec_check(key, v, len))
        return KVT_ECORRUPT;
    r->slab = get32(v + 4);
    r->slot = get32(v + 8);
    r->length = get32(v + 12);
    memcpy(r->sum, v + 16, 16);
    memcpy(r->parent, v + 32, DSTORE_KEY_BYTES);
    memcpy(r->ns, v + 64, DSTORE_NS_BYTES);
    r->created = get64(v + 96);
    r->last_access = get64(v + 104);
    r->tokens = v + REC_HEAD_BYTES;
    return 0;
}

/* ---- the slot table ---- */

uint64_t key_tag(const uint8_t *key)
{
    uint64_t t = get64(key);

    return t ? t : 1;
}

uint64_t parent_tag(const uint8_t *parent)
{
    static const uint8_t none[DSTORE_KEY_BYTES];

    return memcmp(parent, none, DSTORE_KEY_BYTES) ? key_tag(parent) : 0;
}

int slot_put_tag(struct dindex *ix, MDB_txn *txn, uint32_t g, const uint8_t *key, uint64_t atime,
                 uint64_t ptag)
{
    uint8_t buf[SLOT_ENTRY_BYTES];
    unsigned int slot = g;
    MDB_val k = {sizeof(slot), &slot}, v = {sizeof(buf), buf};

    memcpy(buf, key, DSTORE_KEY_BYTES);
    put64(buf + DSTORE_KEY_BYTES, atime);
    put64(buf + DSTORE_KEY_BYTES + 8, ptag);
    return index_err(mdb_put(txn, ix->slots, &k, &v, 0));
}

int slot_put(struct dindex *ix, MDB_txn *txn, uint32_t g, const uint8_t *key, uint64_t atime,
             const uint8_t *parent)
{
    return slot_put_tag(ix, txn, g, key, atime, parent ? parent_tag(parent) : 0);
}

int slot_del(struct dindex *ix, MDB_txn *txn, uint32_t g)
{
    unsigned int slot = g;
    MDB_val k = {sizeof(slot), &slot};
    int rc = mdb_del(txn, ix->slots, &k, NULL);

    return rc == MDB_NOTFOUND ? 0 : index_err(rc);
}

int slot_decode(const MDB_val *k, const MDB_val *v, struct slot_entry *e)
{
    unsigned int slot;

    if (k->mv_size != sizeof(slot) || v->mv_size != SLOT_ENTRY_BYTES)
        return KVT_ECORRUPT;
    memcpy(&slot, k->mv_data, sizeof(slot));
    e->g = slot;
    e->key = v->mv_data;
    e->atime = get64((const uint8_t *)v->mv_data + DSTORE_KEY_BYTES);
    e->parent = get64((const uint8_t *)v->mv_data + DSTORE_KEY_BYTES + 8);
    return 0;
}

/* ---- meta ---- */

#define META_HEAD_BYTES 12 /* the magic and the version: where every format's record starts */
#define META_CHECK_BYTES 8 /* the check every format's record ends with */

static uint64_t meta_check(const uint8_t *rec, size_t len)
{
    return XXH3_64bits_withSeed(rec, len - META_CHECK_BYTES, CHECK_SEED);
}

void meta_seal(uint8_t *rec, size_t len)
{
    put64(rec + len - META_CHECK_BYTES, meta_check(rec, len));
}

static void meta_encode(const struct dmeta *m, uint8_t *out)
{
    memset(out, 0, META_BYTES);
    memcpy(out, META_MAGIC, 8);
    put32(out + 8, m->version);
    put32(out + 12, m->page_bytes);
    put32(out + 16, m->page_tokens);
    put32(out + 20, m->slot_bytes);
    put32(out + 24, m->slab_slots);
    memcpy(out + 32, m->fingerprint, DSTORE_FINGERPRINT_BYTES);
    put64(out + 64, m->created);
    meta_seal(out, META_BYTES);
}

/* The check first: a bit flipped in the magic or the version must not pass for a format this
 * build cannot read, which would leave a damaged index of ours unrepaired. Only then the magic
 * and the version, since a newer format may lay out the rest differently. */
static enum index_verdict meta_verdict(const uint8_t *v, size_t len, uint32_t *version)
{
    *version = len >= META_HEAD_BYTES ? get32(v + 8) : 0;
    if (len < META_HEAD_BYTES + META_CHECK_BYTES ||
        get64(v + len - META_CHECK_BYTES) != meta_check(v, len))
        return INDEX_BAD_RECORD;
    if (memcmp(v, META_MAGIC, 8) != 0)
        return INDEX_FOREIGN;
    return *version >= DSTORE_FORMAT_OLDEST && *version <= DSTORE_FORMAT_VERSION ? INDEX_OURS
                                                                                 : INDEX_OTHER;
}

static int meta_decode(const uint8_t *v, size_t len, struct dmeta *m)
{
    enum index_verdict verdict = meta_verdict(v, len, &m->version);

    if (verdict == INDEX_FOREIGN || verdict == INDEX_OTHER)
        return KVT_EFORMAT;
    if (verdict != INDEX_OURS || len != META_BYTES)
        return KVT_ECORRUPT;
    m->page_bytes = get32(v + 12);
    m->page_tokens = get32(v + 16);
    m->slot_bytes = get32(v + 20);
    m->slab_slots = get32(v + 24);
    memcpy(m->fingerprint, v + 32, DSTORE_FINGERPRINT_BYTES);
    m->created = get64(v + 64);
    return 0;
}

/* ---- environment ---- */

int index_err(int rc)
{
    switch (rc) {
    case MDB_SUCCESS:
        return 0;
    case MDB_NOTFOUND:
        return -ENOENT;
    case MDB_MAP_FULL:
        return -ENOSPC;
    case MDB_READERS_FULL:
    case MDB_TXN_FULL:
        return -EAGAIN;
    case MDB_INVALID:
    case MDB_VERSION_MISMATCH:
    case MDB_INCOMPATIBLE:
        return KVT_EFORMAT;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_PANIC:
        return KVT_ECORRUPT;
    case MDB_MAP_RESIZED:
        return -EAGAIN; /* another process grew the index while a snapshot was live */
    default:
        return rc > 0 ? -rc : -EIO;
    }
}

/* mapsize 0 takes the size the environment's writer last recorded. */
static int env_open(MDB_env **out, const char *path, unsigned flags, size_t mapsize)
{
    MDB_env *env;
    int rc = mdb_env_create(&env);

    if (rc)
        return index_err(rc);
    rc = mdb_env_set_maxdbs(env, 3);
    if (!rc && mapsize)
        rc = mdb_env_set_mapsize(env, mapsize);
    if (!rc)
        rc = mdb_env_open(env, path, flags | MDB_NOTLS | MDB_NORDAHEAD, 0600);
    if (rc) {
        mdb_env_close(env);
        return index_err(rc);
    }
    *out = env;
    return 0;
}

int index_create(const char *path, const struct dmeta *m, size_t mapsize)
{
    MDB_env *env = NULL; /* set by env_open; NULL keeps -O3's flow analysis quiet */
    MDB_txn *txn;
    MDB_dbi meta, pages, slots;
    uint8_t buf[META_BYTES];
    MDB_val k = {sizeof(META_KEY) - 1, (void *)META_KEY}, v = {META_BYTES, buf};
    int rc = env_open(&env, path, 0, mapsize);

    if (rc)
        return rc;
    meta_encode(m, buf);
    if ((rc = mdb_txn_begin(env, NULL, 0, &txn)))
        goto out;
    if ((rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &meta)) ||
        (rc = mdb_dbi_open(txn, "pages", MDB_CREATE, &pages)) ||
        (rc = mdb_dbi_open(txn, "slots", MDB_CREATE | MDB_INTEGERKEY, &slots)) ||
        (rc = mdb_put(txn, meta, &k, &v, 0))) {
        mdb_txn_abort(txn);
        goto out;
    }
    rc = mdb_txn_commit(txn);
out:
    mdb_env_close(env);
    return index_err(rc);
}

/* The meta record in txn, its database opened into ix: 0, MDB_NOTFOUND when the database or
 * the record is missing, or another LMDB code. */
static int meta_get(struct dindex *ix, MDB_txn *txn, MDB_val *v)
{
    MDB_val k = {sizeof(META_KEY) - 1, (void *)META_KEY};
    int rc = mdb_dbi_open(txn, "meta", 0, &ix->meta);

    if (rc == MDB_INCOMPATIBLE)
        return MDB_NOTFOUND;
    return rc ? rc : mdb_get(txn, ix->meta, &k, v);
}

/* What the index holds (index_verdict), its databases opened into ix in txn: 0, or an LMDB
 * code. The record is judged before the other databases are looked for: an index of another
 * format need not have them. */
static int judge(struct dindex *ix, MDB_txn *txn, enum index_verdict *verdict, uint32_t *version)
{
    MDB_val v;
    int rc = meta_get(ix, txn, &v);

    *verdict = INDEX_UNNAMED;
    *version = 0;
    if (rc)
        return rc == MDB_NOTFOUND ? 0 : rc;
    if ((*verdict = meta_verdict(v.mv_data, v.mv_size, version)) != INDEX_OURS)
        return 0;
    rc = mdb_dbi_open(txn, "pages", 0, &ix->pages);
    if (!rc)
        rc = mdb_dbi_open(txn, "slots", MDB_INTEGERKEY, &ix->slots);
    if (rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE)
        *verdict = INDEX_UNNAMED;
    return rc == MDB_NOTFOUND || rc == MDB_INCOMPATIBLE ? 0 : rc;
}

/* Open the environment and judge it; ix stays open unless this fails. */
static int open_judged(struct dindex *ix, const char *path, bool readonly, size_t mapsize,
                       enum index_verdict *verdict, uint32_t *version)
{
    MDB_txn *txn;
    int dead, rc = env_open(&ix->env, path, readonly ? MDB_RDONLY : 0, mapsize);

    if (rc)
        return rc;
    mdb_reader_check(ix->env, &dead); /* slots of readers that died (a killed engine) */
    if (!(rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn))) {
        if ((rc = judge(ix, txn, verdict, version)))
            mdb_txn_abort(txn);
        else /* handles opened in a read transaction stay valid after it commits */
            rc = mdb_txn_commit(txn);
    }
    if (rc)
        index_close(ix);
    return index_err(rc);
}

int index_open(struct dindex *ix, const char *path, bool readonly, size_t mapsize)
{
    enum index_verdict verdict;
    uint32_t version;
    int rc = open_judged(ix, path, readonly, mapsize, &verdict, &version);

    if (rc || verdict == INDEX_OURS)
        return rc;
    index_close(ix);
    return verdict == INDEX_FOREIGN || verdict == INDEX_OTHER ? KVT_EFORMAT : KVT_ECORRUPT;
}

int index_examine(const char *path, enum index_verdict *verdict, uint32_t *version)
{
    struct dindex ix = {0};
    int rc = open_judged(&ix, path, true, 0, verdict, version);

    index_close(&ix);
    return rc;
}

int index_read_begin(struct dindex *ix, MDB_txn **txn, bool remap)
{
    int rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, txn);

    if (rc == MDB_MAP_RESIZED && remap && !(rc = mdb_env_set_mapsize(ix->env, 0)))
        rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, txn);
    return index_err(rc);
}

int index_read_renew(struct dindex *ix, MDB_txn *txn, bool remap)
{
    int rc = mdb_txn_renew(txn);

    if (rc == MDB_MAP_RESIZED && remap && !(rc = mdb_env_set_mapsize(ix->env, 0)))
        rc = mdb_txn_renew(txn);
    return index_err(rc);
}

int index_set_mapsize(struct dindex *ix, size_t bytes)
{
    return index_err(mdb_env_set_mapsize(ix->env, bytes));
}

int index_set_sync(struct dindex *ix, bool relaxed)
{
    unsigned on = relaxed ? MDB_NOSYNC : MDB_NOMETASYNC;

    return index_err(mdb_env_set_flags(ix->env, on, 1));
}

int index_flush(struct dindex *ix)
{
    return index_err(mdb_env_sync(ix->env, 1));
}

uint64_t index_file_bytes(const char *path)
{
    struct stat st;

    return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

void index_close(struct dindex *ix)
{
    if (ix->env)
        mdb_env_close(ix->env);
    ix->env = NULL;
}

int index_read_meta(struct dindex *ix, struct dmeta *m)
{
    MDB_txn *txn;
    MDB_val k = {sizeof(META_KEY) - 1, (void *)META_KEY}, v;
    int rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);

    if (rc)
        return index_err(rc);
    rc = mdb_get(txn, ix->meta, &k, &v);
    rc = rc == MDB_NOTFOUND ? KVT_ECORRUPT
         : rc               ? index_err(rc)
                            : meta_decode(v.mv_data, v.mv_size, m);
    mdb_txn_abort(txn);
    return rc;
}

static int decode_version(const MDB_val *v, uint32_t *version)
{
    if (v->mv_size < 8 || memcmp(v->mv_data, META_MAGIC, 8) != 0)
        return KVT_EFORMAT;
    if (v->mv_size < META_HEAD_BYTES)
        return KVT_ECORRUPT;
    *version = get32((const uint8_t *)v->mv_data + 8);
    return 0;
}

int index_peek_version(const char *path, uint32_t *version)
{
    struct dindex ix = {0};
    MDB_txn *txn;
    MDB_val v;
    int rc = env_open(&ix.env, path, MDB_RDONLY, 0);

    if (rc)
        return rc;
    if ((rc = mdb_txn_begin(ix.env, NULL, MDB_RDONLY, &txn))) {
        index_close(&ix);
        return index_err(rc);
    }
    rc = meta_get(&ix, txn, &v);
    rc = rc == MDB_NOTFOUND ? KVT_EFORMAT : rc ? index_err(rc) : decode_version(&v, version);
    mdb_txn_abort(txn);
    index_close(&ix);
    return rc;
}
