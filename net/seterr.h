/*
 * seterr.h - the error-message helper of net/: formats into a caller's
 * (err, errlen) buffer, which may be NULL or empty.  Header only, so every
 * net/ file (and a fuzz target that compiles one of them alone) has it.
 */
#ifndef UMBP_NET_SETERR_H
#define UMBP_NET_SETERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void net_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void net_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || !errlen)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

#endif
