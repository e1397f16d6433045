/*
 * test_ref.c — checks the oracle itself: the fp64 reference of docs/DESIGN.md §1 (testing/ref.c) by
 * central finite differences for every option and reduction, against a direct two-pass
 * (log-softmax) formula, on edge cases (ignored labels, huge logits, hand-computed values); the
 * distillation reference (ref_distill: the same finite differences for every divergence, closed
 * forms, masking, NaN containment); and the host helpers (testing/host.c): 16-bit conversions,
 * the random generator, rel_l2.
 * Fresh random data every run; FLCE_SEED=<printed seed> replays a run. CTest label: cpu.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "host.h"
#include "ref.h"

static host_rng rng;

/* What flce_problem_init will give (the library defines it; this test does not link it). */
static flce_problem test_problem(int64_t n, int64_t d, int64_t v) {
    flce_problem p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.api_version = FLCE_API_VERSION;
    p.tokens = n;
    p.hidden = d;
    p.vocab_shard = v;
    p.dtype = FLCE_DTYPE_F32;
    p.label_bits = 32;
    p.reduction = FLCE_REDUCTION_MEAN;
    p.ignore_index = -100;
    p.temperature = 1.0f;
    p.tp_size = 1;
    return p;
}

static void *test_alloc(size_t count, size_t size) {
    void *a = calloc(count ? count : 1, size);
    if (!a) {
        fprintf(stderr, "test_ref: out of memory\n");
        exit(1);
    }
    return a;
}

static double *test_normal(size_t count, double sd) {
    double *a = test_alloc(count, sizeof *a);
    for (size_t i = 0; i < count; i++)
        a[i] = sd * host_rng_normal(&rng);
    return a;
}

static double *test_uniform(size_t count, double lo, double hi) {
    double *a = test_alloc(count, sizeof *a);
    for (size_t i = 0; i < count; i++)
        a[i] = lo + (hi - lo) * host_rng_uniform(&rng);
    return a;
}

static int all_zero(const double *a, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (a[i] != 0.0)
            return 0;
    return 1;
}

static int all_finite(const double *a, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (!isfinite(a[i]))
            return 0;
    return 1;
}

/* ---- random problems ---------------------------------------------------------------------- */

/* The options of one finite-difference case. */
typedef struct opt_case {
    float eps, lambda, cap, temp; /* temp 0 means the default 1 */
    int bias, weights;
    flce_reduction reduction;
} opt_case;

/* One random problem with its inputs. */
typedef struct prob {
    flce_problem p;
    ref_extra x;
    int64_t n, d, v;
    double *h, *w, *b, *cw, *go;
    int64_t *labels;
} prob;

/* Logits of sd about 2 (peaked enough that softcap 2 bends them), one ignored token and one
 * out-of-range label (treated as ignored) whenever n allows, so every case checks masking too. */
static prob prob_make(const opt_case *c, int64_t n, int64_t d, int64_t v) {
    prob t;
    memset(&t, 0, sizeof t);
    t.p = test_problem(n, d, v);
    t.p.label_smoothing = c->eps;
    t.p.z_loss = c->lambda;
    t.p.softcap = c->cap;
    t.p.temperature = c->temp > 0 ? c->temp : 1.0f;
    t.p.has_bias = c->bias;
    t.p.reduction = c->reduction;
    t.n = n, t.d = d, t.v = v;
    t.h = test_normal((size_t)(n * d), 1.0);
    t.w = test_normal((size_t)(v * d), 2.0 / sqrt((double)d));
    t.b = c->bias ? test_normal((size_t)v, 1.0) : NULL;
    if (c->weights) {
        t.cw = test_uniform((size_t)v, 0.25, 2.0);
        t.x.class_weight = t.cw;
    }
    t.go = c->reduction == FLCE_REDUCTION_NONE ? test_normal((size_t)n, 1.0)
                                               : test_uniform(1, 0.5, 1.5);
    t.labels = test_alloc((size_t)n, sizeof *t.labels);
    for (int64_t i = 0; i < n; i++)
        t.labels[i] = host_rng_below(&rng, v);
    if (n >= 3)
        t.labels[1] = t.p.ignore_index;
    if (n >= 4)
        t.labels[3] = v; /* out of range: the library flags it, the reference ignores it */
    return t;
}

static void prob_free(prob *t) {
    free(t->h), free(t->w), free(t->b), free(t->cw), free(t->go), free(t->labels);
}

/* g·loss, or Σ g_i·loss_i for "none": the scalar whose gradient the references return. Frees loss. */
static double upstream_objective(flce_reduction r, int64_t n, const double *go, double *loss, int rc) {
    double f = 0.0;
    if (r == FLCE_REDUCTION_NONE)
        for (int64_t i = 0; i < n; i++)
            f += go[i] * loss[i];
    else
        f = go[0] * loss[0];
    free(loss);
    return rc == 0 ? f : NAN;
}

/* The scalar whose gradient ref_loss_and_grad returns. */
static double prob_objective(const prob *t) {
    double *loss = test_alloc((size_t)t->n, sizeof *loss);
    int rc = ref_loss_and_grad(&t->p, &t->x, t->n, t->d, t->v, t->h, t->w, t->b, t->labels, NULL,
                               loss, NULL, NULL, NULL, NULL);
    return upstream_objective(t->p.reduction, t->n, t->go, loss, rc);
}

/* Central differences of the objective w.r.t. every entry of a (an input of t). */
static void fd_gradient(prob *t, double *a, size_t count, double *out) {
    const double step = 1e-5;
    for (size_t k = 0; k < count; k++) {
        double keep = a[k];
        a[k] = keep + step;
        double up = prob_objective(t);
        a[k] = keep - step;
        double down = prob_objective(t);
        a[k] = keep;
        out[k] = (up - down) / (2 * step);
    }
}

static void fd_compare(const char *what, prob *t, double *a, size_t count, const double *grad) {
    double *fd = test_alloc(count, sizeof *fd);
    fd_gradient(t, a, count, fd);
    double err = ref_rel_l2(fd, grad, count);
    CHECKF(err < 1e-6, "d loss/d %s: rel_l2 %.3g vs finite differences", what, err);
    free(fd);
}

static void fd_check(const opt_case *c) {
    prob t = prob_make(c, 6, 5, 11);
    double *dh = test_alloc((size_t)(t.n * t.d), sizeof *dh);
    double *dw = test_alloc((size_t)(t.v * t.d), sizeof *dw);
    double *db = test_alloc((size_t)t.v, sizeof *db);
    double loss[6];
    int rc = ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, t.go, loss, NULL,
                               dh, dw, db);
    CHECK(rc == 0);
    fd_compare("h", &t, t.h, (size_t)(t.n * t.d), dh);
    fd_compare("w", &t, t.w, (size_t)(t.v * t.d), dw);
    if (t.b)
        fd_compare("b", &t, t.b, (size_t)t.v, db);
    /* Rows 1 (ignore_index) and 3 (label V) carry no gradient at all. */
    CHECK(all_zero(dh + 1 * t.d, (size_t)t.d));
    CHECK(all_zero(dh + 3 * t.d, (size_t)t.d));
    free(dh), free(dw), free(db);
    prob_free(&t);
}

