/* topk.h — the top-k log-probabilities call's plan and run (topk.c), below topk_api.c's checks. */
#ifndef FLCE_TOPK_H
#define FLCE_TOPK_H

#include <stdint.h>

#include "distill.h"
#include "flce.h"
#include "plan.h"

#define TOPK_DEFAULT_BUDGET (1ull << 30)

/* One call's plan: the logits kernel (fp32 Z store with statistics, at temperature T) of a chunked
 * CE plan of (N, D, V) with the compact store off, over token chunks whose fp32 logits fit the
 * budget; the workspace is this call's own (Z, the statistics, stand-in labels). Pure. */
typedef struct topk_plan {
    int64_t chunk_rows, chunks;
    int64_t ld;                /* V rounded up to 8 */
    flce_problem ce;           /* the CE problem the plan is of */
    plan model;
    uint64_t z_offset;         /* chunk_rows × ld fp32 logits at T */
    uint64_t part_m_offset, part_s_offset; /* chunk_rows × model.splits fp32 statistics */
    uint64_t target_offset;    /* chunk_rows floats the statistics pass writes (the stand-in labels' logit) */
    uint64_t labels_offset;    /* N zero int32 labels (the logits epilogue reads one per row) */
    uint64_t workspace_bytes;
} topk_plan;

/* The module flce_topk_row is in (the distillation's, templates/distill.cu): one per arch and dtype. */
kernel_spec topk_module_spec(int sm, const flce_topk_problem *p);

flce_status topk_plan_make(const flce_topk_problem *p, const call_device *dev, topk_plan *pl);

/* Every check of flce_topk_logprobs but the context's; the problem with its defaults and its plan. */
flce_status topk_check(const flce_topk_problem *problem, const flce_topk_tensors *t, const call_device *dev,
                       flce_topk_problem *p, topk_plan *pl);

/* Compiles (or loads from the disk cache) the call's kernels, whatever compile_in_call says. */
flce_status topk_prepare(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl);

flce_status topk_run(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl, const flce_topk_tensors *t,
                     void *stream);

#endif
