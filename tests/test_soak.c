/*
 * test_soak.c — one process, one flce context, 4 host threads each with its own stream, calling
 * over and over (issue 15 item 7): 240 recipes (24 kernel families of shape, dtype, reduction and
 * options, × forward / loss-and-grad AUTO / chunked over several chunks / recompute over several
 * vocab chunks / forward then backward, × random token counts), >= 12,000 calls after a warm-up,
 * every result checked on sampled rows against the fp64 reference. Two threads let the context
 * own the workspace (the library orders the streams that share it), two pass their own.
 *
 * After the warm-up (every kernel prepared with flce_prepare, every recipe run once by every
 * thread) the process must be flat: device free memory (cuMemGetInfo), host RSS (/proc/self/statm),
 * open descriptors (/proc/self/fd) and the context's loaded modules (ctx->n_modules, context.h)
 * are sampled after each quarter of the calls, printed, and compared with the warm-up's.
 *
 *   FLCE_SOAK_CALLS=n   calls after the warm-up (default 12000)
 *
 * Label `soak`, kept out of the README's ctest run by CONFIGURATIONS Extra (tests/CMakeLists.txt);
 * bench/device_ci.sh runs it with ctest -C Extra -L soak. Exits 77 without a GPU.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "context.h"
#include "devmem.h"
#include "driver.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "ref.h"

enum { THREADS = 4, SEGMENTS = 4, TOK_SAMPLES = 4, ROW_SAMPLES = 4, MAX_N = 600 };
enum { K_FORWARD, K_AUTO, K_CHUNKED, K_RECOMPUTE, K_BACKWARD, KINDS };
static const char *kind_name[KINDS] = {"forward", "loss_and_grad auto", "chunked", "recompute", "fwd+backward"};

/* Flatness after the warm-up. Device memory: the driver's allocation granularity. Host RSS:
 * malloc's arenas settle within a few MiB; 8 MiB over 12,000 calls flags a leak of ~700 bytes a
 * call, 4 MiB over the second half one of ~700 too. Descriptors and modules: exactly. */
#define DEV_SLACK (2u << 20)
#define RSS_SLACK_KIB (8 * 1024)
#define RSS_HALF_SLACK_KIB (4 * 1024)

static flce_context *ctx;

/* One recipe: a problem and a call kind, its inputs on the device, its reference on sampled rows. */
typedef struct recipe {
    flce_problem p;
    int kind;
    void *d_h, *d_w, *d_labels;
    int64_t tok[TOK_SAMPLES], vrow[ROW_SAMPLES];
    double loss;                               /* mean or sum */
    double tok_loss[TOK_SAMPLES], tok_lse[TOK_SAMPLES];
    double dh[TOK_SAMPLES * 128], dw[ROW_SAMPLES * 128];
    uint64_t seed;
    int ok;           /* reference computed, inputs uploaded */
} recipe;

static recipe *recipes;
static int n_recipes;

static double tol_grad(flce_dtype t) { return t == FLCE_DTYPE_F32 ? 1e-4 : 4e-3; }

/* 2 shapes × 3 dtypes × 2 reductions × 2 option sets = 24 kernel families, × 5 kinds × 2 token
 * counts. The second option set (smoothing, z-loss and softcap) also turns the chunked strategy's
 * compact 16-bit logits off. */
static void make_recipes(uint64_t seed)
{
    static const int64_t shapes[2][2] = {{64, 1000}, {128, 2053}};
    host_rng rng;
    host_rng_seed(&rng, seed);
    n_recipes = 2 * 3 * 2 * 2 * KINDS * 2;
    recipes = calloc((size_t)n_recipes, sizeof *recipes);
    int r = 0;
    for (int s = 0; s < 2; s++)
        for (int dt = 0; dt < 3; dt++)
            for (int red = 0; red < 2; red++)
                for (int opt = 0; opt < 2; opt++)
                    for (int kind = 0; kind < KINDS; kind++)
                        for (int rep = 0; rep < 2; rep++, r++) {
                            recipe *c = &recipes[r];
                            flce_problem *p = &c->p;
                            flce_problem_init(p);
                            p->tokens = 1 + host_rng_below(&rng, MAX_N);
                            p->hidden = shapes[s][0], p->vocab_shard = shapes[s][1];
                            p->dtype = (flce_dtype)dt;
                            p->reduction = red ? FLCE_REDUCTION_NONE : FLCE_REDUCTION_MEAN;
                            if (opt) p->label_smoothing = 0.1f, p->z_loss = 1e-4f, p->softcap = 30.f;
                            c->kind = kind;
                            if (kind == K_CHUNKED) p->strategy = FLCE_STRATEGY_CHUNKED, p->memory_budget = 256 << 10;
                            if (kind == K_RECOMPUTE || kind == K_BACKWARD)
                                p->strategy = FLCE_STRATEGY_RECOMPUTE, p->memory_budget = 256 << 10;
                            c->seed = host_rng_next(&rng);
                        }
}

