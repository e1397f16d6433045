/* test_tiered.c — tiered kernels (issue 16 item 3, runtime/context.c ctx_stand_in): a shape whose
 * compact logits kernel is specialized for whole vocab tiles (full_tiles) but not built yet runs at
 * once on the generic twin already cached, correct against the fp64 reference, while the
 * specialized kernel compiles in the background; the first call after that compile loads it and
 * gives the same bits; a kernel compiled specialized queues its twin, so a later vocabulary of
 * partial tiles compiles nothing. Each case on a fresh cache directory. Exits 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "check.h"
#include "config.h"
#include "context.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "jit.h"
#include "ref.h"
#include "tmpdir.h"

enum { N = 300, D = 64 };

static host_rng rng;

/* One problem's inputs on the device, its outputs, and its fp64 reference. */
typedef struct run_case {
    flce_problem p;
    void *h, *w, *labels, *loss, *lse, *dh, *dw;
    double ref_loss, *ref_lse, *ref_dh, *ref_dw;
} run_case;

static int setup(run_case *c, int64_t v)
{
    memset(c, 0, sizeof *c);
    flce_problem_init(&c->p);
    c->p.tokens = N, c->p.hidden = D, c->p.vocab_shard = v, c->p.dtype = FLCE_DTYPE_BF16;
    c->p.strategy = FLCE_STRATEGY_CHUNKED; /* the compact logits pass: the kernel with a twin */
    double *h = dalloc(N * D), *w = dalloc(v * D), loss = 0;
    int64_t *labels = malloc(sizeof(int64_t) * N);
    int32_t *l32 = malloc(sizeof(int32_t) * N);
    c->ref_lse = dalloc(N), c->ref_dh = dalloc(N * D), c->ref_dw = dalloc(v * D);
    for (int64_t k = 0; k < N * D; k++) h[k] = host_rng_normal(&rng);
    for (int64_t k = 0; k < v * D; k++) w[k] = 2.0 / sqrt((double)D) * host_rng_normal(&rng);
    host_round_to_dtype(c->p.dtype, h, N * D), host_round_to_dtype(c->p.dtype, w, (size_t)(v * D));
    for (int k = 0; k < N; k++) labels[k] = host_rng_below(&rng, v), l32[k] = (int32_t)labels[k];
    int ok = ref_loss_and_grad(&c->p, NULL, N, D, v, h, w, NULL, labels, NULL, &loss, c->ref_lse, c->ref_dh,
                               c->ref_dw, NULL) == 0;
    c->ref_loss = loss;
    c->h = upload_dtype(c->p.dtype, h, N * D), c->w = upload_dtype(c->p.dtype, w, v * D);
    if (devmem_alloc(&c->labels, N * 4) == FLCE_OK) devmem_upload(c->labels, l32, N * 4);
    c->loss = poisoned(4), c->lse = poisoned(N * 4), c->dh = poisoned(N * D * 2), c->dw = poisoned((size_t)(v * D * 2));
    free(h), free(w), free(labels), free(l32);
    return ok && c->h && c->w && c->labels && c->loss && c->lse && c->dh && c->dw;
}

static void release(run_case *c)
{
    void *b[] = {c->h, c->w, c->labels, c->loss, c->lse, c->dh, c->dw};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) devmem_free(b[i]);
    free(c->ref_lse), free(c->ref_dh), free(c->ref_dw);
}

/* The call on poisoned outputs; its outputs' bytes in *bits (malloc'd) and 1 when they match the
 * reference. */
static int call_and_check(flce_context *ctx, run_case *c, unsigned char **bits, size_t *nbits)
{
    int64_t v = c->p.vocab_shard;
    devmem_poison(c->loss, 4), devmem_poison(c->lse, N * 4);
    devmem_poison(c->dh, N * D * 2), devmem_poison(c->dw, (size_t)(v * D * 2));
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = c->h, t.weight = c->w, t.labels = c->labels, t.loss = c->loss, t.lse = c->lse;
    t.grad_hidden = c->dh, t.grad_weight = c->dw;
    flce_status st = flce_loss_and_grad(ctx, &c->p, &t, NULL);
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    CHECKF(st == FLCE_OK, "V=%lld: %s", (long long)v, flce_last_error());
    if (st != FLCE_OK) return 0;
    size_t sizes[4] = {4, N * 4, N * D * 2, (size_t)(v * D * 2)};
    const void *devs[4] = {c->loss, c->lse, c->dh, c->dw};
    *nbits = sizes[0] + sizes[1] + sizes[2] + sizes[3];
    *bits = malloc(*nbits);
    for (size_t i = 0, at = 0; i < 4; at += sizes[i], i++) devmem_download(*bits + at, devs[i], sizes[i]);
    double loss, *lse = dalloc(N), *dh = dalloc(N * D), *dw = dalloc(v * D);
    down_f32(c->loss, &loss, 1), down_f32(c->lse, lse, N);
    download_f64(c->p.dtype, c->dh, dh, N * D), download_f64(c->p.dtype, c->dw, dw, (size_t)(v * D));
    double e_loss = fabs(loss - c->ref_loss) / fabs(c->ref_loss), e_lse = ref_rel_l2(c->ref_lse, lse, N);
    double e_dh = ref_rel_l2(c->ref_dh, dh, N * D), e_dw = ref_rel_l2(c->ref_dw, dw, (size_t)(v * D));
    printf("    V=%lld: loss %.1e lse %.1e dH %.1e dW %.1e\n", (long long)v, e_loss, e_lse, e_dh, e_dw);
    free(lse), free(dh), free(dw);
    return e_loss <= 1e-5 && e_lse <= 1e-5 && e_dh <= 4e-3 && e_dw <= 4e-3;
}

