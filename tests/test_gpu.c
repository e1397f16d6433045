/* test_gpu.c — loss, lse and both gradients on the GPU against the fp64 reference, for every
 * dtype and reduction, on awkward shapes, with fresh random data each run and every output
 * poisoned (NaN) before the call so an unwritten element shows. Exits 77 (skipped) without a GPU.
 * The cases run in FLCE_TEST_JOBS forked shards (tests/shard.h): each small test function is one
 * unit, each case of the table-driven ones (those run with RUN_CASES) is one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "error.h"
#include "host.h"
#include "ref.h"
#include "shard.h"
#include "spec.h"

static flce_context *ctx;
static host_rng rng;

typedef struct gcase {
    const char *name;
    int64_t n, d, v;
    flce_dtype dtype;
    flce_reduction reduction;
    double logit_sd;      /* standard deviation of the logits */
    double ignore_frac;   /* share of tokens labelled ignore_index */
    int label_bits;
    uint64_t budget;      /* memory_budget (0 = default); small values force many chunks */
    int edge_labels;      /* put labels 0 and V-1 in */
    int with_grad_output; /* pass an upstream gradient */
    int via_backward;     /* forward, then backward from the saved lse */
} gcase;

typedef struct bufs {
    void *h, *w, *labels, *loss, *lse, *dh, *dw, *go;
} bufs;

static double tol_grad(flce_dtype t) { return t == FLCE_DTYPE_F32 ? 1e-4 : 4e-3; }

static int all_finite(const double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static void fill(const gcase *c, double *h, double *w, int64_t *labels, double *go, int64_t n_go)
{
    /* logits sd ≈ sqrt(D)·sh·sw: unit hidden, weights scaled to the wanted spread */
    double sw = c->logit_sd / sqrt((double)c->d);
    for (int64_t i = 0; i < c->n * c->d; i++) h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < c->v * c->d; i++) w[i] = sw * host_rng_normal(&rng);
    host_round_to_dtype(c->dtype, h, (size_t)(c->n * c->d));
    host_round_to_dtype(c->dtype, w, (size_t)(c->v * c->d));
    for (int64_t i = 0; i < c->n; i++)
        labels[i] = host_rng_uniform(&rng) < c->ignore_frac ? -100 : host_rng_below(&rng, c->v);
    if (c->edge_labels && c->n >= 2) labels[0] = 0, labels[c->n - 1] = c->v - 1;
    for (int64_t i = 0; i < n_go; i++) go[i] = 0.5 + host_rng_uniform(&rng);
}

static flce_status upload_all(const gcase *c, bufs *b, const double *h, const double *w,
                              const int64_t *labels, const double *go, int64_t n_go)
{
    size_t es = host_dtype_size(c->dtype), lb = (size_t)c->label_bits / 8;
    size_t nh = (size_t)(c->n * c->d), nw = (size_t)(c->v * c->d);
    void *th = malloc(nh * es), *tw = malloc(nw * es), *tl = malloc((size_t)c->n * lb);
    float *tg = malloc(sizeof(float) * (size_t)(n_go ? n_go : 1));
    host_to_dtype(c->dtype, h, th, nh);
    host_to_dtype(c->dtype, w, tw, nw);
    for (int64_t i = 0; i < c->n; i++) {
        if (lb == 4) ((int32_t *)tl)[i] = (int32_t)labels[i];
        else ((int64_t *)tl)[i] = labels[i];
    }
    for (int64_t i = 0; i < n_go; i++) tg[i] = (float)go[i];
    flce_status st = FLCE_OK;
    if (st == FLCE_OK) st = devmem_alloc(&b->h, nh * es);
    if (st == FLCE_OK) st = devmem_alloc(&b->w, nw * es);
    if (st == FLCE_OK) st = devmem_alloc(&b->labels, (size_t)c->n * lb);
    if (st == FLCE_OK) st = devmem_alloc(&b->loss, (size_t)c->n * 4);
    if (st == FLCE_OK) st = devmem_alloc(&b->lse, (size_t)c->n * 4);
    if (st == FLCE_OK) st = devmem_alloc(&b->dh, nh * es);
    if (st == FLCE_OK) st = devmem_alloc(&b->dw, nw * es);
    if (st == FLCE_OK && n_go) st = devmem_alloc(&b->go, (size_t)n_go * 4);
    if (st == FLCE_OK) st = devmem_upload(b->h, th, nh * es);
    if (st == FLCE_OK) st = devmem_upload(b->w, tw, nw * es);
    if (st == FLCE_OK) st = devmem_upload(b->labels, tl, (size_t)c->n * lb);
    if (st == FLCE_OK && n_go) st = devmem_upload(b->go, tg, (size_t)n_go * 4);
    /* Poison every output: NaN everywhere until the library writes it. */
    if (st == FLCE_OK) st = devmem_poison(b->loss, (size_t)c->n * 4);
    if (st == FLCE_OK) st = devmem_poison(b->lse, (size_t)c->n * 4);
    if (st == FLCE_OK) st = devmem_poison(b->dh, nh * es);
    if (st == FLCE_OK) st = devmem_poison(b->dw, nw * es);
    free(th), free(tw), free(tl), free(tg);
    return st;
}

static void free_all(bufs *b)
{
    devmem_free(b->h), devmem_free(b->w), devmem_free(b->labels), devmem_free(b->loss);
    devmem_free(b->lse), devmem_free(b->dh), devmem_free(b->dw), devmem_free(b->go);
}

static flce_status run_case(const gcase *c, const flce_problem *p, bufs *b)
{
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = b->h, t.weight = b->w, t.labels = b->labels;
    t.loss = b->loss, t.lse = b->lse, t.grad_hidden = b->dh, t.grad_weight = b->dw;
    t.grad_output = b->go;
    if (!c->via_backward) return flce_loss_and_grad(ctx, p, &t, NULL);
    flce_problem pf = *p;
    pf.strategy = FLCE_STRATEGY_AUTO; /* the strategy is the backward's */
    TRY(flce_forward(ctx, &pf, &t, NULL));
    return flce_backward(ctx, p, &t, NULL);
}

