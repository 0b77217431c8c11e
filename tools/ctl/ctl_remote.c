/*
 * remote stat URL and remote verify URL: the Redis/Valkey tier (options.remote) seen from the
 * server. Pages live under "kvt:<fingerprint hex>:<page key hex>" (src/store/redis), so a SCAN
 * of kvt:* finds every engine's pages, grouped here by fingerprint. Only SCAN, STRLEN, GET,
 * INFO, CLUSTER SLOTS and AUTH (an ACL user's, "redis://USER:PASSWORD@...", Redis 6+) are sent: the
 * server is never modified. Keys are read in pipelined batches of one SCAN reply each, so a big
 * server costs round trips per thousand keys, not per key. On a cluster (the first seed to answer
 * answers CLUSTER SLOTS) every master is scanned in turn, its own keys read from it, and counted
 * per node too; a key that moved to another node during the scan (MOVED, ASK) counts as gone, like
 * an evicted one. A master that cannot be reached, or fails during its scan, is reported with its
 * state and why, the others are scanned all the same, and the exit status is 1. A page's copy
 * (its key's name then ":copy{T}", on another master) counts as a page and as a copy. A kvt:* key
 * of another type than a string (WRONGTYPE) is foreign, like a name that is no page's. Every
 * reply is bounded in time as a whole (TIMEOUT_S) and in size (the client's bounds).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ctl.h"

#ifndef KVT_HAVE_REDIS

int cmd_remote(const struct ctl_args *a)
{
    (void)a;
    fputs(PROG ": remote commands are not built in (kvtier was built without the Redis store)\n",
          stderr);
    return 2;
}

#else

#include "kvtier.h"
#include "store/redis/client.h"
#include "store/redis/redis.h"

#define SCAN_COUNT "1000"
#define BAD_LISTED 8 /* bad keys named in the report */
#define FP_HEX (2 * STORE_REDIS_FP_BYTES)
#define TIMEOUT_S 10

struct fp_count {
    char hex[FP_HEX + 1];
    uint64_t pages, bytes, good, bad, copies;
};

#define MAX_NODES 64

/* One server scanned: a standalone one, or a master of a cluster. */
struct node_count {
    char server[300];
    uint64_t pages, bytes, good, bad, used_memory, maxmemory;
    const char *state; /* "ok", "unreachable" (no connection), "failed" (during its scan) */
    char error[400];   /* why, when not ok */
};

struct remote {
    const char *url;
    char server[300]; /* the node being read */
    char seed[300];   /* the first that answered */
    char user[256], password[256];
    bool cluster;
    struct node_count node[MAX_NODES];
    size_t nnodes;
    struct redis_wire *ctx;
    SSL_CTX *tls; /* rediss:// */
    bool verify;
    struct fp_count *fp;
    size_t nfp;
    uint64_t pages, bytes, good, bad, copies;
    uint64_t other;   /* kvt:* keys whose name is not a page's, or not strings: bad for verify */
    uint64_t gone;    /* keys SCAN named that were gone when read (evicted, expired) */
    uint64_t nlisted; /* bad keys kept in listed */
    char listed[BAD_LISTED][STORE_REDIS_KEY_CHARS + 1];
    uint64_t used_memory, maxmemory;
    char policy[64];
    char why[400];      /* the last failure, as said on stderr */
    size_t unreachable; /* masters not scanned whole */
};

/* Say why something failed (on stderr, as ctl_fail does) and keep it for the report: 1. */
static int fail(struct remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct remote *r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->why, sizeof(r->why), fmt, ap);
    va_end(ap);
    return ctl_fail("%s", r->why);
}

/* ---- the connection ---- */

/* A reply that is not what what expects, or (rep NULL) none: why (rc) from the client. */
static int reply_error(struct remote *r, const struct resp_value *rep, const char *what, int rc)
{
    if (!rep)
        return fail(r, "%s: %s: %s", r->server, what, redis_wire_why(r->ctx, rc));
    return fail(r, "%s: %s: %s", r->server, what,
                rep->type == RESP_ERROR ? rep->str : "unexpected reply");
}