/* Inputs of recipe i, uploaded, and the fp64 reference of its sampled rows (on host threads:
 * each makes the primary context current for its uploads). */
static void recipe_setup(void *arg, int64_t i)
{
    (void)arg;
    recipe *c = &recipes[i];
    drv.CtxSetCurrent(ctx->primary);
    const flce_problem *p = &c->p;
    int64_t n = p->tokens, d = p->hidden, v = p->vocab_shard, nl = p->reduction == FLCE_REDUCTION_NONE ? n : 1;
    host_rng rng;
    host_rng_seed(&rng, c->seed);
    double *h = dalloc(n * d), *w = dalloc(v * d), *loss = dalloc(nl), *lse = dalloc(n);
    double *dh = dalloc(n * d), *dw = dalloc(v * d);
    int64_t *labels = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *l32 = malloc(sizeof(int32_t) * (size_t)n);
    double sw = 3.0 / sqrt((double)d);
    for (int64_t k = 0; k < n * d; k++) h[k] = host_rng_normal(&rng);
    for (int64_t k = 0; k < v * d; k++) w[k] = sw * host_rng_normal(&rng);
    host_round_to_dtype(p->dtype, h, (size_t)(n * d));
    host_round_to_dtype(p->dtype, w, (size_t)(v * d));
    for (int64_t k = 0; k < n; k++) {
        labels[k] = host_rng_uniform(&rng) < 0.05 ? -100 : host_rng_below(&rng, v);
        l32[k] = (int32_t)labels[k];
    }
    for (int s = 0; s < TOK_SAMPLES; s++) c->tok[s] = s == 0 ? 0 : s == 1 ? n - 1 : host_rng_below(&rng, n);
    for (int s = 0; s < ROW_SAMPLES; s++) c->vrow[s] = s == 0 ? 0 : s == 1 ? v - 1 : host_rng_below(&rng, v);
    c->ok = ref_loss_and_grad(p, NULL, n, d, v, h, w, NULL, labels, NULL, loss, lse, dh, dw, NULL) == 0;
    c->loss = loss[0];
    for (int s = 0; s < TOK_SAMPLES; s++) {
        c->tok_lse[s] = lse[c->tok[s]];
        c->tok_loss[s] = p->reduction == FLCE_REDUCTION_NONE ? loss[c->tok[s]] : 0; /* N = 1 too */
        memcpy(c->dh + s * d, dh + c->tok[s] * d, sizeof(double) * (size_t)d);
    }
    for (int s = 0; s < ROW_SAMPLES; s++) memcpy(c->dw + s * d, dw + c->vrow[s] * d, sizeof(double) * (size_t)d);
    c->d_h = upload_dtype(p->dtype, h, n * d), c->d_w = upload_dtype(p->dtype, w, v * d);
    if (devmem_alloc(&c->d_labels, (size_t)n * 4) == FLCE_OK) devmem_upload(c->d_labels, l32, (size_t)n * 4);
    c->ok = c->ok && c->d_h && c->d_w && c->d_labels;
    free(h), free(w), free(loss), free(lse), free(dh), free(dw), free(labels), free(l32);
}

static int recipes_ready(void)
{
    for (int i = 0; i < n_recipes; i++)
        if (!recipes[i].ok) return 0;
    return 1;
}

/* ---- one thread's calls --------------------------------------------------------------------- */

