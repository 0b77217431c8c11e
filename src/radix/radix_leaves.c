/*
 * The two leaf lists: for each tier, the nodes whose copy there may go now (device leaves,
 * host leaves), kept up to date as nodes change so that eviction never searches the tree;
 * the device page counts (cached, evictable, protected) that follow the same changes; and,
 * with Mamba states, the list of nodes whose state may go and the dropping of a state.
 */
#include "radix_int.h"

/* A device leaf gives up its device copy: it holds one, nothing locks or fills it, and no
 * child holds one. Without a host copy it must be a real leaf, since it is then deleted. */
bool is_device_leaf(const struct rdx_node *n, uint32_t idx)
{
    return idx != ROOT && n->on_device && n->lock_ref == 0 && n->pending == 0 &&
           n->ndev_children == 0 && (n->on_host || n->nchildren == 0);
}

/* A host leaf is deleted: it is left only on the host and has no children. */
bool is_host_leaf(const struct rdx_node *n, uint32_t idx)
{
    return idx != ROOT && !n->on_device && n->on_host && n->lock_ref == 0 && n->pending == 0 &&
           n->disk_op == 0 && n->nchildren == 0;
}

static bool is_leaf(const struct rdx_node *n, uint32_t idx, int list)
{
    return list == LIST_DEV ? is_device_leaf(n, idx) : is_host_leaf(n, idx);
}

bool in_list(const struct rdx_tree *t, uint32_t idx, int list)
{
    const struct rdx_node *n = node_at(t, idx);
    return n->prev[list] != NONE || t->leaf_head[list] == idx;
}

static void list_add(struct rdx_tree *t, uint32_t idx, int list)
{
    struct rdx_node *n = node_at(t, idx);

    n->prev[list] = NONE;
    n->next[list] = t->leaf_head[list];
    if (t->leaf_head[list] != NONE)
        node_at(t, t->leaf_head[list])->prev[list] = idx;
    t->leaf_head[list] = idx;
    t->nleaves[list]++;
}

static void list_remove(struct rdx_tree *t, uint32_t idx, int list)
{
    struct rdx_node *n = node_at(t, idx);

    if (n->prev[list] != NONE)
        node_at(t, n->prev[list])->next[list] = n->next[list];
    else
        t->leaf_head[list] = n->next[list];
    if (n->next[list] != NONE)
        node_at(t, n->next[list])->prev[list] = n->prev[list];
    n->prev[list] = n->next[list] = NONE;
    t->nleaves[list]--;
}

void update_leaf(struct rdx_tree *t, uint32_t idx)
{
    for (int list = LIST_DEV; list <= LIST_HOST; list++) {
        bool want = is_leaf(node_at(t, idx), idx, list);
        bool have = in_list(t, idx, list);
        if (want && !have)
            list_add(t, idx, list);
        else if (!want && have)
            list_remove(t, idx, list);
    }
}

/* Count a node's device pages in (sign 1) or out of (sign -1) the tree's sizes. */
void account_device(struct rdx_tree *t, const struct rdx_node *n, int sign)
{
    uint64_t np = n->npages;

    t->sz.cached_pages += sign > 0 ? np : -np;
    if (n->lock_ref)
        t->sz.protected_pages += sign > 0 ? np : -np;
    else
        t->sz.evictable_pages += sign > 0 ? np : -np;
}

/* ---- Mamba states ---- */

static bool state_evictable(const struct mamba_state *m)
{
    return m->slot != 0 && m->locks == 0;
}

bool in_state_list(const struct rdx_tree *t, uint32_t idx)
{
    return t->mamba[idx].prev != NONE || t->mamba_head == idx;
}

static void state_list_add(struct rdx_tree *t, uint32_t idx)
{
    struct mamba_state *m = &t->mamba[idx];

    m->prev = NONE;
    m->next = t->mamba_head;
    if (t->mamba_head != NONE)
        t->mamba[t->mamba_head].prev = idx;
    t->mamba_head = idx;
    t->sz.mamba_evictable++;
}

static void state_list_remove(struct rdx_tree *t, uint32_t idx)
{
    struct mamba_state *m = &t->mamba[idx];

    if (m->prev != NONE)
        t->mamba[m->prev].next = m->next;
    else
        t->mamba_head = m->next;
    if (m->next != NONE)
        t->mamba[m->next].prev = m->prev;
    m->prev = m->next = NONE;
    t->sz.mamba_evictable--;
}

void update_state(struct rdx_tree *t, uint32_t idx)
{
    bool want = state_evictable(&t->mamba[idx]);
    bool have = in_state_list(t, idx);

    if (want && !have)
        state_list_add(t, idx);
    else if (!want && have)
        state_list_remove(t, idx);
}

/* ---- host copies of states: a list of them all, oldest access found by a walk ---- */

void host_state_add(struct rdx_tree *t, uint32_t idx, uint32_t hslot)
{
    struct mamba_state *m = &t->mamba[idx];

    m->hslot = hslot;
    m->hprev = NONE;
    m->hnext = t->mamba_host_head;
    if (t->mamba_host_head != NONE)
        t->mamba[t->mamba_host_head].hprev = idx;
    t->mamba_host_head = idx;
    t->sz.mamba_host_states++;
}