/* One command and its reply; NULL (said) when the connection failed. */
static struct resp_value *call(struct remote *r, int argc, const char **argv, const char *what)
{
    struct resp_value *rep;
    int rc;

    if ((rc = redis_call(r->ctx, argc, argv, NULL, &rep))) {
        reply_error(r, NULL, what, rc);
        return NULL;
    }
    return rep;
}

/* AUTH [user] password on r->ctx: 0, or 1 with the refusal named (WRONGPASS, ...). */
static int authenticate(struct remote *r)
{
    const char *argv[] = {"AUTH", r->user[0] ? r->user : r->password, r->password};
    struct resp_value *rep = call(r, r->user[0] ? 3 : 2, argv, "AUTH");

    if (!rep)
        return 1;
    if (rep->type != RESP_ERROR) {
        redis_resp_free(rep);
        return 0;
    }
    fail(r, "%s: AUTH%s%s refused: %s", r->server, r->user[0] ? " as user " : "", r->user,
         rep->str);
    redis_resp_free(rep);
    return 1;
}

/* A connection to host:port (AUTH when the URL had a password) as r->ctx. */
static int connect_to(struct remote *r, const char *host, unsigned port)
{
    const struct redis_wire_timeouts t = {TIMEOUT_S * 1000, TIMEOUT_S * 1000, TIMEOUT_S * 1000};
    char why[300];
    size_t k;

    redis_wire_close(r->ctx);
    r->ctx = NULL;
    snprintf(r->server, sizeof(r->server), "%s:%u", host, port);
    if (redis_wire_open(host, (uint16_t)port, r->tls, &t, &r->ctx, why, sizeof(why))) {
        k = strlen(r->server); /* the client's reason names the server too */
        k = !strncmp(why, r->server, k) && !strncmp(why + k, ": ", 2) ? k + 2 : 0;
        return fail(r, "cannot connect to %s: %s", r->server, why + k);
    }
    return r->password[0] ? authenticate(r) : 0;
}

/* The TLS context --tls-* ask for; 2 (bad usage) when they come without rediss:// or name a
 * file that cannot be used. */
static int tls_setup(struct remote *r, const struct ctl_args *a, bool tls)
{
    char why[400];

    if (!tls && (a->tls_ca || a->tls_cert || a->tls_key)) {
        fprintf(stderr, PROG ": --tls-ca, --tls-cert and --tls-key need a rediss:// URL\n");
        return 2;
    }
    if (tls && a->tls_key && !a->tls_cert) {
        fprintf(stderr, PROG ": --tls-key needs --tls-cert\n");
        return 2;
    }
    if (tls && redis_tls_ctx(a->tls_ca, a->tls_cert, a->tls_key, &r->tls, why, sizeof(why))) {
        fprintf(stderr, PROG ": TLS: %s\n", why);
        return 2;
    }
    return 0;
}

/* The first seed of the URL that answers; an error naming the last one when none does. */
static int remote_connect(struct remote *r, const struct ctl_args *a)
{
    char buf[1024];
    struct store_redis_options o = {0};
    int rc = 1;

    if (store_redis_parse_url(r->url, buf, sizeof(buf), &o)) {
        fprintf(stderr,
                PROG ": bad URL '%s': expected redis://[[USER]:PASSWORD@]HOST[:PORT] (or "
                     "rediss:// for TLS) or a comma-separated list of them (a cluster's seeds)\n",
                r->url);
        return 2;
    }
    if ((rc = tls_setup(r, a, o.tls)))
        return rc;
    rc = 1;
    snprintf(r->user, sizeof(r->user), "%s", o.user ? o.user : "");
    snprintf(r->password, sizeof(r->password), "%s", o.password ? o.password : "");
    for (uint32_t i = 0; i < o.n_seeds && rc; i++)
        rc = connect_to(r, o.seeds[i].host, o.seeds[i].port ? o.seeds[i].port : 6379u);
    return rc;
}

