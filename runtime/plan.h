/*
 * plan.h — how one call will run: which kernel specs, how the tokens (chunked strategy) or the
 * vocab (recompute strategy) are cut into chunks that fit the memory budget, how the logits GEMM
 * splits the vocab across CTAs, and where each scratch array sits in the workspace. No GPU, so the
 * cpu tests check budgets and layouts. plan_build is a pure function of the problem, the device
 * facts, the settings (config.h) and a tune entry's tiles; plan_make_on binds it to the process's
 * settings and to tune_apply (the tune table and the thread's forced tiles).
 */
#ifndef FLCE_PLAN_H
#define FLCE_PLAN_H

#include <stdint.h>

#include "plan_consts.h"
#include "spec.h"

#define PLAN_DEFAULT_BUDGET (512ull << 20)
/* PLAN_RASTER_ROWS, PLAN_DH_K_SLICE, PLAN_DH_SPLITS_MAX and PLAN_DH_SPLIT_MIN_K, the planner's
 * constants that the settings table uses as defaults and bounds, are plan_consts.h's. */
/* FLCE_DEV logits_cluster unset: the logits pass in 2-CTA clusters where its launch has at least this
 * many row blocks (an odd count pairs its last block with an idle one; plan.c plan_logits_cluster) */
#define PLAN_LOGITS_CLUSTER_MIN_BLOCKS 4
/* Row-scaled compact logits (qrows) by default only where a token chunk holds at least this many
 * logits: measured on an H100 (bench/NOTES.md v39) 8192×4096×128256 and 8192×2304×256000 (one chunk
 * of 1.05e9 and 2.1e9) 0.3-0.5 ms faster; after session 14's cheaper flce_qref and flce_qdw
 * 4096×2048×32000 and 1024×4096×128256 (1.3e8 each) 0.03-0.09 ms faster (run minima), 512×4096×128256
 * (6.6e7) even: its six small kernels cost what the dz pass they replace does. */
#define PLAN_QROWS_MIN_LOGITS 100000000ll
/* problem.batch_invariant: the statistics pass's vocab splits are this many columns each, whatever
 * the rows (plan.c plan_invariant_logits) */
#define PLAN_INVARIANT_SPLIT_COLS 8192
/* a / b rounded up (a >= 0, b > 0): the planner's chunk and split counts and the launch path's grids
 * (launch_prim.h includes this header), one definition for both. */
static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
/* The statistics all-gather of TP: each rank's block is a header of FLCE_TP_HEADER words, then
 * FLCE_TP_RECORD words per token row (templates/params.h). */
uint64_t plan_tp_block_bytes(int64_t rows);

/* Per-token outputs that sequence parallelism computes for all tokens in the workspace and then
 * copies back as this rank's rows (the order of launch.c's sp_output table). */
enum { SP_LSE, SP_LOSS, SP_LOSS_PER_TOKEN, SP_ZLOSS, SP_LOGPROB, SP_ENTROPY, SP_ARGMAX, SP_OUTPUTS };
/* The per-token upstream gradients (problem.grad_outputs, FLCE_GRAD_* bit 1 << k) that sequence
 * parallelism all-gathers into the workspace for the dz pass. */
enum { SP_GRAD_LOGPROB, SP_GRAD_LSE, SP_GRAD_ENTROPY, SP_GRAD_LOSS_PER_TOKEN, SP_GRADS };

