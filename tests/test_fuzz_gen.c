/*
 * test_fuzz_gen.c — the CPU half of `flce fuzz` (testing/fuzz_case.c), no GPU: case K of seed S is
 * the same problem and data every time; the cases cover the ranges and options issue 7 names and
 * every one plans; and the checker passes outputs simulated from the full fp64 reference (rounded
 * like the GPU's) on both its paths (whole reference, sampled rows) and fails them once corrupted.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz_case.h"
#include "host.h"
#include "plan.h"
#include "ref.h"

#define COVERAGE_CASES 3000

static void generator_is_deterministic(void)
{
    int differing = 0;
    for (uint64_t k = 0; k < 300; k++) {
        fz_case a, b;
        fz_case_make(42, k, &a);
        fz_case_make(99, k, &b); /* another seed in between changes nothing */
        fz_case_make(42, k, &b);
        differing += memcmp(&a, &b, sizeof a) != 0;
        if (fz_case_work(&a) > 1e6 || a.p.tokens * a.p.hidden > 100000) continue;
        fz_data x, y;
        CHECK(fz_data_make(&a, &x) == 0 && fz_data_make(&b, &y) == 0);
        size_t nd = (size_t)(x.n * x.d), vd = (size_t)(x.v * x.d);
        differing += memcmp(x.h, y.h, nd * sizeof *x.h) || memcmp(x.w, y.w, vd * sizeof *x.w) ||
                     memcmp(x.labels, y.labels, (size_t)x.n * sizeof *x.labels) ||
                     memcmp(x.h_dt, y.h_dt, nd * host_dtype_size(a.p.dtype));
        fz_data_free(&x), fz_data_free(&y);
    }
    CHECKF(differing == 0, "%d of 300 cases differ between two generations", differing);
    fz_case a, b;
    fz_case_make(42, 7, &a), fz_case_make(43, 7, &b);
    CHECK(memcmp(&a.p, &b.p, sizeof a.p) != 0); /* the seed matters */
}

typedef struct coverage {
    int dtype[3], reduction[3], mode[3], strategy[4], label64, offset, first_shard, ign_valid_id;
    int eps, zl, cap, temp, bias, cw, acc_h, acc_w, small_budget, tf32, det, go;
    int dense_ignore, no_ignore, block_ignore, outs[10];
    int n_max, n_one, d_max, d_min, v_max, v_one, sampled, big;
} coverage;

