/*
 * api.c - the public data-path entry points: validate, fill an op, post.
 *
 * Runs on the caller's thread.  Whole-batch errors (bad arguments, shapes,
 * duplicate keys, back-pressure, shutdown) are found here and returned at
 * once, so nothing is half-submitted; per-key outcomes arrive in the op.
 * Synchronous helpers (lookup, stats, clear, flush) submit an op and wait on
 * it with a bound; a caller that gives up releases its handle and the op is
 * recycled when the loop thread completes it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

#define MAX_BATCH (1u << 24)

static int submit_gate(struct umbp_runtime *rt)
{
    /* A stalled backend is reported by the tier's health() where the actors
     * receive the op; here only shutdown refuses. */
    if (atomic_load_explicit(&rt->closing, memory_order_acquire))
        return UMBP_E_NOT_ATTEMPTED;
    return 0;
}

static int post_op(struct umbp_runtime *rt, struct umbp_op *op, enum msg_type t)
{
    op->hdr.type = (uint16_t)t;
    int rc = rt_post(rt, &op->hdr);
    if (rc < 0) {
        CNT_ADD(rt, mailbox_full, 1);
        op_abandon(op);
    }
    return rc;
}

/* ---- shape checks ----------------------------------------------------------- */

static int check_range(const umbp_range_t *r)
{
    if (!r->ptr || r->len == 0 || r->offset + r->len < r->offset)
        return UMBP_E_SHAPE;
    return 0;
}

/* Ranges must tile [0, size): sorted, contiguous, non-empty, exact end. */
static int check_put_item(const umbp_put_item_t *it)
{
    if (it->object_size == 0 || it->num_ranges == 0 || !it->ranges)
        return UMBP_E_SHAPE;
    uint64_t end = 0;
    for (uint32_t r = 0; r < it->num_ranges; r++) {
        const umbp_range_t *rg = &it->ranges[r];
        if (check_range(rg) < 0 || rg->offset != end)
            return UMBP_E_SHAPE;
        end = rg->offset + rg->len;
    }
    return end == it->object_size ? 0 : UMBP_E_SHAPE;
}

