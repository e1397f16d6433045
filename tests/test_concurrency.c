/*
 * test_concurrency.c — one flce context shared by several host threads, each with its own
 * stream and its own problem (dtype, shapes, options differ), all running at once; every result
 * is checked against the fp64 reference. Once with a workspace per thread, once with the
 * context's own workspace (the library must order the streams that share it). Then two contexts
 * on two GPUs at once: that case is skipped, and says so, on a machine with one GPU.
 * Exits 77 without a GPU.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "ref.h"

#define THREADS 4
#define ROUNDS 4

typedef struct job {
    int device;
    flce_context *ctx;
    int own_workspace;
    flce_problem p;
    uint64_t seed;
    pthread_barrier_t *start;
    int failures;        /* rounds whose results missed the reference */
    char why[512];
} job;

static void job_problem(job *j, int kind)
{
    flce_problem *p = &j->p;
    flce_problem_init(p);
    switch (kind % THREADS) {
    case 0: p->tokens = 257, p->hidden = 64, p->vocab_shard = 1001, p->dtype = FLCE_DTYPE_BF16; break;
    case 1:
        p->tokens = 500, p->hidden = 128, p->vocab_shard = 3000, p->dtype = FLCE_DTYPE_F16;
        p->reduction = FLCE_REDUCTION_SUM, p->label_smoothing = 0.1f;
        break;
    case 2:
        p->tokens = 129, p->hidden = 40, p->vocab_shard = 777, p->dtype = FLCE_DTYPE_F32;
        p->reduction = FLCE_REDUCTION_NONE, p->z_loss = 1e-3f;
        break;
    default:
        p->tokens = 1000, p->hidden = 96, p->vocab_shard = 2050, p->dtype = FLCE_DTYPE_BF16;
        p->memory_budget = 1 << 20, p->strategy = FLCE_STRATEGY_CHUNKED, p->softcap = 20.f;
        break;
    }
}

static double dev_err(flce_dtype t, const void *dev, const double *ref, int64_t n)
{
    double *got = dalloc(n);
    download_f64(t, dev, got, (size_t)n);
    double e = ref_rel_l2(ref, got, (size_t)n);
    free(got);
    return e;
}

/* One round: fresh data, poisoned outputs, the call on this thread's stream, the reference. */
static int job_round(job *j, void *stream, host_rng *r)
{
    const flce_problem *p = &j->p;
    int64_t n = p->tokens, d = p->hidden, v = p->vocab_shard, nl = p->reduction == FLCE_REDUCTION_NONE ? n : 1;
    double *h = malloc(sizeof(double) * (size_t)(n * d)), *w = malloc(sizeof(double) * (size_t)(v * d));
    double *rl = malloc(sizeof(double) * (size_t)n), *rdh = malloc(sizeof(double) * (size_t)(n * d));
    double *rdw = malloc(sizeof(double) * (size_t)(v * d));
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *l32 = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n * d; i++) h[i] = host_rng_normal(r);
    for (int64_t i = 0; i < v * d; i++) w[i] = 3 * host_rng_normal(r) / sqrt((double)d);
    host_round_to_dtype(p->dtype, h, (size_t)(n * d));
    host_round_to_dtype(p->dtype, w, (size_t)(v * d));
    for (int64_t i = 0; i < n; i++) {
        labels[i] = host_rng_uniform(r) < 0.1 ? -100 : host_rng_below(r, v);
        l32[i] = (int32_t)labels[i];
    }
    size_t es = host_dtype_size(p->dtype);
    void *dl = NULL, *dloss = NULL, *ddh = NULL, *ddw = NULL, *ws = NULL;
    void *dh = upload_dtype(p->dtype, h, n * d), *dw = upload_dtype(p->dtype, w, v * d);
    devmem_alloc(&dl, (size_t)n * 4), devmem_upload(dl, l32, (size_t)n * 4);
    devmem_alloc(&dloss, (size_t)nl * 4), devmem_poison(dloss, (size_t)nl * 4);
    devmem_alloc(&ddh, (size_t)(n * d) * es), devmem_poison(ddh, (size_t)(n * d) * es);
    devmem_alloc(&ddw, (size_t)(v * d) * es), devmem_poison(ddw, (size_t)(v * d) * es);
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = dh, t.weight = dw, t.labels = dl, t.loss = dloss, t.grad_hidden = ddh, t.grad_weight = ddw;
    uint64_t bytes = 0;
    if (j->own_workspace && flce_workspace_size(j->ctx, p, FLCE_OP_LOSS_AND_GRAD, &bytes) == FLCE_OK &&
        devmem_alloc(&ws, bytes) == FLCE_OK)
        t.workspace = ws, t.workspace_bytes = bytes;
    flce_status st = flce_loss_and_grad(j->ctx, p, &t, stream);
    if (st == FLCE_OK) st = flce_check(j->ctx, stream);
    int ok = st == FLCE_OK;
    if (!ok) snprintf(j->why, sizeof j->why, "%s", flce_last_error());
    ref_loss_and_grad(p, NULL, n, d, v, h, w, NULL, labels, NULL, rl, NULL, rdh, rdw, NULL);
    if (ok) {
        float *fl = malloc(sizeof(float) * (size_t)nl);
        double *gl = malloc(sizeof(double) * (size_t)nl);
        devmem_download(fl, dloss, (size_t)nl * 4);
        for (int64_t i = 0; i < nl; i++) gl[i] = fl[i];
        double el = ref_rel_l2(rl, gl, (size_t)nl), eh = dev_err(p->dtype, ddh, rdh, n * d);
        double ew = dev_err(p->dtype, ddw, rdw, v * d), tg = p->dtype == FLCE_DTYPE_F32 ? 1e-4 : 4e-3;
        ok = el <= 1e-5 && eh <= tg && ew <= tg;
        if (!ok)
            snprintf(j->why, sizeof j->why, "%s N=%lld: loss %.2e dH %.2e dW %.2e", host_dtype_name(p->dtype),
                     (long long)n, el, eh, ew);
        free(fl), free(gl);
    }
    devmem_free(dh), devmem_free(dw), devmem_free(dl), devmem_free(dloss), devmem_free(ddh);
    devmem_free(ddw), devmem_free(ws);
    free(h), free(w), free(rl), free(rdh), free(rdw), free(labels), free(l32);
    return ok;
}