static void check_case(const gcase *c)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = c->n, p.hidden = c->d, p.vocab_shard = c->v, p.dtype = c->dtype;
    p.reduction = c->reduction, p.label_bits = c->label_bits ? c->label_bits : 32;
    p.memory_budget = c->budget;
    /* a small budget is there to exercise many token chunks: keep AUTO from switching strategy */
    if (c->budget) p.strategy = FLCE_STRATEGY_CHUNKED;
    gcase cc = *c;
    cc.label_bits = p.label_bits;
    int64_t n_loss = c->reduction == FLCE_REDUCTION_NONE ? c->n : 1;
    int64_t n_go = c->with_grad_output ? n_loss : 0;
    size_t nh = (size_t)(c->n * c->d), nw = (size_t)(c->v * c->d);
    double *h = malloc(sizeof(double) * nh), *w = malloc(sizeof(double) * nw);
    double *go = malloc(sizeof(double) * (size_t)(n_go + 1));
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)c->n);
    double *rl = malloc(sizeof(double) * (size_t)c->n), *rlse = malloc(sizeof(double) * (size_t)c->n);
    double *rdh = malloc(sizeof(double) * nh), *rdw = malloc(sizeof(double) * nw);
    double *gl = malloc(sizeof(double) * (size_t)c->n), *glse = malloc(sizeof(double) * (size_t)c->n);
    double *gdh = malloc(sizeof(double) * nh), *gdw = malloc(sizeof(double) * nw);
    fill(&cc, h, w, labels, go, n_go);
    bufs b = {0};
    flce_status st = upload_all(&cc, &b, h, w, labels, go, n_go);
    if (st == FLCE_OK) st = run_case(&cc, &p, &b);
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    CHECKF(st == FLCE_OK, "%s: %s", c->name, flce_last_error());
    if (st == FLCE_OK) {
        ref_loss_and_grad(&p, NULL, c->n, c->d, c->v, h, w, NULL, labels, n_go ? go : NULL, rl, rlse,
                          rdh, rdw, NULL);
        float *fl = malloc(sizeof(float) * (size_t)c->n);
        devmem_download(fl, b.loss, sizeof(float) * (size_t)n_loss);
        for (int64_t i = 0; i < n_loss; i++) gl[i] = fl[i];
        devmem_download(fl, b.lse, sizeof(float) * (size_t)c->n);
        for (int64_t i = 0; i < c->n; i++) glse[i] = fl[i];
        free(fl);
        download_f64(c->dtype, b.dh, gdh, nh);
        download_f64(c->dtype, b.dw, gdw, nw);
        double e_loss = ref_rel_l2(rl, gl, (size_t)n_loss), e_lse = ref_rel_l2(rlse, glse, (size_t)c->n);
        double e_dh = ref_rel_l2(rdh, gdh, nh), e_dw = ref_rel_l2(rdw, gdw, nw);
        double tg = tol_grad(c->dtype);
        printf("  %-44s loss %.1e lse %.1e dH %.1e dW %.1e\n", c->name, e_loss, e_lse, e_dh, e_dw);
        CHECKF(c->via_backward || (all_finite(gl, (size_t)n_loss) && e_loss <= 1e-5), "%s: loss rel err %.3e (%g vs %g)", c->name, e_loss, gl[0], rl[0]);
        CHECKF(all_finite(glse, (size_t)c->n) && e_lse <= 1e-5, "%s: lse rel err %.3e", c->name, e_lse);
        CHECKF(all_finite(gdh, nh) && e_dh <= tg, "%s: dH rel err %.3e > %.0e", c->name, e_dh, tg);
        CHECKF(all_finite(gdw, nw) && e_dw <= tg, "%s: dW rel err %.3e > %.0e", c->name, e_dw, tg);
    }
    free_all(&b);
    free(h), free(w), free(go), free(labels), free(rl), free(rlse), free(rdh), free(rdw);
    free(gl), free(glse), free(gdh), free(gdw);
}

static const char *red_name[] = {"mean", "sum", "none"};

static void every_dtype_and_reduction_matches_the_reference(void)
{
    for (int dt = 0; dt < 3; dt++)
        for (int red = 0; red < 3; red++)
            for (int sd = 0; sd < 2; sd++) {
                if (!shard_mine()) continue;
                char name[96];
                snprintf(name, sizeof name, "%s %s logit-sd %s", spec_dtype_name((flce_dtype)dt), red_name[red], sd ? "4" : "0.5");
                gcase c = {name, 133, 72, 1001, (flce_dtype)dt, (flce_reduction)red, sd ? 4.0 : 0.5, 0.1, 32, 0, 1, 0, 0};
                check_case(&c);
            }
}

static void awkward_shapes_match_the_reference(void)
{
    for (int dt = 0; dt < 3; dt++) {
        gcase cases[] = {
            {"N=1", 1, 64, 300, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 2, 0, 32, 0, 0, 0, 0},
            {"odd N=257, V=1001", 257, 40, 1001, (flce_dtype)dt, FLCE_REDUCTION_SUM, 2, 0.1, 32, 0, 1, 0, 0},
            {"vocab shard 1", 19, 16, 1, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 2, 0.2, 32, 0, 0, 0, 0},
            {"vocab shard 129, labels 0 and V-1", 200, 8, 129, (flce_dtype)dt, FLCE_REDUCTION_NONE, 3, 0, 64, 0, 1, 0, 0},
            {"many chunks (small budget)", 700, 96, 2050, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 4, 0.1, 32, 1 << 20, 1, 0, 0},
            {"many chunks, reduction none + grad", 700, 96, 2050, (flce_dtype)dt, FLCE_REDUCTION_NONE, 4, 0.1, 64, 1 << 20, 1, 1, 0},
            {"backward from saved lse", 300, 64, 999, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 4, 0.1, 32, 0, 1, 1, 1},
            {"backward, many chunks, none", 300, 64, 999, (flce_dtype)dt, FLCE_REDUCTION_NONE, 2, 0.1, 32, 1 << 20, 1, 1, 1},
            {"large hidden 1024, V 5000", 64, 1024, 5000, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 4, 0.05, 32, 0, 1, 0, 0},
            /* test_soak found these (session 7): one token, chunked with a small budget */
            {"N=1, none, chunked (small budget)", 1, 64, 1000, (flce_dtype)dt, FLCE_REDUCTION_NONE, 2, 0, 32, 256 << 10, 0, 0, 0},
            {"N=3, none, chunked (small budget)", 3, 64, 1000, (flce_dtype)dt, FLCE_REDUCTION_NONE, 2, 0, 32, 256 << 10, 0, 0, 0},
            {"N=1, mean, chunked (small budget)", 1, 64, 1000, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 2, 0, 32, 256 << 10, 0, 0, 0},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (!shard_mine()) continue;
            char name[96];
            snprintf(name, sizeof name, "%s %s", spec_dtype_name((flce_dtype)dt), cases[i].name);
            cases[i].name = name;
            check_case(&cases[i]);
        }
    }
}

/* Row-scaled compact logits (bf16 chunked, runtime/plan.h qrows) against each row's reference c_i:
 * wide logits put tiles far above the sampled c_i (stored against their own maximum, the row
 * rescaled by flce_qscale) and rows whose lse lies far above it; narrow ones keep every row as
 * stored. Each with ignored tokens, several chunks, and a per-token upstream gradient. */