/* The masters of a CLUSTER SLOTS reply, each once; "" as a host is the asked node's. */
static int add_masters(struct remote *r, const struct resp_value *rep, const char *asked)
{
    for (size_t i = 0; i < rep->n; i++) {
        const struct resp_value *e = rep->elem[i], *m;
        char server[300];
        size_t k;
        if (e->type != RESP_ARRAY || e->n < 3 || (m = e->elem[2])->type != RESP_ARRAY || m->n < 2 ||
            m->elem[0]->type != RESP_BULK || m->elem[1]->type != RESP_INT)
            return fail(r, "%s: CLUSTER SLOTS: unexpected reply", r->server);
        if (snprintf(server, sizeof(server), "%s:%lld",
                     m->elem[0]->integer ? m->elem[0]->str : asked,
                     m->elem[1]->integer) >= (int)sizeof(server))
            return fail(r, "%s: CLUSTER SLOTS: a host name too long", r->server);
        for (k = 0; k < r->nnodes && strcmp(r->node[k].server, server); k++)
            ;
        if (k == r->nnodes && r->nnodes == MAX_NODES)
            return ctl_fail("more than %d masters", MAX_NODES);
        if (k == r->nnodes)
            snprintf(r->node[r->nnodes++].server, sizeof(server), "%s", server);
    }
    return 0;
}

/* The servers to scan: the one connected, or, when it answers as a cluster, its masters. */
static int find_nodes(struct remote *r)
{
    const char *argv[] = {"CLUSTER", "SLOTS"};
    struct resp_value *rep = call(r, 2, argv, "CLUSTER SLOTS");
    char asked[300];
    int rc = 0;

    snprintf(asked, sizeof(asked), "%s", r->server);
    *strrchr(asked, ':') = '\0';
    if (!rep)
        return 1;
    r->cluster = rep->type == RESP_ARRAY;
    if (r->cluster)
        rc = add_masters(r, rep, asked);
    else
        snprintf(r->node[r->nnodes++].server, sizeof(r->server), "%s", r->server);
    redis_resp_free(rep);
    return rc;
}

/* The value after "name:" on its own line of an INFO reply; 0 or "" when absent. */
static const char *info_field(const char *info, const char *name, char *out, size_t len)
{
    size_t n = strlen(name);

    out[0] = '\0';
    for (const char *p = info; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, name, n) && p[n] == ':') {
            size_t v = strcspn(p + n + 1, "\r\n");
            snprintf(out, len, "%.*s", (int)(v < len ? v : len - 1), p + n + 1);
            break;
        }
    }
    return out;
}

static int read_memory(struct remote *r, struct node_count *n)
{
    const char *argv[] = {"INFO", "memory"};
    struct resp_value *rep = call(r, 2, argv, "INFO memory");
    char v[64];

    if (!rep)
        return 1;
    if (rep->type != RESP_BULK) {
        int rc = reply_error(r, rep, "INFO memory", 0);
        redis_resp_free(rep);
        return rc;
    }
    n->used_memory = strtoull(info_field(rep->str, "used_memory", v, sizeof(v)), NULL, 10);
    n->maxmemory = strtoull(info_field(rep->str, "maxmemory", v, sizeof(v)), NULL, 10);
    r->used_memory += n->used_memory;
    r->maxmemory += n->maxmemory;
    if (!r->policy[0])
        info_field(rep->str, "maxmemory_policy", r->policy, sizeof(r->policy));
    redis_resp_free(rep);
    return 0;
}

/* ---- one key ---- */

static bool unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < 2 * n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        out[i / 2] = (uint8_t)(i % 2 ? out[i / 2] | d : d << 4);
    }
    return true;
}

