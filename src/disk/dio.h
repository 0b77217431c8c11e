/*
 * The disk tier's I/O engines: positional reads and writes of whole pages against slab
 * files, run off the caller's thread.
 *
 * Two engines with one interface:
 * - uring: one io_uring and one thread that both fills the submission ring and reaps
 *   completions. Producers wake it through an eventfd whose read is kept armed in the ring,
 *   so the thread sleeps in exactly one place. The host pool can be registered as fixed
 *   buffers; a request that lies inside it goes out as READ_FIXED / WRITE_FIXED.
 * - psync: a few threads with pread/pwrite, for kernels or sandboxes that refuse io_uring.
 *
 * Reads go ahead of writes queued before them: a read is a request waiting (a fill, a get),
 * a write rarely is, and behind a write batch a read waited milliseconds. Each kind keeps
 * its order.
 *
 * A request's completion callback runs once, on an engine thread, with res set. Short
 * transfers are continued by the engine; a read that meets the end of the file ends with
 * -ENODATA (the slot is not backed by the file).
 */
#ifndef KVT_DISK_DIO_H
#define KVT_DISK_DIO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "disk/store.h"

struct dio_req {
    struct dio_req *next; /* queue link; the engine's while the request is submitted */
    void (*complete)(struct dio_req *r);
    void *ctx; /* the submitter's: what the request belongs to */
    void *buf;
    /* Or, niov > 0: the bytes are these regions in order, len in all (buf unused). The
     * engine advances them past what a short transfer moved: they are the request's. */
    struct iovec *iov;
    uint32_t niov;
    uint64_t off;
    uint32_t len;
    uint32_t done; /* bytes moved so far */
    int fd;
    bool write;
    bool fixed; /* set by the engine when a registered buffer carried it */
    /* Run it on the kernel's workers, not inline in the engine's thread: an I/O through the
     * page cache is a copy the kernel makes inline, one at a time, so a batch's copies run
     * beside each other only from workers (writes: one per slab file). */
    bool async;
    uint32_t slab, slot; /* named to the fault seam */
    int res;             /* 0, or -errno */
    /* Or NULL. The psync engine hands it the request's bytes as they pass, in order and each
     * once, at most DIO_STEP at a time: a write's just before writing them, a read's just
     * after reading them, so that a checksum reads them from the CPU's cache rather than
     * memory. The io_uring engine never calls it: set it on a psync engine's requests only. */
    void (*each)(struct dio_req *r, const void *bytes, size_t n);
    uint32_t fed; /* bytes handed to each so far (a short write hands none twice) */
};

/* The most bytes one system call moves of a request with each (256 KiB: a step and its
 * checksum stay in a core's cache). */
#define DIO_STEP (256u << 10)

struct dio_config {
    uint32_t kind;    /* enum dstore_io: AUTO tries io_uring, then psync */
    uint32_t depth;   /* requests in flight at most (uring) */
    uint32_t threads; /* worker threads (psync) */
    void *reg_base;   /* memory to register as fixed buffers (uring); may be NULL */
    size_t reg_bytes;
    const struct dstore_faults *faults; /* may be NULL */
};

/* A queue of requests: reads first (rlast the last of them, NULL when none), then writes,
 * each kind in the order queued (dio_queue.c). */
struct dio_q {
    struct dio_req *head, *tail, *rlast;
};

/* Queue one request after the others of its kind. */
void dio_q_push(struct dio_q *q, struct dio_req *r);

/* Queue one request ahead of the others of its kind (a short transfer's rest). */
void dio_q_push_front(struct dio_q *q, struct dio_req *r);

/* The first request off the queue, or NULL. */
struct dio_req *dio_q_pop(struct dio_q *q);

struct dio;

/* Start an engine. kind URING fails with the kernel's answer (-ENOSYS, -EPERM, ...) when
 * io_uring is refused or not built in; AUTO then falls back to psync. */
int dio_create(const struct dio_config *cfg, struct dio **out);

/* Run every request already submitted to completion, then stop. NULL is a no-op. */
void dio_destroy(struct dio *io);

/* Queue a NULL-terminated list of requests (linked by next). Never fails; the callbacks
 * report each request's result. */
void dio_submit(struct dio *io, struct dio_req *list);

/* The engine in use: DSTORE_IO_URING or DSTORE_IO_PSYNC. */
uint32_t dio_kind(const struct dio *io);

/* Whether the registered region is in use as fixed buffers. */
bool dio_fixed_buffers(const struct dio *io);

/* ---- shared by the engines (dio.c, dio_queue.c) ---- */

struct dio {
    struct dio_config cfg;
    uint32_t kind;
    pthread_mutex_t lock;
    pthread_cond_t work;
    struct dio_q q; /* submitted, not yet taken by an engine thread */
    bool stop;
    bool fixed;
    /* Wakes the engine after a submit (uring: writes its eventfd); NULL for psync. */
    void (*kick)(struct dio *io);
    void (*finish)(struct dio *io); /* stop the threads and free the engine's own state */
    void *priv;
};

/* dio_queue.c: a vectored request's regions advanced past n more bytes moved. */
void dio_iov_advance(struct dio_req *r, size_t n);

/* dio_queue.c: the fault seam's verdict on r: 0, or the error to fail it with. */
int dio_fault(const struct dio *io, const struct dio_req *r);

/* dio_queue.c: under the lock, take every queued request, reads first. */
struct dio_req *dio_take_locked(struct dio *io);

/* The engines' starts (dio_psync.c, dio_uring.c): threads up, kick and finish set. */
int dio_psync_start(struct dio *io);
#ifdef KVT_HAVE_URING
int dio_uring_start(struct dio *io);
#endif

#endif
