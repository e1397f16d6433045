/* test_saved.c — the saved-logits strategy (flce.h "Saved logits": flce_forward keeps the compact
 * logits, flce_backward forms dZ from them) and the gradients of per-token outputs
 * (problem.grad_outputs: log-prob, lse, entropy) against an fp64 reference of docs/DESIGN.md §1.3:
 *   dz_ij = g_i·∂loss_i/∂z_ij + c_ij·[g_lp,i·(1[j=y] − p_ij) + g_lse,i·p_ij − g_H,i·p_ij·(log p_ij + H_i)]
 * with c_ij the chain factor of temperature and softcap. Fresh random data each run, outputs
 * poisoned before the calls. Also run under FLCE_DEV=qrows=1 (row-scaled logits at every size), as
 * test_saved_qrows. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "ref.h"

static flce_context *ctx;
static host_rng rng;

typedef struct scase {
    const char *name;
    int64_t n, d, v;
    flce_dtype dtype;
    flce_reduction reduction;
    double logit_sd, ignore_frac;
    int grad_outputs;      /* FLCE_GRAD_* bits given upstream gradients */
    int loss_grad;         /* the loss also gets an upstream gradient (else 0: only the outputs) */
    float temperature, smoothing, softcap;
    flce_strategy strategy; /* SAVED (two calls) or CHUNKED (one loss-and-grad call) */
} scase;

/* The reference: loss, lse, log-probs, entropy and dH, dW of the case's upstream gradients. */
typedef struct refout {
    double *loss, *lse, *lp, *ent, *dh, *dw;
} refout;

static void reference(const scase *c, const flce_problem *p, const double *h, const double *w, const int64_t *y,
                      const double *g_loss, const double *g_lp, const double *g_lse, const double *g_h,
                      const double *g_rows, refout *r)
{
    int64_t n = c->n, d = c->d, v = c->v;
    ref_loss_and_grad(p, NULL, n, d, v, h, w, NULL, y, g_loss, r->loss, r->lse, r->dh, r->dw, NULL);
    if (g_rows) { /* d Σ_i g_rows,i·loss_i: the same rows under reduction none, added */
        flce_problem q = *p;
        q.reduction = FLCE_REDUCTION_NONE;
        double *dh = dalloc(n * d), *dw = dalloc(v * d);
        ref_loss_and_grad(&q, NULL, n, d, v, h, w, NULL, y, g_rows, NULL, NULL, dh, dw, NULL);
        for (int64_t k = 0; k < n * d; k++) r->dh[k] += dh[k];
        for (int64_t k = 0; k < v * d; k++) r->dw[k] += dw[k];
        free(dh), free(dw);
    }
    ref_add_output_grads(p, NULL, n, d, v, h, w, NULL, y, g_lp, g_lse, g_h, r->dh, r->dw, NULL);
    for (int64_t i = 0; i < n; i++) {
        ref_row_out o;
        ref_row(p, NULL, d, v, h + i * d, w, NULL, y[i], &o, NULL);
        r->lp[i] = o.target_logprob, r->ent[i] = o.entropy;
    }
}

static double *upstream(int64_t n, int on)
{
    if (!on) return NULL;
    double *g = dalloc(n);
    for (int64_t i = 0; i < n; i++) g[i] = host_rng_normal(&rng); /* advantages: both signs */
    return g;
}

