/*
 * A data dir's index in memory, for the offline commands: every record, its namespace, its
 * parent and children, its depth from the namespace root, and what is wrong with it.
 *
 * The records come from one LMDB snapshot, so a writer beside us cannot make the picture
 * inconsistent. What the record checks find here (a record that fails its own check, a key
 * that is not the hash of its parent and tokens, a slot outside the slab files or not its
 * own in the slot table) the engine would never serve. A good page below such a page or below
 * a missing one is detached: a match walks the chain from the root and stops there, but once
 * an engine stores the page above again (it recomputed it), the match goes on through the
 * detached pages below it. On a large dir most pages are detached for a while: the disk copies
 * of hot chain roots age out because their hits happen in the upper tiers.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "emb/format.h"
#include "engine/engine.h"
#include "radix/hash.h"

/* ---- loading ---- */

struct loader {
    struct ctl_index *ix;
    struct page_hasher h;
    uint32_t *order; /* namespace ids, sorted by root: ix->ns is in order of discovery */
    uint32_t step;   /* the engine's page in the last record of several (0: none yet) */
};

static struct page *page_push(struct ctl_index *ix)
{
    if (ix->n == ix->cap) {
        uint32_t cap = ix->cap ? 2 * ix->cap : 1024;
        struct page *p = realloc(ix->p, (size_t)cap * sizeof(*p));

        if (!p)
            return NULL;
        ix->p = p;
        ix->cap = cap;
    }
    struct page *p = &ix->p[ix->n++];
    memset(p, 0, sizeof(*p));
    p->ns = p->up = p->child = p->next = NO_PAGE;
    return p;
}

/* The namespace of root, appended when new (pages already loaded keep their ids): its id, or
 * NO_PAGE without memory. */
static uint32_t ns_of(struct loader *l, const uint8_t *root)
{
    struct ctl_index *ix = l->ix;
    uint32_t lo = 0, hi = ix->nns;

    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        int c = memcmp(ix->ns[l->order[mid]].root, root, HASH_BYTES);

        if (c == 0)
            return l->order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    struct ns_info *v = realloc(ix->ns, (ix->nns + 1) * sizeof(*v));
    if (v)
        ix->ns = v;
    uint32_t *o = v ? realloc(l->order, (ix->nns + 1) * sizeof(*o)) : NULL;
    if (!o)
        return NO_PAGE;
    l->order = o;
    memmove(&o[lo + 1], &o[lo], (ix->nns - lo) * sizeof(*o));
    o[lo] = ix->nns;
    memset(&v[ix->nns], 0, sizeof(*v));
    memcpy(v[ix->nns].root, root, HASH_BYTES);
    v[ix->nns].is_default = !memcmp(root, ix->default_root, HASH_BYTES);
    v[ix->nns].is_states = !memcmp(root, ix->states_root, HASH_BYTES);
    v[ix->nns].is_windows = !memcmp(root, ix->windows_root, HASH_BYTES);
    v[ix->nns].is_embeddings = !memcmp(root, ix->embeddings_root, HASH_BYTES);
    v[ix->nns].first = NO_PAGE;
    return ix->nns++;
}

/* Namespaces in root order, and the pages' ids with them. */
static int ns_sort(struct loader *l)
{
    struct ctl_index *ix = l->ix;
    struct ns_info *v = malloc((ix->nns ? ix->nns : 1) * sizeof(*v));
    uint32_t *rank = malloc((ix->nns ? ix->nns : 1) * sizeof(*rank));

    if (!v || !rank) {
        free(v);
        free(rank);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < ix->nns; i++) {
        v[i] = ix->ns[l->order[i]];
        rank[l->order[i]] = i;
    }
    for (uint32_t i = 0; i < ix->n; i++)
        if (ix->p[i].ns != NO_PAGE)
            ix->p[i].ns = rank[ix->p[i].ns];
    free(ix->ns);
    ix->ns = v;
    free(rank);
    return 0;
}

static const uint8_t zero_root[HASH_BYTES];

