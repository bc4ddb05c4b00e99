/*
 * journal.c - object records of a named pool in /dev/shm/<name>.meta (see
 * journal.h for the states and the commit rule).
 *
 * Layout: a 4 KiB header page, then nslots slots of 64 bytes.  Only the
 * pages of slots in use are ever touched, so a large table costs memory in
 * proportion to the objects stored.  The free list of slots lives in the
 * owner's memory and is rebuilt by scan().
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal.h"

#define JOURNAL_MAGIC 0x4c4e524a50424d55ull /* "UMBPJRNL" */
#define JOURNAL_VERSION 1
#define HDR_BYTES 4096

struct jheader {
    uint64_t magic;
    uint32_t version, slot_size;
    uint64_t nslots, pool_size, pool_id;
    /* the latest hold time of a reservation that found no free slot (0 in
     * tables written before it existed: the same meaning, none) */
    _Atomic uint32_t unrecorded_hold_s;
    /* the inode of the pool file these records describe (0 in tables
     * written before it existed: trusted once, then set): a pool file made
     * anew under an old table is another pool, whatever its name */
    uint64_t pool_ino;
};

struct jslot {
    _Atomic uint32_t state;
    uint32_t hold_s;              /* PENDING: see journal.h; 0 in old tables */
    uint64_t off, size, oid;
    uint8_t key[UMBP_KEY_SIZE];
};
_Static_assert(sizeof(struct jslot) == 64, "journal slots are 64 bytes");

struct dram_journal {
    char path[300];
    int fd;
    void *map;
    size_t map_len;
    struct jheader *hdr;
    struct jslot *slots;
    uint32_t nslots;
    uint32_t *free_list; /* stack of free slot numbers */
    uint32_t nfree;
    bool persistent;
};

static int map_file(struct dram_journal *j, bool create, char *err, size_t errlen)
{
    if (create && ftruncate(j->fd, (off_t)j->map_len) < 0) {
        snprintf(err, errlen, "dram_shm_name: cannot size /dev/shm%s (%s); check /dev/shm's "
                 "size", j->path, strerror(errno));
        return -errno;
    }
    j->map = mmap(NULL, j->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, j->fd, 0);
    if (j->map == MAP_FAILED) {
        j->map = NULL;
        snprintf(err, errlen, "dram_shm_name: cannot map /dev/shm%s (%s)", j->path,
                 strerror(errno));
        return -errno;
    }
    j->hdr = j->map;
    j->slots = (struct jslot *)((char *)j->map + HDR_BYTES);
    return 0;
}

/* An existing table this pool may adopt: same layout, same pool size. */
static bool header_matches(const struct dram_journal *j, uint64_t pool_size)
{
    const struct jheader *h = j->hdr;
    return h->magic == JOURNAL_MAGIC && h->version == JOURNAL_VERSION &&
           h->slot_size == sizeof(struct jslot) && h->nslots == j->nslots &&
           h->pool_size == pool_size;
}

static void reset_free_list(struct dram_journal *j)
{
    j->nfree = 0;
    for (uint32_t s = j->nslots; s-- > 0;)
        if (atomic_load_explicit(&j->slots[s].state, memory_order_acquire) == DRAM_JSLOT_FREE)
            j->free_list[j->nfree++] = s;
}