static void check_saved(const scase *c)
{
    int64_t n = c->n, d = c->d, v = c->v, n_loss = c->reduction == FLCE_REDUCTION_NONE ? n : 1;
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_shard = v, p.dtype = c->dtype, p.reduction = c->reduction;
    p.temperature = c->temperature > 0 ? c->temperature : 1.0f, p.label_smoothing = c->smoothing;
    p.softcap = c->softcap, p.grad_outputs = c->grad_outputs, p.strategy = c->strategy;
    double *h = dalloc(n * d), *w = dalloc(v * d);
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    double sw = c->logit_sd / sqrt((double)d);
    for (int64_t i = 0; i < n * d; i++) h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) w[i] = sw * host_rng_normal(&rng);
    host_round_to_dtype(c->dtype, h, (size_t)(n * d));
    host_round_to_dtype(c->dtype, w, (size_t)(v * d));
    for (int64_t i = 0; i < n; i++) y[i] = host_rng_uniform(&rng) < c->ignore_frac ? -100 : host_rng_below(&rng, v);
    double *g_loss = upstream(n_loss, c->loss_grad);
    double *g_lp = upstream(n, c->grad_outputs & FLCE_GRAD_LOGPROB);
    double *g_lse = upstream(n, c->grad_outputs & FLCE_GRAD_LSE);
    double *g_h = upstream(n, c->grad_outputs & FLCE_GRAD_ENTROPY);
    double *g_rows = upstream(n, c->grad_outputs & FLCE_GRAD_LOSS_PER_TOKEN);
    if (!c->loss_grad) { /* the loss unused: an upstream gradient of 0 */
        g_loss = dalloc(n_loss);
    }

    int32_t *y32 = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) y32[i] = (int32_t)y[i];
    void *dlab = NULL;
    devmem_alloc(&dlab, (size_t)n * 4);
    devmem_upload(dlab, y32, (size_t)n * 4);
    size_t es = host_dtype_size(c->dtype);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = upload_dtype(c->dtype, h, n * d), t.weight = upload_dtype(c->dtype, w, v * d), t.labels = dlab;
    t.loss = poisoned((size_t)n * 4), t.lse = poisoned((size_t)n * 4);
    t.target_logprob = poisoned((size_t)n * 4), t.entropy = poisoned((size_t)n * 4);
    t.grad_hidden = poisoned((size_t)(n * d) * es), t.grad_weight = poisoned((size_t)(v * d) * es);
    t.grad_output = upload_f32(g_loss, n_loss);
    if (g_lp) t.grad_logprob = upload_f32(g_lp, n);
    if (g_lse) t.grad_lse = upload_f32(g_lse, n);
    if (g_h) t.grad_entropy = upload_f32(g_h, n);
    if (g_rows) t.grad_loss_per_token = upload_f32(g_rows, n);
    uint64_t ws = 0;
    void *dws = NULL;
    flce_status st = flce_workspace_size(ctx, &p, c->strategy == FLCE_STRATEGY_SAVED ? FLCE_OP_FORWARD
                                                                                   : FLCE_OP_LOSS_AND_GRAD, &ws);
    if (st == FLCE_OK) st = devmem_alloc(&dws, ws ? ws : 256);
    t.workspace = dws, t.workspace_bytes = ws;
    if (st == FLCE_OK) {
        if (c->strategy == FLCE_STRATEGY_SAVED) {
            st = flce_forward(ctx, &p, &t, NULL);
            /* the caller's own work in between: the backward must not depend on it */
            if (st == FLCE_OK) st = devmem_sync();
            if (st == FLCE_OK) st = flce_backward(ctx, &p, &t, NULL);
        } else {
            st = flce_loss_and_grad(ctx, &p, &t, NULL);
        }
    }
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    CHECKF(st == FLCE_OK, "%s: %s", c->name, flce_last_error());
    if (st == FLCE_OK) {
        refout r = {dalloc(n), dalloc(n), dalloc(n), dalloc(n), dalloc(n * d), dalloc(v * d)};
        reference(c, &p, h, w, y, g_loss, g_lp, g_lse, g_h, g_rows, &r);
        double *gl = dalloc(n), *glse = dalloc(n), *glp = dalloc(n), *gent = dalloc(n);
        double *gdh = dalloc(n * d), *gdw = dalloc(v * d);
        down_f32(t.loss, gl, n_loss), down_f32(t.lse, glse, n), down_f32(t.target_logprob, glp, n);
        down_f32(t.entropy, gent, n);
        download_f64(c->dtype, t.grad_hidden, gdh, (size_t)(n * d));
        download_f64(c->dtype, t.grad_weight, gdw, (size_t)(v * d));
        double e_loss = ref_rel_l2(r.loss, gl, (size_t)n_loss), e_lse = ref_rel_l2(r.lse, glse, (size_t)n);
        double e_lp = ref_rel_l2(r.lp, glp, (size_t)n), e_ent = ref_rel_l2(r.ent, gent, (size_t)n);
        double e_dh = ref_rel_l2(r.dh, gdh, (size_t)(n * d)), e_dw = ref_rel_l2(r.dw, gdw, (size_t)(v * d));
        printf("  %-58s loss %.1e lse %.1e lp %.1e H %.1e dH %.1e dW %.1e\n", c->name, e_loss, e_lse, e_lp, e_ent,
               e_dh, e_dw);
        CHECKF(e_loss <= 1e-5 && e_lse <= 1e-5 && e_lp <= 1e-4 && e_ent <= 1e-4,
               "%s: outputs off: loss %.2e lse %.2e logprob %.2e entropy %.2e", c->name, e_loss, e_lse, e_lp, e_ent);
        CHECKF(e_dh <= 4e-3 && e_dw <= 4e-3, "%s: gradients off: dH %.2e dW %.2e (tolerance 4e-3)", c->name, e_dh,
               e_dw);
        free(r.loss), free(r.lse), free(r.lp), free(r.ent), free(r.dh), free(r.dw);
        free(gl), free(glse), free(glp), free(gent), free(gdh), free(gdw);
    }
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(dlab), devmem_free(t.loss);
    devmem_free(t.lse), devmem_free(t.target_logprob), devmem_free(t.entropy), devmem_free(t.grad_hidden);
    devmem_free(t.grad_weight), devmem_free((void *)t.grad_output), devmem_free((void *)t.grad_logprob);
    devmem_free((void *)t.grad_lse), devmem_free((void *)t.grad_entropy), devmem_free((void *)t.grad_loss_per_token);
    devmem_free(dws);
    free(h), free(w), free(y), free(y32), free(g_loss), free(g_lp), free(g_lse), free(g_h), free(g_rows);
}