/* A namespace root of zeros: pages a caller named with keys of its own (the public page
 * store, SGLang's page hashes), not the engine's chained hashes; there is no chain to check. */
static bool caller_keys(const uint8_t *ns_root)
{
    return !memcmp(ns_root, zero_root, HASH_BYTES);
}

/* Whether key is the chained hash of the record's tokens as pages of step tokens from its
 * parent on: the engine's names for its pages, the last one naming a record that holds
 * several of them (kvt_options.store_page_tokens). */
static bool chain_checks_out(struct loader *l, const struct dstore_entry *e, uint32_t step)
{
    uint8_t h[HASH_BYTES];
    const uint8_t *prev = e->parent;

    for (uint32_t at = 0; at < e->ntokens; at += step, prev = h)
        if (page_hash_next(&l->h, prev, e->tokens + at, step, h))
            return false;
    return !memcmp(h, e->key, HASH_BYTES);
}

/* Whether the record's key is SHA256(parent || tokens), as the engine names pages (chained
 * over its pages for a record of several, whose page size the dir does not say: the powers
 * of two dividing its tokens are tried, the one found last first), or a caller's own key, or
 * a page of a recurrent state (whose key depends on the state's size, which no record holds:
 * its bytes are checked when read, as every page's are), or a window copy, whose key is
 * SHA256(parent || KVT_WINDOW_TAG), or a chunk of an embedding (whose key is named by the
 * head in its first chunk: kvtier-ctl emb checks it). */
static bool key_checks_out(struct loader *l, const struct dstore_entry *e)
{
    uint8_t h[HASH_BYTES];

    if (caller_keys(e->ns) || !memcmp(e->ns, l->ix->states_root, HASH_BYTES) ||
        !memcmp(e->ns, l->ix->embeddings_root, HASH_BYTES))
        return true;
    if (!memcmp(e->ns, l->ix->windows_root, HASH_BYTES))
        return !page_hasher_digest2(&l->h, e->parent, HASH_BYTES, KVT_WINDOW_TAG,
                                    sizeof(KVT_WINDOW_TAG) - 1, h) &&
               !memcmp(h, e->key, HASH_BYTES);
    if (!page_hash_next(&l->h, e->parent, e->tokens, e->ntokens, h) &&
        !memcmp(h, e->key, HASH_BYTES))
        return true;
    if (l->step && l->step < e->ntokens && e->ntokens % l->step == 0 &&
        chain_checks_out(l, e, l->step))
        return true;
    for (uint32_t step = KVT_PAGE_SIZE_MAX; step; step /= 2)
        if (step < e->ntokens && e->ntokens % step == 0 && step != l->step &&
            chain_checks_out(l, e, step)) {
            l->step = step;
            return true;
        }
    return false;
}

/* The checks a record gets without reading its page. */
static uint32_t record_problems(struct loader *l, const struct dstore_entry *e, bool key_ok)
{
    const struct dstore_info *in = &l->ix->info;

    if (e->length != in->page_bytes || e->ntokens != in->page_tokens)
        return BAD_LENGTH;
    if (!key_ok)
        return BAD_HASH;
    if (!dstore_entry_in_bounds(l->ix->s, e))
        return BAD_DANGLING;
    if (!e->slot_owner || memcmp(e->slot_owner, e->key, HASH_BYTES))
        return BAD_STALE;
    return 0;
}

static int on_entry(void *arg, const struct dstore_entry *e)
{
    struct loader *l = arg;
    struct page *p;

    if (e->key_bytes != HASH_BYTES) {
        l->ix->bad_keys++;
        return 0;
    }
    if (!(p = page_push(l->ix)))
        return -ENOMEM;
    memcpy(p->key, e->key, HASH_BYTES);
    if (e->status) {
        p->problems = BAD_RECORD;
        return 0;
    }
    memcpy(p->parent, e->parent, HASH_BYTES);
    if ((p->ns = ns_of(l, e->ns)) == NO_PAGE)
        return -ENOMEM;
    p->slab = e->slab;
    p->slot = e->slot;
    p->created = e->created_ns;
    p->atime = e->last_access_ns;
    p->first_token = e->ntokens ? e->tokens[0] : 0;
    p->owns_slot = e->slot_owner && !memcmp(e->slot_owner, e->key, HASH_BYTES);
    p->key_ok = key_checks_out(l, e);
    p->problems = record_problems(l, e, p->key_ok);
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    return memcmp(a, ((const struct page *)b)->key, HASH_BYTES);
}

