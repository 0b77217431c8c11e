/*
 * What the I/O engines share below the interface: the queue they take requests from and the
 * fault seam every request passes.
 */
#include "dio.h"

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
