/* test_scale_gpu.c — flce_scale_gradients: gradients times the upstream scalar in device memory,
 * in place, rounded once in their dtype (bit for bit what fp32 multiply + round-to-nearest gives),
 * untouched when the scalar is 1 (and then much faster than a pass over them), and every bad
 * argument named. Exits 77 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devmem.h"
#include "gpu_ready.h"
#include "host.h"

static flce_context *ctx;
static host_rng rng;

static int says(const char *needle) { return strstr(flce_last_error(), needle) != NULL; }

static flce_problem problem(flce_dtype dt, int64_t n, int64_t d, int64_t v)
{
    flce_problem p;
    flce_problem_init(&p);
    p.dtype = dt, p.tokens = n, p.hidden = d, p.vocab_shard = v, p.has_bias = 1;
    return p;
}

/* Random values in the dtype, on the host (bits) and the device. */
static void *random_buffer(flce_dtype dt, size_t count, void **dev)
{
    size_t es = host_dtype_size(dt);
    double *x = malloc(count * sizeof *x);
    void *bits = malloc(count * es);
    for (size_t i = 0; i < count; i++) x[i] = 3.0 * host_rng_normal(&rng);
    host_to_dtype(dt, x, bits, count);
    free(x);
    *dev = NULL;
    if (devmem_alloc(dev, count * es) != FLCE_OK || devmem_upload(*dev, bits, count * es) != FLCE_OK) CHECK(0);
    return bits;
}

/* What the kernel must produce: fp32 product of the value and g, rounded once to the dtype. */
static void expected(flce_dtype dt, const void *bits, size_t count, float g, void *out)
{
    double *x = malloc(count * sizeof *x);
    host_from_dtype(dt, bits, x, count);
    for (size_t i = 0; i < count; i++) x[i] = (double)((float)x[i] * g);
    host_to_dtype(dt, x, out, count);
    free(x);
}

static flce_status scale(const flce_problem *p, void *dh, void *dw, void *db, const float *g_dev)
{
    flce_tensors t;
    flce_tensors_init(&t);
    t.grad_hidden = dh, t.grad_weight = dw, t.grad_bias = db, t.grad_output = g_dev;
    flce_status st = flce_scale_gradients(ctx, p, &t, NULL);
    if (st == FLCE_OK) st = devmem_sync();
    return st;
}

static void scaled_exactly_and_untouched_by_one(void)
{
    /* Odd V: the bias has a tail past the 16-byte steps; N·D and V·D are multiples of 8. */
    const int64_t n = 37, d = 64, v = 1001;
    const flce_dtype dts[] = {FLCE_DTYPE_BF16, FLCE_DTYPE_F16, FLCE_DTYPE_F32};
    float *g_dev = NULL;
    CHECK(devmem_alloc((void **)&g_dev, sizeof(float)) == FLCE_OK);
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        flce_dtype dt = dts[k];
        flce_problem p = problem(dt, n, d, v);
        size_t counts[3] = {(size_t)(n * d), (size_t)(v * d), (size_t)v}, es = host_dtype_size(dt);
        void *dev[3], *bits[3], *got[3], *want[3];
        for (int b = 0; b < 3; b++) {
            bits[b] = random_buffer(dt, counts[b], &dev[b]);
            got[b] = malloc(counts[b] * es), want[b] = malloc(counts[b] * es);
        }
        const float gs[] = {1.0f, 0.37f, -2.5f};
        for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++) {
            CHECK(devmem_upload(g_dev, &gs[gi], sizeof(float)) == FLCE_OK);
            CHECKF(scale(&p, dev[0], dev[1], dev[2], g_dev) == FLCE_OK, "%s", flce_last_error());
            for (int b = 0; b < 3; b++) {
                expected(dt, bits[b], counts[b], gs[gi], want[b]);
                CHECK(devmem_download(got[b], dev[b], counts[b] * es) == FLCE_OK);
                CHECKF(!memcmp(got[b], want[b], counts[b] * es), "%s, g = %g, buffer %d: not the fp32 product rounded once",
                       host_dtype_name(dt), gs[gi], b);
                memcpy(bits[b], want[b], counts[b] * es); /* the next g scales these */
            }
        }
        for (int b = 0; b < 3; b++) devmem_free(dev[b]), free(bits[b]), free(got[b]), free(want[b]);
    }
    devmem_free(g_dev);
}

