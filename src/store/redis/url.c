/*
 * The remote URL: "redis://[:PASSWORD@]HOST[:PORT]", or a comma-separated list of them naming
 * one cluster's seeds: one parser for the engine's options.remote and the tools that look at
 * the same servers.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis/redis.h"

static const char scheme[] = "redis://";

/* One seed, in place in s ("[:PASSWORD@]HOST[:PORT]"); *password set when it has one. */
static int parse_seed(char *s, struct store_redis_addr *a, const char **password)
{
    char *at, *colon, *end;

    *password = NULL;
    if ((at = strrchr(s, '@'))) {
        if (s[0] != ':')
            return -EINVAL; /* no ACL user yet: ":password@" */
        *at = '\0';
        *password = s + 1;
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

/* Every seed after the scheme of the first, each item of the list cut out of buf. */
static int parse_list(char *buf, struct store_redis_options *ro)
{
    const char *pw, *password = NULL;
    uint32_t n = 0;
    int rc = 0;

    for (char *item = buf, *next; item && !rc; item = next) {
        if ((next = strchr(item, ',')))
            *next++ = '\0';
        if (n > 0 && !strncmp(item, scheme, strlen(scheme)))
            item += strlen(scheme);
        if (n == STORE_REDIS_MAX_SEEDS || (rc = parse_seed(item, &ro->seeds[n], &pw)))
            return -EINVAL;
        if (pw && password && strcmp(pw, password))
            return -EINVAL; /* one cluster, one password */
        password = pw ? pw : password;
        n++;
    }
    ro->n_seeds = n;
    ro->password = password;
    ro->host = ro->seeds[0].host;
    ro->port = ro->seeds[0].port;
    return 0;
}

int store_redis_parse_url(const char *url, char *buf, size_t len, struct store_redis_options *ro)
{
    struct store_redis_options o = *ro;
    int rc;

    if (strncmp(url, scheme, strlen(scheme)) || strlen(url) >= len)
        return -EINVAL;
    strcpy(buf, url + strlen(scheme));
    if ((rc = parse_list(buf, &o)))
        return rc;
    *ro = o;
    return 0;
}
