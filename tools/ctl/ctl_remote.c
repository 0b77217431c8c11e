/*
 * remote stat URL and remote verify URL: the Redis/Valkey tier (options.remote) seen from the
 * server. Pages live under "kvt:<fingerprint hex>:<page key hex>" (src/store/redis), so a SCAN
 * of kvt:* finds every engine's pages, grouped here by fingerprint. Only SCAN, STRLEN, GET,
 * INFO and AUTH are sent: the server is never modified. Keys are read in pipelined batches of
 * one SCAN reply each, so a big server costs round trips per thousand keys, not per key.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ctl.h"

#ifndef KVT_HAVE_REDIS

int cmd_remote(const struct ctl_args *a)
{
    (void)a;
    fputs(PROG ": remote commands are not built in (kvtier was built without hiredis)\n", stderr);
    return 2;
}

#else

#include <hiredis/hiredis.h>

#include "kvtier.h"
#include "store/redis/redis.h"

#define SCAN_COUNT "1000"
#define BAD_LISTED 8 /* bad keys named in the report */
#define FP_HEX (2 * STORE_REDIS_FP_BYTES)
#define TIMEOUT_S 10

struct fp_count {
    char hex[FP_HEX + 1];
    uint64_t pages, bytes, good, bad;
};

struct remote {
    const char *url;
    char server[300];
    redisContext *ctx;
    bool verify;
    struct fp_count *fp;
    size_t nfp;
    uint64_t pages, bytes, good, bad;
    uint64_t other;   /* kvt:* keys whose name is not a page's: bad for verify */
    uint64_t gone;    /* keys SCAN named that were gone when read (evicted, expired) */
    uint64_t nlisted; /* bad keys kept in listed */
    char listed[BAD_LISTED][STORE_REDIS_KEY_CHARS + 1];
    uint64_t used_memory, maxmemory;
    char policy[64];
};

/* ---- the connection ---- */

static int remote_connect(struct remote *r)
{
    char buf[1024];
    struct store_redis_options o = {0};
    struct timeval tv = {.tv_sec = TIMEOUT_S};
    redisReply *rep;

    if (store_redis_parse_url(r->url, buf, sizeof(buf), &o)) {
        fprintf(stderr, PROG ": bad URL '%s': expected redis://[:PASSWORD@]HOST[:PORT]\n", r->url);
        return 2;
    }
    snprintf(r->server, sizeof(r->server), "%s:%u", o.host, o.port ? o.port : 6379u);
    r->ctx = redisConnectWithTimeout(o.host, o.port ? o.port : 6379, tv);
    if (!r->ctx || r->ctx->err)
        return ctl_fail("cannot connect to %s: %s", r->server,
                        r->ctx ? r->ctx->errstr : "out of memory");
    redisSetTimeout(r->ctx, tv);
    if (!o.password)
        return 0;
    rep = redisCommand(r->ctx, "AUTH %s", o.password);
    if (rep && rep->type != REDIS_REPLY_ERROR) {
        freeReplyObject(rep);
        return 0;
    }
    ctl_fail("%s: AUTH failed: %s", r->server, rep ? rep->str : r->ctx->errstr);
    freeReplyObject(rep);
    return 1;
}