/* Parents and children: a first page hangs from its namespace, the rest from the present
 * record their parent hash names, when it is of the same namespace (whatever the parent's
 * state; reach() decides what is served). Only a page whose key is the hash of its parent
 * and tokens is linked: a chain of such keys cannot loop, while records with keys made up
 * (or damaged) can name each other, or themselves, as parents. A caller's keys are not
 * hashes, so their links can loop: break_loops cuts each loop once. */
static void link_pages(struct ctl_index *ix)
{
    for (uint32_t i = ix->n; i-- > 0;) {
        struct page *p = &ix->p[i], *up;

        if (p->ns == NO_PAGE)
            continue;
        if (!memcmp(p->parent, ix->ns[p->ns].root, HASH_BYTES)) {
            p->next = ix->ns[p->ns].first;
            ix->ns[p->ns].first = i;
        } else if (p->key_ok && (up = bsearch(p->parent, ix->p, ix->n, sizeof(*up), cmp_key)) &&
                   (up->ns == p->ns || ns_follows_kv(&ix->ns[p->ns]))) {
            /* A state's pages, a window copy, hang from the page of KV they follow. */
            p->up = (uint32_t)(up - ix->p);
            p->next = up->child;
            up->child = i;
        }
    }
}

/* Take page k off its parent's list of children: it hangs from nothing now. */
static void unlink_up(struct ctl_index *ix, uint32_t k)
{
    uint32_t *c = &ix->p[ix->p[k].up].child;

    while (*c != k)
        c = &ix->p[*c].next;
    *c = ix->p[k].next;
    ix->p[k].up = ix->p[k].next = NO_PAGE;
}

/* Cut every loop of parent links (only a caller's keys can make one) at the page where a walk
 * up first meets itself, so that every walk up ends: each page is walked over once. */
static int break_loops(struct ctl_index *ix)
{
    uint32_t *walk = calloc(ix->n ? ix->n : 1, sizeof(*walk)); /* 0: not walked yet */

    if (!walk)
        return -ENOMEM;
    for (uint32_t i = 0; i < ix->n; i++) {
        uint32_t k = i;
        while (k != NO_PAGE && !walk[k]) {
            walk[k] = i + 1;
            k = ix->p[k].up;
        }
        if (k != NO_PAGE && walk[k] == i + 1)
            unlink_up(ix, k);
    }
    free(walk);
    return 0;
}

/* Depth-first from each namespace's first pages through good pages only; a good page not
 * reached is detached. Run again after verify finds bad bytes. */
static int reach(struct ctl_index *ix)
{
    uint32_t *stack = malloc(((size_t)ix->n + 1) * sizeof(*stack)), top = 0;

    if (!stack)
        return -ENOMEM;
    for (uint32_t i = 0; i < ix->n; i++)
        ix->p[i].depth = 0;
    for (uint32_t n = 0; n < ix->nns; n++) {
        for (uint32_t c = ix->ns[n].first; c != NO_PAGE; c = ix->p[c].next)
            if (page_good(&ix->p[c])) {
                ix->p[c].depth = 1;
                stack[top++] = c;
            }
        while (top) {
            const struct page *p = &ix->p[stack[--top]];

            for (uint32_t c = p->child; c != NO_PAGE; c = ix->p[c].next)
                if (page_good(&ix->p[c]) && !ix->p[c].depth) {
                    ix->p[c].depth = p->depth + 1;
                    stack[top++] = c;
                }
        }
    }
    free(stack);
    for (uint32_t i = 0; i < ix->n; i++)
        ix->p[i].detached = !ix->p[i].depth && !ix->p[i].problems;
    return 0;
}

