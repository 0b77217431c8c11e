/*
 * The remote URL, "redis://[:PASSWORD@]HOST[:PORT]": one parser for the engine's
 * options.remote and the tools that look at the same server.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/redis/redis.h"

int store_redis_parse_url(const char *url, char *buf, size_t len, struct store_redis_options *ro)
{
    static const char scheme[] = "redis://";
    char *at, *colon, *end;

    if (strncmp(url, scheme, strlen(scheme)) || strlen(url) >= len)
        return -EINVAL;
    strcpy(buf, url + strlen(scheme));
    if ((at = strrchr(buf, '@'))) {
        if (buf[0] != ':')
            return -EINVAL; /* no ACL user yet: ":password@" */
        *at = '\0';
        ro->password = buf + 1;
        buf = at + 1;
    }
    if ((colon = strrchr(buf, ':'))) {
        *colon = '\0';
        unsigned long port = strtoul(colon + 1, &end, 10);
        if (!colon[1] || *end || port == 0 || port > 65535)
            return -EINVAL;
        ro->port = (uint16_t)port;
    }
    if (!*buf || strchr(buf, '/'))
        return -EINVAL;
    ro->host = buf;
    return 0;
}
