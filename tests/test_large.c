/*
 * test_large.c — problems past 2^31 elements, and past 2^32 (issue 15 item 7, device side;
 * test_spec checks the planner's side without a GPU), bf16:
 *   tokens × vocab   32768 × 132072 (4.3e9 logits): never stored whole at the default budget, and
 *                    stored whole in ONE workspace block at a 16 GiB budget;
 *   vocab × hidden   a 2,200,000-row vocab shard of D = 2048 (4.5e9 elements: a 9 GB weight, a
 *                    9 GB dW) under 1000 tokens, a count no tile divides;
 *   tokens × hidden  2,200,000 tokens of D = 2048 (a 9 GB hidden state and dH) over V = 1000.
 * An element index kept in 32 bits anywhere (a row offset, a chunk's base, a TMA coordinate, the
 * compact logits' address) wraps in one of them. Each runs forward (loss, lse, per-token losses),
 * then loss-and-grad chunked and recompute, each at the default budget and at 16 GiB, every output
 * poisoned first; all checked against the fp64 reference on sampled rows (testing/bench_data.h:
 * sampled tokens' lse, loss and dH rows; sampled vocab rows' dW, the first and last always) and
 * on the last valid token (the highest hidden and dH addresses).
 *
 * At most about 37 GiB of device memory (tokens × hidden under recompute: H, dH and the fp32 dH
 * accumulator) and 10 GiB of host memory; a case the GPU has no room for says so and is skipped.
 * A few minutes on an H100 machine, mostly the fp64 reference and filling 9 GB of inputs: label
 * `large`, kept out of the README's ctest run by CONFIGURATIONS Extra (tests/CMakeLists.txt);
 * bench/device_ci.sh runs it with ctest -C Extra -L large. Exits 77 without a GPU.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_data.h"
#include "check.h"
#include "devmem.h"
#include "gpu_ready.h"
#include "host.h"

enum { SAMPLES = 16 };
#define GIB (1024.0 * 1024.0 * 1024.0)

static flce_context *ctx;
static uint64_t seed;

typedef struct large_case {
    const char *name;
    int64_t n, d, v;
} large_case;

/* ---- dW of sampled vocab rows, over threads (bench_ref_vocab is serial: 1M tokens take minutes) */

enum { VOCAB_BLOCK = 4096 };

typedef struct vocab_job {
    const bench_data *d;
    const bench_ref *r;
    const float *lse;
    double *partial; /* one samples × D block per token block */
    const double *wrows;
} vocab_job;

static void vocab_block(void *arg, int64_t b)
{
    vocab_job *j = arg;
    const flce_problem *p = &j->d->p;
    int64_t D = p->hidden, i0 = b * VOCAB_BLOCK, i1 = i0 + VOCAB_BLOCK < p->tokens ? i0 + VOCAB_BLOCK : p->tokens;
    double *acc = j->partial + b * j->r->samples * D, *h = malloc(sizeof(double) * (size_t)D);
    for (int64_t i = i0; i < i1 && h; i++) {
        if (j->d->labels[i] == p->ignore_index) continue;
        host_from_dtype(p->dtype, (const char *)j->d->h + (size_t)i * (size_t)D * j->d->es, h, (size_t)D);
        for (int s = 0; s < j->r->samples; s++) {
            const double *w = j->wrows + s * D;
            double t = 0;
            for (int64_t k = 0; k < D; k++) t += h[k] * w[k];
            double dz = j->r->g * (exp(t - (double)j->lse[i]) - (j->r->vrow[s] == j->d->labels[i]));
            for (int64_t k = 0; k < D; k++) acc[s * D + k] += dz * h[k];
        }
    }
    free(h);
}

/* bench_ref_vocab's result (the same rows: first, last, then random), token blocks in parallel. */
static int ref_vocab_parallel(bench_ref *r, const bench_data *d, host_rng *rng, const float *lse)
{
    int64_t D = d->p.hidden, V = d->p.vocab_shard, blocks = (d->p.tokens + VOCAB_BLOCK - 1) / VOCAB_BLOCK;
    int S = r->samples;
    double *wrows = malloc(sizeof(double) * (size_t)(S * D));
    double *partial = calloc((size_t)(blocks * S * D), sizeof(double));
    if (!wrows || !partial) {
        free(wrows), free(partial);
        return 0;
    }
    for (int s = 0; s < S; s++) {
        r->vrow[s] = s == 0 ? 0 : s == 1 ? V - 1 : host_rng_below(rng, V);
        host_from_dtype(d->p.dtype, (const char *)d->w + (size_t)r->vrow[s] * (size_t)D * d->es, wrows + s * D,
                        (size_t)D);
    }
    vocab_job j = {d, r, lse, partial, wrows};
    host_parallel_for(blocks, 0, vocab_block, &j);
    memset(r->dw, 0, sizeof(double) * (size_t)(S * D));
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t e = 0; e < S * D; e++) r->dw[e] += partial[b * S * D + e];
    r->have_dw = 1;
    free(wrows), free(partial);
    return 1;
}

