/* kvtier-store-bench's main (store_bench.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store_bench.h"
#ifdef KVT_HAVE_REDIS
#include "store_bench_remote.h"
#endif

static void finish(struct bench *b)
{
    char path[PATH_MAX];

    if (!b->wd.path[0])
        return;
    if (b->cfg->keep) {
        workdir_path(&b->wd, "fio.data", path, sizeof(path)); /* never worth keeping */
        unlink(path);
    } else {
        workdir_rm_tree(b->wd.path);
    }
    free(b->pt);
}

/* --remote-restart: the Redis store's recovery after a restart (store_bench_restart.c). */
static int run_restart(const struct config *cfg)
{
#ifdef KVT_HAVE_REDIS
    struct workdir wd = {0};
    bool batch_set = cfg->batch != DEFAULT_BATCH;
    struct restart_bench_config rc = {
        .redis_server = cfg->redis_server ? cfg->redis_server : "redis-server",
        .page_bytes =
            cfg->page_bytes.v[0] != DEFAULT_PAGE_BYTES ? (uint32_t)cfg->page_bytes.v[0] : 65536,
        .batch = batch_set ? cfg->batch : 8,
        .reps = cfg->reps,
        .down_ms = cfg->down_ms.v,
        .n_down = cfg->down_ms.n,
        .backoff_max_ms = cfg->backoff_max_ms ? (uint32_t)cfg->backoff_max_ms : 1000,
        .json = cfg->json};
    int err;

    if (rc.batch > 256)
        return cli_bad_usage(PROG, "--remote-restart takes --batch up to 256", NULL);
    if (workdir_make(&wd, PROG, cfg->parent))
        return 1;
    rc.dir = wd.path;
    err = restart_bench_run(&rc);
    if (!cfg->keep)
        workdir_rm_tree(wd.path);
    return err;
#else
    (void)cfg;
    fprintf(stderr,
            "%s: --remote-restart: not built in (kvtier was built without the Redis store)\n",
            PROG);
    return 1;
#endif
}

/* --remote: the Redis store against redis-benchmark (store_bench_remote.c). */
static int run_remote(const struct config *cfg)
{
#ifdef KVT_HAVE_REDIS
    struct workdir wd = {0};
    uint64_t page = cfg->page_bytes.v[0];
    uint64_t bytes = cfg->bytes == DEFAULT_BYTES ? DEFAULT_REMOTE_BYTES : cfg->bytes;
    struct remote_bench_config rc = {.url = cfg->remote,
                                     .redis_benchmark = cfg->redis_benchmark ? cfg->redis_benchmark
                                                                             : "redis-benchmark",
                                     .page_bytes = (uint32_t)page,
                                     .pages = cfg->pages_set ? cfg->pages : bytes / page,
                                     .batch = cfg->batch,
                                     .reps = cfg->reps,
                                     .seed = cfg->seed,
                                     .json = cfg->json,
                                     .tls_ca = cfg->remote_tls_ca};
    bool tls = !strncmp(cfg->remote, "rediss://", 9);
    char log[PATH_MAX];
    int err;

    if ((!tls && strncmp(cfg->remote, "redis://", 8)) || rc.pages == 0)
        return cli_bad_usage(
            PROG, "--remote needs a redis:// URL (rediss:// for TLS) and at least one page",
            cfg->remote);
    if (cfg->remote_tls_ca && !tls)
        return cli_bad_usage(PROG, "--remote-tls-ca needs a rediss:// --remote", NULL);
    if (workdir_make(&wd, PROG, cfg->parent))
        return 1;
    workdir_path(&wd, "redis-benchmark.log", log, sizeof(log));
    rc.log = log;
    err = remote_bench_run(&rc);
    if (!cfg->keep)
        workdir_rm_tree(wd.path);
    return err;
#else
    (void)cfg;
    fprintf(stderr, "%s: --remote: not built in (kvtier was built without the Redis store)\n",
            PROG);
    return 1;
#endif
}

int main(int argc, char **argv)
{
    struct config cfg;
    struct bench b = {.cfg = &cfg};
    int rc;

    sb_config_defaults(&cfg);
    if ((rc = sb_parse_args(&cfg, argc, argv)))
        return rc < 0 ? 0 : rc;
    if (cfg.down_ms.n)
        return run_restart(&cfg);
    if (cfg.remote)
        return run_remote(&cfg);
    if (workdir_make(&b.wd, PROG, cfg.parent))
        return 1;
    sb_fio_setup(&b);
    if (sb_resolve_buffers(&b)) {
        finish(&b);
        return 1;
    }
    if (cfg.json && b.fio.note[0] && !cfg.no_fio)
        fprintf(stderr, "%s: note: %s\n", PROG, b.fio.note);
    rc = sb_run_throughput(&b) || sb_run_open(&b) ? 1 : 0;
    if (!rc)
        sb_print_report(&b);
    finish(&b);
    return rc;
}
