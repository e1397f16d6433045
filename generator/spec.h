/*
 * spec.h — a kernel spec names everything one generated kernel module is specialized on
 * (docs/DESIGN.md §4). The dispatcher fills specs, spec_validate rejects impossible ones with a message
 * naming the field, emit.c turns a valid spec into CUDA source, and the JIT caches by that source.
 */
#ifndef FLCE_SPEC_H
#define FLCE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"

typedef enum spec_role {
    ROLE_LOGITS = 0, /* Z = H·Wᵀ with the online-LSE epilogue (kernel flce_logits) */
    ROLE_DH = 1,     /* dH = dZ·W (kernel flce_dh) */
    ROLE_DW = 2,     /* dW = dZᵀ·H (kernel flce_dw) */
    ROLE_ROWOPS = 3, /* flce_prepare, _combine, _dz, _reduce, _dbias, _tp_pack, _cast */
    ROLE_DISTILL = 4 /* the distillation call's kernels (templates/distill.cu, emit_distill_source) */
} spec_role;

/* The GEMM main loop: which instructions multiply and how stages reach shared memory. One value
 * rather than independent switches, so that a tile names only loops that exist (TMA without a
 * warpgroup MMA, or tcgen05 without TMA, cannot be written). The values are stable: the fuzz
 * corpus stores them, and MAINLOOP_MMA_SYNC is 0 so that a zeroed spec is the portable loop. */
typedef enum spec_mainloop {
    MAINLOOP_MMA_SYNC = 0,       /* mma.sync (FFMA for fp32), cp.async stages: every arch
                                  * (templates/gemm_mma_sync.cu) */
    MAINLOOP_WGMMA_CP_ASYNC = 1, /* Hopper wgmma (sm_90a, 16-bit, 128 × BN × 64, 8 × 1 warps), stages
                                  * loaded by cp.async (gemm_wgmma_cp_async.cu) */
    MAINLOOP_WGMMA_TMA = 2,      /* Hopper wgmma, stages loaded by TMA under mbarriers from a producer
                                  * warpgroup (+128 threads), two consumer warpgroups (gemm_wgmma_tma.cu) */
    MAINLOOP_TCGEN05 = 3         /* Blackwell (sm_100a, 16-bit): the same TMA tiles and producer,
                                  * tcgen05.mma into tensor memory, 128 × BN × 64, 8 × 1 warps
                                  * (gemm_tcgen05.cu) */
} spec_mainloop;
enum { SPEC_MAINLOOPS = 4 };

typedef struct spec_tile {
    int bm, bn, bk;      /* CTA tile: rows, columns, depth of one pipeline stage */
    int stages;          /* pipeline depth */
    int warps_m, warps_n;
    spec_mainloop loop;
} spec_tile;

/* Hopper wgmma, either feed (FLCE_WGMMA's wgmma instructions; not tcgen05). */
static inline int spec_uses_wgmma(const spec_tile *t)
{
    return t->loop == MAINLOOP_WGMMA_CP_ASYNC || t->loop == MAINLOOP_WGMMA_TMA;
}
/* A warpgroup loop (wgmma or tcgen05): the 128-byte-swizzled tiles of templates/gemm_wgmma.cu. */
static inline int spec_uses_warpgroup(const spec_tile *t)
{
    return spec_uses_wgmma(t) || t->loop == MAINLOOP_TCGEN05;
}
/* Stages loaded by TMA under mbarriers from a producer warpgroup (Hopper's TMA loop or tcgen05). */
static inline int spec_uses_tma(const spec_tile *t)
{
    return t->loop == MAINLOOP_WGMMA_TMA || t->loop == MAINLOOP_TCGEN05;
}

