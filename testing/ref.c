/*
 * ref.c — the fp64 CPU reference of docs/DESIGN.md §1 (contract in ref.h). Every GPU test and
 * `flce demo` compares against it, and tests/test_ref.c checks it by finite differences, so it
 * favours obviously-correct loops over speed; the only concession to speed is a loop order that
 * streams each weight row contiguously (tests run it at N=64, V=5000, D=256).
 *
 * Class weights (ref_extra.class_weight, w_j) follow torch.nn.functional.cross_entropy(weight=,
 * label_smoothing=) exactly (aten/src/ATen/native/LossNLL.cpp, cross_entropy_loss_label_smoothing):
 *
 *     loss_i = (1−ε)·w_y·(lse_i − z_iy) + (ε/V)·Σ_j w_j·(lse_i − z_ij)  [+ w_y·λ·lse_i²]
 *     mean   = Σ_i loss_i / Σ_{valid i} w_{y_i}        (both terms share that denominator)
 *
 * i.e. the smoothing term weights each class by its own weight, not by the target's. PyTorch has
 * no z-loss; we scale it by w_y like the target term (a token's weight says how much that token
 * counts), which keeps the mean a weighted average of per-token losses. With all w_j = 1 this is
 * exactly §1.
 */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Scalar options of one problem, widened to double once (the problem stores floats). */
typedef struct ref_opts {
    double eps;      /* label smoothing ε */
    double lambda;   /* z-loss λ */
    double cap;      /* softcap c; 0 = off */
    double inv_temp; /* 1/T */
    int has_bias;
} ref_opts;

/* Running statistics of one row's logits, kept online (running max m, sums rescaled to m) so that
 * no exp() can overflow whatever the logits' size: the same scheme the kernels use. */
typedef struct ref_stats {
    double m;       /* largest z so far */
    double s;       /* Σ exp(z − m) */
    double pz;      /* Σ exp(z − m)·z */
    double wz;      /* Σ w_j·z_j (Σ z_j without class weights), for smoothing */
    double z_y;     /* the target's logit */
    int64_t argmax; /* first index of m */
} ref_stats;

int64_t ref_vocab_size(const flce_problem *p) {
    return p->vocab_total > 0 ? p->vocab_total : p->vocab_offset + p->vocab_shard;
}

static ref_opts ref_opts_of(const flce_problem *p) {
    ref_opts o;
    o.eps = p->label_smoothing;
    o.lambda = p->z_loss;
    o.cap = p->softcap > 0 ? p->softcap : 0.0;
    /* The library rejects T <= 0; a zeroed problem (T = 0) is read as the default T = 1 so that a
     * caller who forgot flce_problem_init still gets the plain math rather than infinities. */
    o.inv_temp = p->temperature > 0 ? 1.0 / p->temperature : 1.0;
    o.has_bias = p->has_bias != 0;
    return o;
}

static int ref_label_valid(const flce_problem *p, int64_t label, int64_t v) {
    return label != p->ignore_index && label >= 0 && label < v;
}

static double ref_weight(const ref_extra *x, int64_t j) {
    return x && x->class_weight ? x->class_weight[j] : 1.0;
}

static double ref_dot(const double *a, const double *b, int64_t d) {
    double acc = 0.0;
    for (int64_t k = 0; k < d; k++)
        acc += a[k] * b[k];
    return acc;
}

/* z_j of §1 from the raw logit u_j = h·w_j (+ b_j): temperature first, then the softcap. */
static double ref_logit(const ref_opts *o, double u) {
    double z = u * o->inv_temp;
    return o->cap > 0 ? o->cap * tanh(z / o->cap) : z;
}

/* ∂z/∂u at z: the softcap's 1 − tanh² = 1 − (z/c)², times the temperature's 1/T. */
static double ref_logit_slope(const ref_opts *o, double z) {
    double slope = o->inv_temp;
    if (o->cap > 0) {
        double t = z / o->cap;
        slope *= 1.0 - t * t;
    }
    return slope;
}