typedef struct worker {
    int k;
    void *stream;
    host_rng rng;
    void *loss, *lse, *dh, *dw; /* sized for the largest recipe */
    void *ws;                   /* own workspace (threads 2 and 3), else NULL: the context's */
    uint64_t ws_bytes;
    long target, calls, failed;
    int warmup;                 /* run every recipe once, in an order of its own */
    char why[600];
} worker;

static void worker_fail(worker *t, const recipe *c, const char *what)
{
    if (t->failed++ == 0)
        snprintf(t->why, sizeof t->why, "thread %d, N=%lld D=%lld V=%lld %s %s %s: %s", t->k, (long long)c->p.tokens,
                 (long long)c->p.hidden, (long long)c->p.vocab_shard, spec_dtype_name(c->p.dtype),
                 c->p.reduction == FLCE_REDUCTION_NONE ? "none" : "mean", kind_name[c->kind], what);
}

static double rows_err(const recipe *c, const void *dev, const int64_t *rows, const double *ref, int samples)
{
    int64_t d = c->p.hidden;
    double *got = dalloc(samples * d);
    for (int s = 0; s < samples; s++)
        download_f64(c->p.dtype, (const char *)dev + (size_t)(rows[s] * d) * host_dtype_size(c->p.dtype),
                     got + s * d, (size_t)d);
    double e = ref_rel_l2(ref, got, (size_t)(samples * d));
    free(got);
    return e;
}

/* The outputs of recipe c's call against its sampled reference; 1 when they match. */
static int worker_check(worker *t, const recipe *c)
{
    int64_t n = c->p.tokens;
    double *lse = dalloc(n), *loss = dalloc(n), want[TOK_SAMPLES], got[TOK_SAMPLES];
    down_f32(t->lse, lse, n);
    for (int s = 0; s < TOK_SAMPLES; s++) want[s] = c->tok_lse[s], got[s] = lse[c->tok[s]];
    double e_lse = ref_rel_l2(want, got, TOK_SAMPLES), e_loss = 0, e_dh = 0, e_dw = 0;
    if (c->kind != K_BACKWARD) {
        if (c->p.reduction == FLCE_REDUCTION_NONE) {
            down_f32(t->loss, loss, n);
            for (int s = 0; s < TOK_SAMPLES; s++) want[s] = c->tok_loss[s], got[s] = loss[c->tok[s]];
            e_loss = ref_rel_l2(want, got, TOK_SAMPLES);
        } else {
            down_f32(t->loss, loss, 1);
            e_loss = fabs(loss[0] - c->loss) / fmax(fabs(c->loss), 1e-30);
        }
    }
    if (c->kind != K_FORWARD) {
        e_dh = rows_err(c, t->dh, c->tok, c->dh, TOK_SAMPLES);
        e_dw = rows_err(c, t->dw, c->vrow, c->dw, ROW_SAMPLES);
    }
    free(lse), free(loss);
    double tg = tol_grad(c->p.dtype);
    /* written as x <= tol so that a NaN fails */
    int ok = e_lse <= 1e-5 && e_loss <= 1e-5 && e_dh <= tg && e_dw <= tg;
    if (!ok) {
        char what[160];
        snprintf(what, sizeof what, "lse %.2e loss %.2e dH %.2e dW %.2e", e_lse, e_loss, e_dh, e_dw);
        worker_fail(t, c, what);
    }
    return ok;
}

/* Poisons the outputs on the thread's own stream (a legacy-stream memset would not be ordered
 * before the call on a non-blocking stream). */
static flce_status worker_poison(const worker *t, const recipe *c)
{
    size_t es = host_dtype_size(c->p.dtype), n = (size_t)c->p.tokens, d = (size_t)c->p.hidden;
    CUstream s = (CUstream)t->stream;
    DRV_TRY(drv.MemsetD8Async((CUdeviceptr)(uintptr_t)t->loss, 0xFF, n * 4, s));
    DRV_TRY(drv.MemsetD8Async((CUdeviceptr)(uintptr_t)t->lse, 0xFF, n * 4, s));
    DRV_TRY(drv.MemsetD8Async((CUdeviceptr)(uintptr_t)t->dh, 0xFF, n * d * es, s));
    DRV_TRY(drv.MemsetD8Async((CUdeviceptr)(uintptr_t)t->dw, 0xFF, (size_t)c->p.vocab_shard * d * es, s));
    return FLCE_OK;
}

