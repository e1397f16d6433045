/* distill.h — the distillation call's plan and run (distill.c), below distill_api.c's checks. */
#ifndef FLCE_DISTILL_H
#define FLCE_DISTILL_H

#include <stdint.h>

#include "flce.h"
#include "plan.h"
#include "row_call.h" /* call_device: the device a plan is made for; name NULL: no tune table */

/* The default memory_budget (0; a budget given bounds the whole workspace instead: distill.c
 * distill_plan_make): one token chunk's fp32 logits of both models (and dZs) in 4 GiB:
 * 4096 × 32000 is one chunk, 8192 × 128256 three. Measured on an H200 (bench/NOTES.md, session 24):
 * 8192×4096×128256 takes 69.4 / 66.7 / 61.9 / 61.6 ms at 1 / 2 / 4 / 8 GiB (extra memory 2.9 / 4.0 /
 * 5.4 / 7.0 GiB), 8192×2048×151936 (teacher 4096) 61.2 / 52.9 / 50.0 / 48.1 ms. */
#define DISTILL_DEFAULT_BUDGET (4ull << 30)

/* The most (index, log-probability) pairs per token a teacher given as top-k may have (problem.teacher_topk;
 * templates/distill.cu DISTILL_TOPK_MAX). */
#define DISTILL_TOPK_MAX 64

/* One call's plan: the student's GEMMs are a chunked CE plan of (N, Ds, V) with the fp32 Z store
 * (its logits, dH and dW kernels, tuned tiles, workspace layout: Z, dZ, accumulators); the
 * teacher's logits kernel comes from the same plan of (N, Dt, V). Token chunks of chunk_rows: per
 * logit 4 bytes of teacher Z on top of the student's 6 (fp32 Z + 16-bit dZ; fp32 inputs: 4, dZ in
 * place) fit the budget. Pure: no device, no environment beyond the settings' defaults. */
typedef struct distill_plan {
    int64_t chunk_rows;        /* tokens per chunk, 1..N */
    int64_t chunks;            /* ceil(N / chunk_rows) */
    int64_t ld;                /* row stride of both logit blocks and dZs: V rounded up to 8 */
    flce_problem student_problem, teacher_problem; /* the CE problems the two plans are of */
    plan student, teacher;
    uint64_t zt_offset;        /* workspace byte offsets after the student plan's: teacher's fp32
                                  logits, chunk_rows × ld */
    uint64_t teacher_part_m, teacher_part_s, teacher_target; /* the teacher pass's statistics:
                                  chunk_rows × teacher.splits floats (max, Σ exp), chunk_rows */
    /* The compact forward-KL path (compact = 1; distill.c says when): both passes store fp16 p̃ with
     * group maxima (the student's in its plan's off_z / off_tile_max, dZs then written in place),
     * the teacher's p̃ at pt_offset, its group maxima at teacher_tile_max (chunk_rows × the plans'
     * common tile_max_ld), its lse per row at lse_t_offset, and the student pass's soft-target sums
     * at part_xs_offset (chunk_rows × student.splits). The fp32 path (compact = 0) uses zt_offset,
     * and under TP lse_t_offset for the teacher's lse (the shard's, then the merged one). */
    int compact;
    int topk;                  /* problem.teacher_topk: > 0, the teacher's top-k is given (no
                                  teacher plan, pass or regions; compact: the student's p̃ alone) */
    uint64_t pt_offset, teacher_tile_max, lse_t_offset, part_xs_offset;
    /* The top-k teacher's compact path: its sorted (id, p) lists, chunk_rows × SPEC_SPARSE_K int32
     * and fp32 (the student pass's sparse target), part_xs_offset its sums */
    uint64_t sparse_ids_offset, sparse_p_offset;
    /* Tensor parallelism (tp > 1): this rank's all-gather block and every rank's (tp_block_bytes
     * each), the global lse_s and x per row, and the row sums' all-reduce buffer, 2 floats per row
     * (the compact path's (a, w), the fp32 path's D and KL(q‖m) parts; none for the compact top-k
     * teacher: aw_offset 0) */
    int tp;
    uint64_t tp_send_offset, tp_recv_offset, lse_s_offset, x_offset, aw_offset;
    uint64_t labels_offset;    /* N zero labels (8 bytes each) for the logits epilogue when labels are NULL */
    uint64_t per_token_offset; /* fp32 loss_i of every token, N */
    uint64_t count_offset;     /* fp32 count of valid tokens (one value, padded to 16 bytes) */
    uint64_t workspace_bytes;  /* the total */
} distill_plan;

/* The plan of problem p (checked) on device dev for tensors t (NULL: the worst case, as
 * flce_distill_workspace_size reports). FLCE_ERR_INVALID_ARGUMENT when memory_budget cannot hold
 * one token's logits. */
flce_status distill_plan_make(const flce_distill_problem *p, const call_device *dev,
                              const flce_distill_tensors *t, distill_plan *pl);

/* Every check of flce_distill_loss_and_grad but the context's (no device): the problem copied into
 * *p with its defaults, and its plan on dev. The cpu tests call it directly. */
flce_status distill_check(const flce_distill_problem *problem, const flce_distill_tensors *t,
                          const call_device *dev, flce_distill_problem *p, distill_plan *pl);

/* Compiles (or loads from the disk cache) every kernel a call of problem p with tensors t runs, t NULL:
 * those of calls with and without labels; whatever the context's compile_in_call says. */
flce_status distill_prepare(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                            const flce_distill_tensors *t);

/* Enqueues the call on `stream` (arguments already checked). */
flce_status distill_run(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                        const flce_distill_tensors *t, void *stream);

#endif
