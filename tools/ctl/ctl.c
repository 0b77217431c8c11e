/*
 * kvtier-ctl: inspect, verify and manage every tier of kvtier. Offline commands work on a
 * data dir, with or without an engine running on it: read-only ones open it read-only (no
 * lock, no write, a consistent LMDB snapshot), writing ones take the dir's lock as an engine
 * does. Live commands ask a running engine's stats socket.
 *
 * This file holds the command table, option parsing and help; the commands and the output
 * helpers they share (ctl_out.c) lie below it, and none calls back into it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"

/* ---- commands ---- */

struct command {
    const char *name;
    int (*run)(const struct ctl_args *a);
    int min_pos, max_pos;
    const char *options; /* the options it takes, each followed by a space */
    const char *synopsis;
    const char *help;
};

#define DIR_NOTE                                                                                   \
    "DIR is a kvtier data dir; it is opened read-only (no lock, no write), so this is safe\n"      \
    "beside an engine running on it.\n"
#define WRITE_NOTE                                                                                 \
    "This writes DIR: it takes the dir's lock, so it is refused (exit 1) while an engine\n"        \
    "has the dir open.\n"
#define SELECT_HELP                                                                                \
    "  --ns NS               pages of namespace NS: \"default\", \"states\" (recurrent\n"          \
    "                        states' pages), \"windows\" (window copies of sliding-window\n"       \
    "                        pages), \"embeddings\" (chunks of multimodal embeddings),\n"          \
    "                        \"name:TEXT\" (the namespace's bytes) or a hex\n"                     \
    "                        prefix of its root hash as stat prints it\n"                          \
    "  --prefix HASH         the page HASH, its chain to the root and every page below it\n"
#define JSON_HELP "  --json                one JSON object on stdout instead of text\n"
#define COPY_STATUS                                                                                \
    "\nExit status: 0 when every selected page was copied or found there already, 1 when any\n"    \
    "was skipped (the report says why) or on an error, 2 on bad usage (a target inside the\n"      \
    "source too).\n"

