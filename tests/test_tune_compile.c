/* test_tune_compile.c — a sample of the autotuner's candidate tiles (tune_candidates) compiles
 * with NVRTC for sm_80 and sm_90a, for each GEMM role: the first (the built-in default, already
 * covered by test_compile), and three spread over the rest of the list. The full lists compile
 * with `flce tune --dry-run --arch ...` (about 8 s for sm_90a's 30 on 4 cores); CI keeps to a
 * sample so it stays within a few minutes on 2 cores. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "compile_pool.h"
#include "jit.h"
#include "tune.h"

enum { MAX_SPECS = 64 };
static kernel_spec specs[MAX_SPECS];
static int n_specs, failures;

static void add_sample(int sm, flce_dtype dtype)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 300, p.hidden = 136, p.vocab_shard = 1001, p.dtype = dtype;
    plan pl;
    if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &pl) != FLCE_OK) {
        failures++;
        return;
    }
    const kernel_spec *base[TUNE_ROLES] = {&pl.logits, &pl.dh, &pl.dw};
    for (int r = 0; r < TUNE_ROLES; r++) {
        spec_tile c[64];
        int n = tune_candidates(sm, dtype, base[r]->role, p.hidden, p.vocab_shard, c, 64);
        int picks[3] = {n / 3, 2 * n / 3, n - 1};
        for (int i = 0; i < 3 && n > 1; i++) {
            if (picks[i] < 1 || (i && picks[i] == picks[i - 1])) continue;
            specs[n_specs] = *base[r];
            /* (the plan's own dW cluster, plan_dw_cluster at short token chunks, is for its TMA
             * tile; a plan of tuned tiles takes none) */
            if (c[picks[i]].loop != MAINLOOP_WGMMA_TMA) specs[n_specs].cluster = 0;
            specs[n_specs++].tile = c[picks[i]];
        }
    }
}

static void compile_sample(int sm, flce_dtype dtype)
{
    n_specs = failures = 0;
    add_sample(sm, dtype);
    failures += compile_pool_run(specs, n_specs);
    CHECKF(n_specs >= 6 && failures == 0, "%d of %d candidates failed", failures, n_specs);
}

static void sampled_candidates_compile_for_sm_80_bf16(void) { compile_sample(80, FLCE_DTYPE_BF16); }
static void sampled_candidates_compile_for_sm_80_f32(void) { compile_sample(80, FLCE_DTYPE_F32); }
static void sampled_candidates_compile_for_sm_90a_bf16(void) { compile_sample(90, FLCE_DTYPE_BF16); }

int main(void)
{
    RUN(sampled_candidates_compile_for_sm_80_bf16);
    RUN(sampled_candidates_compile_for_sm_80_f32);
    RUN(sampled_candidates_compile_for_sm_90a_bf16);
    FINISH();
}