static void *job_main(void *arg)
{
    job *j = arg;
    void *stream = NULL;
    host_rng r;
    host_rng_seed(&r, j->seed);
    if (devmem_use(j->device) != FLCE_OK || devmem_stream_create(&stream) != FLCE_OK) {
        j->failures = ROUNDS;
        snprintf(j->why, sizeof j->why, "stream: %s", flce_last_error());
        pthread_barrier_wait(j->start);
        return NULL;
    }
    pthread_barrier_wait(j->start); /* all threads call at once */
    for (int k = 0; k < ROUNDS; k++) j->failures += !job_round(j, stream, &r);
    devmem_stream_destroy(stream);
    return NULL;
}

static uint64_t seed;

/* THREADS jobs at once; jobs[i].ctx and .device set by the caller. */
static void run_jobs(job *jobs, int count, const char *what)
{
    pthread_t th[THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)count);
    for (int i = 0; i < count; i++) {
        jobs[i].start = &start, jobs[i].seed = seed + 1000u * (unsigned)i;
        pthread_create(&th[i], NULL, job_main, &jobs[i]);
    }
    for (int i = 0; i < count; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < count; i++) {
        CHECKF(jobs[i].failures == 0, "%s, thread %d: %d of %d rounds wrong: %s", what, i, jobs[i].failures,
               ROUNDS, jobs[i].why);
    }
}

static void shared_context(int own_workspace, const char *what)
{
    flce_context *ctx = NULL;
    CHECK(flce_context_create(0, &ctx) == FLCE_OK);
    job jobs[THREADS];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < THREADS; i++) {
        jobs[i].ctx = ctx, jobs[i].device = 0, jobs[i].own_workspace = own_workspace;
        job_problem(&jobs[i], i);
    }
    run_jobs(jobs, THREADS, what);
    flce_context_destroy(ctx);
}

static void threads_with_own_streams_and_workspaces_share_a_context(void)
{
    shared_context(1, "own workspaces");
}

static void threads_with_own_streams_share_the_contexts_workspace(void)
{
    shared_context(0, "the context's workspace");
}

static void two_contexts_on_two_gpus_run_at_once(void)
{
    if (!gpu_enough(devmem_gpu_count(), 2)) return;
    flce_context *ctx[2] = {NULL, NULL};
    CHECK(flce_context_create(0, &ctx[0]) == FLCE_OK && flce_context_create(1, &ctx[1]) == FLCE_OK);
    job jobs[2];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < 2; i++) {
        jobs[i].ctx = ctx[i], jobs[i].device = i, jobs[i].own_workspace = i;
        job_problem(&jobs[i], i + 1);
    }
    run_jobs(jobs, 2, "two GPUs");
    printf("     ran on GPUs 0 and 1\n");
    flce_context_destroy(ctx[0]);
    flce_context_destroy(ctx[1]);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    seed = host_announced_seed();
    RUN(threads_with_own_streams_and_workspaces_share_a_context);
    RUN(threads_with_own_streams_share_the_contexts_workspace);
    RUN(two_contexts_on_two_gpus_run_at_once);
    FINISH();
}
