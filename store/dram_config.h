/*
 * dram_config.h - the dram_* options' struct (dram_config.c has the table).
 */
#ifndef UMBP_DRAM_CONFIG_H
#define UMBP_DRAM_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "pool.h"
#include "umbp/tier.h"

#define HUGE_2M (2ull << 20)
#define HUGE_1G (1ull << 30)

struct dram_config {
    bool use_shared_memory;
    char shm_name[DRAM_SHM_NAME_MAX];
    bool use_hugepages;
    uint64_t hugepage_size;
    int64_t numa_node;
    bool prefault;
    double high_watermark;
    double low_watermark;
};

extern const struct umbp_option dram_options[];

#endif
