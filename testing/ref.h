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

/* ---- distillation (issue 44, step 1: the fp64 oracle; nothing public yet) --------------------
 *
 * Per token i: student logits zs_j = hs_i·ws_j, teacher logits zt_j = ht_i·wt_j (no bias, no
 * softcap), q = softmax(zs/T) (student), p = softmax(zt/T) (teacher), T > 0:
 *   forward KL  D_i = Σ_j p_j (log p_j − log q_j)                          = KL(p‖q)
 *   reverse KL  D_i = Σ_j q_j (log q_j − log p_j)                          = KL(q‖p)
 *   JSD(β)      D_i = β KL(p‖m) + (1−β) KL(q‖m),  m = β p + (1−β) q        (β weights the teacher)
 *               for 0 < β < 1. β = 0 is defined as forward KL and β = 1 as reverse KL (Liger's
 *               LigerFusedLinearJSD convention), NOT the literal formula's limit 0: the value
 *               jumps at both ends, on purpose.
 *   loss_i = D_i + ce_weight·CE_i,  CE_i = lse(zs) − zs_y at temperature 1 (not T).
 * No T² factor anywhere: a caller who wants the usual T²·KL scales the loss (and so the
 * gradients) itself.
 * A token is ignored when labels[i] == ignore_index or the label is outside [0, V) (as ref_row
 * does; the library will flag out-of-range labels): it contributes no divergence, no CE, no
 * gradient, does not count in the mean, and its teacher row is never read. labels == NULL: no token
 * is ignored and there is no CE term (ce_weight must then be 0).
 * Reductions as ref_loss_and_grad: mean = Σ loss_i / (count of valid tokens), 0 when there are
 * none; sum; none (per-token, 0 for ignored tokens). grad_output likewise: NULL means 1, else 1
 * value (mean/sum) or N (none).
 * Gradients only for the student (hs, ws); ∂loss_i/∂zs_j (the "dz" of ref_distill_row):
 *   forward KL  (q_j − p_j)/T
 *   reverse KL  q_j (log q_j − log p_j − D_i)/T
 *   JSD(β)      (1−β)/T · q_j (log q_j − log m_j − KL(q‖m))
 *   CE          ce_weight·(softmax(zs)_j − 1[j=y])
 * NaN: everything is per token, so a NaN in one token's teacher (or student) row gives that
 * token's loss_i and dhs row NaN and leaves the other tokens' values alone; dws (a sum over
 * tokens) and a mean/sum loss are NaN then, as they must be. */
typedef enum ref_divergence {
    REF_DIV_FORWARD_KL = 0,
    REF_DIV_REVERSE_KL = 1,
    REF_DIV_JSD = 2,
} ref_divergence;

typedef struct ref_distill_problem {
    ref_divergence divergence;
    double beta;        /* JSD's β in [0, 1]; ignored by the KLs */
    double temperature; /* T > 0 of both softmaxes of the divergence; <= 0 is read as 1 */
    double ce_weight;   /* weight of the CE term on the student (temperature 1); 0 = none */
    int64_t ignore_index;
    flce_reduction reduction;
} ref_distill_problem;

/* Per-token results of one row (grad_output not applied). */
typedef struct ref_distill_row_out {
    double loss;       /* divergence + ce_weight·ce (the CE only when valid) */
    double divergence; /* D_i */
    double ce;         /* CE_i at temperature 1 (unweighted), 0 without a label */
    int valid;         /* 0 <= label < V: the CE term is in loss */
} ref_distill_row_out;

/* One token from its raw logits zs, zt (V values each, before temperature). Ignoring is
 * ref_distill's business: here the divergence is always computed, and the CE term only when
 * 0 <= label < V (out->valid says so; any other label gives the divergence alone). dz (V values,
 * may be NULL) receives ∂loss_i/∂zs_j. Out of memory (two V-sized buffers) gives a NaN loss. */
void ref_distill_row(const ref_distill_problem *p, int64_t v, const double *zs, const double *zt,
                     int64_t label, ref_distill_row_out *out, double *dz);

/* D_i of every token (out, N values) from the fp64 logits of both models (ref_distill_row), 0 for a
 * token whose label (labels may be NULL: none) is ignore_index or outside [0, V). */
void ref_distill_divergences(const ref_distill_problem *p, int64_t n, int64_t ds, int64_t dt, int64_t v,
                             const double *hs, const double *ws, const double *ht, const double *wt,
                             const int64_t *labels, double *out);

/* The whole problem: hs N×ds, ws V×ds (student), ht N×dt, wt V×dt (teacher), row-major.
 * loss: 1 value (mean/sum) or N (none); dhs (N×ds) and dws (V×ds) may be NULL.
 * Returns 0, -1 when memory runs out, -2 when ce_weight != 0 without labels. */
int ref_distill(const ref_distill_problem *p, int64_t n, int64_t ds, int64_t dt, int64_t v,
                const double *hs, const double *ws, const double *ht, const double *wt,
                const int64_t *labels, const double *grad_output, double *loss, double *dhs,
                double *dws);

#endif