static const struct command commands[] = {
    {"stat", cmd_stat, 0, 1, "--json --live ", "stat DIR | stat --live SOCKET",
     "Offline (DIR): the data format, the fingerprint (model, geometry, page size, TP),\n"
     "the page geometry, the slab files, pages and bytes in total and per namespace,\n"
     "pages with problems found by the record checks, detached pages (intact, but a page\n"
     "above them is not on this disk: no problem), free slots, and the oldest and newest\n"
     "pages.\n" DIR_NOTE
     "\nLive (--live SOCKET): a running engine's figures from its stats socket:\n"
     "per tier (device, host, disk) capacity, use, cached and hit tokens; bytes moved;\n"
     "operations in flight; errors.\n\n" JSON_HELP
     "  --live SOCKET         ask the engine serving stats at SOCKET instead of a dir\n"},
    {"ls", cmd_ls, 1, 1, "--json --ns --prefix --sort --reverse --limit ", "ls DIR [options]",
     "One line per page: hash, namespace, prefix length in tokens through the page,\n"
     "slab:slot, created, last access, first token, and its state: ok, detached (a page\n"
     "above it is not on this disk) or its problem.\n" DIR_NOTE "\n" SELECT_HELP
     "  --sort KEY            hash (default, index order), time (last access, newest\n"
     "                        first), created (newest first) or size (longest prefix first)\n"
     "  --reverse             reverse the order\n"
     "  --limit N             at most N lines\n" JSON_HELP},
    {"show", cmd_show, 2, 2, "--json ", "show DIR HASH",
     "One page's record (slab, slot, length, checksum, times, namespace, parent, tokens)\n"
     "and its chain from the namespace root down to it, one page per line with its\n"
     "tokens. HASH is a page hash or a unique prefix of one (at least 4 hex digits).\n" DIR_NOTE
     "\n" JSON_HELP},
    {"tree", cmd_tree, 1, 1, "--json --dot --ns --prefix ", "tree DIR [options]",
     "The prefix forest rebuilt from parent links: one tree per namespace, a run of pages\n"
     "with one child each shown as one node (first hash, last hash, pages, tokens).\n"
     "Detached pages (their parent is not on this disk) are drawn after the forest.\n" DIR_NOTE
     "\n" SELECT_HELP "  --dot                 write Graphviz (dot) instead of text\n" JSON_HELP},
    {"verify", cmd_verify, 1, 1, "--json --repair ", "verify DIR [--repair]",
     "Read every page and check its checksum; check every record (its own check, its\n"
     "hash chain, its length), its slot (inside the slab files: else dangling; its own in\n"
     "the slot table: else stale). A page the engine evicts during the scan is not\n"
     "counted; a checksum failure is confirmed by a second read. Pages with no chain of\n"
     "good pages up to their namespace root are counted as detached, which is no problem:\n"
     "a page above them is not on this disk (on a big dir the disk copies of hot chain\n"
     "roots age out, as their hits go to the upper tiers), and an engine serves them again\n"
     "once it stores that page again. A progress line is shown on stderr when it is a\n"
     "terminal.\n" DIR_NOTE "\n"
     "  --repair              then drop the pages found bad: corrupt (checksum included),\n"
     "                        dangling and stale; detached pages are kept (gc --detached\n"
     "                        drops them). Pages whose read failed (read error) are kept,\n"
     "                        since the failure may pass; they are counted as left. This\n"
     "                        writes DIR and takes its lock, so it is refused while an\n"
     "                        engine has the dir open\n" JSON_HELP
     "\nExit status: 0 when nothing is wrong (or --repair dropped everything found), 1 when\n"
     "problems remain or on an error, 2 on bad usage.\n"},
    {"gc", cmd_gc, 1, 1, "--json --dry-run --detached ", "gc DIR [--dry-run] [--detached]",
     "Drop what the engine can never serve, found from the index alone (no page is read):\n"
     "records that fail their checks, dangling and stale records. verify --repair also\n"
     "drops pages whose bytes fail their checksum. Detached pages (intact, but a page\n"
     "above them is not on this disk) are kept unless --detached is given: an engine\n"
     "serves them again once it stores that page again.\n" WRITE_NOTE "\n"
     "  --detached            drop detached pages too\n"
     "  --dry-run             only say what would be dropped (read-only)\n" JSON_HELP},
    {"recover", cmd_recover, 1, 1, "--json ", "recover DIR",
     "Rebuild DIR's index from its slab files: every slot's page head (key, parent,\n"
     "namespace, tokens, checksum) is read, and each that checks out gets its record back.\n"
     "The old index is set aside as DIR/index.damaged (the last one only). Read-only\n"
     "commands refuse a damaged index and point here; an engine's open, and gc, evict,\n"
     "verify --repair and import into the dir, rebuild a damaged or lost index by\n"
     "themselves. Page bytes are not read (verify reads them); a page evicted before the\n"
     "index was damaged may come back, as a good page of this dir.\n" WRITE_NOTE "\n" JSON_HELP
     "\nExit status: 0 when the index was rebuilt, 1 on an error (the rebuild met index\n"
     "errors, or the dir is not one kvtier can rebuild).\n"},
    {"evict", cmd_evict, 1, 1, "--json --to ", "evict DIR --to SIZE",
     "Evict least recently used pages until the pages held take at most SIZE bytes (as\n"
     "stat counts them: pages x page bytes). Slab files keep their size; the slots are\n"
     "reused. SIZE is a byte count with an optional K, M, G or T suffix (powers of "
     "1024).\n" WRITE_NOTE
     "\n  --to SIZE             the size to shrink to (required)\n" JSON_HELP},
    {"export", cmd_export, 2, 2, "--json --all --ns --prefix --capacity ",
     "export DIR TARGET (--all | --ns NS | --prefix HASH)...",
     "Copy chosen prefixes from DIR into the data dir TARGET, which must have the same\n"
     "fingerprint and page geometry; TARGET is created with DIR's when missing. Every\n"
     "page's bytes are checked on the way; a page that fails is not copied, nor anything\n"
     "below it. Parents are written before children. DIR is opened read-only (safe beside\n"
     "an engine); TARGET is written and locked (refused while an engine has it open).\n"
     "TARGET must lie outside DIR and DIR outside TARGET (symbolic links and bind mounts\n"
     "are seen through). The report counts the pages skipped by reason: bad bytes, read\n"
     "errors, evicted or changed since the index was read, below a skipped page.\n\n"
     "  --all                 every page that can be served, detached ones included\n" SELECT_HELP
     "  --capacity SIZE       TARGET's capacity when it is created (default DIR's, as its\n"
     "                        slab files span; raised as needed to hold what is copied).\n"
     "                        An existing TARGET keeps its capacity (what its slab files\n"
     "                        span) and the copy is refused when it does not fit in its free\n"
     "                        slots; --capacity grows it to SIZE, and the engine must then\n"
     "                        open TARGET with disk_bytes of at least SIZE, or it drops the\n"
     "                        pages beyond its own capacity\n"
     "                        (--ns and --prefix may be repeated)\n" JSON_HELP COPY_STATUS},
    {"import", cmd_import, 2, 2, "--json --all --ns --prefix --capacity ",
     "import DIR SOURCE (--all | --ns NS | --prefix HASH)...",
     "Copy chosen prefixes from the data dir SOURCE into DIR: export SOURCE DIR, with the\n"
     "same options. DIR is written and locked (refused while an engine has it open);\n"
     "SOURCE is only read. Neither may lie inside the other.\n\n"
     "  --all                 every page that can be served, detached ones included\n" SELECT_HELP
     "  --capacity SIZE       DIR's capacity when it is created (default SOURCE's). An\n"
     "                        existing DIR keeps its capacity (what its slab files span)\n"
     "                        and the copy is refused when it does not fit in its free\n"
     "                        slots; --capacity grows it to SIZE, and the engine must then\n"
     "                        open DIR with disk_bytes of at least SIZE, or it drops the\n"
     "                        pages beyond its own capacity\n" JSON_HELP COPY_STATUS},
    {"top", cmd_top, 1, 1, "--json --count --interval ", "top SOCKET [options]",
     "stat --live, refreshed: the figures of the engine serving stats at SOCKET, with\n"
     "rates (per second) since the last refresh. On a terminal the screen is redrawn;\n"
     "otherwise each refresh is printed after the last.\n\n"
     "  --interval SECONDS    time between refreshes (default 1; fractions allowed)\n"
     "  --count N             stop after N refreshes (default: until interrupted)\n"
     "  --json                one JSON object per refresh, one per line\n"},
    {"remote", cmd_remote, 2, 2, "--json --tls-ca --tls-cert --tls-key ",
     "remote stat URL | remote verify URL [options]",
     "The Redis/Valkey tier (options.remote) on its server, URL as options.remote takes it:\n"
     "redis://[[USER]:PASSWORD@]HOST[:PORT], or a comma-separated list of them naming a\n"
     "Redis Cluster's seeds (redis://h1:p1,redis://h2:p2); rediss:// in place of redis://\n"
     "speaks TLS. Every kvt:* key is found with SCAN;\n"
     "nothing is written to the server. Keys evicted or expired during the scan are not\n"
     "counted. On a cluster (the first seed to answer answers CLUSTER SLOTS; one node's\n"
     "URL is enough) every master is scanned, the totals are the cluster's and a line per\n"
     "master follows with its state (--json: nodes, each with \"state\"); keys whose slot\n"
     "moved during the scan count as gone. A master that cannot be reached (or fails\n"
     "during its scan) is named with why (\"unreachable\" or \"failed\", and \"error\"),\n"
     "the others are scanned all the same, and the exit status is 1. A page's copy (its\n"
     "key then \":copy{T}\", on another master: an engine writes one on a cluster) counts\n"
     "as a page, and as a copy (\"copies\"). Each reply must come whole within 10 s.\n\n"
     "stat: pages and bytes per fingerprint (the engine's KV identity; several models\n"
     "may share a server), and the server's used memory, maxmemory and its policy.\n\n"
     "verify: read every page and check its header (magic, format, fingerprint and page\n"
     "key matching the key's name, length) and its XXH3-128 checksum; count good and bad\n"
     "pages per fingerprint and name the first bad keys. A kvt:* key not named as a page,\n"
     "or of another type than a string (a list, a set), is foreign: counted (other keys),\n"
     "and bad for verify. An engine treats a bad value as a miss and deletes it when it\n"
     "reads it.\n"
     "\n"
     "  --tls-ca FILE         rediss://: PEM CA certificates the server's must chain to\n"
     "                        (default: the system's); its certificate must also name\n"
     "                        the URL's host\n"
     "  --tls-cert FILE       rediss://: a PEM client certificate, for a server that asks\n"
     "  --tls-key FILE        its private key (default: in --tls-cert's file)\n" JSON_HELP
     "\nExit status: 0 ok (verify: nothing bad), 1 bad pages found (verify), a cluster's\n"
     "master unreachable (the others reported), or an error (server down, TLS\n"
     "refused), 2 on bad usage (a bad URL, a TLS option without\n"
     "rediss://, an unusable TLS file), or where kvtier-ctl was built without the Redis\n"
     "store.\n"},
    {"emb", cmd_emb, 1, 1, "--json --verify ", "emb DIR [--verify]",
     "The multimodal embeddings the dir holds (kvt_emb_put with a disk tier), one line\n"
     "each: item hash, namespace, bytes, chunks, created, state. Each embedding's first\n"
     "chunk is read: its head names the item and the rest of its chunks, which are looked\n"
     "up. States: ok; incomplete (a chunk is not in the dir: evicted, or its write was cut\n"
     "short; the engine reads it as a miss, no problem); damaged (a chunk or the head fails\n"
     "its checks, or with --verify the bytes fail the head's checksum: a miss too). Chunks\n"
     "whose first chunk is gone are counted.\n" DIR_NOTE "\n"
     "  --verify              read every chunk and check each embedding whole\n" JSON_HELP
     "\nExit status: 0 when no embedding is damaged, 1 when one is or on an error, 2 on bad\n"
     "usage.\n"},
    {"metrics", cmd_metrics, 1, 1, "--json ", "metrics SOCKET",
     "The engine's figures in Prometheus text format, as its stats socket serves them\n"
     "(kvtier_<field> lines with # HELP and # TYPE).\n\n"
     "  --json                one JSON object, {\"metrics\": {name: value, ...}}\n"},
};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s COMMAND ARGS [options]\n"
            "       %s COMMAND --help\n"
            "\n"
            "Inspect, verify and manage kvtier's tiers: a data dir (the disk tier) with or\n"
            "without an engine running on it, and a running engine's tiers through its stats\n"
            "socket (options.stats_socket).\n"
            "\n"
            "On a data dir (read-only, safe beside a running engine, unless it says writes):\n"
            "  stat DIR              format, fingerprint, pages and bytes (total and per\n"
            "                        namespace), free slots, oldest and newest pages\n"
            "  ls DIR                pages, by namespace or prefix, sorted by hash, time or size\n"
            "  show DIR HASH         a page's record and its chain to the root, with tokens\n"
            "  tree DIR              the prefix forest rebuilt from parent links; --dot: Graphviz\n"
            "  verify DIR            read every page: checksums, records, corrupt, dangling and\n"
            "                        stale entries (detached pages are counted, no problem);\n"
            "                        exit 1 when anything is wrong; --repair (writes) drops\n"
            "                        what is bad\n"
            "  gc DIR                writes: drop corrupt, dangling and stale records;\n"
            "                        --detached: detached pages too\n"
            "  evict DIR --to SIZE   writes: evict least recently used pages down to SIZE\n"
            "  recover DIR           writes: rebuild a damaged or lost index from the pages'\n"
            "                        heads in the slab files\n"
            "  export DIR TARGET     writes TARGET: copy chosen prefixes to a dir of the same\n"
            "                        fingerprint (created when missing)\n"
            "  import DIR SOURCE     writes DIR: copy chosen prefixes from SOURCE\n"
            "  emb DIR               the multimodal embeddings it holds; --verify: read them\n"
            "                        whole; exit 1 when any is damaged\n"
            "\n"
            "On a running engine (its stats socket):\n"
            "  stat --live SOCKET    per tier occupancy, hits, bytes moved, ops in flight, errors\n"
            "  top SOCKET            the same, refreshed, with rates\n"
            "  metrics SOCKET        Prometheus text format\n"
            "\n"
            "On the Redis tier's server or cluster (options.remote, redis://[[USER]:PASSWORD@]\n"
            "HOST[:PORT] or a comma-separated list of them, a cluster's seeds; rediss:// for\n"
            "TLS):\n"
            "  remote stat URL       pages and bytes per fingerprint, the server's memory\n"
            "  remote verify URL     read every page and check its header and checksum;\n"
            "                        exit 1 when any is bad\n"
            "\n"
            "Every command takes --json (JSON on stdout) and --help. HASH is a page hash in hex\n"
            "or a unique prefix of one (at least 4 digits).\n"
            "Exit status: 0 ok; 1 an error, problems found (verify) or pages not copied\n"
            "(export, import); 2 bad usage.\n",
            PROG, PROG);
}

