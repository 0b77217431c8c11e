/* kvtier-bench's engine (bench.h): kvt_open from the options, its errors told in terms of the
 * options given, and the buffers of a request. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "datadir.h"

/* ---- kvt_open's errors, told in terms of the options given ---- */

/* Bytes of the disk tier's slab files for --disk-tokens (docs/formats.md): a page below 4 KiB
 * takes its bytes and its head (160 bytes and 4 a token) in 64-byte steps, a larger one its
 * whole blocks and one more for the rest and the head. */
static uint64_t disk_bytes(const struct config *cfg, uint64_t ps)
{
    uint64_t page = kvt_cell_bytes(&cfg->g) * ps, head = 160 + 4 * ps, slot;

    if (page < 4096)
        slot = ((page + 7) / 8 * 8 + head + 63) / 64 * 64;
    else
        slot = page / 4096 * 4096 + ((page % 4096 + 7) / 8 * 8 + head + 4095) / 4096 * 4096;
    return (cfg->disk_tokens + ps - 1) / ps * slot;
}

/* What is wrong with --dir for an error of the data dir, and what to do; NULL for
 * KVT_EFINGERPRINT, -ENOSPC and -EDQUOT (dir_error words them) and for errors of other
 * parts. */
static const char *dir_problem(int rc)
{
    switch (rc) {
    case KVT_EFORMAT:
        return "not a kvtier data dir (it holds other files), or one a newer kvtier wrote: give "
               "a new or empty dir, or a kvtier data dir";
    case KVT_ECORRUPT:
        return "its index is damaged: look with kvtier-ctl verify, or use another --dir";
    case -EBUSY:
        return "another process (an engine, or another kvtier-bench) has it open: wait for it "
               "to end, or use another --dir";
    case -ENOENT:
        return "its parent dir does not exist (only the last part of the path is created): "
               "create the parent first";
    case -ENOTDIR:
        return "it, or a dir on its path, is not a directory: give a directory's path";
    case -EACCES:
    case -EPERM:
        return "permission denied: give a dir this user may create and write";
    case -EROFS:
        return "on a read-only file system: give a dir on a writable one";
    case -ENAMETOOLONG:
        return "the path is too long";
    case -ELOOP:
        return "too many symbolic links on its path";
    case -EIO:
        return "an I/O error reading or writing it: check the disk, or use another --dir";
    default:
        return NULL;
    }
}

/* Whether rc is an error of the data dir, which dir_error words. */
static bool is_dir_error(const struct config *cfg, int rc)
{
    char entry[2 * CLI_PATH_ECHO_MAX + 128];

    return dir_problem(rc) || rc == KVT_EFINGERPRINT || rc == -ENOSPC || rc == -EDQUOT ||
           (rc > -4096 && cli_dir_problem(cfg->dir, cfg->dir, entry, sizeof(entry)));
}

/* The options of kvt_open that name a path or a server, for an error none of them explains:
 * which ones this run gave, in buf. */
static const char *open_paths(const struct config *cfg, char *buf, size_t len)
{
    char clip[CLI_PATH_ECHO_MAX + 4];
    size_t n = 0;

    buf[0] = '\0';
    if (cfg->dir)
        n += (size_t)snprintf(buf + n, len - n, " --dir %s",
                              cli_clip(cfg->dir, CLI_PATH_ECHO_MAX, clip));
    if (cfg->remote && n < len)
        n += (size_t)snprintf(buf + n, len - n, " --remote %s",
                              cli_clip(cfg->remote, CLI_PATH_ECHO_MAX, clip));
    if (cfg->remote_tls_ca && n < len)
        n += (size_t)snprintf(buf + n, len - n, " --remote-tls-ca %s",
                              cli_clip(cfg->remote_tls_ca, CLI_PATH_ECHO_MAX, clip));
    if (cfg->remote_tls_cert && n < len)
        snprintf(buf + n, len - n, " --remote-tls-cert %s",
                 cli_clip(cfg->remote_tls_cert, CLI_PATH_ECHO_MAX, clip));
    return buf;
}