static void row_scaled_logits_match_the_reference_at_every_spread(void)
{
    gcase cases[] = {
        {"bf16 row-scaled, logit sd 0.5", 300, 64, 3000, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 0.5, 0.1, 32, 0, 1, 0, 0},
        {"bf16 row-scaled, logit sd 12 (some rows rescaled)", 300, 64, 3000, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 12, 0.1, 32, 0, 1, 0, 0},
        {"bf16 row-scaled, logit sd 40 (every row rescaled)", 300, 64, 3000, FLCE_DTYPE_BF16, FLCE_REDUCTION_SUM, 40, 0.1, 32, 0, 1, 0, 0},
        {"bf16 row-scaled, sd 25, none + grad, chunks", 700, 96, 2050, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE, 25, 0.1, 64, 1 << 20, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (shard_mine()) check_case(&cases[i]);
}

/* Every label ignored: mean is 0 with zero gradients, never NaN. */
static void all_labels_ignored_mean_is_zero(void)
{
    for (int dt = 0; dt < 3; dt++) {
        if (!shard_mine()) continue;
        gcase c = {"all ignored", 50, 32, 300, (flce_dtype)dt, FLCE_REDUCTION_MEAN, 2, 1.0, 32, 0, 0, 0, 0};
        check_case(&c);
    }
}

static void forward_matches_loss_and_grad(void)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 333, p.hidden = 48, p.vocab_shard = 777, p.dtype = FLCE_DTYPE_BF16;
    gcase c = {"fwd", 333, 48, 777, FLCE_DTYPE_BF16, FLCE_REDUCTION_MEAN, 3, 0.1, 32, 0, 0, 0, 0};
    size_t nh = 333 * 48, nw = 777 * 48;
    double *h = malloc(sizeof(double) * nh), *w = malloc(sizeof(double) * nw), go = 0;
    int64_t *labels = malloc(sizeof(int64_t) * 333);
    fill(&c, h, w, labels, &go, 0);
    bufs b = {0};
    CHECK(upload_all(&c, &b, h, w, labels, &go, 0) == FLCE_OK);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = b.h, t.weight = b.w, t.labels = b.labels, t.loss = b.loss, t.lse = b.lse;
    float fwd[2], both[2];
    CHECK(flce_forward(ctx, &p, &t, NULL) == FLCE_OK && flce_check(ctx, NULL) == FLCE_OK);
    devmem_download(&fwd[0], b.loss, 4);
    devmem_download(&fwd[1], b.lse, 4);
    t.grad_hidden = b.dh, t.grad_weight = b.dw;
    CHECK(flce_loss_and_grad(ctx, &p, &t, NULL) == FLCE_OK && flce_check(ctx, NULL) == FLCE_OK);
    devmem_download(&both[0], b.loss, 4);
    devmem_download(&both[1], b.lse, 4);
    /* The same bits, except where loss_and_grad stores row-scaled compact logits (FLCE_DEV qrows=1 at
     * this size; by default chunks of 1e8 logits or more): their statistics are summed against each
     * row's reference c_i, not each tile's maximum (bench/NOTES.md v40b), so they agree with the
     * forward pass's within fp32 rounding. */
    double tol = config_get()->qrows == 1 ? 1e-6 : 0;
    CHECKF(fabs(fwd[0] - both[0]) <= tol * fabs(fwd[0]) && fabs(fwd[1] - both[1]) <= tol * fabs(fwd[1]),
           "forward %.9g/%.9g vs loss_and_grad %.9g/%.9g (relative tolerance %g)", fwd[0], fwd[1], both[0], both[1],
           tol);
    free_all(&b);
    free(h), free(w), free(labels);
}

/* A label outside [0, V) is reported by flce_check, and treated as ignored meanwhile. */
static void out_of_range_label_is_reported_not_read(void)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 16, p.hidden = 16, p.vocab_shard = 100, p.dtype = FLCE_DTYPE_F32;
    gcase c = {"bad", 16, 16, 100, FLCE_DTYPE_F32, FLCE_REDUCTION_SUM, 1, 0, 32, 0, 0, 0, 0};
    double h[256], w[1600], go = 0;
    int64_t labels[16];
    fill(&c, h, w, labels, &go, 0);
    labels[3] = 100, labels[7] = -5;
    bufs b = {0};
    CHECK(upload_all(&c, &b, h, w, labels, &go, 0) == FLCE_OK);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = b.h, t.weight = b.w, t.labels = b.labels, t.loss = b.loss;
    CHECK(flce_forward(ctx, &p, &t, NULL) == FLCE_OK);
    flce_status st = flce_check(ctx, NULL);
    CHECKF(st == FLCE_ERR_BAD_LABEL, "flce_check gave %s", flce_status_name(st));
    CHECK(strstr(flce_last_error(), "label") != NULL);
    CHECK(flce_check(ctx, NULL) == FLCE_OK); /* reported once */
    float loss;
    devmem_download(&loss, b.loss, 4);
    labels[3] = -100, labels[7] = -100;
    double ref;
    ref_loss_and_grad(&p, NULL, 16, 16, 100, h, w, NULL, labels, NULL, &ref, NULL, NULL, NULL, NULL);
    CHECKF(fabs(loss - ref) <= 1e-5 * fabs(ref), "loss %g, reference with bad labels ignored %g", loss, ref);
    free_all(&b);
}

/* ---- options, per-token outputs, accumulate modes and the recompute strategy ---- */

typedef struct ocase {
    const char *name;
    int64_t n, d, v;
    float eps, zl, cap, temp;
    int bias, weights;
    flce_strategy strategy;
    int acc;              /* accumulate dH and dW into fp32 buffers holding random values */
    uint64_t budget;
    int via_backward;     /* forward (saving lse), then backward with grad_output */
    double sd;
} ocase;

static double z_at(const double *h, const double *w, const double *b, const flce_problem *p,
                   int64_t d, int64_t j)
{
    double z = 0;
    for (int64_t k = 0; k < d; k++) z += h[k] * w[j * d + k];
    if (b) z += b[j];
    z /= p->temperature;
    if (p->softcap > 0) z = p->softcap * tanh(z / p->softcap);
    return z;
}

