/*
 * The io_uring engine (see dio.h). One thread owns the ring: it moves queued requests into
 * submission entries (at most depth in flight), submits them a few at a time, sleeps until a
 * completion, fills the ring again and hands the finished requests to a second thread, which
 * runs their callbacks (uring_thread, callback_thread). Producers wake the first through an
 * eventfd whose read always sits in the ring, so a new request never waits behind a slow one.
 *
 * Why two threads: a read's callback checks its page (XXH3-128 of 256 KiB: about 20 us), and
 * the disk is fast only while its queue is kept full. With the checks on the ring's thread,
 * even run after each refill, random 256 KiB reads at queue depth 32 went from 3.8 GB/s
 * (nothing checked) to 2.4; with them on a thread of their own, 3.3 - 3.5.
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

#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
/* liburing maps and unmaps a ring with raw system calls, which ThreadSanitizer does not see:
 * a new ring mapped where a closed one was looks to it like memory shared by the two rings'
 * threads. The kernel orders the unmap before the map; these tell ThreadSanitizer so. */
static char ring_maps;
#define RING_UNMAPPING() __tsan_release(&ring_maps)
#define RING_MAPPED() __tsan_acquire(&ring_maps)
#else
#define RING_UNMAPPING() ((void)0)
#define RING_MAPPED() ((void)0)
#endif

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
    struct dio_q ready; /* taken from the queue, not yet in the ring: reads first */
    /* Finished requests for the callback thread, under cb_lock. */
    pthread_t cb_thread;
    pthread_mutex_t cb_lock;
    pthread_cond_t cb_work;
    struct dio_req *cb_head, **cb_tail;
    uint32_t cb_pending;    /* handed over, callback not yet returned */
    bool stopping, cb_stop; /* finish asked for; the ring's thread has exited */
};

/* user_data of the eventfd read: no request lives at this address. */
static char efd_tag;

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
    int idx = r->niov ? -1 : fixed_index(u, p, len);

    r->fixed = idx >= 0;
    if (r->niov && r->write)
        io_uring_prep_writev(sqe, r->fd, r->iov, r->niov, off);
    else if (r->niov)
        io_uring_prep_readv(sqe, r->fd, r->iov, r->niov, off);
    else if (idx >= 0 && r->write)
        io_uring_prep_write_fixed(sqe, r->fd, p, len, off, idx);
    else if (idx >= 0)
        io_uring_prep_read_fixed(sqe, r->fd, p, len, off, idx);
    else if (r->write)
        io_uring_prep_write(sqe, r->fd, p, len, off);
    else
        io_uring_prep_read(sqe, r->fd, p, len, off);
    if (r->async)
        io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
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

/* Up to max ready requests into the ring while there is room (a faulted one is finished
 * here, onto done); how many went in. */
