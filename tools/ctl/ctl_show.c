/*
 * The read-only views of a data dir: stat, ls, show, tree. Each loads the index from one
 * snapshot (ctl_index.c) and prints it; none reads a page's bytes (verify does).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ctl.h"

/* ---- stat ---- */

struct dir_totals {
    uint64_t oldest, newest, last_access; /* created, created, last access */
};

static void totals(const struct ctl_index *ix, struct dir_totals *t)
{
    memset(t, 0, sizeof(*t));
    for (uint32_t i = 0; i < ix->n; i++) {
        const struct page *p = &ix->p[i];

        if (p->problems & BAD_RECORD)
            continue;
        if (!t->oldest || p->created < t->oldest)
            t->oldest = p->created;
        if (p->created > t->newest)
            t->newest = p->created;
        if (p->atime > t->last_access)
            t->last_access = p->atime;
    }
}

static uint64_t free_slots(const struct ctl_index *ix)
{
    uint64_t cap = ix->info.capacity_slots;

    return ix->slot_entries < cap ? cap - ix->slot_entries : 0;
}

static void print_problems_text(const struct problem_counts *c)
{
    if (!c->total)
        printf("problems      none found in the index (verify also reads every page)\n");
    else
        printf("problems      %" PRIu64 ": %" PRIu64 " corrupt, %" PRIu64 " dangling, %" PRIu64
               " stale (run verify)\n",
               c->total, c->corrupt, c->dangling, c->stale);
    printf("detached      %" PRIu64 " page%s", c->detached, c->detached == 1 ? "" : "s");
    if (c->detached)
        printf(": a page above them is not on this disk; an engine serves them again once it "
               "stores that page again (not a problem)");
    printf("\n");
}

static void stat_text(const char *dir, const struct ctl_index *ix)
{
    const struct dstore_info *in = &ix->info;
    char hex[2 * HASH_BYTES + 1], t1[32], t2[32], b1[32], b2[32], name[SHORT_HEX + 8];
    struct problem_counts c;
    struct dir_totals t;

    totals(ix, &t);
    index_count_problems(ix, &c);
    ctl_hex(in->fingerprint, HASH_BYTES, hex);
    printf("data dir      %s\n", dir);
    printf("format        version %u, created %s\n", in->format_version,
           ctl_time(in->created_ns, t1));
    if (in->format_version < DSTORE_FORMAT_VERSION && in->page_bytes < 4096)
        printf("              (a block a page below 4 KiB; `kvtier-ctl export %s NEW --all`\n"
               "              copies the pages into a dir of format %u, packed)\n",
               dir, DSTORE_FORMAT_VERSION);
    printf("fingerprint   %s\n", hex);
    printf("page          %u tokens, %s (%u bytes a slot)\n", in->page_tokens,
           ctl_bytes(in->page_bytes, b1), in->slot_bytes);
    if (ix->engine_page_tokens != in->page_tokens)
        printf("              a store page of %u of the engine's pages of %u tokens "
               "(store_page_tokens)\n",
               in->page_tokens / ix->engine_page_tokens, ix->engine_page_tokens);
    printf("slabs         %u file%s of %u slots (%s each); capacity %" PRIu64 " slots\n",
           in->slab_files, in->slab_files == 1 ? "" : "s", in->slab_slots,
           ctl_bytes((uint64_t)in->slab_slots * in->slot_bytes, b1), in->capacity_slots);
    printf("pages         %u (%s of KV, %" PRIu64 " tokens)\n", ix->n,
           ctl_bytes((uint64_t)ix->n * in->page_bytes, b2), (uint64_t)ix->n * in->page_tokens);
    printf("free slots    %" PRIu64 " of %" PRIu64 "\n", free_slots(ix), in->capacity_slots);
    printf("oldest        %s (created)\n", ctl_time(t.oldest, t1));
    printf("newest        %s (created); last access %s\n", ctl_time(t.newest, t1),
           ctl_time(t.last_access, t2));
    print_problems_text(&c);
    printf("\n%-14s %10s %12s %12s  %-20s  %s\n", "NAMESPACE", "PAGES", "BYTES", "TOKENS", "OLDEST",
           "NEWEST");
    for (uint32_t n = 0; n < ix->nns; n++) {
        const struct ns_info *s = &ix->ns[n];

        printf("%-14s %10" PRIu64 " %12s %12" PRIu64 "  %-20s  %s\n", index_ns_name(ix, n, name),
               s->pages, ctl_bytes(s->pages * in->page_bytes, b1), s->pages * in->page_tokens,
               ctl_time(s->oldest, t1), ctl_time(s->newest, t2));
    }
}

