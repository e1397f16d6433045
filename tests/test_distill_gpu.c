/* test_distill_gpu.c — flce_distill_loss_and_grad on a GPU against testing/ref.c ref_distill in fp64
 * (issue 44 item 1): loss, per-token divergence, dHs and dWs on fresh random data (FLCE_SEED
 * reproduces), outputs poisoned before the call, relative L2 errors with the CE path's tolerances
 * (test_gpu.c): every divergence × CE off/on × reduction × bf16/fp32, T = 1 and 2, ignored tokens,
 * several token chunks (a small budget), labels NULL, grad_output, and a NaN teacher row that stays in
 * its token. Exit 77 without a GPU. Passed on an H200 (2026-11-28, bench/results/2026-11-28-session23). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "flce.h"
#include "gpu_io.h"
#include "server_ctx.h"
#include "gpu_ready.h"
#include "ref.h"

static flce_context *ctx;
static host_rng rng;

static double tol_grad(flce_dtype t) { return t == FLCE_DTYPE_F32 ? 1e-4 : 4e-3; }

typedef struct dcase {
    const char *name;
    int64_t n, ds, dt, v;
    flce_dtype dtype;
    flce_divergence div;
    float beta, temperature, ce_weight;
    flce_reduction reduction;
    uint64_t budget;    /* 0: default (one chunk) */
    int ignored_every;  /* every k-th token ignored (1: all; 0: none) */
    int no_labels;      /* labels NULL */
    int grad_output;    /* a random upstream gradient instead of NULL */
    int nan_token;      /* >= 0: that token's teacher hidden row gets a NaN (reduction none) */
    int bad_label;      /* k > 0: token k - 1's label is V + 3 (masked like ignore_index, and flagged) */
    double sharp;       /* > 0: the weights this many times larger (peaked distributions, logits to ±40) */
} dcase;