/* ---- the calls ------------------------------------------------------------------------------ */

static void tensors_of(const bench_data *d, int grads, flce_tensors *t)
{
    flce_tensors_init(t);
    t->hidden = d->d_h, t->weight = d->d_w, t->labels = d->d_labels, t->loss = d->d_loss;
    t->lse = d->d_lse, t->loss_per_token = d->d_loss_rows;
    if (grads) t->grad_hidden = d->d_dh, t->grad_weight = d->d_dw;
}

static const char *strategy_name(flce_strategy s)
{
    return s == FLCE_STRATEGY_CHUNKED ? "chunked" : s == FLCE_STRATEGY_RECOMPUTE ? "recompute" : "forward";
}

/* A strategy and the memory_budget it runs at (0: the library's default). */
typedef struct run_kind {
    flce_strategy s;
    uint64_t budget;
} run_kind;

#define BIG_BUDGET (16ull << 30)
static const run_kind grad_runs[] = {{FLCE_STRATEGY_CHUNKED, 0}, {FLCE_STRATEGY_CHUNKED, BIG_BUDGET},
                                     {FLCE_STRATEGY_RECOMPUTE, 0}, {FLCE_STRATEGY_RECOMPUTE, BIG_BUDGET}};
enum { GRAD_RUNS = sizeof grad_runs / sizeof grad_runs[0] };

static const char *run_name(run_kind k, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", strategy_name(k.s), k.budget ? " 16G" : "");
    return buf;
}

/* One call, timed; 0 with the message when it failed. */
static int call(const bench_data *d, run_kind k, const char *name)
{
    flce_strategy s = k.s;
    char kn[32];
    run_name(k, kn, sizeof kn);
    flce_problem p = d->p;
    p.strategy = s == FLCE_STRATEGY_FORWARD ? FLCE_STRATEGY_AUTO : s;
    p.memory_budget = k.budget;
    flce_tensors t;
    tensors_of(d, s != FLCE_STRATEGY_FORWARD, &t);
    uint64_t ws = 0;
    flce_workspace_size(ctx, &p, s == FLCE_STRATEGY_FORWARD ? FLCE_OP_FORWARD : FLCE_OP_LOSS_AND_GRAD, &ws);
    double t0 = host_now_s();
    flce_status st = bench_data_poison_outputs(d);
    if (st == FLCE_OK)
        st = s == FLCE_STRATEGY_FORWARD ? flce_forward(ctx, &p, &t, NULL) : flce_loss_and_grad(ctx, &p, &t, NULL);
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    CHECKF(st == FLCE_OK, "%s, %s: %s", name, kn, flce_last_error());
    printf("  %-14s %.2f s (kernels compiled or loaded on first use), workspace %.2f GiB\n", kn,
           host_now_s() - t0, (double)ws / GIB);
    return st == FLCE_OK;
}

/* ---- the last valid token, in fp64 (bench_ref samples tokens at random) ------------------- */

typedef struct last_ref {
    int64_t i;
    double lse, loss, *dh; /* dh: D values, for the mean's scale g */
} last_ref;

/* Vocab rows in blocks over threads: 2.2M rows × 2048 are 4.5e9 multiply-adds per pass. */
typedef struct last_job {
    const bench_data *d;
    const double *h;
    double *z, *partial, lse, g;
    int32_t y;
} last_job;

static void last_logits(void *arg, int64_t b)
{
    last_job *j = arg;
    int64_t D = j->d->p.hidden, V = j->d->p.vocab_shard, r1 = (b + 1) * VOCAB_BLOCK < V ? (b + 1) * VOCAB_BLOCK : V;
    double *w = malloc(sizeof(double) * (size_t)D);
    for (int64_t r = b * VOCAB_BLOCK; r < r1 && w; r++) {
        host_from_dtype(j->d->p.dtype, (const char *)j->d->w + (size_t)r * (size_t)D * j->d->es, w, (size_t)D);
        double t = 0;
        for (int64_t k = 0; k < D; k++) t += j->h[k] * w[k];
        j->z[r] = t;
    }
    free(w);
}