static uint64_t new_pool_id(void)
{
    uint64_t id = 0;
    while (id == 0 && getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
        ;
    return id;
}

/* The records describe another pool (the pool file was made anew): every
 * record goes first, then the header takes a new id and the new file's
 * inode, so a crash in between leaves a table that still names the old
 * inode and is cleared again. */
static void renew(struct dram_journal *j, uint64_t pool_ino)
{
    for (uint32_t s = 0; s < j->nslots; s++)
        if (atomic_load_explicit(&j->slots[s].state, memory_order_relaxed) != DRAM_JSLOT_FREE)
            atomic_store_explicit(&j->slots[s].state, DRAM_JSLOT_FREE, memory_order_release);
    atomic_thread_fence(memory_order_seq_cst);
    j->hdr->pool_id = new_pool_id();
    atomic_store_explicit(&j->hdr->unrecorded_hold_s, 0, memory_order_relaxed);
    j->hdr->pool_ino = pool_ino;
}

int dram_journal_open(const char *name, uint64_t pool_size, uint32_t nslots, bool persistent,
                      bool pool_new, uint64_t pool_ino, struct dram_journal **out, bool *adopted,
                      uint64_t *pool_id, char *err, size_t errlen)
{
    struct dram_journal *j = calloc(1, sizeof(*j));
    if (!j || !(j->free_list = calloc(nslots ? nslots : 1, sizeof(uint32_t)))) {
        free(j);
        snprintf(err, errlen, "out of memory for the pool's journal");
        return -ENOMEM;
    }
    snprintf(j->path, sizeof(j->path), "/%s.meta", name);
    j->nslots = nslots;
    j->map_len = HDR_BYTES + (size_t)nslots * sizeof(struct jslot);
    j->persistent = persistent;
    j->fd = shm_open(j->path, O_RDWR | O_CLOEXEC, 0600);
    bool existed = j->fd >= 0;
    if (!existed)
        j->fd = shm_open(j->path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    int rc;
    if (j->fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "dram_shm_name: cannot open /dev/shm%s (%s)", j->path,
                 strerror(errno));
        goto fail;
    }
    struct stat st;
    /* a table of no bytes: its creator died before sizing it (the caller
     * holds the pool's owner lock, so no one is creating it now) */
    bool unsized = existed && fstat(j->fd, &st) == 0 && st.st_size == 0;
    if (existed && !unsized && (fstat(j->fd, &st) < 0 || (size_t)st.st_size != j->map_len)) {
        snprintf(err, errlen, "dram_shm_name: /dev/shm%s is not the journal of a pool of "
                 "this size; remove it (and /dev/shm/%s) to start empty", j->path, name);
        rc = -EMEDIUMTYPE;
        goto fail;
    }
    if ((rc = map_file(j, !existed || unsized, err, errlen)) < 0)
        goto fail;
    /* sized but no header yet: its creator died between the two */
    bool blank = unsized || (existed && j->hdr->magic == 0 && j->hdr->version == 0);
    if (existed && !blank && !header_matches(j, pool_size)) {
        snprintf(err, errlen, "dram_shm_name: /dev/shm%s belongs to another pool layout; "
                 "remove it (and /dev/shm/%s) to start empty", j->path, name);
        rc = -EMEDIUMTYPE;
        goto fail;
    }
    bool adopt = existed && !blank && !pool_new &&
                 (j->hdr->pool_ino == 0 || j->hdr->pool_ino == pool_ino);
    if (!existed || blank) {
        j->hdr->pool_ino = pool_ino;
        atomic_store_explicit(&j->hdr->unrecorded_hold_s, 0, memory_order_relaxed);
        j->hdr->pool_id = new_pool_id();
        j->hdr->pool_size = pool_size;
        j->hdr->nslots = nslots;
        j->hdr->slot_size = sizeof(struct jslot);
        j->hdr->version = JOURNAL_VERSION;
        atomic_thread_fence(memory_order_seq_cst);
        j->hdr->magic = JOURNAL_MAGIC; /* last: a table from here on */
    } else if (!adopt) {
        renew(j, pool_ino);
    } else if (j->hdr->pool_ino == 0) {
        j->hdr->pool_ino = pool_ino;
    }
    reset_free_list(j);
    *adopted = adopt;
    *pool_id = j->hdr->pool_id;
    *out = j;
    return 0;
fail:
    if (!existed && j->fd >= 0)
        shm_unlink(j->path);
    j->persistent = true; /* nothing of ours to unlink any more */
    dram_journal_close(j);
    return rc;
}

void dram_journal_close(struct dram_journal *j)
{
    if (!j)
        return;
    if (j->map)
        munmap(j->map, j->map_len);
    if (j->fd >= 0)
        close(j->fd);
    if (!j->persistent)
        shm_unlink(j->path);
    free(j->free_list);
    free(j);
}

int dram_journal_scan(struct dram_journal *j, struct dram_journal_rec **recs, size_t *n)
{
    size_t cap = 64, k = 0;
    struct dram_journal_rec *v = malloc(cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    for (uint32_t s = 0; s < j->nslots; s++) {
        struct jslot *sl = &j->slots[s];
        uint32_t st = atomic_load_explicit(&sl->state, memory_order_acquire);
        if (st != DRAM_JSLOT_PENDING && st != DRAM_JSLOT_PUBLISHED)
            continue;
        if (k == cap) {
            struct dram_journal_rec *w = realloc(v, 2 * cap * sizeof(*v));
            if (!w) {
                free(v);
                return -ENOMEM;
            }
            v = w;
            cap *= 2;
        }
        v[k] = (struct dram_journal_rec){.slot = s, .state = st, .off = sl->off,
                                         .size = sl->size, .oid = sl->oid,
                                         .hold_s = sl->hold_s};
        memcpy(v[k].key.bytes, sl->key, UMBP_KEY_SIZE);
        k++;
    }
    reset_free_list(j);
    *recs = v;
    *n = k;
    return 0;
}

uint32_t dram_journal_claim(struct dram_journal *j)
{
    return j->nfree ? j->free_list[--j->nfree] : DRAM_JOURNAL_NONE;
}

void dram_journal_set_pending(struct dram_journal *j, uint32_t slot, const umbp_key_t *key,
                              uint64_t off, uint64_t size, uint64_t oid, uint32_t hold_s)
{
    struct jslot *sl = &j->slots[slot];
    sl->hold_s = hold_s;
    sl->off = off;
    sl->size = size;
    sl->oid = oid;
    memcpy(sl->key, key->bytes, UMBP_KEY_SIZE);
    /* the record's fields are complete before it claims to be one */
    atomic_store_explicit(&sl->state, DRAM_JSLOT_PENDING, memory_order_release);
}

void dram_journal_set_hold(struct dram_journal *j, uint32_t slot, uint32_t hold_s)
{
    j->slots[slot].hold_s = hold_s;
}

void dram_journal_note_unrecorded(struct dram_journal *j, uint32_t hold_s)
{
    if (hold_s > atomic_load_explicit(&j->hdr->unrecorded_hold_s, memory_order_relaxed))
        atomic_store_explicit(&j->hdr->unrecorded_hold_s, hold_s, memory_order_relaxed);
}

void dram_journal_clear_unrecorded(struct dram_journal *j, uint32_t floor_s)
{
    atomic_store_explicit(&j->hdr->unrecorded_hold_s, floor_s, memory_order_relaxed);
}

uint32_t dram_journal_unrecorded_hold(const struct dram_journal *j)
{
    return atomic_load_explicit(&j->hdr->unrecorded_hold_s, memory_order_relaxed);
}

uint32_t dram_journal_hold_s(uint64_t mono_ns)
{
    uint64_t s = (mono_ns + 999999999ull) / 1000000000ull;
    return s == 0 ? 1 : s > UINT32_MAX ? UINT32_MAX : (uint32_t)s;
}

void dram_journal_set_published(struct dram_journal *j, uint32_t slot)
{
    atomic_store_explicit(&j->slots[slot].state, DRAM_JSLOT_PUBLISHED, memory_order_release);
}

void dram_journal_drop(struct dram_journal *j, uint32_t slot)
{
    atomic_store_explicit(&j->slots[slot].state, DRAM_JSLOT_FREE, memory_order_release);
    j->free_list[j->nfree++] = slot;
}

uint32_t dram_journal_slots(const struct dram_journal *j) { return j->nslots; }
