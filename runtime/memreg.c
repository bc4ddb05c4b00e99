/*
 * memreg.c - registered memory regions.
 *
 * Host regions only: device memory is refused with -ENOTSUP, since GPU KV
 * caches are registered by shape with umbp_kv_register and moved by the GPU
 * copy engine.  Ranges of puts and gets are always treated as host memory.
 * Each region is handed to the tier (its mem_register member: a tier that
 * moves bytes with a NIC registers it there once, off the critical path);
 * a tier without one has nothing to do, and the tier's failure fails the
 * registration.  Any thread; a mutex guards the sorted array and is held
 * across the tier's calls, which may block (registration is rare), so the
 * tier never sees two at once.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"
#include "tier_call.h"

static size_t find_first_end_after(struct memreg *r, uintptr_t p)
{
    size_t lo = 0, hi = r->n; /* first entry with end > p */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r->v[mid].end <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int umbp_mem_register(umbp_runtime_t *rt, const umbp_mem_desc_t *d, umbp_mem_handle_t *out)
{
    if (!rt || !d || !out || !d->addr || d->len == 0 ||
        (uintptr_t)d->addr + d->len < (uintptr_t)d->addr)
        return -EINVAL;
    if (d->kind != UMBP_MEM_HOST && d->kind != UMBP_MEM_DEVICE)
        return -EINVAL;
    if (d->kind == UMBP_MEM_DEVICE) {
        umbp_log(UMBP_LOG_ERROR, "umbp_mem_register: device memory needs the GPU copy engine, "
                 "which this runtime does not have");
        return -ENOTSUP;
    }
    struct memreg *r = &rt->memreg;
    uintptr_t s = (uintptr_t)d->addr, e = s + d->len;
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    size_t i = find_first_end_after(r, s);
    if (i < r->n && r->v[i].start < e) {
        rc = -EEXIST;
        goto out;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        struct memreg_entry *v = realloc(r->v, cap * sizeof(*v));
        if (!v) {
            rc = -ENOMEM;
            goto out;
        }
        r->v = v;
        r->cap = cap;
    }
    void *th;
    rc = tier_mem_register(rt->tier, d->addr, d->len, d->kind, d->device, &th);
    if (rc < 0 && rc != -ENOTSUP) {
        umbp_set_error("umbp_mem_register: tier %s could not register %zu bytes at %p: %s",
                       rt->tier_name, d->len, d->addr, umbp_strerror(rc));
        goto out;
    }
    memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof(*r->v));
    r->v[i] = (struct memreg_entry){s, e, d->kind, d->device, ++r->next_handle, rc == 0, th};
    rc = 0;
    r->n++;
    *out = r->v[i].handle;
out:
    pthread_mutex_unlock(&r->lock);
    return rc;
}

int umbp_mem_deregister(umbp_runtime_t *rt, umbp_mem_handle_t h)
{
    if (!rt)
        return -EINVAL;
    struct memreg *r = &rt->memreg;
    int rc = -ENOENT;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->n; i++) {
        if (r->v[i].handle != h)
            continue;
        if (r->v[i].in_tier)
            tier_mem_deregister(rt->tier, r->v[i].tier_handle);
        memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof(*r->v));
        r->n--;
        rc = 0;
        break;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

void memreg_fini(struct umbp_runtime *rt)
{
    struct memreg *r = &rt->memreg;
    for (size_t i = 0; rt->tier && i < r->n; i++)
        if (r->v[i].in_tier)
            tier_mem_deregister(rt->tier, r->v[i].tier_handle);
    r->n = 0;
}
