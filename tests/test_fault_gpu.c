/*
 * test_fault_gpu.c — GPU failures injected through FLCE_FAULT (runtime/fault.h): cuModuleLoadData
 * failing at each module load of a call, and the workspace's cuMemAlloc failing at each
 * allocation (first allocation, then growth), nth = 1, 2, … until a call passes untouched. Each
 * must give a clean status with a message, keep the context usable (the same call without the
 * fault then gives results that match the fp64 reference) and leak nothing: no half-registered
 * module, no workspace, and device memory back to what it was before the context (cuMemGetInfo).
 * The workspace is the library's only device allocation in a call (context.c, ctx_workspace), so
 * "every allocation" is every workspace allocation of a sequence of calls: the chunked strategy
 * over many token chunks and the recompute strategy over many vocab chunks (issue 15 item 5), each
 * failure naming the bytes it needed. A caller's workspace one byte short is refused by name.
 * The other device resources (FLCE_FAULT=device_resource: the context's host-mapped error flag, the
 * workspace's event, the streams and events dW and dH run on side by side): each failure a clean
 * status, the context still usable and right.
 *
 * fault.c counts calls per process from the moment FLCE_FAULT takes a value, so every nth runs in
 * a child process of its own (as tests/test_fault.c does); the parent never touches CUDA, so the
 * children may. Exits 77 without a GPU (tests/gpu_ready.h).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_data.h"
#include "check.h"
#include "config.h"
#include "context.h"
#include "devmem.h"
#include "error.h"
#include "gpu_ready.h"
#include "host.h"
#include "ref.h"
#include "shard.h"

/* Child exit codes: the fault fired and everything held; no call reached the nth point. */
enum { CHILD_FAULTED = 0, CHILD_FAILED = 1, CHILD_NOT_REACHED = 3 };
/* Allocation granularity of the driver: memory compares may differ by this much. */
#define MEM_SLACK (4u << 20)

/* One problem on the device with its fp64 reference. */
typedef struct prob {
    flce_problem p;
    double *h, *w, *ref_loss, *ref_dh, *ref_dw;
    int64_t *labels;
    void *d_h, *d_w, *d_labels, *d_loss, *d_dh, *d_dw;
} prob;

static int prob_setup(prob *q, int64_t n, int64_t d, int64_t v, uint64_t budget, int with_ref, uint64_t seed)
{
    memset(q, 0, sizeof *q);
    flce_problem_init(&q->p);
    q->p.tokens = n, q->p.hidden = d, q->p.vocab_shard = v, q->p.dtype = FLCE_DTYPE_BF16;
    q->p.strategy = FLCE_STRATEGY_CHUNKED, q->p.memory_budget = budget;
    host_rng r;
    host_rng_seed(&r, seed);
    q->h = malloc(sizeof(double) * (size_t)(n * d)), q->w = malloc(sizeof(double) * (size_t)(v * d));
    q->labels = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n * d; i++) q->h[i] = host_rng_normal(&r);
    for (int64_t i = 0; i < v * d; i++) q->w[i] = 3 * host_rng_normal(&r) / sqrt((double)d);
    for (int64_t i = 0; i < n; i++) q->labels[i] = host_rng_uniform(&r) < 0.1 ? -100 : host_rng_below(&r, v);
    host_round_to_dtype(FLCE_DTYPE_BF16, q->h, (size_t)(n * d));
    host_round_to_dtype(FLCE_DTYPE_BF16, q->w, (size_t)(v * d));
    if (with_ref) {
        q->ref_loss = malloc(sizeof(double)), q->ref_dh = malloc(sizeof(double) * (size_t)(n * d));
        q->ref_dw = malloc(sizeof(double) * (size_t)(v * d));
        ref_loss_and_grad(&q->p, NULL, n, d, v, q->h, q->w, NULL, q->labels, NULL, q->ref_loss, NULL,
                          q->ref_dh, q->ref_dw, NULL);
    }
    uint16_t *tmp = malloc(2 * (size_t)((n > v ? n : v) * d));
    int32_t *l32 = malloc(4 * (size_t)n);
    for (int64_t i = 0; i < n; i++) l32[i] = (int32_t)q->labels[i];
    int ok = devmem_alloc(&q->d_h, 2 * (size_t)(n * d)) == FLCE_OK &&
             devmem_alloc(&q->d_w, 2 * (size_t)(v * d)) == FLCE_OK &&
             devmem_alloc(&q->d_labels, 4 * (size_t)n) == FLCE_OK && devmem_alloc(&q->d_loss, 4) == FLCE_OK &&
             devmem_alloc(&q->d_dh, 2 * (size_t)(n * d)) == FLCE_OK &&
             devmem_alloc(&q->d_dw, 2 * (size_t)(v * d)) == FLCE_OK;
    host_to_dtype(FLCE_DTYPE_BF16, q->h, tmp, (size_t)(n * d));
    ok = ok && devmem_upload(q->d_h, tmp, 2 * (size_t)(n * d)) == FLCE_OK;
    host_to_dtype(FLCE_DTYPE_BF16, q->w, tmp, (size_t)(v * d));
    ok = ok && devmem_upload(q->d_w, tmp, 2 * (size_t)(v * d)) == FLCE_OK;
    ok = ok && devmem_upload(q->d_labels, l32, 4 * (size_t)n) == FLCE_OK;
    free(tmp), free(l32);
    return ok;
}

