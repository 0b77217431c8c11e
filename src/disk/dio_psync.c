/*
 * The psync engine: every worker takes the next queued request (reads first) and runs it to the end
 * with pread/pwrite, so requests overlap across workers as they would in the kernel's queue. For
 * kernels and sandboxes that refuse io_uring, and for dirs in memory (tmpfs), where every I/O
 * is a copy the CPU makes: there a request may take its checksum as its bytes pass (each).
 */
#include "dio.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#define PSYNC_MAX_THREADS 64

struct psync {
    uint32_t nthreads;
    pthread_t threads[PSYNC_MAX_THREADS];
};

/* One system call of at most DIO_STEP bytes of r, in one run of memory, with r->each handed
 * them (a write's before, a read's after). */
static ssize_t step(struct dio_req *r, off_t off)
{
    uint8_t *p = r->niov ? r->iov->iov_base : (uint8_t *)r->buf + r->done;
    size_t len = r->niov ? r->iov->iov_len : r->len - r->done;
    ssize_t n;

    len = len < DIO_STEP ? len : DIO_STEP;
    if (r->write && r->done + len > r->fed) {
        r->each(r, p + (r->fed - r->done), r->done + len - r->fed);
        r->fed = r->done + (uint32_t)len;
    }
    n = r->write ? pwrite(r->fd, p, len, off) : pread(r->fd, p, len, off);
    if (n > 0 && !r->write)
        r->each(r, p, (size_t)n);
    return n;
}

/* The whole transfer, continuing after short counts; -ENODATA when a read meets the end. */
static int psync_run(struct dio *io, struct dio_req *r)
{
    int rc = dio_fault(io, r);

    while (!rc && r->done < r->len) {
        uint8_t *p = (uint8_t *)r->buf + r->done;
        size_t left = r->len - r->done;
        off_t off = (off_t)(r->off + r->done);
        int cnt = r->niov > IOV_MAX ? IOV_MAX : (int)r->niov;
        ssize_t n =
            r->each ? step(r, off)
            : r->niov
                ? (r->write ? pwritev(r->fd, r->iov, cnt, off) : preadv(r->fd, r->iov, cnt, off))
                : (r->write ? pwrite(r->fd, p, left, off) : pread(r->fd, p, left, off));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = -errno;
        else if (n == 0)
            rc = r->write ? -EIO : -ENODATA;
        else
            r->done += (uint32_t)n;
        if (n > 0)
            dio_iov_advance(r, (size_t)n);
    }
    return rc;
}

/* The next queued request, or NULL once stopped with the queue drained. */
static struct dio_req *psync_next(struct dio *io)
{
    struct dio_req *r;

    pthread_mutex_lock(&io->lock);
    while (!io->q.head && !io->stop)
        pthread_cond_wait(&io->work, &io->lock);
    r = dio_q_pop(&io->q);
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

int dio_psync_start(struct dio *io)
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