/* A copy's suffix after the page's key: ":copy{" five hex digits "}". */
static bool copy_suffix(const char *s)
{
    size_t k = strlen(STORE_REDIS_COPY_SUFFIX);
    uint8_t tag[3];
    char t[6] = {'0'};

    if (memcmp(s, STORE_REDIS_COPY_SUFFIX, k) || s[k + 5] != '}')
        return false;
    memcpy(t + 1, s + k, 5); /* "0" and the five digits: three bytes of hex */
    return unhex(t, tag, 3);
}

/* Whether name is a page's key, "kvt:<fp hex>:<key hex>", as store_redis_key writes it, or its
 * copy's (*copy set), as store_redis_copy_key does. */
static bool parse_name(const char *name, size_t len, uint8_t *fp, uint8_t *key, bool *copy)
{
    *copy = len == STORE_REDIS_COPY_KEY_CHARS && copy_suffix(name + STORE_REDIS_KEY_CHARS);
    return (len == STORE_REDIS_KEY_CHARS || *copy) && !memcmp(name, "kvt:", 4) &&
           name[4 + FP_HEX] == ':' && unhex(name + 4, fp, STORE_REDIS_FP_BYTES) &&
           unhex(name + 5 + FP_HEX, key, STORE_KEY_BYTES);
}

static struct fp_count *fp_of(struct remote *r, const char *name)
{
    struct fp_count *grown;

    for (size_t i = 0; i < r->nfp; i++)
        if (!memcmp(r->fp[i].hex, name + 4, FP_HEX))
            return &r->fp[i];
    if (!(grown = realloc(r->fp, (r->nfp + 1) * sizeof(*grown))))
        return NULL;
    r->fp = grown;
    memset(&r->fp[r->nfp], 0, sizeof(r->fp[0]));
    memcpy(r->fp[r->nfp].hex, name + 4, FP_HEX);
    return &r->fp[r->nfp++];
}

static void note_bad(struct remote *r, const char *name, size_t len)
{
    r->bad++;
    if (r->nlisted < BAD_LISTED)
        snprintf(r->listed[r->nlisted++], STORE_REDIS_KEY_CHARS + 1, "%.*s",
                 (int)(len < STORE_REDIS_KEY_CHARS ? len : STORE_REDIS_KEY_CHARS), name);
}

/* The value (verify: GET) or its length (stat: STRLEN) of one key SCAN named. */
static int count_key(struct remote *r, const struct resp_value *name, const struct resp_value *rep)
{
    uint8_t fp[STORE_REDIS_FP_BYTES], key[STORE_KEY_BYTES];
    size_t name_len = (size_t)name->integer,
           len = rep->type == RESP_BULK ? (size_t)rep->integer : 0;
    bool copy, foreign = rep->type == RESP_ERROR; /* another type than a string */
    bool page = parse_name(name->str, name_len, fp, key, &copy) && !foreign;
    struct fp_count *f = page ? fp_of(r, name->str) : NULL;
    uint64_t bytes = r->verify || foreign ? len : (uint64_t)rep->integer;

    if (page && !f)
        return ctl_fail("out of memory");
    if ((r->verify && rep->type == RESP_NIL) || (!r->verify && !foreign && !bytes)) {
        r->gone++; /* evicted or expired between SCAN and the read */
        return 0;
    }
    if (!page) {
        r->other++;
        if (r->verify)
            note_bad(r, name->str, name_len);
        return 0;
    }
    f->pages++, f->bytes += bytes, r->pages++, r->bytes += bytes;
    f->copies += copy, r->copies += copy;
    if (!r->verify)
        return 0;
    bool ok = rep->type == RESP_BULK && len >= STORE_REDIS_HEAD_BYTES &&
              len - STORE_REDIS_HEAD_BYTES <= UINT32_MAX &&
              !store_redis_value_check(fp, key, (uint32_t)(len - STORE_REDIS_HEAD_BYTES),
                                       (const uint8_t *)rep->str, len);
    ok ? (f->good++, r->good++) : (f->bad++, note_bad(r, name->str, name_len));
    return 0;
}

/* ---- the scan ---- */

