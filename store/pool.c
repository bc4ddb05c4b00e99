/*
 * pool.c - maps the dram tier's host memory.
 *
 * Order matters: check the NUMA node, map (huge pages first when asked,
 * then 4 KiB pages with exactly one warning), bind to the node, and only
 * then touch the pages (prefault), so every page is allocated on the node.
 * A pool owns its mapping, its descriptor (memfd or shm) and its shm name;
 * dram_pool_destroy releases all three, in reverse order.
 * Runs on the runtime's creating thread; may block (page faults, mbind).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create, MFD_*, MAP_HUGETLB */
#endif
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "umbp/tier.h"
#include "pool.h"

#ifndef MFD_HUGE_SHIFT
#define MFD_HUGE_SHIFT 26 /* <linux/memfd.h>; glibc's header lacks it */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older glibc lacks the name */
#endif

#define MiB (1024.0 * 1024.0)

/* Why one mapping attempt failed: the call and its errno. */
struct map_failure {
    const char *call;
    int err;
};

static int huge_shift(uint64_t page_size)
{
    return page_size == (1ull << 30) ? 30 : 21;
}

static int open_memfd(uint64_t page_size, bool huge, struct map_failure *f)
{
    unsigned flags = MFD_CLOEXEC;
    int fd;

    if (huge)
        flags |= MFD_HUGETLB | (unsigned)huge_shift(page_size) << MFD_HUGE_SHIFT;
    fd = memfd_create("umbp-dram", flags);
    if (fd < 0)
        *f = (struct map_failure){ "memfd_create", errno };
    return fd;
}

static int open_shm(struct dram_pool *pool, const char *name, bool persistent,
                    struct map_failure *f)
{
    int fd;

    snprintf(pool->shm_path, sizeof(pool->shm_path), "/%s", name);
    if (persistent) {
        fd = shm_open(pool->shm_path, O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0) {
            pool->adopted = true;
            return fd;
        }
    }
    fd = shm_open(pool->shm_path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        *f = (struct map_failure){ "shm_open", errno };
        pool->shm_path[0] = '\0'; /* not ours to unlink */
    }
    return fd;
}

/* One try at the owner lock: -ESTALE when the file locked is no longer
 * the one at the path. */
static int lock_once(struct dram_pool *pool, const char *name, const char *path, char *err,
                     size_t errlen)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, errlen, "dram_shm_name=%s: cannot open the pool's owner lock %s (%s); "
                 "check /dev/shm's permissions or choose another dram_shm_name", name, path,
                 strerror(-rc));
        return rc;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        char pid[24] = "";
        ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(fd);
        if (rc == -EBUSY)
            snprintf(err, errlen, "dram_shm_name=%s: the pool /dev/shm/%s is in use by a live "
                     "process (pid %s), a umbp-server or an embedded runtime; a named pool "
                     "has one owner: stop that process, or give this one another "
                     "dram_shm_name", name, name, pid[0] ? pid : "unknown");
        else
            snprintf(err, errlen, "dram_shm_name=%s: cannot lock %s (%s)", name, path,
                     strerror(-rc));
        return rc;
    }
    struct stat at, held;
    if (fstat(fd, &held) < 0 || stat(path, &at) < 0 || at.st_ino != held.st_ino ||
        at.st_dev != held.st_dev) {
        close(fd);
        snprintf(err, errlen, "dram_shm_name=%s: the pool's owner lock %s kept changing; "
                 "another process is starting or ending on this name", name, path);
        return -ESTALE;
    }
    char pid[24];
    int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        umbp_log(UMBP_LOG_WARN, "dram_shm_name=%s: cannot record this pid in %s (%s)", name,
                 path, strerror(errno));
    pool->owner_fd = fd;
    return 0;
}

/* Takes the one-live-owner lock of a named pool (pool.h): an exclusive
 * flock on /dev/shm/<name>.owner, kept open (close-on-exec, never handed to
 * clients: the pool's own descriptor is a separate open file description)
 * until dram_pool_destroy.  The file then holds our pid, for the message a
 * second owner gets. */
static int take_owner_lock(struct dram_pool *pool, const char *name, char *err, size_t errlen)
{
    char path[DRAM_SHM_NAME_MAX + 32];
    snprintf(path, sizeof(path), "/dev/shm/%s.owner", name);
    for (int tries = 0;; tries++) {
        int rc = lock_once(pool, name, path, err, errlen);
        /* the file we locked was unlinked by its last owner meanwhile (an
         * embedded runtime's, at its end): lock the one at the path now */
        if (rc != -ESTALE || tries == 8)
            return rc == -ESTALE ? -EBUSY : rc;
    }
}

/* One attempt at mapping `size` bytes with pages of page_size (huge or
 * not).  Leaves the pool untouched on failure, except an shm name it
 * created, which stays recorded so destroy unlinks it. */
static int map_once(struct dram_pool *pool, const struct dram_pool_params *p,
                    uint64_t size, uint64_t page_size, bool huge,
                    struct map_failure *f)
{
    int prot = PROT_READ | PROT_WRITE, flags, fd = -1;
    void *base;