static void cases_cover_the_ranges_and_all_plan(void)
{
    coverage cv;
    memset(&cv, 0, sizeof cv);
    int bad_range = 0, bad_plan = 0, bad_valid = 0;
    double *work = malloc(sizeof(double) * COVERAGE_CASES);
    for (uint64_t k = 0; k < COVERAGE_CASES; k++) {
        fz_case c;
        fz_case_make(1, k, &c);
        const flce_problem *p = &c.p;
        work[k] = fz_case_work(&c);
        bad_range += p->tokens < 1 || p->tokens > FZ_MAX_TOKENS || p->hidden < 8 || p->hidden > FZ_MAX_HIDDEN ||
                     p->hidden % 8 || p->vocab_shard < 1 || p->vocab_shard > FZ_MAX_VOCAB;
        bad_range += (p->vocab_offset || p->vocab_total) && p->label_smoothing != 0;
        if (flce_problem_validate(p) != FLCE_OK) {
            if (bad_valid++ == 0) fprintf(stderr, "  case %llu: %s\n", (unsigned long long)k, flce_last_error());
        }
        plan pl;
        flce_op op = c.mode == FZ_FORWARD ? FLCE_OP_FORWARD : c.mode == FZ_BACKWARD ? FLCE_OP_BACKWARD
                                                                                     : FLCE_OP_LOSS_AND_GRAD;
        if (plan_make(p, op, 90, 132, NULL, &pl) != FLCE_OK) {
            if (bad_plan++ == 0) fprintf(stderr, "  case %llu: %s\n", (unsigned long long)k, flce_last_error());
        }
        cv.dtype[p->dtype]++, cv.reduction[p->reduction]++, cv.mode[c.mode]++, cv.strategy[p->strategy]++;
        cv.label64 += p->label_bits == 64, cv.offset += p->vocab_offset > 0;
        cv.first_shard += p->vocab_offset == 0 && p->vocab_total > p->vocab_shard;
        cv.ign_valid_id += p->ignore_index >= 0;
        cv.eps += p->label_smoothing > 0, cv.zl += p->z_loss > 0, cv.cap += p->softcap > 0;
        cv.temp += p->temperature != 1, cv.bias += p->has_bias, cv.cw += p->has_class_weights;
        cv.acc_h += p->accumulate_grad_hidden && (c.outputs & TENSOR_GRAD_HIDDEN);
        cv.acc_w += p->accumulate_grad_weight && (c.outputs & TENSOR_GRAD_WEIGHT);
        cv.small_budget += p->memory_budget > 0 && p->memory_budget < (64u << 20);
        cv.tf32 += p->allow_tf32, cv.det += p->deterministic, cv.go += c.grad_output;
        cv.dense_ignore += c.ignore_frac == 1, cv.no_ignore += c.ignore_frac == 0;
        cv.block_ignore += c.ignore_layout != 0;
        for (int b = 0; b < 10; b++) cv.outs[b] += (c.outputs >> b) & 1;
        cv.n_max += p->tokens == FZ_MAX_TOKENS, cv.n_one += p->tokens == 1;
        cv.d_max += p->hidden == FZ_MAX_HIDDEN, cv.d_min += p->hidden == 8;
        cv.v_max += p->vocab_shard == FZ_MAX_VOCAB, cv.v_one += p->vocab_shard == 1;
        cv.sampled += !c.full_ref, cv.big += work[k] > 1e10;
    }
    CHECKF(bad_range == 0, "%d cases out of range", bad_range);
    CHECKF(bad_valid == 0, "%d cases flce_problem_validate rejects", bad_valid);
    CHECKF(bad_plan == 0, "%d cases do not plan (budget too small?)", bad_plan);
    int *all = (int *)&cv, missing = 0;
    for (size_t i = 0; i < sizeof cv / sizeof(int); i++)
        if (all[i] == 0) {
            fprintf(stderr, "  coverage field %zu never set\n", i);
            missing++;
        }
    CHECKF(missing == 0, "%d kinds of case never drawn in %d cases", missing, COVERAGE_CASES);
    /* Skewed small: the median case is cheap, but some are big. */
    int small = 0;
    for (int k = 0; k < COVERAGE_CASES; k++) small += work[k] <= 1e8;
    /* more than half the cases at most 1e8 multiply-adds: the median case is small */
    printf("     %d cases: %d with N·V·D <= 1e8, %d over 1e10; N=40000 %d, D=8192 %d, V=256000 %d, "
           "offset %d, sampled %d\n", COVERAGE_CASES, small, cv.big, cv.n_max, cv.d_max, cv.v_max,
           cv.offset, cv.sampled);
    CHECK(small > COVERAGE_CASES / 2 && cv.big >= 5);
    free(work);
}

/* ---- the checker against simulated GPU outputs -------------------------------------------- */

static double round_dt(flce_dtype t, double v)
{
    host_round_to_dtype(t, &v, 1);
    return v;
}

typedef struct sim {
    fz_got g;
    double *full_dh, *full_dw, *full_db; /* what the GPU would hold, whole */
} sim;

static void store_grads(const fz_case *c, const fz_data *x, const fz_sample *s, sim *o);