static int dir_error(const struct bench *b, int rc)
{
    const struct config *cfg = b->cfg;
    char clip[CLI_PATH_ECHO_MAX + 4], size[32], entry[2 * CLI_PATH_ECHO_MAX + 128];
    const char *dir = cli_clip(cfg->dir, CLI_PATH_ECHO_MAX, clip), *what = dir_problem(rc);

    /* A bare errno about a file in the dir: which one, when one is of the wrong kind. */
    if (rc > -4096 && rc != -EBUSY && cli_dir_problem(cfg->dir, dir, entry, sizeof(entry)))
        fprintf(stderr, "%s: --dir %s: %s (%s): remove it, or use another --dir\n", PROG, dir,
                entry, kvt_strerror(rc));
    else if (what)
        fprintf(stderr, "%s: --dir %s: %s\n", PROG, dir, what);
    else if (rc == KVT_EFINGERPRINT)
        fprintf(stderr,
                "%s: --dir %s holds the KV of another model, geometry, page size or seed than "
                "this run's (--geometry %s, --page-size %u, --seed %" PRIu64 "): use another "
                "--dir, or the --geometry, --page-size and --seed it was written with\n",
                PROG, dir, cfg->geometry_arg, cfg->page_size, cfg->seed);
    else if (rc == -ENOSPC || rc == -EDQUOT)
        fprintf(stderr,
                "%s: --dir %s: no room on its file system for the %s of slab files "
                "--disk-tokens %" PRIu64 " takes: free some, or lower --disk-tokens\n",
                PROG, dir, cli_size(disk_bytes(cfg, b->store_pages), size), cfg->disk_tokens);
    return -1;
}

/* kvt_open refused the options (Invalid argument), past what parse_args checks: every
 * size given. */
static int invalid_error(const struct config *cfg)
{
    fprintf(stderr,
            "%s: kvt_open refused these options (invalid argument): --geometry %s, "
            "--page-size %u, --device-tokens %" PRIu64 ", --host-tokens %" PRIu64
            ", --disk-tokens %" PRIu64 "\n",
            PROG, cfg->geometry_arg, cfg->page_size, cfg->device_tokens, cfg->host_tokens,
            cfg->disk_tokens);
    return -1;
}

/* kvt_open's error rc, named by the option that most likely caused it, with what to do. */
static int open_error(const struct bench *b, int rc)
{
    const struct config *cfg = b->cfg;
    uint64_t cell = kvt_cell_bytes(&cfg->g);
    char size[32];

    if (cfg->dir && is_dir_error(cfg, rc))
        return dir_error(b, rc);
    switch (rc) {
    case KVT_EHOSTRAM:
        fprintf(stderr,
                "%s: --host-tokens %" PRIu64 ": a host pool of %s does not fit in the memory "
                "available now: lower --host-tokens\n",
                PROG, cfg->host_tokens, cli_size(cfg->host_tokens * cell, size));
        return -1;
    case KVT_EHOSTSIZE:
        fprintf(stderr,
                "%s: --host-tokens %" PRIu64 " must be larger than the device pool "
                "(--device-tokens %" PRIu64 ") in whole pages of %u tokens\n",
                PROG, cfg->host_tokens, cfg->device_tokens, cfg->page_size);
        return -1;
    case KVT_ENOBACKEND:
        if (cfg->remote) {
            fprintf(stderr,
                    "%s: --remote: not built in (kvtier was built without the Redis store)\n",
                    PROG);
            return -1;
        }
        /* fall through */
    case KVT_EBACKEND:
        fprintf(stderr, "%s: --backend %s: %s%s\n", PROG, bench_backend_names[cfg->backend],
                kvt_strerror(rc), rc == KVT_ENOBACKEND ? ": use --backend sim" : "");
        return -1;
    case -ENOMEM:
        /* The device pool is the likeliest; the disk tier's index maps its share too. */
        fprintf(stderr,
                "%s: out of memory opening the engine, for a device pool of %s (--device-tokens "
                "%" PRIu64 " of %" PRIu64 " bytes, --geometry %s)%s: lower --device-tokens%s\n",
                PROG, cli_size(cfg->device_tokens * cell, size), cfg->device_tokens, cell,
                cfg->geometry_arg, cfg->dir ? " and the index of the disk tier" : "",
                cfg->dir ? " or --disk-tokens" : "");
        return -1;
    case -EINVAL:
        if (cfg->remote_tls_ca || cfg->remote_tls_cert) {
            fprintf(stderr,
                    "%s: --remote-tls-ca, --remote-tls-cert or --remote-tls-key: a file holds no "
                    "usable PEM certificate or key (or the key is not the certificate's)\n",
                    PROG);
            return -1;
        }
        return invalid_error(cfg);
    default: {
        char paths[4 * CLI_PATH_ECHO_MAX + 96];

        open_paths(cfg, paths, sizeof(paths));
        fprintf(stderr, "%s: kvt_open: %s%s%s%s\n", PROG, kvt_strerror(rc),
                *paths ? " (opening the engine with" : "", paths, *paths ? ")" : "");
        return -1;
    }
    }
}

/* ---- setup ---- */

/* The sim backend's device pool is host memory, mapped at open and touched as slots are
 * written: what the replay will touch (the pool, or every slot its requests take when that
 * is less) must fit in this machine's RAM, or the run would end killed for memory. */
