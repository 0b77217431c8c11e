/*
 * The io_uring engine (see dio.h). One thread owns the ring: it moves queued requests into
 * submission entries (at most depth in flight), submits them a few at a time, sleeps until a
 * completion, and fills the ring again before it runs the completions' callbacks
 * (uring_thread). Producers wake it through an eventfd whose read always sits in the ring, so
 * a new request never waits behind a slow one.
 *
 * The registered region is cut into chunks of at most 1 GiB (the kernel's limit for one
 * fixed buffer); a request that fits inside one chunk uses it.
 */
#ifdef KVT_HAVE_URING

#include "dio.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define CHUNK_BYTES (1ull << 30)
#define MAX_CHUNKS 1024
#define SUBMIT_BATCH 4 /* requests per submit (submit_ready) */

struct uring {
    struct io_uring ring;
    pthread_t thread;
    int efd;
    uint64_t efd_val;  /* the armed eventfd read lands here */
    uint32_t depth;    /* requests in flight at most */
    uint32_t inflight; /* requests in the ring (the eventfd read not counted) */
    uint8_t *reg_base; /* registered region, NULL when none */
    size_t reg_bytes;
    struct dio_req *ready; /* taken from the queue, not yet in the ring: FIFO */
    struct dio_req *ready_tail;
};

/* user_data of the eventfd read: no request lives at this address. */
static char efd_tag;

static void ready_push_front(struct uring *u, struct dio_req *r)
{
    r->next = u->ready;
    u->ready = r;
    if (!u->ready_tail)
        u->ready_tail = r;
}

static void ready_append(struct uring *u, struct dio_req *list)
{
    struct dio_req *last = list;

    if (!list)
        return;
    while (last->next)
        last = last->next;
    if (u->ready_tail)
        u->ready_tail->next = list;
    else
        u->ready = list;
    u->ready_tail = last;
}

static struct dio_req *ready_pop(struct uring *u)
{
    struct dio_req *r = u->ready;

    u->ready = r->next;
    if (!u->ready)
        u->ready_tail = NULL;
    r->next = NULL;
    return r;
}

/* The registered buffer holding [p, p + len), or -1. */
static int fixed_index(const struct uring *u, const uint8_t *p, size_t len)
{
    size_t off, idx;

    if (!u->reg_base || p < u->reg_base || (size_t)(p - u->reg_base) >= u->reg_bytes)
        return -1;
    off = (size_t)(p - u->reg_base);
    idx = off / CHUNK_BYTES;
    if (off + len > u->reg_bytes || off + len > (idx + 1) * CHUNK_BYTES)
        return -1;
    return (int)idx;
}

static void prep(struct uring *u, struct io_uring_sqe *sqe, struct dio_req *r)
{
    uint8_t *p = (uint8_t *)r->buf + r->done;
    unsigned len = r->len - r->done;
    uint64_t off = r->off + r->done;
    int idx = fixed_index(u, p, len);

    r->fixed = idx >= 0;
    if (idx >= 0 && r->write)
        io_uring_prep_write_fixed(sqe, r->fd, p, len, off, idx);
    else if (idx >= 0)
        io_uring_prep_read_fixed(sqe, r->fd, p, len, off, idx);
    else if (r->write)
        io_uring_prep_write(sqe, r->fd, p, len, off);
    else
        io_uring_prep_read(sqe, r->fd, p, len, off);
    io_uring_sqe_set_data(sqe, r);
}

static void arm_eventfd(struct uring *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);

    /* The ring has room for the eventfd read beyond depth, so this never fails. */
    if (!sqe)
        return;
    io_uring_prep_read(sqe, u->efd, &u->efd_val, sizeof(u->efd_val), 0);
    io_uring_sqe_set_data(sqe, &efd_tag);
}

/* Up to max ready requests into the ring while there is room (a faulted one completes here);
 * how many went in. */