static void last_dh(void *arg, int64_t b)
{
    last_job *j = arg;
    int64_t D = j->d->p.hidden, V = j->d->p.vocab_shard, r1 = (b + 1) * VOCAB_BLOCK < V ? (b + 1) * VOCAB_BLOCK : V;
    double *w = malloc(sizeof(double) * (size_t)D), *acc = j->partial + b * D;
    for (int64_t r = b * VOCAB_BLOCK; r < r1 && w; r++) {
        double dz = j->g * (exp(j->z[r] - j->lse) - (r == j->y));
        host_from_dtype(j->d->p.dtype, (const char *)j->d->w + (size_t)r * (size_t)D * j->d->es, w, (size_t)D);
        for (int64_t k = 0; k < D; k++) acc[k] += dz * w[k];
    }
    free(w);
}

/* lse, loss and dH row (for the mean's scale g) of the last token whose label is not ignored. */
static int last_token_ref(last_ref *L, const bench_data *d, double g)
{
    const flce_problem *p = &d->p;
    int64_t D = p->hidden, V = p->vocab_shard, blocks = (V + VOCAB_BLOCK - 1) / VOCAB_BLOCK;
    L->i = p->tokens - 1;
    while (L->i > 0 && d->labels[L->i] == p->ignore_index) L->i--;
    double *h = malloc(sizeof(double) * (size_t)D), *z = malloc(sizeof(double) * (size_t)V);
    double *partial = calloc((size_t)(blocks * D), sizeof(double));
    L->dh = calloc((size_t)D, sizeof(double));
    int ok = h && z && partial && L->dh;
    if (ok) {
        host_from_dtype(p->dtype, (const char *)d->h + (size_t)L->i * (size_t)D * d->es, h, (size_t)D);
        last_job j = {d, h, z, partial, 0, g, d->labels[L->i]};
        host_parallel_for(blocks, 0, last_logits, &j);
        double m = -INFINITY, sum = 0;
        for (int64_t r = 0; r < V; r++) m = fmax(m, z[r]);
        for (int64_t r = 0; r < V; r++) sum += exp(z[r] - m);
        L->lse = j.lse = m + log(sum);
        L->loss = L->lse - z[j.y];
        host_parallel_for(blocks, 0, last_dh, &j);
        for (int64_t b = 0; b < blocks; b++)
            for (int64_t k = 0; k < D; k++) L->dh[k] += partial[b * D + k];
    }
    free(h), free(z), free(partial);
    return ok;
}

/* Max of the last token's lse and loss rel errors, and its dH row's rel L2 when grads. */
static void last_token_errors(const last_ref *L, const bench_data *d, int grads, double *e_row, double *e_dh)
{
    int64_t D = d->p.hidden;
    float lse = NAN, loss = NAN;
    devmem_download(&lse, (const float *)d->d_lse + L->i, 4);
    devmem_download(&loss, (const float *)d->d_loss_rows + L->i, 4);
    *e_row = fmax(fabs(lse - L->lse) / fabs(L->lse), fabs(loss - L->loss) / fmax(fabs(L->loss), 1e-6));
    if (isnan(lse) || isnan(loss)) *e_row = NAN;
    *e_dh = 0;
    if (!grads) return;
    void *row = malloc((size_t)D * d->es);
    double *got = malloc(sizeof(double) * (size_t)D), num = 0, den = 0;
    devmem_download(row, (const char *)d->d_dh + (size_t)L->i * (size_t)D * d->es, (size_t)D * d->es);
    host_from_dtype(d->p.dtype, row, got, (size_t)D);
    for (int64_t k = 0; k < D; k++) num += (got[k] - L->dh[k]) * (got[k] - L->dh[k]), den += L->dh[k] * L->dh[k];
    *e_dh = sqrt(num / den);
    free(row), free(got);
}

/* The device outputs of the last call against r and L; grads 0: forward (loss, lse, per-token loss). */
static void compare(const bench_ref *r, const last_ref *L, const bench_data *d, int grads, const char *name,
                    const char *kn)
{
    bench_errors e;
    bench_ref_compare(r, d, grads, &e);
    double last_row = 0, last_dh = 0;
    last_token_errors(L, d, grads, &last_row, &last_dh);
    printf("  %-14s mean %.1e  lse %.1e  loss rows %.1e  last token %.1e", kn, e.mean, e.lse, e.loss_row, last_row);
    if (grads) printf("  dH %.1e (last %.1e)  dW %.1e", e.dh, last_dh, e.dw);
    printf("\n");
    /* written as x < tol so that a NaN fails; docs/DESIGN.md §8.2's bf16 tolerances */
    CHECKF(e.mean < 1e-5 && e.lse < 1e-5 && e.loss_row < 1e-4 && last_row < 1e-4,
           "%s, %s: mean %.2e lse %.2e loss rows %.2e last token %.2e", name, kn, e.mean, e.lse, e.loss_row, last_row);
    if (grads)
        CHECKF(e.dh < 4e-3 && e.dw < 4e-3 && last_dh < 4e-3, "%s, %s: dH %.2e (last token %.2e) dW %.2e", name, kn,
               e.dh, last_dh, e.dw);
}