static void command_help(const struct command *c)
{
    printf("usage: %s %s\n\n%s", PROG, c->synopsis, c->help);
    printf("  --help                print this and exit\n");
}

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

/* ---- options ---- */

static bool takes(const struct command *c, const char *opt)
{
    size_t len = strlen(opt);

    for (const char *p = strstr(c->options, opt); p; p = strstr(p + 1, opt))
        if ((p == c->options || p[-1] == ' ') && p[len] == ' ')
            return true;
    return false;
}

static int bad(const struct command *c, const char *msg, const char *arg)
{
    char prog[64];

    snprintf(prog, sizeof(prog), "%s %s", PROG, c->name);
    return cli_bad_usage(prog, msg, arg);
}

static int parse_interval(const struct command *c, const char *val, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(val, &end);
    if (errno || *end || end == val || !(v > 0) || v > 86400)
        return bad(c, "--interval needs seconds above 0 (e.g. 0.5)", val);
    *out = v;
    return 0;
}

static int add_select(const struct command *c, const char **list, int *n, const char *opt,
                      const char *val)
{
    if (*n == MAX_SELECT)
        return bad(c, "too many selections (at most 16 of each)", opt);
    list[(*n)++] = val;
    return 0;
}

static int parse_count(const struct command *c, const char *opt, const char *val, uint64_t *out)
{
    if (!cli_parse_u64(val, out))
        return bad(c, "expected a non-negative integer", opt);
    return 0;
}