static int cmp_range_offset(const void *a, const void *b)
{
    const umbp_range_t *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Get ranges: non-empty and pairwise disjoint.  Sorts the op's copy. */
static int check_get_ranges(umbp_range_t *r, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (check_range(&r[i]) < 0)
            return UMBP_E_SHAPE;
    if (n > 1)
        qsort(r, n, sizeof(*r), cmp_range_offset);
    for (uint32_t i = 1; i < n; i++)
        if (r[i].offset < r[i - 1].offset + r[i - 1].len)
            return UMBP_E_SHAPE;
    return 0;
}

/* An open-addressed table of key indices (at most half full): 6 us for 625
 * keys where sorting them took 60 (docs/benchmarks.md).  The keys are
 * first[0], first[stride], ... (bytes); op's table, sized for n keys. */
int umbp_keys_check_duplicates(struct umbp_op *op, const umbp_key_t *first, size_t stride,
                               size_t n)
{
    if (n < 2)
        return 0;
    size_t mask = op->dup_cap - 1;
    uint32_t *tab = op->dup_tab;
    const uint8_t *base = (const uint8_t *)first;
    memset(tab, 0xff, op->dup_cap * sizeof(*tab));
    for (size_t k = 0; k < n; k++) {
        const umbp_key_t *key = (const umbp_key_t *)(base + k * stride);
        size_t h = (size_t)umbp_key_hash(key) & mask;
        for (; tab[h] != UINT32_MAX; h = (h + 1) & mask)
            if (memcmp(base + (size_t)tab[h] * stride, key->bytes, UMBP_KEY_SIZE) == 0)
                return UMBP_E_DUPLICATE_KEY;
        tab[h] = (uint32_t)k;
    }
    return 0;
}

int umbp_check_duplicate_keys(struct umbp_op *op)
{
    if (op->n < 2)
        return 0;
    return umbp_keys_check_duplicates(op, &op->reqs[0].key, sizeof(op->reqs[0]), op->n);
}

/* Copies per-key data common to puts and gets into the op. */
static void fill_key(struct umbp_op *op, size_t k, const umbp_key_t *key,
                     const umbp_range_t *ranges, uint32_t nr, size_t *ri)
{
    memset(&op->reqs[k], 0, sizeof(op->reqs[k]));
    op->reqs[k].key = *key;
    op->state[k] = KEY_TODO;
    op->status[k] = UMBP_E_INPROGRESS;
    op->range_first[k] = (uint32_t)*ri;
    memcpy(&op->ranges[*ri], ranges, nr * sizeof(*ranges));
    *ri += nr;
    op->range_first[k + 1] = (uint32_t)*ri;
}

static int take_op(struct umbp_runtime *rt, enum op_kind kind, size_t n, size_t nranges,
                   struct umbp_op **out)
{
    int rc = submit_gate(rt);
    if (rc < 0)
        return rc;
    struct umbp_op *op = op_get(rt, kind);
    if (!op)
        return -EAGAIN;
    if (op_reserve_keys(op, n, nranges) < 0) {
        op_abandon(op);
        return -ENOMEM;
    }
    *out = op;
    return 0;
}

/* The common end of a put or get submission: the duplicate check needs the
 * op's copy of the batch; then the post.  Gives the op back on error. */
static int submit_filled(struct umbp_runtime *rt, struct umbp_op *op, enum msg_type t,
                         umbp_op_t **out)
{
    int rc = umbp_check_duplicate_keys(op);
    if (rc < 0) {
        op_abandon(op);
        return rc;
    }
    if ((rc = post_op(rt, op, t)) < 0)
        return rc;
    *out = op;
    return 0;
}

/* Takes an op sized for the batch; -EINVAL if it has too many ranges. */
static int take_batch_op(struct umbp_runtime *rt, enum op_kind kind, size_t n,
                         size_t nranges, struct umbp_op **op)
{
    if (nranges > UINT32_MAX)
        return -EINVAL;
    return take_op(rt, kind, n, nranges, op);
}

int umbp_put(umbp_runtime_t *rt, const umbp_put_item_t *items, size_t n, umbp_op_t **out)
{
    if (!rt || !items || !out || n == 0 || n > MAX_BATCH)
        return -EINVAL;
    size_t nranges = 0;
    for (size_t i = 0; i < n; i++) {
        if (check_put_item(&items[i]) < 0)
            return UMBP_E_SHAPE;
        nranges += items[i].num_ranges;
    }
    struct umbp_op *op;
    int rc = take_batch_op(rt, OP_PUT, n, nranges, &op);
    if (rc < 0)
        return rc;
    size_t ri = 0;
    for (size_t k = 0; k < n; k++) {
        fill_key(op, k, &items[k].key, items[k].ranges, items[k].num_ranges, &ri);
        op->reqs[k].size = items[k].object_size;
    }
    return submit_filled(rt, op, MSG_PUT_SUBMIT, out);
}

int umbp_get(umbp_runtime_t *rt, const umbp_get_item_t *items, size_t n, umbp_op_t **out)
{
    if (!rt || !items || !out || n == 0 || n > MAX_BATCH)
        return -EINVAL;
    size_t nranges = 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].num_ranges == 0 || !items[i].ranges)
            return UMBP_E_SHAPE;
        nranges += items[i].num_ranges;
    }
    struct umbp_op *op;
    int rc = take_batch_op(rt, OP_GET, n, nranges, &op);
    if (rc < 0)
        return rc;
    size_t ri = 0;
    for (size_t k = 0; k < n; k++) {
        fill_key(op, k, &items[k].key, items[k].ranges, items[k].num_ranges, &ri);
        if ((rc = check_get_ranges(&op->ranges[op->range_first[k]], items[k].num_ranges)) < 0) {
            op_abandon(op);
            return rc;
        }
    }
    return submit_filled(rt, op, MSG_GET_SUBMIT, out);
}

/* ---- synchronous, bounded helpers ---------------------------------------------- */

/* Posts op and waits up to timeout_ms.  On time-out the handle is released
 * (the op is recycled once it completes) and UMBP_E_TIMEOUT returned. */
