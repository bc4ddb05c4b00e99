/*
 * pool.h - the dram tier's host memory: one mapping of capacity bytes.
 *
 * Anonymous, or a memfd / POSIX shared-memory object when shared; huge
 * pages when asked and available (else 4 KiB pages and one warning); bound
 * to a NUMA node before first touch; optionally prefaulted.  Created and
 * destroyed on the runtime's creating thread; the loop thread only reads
 * the fields.
 *
 * A named pool has exactly one live owner: its creator (a server, or an
 * embedded runtime with dram_shm_name) holds an exclusive flock on
 * /dev/shm/<name>.owner (which holds the owner's pid) for the pool's whole
 * life.  The kernel drops the lock when the owner dies, so
 * a server restarted after kill -9 adopts the pool, while a second server
 * started on a live pool is refused naming dram_shm_name and the owner's
 * pid (two allocators in one pool would hand out the same bytes twice).
 * A server's lock file stays (its pool does); an embedded runtime's pool
 * takes its lock file along, unlinking it while still locked, and every
 * locker checks that the file it locked is still the one at the path (two
 * openers must never lock two different inodes).
 */
#ifndef UMBP_DRAM_POOL_H
#define UMBP_DRAM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DRAM_SHM_NAME_MAX 256 /* dram_shm_name's capacity, NUL included */

struct dram_pool_params {
    uint64_t capacity;      /* bytes; rounded up to the page size in use */
    bool shared;            /* memfd or shm_open + MAP_SHARED */
    const char *shm_name;   /* shared only: "" or NULL for memfd */
    bool hugepages;
    uint64_t hugepage_size; /* 2 MiB or 1 GiB */
    int numa_node;          /* -1: no binding */
    bool prefault;
    bool persistent;        /* named only: open the pool if it exists (a
                               restarted server adopts it) and leave it in
                               /dev/shm at destroy */
};

struct dram_pool {
    void *base;
    uint64_t size;      /* mapped bytes, a multiple of page_size */
    uint64_t page_size; /* in use: 4 KiB or the huge page size */
    bool hugepages;     /* huge pages in use */
    int fd;             /* memfd or shm descriptor; -1 when anonymous */
    int owner_fd;       /* named: /dev/shm/<name>.owner, flock'ed for
                           the pool's whole life (its one live owner); -1 */
    char shm_path[DRAM_SHM_NAME_MAX + 1]; /* "/name" unlinked at destroy */
    bool adopted;       /* persistent: the named pool existed and was opened */
    bool persistent;    /* leave it in /dev/shm at destroy */
    char warning[512];  /* the huge-page fallback warning, "" if none */
};

/* Maps the pool.  On failure writes a message naming the option at fault
 * and the fix into err and returns a negative errno. */
int dram_pool_create(const struct dram_pool_params *p, struct dram_pool **out,
                     char *err, size_t errlen);
/* Unmaps, closes and unlinks everything. */
void dram_pool_destroy(struct dram_pool *pool);

#endif /* UMBP_DRAM_POOL_H */