static void ref_stats_add(ref_stats *st, int64_t j, double z, double wj) {
    if (z > st->m) {
        /* Rescale the sums to the new max; exp(m_old − z) <= 1 and is 0 for the first entry. */
        double r = st->s > 0 ? exp(st->m - z) : 0.0;
        st->s = st->s * r + 1.0;
        st->pz = st->pz * r + z;
        st->m = z;
        st->argmax = j;
    } else {
        double e = exp(z - st->m);
        st->s += e;
        st->pz += e * z;
    }
    st->wz += wj * z;
}

/* One pass over the vocab: statistics of the row, and the logits z_j into z (if not NULL). */
static ref_stats ref_row_stats(const ref_opts *o, const ref_extra *x, int64_t d, int64_t v,
                               const double *h_row, const double *w, const double *bias,
                               int64_t label, double *z) {
    ref_stats st = {-INFINITY, 0.0, 0.0, 0.0, 0.0, 0};
    for (int64_t j = 0; j < v; j++) {
        double u = ref_dot(h_row, w + j * d, d);
        if (o->has_bias && bias)
            u += bias[j];
        double zj = ref_logit(o, u);
        ref_stats_add(&st, j, zj, ref_weight(x, j));
        if (j == label)
            st.z_y = zj;
        if (z)
            z[j] = zj;
    }
    return st;
}

static double ref_weight_total(const ref_extra *x, int64_t v) {
    if (!x || !x->class_weight)
        return (double)v;
    double t = 0.0;
    for (int64_t j = 0; j < v; j++)
        t += x->class_weight[j];
    return t;
}

/* In place: z_j -> ∂loss/∂u_j for a valid label (the class-weighted form of §1, see the top).
 *   ∂loss/∂z_j = [w_y(1−ε) + 2λ·w_y·lse + ε·W/V]·p_j − w_y(1−ε)·1[j=y] − ε·w_j/V,   W = Σ_k w_k
 * then the chain rule through softcap and temperature. */
static void ref_row_grad(const ref_opts *o, const ref_extra *x, int64_t v, int64_t label,
                         double lse, double *z_to_dz) {
    double w_y = ref_weight(x, label);
    double smooth = o->eps / (double)v;
    double p_coef = w_y * (1.0 - o->eps) + 2.0 * o->lambda * w_y * lse +
                    smooth * ref_weight_total(x, v);
    for (int64_t j = 0; j < v; j++) {
        double z = z_to_dz[j];
        double g = p_coef * exp(z - lse) - smooth * ref_weight(x, j);
        if (j == label)
            g -= w_y * (1.0 - o->eps);
        z_to_dz[j] = g * ref_logit_slope(o, z);
    }
}

void ref_row(const flce_problem *p, const ref_extra *x, int64_t d, int64_t v, const double *h_row,
             const double *w, const double *bias, int64_t label, ref_row_out *out, double *dz) {
    ref_opts o = ref_opts_of(p);
    int valid = ref_label_valid(p, label, v);
    ref_stats st = ref_row_stats(&o, x, d, v, h_row, w, bias, valid ? label : -1, dz);
    double lse = st.m + log(st.s);

    memset(out, 0, sizeof *out);
    out->lse = lse;
    out->entropy = lse - st.pz / st.s;
    out->argmax = st.argmax;
    out->valid = valid;
    if (!valid) {
        if (dz)
            memset(dz, 0, (size_t)v * sizeof *dz);
        return;
    }
    double w_y = ref_weight(x, label);
    double nll = lse - st.z_y;
    double smooth = (lse * ref_weight_total(x, v) - st.wz) / (double)v;
    out->z_loss_term = o.lambda * lse * lse;
    out->target_logprob = st.z_y - lse;
    out->loss = w_y * ((1.0 - o.eps) * nll + out->z_loss_term) + o.eps * smooth;
    if (dz)
        ref_row_grad(&o, x, v, label, lse, dz);
}

