/*
 * ref.h — the fp64 CPU reference of docs/DESIGN.md §1: the oracle that every GPU test and `flce demo`
 * compares against. Plain loops, no cleverness, every option of the math (so later issues can
 * test against it), itself checked by finite differences in tests/test_ref.c.
 *
 * Shapes: h is N × D, w is V × D (the FULL vocab, V = problem->vocab_total or vocab_offset +
 * vocab_shard when vocab_total is 0), row-major doubles. Labels are int64 whatever label_bits says.
 * The reference ignores dtype, tp_*, strategy and memory_budget: it is the exact math.
 */
#ifndef FLCE_REF_H
#define FLCE_REF_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"

/* Inputs of the math that are tensors, not problem fields: the class weights (tensors.class_weights). */
typedef struct ref_extra {
    const double *class_weight; /* V weights as torch cross_entropy(weight=); NULL = all 1 */
} ref_extra;

/* Per-token results of one row (g_i not applied). */
typedef struct ref_row_out {
    double lse;          /* log Σ_j exp(z_j) over the full vocab, z after bias/temperature/softcap */
    double loss;         /* loss_i of §1 (smoothing and z-loss included), 0 when ignored */
    double z_loss_term;  /* λ·lse², 0 when ignored */
    double target_logprob; /* z_y − lse (0 when ignored) */
    double entropy;      /* lse − Σ_j p_j z_j */
    int64_t argmax;      /* first j of the largest z_j */
    int valid;           /* label != ignore_index and 0 <= label < V */
} ref_row_out;

/* V of a problem: vocab_total, or vocab_offset + vocab_shard when vocab_total is 0. */
int64_t ref_vocab_size(const flce_problem *p);

/* One token. dz (V values, may be NULL) receives ∂loss_i/∂z_j · ∂z_j/∂(h·w_j) chain (i.e. the
 * gradient w.r.t. the raw pre-bias logits h·w_j), for g_i = 1; zeros when the label is ignored. */
void ref_row(const flce_problem *p, const ref_extra *x, int64_t d, int64_t v, const double *h_row,
             const double *w, const double *bias, int64_t label, ref_row_out *out, double *dz);

/* The whole problem. loss: 1 value (mean/sum) or N (none). lse, dh (N×D), dw (V×D), db (V) may be
 * NULL. grad_output: NULL means 1; else 1 value (mean/sum) or N (none).
 * Returns 0, or -1 when memory runs out. */
int ref_loss_and_grad(const flce_problem *p, const ref_extra *x, int64_t n, int64_t d, int64_t v,
                      const double *h, const double *w, const double *bias, const int64_t *labels,
                      const double *grad_output, double *loss, double *lse, double *dh, double *dw,
                      double *db);

/* The gradients of the per-token outputs' terms Σ_i g_lp,i·logprob_i + g_lse,i·lse_i + g_H,i·H_i
 * (problem.grad_outputs: upstream gradients of target_logprob, lse and entropy; any may be NULL;
 * a log-prob is 0 for an ignored token) ADDED into dh (N×D), dw (V×D) and db (V), each may be NULL:
 *   ∂/∂z_j = g_lp·(1[j=y] − p_j) + g_lse·p_j − g_H·p_j·(log p_j + H), through softcap and temperature.
 * Returns 0, or -1 when memory runs out. */
int ref_add_output_grads(const flce_problem *p, const ref_extra *x, int64_t n, int64_t d, int64_t v,
                         const double *h, const double *w, const double *bias, const int64_t *labels,
                         const double *g_lp, const double *g_lse, const double *g_h, double *dh, double *dw,
                         double *db);

/* g_i of §1 for each token (reduction, count of valid tokens, ignore_index, class weights). */
void ref_token_scales(const flce_problem *p, const ref_extra *x, int64_t n, int64_t v,
                      const int64_t *labels, const double *grad_output, double *g);

/* ‖got − ref‖₂ / ‖ref‖₂ (‖got − ref‖₂ when ‖ref‖₂ is 0); NaN anywhere gives NaN. */
double ref_rel_l2(const double *ref, const double *got, size_t n);

#endif