/* GPU outputs as the reference says, rounded as the GPU stores them (fp32 or the dtype). */
static void simulate(const fz_case *c, const fz_data *x, const fz_sample *s, sim *o)
{
    memset(o, 0, sizeof *o);
    flce_problem q = fz_ref_problem(c);
    ref_extra e = {x->cw ? x->cw + c->p.vocab_offset : NULL};
    int64_t n = x->n, d = x->d, v = x->v;
    double *loss = calloc((size_t)n, 8), *lse = calloc((size_t)n, 8);
    o->full_dh = calloc((size_t)(n * d), 8), o->full_dw = calloc((size_t)(v * d), 8);
    o->full_db = calloc((size_t)v, 8);
    ref_loss_and_grad(&q, &e, n, d, v, x->h, x->w, x->b, x->ref_labels, x->go, loss, lse, o->full_dh,
                      o->full_dw, o->full_db);
    fz_got *g = &o->g;
    double zsum = 0, den = 0;
    g->lse = calloc((size_t)n, 8), g->lpt = calloc((size_t)n, 8), g->logprob = calloc((size_t)n, 8);
    g->entropy = calloc((size_t)n, 8), g->argmax = calloc((size_t)n, 8);
    g->loss = calloc((size_t)x->n_loss, 8), g->zl = calloc((size_t)x->n_loss, 8);
    for (int64_t i = 0; i < n; i++) {
        ref_row_out r;
        ref_row(&q, &e, d, v, x->h + i * d, x->w, x->b, x->ref_labels[i], &r, NULL);
        double wy = r.valid && e.class_weight ? e.class_weight[x->ref_labels[i]] : 1;
        g->lse[i] = (float)r.lse, g->lpt[i] = (float)r.loss, g->logprob[i] = (float)r.target_logprob;
        g->entropy[i] = (float)r.entropy, g->argmax[i] = r.argmax + c->p.vocab_offset;
        if (x->n_loss > 1) g->zl[i] = (float)(r.z_loss_term * wy);
        zsum += r.z_loss_term * wy, den += r.valid ? wy : 0;
    }
    for (int64_t i = 0; i < x->n_loss; i++) g->loss[i] = (float)loss[i];
    if (x->n_loss == 1) g->zl[0] = (float)(q.reduction == FLCE_REDUCTION_MEAN ? (den > 0 ? zsum / den : 0) : zsum);
    fz_got_drop_unasked(c, g);
    store_grads(c, x, s, o);
    free(loss), free(lse);
}

/* The gradients as the GPU stores them (fp32 sums in accumulate mode, else the dtype), and the
 * sampled rows of them in o->g. */
static void store_grads(const fz_case *c, const fz_data *x, const fz_sample *s, sim *o)
{
    int64_t n = x->n, d = x->d, v = x->v;
    fz_got *g = &o->g;
    unsigned out = c->outputs;
    flce_dtype t = c->p.dtype;
    for (int64_t i = 0; i < n * d; i++)
        o->full_dh[i] = x->acc_h ? (float)(o->full_dh[i] + x->acc_h[i]) : round_dt(t, o->full_dh[i]);
    for (int64_t i = 0; i < v * d; i++)
        o->full_dw[i] = x->acc_w ? (float)(o->full_dw[i] + x->acc_w[i]) : round_dt(t, o->full_dw[i]);
    for (int64_t j = 0; j < v; j++) o->full_db[j] = round_dt(t, o->full_db[j]);
    free(g->dh_rows), free(g->dw_rows), free(g->db_rows);
    g->dh_rows = g->dw_rows = g->db_rows = NULL;
    if (out & TENSOR_GRAD_HIDDEN) {
        g->dh_rows = malloc(sizeof(double) * (size_t)(s->n_tok * d));
        for (int64_t k = 0; k < s->n_tok; k++) memcpy(g->dh_rows + k * d, o->full_dh + s->tok[k] * d, (size_t)d * 8);
    }
    if (out & TENSOR_GRAD_WEIGHT) {
        g->dw_rows = malloc(sizeof(double) * (size_t)(s->n_voc * d));
        for (int64_t k = 0; k < s->n_voc; k++) memcpy(g->dw_rows + k * d, o->full_dw + s->voc[k] * d, (size_t)d * 8);
    }
    if (out & TENSOR_GRAD_BIAS) {
        g->db_rows = malloc(sizeof(double) * (size_t)s->n_voc);
        for (int64_t k = 0; k < s->n_voc; k++) g->db_rows[k] = o->full_db[s->voc[k]];
    }
}

