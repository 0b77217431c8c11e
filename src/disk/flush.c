/*
 * Relaxed mode's flushes (store.h: DSTORE_SYNC_RELAXED). A write batch there syncs nothing: its
 * slabs are noted here, and the committer flushes them, then the index, once the oldest
 * unflushed write has waited sync_ms or sync_bytes of pages wait, when dstore_flush asks, and
 * at close. Slabs first: the records the index flush makes durable then name bytes that are
 * durable too, so a power cut after a flush finds everything before it whole. What a power
 * cut between flushes costs is in docs/design.md; no byte it leaves wrong is ever served,
 * since every read checks the page against its record's checksum.
 *
 * Durable mode notes nothing (each batch syncs its slabs itself), so flush_all there is the
 * index flush alone. The committer's thread only.
 */
#include "store_int.h"

#include <errno.h>

static uint64_t sync_ms(const struct dstore *s)
{
    return s->o.sync_ms ? s->o.sync_ms : DSTORE_SYNC_MS;
}

static uint64_t sync_bytes(const struct dstore *s)
{
    return s->o.sync_bytes ? s->o.sync_bytes : DSTORE_SYNC_BYTES;
}

void flush_note(struct dstore *s, uint32_t slab, uint64_t bytes)
{
    s->slabs[slab].unflushed = true; /* the committer alone writes this flag */
    if (!s->unflushed_since)
        s->unflushed_since = mono_ns();
    s->unflushed_bytes += bytes;
}

uint64_t flush_due_locked(const struct dstore *s)
{
    if (!s->unflushed_since)
        return UINT64_MAX;
    if (s->unflushed_bytes >= sync_bytes(s))
        return s->unflushed_since;
    return s->unflushed_since + sync_ms(s) * 1000000ull;
}

int flush_slabs(struct dstore *s)
{
    int first = 0;

    for (uint32_t slab = 0; slab < s->nslabs; slab++) {
        int rc;

        if (!s->slabs[slab].unflushed)
            continue;
        s->slabs[slab].unflushed = false;
        if ((rc = slab_sync(s, slab))) {
            pthread_mutex_lock(&s->lock);
            s->st.err_sync++;
            pthread_mutex_unlock(&s->lock);
            first = first ? first : rc;
        }
    }
    /* A failed flush is not retried: what it lost is found by the reads' checks. */
    s->unflushed_bytes = 0;
    s->unflushed_since = 0;
    return first;
}

int flush_all(struct dstore *s)
{
    int rc = flush_slabs(s), irc = flush_index(s);

    return rc ? rc : irc;
}
