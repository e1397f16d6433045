/*
 * launch.h — enqueues a planned call's kernels on the caller's stream: prepare, then per token
 * chunk logits → combine → dZ → dH → dW, then the loss reduction. No host synchronization.
 */
#ifndef FLCE_LAUNCH_H
#define FLCE_LAUNCH_H

#include "context.h"
#include "plan.h"

/* Loads (JIT) every kernel the plan needs. Call with ctx->lock held. */
flce_status launch_prepare_kernels(flce_context *ctx, const plan *pl);
flce_status launch_run(flce_context *ctx, const plan *pl, const flce_problem *p,
                       const flce_tensors *t, CUdeviceptr ws, CUstream stream);

#endif