static int check_sim_memory(const struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};
    uint64_t cell = kvt_cell_bytes(&b->cfg->g), ram, touched;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    char a[32], c[32];

    if (kvt_stats(b->e, &st) || st.backend != KVT_BACKEND_SIM || pages <= 0 || page <= 0)
        return 0;
    ram = (uint64_t)pages * (uint64_t)page;
    touched = b->slots_taken < UINT64_MAX / cell ? b->slots_taken * cell : UINT64_MAX;
    if (touched > st.kv_pool_bytes)
        touched = st.kv_pool_bytes;
    if (touched <= ram)
        return 0;
    fprintf(
        stderr,
        "%s: the sim backend keeps the device pool in host memory, and this run could fill up to "
        "%s of it (--device-tokens %" PRIu64 " of %" PRIu64 " bytes, --geometry %s) on a "
        "machine with %s: lower --device-tokens or --requests, or pick a smaller "
        "--geometry\n",
        PROG, cli_size(touched, a), b->cfg->device_tokens, cell, b->cfg->geometry_arg,
        cli_size(ram, c));
    return -1;
}

/* Before anything is allocated for it: the longest request must fit the device pool. */
static int check_fit(const struct bench *b)
{
    uint32_t ps = b->cfg->page_size;
    uint64_t pool = b->cfg->device_tokens / ps * ps;

    if (b->max_tokens + ps > INT32_MAX) {
        fprintf(stderr, "%s: a request of %" PRIu64 " tokens is too long\n", PROG, b->max_tokens);
        return -1;
    }
    if (pool < round_up(b->max_tokens, ps)) {
        fprintf(stderr,
                "%s: the longest request needs %zu slots, --device-tokens %" PRIu64
                " gives %" PRIu64 " (whole pages of %u): raise --device-tokens\n",
                PROG, round_up(b->max_tokens, ps), b->cfg->device_tokens, pool, ps);
        return -1;
    }
    return 0;
}

/* State slots: --mamba-slots, or as many as MAMBA_MEMORY_RATIO of the KV pool's bytes hold
 * (MAMBA_MIN_SLOTS at least: two for the request, the rest checkpoints). */
static uint64_t mamba_slots(const struct config *cfg)
{
    uint64_t state = cfg->mamba.layers * (cfg->mamba.conv_bytes + cfg->mamba.ssm_bytes);
    uint64_t n;

    if (!cfg->mamba.layers)
        return 0;
    if (cfg->mamba_slots)
        return cfg->mamba_slots;
    n = (uint64_t)(MAMBA_MEMORY_RATIO * (double)cfg->device_tokens *
                   (double)kvt_cell_bytes(&cfg->g) / (double)state);
    return n < MAMBA_MIN_SLOTS ? MAMBA_MIN_SLOTS : n > INT32_MAX - 1 ? INT32_MAX - 1 : n;
}

/* The KV bytes are a function of the tokens and --seed (hash_tokens), so a seed other than the
 * default one is part of the model id: a dir or a remote tier holding another seed's KV is
 * another fingerprint's (a dir refused, a remote tier other keys), never pages that fail the
 * verifier. Seed 1 keeps the id --geometry alone, as dirs written before it was added have. */
static int make_model_id(struct bench *b)
{
    const struct config *cfg = b->cfg;
    size_t len = strlen(cfg->geometry_arg) + 32;

    if (!(b->model_id = malloc(len)))
        return -1;
    if (cfg->seed == 1)
        snprintf(b->model_id, len, "%s", cfg->geometry_arg);
    else
        snprintf(b->model_id, len, "%s;kv-seed=%" PRIu64, cfg->geometry_arg, cfg->seed);
    return 0;
}

