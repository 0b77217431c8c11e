/*
 * emb: the multimodal embeddings a data dir holds (src/emb/format.h, docs/formats.md). Each
 * embedding is a record of chunks under the namespace root SHA256("kvtier/emb/1"): its first
 * chunk starts with a head naming the item (hash and namespace), the length and the XXH3-128
 * of the bytes, and the keys of the other chunks follow from it. For each first chunk this
 * reads the head, checks that its key is the one the head names, and looks the other chunks
 * up; with --verify it reads every chunk (the store checks each) and checks the whole
 * against the head.
 *
 * States: ok; incomplete (a chunk is not in the dir: the disk's eviction took it, or a write
 * was cut short; the engine reads it as a miss: no problem, as a detached page is none);
 * damaged (a chunk failed its checks, a head or key that does not check out, or bytes whose
 * checksum is not the head's: the engine reads it as a miss too, and drops what failed).
 * Chunks of no head found here are counted apart (their first chunk is gone).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ctl.h"
#include "emb/format.h"

enum emb_state { EMB_OK, EMB_INCOMPLETE, EMB_DAMAGED };
static const char *const state_names[] = {"ok", "incomplete", "damaged"};

struct emb_row {
    uint32_t page; /* the first chunk */
    struct emb_head h;
    uint32_t chunks;
    enum emb_state state;
    const char *why; /* damaged: what failed */
};

struct emb_scan {
    struct ctl_index *ix;
    struct page_hasher ph;
    bool verify;
    uint8_t *buf;   /* a whole record's chunks */
    size_t buf_cap; /* chunks */
    uint8_t *keys;  /* its keys */
    bool *mine;     /* per page: a chunk of a head found */
    struct emb_row *rows;
    uint32_t n, cap;
};

static int cmp_key(const void *k, const void *p)
{
    return memcmp(k, ((const struct page *)p)->key, HASH_BYTES);
}

static int64_t page_of(const struct ctl_index *ix, const uint8_t *key)
{
    const struct page *p = bsearch(key, ix->p, ix->n, sizeof(*p), cmp_key);

    return p ? p - ix->p : -1;
}

static int grow(struct emb_scan *sc, size_t chunks)
{
    size_t pb = sc->ix->info.page_bytes;

    if (chunks <= sc->buf_cap)
        return 0;
    free(sc->buf);
    free(sc->keys);
    sc->keys = malloc(chunks * HASH_BYTES);
    if (posix_memalign((void **)&sc->buf, 4096, chunks * pb) || !sc->keys) {
        sc->buf = NULL;
        sc->buf_cap = 0;
        return -ENOMEM;
    }
    sc->buf_cap = chunks;
    return 0;
}

/* Read chunks [0, n) of the record whose keys are in sc->keys: 0, or the first failure. */
static int read_chunks(struct emb_scan *sc, size_t n)
{
    struct dstore_rpage *rp = malloc(n * sizeof(*rp));
    int *res = malloc(n * sizeof(int)), rc = rp && res ? 0 : -ENOMEM, tries = 0;

    for (size_t i = 0; rc == 0 && i < n; i++)
        rp[i] = (struct dstore_rpage){.key = sc->keys + i * HASH_BYTES,
                                      .buf = sc->buf + i * sc->ix->info.page_bytes};
    while (rc == 0 && ctl_retry(rc = dstore_get(sc->ix->s, rp, n, res), &tries))
        ;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = res[i];
    free(rp);
    free(res);
    return rc;
}

static void damaged(struct emb_row *r, const char *why)
{
    r->state = EMB_DAMAGED;
    r->why = why;
}

/* The keys of the record's chunks from its head; whether the first chunk is under its own. */
static int chunk_keys(struct emb_scan *sc, struct emb_row *r, bool *first_ok)
{
    uint8_t digest[HASH_BYTES];
    int rc = emb_digest(&sc->ph, r->h.nsd, r->h.item, digest);

    for (uint32_t i = 0; rc == 0 && i < r->chunks; i++)
        rc = emb_chunk_key(&sc->ph, digest, i, sc->keys + (size_t)i * HASH_BYTES);
    *first_ok = rc == 0 && !memcmp(sc->keys, sc->ix->p[r->page].key, HASH_BYTES);
    return rc;
}

