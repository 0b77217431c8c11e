/*
 * tree: the prefix forest of a data dir, rebuilt from parent links. A run of pages that each
 * have one child is one node, as in the engine's radix tree, so a dir of long prompts reads
 * as its branch points. Three renderings of one walk: text, JSON and Graphviz.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ctl.h"

#define MAX_INDENT 2048 /* deeper branches are drawn without further indentation */

enum tree_format { TREE_TEXT, TREE_JSON, TREE_DOT };

struct tree {
    const struct ctl_index *ix;
    const bool *sel;
    enum tree_format fmt;
    char indent[MAX_INDENT + 8];
};

/* One node: a run of pages from first to last, each but the last with one selected child. */
struct run {
    uint32_t first, last, pages, bad;
    uint32_t pos; /* the first page's place in its prefix (1-based); 0: unknown (orphans) */
    uint32_t problems;
};

static uint32_t selected_children(const struct tree *t, uint32_t i, uint32_t *only)
{
    uint32_t n = 0;

    for (uint32_t c = t->ix->p[i].child; c != NO_PAGE; c = t->ix->p[c].next)
        if (t->sel[c]) {
            *only = c;
            n++;
        }
    return n;
}

static struct run run_from(const struct tree *t, uint32_t first, uint32_t pos)
{
    struct run r = {.first = first, .last = first, .pos = pos};
    uint32_t next;

    for (;;) {
        const struct page *p = &t->ix->p[r.last];

        r.pages++;
        r.bad += p->problems != 0;
        r.problems |= p->problems;
        if (selected_children(t, r.last, &next) != 1 || r.pages >= t->ix->n)
            return r;
        r.last = next;
    }
}

static void short_hex(const uint8_t *key, char *out)
{
    ctl_hex(key, HASH_BYTES, out);
    out[SHORT_HEX] = '\0';
}

/* "0a1b2c3d4e5f..77aa88bb99cc  12 pages, tokens 0-191" */
static void run_label(const struct tree *t, const struct run *r, char *buf, size_t len)
{
    char a[2 * HASH_BYTES + 1], b[2 * HASH_BYTES + 1], where[64] = "";
    uint64_t pt = t->ix->info.page_tokens;
    int n;

    short_hex(t->ix->p[r->first].key, a);
    short_hex(t->ix->p[r->last].key, b);
    if (r->pos)
        snprintf(where, sizeof(where), ", tokens %" PRIu64 "-%" PRIu64, (r->pos - 1) * pt,
                 (r->pos - 1 + (uint64_t)r->pages) * pt - 1);
    n = snprintf(buf, len, "%s%s%s  %u page%s%s", a, r->pages > 1 ? ".." : "",
                 r->pages > 1 ? b : "", r->pages, r->pages == 1 ? "" : "s", where);
    if (r->bad && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "  [%u %s]", r->bad, problem_name(r->problems));
}

static void walk(struct tree *t, uint32_t first, uint32_t pos, const char *parent_id, bool last,
                 bool comma);

/* The selected children of page i (or, with i NO_PAGE, the pages from list on, linked by
 * next), each drawn as a subtree. */
static void walk_children(struct tree *t, uint32_t list, uint32_t pos, const char *id)
{
    uint32_t count = 0, seen = 0;

    for (uint32_t c = list; c != NO_PAGE; c = t->ix->p[c].next)
        count += t->sel[c];
    for (uint32_t c = list; c != NO_PAGE; c = t->ix->p[c].next)
        if (t->sel[c]) {
            seen++;
            walk(t, c, pos, id, seen == count, seen > 1);
        }
}

static void node_open(struct tree *t, const struct run *r, const char *parent_id, bool last,
                      bool comma, char *id)
{
    char label[160], hex[2 * HASH_BYTES + 1];

    run_label(t, r, label, sizeof(label));
    snprintf(id, 24, "p%u", r->first);
    if (t->fmt == TREE_TEXT) {
        printf("%s%s%s\n", t->indent, last ? "`-- " : "|-- ", label);
    } else if (t->fmt == TREE_DOT) {
        printf("  %s [label=\"%s\"%s];\n  %s -> %s;\n", id, label,
               r->bad ? ", color=red, fontcolor=red" : "", parent_id, id);
    } else {
        ctl_hex(t->ix->p[r->first].key, HASH_BYTES, hex);
        printf("%s{\"first\":\"%s\",", comma ? "," : "", hex);
        ctl_hex(t->ix->p[r->last].key, HASH_BYTES, hex);
        printf("\"last\":\"%s\",\"pages\":%u,\"problem_pages\":%u,", hex, r->pages, r->bad);
        if (r->pos)
            printf("\"first_token\":%" PRIu64 ",",
                   (uint64_t)(r->pos - 1) * t->ix->info.page_tokens);
        printf("\"children\":[");
    }
}