static void prob_free(prob *q)
{
    devmem_free(q->d_h), devmem_free(q->d_w), devmem_free(q->d_labels), devmem_free(q->d_loss);
    devmem_free(q->d_dh), devmem_free(q->d_dw);
    free(q->h), free(q->w), free(q->labels), free(q->ref_loss), free(q->ref_dh), free(q->ref_dw);
}

static flce_status prob_run(flce_context *ctx, prob *q)
{
    devmem_poison(q->d_loss, 4);
    devmem_poison(q->d_dh, 2 * (size_t)(q->p.tokens * q->p.hidden));
    devmem_poison(q->d_dw, 2 * (size_t)(q->p.vocab_shard * q->p.hidden));
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = q->d_h, t.weight = q->d_w, t.labels = q->d_labels, t.loss = q->d_loss;
    t.grad_hidden = q->d_dh, t.grad_weight = q->d_dw;
    flce_status st = flce_loss_and_grad(ctx, &q->p, &t, NULL);
    return st == FLCE_OK ? flce_check(ctx, NULL) : st;
}

static double rel_err_bf16(const void *dev, const double *ref, size_t n)
{
    uint16_t *tmp = malloc(2 * n);
    double *got = malloc(sizeof(double) * n);
    devmem_download(tmp, dev, 2 * n);
    host_from_dtype(FLCE_DTYPE_BF16, tmp, got, n);
    double e = ref_rel_l2(ref, got, n);
    free(tmp), free(got);
    return e;
}

/* Loss and both gradients of a problem with a reference, against it (docs/DESIGN.md §8.2 bf16 tolerances). */
static int prob_correct(prob *q)
{
    float loss = NAN;
    devmem_download(&loss, q->d_loss, 4);
    double el = fabs(loss - q->ref_loss[0]) / fabs(q->ref_loss[0]);
    double eh = rel_err_bf16(q->d_dh, q->ref_dh, (size_t)(q->p.tokens * q->p.hidden));
    double ew = rel_err_bf16(q->d_dw, q->ref_dw, (size_t)(q->p.vocab_shard * q->p.hidden));
    int ok = el <= 1e-5 && eh <= 4e-3 && ew <= 4e-3;
    if (!ok) fprintf(stderr, "    wrong results: loss %.2e dH %.2e dW %.2e\n", el, eh, ew);
    return ok;
}

static size_t free_mem(void)
{
    size_t f = 0, t = 0;
    devmem_info(&f, &t);
    return f;
}

static int mem_back(size_t before, size_t after, const char *when)
{
    long long diff = (long long)before - (long long)after;
    printf("    device memory %s: %+lld bytes against the start\n", when, -diff);
    return diff <= (long long)MEM_SLACK;
}

/* Loads every kernel once in a throwaway context, so the local-memory reservation and the disk
 * cache are settled before memory is compared. */
