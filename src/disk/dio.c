/*
 * The I/O engines' interface: the engine chosen at create (io_uring, falling back to psync
 * under AUTO), submission onto the shared queue, and teardown. The engines are dio_uring.c and
 * dio_psync.c; what they share below this is dio_queue.c.
 */
#include "dio.h"

#include <errno.h>
#include <stdlib.h>

/* ---- the interface ---- */

/* The engine asked for, falling back from io_uring to psync under AUTO only. */
static int engine_start(struct dio *io)
{
    int rc = -ENOSYS;

    if (io->cfg.kind == DSTORE_IO_PSYNC)
        return dio_psync_start(io);
#ifdef KVT_HAVE_URING
    rc = dio_uring_start(io);
#endif
    if (rc && io->cfg.kind == DSTORE_IO_AUTO)
        rc = dio_psync_start(io);
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
    bool one = list && !list->next;

    if (!list)
        return;
    pthread_mutex_lock(&io->lock);
    while (list) {
        struct dio_req *r = list;

        list = r->next;
        dio_q_push(&io->q, r);
    }
    if (one) /* one request wakes one psync worker, not all of them to find it taken */
        pthread_cond_signal(&io->work);
    else
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