/* Read the keys of one SCAN reply, pipelined. */
static int read_batch(struct remote *r, const struct resp_value *keys)
{
    const char *what = r->verify ? "GET" : "STRLEN";
    struct resp_value *rep;
    int rc = 0;

    for (size_t i = 0; i < keys->n; i++) {
        const char *argv[] = {what, keys->elem[i]->str};
        size_t lens[] = {strlen(what), (size_t)keys->elem[i]->integer};
        if (keys->elem[i]->type != RESP_BULK)
            return reply_error(r, keys, "SCAN", 0);
        if (redis_wire_append(r->ctx, 2, argv, lens))
            return ctl_fail("out of memory");
    }
    if ((rc = redis_wire_flush(r->ctx)))
        return reply_error(r, NULL, what, rc);
    for (size_t i = 0; i < keys->n; i++) {
        int err;
        if ((err = redis_resp_read(r->ctx, &rep)))
            return rc ? rc : reply_error(r, NULL, what, err);
        if (!rc && rep->type == RESP_ERROR &&
            (!strncmp(rep->str, "MOVED ", 6) || !strncmp(rep->str, "ASK ", 4)))
            r->gone++; /* its slot moved to another node during the scan */
        else if (!rc && rep->type == RESP_ERROR && !strncmp(rep->str, "WRONGTYPE", 9))
            rc = count_key(r, keys->elem[i], rep); /* a list, a set...: foreign */
        else if (!rc && (rep->type == RESP_ERROR || (!r->verify && rep->type != RESP_INT)))
            rc = reply_error(r, rep, what, 0);
        else if (!rc)
            rc = count_key(r, keys->elem[i], rep);
        redis_resp_free(rep);
    }
    return rc;
}

static bool scan_reply_ok(const struct resp_value *rep)
{
    return rep->type == RESP_ARRAY && rep->n == 2 && rep->elem[0]->type == RESP_BULK &&
           rep->elem[1]->type == RESP_ARRAY;
}

static int scan_all(struct remote *r)
{
    char cursor[32] = "0";
    int rc = 0;

    do {
        const char *argv[] = {"SCAN", cursor, "MATCH", "kvt:*", "COUNT", SCAN_COUNT};
        struct resp_value *rep = call(r, 6, argv, "SCAN");
        if (!rep)
            return 1;
        if (!scan_reply_ok(rep)) {
            rc = reply_error(r, rep, "SCAN", 0);
            redis_resp_free(rep);
            return rc;
        }
        snprintf(cursor, sizeof(cursor), "%s", rep->elem[0]->str);
        rc = read_batch(r, rep->elem[1]);
        redis_resp_free(rep);
    } while (!rc && strcmp(cursor, "0"));
    return rc;
}

/* ---- reports ---- */

/* A cluster's masters, one line each; one that was not scanned whole says so and why. */
static void nodes_text(const struct remote *r)
{
    char b1[32], b2[32];

    if (!r->cluster)
        return;
    printf("\n%-24s %12s %12s %12s %12s  %s\n", "node", "pages", "bytes",
           r->verify ? "good" : "used", r->verify ? "bad" : "maxmemory", "state");
    for (size_t i = 0; i < r->nnodes; i++) {
        const struct node_count *n = &r->node[i];
        if (r->verify)
            printf("%-24s %12" PRIu64 " %12s %12" PRIu64 " %12" PRIu64, n->server, n->pages,
                   ctl_bytes(n->bytes, b1), n->good, n->bad);
        else
            printf("%-24s %12" PRIu64 " %12s %12s %12s", n->server, n->pages,
                   ctl_bytes(n->bytes, b1), ctl_bytes(n->used_memory, b2),
                   n->maxmemory ? ctl_bytes(n->maxmemory, b2 + 16) : "none");
        printf("  %s%s%s\n", n->state, n->error[0] ? ": " : "", n->error);
    }
}

static void server_line(const struct remote *r)
{
    if (r->cluster)
        printf("cluster:      %zu master%s, found from %s\n", r->nnodes, r->nnodes == 1 ? "" : "s",
               r->seed);
    else
        printf("server:       %s\n", r->seed);
    if (r->unreachable)
        printf("unreachable:  %zu master%s (the totals are the others')\n", r->unreachable,
               r->unreachable == 1 ? "" : "s");
}

