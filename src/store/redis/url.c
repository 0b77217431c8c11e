/*
 * The remote URL: "redis://[[USER]:PASSWORD@]HOST[:PORT]" ("rediss://": over TLS), or a
 * comma-separated list of them naming one cluster's seeds: one parser for the engine's
 * options.remote and the tools that look at the same servers. USER and PASSWORD may carry any byte
 * as %XX (':', '@', ',', '%' itself), so a password holding them can be written down; a '%' not
 * followed by two hex digits is kept as it is. Options of the store follow the list after a
 * '?' (the last one, past every '@': a password may hold one): "copies=1|2",
 * "replica_reads=yes|no", joined by '&'.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis/redis.h"

static const char plain[] = "redis://", secure[] = "rediss://";

/* The length of s's scheme, redis:// or rediss:// (*tls: which); 0 when it has neither. */
static size_t scheme_len(const char *s, bool *tls)
{
    *tls = !strncmp(s, secure, strlen(secure));
    return *tls ? strlen(secure) : !strncmp(s, plain, strlen(plain)) ? strlen(plain) : 0;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* %XX decoded in place; -EINVAL when it decodes to a NUL (AUTH could not send it). */
static int unescape(char *s)
{
    char *out = s;
    int hi, lo;

    for (; *s; s++) {
        if (s[0] == '%' && (hi = hex_digit(s[1])) >= 0 && (lo = hex_digit(s[2])) >= 0) {
            if (!(*out++ = (char)(hi << 4 | lo)))
                return -EINVAL;
            s += 2;
        } else {
            *out++ = *s;
        }
    }
    *out = '\0';
    return 0;
}

/* "[USER]:PASSWORD", in place: *user NULL when empty (the default user). */
static int parse_userinfo(char *s, const char **user, const char **password)
{
    char *colon = strchr(s, ':');

    if (!colon || !colon[1])
        return -EINVAL; /* "USER@" or "USER:@": no password to AUTH with */
    *colon = '\0';
    *user = s[0] ? s : NULL;
    *password = colon + 1;
    return unescape(s) || unescape(colon + 1) ? -EINVAL : 0;
}

/* One seed, in place in s ("[[USER]:PASSWORD@]HOST[:PORT]"); *user, *password set when it
 * has them. */
static int parse_seed(char *s, struct store_redis_addr *a, const char **user, const char **password)
{
    char *at, *colon, *end;

    *user = *password = NULL;
    if ((at = strrchr(s, '@'))) {
        *at = '\0';
        if (parse_userinfo(s, user, password))
            return -EINVAL;
        s = at + 1;
    }
    a->port = 0;
    if ((colon = strrchr(s, ':'))) {
        *colon = '\0';
        unsigned long port = strtoul(colon + 1, &end, 10);
        if (!colon[1] || *end || port == 0 || port > 65535)
            return -EINVAL;
        a->port = (uint16_t)port;
    }
    if (!*s || strchr(s, '/'))
        return -EINVAL;
    a->host = s;
    return 0;
}

static bool same(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Every seed after the scheme of the first, each item of the list cut out of buf; a seed's
 * own scheme, if it has one, must ask for what the first's does (tls). */
static int parse_list(char *buf, bool tls, struct store_redis_options *ro)
{
    const char *u, *pw, *user = NULL, *password = NULL;
    uint32_t n = 0;
    size_t k;
    bool t;
    int rc = 0;

    for (char *item = buf, *next; item && !rc; item = next) {
        if ((next = strchr(item, ',')))
            *next++ = '\0';
        if (n > 0 && (k = scheme_len(item, &t))) {
            if (t != tls)
                return -EINVAL; /* one cluster, one kind of connection */
            item += k;
        }
        if (n == STORE_REDIS_MAX_SEEDS || (rc = parse_seed(item, &ro->seeds[n], &u, &pw)))
            return -EINVAL;
        if (pw && password && (strcmp(pw, password) || !same(u, user)))
            return -EINVAL; /* one cluster, one user and password */
        user = pw ? u : user;
        password = pw ? pw : password;
        n++;
    }
    ro->n_seeds = n;
    ro->user = user;
    ro->password = password;
    ro->host = ro->seeds[0].host;
    ro->port = ro->seeds[0].port;
    return 0;
}

static int parse_yes(const char *v, bool *out)
{
    *out = !strcmp(v, "yes") || !strcmp(v, "1") || !strcmp(v, "true");
    return *out || !strcmp(v, "no") || !strcmp(v, "0") || !strcmp(v, "false") ? 0 : -EINVAL;
}

/* "NAME=VALUE&..." in place into o: copies, replica_reads. */
static int parse_options(char *q, struct store_redis_options *o)
{
    for (char *item = q, *next; item; item = next) {
        char *eq = strchr(item, '=');
        if ((next = strchr(item, '&')))
            *next++ = '\0';
        if (!eq)
            return -EINVAL;
        *eq = '\0';
        if (!strcmp(item, "copies") && (!strcmp(eq + 1, "1") || !strcmp(eq + 1, "2")))
            o->copies = (uint32_t)(eq[1] - '0');
        else if (strcmp(item, "replica_reads") || parse_yes(eq + 1, &o->replica_reads))
            return -EINVAL;
    }
    return 0;
}

int store_redis_parse_url(const char *url, char *buf, size_t len, struct store_redis_options *ro)
{
    struct store_redis_options o = *ro;
    size_t k = scheme_len(url, &o.tls);
    char *q;
    int rc;

    if (!k || strlen(url) >= len)
        return -EINVAL;
    strcpy(buf, url + k);
    if ((q = strrchr(buf, '?')) && !strchr(q, '@')) {
        *q++ = '\0';
        if ((rc = parse_options(q, &o)))
            return rc;
    }
    if ((rc = parse_list(buf, o.tls, &o)))
        return rc;
    *ro = o;
    return 0;
}