static int open_engine(struct bench *b)
{
    const struct config *cfg = b->cfg;
    uint32_t ps = cfg->page_size;
    struct kvt_options o;

    kvt_options_init(&o, sizeof(o));
    o.geometry = cfg->g;
    o.page_size = ps;
    o.backend = cfg->backend;
    o.sim_serial = cfg->serial;
    o.device_tokens = cfg->device_tokens;
    o.max_requests = 1;
    o.max_context = (uint32_t)round_up(b->max_tokens, ps);
    o.evict_policy = cfg->policy;
    if (make_model_id(b)) {
        fprintf(stderr, "%s: out of memory\n", PROG);
        return -1;
    }
    o.model_id = b->model_id;
    o.tp_size = cfg->tp_size;
    o.host_tokens = cfg->host_tokens;
    o.write_policy = cfg->write_policy;
    o.mamba = cfg->mamba;
    o.mamba.slots = (uint32_t)mamba_slots(cfg);
    if (cfg->swa_window)
        o.swa = (struct kvt_swa){cfg->swa_window, b->nfull, b->full_ids, cfg->swa_tokens};
    o.store_page_tokens = (uint32_t)cfg->store_page_tokens;
    /* Without a disk or remote tier there is no store page; 0: kvt_open refuses the options
     * and says so. */
    b->store_pages = cfg->disk_tokens || cfg->remote ? kvt_store_page_tokens(&o) : ps;
    if (!b->store_pages)
        b->store_pages = ps;
    if (cfg->disk_tokens) {
        o.disk_dir = cfg->dir;
        o.disk_bytes = disk_bytes(cfg, b->store_pages);
        o.disk_sync = cfg->disk_sync;
    }
    o.remote = cfg->remote;
    o.remote_tls_ca = cfg->remote_tls_ca;
    o.remote_tls_cert = cfg->remote_tls_cert;
    o.remote_tls_key = cfg->remote_tls_key;
    if (bench_mm_wanted(cfg->synthetic))
        bench_mm_options(&cfg->mm, cfg->device_tokens * kvt_cell_bytes(&cfg->g), &o);
    int rc = kvt_open(&o, &b->e);
    if (rc)
        return open_error(b, rc);
    if (check_sim_memory(b))
        return -1;
    if (kvt_available(b->e) < o.max_context) {
        fprintf(stderr,
                "%s: the longest request needs %u slots, the device pool has %zu: raise "
                "--device-tokens%s\n",
                PROG, o.max_context, kvt_available(b->e),
                cfg->swa_window ? " or --swa-tokens" : "");
        return -1;
    }
    return 0;
}

/* Rows per chunk: CHUNK_TOKENS, halved while a buffer would pass CHUNK_BYTES, but a page at
 * least. */
static size_t chunk_tokens(size_t row, uint32_t ps)
{
    size_t n = CHUNK_TOKENS;

    while (n > ps && n * row > CHUNK_BYTES)
        n /= 2;
    return n;
}

/* The request's tokens, hashes and slots (the longest request's worth, which the device
 * pool holds: check_fit) and a chunk of K and V rows. */
static int alloc_buffers(struct bench *b)
{
    size_t n = (size_t)b->max_tokens, want = b->row[0] > b->row[1] ? b->row[0] : b->row[1];
    size_t row = want;

    for (int part = 0; hybrid(b) && part < 2; part++) {
        b->state[part] = malloc(state_part_bytes(b, part));
        if (!b->state[part])
            return say("out of memory for a recurrent layer's state");
        if (state_part_bytes(b, part) > want)
            want = state_part_bytes(b, part);
    }
    b->chunk = chunk_tokens(row, b->cfg->page_size);
    b->tokens = malloc(n * sizeof(*b->tokens));
    b->hash = malloc(n * sizeof(*b->hash));
    b->slots = malloc(n * sizeof(*b->slots));
    for (int x = 0; x < 2; x++)
        b->buf[x] = malloc(b->chunk * b->row[x] + 1);
    b->want = malloc(want);
    if (b->tokens && b->hash && b->slots && b->buf[0] && b->buf[1] && b->want)
        return 0;
    fprintf(stderr,
            "%s: out of memory for the buffers of requests of %zu tokens and chunks of %zu rows "
            "of %zu bytes (--geometry %s)\n",
            PROG, n, b->chunk, want, b->cfg->geometry_arg);
    return -1;
}

int bench_setup(struct bench *b)
{
    const struct kvt_geometry *g = &b->cfg->g;

    if (g->attention == KVT_ATTN_MLA) {
        b->row[0] = (size_t)(g->kv_lora_rank + g->qk_rope_head_dim) * g->dtype_bytes;
    } else {
        b->row[0] = (size_t)g->kv_heads * g->head_dim * g->dtype_bytes;
        b->row[1] =
            (size_t)g->kv_heads * (g->v_head_dim ? g->v_head_dim : g->head_dim) * g->dtype_bytes;
    }
    if (b->cfg->swa_window) {
        b->full_ids = malloc(g->layers * sizeof(*b->full_ids));
        if (!b->full_ids)
            return say("out of memory");
        for (uint32_t l = 0; l < g->layers; l++)
            if (!swa_layer(b, l))
                b->full_ids[b->nfull++] = l;
        b->nswa = g->layers - b->nfull;
    }
    if (check_fit(b) || open_engine(b))
        return -1;
    if (bench_mm_wanted(b->cfg->synthetic) &&
        bench_mm_open(&b->cfg->mm, kvt_cell_bytes(g), b->cfg->page_size, b->e, &b->mm))
        return -1;
    return alloc_buffers(b);
}

void bench_teardown(struct bench *b)
{
    bench_mm_close(b->mm); /* its holds go before the engine */
    kvt_close(b->e);
    free(b->tokens);
    free(b->hash);
    free(b->slots);
    free(b->buf[0]);
    free(b->buf[1]);
    free(b->want);
    free(b->state[0]);
    free(b->state[1]);
    free(b->full_ids);
    free(b->model_id);
}
