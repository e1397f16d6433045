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
    unsigned long long out;       /* logits: fp32 Z (ld = ldo) or 0; dH/dW: the output */
    unsigned long long addend;    /* dH/dW: fp32 values added before the store (may equal out), or 0 */
    unsigned long long labels;    /* logits: labels of rows 0..m-1 */
    unsigned long long part_m;    /* logits: per-(row, split) running max, [m][splits] */
    unsigned long long part_s;    /* logits: per-(row, split) Σ exp(z − max) */
    unsigned long long target;    /* logits: z of the row's label when it lies in this shard */
    unsigned long long part_t;    /* logits (entropy): per-(row, split) Σ exp(z − max)·z */
    unsigned long long part_zs;   /* logits (smoothing): per-(row, split) Σ w_j·z */
    unsigned long long part_arg;  /* logits (argmax): per-(row, split) global id of the max, int64 */
    unsigned long long bias;      /* logits: V_r bias values (dtype), already offset to column 0 */
    unsigned long long class_weights; /* logits (smoothing): vocab_total fp32 weights, global ids */
    long long m, n, k;
    long long a_rows, a_cols, lda;
    long long b_rows, b_cols, ldb;
    long long ldo;
    long long vocab_offset;       /* logits: global id of column 0 (the shard's or vocab chunk's) */
    int out_f32;                  /* dH/dW: out holds fp32 (else the input dtype) */
    int splits;                   /* logits: vocab splits (gridDim.y) */
    int tiles_per_split;          /* logits: BN-wide vocab tiles each split walks */
    int scale_mode;               /* dH/dW: multiply acc by g = 1 (0), grad (1, sum) or grad/count (2, mean) */
    unsigned long long scale_grad;  /* fp32 upstream gradient (1 value) or 0 for 1 */
    unsigned long long scale_count; /* float: Σ over valid tokens of w_y (the count without weights) */
    /* TMA path (spec tile.tma): maps of the stored A and B with the tile's boxes, encoded per
     * launch by runtime/tma.c; unused (zero) otherwise. */
    struct flce_tmap tmap_a, tmap_b;
};

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
    unsigned long long flag;        /* int: raised (set to 1) when a label is out of range */
    unsigned long long dbias_acc;   /* fp32 [V_r] accumulator of db, or 0 */
    unsigned long long grad_bias;   /* dtype [V_r] db output, or 0 */
    long long tokens, row0, rows, ldz;
    long long chunk_offset;         /* global id of column 0 of z/dz */
    long long cols;                 /* valid columns of z/dz */
    long long col0;                 /* chunk_offset − the shard's first global id */
    long long vocab_offset, vocab_total, ignore_index;
    int splits;
    int first, last;                /* dbias: first and last pass of the accumulation */
    int pad_;
};

#endif
