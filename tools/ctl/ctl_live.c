/*
 * The live commands: a running engine's figures through its stats socket
 * (options.stats_socket). The client connects, writes one line ("stats" or "metrics") and
 * reads the reply until EOF. "stats" is one JSON object,
 *   {"kvtier":1,"time_ns":N,"stats":{"<field of struct kvt_stats>":N,...}},
 * which is parsed here with a small reader of exactly that shape (no JSON library), so an
 * unexpected reply is refused rather than half understood.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "ctl.h"

#define REPLY_MAX (1u << 20)
#define REPLY_TIMEOUT_MS 5000
#define FIELDS_MAX 128
#define FIELD_NAME_MAX 64

struct live {
    uint64_t time_ns;
    uint32_t n;
    char name[FIELDS_MAX][FIELD_NAME_MAX];
    uint64_t value[FIELDS_MAX];
};

/* ---- the socket ---- */

static int connect_to(const char *path, int *out)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd;

    if (strlen(path) >= sizeof(a.sun_path))
        return ctl_fail("%s: socket path too long", path);
    strcpy(a.sun_path, path);
    if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return ctl_fail("socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        *out = fd;
        return 0;
    }
    int e = errno;
    close(fd);
    if (e == ENOENT)
        return ctl_fail("%s: no such socket (is the engine running with stats_socket set to it?)",
                        path);
    if (e == ECONNREFUSED)
        return ctl_fail("%s: nobody is listening (the engine has stopped; a stale socket file)",
                        path);
    return ctl_fail("%s: cannot connect: %s", path, strerror(e));
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The reply, up to EOF, within REPLY_TIMEOUT_MS in all. */
static int read_reply(const char *path, int fd, char *buf, size_t cap, size_t *len)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int64_t deadline = now_ms() + REPLY_TIMEOUT_MS;
    ssize_t r = 1;

    *len = 0;
    while (r > 0) {
        int64_t left = deadline - now_ms();
        int pr = left > 0 ? poll(&p, 1, (int)left) : 0;

        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return ctl_fail("%s: waiting for the reply: %s", path, strerror(errno));
        if (pr == 0)
            return ctl_fail("%s: no whole reply within %d ms", path, REPLY_TIMEOUT_MS);
        r = read(fd, buf + *len, cap - 1 - *len);
        if (r < 0 && errno == EINTR)
            r = 1;
        else if (r > 0 && (*len += (size_t)r) == cap - 1)
            return ctl_fail("%s: reply longer than %u bytes", path, REPLY_MAX);
    }
    buf[*len] = '\0';
    return r < 0 ? ctl_fail("%s: reading: %s", path, strerror(errno)) : 0;
}

/* All of buf; MSG_NOSIGNAL, so a server that closed first is an error here, not SIGPIPE. */
static int send_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The start of a reply's first line, made printable: for an error message. */
static const char *excerpt(const char *reply, char *buf, size_t cap)
{
    size_t i = 0;

    for (; reply[i] && reply[i] != '\n' && i + 1 < cap; i++)
        buf[i] = reply[i] >= 0x20 && reply[i] < 0x7f ? reply[i] : '?';
    buf[i] = '\0';
    return buf;
}

/* Ask one question; *reply (malloc'ed, NUL-terminated) is the answer. */
static int ask(const char *path, const char *question, char **reply)
{
    size_t len;
    int fd = -1, rc = connect_to(path, &fd), wrc;

    if (rc)
        return rc;
    if (!(*reply = malloc(REPLY_MAX))) {
        close(fd);
        return ctl_fail("out of memory");
    }
    if ((wrc = send_all(fd, question, strlen(question))))
        rc = ctl_fail("%s: writing the request: %s", path, strerror(-wrc));
    else
        rc = read_reply(path, fd, *reply, REPLY_MAX, &len);
    close(fd);
    if (!rc && !strncmp(*reply, "error:", 6)) {
        char b[81];
        rc = ctl_fail("%s: the engine answered: %s", path, excerpt(*reply, b, sizeof(b)));
    }
    if (rc) {
        free(*reply);
        *reply = NULL;
    }
    return rc;
}

/* ---- the stats reply ---- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')
        p++;
    return p;
}

/* Expect literal lit at p (after blanks): the text after it, or NULL. */
static const char *expect(const char *p, const char *lit)
{
    p = skip_ws(p);
    return strncmp(p, lit, strlen(lit)) ? NULL : p + strlen(lit);
}

static const char *parse_u64(const char *p, uint64_t *v)
{
    char *end;

    p = skip_ws(p);
    if (*p < '0' || *p > '9')
        return NULL;
    errno = 0;
    *v = strtoull(p, &end, 10);
    return errno ? NULL : end;
}

