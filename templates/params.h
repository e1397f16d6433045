/*
 * params.h — the parameter blocks of our kernels, shared word for word by the host (C, runtime/)
 * and the generated CUDA source (the generator pastes this file in). Plain C: fixed-size fields,
 * addresses as unsigned long long, so both compilers lay the structs out identically.
 */
#ifndef FLCE_PARAMS_H
#define FLCE_PARAMS_H

/* A TMA tensor map (CUtensorMap): 128 opaque bytes that cuTensorMapEncodeTiled fills on the host
 * (runtime/tma.c) and the copy engine reads from the kernel's parameter space, which needs the
 * 64-byte alignment CUDA's own type declares. NVRTC has no CUDA headers, hence our own type. */
#ifdef __cplusplus
#define FLCE_ALIGN64 alignas(64)
#else
#define FLCE_ALIGN64 _Alignas(64)
#endif
struct flce_tmap {
    FLCE_ALIGN64 unsigned long long opaque[16];
};

/* flce_gemm: C[m × n] = A[m × k] · B[n × k]ᵀ, operands stored K-major or transposed (see
 * A_KMAJOR/B_KMAJOR), followed by the role's epilogue. "Stored" extents bound the loads: a stored
 * matrix has *_rows rows of *_cols elements, leading dimension ld*; *_cols is a multiple of the
 * 16-byte vector so every vector load is wholly inside or wholly outside. */
