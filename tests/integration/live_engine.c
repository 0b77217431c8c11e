/*
 * live_engine: a small serving loop for kvtier-ctl's live tests (test_ctl.py), built only
 * for the tests. It opens an engine (sim backend, tiny geometry, a host tier, optionally a
 * disk data dir) with a stats socket, then serves requests in namespaces that share
 * prefixes, as a scheduler would (begin, extend, finish, poll), until SIGTERM or SIGINT,
 * when it closes the engine cleanly and exits 0.
 *
 * usage: live_engine --socket PATH [--dir DIR] [--namespaces N] [--requests N]
 *                    [--pause-us U] [--hybrid mamba|swa]
 *   --hybrid K     a hybrid model: 2 recurrent layers (mamba; with the host tier) or a
 *                  32-token window on layer 0 (swa; the device alone); no disk tier
 *   --requests N   serve N requests, then only poll until signalled (default: no limit)
 *   --pause-us U   sleep U microseconds after each request (default 1000), so the figures
 *                  move at a pace a test can watch
 * "ready" is printed on stdout once the engine (and so the socket) is up; "served N" when
 * N requests are done.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvtier.h"

#define PAGE 16
#define DEVICE_TOKENS 4096
#define HOST_TOKENS 16384
#define DISK_BYTES (64ull << 20)
#define MAX_CONTEXT 1024
#define SHARED_TOKENS 64 /* per namespace: a system prompt */
#define CONV_TOKENS 256  /* per conversation */
#define CONVERSATIONS 24
#define TAILS 400 /* distinct request tails */

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

struct config {
    const char *socket, *dir, *hybrid;
    uint32_t namespaces;
    uint64_t requests;
    long pause_us;
};

static uint32_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)(x % 128000u);
}

/* Request r: its namespace's prompt, its conversation's history, then tokens of its own,
 * drawn from a bounded set, so the KV the requests make stays within the disk tier and a
 * prefix evicted from the host comes back from disk. */
static size_t make_tokens(uint64_t r, uint32_t ns, uint32_t *t)
{
    uint64_t conv = r % CONVERSATIONS, own = 32 + r % 97;
    size_t n = 0;

    for (uint32_t i = 0; i < SHARED_TOKENS; i++)
        t[n++] = mix((uint64_t)ns << 32 | i);
    for (uint32_t i = 0; i < CONV_TOKENS; i++)
        t[n++] = mix(conv << 40 | (uint64_t)ns << 32 | (i + 1000));
    for (uint64_t i = 0; i < own; i++)
        t[n++] = mix((r % TAILS) << 20 | (i + 7));
    return n;
}

static int fail(const char *call, int rc)
{
    fprintf(stderr, "live_engine: %s: %s\n", call, kvt_strerror(rc));
    return 1;
}

static int open_engine(const struct config *c, kvt_engine **e)
{
    struct kvt_options o;

    kvt_options_init(&o, sizeof(o));
    o.geometry = (struct kvt_geometry){
        .attention = KVT_ATTN_MHA, .layers = 2, .kv_heads = 1, .head_dim = 16, .dtype_bytes = 2};
    o.page_size = PAGE;
    o.backend = KVT_BACKEND_SIM;
    o.device_tokens = DEVICE_TOKENS;
    o.max_requests = 4;
    o.max_context = MAX_CONTEXT;
    o.model_id = "live-engine";
    o.host_tokens = HOST_TOKENS;
    o.disk_dir = c->dir;
    o.disk_bytes = c->dir ? DISK_BYTES : 0;
    o.store_page_tokens = o.page_size; /* a store page to a page: what the tests count */
    o.stats_socket = c->socket;
    static const uint32_t full_layer = 1;
    if (c->hybrid) { /* no disk (hybrid engines refuse one); no host tier with windows */
        o.host_tokens = strcmp(c->hybrid, "mamba") ? 0 : HOST_TOKENS;
        o.disk_dir = NULL;
        o.disk_bytes = 0;
        if (!strcmp(c->hybrid, "mamba"))
            o.mamba = (struct kvt_mamba){.layers = 2,
                                         .conv_bytes = 64,
                                         .ssm_bytes = 256,
                                         .chunk = 64,
                                         .track_interval = 256};
        else
            o.swa = (struct kvt_swa){.window = 32, .nfull = 1, .full_layers = &full_layer};
    }
    int rc = kvt_open(&o, e);
    return rc ? fail("kvt_open", rc) : 0;
}

static int make_room(kvt_engine *e, size_t tokens)
{
    size_t avail = kvt_available(e);
    int rc = avail < tokens ? kvt_evict(e, tokens - avail, NULL) : 0;

    return rc ? fail("kvt_evict", rc) : 0;
}

