/*
 * journal.c - object records of a named pool in /dev/shm/<name>.meta (see
 * journal.h for the states and the commit rule).
 *
 * Layout: a 4 KiB header page, then nslots slots of 64 bytes.  Only the
 * pages of slots in use are ever touched, so a large table costs memory in
 * proportion to the objects stored.  The free list of slots lives in the
 * owner's memory and is rebuilt by scan().
 *
 * Version 2 carries a namespace number in the top 16 bits of a record's oid
 * (journal.h); version 1 has 0 there, the default namespace, so its tables
 * are adopted as they are (and become version 2).
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
#include "umbp/tier.h" /* umbp_log */

#define JOURNAL_MAGIC 0x4c4e524a50424d55ull /* "UMBPJRNL" */
#define JOURNAL_VERSION 2
#define JOURNAL_VERSION_NO_NS 1 /* adopted: every record in the default namespace */
#define HDR_BYTES 4096
#define OID_NS_SHIFT 48

/* <name>.ns: this header, then entry i at DRAM_JOURNAL_NS_BYTES * i */
#define NS_MAGIC 0x424154534e504d55ull /* "UMPNSTAB" */
#define NS_VERSION 1
struct nsheader {
    uint64_t magic;
    uint32_t version, entry_size;
    uint64_t pool_id; /* the table describes this pool's records */
    uint8_t zero[40];
};
_Static_assert(sizeof(struct nsheader) == DRAM_JOURNAL_NS_BYTES, "the header is entry 0");

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
    /* namespaces: <name>.ns, opened when a name is first added */
    char ns_shm[300], ns_msg[310]; /* "/<name>.ns", "/dev/shm/<name>.ns" */
    int ns_fd;
    bool ns_ok;                    /* the file has this pool's header */
    bool ns_warned;
    uint32_t ns_next;              /* the next number to give */
    char (*ns_names)[DRAM_JOURNAL_NS_BYTES]; /* DRAM_JOURNAL_MAX_NS, "" unnamed */
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
    return h->magic == JOURNAL_MAGIC &&
           (h->version == JOURNAL_VERSION || h->version == JOURNAL_VERSION_NO_NS) &&
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

int dram_journal_ns_parse(const uint8_t *buf, size_t len, uint64_t pool_id,
                          char (*names)[DRAM_JOURNAL_NS_BYTES], uint32_t max)
{
    const size_t es = DRAM_JOURNAL_NS_BYTES;
    for (uint32_t i = 0; i < max; i++)
        names[i][0] = '\0';
    struct nsheader h;
    if (len < sizeof(h))
        return -1;
    memcpy(&h, buf, sizeof(h));
    if (h.magic != NS_MAGIC || h.version != NS_VERSION || h.entry_size != es ||
        h.pool_id != pool_id)
        return -1;
    int bad = 0;
    for (size_t i = 1; i * es < len; i++) {
        const char *e = (const char *)buf + i * es;
        size_t room = len - i * es < es ? len - i * es : es;
        size_t n = strnlen(e, room), z = n;
        while (z < room && !e[z])
            z++;
        if (n == 0 && z == room)
            continue; /* unused */
        if (n == room || z < room || room < es || i >= max) {
            bad++; /* not terminated, bytes after its NUL, torn, or a number past max */
            continue;
        }
        memcpy(names[i], e, n + 1);
    }
    return bad;
}

static void ns_warn(struct dram_journal *j, const char *what, int e)
{
    if (j->ns_warned)
        return;
    j->ns_warned = true;
    umbp_log(UMBP_LOG_WARN, "pool namespaces %s: %s (%s); objects of namespaces it cannot name "
             "count in the default namespace after a restart", j->ns_msg, what, strerror(e));
}

/* Adopting: the names the pool's table gives its numbers. */
static void ns_load(struct dram_journal *j)
{
    int fd = shm_open(j->ns_shm, O_RDONLY | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno != ENOENT)
            umbp_log(UMBP_LOG_WARN, "pool namespaces %s: cannot open it (%s); adopted objects "
                     "count in the default namespace", j->ns_msg, strerror(errno));
        return;
    }
    const size_t cap = (size_t)DRAM_JOURNAL_MAX_NS * DRAM_JOURNAL_NS_BYTES;
    uint8_t *buf = malloc(cap);
    struct stat st;
    ssize_t got = buf && fstat(fd, &st) == 0 ? pread(fd, buf, cap, 0) : -1;
    int e = errno;
    close(fd);
    if (got < 0) {
        umbp_log(UMBP_LOG_WARN, "pool namespaces %s: cannot read it (%s); adopted objects "
                 "count in the default namespace", j->ns_msg, strerror(e));
        free(buf);
        return;
    }
    /* numbers the file has room for stay taken, named or not */
    uint64_t entries = ((uint64_t)st.st_size + DRAM_JOURNAL_NS_BYTES - 1) / DRAM_JOURNAL_NS_BYTES;
    j->ns_next = entries > DRAM_JOURNAL_MAX_NS ? DRAM_JOURNAL_MAX_NS
               : entries > 1 ? (uint32_t)entries : 1;
    int bad = dram_journal_ns_parse(buf, (size_t)got, j->hdr->pool_id, j->ns_names,
                                    DRAM_JOURNAL_MAX_NS);
    free(buf);
    if (bad < 0)
        umbp_log(UMBP_LOG_WARN, "pool namespaces %s: not this pool's table (%lld bytes); "
                 "adopted objects count in the default namespace", j->ns_msg,
                 (long long)st.st_size);
    else if (bad > 0 || (uint64_t)st.st_size > (uint64_t)got)
        umbp_log(UMBP_LOG_WARN, "pool namespaces %s: %d entries unreadable%s; their objects "
                 "count in the default namespace", j->ns_msg, bad,
                 (uint64_t)st.st_size > (uint64_t)got ? ", the file is longer than any table" : "");
    j->ns_ok = bad >= 0;
}

