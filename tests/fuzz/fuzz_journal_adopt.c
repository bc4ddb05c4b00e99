/*
 * fuzz_journal_adopt.c - libFuzzer target of the one decoder of bytes that
 * another process wrote and this one trusts at start: a named pool's
 * journal (/dev/shm/<name>.meta, store/journal.h), which a restarted
 * umbp-server adopts.  The input is the journal's slot area (64-byte slots
 * after the 4 KiB header) and, when its first byte is odd, also the
 * header's bytes; when its first byte has bit 1, also the entries of the
 * namespace table (<name>.ns, after a header naming this pool) that the
 * records' namespace numbers refer to; the pool file exists and has the
 * right size.
 *
 * Properties (abort() when broken):
 *   - the store opens, or refuses with a negative code and a message;
 *   - adopted objects are findable, hold a lease, and lie inside the pool;
 *   - its counters add up: objects == adopted, each object in one
 *     namespace (the per-namespace objects and bytes sum to the store's),
 *     and after evicting
 *     everything and adopt_finish nothing is used;
 *   - the adopted store keeps working: a reserve and publish succeed.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "journal.h"
#include "store.h"
#include "fuzz_check.h"

#define CAP (1u << 20)
#define SLOTS 64
#define HDR 4096
#define NS_ENTRIES 4 /* of the namespace table, after its header */

static char name[64];

/* The owner's numbering: a name's first byte picks one of 4 namespaces. */
static const char *ns_name_cb(void *ctx, unsigned ns)
{
    (void)ctx;
    static const char *const names[] = {"", "n1", "n2", "n3"};
    return ns < 4 ? names[ns] : NULL;
}

static unsigned ns_of_name_cb(void *ctx, const char *nm)
{
    (void)ctx;
    FZ_CHECK(nm && nm[0] && strlen(nm) < DRAM_JOURNAL_NS_BYTES);
    return (unsigned char)nm[0] % 4;
}

static struct dram_store *open_store(char *err, size_t errlen)
{
    struct dram_store_params p = {
        .pool = {.capacity = CAP, .shared = true, .shm_name = name, .hugepage_size = 2u << 20,
                 .numa_node = -1, .persistent = true},
        .capacity = CAP, .high_watermark = 0.9, .low_watermark = 0.7, .journal_slots = SLOTS,
        .ns_name = ns_name_cb, .ns_of_name = ns_of_name_cb,
    };
    struct dram_store *s = NULL;
    return dram_store_create(&p, &s, err, errlen) == 0 ? s : NULL;
}

static void cleanup(void)
{
    char p[96];
    snprintf(p, sizeof(p), "/%s", name);
    shm_unlink(p);
    snprintf(p, sizeof(p), "/%s.meta", name);
    shm_unlink(p);
    snprintf(p, sizeof(p), "/%s.owner", name);
    shm_unlink(p);
    snprintf(p, sizeof(p), "/%s.ns", name);
    shm_unlink(p);
}

/* Once: a pool and an empty journal of the right sizes, left in /dev/shm. */
static void setup(void)
{
    snprintf(name, sizeof(name), "umbp-fuzz-journal-%d", (int)getpid());
    cleanup();
    atexit(cleanup);
    char err[256];
    struct dram_store *s = open_store(err, sizeof(err));
    if (!s) {
        fprintf(stderr, "fuzz_journal_adopt: %s\n", err);
        abort();
    }
    dram_store_destroy(s);
}

static void write_journal(const uint8_t *data, size_t size, const uint8_t *hdr_saved)
{
    char mp[96];
    snprintf(mp, sizeof(mp), "/%s.meta", name);
    int fd = shm_open(mp, O_RDWR, 0600);
    FZ_CHECK(fd >= 0);
    size_t len = HDR + SLOTS * 64;
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    FZ_CHECK(m != MAP_FAILED);
    memcpy(m, hdr_saved, HDR); /* a valid header unless the input says otherwise */
    memset(m + HDR, 0, SLOTS * 64);
    bool header = size && (data[0] & 1), ns = size && (data[0] & 2);
    char p[96];
    if (size) {
        data++, size--;
    }
    if (header) {
        size_t h = size < 48 ? size : 48;
        memcpy(m, data, h);
        data += h, size -= h;
    }
    /* the namespace table: this pool's header (or none), then the input */
    snprintf(p, sizeof(p), "/%s.ns", name);
    shm_unlink(p);
    if (ns) {
        uint8_t t[DRAM_JOURNAL_NS_BYTES * (1 + NS_ENTRIES)] = {0};
        uint64_t magic = 0x424154534e504d55ull, pool_id;
        uint32_t ver = 1, es = DRAM_JOURNAL_NS_BYTES;
        /* the journal header's pool id: after magic, version, slot size,
         * nslots and pool size */
        memcpy(&pool_id, m + 32, 8);
        memcpy(t, &magic, 8);
        memcpy(t + 8, &ver, 4);
        memcpy(t + 12, &es, 4);
        memcpy(t + 16, &pool_id, 8);
        size_t e = sizeof(t) - DRAM_JOURNAL_NS_BYTES;
        e = size < e ? size : e;
        memcpy(t + DRAM_JOURNAL_NS_BYTES, data, e);
        data += e, size -= e;
        int nfd = shm_open(p, O_CREAT | O_RDWR, 0600);
        FZ_CHECK(nfd >= 0);
        size_t len_ns = DRAM_JOURNAL_NS_BYTES + e;
        FZ_CHECK(write(nfd, t, len_ns) == (ssize_t)len_ns);
        close(nfd);
    }
    memcpy(m + HDR, data, size < SLOTS * 64 ? size : SLOTS * 64);
    munmap(m, len);
}

