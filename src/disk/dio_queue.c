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

void dio_iov_advance(struct dio_req *r, size_t n)
{
    while (n && r->niov) {
        size_t k = n < r->iov->iov_len ? n : r->iov->iov_len;

        r->iov->iov_base = (uint8_t *)r->iov->iov_base + k;
        r->iov->iov_len -= k;
        n -= k;
        if (!r->iov->iov_len) {
            r->iov++;
            r->niov--;
        }
    }
}

struct dio_req *dio_take_locked(struct dio *io)
{
    struct dio_req *list = io->q.head;

    io->q = (struct dio_q){NULL, NULL, NULL};
    return list;
}

/* r linked in at *at, the queue's ends kept. */
static void link_at(struct dio_q *q, struct dio_req **at, struct dio_req *r)
{
    r->next = *at;
    *at = r;
    if (!r->next)
        q->tail = r;
    if (!r->write && (!q->rlast || q->rlast->next == r))
        q->rlast = r;
}

void dio_q_push(struct dio_q *q, struct dio_req *r)
{
    if (r->write)
        link_at(q, q->tail ? &q->tail->next : &q->head, r);
    else
        link_at(q, q->rlast ? &q->rlast->next : &q->head, r);
}

void dio_q_push_front(struct dio_q *q, struct dio_req *r)
{
    if (r->write)
        link_at(q, q->rlast ? &q->rlast->next : &q->head, r);
    else
        link_at(q, &q->head, r);
}

struct dio_req *dio_q_pop(struct dio_q *q)
{
    struct dio_req *r = q->head;

    if (!r)
        return NULL;
    q->head = r->next;
    if (!q->head)
        q->tail = NULL;
    if (q->rlast == r)
        q->rlast = NULL;
    r->next = NULL;
    return r;
}
