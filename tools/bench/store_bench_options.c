/* kvtier-store-bench's command line (store_bench.h): the option table, --help, the defaults. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_bench.h"

const char *const sb_order_names[2] = {"random", "seq"};
const char *const sb_io_names[3] = {"auto", "uring", "psync"};
const char *const sb_sync_names[2] = {"durable", "relaxed"};
const char *const sb_buffer_names[3] = {"auto", "huge", "4k"};

#define MAX_PAGES (1ull << 31) /* positions are 32-bit in the read order */

/* --pages, given the whole config: also says that pages, not bytes, size the runs. */
static int parse_pages(void *cfg, const char *opt, const char *val)
{
    struct config *c = cfg;

    c->pages_set = true;
    return cli_parse_count(PROG, opt, val, 0, MAX_PAGES, false, &c->pages);
}

#define OFF(f) offsetof(struct config, f)
static const struct cli_option options[] = {
    {.kind = CLI_TEXT, .help = "\nThroughput:\n"},
    {"--page-bytes", CLI_SIZES, OFF(page_bytes), 512, 256ull << 20, .arg = "LIST",
     .help = "page sizes, comma separated, 512 B to 256M, suffixes K, M, G\n"
             "(default 2M: Llama-3-8B, 16 tokens a page); a multiple of\n"
             "4K keeps the store on O_DIRECT and equal to fio's block"},
    {"--queue-depth", CLI_COUNTS, OFF(queue_depth), 1, 4096, .arg = "LIST",
     .help = "I/Os in flight (the store's queue_depth, fio's iodepth),\n"
             "comma separated, 1 to 4096 (default " CLI_STR(DEFAULT_QUEUE_DEPTH) ")"},
    {"--bytes", CLI_SIZE, OFF(bytes), 1, 1ull << 44, .arg = "SIZE",
     .help = "bytes per run of each point (default 2G); pages = SIZE / page"},
    {"--pages", CLI_CUSTOM, .parse = parse_pages, .arg = "N",
     .help = "pages per run instead (0: skip the throughput part)"},
    {"--batch", CLI_COUNT, OFF(batch), 1, 65536, .arg = "N",
     .help = "pages per op and per commit batch (the store's max_batch;\n"
             "default " CLI_STR(DEFAULT_BATCH) ", the store's default); fio syncs every N writes"},
    {"--reps", CLI_COUNT, OFF(reps), 1, 100, .arg = "N",
     .help = "runs of each point, store and fio alternating; medians and\n"
             "bests are reported (default " CLI_STR(DEFAULT_REPS) ")"},
    {"--read-order", CLI_NAME, OFF(order), CLI_NAMES(sb_order_names), .arg = "O",
     .help = "random (default; fio randread) or seq (the written order;\nfio read)"},
    {"--io", CLI_NAME, OFF(io), CLI_NAMES(sb_io_names), .arg = "M",
     .help = "the store's I/O engine: auto, uring or psync (default auto)"},
    {"--buffers", CLI_NAME, OFF(buffers), CLI_NAMES(sb_buffer_names), .arg = "B",
     .help = "the store's and fio's buffers alike: huge (huge pages: the\n"
             "store's as the engine's host pool asks, MADV_HUGEPAGE;\n"
             "fio's hugetlb pages, which must be reserved beforehand:\n"
             "sysctl vm.nr_hugepages), 4k (4 KiB pages both), or auto\n"
             "(default: huge when fio can have them, else 4k)"},
    {"--disk-sync", CLI_NAME, OFF(sync), CLI_NAMES(sb_sync_names), .arg = "S",
     .help = "durable (default: an fdatasync per batch, judged against\n"
             "fio's durable write) or relaxed (no sync per batch, a flush\n"
             "every 256 MiB or second; judged against fio's plain write)"},
    {"--fio", CLI_STRING, OFF(fio), 1, .arg = "PATH",
     .help = "the fio to run (default: fio on PATH)"},
    {"--no-fio", CLI_FLAG, OFF(no_fio), .help = "do not run fio"},
    {.kind = CLI_TEXT, .help = "\nOpen:\n"},
    {"--open-pages", CLI_COUNT, OFF(open_pages), 0, 1ull << 30, .arg = "N",
     .help =
         "pages the open test's dir indexes (default " CLI_STR(DEFAULT_OPEN_PAGES) "; 0: skip)"},
    {"--open-page-bytes", CLI_SIZE, OFF(open_page_bytes), 512, 256ull << 20, .arg = "SIZE",
     .help = "the open test's page size (default 4K; 2K is the tiny\ngeometry's)"},
    {"--open-reps", CLI_COUNT, OFF(open_reps), 1, 100, .arg = "N",
     .help = "opens of each kind, cold and warm (default " CLI_STR(DEFAULT_OPEN_REPS) ")"},
    {.kind = CLI_TEXT, .help = "\nRemote (instead of (a) and (b)):\n"},
    {"--remote", CLI_STRING, OFF(remote), 1, .arg = "URL",
     .help = "the Redis store on this server or cluster (options.remote's\n"
             "form: redis://HOST:PORT, or a cluster's seeds\n"
             "redis://h1:p1,redis://h2:p2) against redis-benchmark:\n"
             "--page-bytes (its first), --pages or --bytes (default\n"
             "256 MiB), --batch, --reps, --seed apply; rediss:// over TLS\n"
             "(redis-benchmark over TLS too)"},
    {"--remote-tls-ca", CLI_STRING, OFF(remote_tls_ca), 1, .arg = "FILE",
     .help = "rediss://: the PEM CA certificates to check the server's\n"
             "against, for the store and redis-benchmark (default: the\n"
             "system's)"},
    {"--redis-benchmark", CLI_STRING, OFF(redis_benchmark), 1, .arg = "PATH",
     .help = "the redis-benchmark program (default: redis-benchmark on PATH)"},
    {"--remote-restart", CLI_COUNTS, OFF(down_ms), 1, 600000, .arg = "MS,...",
     .help = "the Redis store's recovery on a redis-server of its own,\n"
             "killed and started again while ops run (r2), down this\n"
             "long, a rep each (e.g. 100,300,1000,3000); --page-bytes\n"
             "(its first; default 64 KiB here), --batch (at most 256;\n"
             "default 8 here), --reps apply"},
    {"--backoff-max-ms", CLI_COUNT, OFF(backoff_max_ms), 1, 60000, .arg = "MS",
     .help = "the store's longest wait between reconnects (default 1000,\nas kvt_open's)"},
    {"--redis-server", CLI_STRING, OFF(redis_server), 1, .arg = "PATH",
     .help = "the redis-server program (default: redis-server on PATH)"},
    {.kind = CLI_TEXT, .help = "\nCommon:\n"},
    {"--dir", CLI_STRING, OFF(parent), 1, .arg = "PATH",
     .help = "where the work dir is made (default /tmp); the file system\nmeasured"},
    {"--keep", CLI_FLAG, OFF(keep), .help = "keep the work dir"},
    {"--seed", CLI_COUNT, OFF(seed), 0, UINT64_MAX, .arg = "N",
     .help = "seeds the keys and the read order (default 1)"},
    {"--json", CLI_FLAG, OFF(json), .help = "one JSON object on stdout instead of the text report"},
    {"--help", CLI_HELP, .help = "print this and exit"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [options]\n"
            "\n"
            "Measure kvtier's disk block store and print figures (a benchmark: timing never\n"
            "fails a run). Everything is written in a fresh dir made under --dir and removed\n"
            "at the end (--keep keeps the open test's dir and fio's last report).\n"
            "\n"
            "(a) Throughput, for each page size x queue depth: pages written with\n"
            "    dstore_write (ops of --batch pages = one commit batch each: I/O, one\n"
            "    fdatasync, one LMDB transaction; two ops in flight) into a fresh data dir,\n"
            "    then read back with dstore_read (ops of --batch pages, enough in flight for\n"
            "    queue-depth I/Os), from page-aligned buffers registered with io_uring. In the\n"
            "    same run, rep by rep, fio on a file in the same dir, as many I/Os as the store\n"
            "    has pages, iodepth = the queue depth:\n"
            "      fio --name=%s --filename=DIR/fio.data --ioengine=io_uring --direct=1\n"
            "          --fixedbufs=1 [--iomem=shmhuge] --fallocate=native --bs=BS\n"
            "          --iodepth=QD --rw=RW\n"
            "          --size=PAGES*SLOT [--io_size=PAGES*BS] --fdatasync=K [--end_fsync=1]\n"
            "          --output=DIR/fio.json --output-format=json\n"
            "    SLOT is what a page takes in the store's slab: its whole 4 KiB blocks, then a\n"
            "    block with the rest of it and its head (4 KiB pages: 8 KiB; 2 MiB: 2 MiB +\n"
            "    4 KiB). Writes, BS=SLOT (the store writes the page and its head): RW=write\n"
            "    K=--batch and --end_fsync=1 (durable: an fdatasync per store batch and one\n"
            "    after the last writes, as the store syncs every batch before its op\n"
            "    completes), and RW=write K=0 (plain: nothing synced, the bytes may still sit\n"
            "    in the disk's write cache). The read, on the durable file, is the store's:\n"
            "    BS = the bytes the store reads a page with (a page of whole blocks alone, its\n"
            "    head block skipped: 4 KiB for 4 KiB pages, 2 MiB for 2 MiB; else the whole\n"
            "    slot, which the store reads as two adjacent I/Os), PAGES I/Os over the same\n"
            "    PAGES*SLOT bytes of file: RW=randread (random offsets, each read once), or\n"
            "    with --read-order seq RW=read:SKIP (SLOT-BS skipped after each read, the\n"
            "    store's stride). --direct and --fixedbufs follow what the store got (O_DIRECT\n"
            "    on both sides: no page cache; the store's index is its own cost); the\n"
            "    buffers are of the same pages on both sides (--buffers: huge pages, fio's\n"
            "    hugetlb ones, or 4 KiB pages), and the report says which. Every\n"
            "    timed write, the store's and fio's, starts after a syncfs of the work dir, so\n"
            "    none pays for the write cache or discards an earlier one left.\n"
            "    Ratio = fio's time / the store's for as many I/Os (store pages/s over fio\n"
            "    I/Os/s); target >= %.2f against the durable write and the read, like against\n"
            "    like. fio's GB/s are of the bytes its job moved (in the JSON every fio timing\n"
            "    counts fio.bytes, PAGES*SLOT; fio.read_bytes is what the read moved). The\n"
            "    ratio against the plain write is printed too (what durability costs on this\n"
            "    disk), not judged.\n"
            "    With --disk-sync relaxed the store syncs no batch (it flushes every 256 MiB\n"
            "    or second) and its write is judged against fio's plain write instead.\n"
            "    Without fio a note says so and (a) reports the store alone (install fio:\n"
            "    apt-get install fio).\n"
            "(b) Open: a data dir indexing --open-pages pages of --open-page-bytes is built\n"
            "    (timed), then opened --open-reps times cold (its files dropped from the\n"
            "    page cache) and warm: ms to dstore_open, to a dstore_leading_run finding\n"
            "    all of 64 known keys (ready to serve; target <= %.0f ms), to one page read,\n"
            "    and to dstore_wait_ready (the background rebuild done).\n"
            "    The figure of record, ten million pages of the tiny geometry (2 KiB pages in\n"
            "    2,304-byte slots: 25 GiB of slabs and index; it asks for 31 GiB free):\n"
            "      %s --pages 0 --open-pages 10000000 --open-page-bytes 2K\n"
            "(r) --remote URL: the Redis store instead (a server or a cluster; it writes pages\n"
            "    under fingerprints of its own, with a 10-minute TTL): N pages written with\n"
            "    store_write in ops of --batch pages, all queued at once, then read back and\n"
            "    compared; in the same run, rep by rep, redis-benchmark -t set,get on the same\n"
            "    servers with the same value size, -P 16, a connection per master, N requests\n"
            "    over N/4 random keys. Ratio = store op/s / redis-benchmark op/s, SET against\n"
            "    write, GET against read; goal >= 0.8.\n"
            "(r2) --remote-restart MS,...: the Redis store's recovery. A redis-server of its own\n"
            "    on a free loopback port and one store on it (timeouts 1000 ms as kvt_open's);\n"
            "    ops run back to back (--batch pages written under new keys, then read back and\n"
            "    compared) while the server is killed, left down MS, and started again\n"
            "    empty. Reported per rep, in ms from its start: its PING, the store's first\n"
            "    whole write and first whole read, and the ops that failed from the kill on.\n"
            "    Bound: the reconnect backoff, 20 ms doubling to --backoff-max-ms.\n",
            PROG, PROG, TARGET_RATIO, TARGET_SERVE_S * 1e3, PROG);
    cli_print_options(f, options, CLI_COUNT_OF(options), 22);
    fprintf(f, "\n"
               "Exit status: 0 when the figures were measured (with or without fio), 1 on an\n"
               "error (a failed store op, no space, no memory), 2 on bad usage.\n");
}

