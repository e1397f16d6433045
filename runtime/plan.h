/*
 * plan.h — how one call will run: which kernel specs, how many token chunks of what size, how
 * the logits GEMM splits the vocab across CTAs, and where each scratch array sits in the
 * workspace. Pure arithmetic (no GPU), so the cpu tests check budgets and layouts.
 */
#ifndef FLCE_PLAN_H
#define FLCE_PLAN_H

#include <stdint.h>

#include "spec.h"

#define PLAN_DEFAULT_BUDGET (512ull << 20)

typedef struct plan {
    flce_op op;
    int64_t n, d, v;      /* tokens, hidden, vocab shard */
    int64_t ldz;          /* row stride of the chunk's logits and dZ: v rounded up to 8 */
    int64_t chunk_rows;   /* tokens per chunk (the last may be shorter) */
    int64_t n_chunks;
    int splits;           /* vocab splits of the logits GEMM */
    int tiles_per_split;
    kernel_spec logits, dh, dw, rowops;
    /* Workspace layout: byte offsets, each 256-aligned; 0-size regions are unused. */
    uint64_t off_count, off_target, off_part_m, off_part_s, off_loss_rows, off_lse, off_z, off_dz,
        off_dw_acc;
    int need_loss_rows, need_lse, need_dw_acc;
    uint64_t workspace_bytes;
} plan;

/* Plans `op` for problem p on an arch with `num_sms` SMs. `t` says which outputs the caller gave
 * (NULL: plan the worst case, as flce_workspace_size reports). The problem must be valid. */
flce_status plan_make(const flce_problem *p, flce_op op, int sm, int num_sms, const flce_tensors *t,
                      plan *out);

#endif
