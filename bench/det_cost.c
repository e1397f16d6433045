/*
 * det_cost.c — what problem.deterministic costs (issue 7): loss + both gradients of one bf16
 * problem with deterministic = 0 and = 1, timed alternately with device events (median of many
 * runs after warm-up), and the outputs' bytes compared between the two settings. Today's kernels
 * have no float atomics and reduce in a fixed order whatever the flag says, so the expectation is
 * the same time and the same bits: there is no faster non-deterministic mode.
 *   usage: flce_det_cost [N D V]      (default 4096 4096 32768)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "host.h"

#define RUNS 21

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static unsigned long long fnv(const unsigned char *p, size_t n, unsigned long long h)
{
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* FNV-1a of every output's bytes. */
static unsigned long long outputs_hash(void **bufs, const size_t *bytes, int count)
{
    unsigned long long h = 0xCBF29CE484222325ull;
    for (int i = 0; i < count; i++) {
        unsigned char *tmp = malloc(bytes[i]);
        devmem_download(tmp, bufs[i], bytes[i]);
        h = fnv(tmp, bytes[i], h);
        free(tmp);
    }
    return h;
}

int main(int argc, char **argv)
{
    long long n = argc > 3 ? atoll(argv[1]) : 4096, d = argc > 3 ? atoll(argv[2]) : 4096;
    long long v = argc > 3 ? atoll(argv[3]) : 32768;
    if (devmem_gpu_count() < 1) {
        printf("no GPU: skipped\n");
        return 77;
    }
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        fprintf(stderr, "%s\n", flce_last_error());
        return 1;
    }
    flce_problem p[2];
    for (int k = 0; k < 2; k++) {
        flce_problem_init(&p[k]);
        p[k].tokens = n, p[k].hidden = d, p[k].vocab_shard = v, p[k].dtype = FLCE_DTYPE_BF16;
        p[k].label_smoothing = 0.1f, p[k].deterministic = k;
    }
    host_rng r;
    host_rng_seed(&r, host_fresh_seed());
    size_t nh = (size_t)(n * d), nw = (size_t)(v * d);
    double *tmp = malloc(sizeof(double) * (nh > nw ? nh : nw));
    uint16_t *b16 = malloc(2 * (nh > nw ? nh : nw));
    int32_t *lab = malloc(4 * (size_t)n);
    void *dh_in, *dw_in, *dl, *loss, *lse, *gdh, *gdw, *ws;
    devmem_alloc(&dh_in, 2 * nh), devmem_alloc(&dw_in, 2 * nw), devmem_alloc(&dl, 4 * (size_t)n);
    devmem_alloc(&loss, 4), devmem_alloc(&lse, 4 * (size_t)n), devmem_alloc(&gdh, 2 * nh), devmem_alloc(&gdw, 2 * nw);
    for (size_t i = 0; i < nh; i++) tmp[i] = host_rng_normal(&r);
    host_to_dtype(FLCE_DTYPE_BF16, tmp, b16, nh), devmem_upload(dh_in, b16, 2 * nh);
    for (size_t i = 0; i < nw; i++) tmp[i] = 4.0 / 64 * host_rng_normal(&r);
    host_to_dtype(FLCE_DTYPE_BF16, tmp, b16, nw), devmem_upload(dw_in, b16, 2 * nw);
    for (long long i = 0; i < n; i++) lab[i] = (int32_t)host_rng_below(&r, v);
    devmem_upload(dl, lab, 4 * (size_t)n);
    uint64_t wsb = 0;
    flce_workspace_size(ctx, &p[0], FLCE_OP_LOSS_AND_GRAD, &wsb);
    devmem_alloc(&ws, wsb);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = dh_in, t.weight = dw_in, t.labels = dl, t.loss = loss, t.lse = lse;
    t.grad_hidden = gdh, t.grad_weight = gdw, t.workspace = ws, t.workspace_bytes = wsb;
    void *outs[] = {loss, lse, gdh, gdw};
    size_t bytes[] = {4, 4 * (size_t)n, 2 * nh, 2 * nw};
    unsigned long long hash[2];
    for (int k = 0; k < 2; k++) { /* warm-up (JIT) and the bits of each setting */
        devmem_poison(gdh, 2 * nh), devmem_poison(gdw, 2 * nw);
        for (int w = 0; w < 3; w++)
            if (flce_loss_and_grad(ctx, &p[k], &t, NULL) != FLCE_OK || flce_check(ctx, NULL) != FLCE_OK) {
                fprintf(stderr, "%s\n", flce_last_error());
                return 1;
            }
        hash[k] = outputs_hash(outs, bytes, 4);
    }
    float ms[2][RUNS];
    for (int i = 0; i < RUNS; i++)
        for (int k = 0; k < 2; k++) { /* alternate, so drift hits both alike */
            devmem_timer *tm;
            devmem_timer_start(&tm);
            flce_loss_and_grad(ctx, &p[k], &t, NULL);
            devmem_timer_stop(tm, &ms[k][i]);
        }
    double flops = 6.0 * (double)n * (double)d * (double)v;
    printf("loss_and_grad bf16 N=%lld D=%lld V=%lld (smoothing 0.1), median of %d alternating runs:\n", n, d, v, RUNS);
    for (int k = 0; k < 2; k++) {
        qsort(ms[k], RUNS, sizeof(float), cmp_f);
        printf("  deterministic=%d: median %.3f ms (min %.3f, max %.3f), %.1f TFLOP/s, outputs hash %016llx\n", k,
               ms[k][RUNS / 2], ms[k][0], ms[k][RUNS - 1], flops / ms[k][RUNS / 2] / 1e9, hash[k]);
    }
    printf("  time ratio det=1/det=0: %.4f; outputs %s\n", ms[1][RUNS / 2] / ms[0][RUNS / 2],
           hash[0] == hash[1] ? "bitwise identical" : "DIFFER");
    flce_context_destroy(ctx);
    return hash[0] == hash[1] ? 0 : 1;
}
