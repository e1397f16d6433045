/*
 * regions.h — the workspace-layout check of the planner tests (test_spec, test_plan_tp): every
 * region 256-aligned and inside workspace_bytes, and no two non-empty regions overlapping.
 */
#ifndef FLCE_TEST_REGIONS_H
#define FLCE_TEST_REGIONS_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"

typedef struct region {
    uint64_t off, len;
} region;

static void check_disjoint(const region *r, size_t n, uint64_t total, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        CHECKF(r[i].off % 256 == 0 && r[i].off + r[i].len <= total,
               "%s: region %zu at %llu+%llu outside %llu or unaligned", what, i,
               (unsigned long long)r[i].off, (unsigned long long)r[i].len, (unsigned long long)total);
        for (size_t j = i + 1; j < n; j++)
            CHECKF(!r[i].len || !r[j].len || r[i].off + r[i].len <= r[j].off || r[j].off + r[j].len <= r[i].off,
                   "%s: regions %zu and %zu overlap", what, i, j);
    }
}

#endif
