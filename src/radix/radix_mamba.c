/*
 * Mamba states on nodes (cfg.mamba): SGLang's MambaRadixCache semantics over the tree.
 * A node may hold one state, the checkpoint slot of the recurrent state at the node's end;
 * one without is a tombstone. A match walks the KV prefix as rdx_match does and names the
 * deepest state on it; state locks ride on the node's own KV locks (full >= mamba); the
 * unlocked states form their own eviction list, so states go while their KV stays. A state
 * may have a host copy beside the node's host copy of its KV (hslot): saved when the state
 * leaves the device while the node stays on the host, or read from the store below
 * (rdx_mamba_attach_host); rdx_mamba_find names the deepest state of either kind.
 *
 * Below this file: radix.c keeps a split's upper node stateless (a new node starts with none)
 * and drops a node's state with its device copy, saving it first beside a host copy, and a
 * host copy of a state with the node's host copy (drop_state, drop_host_state,
 * radix_leaves.c), so nothing there calls up here. Checkpoint arithmetic (which positions may hold
 * a state) is the device layer's (mamba_ckpt.h); the tree only rounds a hit down to the grid it is
 * given.
 */
#include "radix_int.h"

#include <errno.h>
#include <string.h>

static bool mamba_on(const struct rdx_tree *t)
{
    return t && t->mamba;
}

/* Tokens from the root to the end of node idx. */
static uint64_t depth_tokens(const struct rdx_tree *t, uint32_t idx)
{
    uint64_t pages = 0;

    for (uint32_t i = idx; i != ROOT; i = node_at(t, i)->parent)
        pages += node_at(t, i)->npages;
    return pages * t->cfg.page_size;
}

/* The deepest node holding a state from idx up; ROOT when none does. */
static uint32_t deepest_state(const struct rdx_tree *t, uint32_t idx)
{
    while (idx != ROOT && t->mamba[idx].slot == 0)
        idx = node_at(t, idx)->parent;
    return idx;
}

int rdx_mamba_attach(struct rdx_tree *t, kvt_node_ref ref, uint32_t slot)
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t) || slot == 0)
        return -EINVAL;
    if ((rc = resolve_current(t, ref, &idx)))
        return rc;
    if (idx == ROOT)
        return -EINVAL;
    if (t->mamba[idx].slot)
        return -EEXIST;
    t->mamba[idx].slot = slot;
    t->sz.mamba_states++;
    update_state(t, idx);
    return 0;
}

int rdx_mamba_find(const struct rdx_tree *t, kvt_node_ref ref, kvt_node_ref *node, uint32_t *slot,
                   uint32_t *hslot, uint64_t *tokens)
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t) || !node || !slot || !hslot || !tokens)
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    while (idx != ROOT && t->mamba[idx].slot == 0 && t->mamba[idx].hslot == 0)
        idx = node_at(t, idx)->parent;
    *node = make_ref(t, idx);
    *slot = t->mamba[idx].slot;
    *hslot = t->mamba[idx].hslot;
    *tokens = depth_tokens(t, idx);
    return 0;
}

int rdx_mamba_host_room(struct rdx_tree *t)
{
    if (!mamba_on(t))
        return -EINVAL;
    return host_state_room(t) ? 0 : -ENOSPC;
}

int rdx_mamba_attach_host(struct rdx_tree *t, kvt_node_ref ref, uint32_t hslot)
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t) || hslot == 0)
        return -EINVAL;
    /* A host-only node has no current ref (rdx_match_tiers names it by the tree's). */
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    if (idx == ROOT || !node_at(t, idx)->on_host)
        return -EINVAL;
    if (t->mamba[idx].hslot)
        return -EEXIST;
    if (t->sz.mamba_host_states >= t->cfg.mamba_host_states)
        return -ENOSPC;
    host_state_add(t, idx, hslot);
    return 0;
}

int rdx_mamba_bare(const struct rdx_tree *t, kvt_node_ref ref, kvt_node_ref *refs,
                   uint8_t (*hashes)[KVT_HASH_LEN], size_t max)
{
    uint64_t grid = t && t->cfg.mamba_grid ? t->cfg.mamba_grid : 1, end;
    uint32_t idx;
    int n = 0, rc;

    if (!mamba_on(t) || !t->cfg.hash_pages)
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    end = depth_tokens(t, idx);
    for (; idx != ROOT && !t->mamba[idx].slot && !t->mamba[idx].hslot && (size_t)n < max;
         end -= (uint64_t)node_at(t, idx)->npages * t->cfg.page_size,
         idx = node_at(t, idx)->parent) {
        const struct rdx_node *nd = node_at(t, idx);
        if (!nd->on_host || nd->pending || end % grid)
            continue;
        refs[n] = make_ref(t, idx);
        memcpy(hashes[n], nd->hash[nd->npages - 1], KVT_HASH_LEN);
        n++;
    }
    return n;
}