static uint64_t compiles(void)
{
    cache_counters k;
    cache_counters_get(&k);
    return k.compiles;
}

/* A vocabulary of partial tiles builds the generic kernel; then one of whole tiles runs on it at
 * once and swaps in its own kernel when the background compile is done, with the same bits. */
static void whole_tiles_run_on_the_twin_then_swap_in_the_same_bits(void)
{
    char dir[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tiered");
    config_set(CONFIG_CACHE_DIR, dir);
    flce_context *ctx = NULL;
    run_case partial, whole, other;
    CHECK(setup(&partial, 1000) && setup(&whole, 1024) && setup(&other, 768));
    CHECK(flce_context_create(0, &ctx) == FLCE_OK);
    unsigned char *b0 = NULL, *b1 = NULL, *b2 = NULL;
    size_t n0 = 0, n1 = 0, n2 = 0;
    CHECKF(call_and_check(ctx, &partial, &b0, &n0), "V=1000 (partial tiles) against the reference");
    jit_prefetch_wait(300); /* nothing of this call may still be compiling */
    size_t modules = ctx->n_modules;
    uint64_t c0 = compiles();
    CHECKF(call_and_check(ctx, &whole, &b1, &n1), "V=1024 on the generic twin against the reference");
    CHECKF(ctx->n_standins == 1, "%zu stand-ins after the first whole-tile call (want 1)", ctx->n_standins);
    CHECKF(ctx->n_modules == modules, "%zu modules after the stand-in call, %zu before", ctx->n_modules, modules);
    CHECK(jit_prefetch_wait(300));
    CHECKF(compiles() == c0 + 1, "%llu compiles in the background (want 1: the specialized kernel)",
           (unsigned long long)(compiles() - c0));
    CHECKF(call_and_check(ctx, &whole, &b2, &n2), "V=1024 on its own kernel against the reference");
    CHECKF(ctx->n_standins == 0 && ctx->n_modules == modules + 1,
           "after the swap: %zu stand-ins (want 0), %zu modules (want %zu)", ctx->n_standins, ctx->n_modules, modules + 1);
    CHECKF(b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1), "the specialized kernel's outputs differ from the twin's");
    /* another vocabulary of whole tiles finds the specialized kernel loaded: no stand-in, no compile */
    uint64_t c1 = compiles();
    free(b0), b0 = NULL;
    CHECKF(call_and_check(ctx, &other, &b0, &n0), "V=768 against the reference");
    CHECKF(ctx->n_standins == 0 && ctx->n_modules == modules + 1 && compiles() == c1,
           "V=768: %zu stand-ins, %zu modules, %llu compiles", ctx->n_standins, ctx->n_modules,
           (unsigned long long)(compiles() - c1));
    flce_context_destroy(ctx);
    free(b0), free(b1), free(b2);
    release(&partial), release(&whole), release(&other);
    remove_tree(dir);
}

/* A specialized kernel compiled in the foreground queues its twin: the partial-tile vocabulary
 * after it compiles nothing. */
static void a_specialized_compile_queues_its_twin(void)
{
    char dir[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-tiered");
    config_set(CONFIG_CACHE_DIR, dir);
    flce_context *ctx = NULL;
    run_case whole, partial;
    CHECK(setup(&whole, 1024) && setup(&partial, 1000));
    CHECK(flce_context_create(0, &ctx) == FLCE_OK);
    unsigned char *b = NULL;
    size_t nb = 0;
    CHECKF(call_and_check(ctx, &whole, &b, &nb), "V=1024 against the reference");
    CHECKF(ctx->n_standins == 0, "a stand-in with nothing cached");
    CHECK(jit_prefetch_wait(300));
    uint64_t c0 = compiles();
    free(b), b = NULL;
    CHECKF(call_and_check(ctx, &partial, &b, &nb), "V=1000 against the reference");
    CHECKF(compiles() == c0, "V=1000 compiled %llu kernels (want 0: the twin was queued)",
           (unsigned long long)(compiles() - c0));
    flce_context_destroy(ctx);
    free(b);
    release(&whole), release(&partial);
    remove_tree(dir);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    host_rng_seed(&rng, host_announced_seed());
    if (devmem_use(0) != FLCE_OK) {
        printf("FAIL: %s\n", flce_last_error());
        return 1;
    }
    RUN(whole_tiles_run_on_the_twin_then_swap_in_the_same_bits);
    RUN(a_specialized_compile_queues_its_twin);
    FINISH();
}