static int warm_up(prob *a, prob *b)
{
    flce_context *ctx = NULL;
    int ok = flce_context_create(0, &ctx) == FLCE_OK && prob_run(ctx, a) == FLCE_OK && prob_run(ctx, b) == FLCE_OK;
    flce_context_destroy(ctx);
    return ok;
}

/* The child of one nth: problem A (small, with reference) then B (bigger: grows the workspace). */
static int child_case(const char *point, int nth)
{
    if (devmem_use(0) != FLCE_OK) return CHILD_FAILED;
    prob a, b;
    if (!prob_setup(&a, 300, 64, 999, 0, 1, 11) || !prob_setup(&b, 4096, 64, 4096, 64u << 20, 0, 12))
        return CHILD_FAILED;
    if (!warm_up(&a, &b)) {
        fprintf(stderr, "    warm-up: %s\n", flce_last_error());
        return CHILD_FAILED;
    }
    size_t before = free_mem();
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK) return CHILD_FAILED;
    char setting[64];
    snprintf(setting, sizeof setting, "%s:%d", point, nth);
    config_set(CONFIG_FAULT, setting);
    int failed_at = 0, bad = 0;
    prob *seq[2] = {&a, &b};
    for (int c = 0; c < 2 && !bad; c++) {
        size_t modules = ctx->n_modules;
        flce_status st = prob_run(ctx, seq[c]);
        if (st == FLCE_OK) continue;
        failed_at = c + 1;
        const char *msg = flce_last_error();
        int module = !strcmp(point, "module_load");
        flce_status want = module ? FLCE_ERR_CUDA : FLCE_ERR_OUT_OF_MEMORY;
        const char *words = module ? "loading a compiled kernel module" : "workspace";
        printf("    %s, call %d: %s: %s\n", setting, c + 1, flce_status_name(st), msg);
        if (st != want || !strstr(msg, words)) bad = 1, fprintf(stderr, "    expected %s with '%s'\n", flce_status_name(want), words);
        /* Nothing half-done stays behind: modules loaded before the failure are kept (and
         * unloaded by destroy), the failed one is not registered; a failed growth keeps none. */
        if (module && ctx->n_modules != (size_t)(nth - 1))
            bad = 1, fprintf(stderr, "    %zu modules registered after the failed load %d (had %zu)\n",
                             ctx->n_modules, nth, modules);
        if (!module && (ctx->workspace != 0 || ctx->workspace_bytes != 0))
            bad = 1, fprintf(stderr, "    the context kept a workspace after a failed allocation\n");
        /* the same call without the fault: the context must still work */
        config_set(CONFIG_FAULT, NULL);
        st = prob_run(ctx, seq[c]);
        if (st != FLCE_OK) bad = 1, fprintf(stderr, "    retry without the fault: %s\n", flce_last_error());
        config_set(CONFIG_FAULT, setting);
    }
    config_set(CONFIG_FAULT, NULL);
    /* and problem A from scratch, against the reference */
    if (!bad && (prob_run(ctx, &a) != FLCE_OK || !prob_correct(&a))) bad = 1;
    flce_context_destroy(ctx);
    if (!mem_back(before, free_mem(), "after destroy")) bad = 1;
    prob_free(&a), prob_free(&b);
    if (bad) return CHILD_FAILED;
    return failed_at ? CHILD_FAULTED : CHILD_NOT_REACHED;
}

/* fn(point, nth) in a child process of its own (fault.c counts per process); its exit code. */
static int run_child(int (*fn)(const char *, int), const char *point, int nth)
{
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = fn(point, nth);
        fflush(stdout), fflush(stderr);
        _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : CHILD_FAILED;
}

/* nth = 1, 2, … : each fails cleanly until one passes untouched. */
static void fault_each_nth(int (*fn)(const char *, int), const char *point, int min_faults)
{
    int faults = 0, done = 0;
    for (int nth = 1; nth <= 12 && !done; nth++) {
        int rc = run_child(fn, point, nth);
        CHECKF(rc == CHILD_FAULTED || rc == CHILD_NOT_REACHED, "%s:%d: child exit %d", point, nth, rc);
        if (rc == CHILD_FAULTED) faults++;
        if (rc != CHILD_FAULTED) done = 1;
    }
    printf("    %s: %d injected failure point(s), each clean, then a run untouched\n", point, faults);
    CHECKF(done && faults >= min_faults, "%s: %d faults, done %d", point, faults, done);
}

