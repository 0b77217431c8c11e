/*
 * The I/O engines' shared part (the request queue, the fault seam) and the psync engine.
 *
 * psync: every worker takes the oldest queued request and runs it to the end with
 * pread/pwrite, so requests overlap across workers as they would in the kernel's queue.
 */
#include "dio.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#define PSYNC_MAX_THREADS 64

struct psync {
    uint32_t nthreads;
    pthread_t threads[PSYNC_MAX_THREADS];
};

int dio_fault(const struct dio *io, const struct dio_req *r)
{
    const struct dstore_faults *f = io->cfg.faults;

    if (!f || !f->inject)
        return 0;
    return f->inject(f->arg, r->write ? DSTORE_FAULT_WRITE : DSTORE_FAULT_READ, r->slab, r->slot);
}

struct dio_req *dio_take_locked(struct dio *io)
{
    struct dio_req *list = io->head;

    io->head = io->tail = NULL;
    return list;
}

/* ---- psync ---- */

/* The whole transfer, continuing after short counts; -ENODATA when a read meets the end. */
static int psync_run(struct dio *io, struct dio_req *r)
{
    int rc = dio_fault(io, r);

    while (!rc && r->done < r->len) {
        uint8_t *p = (uint8_t *)r->buf + r->done;
        size_t left = r->len - r->done;
        off_t off = (off_t)(r->off + r->done);
        ssize_t n = r->write ? pwrite(r->fd, p, left, off) : pread(r->fd, p, left, off);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = -errno;
        else if (n == 0)
            rc = r->write ? -EIO : -ENODATA;
        else
            r->done += (uint32_t)n;
    }
    return rc;
}

/* The oldest queued request, or NULL once stopped with the queue drained. */
static struct dio_req *psync_next(struct dio *io)
{
    struct dio_req *r;

    pthread_mutex_lock(&io->lock);
    while (!io->head && !io->stop)
        pthread_cond_wait(&io->work, &io->lock);
    r = io->head;
    if (r) {
        io->head = r->next;
        if (!io->head)
            io->tail = NULL;
    }
    pthread_mutex_unlock(&io->lock);
    return r;
}

static void *psync_worker(void *arg)
{
    struct dio *io = arg;
    struct dio_req *r;

    while ((r = psync_next(io))) {
        r->next = NULL;
        r->res = psync_run(io, r);
        r->complete(r);
    }
    return NULL;
}

static void psync_finish(struct dio *io)
{
    struct psync *p = io->priv;

    pthread_mutex_lock(&io->lock);
    io->stop = true;
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->lock);
    for (uint32_t i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    free(p);
}

static int psync_start(struct dio *io)
{
    uint32_t want = io->cfg.threads ? io->cfg.threads : 4;
    struct psync *p = calloc(1, sizeof(*p));

    if (!p)
        return -ENOMEM;
    if (want > PSYNC_MAX_THREADS)
        want = PSYNC_MAX_THREADS;
    io->priv = p;
    io->finish = psync_finish;
    io->kind = DSTORE_IO_PSYNC;
    for (; p->nthreads < want; p->nthreads++)
        if (pthread_create(&p->threads[p->nthreads], NULL, psync_worker, io))
            break;
    if (p->nthreads)
        return 0;
    free(p);
    io->priv = NULL;
    io->finish = NULL;
    return -ENOMEM;
}

/* ---- the interface ---- */

/* The engine asked for, falling back from io_uring to psync under AUTO only. */
static int engine_start(struct dio *io)
{
    int rc = -ENOSYS;

    if (io->cfg.kind == DSTORE_IO_PSYNC)
        return psync_start(io);
#ifdef KVT_HAVE_URING
    rc = dio_uring_start(io);
#endif
    if (rc && io->cfg.kind == DSTORE_IO_AUTO)
        rc = psync_start(io);
    return rc;
}

int dio_create(const struct dio_config *cfg, struct dio **out)
{
    struct dio *io;
    int rc;

    *out = NULL;
    if (cfg->kind > DSTORE_IO_PSYNC)
        return -EINVAL;
    io = calloc(1, sizeof(*io));
    if (!io)
        return -ENOMEM;
    io->cfg = *cfg;
    if (pthread_mutex_init(&io->lock, NULL)) {
        free(io);
        return -ENOMEM;
    }
    if (pthread_cond_init(&io->work, NULL)) {
        rc = -ENOMEM;
        goto fail_cond;
    }
    if ((rc = engine_start(io)))
        goto fail_engine;
    *out = io;
    return 0;

fail_engine:
    pthread_cond_destroy(&io->work);
fail_cond:
    pthread_mutex_destroy(&io->lock);
    free(io);
    return rc;
}

void dio_destroy(struct dio *io)
{
    if (!io)
        return;
    io->finish(io);
    pthread_cond_destroy(&io->work);
    pthread_mutex_destroy(&io->lock);
    free(io);
}

void dio_submit(struct dio *io, struct dio_req *list)
{
    struct dio_req *last = list;

    if (!list)
        return;
    while (last->next)
        last = last->next;
    pthread_mutex_lock(&io->lock);
    if (io->tail)
        io->tail->next = list;
    else
        io->head = list;
    io->tail = last;
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->lock);
    if (io->kick)
        io->kick(io);
}

uint32_t dio_kind(const struct dio *io)
{
    return io->kind;
}

bool dio_fixed_buffers(const struct dio *io)
{
    return io->fixed;
}
