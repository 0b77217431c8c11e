/*
 * The hint table: keys last seen stored, one per slot by the key's first bytes, so a read
 * can say which of its pages are on their way without asking the server. A later SET, GET or
 * EXISTS that finds a key gone clears its slot; anything else may have changed since, so it
 * is a hint, never a promise: the read itself decides.
 */
#include <string.h>

#include "store/redis/redis_int.h"

static uint8_t *hint_slot(struct redis_store *r, const uint8_t *key)
{
    uint64_t h;

    memcpy(&h, key, sizeof(h)); /* page keys are hashes already */
    return r->hint[(h * 0x9e3779b97f4a7c15ull) >> (64 - HINT_BITS)];
}

void redis_hint_set(struct redis_store *r, const uint8_t *key, bool present)
{
    uint8_t *slot = hint_slot(r, key);

    if (present)
        memcpy(slot, key, STORE_KEY_BYTES);
    else if (!memcmp(slot, key, STORE_KEY_BYTES))
        memset(slot, 0, STORE_KEY_BYTES);
}

bool redis_hint_has(struct redis_store *r, const uint8_t *key)
{
    return !memcmp(hint_slot(r, key), key, STORE_KEY_BYTES);
}