static void fault_at_each_point(const char *point, int min_faults) { fault_each_nth(child_case, point, min_faults); }

/* Two calls load 4 modules each time a new problem class appears (logits, dH, dW, rowops). */
static void module_load_failure_at_each_load_is_clean(void) { fault_at_each_point("module_load", 4); }
/* The workspace: the first call allocates it, the second grows it. */
static void device_alloc_failure_at_each_allocation_is_clean(void) { fault_at_each_point("device_alloc", 2); }

/* ---- the chunked and recompute strategies, many chunks each (issue 15 item 5) ---------------- */

enum { STRAT_SAMPLES = 16 };

static const char *strat_name(flce_strategy s) { return s == FLCE_STRATEGY_CHUNKED ? "chunked" : "recompute"; }

/* 2048 tokens × 4096 vocab × 64 hidden at a 1 MiB budget: 16 token chunks of 2-byte logits
 * (chunked, with its fp32 dW accumulator) or 16 vocab chunks of dZ (recompute, with its fp32 dH
 * accumulator). */
static int strat_setup(bench_data *d, flce_strategy s, uint64_t seed)
{
    memset(d, 0, sizeof *d);
    flce_problem_init(&d->p);
    d->p.tokens = 2048, d->p.hidden = 64, d->p.vocab_shard = 4096, d->p.dtype = FLCE_DTYPE_BF16;
    d->p.strategy = s, d->p.memory_budget = 1u << 20;
    return bench_data_fill(d, seed, 3.0) && bench_data_upload(d) == FLCE_OK;
}

/* One loss-and-grad call with every output poisoned first; ws NULL lets the context allocate. */
static flce_status strat_run(flce_context *ctx, const bench_data *d, void *ws, uint64_t ws_bytes)
{
    TRY(bench_data_poison_outputs(d));
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = d->d_h, t.weight = d->d_w, t.labels = d->d_labels, t.loss = d->d_loss, t.lse = d->d_lse;
    t.grad_hidden = d->d_dh, t.grad_weight = d->d_dw, t.loss_per_token = d->d_loss_rows;
    t.workspace = ws, t.workspace_bytes = ws_bytes;
    TRY(flce_loss_and_grad(ctx, &d->p, &t, NULL));
    return flce_check(ctx, NULL);
}

/* The workspace this exact call needs (its outputs can make it less than flce_workspace_size, the
 * bound for a call asking every output): the refusal of a 256-byte workspace names it. 0 when the
 * refusal did not come or did not say. */
static uint64_t strat_need(flce_context *ctx, const bench_data *d)
{
    void *ws = NULL;
    if (devmem_alloc(&ws, 256) != FLCE_OK) return 0;
    flce_status st = strat_run(ctx, d, ws, 256);
    devmem_free(ws);
    const char *at = strstr(flce_last_error(), "needs ");
    if (st != FLCE_ERR_INVALID_ARGUMENT || !at) return 0;
    return strtoull(at + 6, NULL, 10);
}

/* The outputs of the last strat_run against the fp64 reference of sampled rows (bench_data.h). */
static int strat_correct(const bench_data *d)
{
    host_rng rng;
    host_rng_seed(&rng, 77);
    bench_ref r;
    float *lse = malloc((size_t)d->p.tokens * 4);
    if (!lse || !bench_ref_tokens(&r, d, &rng, STRAT_SAMPLES)) {
        free(lse);
        fprintf(stderr, "    the reference: out of host memory\n");
        return 0;
    }
    devmem_download(lse, d->d_lse, (size_t)d->p.tokens * 4);
    bench_ref_vocab(&r, d, &rng, lse);
    bench_errors e;
    bench_ref_compare(&r, d, 1, &e);
    bench_ref_free(&r);
    free(lse);
    /* written as x < tol so that a NaN fails */
    int ok = e.mean < 1e-5 && e.lse < 1e-5 && e.loss_row < 1e-4 && e.dh < 4e-3 && e.dw < 4e-3;
    if (!ok)
        fprintf(stderr, "    %s: wrong results: mean %.2e lse %.2e loss rows %.2e dH %.2e dW %.2e\n",
                strat_name(d->p.strategy), e.mean, e.lse, e.loss_row, e.dh, e.dw);
    return ok;
}

