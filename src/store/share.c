/*
 * Views of one store (share.h). Every op submitted through a view is remembered with its
 * view until that view collects it; a completion collected by another view's poll waits in
 * its record (done) for its own view.
 */
#include "store/share.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct share;

struct share_view {
    struct kvt_store base; /* first: a view is a store */
    struct share *sh;
    uint32_t index;
    bool open;
};

/* An op submitted through a view and not yet handed to it. */
struct share_op {
    uint64_t id;
    uint32_t view;
    bool done; /* collected from the store: d is its completion */
    struct store_done d;
};

struct share {
    struct kvt_store *store;
    struct store_ops ops; /* the views' table: the store's kind (remote) and names */
    struct share_view views[STORE_SHARE_MAX];
    uint32_t nviews, open;
    struct share_op *op; /* in submission order */
    size_t nops, cap;
    uint64_t last_id; /* the highest op id the store handed out through a view */
};

static struct share_view *view_of(struct kvt_store *s)
{
    return (struct share_view *)s;
}

/* ---- the records of ops ---- */

static int reserve(struct share *sh)
{
    if (sh->nops < sh->cap)
        return 0;
    size_t ncap = sh->cap ? sh->cap * 2 : 16;
    struct share_op *v = realloc(sh->op, ncap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    sh->op = v;
    sh->cap = ncap;
    return 0;
}

static void record(struct share *sh, uint32_t view, uint64_t id)
{
    sh->op[sh->nops++] = (struct share_op){.id = id, .view = view};
    if (id > sh->last_id)
        sh->last_id = id;
}

static struct share_op *find(struct share *sh, uint64_t id)
{
    for (size_t i = 0; i < sh->nops; i++)
        if (sh->op[i].id == id)
            return &sh->op[i];
    return NULL;
}

static void forget(struct share *sh, struct share_op *op)
{
    size_t i = (size_t)(op - sh->op);

    memmove(op, op + 1, (sh->nops - i - 1) * sizeof(*op));
    sh->nops--;
}

/* A completion the store gave: to out when it is view's (room for it is known), else kept
 * for its own view. 1 when it went to out. */
static int route(struct share *sh, uint32_t view, const struct store_done *d,
                 struct store_done *out)
{
    struct share_op *op = find(sh, d->op);

    if (!op)
        return 0; /* not submitted through a view: cannot happen */
    if (op->view == view) {
        *out = *d;
        forget(sh, op);
        return 1;
    }
    op->done = true;
    op->d = *d;
    return 0;
}

/* ---- the contract ---- */

static int share_leading_run(struct kvt_store *s, const uint8_t *keys, size_t n, size_t *run)
{
    return store_leading_run(view_of(s)->sh->store, keys, n, run);
}

static size_t share_run_remote(struct kvt_store *s, size_t pages)
{
    return store_run_remote(view_of(s)->sh->store, pages);
}

static int share_read(struct kvt_store *s, const struct store_rpage *pages, size_t n, int *results,
                      uint64_t *op, size_t *leading)
{
    struct share_view *v = view_of(s);
    int rc = reserve(v->sh);

    if (rc == 0 && (rc = store_read(v->sh->store, pages, n, results, op, leading)) == 0)
        record(v->sh, v->index, *op);
    return rc;
}

static int share_write(struct kvt_store *s, const struct store_wpage *pages, size_t n, int *results,
                       uint64_t *op)
{
    struct share_view *v = view_of(s);
    int rc = reserve(v->sh);

    if (rc == 0 && (rc = store_write(v->sh->store, pages, n, results, op)) == 0)
        record(v->sh, v->index, *op);
    return rc;
}

/* The view's completions kept for it, then what the store has: never more of them than max,
 * so none is collected that does not fit (others' go to their records). */
static size_t share_poll(struct kvt_store *s, struct store_done *done, size_t max)
{
    struct share_view *v = view_of(s);
    struct share *sh = v->sh;
    struct store_done d[16];
    size_t n = 0, got;

    for (size_t i = 0; i < sh->nops && n < max;)
        if (sh->op[i].view == v->index && sh->op[i].done) {
            done[n++] = sh->op[i].d;
            forget(sh, &sh->op[i]);
        } else {
            i++;
        }
    while (n < max && (got = store_poll(sh->store, d, max - n < 16 ? max - n : 16)) > 0)
        for (size_t i = 0; i < got; i++)
            n += (size_t)route(sh, v->index, &d[i], &done[n]);
    return n;
}

static int share_wait_for(struct kvt_store *s, uint64_t id, int timeout_ms, struct store_done *done)
{
    struct share_view *v = view_of(s);
    struct share *sh = v->sh;
    struct share_op *op = find(sh, id);
    int rc;

    if (!op)
        return id == 0 || id > sh->last_id ? -EINVAL : -ENOENT;
    if (op->view != v->index)
        return -EINVAL; /* another view's: never issued through this one */
    if (op->done) {
        *done = op->d;
        forget(sh, op);
        return 0;
    }
    if ((rc = store_wait_for(sh->store, id, timeout_ms, done)) == 0)
        forget(sh, find(sh, id));
    return rc;
}

static int share_drain(struct kvt_store *s)
{
    return store_drain(view_of(s)->sh->store);
}

static void share_stats(struct kvt_store *s, struct store_stats *st)
{
    store_stats(view_of(s)->sh->store, st);
}

/* The view's ops land first (their buffers are the view user's, freed after this returns);
 * the last view to go closes the store. */
static void share_close(struct kvt_store *s)
{
    struct share_view *v = view_of(s);
    struct share *sh = v->sh;
    struct store_done d;

    for (size_t i = 0; i < sh->nops;) {
        if (sh->op[i].view != v->index) {
            i++;
            continue;
        }
        if (!sh->op[i].done)
            (void)store_wait_for(sh->store, sh->op[i].id, -1, &d); /* it lands, whatever */
        forget(sh, &sh->op[i]);
    }
    v->open = false;
    if (--sh->open > 0)
        return;
    store_close(sh->store);
    free(sh->op);
    free(sh);
}

int store_share_open(struct kvt_store *store, size_t n, struct kvt_store **views)
{
    struct share *sh;

    if (!store || n < 2 || n > STORE_SHARE_MAX)
        return -EINVAL;
    if (!(sh = calloc(1, sizeof(*sh))))
        return -ENOMEM;
    sh->store = store;
    sh->ops = (struct store_ops){
        .name = store->ops->name,
        .remote = store->ops->remote,
        .parts = store->ops->parts, /* pages pass through as they are */
        .leading_run = share_leading_run,
        .read = share_read,
        .write = share_write,
        .poll = share_poll,
        .wait_for = share_wait_for,
        .drain = share_drain,
        .stats = share_stats,
        .run_remote = store->ops->run_remote ? share_run_remote : NULL,
        .close = share_close,
    };
    sh->nviews = sh->open = (uint32_t)n;
    for (uint32_t i = 0; i < n; i++) {
        sh->views[i] =
            (struct share_view){{&sh->ops, store->page_bytes, store->page_tokens}, sh, i, true};
        views[i] = &sh->views[i].base;
    }
    return 0;
}