/* g = 1 must not be a pass over the gradients: the kernel reads g and stops. 256 MiB of bf16 dW. */
static void one_costs_no_pass(void)
{
    const int64_t v = 32768, d = 4096;
    flce_problem p = problem(FLCE_DTYPE_BF16, 8, d, v);
    void *dw = NULL;
    float *g_dev = NULL;
    CHECK(devmem_alloc(&dw, (size_t)(v * d) * 2) == FLCE_OK && devmem_alloc((void **)&g_dev, 4) == FLCE_OK);
    CHECK(devmem_poison(dw, (size_t)(v * d) * 2) == FLCE_OK);
    double best[2] = {1e9, 1e9};
    const float gs[2] = {1.0f, 0.5f};
    /* The best of many: under `ctest -j` other GPU tests share the device, and a time slice of
     * theirs inside one sample made the best of 5 read 0.068 ms against 0.248 (H100, 2026-11-23). */
    for (int rep = 0; rep < 30; rep++)
        for (int k = 0; k < 2; k++) {
            CHECK(devmem_upload(g_dev, &gs[k], 4) == FLCE_OK && devmem_sync() == FLCE_OK);
            double t0 = host_now_s();
            CHECK(scale(&p, NULL, dw, NULL, g_dev) == FLCE_OK);
            double dt = host_now_s() - t0;
            if (dt < best[k]) best[k] = dt;
        }
    printf("  256 MiB dW: g = 1 %.3f ms, g = 0.5 %.3f ms\n", 1e3 * best[0], 1e3 * best[1]);
    CHECKF(best[0] * 4 < best[1], "g = 1 took %.3f ms against %.3f ms for a real pass", 1e3 * best[0], 1e3 * best[1]);
    devmem_free(dw), devmem_free(g_dev);
}

static void bad_arguments_are_named(void)
{
    flce_problem p = problem(FLCE_DTYPE_BF16, 16, 64, 100);
    void *dw = NULL;
    float *g_dev = NULL;
    CHECK(devmem_alloc(&dw, 100 * 64 * 2) == FLCE_OK && devmem_alloc((void **)&g_dev, 4) == FLCE_OK);
    flce_tensors t;
    flce_tensors_init(&t);
    t.grad_weight = dw;
    CHECK(flce_scale_gradients(ctx, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("grad_output"));
    t.grad_output = g_dev;
    flce_problem q = p;
    q.reduction = FLCE_REDUCTION_NONE;
    CHECK(flce_scale_gradients(ctx, &q, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("reduction"));
    q = p, q.accumulate_grad_weight = 1;
    CHECK(flce_scale_gradients(ctx, &q, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("accumulate_grad_weight"));
    q = p, q.has_bias = 0;
    t.grad_bias = dw;
    CHECK(flce_scale_gradients(ctx, &q, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("has_bias"));
    t.grad_bias = NULL, t.grad_weight = (char *)dw + 2;
    CHECK(flce_scale_gradients(ctx, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("grad_weight"));
    t.grad_weight = NULL;
    CHECK(flce_scale_gradients(ctx, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("nothing to scale"));
    t.grad_weight = dw;
    CHECK(flce_scale_gradients(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
    CHECK(flce_scale_gradients(ctx, &p, &t, NULL) == FLCE_OK && devmem_sync() == FLCE_OK);
    devmem_free(dw), devmem_free(g_dev);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    host_rng_seed(&rng, host_announced_seed());
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    RUN(scaled_exactly_and_untouched_by_one);
    RUN(one_costs_no_pass);
    RUN(bad_arguments_are_named);
    flce_context_destroy(ctx);
    FINISH();
}