static void fd_plain_mean(void) { fd_check(&(opt_case){.reduction = FLCE_REDUCTION_MEAN}); }
static void fd_plain_sum(void) { fd_check(&(opt_case){.reduction = FLCE_REDUCTION_SUM}); }
static void fd_plain_none_with_grad_output(void) {
    fd_check(&(opt_case){.reduction = FLCE_REDUCTION_NONE});
}
static void fd_label_smoothing(void) { fd_check(&(opt_case){.eps = 0.2f}); }
static void fd_z_loss(void) { fd_check(&(opt_case){.lambda = 0.05f}); }
static void fd_softcap(void) { fd_check(&(opt_case){.cap = 2.0f}); }
static void fd_temperature(void) { fd_check(&(opt_case){.temp = 0.7f}); }
static void fd_bias(void) { fd_check(&(opt_case){.bias = 1}); }
static void fd_class_weights(void) { fd_check(&(opt_case){.weights = 1}); }
static void fd_class_weights_with_smoothing(void) {
    fd_check(&(opt_case){.eps = 0.3f, .weights = 1});
}

static const opt_case all_options = {0.1f, 0.02f, 3.0f, 1.3f, 1, 1, FLCE_REDUCTION_MEAN};

static void fd_all_options_mean(void) { fd_check(&all_options); }
static void fd_all_options_sum(void) {
    opt_case c = all_options;
    c.reduction = FLCE_REDUCTION_SUM;
    fd_check(&c);
}
static void fd_all_options_none(void) {
    opt_case c = all_options;
    c.reduction = FLCE_REDUCTION_NONE;
    fd_check(&c);
}

/* ---- the loss value itself, against a direct formula -------------------------------------- */

/* loss_i written the way PyTorch computes it: log-softmax in two passes, then
 * (1−ε)·w_y·(−log p_y) + (ε/V)·Σ_j w_j·(−log p_j) + w_y·λ·lse². */
static double direct_row_loss(const prob *t, int64_t i, double *lse_out) {
    const flce_problem *p = &t->p;
    double *z = test_alloc((size_t)t->v, sizeof *z);
    double m = -INFINITY;
    for (int64_t j = 0; j < t->v; j++) {
        double u = 0.0;
        for (int64_t k = 0; k < t->d; k++)
            u += t->h[i * t->d + k] * t->w[j * t->d + k];
        u = (u + (t->b ? t->b[j] : 0.0)) / p->temperature;
        z[j] = p->softcap > 0 ? p->softcap * tanh(u / p->softcap) : u;
        m = z[j] > m ? z[j] : m;
    }
    double s = 0.0;
    for (int64_t j = 0; j < t->v; j++)
        s += exp(z[j] - m);
    double lse = m + log(s);
    *lse_out = lse;
    int64_t y = t->labels[i];
    double loss = 0.0;
    if (y != p->ignore_index && y >= 0 && y < t->v) {
        double w_y = t->cw ? t->cw[y] : 1.0, smooth = 0.0;
        for (int64_t j = 0; j < t->v; j++)
            smooth += (t->cw ? t->cw[j] : 1.0) * (lse - z[j]);
        loss = (1.0 - (double)p->label_smoothing) * w_y * (lse - z[y]) +
               p->label_smoothing / (double)t->v * smooth + w_y * p->z_loss * lse * lse;
    }
    free(z);
    return loss;
}

static void loss_matches_direct_formula_for_every_option(void) {
    static const opt_case cases[] = {
        /* eps, lambda, cap, temp, bias, weights, reduction */
        {0, 0, 0, 0, 0, 0, FLCE_REDUCTION_MEAN},
        {0.1f, 0, 0, 0, 0, 0, FLCE_REDUCTION_SUM},
        {0, 0.01f, 0, 0, 0, 0, FLCE_REDUCTION_NONE},
        {0, 0, 2.5f, 0, 0, 0, FLCE_REDUCTION_MEAN},
        {0, 0, 0, 0.5f, 1, 0, FLCE_REDUCTION_MEAN},
        {0.2f, 0, 0, 0, 0, 1, FLCE_REDUCTION_MEAN},
        {0.1f, 0.02f, 3.0f, 1.3f, 1, 1, FLCE_REDUCTION_NONE},
        {0.1f, 0.02f, 3.0f, 1.3f, 1, 1, FLCE_REDUCTION_MEAN},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        prob t = prob_make(&cases[c], 7, 9, 23);
        double loss[7], lse[7], want[7], want_lse[7], total = 0.0, den = 0.0;
        CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, NULL, loss, lse,
                                NULL, NULL, NULL) == 0);
        for (int64_t i = 0; i < t.n; i++) {
            want[i] = direct_row_loss(&t, i, &want_lse[i]);
            total += want[i];
            int64_t y = t.labels[i];
            if (y != t.p.ignore_index && y >= 0 && y < t.v)
                den += t.cw ? t.cw[y] : 1.0;
        }
        double e_lse = ref_rel_l2(want_lse, lse, (size_t)t.n);
        CHECKF(e_lse < 1e-13, "case %zu: lse rel_l2 %.3g", c, e_lse);
        if (t.p.reduction == FLCE_REDUCTION_NONE) {
            double e = ref_rel_l2(want, loss, (size_t)t.n);
            CHECKF(e < 1e-13, "case %zu: per-token loss rel_l2 %.3g", c, e);
        } else {
            double w = t.p.reduction == FLCE_REDUCTION_MEAN ? total / den : total;
            CHECKF(fabs(loss[0] - w) <= 1e-13 * fabs(w), "case %zu: loss %.17g, want %.17g", c,
                   loss[0], w);
        }
        prob_free(&t);
    }
}

/* ---- masking and edge cases --------------------------------------------------------------- */

static void all_labels_ignored_mean_is_zero_with_zero_grads(void) {
    static const flce_reduction reds[] = {FLCE_REDUCTION_MEAN, FLCE_REDUCTION_SUM,
                                          FLCE_REDUCTION_NONE};
    for (size_t r = 0; r < 3; r++) {
        opt_case c = all_options;
        c.reduction = reds[r];
        prob t = prob_make(&c, 4, 8, 10);
        for (int64_t i = 0; i < t.n; i++)
            t.labels[i] = t.p.ignore_index;
        double loss[4], lse[4], dh[4 * 8], dw[10 * 8], db[10];
        memset(loss, 0xFF, sizeof loss); /* NaN poison: every written value must be overwritten */
        CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, t.go, loss, lse,
                                dh, dw, db) == 0);
        size_t n_loss = reds[r] == FLCE_REDUCTION_NONE ? 4 : 1;
        CHECKF(all_zero(loss, n_loss), "reduction %d: loss %g", (int)reds[r], loss[0]);
        CHECK(all_finite(lse, 4)); /* lse is still defined for ignored rows */
        CHECK(all_zero(dh, sizeof dh / sizeof dh[0]));
        CHECK(all_zero(dw, sizeof dw / sizeof dw[0]));
        CHECK(all_zero(db, sizeof db / sizeof db[0]));
        prob_free(&t);
    }
}

