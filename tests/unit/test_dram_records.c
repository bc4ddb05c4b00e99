/*
 * test_dram_records.c - the store's fixed-size records: zeroed on get,
 * reused after put, made up front by prefill and 256 at a time past it,
 * all freed by destroy (ASan's leak check says so in the sanitizer build).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "records.h"

struct rec {
    uint64_t a, b, c;
    char name[40];
};

Test(dram_records, get_is_zeroed_and_put_is_reused)
{
    struct dram_records *r;
    cr_assert_eq(dram_records_create(sizeof(struct rec), &r), 0);
    cr_assert_eq(dram_records_made(r), 0);
    struct rec *x = dram_records_get(r);
    cr_assert_not_null(x);
    cr_assert_eq(dram_records_made(r), 256, "the first get makes a chunk of 256");
    cr_assert_eq((uintptr_t)x % 16, 0, "records are 16-byte aligned");
    x->a = 7;
    memset(x->name, 'x', sizeof(x->name));
    dram_records_put(r, x);
    struct rec *y = dram_records_get(r);
    cr_assert_eq(y, x, "the record just put is the next one got");
    static const struct rec zero;
    cr_assert_eq(memcmp(y, &zero, sizeof(zero)), 0, "a record is zeroed when got again");
    dram_records_put(r, NULL); /* does nothing */
    dram_records_destroy(r);  /* frees y too */
}

Test(dram_records, prefill_makes_records_up_front)
{
    enum { N = 5000 };
    struct dram_records *r;
    static struct rec *got[N + 1];
    cr_assert_eq(dram_records_create(sizeof(struct rec), &r), 0);
    cr_assert_eq(dram_records_prefill(r, N), 0);
    cr_assert_eq(dram_records_made(r), N);
    cr_assert_eq(dram_records_prefill(r, 100), 0, "fewer than made: nothing to do");
    cr_assert_eq(dram_records_made(r), N);
    for (size_t i = 0; i < N; i++) {
        got[i] = dram_records_get(r);
        cr_assert_not_null(got[i]);
        for (size_t j = 0; j < sizeof(struct rec); j++)
            cr_assert_eq(((unsigned char *)got[i])[j], 0);
        memset(got[i], 0xab, sizeof(struct rec)); /* no two records overlap: */
    }
    for (size_t i = 0; i < N; i++)
        for (size_t k = i + 1; k < i + 3 && k < N; k++)
            cr_assert_geq((uintptr_t)got[k] > (uintptr_t)got[i]
                              ? (uintptr_t)got[k] - (uintptr_t)got[i]
                              : (uintptr_t)got[i] - (uintptr_t)got[k],
                          sizeof(struct rec));
    cr_assert_eq(dram_records_made(r), N, "the prefilled records served every get");
    got[N] = dram_records_get(r);
    cr_assert_not_null(got[N]);
    cr_assert_eq(dram_records_made(r), N + 256, "past them, a chunk of 256");
    for (size_t i = 0; i < N; i += 2)
        dram_records_put(r, got[i]);
    dram_records_destroy(r); /* the odd ones and got[N] are still in use */
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* A record is poisoned once put back, so a read through a stale pointer is
 * an ASan report, as it was when records were malloc'd and freed; a record
 * got again is not.  Only in the sanitizer build, where poisoning exists. */
Test(dram_records, a_record_put_back_is_poisoned_under_asan)
{
    struct dram_records *r;
    cr_assert_eq(dram_records_create(sizeof(struct rec), &r), 0);
    struct rec *x = dram_records_get(r);
    cr_assert_not_null(x);
    cr_assert_not(__asan_address_is_poisoned(&x->b), "a record in use is poisoned");
    dram_records_put(r, x);
    cr_assert(__asan_address_is_poisoned(&x->b), "a record put back is not poisoned");
    cr_assert(__asan_address_is_poisoned(&x->name[39]), "its last bytes are not poisoned");
    struct rec *y = dram_records_get(r);
    cr_assert_eq(y, x);
    cr_assert_not(__asan_address_is_poisoned(&y->name[39]), "a record got again is poisoned");
    dram_records_destroy(r);
}
#endif

Test(dram_records, zero_size_is_refused)
{
    struct dram_records *r = NULL;
    cr_assert_eq(dram_records_create(0, &r), -EINVAL);
    cr_assert_null(r);
}
