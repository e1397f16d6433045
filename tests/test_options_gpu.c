/* test_options_gpu.c — contexts with settings of their own (issue 42 item 4, flce_context_create_ex):
 * two contexts of one process with different cache directories each compile into their own (and
 * log to their own callback), with the same results; a context with compile_in_call = 0 answers a
 * call whose kernels are not built with FLCE_ERR_NOT_READY, leaving the outputs untouched, until
 * flce_prepare has built them. tests/test_options.c checks the same plumbing without a GPU. Exits
 * 77 without a GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "check.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "jit.h"
#include "tmpdir.h"

enum { N = 256, D = 64, V = 1000 };

static host_rng rng;
static void *h, *w, *labels, *loss, *lse, *dh, *dw;
static flce_problem prob;

static int setup(void)
{
    flce_problem_init(&prob);
    prob.tokens = N, prob.hidden = D, prob.vocab_shard = V, prob.dtype = FLCE_DTYPE_BF16;
    double *hh = dalloc(N * D), *ww = dalloc((int64_t)V * D);
    int32_t *l32 = malloc(sizeof(int32_t) * N);
    for (int64_t k = 0; k < N * D; k++) hh[k] = host_rng_normal(&rng);
    for (int64_t k = 0; k < (int64_t)V * D; k++) ww[k] = 0.25 * host_rng_normal(&rng);
    for (int k = 0; k < N; k++) l32[k] = (int32_t)host_rng_below(&rng, V);
    h = upload_dtype(prob.dtype, hh, N * D), w = upload_dtype(prob.dtype, ww, (int64_t)V * D);
    if (devmem_alloc(&labels, N * 4) == FLCE_OK) devmem_upload(labels, l32, N * 4);
    loss = poisoned(4), lse = poisoned(N * 4), dh = poisoned(N * D * 2), dw = poisoned((size_t)V * D * 2);
    free(hh), free(ww), free(l32);
    return h && w && labels && loss && lse && dh && dw;
}

static flce_tensors tensors(void)
{
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = h, t.weight = w, t.labels = labels, t.loss = loss, t.lse = lse, t.grad_hidden = dh, t.grad_weight = dw;
    return t;
}

/* The loss-and-grad call on poisoned outputs; its loss in *out (bit pattern compared). */
static flce_status call(flce_context *ctx, float *out)
{
    devmem_poison(loss, 4);
    flce_tensors t = tensors();
    flce_status st = flce_loss_and_grad(ctx, &prob, &t, NULL);
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    devmem_download(out, loss, 4);
    return st;
}

static uint64_t entries(const char *dir)
{
    cache_stats st;
    return cache_stat(dir, &st) == FLCE_OK ? st.entries : 0;
}

typedef struct lines {
    pthread_mutex_t lock;
    int compiled, total;
} lines;

static void count_line(void *user, int level, const char *line)
{
    lines *l = user;
    (void)level;
    pthread_mutex_lock(&l->lock);
    l->total++;
    l->compiled += strstr(line, ": compiled in ") != NULL;
    pthread_mutex_unlock(&l->lock);
}

static void two_contexts_compile_into_their_own_directories(void)
{
    char a[TEST_PATH_MAX], b[TEST_PATH_MAX];
    make_tmpdir_named(a, "flce-optgpu-a"), make_tmpdir_named(b, "flce-optgpu-b");
    lines la = {.lock = PTHREAD_MUTEX_INITIALIZER}, lb = {.lock = PTHREAD_MUTEX_INITIALIZER};
    flce_options o;
    flce_options_init(&o);
    o.cache_ro = "", o.log_level = FLCE_LOG_INFO, o.background_compile = 0; /* every kernel in the call */
    flce_context *ca = NULL, *cb = NULL;
    o.cache_dir = a, o.log = count_line, o.log_user = &la;
    CHECKF(flce_context_create_ex(0, &o, &ca) == FLCE_OK, "%s", flce_last_error());
    o.cache_dir = b, o.log_user = &lb;
    CHECKF(flce_context_create_ex(0, &o, &cb) == FLCE_OK, "%s", flce_last_error());
    if (!ca || !cb) goto done;
    float loss_a = 0, loss_b = 0;
    CHECKF(call(ca, &loss_a) == FLCE_OK, "context A: %s", flce_last_error());
    uint64_t in_b = entries(b);
    CHECKF(call(cb, &loss_b) == FLCE_OK, "context B: %s", flce_last_error());
    printf("    A: %llu entries, %d lines (%d compiled); B: %llu entries, %d lines (%d compiled)\n",
           (unsigned long long)entries(a), la.total, la.compiled, (unsigned long long)entries(b), lb.total, lb.compiled);
    CHECKF(in_b == 0, "B's directory had %llu entries after A's call", (unsigned long long)in_b);
    CHECK(entries(a) >= 3 && entries(b) == entries(a));
    CHECK(la.compiled >= 3 && lb.compiled == la.compiled);
    CHECK(!memcmp(&loss_a, &loss_b, sizeof loss_a));
done:
    flce_context_destroy(ca), flce_context_destroy(cb);
    remove_tree(a), remove_tree(b);
}

static void a_context_that_never_compiles_in_a_call_needs_prepare(void)
{
    char c[TEST_PATH_MAX], r[TEST_PATH_MAX];
    make_tmpdir_named(c, "flce-optgpu-c"), make_tmpdir_named(r, "flce-optgpu-ref");
    flce_options o;
    flce_options_init(&o);
    o.cache_dir = r, o.cache_ro = "";
    flce_context *ref = NULL, *ctx = NULL;
    CHECKF(flce_context_create_ex(0, &o, &ref) == FLCE_OK, "%s", flce_last_error());
    o.cache_dir = c, o.compile_in_call = 0, o.background_compile = 1;
    CHECKF(flce_context_create_ex(0, &o, &ctx) == FLCE_OK, "%s", flce_last_error());
    if (!ref || !ctx) goto done;
    float want = 0, got = 0, poison = 0;
    CHECKF(call(ref, &want) == FLCE_OK, "%s", flce_last_error());
    flce_status st = call(ctx, &got);
    devmem_poison(loss, 4);
    devmem_download(&poison, loss, 4);
    CHECKF(st == FLCE_ERR_NOT_READY && strstr(flce_last_error(), "flce_prepare"), "%s: %s", flce_status_name(st),
           flce_last_error());
    CHECK(!memcmp(&got, &poison, sizeof got)); /* nothing ran */
    flce_tensors t = tensors();
    CHECKF(flce_prepare(ctx, &prob, FLCE_OP_LOSS_AND_GRAD, &t) == FLCE_OK, "%s", flce_last_error());
    CHECKF(call(ctx, &got) == FLCE_OK, "after flce_prepare: %s", flce_last_error());
    CHECK(!memcmp(&got, &want, sizeof got));
    CHECK(jit_prefetch_wait(300));
    CHECK(entries(c) >= 3);
done:
    flce_context_destroy(ref), flce_context_destroy(ctx);
    remove_tree(c), remove_tree(r);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    host_rng_seed(&rng, host_announced_seed());
    if (devmem_use(0) != FLCE_OK || !setup()) {
        printf("FAIL: %s\n", flce_last_error());
        return 1;
    }
    RUN(two_contexts_compile_into_their_own_directories);
    RUN(a_context_that_never_compiles_in_a_call_needs_prepare);
    FINISH();
}
