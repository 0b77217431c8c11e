/*
 * The committer: the one thread that reserves slots and writes the index. It takes jobs in
 * the order they were queued, so a delete queued after a write applies after it. A run of
 * write ops queued back to back is one batch (batch.c), and up to PIPE_BATCHES batches fly at
 * once; deletes and evictions are jobs of their own, run once the batches before them have
 * retired (lru.c picks and forgets the victims). The records reads found bad are no jobs:
 * they gather and go in one transaction (drop.c). Below it: records.c (lookups, deletes,
 * transactions), slots.c (the slot table), queue.c (jobs and op completion).
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- deletes and drops ---- */

/* Delete one key's record in txn; its slot is noted in *g for release after the commit. */
static int delete_key(struct dstore *s, MDB_txn *txn, const uint8_t *key, uint32_t *g)
{
    uint32_t slot;
    int rc = delete_record(s, txn, key, (struct rec_match){.g = NO_SLOT, .any = true}, &slot);

    *g = NO_SLOT;
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return rc;
    pthread_mutex_lock(&s->lock);
    if (slot != NO_SLOT && kill_locked(s, slot, key))
        *g = slot;
    pthread_mutex_unlock(&s->lock);
    if (*g != NO_SLOT && (rc = slot_del(&s->ix, txn, *g)))
        return rc;
    return 1;
}

static void release_all(struct dstore *s, const uint32_t *gs, size_t n, bool committed)
{
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < n; i++)
        if (gs[i] != NO_SLOT)
            committed ? slot_release_locked(s, gs[i]) : slot_revive_locked(s, gs[i]);
    pthread_mutex_unlock(&s->lock);
}

static int run_delete(struct dstore *s, struct djob *j)
{
    uint32_t *gs = calloc(j->n ? j->n : 1, sizeof(*gs));
    MDB_txn *txn;
    size_t gone = 0, seen = 0;
    int rc;

    if (!gs)
        return -ENOMEM;
    if ((rc = txn_begin(s, &txn)))
        goto out;
    for (; seen < j->n && !rc; seen++) {
        int r = delete_key(s, txn, j->keys + seen * DSTORE_KEY_BYTES, &gs[seen]);

        if (r < 0)
            rc = r;
        else
            gone += (size_t)r;
    }
    if (rc)
        mdb_txn_abort(txn);
    else
        rc = txn_commit_freeing(s, txn);
    release_all(s, gs, seen, !rc);
    if (!rc) {
        pthread_mutex_lock(&s->lock);
        s->st.deleted += gone;
        pthread_mutex_unlock(&s->lock);
        j->result = gone;
    }
out:
    free(gs);
    return rc;
}

/* ---- the thread ---- */

/* Under the lock: pages of the run of write jobs at the head of the queue that one batch
 * takes, and its last job. Ops join a batch up to max_batch pages, and never past a quarter
 * of the store: a batch makes room for itself, and one store-sized batch would evict all the
 * rest. The first op is taken whatever its size. */
static size_t write_run_locked(const struct dstore *s, struct djob **last)
{
    size_t most = s->nslots / 4 < s->o.max_batch ? (size_t)s->nslots / 4 : s->o.max_batch;
    size_t pages = s->jhead->op->n;

    *last = s->jhead;
    while ((*last)->next && (*last)->next->kind == JOB_WRITE &&
           pages + (*last)->next->op->n <= most) {
        *last = (*last)->next;
        pages += (*last)->op->n;
    }
    return pages;
}

/* Under the lock: the jobs from the head of the queue through last, taken off it. */
static struct djob *take_locked(struct dstore *s, struct djob *last)
{
    struct djob *first = s->jhead;

    s->jhead = last->next;
    if (!s->jhead)
        s->jtail = NULL;
    last->next = NULL;
    return first;
}

static void job_done(struct dstore *s, struct djob *j, int rc)
{
    pthread_mutex_lock(&s->lock);
    j->rc = rc;
    j->done = true;
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->lock);
}

/* One job other than a write, with no batch in flight: a delete queued after a write applies
 * after it, a flush or a barrier covers every write before it. */
static void run_job(struct dstore *s, struct djob *j)
{
    int broken;

    pthread_mutex_lock(&s->lock);
    broken = s->broken;
    pthread_mutex_unlock(&s->lock);
    /* Without a slot table nothing may be dropped, deleted or evicted (writes fail too). */
    if (broken && j->kind != JOB_FLUSH && j->kind != JOB_BARRIER) {
        job_done(s, j, broken);
        return;
    }
    switch (j->kind) {
    case JOB_WRITE: /* never here: writes start batches */
    case JOB_BARRIER:
        job_done(s, j, 0);
        break;
    case JOB_DELETE:
        job_done(s, j, run_delete(s, j));
        break;
    case JOB_EVICT:
        job_done(s, j, evict_oldest(s, j->n, &j->result));
        break;
    case JOB_FLUSH:
        while (flush_access(s))
            ;
        job_done(s, j, flush_all(s));
        break;
    }
}

/* What the committer does next. */
enum step {
    STEP_START,  /* a write batch: into the pipe */
    STEP_RETIRE, /* the landed batches at the head of the pipe: sync, commit, complete */
    STEP_FLUSH,  /* relaxed mode: sync_ms or sync_bytes says the slabs and index flush now */
    STEP_DROPS,  /* the records reads found bad: they fell due, or a job waits behind them */
    STEP_JOB,    /* another job: the pipe is empty */
    STEP_TIMERS, /* access times fell due; nothing else to do */
    STEP_STOP,   /* stop asked, the queue and the pipe empty */
};

