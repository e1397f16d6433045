/*
 * launch.h — enqueues a planned call's kernels and collectives on the caller's stream: prepare,
 * then per token chunk logits → [TP all-gather] → combine → dZ → dH → dW, then the loss reduction
 * [and the dH all-reduce]. No host synchronization.
 */
#ifndef FLCE_LAUNCH_H
#define FLCE_LAUNCH_H

#include "context.h"
#include "plan.h"

/* Loads (JIT) every kernel the plan needs. Call with ctx->lock held. */
flce_status launch_prepare_kernels(flce_context *ctx, const plan *pl);

/* What a forward call does: all of it, or one half of the split-phase TP forward (the caller
 * all-gathers `tp_buffer` between the halves). */
typedef enum launch_part {
    PART_ALL = 0,
    PART_TP_STATS = 1, /* statistics of this rank's shard → tp_buffer (one rank's block) */
    PART_TP_FINISH = 2 /* every rank's blocks (tp_buffer) → lse, loss, per-token outputs */
} launch_part;

flce_status launch_run(flce_context *ctx, const plan *pl, const flce_problem *p,
                       const flce_tensors *t, CUdeviceptr ws, CUstream stream, launch_part part,
                       CUdeviceptr tp_buffer);

/* flce_scale_gradients: the dtype gradients t names, in place, times the fp32 scalar at
 * t->grad_output (read on the device; nothing moves when it is 1). Call with ctx->lock held. */
flce_status launch_scale(flce_context *ctx, const plan *pl, const flce_tensors *t, CUstream stream);

#endif