typedef struct plan {
    flce_op op;
    /* Tensor parallelism (docs/DESIGN.md §2): tp ranks, and whether this call issues the collectives
     * (tensors.comm given). Under sequence parallelism n counts every rank's tokens and
     * n_local this rank's. */
    int tp, rank, sp, collective;
    int64_t n_local;
    int recompute;        /* gradients walk vocab chunks with all tokens (RECOMPUTE strategy) */
    /* SAVED strategy (flce.h): the chunked plan of all tokens in one chunk, run in two calls (the
     * forward keeps the workspace's compact logits for the backward; launch.c run_saved) */
    int saved;
    int64_t n, d, v;      /* tokens, hidden, vocab shard */
    /* Gradient passes work on a (rows × cols) block of logits at a time: token chunks × the whole
     * shard (chunked), or all tokens × vocab chunks (recompute). */
    int64_t chunk_rows, n_chunks;
    int64_t chunk_cols, n_vchunks;
    int64_t ldz;          /* row stride of the block's logits and dZ: chunk_cols rounded up to 8 */
    int splits;           /* vocab splits of the forward statistics pass */
    int tiles_per_split;
    /* FLCE_DEV logits_persist: 1 where the statistics pass may run persistent CTAs that walk its
     * items in turn (launch.c, where the items outnumber the CTAs resident at once). */
    int logits_persist;
    int logits_group;         /* FLCE_DEV logits_group: row blocks per group of the logits items' order, or 0 */
    kernel_spec logits, dh, dw, rowops;
    /* Recompute: each vocab chunk's logits pass writes dZ itself (logits_dz: the logits spec with
     * fused_dz), so no fp32 Z and no dz pass; FLCE_DEV=fused_dz=0 in the environment turns it off. */
    int fused_dz;
    kernel_spec logits_dz;
    int raster_rows;      /* the persistent dH/dW kernels' tile order (params.h raster_rows) */
    int tiles_tuned;      /* the tiles came from the tune table or the tuner: kept as they are */
    /* Chunked loss-and-grad with 16-bit inputs: the logits pass stores each chunk's logits as fp16
     * p̃ plus fp32 maxima per (row, tile_cols group), 2 bytes per logit instead of 6 (fp32 Z + dZ),
     * and flce_dz turns p̃ into dZ in place: 3x longer token chunks in the same budget.
     * FLCE_DEV=compact=0 in the environment turns it off (side-by-side timing). */
    int compact;
    int64_t tile_cols, tile_max_ld;
    /* With compact logits (bf16, wgmma TMA logits pass, no bias, smoothing, softcap or z-loss; the
     * whole vocab, or a TP shard whose statistics the call gathers, without SP): the compact pass stores bf16 exp(z − c_i) against one reference
     * per row (templates/common.cuh, FLCE_QROWS), so dZ = s_i·p̃ (the label's entry rewritten): dH
     * scales its rows by s_i, dW reads s ⊙ H (off_qh, the chunk's rows × D in the dtype), and there
     * is no dz pass. off_qref, off_qflags, off_row_scale: c_i, the rescale flags and s_i per chunk
     * row. FLCE_DEV=qrows=0 keeps the fp16 p̃ and the dz pass. */
    int qrows;
    /* qdh (with qrows): the labels' term of dH added by flce_qdh after dH, not by dH's epilogue */
    int qdh;
    /* qlab: (dz, column) of each row's label; qlist_*: the chunk rows grouped by label, for the
     * labels' term of dW, which flce_qdw adds after the dW GEMM */
    uint64_t off_qref, off_qflags, off_row_scale, off_qh, off_qlab, off_qlist_start, off_qlist_tok, off_qlist_blk;
    /* dH/dW adding into an fp32 accumulator in place (chunked dW, recompute's dH, the caller's
     * fp32 buffers): red.global.add from the epilogue instead of load + add + store, so the
     * consumers go on to the next tile while L2 adds. One reduction per element per launch: the
     * load-add-store's bits (but subnormals flush to zero). On by default since NOTES v32
     * (FLCE_DEV=red_acc=0 turns it off). */
    int red_acc;
    int bulk_red; /* FLCE_DEV bulk_red: those reductions as bulk ones from shared memory (spec red_acc 1, else 2) */
    /* FLCE_DEV=cluster=2: the dH/dW kernels on the wgmma TMA path run in 2-CTA clusters that load their
     * shared B tile once by TMA multicast (spec cluster). Default -1: the planner puts dW alone in
     * clusters on short token chunks; 0 = off. */
    int cluster;
    /* AUTO: plan_estimate_ms of the chunked and the recompute plan it chose between (0: that plan
     * did not fit the budget, or the strategy was forced). */
    double est_chunked_ms, est_recompute_ms;
    /* Workspace layout: byte offsets, each 256-aligned; regions not needed are 0 and unused. */
    uint64_t off_stats, off_target, off_part_m, off_part_s, off_part_t, off_part_zs, off_part_arg,
        off_loss_rows, off_zloss_rows, off_lse, off_z, off_dz, off_dw_acc, off_dh_acc, off_db_acc,
        off_tile_max;
    int need_loss_rows, need_zloss_rows, need_lse, need_dw_acc, need_dh_acc, need_db_acc;
    /* plan_dz_all_rows: off_dz holds dZ of every token (n × ldz), not one chunk's, so that dW runs
     * once over all of them after the last chunk, with no fp32 accumulator (the distillation's
     * paths, runtime/distill.c; compact: off_z too, the p̃ that becomes dZ in place) */
    int dz_all_rows;
    /* plan_dw_in_dtype: dW of each token chunk added into the caller's 16-bit dW (the first chunk
     * stores, the others read it back as their addend: params.h addend_dtype), with no fp32
     * accumulator: dW rounded to the dtype once per chunk (a distillation call that the caller's
     * memory_budget holds to its size, runtime/distill.c) */
    int dw_in_dtype;
    /* Chunked: dH of a token chunk in launches over at most this many vocab columns each, added
     * up in fp32 (0: one launch over the whole shard) */
    int64_t dh_k_slice;
    int64_t dh_k_slice_max; /* FLCE_DEV dh_k_slice (config.h), default PLAN_DH_K_SLICE */
    /* dH's one launch split over its k (the vocab columns) where its output tiles would fill under
     * half the SMs (small token counts: 64 tiles at 512×4096): dh_splits > 1 units per tile, each
     * over dh_split_k columns (a multiple of 64), stored to its own fp32 slab of rows × D at
     * off_dh_split; one flce_cast sums the slabs in order into grad_hidden (deterministic). */
    int dh_splits;
    int64_t dh_split_k;
    uint64_t off_dh_split;
    int64_t stat_rows;    /* rows the statistics arrays (target, partials) hold */
    /* TP: this rank's block of the statistics all-gather and all ranks' blocks; the fp32 dH that
     * is all-reduced (or reduce-scattered); SP: the gathered inputs and all-token outputs. */
    uint64_t tp_block_bytes, off_tp_send, off_tp_recv, off_dh_tp;
    int need_dh_tp;
    /* FLCE_DEV=tp_dh_16bit=1: the summed dH crosses ranks in the input dtype (half the bytes, as
     * Megatron's all-reduce) instead of fp32: each rank's fp32 dH is rounded into grad_hidden and
     * all-reduced there. Only for a plain all-reduce (no SP, no accumulate_grad_hidden, 16-bit
     * inputs); off by default until tp_compare shows its error. */
    int dh_reduce_16bit;
    /* FLCE_DEV tp_dh_gather16 (default on): the plain all-reduce's fp32 dH is reduce-scattered in fp32,
     * each rank rounds its slice of the sums into grad_hidden, and the rounded slices are
     * all-gathered there: 3/4 of the fp32 all-reduce's bytes and the cast on 1/tp of the values,
     * the same fp32 sums rounded once. Where the plain all-reduce applies (no SP, no
     * accumulate_grad_hidden, 16-bit inputs, not dh_reduce_16bit); launch_tp.c falls back to the
     * all-reduce for a block whose values do not split into 4-aligned slices. */
    int dh_gather16;
    /* FLCE_DEV=tp_overlap=1 (overlap_wanted): each token chunk's summed dH rows (all rows after the last
     * vocab chunk in recompute; under SP all rows after the last chunk, one reduce-scatter) are
     * reduced across ranks on the context's side stream while dW runs, dW taking its tiles from a
     * counter (off_tile_counter) in two launches, the first leaving tp_overlap_sms SMs to NCCL's
     * kernel, the second joining when the reduction ends. With concurrent_grads as well, the
     * reduction follows dH on its stream while dW fills dH's tail. Where dW is on the wgmma TMA path
     * without clusters. */
    int overlap_wanted, tp_overlap;
    /* Under tp_overlap: dW's first launch leaves this many SMs to NCCL's kernel; a second launch of
     * as many CTAs joins the tile counter once the reduction is done (launch_grads.c). 0: one launch. */
    int tp_overlap_sms;
    /* FLCE_DEV grad_streams (default on; grad_streams_wanted): dH in the caller's stream and dW at once
     * on the context's fill stream (lowest priority), joined before anything reads dZ again: dW's
     * CTAs, taking tiles from the counter, fill the SMs dH leaves idle (launch_grads.c, run_dh_dw_at_once,
     * says why dH must be the one in the caller's stream). Where both gradients are asked for, dW is
     * on the wgmma TMA path without clusters, and dH leaves SMs idle: several dH launches, or one
     * whose last wave leaves over 10 % of the SM time empty (plan.c grads_overlap;
     * concurrent_grads). */
    int grad_streams_wanted, concurrent_grads;
    int num_sms; /* the device's, as planned for */
    /* The default budget's ceiling for a compact chunked workspace: 1/16 of the device's memory
     * (0: unknown, as in offline plans); grown: the plan took more than 512 MiB of logits because of
     * it (plan.c grown_budget), so an allocation that fails may fall back to the lean plan. */
    uint64_t mem_cap;
    int grown;
    /* dW takes its tiles from the counter at off_tile_counter (tp_overlap or concurrent_grads). */
    int dw_dynamic;
    uint64_t off_tile_counter;
    uint64_t off_sp_hidden, off_sp_labels, off_sp_go, off_sp_lse, off_sp_out[SP_OUTPUTS], off_sp_grads[SP_GRADS];
    uint64_t workspace_bytes;
} plan;