static int all_finite(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static void fill(double *x, int64_t count, double scale, flce_dtype t)
{
    for (int64_t i = 0; i < count; i++) x[i] = scale * host_rng_normal(&rng);
    host_round_to_dtype(t, x, (size_t)count);
}

static void run_case(const dcase *c)
{
    const int64_t n = c->n, ds = c->ds, dt = c->dt, v = c->v;
    const size_t es = host_dtype_size(c->dtype);
    double *hs = dalloc(n * ds), *ws = dalloc(v * ds), *ht = dalloc(n * dt), *wt = dalloc(v * dt);
    const double k = c->sharp > 0 ? c->sharp : 1.0;
    fill(hs, n * ds, 1.0, c->dtype), fill(ws, v * ds, k * 1.5 / sqrt((double)ds), c->dtype);
    fill(ht, n * dt, 1.0, c->dtype), fill(wt, v * dt, k * 2.0 / sqrt((double)dt), c->dtype);
    if (c->nan_token >= 0) ht[c->nan_token * dt + 3] = NAN;
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *labels32 = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        labels[i] = c->ignored_every && i % c->ignored_every == c->ignored_every - 1 ? -100 : host_rng_below(&rng, v);
        labels32[i] = (int32_t)labels[i];
    }
    if (c->bad_label > 0) /* the device sees V + 3; the reference, an ignored token */
        labels32[c->bad_label - 1] = (int32_t)(v + 3), labels[c->bad_label - 1] = -100;
    const int64_t n_loss = c->reduction == FLCE_REDUCTION_NONE ? n : 1;
    double *go = dalloc(n_loss);
    for (int64_t i = 0; i < n_loss; i++) go[i] = c->grad_output ? 0.5 + host_rng_uniform(&rng) : 1.0;

    ref_distill_problem rp = {(ref_divergence)c->div, c->beta, c->temperature, c->ce_weight, -100, c->reduction};
    double *rl = dalloc(n_loss), *rdh = dalloc(n * ds), *rdw = dalloc(v * ds), *rdiv = dalloc(n);
    const int64_t *rlab = c->no_labels ? NULL : labels;
    CHECKF(ref_distill(&rp, n, ds, dt, v, hs, ws, ht, wt, rlab, c->grad_output ? go : NULL, rl, rdh, rdw) == 0,
           "%s: reference failed", c->name);
    ref_distill_divergences(&rp, c->n, c->ds, c->dt, c->v, hs, ws, ht, wt, rlab, rdiv);

    flce_distill_problem p;
    flce_distill_problem_init(&p);
    p.tokens = n, p.hidden_student = ds, p.hidden_teacher = dt, p.vocab = v, p.dtype = c->dtype;
    p.divergence = c->div, p.beta = c->beta, p.temperature = c->temperature, p.ce_weight = c->ce_weight;
    p.reduction = c->reduction, p.memory_budget = c->budget, p.label_bits = 32;
    flce_distill_tensors t;
    flce_distill_tensors_init(&t);
    t.student_hidden = upload_dtype(c->dtype, hs, n * ds), t.student_weight = upload_dtype(c->dtype, ws, v * ds);
    t.teacher_hidden = upload_dtype(c->dtype, ht, n * dt), t.teacher_weight = upload_dtype(c->dtype, wt, v * dt);
    void *dlab = NULL;
    if (!c->no_labels && devmem_alloc(&dlab, (size_t)n * 4) == FLCE_OK) devmem_upload(dlab, labels32, (size_t)n * 4);
    t.labels = dlab;
    t.grad_output = c->grad_output ? upload_f32(go, n_loss) : NULL;
    t.loss = poisoned((size_t)n_loss * 4), t.divergence = poisoned((size_t)n * 4);
    t.grad_student_hidden = poisoned((size_t)(n * ds) * es), t.grad_student_weight = poisoned((size_t)(v * ds) * es);

    flce_status st = flce_distill_loss_and_grad(ctx, &p, &t, NULL);
    CHECKF(st == FLCE_OK, "%s: %s: %s", c->name, flce_status_name(st), flce_last_error());
    flce_status chk = flce_check(ctx, NULL);
    if (c->bad_label > 0)
        CHECKF(chk == FLCE_ERR_BAD_LABEL, "%s: a label outside [0, V): flce_check said %s, want FLCE_ERR_BAD_LABEL",
               c->name, flce_status_name(chk));
    else
        CHECKF(chk == FLCE_OK, "%s: check: %s", c->name, flce_last_error());
    double *gl = dalloc(n_loss), *gdiv = dalloc(n), *gdh = dalloc(n * ds), *gdw = dalloc(v * ds);
    down_f32(t.loss, gl, n_loss), down_f32(t.divergence, gdiv, n);
    download_f64(c->dtype, t.grad_student_hidden, gdh, (size_t)(n * ds));
    download_f64(c->dtype, t.grad_student_weight, gdw, (size_t)(v * ds));
    if (c->nan_token >= 0) {
        /* NaN stays in its token: its loss, divergence and dHs row; the others match */
        int64_t k = c->nan_token;
        CHECKF(isnan(gl[k]) && isnan(gdiv[k]), "%s: token %lld loss %g divergence %g", c->name, (long long)k, gl[k],
               gdiv[k]);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            if (i == k) continue;
            bad += !(fabs(gl[i] - rl[i]) <= 1e-4 * (1 + fabs(rl[i])) && fabs(gdiv[i] - rdiv[i]) <= 1e-4 * (1 + fabs(rdiv[i])));
            bad += !all_finite(gdh + i * ds, (size_t)ds) ||
                   ref_rel_l2(rdh + i * ds, gdh + i * ds, (size_t)ds) > tol_grad(c->dtype) * 4;
        }
        CHECKF(bad == 0, "%s: %d values of other tokens wrong", c->name, bad);
    } else {
        double e_loss = ref_rel_l2(rl, gl, (size_t)n_loss), e_div = ref_rel_l2(rdiv, gdiv, (size_t)n);
        double e_dh = ref_rel_l2(rdh, gdh, (size_t)(n * ds)), e_dw = ref_rel_l2(rdw, gdw, (size_t)(v * ds));
        double tg = tol_grad(c->dtype);
        CHECKF(e_loss <= 1e-4 && e_div <= 1e-4, "%s: loss %.2e (%g vs %g) divergence %.2e", c->name, e_loss, gl[0],
               rl[0], e_div);
        CHECKF(e_dh <= tg && e_dw <= tg, "%s: dHs %.2e dWs %.2e (tol %.0e)", c->name, e_dh, e_dw, tg);
    }
    devmem_free((void *)t.student_hidden), devmem_free((void *)t.student_weight);
    devmem_free((void *)t.teacher_hidden), devmem_free((void *)t.teacher_weight), devmem_free(dlab);
    devmem_free((void *)t.grad_output), devmem_free(t.loss), devmem_free(t.divergence);
    devmem_free(t.grad_student_hidden), devmem_free(t.grad_student_weight);
    free(hs), free(ws), free(ht), free(wt), free(labels), free(labels32), free(go);
    free(rl), free(rdh), free(rdw), free(rdiv), free(gl), free(gdiv), free(gdh), free(gdw);
}