/* Length of the name at p: lower-case letters, digits and '_', as struct kvt_stats's. */
static size_t name_len(const char *p)
{
    return strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
}

/* "name":value; the text after it, or NULL. */
static const char *parse_field(const char *p, struct live *l)
{
    const char *q;
    size_t len;

    if (!(p = expect(p, "\"")) || *(q = p + name_len(p)) != '"')
        return NULL;
    len = (size_t)(q - p);
    if (len == 0 || len >= FIELD_NAME_MAX || l->n == FIELDS_MAX || !(q = expect(q + 1, ":")))
        return NULL;
    memcpy(l->name[l->n], p, len);
    l->name[l->n][len] = '\0';
    if (!(q = parse_u64(q, &l->value[l->n])))
        return NULL;
    l->n++;
    return q;
}

static bool parse_stats(const char *p, struct live *l)
{
    uint64_t version;

    l->n = 0;
    if (!(p = expect(p, "{")) || !(p = expect(p, "\"kvtier\":")) || !(p = parse_u64(p, &version)) ||
        version != 1)
        return false;
    if (!(p = expect(p, ",")) || !(p = expect(p, "\"time_ns\":")) ||
        !(p = parse_u64(p, &l->time_ns)))
        return false;
    if (!(p = expect(p, ",")) || !(p = expect(p, "\"stats\":")) || !(p = expect(p, "{")))
        return false;
    if (!expect(p, "}")) {
        while ((p = parse_field(p, l)) && expect(p, ","))
            p = expect(p, ",");
    }
    return p && (p = expect(p, "}")) && (p = expect(p, "}")) && !*skip_ws(p);
}

static uint64_t get(const struct live *l, const char *name)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (!strcmp(l->name[i], name))
            return l->value[i];
    return 0;
}

static int fetch(const char *path, struct live *l)
{
    char *reply;
    int rc = ask(path, "stats\n", &reply);

    if (rc)
        return rc;
    if (!parse_stats(reply, l)) {
        char b[81];
        rc = ctl_fail("%s: not a kvtier stats reply (protocol 1): %s", path,
                      excerpt(reply, b, sizeof(b)));
    }
    free(reply);
    return rc;
}

/* ---- text ---- */

static const char *name_of(uint64_t v, const char *const *names, uint64_t n)
{
    return v < n ? names[v] : "?";
}

static void tier_row(const char *tier, uint64_t cap, uint64_t used, uint64_t cached, uint64_t hit,
                     uint64_t evicted, bool has_evicted)
{
    char ev[24];

    if (!cap) {
        printf("%-8s %12s\n", tier, "none");
        return;
    }
    snprintf(ev, sizeof(ev), "%" PRIu64, evicted);
    printf("%-8s %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %12" PRIu64 " %12s\n",
           tier, cap, used, cap - (used < cap ? used : cap), cached, hit, has_evicted ? ev : "-");
}

/* A hybrid model's recurrent states and sliding-window KV, when it has them. */
static void live_hybrid_text(const struct live *l)
{
    uint64_t ms = get(l, "mamba_slots"), st = get(l, "swa_tokens");

    if (ms)
        printf("states   %" PRIu64 " slots, %" PRIu64 " free, %" PRIu64
               " checkpoints cached, %" PRIu64 " evicted for room; %" PRIu64
               " tokens of KV found, %" PRIu64 " served from a state\n",
               ms, get(l, "mamba_free_slots"), get(l, "mamba_cached_states"),
               get(l, "mamba_evicted_states"), get(l, "mamba_kv_hit_tokens"),
               get(l, "match_hit_tokens"));
    if (ms && get(l, "mamba_host_slots"))
        printf("         on the host: %" PRIu64 " of %" PRIu64 " copies held; %" PRIu64
               " saved as they left the device, %" PRIu64 " restored\n",
               get(l, "mamba_host_states"), get(l, "mamba_host_slots"),
               get(l, "mamba_saved_states"), get(l, "mamba_restored_states"));
    if (st)
        printf("window   %" PRIu64 " SWA slots, %" PRIu64 " free, %" PRIu64
               " cached tokens with SWA KV; %" PRIu64 " tokens of KV found, %" PRIu64
               " served with a live window; released %" PRIu64 ", evicted %" PRIu64
               ", revived %" PRIu64 "\n",
               st, get(l, "swa_free_tokens"), get(l, "swa_cached_tokens"),
               get(l, "swa_kv_hit_tokens"), get(l, "match_hit_tokens"),
               get(l, "swa_released_tokens"), get(l, "swa_evicted_tokens"),
               get(l, "swa_revived_tokens"));
}