static unsigned fill(struct dio *io, struct uring *u, unsigned max, struct done_list *done)
{
    unsigned n = 0;

    while (u->ready.head && u->inflight < u->depth && n < max) {
        struct dio_req *r = u->ready.head;
        struct io_uring_sqe *sqe;
        int f = r->done ? 0 : dio_fault(io, r);

        if (f) {
            r->res = f;
            done_push(done, dio_q_pop(&u->ready));
            continue;
        }
        sqe = io_uring_get_sqe(&u->ring);
        if (!sqe)
            break;
        prep(u, sqe, dio_q_pop(&u->ready));
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
static void submit_ready(struct dio *io, struct uring *u, struct done_list *done)
{
    unsigned n;

    do {
        n = fill(io, u, SUBMIT_BATCH, done);
        if (io_uring_submit(&u->ring) < 0)
            return;
    } while (n == SUBMIT_BATCH);
}

/* A request's completion entry: finished or failed (onto done, its callback still to run),
 * or short (continued from the front). */
static void landed(struct uring *u, struct dio_req *r, int res, struct done_list *done)
{
    u->inflight--;
    if (res > 0 && r->done + (uint32_t)res < r->len) {
        r->done += (uint32_t)res;
        dio_iov_advance(r, (size_t)res);
        dio_q_push_front(&u->ready, r);
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
    for (struct dio_req *r = dio_take_locked(io), *next; r; r = next) {
        next = r->next;
        dio_q_push(&u->ready, r);
    }
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
    submit_ready(io, u, done);
}

/* The finished requests to the callback thread, in order. */
static void hand_over(struct uring *u, struct done_list *done)
{
    uint32_t n = 0;

    if (!done->head)
        return;
    for (struct dio_req *r = done->head; r; r = r->next)
        n++;
    pthread_mutex_lock(&u->cb_lock);
    *u->cb_tail = done->head;
    u->cb_tail = done->tail;
    u->cb_pending += n;
    pthread_cond_signal(&u->cb_work);
    pthread_mutex_unlock(&u->cb_lock);
    done->head = NULL;
    done->tail = &done->head;
}

/* Whether callbacks are still to run (one may hand its request back). */
static bool callbacks_pending(struct uring *u)
{
    bool pending;

    pthread_mutex_lock(&u->cb_lock);
    pending = u->cb_pending != 0;
    pthread_mutex_unlock(&u->cb_lock);
    return pending;
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

/* The ring's thread: requests in, completions out, nothing else. It stops once a stop was
 * asked for and nothing is queued, in the ring or in a callback (which may submit more). */
static void *uring_thread(void *arg)
{
    struct dio *io = arg;
    struct uring *u = io->priv;
    struct done_list done = {NULL, &done.head};

    arm_eventfd(u);
    for (;;) {
        bool stop = take(io, u);

        submit_ready(io, u, &done);
        hand_over(u, &done);
        if (stop && !u->inflight && !u->ready.head && !callbacks_pending(u))
            break;
        wait_one(u);
        refill(io, u, &done);
        hand_over(u, &done);
    }
    return NULL;
}

/* Runs the callbacks, oldest first. Once a stop is asked for it wakes the ring's thread
 * after each round, so that the last callback's return is seen. */
static void *callback_thread(void *arg)
{
    struct dio *io = arg;
    struct uring *u = io->priv;

    pthread_mutex_lock(&u->cb_lock);
    for (;;) {
        struct dio_req *list;
        uint32_t n = 0;
        bool stopping;

        while (!u->cb_head && !u->cb_stop)
            pthread_cond_wait(&u->cb_work, &u->cb_lock);
        if (!u->cb_head)
            break;
        list = u->cb_head;
        u->cb_head = NULL;
        u->cb_tail = &u->cb_head;
        pthread_mutex_unlock(&u->cb_lock);
        while (list) {
            struct dio_req *r = list;

            list = r->next; /* read first: a callback may hand its request back */
            r->complete(r);
            n++;
        }
        pthread_mutex_lock(&u->cb_lock);
        u->cb_pending -= n;
        stopping = u->stopping;
        if (stopping && !u->cb_pending) {
            pthread_mutex_unlock(&u->cb_lock);
            eventfd_write(u->efd, 1);
            pthread_mutex_lock(&u->cb_lock);
        }
    }
    pthread_mutex_unlock(&u->cb_lock);
    return NULL;
}

static void uring_kick(struct dio *io)
{
    struct uring *u = io->priv;

    eventfd_write(u->efd, 1);
}

static void uring_free(struct uring *u)
{
    RING_UNMAPPING();
    io_uring_queue_exit(&u->ring);
    close(u->efd);
    pthread_cond_destroy(&u->cb_work);
    pthread_mutex_destroy(&u->cb_lock);
    free(u);
}

/* Stop the callback thread once nothing more can reach it. */
static void stop_callbacks(struct uring *u)
{
    pthread_mutex_lock(&u->cb_lock);
    u->cb_stop = true;
    pthread_cond_signal(&u->cb_work);
    pthread_mutex_unlock(&u->cb_lock);
    pthread_join(u->cb_thread, NULL);
}

static void uring_finish(struct dio *io)
{
    struct uring *u = io->priv;

    pthread_mutex_lock(&u->cb_lock);
    u->stopping = true;
    pthread_mutex_unlock(&u->cb_lock);
    pthread_mutex_lock(&io->lock);
    io->stop = true;
    pthread_mutex_unlock(&io->lock);
    uring_kick(io);
    pthread_join(u->thread, NULL);
    stop_callbacks(u);
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
    u->cb_tail = &u->cb_head;
    if (pthread_mutex_init(&u->cb_lock, NULL)) {
        free(u);
        return -ENOMEM;
    }
    if (pthread_cond_init(&u->cb_work, NULL)) {
        rc = -ENOMEM;
        goto fail_cond;
    }
    u->efd = eventfd(0, EFD_CLOEXEC);
    if (u->efd < 0) {
        rc = -errno;
        goto fail_efd;
    }
    /* Two entries beyond depth: the eventfd read and its re-arm. */
    if ((rc = io_uring_queue_init(u->depth + 2, &u->ring, 0)))
        goto fail_ring;
    RING_MAPPED();
    register_region(io, u);
    io->priv = u;
    io->kick = uring_kick;
    io->finish = uring_finish;
    io->kind = DSTORE_IO_URING;
    if (pthread_create(&u->cb_thread, NULL, callback_thread, io))
        goto fail_threads;
    if (pthread_create(&u->thread, NULL, uring_thread, io) == 0)
        return 0;
    stop_callbacks(u);
fail_threads:
    rc = -ENOMEM;
    RING_UNMAPPING();
    io_uring_queue_exit(&u->ring);
    io->fixed = false;
    io->priv = NULL;
    io->kick = NULL;
    io->finish = NULL;
fail_ring:
    close(u->efd);
fail_efd:
    pthread_cond_destroy(&u->cb_work);
fail_cond:
    pthread_mutex_destroy(&u->cb_lock);
    free(u);
    return rc;
}

#endif /* KVT_HAVE_URING */