/* One record from its first chunk: head, keys, the other chunks' records, and with verify
 * their bytes. -ENOENT: the first chunk went since the index was read (not listed). */
static int check_record(struct emb_scan *sc, struct emb_row *r)
{
    const struct ctl_index *ix = sc->ix;
    uint32_t pb = ix->info.page_bytes;
    bool first_ok;
    int rc;

    memcpy(sc->keys, ix->p[r->page].key, HASH_BYTES);
    if ((rc = read_chunks(sc, 1)) == -ENOENT)
        return rc;
    if (rc) {
        damaged(r, rc == KVT_ECORRUPT ? "first chunk fails its checksum" : "read error");
        return 0;
    }
    if (emb_head_read(sc->buf, &r->h)) {
        damaged(r, "not a head");
        return 0;
    }
    r->chunks = (uint32_t)emb_chunks(r->h.len, pb);
    if ((rc = grow(sc, r->chunks)) || (rc = chunk_keys(sc, r, &first_ok)))
        return rc;
    if (!first_ok) {
        damaged(r, "key is not the one its head names");
        return 0;
    }
    for (uint32_t i = 0; i < r->chunks; i++) {
        int64_t p = page_of(ix, sc->keys + (size_t)i * HASH_BYTES);
        if (p < 0) {
            r->state = r->state == EMB_OK ? EMB_INCOMPLETE : r->state;
            continue;
        }
        sc->mine[p] = true;
        if (!page_good(&ix->p[p]))
            damaged(r, "a chunk's record fails its checks");
    }
    if (!sc->verify || r->state != EMB_OK)
        return 0;
    if ((rc = read_chunks(sc, r->chunks)) == -ENOENT)
        r->state = EMB_INCOMPLETE; /* evicted while we read */
    else if (rc)
        damaged(r, rc == KVT_ECORRUPT ? "a chunk fails its checksum" : "read error");
    else if (!emb_payload_ok(&r->h, sc->buf + EMB_HEAD_BYTES))
        damaged(r, "bytes do not match the head's checksum");
    return 0;
}

static int scan(struct emb_scan *sc, uint32_t ns)
{
    int rc = 0;

    for (uint32_t c = sc->ix->ns[ns].first; c != NO_PAGE && rc == 0; c = sc->ix->p[c].next) {
        if (sc->n == sc->cap) {
            uint32_t ncap = sc->cap ? 2 * sc->cap : 64;
            struct emb_row *v = realloc(sc->rows, ncap * sizeof(*v));
            if (!v)
                return -ENOMEM;
            sc->rows = v;
            sc->cap = ncap;
        }
        struct emb_row *r = &sc->rows[sc->n];
        *r = (struct emb_row){.page = c, .chunks = 1};
        sc->mine[c] = true;
        if ((rc = check_record(sc, r)) == 0)
            sc->n++;
        else if (rc == -ENOENT)
            rc = 0;
    }
    return rc;
}

/* ---- report ---- */

struct emb_totals {
    uint64_t count[3], bytes, chunks, orphans;
};

static void totals(const struct emb_scan *sc, uint32_t ns, struct emb_totals *t)
{
    memset(t, 0, sizeof(*t));
    for (uint32_t i = 0; i < sc->n; i++) {
        t->count[sc->rows[i].state]++;
        t->bytes += sc->rows[i].state == EMB_DAMAGED ? 0 : sc->rows[i].h.len;
        t->chunks += sc->rows[i].chunks;
    }
    for (uint32_t i = 0; ns != NO_PAGE && i < sc->ix->n; i++)
        t->orphans += sc->ix->p[i].ns == ns && !sc->mine[i];
}

static const uint8_t zero_nsd[EMB_HASH_BYTES];