static int reply_error(struct remote *r, const redisReply *rep, const char *what)
{
    if (!rep)
        return ctl_fail("%s: %s: %s", r->server, what, r->ctx->errstr);
    return ctl_fail("%s: %s: %s", r->server, what,
                    rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
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

static int read_memory(struct remote *r)
{
    redisReply *rep = redisCommand(r->ctx, "INFO memory");
    char v[64];

    if (!rep || rep->type != REDIS_REPLY_STRING) {
        int rc = reply_error(r, rep, "INFO memory");
        freeReplyObject(rep);
        return rc;
    }
    r->used_memory = strtoull(info_field(rep->str, "used_memory", v, sizeof(v)), NULL, 10);
    r->maxmemory = strtoull(info_field(rep->str, "maxmemory", v, sizeof(v)), NULL, 10);
    info_field(rep->str, "maxmemory_policy", r->policy, sizeof(r->policy));
    freeReplyObject(rep);
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

/* Whether name is a page's key, "kvt:<fp hex>:<key hex>", as store_redis_key writes it. */
static bool parse_name(const char *name, size_t len, uint8_t *fp, uint8_t *key)
{
    return len == STORE_REDIS_KEY_CHARS && !memcmp(name, "kvt:", 4) && name[4 + FP_HEX] == ':' &&
           unhex(name + 4, fp, STORE_REDIS_FP_BYTES) &&
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
static int count_key(struct remote *r, const redisReply *name, const redisReply *rep)
{
    uint8_t fp[STORE_REDIS_FP_BYTES], key[STORE_KEY_BYTES];
    bool page = parse_name(name->str, name->len, fp, key);
    struct fp_count *f = page ? fp_of(r, name->str) : NULL;
    uint64_t bytes =
        r->verify ? (rep->type == REDIS_REPLY_STRING ? rep->len : 0) : (uint64_t)rep->integer;

    if (page && !f)
        return ctl_fail("out of memory");
    if ((r->verify && rep->type == REDIS_REPLY_NIL) || (!r->verify && !bytes)) {
        r->gone++; /* evicted or expired between SCAN and the read */
        return 0;
    }
    if (!page) {
        r->other++;
        if (r->verify)
            note_bad(r, name->str, name->len);
        return 0;
    }
    f->pages++, f->bytes += bytes, r->pages++, r->bytes += bytes;
    if (!r->verify)
        return 0;
    bool ok = rep->type == REDIS_REPLY_STRING && rep->len >= STORE_REDIS_HEAD_BYTES &&
              rep->len - STORE_REDIS_HEAD_BYTES <= UINT32_MAX &&
              !store_redis_value_check(fp, key, (uint32_t)(rep->len - STORE_REDIS_HEAD_BYTES),
                                       (const uint8_t *)rep->str, rep->len);
    ok ? (f->good++, r->good++) : (f->bad++, note_bad(r, name->str, name->len));
    return 0;
}

/* ---- the scan ---- */

/* Read the keys of one SCAN reply, pipelined. */
static int read_batch(struct remote *r, const redisReply *keys)
{
    redisReply *rep;
    int rc = 0;

    for (size_t i = 0; i < keys->elements; i++)
        redisAppendCommand(r->ctx, r->verify ? "GET %b" : "STRLEN %b", keys->element[i]->str,
                           keys->element[i]->len);
    for (size_t i = 0; i < keys->elements; i++) {
        if (redisGetReply(r->ctx, (void **)&rep) != REDIS_OK)
            return reply_error(r, NULL, r->verify ? "GET" : "STRLEN");
        if (!rc &&
            (rep->type == REDIS_REPLY_ERROR || (!r->verify && rep->type != REDIS_REPLY_INTEGER)))
            rc = reply_error(r, rep, r->verify ? "GET" : "STRLEN");
        else if (!rc)
            rc = count_key(r, keys->element[i], rep);
        freeReplyObject(rep);
    }
    return rc;
}

static bool scan_reply_ok(const redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
           rep->element[0]->type == REDIS_REPLY_STRING &&
           rep->element[1]->type == REDIS_REPLY_ARRAY;
}

static int scan_all(struct remote *r)
{
    char cursor[32] = "0";
    int rc = 0;

    do {
        redisReply *rep = redisCommand(r->ctx, "SCAN %s MATCH kvt:* COUNT " SCAN_COUNT, cursor);
        if (!scan_reply_ok(rep)) {
            rc = reply_error(r, rep, "SCAN");
            freeReplyObject(rep);
            return rc;
        }
        snprintf(cursor, sizeof(cursor), "%s", rep->element[0]->str);
        rc = read_batch(r, rep->element[1]);
        freeReplyObject(rep);
    } while (!rc && strcmp(cursor, "0"));
    return rc;
}

/* ---- reports ---- */

static void stat_text(const struct remote *r)
{
    char b1[32], b2[32];

    printf("server:       %s\n", r->server);
    printf("used memory:  %s\n", ctl_bytes(r->used_memory, b1));
    printf("maxmemory:    %s, policy %s\n",
           r->maxmemory ? ctl_bytes(r->maxmemory, b2) : "none (no limit)",
           r->policy[0] ? r->policy : "?");
    printf("pages:        %" PRIu64 " (%s) in %zu fingerprint%s\n", r->pages,
           ctl_bytes(r->bytes, b1), r->nfp, r->nfp == 1 ? "" : "s");
    if (r->other)
        printf("other keys:   %" PRIu64 " kvt:* keys not named as pages\n", r->other);
    if (r->nfp)
        printf("\n%-*s %12s %12s\n", FP_HEX, "fingerprint", "pages", "bytes");
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s %12" PRIu64 " %12s\n", r->fp[i].hex, r->fp[i].pages,
               ctl_bytes(r->fp[i].bytes, b1));
}

static void json_head(const struct remote *r)
{
    printf("{\"server\":");
    cli_json_string(r->server);
    printf(",\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"other_keys\":%" PRIu64, r->pages,
           r->bytes, r->other);
}

static void stat_json(const struct remote *r)
{
    json_head(r);
    printf(",\"used_memory\":%" PRIu64 ",\"maxmemory\":%" PRIu64 ",\"maxmemory_policy\":",
           r->used_memory, r->maxmemory);
    cli_json_string(r->policy);
    printf(",\"fingerprints\":[");
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s{\"fingerprint\":\"%s\",\"pages\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
               i ? "," : "", r->fp[i].hex, r->fp[i].pages, r->fp[i].bytes);
    printf("]}\n");
}

static void verify_text(const struct remote *r)
{
    printf("server:       %s\n", r->server);
    printf("pages read:   %" PRIu64 ", good %" PRIu64 ", bad %" PRIu64 "\n", r->pages, r->good,
           r->bad - r->other);
    if (r->other)
        printf("other keys:   %" PRIu64 " kvt:* keys not named as pages (bad)\n", r->other);
    if (r->gone)
        printf("gone:         %" PRIu64 " keys evicted or expired during the scan\n", r->gone);
    if (r->nfp)
        printf("\n%-*s %12s %12s\n", FP_HEX, "fingerprint", "good", "bad");
    for (size_t i = 0; i < r->nfp; i++)
        printf("%s %12" PRIu64 " %12" PRIu64 "\n", r->fp[i].hex, r->fp[i].good, r->fp[i].bad);
    for (uint64_t i = 0; i < r->nlisted; i++)
        printf("%sbad: %s\n", i ? "" : "\n", r->listed[i]);
    if (r->bad > r->nlisted)
        printf("... and %" PRIu64 " more\n", r->bad - r->nlisted);
    printf("%s\n", r->bad ? "PROBLEMS FOUND" : "OK");
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
    printf("],\"ok\":%s}\n", r->bad ? "false" : "true");
}

static int remote_run(struct remote *r, bool json)
{
    int rc = remote_connect(r);

    if (!rc && !r->verify)
        rc = read_memory(r);
    if (!rc)
        rc = scan_all(r);
    if (rc)
        return rc;
    if (r->verify)
        json ? verify_json(r) : verify_text(r);
    else
        json ? stat_json(r) : stat_text(r);
    return r->verify && r->bad ? 1 : 0;
}

int cmd_remote(const struct ctl_args *a)
{
    struct remote *r = calloc(1, sizeof(*r));
    int rc;

    if (!r)
        return ctl_fail("out of memory");
    r->verify = !strcmp(a->pos[0], "verify");
    r->url = a->pos[1];
    rc = remote_run(r, a->json);
    if (r->ctx)
        redisFree(r->ctx);
    free(r->fp);
    free(r);
    return rc;
}

#endif
