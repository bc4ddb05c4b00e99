/*
 * sync.h - the futex call and the spin hint shared by the runtime's waiters
 * (op handles, the copy workers, the parallel-for helpers).
 */
#ifndef UMBP_RUNTIME_SYNC_H
#define UMBP_RUNTIME_SYNC_H

#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* FUTEX_WAIT_PRIVATE / FUTEX_WAKE_PRIVATE on a 32-bit atomic; ts NULL: no
 * timeout (relative, as FUTEX_WAIT takes it). */
static inline long umbp_futex(_Atomic uint32_t *addr, int op, uint32_t val,
                              const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* One iteration's worth of "still spinning" for the CPU. */
static inline void umbp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("pause" ::: "memory");
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

#endif