static void print_text(const struct emb_scan *sc, const struct emb_totals *t)
{
    char item[2 * HASH_BYTES + 1], nsd[2 * HASH_BYTES + 1], b[32], tb[32];

    if (sc->n)
        printf("%-14s %-14s %10s %7s  %-20s  %s\n", "ITEM", "NAMESPACE", "BYTES", "CHUNKS",
               "CREATED", "STATE");
    for (uint32_t i = 0; i < sc->n; i++) {
        const struct emb_row *r = &sc->rows[i];
        bool head = r->h.len || r->state != EMB_DAMAGED;
        ctl_hex(r->h.item, SHORT_HEX / 2, item);
        ctl_hex(r->h.nsd, SHORT_HEX / 2, nsd);
        printf("%-14s %-14s %10s %7u  %-20s  %s%s%s\n", head ? item : "?",
               !head                            ? "?"
               : memcmp(r->h.nsd, zero_nsd, 32) ? nsd
                                                : "default",
               head ? ctl_bytes(r->h.len, b) : "?", r->chunks, ctl_time(r->h.created_ns, tb),
               state_names[r->state], r->why ? ": " : "", r->why ? r->why : "");
    }
    printf("embeddings: %u (%s in %" PRIu64 " chunks): %" PRIu64 " ok, %" PRIu64
           " incomplete, %" PRIu64 " damaged; %" PRIu64 " chunks of no head found; %s\n",
           sc->n, ctl_bytes(t->bytes, b), t->chunks, t->count[EMB_OK], t->count[EMB_INCOMPLETE],
           t->count[EMB_DAMAGED], t->orphans,
           sc->verify ? "every chunk read and the whole checked" : "heads read (--verify: all)");
}

static void print_json(const char *dir, const struct emb_scan *sc, const struct emb_totals *t)
{
    printf("{\"dir\":");
    cli_json_string(dir);
    printf(",\"verified\":%s,\"embeddings\":[", sc->verify ? "true" : "false");
    for (uint32_t i = 0; i < sc->n; i++) {
        const struct emb_row *r = &sc->rows[i];
        printf("%s{\"item\":", i ? "," : "");
        ctl_json_hex(r->h.item, EMB_HASH_BYTES);
        printf(",\"namespace\":");
        if (memcmp(r->h.nsd, zero_nsd, 32))
            ctl_json_hex(r->h.nsd, EMB_HASH_BYTES);
        else
            printf("\"default\"");
        printf(",\"first_chunk\":");
        ctl_json_hex(sc->ix->p[r->page].key, HASH_BYTES);
        printf(",\"bytes\":%" PRIu64 ",\"chunks\":%u,\"created_ns\":%" PRIu64 ",\"state\":\"%s\"",
               r->h.len, r->chunks, r->h.created_ns, state_names[r->state]);
        if (r->why) {
            printf(",\"why\":");
            cli_json_string(r->why);
        }
        printf("}");
    }
    printf("],\"total\":%u,\"ok\":%" PRIu64 ",\"incomplete\":%" PRIu64 ",\"damaged\":%" PRIu64
           ",\"bytes\":%" PRIu64 ",\"chunks\":%" PRIu64 ",\"orphan_chunks\":%" PRIu64 "}\n",
           sc->n, t->count[EMB_OK], t->count[EMB_INCOMPLETE], t->count[EMB_DAMAGED], t->bytes,
           t->chunks, t->orphans);
}

static uint32_t embeddings_ns(const struct ctl_index *ix)
{
    for (uint32_t n = 0; n < ix->nns; n++)
        if (ix->ns[n].is_embeddings)
            return n;
    return NO_PAGE;
}

int cmd_emb(const struct ctl_args *a)
{
    struct emb_scan sc = {.verify = a->verify};
    struct ctl_index ix;
    struct dstore *s;
    struct emb_totals t;
    uint32_t ns;
    int rc;

    if ((rc = ctl_load(a->pos[0], false, &s, &ix)))
        return rc;
    sc.ix = &ix;
    ns = embeddings_ns(&ix);
    sc.mine = calloc(ix.n ? ix.n : 1, sizeof(*sc.mine));
    rc = sc.mine && !grow(&sc, 1) ? page_hasher_init(&sc.ph) : -ENOMEM;
    if (rc == 0 && ns != NO_PAGE)
        rc = scan(&sc, ns);
    if (rc == 0) {
        totals(&sc, ns, &t);
        if (a->json)
            print_json(a->pos[0], &sc, &t);
        else
            print_text(&sc, &t);
    }
    page_hasher_finish(&sc.ph);
    free(sc.buf);
    free(sc.keys);
    free(sc.mine);
    free(sc.rows);
    ctl_unload(s, &ix);
    if (rc)
        return ctl_fail("%s: %s", a->pos[0], kvt_strerror(rc));
    return t.count[EMB_DAMAGED] ? 1 : 0;
}