static void problems_json(const struct problem_counts *c)
{
    printf("{\"total\":%" PRIu64 ",\"corrupt\":%" PRIu64 ",\"dangling\":%" PRIu64
           ",\"stale\":%" PRIu64 ",\"read_errors\":%" PRIu64 "}",
           c->total, c->corrupt, c->dangling, c->stale, c->io);
}

static void namespaces_json(const struct ctl_index *ix)
{
    uint32_t pb = ix->info.page_bytes;

    printf("[");
    for (uint32_t n = 0; n < ix->nns; n++) {
        const struct ns_info *s = &ix->ns[n];

        printf("%s{\"root\":", n ? "," : "");
        ctl_json_hex(s->root, HASH_BYTES);
        printf(",\"default\":%s,\"states\":%s,\"windows\":%s,\"embeddings\":%s,\"pages\":%" PRIu64
               ",\"good_pages\":%" PRIu64 ",\"detached\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"tokens\":%" PRIu64 ",\"oldest_ns\":%" PRIu64 ",\"newest_ns\":%" PRIu64 "}",
               s->is_default ? "true" : "false", s->is_states ? "true" : "false",
               s->is_windows ? "true" : "false", s->is_embeddings ? "true" : "false", s->pages,
               s->good, s->detached, s->pages * pb, s->pages * ix->info.page_tokens, s->oldest,
               s->newest);
    }
    printf("]");
}

static void stat_json(const char *dir, const struct ctl_index *ix)
{
    const struct dstore_info *in = &ix->info;
    struct problem_counts c;
    struct dir_totals t;

    totals(ix, &t);
    index_count_problems(ix, &c);
    printf("{\"dir\":");
    cli_json_string(dir);
    printf(",\"format_version\":%u,\"created_ns\":%" PRIu64 ",\"fingerprint\":", in->format_version,
           in->created_ns);
    ctl_json_hex(in->fingerprint, HASH_BYTES);
    printf(",\"page_tokens\":%u,\"engine_page_tokens\":%u,\"page_bytes\":%u,\"slot_bytes\":%u,"
           "\"slab_slots\":%u,\"slab_files\":%u,\"capacity_slots\":%" PRIu64
           ",\"backed_slots\":%" PRIu64,
           in->page_tokens, ix->engine_page_tokens, in->page_bytes, in->slot_bytes, in->slab_slots,
           in->slab_files, in->capacity_slots, in->backed_slots);
    printf(",\"pages\":%u,\"bytes\":%" PRIu64 ",\"tokens\":%" PRIu64 ",\"free_slots\":%" PRIu64,
           ix->n, (uint64_t)ix->n * in->page_bytes, (uint64_t)ix->n * in->page_tokens,
           free_slots(ix));
    printf(",\"oldest_ns\":%" PRIu64 ",\"newest_ns\":%" PRIu64 ",\"last_access_ns\":%" PRIu64
           ",\"detached\":%" PRIu64 ",\"problems\":",
           t.oldest, t.newest, t.last_access, c.detached);
    problems_json(&c);
    printf(",\"namespaces\":");
    namespaces_json(ix);
    printf("}\n");
}

int cmd_stat(const struct ctl_args *a)
{
    struct ctl_index ix;
    struct dstore *s;
    int rc = ctl_load(a->pos[0], false, &s, &ix);

    if (rc)
        return rc;
    if (a->json)
        stat_json(a->pos[0], &ix);
    else
        stat_text(a->pos[0], &ix);
    ctl_unload(s, &ix);
    return 0;
}

/* ---- ls ---- */

static const struct ctl_index *sort_ix;
static int sort_mode; /* 0 hash, 1 time, 2 created, 3 size */

static int cmp_pages(const void *x, const void *y)
{
    uint32_t i = *(const uint32_t *)x, j = *(const uint32_t *)y;
    const struct page *p = &sort_ix->p[i], *q = &sort_ix->p[j];
    uint64_t a = 0, b = 0;

    if (sort_mode == 1) {
        a = p->atime;
        b = q->atime;
    } else if (sort_mode == 2) {
        a = p->created;
        b = q->created;
    } else if (sort_mode == 3) {
        a = p->depth;
        b = q->depth;
    }
    if (a != b)
        return a > b ? -1 : 1; /* largest (newest, longest) first */
    return (i > j) - (i < j);
}

