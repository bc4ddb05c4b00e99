/*
 * alloc.c - best-fit allocator with immediate coalescing for the dram pool.
 *
 * The range [0, capacity) is cut into blocks, each described by a struct
 * dram_block kept outside the pool (from records.h, so a block taken while
 * the pool fills does not fault in a heap page).  Invariants:
 *   - every block is on the address list (prev/next), which tiles the range
 *     exactly: the first block starts at 0, each next one where its
 *     predecessor ends, the last one ends at capacity;
 *   - no two neighbours on the address list are both free (freeing merges);
 *   - a free block is in the free tree, ordered by (len, off), so the best
 *     fit is one descent; a used block is in the used tree, ordered by off,
 *     so a free of an unknown offset is detected instead of corrupting;
 *   - both trees are AVL trees, so every operation is O(log n) in the number
 *     of blocks.
 * Single-threaded: owned by the tier, i.e. the runtime's loop thread.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "alloc.h"
#include "records.h"

struct dram_block {
    uint64_t off, len;
    struct dram_block *prev, *next;  /* neighbours in address order */
    struct dram_block *left, *right; /* children in the tree holding it */
    int height;
    bool free;
};

struct dram_alloc {
    struct dram_records *recs;    /* the blocks' records (records.h) */
    uint64_t capacity, used;
    size_t nfree;
    struct dram_block *first;     /* address list */
    struct dram_block *free_root; /* by (len, off) */
    struct dram_block *used_root; /* by off */
};

typedef int (*block_cmp_fn)(const struct dram_block *, const struct dram_block *);

static int cmp_u64(uint64_t a, uint64_t b)
{
    return a < b ? -1 : a > b;
}

static int cmp_free(const struct dram_block *a, const struct dram_block *b)
{
    int c = cmp_u64(a->len, b->len);
    return c ? c : cmp_u64(a->off, b->off);
}

static int cmp_used(const struct dram_block *a, const struct dram_block *b)
{
    return cmp_u64(a->off, b->off);
}

/* ---- AVL tree over struct dram_block (left/right/height) -------------- */

static int height(const struct dram_block *b)
{
    return b ? b->height : 0;
}

static void update_height(struct dram_block *b)
{
    int hl = height(b->left), hr = height(b->right);
    b->height = 1 + (hl > hr ? hl : hr);
}

static struct dram_block *rotate_right(struct dram_block *y)
{
    struct dram_block *x = y->left;
    y->left = x->right;
    x->right = y;
    update_height(y);
    update_height(x);
    return x;
}

static struct dram_block *rotate_left(struct dram_block *x)
{
    struct dram_block *y = x->right;
    x->right = y->left;
    y->left = x;
    update_height(x);
    update_height(y);
    return y;
}

static struct dram_block *rebalance(struct dram_block *b)
{
    int balance;

    update_height(b);
    balance = height(b->left) - height(b->right);
    if (balance > 1) {
        if (height(b->left->left) < height(b->left->right))
            b->left = rotate_left(b->left);
        return rotate_right(b);
    }
    if (balance < -1) {
        if (height(b->right->right) < height(b->right->left))
            b->right = rotate_right(b->right);
        return rotate_left(b);
    }
    return b;
}

static struct dram_block *tree_insert(struct dram_block *root,
                                      struct dram_block *n, block_cmp_fn cmp)
{
    if (!root) {
        n->left = n->right = NULL;
        n->height = 1;
        return n;
    }
    if (cmp(n, root) < 0)
        root->left = tree_insert(root->left, n, cmp);
    else
        root->right = tree_insert(root->right, n, cmp);
    return rebalance(root);
}

static struct dram_block *tree_pop_min(struct dram_block *root,
                                       struct dram_block **min)
{
    if (!root->left) {
        *min = root;
        return root->right;
    }
    root->left = tree_pop_min(root->left, min);
    return rebalance(root);
}

/* Keys are unique (off is), so cmp == 0 means root is n itself. */
static struct dram_block *tree_remove(struct dram_block *root,
                                      const struct dram_block *n,
                                      block_cmp_fn cmp)
{
    struct dram_block *succ;
    int c;

    if (!root)
        return NULL;
    c = cmp(n, root);
    if (c < 0) {
        root->left = tree_remove(root->left, n, cmp);
    } else if (c > 0) {
        root->right = tree_remove(root->right, n, cmp);
    } else {
        if (!root->right)
            return root->left;
        struct dram_block *rest = tree_pop_min(root->right, &succ);
        succ->left = root->left;
        succ->right = rest;
        return rebalance(succ);
    }
    return rebalance(root);
}

