/*
 * One LMDB environment per data dir per process. LMDB forbids a second environment on a file
 * a process has open: the locks that tell other processes a reader or the writer is alive are
 * POSIX locks on index/lock.mdb, which the process holds once for all its descriptors, and
 * closing any descriptor of the file drops them all; a last close also tears down what the
 * environments share in the lock file. A read-only store opened and closed beside a writer of
 * the same dir in one process so broke the writer (its reads failed ever after).
 *
 * So the stores of one process share: the first store of a dir opens (and checks) the
 * environment; a read-only store of the same dir opened after it, from any thread, waits for
 * that open and uses the same environment, and the last store to close closes it. A writer is
 * refused (-EBUSY) while any store of this process has the dir open: its open may set the
 * index aside and rebuild it, and it sizes the map and the commit flags, none of which can be
 * done under readers. The dir is known by its device and inode, whatever path names it.
 *
 * A read-only store may adopt a map its writer (in another process) grew, which LMDB allows
 * only while no transaction of the environment is live in the process: every snapshot of
 * every store counts here, and a remap waits for none to be starting.
 */
#include "store_int.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>

struct share {
    struct share *next;
    dev_t dev;
    ino_t ino;
    unsigned refs;         /* stores using it (its opener included, once ready) */
    bool ready;            /* the environment is open; until then its opener prepares it */
    struct dindex ix;      /* the environment and its databases, once ready */
    pthread_rwlock_t gate; /* snapshots start under its read side, a remap under its write side */
    atomic_uint live;      /* snapshots live, of every store */
};

static pthread_mutex_t shares_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t shares_cv = PTHREAD_COND_INITIALIZER; /* an entry became ready or went */
static struct share *shares;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A forked child has none of its parent's environments (LMDB's may not be used across a
 * fork, and their locks are the parent's): it starts with no store open. Held across the
 * fork, so the child's copy of the list is not half written. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&shares_mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&shares_mu);
}

static void fork_child(void)
{
    shares = NULL; /* the parent's entries are its own; this copy of them is left alone */
    pthread_mutex_unlock(&shares_mu);
}

static void fork_handlers(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static struct share *find_locked(dev_t dev, ino_t ino)
{
    struct share *e = shares;

    while (e && (e->dev != dev || e->ino != ino))
        e = e->next;
    return e;
}

static void unlink_locked(struct share *gone)
{
    struct share **p = &shares;

    while (*p != gone)
        p = &(*p)->next;
    *p = gone->next;
    pthread_cond_broadcast(&shares_cv);
}

static struct share *entry_new_locked(dev_t dev, ino_t ino)
{
    struct share *e = calloc(1, sizeof(*e));

    if (!e)
        return NULL;
    if (pthread_rwlock_init(&e->gate, NULL)) {
        free(e);
        return NULL;
    }
    e->dev = dev;
    e->ino = ino;
    e->refs = 1;
    e->next = shares;
    shares = e;
    return e;
}

static void entry_free(struct share *e)
{
    pthread_rwlock_destroy(&e->gate);
    free(e);
}

int share_join(struct dstore *s)
{
    struct share *e;
    struct stat st;
    int rc = 0;

    pthread_once(&fork_once, fork_handlers);
    if (fstat(s->dirfd, &st))
        return -errno;
    pthread_mutex_lock(&shares_mu);
    for (;;) {
        e = find_locked(st.st_dev, st.st_ino);
        if (!e) {
            rc = (s->share = entry_new_locked(st.st_dev, st.st_ino)) ? 0 : -ENOMEM;
            break;
        }
        if (!s->ro) {
            rc = -EBUSY; /* a store of this process has the dir open */
            break;
        }
        if (e->ready) {
            e->refs++;
            s->share = e;
            s->ix = e->ix;
            s->share_joined = true;
            break;
        }
        pthread_cond_wait(&shares_cv, &shares_mu); /* its opener is still at it */
    }
    pthread_mutex_unlock(&shares_mu);
    return rc;
}

void share_ready(struct dstore *s)
{
    pthread_mutex_lock(&shares_mu);
    s->share->ix = s->ix;
    s->share->ready = true;
    pthread_cond_broadcast(&shares_cv);
    pthread_mutex_unlock(&shares_mu);
}

void share_leave(struct dstore *s)
{
    struct share *e = s->share, *gone = NULL;

    if (!e) {
        index_close(&s->ix);
        return;
    }
    pthread_mutex_lock(&shares_mu);
    if (!e->ready) { /* its opener failed: the next store to come opens it afresh */
        unlink_locked(e);
        gone = e;
        index_close(&s->ix);
    } else if (--e->refs == 0) {
        unlink_locked(e);
        gone = e;
        index_close(&e->ix);
    }
    pthread_mutex_unlock(&shares_mu);
    if (gone)
        entry_free(gone);
    s->share = NULL;
    s->ix = (struct dindex){0};
}

bool share_busy(int dirfd)
{
    struct stat st;
    bool busy;

    if (fstat(dirfd, &st))
        return false;
    pthread_mutex_lock(&shares_mu);
    busy = find_locked(st.st_dev, st.st_ino) != NULL;
    pthread_mutex_unlock(&shares_mu);
    return busy;
}

/* Begin or renew; remap (a reader adopting its writer's map) only when asked. */
static int read_txn(struct dstore *s, MDB_txn **txn, bool renew, bool remap)
{
    return renew ? index_read_renew(&s->ix, *txn, remap) : index_read_begin(&s->ix, txn, remap);
}

int share_read(struct dstore *s, MDB_txn **txn, bool renew)
{
    struct share *e = s->share;
    int rc;

    pthread_rwlock_rdlock(&e->gate);
    atomic_fetch_add(&e->live, 1);
    rc = read_txn(s, txn, renew, false);
    pthread_rwlock_unlock(&e->gate);
    if (rc == -EAGAIN && s->ro) { /* the map grew: adopt it when ours is the only snapshot */
        pthread_rwlock_wrlock(&e->gate);
        if (atomic_load(&e->live) == 1)
            rc = read_txn(s, txn, renew, true);
        pthread_rwlock_unlock(&e->gate);
    }
    if (rc)
        atomic_fetch_sub(&e->live, 1);
    return rc;
}

int share_read_meta(struct dstore *s, struct dmeta *m)
{
    struct share *e = s->share;
    int rc;

    pthread_rwlock_rdlock(&e->gate); /* no remap under it */
    rc = index_read_meta(&s->ix, m);
    pthread_rwlock_unlock(&e->gate);
    return rc;
}

void share_read_end(struct dstore *s)
{
    atomic_fetch_sub(&s->share->live, 1);
}