/* Plans `op` for problem p on an arch with `num_sms` SMs. `t` says which outputs the caller gave
 * (NULL: plan the worst case, as flce_workspace_size reports). The problem must be valid. */
flce_status plan_make(const flce_problem *p, flce_op op, int sm, int num_sms, const flce_tensors *t,
                      plan *out);

/* plan_make on a named device (flce_context's name): the dispatcher also consults the autotune
 * table for the problem's class (tune.h). plan_make is plan_make_on with device NULL: built-in
 * tiles only (offline plans, flce gen). */
flce_status plan_make_on(const flce_problem *p, flce_op op, const char *device, int sm, int num_sms,
                         const flce_tensors *t, plan *out);

/* plan_make_on on a device of mem_bytes of memory (cuDeviceTotalMem): the default budget may grow
 * to 1/16 of it where fewer token chunks are faster (plan.c, grown_budget). */
flce_status plan_make_dev(const flce_problem *p, flce_op op, const char *device, int sm, int num_sms,
                          uint64_t mem_bytes, const flce_tensors *t, plan *out);

/* plan_make_dev under settings cfg instead of the process's (config_get): the distillation call
 * (runtime/distill.c) plans its GEMMs as a chunked CE call with the fp32 Z store (compact off). */
struct flce_config;
flce_status plan_make_cfg(const flce_problem *p, flce_op op, const char *device, int sm, int num_sms,
                          uint64_t mem_bytes, const struct flce_config *cfg, const flce_tensors *t, plan *out);