static const char *const div_names[] = {"forward-kl", "reverse-kl", "jsd"};
static const char *const red_names[] = {"mean", "sum", "none"};

/* 3 divergences × CE off/on × 3 reductions × bf16/fp32; CE on at T = 1, CE off at T = 2. */
static void every_divergence_reduction_and_dtype_matches_the_reference(void)
{
    flce_dtype dts[] = {FLCE_DTYPE_BF16, FLCE_DTYPE_F32};
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 3; d++)
            for (int ce = 0; ce < 2; ce++)
                for (int r = 0; r < 3; r++) {
                    char name[128];
                    snprintf(name, sizeof name, "%s %s ce=%d %s", host_dtype_name(dts[a]), div_names[d], ce,
                             red_names[r]);
                    dcase c = {name, 96, 64, 128, 1000, dts[a], (flce_divergence)d, 0.3f, ce ? 1.0f : 2.0f,
                               ce ? 0.7f : 0.0f, (flce_reduction)r, 0, 0, 0, 0, -1};
                    run_case(&c);
                }
}

static void ignored_tokens_chunks_and_options_match_the_reference(void)
{
    static const dcase cases[] = {
        {"ignored tokens, mean, jsd", 128, 64, 64, 777, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_JSD, 0.5f, 1.0f, 0.5f,
         FLCE_REDUCTION_MEAN, 0, 3, 0, 0, -1},
        /* a memory_budget bounds the whole workspace (runtime/distill.c distill_plan_make): these two
           have room for no dWs buffer, so each chunk's dWs is added into dW in the dtype (6 and 5
           chunks; rounded once per chunk) */
        {"several chunks (small budget), reverse kl, dWs added into dW per chunk", 200, 64, 96, 1500,
         FLCE_DTYPE_BF16, FLCE_DIVERGENCE_REVERSE_KL, 0.f, 2.0f, 0.f, FLCE_REDUCTION_MEAN, 8ull * 1500 * 48, 4, 0, 0,
         -1},
        {"several chunks (small budget), forward kl (the compact path), dWs added into dW per chunk", 200, 64, 96,
         1500, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_FORWARD_KL, 0.f, 1.0f, 0.5f, FLCE_REDUCTION_MEAN, 4ull * 1500 * 48, 4,
         0, 0, -1},
        /* room for the fp32 dWs accumulator (Ds 64: every token's dZs would be larger), 4 chunks */
        {"several chunks, the dWs accumulator, reverse kl", 200, 64, 96, 1500, FLCE_DTYPE_BF16,
         FLCE_DIVERGENCE_REVERSE_KL, 0.f, 2.0f, 0.f, FLCE_REDUCTION_MEAN, 16ull * 1500 * 48, 4, 0, 0, -1},
        {"sharp logits (to ±40), forward kl, none", 128, 64, 128, 2000, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_FORWARD_KL,
         0.f, 1.0f, 0.f, FLCE_REDUCTION_NONE, 0, 0, 0, 1, -1, 0, 5.0},
        {"sharp logits, fp16, forward kl at T = 2", 128, 64, 128, 2000, FLCE_DTYPE_F16, FLCE_DIVERGENCE_FORWARD_KL,
         0.f, 2.0f, 0.f, FLCE_REDUCTION_SUM, 0, 0, 0, 0, -1, 0, 5.0},
        {"sharp logits, reverse kl (the fp32 path)", 128, 64, 128, 2000, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_REVERSE_KL,
         0.f, 1.0f, 0.f, FLCE_REDUCTION_MEAN, 0, 0, 0, 0, -1, 0, 5.0},
        {"several chunks, fp32, forward kl, sum", 200, 32, 32, 999, FLCE_DTYPE_F32, FLCE_DIVERGENCE_FORWARD_KL, 0.f,
         1.0f, 1.0f, FLCE_REDUCTION_SUM, 8ull * 999 * 33, 5, 0, 1, -1},
        {"labels NULL, jsd beta 0 is forward kl", 64, 32, 64, 500, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_JSD, 0.0f, 1.5f,
         0.f, FLCE_REDUCTION_MEAN, 0, 0, 1, 0, -1},
        {"jsd beta 1 is reverse kl, none with grad_output", 64, 32, 64, 500, FLCE_DTYPE_F16, FLCE_DIVERGENCE_JSD, 1.0f,
         1.0f, 0.f, FLCE_REDUCTION_NONE, 0, 0, 0, 1, -1},
        {"every token ignored: mean 0", 16, 32, 32, 300, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_FORWARD_KL, 0.f, 1.0f, 0.f,
         FLCE_REDUCTION_MEAN, 0, 1, 0, 0, -1},
        {"NaN teacher row stays in its token", 64, 32, 64, 600, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_JSD, 0.4f, 1.0f, 0.f,
         FLCE_REDUCTION_NONE, 0, 0, 0, 0, 17},
        {"a label outside [0, V) is masked and flagged", 96, 32, 64, 700, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_FORWARD_KL,
         0.f, 1.0f, 0.5f, FLCE_REDUCTION_MEAN, 0, 5, 0, 0, -1, 12},
        /* room for every token's dZs (N − chunk rows)·V·2 ≤ V·Ds·4 in 3 and 4 chunks: dZs of all tokens
           kept, dWs once (runtime/distill.c dw_schedule) */
        {"several chunks, dWs once over all tokens, reverse kl, CE", 200, 128, 96, 1500, FLCE_DTYPE_BF16,
         FLCE_DIVERGENCE_REVERSE_KL, 0.f, 1.0f, 0.5f, FLCE_REDUCTION_MEAN, 20ull * 1500 * 48, 4, 0, 0, -1},
        {"several chunks, dWs once over all tokens, fp16 jsd, none", 130, 96, 64, 999, FLCE_DTYPE_F16,
         FLCE_DIVERGENCE_JSD, 0.6f, 2.0f, 0.f, FLCE_REDUCTION_NONE, 15ull * 1000 * 40, 0, 0, 1, -1},
        /* the compact path likewise: every token's p̃ / dZs kept (3 and 2 chunks) */
        {"several chunks, dWs once over all tokens, forward kl (compact), CE", 200, 128, 96, 1500, FLCE_DTYPE_BF16,
         FLCE_DIVERGENCE_FORWARD_KL, 0.f, 1.0f, 0.5f, FLCE_REDUCTION_MEAN, 12ull * 1500 * 48, 4, 0, 0, -1},
        {"several chunks, dWs once over all tokens, fp16 forward kl (compact) at T = 2, none", 150, 96, 64, 1500,
         FLCE_DTYPE_F16, FLCE_DIVERGENCE_FORWARD_KL, 0.f, 2.0f, 0.f, FLCE_REDUCTION_NONE, 12ull * 1500 * 48, 0, 0, 1,
         -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* The teacher as top-k (problem.teacher_topk = k): the k largest of a random teacher's fp64
 * log-softmax in a shuffled order, against forward KL over those ids in fp64 (D_i, the loss, dHs and
 * dWs from dz = g·(q·P_K − p·1[K])/T + CE); token 1 repeats an id and token 4 names one past V, so
 * their divergence is NaN and the other tokens still match. */
typedef struct tcase {
    const char *name;
    int64_t n, ds, v;
    int k;
    flce_dtype dtype;
    float temperature, ce_weight;
    flce_reduction reduction;
    uint64_t budget;
    int bad_ids;
    double wscale; /* the student weight's scale · sqrt(ds) (0: 1.5); a large one spreads its logits */
} tcase;

static void run_topk_case(const tcase *c)
{
    const int64_t n = c->n, ds = c->ds, v = c->v, k = c->k;
    const size_t es = host_dtype_size(c->dtype);
    double *hs = dalloc(n * ds), *ws = dalloc(v * ds), *zt = dalloc(v), *lp = dalloc(n * k);
    int64_t *ids = malloc(sizeof(int64_t) * (size_t)(n * k)), *labels = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *labels32 = malloc(sizeof(int32_t) * (size_t)n);
    fill(hs, n * ds, 1.0, c->dtype), fill(ws, v * ds, (c->wscale ? c->wscale : 1.5) / sqrt((double)ds), c->dtype);
    for (int64_t i = 0; i < n; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; j++) zt[j] = 2.0 * host_rng_normal(&rng), m = fmax(m, zt[j]);
        for (int64_t j = 0; j < v; j++) s += exp(zt[j] - m);
        for (int64_t q = 0; q < k; q++) { /* the q-th largest, by selection (k ≤ 64) */
            int64_t best = -1;
            for (int64_t j = 0; j < v; j++) {
                int taken = 0;
                for (int64_t u = 0; u < q && !taken; u++) taken = ids[i * k + u] == j;
                if (!taken && (best < 0 || zt[j] > zt[best])) best = j;
            }
            ids[i * k + q] = best, lp[i * k + q] = (double)(float)(zt[best] - m - log(s));
        }
        for (int64_t q = k - 1; q > 0; q--) { /* shuffled: the call must not assume an order */
            int64_t u = (int64_t)host_rng_below(&rng, q + 1), ti = ids[i * k + q];
            double tl = lp[i * k + q];
            ids[i * k + q] = ids[i * k + u], lp[i * k + q] = lp[i * k + u], ids[i * k + u] = ti, lp[i * k + u] = tl;
        }
        labels[i] = i % 9 == 8 ? -100 : (int64_t)host_rng_below(&rng, v), labels32[i] = (int32_t)labels[i];
    }
    if (c->bad_ids && k >= 2) ids[1 * k + 1] = ids[1 * k];
    if (c->bad_ids) ids[4 * k + k - 1] = v + 3;
    /* the reference */
    const int64_t n_loss = c->reduction == FLCE_REDUCTION_NONE ? n : 1;
    double *rl = dalloc(n), *rdiv = dalloc(n), *dz = dalloc(n * v), *rdh = dalloc(n * ds), *rdw = dalloc(v * ds);
    double count = 0, total = 0;
    for (int64_t i = 0; i < n; i++) {
        const int valid = labels[i] != -100;
        rl[i] = rdiv[i] = 0;
        if (!valid) continue;
        count += 1;
        double *z = dz + i * v, m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; j++) {
            double a = 0;
            for (int64_t l = 0; l < ds; l++) a += hs[i * ds + l] * ws[j * ds + l];
            z[j] = a;
        }
        for (int64_t j = 0; j < v; j++) m = fmax(m, z[j] / c->temperature);
        for (int64_t j = 0; j < v; j++) s += exp(z[j] / c->temperature - m);
        const double lse = m + log(s);
        double d = 0, pk = 0;
        for (int64_t q = 0; q < k; q++) {
            const double p = exp(lp[i * k + q]);
            d += p * (lp[i * k + q] - (z[ids[i * k + q]] / c->temperature - lse)), pk += p;
        }
        double ce = 0, m1 = -INFINITY, s1 = 0;
        for (int64_t j = 0; j < v; j++) m1 = fmax(m1, z[j]);
        for (int64_t j = 0; j < v; j++) s1 += exp(z[j] - m1);
        ce = m1 + log(s1) - z[labels[i]];
        rdiv[i] = d, rl[i] = d + c->ce_weight * ce, total += rl[i];
        for (int64_t j = 0; j < v; j++) {
            const double q = exp(z[j] / c->temperature - lse), q1 = exp(z[j] - m1) / s1;
            z[j] = q * pk / c->temperature + c->ce_weight * (q1 - (j == labels[i]));
        }
        for (int64_t q = 0; q < k; q++) z[ids[i * k + q]] -= exp(lp[i * k + q]) / c->temperature;
    }
    double rloss = c->reduction == FLCE_REDUCTION_MEAN ? (count ? total / count : 0) : total;
    for (int64_t i = 0; i < n; i++) {
        const double g = labels[i] == -100 ? 0 : c->reduction == FLCE_REDUCTION_MEAN ? 1.0 / count : 1.0;
        for (int64_t j = 0; j < v; j++) dz[i * v + j] *= g;
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t l = 0; l < ds; l++) {
            double a = 0;
            for (int64_t j = 0; j < v; j++) a += dz[i * v + j] * ws[j * ds + l];
            rdh[i * ds + l] = a;
        }
    for (int64_t j = 0; j < v; j++)
        for (int64_t l = 0; l < ds; l++) {
            double a = 0;
            for (int64_t i = 0; i < n; i++) a += dz[i * v + j] * hs[i * ds + l];
            rdw[j * ds + l] = a;
        }
    /* the call */
    flce_distill_problem p;
    flce_distill_problem_init(&p);
    p.tokens = n, p.hidden_student = ds, p.hidden_teacher = 0, p.vocab = v, p.dtype = c->dtype, p.teacher_topk = c->k;
    p.temperature = c->temperature, p.ce_weight = c->ce_weight, p.reduction = c->reduction, p.label_bits = 32;
    p.memory_budget = c->budget;
    flce_distill_tensors t;
    flce_distill_tensors_init(&t);
    t.student_hidden = upload_dtype(c->dtype, hs, n * ds), t.student_weight = upload_dtype(c->dtype, ws, v * ds);
    void *dids = NULL, *dlab = NULL;
    if (devmem_alloc(&dids, (size_t)(n * k) * 8) == FLCE_OK) devmem_upload(dids, ids, (size_t)(n * k) * 8);
    if (devmem_alloc(&dlab, (size_t)n * 4) == FLCE_OK) devmem_upload(dlab, labels32, (size_t)n * 4);
    t.teacher_topk_indices = dids, t.teacher_topk_logprobs = upload_f32(lp, n * k), t.labels = dlab;
    t.loss = poisoned((size_t)n_loss * 4), t.divergence = poisoned((size_t)n * 4);
    t.grad_student_hidden = poisoned((size_t)(n * ds) * es), t.grad_student_weight = poisoned((size_t)(v * ds) * es);
    flce_status st = flce_distill_loss_and_grad(ctx, &p, &t, NULL);
    CHECKF(st == FLCE_OK, "%s: %s: %s", c->name, flce_status_name(st), flce_last_error());
    CHECKF(flce_check(ctx, NULL) == FLCE_OK, "%s: check: %s", c->name, flce_last_error());
    double *gl = dalloc(n_loss), *gdiv = dalloc(n), *gdh = dalloc(n * ds), *gdw = dalloc(v * ds);
    down_f32(t.loss, gl, n_loss), down_f32(t.divergence, gdiv, n);
    download_f64(c->dtype, t.grad_student_hidden, gdh, (size_t)(n * ds));
    download_f64(c->dtype, t.grad_student_weight, gdw, (size_t)(v * ds));
    if (c->bad_ids) {
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const int nan_token = labels[i] != -100 && ((i == 1 && k >= 2) || i == 4);
            if (nan_token) bad += !isnan(gdiv[i]) || !isnan(gdh[i * ds]);
            else bad += !(fabs(gdiv[i] - rdiv[i]) <= 1e-4 * (1 + fabs(rdiv[i])));
        }
        CHECKF(bad == 0, "%s: %d tokens wrong (NaN where the ids are bad, the reference elsewhere)", c->name, bad);
    } else {
        double e_loss = c->reduction == FLCE_REDUCTION_NONE ? ref_rel_l2(rl, gl, (size_t)n) : fabs(gl[0] - rloss) / (1 + fabs(rloss));
        double e_div = ref_rel_l2(rdiv, gdiv, (size_t)n);
        double e_dh = ref_rel_l2(rdh, gdh, (size_t)(n * ds)), e_dw = ref_rel_l2(rdw, gdw, (size_t)(v * ds));
        double tg = tol_grad(c->dtype);
        CHECKF(e_loss <= 1e-5 && e_div <= 1e-5, "%s: loss %.2e (%g vs %g) divergence %.2e", c->name, e_loss, gl[0],
               rloss, e_div);
        CHECKF(e_dh <= tg && e_dw <= tg, "%s: dHs %.2e dWs %.2e (tol %.0e)", c->name, e_dh, e_dw, tg);
    }
    devmem_free((void *)t.student_hidden), devmem_free((void *)t.student_weight), devmem_free(dids), devmem_free(dlab);
    devmem_free((void *)t.teacher_topk_logprobs), devmem_free(t.loss), devmem_free(t.divergence);
    devmem_free(t.grad_student_hidden), devmem_free(t.grad_student_weight);
    free(hs), free(ws), free(zt), free(lp), free(ids), free(labels), free(labels32);
    free(rl), free(rdiv), free(dz), free(rdh), free(rdw), free(gl), free(gdiv), free(gdh), free(gdw);
}