/* The free block with the smallest (len, off) such that len >= want. */
static struct dram_block *best_fit(struct dram_block *b, uint64_t want)
{
    struct dram_block *best = NULL;

    while (b) {
        if (b->len >= want) {
            best = b;
            b = b->left;
        } else {
            b = b->right;
        }
    }
    return best;
}

static struct dram_block *find_used(struct dram_block *b, uint64_t off)
{
    while (b && b->off != off)
        b = off < b->off ? b->left : b->right;
    return b;
}

/* ---- blocks ----------------------------------------------------------- */

static void free_insert(struct dram_alloc *a, struct dram_block *b)
{
    b->free = true;
    a->free_root = tree_insert(a->free_root, b, cmp_free);
    a->nfree++;
}

static void free_remove(struct dram_alloc *a, struct dram_block *b)
{
    a->free_root = tree_remove(a->free_root, b, cmp_free);
    a->nfree--;
}

/* Removes b from the address list (its bytes now belong to a neighbour). */
static void block_unlink(struct dram_alloc *a, struct dram_block *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        a->first = b->next;
    if (b->next)
        b->next->prev = b->prev;
    dram_records_put(a->recs, b);
}

/* Puts `tail` on the address list right after b, carved off b's end. */
static void block_split(struct dram_block *b, struct dram_block *tail,
                        uint64_t keep)
{
    tail->off = b->off + keep;
    tail->len = b->len - keep;
    tail->prev = b;
    tail->next = b->next;
    if (b->next)
        b->next->prev = tail;
    b->next = tail;
    b->len = keep;
}

int dram_alloc_create(uint64_t capacity, struct dram_alloc **out)
{
    struct dram_alloc *a;
    struct dram_block *b;

    capacity &= ~(uint64_t)(DRAM_ALLOC_ALIGN - 1);
    if (capacity == 0)
        return -EINVAL;
    a = calloc(1, sizeof(*a));
    if (!a || dram_records_create(sizeof(*b), &a->recs) < 0 ||
        !(b = dram_records_get(a->recs))) {
        dram_alloc_destroy(a);
        return -ENOMEM;
    }
    a->capacity = capacity;
    b->len = capacity;
    a->first = b;
    free_insert(a, b);
    *out = a;
    return 0;
}

/* Appends a block [off, off + len) at the end of the address list. */
static int append_block(struct dram_alloc *a, struct dram_block **last, uint64_t off,
                        uint64_t len, bool is_free)
{
    struct dram_block *b = dram_records_get(a->recs);
    if (!b)
        return -ENOMEM;
    b->off = off;
    b->len = len;
    b->prev = *last;
    if (*last)
        (*last)->next = b;
    else
        a->first = b;
    *last = b;
    if (is_free) {
        free_insert(a, b);
    } else {
        b->free = false;
        a->used_root = tree_insert(a->used_root, b, cmp_used);
        a->used += len;
    }
    return 0;
}

int dram_alloc_create_used(uint64_t capacity, const struct dram_alloc_range *used, size_t n,
                           struct dram_alloc **out)
{
    capacity &= ~(uint64_t)(DRAM_ALLOC_ALIGN - 1);
    if (capacity == 0)
        return -EINVAL;
    uint64_t end = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = used[i].size ? dram_alloc_round(used[i].size) : 0;
        if (!len || used[i].off % DRAM_ALLOC_ALIGN || used[i].off < end ||
            used[i].off > capacity || len > capacity - used[i].off)
            return -EINVAL; /* unsorted, overlapping, misaligned or outside */
        end = used[i].off + len;
    }
    struct dram_alloc *a = calloc(1, sizeof(*a));
    if (!a || dram_records_create(sizeof(struct dram_block), &a->recs) < 0) {
        free(a);
        return -ENOMEM;
    }
    a->capacity = capacity;
    struct dram_block *last = NULL;
    uint64_t at = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (used[i].off > at)
            rc = append_block(a, &last, at, used[i].off - at, true);
        if (rc == 0)
            rc = append_block(a, &last, used[i].off, dram_alloc_round(used[i].size), false);
        at = used[i].off + dram_alloc_round(used[i].size);
    }
    if (rc == 0 && at < capacity)
        rc = append_block(a, &last, at, capacity - at, true);
    if (rc < 0) {
        dram_alloc_destroy(a);
        return rc;
    }
    *out = a;
    return 0;
}