/* A failed call at nth: FLCE_ERR_OUT_OF_MEMORY naming the workspace and its bytes, no workspace
 * kept; then the same call without the fault works and is right. 1 when all of that held. */
static int strat_failure_clean(flce_context *ctx, const bench_data *d, flce_status st, uint64_t need,
                               const char *setting)
{
    char bytes[48];
    snprintf(bytes, sizeof bytes, "%llu bytes", (unsigned long long)need);
    const char *msg = flce_last_error();
    printf("    %s, %s call: %s: %s\n", setting, strat_name(d->p.strategy), flce_status_name(st), msg);
    int ok = 1;
    if (st != FLCE_ERR_OUT_OF_MEMORY || !strstr(msg, "workspace") || !strstr(msg, bytes))
        ok = 0, fprintf(stderr, "    expected %s naming the workspace and '%s'\n",
                        flce_status_name(FLCE_ERR_OUT_OF_MEMORY), bytes);
    if (ctx->workspace != 0 || ctx->workspace_bytes != 0)
        ok = 0, fprintf(stderr, "    the context kept a workspace after a failed allocation\n");
    config_set(CONFIG_FAULT, NULL);
    st = strat_run(ctx, d, NULL, 0);
    if (st != FLCE_OK) ok = 0, fprintf(stderr, "    retry without the fault: %s\n", flce_last_error());
    if (st == FLCE_OK && !strat_correct(d)) ok = 0;
    config_set(CONFIG_FAULT, setting);
    return ok;
}

/* The child of one nth: the two strategies on one context, in the order their workspaces grow,
 * under FLCE_FAULT=<point>:<nth>; then both again against the reference, and device memory back
 * to where it was once the context is gone. */
static int child_strategies(const char *point, int nth)
{
    if (devmem_use(0) != FLCE_OK) return CHILD_FAILED;
    bench_data c, r;
    if (!strat_setup(&c, FLCE_STRATEGY_CHUNKED, 21) || !strat_setup(&r, FLCE_STRATEGY_RECOMPUTE, 22))
        return CHILD_FAILED;
    flce_context *ctx = NULL;
    /* kernels loaded once in a throwaway context, so the memory compare sees only this one */
    int ok = flce_context_create(0, &ctx) == FLCE_OK && strat_run(ctx, &c, NULL, 0) == FLCE_OK &&
             strat_run(ctx, &r, NULL, 0) == FLCE_OK;
    flce_context_destroy(ctx), ctx = NULL;
    if (!ok) {
        fprintf(stderr, "    warm-up: %s\n", flce_last_error());
        return CHILD_FAILED;
    }
    size_t before = free_mem();
    if (flce_context_create(0, &ctx) != FLCE_OK) return CHILD_FAILED;
    bench_data *seq[2] = {&c, &r};
    uint64_t need[2] = {0, 0}, bound = 0;
    for (int i = 0; i < 2; i++) {
        need[i] = strat_need(ctx, seq[i]);
        if (!need[i] || flce_workspace_size(ctx, &seq[i]->p, FLCE_OP_LOSS_AND_GRAD, &bound) != FLCE_OK ||
            need[i] > bound) {
            fprintf(stderr, "    %s: the call's workspace (%llu bytes) is unknown or above flce_workspace_size "
                    "(%llu)\n", strat_name(seq[i]->p.strategy), (unsigned long long)need[i], (unsigned long long)bound);
            return CHILD_FAILED;
        }
    }
    if (need[1] < need[0]) {
        bench_data *t = seq[0];
        uint64_t n = need[0];
        seq[0] = seq[1], seq[1] = t, need[0] = need[1], need[1] = n;
    }
    if (nth == 1)
        printf("    workspaces: %s %llu bytes, then %s %llu bytes (%s)\n", strat_name(seq[0]->p.strategy),
               (unsigned long long)need[0], strat_name(seq[1]->p.strategy), (unsigned long long)need[1],
               need[1] > need[0] ? "two allocations" : "one allocation");
    char setting[64];
    snprintf(setting, sizeof setting, "%s:%d", point, nth);
    config_set(CONFIG_FAULT, setting);
    int failed_at = 0, bad = 0;
    for (int i = 0; i < 2 && !bad; i++) {
        flce_status st = strat_run(ctx, seq[i], NULL, 0);
        if (st == FLCE_OK) continue;
        failed_at = i + 1;
        bad = !strat_failure_clean(ctx, seq[i], st, need[i], setting);
    }
    config_set(CONFIG_FAULT, NULL);
    for (int i = 0; i < 2 && !bad; i++)
        if (strat_run(ctx, seq[i], NULL, 0) != FLCE_OK || !strat_correct(seq[i])) bad = 1;
    flce_context_destroy(ctx);
    if (!mem_back(before, free_mem(), "after destroy")) bad = 1;
    bench_data_free(&c), bench_data_free(&r);
    if (bad) return CHILD_FAILED;
    return failed_at ? CHILD_FAULTED : CHILD_NOT_REACHED;
}