static uint32_t *sorted_selection(const struct ctl_index *ix, const struct ctl_args *a,
                                  const bool *sel, uint32_t *n)
{
    static const char *const modes[] = {"hash", "time", "created", "size"};
    uint32_t *v = malloc(((size_t)ix->n + 1) * sizeof(*v)), m = 0;

    if (!v)
        return NULL;
    for (uint32_t i = 0; i < ix->n; i++)
        if (sel[i])
            v[m++] = i;
    sort_mode = 0;
    for (int k = 0; a->sort && k < 4; k++)
        if (!strcmp(a->sort, modes[k]))
            sort_mode = k;
    sort_ix = ix;
    qsort(v, m, sizeof(*v), cmp_pages);
    for (uint32_t k = 0; a->reverse && k < m / 2; k++) {
        uint32_t t = v[k];
        v[k] = v[m - 1 - k];
        v[m - 1 - k] = t;
    }
    *n = a->limit && a->limit < m ? (uint32_t)a->limit : m;
    return v;
}

/* Tokens through the page; a page of a recurrent state, a window copy, counts the prefix
 * through the page of KV it follows. */
static uint64_t prefix_tokens(const struct ctl_index *ix, const struct page *p)
{
    return (uint64_t)(p->depth - ns_follows_kv(&ix->ns[p->ns])) * ix->info.page_tokens;
}

static void ls_line(const struct ctl_index *ix, const struct page *p)
{
    char hex[2 * HASH_BYTES + 1], t1[32], t2[32], name[SHORT_HEX + 8], prefix[24], slot[24];

    ctl_hex(p->key, HASH_BYTES, hex);
    hex[SHORT_HEX] = '\0';
    if (p->depth)
        snprintf(prefix, sizeof(prefix), "%" PRIu64, prefix_tokens(ix, p));
    else
        strcpy(prefix, "-");
    snprintf(slot, sizeof(slot), "%u:%u", p->slab, p->slot);
    printf("%-12s  %-12s %8s  %-11s  %-20s  %-20s  %s\n", hex, index_ns_name(ix, p->ns, name),
           prefix, p->problems & BAD_RECORD ? "-" : slot, ctl_time(p->created, t1),
           ctl_time(p->atime, t2), page_state(p));
}

/* A page's members, without the braces around them. */
static void page_json_members(const struct ctl_index *ix, const struct page *p)
{
    printf("\"hash\":");
    ctl_json_hex(p->key, HASH_BYTES);
    printf(",\"state\":\"%s\"", page_state(p));
    if (p->problems & BAD_RECORD)
        return;
    printf(",\"namespace\":");
    ctl_json_hex(ix->ns[p->ns].root, HASH_BYTES);
    printf(",\"parent\":");
    ctl_json_hex(p->parent, HASH_BYTES);
    if (p->depth)
        printf(",\"prefix_tokens\":%" PRIu64, prefix_tokens(ix, p));
    else
        printf(",\"prefix_tokens\":null");
    printf(",\"slab\":%u,\"slot\":%u,\"created_ns\":%" PRIu64 ",\"last_access_ns\":%" PRIu64,
           p->slab, p->slot, p->created, p->atime);
}

static void ls_json_page(const struct ctl_index *ix, const struct page *p)
{
    printf("{");
    page_json_members(ix, p);
    printf("}");
}

static void ls_print(const struct ctl_index *ix, const uint32_t *v, uint32_t n, bool json)
{
    if (json) {
        printf("{\"count\":%u,\"pages\":[", n);
        for (uint32_t k = 0; k < n; k++) {
            printf(k ? "," : "");
            ls_json_page(ix, &ix->p[v[k]]);
        }
        printf("]}\n");
        return;
    }
    printf("%-12s  %-12s %8s  %-11s  %-20s  %-20s  %s\n", "HASH", "NAMESPACE", "PREFIX",
           "SLAB:SLOT", "CREATED", "LAST ACCESS", "STATE");
    for (uint32_t k = 0; k < n; k++)
        ls_line(ix, &ix->p[v[k]]);
}

int cmd_ls(const struct ctl_args *a)
{
    struct ctl_index ix;
    struct dstore *s;
    uint32_t *v = NULL, n = 0;
    bool *sel;
    int rc = ctl_load(a->pos[0], false, &s, &ix);

    if (rc)
        return rc;
    if (!(sel = calloc((size_t)ix.n + 1, 1)))
        rc = ctl_fail("out of memory");
    else if (!(rc = index_select(&ix, a, false, sel)) && !(v = sorted_selection(&ix, a, sel, &n)))
        rc = ctl_fail("out of memory");
    if (!rc)
        ls_print(&ix, v, n, a->json);
    free(v);
    free(sel);
    ctl_unload(s, &ix);
    return rc;
}

