/*
 * launch_call.c — one call on the library's internal path (launch.h launch_call): plan it, load
 * (JIT) its kernels, find its workspace (the caller's, the context's, or after an out-of-memory
 * the lean plan's), then launch_run; and FLCE_LOG=debug's account of the plan. The planning and
 * allocation around a run live here so that launch.c only runs plans.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "launch.h"
#include "log.h"

/* FLCE_LOG=debug: what a call runs and, when AUTO chose, why (the cost model's two estimates).
 * Debug, not info: the Python binding asks flce_strategy_of on every step. */
void launch_log_plan(const plan *pl)
{
    if (pl->op == FLCE_OP_FORWARD) {
        log_msg(LOG_DEBUG, "forward: one pass over %lld tokens", (long long)pl->n);
        return;
    }
    char why[128] = "";
    if (pl->est_chunked_ms > 0 && pl->est_recompute_ms > 0)
        snprintf(why, sizeof why, "; AUTO's estimates: chunked %.1f ms, recompute %.1f ms",
                 pl->est_chunked_ms, pl->est_recompute_ms);
    if (pl->recompute)
        log_msg(LOG_DEBUG, "recompute: %lld vocab chunk(s) of %lld columns, workspace %.1f MiB%s",
                (long long)pl->n_vchunks, (long long)pl->chunk_cols, (double)pl->workspace_bytes / (1 << 20), why);
    else
        log_msg(LOG_DEBUG, "chunked%s: %lld token chunk(s) of %lld rows, workspace %.1f MiB%s",
                pl->qrows ? " (compact bf16 logits, row-scaled)" : pl->compact ? " (compact fp16 logits)" : "", (long long)pl->n_chunks, (long long)pl->chunk_rows,
                (double)pl->workspace_bytes / (1 << 20), why);
}

/* A plan that took more than the default 512 MiB of logits because the device has room (plan.h
 * mem_cap) but whose workspace could not be allocated (memory held by the caller's framework):
 * the lean plan instead, as with no device share at all, so the job goes on. Its token chunks
 * differ, so dW's bits may differ from a call that got the grown workspace. */
static flce_status launch_lean_plan(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                                    CUstream stream, plan *pl, CUdeviceptr *ws)
{
    log_msg(LOG_INFO, "%.1f MiB of workspace not available: falling back to the 512 MiB plan",
            (double)pl->workspace_bytes / (1 << 20));
    err_clear();
    TRY(plan_make_dev(p, op, ctx->name, ctx->sm, ctx->num_sms, 0, t, pl));
    TRY(launch_prepare_kernels(ctx, pl));
    return ctx_workspace(ctx, pl->workspace_bytes, stream, ws);
}

flce_status launch_call(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                        CUstream stream, launch_part part, CUdeviceptr tp_buffer)
{
    plan pl;
    TRY(plan_make_dev(p, op, ctx->name, ctx->sm, ctx->num_sms, ctx->mem_bytes, t, &pl));
    if (t->workspace && t->workspace_bytes < pl.workspace_bytes)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.workspace_bytes=%llu: this call needs %llu (flce_workspace_size gives the "
                       "most any call of this problem needs)",
                       (unsigned long long)t->workspace_bytes,
                       (unsigned long long)pl.workspace_bytes);

    launch_prebuild_kernels(ctx, &pl, 0); /* FLCE_DEV unlocked_compile: compiles before the lock */
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_take_flag(ctx);
    if (st == FLCE_OK) st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        CUdeviceptr ws = (CUdeviceptr)(uintptr_t)t->workspace;
        st = launch_prepare_kernels(ctx, &pl);
        if (st == FLCE_OK && !ws) st = ctx_workspace(ctx, pl.workspace_bytes, stream, &ws);
        if (st == FLCE_ERR_OUT_OF_MEMORY && pl.grown) st = launch_lean_plan(ctx, p, op, t, stream, &pl, &ws);
        if (st == FLCE_OK) {
            log_msg(LOG_DEBUG, "op %d: N=%lld D=%lld V=%lld, %d vocab splits", (int)op, (long long)pl.n,
                    (long long)pl.d, (long long)pl.v, pl.splits);
            launch_log_plan(&pl);
            st = launch_run(ctx, &pl, p, t, ws, stream, part, tp_buffer);
            if (!t->workspace) { /* (after a failed call too: some of its work may be queued) */
                flce_status done = ctx_workspace_done(ctx, stream);
                if (st == FLCE_OK) st = done;
            }
        }
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