static void sim_free(sim *o)
{
    fz_got *g = &o->g;
    free(g->loss), free(g->lse), free(g->lpt), free(g->zl), free(g->logprob), free(g->entropy);
    free(g->argmax), free(g->dh_rows), free(g->dw_rows), free(g->db_rows);
    free(o->full_dh), free(o->full_dw), free(o->full_db);
}

/* Row (of a k × d array of results, `init` the accumulate start values of those rows or NULL)
 * whose gradient part a − init is largest, or -1 when none stands out of the fp32 rounding. */
static int64_t largest_row(const double *a, const float *init, const int64_t *rows, int64_t k, int64_t d)
{
    int64_t best = -1;
    double bn = 0;
    for (int64_t r = 0; r < k; r++) {
        double s = 0, t = 0;
        for (int64_t c = 0; c < d; c++) {
            double i0 = init ? init[rows[r] * d + c] : 0;
            s += (a[r * d + c] - i0) * (a[r * d + c] - i0), t += a[r * d + c] * a[r * d + c];
        }
        if (s > bn && s > 0x1p-36 * t) bn = s, best = r;
    }
    return best;
}

/* The gradient part of row r 10 % too large. */
static void scale_row(double *a, const float *init, const int64_t *rows, int64_t r, int64_t d)
{
    for (int64_t c = 0; c < d; c++) {
        double i0 = init ? init[rows[r] * d + c] : 0;
        a[r * d + c] += 0.1 * (a[r * d + c] - i0);
    }
}

/* The kernels' arithmetic, modelled in fp32: logits, lse and dZ evaluated in float as
 * templates/rowops.cu does (dZ stored in the dtype, ×256 for fp16 mean/sum, the per-token
 * gradient inside it for reduction none), gradients summed from the stored dZ. Replaces the
 * gradients of a simulate()d result. */
static void float_model_grads(const fz_case *c, const fz_data *x, const fz_sample *s, sim *o)
{
    flce_problem q = fz_ref_problem(c);
    const double *cw = x->cw ? x->cw + c->p.vocab_offset : NULL;
    int64_t n = x->n, d = x->d, v = x->v;
    double *gs = fz_token_scales(c, x);
    int none = q.reduction == FLCE_REDUCTION_NONE, scaled = q.dtype == FLCE_DTYPE_F16 && !none;
    float eps = q.label_smoothing, lam = q.z_loss, cap = q.softcap, inv_t = 1.f / q.temperature;
    float wsum = 0;
    for (int64_t j = 0; j < v; j++) wsum += cw ? (float)cw[j] : 1.f;
    if (!cw) wsum = (float)v;
    memset(o->full_dh, 0, sizeof(double) * (size_t)(n * d));
    memset(o->full_dw, 0, sizeof(double) * (size_t)(v * d));
    memset(o->full_db, 0, sizeof(double) * (size_t)v);
    float *z = malloc(sizeof(float) * (size_t)v);
    for (int64_t i = 0; i < n && z && gs; i++) {
        int64_t y = x->ref_labels[i];
        if (y < 0 || gs[i] == 0) continue;
        float m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < v; j++) {
            float acc = 0;
            for (int64_t k = 0; k < d; k++) acc += (float)x->h[i * d + k] * (float)x->w[j * d + k];
            if (x->b) acc += (float)x->b[j];
            if (inv_t != 1.f) acc *= inv_t;
            if (cap > 0) acc = cap * tanhf(acc * (1.f / cap));
            z[j] = acc, m = fmaxf(m, acc);
        }
        for (int64_t j = 0; j < v; j++) sum += expf(z[j] - m);
        float lse = m + logf(sum), wy = cw ? (float)cw[y] : 1.f;
        float a = (1.f - eps) * wy + (eps > 0 ? eps * wsum / (float)v : 0.f) + 2.f * lam * wy * lse;
        for (int64_t j = 0; j < v; j++) {
            float val = a * expf(z[j] - lse);
            if (j == y) val -= (1.f - eps) * wy;
            if (eps > 0) val -= eps * (cw ? (float)cw[j] : 1.f) / (float)v;
            if (inv_t != 1.f) val *= inv_t;
            if (cap > 0) {
                float r = z[j] * (1.f / cap);
                val *= 1.f - r * r;
            }
            if (none) val *= (float)gs[i];
            if (scaled) val *= 256.f;
            double st = round_dt(q.dtype, val) * (none ? 1 : gs[i]) / (scaled ? 256 : 1);
            for (int64_t k = 0; k < d; k++) {
                o->full_dh[i * d + k] += st * x->w[j * d + k];
                o->full_dw[j * d + k] += st * x->h[i * d + k];
            }
            o->full_db[j] += st;
        }
    }
    free(z), free(gs);
    store_grads(c, x, s, o);
}

