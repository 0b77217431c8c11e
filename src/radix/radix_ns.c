/*
 * Namespaces: each key's namespace bytes interned once, with the root of its page hash chain.
 * Id 0 is the default (empty) namespace and always lives; the others live while they have
 * nodes.
 */
#include "radix_int.h"

#include <errno.h>
#include <string.h>

static uint64_t ns_key(const void *bytes, size_t len)
{
    const uint8_t *p = bytes;
    uint64_t h = 0xCBF29CE484222325ull ^ len;

    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

size_t key_ns_len(const struct kvt_key *key)
{
    return key->ns ? key->ns_len : 0;
}

uint32_t ns_find(const struct rdx_tree *t, const struct kvt_key *key)
{
    size_t len = key_ns_len(key);
    uint64_t k;

    if (len == 0)
        return 0;
    k = ns_key(key->ns, len);
    for (uint32_t i = 1; i < t->nns; i++) {
        const struct ns_entry *e = &t->ns[i];
        if (e->used && e->key == k && e->len == len && memcmp(e->bytes, key->ns, len) == 0)
            return i;
    }
    return NONE;
}

int ns_fill(struct rdx_tree *t, struct ns_entry *e, const void *bytes, size_t len)
{
    int rc = 0;

    e->bytes = NULL;
    if (len) {
        e->bytes = tree_alloc(t, len);
        if (!e->bytes)
            return -ENOMEM;
        memcpy(e->bytes, bytes, len);
    }
    e->len = len;
    e->key = ns_key(bytes, len);
    e->nodes = 0;
    e->used = true;
    if (t->cfg.hash_pages)
        rc = page_hash_root(&t->hasher, t->cfg.fingerprint, bytes, len, e->root_hash);
    if (rc) {
        tree_free(t, e->bytes);
        e->used = false;
    }
    return rc;
}

/* The namespace of key, created when absent. */
int ns_intern(struct rdx_tree *t, const struct kvt_key *key, uint32_t *id)
{
    uint32_t i = ns_find(t, key);

    if (i != NONE) {
        *id = i;
        return 0;
    }
    for (i = 1; i < t->nns && t->ns[i].used; i++)
        ;
    if (i == t->nns) {
        struct ns_entry *ns = tree_realloc(t, t->ns, (t->nns + 1) * sizeof(*ns));
        if (!ns)
            return -ENOMEM;
        t->ns = ns;
        t->ns[t->nns++].used = false;
    }
    int rc = ns_fill(t, &t->ns[i], key->ns, key_ns_len(key));
    if (rc == 0)
        *id = i;
    return rc;
}

/* Namespaces other than the default live only while they have nodes. */
void ns_drop_if_empty(struct rdx_tree *t, uint32_t id)
{
    struct ns_entry *e = &t->ns[id];

    if (id != 0 && e->nodes == 0) {
        tree_free(t, e->bytes);
        e->bytes = NULL;
        e->used = false;
    }
}

void ns_unref(struct rdx_tree *t, uint32_t id)
{
    t->ns[id].nodes--;
    ns_drop_if_empty(t, id);
}