/* One recipe: its call(s) on the thread's stream, then the check. Returns the calls made. */
static int worker_run(worker *t, const recipe *c)
{
    flce_tensors tt;
    flce_tensors_init(&tt);
    tt.hidden = c->d_h, tt.weight = c->d_w, tt.labels = c->d_labels, tt.loss = t->loss, tt.lse = t->lse;
    tt.workspace = t->ws, tt.workspace_bytes = t->ws_bytes;
    if (c->kind != K_FORWARD) tt.grad_hidden = t->dh, tt.grad_weight = t->dw;
    flce_status st = worker_poison(t, c);
    int calls = 1;
    if (st == FLCE_OK && c->kind == K_FORWARD) st = flce_forward(ctx, &c->p, &tt, t->stream);
    else if (st == FLCE_OK && c->kind == K_BACKWARD) {
        flce_problem pf = c->p;
        pf.strategy = FLCE_STRATEGY_AUTO;
        flce_tensors f = tt;
        f.grad_hidden = f.grad_weight = NULL;
        st = flce_forward(ctx, &pf, &f, t->stream);
        if (st == FLCE_OK) st = flce_backward(ctx, &c->p, &tt, t->stream), calls = 2;
    } else if (st == FLCE_OK) st = flce_loss_and_grad(ctx, &c->p, &tt, t->stream);
    if (st == FLCE_OK) st = flce_check(ctx, t->stream);
    if (st != FLCE_OK) worker_fail(t, c, flce_last_error());
    else worker_check(t, c);
    return calls;
}

static void *worker_main(void *arg)
{
    worker *t = arg;
    if (drv.CtxSetCurrent(ctx->primary) != CUDA_SUCCESS) {
        t->failed++, snprintf(t->why, sizeof t->why, "thread %d: cuCtxSetCurrent failed", t->k);
        return NULL;
    }
    if (t->warmup) {
        for (int i = 0; i < n_recipes; i++) t->calls += worker_run(t, &recipes[(i + t->k * n_recipes / THREADS) % n_recipes]);
        return NULL;
    }
    for (long done = 0; done < t->target;) {
        int calls = worker_run(t, &recipes[host_rng_below(&t->rng, n_recipes)]);
        done += calls, t->calls += calls;
    }
    return NULL;
}

/* Runs one segment on THREADS threads: the warm-up pass, or `each` calls per thread. */
static void run_segment(worker *w, int warmup, long each)
{
    pthread_t th[THREADS];
    for (int k = 0; k < THREADS; k++) {
        w[k].warmup = warmup, w[k].target = each;
        if (pthread_create(&th[k], NULL, worker_main, &w[k]) != 0) th[k] = 0, w[k].failed++;
    }
    for (int k = 0; k < THREADS; k++)
        if (th[k]) pthread_join(th[k], NULL);
}

/* ---- what must stay flat -------------------------------------------------------------------- */

typedef struct sample {
    size_t dev_free;
    long rss_kib;
    int fds;
    size_t modules;
} sample;