void drop_host_state(struct rdx_tree *t, uint32_t idx)
{
    struct mamba_state *m = t->mamba ? &t->mamba[idx] : NULL;

    if (!m || m->hslot == 0)
        return;
    if (t->cfg.free_host_mamba)
        t->cfg.free_host_mamba(t->cfg.ctx, &m->hslot, 1);
    if (m->hprev != NONE)
        t->mamba[m->hprev].hnext = m->hnext;
    else
        t->mamba_host_head = m->hnext;
    if (m->hnext != NONE)
        t->mamba[m->hnext].hprev = m->hprev;
    m->hslot = 0;
    m->hprev = m->hnext = NONE;
    t->sz.mamba_host_states--;
}

/* Room for one more host copy of a state: the least recently used copy on a node no lock
 * holds goes (a request restoring a copy holds its node). The walk is over the copies, at
 * most cfg.mamba_host_states, and runs only when a state is saved into a full set. */
bool host_state_room(struct rdx_tree *t)
{
    uint32_t victim = NONE;

    if (t->sz.mamba_host_states < t->cfg.mamba_host_states)
        return true;
    for (uint32_t i = t->mamba_host_head; i != NONE; i = t->mamba[i].hnext)
        if (node_at(t, i)->lock_ref == 0 &&
            (victim == NONE || node_at(t, i)->last_access < node_at(t, victim)->last_access))
            victim = i;
    if (victim == NONE)
        return false;
    drop_host_state(t, victim);
    return true;
}

/* Keep a copy of node idx's state on the host, beside its host copy. */
static void save_state(struct rdx_tree *t, uint32_t idx)
{
    struct mamba_state *m = &t->mamba[idx];
    uint32_t hslot;

    if (!node_at(t, idx)->on_host || m->hslot || !t->cfg.save_mamba || !host_state_room(t))
        return;
    if ((hslot = t->cfg.save_mamba(t->cfg.ctx, m->slot)))
        host_state_add(t, idx, hslot);
}

void drop_state(struct rdx_tree *t, uint32_t idx)
{
    struct mamba_state *m = t->mamba ? &t->mamba[idx] : NULL;

    if (!m || m->slot == 0)
        return;
    save_state(t, idx);
    if (t->cfg.free_mamba)
        t->cfg.free_mamba(t->cfg.ctx, &m->slot, 1);
    m->slot = 0; /* unlocked: its locks would hold the KV whose loss drops it */
    t->sz.mamba_states--;
    update_state(t, idx);
}

/* ---- the SWA part of nodes (cfg.swa_window) ---- */

bool in_swa_list(const struct rdx_tree *t, uint32_t idx)
{
    return t->swa[idx].prev != NONE || t->swa_head == idx;
}

/* The list only: its pages are counted by update_swa, which knows what joined. */
static void swa_list_add(struct rdx_tree *t, uint32_t idx)
{
    struct swa_part *w = &t->swa[idx];

    w->prev = NONE;
    w->next = t->swa_head;
    if (t->swa_head != NONE)
        t->swa[t->swa_head].prev = idx;
    t->swa_head = idx;
    t->swa_listed++;
}

static void swa_list_remove(struct rdx_tree *t, uint32_t idx)
{
    struct swa_part *w = &t->swa[idx];

    if (w->prev != NONE)
        t->swa[w->prev].next = w->next;
    else
        t->swa_head = w->next;
    if (w->next != NONE)
        t->swa[w->next].prev = w->prev;
    w->prev = w->next = NONE;
    t->swa_listed--;
}

void update_swa(struct rdx_tree *t, uint32_t idx)
{
    bool want = t->swa[idx].live && t->swa[idx].locks == 0;
    bool have = in_swa_list(t, idx);
    uint64_t np = node_at(t, idx)->npages;

    if (want && !have) {
        swa_list_add(t, idx);
        t->sz.swa_evictable += np;
    } else if (!want && have) {
        swa_list_remove(t, idx);
        t->sz.swa_evictable -= np;
    }
}

void gain_swa(struct rdx_tree *t, uint32_t idx)
{
    if (!t->swa || t->swa[idx].live)
        return;
    t->swa[idx].live = true;
    t->swa[idx].access = t->clock;
    t->sz.swa_pages += node_at(t, idx)->npages;
    update_swa(t, idx);
}

/* Every window covering the whole node covers both halves, so upper takes its locks; the
 * locks taken at idx stay there, as idx keeps the node's end. The pages were counted whole. */
void split_swa(struct rdx_tree *t, uint32_t idx, uint32_t upper)
{
    struct swa_part *w = t->swa ? &t->swa[idx] : NULL;

    if (!w)
        return;
    t->swa[upper] = (struct swa_part){.live = w->live,
                                      .hlive = w->hlive,
                                      .locks = w->locks,
                                      .access = w->access,
                                      .prev = NONE,
                                      .next = NONE};
    if (w->live && w->locks == 0)
        swa_list_add(t, upper);
}

void forget_swa(struct rdx_tree *t, uint32_t idx)
{
    struct swa_part *w = t->swa ? &t->swa[idx] : NULL;

    if (!w || !w->live)
        return;
    w->live = false;
    update_swa(t, idx);
    t->sz.swa_pages -= node_at(t, idx)->npages;
}

void drop_swa(struct rdx_tree *t, uint32_t idx)
{
    struct rdx_node *n = node_at(t, idx);

    if (!t->swa || !t->swa[idx].live)
        return;
    if (t->cfg.free_swa_pages)
        t->cfg.free_swa_pages(t->cfg.ctx, n->pages, n->npages);
    forget_swa(t, idx);
}