/* A caller's workspace one byte short of what the call needs (at most flce_workspace_size, the bound
 * for every output): refused before anything runs, the message naming both sizes; the exact size
 * then works, with no workspace of the context's own. */
static int child_short_workspace(const char *unused, int strategy)
{
    (void)unused;
    if (devmem_use(0) != FLCE_OK) return CHILD_FAILED;
    bench_data d;
    flce_context *ctx = NULL;
    uint64_t need = 0;
    void *ws = NULL;
    uint64_t bound = 0;
    if (!strat_setup(&d, (flce_strategy)strategy, 23) || flce_context_create(0, &ctx) != FLCE_OK ||
        flce_workspace_size(ctx, &d.p, FLCE_OP_LOSS_AND_GRAD, &bound) != FLCE_OK || !(need = strat_need(ctx, &d)) ||
        need > bound || devmem_alloc(&ws, need) != FLCE_OK) {
        fprintf(stderr, "    %s: the call's workspace (%llu bytes) is unknown or above flce_workspace_size (%llu)\n",
                strat_name(d.p.strategy), (unsigned long long)need, (unsigned long long)bound);
        return CHILD_FAILED;
    }
    int bad = 0;
    flce_status st = strat_run(ctx, &d, ws, need - 1);
    const char *msg = flce_last_error(), *at;
    char given[64], needed[32];
    snprintf(given, sizeof given, "workspace_bytes=%llu", (unsigned long long)(need - 1));
    snprintf(needed, sizeof needed, "%llu", (unsigned long long)need);
    printf("    %s, a workspace of %llu bytes: %s: %s\n", strat_name(d.p.strategy),
           (unsigned long long)(need - 1), flce_status_name(st), msg);
    if (st != FLCE_ERR_INVALID_ARGUMENT || !(at = strstr(msg, given)) || !strstr(at + strlen(given), needed))
        bad = 1, fprintf(stderr, "    expected %s naming '%s' and %s\n",
                         flce_status_name(FLCE_ERR_INVALID_ARGUMENT), given, needed);
    float loss = 0;
    devmem_download(&loss, d.d_loss, 4);
    if (!isnan(loss)) bad = 1, fprintf(stderr, "    the refused call wrote the loss (%g)\n", loss);
    st = strat_run(ctx, &d, ws, need);
    if (st != FLCE_OK) bad = 1, fprintf(stderr, "    with %llu bytes: %s\n", (unsigned long long)need, flce_last_error());
    if (st == FLCE_OK && !strat_correct(&d)) bad = 1;
    if (ctx->workspace != 0) bad = 1, fprintf(stderr, "    the context allocated a workspace of its own\n");
    flce_context_destroy(ctx);
    devmem_free(ws);
    bench_data_free(&d);
    return bad ? CHILD_FAILED : CHILD_FAULTED;
}

/* Chunked over 16 token chunks and recompute over 16 vocab chunks: at least the first call's
 * allocation, and the second's when its workspace is larger. */
static void device_alloc_failure_in_chunked_and_recompute_is_clean(void)
{
    fault_each_nth(child_strategies, "device_alloc", 1);
}