/* The cases `flce fuzz --seed 20261122` flagged on the device (bench/results/2026-11-22-h200x2-
 * final/fuzz.log, in archive/2026-11.tar.xz) whose gradients the first error measure held to a
 * relative error that fp32 evaluation of dZ cannot reach where its pieces cancel (V ≤ 3;
 * p_ij ≈ ε/V; p_iy ≈ 1): an fp32 model of the kernels must pass, and the corruptions must still
 * fail. */
static void checker_accepts_an_fp32_model_where_dz_cancels(void)
{
    const uint64_t flagged[] = {74,  282, 296, 322, 343, 355,  377,  421,  590,  669, 729,
                                751, 832, 843, 976, 1027, 1524, 1530, 1811, 1910, 1944};
    int wrong = 0, run = 0;
    for (size_t f = 0; f < sizeof flagged / sizeof flagged[0]; f++) {
        fz_case c;
        fz_case_make(20261122, flagged[f], &c);
        if (!c.full_ref || fz_case_work(&c) > 2e7) continue;
        fz_data x;
        fz_sample s;
        if (fz_inputs_make(&c, &x, &s)) {
            CHECK(!"host memory");
            continue;
        }
        for (int how = 0; how < 2; how++) {
            sim o, ref;
            simulate(&c, &x, &s, &o);
            simulate(&c, &x, &s, &ref);
            float_model_grads(&c, &x, &s, &o);
            int64_t r = -1;
            if (how == 1) { /* and a 10 % wrong gradient row still fails, where the row is not 0
                             * in exact math (V = 1: every dz is a cancellation to 0) */
                r = o.g.dw_rows ? largest_row(ref.g.dw_rows, x.acc_w, s.voc, s.n_voc, x.d) : -1;
                double rn = 0;
                for (int64_t q = 0; r >= 0 && q < x.d; q++) {
                    double gq = ref.g.dw_rows[r * x.d + q] - (x.acc_w ? x.acc_w[s.voc[r] * x.d + q] : 0);
                    rn += gq * gq;
                }
                if (rn < 1e-20) r = -1;
                if (r >= 0) scale_row(o.g.dw_rows, x.acc_w, s.voc, r, x.d);
            }
            fz_result res;
            if (how == 0 || r >= 0) {
                run++;
                int ok = fz_check(&c, &x, &s, &o.g, &res) == 0 && res.failed == (how == 1);
                if (!ok) {
                    char line[1024];
                    fz_case_describe(&c, line, sizeof line);
                    fprintf(stderr, "  case %llu (%s): verdict %s\n    %s\n", (unsigned long long)c.index,
                            how ? "dW row 10%% off" : "fp32 model", res.failed ? "fail" : "pass", line);
                    for (int q = 0; q < FZ_Q_COUNT; q++)
                        if (res.err[q] >= 0) fprintf(stderr, "    %-9s %.3e (tol %.3e)\n", fz_q_names[q], res.err[q], res.tol[q]);
                }
                wrong += !ok;
            }
            sim_free(&o), sim_free(&ref);
        }
        fz_sample_free(&s);
        fz_data_free(&x);
    }
    printf("     %d verdicts on the device-flagged cases\n", run);
    CHECKF(run > 0 && wrong == 0, "%d wrong verdicts", wrong);
}