struct flce_gemm_params {
    unsigned long long a, b;      /* operand base addresses */
    unsigned long long out;       /* logits: fp32 Z (ld = ldo), dZ (FLCE_FUSED_DZ) or 0; dH/dW: the output */
    unsigned long long addend;    /* dH/dW: values added before the store (may equal out), fp32 or
                                     (addend_dtype) the input dtype, or 0 */
    unsigned long long labels;    /* logits: labels of rows 0..m-1 */
    unsigned long long part_m;    /* logits: per-(row, split) running max, [m][splits] */
    unsigned long long part_s;    /* logits: per-(row, split) Σ exp(z − max) */
    unsigned long long target;    /* logits: z of the row's label when it lies in this shard */
    unsigned long long part_t;    /* logits (entropy): per-(row, split) Σ exp(z − max)·z */
    unsigned long long part_zs;   /* logits (smoothing): per-(row, split) Σ w_j·z */
    unsigned long long part_arg;  /* logits (argmax): per-(row, split) global id of the max, int64 */
    unsigned long long bias;      /* logits: V_r bias values (dtype), already offset to column 0 */
    unsigned long long class_weights; /* logits (smoothing, or dZ): vocab_total fp32 weights, global ids */
    /* logits with the dZ epilogue (FLCE_FUSED_DZ): out is dZ in the input dtype (ld = ldo) */
    unsigned long long lse;         /* fp32 lse of rows 0..m-1 */
    unsigned long long grad_output; /* reduction none: fp32 per-row upstream gradient, or 0 for 1 */
    unsigned long long stats;       /* float[2] of flce_prepare: [1] = Σ_j w_j */
    /* logits with the compact store (FLCE_COMPACT, the chunked strategy's pass): out holds fp16
     * p̃ = exp(z − m)·2^15 (ld = ldo) and tile_max the fp32 m of each (row, WTN-column group), row
     * stride ld_tile_max; the group is one warp tile's width (the whole BN tile on wgmma paths). */
    unsigned long long tile_max;
    long long ld_tile_max;
    long long vocab_total, ignore_index;
    long long m, n, k;
    long long a_rows, a_cols, lda;
    long long b_rows, b_cols, ldb;
    long long ldo;
    long long vocab_offset;       /* logits: global id of column 0 (the shard's or vocab chunk's) */
    int out_f32;                  /* dH/dW: out holds fp32 (else the input dtype) */
    int addend_dtype;             /* dH/dW: the addend holds the 16-bit input dtype (a dW built up in
                                     the caller's own buffer, runtime plan.h dw_in_dtype), else fp32 */
    int splits;                   /* logits: vocab splits (gridDim.y) */
    int tiles_per_split;          /* logits: BN-wide vocab tiles each split walks */
    int group_rows;               /* logits: row blocks per group of the items' order (0: LOGITS_GROUP;
                                     the kernels with the persistent loop, templates/gemm_entry.cu) */
    int persist;                  /* logits: 0, one item per CTA of the (units, splits) grid; else the
                                     grid's units (CTAs or clusters) along x, each walking items
                                     u, u + persist, … (templates/gemm_entry.cu) */
    int raster_rows;              /* dH/dW, TMA (persistent): tiles walk in groups of this many row
                                     blocks × all column tiles, row blocks fastest; 0: column tiles
                                     fastest over all rows */
    int scale_mode;               /* dH/dW: multiply acc by g = 1 (0), grad (1, sum) or grad/count (2,
                                     mean); + 4: and by 1/DZ_SCALE_F16 (fp16 dZ, common.cuh) */
    int red_addend;               /* dH/dW with addend == out (fp32): out += scale·acc by fire-and-
                                     forget reductions (red.global.add) instead of load, add, store */
    int k_splits;                 /* dH on the wgmma TMA path, static walk (runtime plan dh_splits): > 1
                                     walks k_splits × the output tiles: unit u is tile u % tiles over
                                     k columns [s·k_split, min(k, (s + 1)·k_split)), s = u / tiles,
                                     stored in fp32 (out_f32, no addend) to out + s·out_split_stride
                                     bytes; flce_cast sums the slabs in order. 0 or 1: no split */
    unsigned long long scale_grad;  /* fp32 upstream gradient (1 value) or 0 for 1 */
    unsigned long long scale_count; /* float: Σ over valid tokens of w_y (the count without weights) */
    /* dH/dW on the wgmma TMA path without clusters: 0, or a zeroed 64-bit counter from which the
     * persistent CTAs take their tiles after the first (gemm_entry.cu), so that CTAs which start
     * late (SMs held by an overlapping NCCL kernel) take fewer tiles instead of finishing late. */
    unsigned long long tile_counter;
    /* With tile_counter: CTA b of this launch is CTA block0 + b of the whole dW; tiles below
     * counter_base go one to each such CTA as its first, the rest come from the counter numbered
     * from counter_base. One launch: block0 0, counter_base its grid. Under FLCE_TP_OVERLAP a
     * second, late launch (block0 = counter_base = the first's grid) joins the same counter once
     * the dH all-reduce has freed the SMs it held (launch.c run_dw_beside_reduction). */
    long long counter_base, block0;
    /* Logits with FLCE_QROWS (the compact pass stores bf16 exp(z − ref)): qref the fp32 reference c
     * of each row (flce_qref), qflags an int per row set to 1 where a tile's maximum lies more than
     * QROWS_SPAN above c (that tile's ref is its maximum; tile_max holds every (row, tile)'s ref).
     * dH: row_scale, 0 or an fp32 factor per row of the launch that multiplies its accumulators
     * (flce_qscale's s_i; a 0 factor gives 0 whatever the accumulator holds). */
    unsigned long long qref, qflags, row_scale;
    /* Logits with OPT_SOFT (the distillation's student pass; no FLCE_QROWS, no FLCE_FUSED_DZ, so
     * these fields are free there): qref is the teacher pass's compact fp16 p̃ of the same rows and
     * columns (ld = ldo), qflags its fp32 group maxima (ld = ld_tile_max, the same column groups),
     * and lse the teacher's fp32 lse of rows 0..m-1 (templates/gemm_logits.cu). With OPT_SPARSE
     * instead: qref SPARSE_K int32 ids per row (sorted, padded past every column), qflags their fp32
     * weights (gemm_logits.cu sparse_sum). */
    /* dH with row_scale and the label terms in its epilogue (the runtime's qdh off; else 0): qlab,
     * flce_qscale's (dz, label column) pairs per row, whose dz times the label's row of B is added
     * where that column lies in this launch's k range [qlab_k0, qlab_k0 + k) (B's row
     * qcol − qlab_k0). */
    unsigned long long qlab;
    long long qlab_k0;
    long long k_split;                   /* with k_splits: k columns per split, a multiple of BK */
    unsigned long long out_split_stride; /* with k_splits: bytes from one split's fp32 slab to the next */
    /* TMA path (spec tile.tma): maps of the stored A and B with the tile's boxes, encoded per
     * launch by runtime/tma.c; unused (zero) otherwise. */
    struct flce_tmap tmap_a, tmap_b;
};

