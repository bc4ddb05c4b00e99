/*
 * par.h - a parallel-for over [0, n) for the API caller's CPU-bound batch
 * work (par.c): fn(ctx, lo, hi) runs on disjoint ranges, on the caller's
 * thread and on up to 3 helper threads, and every range is done when
 * par_for returns.  fn must be safe to run concurrently on disjoint ranges.
 */
#ifndef UMBP_PAR_H
#define UMBP_PAR_H

#include <stddef.h>

typedef void (*par_fn)(void *ctx, size_t lo, size_t hi);

void par_for(size_t n, size_t chunk, par_fn fn, void *ctx);
/* Helper threads (starts them on first use; 0 when the pool is off). */
int par_helpers(void);

#endif
