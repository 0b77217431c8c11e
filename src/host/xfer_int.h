/*
 * The transfer engine's private header: the state both backends share, and the table each
 * backend fills in (struct xfer_backend), the way device/backend.h does for device memory.
 *
 * transfer.c holds what does not depend on how bytes move: the API's checks, op ids and the
 * op list, watermarks and the first error, the waits, the byte counts, the copy plan, and the
 * marks a load leaves as its layers land. A backend file holds the rest: xfer_sim.c (worker
 * threads and memcpy) always, xfer_cuda.c (CUDA streams, kernels, the copy engine) only in a
 * build with CUDA (src/host/meson.build); transfer.c picks the one whose kind is the device
 * pool's, and names the compiled-in backends in one place.
 *
 * A backend extends the engine and the op by embedding struct xfer_engine or struct xfer_op as
 * the first member of its own struct, whose size its table gives: transfer.c allocates both,
 * zeroed, and the backend converts the pointer back to its own struct.
 *
 * Locking: each stream has one mutex. It guards the op list, the load progress (cur_id and
 * cur_layers) and the first error. The watermark and the byte count are atomics written under
 * the mutex, so waiters can test them inside their predicate and the owner can read them
 * without locking. issued is the owner thread's alone.
 */
#ifndef KVT_HOST_XFER_INT_H
#define KVT_HOST_XFER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "host/transfer.h"

struct xfer_op {
    struct xfer_op *next;
    struct xfer_stream *s;
    uint64_t id;
    uint64_t bytes; /* what the op moves, counted once it completes without error */
    size_t n;
    uint32_t *dev_pages, *host_pages; /* stored behind the backend's op, in one allocation */
    uint32_t *swa_pages; /* after them, or NULL: none (a plain engine, or the caller gave none) */
};

struct xfer_stream {
    struct xfer_engine *x;
    enum xfer_dir dir;
    uint64_t issued; /* the last id handed out; owner thread only */
    _Atomic uint64_t done;
    _Atomic uint64_t bytes;
    bool inited;  /* lock and condvar exist */
    bool started; /* the backend's start succeeded */
    pthread_mutex_t lock;
    pthread_cond_t progress; /* the watermark or a load's layer count moved */
    int err;                 /* the first error and the op it hit */
    uint64_t err_id;
    /* The backend's ops in submission order: sim, those queued for the worker; cuda, those
     * enqueued and not yet reaped. */
    struct xfer_op *head, *tail;
    uint64_t cur_id;     /* the load being copied layer by layer (sim) */
    uint32_t cur_layers; /* layers of cur_id that have landed */
};

struct xfer_engine {
    const struct xfer_backend *be;
    struct kv_pool *dev;
    struct host_pool *host;
    struct xfer_config cfg;
    uint32_t layers, page_size;
    uint64_t dev_npages;  /* device pages, the padding page 0 included */
    size_t page_bytes;    /* one page over every layer, K and V */
    bool host_contiguous; /* a run of host pages is one span within a layer (layer_first) */
    uint64_t path_ops[2]; /* ops sent by kernel, by DMA (cuda); owner thread only */
    /* NULL, or a sliding-window model's pools (dev is then &swa->full), and the SWA pool's
     * pages, its padding page 0 included (0 without). */
    const struct swa_pool *swa;
    uint64_t swa_npages;
    struct xfer_stream s[2];
};

/* What a backend does; transfer.c calls these from the owner thread unless noted. */
struct xfer_backend {
    uint32_t kind;      /* the enum kvt_backend of the device pools it copies for */
    size_t engine_size; /* its engine struct, struct xfer_engine first */
    size_t op_size;     /* its op struct, struct xfer_op first */
    bool two_pools;     /* copies a sliding-window model's pools (xfer_config.swa) */
    /* Bring the stream up (a worker thread, a device stream); 0 or -errno / KVT_E*. */
    int (*start)(struct xfer_stream *s);
    /* Complete every op submitted, then take the stream down; only after a good start. */
    void (*stop)(struct xfer_stream *s);
    /* NULL or engine-wide setup once both streams have started; an error fails create. */
    int (*setup)(struct xfer_engine *x);
    /* NULL or undo setup once both streams have stopped, whether setup ran, failed or not. */
    void (*finish)(struct xfer_engine *x);
    /* Give op its id (++issued) and start it after ready; the op is the backend's from here,
     * even on failure, when no id is used. */
    int (*submit)(struct xfer_stream *s, struct xfer_op *op, void *ready);
    /* Under the lock: let the lock go until progress may have been made, then retake it. */
    void (*wait_progress)(struct xfer_stream *s);
    /* NULL or, after a wait, free what the ops that completed still hold. */
    void (*reap)(struct xfer_stream *s);
    /* NULL or make stream wait for a layer of load id, not yet done, without blocking; NULL:
     * the caller blocks until the layer's mark (xfer_layers_landed) or the op's completion. */
    int (*wait_layer)(struct xfer_stream *s, uint64_t id, uint32_t layer, void *stream);
};

extern const struct xfer_backend xfer_backend_sim;
extern const struct xfer_backend xfer_backend_cuda; /* defined only in a build with CUDA */

/* Copies one span in the direction of the stream; the backend's primitive for the plan. */
typedef int (*xfer_copy_fn)(struct xfer_stream *s, void *dst, const void *src, size_t n);

/* Length of the run of pages from i whose device and host page numbers both climb by one
 * (dev_pages: the full pool's pages). */
size_t xfer_run_len(const struct xfer_op *op, size_t i);

/* Every page of op in one model layer, as few spans per run as the host layout allows, by
 * copy: a sliding-window layer from or to op's swa_pages, skipping the pages with none. */
int xfer_copy_layer(struct xfer_stream *s, xfer_copy_fn copy, const struct xfer_op *op,
                    uint32_t layer);

/* Under the lock: op id finished with rc; moves the watermark (never back) and wakes waiters. */
void xfer_complete_locked(struct xfer_stream *s, uint64_t id, uint64_t bytes, int rc);

/* Under the lock: append op to the stream's list. */
void xfer_push_locked(struct xfer_stream *s, struct xfer_op *op);

/* Under the lock: unlink and return the oldest op of the list; NULL when it is empty. */
struct xfer_op *xfer_pop_locked(struct xfer_stream *s);

/* Under the lock: load id starts copying, none of its layers landed yet. */
void xfer_layers_begin_locked(struct xfer_stream *s, uint64_t id);

/* Takes the lock: the first landed layers of the current load are there; wakes waiters. */
void xfer_layers_landed(struct xfer_stream *s, uint32_t landed);

#endif