/* Tensor parallelism: each rank's block of the statistics all-gather is a header of FLCE_TP_HEADER
 * 32-bit words (int64 vocab_offset, vocab_shard, vocab_total, tokens: every rank checks that the
 * shards tile the vocab) followed by FLCE_TP_RECORD words per token row: float max, Σexp, Σexp·z,
 * Σw·z, the target logit (0 when the label is on another rank), unused, then the int64 argmax. */
#define FLCE_TP_HEADER 8
#define FLCE_TP_RECORD 8

/* The device-side error flags are two host-mapped ints: [0] is set to 1 by any kernel that sees a
 * bad label; [1] gathers these bits, written by one thread of the TP combine. */
#define FLCE_FLAG_TP_SHARDS 1   /* shards overlap or leave gaps */
#define FLCE_FLAG_TP_TOTAL 2    /* ranks disagree on vocab_total */
#define FLCE_FLAG_TP_TOKENS 4   /* ranks disagree on the token count */

/* Threads of the one-CTA row kernels (rowops.cu flce_prepare and flce_reduce): their launch bounds,
 * shared scratch and fixed summation tree, and the block size launch.c launches them with. A power
 * of two (the tree halves it) and at most the 1024 threads a CTA can have. */
#define FLCE_ROW_CTA_THREADS 1024

/* Lanes per row of flce_combine and flce_tp_pack, which merge a row's vocab splits together (a
 * power of two ≤ 32; launch.c launches rows × FLCE_MERGE_LANES threads). */
#define FLCE_MERGE_LANES 8

/* The row kernels of rowops.cu: prepare, combine, dz, reduce. Row-indexed arrays named "(all)"
 * hold all N tokens and are indexed by row0 + i; the others belong to the current chunk. */