/* FLCE_FAULT=device_resource:nth set before the context is made: the host-mapped error flag at
 * creation (FLCE_ERR_OUT_OF_MEMORY naming it, no context), then the resources the first calls make
 * (the workspace's event before any work; the streams dW and dH run on, where the plan runs them side
 * by side); each failed call retried without the fault must work and match the reference. */
static int child_resources(const char *point, int nth)
{
    if (devmem_use(0) != FLCE_OK) return CHILD_FAILED;
    bench_data c;
    if (!strat_setup(&c, FLCE_STRATEGY_CHUNKED, 24)) return CHILD_FAILED;
    char setting[64];
    snprintf(setting, sizeof setting, "%s:%d", point, nth);
    config_set(CONFIG_FAULT, setting);
    int failed_at = 0, bad = 0;
    flce_context *ctx = NULL;
    flce_status st = flce_context_create(0, &ctx);
    if (st != FLCE_OK) {
        failed_at = 1;
        const char *msg = flce_last_error();
        printf("    %s, context creation: %s: %s\n", setting, flce_status_name(st), msg);
        if (st != FLCE_ERR_OUT_OF_MEMORY || !strstr(msg, "error flag") || ctx != NULL)
            bad = 1, fprintf(stderr, "    expected %s naming the error flag, and no context\n",
                             flce_status_name(FLCE_ERR_OUT_OF_MEMORY));
        config_set(CONFIG_FAULT, NULL);
        ctx = NULL;
        if (flce_context_create(0, &ctx) != FLCE_OK) {
            fprintf(stderr, "    a context without the fault: %s\n", flce_last_error());
            return CHILD_FAILED;
        }
        config_set(CONFIG_FAULT, setting);
    }
    for (int k = 0; k < 2 && !bad; k++) { /* the first call makes the resources, the second reuses them */
        st = strat_run(ctx, &c, NULL, 0);
        if (st == FLCE_OK) continue;
        failed_at = 2 + k;
        const char *msg = flce_last_error();
        printf("    %s, call %d: %s: %s\n", setting, k + 1, flce_status_name(st), msg);
        if (st != FLCE_ERR_OUT_OF_MEMORY || !*msg)
            bad = 1, fprintf(stderr, "    expected %s with a message\n", flce_status_name(FLCE_ERR_OUT_OF_MEMORY));
        config_set(CONFIG_FAULT, NULL);
        st = strat_run(ctx, &c, NULL, 0);
        if (st != FLCE_OK) bad = 1, fprintf(stderr, "    retry without the fault: %s\n", flce_last_error());
        if (st == FLCE_OK && !strat_correct(&c)) bad = 1;
        config_set(CONFIG_FAULT, setting);
    }
    config_set(CONFIG_FAULT, NULL);
    if (!bad && (strat_run(ctx, &c, NULL, 0) != FLCE_OK || !strat_correct(&c))) bad = 1;
    flce_context_destroy(ctx);
    bench_data_free(&c);
    if (bad) return CHILD_FAILED;
    return failed_at ? CHILD_FAULTED : CHILD_NOT_REACHED;
}

/* At least the error flag and the workspace's event (more where dW runs beside dH). */
static void device_resource_failures_are_clean(void) { fault_each_nth(child_resources, "device_resource", 2); }

static void caller_workspace_one_byte_short_is_refused(void)
{
    flce_strategy s[] = {FLCE_STRATEGY_CHUNKED, FLCE_STRATEGY_RECOMPUTE};
    for (int i = 0; i < 2; i++) {
        int rc = run_child(child_short_workspace, "", (int)s[i]);
        CHECKF(rc == CHILD_FAULTED, "%s: child exit %d", strat_name(s[i]), rc);
    }
}


int main(void)
{
    /* The parent must not initialize CUDA before forking: the check runs in a child too. */
    int rc = shard_gpu_check(1);
    if (rc != 0) return rc;
    RUN(module_load_failure_at_each_load_is_clean);
    RUN(device_alloc_failure_at_each_allocation_is_clean);
    RUN(device_alloc_failure_in_chunked_and_recompute_is_clean);
    RUN(caller_workspace_one_byte_short_is_refused);
    RUN(device_resource_failures_are_clean);
    FINISH();
}