static void teacher_topk_matches_the_reference(void)
{
    static const tcase cases[] = {
        {"top-k teacher, bf16, k 16, mean", 96, 64, 1000, 16, FLCE_DTYPE_BF16, 1.0f, 0.f, FLCE_REDUCTION_MEAN, 0, 0},
        {"top-k teacher, fp32, k 64, sum, T 2", 96, 32, 700, 64, FLCE_DTYPE_F32, 2.0f, 0.f, FLCE_REDUCTION_SUM, 0, 0},
        {"top-k teacher, bf16, k 1, none, CE", 64, 32, 500, 1, FLCE_DTYPE_BF16, 1.0f, 0.5f, FLCE_REDUCTION_NONE, 0, 0},
        {"top-k teacher, fp16, k 8, 2 chunks, dWs added into dW per chunk", 200, 64, 1500, 8, FLCE_DTYPE_F16, 1.5f,
         0.f, FLCE_REDUCTION_MEAN, 6ull * 1504 * 48, 0},
        {"top-k teacher, bad ids make their tokens NaN", 64, 32, 300, 4, FLCE_DTYPE_BF16, 1.0f, 0.f,
         FLCE_REDUCTION_NONE, 0, 1},
        /* student logits ~N(0, 20²): many ids lie 28+ nats under their column group's maximum, where
         * the compact store's fp16 p̃ is 0 (the row kernel recomputes those logits exactly) */
        {"top-k teacher, bf16, k 32, ids far under their group's maximum", 96, 64, 1000, 32, FLCE_DTYPE_BF16, 1.0f,
         0.f, FLCE_REDUCTION_NONE, 0, 0, 20.0},
        {"top-k teacher, fp16, k 64, sum, 3 chunks, dWs added into dW per chunk", 130, 128, 2000, 64, FLCE_DTYPE_F16,
         1.0f, 0.f, FLCE_REDUCTION_SUM, 2ull * 2000 * 70, 0, 4.0},
        /* (the two above have room for no dWs buffer; here a larger budget and Ds 32 keep the fp32
         * accumulator) */
        {"top-k teacher, bf16, k 8, 3 chunks, the dWs accumulator", 300, 32, 1500, 8, FLCE_DTYPE_BF16, 1.0f, 0.f,
         FLCE_REDUCTION_MEAN, 12ull * 1504 * 48, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_topk_case(&cases[i]);
}

/* A server's context (compile_in_call = 0, no background compiles) over an empty cache: the call
 * refuses with FLCE_ERR_NOT_READY before flce_distill_prepare (NULL tensors: every variant), and
 * runs after it. */
static void prepare_before_a_never_compiling_call(void)
{
    char dir[] = "/tmp/flce-distill-prepare-XXXXXX"; /* mkdtemp's template (server_ctx.h) */
    flce_context *server = server_context(dir);
    CHECKF(server != NULL, "server context in %s: %s", dir, flce_last_error());
    const int64_t n = 32, ds = 32, dt = 64, v = 300;
    flce_distill_problem p;
    flce_distill_problem_init(&p);
    p.tokens = n, p.hidden_student = ds, p.hidden_teacher = dt, p.vocab = v;
    double *hs = dalloc(n * ds), *ws = dalloc(v * ds), *ht = dalloc(n * dt), *wt = dalloc(v * dt);
    fill(hs, n * ds, 1.0, p.dtype), fill(ws, v * ds, 0.2, p.dtype), fill(ht, n * dt, 1.0, p.dtype);
    fill(wt, v * dt, 0.2, p.dtype);
    flce_distill_tensors t;
    flce_distill_tensors_init(&t);
    t.student_hidden = upload_dtype(p.dtype, hs, n * ds), t.student_weight = upload_dtype(p.dtype, ws, v * ds);
    t.teacher_hidden = upload_dtype(p.dtype, ht, n * dt), t.teacher_weight = upload_dtype(p.dtype, wt, v * dt);
    t.loss = poisoned(4), t.grad_student_hidden = poisoned((size_t)(n * ds) * 2);
    t.grad_student_weight = poisoned((size_t)(v * ds) * 2);
    flce_status st = flce_distill_loss_and_grad(server, &p, &t, NULL);
    CHECKF(st == FLCE_ERR_NOT_READY, "before prepare: %s (%s)", flce_status_name(st), flce_last_error());
    CHECKF(flce_distill_prepare(server, &p, NULL) == FLCE_OK, "prepare: %s", flce_last_error());
    st = flce_distill_loss_and_grad(server, &p, &t, NULL);
    CHECKF(st == FLCE_OK && flce_check(server, NULL) == FLCE_OK, "after prepare: %s", flce_last_error());
    double loss = 0;
    down_f32(t.loss, &loss, 1);
    CHECKF(isfinite(loss), "loss %g", loss);
    devmem_free((void *)t.student_hidden), devmem_free((void *)t.student_weight);
    devmem_free((void *)t.teacher_hidden), devmem_free((void *)t.teacher_weight), devmem_free(t.loss);
    devmem_free(t.grad_student_hidden), devmem_free(t.grad_student_weight);
    free(hs), free(ws), free(ht), free(wt);
    CHECK(server_context_done(server, dir) == 0);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    uint64_t seed = host_fresh_seed();
    printf("seed %llu (FLCE_SEED=%llu reproduces)\n", (unsigned long long)seed, (unsigned long long)seed);
    host_rng_seed(&rng, seed);
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    RUN(every_divergence_reduction_and_dtype_matches_the_reference);
    RUN(ignored_tokens_chunks_and_options_match_the_reference);
    RUN(teacher_topk_matches_the_reference);
    RUN(prepare_before_a_never_compiling_call);
    flce_context_destroy(ctx);
    FINISH();
}
