/*
 * tree: the prefix forest of a data dir, rebuilt from parent links. A run of pages that each
 * have one child is one node, as in the engine's radix tree, so a dir of long prompts reads
 * as its branch points. Three renderings of one walk: text, JSON and Graphviz.
 */
#include <errno.h>
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
    /* Each page is drawn once at most, so even links that looped could not hang the walk;
     * scratch of ix->n each for finding where detached subtrees start. */
    bool *drawn, *placed;
    uint32_t *starts, *stack;
};

/* One node: a run of pages from first to last, each but the last with one selected child. */
struct run {
    uint32_t first, last, pages, bad;
    uint32_t pos; /* the first page's place in its prefix (1-based); 0: unknown (detached) */
    uint32_t problems;
};

static uint32_t selected_children(const struct tree *t, uint32_t i, uint32_t *only)
{
    uint32_t n = 0;

    for (uint32_t c = t->ix->p[i].child; c != NO_PAGE; c = t->ix->p[c].next)
        if (t->sel[c] && !t->drawn[c]) {
            *only = c;
            n++;
        }
    return n;
}

static struct run run_from(struct tree *t, uint32_t first, uint32_t pos)
{
    struct run r = {.first = first, .last = first, .pos = pos};
    uint32_t next;

    for (;;) {
        const struct page *p = &t->ix->p[r.last];

        t->drawn[r.last] = true;
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
        count += t->sel[c] && !t->drawn[c];
    for (uint32_t c = list; c != NO_PAGE; c = t->ix->p[c].next)
        if (t->sel[c] && !t->drawn[c]) {
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

/* Detached subtrees start at a page whose parent is not its root and is not stored, or is
 * stored as a record that fails its checks (so it names no parent of its own). */
static bool detached_top(const struct ctl_index *ix, uint32_t i)
{
    const struct page *p = &ix->p[i];

    return p->ns != NO_PAGE && p->up == NO_PAGE &&
           memcmp(p->parent, ix->ns[p->ns].root, HASH_BYTES);
}

/* Mark placed i and every selected page below it not placed yet: what walk() will draw. */
static void place_subtree(struct tree *t, uint32_t i)
{
    uint32_t top = 0;

    t->placed[i] = true;
    t->stack[top++] = i;
    while (top) {
        uint32_t k = t->stack[--top];

        for (uint32_t c = t->ix->p[k].child; c != NO_PAGE; c = t->ix->p[c].next)
            if (t->sel[c] && !t->placed[c]) {
                t->placed[c] = true;
                t->stack[top++] = c;
            }
    }
}

/* Where the detached subtrees start, into t->starts: each detached top not drawn yet, then a
 * page of whatever is still undrawn (were parent links ever to loop, which link_pages rules
 * out), so that no selected page vanishes from the tree. */
static uint32_t detached_starts(struct tree *t)
{
    uint32_t n = 0;

    memcpy(t->placed, t->drawn, t->ix->n * sizeof(*t->placed));
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < t->ix->n; i++)
            if (t->sel[i] && !t->placed[i] && t->ix->p[i].ns != NO_PAGE &&
                (pass || detached_top(t->ix, i))) {
                t->starts[n++] = i;
                place_subtree(t, i);
            }
    return n;
}

static void draw_detached(struct tree *t)
{
    uint32_t count = detached_starts(t);

    if (t->fmt == TREE_TEXT && count)
        printf("detached (parent not on disk): %u subtree%s\n", count, count == 1 ? "" : "s");
    if (t->fmt == TREE_DOT && count)
        printf("  detached [label=\"detached\\n(parent not on disk)\", shape=ellipse];\n");
    for (uint32_t k = 0; k < count; k++)
        walk(t, t->starts[k], 0, "detached", k + 1 == count, k > 0);
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
        printf("],\"detached\":[");
    draw_detached(t);
    if (t->fmt == TREE_JSON)
        printf("],\"corrupt_records\":%" PRIu64 "}\n", bad);
    else if (t->fmt == TREE_DOT)
        printf("}\n");
    else if (bad)
        printf("%" PRIu64 " record%s failed their checks and are not shown (see verify)\n", bad,
               bad == 1 ? "" : "s");
}

static int tree_alloc(struct tree *t, uint32_t n)
{
    t->drawn = calloc((size_t)n + 1, sizeof(*t->drawn));
    t->placed = calloc((size_t)n + 1, sizeof(*t->placed));
    t->starts = malloc(((size_t)n + 1) * sizeof(*t->starts));
    t->stack = malloc(((size_t)n + 1) * sizeof(*t->stack));
    return t->drawn && t->placed && t->starts && t->stack ? 0 : -ENOMEM;
}

static void tree_free(struct tree *t)
{
    if (!t)
        return;
    free(t->drawn);
    free(t->placed);
    free(t->starts);
    free(t->stack);
    free(t);
}

int cmd_tree(const struct ctl_args *a)
{
    struct ctl_index ix;
    struct dstore *s;
    struct tree *t;
    bool *sel = NULL;
    int rc = ctl_load(a->pos[0], false, &s, &ix);

    if (rc)
        return rc;
    t = calloc(1, sizeof(*t));
    if (!t || !(sel = calloc((size_t)ix.n + 1, 1)) || tree_alloc(t, ix.n))
        rc = ctl_fail("out of memory");
    else if (!(rc = index_select(&ix, a, false, sel))) {
        t->ix = &ix;
        t->sel = sel;
        t->fmt = a->json ? TREE_JSON : a->dot ? TREE_DOT : TREE_TEXT;
        draw(t);
    }
    free(sel);
    tree_free(t);
    ctl_unload(s, &ix);
    return rc;
}