/* The remote tier, apart from the disk, once it has done anything (or failed to). */
static void live_remote_text(const struct live *l)
{
    uint64_t hit = get(l, "remote_hit_tokens"), read = get(l, "remote_read_tokens");
    uint64_t written = get(l, "remote_written_tokens"), errors = get(l, "remote_errors");

    if (hit || read || written || errors)
        printf("remote   %" PRIu64 " tokens found past the host and disk, %" PRIu64
               " read, %" PRIu64 " written; %" PRIu64 " errors\n",
               hit, read, written, errors);
}

static void live_text(const char *path, const struct live *l)
{
    static const char *const backends[] = {"auto", "sim", "cuda"};
    static const char *const disk_io[] = {"auto", "io_uring", "psync"};
    char t[32], b1[32], b2[32], b3[32], b4[32];
    uint64_t dt = get(l, "device_tokens"), ht = get(l, "host_tokens");

    printf("engine   %s: %s backend, page %" PRIu64 " tokens, figures of %s\n", path,
           name_of(get(l, "backend"), backends, 3), get(l, "page_size"), ctl_time(l->time_ns, t));
    printf("\n%-8s %12s %12s %12s %12s %12s %12s   (tokens)\n", "TIER", "CAPACITY", "USED", "FREE",
           "CACHED", "HIT", "EVICTED");
    tier_row("device", dt, dt - get(l, "device_free_tokens"), get(l, "cached_tokens"),
             get(l, "match_hit_tokens"), get(l, "evicted_tokens"), true);
    tier_row("host", ht, ht - get(l, "host_free_tokens"), get(l, "host_cached_tokens"),
             get(l, "host_hit_tokens"), get(l, "host_evicted_tokens"), true);
    tier_row("disk", get(l, "disk_tokens"), get(l, "disk_cached_tokens"),
             get(l, "disk_cached_tokens"), get(l, "disk_hit_tokens"), 0, false);
    printf("\nmatches  %" PRIu64 " calls asked for %" PRIu64 " tokens; %" PRIu64
           " found on the device, %" PRIu64 " on the host, %" PRIu64 " on disk\n",
           get(l, "match_calls"), get(l, "match_query_tokens"), get(l, "match_hit_tokens"),
           get(l, "host_hit_tokens"), get(l, "disk_hit_tokens"));
    printf("moved    host->device %s, device->host %s, disk->host %s, host->disk %s\n",
           ctl_bytes(get(l, "h2d_bytes"), b1), ctl_bytes(get(l, "d2h_bytes"), b2),
           ctl_bytes(get(l, "disk_read_bytes"), b3), ctl_bytes(get(l, "disk_written_bytes"), b4));
    printf("in flight %" PRIu64 " transfers, %" PRIu64 " disk ops (disk io: %s)\n",
           get(l, "ops_in_flight"), get(l, "disk_ops_in_flight"),
           name_of(get(l, "disk_io"), disk_io, 3));
    printf("errors   %" PRIu64 " disk\n", get(l, "disk_errors"));
    live_remote_text(l);
    live_hybrid_text(l);
}

static void live_json_members(const char *path, const struct live *l)
{
    printf("\"socket\":");
    cli_json_string(path);
    printf(",\"time_ns\":%" PRIu64 ",\"stats\":{", l->time_ns);
    for (uint32_t i = 0; i < l->n; i++)
        printf("%s\"%s\":%" PRIu64, i ? "," : "", l->name[i], l->value[i]);
    printf("}");
}

int cmd_stat_live(const struct ctl_args *a)
{
    struct live *l = malloc(sizeof(*l));
    int rc = l ? fetch(a->live, l) : ctl_fail("out of memory");

    if (!rc && a->json) {
        printf("{");
        live_json_members(a->live, l);
        printf("}\n");
    } else if (!rc) {
        live_text(a->live, l);
    }
    free(l);
    return rc;
}

/* ---- top ---- */

/* Counters whose rates top shows, and how. */
static const char *const rated[] = {"match_calls",     "match_hit_tokens",   "host_hit_tokens",
                                    "disk_hit_tokens", "h2d_bytes",          "d2h_bytes",
                                    "disk_read_bytes", "disk_written_bytes", "remote_hit_tokens"};
#define NRATED (sizeof(rated) / sizeof(rated[0]))

static double rate(const struct live *now, const struct live *was, const char *name)
{
    double s = (double)(now->time_ns - was->time_ns) / 1e9;
    uint64_t a = get(now, name), b = get(was, name);

    return s > 0 && a >= b ? (double)(a - b) / s : 0.0;
}

