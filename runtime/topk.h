/* topk.h — the top-k log-probabilities call's plan and run (topk.c), below topk_api.c's checks. */
#ifndef FLCE_TOPK_H
#define FLCE_TOPK_H

#include <stdint.h>

#include "distill.h"
#include "flce.h"
#include "plan.h"

#define TOPK_DEFAULT_BUDGET (1ull << 30)

/* Which part of the call runs: all of it (with tp_size > 1 the stats, the all-gather over
 * tensors.comm, then the merge), or one half of the split phase (flce_topk_stats, _finish). */
typedef enum topk_part { TOPK_ALL, TOPK_STATS, TOPK_FINISH } topk_part;

/* One call's plan: the logits kernel (fp32 Z store with statistics, at temperature T) of a chunked
 * CE plan of (N, D, V) with the compact store off, over token chunks whose fp32 logits fit the
 * budget; the workspace is this call's own (Z, the statistics, stand-in labels; with tp_size > 1
 * this rank's block and the gathered blocks after them). Pure. */
typedef struct topk_plan {
    int64_t chunk_rows, chunks;
    int64_t ld;                /* V rounded up to 8 */
    flce_problem ce;           /* the CE problem the plan is of */
    plan model;
    uint64_t z_offset;         /* chunk_rows × ld fp32 logits at T */
    uint64_t part_m_offset, part_s_offset, part_t_offset; /* chunk_rows × model.splits fp32 statistics */
    uint64_t target_offset;    /* chunk_rows floats the statistics pass writes (the stand-in labels' logit) */
    uint64_t labels_offset;    /* N zero int32 labels (the logits epilogue reads one per row) */
    uint64_t stats_bytes;      /* the workspace up to here: all flce_topk_stats needs */
    uint64_t block_bytes;      /* one rank's block, topk_block_bytes */
    uint64_t block_offset;     /* tp_size > 1: this rank's block (flce_topk_logprobs with comm) */
    uint64_t gathered_offset;  /* tp_size > 1: the tp_size blocks the all-gather writes */
    uint64_t workspace_bytes;  /* all of it: what flce_topk_workspace_size says */
} topk_plan;

/* Bytes of one rank's block under TP: FLCE_TP_HEADER words, then 2 + 2k words per token
 * (templates/distill.cu, "top-k log-probabilities"). */
uint64_t topk_block_bytes(const flce_topk_problem *p);

/* The workspace a part needs: the merge none, the stats half the logits pass's, the whole call all. */
uint64_t topk_part_workspace(const topk_plan *pl, topk_part part);

/* The module flce_topk_row is in (the distillation's, templates/distill.cu): one per arch and dtype. */
kernel_spec topk_module_spec(int sm, const flce_topk_problem *p);

flce_status topk_plan_make(const flce_topk_problem *p, const call_device *dev, topk_plan *pl);

/* Every check of flce_topk_logprobs (part TOPK_ALL, buf NULL) or of a half of the split phase (buf
 * this rank's block or the gathered blocks) but the context's and the communicator's ranks
 * (comm_check); the problem and the tensors with their defaults (older callers' structs are
 * smaller), and the plan. */
flce_status topk_check(const flce_topk_problem *problem, const flce_topk_tensors *tensors, topk_part part,
                       const void *buf, const call_device *dev, flce_topk_problem *p, flce_topk_tensors *t,
                       topk_plan *pl);

/* Compiles (or loads from the disk cache) the call's kernels, whatever compile_in_call says. */
flce_status topk_prepare(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl);

/* Enqueues `part` on `stream`: `buf` is this rank's block (TOPK_STATS) or the gathered blocks
 * (TOPK_FINISH), NULL for TOPK_ALL. */
flce_status topk_run(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl, const flce_topk_tensors *t,
                     topk_part part, void *buf, void *stream);

#endif