/* A chunked plan with gradients on 16-bit inputs (not row-scaled, fused dZ or collective) laid out
 * again with dZ (compact: p̃, then dZ in its place) kept for all n tokens (dz_all_rows) instead of an
 * fp32 dW accumulator: its caller runs the logits pass and dH per chunk at that chunk's rows of
 * off_dz and dW once over all tokens (runtime/distill.c). FLCE_ERR_INTERNAL for any other plan. */
flce_status plan_dz_all_rows(const flce_problem *p, const flce_tensors *t, plan *pl);

/* The same kind of plan laid out again with dW added chunk by chunk into the caller's 16-bit dW
 * (dw_in_dtype) instead of an fp32 accumulator: one chunk's dZ, no V × D buffer, dW rounded once per
 * token chunk. Collective plans too (dW is this rank's shard). FLCE_ERR_INTERNAL for any other plan. */
flce_status plan_dw_in_dtype(const flce_problem *p, const flce_tensors *t, plan *pl);

/* The pure planner: plan_make_on is plan_build with the process's settings (config_get) and the
 * tiles tune.c picks (tune table or the tuner's forced tiles). Here everything is an argument: the
 * problem, the device facts (sm, num_sms), the settings cfg (config.h: compact, fused_dz, tiles,
 * portable, raster, cluster, accumulator knobs) and tuned, the logits/dH/dW tiles of a tune entry
 * (TUNE_ROLES of them, already checked with spec_validate by the caller) or NULL for the built-in
 * tiles. Reads no environment, file or global: the same arguments give the same plan. */
struct flce_config;
flce_status plan_build(const flce_problem *p, flce_op op, int sm, int num_sms, const struct flce_config *cfg,
                       const spec_tile *tuned, const flce_tensors *t, plan *out);

/* plan_build's two halves, for plan_make.c, which puts the tune table's tiles between them:
 * plan_start gives the specs their built-in tiles and cfg's knobs; plan_finish does the rest
 * (strategy, chunks, splits, layout) once the tiles are final. */
void plan_start(const flce_problem *p, flce_op op, int sm, const struct flce_config *cfg, const flce_tensors *t,
                plan *pl);
flce_status plan_finish(const flce_problem *p, flce_op op, int num_sms, const struct flce_config *cfg,
                        const flce_tensors *t, plan *pl);

/* AUTO's cost model of loss-and-grad plan pl (plan.c says what it counts), in ms on an H100. */
double plan_estimate_ms(const flce_problem *p, const plan *pl, int num_sms);

/* How many vocab splits (gridDim.y) a logits pass over rows × cols uses, and how many BN-wide
 * tiles each walks: the split count whose whole rounds of CTAs on the device's SMs waste the
 * least time. */
void plan_vocab_splits(const plan *pl, int64_t rows, int64_t cols, int num_sms, int *splits,
                       int *tiles_per_split);


#endif