static void check_adopted(struct dram_store *s)
{
    struct dram_store_adoption a;
    dram_store_adoption(s, &a);
    struct umbp_tier_usage u;
    dram_store_usage(s, &u);
    FZ_CHECK(u.num_objects == a.objects);
    FZ_CHECK(u.used_bytes <= u.capacity_bytes);
    FZ_CHECK(a.objects + a.held_pending + a.dropped <= SLOTS);
    FZ_CHECK(a.unnamed <= a.objects + a.held_pending);
    uint64_t ns_objects = 0, ns_used = 0;
    for (unsigned n = 0; n < DRAM_STORE_MAX_NS; n++) {
        struct dram_store_ns_usage nu;
        dram_store_ns_usage(s, n, &nu);
        FZ_CHECK(n < 4 || (nu.objects == 0 && nu.used_bytes == 0));
        ns_objects += nu.objects;
        ns_used += nu.used_bytes;
    }
    FZ_CHECK(ns_objects == a.objects && ns_used == u.used_bytes);
    /* every adopted object: found, leased, inside the pool */
    const struct dram_pool *pool = dram_store_pool(s);
    char p[96];
    snprintf(p, sizeof(p), "/%s.meta", name);
    int fd = shm_open(p, O_RDONLY, 0600);
    FZ_CHECK(fd >= 0);
    uint8_t *m = mmap(NULL, HDR + SLOTS * 64, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    FZ_CHECK(m != MAP_FAILED);
    uint64_t found = 0;
    for (int i = 0; i < SLOTS; i++) {
        const uint8_t *sl = m + HDR + (size_t)i * 64;
        uint32_t state;
        memcpy(&state, sl, 4);
        if (state != 2) /* PUBLISHED */
            continue;
        umbp_key_t k;
        memcpy(k.bytes, sl + 32, UMBP_KEY_SIZE);
        struct dram_store_region r;
        if (dram_store_acquire(s, &k, 0, 1000000000ull, &r) != 0)
            continue; /* a record that was dropped (or a duplicate key's) */
        FZ_CHECK(r.size > 0 && r.offset < pool->size && r.size <= pool->size - r.offset);
        uint64_t freed = 0;
        FZ_CHECK(dram_store_release(s, r.token, &freed) == 0);
        found++;
    }
    munmap(m, HDR + SLOTS * 64);
    FZ_CHECK(found == a.objects);
    bool more;
    dram_store_evict(s, 0, 0, SIZE_MAX, &more);
    dram_store_adopt_finish(s);
    dram_store_usage(s, &u);
    FZ_CHECK(u.used_bytes == 0 && u.num_objects == 0 && u.num_pending == 0);
    umbp_key_t k = {{0xfe}};
    struct dram_store_region r;
    FZ_CHECK(dram_store_reserve(s, &k, 4096, &r) == 0);
    FZ_CHECK(dram_store_publish(s, &k, r.token) == 0);
    k.bytes[1] = 1; /* and in a namespace: its name goes into the table */
    FZ_CHECK(dram_store_reserve_ns(s, &k, 4096, 1, &r) == 0);
    FZ_CHECK(dram_store_publish(s, &k, r.token) == 0);
}

/* The input as a whole <name>.ns file (its header's pool id read back
 * from bytes 16..23, so the header can match): the decoder reads inside
 * len only (ASan: an exact copy on the heap), and fills each of max names
 * with "" or a NUL-terminated name of at most 63 bytes. */
static void parse_ns_table(const uint8_t *data, size_t size)
{
    enum { MAX = 8 };
    uint8_t *buf = malloc(size ? size : 1);
    char (*names)[DRAM_JOURNAL_NS_BYTES] = malloc(MAX * sizeof(*names));
    FZ_CHECK(buf && names);
    memcpy(buf, data, size);
    memset(names, 'x', MAX * sizeof(*names));
    uint64_t pool = 0;
    if (size >= 24)
        memcpy(&pool, data + 16, sizeof(pool));
    int bad = dram_journal_ns_parse(buf, size, pool, names, MAX);
    FZ_CHECK(bad >= -1 && (size_t)(bad < 0 ? 0 : bad) <= size / DRAM_JOURNAL_NS_BYTES + 1);
    for (int i = 0; i < MAX; i++)
        FZ_CHECK(memchr(names[i], 0, DRAM_JOURNAL_NS_BYTES) != NULL);
    if (bad < 0)
        for (int i = 0; i < MAX; i++)
            FZ_CHECK(names[i][0] == 0); /* not this pool's table: nothing named */
    free(names);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t hdr[HDR];
    if (!name[0]) {
        setup();
        char p[96];
        snprintf(p, sizeof(p), "/%s.meta", name);
        int fd = shm_open(p, O_RDONLY, 0600);
        FZ_CHECK(fd >= 0 && pread(fd, hdr, HDR, 0) == HDR);
        close(fd);
    }
    parse_ns_table(data, size);
    write_journal(data, size, hdr);
    char err[512] = "";
    struct dram_store *s = open_store(err, sizeof(err));
    if (!s) {
        FZ_CHECK(err[0]); /* refused, saying why */
        return 0;
    }
    check_adopted(s);
    dram_store_destroy(s);
    return 0;
}