/* Denominator of the mean: the count of valid tokens, or Σ w_{y_i} over them with class weights. */
static double ref_mean_denominator(const flce_problem *p, const ref_extra *x, int64_t n, int64_t v,
                                   const int64_t *labels) {
    double den = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (ref_label_valid(p, labels[i], v))
            den += ref_weight(x, labels[i]);
    return den;
}

void ref_token_scales(const flce_problem *p, const ref_extra *x, int64_t n, int64_t v,
                      const int64_t *labels, const double *grad_output, double *g) {
    double go = grad_output ? grad_output[0] : 1.0;
    double scale = go;
    if (p->reduction == FLCE_REDUCTION_MEAN) {
        double den = ref_mean_denominator(p, x, n, v, labels);
        /* Zero valid weight: loss 0 and zero gradients, never 0/0. */
        scale = den != 0.0 ? go / den : 0.0;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!ref_label_valid(p, labels[i], v))
            g[i] = 0.0;
        else if (p->reduction == FLCE_REDUCTION_NONE)
            g[i] = grad_output ? grad_output[i] : 1.0;
        else
            g[i] = scale;
    }
}

/* dh_i = Σ_j dz_j·w_j, dw_j += dz_j·h_i, db_j += dz_j: one streaming pass over the rows of W. */
static void ref_accumulate_grads(int64_t d, int64_t v, const double *h_row, const double *w,
                                 const double *dz, double *dh_row, double *dw, double *db) {
    for (int64_t j = 0; j < v; j++) {
        double g = dz[j];
        if (g == 0.0)
            continue;
        const double *w_row = w + j * d;
        if (dh_row)
            for (int64_t k = 0; k < d; k++)
                dh_row[k] += g * w_row[k];
        if (dw) {
            double *dw_row = dw + j * d;
            for (int64_t k = 0; k < d; k++)
                dw_row[k] += g * h_row[k];
        }
        if (db)
            db[j] += g;
    }
}

static void ref_zero(double *a, size_t count) {
    if (a)
        memset(a, 0, count * sizeof *a);
}

int ref_loss_and_grad(const flce_problem *p, const ref_extra *x, int64_t n, int64_t d, int64_t v,
                      const double *h, const double *w, const double *bias, const int64_t *labels,
                      const double *grad_output, double *loss, double *lse, double *dh, double *dw,
                      double *db) {
    int want_grads = dh || dw || db;
    double *g = malloc((size_t)(n > 0 ? n : 1) * sizeof *g);
    double *dz = want_grads ? malloc((size_t)v * sizeof *dz) : NULL;
    if (!g || (want_grads && !dz)) {
        free(g);
        free(dz);
        return -1;
    }
    ref_token_scales(p, x, n, v, labels, grad_output, g);
    ref_zero(dh, (size_t)(n * d));
    ref_zero(dw, (size_t)(v * d));
    ref_zero(db, (size_t)v);

    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ref_row_out r;
        const double *h_row = h + i * d;
        ref_row(p, x, d, v, h_row, w, bias, labels[i], &r, dz);
        if (lse)
            lse[i] = r.lse;
        if (loss && p->reduction == FLCE_REDUCTION_NONE)
            loss[i] = r.loss;
        total += r.loss;
        if (!want_grads || g[i] == 0.0)
            continue;
        for (int64_t j = 0; j < v; j++)
            dz[j] *= g[i];
        ref_accumulate_grads(d, v, h_row, w, dz, dh ? dh + i * d : NULL, dw, db);
    }
    if (loss && p->reduction != FLCE_REDUCTION_NONE) {
        double den = p->reduction == FLCE_REDUCTION_MEAN ? ref_mean_denominator(p, x, n, v, labels)
                                                         : 1.0;
        loss[0] = den != 0.0 ? total / den : 0.0;
    }
    free(g);
    free(dz);
    return 0;
}