static void ignored_tokens_get_zero_grad_and_do_not_count_in_mean(void) {
    opt_case c = {0.1f, 0.01f, 0, 0, 1, 0, FLCE_REDUCTION_MEAN};
    prob t = prob_make(&c, 8, 8, 16);
    t.p.ignore_index = 5; /* a label that is also a valid class id */
    int64_t labels[8] = {0, 5, 6, 5, 12, 5, 15, 5};
    memcpy(t.labels, labels, sizeof labels);
    double mean, sum, per[8], dh[8 * 8];
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, NULL, &mean, NULL,
                            dh, NULL, NULL) == 0);
    for (int64_t i = 1; i < t.n; i += 2)
        CHECKF(all_zero(dh + i * t.d, (size_t)t.d), "row %lld", (long long)i);
    CHECK(!all_zero(dh, (size_t)t.d));
    t.p.reduction = FLCE_REDUCTION_SUM;
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, NULL, &sum, NULL,
                            NULL, NULL, NULL) == 0);
    t.p.reduction = FLCE_REDUCTION_NONE;
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, NULL, per, NULL,
                            NULL, NULL, NULL) == 0);
    CHECKF(fabs(mean - sum / 4) <= 1e-14 * fabs(sum), "mean %.17g, sum/4 %.17g", mean, sum / 4);
    for (int64_t i = 1; i < t.n; i += 2)
        CHECK(per[i] == 0.0);
    prob_free(&t);
}

static void out_of_range_labels_are_treated_as_ignored(void) {
    opt_case c = {0, 0, 0, 0, 0, 0, FLCE_REDUCTION_NONE};
    prob t = prob_make(&c, 3, 8, 6);
    t.labels[0] = -1, t.labels[1] = 6, t.labels[2] = INT64_MAX;
    double per[3], dh[3 * 8];
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, t.go, per, NULL,
                            dh, NULL, NULL) == 0);
    CHECK(all_zero(per, 3));
    CHECK(all_zero(dh, 3 * 8));
    ref_row_out r;
    ref_row(&t.p, NULL, t.d, t.v, t.h, t.w, NULL, -1, &r, NULL);
    CHECK(!r.valid && r.loss == 0.0 && r.target_logprob == 0.0 && isfinite(r.lse));
    prob_free(&t);
}

static void labels_at_0_and_V_minus_1(void) {
    opt_case c = all_options;
    c.reduction = FLCE_REDUCTION_SUM;
    prob t = prob_make(&c, 4, 6, 9);
    int64_t labels[4] = {0, 8, 8, 0};
    memcpy(t.labels, labels, sizeof labels);
    double dh[4 * 6], dw[9 * 6], db[9], loss, lse, want = 0.0;
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, t.go, &loss, NULL,
                            dh, dw, db) == 0);
    for (int64_t i = 0; i < t.n; i++)
        want += direct_row_loss(&t, i, &lse);
    CHECKF(fabs(loss - want) <= 1e-13 * fabs(want), "loss %.17g, want %.17g", loss, want);
    fd_compare("h", &t, t.h, 4 * 6, dh);
    fd_compare("w", &t, t.w, 9 * 6, dw);
    fd_compare("b", &t, t.b, 9, db);
    prob_free(&t);
}

/* z_j = ±1000 + 0.01·j through h = (±1000, 1), w_j = (1, 0.01·j): exp(z) overflows a double at
 * 710, so only a max-shifted lse survives. */
static void lse_matches_log_sum_exp_of_huge_logits(void) {
    enum { V = 50 };
    double w[V * 2], small = 0.0;
    for (int j = 0; j < V; j++) {
        w[2 * j] = 1.0, w[2 * j + 1] = 0.01 * j;
        small += exp(0.01 * j);
    }
    for (int sign = -1; sign <= 1; sign += 2) {
        double h[2] = {1000.0 * sign, 1.0}, loss, lse, dh[2], dw[V * 2];
        int64_t label = 7;
        flce_problem p = test_problem(1, 2, V);
        p.z_loss = 1e-4f;
        CHECK(ref_loss_and_grad(&p, NULL, 1, 2, V, h, w, NULL, &label, NULL, &loss, &lse, dh, dw,
                                NULL) == 0);
        double want = 1000.0 * sign + log(small);
        CHECKF(fabs(lse - want) <= 1e-13 * 1000, "lse %.17g, want %.17g", lse, want);
        CHECK(isfinite(loss) && all_finite(dh, 2) && all_finite(dw, V * 2));
        double want_loss = (want - (1000.0 * sign + 0.07)) + 1e-4f * want * want;
        CHECKF(fabs(loss - want_loss) <= 1e-9 * fabs(want_loss), "loss %.17g, want %.17g", loss,
               want_loss);
    }
}

/* ---- ref_row ------------------------------------------------------------------------------ */

static void ref_row_agrees_with_ref_loss_and_grad(void) {
    opt_case c = all_options;
    c.reduction = FLCE_REDUCTION_SUM;
    prob t = prob_make(&c, 5, 7, 13);
    double loss, lse[5], dh[5 * 7], dw[13 * 7], db[13], dz[13];
    double want_dh[5 * 7] = {0}, want_dw[13 * 7] = {0}, want_db[13] = {0}, want_loss = 0.0;
    double g[5];
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, t.go, &loss, lse,
                            dh, dw, db) == 0);
    ref_token_scales(&t.p, &t.x, t.n, t.v, t.labels, t.go, g);
    for (int64_t i = 0; i < t.n; i++) {
        ref_row_out r;
        ref_row(&t.p, &t.x, t.d, t.v, t.h + i * t.d, t.w, t.b, t.labels[i], &r, dz);
        CHECK(r.lse == lse[i]);
        want_loss += r.loss;
        for (int64_t j = 0; j < t.v; j++) {
            want_db[j] += g[i] * dz[j];
            for (int64_t k = 0; k < t.d; k++) {
                want_dh[i * t.d + k] += g[i] * dz[j] * t.w[j * t.d + k];
                want_dw[j * t.d + k] += g[i] * dz[j] * t.h[i * t.d + k];
            }
        }
    }
    CHECKF(fabs(loss - want_loss) <= 1e-14 * fabs(want_loss), "loss %.17g vs %.17g", loss,
           want_loss);
    CHECK(ref_rel_l2(want_dh, dh, 5 * 7) < 1e-14);
    CHECK(ref_rel_l2(want_dw, dw, 13 * 7) < 1e-14);
    CHECK(ref_rel_l2(want_db, db, 13) < 1e-14);
    prob_free(&t);
}

/* dz is ∂loss_i/∂u_j for the raw logit u_j = h·w_j + b_j, i.e. ∂loss_i/∂b_j. */
static void ref_row_dz_is_gradient_of_raw_logit(void) {
    opt_case c = all_options;
    prob t = prob_make(&c, 1, 8, 17);
    t.labels[0] = host_rng_below(&rng, t.v);
    double dz[17], fd[17];
    ref_row_out r;
    ref_row(&t.p, &t.x, t.d, t.v, t.h, t.w, t.b, t.labels[0], &r, dz);
    for (int64_t j = 0; j < t.v; j++) {
        double keep = t.b[j], step = 1e-5;
        ref_row_out up, down;
        t.b[j] = keep + step;
        ref_row(&t.p, &t.x, t.d, t.v, t.h, t.w, t.b, t.labels[0], &up, NULL);
        t.b[j] = keep - step;
        ref_row(&t.p, &t.x, t.d, t.v, t.h, t.w, t.b, t.labels[0], &down, NULL);
        t.b[j] = keep;
        fd[j] = (up.loss - down.loss) / (2 * step);
    }
    double err = ref_rel_l2(fd, dz, 17);
    CHECKF(err < 1e-6, "rel_l2 %.3g", err);
    prob_free(&t);
}