static void check_options_dtype(const ocase *c, flce_dtype dt, flce_reduction red)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = c->n, p.hidden = c->d, p.vocab_shard = c->v, p.dtype = dt, p.reduction = red;
    p.label_smoothing = c->eps, p.z_loss = c->zl, p.softcap = c->cap, p.temperature = c->temp;
    p.has_bias = c->bias, p.has_class_weights = c->weights, p.strategy = c->strategy;
    p.accumulate_grad_hidden = p.accumulate_grad_weight = c->acc, p.memory_budget = c->budget;
    int64_t n = c->n, d = c->d, v = c->v, nl = red == FLCE_REDUCTION_NONE ? n : 1;
    double *h = dalloc(n * d), *w = dalloc(v * d), *b = dalloc(v), *cw = dalloc(v), *go = dalloc(n);
    double *acc_h = dalloc(n * d), *acc_w = dalloc(v * d);
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)n);
    gcase g = {c->name, n, d, v, dt, red, c->sd, 0.1, 32, 0, 1, 0, 0};
    fill(&g, h, w, labels, go, n);
    for (int64_t j = 0; j < v; j++) b[j] = 0.5 * host_rng_normal(&rng), cw[j] = 0.5 + 1.5 * host_rng_uniform(&rng);
    host_round_to_dtype(dt, b, (size_t)v);
    for (int64_t i = 0; i < n * d; i++) acc_h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) acc_w[i] = host_rng_normal(&rng);

    int32_t *l32 = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) l32[i] = (int32_t)labels[i];
    void *d_labels = NULL;
    devmem_alloc(&d_labels, (size_t)n * 4);
    devmem_upload(d_labels, l32, (size_t)n * 4);
    size_t es = host_dtype_size(dt), ges = c->acc ? 4 : es;
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = upload_dtype(dt, h, n * d), t.weight = upload_dtype(dt, w, v * d), t.labels = d_labels;
    t.bias = c->bias ? upload_dtype(dt, b, v) : NULL;
    t.class_weights = c->weights ? upload_f32(cw, v) : NULL;
    t.grad_output = upload_f32(go, nl);
    t.lse = poisoned((size_t)n * 4);
    t.grad_hidden = c->acc ? upload_f32(acc_h, n * d) : poisoned((size_t)(n * d) * ges);
    t.grad_weight = c->acc ? upload_f32(acc_w, v * d) : poisoned((size_t)(v * d) * ges);
    t.grad_bias = c->bias ? poisoned((size_t)v * es) : NULL;
    float *loss = poisoned((size_t)n * 4), *lpt = poisoned((size_t)n * 4), *zlo = poisoned((size_t)n * 4);
    float *lp = poisoned((size_t)n * 4), *ent = poisoned((size_t)n * 4);
    int64_t *am = poisoned((size_t)n * 8);
    t.loss = loss, t.loss_per_token = lpt, t.z_loss_out = zlo; /* zeros without z-loss */
    t.target_logprob = lp, t.entropy = ent, t.argmax = am;

    flce_status st;
    if (c->via_backward) {
        flce_tensors f = t;
        f.grad_hidden = f.grad_weight = f.grad_bias = NULL, f.grad_output = NULL;
        flce_problem pf = p;
        pf.strategy = FLCE_STRATEGY_AUTO;
        st = flce_forward(ctx, &pf, &f, NULL);
        flce_tensors bw = t;
        bw.loss = bw.loss_per_token = bw.z_loss_out = bw.target_logprob = bw.entropy = NULL, bw.argmax = NULL;
        if (st == FLCE_OK) st = flce_backward(ctx, &p, &bw, NULL);
    } else {
        st = flce_loss_and_grad(ctx, &p, &t, NULL);
    }
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    char name[160];
    snprintf(name, sizeof name, "%s %s %s", spec_dtype_name((flce_dtype)dt), red_name[red], c->name);
    CHECKF(st == FLCE_OK, "%s: %s", name, flce_last_error());
    if (st == FLCE_OK) {
        ref_extra x = {c->weights ? cw : NULL};
        double *rl = dalloc(n), *rlse = dalloc(n), *rdh = dalloc(n * d), *rdw = dalloc(v * d), *rdb = dalloc(v);
        ref_loss_and_grad(&p, &x, n, d, v, h, w, c->bias ? b : NULL, labels, go, rl, rlse, rdh, rdw, rdb);
        if (c->acc) {
            for (int64_t i = 0; i < n * d; i++) rdh[i] += acc_h[i];
            for (int64_t i = 0; i < v * d; i++) rdw[i] += acc_w[i];
        }
        double *gl = dalloc(n), *glse = dalloc(n), *gdh = dalloc(n * d), *gdw = dalloc(v * d), *gdb = dalloc(v);
        down_f32(loss, gl, nl);
        down_f32(t.lse, glse, n);
        if (c->acc) {
            down_f32(t.grad_hidden, gdh, n * d);
            down_f32(t.grad_weight, gdw, v * d);
        } else {
            download_f64(dt, t.grad_hidden, gdh, (size_t)(n * d));
            download_f64(dt, t.grad_weight, gdw, (size_t)(v * d));
        }
        if (c->bias) download_f64(dt, t.grad_bias, gdb, (size_t)v);
        double tg = tol_grad(dt);
        double e_lse = ref_rel_l2(rlse, glse, (size_t)n), e_dh = ref_rel_l2(rdh, gdh, (size_t)(n * d));
        double e_dw = ref_rel_l2(rdw, gdw, (size_t)(v * d)), e_db = c->bias ? ref_rel_l2(rdb, gdb, (size_t)v) : 0;
        double e_loss = c->via_backward ? 0 : ref_rel_l2(rl, gl, (size_t)nl);
        CHECKF(e_lse <= 1e-5 && e_loss <= 1e-5, "%s: lse %.2e loss %.2e", name, e_lse, e_loss);
        CHECKF(e_dh <= tg && e_dw <= tg && e_db <= tg, "%s: dH %.2e dW %.2e db %.2e (tol %.0e)", name,
               e_dh, e_dw, e_db, tg);
        double e_tok = 0;
        if (!c->via_backward) {
            /* per-token outputs against the reference row by row */
            double *glpt = dalloc(n), *glp = dalloc(n), *gent = dalloc(n), *gzl = dalloc(n);
            double *rlpt = dalloc(n), *rlp = dalloc(n), *rent = dalloc(n), *rzl = dalloc(n);
            int64_t *gam = malloc(sizeof(int64_t) * (size_t)n);
            down_f32(lpt, glpt, n), down_f32(lp, glp, n), down_f32(ent, gent, n);
            devmem_download(gam, am, (size_t)n * 8);
            int bad_arg = 0;
            double zsum = 0, gz = 0;
            for (int64_t i = 0; i < n; i++) {
                ref_row_out o;
                ref_row(&p, &x, d, v, h + i * d, w, c->bias ? b : NULL, labels[i], &o, NULL);
                rlpt[i] = o.loss, rlp[i] = o.target_logprob, rent[i] = o.entropy;
                /* the z-loss term of the loss is weighted like the target term */
                rzl[i] = o.z_loss_term * (o.valid && c->weights ? cw[labels[i]] : 1);
                zsum += rzl[i];
                if (gam[i] != o.argmax) {
                    double za = z_at(h + i * d, w, c->bias ? b : NULL, &p, d, gam[i] >= 0 && gam[i] < v ? gam[i] : 0);
                    double zb = z_at(h + i * d, w, c->bias ? b : NULL, &p, d, o.argmax);
                    bad_arg += !(gam[i] >= 0 && gam[i] < v && fabs(za - zb) <= 1e-4 * (1 + fabs(zb)));
                }
            }
            e_tok = fmax(fmax(ref_rel_l2(rlpt, glpt, (size_t)n), ref_rel_l2(rlp, glp, (size_t)n)),
                         ref_rel_l2(rent, gent, (size_t)n));
            CHECKF(e_tok <= 1e-4, "%s: per-token loss %.2e logprob %.2e entropy %.2e", name,
                   ref_rel_l2(rlpt, glpt, (size_t)n), ref_rel_l2(rlp, glp, (size_t)n), ref_rel_l2(rent, gent, (size_t)n));
            CHECKF(bad_arg == 0, "%s: %d argmax mismatches", name, bad_arg);
            { /* the z-loss part is asked for every case: 0 (written, not left alone) without z-loss */
                if (red == FLCE_REDUCTION_NONE) {
                    down_f32(zlo, gzl, n);
                    CHECKF(ref_rel_l2(rzl, gzl, (size_t)n) <= 1e-4, "%s: z-loss rows %.2e", name, ref_rel_l2(rzl, gzl, (size_t)n));
                } else {
                    double denom = 0;
                    for (int64_t i = 0; i < n; i++)
                        if (labels[i] >= 0 && labels[i] < v) denom += c->weights ? cw[labels[i]] : 1;
                    double want = red == FLCE_REDUCTION_MEAN ? (denom > 0 ? zsum / denom : 0) : zsum;
                    down_f32(zlo, &gz, 1);
                    CHECKF(fabs(gz - want) <= 1e-4 * fabs(want) + 1e-7, "%s: z-loss %g vs %g", name, gz, want);
                }
            }
            free(glpt), free(glp), free(gent), free(gzl), free(rlpt), free(rlp), free(rent), free(rzl), free(gam);
        }
        printf("  %-60s loss %.1e lse %.1e dH %.1e dW %.1e db %.1e tok %.1e\n", name, e_loss, e_lse, e_dh,
               e_dw, e_db, e_tok);
        free(rl), free(rlse), free(rdh), free(rdw), free(rdb), free(gl), free(glse), free(gdh), free(gdw), free(gdb);
    }
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(d_labels);
    devmem_free((void *)t.bias), devmem_free((void *)t.class_weights), devmem_free((void *)t.grad_output);
    devmem_free(t.lse), devmem_free(t.grad_hidden), devmem_free(t.grad_weight), devmem_free(t.grad_bias);
    devmem_free(loss), devmem_free(lpt), devmem_free(zlo), devmem_free(lp), devmem_free(ent), devmem_free(am);
    free(h), free(w), free(b), free(cw), free(go), free(acc_h), free(acc_w), free(labels), free(l32);
}