static void count_namespaces(struct ctl_index *ix)
{
    for (uint32_t n = 0; n < ix->nns; n++) {
        ix->ns[n].pages = ix->ns[n].good = ix->ns[n].detached = 0;
        ix->ns[n].oldest = ix->ns[n].newest = 0;
    }
    for (uint32_t i = 0; i < ix->n; i++) {
        const struct page *p = &ix->p[i];
        struct ns_info *n;

        if (p->ns == NO_PAGE)
            continue;
        n = &ix->ns[p->ns];
        n->pages++;
        n->good += page_good(p) && !p->detached;
        n->detached += p->detached;
        if (!n->oldest || p->created < n->oldest)
            n->oldest = p->created;
        if (p->created > n->newest)
            n->newest = p->created;
    }
}

int index_relink(struct ctl_index *ix)
{
    int rc = reach(ix);

    if (!rc)
        count_namespaces(ix);
    return rc;
}

int index_load(struct dstore *s, struct ctl_index *ix)
{
    struct loader l = {.ix = ix};
    int rc;

    memset(ix, 0, sizeof(*ix));
    ix->s = s;
    dstore_info(s, &ix->info);
    if ((rc = page_hasher_init(&l.h)))
        return rc;
    rc = page_hash_root(&l.h, ix->info.fingerprint, NULL, 0, ix->default_root);
    if (!rc)
        rc = page_hasher_digest2(&l.h, KVT_STATE_TAG, sizeof(KVT_STATE_TAG) - 1, NULL, 0,
                                 ix->states_root);
    if (!rc)
        rc = page_hasher_digest2(&l.h, KVT_WINDOW_TAG, sizeof(KVT_WINDOW_TAG) - 1, NULL, 0,
                                 ix->windows_root);
    if (!rc)
        rc = emb_root(&l.h, ix->embeddings_root);
    if (!rc)
        rc = dstore_iterate(s, on_entry, &l);
    if (!rc)
        rc = ns_sort(&l);
    page_hasher_finish(&l.h);
    free(l.order);
    if (rc)
        return rc;
    ix->engine_page_tokens = l.step ? l.step : ix->info.page_tokens;
    ix->slot_entries = dstore_slot_entries(s);
    link_pages(ix);
    if ((rc = break_loops(ix)))
        return rc;
    return index_relink(ix);
}

void index_free(struct ctl_index *ix)
{
    free(ix->p);
    free(ix->ns);
    memset(ix, 0, sizeof(*ix));
}

/* ---- names ---- */

const char *problem_name(uint32_t mask)
{
    static const char *const names[] = {
        "corrupt record", "corrupt (hash chain)", "corrupt (length)", "corrupt (checksum)",
        "dangling",       "stale slot",           "read error"};

    for (int i = 0; i < 7; i++)
        if (mask & (1u << i))
            return names[i];
    return "ok";
}

const char *page_state(const struct page *p)
{
    return p->detached ? "detached" : problem_name(p->problems);
}

const char *index_ns_name(const struct ctl_index *ix, uint32_t ns, char *buf)
{
    char hex[2 * HASH_BYTES + 1];

    if (ns == NO_PAGE)
        return strcpy(buf, "?");
    if (ix->ns[ns].is_default)
        return strcpy(buf, "default");
    if (ix->ns[ns].is_states)
        return strcpy(buf, "states");
    if (ix->ns[ns].is_windows)
        return strcpy(buf, "windows");
    if (ix->ns[ns].is_embeddings)
        return strcpy(buf, "embeddings");
    if (caller_keys(ix->ns[ns].root))
        return strcpy(buf, "caller-keys");
    ctl_hex(ix->ns[ns].root, HASH_BYTES, hex);
    hex[SHORT_HEX] = '\0';
    return strcpy(buf, hex);
}