/* D = 1, h = 1, w = (1, 2, 3): z = (1, 2, 3), label 1. Values from Python's math module. */
static void per_token_outputs_on_hand_computed_case(void) {
    flce_problem p = test_problem(1, 1, 3);
    double h = 1.0, w[3] = {1.0, 2.0, 3.0};
    ref_row_out r;
    ref_row(&p, NULL, 1, 3, &h, w, NULL, 1, &r, NULL);
    CHECK(r.valid);
    CHECKF(fabs(r.lse - 3.40760596444438) < 1e-14, "lse %.17g", r.lse);
    CHECKF(fabs(r.target_logprob - -1.4076059644443801) < 1e-14, "logp %.17g", r.target_logprob);
    CHECKF(fabs(r.loss - 1.4076059644443801) < 1e-14, "loss %.17g", r.loss);
    CHECKF(fabs(r.entropy - 0.8323955818399384) < 1e-14, "entropy %.17g", r.entropy);
    CHECK(r.argmax == 2 && r.z_loss_term == 0.0);
    /* ε = 0.1 leaves this loss unchanged (mean z = z_y = 2); λ = 0.01 adds λ·lse². */
    p.label_smoothing = 0.1f;
    p.z_loss = 0.01f;
    ref_row(&p, NULL, 1, 3, &h, w, NULL, 1, &r, NULL);
    double lambda = 0.01f;
    CHECKF(fabs(r.z_loss_term - lambda * 3.40760596444438 * 3.40760596444438) < 1e-14, "%.17g",
           r.z_loss_term);
    double want = 1.4076059644443801 + lambda * 3.40760596444438 * 3.40760596444438;
    CHECKF(fabs(r.loss - want) < 1e-14, "loss %.17g, want %.17g", r.loss, want);
}

static void argmax_takes_first_of_equal_logits(void) {
    flce_problem p = test_problem(1, 1, 5);
    double h = 1.0, w[5] = {-1.0, 3.0, 0.5, 3.0, 3.0};
    ref_row_out r;
    ref_row(&p, NULL, 1, 5, &h, w, NULL, -100, &r, NULL);
    CHECK(r.argmax == 1);
    CHECK(!r.valid && r.loss == 0.0);
}

static void token_scales_follow_reduction_and_weights(void) {
    flce_problem p = test_problem(5, 8, 4);
    int64_t labels[5] = {0, -100, 3, 2, 4}; /* 4 is out of range for V = 4 */
    double cw[4] = {1.0, 5.0, 2.0, 0.5}, go[5] = {1, 2, 3, 4, 5}, three = 3.0, g[5];
    ref_extra x = {cw};
    ref_token_scales(&p, NULL, 5, 4, labels, &three, g);
    CHECK(g[0] == 1.0 && g[1] == 0.0 && g[2] == 1.0 && g[3] == 1.0 && g[4] == 0.0);
    ref_token_scales(&p, &x, 5, 4, labels, NULL, g);
    CHECK(g[0] == 1.0 / 3.5 && g[1] == 0.0 && g[2] == 1.0 / 3.5 && g[4] == 0.0);
    p.reduction = FLCE_REDUCTION_SUM;
    ref_token_scales(&p, &x, 5, 4, labels, &three, g);
    CHECK(g[0] == 3.0 && g[1] == 0.0 && g[3] == 3.0);
    p.reduction = FLCE_REDUCTION_NONE;
    ref_token_scales(&p, NULL, 5, 4, labels, go, g);
    CHECK(g[0] == 1.0 && g[1] == 0.0 && g[2] == 3.0 && g[3] == 4.0 && g[4] == 0.0);
}

static void vocab_size_comes_from_total_or_offset_plus_shard(void) {
    flce_problem p = test_problem(1, 8, 100);
    CHECK(ref_vocab_size(&p) == 100);
    p.vocab_offset = 300;
    CHECK(ref_vocab_size(&p) == 400);
    p.vocab_total = 1000;
    CHECK(ref_vocab_size(&p) == 1000);
}

/* The size the GPU tests use must stay cheap: mean loss = mean of row losses, and timing shown. */
static void reference_handles_test_sized_problem(void) {
    opt_case c = all_options;
    prob t = prob_make(&c, 64, 256, 5000);
    double *dh = test_alloc(64 * 256, sizeof *dh), *dw = test_alloc(5000 * 256, sizeof *dw);
    double loss, den = 0.0, sum = 0.0;
    clock_t start = clock();
    CHECK(ref_loss_and_grad(&t.p, &t.x, t.n, t.d, t.v, t.h, t.w, t.b, t.labels, NULL, &loss, NULL,
                            dh, dw, NULL) == 0);
    double secs = (double)(clock() - start) / CLOCKS_PER_SEC;
    printf("     N=64 V=5000 D=256, all options: %.3f s\n", secs);
    for (int64_t i = 0; i < t.n; i += 1) {
        ref_row_out r;
        ref_row(&t.p, &t.x, t.d, t.v, t.h + i * t.d, t.w, t.b, t.labels[i], &r, NULL);
        sum += r.loss;
        den += r.valid ? t.cw[t.labels[i]] : 0.0;
    }
    CHECKF(fabs(loss - sum / den) <= 1e-13 * fabs(loss), "loss %.17g vs %.17g", loss, sum / den);
    CHECK(all_finite(dh, 64 * 256) && all_finite(dw, 5000 * 256));
    free(dh), free(dw);
    prob_free(&t);
}

/* ---- distillation (ref_distill, issue 44) ------------------------------------------------- */

/* One random distillation problem: student ds = 5, teacher dt = 4 (different widths on purpose),
 * token 1 ignored and token 3 out of range whenever n allows, as prob_make does. */
typedef struct dprob {
    ref_distill_problem p;
    int64_t n, ds, dt, v;
    double *hs, *ws, *ht, *wt, *go;
    int64_t *labels;
} dprob;

static dprob dprob_make(ref_divergence div, double beta, double temp, double ce_weight,
                        flce_reduction red, int64_t n, int64_t v) {
    dprob t;
    memset(&t, 0, sizeof t);
    t.p.divergence = div;
    t.p.beta = beta;
    t.p.temperature = temp;
    t.p.ce_weight = ce_weight;
    t.p.ignore_index = -100;
    t.p.reduction = red;
    t.n = n, t.ds = 5, t.dt = 4, t.v = v;
    t.hs = test_normal((size_t)(n * t.ds), 1.0);
    t.ws = test_normal((size_t)(v * t.ds), 2.0 / sqrt((double)t.ds));
    t.ht = test_normal((size_t)(n * t.dt), 1.0);
    t.wt = test_normal((size_t)(v * t.dt), 2.0 / sqrt((double)t.dt));
    t.go = red == FLCE_REDUCTION_NONE ? test_normal((size_t)n, 1.0) : test_uniform(1, 0.5, 1.5);
    t.labels = test_alloc((size_t)n, sizeof *t.labels);
    for (int64_t i = 0; i < n; i++)
        t.labels[i] = host_rng_below(&rng, v);
    if (n >= 3)
        t.labels[1] = t.p.ignore_index;
    if (n >= 4)
        t.labels[3] = v;
    return t;
}

static void dprob_free(dprob *t) {
    free(t->hs), free(t->ws), free(t->ht), free(t->wt), free(t->go), free(t->labels);
}

/* The scalar whose gradient ref_distill returns. */
static double dprob_objective(const dprob *t) {
    double *loss = test_alloc((size_t)t->n, sizeof *loss);
    int rc = ref_distill(&t->p, t->n, t->ds, t->dt, t->v, t->hs, t->ws, t->ht, t->wt, t->labels,
                         NULL, loss, NULL, NULL);
    return upstream_objective(t->p.reduction, t->n, t->go, loss, rc);
}