#define SAVED FLCE_STRATEGY_SAVED
#define CHUNKED FLCE_STRATEGY_CHUNKED
#define LP FLCE_GRAD_LOGPROB
#define LSE FLCE_GRAD_LSE
#define ENT FLCE_GRAD_ENTROPY
#define ROWS FLCE_GRAD_LOSS_PER_TOKEN
#define BF FLCE_DTYPE_BF16
#define F16 FLCE_DTYPE_F16

static void saved_logits_match_the_reference(void)
{
    static const scase cases[] = {
        {"saved, mean, plain loss, sd 4", 300, 64, 3000, BF, FLCE_REDUCTION_MEAN, 4, 0.1, 0, 1, 0, 0, 0, SAVED},
        {"saved, mean, plain loss, sd 0.5", 300, 64, 3000, BF, FLCE_REDUCTION_MEAN, 0.5, 0.1, 0, 1, 0, 0, 0, SAVED},
        {"saved, none x advantage, sd 4", 257, 40, 1001, BF, FLCE_REDUCTION_NONE, 4, 0.2, 0, 1, 0, 0, 0, SAVED},
        {"saved, f16, sum", 200, 64, 2000, F16, FLCE_REDUCTION_SUM, 4, 0.1, 0, 1, 0, 0, 0, SAVED},
        {"saved, logprobs only (loss unused), sd 4", 300, 64, 3000, BF, FLCE_REDUCTION_MEAN, 4, 0.1, LP, 0, 0, 0, 0, SAVED},
        {"saved, mean loss + logprobs + lse, T 0.7", 300, 64, 3000, BF, FLCE_REDUCTION_MEAN, 4, 0.1, LP | LSE, 1, 0.7f, 0, 0, SAVED},
        {"saved, lse alone on ignored tokens too, sd 0.5", 256, 64, 2048, BF, FLCE_REDUCTION_MEAN, 0.5, 0.3, LSE, 0, 0, 0, 0, SAVED},
        {"saved, logprobs + entropy, sd 4", 300, 64, 3000, BF, FLCE_REDUCTION_NONE, 4, 0.1, LP | ENT, 1, 0, 0, 0, SAVED},
        {"saved, all three, T 0.7, sd 0.5", 300, 64, 3000, BF, FLCE_REDUCTION_MEAN, 0.5, 0.1, LP | LSE | ENT, 1, 0.7f, 0, 0, SAVED},
        {"saved, smoothing 0.1 + logprobs", 200, 64, 1500, BF, FLCE_REDUCTION_MEAN, 4, 0.1, LP, 1, 0, 0.1f, 0, SAVED},
        {"saved, softcap 15 + entropy", 200, 64, 1500, BF, FLCE_REDUCTION_MEAN, 4, 0.1, ENT, 1, 0, 0, 15, SAVED},
        {"saved, f16, mean + logprobs + lse", 200, 64, 2000, F16, FLCE_REDUCTION_MEAN, 4, 0.1, LP | LSE, 1, 0, 0, 0, SAVED},
        {"saved, N=1", 1, 64, 999, BF, FLCE_REDUCTION_NONE, 4, 0, LP | LSE, 1, 0, 0, 0, SAVED},
        {"saved, mean + loss_per_token + logprobs", 300, 64, 3000, BF, FLCE_REDUCTION_MEAN, 4, 0.1, LP | ROWS, 1, 0, 0, 0, SAVED},
        {"saved, sum + loss_per_token, smoothing 0.1", 200, 64, 1500, BF, FLCE_REDUCTION_SUM, 4, 0.1, ROWS, 1, 0, 0.1f, 0, SAVED},
        {"chunked one call, logprobs + lse + entropy", 300, 64, 3000, BF, FLCE_REDUCTION_NONE, 4, 0.1, LP | LSE | ENT, 1, 0, 0, 0, CHUNKED},
        {"chunked one call, fp32, mean + all four", 200, 64, 1500, FLCE_DTYPE_F32, FLCE_REDUCTION_MEAN, 4, 0.1, LP | LSE | ENT | ROWS, 1, 0.7f, 0, 0, CHUNKED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_saved(&cases[i]);
}

/* problem.batch_invariant: a token's lse, loss (none), log-prob, entropy and argmax have the same
 * bits whatever the call holds: N ∈ {1, 7, 513, 8192} prefixes of one batch, each through a forward,
 * the saved strategy, a chunked call in many chunks and recompute, against one forward of all.
 * Twice: plain options (compact logits), and softcap with label smoothing (chunked calls store fp32
 * logits then and SAVED is refused; the invariant plan once forced the compact kernel onto that
 * fp32 store: an illegal address). */
enum { BI_OUTS = 5 };
static int bi_run(flce_problem p, flce_strategy s, void *const dev[BI_OUTS], void *dh, void *dw, void *ws,
                  uint64_t ws_bytes, const flce_tensors *in)
{
    flce_tensors t = *in;
    t.lse = dev[0], t.loss = dev[1], t.target_logprob = dev[2], t.entropy = dev[3], t.argmax = dev[4];
    p.strategy = s;
    if (s == FLCE_STRATEGY_FORWARD) return flce_forward(ctx, &p, &t, NULL) == FLCE_OK;
    t.grad_hidden = dh, t.grad_weight = dw;
    if (s == FLCE_STRATEGY_SAVED) {
        t.workspace = ws, t.workspace_bytes = ws_bytes;
        return flce_forward(ctx, &p, &t, NULL) == FLCE_OK && flce_backward(ctx, &p, &t, NULL) == FLCE_OK;
    }
    if (s == FLCE_STRATEGY_CHUNKED) p.memory_budget = 8 << 20; /* many token chunks */
    return flce_loss_and_grad(ctx, &p, &t, NULL) == FLCE_OK;
}

static void batch_invariant_run(float softcap, float smoothing)
{
    const int64_t N = 8192, d = 256, v = 32000;
    double *h = dalloc(N * d), *w = dalloc(v * d);
    for (int64_t i = 0; i < N * d; i++) h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) w[i] = 4.0 / sqrt((double)d) * host_rng_normal(&rng);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) y[i] = host_rng_uniform(&rng) < 0.05 ? -100 : (int32_t)host_rng_below(&rng, v);
    flce_tensors in;
    flce_tensors_init(&in);
    void *lab = NULL, *dh = NULL, *dw = NULL, *ws = NULL;
    devmem_alloc(&lab, (size_t)N * 4);
    devmem_upload(lab, y, (size_t)N * 4);
    in.hidden = upload_dtype(BF, h, N * d), in.weight = upload_dtype(BF, w, v * d), in.labels = lab;
    devmem_alloc(&dh, (size_t)(N * d) * 2), devmem_alloc(&dw, (size_t)(v * d) * 2);
    const size_t bytes[BI_OUTS] = {4, 4, 4, 4, 8};
    void *ref[BI_OUTS], *got[BI_OUTS];
    for (int k = 0; k < BI_OUTS; k++) ref[k] = poisoned(bytes[k] * (size_t)N), got[k] = poisoned(bytes[k] * (size_t)N);
    flce_problem p;
    flce_problem_init(&p);
    p.hidden = d, p.vocab_shard = v, p.reduction = FLCE_REDUCTION_NONE, p.batch_invariant = 1, p.tokens = N;
    p.softcap = softcap, p.label_smoothing = smoothing;
    /* SAVED keeps compact logits, which softcap with smoothing cannot use: refused, naming both */
    const int saved_ok = !(softcap > 0 && smoothing > 0);
    uint64_t ws_bytes = 0;
    p.strategy = FLCE_STRATEGY_SAVED;
    if (!saved_ok) {
        CHECKF(flce_workspace_size(ctx, &p, FLCE_OP_FORWARD, &ws_bytes) == FLCE_ERR_UNSUPPORTED &&
                   strstr(flce_last_error(), "softcap") && strstr(flce_last_error(), "label_smoothing"),
               "SAVED with softcap and smoothing: %s", flce_last_error());
        p.strategy = FLCE_STRATEGY_AUTO;
    }
    int ok = flce_workspace_size(ctx, &p, FLCE_OP_FORWARD, &ws_bytes) == FLCE_OK &&
             devmem_alloc(&ws, ws_bytes) == FLCE_OK && bi_run(p, FLCE_STRATEGY_FORWARD, ref, dh, dw, ws, ws_bytes, &in);
    CHECKF(ok, "batch invariant: the reference forward: %s", flce_last_error());
    unsigned char *a = malloc(8 * (size_t)N), *b = malloc(8 * (size_t)N);
    static const int64_t ns[] = {1, 7, 513, 8192};
    static const flce_strategy ss[] = {FLCE_STRATEGY_FORWARD, FLCE_STRATEGY_SAVED, FLCE_STRATEGY_CHUNKED,
                                       FLCE_STRATEGY_RECOMPUTE};
    static const char *sname[] = {"forward", "saved", "chunked (many chunks)", "recompute"};
    static const char *oname[] = {"lse", "loss", "target_logprob", "entropy", "argmax"};
    for (size_t i = 0; ok && i < sizeof ns / sizeof ns[0]; i++) {
        for (size_t s = 0; ok && s < sizeof ss / sizeof ss[0]; s++) {
            if (ss[s] == FLCE_STRATEGY_SAVED && !saved_ok) continue;
            p.tokens = ns[i];
            for (int k = 0; k < BI_OUTS; k++) devmem_poison(got[k], bytes[k] * (size_t)N);
            ok = bi_run(p, ss[s], got, dh, dw, ws, ws_bytes, &in) && flce_check(ctx, NULL) == FLCE_OK;
            CHECKF(ok, "batch invariant: N=%lld %s: %s", (long long)ns[i], sname[s], flce_last_error());
            for (int k = 0; ok && k < BI_OUTS; k++) {
                devmem_download(a, ref[k], bytes[k] * (size_t)ns[i]);
                devmem_download(b, got[k], bytes[k] * (size_t)ns[i]);
                size_t at = 0;
                while (at < bytes[k] * (size_t)ns[i] && a[at] == b[at]) at++;
                CHECKF(at == bytes[k] * (size_t)ns[i], "batch invariant: N=%lld %s: %s of token %zu differs",
                       (long long)ns[i], sname[s], oname[k], at / bytes[k]);
            }
        }
    }
    printf("  batch invariant (softcap %g, smoothing %g): N in {1, 7, 513, 8192} x {forward, %schunked, "
           "recompute}: %s\n", softcap, smoothing, saved_ok ? "saved, " : "",
           ok && !check_case_failed ? "bitwise equal" : "DIFFERENT");
    for (int k = 0; k < BI_OUTS; k++) devmem_free(ref[k]), devmem_free(got[k]);
    devmem_free((void *)in.hidden), devmem_free((void *)in.weight), devmem_free(lab), devmem_free(dh);
    devmem_free(dw), devmem_free(ws);
    free(h), free(w), free(y), free(a), free(b);
}