static void walk(struct tree *t, uint32_t first, uint32_t pos, const char *parent_id, bool last,
                 bool comma)
{
    struct run r = run_from(t, first, pos);
    size_t len = strlen(t->indent);
    char id[24];

    node_open(t, &r, parent_id, last, comma, id);
    if (len < MAX_INDENT)
        strcpy(t->indent + len, last ? "    " : "|   ");
    walk_children(t, t->ix->p[r.last].child, pos ? pos + r.pages : 0, id);
    t->indent[len] = '\0';
    if (t->fmt == TREE_JSON)
        printf("]}");
}

/* ---- the forest ---- */

static uint32_t ns_selected(const struct tree *t, uint32_t n)
{
    uint32_t count = 0;

    for (uint32_t c = t->ix->ns[n].first; c != NO_PAGE; c = t->ix->p[c].next)
        count += t->sel[c];
    return count;
}

static void namespace_open(struct tree *t, uint32_t n, bool comma, char *id)
{
    const struct ns_info *ns = &t->ix->ns[n];
    char name[SHORT_HEX + 8], hex[2 * HASH_BYTES + 1];

    index_ns_name(t->ix, n, name);
    ctl_hex(ns->root, HASH_BYTES, hex);
    snprintf(id, 24, "ns%u", n);
    if (t->fmt == TREE_TEXT)
        printf("namespace %s (root %.*s): %" PRIu64 " pages\n", name, SHORT_HEX, hex, ns->pages);
    else if (t->fmt == TREE_DOT)
        printf("  %s [label=\"namespace %s\\nroot %.*s\", shape=ellipse];\n", id, name, SHORT_HEX,
               hex);
    else
        printf("%s{\"root\":\"%s\",\"default\":%s,\"pages\":%" PRIu64 ",\"children\":[",
               comma ? "," : "", hex, ns->is_default ? "true" : "false", ns->pages);
}

/* Orphan subtrees start at a page whose parent is not its root and is not stored, or is
 * stored as a record that fails its checks (so it names no parent of its own). */
static bool orphan_top(const struct ctl_index *ix, uint32_t i)
{
    const struct page *p = &ix->p[i];

    return p->ns != NO_PAGE && p->up == NO_PAGE &&
           memcmp(p->parent, ix->ns[p->ns].root, HASH_BYTES);
}

static void draw_orphans(struct tree *t)
{
    uint32_t count = 0, seen = 0;

    for (uint32_t i = 0; i < t->ix->n; i++)
        count += t->sel[i] && orphan_top(t->ix, i);
    if (t->fmt == TREE_TEXT && count)
        printf("orphaned (parent missing or unreadable): %u subtree%s\n", count,
               count == 1 ? "" : "s");
    if (t->fmt == TREE_DOT && count)
        printf("  orphans [label=\"orphaned\\n(parent missing or unreadable)\", shape=ellipse, "
               "color=red];\n");
    for (uint32_t i = 0; i < t->ix->n; i++)
        if (t->sel[i] && orphan_top(t->ix, i)) {
            seen++;
            walk(t, i, 0, "orphans", seen == count, seen > 1);
        }
}

static void draw(struct tree *t)
{
    bool comma = false;
    char id[24];
    uint64_t bad = t->ix->bad_keys;

    for (uint32_t i = 0; i < t->ix->n; i++)
        bad += (t->ix->p[i].problems & BAD_RECORD) != 0;
    if (t->fmt == TREE_JSON)
        printf("{\"namespaces\":[");
    else if (t->fmt == TREE_DOT)
        printf("digraph kvtier {\n  rankdir=LR;\n  node [shape=box, fontname=\"monospace\"];\n");
    for (uint32_t n = 0; n < t->ix->nns; n++) {
        if (!ns_selected(t, n))
            continue;
        namespace_open(t, n, comma, id);
        comma = true;
        walk_children(t, t->ix->ns[n].first, 1, id);
        if (t->fmt == TREE_JSON)
            printf("]}");
    }
    if (t->fmt == TREE_JSON)
        printf("],\"orphaned\":[");
    draw_orphans(t);
    if (t->fmt == TREE_JSON)
        printf("],\"corrupt_records\":%" PRIu64 "}\n", bad);
    else if (t->fmt == TREE_DOT)
        printf("}\n");
    else if (bad)
        printf("%" PRIu64 " record%s failed their checks and are not shown (see verify)\n", bad,
               bad == 1 ? "" : "s");
}

int cmd_tree(const struct ctl_args *a)
{
    struct ctl_index ix;
    struct dstore *s;
    struct tree *t;
    bool *sel = NULL;
    int rc = ctl_load(a->pos[0], &s, &ix);

    if (rc)
        return rc;
    t = calloc(1, sizeof(*t));
    if (!t || !(sel = calloc((size_t)ix.n + 1, 1)))
        rc = ctl_fail("out of memory");
    else if (!(rc = index_select(&ix, a, false, sel))) {
        *t = (struct tree){.ix = &ix, .sel = sel};
        t->fmt = a->json ? TREE_JSON : a->dot ? TREE_DOT : TREE_TEXT;
        draw(t);
    }
    free(sel);
    free(t);
    ctl_unload(s, &ix);
    return rc;
}
