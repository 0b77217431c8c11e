/*
 * kvt_pagestore_open (include/kvtier_store.h): the page store over its disk and, where
 * options.remote names a Redis or Valkey server, a chain of the two (store/chain.h: a write
 * goes to both, a read to the nearest that holds the page, checked there). It sits above the
 * backends, as api.c does for the engine, since no backend may open another.
 */
#include <errno.h>
#include <string.h>

#include "kvtier_store.h"
#include "store/chain.h"
#include "disk/pagestore.h"
#ifdef KVT_HAVE_REDIS
#include "store/redis/redis.h"
#endif

#define REMOTE_TIMEOUT_MS 1000

/* The server's store for pages of s, with its fingerprint. */
static int open_remote(const struct kvt_pagestore_options *o, kvt_pagestore *s,
                       struct kvt_store **out)
{
#ifdef KVT_HAVE_REDIS
    char buf[1024];
    uint32_t ms = o->remote_timeout_ms ? o->remote_timeout_ms : REMOTE_TIMEOUT_MS;
    struct store_redis_options ro = {.page_bytes = (uint32_t)o->page_bytes,
                                     .page_tokens = o->page_tokens,
                                     .connect_timeout_ms = ms,
                                     .read_timeout_ms = ms,
                                     .write_timeout_ms = ms,
                                     .exists_timeout_ms = ms,
                                     .ttl_s = o->remote_ttl_s};
    int rc = store_redis_parse_url(o->remote, buf, sizeof(buf), &ro);

    if (rc)
        return rc;
    memcpy(ro.fingerprint, pagestore_fingerprint(s), STORE_REDIS_FP_BYTES);
    return store_redis_open(&ro, out); /* it copies what points into buf */
#else
    (void)o;
    (void)s;
    (void)out;
    return KVT_ENOBACKEND;
#endif
}

/* Put the chain of s's disk and the server under s; on failure both are closed (s then has
 * no block store left, and is only closed). */
static int attach_remote(const struct kvt_pagestore_options *o, kvt_pagestore *s)
{
    struct kvt_store *stores[2] = {NULL, NULL}, *chain;
    int rc = open_remote(o, s, &stores[1]);

    if (rc)
        return rc;
    if ((rc = pagestore_disk_store(s, &stores[0]))) {
        store_close(stores[1]);
        return rc;
    }
    if ((rc = store_chain_open(stores, 2, &chain))) {
        store_close(stores[1]);
        store_close(stores[0]);
        return rc;
    }
    pagestore_attach_chain(s, chain);
    return 0;
}

int kvt_pagestore_open(const struct kvt_pagestore_options *opts, kvt_pagestore **out)
{
    struct kvt_pagestore_options o;
    kvt_pagestore *s;
    int rc;

    if (!out)
        return -EINVAL;
    *out = NULL;
    if ((rc = pagestore_options(opts, &o)))
        return rc;
    if (o.remote && o.read_only)
        return -EINVAL; /* a reader beside a writer: the server is the writer's to fill */
    if ((rc = pagestore_open_disk(&o, &s)))
        return rc;
    if (o.remote && (rc = attach_remote(&o, s))) {
        pagestore_close(s);
        return rc;
    }
    *out = s;
    return 0;
}