/* ---- show ---- */

struct record {
    bool found;
    struct dstore_entry e;
    uint32_t tokens[DSTORE_MAX_TOKENS];
};

static int copy_entry(void *arg, const struct dstore_entry *e)
{
    struct record *r = arg;

    r->found = true;
    r->e = *e;
    if (r->e.ntokens > DSTORE_MAX_TOKENS)
        r->e.ntokens = DSTORE_MAX_TOKENS; /* the store bounds it; print_tokens relies on it */
    if (!e->status)
        memcpy(r->tokens, e->tokens, r->e.ntokens * sizeof(uint32_t));
    r->e.tokens = r->tokens;
    return 0;
}

/* r for key, as the index holds it now (r->found false when it holds none). */
static void lookup(const struct ctl_index *ix, const uint8_t *key, struct record *r)
{
    int tries = 0;

    r->found = false;
    while (ctl_retry(dstore_lookup(ix->s, key, copy_entry, r), &tries))
        ;
}

static void print_tokens(const struct record *r, bool json)
{
    for (uint32_t t = 0; t < r->e.ntokens; t++)
        printf("%s%u", t ? (json ? "," : " ") : "", r->tokens[t]);
}

/* The chain root-first: *len pages into out (sized ix->n), the page last. Links cannot loop
 * (link_pages); seen (ix->n, all false) still stops the walk at a page met before. */
static void chain_of(const struct ctl_index *ix, uint32_t i, uint32_t *out, bool *seen,
                     uint32_t *len)
{
    uint32_t n = 0;

    for (uint32_t k = i; k != NO_PAGE && !seen[k]; k = ix->p[k].up) {
        seen[k] = true;
        out[n++] = k;
    }
    for (uint32_t k = 0; k < n / 2; k++) {
        uint32_t t = out[k];
        out[k] = out[n - 1 - k];
        out[n - 1 - k] = t;
    }
    *len = n;
}

static bool chain_complete(const struct ctl_index *ix, const uint32_t *chain)
{
    const struct page *top = &ix->p[chain[0]];

    return top->ns != NO_PAGE && !memcmp(top->parent, ix->ns[top->ns].root, HASH_BYTES);
}

/* A page of KV at depth (from 1) in its prefix; a window copy is at its page's place. */
static void print_position(const struct ctl_index *ix, uint32_t depth)
{
    printf("position      page %u of its prefix: tokens %" PRIu64 "-%" PRIu64 "\n", depth,
           (uint64_t)(depth - 1) * ix->info.page_tokens,
           (uint64_t)depth * ix->info.page_tokens - 1);
}

static void show_record_text(const struct ctl_index *ix, const struct page *p,
                             const struct record *r)
{
    char hex[2 * HASH_BYTES + 1], t[32], name[SHORT_HEX + 8];

    ctl_hex(p->key, HASH_BYTES, hex);
    printf("page          %s\nstate         %s\n", hex, page_state(p));
    if (p->problems & BAD_RECORD)
        return;
    ctl_hex(ix->ns[p->ns].root, HASH_BYTES, hex);
    printf("namespace     %s (root %s)\n", index_ns_name(ix, p->ns, name), hex);
    ctl_hex(p->parent, HASH_BYTES, hex);
    printf("parent        %s\n", hex);
    if (ix->ns[p->ns].is_windows)
        printf("window copy   of page %.*s (the parent), its window rows current (formats.md)\n",
               SHORT_HEX, hex);
    if (p->depth && ix->ns[p->ns].is_states)
        printf("position      a page of the recurrent state after token %" PRIu64 " (formats.md)\n",
               prefix_tokens(ix, p));
    else if (p->depth)
        print_position(ix, p->depth - ix->ns[p->ns].is_windows);
    printf("slot          slab %u, slot %u (offset %" PRIu64 ")", p->slab, p->slot,
           (uint64_t)p->slot * ix->info.slot_bytes);
    if (r->found && !r->e.status) {
        printf(", %u bytes\n", r->e.length);
        ctl_hex(r->e.checksum, 16, hex);
        printf("checksum      %s (XXH3-128)\n", hex);
    } else {
        printf("\n");
    }
    printf("created       %s\n", ctl_time(p->created, t));
    printf("last access   %s\n", ctl_time(p->atime, t));
    printf("tokens        ");
    if (!r->found)
        printf("(evicted since the index was read)");
    else if (r->e.status)
        printf("(the record fails its checks since the index was read)");
    else
        print_tokens(r, false);
    printf("\n");
}

