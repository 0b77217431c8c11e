/*
 * Touching pages without reading them: a caller whose upper tiers served a page (vLLM's
 * touch, for chunks its GPU or CPU cache held) keeps the disk copy from being evicted first.
 * The order changes as a read hit changes it (slots.c's touch_locked); the access time
 * reaches the index lazily, so a touch costs no write.
 */
#include <errno.h>
#include <string.h>

#include "disk/store_int.h"

/* Under the lock: touch the slot of key's record r, when the slot still holds key. */
static bool touch_record_locked(struct dstore *s, const uint8_t *key, const struct drec *r)
{
    uint32_t g = r->slab * s->slab_slots + r->slot;

    if (!record_in_bounds_locked(s, r))
        return false;
    if (!s->ready) { /* the table is being rebuilt: applied once it is, as early hits are */
        touch_early_locked(s, g, key);
        return true;
    }
    if (s->broken || s->state[g] != SLOT_USED || memcmp(s->skey[g], key, DSTORE_KEY_BYTES))
        return false;
    touch_locked(s, g);
    return true;
}

int dstore_touch(struct dstore *s, const uint8_t *keys, size_t n, size_t *touched)
{
    size_t count = 0;
    struct drec r;
    uint64_t digest;
    int rc;

    if (!s || (n && !keys))
        return -EINVAL;
    if (touched)
        *touched = 0;
    if (s->ro || n == 0)
        return 0;
    if ((rc = snapshot_renew(s)))
        return rc;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *key = keys + i * DSTORE_KEY_BYTES;
        if (lookup_record(s, s->rtxn, key, &r, &digest))
            continue; /* not stored, or a bad record: a read finds and drops that */
        pthread_mutex_lock(&s->lock);
        count += touch_record_locked(s, key, &r);
        pthread_mutex_unlock(&s->lock);
    }
    snapshot_reset(s);
    if (touched)
        *touched = count;
    return 0;
}
