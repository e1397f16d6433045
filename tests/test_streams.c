/* test_streams.c — what a call synchronizes and where its device-side errors go (issue 43):
 *  - calls alternating between two streams with the context's own workspace do not wait for the
 *    device on the host: right after a call on stream B returns, the work queued before it on
 *    stream A is still running (cuStreamQuery), and B's results are right (B waited on the device);
 *  - with tensors.error_flag a bad label is reported in the call's own flag, not by the next call;
 *    without it, the next flce_check reports it as before.
 * Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"

static flce_context *ctx;
static host_rng rng;

typedef struct prob {
    flce_problem p;
    flce_tensors t;
} prob;

static void make(prob *q, int64_t n, int64_t d, int64_t v, int bad_label)
{
    flce_problem_init(&q->p);
    q->p.tokens = n, q->p.hidden = d, q->p.vocab_shard = v;
    double *h = dalloc(n * d), *w = dalloc(v * d);
    for (int64_t i = 0; i < n * d; i++) h[i] = host_rng_normal(&rng);
    for (int64_t i = 0; i < v * d; i++) w[i] = host_rng_normal(&rng) / sqrt((double)d);
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) y[i] = (int32_t)host_rng_below(&rng, v);
    if (bad_label) y[n / 2] = (int32_t)(v + 5);
    void *lab = NULL;
    devmem_alloc(&lab, (size_t)n * 4);
    devmem_upload(lab, y, (size_t)n * 4);
    flce_tensors_init(&q->t);
    q->t.hidden = upload_dtype(FLCE_DTYPE_BF16, h, n * d), q->t.weight = upload_dtype(FLCE_DTYPE_BF16, w, v * d);
    q->t.labels = lab, q->t.loss = poisoned(4), q->t.lse = poisoned((size_t)n * 4);
    q->t.grad_hidden = poisoned((size_t)(n * d) * 2), q->t.grad_weight = poisoned((size_t)(v * d) * 2);
    free(h), free(w), free(y);
}

static void drop(prob *q)
{
    devmem_free((void *)q->t.hidden), devmem_free((void *)q->t.weight), devmem_free((void *)q->t.labels);
    devmem_free(q->t.loss), devmem_free(q->t.lse), devmem_free(q->t.grad_hidden), devmem_free(q->t.grad_weight);
}

static float loss_of(const prob *q)
{
    float l = NAN;
    devmem_download(&l, q->t.loss, 4);
    return l;
}

static void calls_on_two_streams_do_not_wait_on_the_host(void)
{
    void *a = NULL, *b = NULL;
    CHECK(devmem_stream_create(&a) == FLCE_OK && devmem_stream_create(&b) == FLCE_OK);
    prob big, small;
    make(&big, 8192, 4096, 32000, 0);
    make(&small, 512, 256, 4000, 0);
    /* warm: both problems' kernels loaded, the workspace grown to the big one's */
    int ok = flce_loss_and_grad(ctx, &small.p, &small.t, b) == FLCE_OK &&
             flce_loss_and_grad(ctx, &big.p, &big.t, a) == FLCE_OK && devmem_stream_sync(a) == FLCE_OK &&
             devmem_stream_sync(b) == FLCE_OK;
    CHECKF(ok, "warm-up: %s", flce_last_error());
    float want = loss_of(&small);
    devmem_poison(small.t.loss, 4);
    /* ~20 big calls queued on A, then one small call on B: it must return while A still runs */
    for (int r = 0; ok && r < 20; r++) ok = flce_loss_and_grad(ctx, &big.p, &big.t, a) == FLCE_OK;
    ok = ok && flce_loss_and_grad(ctx, &small.p, &small.t, b) == FLCE_OK;
    int a_busy = devmem_stream_busy(a);
    CHECKF(ok, "queued calls: %s", flce_last_error());
    CHECKF(a_busy, "stream A finished before the call on stream B returned: that call waited for the device");
    ok = ok && devmem_stream_sync(a) == FLCE_OK && devmem_stream_sync(b) == FLCE_OK;
    float got = loss_of(&small);
    CHECKF(ok && got == want, "the call on B (after A's work, on the device): loss %g, alone %g", got, want);
    printf("  two streams, context workspace: A busy when B's call returned: %s; B's loss %s\n",
           a_busy ? "yes" : "NO", got == want ? "bitwise as alone" : "DIFFERENT");
    drop(&big), drop(&small);
    devmem_stream_destroy(a), devmem_stream_destroy(b);
}

static void a_bad_label_goes_to_the_calls_own_flag(void)
{
    prob q;
    make(&q, 300, 64, 1000, 1);
    void *flag = NULL;
    devmem_alloc(&flag, 8);
    devmem_zero(flag, 8);
    q.t.error_flag = flag;
    CHECK(flce_loss_and_grad(ctx, &q.p, &q.t, NULL) == FLCE_OK);
    CHECKF(flce_check(ctx, NULL) == FLCE_OK, "the context was told: %s", flce_last_error());
    int f[2] = {0, 0};
    devmem_download(f, flag, 8);
    CHECKF(f[0] == 1 && f[1] == 0, "the call's flag: %d %d (want 1 0)", f[0], f[1]);
    /* without a flag of its own: the next check reports it, as before */
    q.t.error_flag = NULL;
    CHECK(flce_loss_and_grad(ctx, &q.p, &q.t, NULL) == FLCE_OK);
    CHECK(flce_check(ctx, NULL) == FLCE_ERR_BAD_LABEL);
    devmem_free(flag);
    drop(&q);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    host_rng_seed(&rng, host_fresh_seed());
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    RUN(calls_on_two_streams_do_not_wait_on_the_host);
    RUN(a_bad_label_goes_to_the_calls_own_flag);
    flce_context_destroy(ctx);
    FINISH();
}