typedef struct kernel_spec {
    int sm;              /* compute capability ×10: 80, 86, 89, 90, 100, 120 */
    flce_dtype dtype;
    int64_t hidden;      /* D */
    int64_t vocab_shard; /* V_r */
    spec_role role;
    spec_tile tile;      /* GEMM roles only */
    int label_bits;      /* 32 or 64 */
    flce_reduction reduction; /* ROWOPS only */
    /* Options (docs/DESIGN.md §1), all compile-time: zero/off in the GEMMs that do not use them. */
    unsigned opts;       /* SPEC_OPT_* bits: LOGITS and ROWOPS */
    float softcap;       /* c, 0 = off: LOGITS and ROWOPS */
    float temperature;   /* T; 0 = off (T = 1): LOGITS and ROWOPS */
    float smoothing;     /* ε: ROWOPS and fused_dz (the statistics pass only needs SPEC_OPT_ZSUM) */
    float z_loss;        /* λ: ROWOPS, and LOGITS with fused_dz */
    int fused_dz;        /* LOGITS: the epilogue writes dZ (the recompute strategy's gradient pass,
                          * lse known) instead of statistics or Z; uses reduction (none or not),
                          * smoothing, z_loss and the weights like flce_dz */
    int compact;         /* LOGITS, 16-bit dtypes: the statistics pass of the chunked strategy stores
                          * Z as fp16 p̃ = exp(z − m)·2^15 plus one fp32 m per (row, warp tile),
                          * 2 bytes per logit instead of 4 (templates/common.cuh) */
    int qrows;           /* LOGITS with compact, bf16, wgmma TMA path: p̃ is stored as bf16 exp(z − c_i)
                          * against one reference c_i per row (flce_qref), or the tile's maximum where
                          * that lies far above c_i (the row is then rescaled by flce_qscale), so that
                          * dZ = s_i·p̃ with one factor per row: no dz pass (templates/gemm_logits.cu) */
    int cluster;         /* DH/DW on the wgmma TMA path: 0 (none), or 2: CTAs in clusters of 2 that
                          * work on vertically adjacent tiles and load their shared B tile once,
                          * each half multicast to both (templates/gemm_wgmma_tma.cu, FLCE_CLUSTER);
                          * LOGITS: 0, or 2 (two adjacent row blocks of one vocab split, W's tile
                          * multicast) */
    /* DH/DW epilogue variants (templates/gemm_grad.cu), so that a kernel holds only the stores its
     * launches make (each variant is unrolled over the whole accumulator tile; both cost ~40 % of
     * the kernel's NVRTC time):
     *   plain_out  1: only complete 16-bit tiles through shared memory: no fp32 addend or output,
     *              n a multiple of BN (a 16-bit gradient computed in one pass; wgmma TMA path)
     *   red_acc    1: fp32 accumulators updated in place by reductions (FLCE_RED_ACC): bulk ones
     *              from shared memory where spec_bulk_red, else red.global per thread; 2: red.global
     *              per thread always (FLCE_BULK_RED=0) */
    int plain_out;
    int red_acc;
    /* LOGITS with compact: every launch covers the whole shard (its n is vocab_shard, a multiple
     * of BN), so the kernel has no partial-tile code (templates/gemm_logits.cu, FLCE_FULL_TILES). */
    int full_tiles;
    /* ROLE_DISTILL (runtime/distill.c): the divergence (flce_divergence), JSD's β, the CE weight and
     * whether labels are given; with dtype, label_bits, reduction and temperature above. */
    int divergence;
    float beta;
    float ce_weight;
    int has_labels;
} kernel_spec;

enum {
    SPEC_OPT_BIAS = 1u << 0,    /* logits add b_j; rowops computes db */
    SPEC_OPT_WEIGHTS = 1u << 1, /* class weights */
    SPEC_OPT_ZSUM = 1u << 2,    /* Σ_j w_j·z_j per row (label smoothing) */
    SPEC_OPT_ENTROPY = 1u << 3, /* Σ_j p_j·z_j per row */
    SPEC_OPT_ARGMAX = 1u << 4,  /* argmax_j z_j per row */
    /* ROWOPS: per-token upstream gradients of the outputs (flce.h FLCE_GRAD_*, shifted by 5), and
     * the loss's scalar folded into each row's dZ (templates/common.cuh dz_coef) */
    SPEC_OPT_GRAD_LOGPROB = 1u << 5,
    SPEC_OPT_GRAD_LSE = 1u << 6,
    SPEC_OPT_GRAD_ENTROPY = 1u << 7,
    SPEC_OPT_GRAD_LOSS_ROWS = 1u << 8,
    SPEC_OPT_TOKEN_GRADS_SHIFT = 5,
    /* LOGITS with the compact store (the distillation's student pass, runtime/distill.c): Σ_j p_j·z_j
     * per row into part_zs, p_j another pass's stored compact p̃ of the same columns scaled to
     * probabilities (the teacher's; templates/gemm_logits.cu says where they come from) */
    SPEC_OPT_SOFT = 1u << 9,
    /* LOGITS with the compact store (the distillation's student pass under a top-k teacher): Σ_u p_u·z_u
     * per row into part_zs over a list of SPEC_SPARSE_K (id, p) pairs per row, sorted by id and padded
     * with ids past every column (templates/gemm_logits.cu) */
    SPEC_OPT_SPARSE = 1u << 10
};

