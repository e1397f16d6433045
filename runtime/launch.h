/*
 * launch.h — enqueues a planned call's kernels and collectives on the caller's stream: prepare,
 * then per token chunk logits → [TP all-gather] → combine → dZ → dH → dW, then the loss reduction
 * [and the dH all-reduce]. No host synchronization.
 */
#ifndef FLCE_LAUNCH_H
#define FLCE_LAUNCH_H

#include "context.h"
#include "launch_prim.h"
#include "plan.h"

/* Loads (JIT) every kernel the plan needs. Call with ctx->lock held. */
flce_status launch_prepare_kernels(flce_context *ctx, const plan *pl);
/* ctx_prebuild (context.h) of the kernels plan pl loads; call without ctx->lock. `all`: also those
 * a stand-in could serve (flce_prepare). */
void launch_prebuild_kernels(flce_context *ctx, const plan *pl, int all);


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

/* Where a logits pass's statistics go: per (block row, vocab split) the max and Σ exp(z − max),
 * [rows][r->pl->splits], and each row's label logit where it lies in the shard, [rows]; part_t
 * (entropy: Σ exp(z − max)·z) and part_zs (zsum or soft target) where the spec has them. A compact
 * pass also writes its group maxima to tile_max ([rows][r->pl->tile_max_ld]); a soft-target pass
 * (SPEC_OPT_SOFT) reads another compact pass's p̃ (soft), group maxima (soft_tile_max) and lse per
 * row (soft_lse) of the same rows; a sparse-target pass (SPEC_OPT_SPARSE) reads per row SPEC_SPARSE_K
 * int32 ids sorted ascending (sparse_ids) and their fp32 weights (sparse_p). Zero: not written (not
 * read). */
typedef struct logits_stats {
    unsigned long long part_m, part_s, target, part_t, part_zs, tile_max;
    unsigned long long soft, soft_tile_max, soft_lse;
    unsigned long long sparse_ids, sparse_p;
} logits_stats;

/* The logits of block b (r->t's hidden rows × weight rows, at the plan's temperature) stored at z,
 * row stride r->pl->ldz: fp32, or the compact fp16 p̃ where r->pl->logits is compact; with st their
 * statistics. r->pl->logits must not be a dZ spec, and r->t->labels must be valid for the block's
 * rows (the epilogue reads them). For runtime/distill.c and runtime/topk.c, which run the CE path's
 * tuned GEMMs on their own row kernels. */
flce_status launch_store_logits(run *r, const block *b, unsigned long long z, const logits_stats *st);

/* FLCE_LOG=debug: what a planned call runs and why (launch_call, flce_strategy_of). */
void launch_log_plan(const plan *pl);

/* flce_scale_gradients: the dtype gradients t names, in place, times the fp32 scalar at
 * t->grad_output (read on the device; nothing moves when it is 1). Call with ctx->lock held. */
flce_status launch_scale(flce_context *ctx, const plan *pl, const flce_tensors *t, CUstream stream);

#endif