/* Tokens of a chain: its pages of KV (a state's page or a window copy at its end has none). */
static uint64_t chain_tokens(const struct ctl_index *ix, const uint32_t *chain, uint32_t len)
{
    const struct page *end = &ix->p[chain[len - 1]];

    return (uint64_t)(len - (end->ns != NO_PAGE && ns_follows_kv(&ix->ns[end->ns]))) *
           ix->info.page_tokens;
}

static int show_chain_text(const struct ctl_index *ix, const uint32_t *chain, uint32_t len)
{
    char hex[2 * HASH_BYTES + 1];
    struct record *r = calloc(1, sizeof(*r));

    if (!r)
        return ctl_fail("out of memory");
    if (!chain_complete(ix, chain)) {
        ctl_hex(ix->p[chain[0]].parent, HASH_BYTES, hex);
        printf("\nchain: broken: parent %s is not stored; %u page%s up to it:\n", hex, len,
               len == 1 ? "" : "s");
    } else {
        printf("\nchain from the namespace root: %u page%s, %" PRIu64 " tokens\n", len,
               len == 1 ? "" : "s", chain_tokens(ix, chain, len));
    }
    for (uint32_t k = 0; k < len; k++) {
        const struct page *p = &ix->p[chain[k]];

        lookup(ix, p->key, r);
        ctl_hex(p->key, HASH_BYTES, hex);
        hex[SHORT_HEX] = '\0';
        printf("%5u  %s ", k + 1, hex);
        if (r->found && !r->e.status)
            print_tokens(r, false);
        printf(p->problems || p->detached ? "  [%s]\n" : "\n", page_state(p));
    }
    free(r);
    return 0;
}

static void show_json_page(const struct ctl_index *ix, const struct page *p, struct record *r)
{
    lookup(ix, p->key, r);
    printf("{");
    page_json_members(ix, p);
    if (r->found && !r->e.status) {
        printf(",\"length\":%u,\"checksum\":", r->e.length);
        ctl_json_hex(r->e.checksum, 16);
        printf(",\"tokens\":[");
        print_tokens(r, true);
        printf("]");
    }
    printf("}");
}

static int show_json(const struct ctl_index *ix, uint32_t i, const uint32_t *chain, uint32_t len)
{
    struct record *r = calloc(1, sizeof(*r));

    if (!r)
        return ctl_fail("out of memory");
    printf("{\"page\":");
    show_json_page(ix, &ix->p[i], r);
    printf(",\"chain_complete\":%s,\"chain\":[", chain_complete(ix, chain) ? "true" : "false");
    for (uint32_t k = 0; k < len; k++) {
        printf(k ? "," : "");
        show_json_page(ix, &ix->p[chain[k]], r);
    }
    printf("]}\n");
    free(r);
    return 0;
}

static int show_text(const struct ctl_index *ix, uint32_t i, const uint32_t *chain, uint32_t len)
{
    struct record *r = calloc(1, sizeof(*r));

    if (!r)
        return ctl_fail("out of memory");
    /* The page may have been evicted (a miss) or rewritten since the index was read. */
    lookup(ix, ix->p[i].key, r);
    show_record_text(ix, &ix->p[i], r);
    free(r);
    if (ix->p[i].problems & BAD_RECORD)
        return 0;
    return show_chain_text(ix, chain, len);
}

int cmd_show(const struct ctl_args *a)
{
    struct ctl_index ix;
    struct dstore *s;
    uint32_t i, *chain = NULL, len = 0;
    bool *seen = NULL;
    int rc = ctl_load(a->pos[0], false, &s, &ix);

    if (rc)
        return rc;
    if (!(rc = index_find(&ix, a->pos[1], &i))) {
        chain = malloc(((size_t)ix.n + 1) * sizeof(*chain));
        seen = calloc((size_t)ix.n + 1, sizeof(*seen));
        if (!chain || !seen)
            rc = ctl_fail("out of memory");
    }
    if (!rc) {
        chain_of(&ix, i, chain, seen, &len);
        rc = a->json ? show_json(&ix, i, chain, len) : show_text(&ix, i, chain, len);
    }
    free(seen);
    free(chain);
    ctl_unload(s, &ix);
    return rc;
}
