/*
 * mailbox.c - one mailbox per actor: a bounded multi-producer single-consumer
 * ck ring of message pointers plus an ev_async doorbell on the loop.
 *
 * Producers are caller threads, copy workers and other actors; the consumer
 * is the loop thread.  A full ring is returned to the producer as -EAGAIN,
 * never dropped.  The doorbell handler drains a bounded batch and rings
 * itself again if messages remain, so one busy actor cannot starve the loop.
 */
#include <errno.h>
#include <stdlib.h>

#include "rt.h"

#define MAILBOX_DRAIN_BATCH 64

static void mailbox_on_doorbell(struct ev_loop *loop, ev_async *w, int revents)
{
    struct mailbox *mb = w->data;
    void *m;
    int n = 0;
    while (n < MAILBOX_DRAIN_BATCH && ck_ring_dequeue_mpsc(&mb->ring, mb->buf, &m)) {
        /* pairs with the release in mailbox_post */
        (void)atomic_load_explicit(&((struct msg_hdr *)m)->posted, memory_order_acquire);
        mb->handle(mb->rt, m);
        n++;
    }
    if (n == MAILBOX_DRAIN_BATCH && ck_ring_size(&mb->ring) > 0)
        ev_async_send(loop, &mb->doorbell);
}

int mailbox_init(struct mailbox *mb, struct umbp_runtime *rt, enum actor_id a, unsigned size,
                 mailbox_handler h)
{
    unsigned cap = 2;
    while (cap < size + 1)
        cap <<= 1; /* ck rings hold size - 1 entries and need a power of two */
    mb->buf = calloc(cap, sizeof(ck_ring_buffer_t));
    if (!mb->buf)
        return -ENOMEM;
    ck_ring_init(&mb->ring, cap);
    mb->size = cap;
    mb->handle = h;
    mb->rt = rt;
    mb->actor = a;
    ev_async_init(&mb->doorbell, mailbox_on_doorbell);
    mb->doorbell.data = mb;
    ev_async_start(rt->loop, &mb->doorbell);
    return 0;
}

void mailbox_fini(struct mailbox *mb)
{
    free(mb->buf);
    mb->buf = NULL;
}

int mailbox_post(struct mailbox *mb, struct msg_hdr *m)
{
    /* ck_ring's enqueue publishes the slot with a store fence before moving
     * the producer index, so the consumer sees the message fully written. */
    atomic_store_explicit(&m->posted, 1, memory_order_release);
    if (!ck_ring_enqueue_mpsc(&mb->ring, mb->buf, m))
        return -EAGAIN;
    ev_async_send(mb->rt->loop, &mb->doorbell);
    return 0;
}

int rt_post(struct umbp_runtime *rt, struct msg_hdr *m)
{
    return mailbox_post(&rt->mb[msg_actor((enum msg_type)m->type)], m);
}

int rt_post_many(struct umbp_runtime *rt, struct msg_hdr **m, size_t n)
{
    if (!n)
        return 0;
    /* one doorbell for the batch: a wake-up per message would let the loop
     * thread take each one as it arrives, a system call and a context
     * switch apiece on a small machine */
    struct mailbox *mb = &rt->mb[msg_actor((enum msg_type)m[0]->type)];
    size_t i = 0;
    for (; i < n; i++) {
        if (&rt->mb[msg_actor((enum msg_type)m[i]->type)] != mb)
            break;
        atomic_store_explicit(&m[i]->posted, 1, memory_order_release);
        if (!ck_ring_enqueue_mpsc(&mb->ring, mb->buf, m[i]))
            break;
    }
    ev_async_send(rt->loop, &mb->doorbell);
    return i == n ? 0 : -EAGAIN;
}