/* The (id, p) pairs per row of SPEC_OPT_SPARSE's list: the most a top-k teacher gives (distill.h) */
#define SPEC_SPARSE_K 64

/* The NVRTC target for an arch: "sm_90a" for 90, "sm_100a" for 100, else "sm_<sm>". */
const char *spec_arch_name(int sm);
/* Parses "sm_90a", "sm_90", "90" …; 0 when unknown. */
int spec_parse_arch(const char *s);
int spec_arch_supported(int sm);

const char *spec_role_name(spec_role role);
/* "mma", "wgmma", "wgmma+tma", "tcgen05+tma": the loop's token in the autotune table's tile text
 * (runtime/tune_table.c, so the written text must not change) and in spec_validate's messages; "?"
 * for a value that is not a spec_mainloop. spec_summary prints its own older words. */
const char *spec_mainloop_name(spec_mainloop loop);
/* "f32", "f16", "bf16" (also the autotune table's dtype tokens); "?" for anything else. */
const char *spec_dtype_name(flce_dtype t);
/* One line that identifies the spec to a person ("logits bf16 D=4096 V=32768 sm_90a 128x128x32 s3 w2x4"). */
void spec_summary(const kernel_spec *s, char *out, size_t cap);
/* spec_summary without D and V: the generated code does not depend on them (the shapes arrive as
 * kernel parameters; what does depend on them is a flag: tiles, plain_out, full_tiles), so the
 * source and the cache key carry this one and a new shape with the same flags finds its kernels. */
void spec_code_summary(const kernel_spec *s, char *out, size_t cap);

/* Dynamic shared memory bytes a GEMM spec needs (0 for ROWOPS). */
size_t spec_smem_bytes(const kernel_spec *s);
/* 1 when a red_acc kernel updates fp32 accumulators by bulk reductions from shared memory (a
 * second 2 KiB staging buffer per warp, where it fits: templates/gemm_grad.cu, FLCE_GRAD_BULK). */
int spec_bulk_red(const kernel_spec *s);
/* 1 when a plain logits kernel (no compact, qrows or fused dZ store) stores fp32 Z through two
 * 2 KiB staging buffers per warp, where they fit (templates/gemm_logits.cu, FLCE_Z_STAGED). */
int spec_staged_z(const kernel_spec *s);
int spec_threads(const kernel_spec *s);
/* Largest dynamic shared memory per block of an arch (opt-in limit). */
size_t spec_smem_limit(int sm);
/* Tensor-memory columns a tcgen05 spec allocates (two BN-column fp32 accumulators, rounded up to
 * the power of two tcgen05.alloc takes); 0 for other specs. sm_100 has 512 columns × 128 lanes. */
int spec_tmem_columns(const kernel_spec *s);
enum { SPEC_TMEM_COLUMNS_SM100 = 512 };

/* FLCE_OK, or FLCE_ERR_INVALID_ARGUMENT / FLCE_ERR_UNSUPPORTED with a message naming the field. */
flce_status spec_validate(const kernel_spec *s);

/* The settings that choose among the built-in tiles, passed as data (runtime/config.h fills them
 * from FLCE_TMA and FLCE_ENABLE_SM100; the generator reads no environment). */
typedef struct spec_knobs {
    int tma;          /* sm_90 16-bit: 1 the TMA wgmma tile (default), 0 the cp.async wgmma tile */
    int enable_sm100; /* sm_100 16-bit: 1 the tcgen05 tile (not yet run on hardware), 0 the portable
                       * tile (default) */
} spec_knobs;

/* The default tile of a role and dtype on an arch (the built-in heuristic) under knobs k. */
spec_tile spec_tile_pick(int sm, flce_dtype dtype, spec_role role, spec_knobs k);

/* spec_tile_pick under the process's settings (config_get's tiles; defined in runtime/config.c). */
spec_tile spec_default_tile(int sm, flce_dtype dtype, spec_role role);

#endif