static void copies_line(const struct remote *r)
{
    if (r->copies)
        printf("copies:       %" PRIu64 " of them pages' copies (a second key on another master)\n",
               r->copies);
}

static void stat_text(const struct remote *r)
{
    char b1[32], b2[32];

    server_line(r);
    printf("used memory:  %s\n", ctl_bytes(r->used_memory, b1));
    printf("maxmemory:    %s, policy %s\n",
           r->maxmemory ? ctl_bytes(r->maxmemory, b2) : "none (no limit)",
           r->policy[0] ? r->policy : "?");
    printf("pages:        %" PRIu64 " (%s) in %zu fingerprint%s\n", r->pages,
           ctl_bytes(r->bytes, b1), r->nfp, r->nfp == 1 ? "" : "s");
    copies_line(r);
    if (r->other)
        printf("other keys:   %" PRIu64 " kvt:* keys that are no page (another name or type)\n",
               r->other);
    if (r->nfp)
        printf("\n%-*s %12s %12s\n", FP_HEX, "fingerprint", "pages", "bytes");
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s %12" PRIu64 " %12s\n", r->fp[i].hex, r->fp[i].pages,
               ctl_bytes(r->fp[i].bytes, b1));
    nodes_text(r);
}

/* Every server scanned (one unless a cluster), with its counts. */
static void nodes_json(const struct remote *r)
{
    printf(",\"cluster\":%s,\"nodes\":[", r->cluster ? "true" : "false");
    for (size_t i = 0; i < r->nnodes; i++) {
        const struct node_count *n = &r->node[i];
        printf("%s{\"server\":", i ? "," : "");
        cli_json_string(n->server);
        printf(",\"state\":\"%s\"", n->state);
        if (n->error[0]) {
            printf(",\"error\":");
            cli_json_string(n->error);
        }
        printf(",\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64, n->pages, n->bytes);
        if (r->verify)
            printf(",\"good\":%" PRIu64 ",\"bad\":%" PRIu64 "}", n->good, n->bad);
        else
            printf(",\"used_memory\":%" PRIu64 ",\"maxmemory\":%" PRIu64 "}", n->used_memory,
                   n->maxmemory);
    }
    printf("]");
}

static void json_head(const struct remote *r)
{
    printf("{\"server\":");
    cli_json_string(r->seed);
    printf(",\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"copies\":%" PRIu64
           ",\"other_keys\":%" PRIu64 ",\"unreachable\":%zu",
           r->pages, r->bytes, r->copies, r->other, r->unreachable);
    nodes_json(r);
}

static void stat_json(const struct remote *r)
{
    json_head(r);
    printf(",\"used_memory\":%" PRIu64 ",\"maxmemory\":%" PRIu64 ",\"maxmemory_policy\":",
           r->used_memory, r->maxmemory);
    cli_json_string(r->policy);
    printf(",\"fingerprints\":[");
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s{\"fingerprint\":\"%s\",\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"copies\":%" PRIu64 "}",
               i ? "," : "", r->fp[i].hex, r->fp[i].pages, r->fp[i].bytes, r->fp[i].copies);
    printf("]}\n");
}

static void verify_text(const struct remote *r)
{
    server_line(r);
    printf("pages read:   %" PRIu64 ", good %" PRIu64 ", bad %" PRIu64 "\n", r->pages, r->good,
           r->bad - r->other);
    copies_line(r);
    if (r->other)
        printf("other keys:   %" PRIu64
               " kvt:* keys that are no page (another name or type; bad)\n",
               r->other);
    if (r->gone)
        printf("gone:         %" PRIu64 " keys evicted or expired during the scan\n", r->gone);
    if (r->nfp)
        printf("\n%-*s %12s %12s\n", FP_HEX, "fingerprint", "good", "bad");
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s %12" PRIu64 " %12" PRIu64 "\n", r->fp[i].hex, r->fp[i].good, r->fp[i].bad);
    nodes_text(r);
    for (uint64_t i = 0; i < r->nlisted; i++)
        printf("%sbad: %s\n", i ? "" : "\n", r->listed[i]);
    if (r->bad > r->nlisted)
        printf("... and %" PRIu64 " more\n", r->bad - r->nlisted);
    printf("%s\n", r->bad ? "PROBLEMS FOUND" : r->unreachable ? "INCOMPLETE" : "OK");
}

static void verify_json(const struct remote *r)
{
    json_head(r);
    printf(",\"good\":%" PRIu64 ",\"bad\":%" PRIu64 ",\"gone\":%" PRIu64 ",\"fingerprints\":[",
           r->good, r->bad, r->gone);
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s{\"fingerprint\":\"%s\",\"good\":%" PRIu64 ",\"bad\":%" PRIu64 "}", i ? "," : "",
               r->fp[i].hex, r->fp[i].good, r->fp[i].bad);
    printf("],\"bad_keys\":[");
    for (uint64_t i = 0; i < r->nlisted; i++) {
        fputs(i ? "," : "", stdout);
        cli_json_string(r->listed[i]);
    }
    printf("],\"ok\":%s}\n", r->bad || r->unreachable ? "false" : "true");
}

/* Scan node n (connected to it first on a cluster), its counts the totals' growth; one that
 * cannot be reached or fails keeps its state and why. */
static int scan_node(struct remote *r, struct node_count *n)
{
    struct remote before = *r;
    char host[300];
    int rc = 0;

    n->state = "ok";
    if (r->cluster) {
        snprintf(host, sizeof(host), "%s", n->server);
        char *colon = strrchr(host, ':');
        *colon = '\0';
        if ((rc = connect_to(r, host, (unsigned)strtoul(colon + 1, NULL, 10))))
            n->state = "unreachable";
    }
    if (!rc && !r->verify)
        rc = read_memory(r, n);
    if (!rc)
        rc = scan_all(r);
    if (rc && !strcmp(n->state, "ok"))
        n->state = "failed";
    if (rc)
        snprintf(n->error, sizeof(n->error), "%s", r->why);
    n->pages = r->pages - before.pages;
    n->bytes = r->bytes - before.bytes;
    n->good = r->good - before.good;
    n->bad = r->bad - before.bad;
    return rc;
}

/* Every master of a cluster scanned, those that fail counted and skipped; a standalone
 * server's failure ends the run, as does every master's. */
static int scan_nodes(struct remote *r)
{
    int rc;

    for (size_t i = 0; i < r->nnodes; i++) {
        if (!(rc = scan_node(r, &r->node[i])))
            continue;
        if (!r->cluster || rc != 1)
            return rc;
        r->unreachable++;
    }
    return r->nnodes && r->unreachable == r->nnodes ? 1 : 0;
}

static int remote_run(struct remote *r, const struct ctl_args *a)
{
    bool json = a->json;
    int rc = remote_connect(r, a);

    if (!rc)
        rc = find_nodes(r);
    if (!rc)
        snprintf(r->seed, sizeof(r->seed), "%s", r->server);
    if (!rc)
        rc = scan_nodes(r);
    if (rc)
        return rc;
    if (r->verify)
        json ? verify_json(r) : verify_text(r);
    else
        json ? stat_json(r) : stat_text(r);
    return (r->verify && r->bad) || r->unreachable ? 1 : 0;
}

int cmd_remote(const struct ctl_args *a)
{
    struct remote *r = calloc(1, sizeof(*r));
    int rc;

    if (!r)
        return ctl_fail("out of memory");
    r->verify = !strcmp(a->pos[0], "verify");
    r->url = a->pos[1];
    rc = remote_run(r, a);
    redis_wire_close(r->ctx);
    redis_tls_ctx_free(r->tls);
    free(r->fp);
    free(r);
    return rc;
}

#endif