static int parse_size(const struct command *c, const char *opt, const char *val, uint64_t *out)
{
    if (!cli_parse_size(val, out))
        return bad(c, "expected a size: digits with an optional K, M, G or T", opt);
    return 0;
}

static int parse_valued(const struct command *c, struct ctl_args *a, const char *opt,
                        const char *val)
{
    if (!strcmp(opt, "--live"))
        a->live = val;
    else if (!strcmp(opt, "--ns"))
        return add_select(c, a->ns, &a->nns, opt, val);
    else if (!strcmp(opt, "--prefix"))
        return add_select(c, a->prefix, &a->nprefix, opt, val);
    else if (!strcmp(opt, "--sort"))
        a->sort = val;
    else if (!strcmp(opt, "--limit"))
        return parse_count(c, opt, val, &a->limit);
    else if (!strcmp(opt, "--count"))
        return parse_count(c, opt, val, &a->count);
    else if (!strcmp(opt, "--interval"))
        return parse_interval(c, val, &a->interval);
    else if (!strcmp(opt, "--capacity"))
        return parse_size(c, opt, val, &a->capacity);
    else if (!strcmp(opt, "--tls-ca"))
        a->tls_ca = val;
    else if (!strcmp(opt, "--tls-cert"))
        a->tls_cert = val;
    else if (!strcmp(opt, "--tls-key"))
        a->tls_key = val;
    else if (!strcmp(opt, "--to")) {
        a->to_set = true;
        return parse_size(c, opt, val, &a->to_bytes);
    }
    return 0;
}