static double dfd_error(dprob *t, double *a, size_t count, const double *grad) {
    const double step = 1e-5;
    double *fd = test_alloc(count, sizeof *fd);
    for (size_t k = 0; k < count; k++) {
        double keep = a[k];
        a[k] = keep + step;
        double up = dprob_objective(t);
        a[k] = keep - step;
        double down = dprob_objective(t);
        a[k] = keep;
        fd[k] = (up - down) / (2 * step);
    }
    double err = ref_rel_l2(fd, grad, count);
    free(fd);
    return err;
}

static const char *div_name(ref_divergence d) {
    return d == REF_DIV_FORWARD_KL ? "forward KL" : d == REF_DIV_REVERSE_KL ? "reverse KL" : "JSD";
}

/* Every divergence (JSD at β 0.3 and 0.5) × CE term off/on × T 1/2 × mean/sum/none: dhs and dws
 * against central differences of the loss; the ignored rows' dhs is exactly 0. */
static void distill_fd_every_divergence_ce_temperature_reduction(void) {
    static const struct {
        ref_divergence div;
        double beta;
    } divs[] = {
        {REF_DIV_FORWARD_KL, 0}, {REF_DIV_REVERSE_KL, 0}, {REF_DIV_JSD, 0.3}, {REF_DIV_JSD, 0.5}};
    static const double ces[] = {0.0, 0.7}, temps[] = {1.0, 2.0};
    static const flce_reduction reds[] = {FLCE_REDUCTION_MEAN, FLCE_REDUCTION_SUM,
                                          FLCE_REDUCTION_NONE};
    for (size_t a = 0; a < 4; a++)
        for (size_t c = 0; c < 2; c++)
            for (size_t k = 0; k < 2; k++)
                for (size_t r = 0; r < 3; r++) {
                    dprob t =
                        dprob_make(divs[a].div, divs[a].beta, temps[k], ces[c], reds[r], 6, 11);
                    double *dhs = test_alloc((size_t)(t.n * t.ds), sizeof *dhs);
                    double *dws = test_alloc((size_t)(t.v * t.ds), sizeof *dws);
                    double loss[6];
                    CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels,
                                      t.go, loss, dhs, dws) == 0);
                    double eh = dfd_error(&t, t.hs, (size_t)(t.n * t.ds), dhs);
                    double ew = dfd_error(&t, t.ws, (size_t)(t.v * t.ds), dws);
                    CHECKF(eh < 1e-6 && ew < 1e-6,
                           "%s beta %.1f, ce %.1f, T %.0f, reduction %d: rel_l2 dhs %.3g dws %.3g",
                           div_name(divs[a].div), divs[a].beta, ces[c], temps[k], (int)reds[r], eh,
                           ew);
                    CHECK(all_zero(dhs + 1 * t.ds, (size_t)t.ds) &&
                          all_zero(dhs + 3 * t.ds, (size_t)t.ds));
                    CHECK(!all_zero(dhs, (size_t)t.ds));
                    free(dhs), free(dws);
                    dprob_free(&t);
                }
}

/* The loss written from probabilities (p, q, m formed directly, logs of them), per token, against
 * ref_distill's log-space form; and the CE term against ref_row at temperature 1. */
static void distill_loss_matches_direct_formula(void) {
    static const struct {
        ref_divergence div;
        double beta;
    } divs[] = {{REF_DIV_FORWARD_KL, 0},
                {REF_DIV_REVERSE_KL, 0},
                {REF_DIV_JSD, 0.3},
                {REF_DIV_JSD, 0.5},
                {REF_DIV_JSD, 0.9}};
    for (size_t a = 0; a < 5; a++) {
        dprob t = dprob_make(divs[a].div, divs[a].beta, 1.7, 0.4, FLCE_REDUCTION_NONE, 7, 23);
        double loss[7];
        CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, NULL, loss,
                          NULL, NULL) == 0);
        flce_problem ce = test_problem(t.n, t.ds, t.v);
        for (int64_t i = 0; i < t.n; i++) {
            int64_t y = t.labels[i];
            if (y == t.p.ignore_index || y < 0 || y >= t.v) {
                CHECK(loss[i] == 0.0);
                continue;
            }
            double q[23], p[23], sq = 0.0, sp = 0.0, d = 0.0, b = divs[a].beta;
            for (int64_t j = 0; j < t.v; j++) {
                double us = 0.0, ut = 0.0;
                for (int64_t k = 0; k < t.ds; k++)
                    us += t.hs[i * t.ds + k] * t.ws[j * t.ds + k];
                for (int64_t k = 0; k < t.dt; k++)
                    ut += t.ht[i * t.dt + k] * t.wt[j * t.dt + k];
                q[j] = exp(us / 1.7), p[j] = exp(ut / 1.7);
                sq += q[j], sp += p[j];
            }
            for (int64_t j = 0; j < t.v; j++) {
                q[j] /= sq, p[j] /= sp;
                double m = b * p[j] + (1 - b) * q[j];
                if (divs[a].div == REF_DIV_FORWARD_KL)
                    d += p[j] * log(p[j] / q[j]);
                else if (divs[a].div == REF_DIV_REVERSE_KL)
                    d += q[j] * log(q[j] / p[j]);
                else
                    d += b * p[j] * log(p[j] / m) + (1 - b) * q[j] * log(q[j] / m);
            }
            ref_row_out r;
            ref_row(&ce, NULL, t.ds, t.v, t.hs + i * t.ds, t.ws, NULL, y, &r, NULL);
            double want = d + 0.4 * r.loss;
            CHECKF(fabs(loss[i] - want) <= 1e-13 * fabs(want) + 1e-15,
                   "%s beta %.1f token %lld: %.17g, want %.17g", div_name(divs[a].div), b,
                   (long long)i, loss[i], want);
        }
        dprob_free(&t);
    }
}

/* JSD's ends are the KLs (Liger's convention, ref.h): β = 0 is forward KL, β = 1 reverse KL,
 * value and gradient alike. */
static void distill_jsd_ends_are_the_kls(void) {
    for (int end = 0; end < 2; end++) {
        dprob t = dprob_make(REF_DIV_JSD, end, 1.5, 0.0, FLCE_REDUCTION_SUM, 5, 9);
        double l_jsd, l_kl, dh_jsd[5 * 5], dh_kl[5 * 5];
        CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, NULL,
                          &l_jsd, dh_jsd, NULL) == 0);
        t.p.divergence = end ? REF_DIV_REVERSE_KL : REF_DIV_FORWARD_KL;
        CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, NULL, &l_kl,
                          dh_kl, NULL) == 0);
        CHECKF(l_jsd == l_kl && l_kl > 0, "beta %d: %.17g vs %.17g", end, l_jsd, l_kl);
        CHECK(memcmp(dh_jsd, dh_kl, sizeof dh_kl) == 0);
        dprob_free(&t);
    }
}

