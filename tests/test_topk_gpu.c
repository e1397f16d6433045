/* test_topk_gpu.c — flce_topk_logprobs on a GPU against the top-k of fp64 logits (issue 44 item 2):
 * fresh random data (FLCE_SEED reproduces), outputs poisoned before the call. Per token: the lse at T
 * and each rank's log-prob within 1e-5 of fp64 (absolute; D = 4096 too, where fp32 sums alone err by more), each rank's index the fp64 one or one
 * whose fp64 logit lies as close (the GPU's fp32 sums may order near-equal logits either way), no
 * index twice; equal logits (two identical weight rows) in index order. bf16, f16 and fp32, T ≠ 1,
 * k = 1, 64 and k = V, several token chunks (a small budget); flce_topk_prepare before a call on a
 * context that never compiles in a call. Exit 77 without a GPU. */
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

typedef struct tcase {
    const char *name;
    int64_t n, d, v;
    int k;
    flce_dtype dtype;
    float temperature;
    uint64_t budget; /* 0: default */
    int twin;        /* >= 0: weight row twin + 1 is a copy of row twin (equal logits) */
} tcase;

static int cmp_desc(const void *a, const void *b, void *z)
{
    const double *x = z;
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;
    if (x[i] != x[j]) return x[i] > x[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* qsort_r's argument order differs between libcs: a small insertion sort by (value desc, index asc). */
static void sort_desc(int64_t *idx, int64_t v, const double *z)
{
    for (int64_t a = 1; a < v; a++) {
        int64_t x = idx[a], b = a;
        while (b > 0 && cmp_desc(&idx[b - 1], &x, (void *)z) > 0) idx[b] = idx[b - 1], b--;
        idx[b] = x;
    }
}

static void run_case(const tcase *c)
{
    const int64_t n = c->n, d = c->d, v = c->v;
    const int k = c->k;
    double *h = dalloc(n * d), *w = dalloc(v * d);
    for (int64_t i = 0; i < n * d; i++) h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) w[i] = 2.0 / sqrt((double)d) * host_rng_normal(&rng);
    host_round_to_dtype(c->dtype, h, (size_t)(n * d)), host_round_to_dtype(c->dtype, w, (size_t)(v * d));
    if (c->twin >= 0) memcpy(w + (c->twin + 1) * d, w + c->twin * d, sizeof(double) * (size_t)d);
    flce_topk_problem p;
    flce_topk_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab = v, p.dtype = c->dtype, p.k = k, p.temperature = c->temperature;
    p.memory_budget = c->budget;
    flce_topk_tensors t;
    flce_topk_tensors_init(&t);
    t.hidden = upload_dtype(c->dtype, h, n * d), t.weight = upload_dtype(c->dtype, w, v * d);
    t.indices = poisoned((size_t)(n * k) * 8), t.logprobs = poisoned((size_t)(n * k) * 4), t.lse = poisoned((size_t)n * 4);
    flce_status st = flce_topk_logprobs(ctx, &p, &t, NULL);
    CHECKF(st == FLCE_OK, "%s: %s: %s", c->name, flce_status_name(st), flce_last_error());
    CHECKF(flce_check(ctx, NULL) == FLCE_OK, "%s: check: %s", c->name, flce_last_error());
    int64_t *gi = malloc(sizeof(int64_t) * (size_t)(n * k));
    float *glp = malloc(sizeof(float) * (size_t)(n * k)), *glse = malloc(sizeof(float) * (size_t)n);
    devmem_download(gi, t.indices, (size_t)(n * k) * 8);
    devmem_download(glp, t.logprobs, (size_t)(n * k) * 4);
    devmem_download(glse, t.lse, (size_t)n * 4);
    double *z = dalloc(v);
    int64_t *order = malloc(sizeof(int64_t) * (size_t)v);
    int bad = 0, twin_checked = 0;
    double worst_lp = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; j++) {
            double a = 0;
            for (int64_t q = 0; q < d; q++) a += h[i * d + q] * w[j * d + q];
            z[j] = a / c->temperature, order[j] = j;
            m = fmax(m, z[j]);
        }
        for (int64_t j = 0; j < v; j++) s += exp(z[j] - m);
        const double lse = m + log(s);
        sort_desc(order, v, z);
        bad += !(fabs(glse[i] - lse) <= 1e-5 * (1 + fabs(lse)));
        for (int q = 0; q < k; q++) {
            const int64_t got = gi[i * k + q], want = order[q];
            const double tol = 1e-5 * (1 + fabs(z[want]));
            const int ok_idx = got >= 0 && got < v && (got == want || fabs(z[got] - z[want]) <= tol);
            for (int r = 0; r < q; r++) bad += gi[i * k + r] == got; /* no index twice */
            const double e = fabs(glp[i * k + q] - (z[want] - lse));
            if (e > worst_lp) worst_lp = e;
            if (!ok_idx || !(e <= 1e-5)) {
                if (bad < 5)
                    printf("  %s token %lld rank %d: index %lld (z %.9g) want %lld (z %.9g), log-prob %.9g want %.9g\n",
                           c->name, (long long)i, q, (long long)got, got >= 0 && got < v ? z[got] : NAN,
                           (long long)want, z[want], glp[i * k + q], z[want] - lse);
                bad++;
            }
            if (c->twin >= 0 && got == c->twin + 1) { /* its twin, equal logit and lower index, ranks just before */
                twin_checked++;
                bad += !(q > 0 && gi[i * k + q - 1] == c->twin);
            }
        }
    }
    CHECKF(bad == 0, "%s: %d wrong (largest log-prob error %.2e)", c->name, bad, worst_lp);
    if (c->twin >= 0) printf("  %s: the twin rows met %d times in the top-%d\n", c->name, twin_checked, k);
    printf("  %s: largest log-prob error %.2e\n", c->name, worst_lp);
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(t.indices), devmem_free(t.logprobs);
    devmem_free(t.lse);
    free(h), free(w), free(gi), free(glp), free(glse), free(z), free(order);
}