/* Under the lock: the mono_ns() time the committer must wake by when idle. */
static uint64_t due_locked(const struct dstore *s)
{
    uint64_t due = access_due_locked(s), flush = flush_due_locked(s), drops = drops_due_locked(s);

    due = flush < due ? flush : due;
    return drops < due ? drops : due;
}

/* Under the lock: whether the drops waiting run now. They wait for others (drop.c) until
 * they fall due, but not behind a job other than a write (a delete may free their slots),
 * nor, when one holds no slot, behind a write batch, nor past the end. */
static bool drops_now_locked(const struct dstore *s)
{
    const struct djob *head = s->jhead;

    if (!s->ndrops)
        return false;
    return s->stop || s->drops_unheld || drops_due_locked(s) <= mono_ns() ||
           (head && head->kind != JOB_WRITE);
}

/* Under the lock: the next step, sleeping until there is one. A write starts a batch while
 * the pipe has room, before the oldest in flight retires, so its I/O overlaps that one's sync
 * and commit; a relaxed flush that fell due waits for those two likewise, so the disk has
 * writes in flight while it runs. Any other job waits for the pipe to drain. touch_locked signals
 * when the first access time waits, so a sleep without a deadline ends then; a flush falls due only
 * after a batch retires, on this thread; a batch landing signals too. */
static enum step next_step_locked(struct dstore *s, struct djob **jobs)
{
    for (;;) {
        struct djob *head = s->jhead, *last;
        uint64_t due = due_locked(s), hold = UINT64_MAX;

        if (s->drops_unheld)
            return STEP_DROPS;
        if (head && head->kind == JOB_WRITE && batch_room_locked(s, write_run_locked(s, &last))) {
            *jobs = take_locked(s, last);
            return STEP_START;
        }
        if (batch_landed_locked(s) && batch_retire_now_locked(s, &hold))
            return STEP_RETIRE;
        if (flush_due_locked(s) <= mono_ns())
            return STEP_FLUSH;
        if (drops_now_locked(s))
            return STEP_DROPS;
        if (head && !s->pipe) {
            *jobs = take_locked(s, head);
            return STEP_JOB;
        }
        if (!s->pipe && s->stop)
            return STEP_STOP;
        if (!s->pipe && due <= mono_ns())
            return STEP_TIMERS;
        if (s->pipe)
            due = hold; /* a landing, a job or the end of a group's wait */
        if (due == UINT64_MAX) {
            pthread_cond_wait(&s->job_cv, &s->lock);
        } else {
            struct timespec until = {(time_t)(due / 1000000000ull), (long)(due % 1000000000ull)};

            pthread_cond_timedwait(&s->job_cv, &s->lock, &until);
        }
    }
}

static bool access_is_due(struct dstore *s)
{
    bool due;

    pthread_mutex_lock(&s->lock);
    due = access_due_locked(s) <= mono_ns();
    pthread_mutex_unlock(&s->lock);
    return due;
}

static void *committer_main(void *arg)
{
    struct dstore *s = arg;

    /* What recovery could not put back is simply not there: the rebuild goes on. */
    if (s->recovering && recover(s))
        count_index_error(s, -EIO);
    rebuild(s);
    for (;;) {
        struct djob *jobs = NULL;
        enum step step;

        pthread_mutex_lock(&s->lock);
        step = next_step_locked(s, &jobs);
        pthread_mutex_unlock(&s->lock);
        if (step == STEP_STOP)
            break;
        if (step == STEP_START)
            batch_start(s, jobs);
        else if (step == STEP_RETIRE)
            batch_retire(s);
        else if (step == STEP_FLUSH)
            flush_all(s);
        else if (step == STEP_DROPS)
            drops_run(s);
        else if (step == STEP_JOB)
            run_job(s, jobs);
        else if (access_is_due(s))
            flush_access(s); /* one transaction, then jobs queued meanwhile come first */
    }
    while (flush_access(s))
        ;
    flush_slabs(s); /* relaxed mode; close flushes the index */
    return NULL;
}

int committer_start(struct dstore *s)
{
    int rc = index_err(mdb_txn_begin(s->ix.env, NULL, MDB_RDONLY, &s->ctxn));

    if (rc)
        return rc;
    mdb_txn_reset(s->ctxn);
    if (pthread_create(&s->committer, NULL, committer_main, s)) {
        mdb_txn_abort(s->ctxn);
        s->ctxn = NULL;
        return -ENOMEM;
    }
    s->committer_started = true;
    return 0;
}

void committer_stop(struct dstore *s)
{
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_signal(&s->job_cv);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->committer, NULL);
    s->committer_started = false;
    mdb_txn_abort(s->ctxn);
    s->ctxn = NULL;
}

int job_run(struct dstore *s, struct djob *j)
{
    int rc;

    pthread_mutex_lock(&s->lock);
    job_push_locked(s, j);
    while (!j->done)
        pthread_cond_wait(&s->done_cv, &s->lock);
    rc = j->rc;
    pthread_mutex_unlock(&s->lock);
    return rc;
}