/* Teacher = student (same h, same w): D = 0 and no gradient for every divergence and T. */
static void distill_identical_teacher_gives_zero(void) {
    static const ref_divergence divs[] = {REF_DIV_FORWARD_KL, REF_DIV_REVERSE_KL, REF_DIV_JSD,
                                          REF_DIV_JSD};
    static const double betas[] = {0, 0, 0.3, 0.5};
    for (size_t a = 0; a < 4; a++)
        for (int temp = 1; temp <= 2; temp++) {
            dprob t = dprob_make(divs[a], betas[a], temp, 0.0, FLCE_REDUCTION_NONE, 4, 13);
            t.dt = t.ds;
            double *ht = test_alloc((size_t)(t.n * t.ds), sizeof *ht),
                   *wt = test_alloc((size_t)(t.v * t.ds), sizeof *wt);
            memcpy(ht, t.hs, (size_t)(t.n * t.ds) * sizeof *ht);
            memcpy(wt, t.ws, (size_t)(t.v * t.ds) * sizeof *wt);
            double loss[4], dhs[4 * 5], dws[13 * 5], big = 0.0;
            CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, ht, wt, t.labels, NULL, loss,
                              dhs, dws) == 0);
            for (size_t k = 0; k < 4 * 5; k++)
                big = fmax(big, fabs(dhs[k]));
            for (size_t k = 0; k < 13 * 5; k++)
                big = fmax(big, fabs(dws[k]));
            for (int64_t i = 0; i < t.n; i++)
                big = fmax(big, fabs(loss[i]));
            CHECKF(big < 1e-15, "%s beta %.1f T %d: largest |loss or grad| %.3g", div_name(divs[a]),
                   betas[a], temp, big);
            free(ht), free(wt);
            dprob_free(&t);
        }
}

/* V = 2, D = 1, h = 1: student logits (0, T·ln 3), teacher (0, 0), so q = (1/4, 3/4), p = (1/2,
 * 1/2) at any T. Forward KL = ½ln 2 + ½ln(2/3) = ½ln(4/3), ∂/∂zs = (q − p)/T = (−1/4, 1/4)/T;
 * reverse KL = ¼ln ½ + ¾ln(3/2). */
static void distill_two_class_closed_form(void) {
    for (int temp = 1; temp <= 2; temp++) {
        ref_distill_problem p = {REF_DIV_FORWARD_KL, 0.0, temp, 0.0, -100, FLCE_REDUCTION_SUM};
        double h = 1.0, ws[2] = {0.0, temp * log(3.0)}, wt[2] = {0.0, 0.0}, loss, dh, dw[2];
        int64_t label = 0;
        CHECK(ref_distill(&p, 1, 1, 1, 2, &h, ws, &h, wt, &label, NULL, &loss, &dh, dw) == 0);
        CHECKF(fabs(loss - 0.5 * log(4.0 / 3.0)) < 1e-15, "T %d: forward KL %.17g", temp, loss);
        /* dh = Σ_j dz_j·w_j = (1/4)·T ln 3 / T; dw_j = dz_j·h. */
        CHECKF(fabs(dh - 0.25 * log(3.0)) < 1e-15, "T %d: dh %.17g", temp, dh);
        CHECKF(fabs(dw[0] + 0.25 / temp) < 1e-15 && fabs(dw[1] - 0.25 / temp) < 1e-15,
               "T %d: dw %.17g %.17g", temp, dw[0], dw[1]);
        p.divergence = REF_DIV_REVERSE_KL;
        CHECK(ref_distill(&p, 1, 1, 1, 2, &h, ws, &h, wt, &label, NULL, &loss, NULL, NULL) == 0);
        CHECKF(fabs(loss - (0.25 * log(0.5) + 0.75 * log(1.5))) < 1e-15, "T %d: reverse KL %.17g",
               temp, loss);
    }
}

static void distill_all_tokens_ignored_mean_is_zero(void) {
    static const flce_reduction reds[] = {FLCE_REDUCTION_MEAN, FLCE_REDUCTION_SUM,
                                          FLCE_REDUCTION_NONE};
    for (size_t r = 0; r < 3; r++) {
        dprob t = dprob_make(REF_DIV_JSD, 0.5, 2.0, 1.0, reds[r], 4, 10);
        for (int64_t i = 0; i < t.n; i++)
            t.labels[i] = t.p.ignore_index;
        t.ht[0] = NAN; /* an ignored token's teacher row is never read */
        double loss[4], dhs[4 * 5], dws[10 * 5];
        memset(loss, 0xFF, sizeof loss);
        CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, t.go, loss,
                          dhs, dws) == 0);
        CHECKF(all_zero(loss, reds[r] == FLCE_REDUCTION_NONE ? 4 : 1), "reduction %d: loss %g",
               (int)reds[r], loss[0]);
        CHECK(all_zero(dhs, 4 * 5) && all_zero(dws, 10 * 5));
        dprob_free(&t);
    }
}

/* mean = sum / (valid tokens) = Σ none / (valid tokens); ignored tokens' per-token loss is 0. */
static void distill_reductions_agree_and_ignore_masks(void) {
    dprob t = dprob_make(REF_DIV_REVERSE_KL, 0, 2.0, 0.5, FLCE_REDUCTION_NONE, 8, 12);
    t.labels[5] = t.p.ignore_index; /* valid: 0 2 4 6 7 */
    double per[8], sum, mean, total = 0.0;
    CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, NULL, per, NULL,
                      NULL) == 0);
    t.p.reduction = FLCE_REDUCTION_SUM;
    CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, NULL, &sum,
                      NULL, NULL) == 0);
    t.p.reduction = FLCE_REDUCTION_MEAN;
    CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, NULL, &mean,
                      NULL, NULL) == 0);
    for (int64_t i = 0; i < t.n; i++)
        total += per[i];
    CHECK(per[1] == 0.0 && per[3] == 0.0 && per[5] == 0.0 && per[0] > 0.0);
    CHECKF(fabs(sum - total) <= 1e-14 * fabs(total) &&
               fabs(mean - total / 5) <= 1e-14 * fabs(total),
           "sum %.17g mean %.17g, Σ per-token %.17g", sum, mean, total);
    /* Without labels nothing is ignored and a CE weight has no label to use. */
    t.p.ce_weight = 0.0;
    t.p.reduction = FLCE_REDUCTION_NONE;
    double all[8];
    CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, NULL, NULL, all, NULL,
                      NULL) == 0);
    for (int64_t i = 0; i < t.n; i++)
        CHECK(all[i] > 0.0);
    t.p.ce_weight = 0.5;
    CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, NULL, NULL, all, NULL,
                      NULL) == -2);
    dprob_free(&t);
}

/* A NaN in token 2's teacher hidden row: token 2's loss and dhs row are NaN, every other token's
 * loss and dhs row is bit-identical to the clean run; dws (a sum over tokens) is NaN. */
static void distill_nan_teacher_row_stays_in_its_token(void) {
    static const ref_divergence divs[] = {REF_DIV_FORWARD_KL, REF_DIV_REVERSE_KL, REF_DIV_JSD};
    for (size_t a = 0; a < 3; a++) {
        dprob t = dprob_make(divs[a], 0.5, 2.0, 0.3, FLCE_REDUCTION_NONE, 6, 10);
        double clean[6], dirty[6], dh_clean[6 * 5], dh_dirty[6 * 5], dws[10 * 5];
        CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, t.go, clean,
                          dh_clean, NULL) == 0);
        t.ht[2 * t.dt + 1] = NAN;
        CHECK(ref_distill(&t.p, t.n, t.ds, t.dt, t.v, t.hs, t.ws, t.ht, t.wt, t.labels, t.go, dirty,
                          dh_dirty, dws) == 0);
        for (int64_t i = 0; i < t.n; i++) {
            if (i == 2) {
                CHECKF(isnan(dirty[i]), "%s: token 2 loss %g", div_name(divs[a]), dirty[i]);
                for (int64_t k = 0; k < t.ds; k++)
                    CHECK(isnan(dh_dirty[i * t.ds + k]));
            } else {
                CHECKF(memcmp(&clean[i], &dirty[i], sizeof clean[i]) == 0,
                       "%s: token %lld loss %g vs %g", div_name(divs[a]), (long long)i, dirty[i],
                       clean[i]);
                CHECK(memcmp(dh_clean + i * t.ds, dh_dirty + i * t.ds,
                             (size_t)t.ds * sizeof(double)) == 0);
            }
        }
        CHECK(isnan(dws[0]));
        dprob_free(&t);
    }
}