static bool set_flag(struct ctl_args *a, const char *opt)
{
    static const char *const names[] = {"--json", "--dot",     "--repair",   "--reverse",
                                        "--all",  "--dry-run", "--detached", "--verify"};
    bool *flags[] = {&a->json, &a->dot,     &a->repair,   &a->reverse,
                     &a->all,  &a->dry_run, &a->detached, &a->verify};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (!strcmp(opt, names[i])) {
            *flags[i] = true;
            return true;
        }
    }
    return false;
}

/* One option at argv[*i] ("--opt VALUE" or "--opt=VALUE"). */
static int parse_option(const struct command *c, struct ctl_args *a, int argc, char **argv, int *i)
{
    char opt[32];
    const char *arg = argv[*i], *eq = strchr(arg, '='), *val;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);

    if (len >= sizeof(opt))
        return bad(c, "unknown option", arg);
    memcpy(opt, arg, len);
    opt[len] = '\0';
    if (!takes(c, opt))
        return bad(c, "unknown option", opt);
    if (!eq && set_flag(a, opt))
        return 0;
    if (eq && set_flag(a, opt))
        return bad(c, "option takes no value", opt);
    val = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
    if (!val)
        return bad(c, "option needs a value", opt);
    return parse_valued(c, a, opt, val);
}