static void check_options(const ocase *c)
{
    for (int dt = 0; dt < 3; dt++)
        for (int red = 0; red < 3; red++)
            if (shard_mine()) check_options_dtype(c, (flce_dtype)dt, (flce_reduction)red);
}

static void every_option_alone_matches_the_reference(void)
{
    const ocase cases[] = {
        {"smoothing 0.1", 150, 64, 777, 0.1f, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3},
        {"z-loss 1e-3", 150, 64, 777, 0, 1e-3f, 0, 1, 0, 0, 0, 0, 0, 0, 3},
        {"softcap 5", 150, 64, 777, 0, 0, 5.f, 1, 0, 0, 0, 0, 0, 0, 4},
        {"temperature 0.7", 150, 64, 777, 0, 0, 0, 0.7f, 0, 0, 0, 0, 0, 0, 3},
        {"bias", 150, 64, 777, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 3},
        {"class weights", 150, 64, 777, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_options(&cases[i]);
}

static void recipe_combinations_match_the_reference(void)
{
    const ocase cases[] = {
        {"smoothing + z-loss", 200, 48, 1001, 0.1f, 1e-4f, 0, 1, 0, 0, 0, 0, 0, 0, 4},
        {"softcap + temperature", 200, 48, 1001, 0, 0, 30.f, 0.8f, 0, 0, 0, 0, 0, 0, 4},
        {"weights + ignore + smoothing + bias", 200, 48, 1001, 0.05f, 0, 0, 1, 1, 1, 0, 0, 0, 0, 4},
        {"everything, many chunks", 300, 40, 1500, 0.1f, 1e-3f, 20.f, 0.9f, 1, 1, FLCE_STRATEGY_CHUNKED, 0, 1 << 20, 0, 4},
        {"everything, AUTO at a small budget", 300, 40, 1500, 0.1f, 1e-3f, 20.f, 0.9f, 1, 1, 0, 0, 1 << 20, 0, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_options(&cases[i]);
}

static void accumulate_and_recompute_modes_match_the_reference(void)
{
    const ocase cases[] = {
        {"accumulate into fp32 dH/dW, many chunks", 300, 40, 1500, 0, 0, 0, 1, 0, 0, FLCE_STRATEGY_CHUNKED, 1, 1 << 20, 0, 3},
        {"recompute loss_and_grad, vocab chunks", 300, 40, 1500, 0.1f, 1e-3f, 0, 1, 1, 0, FLCE_STRATEGY_RECOMPUTE, 0, 1 << 20, 0, 3},
        {"recompute backward from lse + accumulate", 300, 40, 1500, 0, 0, 10.f, 1, 1, 1, FLCE_STRATEGY_RECOMPUTE, 1, 1 << 20, 1, 3},
        {"chunked backward from lse, options", 300, 40, 1500, 0.1f, 1e-4f, 0, 0.8f, 1, 0, FLCE_STRATEGY_CHUNKED, 0, 1 << 20, 1, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_options(&cases[i]);
}

/* NaN in one token's hidden state reaches that token's loss, lse and dH row, and no other token's. */
static void nan_input_stays_in_its_token(void)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 64, p.hidden = 32, p.vocab_shard = 500, p.dtype = FLCE_DTYPE_BF16, p.reduction = FLCE_REDUCTION_NONE;
    double *h = dalloc(64 * 32), *w = dalloc(500 * 32), go = 0;
    int64_t labels[64];
    gcase g = {"nan", 64, 32, 500, FLCE_DTYPE_BF16, FLCE_REDUCTION_NONE, 2, 0, 32, 0, 0, 0, 0};
    fill(&g, h, w, labels, &go, 0);
    h[5 * 32 + 7] = NAN;
    bufs bb = {0};
    CHECK(upload_all(&g, &bb, h, w, labels, &go, 0) == FLCE_OK);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = bb.h, t.weight = bb.w, t.labels = bb.labels, t.loss = bb.loss, t.lse = bb.lse, t.grad_hidden = bb.dh;
    CHECK(flce_loss_and_grad(ctx, &p, &t, NULL) == FLCE_OK && flce_check(ctx, NULL) == FLCE_OK);
    double loss[64], lse[64], *dh = dalloc(64 * 32);
    down_f32(bb.loss, loss, 64);
    down_f32(bb.lse, lse, 64);
    download_f64(FLCE_DTYPE_BF16, bb.dh, dh, 64 * 32);
    int leaks = 0;
    for (int i = 0; i < 64; i++) {
        int nan_row = isnan(loss[i]) && isnan(lse[i]) && isnan(dh[i * 32]);
        int finite_row = isfinite(loss[i]) && isfinite(lse[i]) && all_finite(dh + i * 32, 32);
        leaks += i == 5 ? !nan_row : !finite_row;
    }
    CHECKF(leaks == 0, "%d tokens wrong (token 5 must be NaN, all others finite)", leaks);
    free_all(&bb);
    free(h), free(w), free(dh);
}

/* ---- ±Inf in an input (issue 15 item 6) ---- */

enum { INF_N = 200, INF_D = 32, INF_V = 777 };

/* What PyTorch gives for cross_entropy(h @ w.T, y, reduction='none') and its backward when logits
 * are infinite: log_softmax's plain formula in IEEE fp64 with every product computed (a GEMM
 * computes 0·inf, which is NaN): m = max_j z_j, lse = m + log Σ_j exp(z_j − m), loss = lse − z_y,
 * dz_j = exp(z_j − lse) − [j = y], dH = dZ·W, dW = dZᵀ·H. A row whose max is +inf is NaN
 * throughout (inf − inf); a −inf logit is a probability of 0 (a loss of +inf when it is the
 * label's). testing/ref.c is not this: its online max and its skipping of zero dz are exact only
 * for finite logits. Labels must all be valid. */
static void torch_ref(int64_t n, int64_t d, int64_t v, const double *h, const double *w,
                      const int64_t *labels, double *loss, double *lse, double *dh, double *dw)
{
    double *z = dalloc(v);
    memset(dh, 0, sizeof(double) * (size_t)(n * d));
    memset(dw, 0, sizeof(double) * (size_t)(v * d));
    for (int64_t i = 0; i < n; i++) {
        const double *hi = h + i * d;
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < v; j++) {
            z[j] = 0;
            for (int64_t k = 0; k < d; k++) z[j] += hi[k] * w[j * d + k];
            m = z[j] > m || isnan(z[j]) ? z[j] : m; /* torch's max propagates NaN */
        }
        for (int64_t j = 0; j < v; j++) sum += exp(z[j] - m);
        lse[i] = m + log(sum);
        loss[i] = lse[i] - z[labels[i]];
        for (int64_t j = 0; j < v; j++) {
            double dz = exp(z[j] - lse[i]) - (j == labels[i]);
            for (int64_t k = 0; k < d; k++) {
                dh[i * d + k] += dz * w[j * d + k];
                dw[j * d + k] += dz * hi[k];
            }
        }
    }
    free(z);
}

/* got against PyTorch's want: NaN where want is NaN (or +inf, with posinf_ok: torch.logsumexp's
 * answer for a row whose max is +inf), the same infinity where want is infinite, finite
 * elsewhere; `wrong` counts the misses, num/den the finite entries' squared error and norm. */
typedef struct pattern_err {
    int64_t wrong, nonfinite;
    double num, den;
} pattern_err;

static void pattern_add(pattern_err *e, const double *want, const double *got, size_t n, int posinf_ok)
{
    for (size_t i = 0; i < n; i++) {
        if (isnan(want[i])) {
            e->nonfinite++;
            e->wrong += !(isnan(got[i]) || (posinf_ok && got[i] == INFINITY));
        } else if (isinf(want[i])) {
            e->nonfinite++;
            e->wrong += got[i] != want[i];
        } else if (!isfinite(got[i])) {
            e->wrong++;
        } else {
            e->num += (got[i] - want[i]) * (got[i] - want[i]), e->den += want[i] * want[i];
        }
    }
}

static double pattern_rel(const pattern_err *e) { return e->den > 0 ? sqrt(e->num / e->den) : sqrt(e->num); }

/* One loss-and-grad call (reduction none) on host inputs h, w; outputs back in fp64. */
static int inf_run(const flce_problem *p, const double *h, const double *w, const int64_t *labels,
                   double *loss, double *lse, double *dh, double *dw)
{
    gcase g = {"inf", INF_N, INF_D, INF_V, p->dtype, FLCE_REDUCTION_NONE, 2, 0, 32, 0, 0, 0, 0};
    bufs b = {0};
    flce_status st = upload_all(&g, &b, h, w, labels, NULL, 0);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = b.h, t.weight = b.w, t.labels = b.labels, t.loss = b.loss, t.lse = b.lse;
    t.grad_hidden = b.dh, t.grad_weight = b.dw;
    if (st == FLCE_OK) st = flce_loss_and_grad(ctx, p, &t, NULL);
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    CHECKF(st == FLCE_OK, "inf: %s", flce_last_error());
    if (st == FLCE_OK) {
        down_f32(b.loss, loss, INF_N);
        down_f32(b.lse, lse, INF_N);
        download_f64(p->dtype, b.dh, dh, INF_N * INF_D);
        download_f64(p->dtype, b.dw, dw, INF_V * INF_D);
    }
    free_all(&b);
    return st == FLCE_OK;
}

/* Rows other than the two poisoned ones: loss, lse and dH row as in the clean run. */
static int64_t inf_rows_moved(const double *cl, const double *clse, const double *cdh, const double *gl,
                              const double *glse, const double *gdh, int64_t *bitwise)
{
    int64_t moved = 0;
    *bitwise = 0;
    for (int64_t i = 0; i < INF_N; i++) {
        if (i == 5 || i == 9) continue;
        const double *a = cdh + i * INF_D, *b = gdh + i * INF_D;
        moved += !(fabs(gl[i] - cl[i]) <= 1e-6 * fabs(cl[i]) && fabs(glse[i] - clse[i]) <= 1e-6 * fabs(clse[i]) &&
                   ref_rel_l2(a, b, INF_D) <= 1e-3);
        *bitwise += gl[i] == cl[i] && glse[i] == clse[i] && !memcmp(a, b, sizeof(double) * INF_D);
    }
    return moved;
}

/* +inf and −inf in hidden rows 5 and 9 (in_weight 0), or +inf in weight row 17 (in_weight 1): the
 * outputs follow PyTorch's (torch_ref) entry for entry, and with a poisoned hidden row every other
 * token's loss, lse and dH row is what the clean run gave. Several token chunks (chunked) or
 * vocab chunks (recompute), so a chunk's running max starting at −inf shows. */
static void inf_case(int in_weight, flce_dtype dt, flce_strategy strategy)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = INF_N, p.hidden = INF_D, p.vocab_shard = INF_V, p.dtype = dt;
    p.reduction = FLCE_REDUCTION_NONE, p.strategy = strategy, p.memory_budget = 1 << 16;
    size_t nh = INF_N * INF_D, nw = INF_V * INF_D;
    double *h = dalloc((int64_t)nh), *w = dalloc((int64_t)nw);
    int64_t labels[INF_N];
    gcase g = {"inf", INF_N, INF_D, INF_V, dt, FLCE_REDUCTION_NONE, 2, 0, 32, 0, 0, 0, 0};
    fill(&g, h, w, labels, NULL, 0);
    double *cl = dalloc(INF_N), *clse = dalloc(INF_N), *cdh = dalloc((int64_t)nh), *cdw = dalloc((int64_t)nw);
    double *gl = dalloc(INF_N), *glse = dalloc(INF_N), *gdh = dalloc((int64_t)nh), *gdw = dalloc((int64_t)nw);
    double *rl = dalloc(INF_N), *rlse = dalloc(INF_N), *rdh = dalloc((int64_t)nh), *rdw = dalloc((int64_t)nw);
    char name[96];
    snprintf(name, sizeof name, "%s %s, %s", spec_dtype_name((flce_dtype)dt), in_weight ? "+inf in weight row 17" : "+inf/-inf in hidden rows 5, 9",
             strategy == FLCE_STRATEGY_CHUNKED ? "chunked" : "recompute");
    int ok = inf_run(&p, h, w, labels, cl, clse, cdh, cdw);
    if (in_weight) w[17 * INF_D + 3] = INFINITY;
    else h[5 * INF_D + 7] = INFINITY, h[9 * INF_D + 3] = -INFINITY;
    if (ok && inf_run(&p, h, w, labels, gl, glse, gdh, gdw)) {
        torch_ref(INF_N, INF_D, INF_V, h, w, labels, rl, rlse, rdh, rdw);
        pattern_err el = {0}, es = {0}, eh = {0}, ew = {0};
        pattern_add(&el, rl, gl, INF_N, 0);
        pattern_add(&es, rlse, glse, INF_N, 1);
        pattern_add(&eh, rdh, gdh, nh, 0);
        pattern_add(&ew, rdw, gdw, nw, 0);
        double tg = tol_grad(dt);
        printf("  %-52s loss %.1e lse %.1e dH %.1e dW %.1e; non-finite as PyTorch: %lld/%lld/%lld/%lld\n", name,
               pattern_rel(&el), pattern_rel(&es), pattern_rel(&eh), pattern_rel(&ew), (long long)el.nonfinite,
               (long long)es.nonfinite, (long long)eh.nonfinite, (long long)ew.nonfinite);
        CHECKF(el.wrong == 0 && pattern_rel(&el) <= 1e-5, "%s: loss: %lld entries not PyTorch's, finite rel err %.2e",
               name, (long long)el.wrong, pattern_rel(&el));
        CHECKF(es.wrong == 0 && pattern_rel(&es) <= 1e-5, "%s: lse: %lld entries not PyTorch's, finite rel err %.2e",
               name, (long long)es.wrong, pattern_rel(&es));
        CHECKF(eh.wrong == 0 && pattern_rel(&eh) <= tg, "%s: dH: %lld entries not PyTorch's, finite rel err %.2e",
               name, (long long)eh.wrong, pattern_rel(&eh));
        CHECKF(ew.wrong == 0 && pattern_rel(&ew) <= tg, "%s: dW: %lld entries not PyTorch's, finite rel err %.2e",
               name, (long long)ew.wrong, pattern_rel(&ew));
        if (!in_weight) {
            int64_t bitwise = 0, moved = inf_rows_moved(cl, clse, cdh, gl, glse, gdh, &bitwise);
            printf("     other tokens: %lld of %d bitwise as in the clean run\n", (long long)bitwise, INF_N - 2);
            CHECKF(moved == 0, "%s: %lld other tokens' loss, lse or dH row moved from the clean run", name, (long long)moved);
        }
    }
    free(h), free(w), free(cl), free(clse), free(cdh), free(cdw), free(gl), free(glse), free(gdh), free(gdw);
    free(rl), free(rlse), free(rdh), free(rdw);
}

static void inf_input_follows_pytorch_and_stays_in_its_token(void)
{
    const flce_strategy strategies[] = {FLCE_STRATEGY_CHUNKED, FLCE_STRATEGY_RECOMPUTE};
    for (int in_weight = 0; in_weight < 2; in_weight++)
        for (int dt = 0; dt < 3; dt++)
            for (int s = 0; s < 2; s++)
                if (shard_mine()) inf_case(in_weight, (flce_dtype)dt, strategies[s]);
}

/* ---- graph capture and determinism (issue 7) ---- */

typedef struct det_run {
    flce_problem p;
    bufs b;
    flce_tensors t;
    void *ws;
    size_t nh, nw;
} det_run;

static int det_setup(det_run *d, flce_reduction red)
{
    flce_problem_init(&d->p);
    d->p.tokens = 777, d->p.hidden = 128, d->p.vocab_shard = 5003, d->p.dtype = FLCE_DTYPE_BF16;
    d->p.reduction = red, d->p.memory_budget = 4 << 20; /* several chunks: accumulation order matters */
    d->p.label_smoothing = 0.1f, d->p.z_loss = 1e-4f;
    gcase c = {"det", 777, 128, 5003, FLCE_DTYPE_BF16, red, 4, 0.1, 32, 0, 0, 0, 0};
    d->nh = 777 * 128, d->nw = 5003 * 128;
    double *h = dalloc((int64_t)d->nh), *w = dalloc((int64_t)d->nw), go = 0;
    int64_t *labels = malloc(sizeof(int64_t) * 777);
    fill(&c, h, w, labels, &go, 0);
    memset(&d->b, 0, sizeof d->b);
    int ok = upload_all(&c, &d->b, h, w, labels, &go, 0) == FLCE_OK;
    free(h), free(w), free(labels);
    uint64_t bytes = 0;
    ok = ok && flce_workspace_size(ctx, &d->p, FLCE_OP_LOSS_AND_GRAD, &bytes) == FLCE_OK;
    ok = ok && devmem_alloc(&d->ws, bytes) == FLCE_OK;
    flce_tensors_init(&d->t);
    d->t.hidden = d->b.h, d->t.weight = d->b.w, d->t.labels = d->b.labels, d->t.loss = d->b.loss;
    d->t.lse = d->b.lse, d->t.grad_hidden = d->b.dh, d->t.grad_weight = d->b.dw;
    d->t.workspace = d->ws, d->t.workspace_bytes = bytes;
    return ok;
}

/* Every output's bytes, for bitwise comparison. */
static unsigned char *det_snapshot(const det_run *d, size_t *len)
{
    size_t nl = d->p.reduction == FLCE_REDUCTION_NONE ? 777 : 1;
    *len = nl * 4 + 777 * 4 + (d->nh + d->nw) * 2;
    unsigned char *s = malloc(*len), *at = s;
    devmem_download(at, d->b.loss, nl * 4), at += nl * 4;
    devmem_download(at, d->b.lse, 777 * 4), at += 777 * 4;
    devmem_download(at, d->b.dh, d->nh * 2), at += d->nh * 2;
    devmem_download(at, d->b.dw, d->nw * 2);
    return s;
}

static void det_poison(det_run *d)
{
    devmem_poison(d->b.loss, 777 * 4), devmem_poison(d->b.lse, 777 * 4);
    devmem_poison(d->b.dh, d->nh * 2), devmem_poison(d->b.dw, d->nw * 2);
}

/* Ten runs give bitwise-identical loss, lse and gradients: no float atomics, fixed reduction order. */
static void ten_runs_are_bitwise_identical(void)
{
    for (int red = 0; red < 3; red++) {
        if (!shard_mine()) continue;
        det_run d;
        CHECK(det_setup(&d, (flce_reduction)red));
        unsigned char *first = NULL;
        size_t len = 0;
        int differing = 0;
        for (int run = 0; run < 10; run++) {
            det_poison(&d);
            CHECK(flce_loss_and_grad(ctx, &d.p, &d.t, NULL) == FLCE_OK && flce_check(ctx, NULL) == FLCE_OK);
            size_t l2;
            unsigned char *snap = det_snapshot(&d, &l2);
            if (!first) first = snap, len = l2;
            else differing += memcmp(first, snap, len) != 0, free(snap);
        }
        CHECKF(differing == 0, "%s: %d of 9 repeat runs differ from the first", red_name[red], differing);
        free(first);
        free_all(&d.b);
        devmem_free(d.ws);
    }
}

/* Loss-and-grad and forward captured into a CUDA graph (no host synchronization inside) and replayed
 * 100 times give the same bytes as a direct call. Without a workspace, capture is refused clearly. */
static void graph_capture_replays_identically(void)
{
    det_run d;
    CHECK(det_setup(&d, FLCE_REDUCTION_MEAN));
    void *stream = NULL, *exec = NULL;
    CHECK(devmem_stream_create(&stream) == FLCE_OK);
    CHECK(flce_loss_and_grad(ctx, &d.p, &d.t, stream) == FLCE_OK && flce_check(ctx, stream) == FLCE_OK);
    size_t len = 0, l2 = 0;
    unsigned char *direct = det_snapshot(&d, &len);

    /* A fresh context holds no workspace: capturing a call that would have to allocate one is
     * refused with a message, not broken. */
    flce_context *fresh = NULL;
    CHECK(flce_context_create(0, &fresh) == FLCE_OK);
    flce_tensors no_ws = d.t;
    no_ws.workspace = NULL, no_ws.workspace_bytes = 0;
    CHECK(flce_loss_and_grad(fresh, &d.p, &d.t, stream) == FLCE_OK); /* loads its kernels */
    CHECK(devmem_capture_begin(stream) == FLCE_OK);
    flce_status st = flce_loss_and_grad(fresh, &d.p, &no_ws, stream);
    void *discard = NULL;
    devmem_capture_end(stream, &discard);
    devmem_graph_destroy(discard);
    CHECKF(st == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "captured"), "%s: %s",
           flce_status_name(st), flce_last_error());
    CHECK(devmem_stream_sync(stream) == FLCE_OK);
    flce_context_destroy(fresh);

    det_poison(&d);
    CHECK(devmem_capture_begin(stream) == FLCE_OK);
    st = flce_loss_and_grad(ctx, &d.p, &d.t, stream);
    CHECKF(st == FLCE_OK, "capturing loss_and_grad: %s", flce_last_error());
    CHECK(devmem_capture_end(stream, &exec) == FLCE_OK);
    int differing = 0;
    for (int i = 0; i < 100; i++) {
        if (i == 0 || i == 99) det_poison(&d);
        CHECK(devmem_graph_launch(exec, stream) == FLCE_OK);
        if (i == 0 || i == 99) {
            CHECK(devmem_stream_sync(stream) == FLCE_OK);
            unsigned char *snap = det_snapshot(&d, &l2);
            differing += l2 != len || memcmp(snap, direct, len) != 0;
            free(snap);
        }
    }
    CHECK(devmem_stream_sync(stream) == FLCE_OK && flce_check(ctx, stream) == FLCE_OK);
    CHECKF(differing == 0, "%d of 2 checked replays differ from the direct call", differing);
    devmem_graph_destroy(exec);

    /* forward alone: a direct call, then the same captured and replayed */
    flce_tensors f = d.t;
    f.grad_hidden = f.grad_weight = NULL;
    flce_problem pf = d.p;
    float loss_graph = 0, loss_direct = 0;
    CHECK(flce_forward(ctx, &pf, &f, stream) == FLCE_OK && flce_check(ctx, stream) == FLCE_OK);
    devmem_download(&loss_direct, d.b.loss, 4);
    det_poison(&d);
    CHECK(devmem_capture_begin(stream) == FLCE_OK);
    CHECK(flce_forward(ctx, &pf, &f, stream) == FLCE_OK);
    CHECK(devmem_capture_end(stream, &exec) == FLCE_OK);
    for (int i = 0; i < 100; i++) CHECK(devmem_graph_launch(exec, stream) == FLCE_OK);
    CHECK(devmem_stream_sync(stream) == FLCE_OK);
    devmem_download(&loss_graph, d.b.loss, 4);
    CHECKF(loss_graph == loss_direct, "forward graph loss %g vs direct %g", loss_graph, loss_direct);
    devmem_graph_destroy(exec);
    devmem_stream_destroy(stream);
    free(direct);
    free_all(&d.b);
    devmem_free(d.ws);
}

/* Bad tensors: a status and a message naming the argument; nothing launched. */
static void bad_tensors_are_named(void)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 64, p.hidden = 32, p.vocab_shard = 100;
    void *buf = NULL;
    CHECK(devmem_alloc(&buf, 1 << 20) == FLCE_OK);
    char *b = buf;
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = b, t.weight = b + 65536, t.labels = b + 131072, t.loss = (float *)(b + 196608);
    t.grad_hidden = b + 262144, t.grad_weight = b + 327680;
    flce_tensors bad = t;
    bad.hidden = NULL;
    CHECK(flce_loss_and_grad(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "hidden"));
    bad = t, bad.weight = b + 65536 + 2;
    CHECK(flce_loss_and_grad(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "weight") && strstr(flce_last_error(), "aligned"));
    bad = t, bad.labels = b + 131072 + 1;
    CHECK(flce_forward(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "labels"));
    bad = t, bad.loss = NULL;
    CHECK(flce_forward(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "nothing to compute"));
    bad = t, bad.workspace = b + 512 * 1024, bad.workspace_bytes = 256;
    CHECK(flce_loss_and_grad(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "workspace_bytes=256"));
    bad = t, bad.struct_size = 12;
    CHECK(flce_loss_and_grad(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "struct_size"));
    flce_problem q = p;
    q.strategy = FLCE_STRATEGY_FORWARD;
    CHECK(flce_loss_and_grad(ctx, &q, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "strategy"));
    bad = t, bad.lse = NULL;
    CHECK(flce_backward(ctx, &p, &bad, NULL) == FLCE_ERR_INVALID_ARGUMENT && strstr(flce_last_error(), "lse"));
    uint64_t need = 0;
    CHECK(flce_workspace_size(ctx, &p, FLCE_OP_LOSS_AND_GRAD, &need) == FLCE_OK && need > 0);
    CHECK(flce_check(ctx, NULL) == FLCE_OK);
    devmem_free(buf);
}

static void run_all(void)
{
    RUN_CASES(every_dtype_and_reduction_matches_the_reference);
    RUN_CASES(awkward_shapes_match_the_reference);
    RUN_CASES(all_labels_ignored_mean_is_zero);
    RUN_CASES(row_scaled_logits_match_the_reference_at_every_spread);
    RUN_UNIT(forward_matches_loss_and_grad);
    RUN_UNIT(out_of_range_label_is_reported_not_read);
    RUN_UNIT(bad_tensors_are_named);
    RUN_CASES(every_option_alone_matches_the_reference);
    RUN_CASES(recipe_combinations_match_the_reference);
    RUN_CASES(accumulate_and_recompute_modes_match_the_reference);
    RUN_UNIT(nan_input_stays_in_its_token);
    RUN_CASES(inf_input_follows_pytorch_and_stays_in_its_token);
    RUN_CASES(ten_runs_are_bitwise_identical);
    RUN_UNIT(graph_capture_replays_identically);
}

static uint64_t test_seed;

/* Shard k's share of the tests (all of them when there are no shards), on its own context and its
 * own random stream: seed + k. The caller made device 0's primary context current. */
static int run_tests(int k)
{
    host_rng_seed(&rng, test_seed + (uint64_t)k);
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    run_all();
    flce_context_destroy(ctx);
    return check_failed ? 1 : 0;
}

/* A shard's child: CUDA starts here, never in the parent (shard.h). */
static int shard_body(int k)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    return run_tests(k);
}

int main(void)
{
    int jobs = shard_jobs(), rc = 0;
    if (jobs == 1 ? !gpu_ready(1, &rc) : (rc = shard_gpu_check(1)) != 0) return rc;
    test_seed = host_fresh_seed();
    if (jobs == 1) {
        printf("seed %llu (FLCE_SEED=%llu reproduces)\n", (unsigned long long)test_seed,
               (unsigned long long)test_seed);
        run_tests(0);
        FINISH();
    }
    /* Which cases a shard runs and the data it draws depend on the count too. */
    printf("seed %llu (FLCE_SEED=%llu FLCE_TEST_JOBS=%d reproduces; shard k draws from seed + k)\n",
           (unsigned long long)test_seed, (unsigned long long)test_seed, jobs);
    printf("%d shards, each its own process and context (FLCE_TEST_JOBS)\n", jobs);
    return shard_finish(shard_run(jobs, shard_body));
}