static int post_and_wait(struct umbp_runtime *rt, struct umbp_op *op, enum msg_type t,
                         int64_t timeout_ms)
{
    int rc = post_op(rt, op, t);
    if (rc < 0)
        return rc;
    if (op_wait_ns(op, ms_to_ns(timeout_ms)) != 0) {
        CNT_ADD(rt, ops_timed_out, 1);
        return UMBP_E_TIMEOUT;
    }
    return 0;
}

int umbp_lookup(umbp_runtime_t *rt, const umbp_key_t *keys, size_t n, uint8_t *present,
                size_t *prefix_len, unsigned flags)
{
    if (present && n)
        memset(present, 0, n);
    if (prefix_len)
        *prefix_len = 0;
    if (!rt || (!keys && n) || n > MAX_BATCH || (flags & ~(unsigned)UMBP_LOOKUP_TOUCH))
        return -EINVAL;
    if (n == 0)
        return 0;
    /* while an earlier lookup is stuck in a stalled backend, miss at once */
    if (atomic_load_explicit(&rt->lookup_stuck, memory_order_relaxed))
        return UMBP_E_NOT_ATTEMPTED;
    struct umbp_op *op;
    int rc = take_op(rt, OP_LOOKUP, n, 0, &op);
    if (rc < 0)
        return rc;
    for (size_t k = 0; k < n; k++)
        op->reqs[k].key = keys[k];
    op->flags = flags;
    /* with a local tier and the loop asleep, answer here: waking the loop
     * thread costs more than the lookup (tens of us, over 100 on some VMs) */
    if (lookup_run_inline(rt, op))
        rc = op_wait_ns(op, ms_to_ns(rt->core->lookup_timeout_ms)) == 0 ? 0 : UMBP_E_TIMEOUT;
    else
        rc = post_and_wait(rt, op, MSG_LOOKUP, rt->core->lookup_timeout_ms);
    if (rc == -EAGAIN)
        return rc; /* never posted; the op is already back in the pool */
    if (rc == UMBP_E_TIMEOUT) {
        atomic_store(&rt->lookup_stuck, true);
        if (umbp_op_test(op) == 0) /* it finished meanwhile: not stuck */
            atomic_store(&rt->lookup_stuck, false);
    } else if (rc == 0) {
        rc = op->rc;
        if (rc == 0) {
            if (present)
                memcpy(present, op->present, n);
            if (prefix_len)
                *prefix_len = op->prefix;
        }
    }
    op_put_ref(op);
    return rc;
}

/* A control call: one op through the loop, waited for up to timeout_ms.
 * On success the op's result is op->rc (and, for stats, op->stats). */
static int control_call(struct umbp_runtime *rt, enum op_kind kind, enum msg_type t,
                        int64_t timeout_ms, umbp_stats_t *stats)
{
    struct umbp_op *op;
    int rc = take_op(rt, kind, 0, 0, &op);
    if (rc < 0)
        return rc;
    rc = post_and_wait(rt, op, t, timeout_ms);
    if (rc == -EAGAIN)
        return rc; /* never posted; already back in the pool */
    if (rc == 0) {
        rc = op->rc;
        if (stats)
            *stats = op->stats;
    }
    op_put_ref(op);
    return rc;
}

int umbp_get_stats(umbp_runtime_t *rt, umbp_stats_t *out)
{
    if (!rt || !out)
        return -EINVAL;
    return control_call(rt, OP_STATS, MSG_STATS, rt->core->lookup_timeout_ms, out);
}

int umbp_clear(umbp_runtime_t *rt)
{
    if (!rt)
        return -EINVAL;
    return control_call(rt, OP_CLEAR, MSG_CLEAR, rt->core->timeout_ms, NULL);
}

int umbp_flush(umbp_runtime_t *rt, int timeout_ms)
{
    if (!rt)
        return -EINVAL;
    return control_call(rt, OP_FLUSH, MSG_FLUSH,
                        timeout_ms < 0 ? rt->core->timeout_ms : timeout_ms, NULL);
}