/* Case 1346 of seed 20261127 (d3 of session 17; bf16, mean, 91 % of labels ignored, softcap and
 * temperature, bias): on the GPU dH 3.074e-3, dW 2.831e-3 and db 4.295e-3, the same under every
 * kernel family and knob, and the fp32 model gives the same four digits: db over the sampled rows
 * is led by the few rows holding a label, each one bf16 dZ term rounded twice (stored, returned),
 * whose worst case the checker's output rounding (then 2^-9 of the value, now 2^-8) understated.
 * The model must pass; its dW and db 10 % off must not. */
static void checker_accepts_the_fp32_model_of_case_1346(void)
{
#ifdef FLCE_TEST_SANITIZED
    /* one large case's fp64 arithmetic: 98 s under ASan against ~10 s in the default build, which
     * runs it; the code paths it walks are the other cases' */
    printf("    (left out under the sanitizers: the default build runs it)\n");
    return;
#endif
    fz_case c;
    fz_case_make(20261127, 1346, &c);
    CHECK(c.p.dtype == FLCE_DTYPE_BF16 && c.p.has_bias && !c.full_ref);
    fz_data x;
    fz_sample s;
    if (fz_inputs_make(&c, &x, &s)) {
        CHECK(!"host memory");
        return;
    }
    sim o;
    simulate(&c, &x, &s, &o);
    float_model_grads(&c, &x, &s, &o);
    fz_result res;
    int verdict[3] = {-1, -1, -1}; /* the model; its largest dW row 10 % off; db 10 % off */
    for (int how = 0; how < 3; how++) {
        sim m = o;
        size_t nw = (size_t)(s.n_voc * x.d) * sizeof(double), nb = (size_t)s.n_voc * sizeof(double);
        double *dw = o.g.dw_rows ? malloc(nw) : NULL, *db = o.g.db_rows ? malloc(nb) : NULL;
        if (dw) memcpy(dw, o.g.dw_rows, nw), m.g.dw_rows = dw;
        if (db) memcpy(db, o.g.db_rows, nb), m.g.db_rows = db;
        if (how == 1 && dw) scale_row(dw, x.acc_w, s.voc, largest_row(dw, x.acc_w, s.voc, s.n_voc, x.d), x.d);
        for (int64_t t = 0; how == 2 && db && t < s.n_voc; t++) db[t] *= 1.1;
        if (fz_check(&c, &x, &s, &m.g, &res) == 0) verdict[how] = res.failed;
        if (verdict[how] != (how != 0))
            for (int q = 0; q < FZ_Q_COUNT; q++)
                if (res.err[q] >= 0) fprintf(stderr, "    %d %-9s %.3e (tol %.3e)\n", how, fz_q_names[q], res.err[q], res.tol[q]);
        free(dw), free(db);
    }
    CHECKF(verdict[0] == 0, "the fp32 model of case 1346 failed the checker");
    CHECKF(verdict[1] == 1 && verdict[2] == 1, "a 10 %% wrong dW row (%d) or db (%d) passed", verdict[1], verdict[2]);
    sim_free(&o);
    fz_sample_free(&s);
    fz_data_free(&x);
}

typedef enum corruption { C_NONE, C_LSE, C_DH, C_DW, C_ARGMAX, C_POISON, C_COUNT } corruption;
static const char *c_names[] = {"none", "lse", "dH row", "dW row", "argmax", "poison"};