int ref_add_output_grads(const flce_problem *p, const ref_extra *x, int64_t n, int64_t d, int64_t v,
                         const double *h, const double *w, const double *bias, const int64_t *labels,
                         const double *g_lp, const double *g_lse, const double *g_h, double *dh, double *dw,
                         double *db) {
    ref_opts o = ref_opts_of(p);
    double *z = malloc((size_t)(v > 0 ? v : 1) * sizeof *z);
    if (!z)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        int valid = ref_label_valid(p, labels[i], v);
        ref_stats st = ref_row_stats(&o, x, d, v, h + i * d, w, bias, valid ? labels[i] : -1, z);
        double lse = st.m + log(st.s), ent = lse - st.pz / st.s;
        double glp = g_lp && valid ? g_lp[i] : 0.0, gl = g_lse ? g_lse[i] : 0.0, gh = g_h ? g_h[i] : 0.0;
        if (glp == 0.0 && gl == 0.0 && gh == 0.0)
            continue;
        for (int64_t j = 0; j < v; j++) {
            double lp = z[j] - lse, pj = exp(lp);
            double g = glp * ((valid && j == labels[i]) - pj) + gl * pj - gh * pj * (lp + ent);
            z[j] = g * ref_logit_slope(&o, z[j]);
        }
        ref_accumulate_grads(d, v, h + i * d, w, z, dh ? dh + i * d : NULL, dw, db);
    }
    free(z);
    return 0;
}

double ref_rel_l2(const double *ref, const double *got, size_t n) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = got[i] - ref[i];
        diff += e * e;
        norm += ref[i] * ref[i];
    }
    /* NaN in either input propagates through the sums, so a NaN result needs no special case. */
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

/* ---- distillation (contract in ref.h) ----------------------------------------------------- */
/* Where JSD's gradient comes from (s = zs/T, q = softmax(s), m = βp + (1−β)q, p fixed):
 *   D = β Σ p log p + (1−β) Σ q log q − Σ m log m,
 *   ∂D/∂q_j = (1−β)(log q_j + 1) − (1−β)(log m_j + 1) = (1−β)(log q_j − log m_j) =: g_j,
 *   ∂D/∂s_k = q_k (g_k − Σ_j q_j g_j) = (1−β) q_k (log q_k − log m_k − KL(q‖m))   (softmax Jacobian),
 * and ∂s/∂zs = 1/T. Reverse KL is the same computation with g_j = log q_j − log p_j + 1, whose
 * Σ q g is D + 1. All logs stay in log space (log-softmax, log m by logaddexp), so a q_j or p_j
 * that underflows to 0 costs nothing but its own (zero) term. */

/* In place: x -> x − lse(x) (log-softmax in two passes, max first so exp cannot overflow);
 * returns lse(x). A NaN anywhere makes the whole row NaN, which is what we want. */
static double ref_log_softmax(int64_t v, double *x) {
    double m = -INFINITY;
    for (int64_t j = 0; j < v; j++)
        m = x[j] > m || isnan(x[j]) ? x[j] : m;
    double s = 0.0;
    for (int64_t j = 0; j < v; j++)
        s += exp(x[j] - m);
    double lse = m + log(s);
    for (int64_t j = 0; j < v; j++)
        x[j] -= lse;
    return lse;
}

/* a·(la − lb) with the convention 0·anything = 0 (a = e^la underflowed to 0, where la − lb may be
 * −inf or NaN from ∞ − ∞); a NaN a still propagates. */
static double ref_xlogratio(double a, double la, double lb) {
    return a == 0.0 ? 0.0 : a * (la - lb);
}

/* log(β e^lp + (1−β) e^lq) without leaving log space; 0 < β < 1. */
static double ref_log_mix(double beta, double lp, double lq) {
    double a = log(beta) + lp, b = log1p(-beta) + lq;
    double hi = a > b ? a : b, lo = a > b ? b : a;
    if (isnan(a) || isnan(b))
        return a + b;
    if (hi == -INFINITY)
        return -INFINITY;
    return hi + log1p(exp(lo - hi));
}

