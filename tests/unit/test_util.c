/*
 * test_util - common/util.c's umbp_touch_pages: every page its range
 * overlaps is mapped in after it (present in /proc/self/pagemap), however
 * the range is aligned, and no page outside it.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "umbp/tier.h" /* umbp_touch_pages */

/* Whether the page at va is mapped into this process (pagemap bit 63). */
static bool present(int fd, uintptr_t va)
{
    uint64_t e = 0;
    cr_assert_eq(pread(fd, &e, sizeof(e), (off_t)(va / 4096 * sizeof(e))), (ssize_t)sizeof(e));
    return e >> 63 & 1;
}

/* A range that starts mid-page: stepping 4 KiB from its start missed its
 * last page (a warmed session's buffers were not all touched under ASan). */
Test(util, touch_pages_reaches_every_page_it_overlaps)
{
    /* fresh anonymous pages: none present until written */
    size_t len = 16 * 4096;
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(m != MAP_FAILED);
    int fd = open("/proc/self/pagemap", O_RDONLY);
    cr_assert(fd >= 0);
    /* from 100 bytes into page 1 to 50 bytes into page 9: pages 1..9 */
    umbp_touch_pages(m + 4096 + 100, 8 * 4096 - 50);
    for (size_t i = 0; i < 16; i++)
        cr_expect_eq(present(fd, (uintptr_t)m + i * 4096), i >= 1 && i <= 9, "page %zu", i);
    close(fd);
    munmap(m, len);
}
