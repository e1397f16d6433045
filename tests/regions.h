/*
 * regions.h — the workspace-layout check of the planner tests (test_spec, test_plan_tp): every
 * region 256-aligned and inside workspace_bytes, and no two non-empty regions overlapping.
 */
#ifndef FLCE_TEST_REGIONS_H
#define FLCE_TEST_REGIONS_H

#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "plan.h"

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

/* The regions of a loss-and-grad plan, each sized as the plan uses it (0 when the plan has none);
 * returns how many were written to r (at most PLAN_REGIONS). */
enum { PLAN_REGIONS = 16 };
static size_t plan_regions(const plan *pl, region *r)
{
    uint64_t rows = (uint64_t)pl->stat_rows, sp = (uint64_t)pl->splits, blk = (uint64_t)pl->chunk_rows * pl->ldz;
    uint64_t nd4 = (uint64_t)pl->n * pl->d * 4;
    const region all[] = {{pl->off_stats, 16},
                          {pl->off_target, rows * 4},
                          {pl->off_part_m, rows * sp * 4},
                          {pl->off_part_s, rows * sp * 4},
                          {pl->off_part_t, rows * sp * 4},
                          {pl->off_part_arg, rows * sp * 8},
                          {pl->off_loss_rows, pl->need_loss_rows ? (uint64_t)pl->n * 4 : 0},
                          {pl->off_lse, pl->need_lse ? (uint64_t)pl->n * 4 : 0},
                          /* fused: the logits pass writes dZ only; compact: fp16 p̃ becomes dZ in place */
                          {pl->off_z, pl->fused_dz ? 0 : blk * (pl->compact ? 2 : 4)},
                          /* fp32 dZ overwrites fp32 Z in place (off_dz == off_z) */
                          {pl->off_dz, pl->compact || (pl->off_dz == pl->off_z && !pl->fused_dz)
                                           ? 0 : blk * (pl->logits.dtype == FLCE_DTYPE_F32 ? 4 : 2)},
                          {pl->off_tile_max, pl->compact ? (uint64_t)pl->chunk_rows * pl->tile_max_ld * 4 : 0},
                          {pl->off_dw_acc, pl->need_dw_acc ? (uint64_t)pl->v * pl->d * 4 : 0},
                          /* recompute: every token's rows; chunked (dh_k_slice): one token chunk's */
                          {pl->off_dh_acc, !pl->need_dh_acc ? 0 : pl->recompute ? nd4 : (uint64_t)pl->chunk_rows * pl->d * 4},
                          {pl->off_dh_tp, pl->need_dh_tp ? nd4 : 0},
                          {pl->off_tp_send, pl->collective ? pl->tp_block_bytes : 0},
                          {pl->off_tp_recv, pl->collective ? pl->tp_block_bytes * (uint64_t)pl->tp : 0}};
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) r[i] = all[i];
    return n;
}

#endif