/* dz of ref_distill_row is ∂loss_i/∂zs_j, checked on the raw logits directly (the form the GPU
 * row kernel will be compared with), with large logits (sd 8) so that some q_j are tiny.
 * Such rows can have a loss near 20 and a gradient norm near 1e-6 (q saturated on the label, a
 * teacher far from it): a plain relative test of central differences then measures the loss's
 * rounding (ε·|loss|/step), not dz (CI seed 4579989407240166401: reverse KL 4.1e-6 at step 1e-6).
 * So: the fourth-order stencil at step 1e-3 (truncation ~1e-12, rounding ~1e-11), and an error
 * bound of 1e-6·‖dz‖ + 1e-9. Over 60000 rows (20000 seeds × 3 divergences) the worst error was
 * 0.08 of that bound; a wrong term in dz is of the order of ‖dz‖ itself. */
static void distill_row_dz_is_gradient_of_student_logits(void) {
    static const ref_divergence divs[] = {REF_DIV_FORWARD_KL, REF_DIV_REVERSE_KL, REF_DIV_JSD};
    static const double offset[4] = {2, 1, -1, -2}, coef[4] = {-1, 8, -8, 1};
    for (size_t a = 0; a < 3; a++) {
        ref_distill_problem p = {divs[a], 0.3, 1.5, 0.6, -100, FLCE_REDUCTION_NONE};
        double *zs = test_normal(17, 8.0), *zt = test_normal(17, 8.0), dz[17], fd[17];
        ref_distill_row_out r, at;
        ref_distill_row(&p, 17, zs, zt, 4, &r, dz);
        CHECK(r.valid && isfinite(r.loss) && r.divergence >= 0.0);
        const double step = 1e-3;
        for (int j = 0; j < 17; j++) {
            double keep = zs[j];
            fd[j] = 0.0;
            for (int k = 0; k < 4; k++) {
                zs[j] = keep + offset[k] * step;
                ref_distill_row(&p, 17, zs, zt, 4, &at, NULL);
                fd[j] += coef[k] * at.loss;
            }
            zs[j] = keep;
            fd[j] /= 12 * step;
        }
        double diff = 0.0, norm = 0.0;
        for (int j = 0; j < 17; j++)
            diff += (fd[j] - dz[j]) * (fd[j] - dz[j]), norm += dz[j] * dz[j];
        diff = sqrt(diff), norm = sqrt(norm);
        CHECKF(diff <= 1e-6 * norm + 1e-9, "%s: ‖fd − dz‖ %.3g, ‖dz‖ %.3g", div_name(divs[a]),
               diff, norm);
        free(zs), free(zt);
    }
}

/* ---- host helpers ------------------------------------------------------------------------- */

static uint16_t to16(flce_dtype t, double x) {
    uint16_t b;
    host_to_dtype(t, &x, &b, 1);
    return b;
}

static double from16(flce_dtype t, uint16_t b) {
    double x;
    host_from_dtype(t, &b, &x, 1);
    return x;
}

static void host_bf16_round_trips(void) {
    const flce_dtype B = FLCE_DTYPE_BF16;
    CHECK(to16(B, 1.0) == 0x3F80 && from16(B, 0x3F80) == 1.0);
    CHECK(to16(B, -2.0) == 0xC000);
    CHECK(to16(B, 1.0 + 0x1p-8) == 0x3F80);       /* tie between 1 and 1+2^-7: even is 1 */
    CHECK(to16(B, 1.0 + 3 * 0x1p-8) == 0x3F82);   /* tie between 1+2^-7 and 1+2^-6: even is up */
    CHECK(to16(B, 1.0 + 0x1p-8 + 0x1p-20) == 0x3F81); /* just above the tie rounds up */
    CHECK(to16(B, 3.3895313892515355e38) == 0x7F7F); /* max finite */
    CHECK(from16(B, 0x7F7F) == 3.3895313892515355e38);
    CHECK(to16(B, 3.4028234663852886e38) == 0x7F80); /* FLT_MAX is past max + half ulp: inf */
    CHECK(to16(B, INFINITY) == 0x7F80 && to16(B, -INFINITY) == 0xFF80);
    CHECK(isnan(from16(B, to16(B, NAN))));
    CHECK(to16(B, -0.0) == 0x8000);
    /* A NaN whose payload sits only in the low 16 bits must not round into inf. */
    float low_nan;
    uint32_t bits = 0x7F800001u;
    memcpy(&low_nan, &bits, sizeof low_nan);
    CHECK(isnan(from16(B, to16(B, low_nan))));
}

static void host_fp16_round_trips(void) {
    const flce_dtype F = FLCE_DTYPE_F16;
    CHECK(to16(F, 1.0) == 0x3C00 && from16(F, 0x3C00) == 1.0);
    CHECK(to16(F, -2.0) == 0xC000);
    CHECK(to16(F, 65504.0) == 0x7BFF && from16(F, 0x7BFF) == 65504.0);
    CHECK(to16(F, 65519.0) == 0x7BFF);   /* below max + half ulp */
    CHECK(to16(F, 65520.0) == 0x7C00);   /* the tie goes to even: inf */
    CHECK(to16(F, 1e6) == 0x7C00 && to16(F, -1e6) == 0xFC00);
    CHECK(to16(F, 0x1p-24) == 0x0001 && from16(F, 0x0001) == 0x1p-24); /* smallest subnormal */
    CHECK(to16(F, 0x1p-25) == 0x0000);                    /* tie with 0: even is 0 */
    CHECK(to16(F, 1.5 * 0x1p-25) == 0x0001);
    CHECK(to16(F, 3 * 0x1p-25) == 0x0002);                /* tie between 1 and 2 units: 2 */
    CHECK(to16(F, 1023 * 0x1p-24) == 0x03FF && from16(F, 0x03FF) == 1023 * 0x1p-24);
    CHECK(to16(F, 1023.5 * 0x1p-24) == 0x0400);           /* rounds up into the smallest normal */
    CHECK(to16(F, 0x1p-14) == 0x0400);
    CHECK(to16(F, 1.0 + 0x1p-11) == 0x3C00);              /* tie: even is 1 */
    CHECK(to16(F, 1.0 + 3 * 0x1p-11) == 0x3C02);
    CHECK(to16(F, -0.0) == 0x8000 && to16(F, 1e-30) == 0x0000);
    CHECK(isnan(from16(F, to16(F, NAN))) && isinf(from16(F, 0x7C00)));
}

static void host_every_16_bit_value_round_trips(void) {
    for (uint32_t b = 0; b < 0x10000; b++) {
        for (int t = 1; t <= 2; t++) {
            flce_dtype dt = (flce_dtype)t;
            double x = from16(dt, (uint16_t)b);
            if (isnan(x))
                CHECKF(isnan(from16(dt, to16(dt, x))), "%s 0x%04x", host_dtype_name(dt), b);
            else
                CHECKF(to16(dt, x) == b, "%s 0x%04x -> %g -> 0x%04x", host_dtype_name(dt), b, x,
                       to16(dt, x));
        }
    }
}