/* 0 to run, -1 after --help, else the exit status. */
static int parse_args(const struct command *c, int argc, char **argv, struct ctl_args *a)
{
    int rc;

    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];

        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            command_help(c);
            return -1;
        }
        if (arg[0] == '-' && arg[1]) {
            if ((rc = parse_option(c, a, argc, argv, &i)))
                return rc;
        } else if (a->npos == c->max_pos) {
            return bad(c, "unexpected argument", arg);
        } else {
            a->pos[a->npos++] = arg;
        }
    }
    if (a->npos < c->min_pos)
        return bad(c, "missing argument; usage", c->synopsis);
    return 0;
}

/* Longer than any valid argument of its kind: refused before use, so that no message quotes
 * it whole. */
#define SOCKET_PATH_MAX (sizeof(((struct sockaddr_un *)0)->sun_path) - 1)
#define HASH_HEX_MAX (2 * HASH_BYTES)
#define NS_ARG_MAX (5 + KVT_NS_MAX) /* "name:" and the namespace's bytes */

static int too_long(const struct command *c, const char *what, size_t max, const char *arg)
{
    char msg[96];

    if (strlen(arg) <= max)
        return 0;
    snprintf(msg, sizeof(msg), "%s longer than %zu bytes", what, max);
    return bad(c, msg, arg);
}

static int check_lengths(const struct command *c, const struct ctl_args *a)
{
    bool socket = c->run == cmd_top || c->run == cmd_metrics;
    int rc = 0;

    for (int i = 0; i < a->npos && !rc; i++) {
        if (i == 1 && c->run == cmd_show)
            rc = too_long(c, "a page hash", HASH_HEX_MAX, a->pos[i]);
        else
            rc = too_long(c, socket ? "a socket path" : "a path",
                          socket ? SOCKET_PATH_MAX : PATH_MAX - 1, a->pos[i]);
    }
    if (!rc && a->live)
        rc = too_long(c, "a socket path", SOCKET_PATH_MAX, a->live);
    for (int i = 0; i < a->nprefix && !rc; i++)
        rc = too_long(c, "--prefix: a page hash", HASH_HEX_MAX, a->prefix[i]);
    for (int i = 0; i < a->nns && !rc; i++)
        rc = too_long(c, "--ns: a namespace", NS_ARG_MAX, a->ns[i]);
    return rc;
}

/* What one command needs beyond its arguments' count. */
static int check_args(const struct command *c, const struct ctl_args *a)
{
    int rc = check_lengths(c, a);

    if (rc)
        return rc;
    if (c->run == cmd_stat && !a->live == !a->npos)
        return bad(c, "give a data dir or --live SOCKET (one of them)", NULL);
    if (c->run == cmd_remote && strcmp(a->pos[0], "stat") && strcmp(a->pos[0], "verify"))
        return bad(c, "expected stat or verify", a->pos[0]);
    if (c->run == cmd_evict && !a->to_set)
        return bad(c, "--to SIZE is required", NULL);
    if ((c->run == cmd_export || c->run == cmd_import) && !a->all && !a->nns && !a->nprefix)
        return bad(c, "choose what to copy: --all, --ns NS or --prefix HASH", NULL);
    if (a->all && (a->nns || a->nprefix))
        return bad(c, "--all selects everything: give it alone", NULL);
    if (a->sort && strcmp(a->sort, "hash") && strcmp(a->sort, "time") &&
        strcmp(a->sort, "created") && strcmp(a->sort, "size"))
        return bad(c, "--sort needs hash, time, created or size", a->sort);
    if (a->dot && a->json)
        return bad(c, "--dot and --json are two formats: give one", NULL);
    return 0;
}

int main(int argc, char **argv)
{
    struct ctl_args a = {.interval = 1.0};
    const struct command *c;
    int rc;

    if (argc < 2)
        return cli_bad_usage(PROG, "missing command", NULL);
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        if (argc > 2 && (c = find_command(argv[2])))
            command_help(c);
        else
            usage(stdout);
        return 0;
    }
    if (!(c = find_command(argv[1])))
        return cli_bad_usage(PROG, "unknown command", argv[1]);
    rc = parse_args(c, argc, argv, &a);
    if (rc)
        return rc < 0 ? 0 : rc;
    if ((rc = check_args(c, &a)))
        return rc;
    if (c->run == cmd_stat && a.live)
        return cmd_stat_live(&a);
    return c->run(&a);
}