struct flce_row_params {
    unsigned long long labels;      /* (all) */
    unsigned long long part_m, part_s, target, part_t, part_zs, part_arg;
    unsigned long long z;           /* fp32 chunk logits [rows][ldz], column j = global id chunk_offset + j */
    unsigned long long dz;          /* dZ in the input dtype [rows][ldz] (may alias z for fp32) */
    unsigned long long lse;         /* (all) */
    unsigned long long loss_rows;   /* (all) per-token loss */
    unsigned long long loss_copy;   /* (all) a second place for the per-token loss, or 0 */
    unsigned long long zloss_rows;  /* (all) per-token λ·w_y·lse², or 0 */
    unsigned long long loss_out;    /* the reduced loss (1 value) or 0 */
    unsigned long long zloss_out;   /* the reduced z-loss (1 value) or 0 */
    unsigned long long logprob, entropy, argmax; /* (all) per-token outputs or 0 */
    unsigned long long grad_output; /* fp32 upstream gradient: 1 value, N values (none), or 0 */
    unsigned long long stats;       /* float[2]: Σ_valid w_y (the mean's denominator), Σ_j w_j */
    unsigned long long class_weights; /* vocab_total fp32 weights, or 0 */
    unsigned long long flag;        /* int[2]: [0] set to 1 when a label is out of range; [1] TP bits */
    unsigned long long dbias_acc;   /* fp32 [V_r] accumulator of db, or 0 */
    unsigned long long grad_bias;   /* dtype [V_r] db output, or 0 */
    long long tokens, row0, rows, ldz;
    long long chunk_offset;         /* global id of column 0 of z/dz */
    long long cols;                 /* valid columns of z/dz */
    long long col0;                 /* chunk_offset − the shard's first global id */
    long long vocab_offset, vocab_total, ignore_index;
    int splits;
    int first, last;                /* dbias: first and last pass of the accumulation */
    /* tensor parallelism (docs/DESIGN.md §2) */
    unsigned long long tp_send;     /* this rank's block of the all-gather */
    unsigned long long tp_recv;     /* every rank's block, in rank order (0 without TP) */
    long long vocab_shard;          /* this rank's rows, for the header */
    int tp_size;
    int cast_accumulate;            /* flce_cast: add into fp32 instead of storing the dtype */
    unsigned long long cast_src;    /* flce_cast: fp32 values */
    unsigned long long cast_dst;    /* flce_cast: dtype values, or fp32 ones to add into */
    long long cast_count;
    /* flce_cast: cast_src holds cast_splits > 1 slabs of cast_count fp32 values, cast_split_stride
     * values apart (dH split over k: params.h k_splits), summed in slab order; 0 or 1: one */
    long long cast_split_stride;
    int cast_splits;
    /* flce_dz over compact logits (the logits pass's FLCE_COMPACT store): z holds fp16 p̃ =
     * exp(z − m)·2^15, tile_max the fp32 m per (row, tile_cols-wide group), row stride
     * tile_max_ld; 0 when z holds fp32 logits. dz then overwrites p̃ in place. */
    unsigned long long tile_max;
    long long tile_max_ld;
    long long tile_cols;
    /* flce_cast in place (flce_scale_gradients): cast_dst *= the fp32 scalar at cast_scale, in the
     * dtype; the kernel reads it first and does nothing when it is exactly 1. 0: a plain cast. */
    unsigned long long cast_scale;
    /* The chunked strategy's row-scaled compact logits (FLCE_QROWS, templates/gemm_logits.cu):
     * flce_qref reads the chunk's hidden rows and sampled weight rows (d per row) and writes qref and
     * zeroes qflags (both chunk rows); flce_qscale rescales flagged rows to the reference lse,
     * writes row_scale (s_i, chunk rows), qh (hidden rows times s_i in the dtype, [rows][d]) and
     * the label's entry of z (the compact logits). */
    unsigned long long hidden, weight, qref, qflags, row_scale, qh;
    long long d;
    int qref_warps;                 /* flce_qref: warps per group of rows, each a slice of d (1, 2, 4, 8) */
    /* flce_qscale: per chunk row, the label's exact dz_iy (fp32; its stored entry is set to 0) and
     * column (int, −1 for none), which flce_qdh (or dH's epilogue: params above, qlab) and flce_qdw
     * add;
     * flce_qlist_count/_fill: the chunk rows grouped by label, qlist_start (cols + 1 ints),
     * qlist_tok (rows ints), qlist_blk (one int per 128 vocab rows) */
    unsigned long long qlab, qlist_start, qlist_tok, qlist_blk;
    /* OPT_TOKEN_GRADS (flce.h grad_outputs): fp32 per-token upstream gradients of target_logprob,
     * lse and entropy (N values each, or 0 for zeros); entropy (above) is then read as H */
    unsigned long long grad_logprob, grad_lse, grad_entropy;
    unsigned long long grad_loss_rows; /* fp32 per-token gradient of loss_i, added to g_i (or 0) */
    /* flce_qdw / flce_qdh: the dW rows of this launch's output / the chunk's dH rows (cast_dst, fp32
     * where cast_accumulate, else the dtype; row stride d) to which the labels' Σ dz_i·h_i / dz_i·W_y
     * are added */
};

#endif