static long rss_kib(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    fclose(f);
    return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static void take(sample *s, const char *when, const sample *base, long calls)
{
    size_t total = 0;
    devmem_info(&s->dev_free, &total);
    s->rss_kib = rss_kib(), s->fds = fd_count(), s->modules = ctx->n_modules;
    printf("  %-16s %6ld calls  device free %9.1f MiB", when, calls, (double)s->dev_free / (1 << 20));
    if (base) printf(" (%+.1f)", ((double)s->dev_free - (double)base->dev_free) / (1 << 20));
    printf("  RSS %8.1f MiB", (double)s->rss_kib / 1024);
    if (base) printf(" (%+.1f)", (double)(s->rss_kib - base->rss_kib) / 1024);
    printf("  fds %d  modules %zu\n", s->fds, s->modules);
}

/* ---- setup ---------------------------------------------------------------------------------- */

/* flce_prepare for every recipe. On a throwaway context per host thread first: calls on one
 * context are serialized, so that fills the disk cache with 4 prepares compiling at once; then
 * the soak's context loads every kernel from it. */
static flce_status prepare_recipe(flce_context *c, const recipe *r)
{
    if (r->kind == K_FORWARD) return flce_prepare(c, &r->p, FLCE_OP_FORWARD, NULL);
    if (r->kind != K_BACKWARD) return flce_prepare(c, &r->p, FLCE_OP_LOSS_AND_GRAD, NULL);
    flce_problem pf = r->p;
    pf.strategy = FLCE_STRATEGY_AUTO;
    TRY(flce_prepare(c, &pf, FLCE_OP_FORWARD, NULL));
    return flce_prepare(c, &r->p, FLCE_OP_BACKWARD, NULL);
}

typedef struct warm_job {
    int k, failed;
} warm_job;

static void *warm_main(void *arg)
{
    warm_job *j = arg;
    flce_context *c = NULL;
    if (flce_context_create(0, &c) != FLCE_OK) return j->failed = 1, NULL;
    for (int i = j->k; i < n_recipes && !j->failed; i += THREADS)
        if (prepare_recipe(c, &recipes[i]) != FLCE_OK) {
            printf("  prepare %d: %s\n", i, flce_last_error());
            j->failed = 1;
        }
    flce_context_destroy(c);
    return NULL;
}

static int prepare_all(void)
{
    pthread_t th[THREADS];
    warm_job jobs[THREADS];
    int failed = 0;
    for (int k = 0; k < THREADS; k++) {
        jobs[k].k = k, jobs[k].failed = 0;
        if (pthread_create(&th[k], NULL, warm_main, &jobs[k]) != 0) th[k] = 0, jobs[k].failed = 1;
    }
    for (int k = 0; k < THREADS; k++) {
        if (th[k]) pthread_join(th[k], NULL);
        failed |= jobs[k].failed;
    }
    for (int i = 0; i < n_recipes && !failed; i++) failed = prepare_recipe(ctx, &recipes[i]) != FLCE_OK;
    return !failed;
}

static uint64_t op_workspace(const recipe *r)
{
    uint64_t b = 0, f = 0;
    flce_op op = r->kind == K_FORWARD ? FLCE_OP_FORWARD : r->kind == K_BACKWARD ? FLCE_OP_BACKWARD : FLCE_OP_LOSS_AND_GRAD;
    flce_workspace_size(ctx, &r->p, op, &b);
    if (r->kind == K_BACKWARD) {
        flce_problem pf = r->p;
        pf.strategy = FLCE_STRATEGY_AUTO;
        flce_workspace_size(ctx, &pf, FLCE_OP_FORWARD, &f);
    }
    return b > f ? b : f;
}

static int workers_setup(worker *w, uint64_t seed)
{
    size_t max_n = 0, max_nd = 0, max_vd = 0;
    uint64_t ws = 0;
    for (int i = 0; i < n_recipes; i++) {
        const flce_problem *p = &recipes[i].p;
        size_t n = (size_t)p->tokens, nd = n * (size_t)p->hidden, vd = (size_t)(p->vocab_shard * p->hidden);
        max_n = n > max_n ? n : max_n, max_nd = nd > max_nd ? nd : max_nd, max_vd = vd > max_vd ? vd : max_vd;
        uint64_t b = op_workspace(&recipes[i]);
        ws = b > ws ? b : ws;
    }
    int ok = 1;
    for (int k = 0; k < THREADS; k++) {
        memset(&w[k], 0, sizeof w[k]);
        w[k].k = k;
        host_rng_seed(&w[k].rng, seed + 1 + (uint64_t)k);
        ok = ok && devmem_stream_create(&w[k].stream) == FLCE_OK;
        ok = ok && devmem_alloc(&w[k].loss, max_n * 4) == FLCE_OK && devmem_alloc(&w[k].lse, max_n * 4) == FLCE_OK;
        ok = ok && devmem_alloc(&w[k].dh, max_nd * 4) == FLCE_OK && devmem_alloc(&w[k].dw, max_vd * 4) == FLCE_OK;
        if (k >= THREADS / 2) ok = ok && devmem_alloc(&w[k].ws, ws) == FLCE_OK, w[k].ws_bytes = ws;
    }
    return ok;
}

static long soak_calls(void)
{
    const char *v = getenv("FLCE_SOAK_CALLS");
    long n = v && *v ? atol(v) : 12000;
    return n > 0 ? n : 12000;
}

static void soak_stays_right_and_flat(void)
{
    uint64_t seed = host_fresh_seed();
    printf("  seed %llu (FLCE_SEED=%llu reproduces)\n", (unsigned long long)seed, (unsigned long long)seed);
    double t0 = host_now_s();
    make_recipes(seed);
    host_parallel_for(n_recipes, 0, recipe_setup, NULL);
    int ok = recipes_ready();
    CHECKF(ok, "recipes: %s", flce_last_error());
    printf("  %d recipes and their fp64 reference: %.1f s\n", n_recipes, host_now_s() - t0);
    t0 = host_now_s();
    ok = ok && prepare_all();
    CHECKF(ok, "flce_prepare: %s", flce_last_error());
    printf("  every kernel prepared: %zu modules, %.1f s\n", ctx->n_modules, host_now_s() - t0);
    worker w[THREADS];
    ok = ok && workers_setup(w, seed);
    CHECKF(ok, "threads' buffers and streams: %s", flce_last_error());
    if (!ok) return;

    t0 = host_now_s();
    run_segment(w, 1, 0);
    long calls = 0;
    for (int k = 0; k < THREADS; k++) calls += w[k].calls;
    printf("  warm-up: every recipe on every thread, %ld calls, %.1f s\n", calls, host_now_s() - t0);
    sample base, s, half = {0, 0, 0, 0};
    take(&base, "after warm-up", NULL, calls);
    long total = soak_calls(), each = (total + THREADS * SEGMENTS - 1) / (THREADS * SEGMENTS), soaked = 0;
    t0 = host_now_s();
    for (int seg = 1; seg <= SEGMENTS; seg++) {
        long before = 0, after = 0;
        for (int k = 0; k < THREADS; k++) before += w[k].calls;
        run_segment(w, 0, each);
        for (int k = 0; k < THREADS; k++) after += w[k].calls;
        soaked += after - before;
        char when[32];
        snprintf(when, sizeof when, "quarter %d", seg);
        take(&s, when, &base, soaked);
        if (seg == SEGMENTS / 2) half = s;
    }
    double secs = host_now_s() - t0;
    printf("  %ld calls after the warm-up in %.1f s (%.0f calls/s over %d threads)\n", soaked, secs, soaked / secs, THREADS);
    long failed = 0;
    for (int k = 0; k < THREADS; k++) {
        failed += w[k].failed;
        if (w[k].failed) printf("  thread %d: %ld failed calls; the first: %s\n", k, w[k].failed, w[k].why);
    }
    CHECKF(failed == 0, "%ld calls gave wrong results or failed", failed);
    CHECKF(soaked >= 10000, "only %ld calls after the warm-up", soaked);
    CHECKF(base.dev_free <= s.dev_free + DEV_SLACK, "device free memory fell by %.1f MiB",
           ((double)base.dev_free - (double)s.dev_free) / (1 << 20));
    CHECKF(s.rss_kib - base.rss_kib <= RSS_SLACK_KIB && s.rss_kib - half.rss_kib <= RSS_HALF_SLACK_KIB,
           "host RSS grew %ld KiB after the warm-up, %ld KiB in the second half (%.0f bytes a call)",
           s.rss_kib - base.rss_kib, s.rss_kib - half.rss_kib, 1024.0 * (double)(s.rss_kib - base.rss_kib) / soaked);
    CHECKF(s.fds == base.fds, "open descriptors: %d after the warm-up, %d at the end", base.fds, s.fds);
    CHECKF(s.modules == base.modules, "loaded modules: %zu after the warm-up, %zu at the end", base.modules, s.modules);
    for (int k = 0; k < THREADS; k++) {
        devmem_stream_destroy(w[k].stream);
        devmem_free(w[k].loss), devmem_free(w[k].lse), devmem_free(w[k].dh), devmem_free(w[k].dw), devmem_free(w[k].ws);
    }
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    if (flce_context_create(0, &ctx) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    RUN(soak_stays_right_and_flat);
    for (int i = 0; i < n_recipes; i++)
        devmem_free(recipes[i].d_h), devmem_free(recipes[i].d_w), devmem_free(recipes[i].d_labels);
    free(recipes);
    flce_context_destroy(ctx);
    FINISH();
}
