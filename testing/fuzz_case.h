/*
 * fuzz_case.h — the GPU differential fuzzer's CPU half (`flce fuzz`, tools/cmd_fuzz.c): case K of
 * seed S as a random problem with every option, its data, and the fp64 reference on sampled rows,
 * plus the comparison of the GPU's outputs with it. Nothing here touches a GPU, so the cpu test
 * (tests/test_fuzz_gen.c) checks the generator's determinism and ranges and runs the checker on
 * outputs simulated from the full reference.
 *
 * Reproducibility: everything of case K comes from host_rng seeded with (S, K) alone (and, for
 * cases that share kernels, from (S, pool id)), so `flce fuzz --seed S --case K` rebuilds the
 * identical problem and data whatever the worker count or the order cases ran in.
 */
#ifndef FLCE_FUZZ_CASE_H
#define FLCE_FUZZ_CASE_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"
#include "tensor_fields.h"

/* Bounds of the random problems (issue 7). */
#define FZ_MAX_TOKENS 40000
#define FZ_MAX_HIDDEN 8192
#define FZ_MAX_VOCAB 256000

/* How the GPU is driven. */
typedef enum fz_mode {
    FZ_FORWARD = 0,       /* flce_forward: loss, lse, per-token outputs */
    FZ_LOSS_AND_GRAD = 1, /* flce_loss_and_grad with problem.strategy (AUTO, CHUNKED, RECOMPUTE) */
    FZ_BACKWARD = 2       /* flce_forward, then flce_backward from the saved lse */
} fz_mode;

typedef struct fz_case {
    uint64_t seed, index;
    int64_t pool;          /* kernel-sharing class (see fuzz_case.c), -1 = a class of its own */
    flce_problem p;        /* what the GPU gets: global labels, vocab_offset, ignore_index */
    fz_mode mode;
    unsigned outputs;      /* the TENSOR_* it asks for (a NULL pointer otherwise) */
    int grad_output;       /* pass an upstream gradient (1 value, or N for reduction none) */
    double logit_sd;       /* standard deviation of h·w */
    double ignore_frac;    /* share of tokens labelled ignore_index */
    int ignore_layout;     /* 0 scattered, 1 a leading block, 2 a trailing block */
    int edge_labels;       /* labels 0 and V_r−1 of the shard appear */
    int full_ref;          /* small enough for the whole fp64 reference; else sampled rows */
} fz_case;

/* Case `index` of `seed`. Deterministic; never fails. */
void fz_case_make(uint64_t seed, uint64_t index, fz_case *c);
/* N·V_r·D: the multiply-adds of one logits GEMM (what a case costs). */
double fz_case_work(const fz_case *c);
/* One line: shapes, dtype, mode, options. */
void fz_case_describe(const fz_case *c, char *out, size_t len);

/* The data of a case: GPU-side arrays in the input dtype, and fp64 copies the reference reads
 * (the same values: generated, then rounded to the dtype). */
typedef struct fz_data {
    int64_t n, d, v;       /* tokens, hidden, vocab shard */
    int64_t n_loss;        /* 1, or N for reduction none */
    double *h, *w, *b;     /* N×D, V×D, V (b only with bias) */
    double *cw;            /* vocab_total class weights (global ids), or NULL */
    double *go;            /* n_loss upstream gradients, or NULL */
    int64_t *labels;       /* N global labels as the GPU sees them */
    int64_t *ref_labels;   /* N labels of the shard-local reference: local id or −100 */
    float *acc_h, *acc_w;  /* accumulate mode: the fp32 values dH/dW are added to, or NULL */
    void *h_dt, *w_dt, *b_dt; /* h, w, b in the dtype */
} fz_data;

/* Returns 0, or -1 when host memory runs out (then fz_data_free is still safe). */
int fz_data_make(const fz_case *c, fz_data *x);
void fz_data_free(fz_data *x);

/* What the GPU produced, on the host. Per-token arrays are whole (N values); gradient rows only
 * for the sampled tokens and vocab rows (fz_sample), as doubles. A NULL array was not asked for. */
typedef struct fz_got {
    double *loss;          /* n_loss */
    double *lse, *lpt, *zl, *logprob, *entropy; /* N (zl: n_loss) */
    int64_t *argmax;       /* N */
    double *dh_rows;       /* n_tok × D */
    double *dw_rows, *db_rows; /* n_voc × D, n_voc */
    int nonfinite;         /* set by the caller: NaN/Inf/poison anywhere in the outputs it scanned */
} fz_got;

/* Frees (and NULLs) the per-token arrays of g that case c did not ask for, as a GPU run leaves them
 * absent (the checker's model tests build every array first). */
void fz_got_drop_unasked(const fz_case *c, fz_got *g);

/* The rows that are compared: tokens and vocab rows (shard-local ids). */
typedef struct fz_sample {
    int64_t *tok, *voc;
    int64_t n_tok, n_voc;
} fz_sample;

/* Picks the sampled rows (all of them for full_ref cases). Returns 0 or -1 (memory). */
int fz_sample_make(const fz_case *c, const fz_data *x, fz_sample *s);
void fz_sample_free(fz_sample *s);
/* fz_data_make then fz_sample_make: 0, or -1 (memory) with both freed. */
int fz_inputs_make(const fz_case *c, fz_data *x, fz_sample *s);

/* Quantities compared, in this order in fz_result.err. */
enum {
    FZ_Q_LOSS, FZ_Q_LSE, FZ_Q_LPT, FZ_Q_ZL, FZ_Q_LOGPROB, FZ_Q_ENTROPY, FZ_Q_ARGMAX,
    FZ_Q_DH, FZ_Q_DW, FZ_Q_DB, FZ_Q_COUNT
};
extern const char *const fz_q_names[FZ_Q_COUNT];

typedef struct fz_result {
    double err[FZ_Q_COUNT]; /* error measure (see fuzz_case.c), −1 = not checked */
    double tol[FZ_Q_COUNT];
    int failed;             /* a quantity over its tolerance, non-finite, or nonfinite set */
    char detail[400];       /* each failed quantity's worst row, for the report */
} fz_result;

/* Compares `g` with the fp64 reference. `sample` must come from fz_sample_make on the same case.
 * Returns 0, or -1 when memory runs out. */
int fz_check(const fz_case *c, const fz_data *x, const fz_sample *s, const fz_got *g,
             fz_result *r);

/* The reference problem the checker uses: the shard seen as a whole vocab of V_r (vocab_offset 0,
 * labels local, ignore_index −100). */
flce_problem fz_ref_problem(const fz_case *c);

/* Logit z_ij of the reference problem (softcap and temperature applied), as the checker sees it. */
double fz_case_logit(const fz_case *c, const fz_data *x, int64_t i, int64_t j);

/* Per-token gradient scale g_i of the reference for every token (N values, caller frees). */
double *fz_token_scales(const fz_case *c, const fz_data *x);

#endif