/* ---- finding pages and namespaces by hex prefix ---- */

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A hex prefix as the lowest key it names (padded with zeros); its length in digits, or -1. */
static int parse_hex(const char *hex, uint8_t *low)
{
    size_t len = strlen(hex);

    if (len < 4 || len > 2 * HASH_BYTES)
        return -1;
    memset(low, 0, HASH_BYTES);
    for (size_t i = 0; i < len; i++) {
        int d = hex_digit(hex[i]);

        if (d < 0)
            return -1;
        low[i / 2] |= (uint8_t)(i % 2 ? d : d << 4);
    }
    return (int)len;
}

static bool hex_match(const uint8_t *key, const uint8_t *low, int digits)
{
    if (memcmp(key, low, (size_t)digits / 2))
        return false;
    return digits % 2 == 0 || (key[digits / 2] >> 4) == (low[digits / 2] >> 4);
}

/* The first index of keys (n, stride apart, sorted) not below low. */
static uint32_t lower_bound(const uint8_t *keys, size_t stride, uint32_t n, const uint8_t *low)
{
    uint32_t lo = 0, hi = n;

    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;

        if (memcmp(keys + mid * stride, low, HASH_BYTES) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Unique match of hex among n sorted keys: 0 and *out, 1 none, 2 ambiguous, -1 bad hex. */
static int match_prefix(const uint8_t *keys, size_t stride, uint32_t n, const char *hex,
                        uint32_t *out)
{
    uint8_t low[HASH_BYTES];
    int digits = parse_hex(hex, low);
    uint32_t i;

    if (digits < 0)
        return -1;
    i = lower_bound(keys, stride, n, low);
    if (i == n || !hex_match(keys + i * stride, low, digits))
        return 1;
    if (i + 1 < n && hex_match(keys + (i + 1) * stride, low, digits))
        return 2;
    *out = i;
    return 0;
}

static int prefix_error(int rc, const char *what, const char *hex)
{
    if (rc < 0) {
        ctl_fail("%s: not a %s hash: give 4 to 64 hex digits", hex, what);
        return 2; /* bad usage */
    }
    if (rc == 1)
        return ctl_fail("%s: no %s has this hash", hex, what);
    return ctl_fail("%s: ambiguous: several %ss start with it; give more digits", hex, what);
}

int index_find(const struct ctl_index *ix, const char *hex, uint32_t *out)
{
    int rc = ix->n ? match_prefix(ix->p[0].key, sizeof(struct page), ix->n, hex, out) : 1;

    return rc ? prefix_error(rc, "page", hex) : 0;
}

static int find_ns_root(const struct ctl_index *ix, const uint8_t *root, const char *arg,
                        uint32_t *out)
{
    for (uint32_t n = 0; n < ix->nns; n++) {
        if (!memcmp(ix->ns[n].root, root, HASH_BYTES)) {
            *out = n;
            return 0;
        }
    }
    return ctl_fail("namespace %s: no page of it is stored here", arg);
}

int index_find_ns(const struct ctl_index *ix, const char *arg, uint32_t *out)
{
    struct page_hasher h;
    uint8_t root[HASH_BYTES];
    int rc;

    if (!strcmp(arg, "default"))
        return find_ns_root(ix, ix->default_root, arg, out);
    if (!strcmp(arg, "states"))
        return find_ns_root(ix, ix->states_root, arg, out);
    if (!strcmp(arg, "windows"))
        return find_ns_root(ix, ix->windows_root, arg, out);
    if (!strcmp(arg, "embeddings"))
        return find_ns_root(ix, ix->embeddings_root, arg, out);
    if (!strncmp(arg, "name:", 5)) {
        if (strlen(arg + 5) > KVT_NS_MAX)
            return ctl_fail("namespace %s: longer than %d bytes", arg, KVT_NS_MAX);
        if ((rc = page_hasher_init(&h)))
            return ctl_fail("SHA256: %s", kvt_strerror(rc));
        rc = page_hash_root(&h, ix->info.fingerprint, arg + 5, strlen(arg + 5), root);
        page_hasher_finish(&h);
        return rc ? ctl_fail("SHA256: %s", kvt_strerror(rc)) : find_ns_root(ix, root, arg, out);
    }
    rc = ix->nns ? match_prefix(ix->ns[0].root, sizeof(struct ns_info), ix->nns, arg, out) : 1;
    return rc ? prefix_error(rc, "namespace", arg) : 0;
}

/* ---- selections ---- */

/* page i, its ancestors and its descendants (good ones only when good_only). The links
 * cannot loop (link_pages), but a page is still visited once at most each way: a loop would
 * otherwise hang the walk up and overflow the stack down. */
static int select_prefix(const struct ctl_index *ix, uint32_t i, bool good_only, bool *sel)
{
    enum { UP = 1, DOWN = 2 };
    uint32_t *stack = malloc(((size_t)ix->n + 1) * sizeof(*stack)), top = 0;
    uint8_t *seen = calloc((size_t)ix->n + 1, 1);

    if (!stack || !seen) {
        free(stack);
        free(seen);
        return ctl_fail("out of memory");
    }
    for (uint32_t u = ix->p[i].up; u != NO_PAGE && !(seen[u] & UP); u = ix->p[u].up)
        seen[u] |= UP;
    seen[i] |= DOWN;
    stack[top++] = i;
    while (top) {
        uint32_t k = stack[--top];

        for (uint32_t c = ix->p[k].child; c != NO_PAGE; c = ix->p[c].next)
            if (!(seen[c] & DOWN) && (!good_only || page_good(&ix->p[c]))) {
                seen[c] |= DOWN;
                stack[top++] = c;
            }
    }
    for (uint32_t k = 0; k < ix->n; k++)
        sel[k] |= seen[k] != 0;
    free(seen);
    free(stack);
    return 0;
}

int index_select(const struct ctl_index *ix, const struct ctl_args *a, bool good_only, bool *sel)
{
    bool all = a->all || (!a->nns && !a->nprefix);
    uint32_t k;
    int rc;

    for (uint32_t i = 0; i < ix->n; i++)
        sel[i] = all && (!good_only || page_good(&ix->p[i]));
    for (int j = 0; j < a->nns; j++) {
        if ((rc = index_find_ns(ix, a->ns[j], &k)))
            return rc;
        for (uint32_t i = 0; i < ix->n; i++)
            sel[i] |= ix->p[i].ns == k && (!good_only || page_good(&ix->p[i]));
    }
    for (int j = 0; j < a->nprefix; j++) {
        if ((rc = index_find(ix, a->prefix[j], &k)))
            return rc;
        if (good_only && !page_good(&ix->p[k]))
            return ctl_fail("%s: this page is %s: it cannot be served", a->prefix[j],
                            problem_name(ix->p[k].problems));
        if ((rc = select_prefix(ix, k, good_only, sel)))
            return rc;
    }
    return 0;
}

int ctl_load(const char *dir, bool heal, struct dstore **s, struct ctl_index *ix)
{
    bool quiet = !ctl_dir_locked(dir);
    int rc = ctl_open_ro(dir, heal, s), tries = 0;

    if (rc)
        return rc;
    while (ctl_retry(rc = index_load(*s, ix), &tries))
        index_free(ix);
    /* The slot table is counted in a snapshot of its own: it agrees only without a writer. */
    ix->quiet_dir = quiet && !ctl_dir_locked(dir);
    if (rc) {
        index_free(ix);
        dstore_close(*s);
        return ctl_fail("%s: reading the index: %s", dir, kvt_strerror(rc));
    }
    return 0;
}

void ctl_unload(struct dstore *s, struct ctl_index *ix)
{
    index_free(ix);
    dstore_close(s);
}

void index_count_problems(const struct ctl_index *ix, struct problem_counts *c)
{
    memset(c, 0, sizeof(*c));
    c->corrupt = ix->bad_keys;
    for (uint32_t i = 0; i < ix->n; i++) {
        uint32_t m = ix->p[i].problems;

        c->corrupt += (m & BAD_CORRUPT) != 0;
        c->dangling += (m & BAD_DANGLING) != 0;
        c->stale += (m & BAD_STALE) != 0;
        c->io += (m & BAD_IO) != 0;
        c->detached += ix->p[i].detached;
    }
    c->total = c->corrupt + c->dangling + c->stale + c->io;
}