/* Random finite floats: the result must be a nearest representable value, and on an exact tie
 * the even one. Neighbours are the next codes up and down (sign-magnitude). */
static void host_conversions_round_to_nearest_even(void) {
    for (int it = 0; it < 100000; it++) {
        uint32_t bits = (uint32_t)(host_rng_next(&rng) >> 32);
        if (it % 2) /* every other one near the 16-bit types' range: exponents 2^-27 .. 2^16 */
            bits = (bits & 0x807FFFFFu) | ((uint32_t)(127 - 27 + host_rng_below(&rng, 44)) << 23);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (!isfinite(f))
            continue;
        for (int t = 1; t <= 2; t++) {
            flce_dtype dt = (flce_dtype)t;
            uint16_t b = to16(dt, f);
            double got = from16(dt, b);
            if (isinf(got))
                continue; /* overflow is checked by the literal cases */
            uint16_t mag = b & 0x7FFF, sign = b & 0x8000;
            double up = from16(dt, (uint16_t)(sign | (mag + 1)));
            double down = mag ? from16(dt, (uint16_t)(sign | (mag - 1))) : -got;
            double e = fabs(got - f);
            int ok = e <= fabs(up - f) && e <= fabs(down - f);
            if (ok && (e == fabs(up - f) || e == fabs(down - f)) && e != 0)
                ok = (b & 1) == 0;
            CHECKF(ok, "%s: %.9g -> 0x%04x (%.9g)", host_dtype_name(dt), (double)f, b, got);
            if (!ok)
                return;
        }
    }
}

static void host_round_to_dtype_matches_conversions(void) {
    double x[4] = {1.0 + 0x1p-8, 70000.0, 0.1, 1.0 + 0x1p-30};
    double y[4];
    memcpy(y, x, sizeof x);
    host_round_to_dtype(FLCE_DTYPE_BF16, y, 4);
    CHECK(y[0] == 1.0 && y[1] == from16(FLCE_DTYPE_BF16, to16(FLCE_DTYPE_BF16, 70000.0)));
    memcpy(y, x, sizeof x);
    host_round_to_dtype(FLCE_DTYPE_F16, y, 4);
    CHECK(y[0] == x[0] && isinf(y[1]) && y[2] == from16(FLCE_DTYPE_F16, to16(FLCE_DTYPE_F16, 0.1)));
    memcpy(y, x, sizeof x);
    host_round_to_dtype(FLCE_DTYPE_F32, y, 4);
    CHECK(y[0] == x[0] && y[2] == (double)0.1f && y[3] == 1.0);
    CHECK(host_dtype_size(FLCE_DTYPE_F32) == 4 && host_dtype_size(FLCE_DTYPE_BF16) == 2 &&
          host_dtype_size(FLCE_DTYPE_F16) == 2);
}

static void host_rng_is_reproducible_and_in_range(void) {
    host_rng a, b;
    host_rng_seed(&a, 42);
    host_rng_seed(&b, 42);
    int same = 1;
    for (int i = 0; i < 1000; i++)
        same &= host_rng_next(&a) == host_rng_next(&b);
    double sum = 0.0, sq = 0.0;
    int64_t hits[7] = {0};
    for (int i = 0; i < 70000; i++) {
        double u = host_rng_uniform(&a);
        CHECK(u >= 0.0 && u < 1.0);
        double z = host_rng_normal(&a);
        sum += z, sq += z * z;
        int64_t k = host_rng_below(&a, 7);
        CHECK(k >= 0 && k < 7);
        hits[k >= 0 && k < 7 ? k : 0]++;
    }
    CHECK(same);
    CHECKF(fabs(sum / 70000) < 0.03 && fabs(sq / 70000 - 1.0) < 0.05, "mean %g, var %g",
           sum / 70000, sq / 70000);
    for (int k = 0; k < 7; k++)
        CHECKF(hits[k] > 9000 && hits[k] < 11000, "below(7) hit %d %lld times", k,
               (long long)hits[k]);
    host_rng_seed(&b, 43);
    CHECK(host_rng_next(&a) != host_rng_next(&b));
    CHECK(host_rng_below(&a, 1) == 0 && host_rng_below(&a, 0) == 0);
}

static void rel_l2_basics(void) {
    double ref[2] = {3.0, 4.0}, got[2] = {3.0, 4.5}, zero[2] = {0, 0};
    CHECK(ref_rel_l2(ref, ref, 2) == 0.0);
    CHECK(fabs(ref_rel_l2(ref, got, 2) - 0.1) < 1e-15);
    CHECK(ref_rel_l2(zero, ref, 2) == 5.0); /* ‖ref‖ = 0: absolute error */
    got[0] = NAN;
    CHECK(isnan(ref_rel_l2(ref, got, 2)));
    CHECK(isnan(ref_rel_l2(got, ref, 2)));
    CHECK(ref_rel_l2(ref, ref, 0) == 0.0);
}

int main(void) {
    uint64_t seed = host_fresh_seed();
    printf("seed %llu (FLCE_SEED=%llu replays this run)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    host_rng_seed(&rng, seed);

    RUN(fd_plain_mean);
    RUN(fd_plain_sum);
    RUN(fd_plain_none_with_grad_output);
    RUN(fd_label_smoothing);
    RUN(fd_z_loss);
    RUN(fd_softcap);
    RUN(fd_temperature);
    RUN(fd_bias);
    RUN(fd_class_weights);
    RUN(fd_class_weights_with_smoothing);
    RUN(fd_all_options_mean);
    RUN(fd_all_options_sum);
    RUN(fd_all_options_none);
    RUN(loss_matches_direct_formula_for_every_option);
    RUN(all_labels_ignored_mean_is_zero_with_zero_grads);
    RUN(ignored_tokens_get_zero_grad_and_do_not_count_in_mean);
    RUN(out_of_range_labels_are_treated_as_ignored);
    RUN(labels_at_0_and_V_minus_1);
    RUN(lse_matches_log_sum_exp_of_huge_logits);
    RUN(ref_row_agrees_with_ref_loss_and_grad);
    RUN(ref_row_dz_is_gradient_of_raw_logit);
    RUN(per_token_outputs_on_hand_computed_case);
    RUN(argmax_takes_first_of_equal_logits);
    RUN(token_scales_follow_reduction_and_weights);
    RUN(vocab_size_comes_from_total_or_offset_plus_shard);
    RUN(reference_handles_test_sized_problem);
    RUN(distill_fd_every_divergence_ce_temperature_reduction);
    RUN(distill_loss_matches_direct_formula);
    RUN(distill_jsd_ends_are_the_kls);
    RUN(distill_identical_teacher_gives_zero);
    RUN(distill_two_class_closed_form);
    RUN(distill_all_tokens_ignored_mean_is_zero);
    RUN(distill_reductions_agree_and_ignore_masks);
    RUN(distill_nan_teacher_row_stays_in_its_token);
    RUN(distill_row_dz_is_gradient_of_student_logits);
    RUN(host_bf16_round_trips);
    RUN(host_fp16_round_trips);
    RUN(host_every_16_bit_value_round_trips);
    RUN(host_conversions_round_to_nearest_even);
    RUN(host_round_to_dtype_matches_conversions);
    RUN(host_rng_is_reproducible_and_in_range);
    RUN(rel_l2_basics);
    FINISH();
}