int rdx_mamba_end_hash(const struct rdx_tree *t, kvt_node_ref ref, uint8_t out[KVT_HASH_LEN])
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t) || !t->cfg.hash_pages)
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    if (idx == ROOT)
        return -EINVAL;
    const struct rdx_node *n = node_at(t, idx);
    memcpy(out, n->hash[n->npages - 1], KVT_HASH_LEN);
    return 0;
}

/* SGLang's branching point: where the request, whose state starts at state_tokens, should
 * checkpoint so that the next one on this prefix gets a state as deep as the KV allows. */
static uint64_t branch_tokens(const struct rdx_tree *t, uint64_t kv_tokens, uint64_t state_tokens)
{
    uint64_t grid = t->cfg.mamba_grid;
    uint64_t at = grid ? kv_tokens / grid * grid : kv_tokens;

    return at > state_tokens ? at : 0;
}

int rdx_match_mamba(struct rdx_tree *t, const struct kvt_key *key, uint32_t *pages,
                    struct rdx_mamba_hit *hit)
{
    uint32_t last, state;
    int rc;

    if (!mamba_on(t) || !hit)
        return -EINVAL;
    *hit = (struct rdx_mamba_hit){0};
    if ((rc = rdx_match(t, key, pages, &hit->kv_pages, &hit->kv_last)) ||
        (rc = resolve(t, hit->kv_last, &last)))
        return rc;
    state = deepest_state(t, last);
    hit->state_last = make_ref(t, state);
    hit->state_slot = t->mamba[state].slot;
    hit->state_tokens = depth_tokens(t, state);
    hit->branch_tokens = branch_tokens(t, hit->kv_pages * t->cfg.page_size, hit->state_tokens);
    return 0;
}

/* ---- state locks ---- */

int rdx_mamba_lock(struct rdx_tree *t, kvt_node_ref ref)
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t))
        return -EINVAL;
    if ((rc = resolve_current(t, ref, &idx)))
        return rc;
    if (t->mamba[idx].slot == 0)
        return -ENOENT;
    if ((rc = rdx_lock(t, ref)))
        return rc;
    t->mamba[idx].locks++;
    update_state(t, idx);
    return 0;
}

int rdx_mamba_unlock(struct rdx_tree *t, kvt_node_ref ref)
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t))
        return -EINVAL;
    if ((rc = resolve_current(t, ref, &idx)))
        return rc;
    if (t->mamba[idx].locks == 0)
        return -EINVAL;
    t->mamba[idx].locks--; /* first, or rdx_unlock would refuse the lock it holds */
    if ((rc = rdx_unlock(t, ref))) {
        t->mamba[idx].locks++;
        return rc;
    }
    update_state(t, idx);
    return 0;
}

int rdx_mamba_state(const struct rdx_tree *t, kvt_node_ref ref, uint32_t *slot, uint32_t *locks)
{
    uint32_t idx;
    int rc;

    if (!mamba_on(t))
        return -EINVAL;
    if ((rc = resolve(t, ref, &idx)))
        return rc;
    *slot = t->mamba[idx].slot;
    *locks = t->mamba[idx].locks;
    return 0;
}

/* ---- state eviction: least recently used first, by the nodes' last access ---- */

static bool used_before(const struct rdx_tree *t, uint32_t x, uint32_t y)
{
    uint64_t ax = node_at(t, x)->last_access, ay = node_at(t, y)->last_access;

    return ax != ay ? ax < ay : x < y;
}

size_t rdx_mamba_evict(struct rdx_tree *t, size_t n)
{
    struct heap h = {.before = used_before};
    size_t done = 0;

    if (!mamba_on(t) || n == 0)
        return 0;
    h.v = t->heap; /* as long as the id table, and idle between calls */
    for (uint32_t i = t->mamba_head; i != NONE; i = t->mamba[i].next)
        h.v[h.n++] = i;
    heap_build(t, &h);
    while (done < n && h.n) {
        drop_state(t, heap_pop(t, &h));
        done++;
    }
    return done;
}
