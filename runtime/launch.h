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
/* ctx_prebuild (context.h) of the kernels plan pl loads; call without ctx->lock. `all`: also those
 * a stand-in could serve (flce_prepare). */
void launch_prebuild_kernels(flce_context *ctx, const plan *pl, int all);

/* What a forward call does: all of it, or one half of the split-phase TP forward (the caller
 * all-gathers `tp_buffer` between the halves). */
typedef enum launch_part {
    PART_ALL = 0,
    PART_TP_STATS = 1, /* statistics of this rank's shard → tp_buffer (one rank's block) */
    PART_TP_FINISH = 2, /* every rank's blocks (tp_buffer) → lse, loss, per-token outputs */
    PART_SAVE = 3,      /* SAVED's forward: statistics and outputs, compact logits kept in the workspace */
    PART_SAVED_GRADS = 4 /* SAVED's backward: dZ from the kept logits, dH and dW */
} launch_part;

flce_status launch_run(flce_context *ctx, const plan *pl, const flce_problem *p,
                       const flce_tensors *t, CUdeviceptr ws, CUstream stream, launch_part part,
                       CUdeviceptr tp_buffer);

/* One call after api.c's checks, the library's internal launch path: plans it (tune_apply's tiles,
 * the tuner's forced ones included), refuses a passed workspace smaller than the plan needs, then
 * under ctx->lock reports a raised error flag, loads the kernels, grows the owned workspace when
 * none was passed and enqueues the kernels on `stream`. p and t are normalized and checked
 * (api.c run_op); the tuner (tune_run.c) calls it for its timed calls, so they never come back
 * through flce_forward's FLCE_TUNE=1 hook. */
flce_status launch_call(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                        CUstream stream, launch_part part, CUdeviceptr tp_buffer);

/* FLCE_LOG=debug: what a planned call runs and why (launch_call, flce_strategy_of). */
void launch_log_plan(const plan *pl);

/* flce_scale_gradients: the dtype gradients t names, in place, times the fp32 scalar at
 * t->grad_output (read on the device; nothing moves when it is 1). Call with ctx->lock held. */
flce_status launch_scale(flce_context *ctx, const plan *pl, const flce_tensors *t, CUstream stream);

#endif