void sb_config_defaults(struct config *cfg)
{
    *cfg = (struct config){.parent = "/tmp",
                           .fio = "fio",
                           .bytes = DEFAULT_BYTES,
                           .batch = DEFAULT_BATCH,
                           .reps = DEFAULT_REPS,
                           .seed = 1,
                           .open_pages = DEFAULT_OPEN_PAGES,
                           .open_page_bytes = DEFAULT_OPEN_PAGE_BYTES,
                           .open_reps = DEFAULT_OPEN_REPS,
                           .page_bytes = {.v = {DEFAULT_PAGE_BYTES}, .n = 1},
                           .queue_depth = {.v = {DEFAULT_QUEUE_DEPTH}, .n = 1}};
}

int sb_parse_args(struct config *cfg, int argc, char **argv)
{
    int rc = cli_parse_args(PROG, options, CLI_COUNT_OF(options), cfg, argc, argv, usage);

    if (rc)
        return rc;
    if (cfg->redis_benchmark && !cfg->remote)
        return cli_bad_usage(PROG, "--redis-benchmark goes with --remote", NULL);
    if (cfg->remote_tls_ca && !cfg->remote)
        return cli_bad_usage(PROG, "--remote-tls-ca goes with --remote", NULL);
    if ((cfg->backoff_max_ms || cfg->redis_server) && !cfg->down_ms.n)
        return cli_bad_usage(PROG, "--backoff-max-ms and --redis-server go with --remote-restart",
                             NULL);
    if (cfg->down_ms.n && cfg->remote)
        return cli_bad_usage(PROG, "--remote-restart runs a server of its own: no --remote", NULL);
    return 0;
}
