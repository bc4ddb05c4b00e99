/*
 * bench_proc.h - what the benchmarks read of another process in /proc: its
 * CPU time (the master's or a server's share of a run).  Header only.
 */
#ifndef UMBP_BENCH_PROC_H
#define UMBP_BENCH_PROC_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* utime + stime of pid in ns (at the clock tick's resolution), or 0 */
static inline uint64_t proc_cpu_ns(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    /* after ")": state (3), then fields 4 .. 13, then utime (14), stime (15) */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                     &st) != 2)
        return 0;
    return (ut + st) * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
}

#endif