static void topk_matches_fp64(void)
{
    static const tcase cases[] = {
        {"bf16 k=5", 200, 64, 1000, 5, FLCE_DTYPE_BF16, 1.0f, 0, -1},
        {"bf16 k=64 T=0.7, several chunks", 300, 64, 3001, 64, FLCE_DTYPE_BF16, 0.7f, 3004ull * 4 * 100, -1},
        {"fp32 k=V", 64, 32, 40, 40, FLCE_DTYPE_F32, 1.0f, 0, -1},
        {"f16 k=1 T=2", 50, 32, 500, 1, FLCE_DTYPE_F16, 2.0f, 0, -1},
        {"bf16 equal logits (twin rows) in index order", 128, 64, 800, 64, FLCE_DTYPE_BF16, 1.0f, 0, 17},
        {"bf16 k=64 D=4096", 64, 4096, 4000, 64, FLCE_DTYPE_BF16, 1.0f, 0, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* A server's context (compile_in_call = 0, no background compiles) over an empty cache: the call
 * refuses with FLCE_ERR_NOT_READY before flce_topk_prepare, and runs after it. */
static void prepare_before_a_never_compiling_call(void)
{
    char dir[] = "/tmp/flce-topk-prepare-XXXXXX"; /* mkdtemp's template (server_ctx.h) */
    flce_context *server = server_context(dir);
    CHECKF(server != NULL, "server context in %s: %s", dir, flce_last_error());
    flce_topk_problem p;
    flce_topk_problem_init(&p);
    p.tokens = 64, p.hidden = 64, p.vocab = 1000, p.k = 4;
    flce_topk_tensors t;
    flce_topk_tensors_init(&t);
    double *h = dalloc(64 * 64), *w = dalloc(1000 * 64);
    for (int i = 0; i < 64 * 64; i++) h[i] = host_rng_normal(&rng);
    for (int i = 0; i < 1000 * 64; i++) w[i] = 0.2 * host_rng_normal(&rng);
    t.hidden = upload_dtype(FLCE_DTYPE_BF16, h, 64 * 64), t.weight = upload_dtype(FLCE_DTYPE_BF16, w, 1000 * 64);
    t.indices = poisoned(64 * 4 * 8), t.logprobs = poisoned(64 * 4 * 4);
    flce_status st = flce_topk_logprobs(server, &p, &t, NULL);
    CHECKF(st == FLCE_ERR_NOT_READY, "before prepare: %s (%s)", flce_status_name(st), flce_last_error());
    CHECKF(flce_topk_prepare(server, &p) == FLCE_OK, "prepare: %s", flce_last_error());
    st = flce_topk_logprobs(server, &p, &t, NULL);
    CHECKF(st == FLCE_OK && flce_check(server, NULL) == FLCE_OK, "after prepare: %s", flce_last_error());
    CHECK(flce_topk_prepare(NULL, &p) == FLCE_ERR_INVALID_ARGUMENT);
    devmem_free((void *)t.hidden), devmem_free((void *)t.weight), devmem_free(t.indices), devmem_free(t.logprobs);
    free(h), free(w);
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
    RUN(topk_matches_fp64);
    RUN(prepare_before_a_never_compiling_call);
    flce_context_destroy(ctx);
    FINISH();
}