/* 1 when the checker's verdict is right: pass uncorrupted, fail corrupted (if applicable). */
static int verdict(const fz_case *c, const fz_data *x, const fz_sample *s, corruption how, int *applicable)
{
    sim o;
    simulate(c, x, s, &o);
    fz_got *g = &o.g;
    *applicable = 1;
    int64_t r;
    switch (how) {
    case C_NONE: break;
    case C_LSE: /* lse off by 1e-3 relative on one sampled token: 100× the tolerance */
        if (!g->lse) { *applicable = 0; break; }
        g->lse[s->tok[0]] += 1e-3 * (1 + fabs(g->lse[s->tok[0]]));
        break;
    case C_DH: /* the largest sampled dH row 10 % too large */
        r = g->dh_rows ? largest_row(g->dh_rows, x->acc_h, s->tok, s->n_tok, x->d) : -1;
        if (r < 0) { *applicable = 0; break; }
        scale_row(g->dh_rows, x->acc_h, s->tok, r, x->d);
        break;
    case C_DW:
        r = g->dw_rows ? largest_row(g->dw_rows, x->acc_w, s->voc, s->n_voc, x->d) : -1;
        if (r < 0) { *applicable = 0; break; }
        scale_row(g->dw_rows, x->acc_w, s->voc, r, x->d);
        break;
    case C_ARGMAX: /* another row than the maximum, unless every logit ties */
        if (!g->argmax || x->v < 2) { *applicable = 0; break; }
        g->argmax[s->tok[0]] = c->p.vocab_offset + (g->argmax[s->tok[0]] - c->p.vocab_offset + 1) % x->v;
        break;
    case C_POISON:
        g->nonfinite = 1;
        break;
    default: break;
    }
    fz_result res;
    int ok = fz_check(c, x, s, g, &res) == 0;
    int right = ok && (how == C_NONE ? !res.failed : !*applicable || res.failed);
    if (!right) {
        char line[1024];
        fz_case_describe(c, line, sizeof line);
        fprintf(stderr, "  case %llu, corruption %s: verdict %s\n    %s\n", (unsigned long long)c->index,
                c_names[how], res.failed ? "fail" : "pass", line);
        for (int q = 0; q < FZ_Q_COUNT; q++)
            if (res.err[q] >= 0) fprintf(stderr, "    %-9s %.3e (tol %.3e)\n", fz_q_names[q], res.err[q], res.tol[q]);
    }
    sim_free(&o);
    return right;
}

static void checker_passes_the_reference_and_fails_corruptions(void)
{
    int tried = 0, wrong = 0, corrupted = 0;
    for (uint64_t k = 0; tried < 40 && k < 2000; k++) {
        fz_case c;
        fz_case_make(3, k, &c);
        if (fz_case_work(&c) > (1 << 18) || c.p.tokens * c.p.hidden > 40000) continue;
        /* Both paths: the whole reference, and sampled rows (as for big cases). */
        for (int path = 0; path < 2; path++) {
            if (path == 1) {
                c.full_ref = 0;
                c.outputs |= TENSOR_LSE;
                if ((c.outputs & TENSOR_LOSS) && c.p.reduction != FLCE_REDUCTION_NONE) c.outputs |= TENSOR_LOSS_PER_TOKEN;
            }
            fz_data x;
            fz_sample s;
            if (fz_inputs_make(&c, &x, &s)) {
                CHECK(!"host memory");
                continue;
            }
            for (int how = 0; how < C_COUNT; how++) {
                int applicable = 0;
                wrong += !verdict(&c, &x, &s, (corruption)how, &applicable);
                corrupted += how != C_NONE && applicable;
            }
            fz_sample_free(&s);
            fz_data_free(&x);
        }
        tried++;
    }
    printf("     %d small cases × 2 paths, %d corrupted variants\n", tried, corrupted);
    CHECKF(wrong == 0, "%d wrong verdicts", wrong);
    CHECK(tried == 40 && corrupted > 100);
}

int main(void)
{
    RUN(generator_is_deterministic);
    RUN(cases_cover_the_ranges_and_all_plan);
    RUN(checker_passes_the_reference_and_fails_corruptions);
    RUN(checker_accepts_an_fp32_model_where_dz_cancels);
    RUN(checker_accepts_the_fp32_model_of_case_1346);
    FINISH();
}
