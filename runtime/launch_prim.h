/*
 * launch_prim.h — the ground floor of the launch path (launch_prim.c): the state of one run (run,
 * block, kernels), one kernel launch, row kernels, workspace addresses, and loading a plan's kernels.
 * Above it: launch_tp.c (collectives, stream forks), launch_grads.c (gradient passes), launch.c
 * (a plan's passes), launch_call.c (one call end to end). Each includes only what lies below it, so
 * the files form layers, not a circle.
 */
#ifndef FLCE_LAUNCH_PRIM_H
#define FLCE_LAUNCH_PRIM_H

#include <stdint.h>

#include "context.h"
#include "params.h"
#include "plan.h"

/* What a forward call does: all of it, or one half of the split-phase TP forward (the caller
 * all-gathers `tp_buffer` between the halves). */
typedef enum launch_part {
    PART_ALL = 0,
    PART_TP_STATS = 1, /* statistics of this rank's shard → tp_buffer (one rank's block) */
    PART_TP_FINISH = 2, /* every rank's blocks (tp_buffer) → lse, loss, per-token outputs */
    PART_SAVE = 3,      /* SAVED's forward: statistics and outputs, compact logits kept in the workspace */
    PART_SAVED_GRADS = 4 /* SAVED's backward: dZ from the kept logits, dH and dW */
} launch_part;

enum {
    K_PREPARE = 0, K_COMBINE = 1, K_DZ = 2, K_REDUCE = 3, K_DBIAS = 4, K_TP_PACK = 5, K_CAST = 6, K_QREF = 7,
    K_QSCALE = 8, K_QLIST_COUNT = 9, K_QLIST_FILL = 10, K_QDW = 11, K_QDH = 12
};

typedef struct kernels {
    CUfunction logits, logits_dz, dh, dw, row[CTX_MAX_KERNELS];
} kernels;

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

/* Every kernel of plan pl, the missing ones compiled together (ctx_kernels_many). */
flce_status get_kernels(flce_context *ctx, const plan *pl, kernels *k);

#endif