const char *dram_journal_ns_name(const struct dram_journal *j, uint32_t ns)
{
    return ns > 0 && ns < DRAM_JOURNAL_MAX_NS && j->ns_names[ns][0] ? j->ns_names[ns] : NULL;
}

const char *dram_journal_ns_path(const struct dram_journal *j) { return j->ns_msg; }

int dram_journal_ns_add(struct dram_journal *j, const char *name, uint32_t *ns)
{
    size_t len = strlen(name);
    *ns = 0;
    if (len == 0)
        return 0;
    for (uint32_t i = 1; i < j->ns_next; i++)
        if (strcmp(j->ns_names[i], name) == 0) {
            *ns = i;
            return 0;
        }
    if (len >= DRAM_JOURNAL_NS_BYTES) {
        ns_warn(j, "a namespace name too long for it", ENAMETOOLONG);
        return -ENAMETOOLONG;
    }
    if (j->ns_next >= DRAM_JOURNAL_MAX_NS) {
        ns_warn(j, "every namespace number of the pool is taken", ENOSPC);
        return -ENOSPC;
    }
    if (j->ns_fd < 0 &&
        (j->ns_fd = shm_open(j->ns_shm, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0) {
        int e = errno;
        ns_warn(j, "cannot create it", e);
        return -e;
    }
    if (!j->ns_ok) { /* new, or not this pool's: it starts over, numbers go on */
        struct nsheader h = {.magic = NS_MAGIC, .version = NS_VERSION,
                             .entry_size = DRAM_JOURNAL_NS_BYTES, .pool_id = j->hdr->pool_id};
        if (ftruncate(j->ns_fd, 0) < 0 || pwrite(j->ns_fd, &h, sizeof(h), 0) != sizeof(h)) {
            int e = errno ? errno : EIO;
            ns_warn(j, "cannot write it", e);
            return -e;
        }
        j->ns_ok = true;
    }
    char e[DRAM_JOURNAL_NS_BYTES] = {0};
    memcpy(e, name, len);
    uint32_t n = j->ns_next;
    /* the name is there before any record carries its number */
    if (pwrite(j->ns_fd, e, sizeof(e), (off_t)n * sizeof(e)) != (ssize_t)sizeof(e)) {
        int err = errno ? errno : EIO;
        ns_warn(j, "cannot write it", err);
        return -err;
    }
    memcpy(j->ns_names[n], e, sizeof(e));
    j->ns_next = n + 1;
    *ns = n;
    return 0;
}

int dram_journal_open(const char *name, uint64_t pool_size, uint32_t nslots, bool persistent,
                      bool pool_new, uint64_t pool_ino, struct dram_journal **out, bool *adopted,
                      uint64_t *pool_id, char *err, size_t errlen)
{
    struct dram_journal *j = calloc(1, sizeof(*j));
    if (!j || !(j->free_list = calloc(nslots ? nslots : 1, sizeof(uint32_t))) ||
        !(j->ns_names = calloc(DRAM_JOURNAL_MAX_NS, DRAM_JOURNAL_NS_BYTES))) {
        if (j)
            free(j->free_list);
        free(j);
        snprintf(err, errlen, "out of memory for the pool's journal");
        return -ENOMEM;
    }
    snprintf(j->path, sizeof(j->path), "/%s.meta", name);
    snprintf(j->ns_shm, sizeof(j->ns_shm), "/%s.ns", name);
    snprintf(j->ns_msg, sizeof(j->ns_msg), "/dev/shm%s", j->ns_shm);
    j->ns_fd = -1;
    j->ns_next = 1;
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
    if (adopt)
        ns_load(j);
    else
        shm_unlink(j->ns_shm); /* another pool's names, if any */
    /* records written from now on may carry namespaces (version 1's read as
     * version 2: their top bits are 0) */
    if (j->hdr->version == JOURNAL_VERSION_NO_NS)
        j->hdr->version = JOURNAL_VERSION;
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
    if (j->ns_fd >= 0)
        close(j->ns_fd);
    if (!j->persistent) {
        shm_unlink(j->path);
        shm_unlink(j->ns_shm);
    }
    free(j->ns_names);
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
        uint32_t ns = (uint32_t)(sl->oid >> OID_NS_SHIFT);
        v[k] = (struct dram_journal_rec){.slot = s, .state = st, .off = sl->off,
                                         .size = sl->size, .oid = sl->oid & DRAM_JOURNAL_OID_MAX,
                                         .hold_s = sl->hold_s, .ns = ns};
        /* a number some record carries is never given to another name
         * (one past the table's is never given at all) */
        if (ns >= j->ns_next && ns < DRAM_JOURNAL_MAX_NS)
            j->ns_next = ns + 1;
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
                              uint64_t off, uint64_t size, uint64_t oid, uint32_t hold_s,
                              uint32_t ns)
{
    struct jslot *sl = &j->slots[slot];
    sl->hold_s = hold_s;
    sl->off = off;
    sl->size = size;
    sl->oid = (oid & DRAM_JOURNAL_OID_MAX) | (uint64_t)(ns & 0xffffu) << OID_NS_SHIFT;
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
