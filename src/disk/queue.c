/*
 * The committer's job queue and the completion of ops, shared by the front (which queues and
 * collects) and the workers (the committer and the I/O engines' callbacks, which finish
 * pages). Everything here runs under the store's lock, but for freeing jobs taken off the
 * queue.
 */
#include "store_int.h"

#include <stdlib.h>

void job_push_locked(struct dstore *s, struct djob *j)
{
    j->next = NULL;
    if (s->jtail)
        s->jtail->next = j;
    else
        s->jhead = j;
    s->jtail = j;
    pthread_cond_signal(&s->job_cv);
}

void job_free_all(struct djob *jobs)
{
    for (struct djob *j = jobs, *next; j; j = next) {
        next = j->next;
        free(j->keys);
        free(j);
    }
}

static void op_finish_locked(struct dstore *s, struct dop *op)
{
    op->ok = 0;
    for (uint32_t i = 0; i < op->n; i++) {
        op->results[i] = op->pages[i].res;
        op->ok += op->pages[i].res == 0;
    }
    op->done = true;
    pthread_cond_broadcast(&s->done_cv);
    if (s->o.notify && s->o.notify->done)
        s->o.notify->done(s->o.notify->arg);
}

void op_page_done_locked(struct dstore *s, struct dop *op)
{
    if (--op->pending == 0)
        op_finish_locked(s, op);
}