/* Allocate and record the slots of tokens [hit, len) of the request. */
static int extend(kvt_engine *e, const struct kvt_req *req, size_t hit, size_t len, int32_t *slots)
{
    uint32_t prefix = (uint32_t)hit, seq = (uint32_t)len;
    int32_t last = -1;
    int rc;

    if (hit && (rc = kvt_req_read(e, req, hit - 1, 1, &last)))
        return fail("kvt_req_read", rc);
    if ((rc = make_room(e, (len - hit + PAGE - 1) / PAGE * PAGE)))
        return rc;
    if ((rc = kvt_alloc_extend(e, 1, &prefix, &seq, &last, slots, len - hit)))
        return fail("kvt_alloc_extend", rc);
    if ((rc = kvt_req_write(e, req, hit, slots, len - hit)))
        return fail("kvt_req_write", rc);
    return 0;
}

static int serve(kvt_engine *e, uint64_t r, uint32_t namespaces, uint32_t *tokens, int32_t *slots)
{
    char ns[32];
    uint32_t which = (uint32_t)(r % namespaces);
    int ns_len = which ? snprintf(ns, sizeof(ns), "tenant-%u", which) : 0;
    struct kvt_key key = {.tokens = tokens, .ns = ns_len ? ns : NULL, .ns_len = (size_t)ns_len};
    struct kvt_req req;
    int rc, failed;

    size_t len = make_tokens(r, which, tokens);

    key.len = len - 1; /* the last input token is always computed, as in SGLang */
    if ((rc = kvt_req_begin(e, &key, &req)))
        return fail("kvt_req_begin", rc);
    for (uint32_t l = 0; req.load_op && l < 2; l++)
        if ((rc = kvt_load_wait_layer(e, req.load_op, l, NULL)))
            return fail("kvt_load_wait_layer", rc);
    failed = extend(e, &req, req.protected_len, len, slots);
    key.len = failed ? req.protected_len : len;
    if ((rc = kvt_req_cache_finished(e, &req, &key, 0, !failed)))
        return fail("kvt_req_cache_finished", rc);
    return failed;
}

static void pause_for(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};

    if (us > 0)
        nanosleep(&ts, NULL);
}

static int run(const struct config *c, kvt_engine *e)
{
    uint32_t *tokens = malloc(MAX_CONTEXT * sizeof(*tokens));
    int32_t *slots = malloc(MAX_CONTEXT * sizeof(*slots));
    int rc = tokens && slots ? 0 : fail("malloc", -ENOMEM);
    uint64_t r = 0;

    while (!rc && !stop) {
        if (!c->requests || r < c->requests) {
            rc = serve(e, r++, c->namespaces, tokens, slots);
            if (!rc && r == c->requests && !(rc = kvt_sync(e)))
                printf("served %" PRIu64 "\n", r), fflush(stdout);
        }
        if (!rc && (rc = kvt_poll(e, 0, NULL)))
            rc = fail("kvt_poll", rc);
        pause_for(c->requests && r >= c->requests ? 20000 : c->pause_us);
    }
    free(tokens);
    free(slots);
    return rc;
}

static int parse(int argc, char **argv, struct config *c)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];

        if (!strcmp(o, "--socket"))
            c->socket = v;
        else if (!strcmp(o, "--dir"))
            c->dir = v;
        else if (!strcmp(o, "--namespaces"))
            c->namespaces = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(o, "--requests"))
            c->requests = strtoull(v, NULL, 10);
        else if (!strcmp(o, "--pause-us"))
            c->pause_us = strtol(v, NULL, 10);
        else if (!strcmp(o, "--hybrid") && (!strcmp(v, "mamba") || !strcmp(v, "swa")))
            c->hybrid = v;
        else
            return 2;
    }
    return c->socket && c->namespaces && argc % 2 ? 0 : 2;
}

int main(int argc, char **argv)
{
    struct config c = {.namespaces = 1, .pause_us = 1000};
    struct sigaction sa = {.sa_handler = on_signal};
    kvt_engine *e;
    int rc;

    if (parse(argc, argv, &c)) {
        fprintf(stderr, "usage: live_engine --socket PATH [--dir DIR] [--namespaces N] "
                        "[--requests N] [--pause-us U] [--hybrid mamba|swa]\n");
        return 2;
    }
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (open_engine(&c, &e))
        return 1;
    printf("ready\n");
    fflush(stdout);
    rc = run(&c, e);
    kvt_close(e);
    return rc;
}