static void batch_invariant_outputs_are_bitwise_equal(void) { batch_invariant_run(0.f, 0.f); }
static void batch_invariant_with_softcap_and_smoothing(void) { batch_invariant_run(30.f, 0.1f); }

/* What a caller gets wrong: named in the message, nothing run. */
static void saved_misuse_is_named(void)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 64, p.hidden = 64, p.vocab_shard = 1000, p.strategy = FLCE_STRATEGY_SAVED;
    flce_tensors t;
    flce_tensors_init(&t);
    void *buf = NULL;
    devmem_alloc(&buf, 1 << 20);
    t.hidden = t.weight = t.labels = t.loss = t.lse = t.grad_hidden = buf;
    CHECK(flce_forward(ctx, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "workspace"));
    CHECK(flce_loss_and_grad(ctx, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "SAVED"));
    p.memory_budget = 4096; /* too small for all tokens' logits */
    uint64_t bytes = 0;
    CHECK(flce_workspace_size(ctx, &p, FLCE_OP_FORWARD, &bytes) == FLCE_ERR_INVALID_ARGUMENT &&
          strstr(flce_last_error(), "RECOMPUTE"));
    p.memory_budget = 0, p.strategy = FLCE_STRATEGY_AUTO;
    t.grad_lse = buf; /* without its bit */
    CHECK(flce_loss_and_grad(ctx, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "grad_lse"));
    p.grad_outputs = FLCE_GRAD_LSE, p.strategy = FLCE_STRATEGY_RECOMPUTE;
    CHECK(flce_backward(ctx, &p, &t, NULL) == FLCE_ERR_UNSUPPORTED && strstr(flce_last_error(), "RECOMPUTE"));
    p.strategy = FLCE_STRATEGY_SAVED, p.dtype = FLCE_DTYPE_F32;
    CHECK(flce_workspace_size(ctx, &p, FLCE_OP_FORWARD, &bytes) == FLCE_ERR_UNSUPPORTED &&
          strstr(flce_last_error(), "16-bit"));
    devmem_free(buf);
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
    RUN(saved_logits_match_the_reference);
    RUN(saved_misuse_is_named);
    RUN(batch_invariant_outputs_are_bitwise_equal);
    RUN(batch_invariant_with_softcap_and_smoothing);
    flce_context_destroy(ctx);
    FINISH();
}