void ref_distill_row(const ref_distill_problem *p, int64_t v, const double *zs, const double *zt,
                     int64_t label, ref_distill_row_out *out, double *dz) {
    double inv_t = p->temperature > 0 ? 1.0 / p->temperature : 1.0;
    ref_divergence div = p->divergence;
    /* Liger's convention (ref.h): JSD at the ends is a KL, not the formula's 0. */
    if (div == REF_DIV_JSD && p->beta <= 0.0)
        div = REF_DIV_FORWARD_KL;
    else if (div == REF_DIV_JSD && p->beta >= 1.0)
        div = REF_DIV_REVERSE_KL;
    double beta = p->beta;

    double *lq = malloc((size_t)(v > 0 ? v : 1) * sizeof *lq);
    double *lp = malloc((size_t)(v > 0 ? v : 1) * sizeof *lp);
    if (!lq || !lp) {
        /* Callers size v to the test problems; a failed malloc here is reported as NaN. */
        free(lq), free(lp);
        memset(out, 0, sizeof *out);
        out->loss = out->divergence = NAN;
        return;
    }
    for (int64_t j = 0; j < v; j++) {
        lq[j] = zs[j] * inv_t;
        lp[j] = zt[j] * inv_t;
    }
    ref_log_softmax(v, lq);
    ref_log_softmax(v, lp);

    /* The divergence, and r = Σ_j q_j g_j where dz_j ∝ q_j (g_j − r) for the two that need it. */
    double d = 0.0;
    for (int64_t j = 0; j < v; j++) {
        double q = exp(lq[j]), pt = exp(lp[j]);
        if (div == REF_DIV_FORWARD_KL) {
            d += ref_xlogratio(pt, lp[j], lq[j]);
        } else if (div == REF_DIV_REVERSE_KL) {
            d += ref_xlogratio(q, lq[j], lp[j]);
        } else {
            double lm = ref_log_mix(beta, lp[j], lq[j]);
            d += beta * ref_xlogratio(pt, lp[j], lm) + (1.0 - beta) * ref_xlogratio(q, lq[j], lm);
        }
    }
    /* JSD's student-side KL(q‖m), the r of its gradient (the teacher side has no q in front). */
    double kl_qm = 0.0;
    if (div == REF_DIV_JSD && dz)
        for (int64_t j = 0; j < v; j++)
            kl_qm += ref_xlogratio(exp(lq[j]), lq[j], ref_log_mix(beta, lp[j], lq[j]));

    memset(out, 0, sizeof *out);
    out->divergence = d;
    out->valid = label >= 0 && label < v;
    double ce_lse = 0.0;
    if (out->valid) {
        /* CE at temperature 1 from the raw logits: its own log-softmax, not the 1/T one. */
        double m = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < v; j++)
            m = zs[j] > m || isnan(zs[j]) ? zs[j] : m;
        for (int64_t j = 0; j < v; j++)
            s += exp(zs[j] - m);
        ce_lse = m + log(s);
        out->ce = ce_lse - zs[label];
    }
    out->loss = d + (out->valid ? p->ce_weight * out->ce : 0.0);

    if (dz) {
        for (int64_t j = 0; j < v; j++) {
            double q = exp(lq[j]), g;
            if (div == REF_DIV_FORWARD_KL)
                g = q - exp(lp[j]);
            else if (div == REF_DIV_REVERSE_KL)
                g = q == 0.0 ? 0.0 : q * (lq[j] - lp[j] - d);
            else
                g = q == 0.0 ? 0.0
                             : (1.0 - beta) * q * (lq[j] - ref_log_mix(beta, lp[j], lq[j]) - kl_qm);
            g *= inv_t;
            if (out->valid && p->ce_weight != 0.0)
                g += p->ce_weight * (exp(zs[j] - ce_lse) - (j == label));
            dz[j] = g;
        }
    }
    free(lq), free(lp);
}

static int ref_distill_valid(const ref_distill_problem *p, const int64_t *labels, int64_t i,
                             int64_t v) {
    return !labels || (labels[i] != p->ignore_index && labels[i] >= 0 && labels[i] < v);
}