void dram_alloc_destroy(struct dram_alloc *a)
{
    if (!a)
        return;
    dram_records_destroy(a->recs); /* every block */
    free(a);
}

int dram_alloc_prefill(struct dram_alloc *a, size_t blocks)
{
    return dram_records_prefill(a->recs, blocks);
}

size_t dram_alloc_records(const struct dram_alloc *a) { return dram_records_made(a->recs); }

int dram_alloc_get(struct dram_alloc *a, uint64_t size, uint64_t *off)
{
    struct dram_block *b, *tail = NULL;
    uint64_t len;

    if (size == 0)
        return -EINVAL;
    if (size > a->capacity)
        return -ENOSPC;
    len = dram_alloc_round(size);
    b = best_fit(a->free_root, len);
    if (!b)
        return -ENOSPC;
    if (b->len > len && !(tail = dram_records_get(a->recs)))
        return -ENOMEM;
    free_remove(a, b);
    if (tail) {
        block_split(b, tail, len);
        free_insert(a, tail);
    }
    b->free = false;
    a->used_root = tree_insert(a->used_root, b, cmp_used);
    a->used += len;
    *off = b->off;
    return 0;
}

int dram_alloc_put(struct dram_alloc *a, uint64_t off)
{
    struct dram_block *b = find_used(a->used_root, off), *n;

    if (!b)
        return -ENOENT;
    a->used_root = tree_remove(a->used_root, b, cmp_used);
    a->used -= b->len;
    if (b->prev && b->prev->free) {
        struct dram_block *p = b->prev;

        free_remove(a, p);
        p->len += b->len;
        block_unlink(a, b);
        b = p;
    }
    n = b->next;
    if (n && n->free) {
        free_remove(a, n);
        b->len += n->len;
        block_unlink(a, n);
    }
    free_insert(a, b);
    return 0;
}

uint64_t dram_alloc_capacity(const struct dram_alloc *a)
{
    return a->capacity;
}

uint64_t dram_alloc_used(const struct dram_alloc *a)
{
    return a->used;
}

uint64_t dram_alloc_largest_free(const struct dram_alloc *a)
{
    const struct dram_block *b = a->free_root;

    while (b && b->right)
        b = b->right;
    return b ? b->len : 0;
}

size_t dram_alloc_free_blocks(const struct dram_alloc *a)
{
    return a->nfree;
}

/* ---- consistency check (tests) ---------------------------------------- */

/* Returns the number of nodes, or -1 if order, heights, balance or the
 * free flag is wrong anywhere below b. */
static long check_tree(const struct dram_block *b, block_cmp_fn cmp,
                       bool want_free)
{
    long nl, nr;
    int hl, hr;

    if (!b)
        return 0;
    if (b->free != want_free)
        return -1;
    if ((b->left && cmp(b->left, b) >= 0) || (b->right && cmp(b->right, b) <= 0))
        return -1;
    nl = check_tree(b->left, cmp, want_free);
    nr = check_tree(b->right, cmp, want_free);
    hl = height(b->left);
    hr = height(b->right);
    if (nl < 0 || nr < 0 || b->height != 1 + (hl > hr ? hl : hr) ||
        hl - hr > 1 || hr - hl > 1)
        return -1;
    return nl + nr + 1;
}

int dram_alloc_check(const struct dram_alloc *a)
{
    const struct dram_block *b, *prev = NULL;
    uint64_t end = 0, used = 0;
    size_t nfree = 0, nused = 0;

    for (b = a->first; b; prev = b, b = b->next) {
        if (b->prev != prev)
            return -1;                          /* broken back link */
        if (b->off != end || b->len == 0)
            return -2;                          /* gap, overlap or empty */
        if (b->off % DRAM_ALLOC_ALIGN || b->len % DRAM_ALLOC_ALIGN)
            return -3;                          /* misaligned */
        if (prev && prev->free && b->free)
            return -4;                          /* uncoalesced neighbours */
        end = b->off + b->len;
        if (b->free) {
            nfree++;
        } else {
            nused++;
            used += b->len;
        }
    }
    if (end != a->capacity)
        return -5;                              /* does not reach capacity */
    if (used != a->used || nfree != a->nfree)
        return -6;                              /* counters drifted */
    if (check_tree(a->free_root, cmp_free, true) != (long)nfree)
        return -7;
    if (check_tree(a->used_root, cmp_used, false) != (long)nused)
        return -8;
    return 0;
}
