/* distill.h — the distillation call's plan and run (distill.c), below distill_api.c's checks. */
#ifndef FLCE_DISTILL_H
#define FLCE_DISTILL_H

#include <stdint.h>

#include "flce.h"

/* Token chunks of one call: the chunk's fp32 logits of both models (8 bytes per logit) fit the
 * memory budget (0: 512 MiB). Pure: no device, no environment. */
typedef struct distill_plan {
    int64_t chunk_rows;       /* tokens per chunk, 1..N */
    int64_t chunks;           /* ceil(N / chunk_rows) */
    uint64_t zs_offset;       /* workspace byte offsets: student's fp32 logits, chunk_rows × V */
    uint64_t zt_offset;       /* teacher's fp32 logits, chunk_rows × V */
    uint64_t dw_offset;       /* fp32 dWs accumulator, V × Ds (16-bit dtypes; fp32 writes the caller's) */
    uint64_t dh_offset;       /* fp32 dHs of one chunk, chunk_rows × Ds (16-bit dtypes) */
    uint64_t per_token_offset; /* fp32 loss_i of every token, N */
    uint64_t count_offset;    /* fp32 count of valid tokens (one value, padded to 16 bytes) */
    uint64_t workspace_bytes; /* the total */
} distill_plan;

void distill_plan_make(const flce_distill_problem *p, distill_plan *pl);

/* Every check of flce_distill_loss_and_grad but the context's (no device): the problem copied into
 * *p with its defaults, and its plan. The cpu tests call it directly. */
flce_status distill_check(const flce_distill_problem *problem, const flce_distill_tensors *t,
                          flce_distill_problem *p, distill_plan *pl);

/* Enqueues the call on `stream` (arguments already checked). */
flce_status distill_run(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                        const flce_distill_tensors *t, void *stream);

#endif