void ref_distill_divergences(const ref_distill_problem *p, int64_t n, int64_t ds, int64_t dt, int64_t v,
                             const double *hs, const double *ws, const double *ht, const double *wt,
                             const int64_t *labels, double *out)
{
    double *zs = malloc(sizeof(double) * (size_t)(v > 0 ? v : 1)), *zt = malloc(sizeof(double) * (size_t)(v > 0 ? v : 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t y = labels ? labels[i] : -1;
        if (!zs || !zt || (labels && (y == p->ignore_index || y < 0 || y >= v))) {
            out[i] = zs && zt ? 0 : NAN;
            continue;
        }
        for (int64_t j = 0; j < v; j++) {
            double a = 0, b = 0;
            for (int64_t k = 0; k < ds; k++) a += hs[i * ds + k] * ws[j * ds + k];
            for (int64_t k = 0; k < dt; k++) b += ht[i * dt + k] * wt[j * dt + k];
            zs[j] = a, zt[j] = b;
        }
        ref_distill_row_out r;
        ref_distill_row(p, v, zs, zt, y, &r, NULL);
        out[i] = r.divergence;
    }
    free(zs), free(zt);
}

int ref_distill(const ref_distill_problem *p, int64_t n, int64_t ds, int64_t dt, int64_t v,
                const double *hs, const double *ws, const double *ht, const double *wt,
                const int64_t *labels, const double *grad_output, double *loss, double *dhs,
                double *dws) {
    if (!labels && p->ce_weight != 0.0)
        return -2;
    size_t vv = (size_t)(v > 0 ? v : 1);
    double *zs = malloc(vv * sizeof *zs), *zt = malloc(vv * sizeof *zt),
           *dz = malloc(vv * sizeof *dz);
    if (!zs || !zt || !dz) {
        free(zs), free(zt), free(dz);
        return -1;
    }
    ref_zero(dhs, (size_t)(n * ds));
    ref_zero(dws, (size_t)(v * ds));

    int64_t count = 0;
    for (int64_t i = 0; i < n; i++)
        count += ref_distill_valid(p, labels, i, v);
    /* Same scaling as ref_token_scales: zero valid tokens give loss 0 and zero gradients. */
    double go = grad_output ? grad_output[0] : 1.0;
    double scale = p->reduction == FLCE_REDUCTION_MEAN ? (count ? go / (double)count : 0.0) : go;
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!ref_distill_valid(p, labels, i, v)) {
            if (loss && p->reduction == FLCE_REDUCTION_NONE)
                loss[i] = 0.0;
            continue;
        }
        const double *hs_row = hs + i * ds, *ht_row = ht + i * dt;
        for (int64_t j = 0; j < v; j++) {
            zs[j] = ref_dot(hs_row, ws + j * ds, ds);
            zt[j] = ref_dot(ht_row, wt + j * dt, dt);
        }
        ref_distill_row_out r;
        int64_t label = labels ? labels[i] : -1;
        int want_grads = dhs || dws;
        ref_distill_row(p, v, zs, zt, label, &r, want_grads ? dz : NULL);
        if (loss && p->reduction == FLCE_REDUCTION_NONE)
            loss[i] = r.loss;
        total += r.loss;
        double g =
            p->reduction == FLCE_REDUCTION_NONE ? (grad_output ? grad_output[i] : 1.0) : scale;
        if (!want_grads || g == 0.0)
            continue;
        for (int64_t j = 0; j < v; j++)
            dz[j] *= g;
        ref_accumulate_grads(ds, v, hs_row, ws, dz, dhs ? dhs + i * ds : NULL, dws, NULL);
    }
    if (loss && p->reduction != FLCE_REDUCTION_NONE)
        loss[0] =
            p->reduction == FLCE_REDUCTION_MEAN ? (count ? total / (double)count : 0.0) : total;
    free(zs), free(zt), free(dz);
    return 0;
}