static void rates_text(const struct live *now, const struct live *was)
{
    char b[4][32];

    if (!was) {
        printf("rates    (from the next refresh)\n");
        return;
    }
    for (int i = 0; i < 4; i++)
        ctl_bytes((uint64_t)rate(now, was, rated[4 + i]), b[i]);
    printf("rates    %.1f matches/s; hits/s: device %.0f, host %.0f, disk %.0f, remote %.0f "
           "tokens\n",
           rate(now, was, rated[0]), rate(now, was, rated[1]), rate(now, was, rated[2]),
           rate(now, was, rated[3]), rate(now, was, rated[8]));
    printf("         per second: host->device %s, device->host %s, disk->host %s, host->disk "
           "%s\n",
           b[0], b[1], b[2], b[3]);
}

static void rates_json(const struct live *now, const struct live *was)
{
    if (!was) {
        printf(",\"rates\":null");
        return;
    }
    printf(",\"rates\":{");
    for (size_t i = 0; i < NRATED; i++)
        printf("%s\"%s\":%.3f", i ? "," : "", rated[i], rate(now, was, rated[i]));
    printf("}");
}

static void frame(const struct ctl_args *a, const struct live *now, const struct live *was,
                  bool tty, uint64_t k)
{
    if (a->json) {
        printf("{\"refresh\":%" PRIu64 ",", k);
        live_json_members(a->pos[0], now);
        rates_json(now, was);
        printf("}\n");
    } else {
        fputs(tty ? "\033[H\033[2J" : (k > 1 ? "\n" : ""), stdout);
        live_text(a->pos[0], now);
        rates_text(now, was);
    }
    fflush(stdout);
}

static void sleep_for(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};

    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

int cmd_top(const struct ctl_args *a)
{
    struct live *l = malloc(2 * sizeof(*l));
    bool tty = isatty(STDOUT_FILENO) && !a->json;
    int rc = l ? 0 : ctl_fail("out of memory");

    for (uint64_t k = 1; !rc && (!a->count || k <= a->count); k++) {
        struct live *now = &l[k % 2], *was = k > 1 ? &l[(k + 1) % 2] : NULL;

        if (k > 1)
            sleep_for(a->interval);
        if (!(rc = fetch(a->pos[0], now)))
            frame(a, now, was, tty, k);
    }
    free(l);
    return rc;
}

/* ---- metrics ---- */

/* Whether line is one of the exposition lines the engine writes: "# HELP kvtier_x ...",
 * "# TYPE kvtier_x counter|gauge" or "kvtier_x N" (*name and *v then set). */
static bool metrics_line(const char *line, size_t len, size_t *name, uint64_t *v)
{
    const char *end = line + len, *p;

    *name = 0;
    if (!strncmp(line, "# HELP kvtier_", 14))
        return name_len(line + 14) > 0 && line[14 + name_len(line + 14)] == ' ';
    if (!strncmp(line, "# TYPE kvtier_", 14)) {
        p = line + 14 + name_len(line + 14);
        return p > line + 14 && (!strncmp(p, " counter", 8) ? p + 8 == end
                                 : !strncmp(p, " gauge", 6) ? p + 6 == end
                                                            : false);
    }
    if (strncmp(line, "kvtier_", 7) || line[7 + name_len(line + 7)] != ' ')
        return false;
    *name = 7 + name_len(line + 7);
    p = parse_u64(line + *name, v);
    return p == end;
}

/* The engine's metrics, checked line by line: 0, or an exit status after saying why. */
static int metrics_check(const char *path, const char *text)
{
    size_t lines = 0, name;
    uint64_t v;

    for (const char *line = text; *line; lines++) {
        size_t len = strcspn(line, "\n");
        if (!metrics_line(line, len, &name, &v)) {
            char b[81];
            return ctl_fail("%s: not kvtier's metrics (line %zu): %s", path, lines + 1,
                            excerpt(line, b, sizeof(b)));
        }
        line += len + (line[len] == '\n');
    }
    return lines ? 0 : ctl_fail("%s: an empty metrics reply", path);
}

static void metrics_json(const char *text)
{
    bool comma = false;

    printf("{\"metrics\":{");
    for (const char *line = text; *line;) {
        size_t len = strcspn(line, "\n"), name;
        uint64_t v;

        if (metrics_line(line, len, &name, &v) && name) {
            printf("%s\"%.*s\":%" PRIu64, comma ? "," : "", (int)name, line, v);
            comma = true;
        }
        line += len + (line[len] == '\n');
    }
    printf("}}\n");
}

int cmd_metrics(const struct ctl_args *a)
{
    char *reply;
    int rc = ask(a->pos[0], "metrics\n", &reply);

    if (!rc && !(rc = metrics_check(a->pos[0], reply))) {
        if (a->json)
            metrics_json(reply);
        else
            fputs(reply, stdout);
    }
    free(reply);
    return rc;
}
