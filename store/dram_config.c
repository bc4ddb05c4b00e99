/*
 * dram_config.c - the dram_* options (pool, huge pages, NUMA, watermarks):
 * their table, cross-option checks and the store parameters they give.  In
 * the store library, because the dram tier and umbp-server read the same
 * options to build the same store.  Constant table; caller's thread.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dram_config.h"
#include "dram_options.h"
#include "store.h"

#define CFG(field) offsetof(struct dram_config, field)

const struct umbp_option dram_options[] = {
    { .name = "dram_use_shared_memory", .type = UMBP_OPT_BOOL,
      .offset = CFG(use_shared_memory), .def = "false",
      .help = "back the pool with a memfd (or dram_shm_name) instead of "
              "anonymous memory" },
    { .name = "dram_shm_name", .type = UMBP_OPT_STRING,
      .offset = CFG(shm_name), .def = "", .str_cap = DRAM_SHM_NAME_MAX,
      .help = "with dram_use_shared_memory: create /dev/shm/<name> "
              "(exclusively) instead of an unnamed memfd" },
    { .name = "dram_use_hugepages", .type = UMBP_OPT_BOOL,
      .offset = CFG(use_hugepages), .def = "false",
      .help = "map the pool with huge pages; falls back to 4 KiB pages "
              "with a warning" },
    { .name = "dram_hugepage_size", .type = UMBP_OPT_SIZE,
      .offset = CFG(hugepage_size), .def = "2MiB",
      .min = (double)HUGE_2M, .max = (double)HUGE_1G,
      .help = "huge page size: 2MiB or 1GiB" },
    { .name = "dram_numa_node", .type = UMBP_OPT_INT,
      .offset = CFG(numa_node), .def = "-1", .min = -1, .max = 1023,
      .help = "NUMA node to allocate the pool on; -1 for no binding" },
    { .name = "dram_prefault", .type = UMBP_OPT_BOOL,
      .offset = CFG(prefault), .def = "false",
      .help = "touch every page of the pool at creation" },
    { .name = "dram_high_watermark", .type = UMBP_OPT_DOUBLE,
      .offset = CFG(high_watermark), .def = "0.9", .min = 0.01, .max = 1.0,
      .help = "fraction of capacity above which the evictor starts" },
    { .name = "dram_low_watermark", .type = UMBP_OPT_DOUBLE,
      .offset = CFG(low_watermark), .def = "0.7", .min = 0.0, .max = 0.99,
      .help = "fraction of capacity the evictor frees down to" },
    { .name = NULL },
};

static int check_shm_name(const struct dram_config *c, char *err,
                          size_t errlen)
{
    if (!c->shm_name[0])
        return 0;
    if (!c->use_shared_memory) {
        snprintf(err, errlen, "dram_shm_name=%s needs "
                 "dram_use_shared_memory=true; set it, or leave dram_shm_name "
                 "empty", c->shm_name);
        return -EINVAL;
    }
    if (strchr(c->shm_name, '/') || !strcmp(c->shm_name, ".") ||
        !strcmp(c->shm_name, "..")) {
        snprintf(err, errlen, "dram_shm_name=%s: must be a plain file name "
                 "without '/' (it becomes /dev/shm/<name>), e.g. umbp-rank0",
                 c->shm_name);
        return -EINVAL;
    }
    return 0;
}

int umbp_dram_validate_config(const void *cfg, char *err, size_t errlen)
{
    const struct dram_config *c = cfg;

    if (c->hugepage_size != HUGE_2M && c->hugepage_size != HUGE_1G) {
        snprintf(err, errlen, "dram_hugepage_size=%llu: must be 2MiB "
                 "(2097152) or 1GiB (1073741824)",
                 (unsigned long long)c->hugepage_size);
        return -EINVAL;
    }
    if (c->numa_node < -1 || c->numa_node > 1023) {
        snprintf(err, errlen, "dram_numa_node=%lld: must be -1 (no binding) "
                 "or a node number 0..1023", (long long)c->numa_node);
        return -EINVAL;
    }
    if (!(c->low_watermark < c->high_watermark)) {
        snprintf(err, errlen, "dram_low_watermark=%g must be below "
                 "dram_high_watermark=%g; lower dram_low_watermark or raise "
                 "dram_high_watermark", c->low_watermark, c->high_watermark);
        return -EINVAL;
    }
    return check_shm_name(c, err, errlen);
}

int umbp_dram_store_params(const void *cfg, uint64_t capacity,
                           struct dram_store_params *p)
{
    const struct dram_config *c = cfg;
    *p = (struct dram_store_params){
        .pool = {
            .capacity = capacity,
            .shared = c->use_shared_memory,
            .shm_name = c->shm_name,
            .hugepages = c->use_hugepages,
            .hugepage_size = c->hugepage_size,
            .numa_node = (int)c->numa_node,
            .prefault = c->prefault,
        },
        .capacity = capacity,
        .high_watermark = c->high_watermark,
        .low_watermark = c->low_watermark,
    };
    return 0;
}

const struct umbp_option *umbp_dram_options(size_t *config_size)
{
    *config_size = sizeof(struct dram_config);
    return dram_options;
}