static unsigned fill(struct dio *io, struct uring *u, unsigned max)
{
    unsigned n = 0;

    while (u->ready && u->inflight < u->depth && n < max) {
        struct dio_req *r = u->ready;
        struct io_uring_sqe *sqe;
        int f = r->done ? 0 : dio_fault(io, r);

        if (f) {
            ready_pop(u);
            r->res = f;
            r->complete(r);
            continue;
        }
        sqe = io_uring_get_sqe(&u->ring);
        if (!sqe)
            break;
        prep(u, sqe, ready_pop(u));
        u->inflight++;
        n++;
    }
    return n;
}

/* Ready requests into the ring, submitted SUBMIT_BATCH at a time. The kernel hands a submit's
 * requests to the disk together, at the end of the call: one submit of the ~30 small reads a
 * wake-up finds kept the disk idle while the kernel prepared all 30 (random 4 KiB pages, qd
 * 32, on a virtio disk: 0.09 - 0.12 M reads/s, against 0.10 - 0.13 M in submits of 4, faster
 * in 9 pairs of 10, and fio's 0.13 - 0.14 M, which submits each read as it is ready). Submits
 * of 1 or 2 cost a syscall and a doorbell each for no more speed. A refused submit (-EAGAIN,
 * -EBUSY) leaves its entries queued for the next one. */
static void submit_ready(struct dio *io, struct uring *u)
{
    unsigned n;

    do {
        n = fill(io, u, SUBMIT_BATCH);
        if (io_uring_submit(&u->ring) < 0)
            return;
    } while (n == SUBMIT_BATCH);
}

/* Finished requests whose callbacks have yet to run, oldest first. */
struct done_list {
    struct dio_req *head, **tail;
};

static void done_push(struct done_list *d, struct dio_req *r)
{
    r->next = NULL;
    *d->tail = r;
    d->tail = &r->next;
}

/* The link is read here, before the callback: a callback may hand its request back. */
static struct dio_req *done_pop(struct done_list *d)
{
    struct dio_req *r = d->head;

    d->head = r->next;
    if (!d->head)
        d->tail = &d->head;
    return r;
}

/* A request's completion entry: finished or failed (onto done, its callback still to run),
 * or short (continued from the front). */
static void landed(struct uring *u, struct dio_req *r, int res, struct done_list *done)
{
    u->inflight--;
    if (res > 0 && r->done + (uint32_t)res < r->len) {
        r->done += (uint32_t)res;
        ready_push_front(u, r);
        return;
    }
    if (res > 0)
        r->done += (uint32_t)res;
    r->res = res < 0 ? res : res == 0 ? (r->write ? -EIO : -ENODATA) : 0;
    done_push(done, r);
}

/* Every completion entry available, off the ring. */
static void harvest(struct uring *u, struct done_list *done)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    bool rearm = false;

    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        void *data = io_uring_cqe_get_data(cqe);

        seen++;
        if (data == &efd_tag)
            rearm = true;
        else
            landed(u, data, cqe->res, done);
    }
    io_uring_cq_advance(&u->ring, seen);
    if (rearm)
        arm_eventfd(u);
}

/* Move the queue into the ready list; whether a stop was asked for. */
static bool take(struct dio *io, struct uring *u)
{
    bool stop;

    pthread_mutex_lock(&io->lock);
    ready_append(u, dio_take_locked(io));
    stop = io->stop;
    pthread_mutex_unlock(&io->lock);
    return stop;
}

/* The completions off the ring, and the ring filled again at once; their callbacks run
 * after. */
static void refill(struct dio *io, struct uring *u, struct done_list *done)
{
    harvest(u, done);
    take(io, u);
    submit_ready(io, u);
}

/* Sleep until at least one completion (submitting anything still queued, in the same call). A
 * refused submit (-EAGAIN, -EBUSY) leaves the entries queued; waiting for a completion makes
 * room. */