    if (p->shared) {
        bool named = p->shm_name && p->shm_name[0];

        fd = named ? open_shm(pool, p->shm_name, p->persistent, f)
                   : open_memfd(page_size, huge, f);
        if (fd < 0)
            return -f->err;
        struct stat st;
        /* a file of no bytes: its creator died before sizing it (we hold the
         * owner lock, so no one else is creating it now): nothing to adopt */
        if (pool->adopted && fstat(fd, &st) == 0 && st.st_size == 0)
            pool->adopted = false;
        if (pool->adopted && (fstat(fd, &st) < 0 || (uint64_t)st.st_size != size)) {
            *f = (struct map_failure){ "adopt", EMEDIUMTYPE };
            pool->size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
            close(fd);
            pool->shm_path[0] = '\0'; /* not ours to unlink */
            return -EMEDIUMTYPE;
        }
        if (!pool->adopted && ftruncate(fd, (off_t)size) < 0) {
            *f = (struct map_failure){ "ftruncate", errno };
            close(fd);
            return -f->err;
        }
        flags = MAP_SHARED;
    } else {
        flags = MAP_PRIVATE | MAP_ANONYMOUS;
        if (huge)
            flags |= MAP_HUGETLB | huge_shift(page_size) << MAP_HUGE_SHIFT;
    }
    base = mmap(NULL, size, prot, flags, fd, 0);
    if (base == MAP_FAILED) {
        *f = (struct map_failure){ "mmap", errno };
        if (fd >= 0)
            close(fd);
        return -f->err;
    }
    /* a shared pool of 4 KiB pages: ask for transparent huge pages, which
     * shmem grants only with shmem_enabled advise or within_size (anonymous
     * memory gets them by default); fewer TLB misses in every copy */
    if (fd >= 0 && !huge)
        madvise(base, size, MADV_HUGEPAGE);
    pool->base = base;
    pool->size = size;
    pool->page_size = page_size;
    pool->hugepages = huge;
    pool->fd = fd;
    return 0;
}

static void warn_no_hugepages(struct dram_pool *pool,
                              const struct dram_pool_params *p, uint64_t size,
                              const struct map_failure *f)
{
    bool gib = p->hugepage_size == (1ull << 30);
    uint64_t pages = size / p->hugepage_size;

    if (!f)
        snprintf(pool->warning, sizeof(pool->warning),
                 "dram_use_hugepages: POSIX shared memory (dram_shm_name=%s) "
                 "cannot use huge pages; using 4 KiB pages. Leave "
                 "dram_shm_name empty for a huge-page memfd, or set "
                 "dram_use_hugepages=false", p->shm_name);
    else
        snprintf(pool->warning, sizeof(pool->warning),
                 "dram_use_hugepages: cannot map %.0f MiB of %s huge pages "
                 "(%s: %s); using 4 KiB pages. Reserve %llu of them with "
                 "`echo %llu > %s` (as root), or set dram_use_hugepages=false",
                 (double)size / MiB, gib ? "1 GiB" : "2 MiB", f->call,
                 strerror(f->err), (unsigned long long)pages,
                 (unsigned long long)pages,
                 gib ? "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
                     : "/proc/sys/vm/nr_hugepages");
    umbp_log(UMBP_LOG_WARN, "%s", pool->warning);
}

static int round_up(uint64_t n, uint64_t page, uint64_t *out)
{
    if (n == 0 || n > UINT64_MAX - page + 1)
        return -EINVAL;
    *out = (n + page - 1) / page * page;
    return 0;
}

static int map_pool(struct dram_pool *pool, const struct dram_pool_params *p,
                    char *err, size_t errlen)
{
    uint64_t small = (uint64_t)sysconf(_SC_PAGESIZE), size;
    bool named = p->shared && p->shm_name && p->shm_name[0];
    struct map_failure f = { "", 0 };
    int rc;

    if (p->hugepages && !named &&
        round_up(p->capacity, p->hugepage_size, &size) == 0) {
        if (map_once(pool, p, size, p->hugepage_size, true, &f) == 0)
            return 0;
        warn_no_hugepages(pool, p, size, &f);
    } else if (p->hugepages && named) {
        warn_no_hugepages(pool, p, 0, NULL);
    }
    if (round_up(p->capacity, small, &size) < 0) {
        snprintf(err, errlen, "capacity_bytes=%llu cannot be mapped; set "
                 "capacity_bytes (or total_capacity_bytes) to a positive size",
                 (unsigned long long)p->capacity);
        return -EINVAL;
    }
    rc = map_once(pool, p, size, small, false, &f);
    if (rc == -EMEDIUMTYPE)
        snprintf(err, errlen, "dram_shm_name=%s: /dev/shm/%s holds a pool of %llu bytes "
                 "but this config maps %llu; set capacity_bytes to match, or remove the "
                 "file to start empty", p->shm_name, p->shm_name,
                 (unsigned long long)pool->size, (unsigned long long)size);
    else if (rc == -EEXIST && named)
        snprintf(err, errlen, "dram_shm_name=%s: /dev/shm/%s already exists "
                 "(another runtime uses it, or one that crashed left it); "
                 "choose another name or remove the file", p->shm_name,
                 p->shm_name);
    else if (rc < 0)
        snprintf(err, errlen, "dram pool: cannot map %.0f MiB (%s: %s); lower "
                 "capacity_bytes or free memory%s", (double)size / MiB,
                 f.call, strerror(f.err),
                 p->shared ? ", or check /dev/shm's size" : "");
    return rc;
}

