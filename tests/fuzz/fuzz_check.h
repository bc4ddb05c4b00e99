/*
 * fuzz_check.h - the one property check of every libFuzzer target: a
 * broken property prints where and what, then aborts (libFuzzer keeps the
 * input).  Header only; included by each target and by fuzz_common.h.
 */
#ifndef UMBP_FUZZ_CHECK_H
#define UMBP_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FZ_CHECK(cond)                                                              \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: property broken: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                \
        }                                                                           \
    } while (0)

#endif