static void wait_one(struct uring *u)
{
    struct io_uring_cqe *cqe;
    int rc;

    while ((rc = io_uring_submit_and_wait(&u->ring, 1)) == -EINTR)
        ;
    if (rc < 0)
        while (io_uring_wait_cqe(&u->ring, &cqe) == -EINTR)
            ;
}

/* The callbacks check whole pages (a checksum each: about 0.3 ms for 2 MiB), and a disk whose
 * queue waited on them would idle with requests ready. So a request's slot in the ring is
 * filled again before callbacks run, and between two callbacks whenever more completions
 * came in. */
static void *uring_thread(void *arg)
{
    struct dio *io = arg;
    struct uring *u = io->priv;
    struct done_list done = {NULL, &done.head};

    arm_eventfd(u);
    for (;;) {
        bool stop = take(io, u);

        submit_ready(io, u);
        if (stop && !u->inflight && !u->ready)
            break;
        wait_one(u);
        refill(io, u, &done);
        while (done.head) {
            struct dio_req *r = done_pop(&done);

            r->complete(r);
            if (io_uring_cq_ready(&u->ring))
                refill(io, u, &done);
        }
    }
    return NULL;
}

static void uring_kick(struct dio *io)
{
    struct uring *u = io->priv;

    eventfd_write(u->efd, 1);
}

static void uring_free(struct uring *u)
{
    io_uring_queue_exit(&u->ring);
    close(u->efd);
    free(u);
}

static void uring_finish(struct dio *io)
{
    struct uring *u = io->priv;

    pthread_mutex_lock(&io->lock);
    io->stop = true;
    pthread_mutex_unlock(&io->lock);
    uring_kick(io);
    pthread_join(u->thread, NULL);
    uring_free(u);
}

/* Register the caller's region in chunks; without it every request is a plain read/write. */
static void register_region(struct dio *io, struct uring *u)
{
    size_t n = (io->cfg.reg_bytes + CHUNK_BYTES - 1) / CHUNK_BYTES;
    struct iovec *iov;

    if (!io->cfg.reg_base || !io->cfg.reg_bytes || n > MAX_CHUNKS)
        return;
    iov = calloc(n, sizeof(*iov));
    if (!iov)
        return;
    for (size_t i = 0; i < n; i++) {
        size_t off = i * CHUNK_BYTES, left = io->cfg.reg_bytes - off;

        iov[i].iov_base = (uint8_t *)io->cfg.reg_base + off;
        iov[i].iov_len = left < CHUNK_BYTES ? left : CHUNK_BYTES;
    }
    if (io_uring_register_buffers(&u->ring, iov, (unsigned)n) == 0) {
        u->reg_base = io->cfg.reg_base;
        u->reg_bytes = io->cfg.reg_bytes;
        io->fixed = true;
    }
    free(iov);
}

int dio_uring_start(struct dio *io)
{
    struct uring *u = calloc(1, sizeof(*u));
    int rc;

    if (!u)
        return -ENOMEM;
    u->depth = io->cfg.depth ? io->cfg.depth : 64;
    u->efd = eventfd(0, EFD_CLOEXEC);
    if (u->efd < 0) {
        rc = -errno;
        goto fail_efd;
    }
    /* Two entries beyond depth: the eventfd read and its re-arm. */
    if ((rc = io_uring_queue_init(u->depth + 2, &u->ring, 0)))
        goto fail_ring;
    register_region(io, u);
    io->priv = u;
    io->kick = uring_kick;
    io->finish = uring_finish;
    io->kind = DSTORE_IO_URING;
    if (pthread_create(&u->thread, NULL, uring_thread, io) == 0)
        return 0;
    rc = -ENOMEM;
    io_uring_queue_exit(&u->ring);
    io->fixed = false;
    io->priv = NULL;
    io->kick = NULL;
    io->finish = NULL;
fail_ring:
    close(u->efd);
fail_efd:
    free(u);
    return rc;
}

#endif /* KVT_HAVE_URING */