static int check_numa_node(int node, char *err, size_t errlen)
{
    bool numa = numa_available() >= 0;
    int max = numa ? numa_max_node() : 0;

    if (node < 0)
        return 0;
    if (node > max || (numa && !numa_bitmask_isbitset(numa_nodes_ptr, node))) {
        snprintf(err, errlen, "dram_numa_node=%d: no such NUMA node (the "
                 "highest is %d); set dram_numa_node to an existing node, or "
                 "-1 for no binding", node, max);
        return -EINVAL;
    }
    return 0;
}

/* Before the first touch, so the pages are allocated on the node. */
static int bind_node(struct dram_pool *pool, int node, char *err,
                     size_t errlen)
{
    struct bitmask *mask;
    int rc = 0;

    if (node < 0 || numa_available() < 0)
        return 0; /* without NUMA support, node 0 is all there is */
    mask = numa_allocate_nodemask();
    if (!mask)
        return -ENOMEM;
    numa_bitmask_setbit(mask, (unsigned)node);
    if (mbind(pool->base, pool->size, MPOL_BIND, mask->maskp, mask->size + 1,
              0) < 0) {
        rc = -errno;
        snprintf(err, errlen, "dram_numa_node=%d: mbind failed (%s); check "
                 "that this process may use the node (cpuset), or set "
                 "dram_numa_node=-1", node, strerror(-rc));
    }
    numa_free_nodemask(mask);
    return rc;
}

static int prefault(struct dram_pool *pool, char *err, size_t errlen)
{
    volatile char *bytes = pool->base;

    if (madvise(pool->base, pool->size, MADV_POPULATE_WRITE) == 0)
        return 0;
    if (errno != EINVAL) {
        int rc = -errno;

        snprintf(err, errlen, "dram_prefault: cannot populate %.0f MiB (%s); "
                 "lower capacity_bytes, free memory, or set "
                 "dram_prefault=false", (double)pool->size / MiB,
                 strerror(-rc));
        return rc;
    }
    /* Kernels before 5.14: touch one byte per page. */
    for (uint64_t off = 0; off < pool->size; off += pool->page_size)
        bytes[off] = 0;
    return 0;
}

int dram_pool_create(const struct dram_pool_params *p, struct dram_pool **out,
                     char *err, size_t errlen)
{
    struct dram_pool *pool;
    int rc;

    rc = check_numa_node(p->numa_node, err, errlen);
    if (rc < 0)
        return rc;
    pool = calloc(1, sizeof(*pool));
    if (!pool) {
        snprintf(err, errlen, "dram pool: out of memory");
        return -ENOMEM;
    }
    pool->fd = -1;
    pool->owner_fd = -1;
    bool named = p->shared && p->shm_name && p->shm_name[0];
    pool->persistent = p->persistent && named;
    /* every creator of a named pool holds its owner lock, an embedded runtime
     * too: a server must never adopt a pool a live runtime allocates from */
    rc = named ? take_owner_lock(pool, p->shm_name, err, errlen) : 0;
    if (rc == 0)
        rc = map_pool(pool, p, err, errlen);
    if (rc == 0)
        rc = bind_node(pool, p->numa_node, err, errlen);
    if (rc == 0 && p->prefault && !pool->adopted) /* adopted pages hold objects */
        rc = prefault(pool, err, errlen);
    if (rc < 0) {
        dram_pool_destroy(pool);
        return rc;
    }
    *out = pool;
    return 0;
}

void dram_pool_destroy(struct dram_pool *pool)
{
    if (!pool)
        return;
    if (pool->base)
        munmap(pool->base, pool->size);
    if (pool->fd >= 0)
        close(pool->fd);
    if (pool->shm_path[0] && !pool->persistent) {
        shm_unlink(pool->shm_path);
        /* a pool that ends with its owner takes its lock file along, unlinked
         * while still locked: a later locker checks that the file it locked
         * is the one at the path (lock_once) */
        if (pool->owner_fd >= 0) {
            char owner[DRAM_SHM_NAME_MAX + 32];
            snprintf(owner, sizeof(owner), "/dev/shm%s.owner", pool->shm_path);
            unlink(owner);
        }
    }
    if (pool->owner_fd >= 0)
        close(pool->owner_fd); /* last: the next owner may adopt from here on */
    free(pool);
}