/* Device bytes of the inputs, outputs and the larger workspace of the two strategies. */
static uint64_t device_need(const bench_data *d)
{
    uint64_t most = 0;
    for (int i = 0; i < GRAD_RUNS; i++) {
        flce_problem p = d->p;
        p.strategy = grad_runs[i].s, p.memory_budget = grad_runs[i].budget;
        uint64_t ws = 0;
        flce_workspace_size(ctx, &p, FLCE_OP_LOSS_AND_GRAD, &ws);
        most = ws > most ? ws : most;
    }
    return bench_data_input_bytes(&d->p) + bench_data_output_bytes(&d->p) + most;
}

static void run_large(const large_case *c)
{
    bench_data d;
    memset(&d, 0, sizeof d);
    flce_problem_init(&d.p);
    d.p.tokens = c->n, d.p.hidden = c->d, d.p.vocab_shard = c->v, d.p.dtype = FLCE_DTYPE_BF16;
    printf("  N=%lld D=%lld V=%lld: N*V %.2e, V*D %.2e, N*D %.2e elements (2^31 = %.2e)\n", (long long)c->n,
           (long long)c->d, (long long)c->v, (double)c->n * (double)c->v, (double)c->v * (double)c->d,
           (double)c->n * (double)c->d, 2147483648.0);
    size_t free_b = 0, total_b = 0;
    devmem_info(&free_b, &total_b);
    uint64_t need = device_need(&d);
    printf("  device memory: %.1f GiB needed, %.1f GiB free\n", (double)need / GIB, (double)free_b / GIB);
    if (need + (512ull << 20) > free_b) {
        printf("     skipped: this GPU has too little free memory\n");
        return;
    }
    double t0 = host_now_s();
    int ok = bench_data_fill(&d, seed, 2.0);
    CHECKF(ok, "%s: out of host memory for the inputs", c->name);
    if (ok) {
        ok = bench_data_upload(&d) == FLCE_OK;
        CHECKF(ok, "%s: upload: %s", c->name, flce_last_error());
    }
    printf("  inputs filled and uploaded: %.1f s\n", host_now_s() - t0);
    host_rng rng;
    host_rng_seed(&rng, seed ^ 0x1a46e);
    bench_ref r;
    last_ref L = {0, 0, 0, NULL};
    memset(&r, 0, sizeof r);
    run_kind fwd = {FLCE_STRATEGY_FORWARD, 0};
    if (ok && call(&d, fwd, c->name)) {
        t0 = host_now_s();
        ok = bench_ref_tokens(&r, &d, &rng, SAMPLES) && last_token_ref(&L, &d, r.g);
        CHECKF(ok, "%s: the reference: out of host memory", c->name);
        if (ok) compare(&r, &L, &d, 0, c->name, "forward");
        /* dW rows from the forward's lse, whose sampled rows just matched */
        float *lse = malloc(sizeof(float) * (size_t)c->n);
        ok = ok && lse && devmem_download(lse, d.d_lse, sizeof(float) * (size_t)c->n) == FLCE_OK &&
             ref_vocab_parallel(&r, &d, &rng, lse);
        free(lse);
        printf("  fp64 reference of %d tokens, the last one and %d vocab rows: %.1f s\n", SAMPLES, SAMPLES,
               host_now_s() - t0);
        for (int i = 0; i < GRAD_RUNS && ok; i++) {
            char kn[32];
            if (call(&d, grad_runs[i], c->name)) compare(&r, &L, &d, 1, c->name, run_name(grad_runs[i], kn, sizeof kn));
        }
    }
    free(L.dh);
    bench_ref_free(&r);
    bench_data_free(&d);
}

static void tokens_times_vocab_past_2_32(void)
{
    large_case c = {"N*V", 32768, 64, 132072};
    run_large(&c);
}

static void vocab_times_hidden_past_2_32(void)
{
    large_case c = {"V*D", 1000, 2048, 2200000};
    run_large(&c);
}

static void tokens_times_hidden_past_2_32(void)
{
    large_case c = {"N*D", 2200000, 2048, 1000};
    run_large(&c);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    seed = host_announced_seed();
    if (flce_context_create(0, &ctx) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    double t0 = host_now_s();
    RUN(tokens_times_vocab_past_2_32);
    RUN(vocab_times_hidden_past_2_32);
    RUN(tokens_times_hidden_past_2_32);
    printf("total %.1f s\n", host_now_s() - t0);
    flce_context_destroy(ctx);
    FINISH();
}
