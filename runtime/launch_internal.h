/*
 * launch_internal.h — what the files of the launch path share; everything else includes launch.h.
 *   launch.c        runs a plan: the passes of each strategy, row kernels, logits GEMMs, launches
 *   launch_call.c   one call end to end: planning, kernel loading, workspace, then launch_run
 *   launch_grads.c  the gradient passes of one block: dZ, dH, dW, db, their streams
 *   launch_tp.c     tensor and sequence parallelism: dH summed over ranks, SP gathers and
 *                   scatters, the side and fill streams' forks and joins
 */
#ifndef FLCE_LAUNCH_INTERNAL_H
#define FLCE_LAUNCH_INTERNAL_H

#include <stdint.h>

#include "launch.h"
#include "params.h"

enum {
    K_PREPARE = 0, K_COMBINE = 1, K_DZ = 2, K_REDUCE = 3, K_DBIAS = 4, K_TP_PACK = 5, K_CAST = 6, K_QREF = 7,
    K_QSCALE = 8, K_QLIST_COUNT = 9, K_QLIST_FILL = 10, K_QDW = 11, K_QDH = 12
};

typedef struct kernels {
    CUfunction logits, logits_dz, dh, dw, row[CTX_MAX_KERNELS];
} kernels;

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline unsigned long long addr(const void *p) { return (unsigned long long)(uintptr_t)p; }

typedef struct run {
    const plan *pl;
    const flce_problem *p;
    const flce_tensors *t; /* the caller's tensors, or under SP their all-token stand-ins */
    flce_context *ctx;
    CUdeviceptr ws;
    CUstream stream;
    size_t es; /* bytes of one input-dtype element */
    kernels k;
    struct flce_row_params rp; /* fields common to every row kernel */
    CUstream forked[2];        /* the side and/or fill stream, while they have work the caller's
                                  stream must wait for */
    int n_forked;
} run;

/* A block of logits: rows [row0, row0 + rows) × shard columns [col0, col0 + cols). */
typedef struct block {
    int64_t row0, rows, col0, cols;
    int first, last; /* first and last step of an accumulation over blocks */
} block;

/* ---- launch.c ------------------------------------------------------------------------------ */

/* One kernel launch on `stream` (nothing for an empty grid); `what` names it in errors. */
flce_status launch(CUfunction fn, int64_t gx, int64_t gy, int threads, size_t smem, CUstream stream,
                   void *params, const char *what);
/* A launch in clusters of `cluster` CTAs along x; launch() for cluster <= 1. */
flce_status launch_cluster(CUfunction fn, int64_t gx, int64_t gy, int cluster, int threads, size_t smem,
                           CUstream stream, void *params, const char *what);
/* The CTA slots of a persistent launch of fn (spec s): the SMs, or the clusters resident at once. */
int resident_slots(const flce_context *ctx, const kernel_spec *s, CUfunction fn);
/* r->ws + off when needed, else 0. */
unsigned long long ws_at(const run *r, uint64_t off, int needed);
/* Row kernel `kernel` (K_*) over block b with r->rp's parameters. */
flce_status run_rows(run *r, int kernel, const block *b);

/* ---- launch_call.c ------------------------------------------------------------------------- */

/* Every kernel of plan pl, the missing ones compiled together (ctx_kernels_many). */
flce_status get_kernels(flce_context *ctx, const plan *pl, kernels *k);

/* ---- launch_grads.c ------------------------------------------------------------------------ */

/* dZ of one block and the gradient GEMMs that consume it (rows_step: dH's accumulation state,
 * cols_step: dW's and db's). */
flce_status run_grads(run *r, const block *rows_step, const block *cols_step);

/* ---- launch_tp.c --------------------------------------------------------------------------- */

/* Stream s waits for everything the caller's stream holds so far; side_join makes the caller's
 * stream wait for every stream forked to. */
flce_status fork_to(run *r, CUstream s);
flce_status side_join(run *r);
/* dH rows of rows_done summed over the ranks on r->stream, or (overlap_dh) on the side stream. */
flce_status reduce_dh(run *r, const block *rows_done);
flce_status overlap_dh(run *r, const block *rows_done);
/* The end of a call's dH under TP: summed over the ranks and rounded once (unless overlapped). */
flce_status finish_dh(run *r);
/* SP: the token-sharded inputs gathered into the workspace (`all`), and this rank's outputs back. */
flce_status sp_gather(run *r, const flce_tensors *caller, flce_tensors *all, launch_part part);
flce_status sp_scatter_outputs(run *r, const flce_tensors *caller);

#endif
