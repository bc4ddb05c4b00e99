/*
 * records.c - fixed-size records from touched chunks, with a free list
 * (records.h says why).  Free records are linked through their first word.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "records.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define CHUNK_RECORDS 256u

struct chunk {
    struct chunk *next;
    size_t n;
    _Alignas(16) unsigned char recs[];
};

struct dram_records {
    size_t size; /* rounded up to 16 */
    size_t made;
    void *free;
    struct chunk *chunks;
};

int dram_records_create(size_t size, struct dram_records **out)
{
    if (size == 0)
        return -EINVAL;
    struct dram_records *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->size = (size + 15) & ~(size_t)15;
    *out = r;
    return 0;
}

/* A chunk of n records, written once (its pages faulted in now), all on
 * the free list. */
static int chunk_add(struct dram_records *r, size_t n)
{
    if (n > (SIZE_MAX - sizeof(struct chunk)) / r->size)
        return -ENOMEM;
    struct chunk *c = malloc(sizeof(*c) + n * r->size);
    if (!c)
        return -ENOMEM;
    memset(c->recs, 0, n * r->size);
    c->n = n;
    c->next = r->chunks;
    r->chunks = c;
    for (size_t i = n; i-- > 0;) {
        void *rec = c->recs + i * r->size;
        *(void **)rec = r->free;
        r->free = rec;
        POISON(rec, r->size);
    }
    r->made += n;
    return 0;
}

int dram_records_prefill(struct dram_records *r, size_t n)
{
    return n > r->made ? chunk_add(r, n - r->made) : 0;
}

void *dram_records_get(struct dram_records *r)
{
    if (!r->free && chunk_add(r, CHUNK_RECORDS) < 0)
        return NULL;
    void *rec = r->free;
    UNPOISON(rec, r->size);
    r->free = *(void **)rec;
    memset(rec, 0, r->size);
    return rec;
}

void dram_records_put(struct dram_records *r, void *rec)
{
    if (!rec)
        return;
    *(void **)rec = r->free;
    r->free = rec;
    POISON(rec, r->size);
}

void dram_records_destroy(struct dram_records *r)
{
    if (!r)
        return;
    for (struct chunk *c = r->chunks, *next; c; c = next) {
        next = c->next;
        UNPOISON(c->recs, c->n * r->size);
        free(c);
    }
    free(r);
}

size_t dram_records_made(const struct dram_records *r) { return r->made; }
