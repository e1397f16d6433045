/* cmd_demo.c — `flce demo`: the main job. With a GPU: loss and gradients of a realistic output
 * layer on random data, checked against the fp64 reference on sampled rows, timed, with TFLOP/s
 * and extra device memory. Without one: generates and compiles the kernels for an arch, twice, to
 * show the disk cache, and says that no GPU was found. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_data.h"
#include "cmd_gen.h"
#include "devmem.h"
#include "host.h"
#include "tool_api.h"

#define DEMO_SAMPLES 8

/* Without a GPU: the kernels the GPU demo would run, compiled twice (NVRTC, then the disk cache).
 * Returns 0 after the one-line message (the demo's CPU half is done: the README's first command
 * must succeed on a machine without a GPU), or TOOL_EXIT_FAILED when a compile fails. */
static int demo_compile_only(const tool_opts *o)
{
    char why[512];
    snprintf(why, sizeof why, "%s", flce_last_error()[0] ? flce_last_error() : "no CUDA device");
    printf("flce demo: no GPU found: generating and compiling the kernels for %s instead, twice (the "
           "second pass shows the disk cache).\n", spec_arch_name(o->sm));
    /* The outputs the GPU demo asks for (any non-NULL address marks one as wanted), so these are
     * the very kernels it would run. */
    static char mark;
    flce_tensors t;
    flce_tensors_init(&t);
    t.loss = (float *)&mark, t.lse = (float *)&mark, t.grad_hidden = &mark, t.grad_weight = &mark;
    plan pl;
    if (plan_make(&o->problem, FLCE_OP_LOSS_AND_GRAD, o->sm, 132, &t, &pl) != FLCE_OK) {
        fprintf(stderr, "flce demo: %s\n", flce_last_error());
        return TOOL_EXIT_FAILED;
    }
    /* and recompute's dZ-writing logits pass when the plan has one */
    const kernel_spec *specs[] = {&pl.logits, &pl.dh, &pl.dw, &pl.rowops, &pl.logits_dz};
    for (int pass = 1; pass <= 2; pass++) {
        printf("pass %d:\n", pass);
        for (int i = 0; i < 4 + pl.fused_dz; i++) {
            jit_result jr;
            char summary[256];
            spec_summary(specs[i], summary, sizeof summary);
            if (jit_build(specs[i], &jr) != FLCE_OK) {
                fprintf(stderr, "flce demo: %s\n", flce_last_error());
                return TOOL_EXIT_FAILED;
            }
            printf("  %-15s %7zu bytes %8.1f ms  %s\n",
                   jr.origin == JIT_DISK_HIT ? "disk cache hit" : "compiled", jr.len, jr.ms, summary);
            free(jr.cubin);
        }
    }
    fflush(stdout);
    fprintf(stderr, "flce demo: no GPU (%s); compiled the kernels for %s, ran none\n", why, spec_arch_name(o->sm));
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Checks lse, per-token loss and dH of sampled tokens, dW of sampled vocab rows, and the mean
 * against the fp64 reference (bench_data.h). Returns the number of failed checks. */
static int demo_verify(const bench_data *d, uint64_t seed)
{
    host_rng rng;
    host_rng_seed(&rng, seed ^ 0x5eed);
    bench_ref ref;
    if (!bench_ref_tokens(&ref, d, &rng, DEMO_SAMPLES)) {
        fprintf(stderr, "flce demo: the reference: out of host memory\n");
        return 1;
    }
    float *lse = malloc((size_t)d->p.tokens * 4);
    if (lse && devmem_download(lse, d->d_lse, (size_t)d->p.tokens * 4) == FLCE_OK)
        bench_ref_vocab(&ref, d, &rng, lse); /* dW rows from the GPU's lse, itself checked below */
    bench_errors e;
    bench_ref_compare(&ref, d, 1, &e);
    bench_ref_free(&ref);
    free(lse);
    double tol_grad = d->p.dtype == FLCE_DTYPE_F32 ? 1e-4 : 4e-3;
    printf("  mean loss %.6f (from per-token losses %.6f): rel err %.2e\n", e.loss, e.mean_rows, e.mean);
    printf("  %d sampled tokens: lse max rel err %.2e, loss max rel err %.2e, dH rel L2 %.2e\n",
           DEMO_SAMPLES, e.lse, e.loss_row, e.dh);
    printf("  %d sampled vocab rows: dW rel L2 %.2e  (grad tolerance %.0e)\n", DEMO_SAMPLES, e.dw, tol_grad);
    /* written as !(x < tol) so that a NaN fails */
    return !(e.mean < 1e-5) + !(e.lse < 1e-5) + !(e.loss_row < 1e-4) + !(e.dh < tol_grad) + !(e.dw < tol_grad);
}

/* The part of the workspace that is an fp32 gradient accumulator (outside memory_budget,
 * docs/DESIGN.md §3): dW (V×D) for the chunked strategy, dH (N×D) for recompute. Planned as the library does for
 * an H100-sized GPU, which is what decides the strategy here. */
static double acc_mib(const flce_problem *p, const char **which)
{
    plan pl;
    *which = "no";
    if (plan_make(p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) != FLCE_OK) return 0;
    if (pl.need_dw_acc) *which = "the fp32 dW";
    if (pl.need_dh_acc) *which = "the fp32 dH";
    if (pl.need_dw_acc) return (double)pl.v * (double)pl.d * 4 / (1 << 20);
    if (pl.need_dh_acc) return (double)pl.n * (double)pl.d * 4 / (1 << 20);
    return 0;
}

static int demo_fail(const char *what)
{
    fprintf(stderr, "flce demo: %s: %s\n", what, flce_last_error());
    return 1;
}

static int demo_gpu(tool_opts *o)
{
    bench_data d;
    memset(&d, 0, sizeof d);
    d.p = o->problem;
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK) return demo_fail("creating the context");
    int sm = 0;
    flce_context_arch(ctx, &sm);
    if (devmem_use(0) != FLCE_OK) return demo_fail("device memory");
    uint64_t seed = host_fresh_seed();
    printf("flce demo: N=%lld tokens, D=%lld hidden, V=%lld vocab, %s, sm_%d, seed %llu\n",
           (long long)d.p.tokens, (long long)d.p.hidden, (long long)d.p.vocab_shard,
           host_dtype_name(d.p.dtype), sm, (unsigned long long)seed);
    /* Logits of standard deviation about 2: unit hidden states, weights of sd 2/sqrt(D). */
    if (!bench_data_fill(&d, seed, 2.0)) return demo_fail("host memory");
    if (bench_data_upload(&d) != FLCE_OK) return demo_fail("uploading");

    uint64_t ws_bytes = 0;
    if (flce_workspace_size(ctx, &d.p, FLCE_OP_LOSS_AND_GRAD, &ws_bytes) != FLCE_OK)
        return demo_fail("workspace size");
    void *ws = NULL;
    if (devmem_alloc(&ws, ws_bytes) != FLCE_OK) return demo_fail("workspace");
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = d.d_h, t.weight = d.d_w, t.labels = d.d_labels;
    t.loss = d.d_loss, t.lse = d.d_lse, t.grad_hidden = d.d_dh, t.grad_weight = d.d_dw;
    t.workspace = ws, t.workspace_bytes = ws_bytes;

    devmem_timer *tm;
    float first_ms = 0;
    devmem_timer_start(&tm);
    if (flce_loss_and_grad(ctx, &d.p, &t, NULL) != FLCE_OK) return demo_fail("loss_and_grad");
    if (devmem_timer_stop(tm, &first_ms) != FLCE_OK || flce_check(ctx, NULL) != FLCE_OK)
        return demo_fail("first call");
    enum { RUNS = 10 };
    double ms[RUNS];
    for (int r = 0; r < RUNS; r++) {
        float one = 0;
        devmem_timer_start(&tm);
        if (flce_loss_and_grad(ctx, &d.p, &t, NULL) != FLCE_OK) return demo_fail("loss_and_grad");
        if (devmem_timer_stop(tm, &one) != FLCE_OK) return demo_fail("timing");
        ms[r] = one;
    }
    qsort(ms, RUNS, sizeof ms[0], cmp_double);
    double med = ms[RUNS / 2];
    double flops = 6.0 * (double)d.p.tokens * (double)d.p.vocab_shard * (double)d.p.hidden;
    printf("  first call (JIT or cache load included): %.1f ms\n", first_ms);
    printf("  loss_and_grad: median %.3f ms of %d runs (min %.3f), %.1f TFLOP/s (6NVD)\n", med, RUNS,
           ms[0], flops / med / 1e9);
    const char *which;
    double acc = acc_mib(&d.p, &which);
    printf("  extra device memory: %.1f MiB workspace, of which %.1f MiB is %s accumulator (full "
           "fp32 logits would take %.1f MiB)\n", (double)ws_bytes / (1 << 20), acc, which,
           (double)d.p.tokens * (double)d.p.vocab_shard * 4 / (1 << 20));

    /* Per-token losses for the check, from the forward path. */
    flce_problem pf = d.p;
    pf.reduction = FLCE_REDUCTION_NONE;
    flce_tensors tf;
    flce_tensors_init(&tf);
    tf.hidden = d.d_h, tf.weight = d.d_w, tf.labels = d.d_labels, tf.loss = d.d_loss_rows;
    if (flce_forward(ctx, &pf, &tf, NULL) != FLCE_OK || flce_check(ctx, NULL) != FLCE_OK)
        return demo_fail("forward");
    int failed = demo_verify(&d, seed);
    printf("flce demo: %s\n", failed ? "FAILED" : "all checks passed");
    bench_data_free(&d);
    devmem_free(ws);
    flce_context_destroy(ctx);
    return failed ? 1 : 0;
}

static void demo_usage(FILE *f)
{
    fprintf(f,
            "usage: flce demo [options]\n"
            "Runs flce's fused loss-and-gradient call (flce_loss_and_grad) on random data on GPU 0:\n"
            "checks lse, loss and dH of 8 sampled tokens and dW of 8 sampled vocab rows against an fp64\n"
            "CPU reference, and prints the median time of 10 calls, TFLOP/s (counted as 6*N*V*D) and\n"
            "the extra device memory. Without a GPU it generates and compiles the same kernels for\n"
            "--arch, twice (the second pass shows the disk cache), and exits 3.\n"
            "\n"
            "Options (default in brackets):\n"
            "  --tokens N        tokens N [4096]\n"
            "  --hidden D        hidden size D, a multiple of 8 [4096]\n"
            "  --vocab V         vocabulary size V [32768]\n"
            "  --dtype T         bf16, f16 or f32 [bf16]\n"
            "  --budget-mib M    memory budget for stored logits, MiB [0: the library's default]\n"
            "  --arch A          the target to compile for without a GPU: sm_80, sm_86, sm_87, sm_89,\n"
            "                    sm_90a, sm_100a, sm_120 [sm_90a] (with a GPU: the GPU's own)\n"
            "  -h, --help        this text\n"
            "\n"
            "Example:\n"
            "  flce demo --tokens 8192 --hidden 4096 --vocab 128256\n"
            "\n"
            "Exit status: 0 all checks passed, 1 a check or a call failed, 2 a usage error,\n"
            "3 never: without a GPU the demo compiles its kernels, says so in one line and exits 0.\n");
}

static const struct option demo_options[] = {
    {"help", no_argument, NULL, 'h'},
    TOOL_PROBLEM_OPT("tokens"),
    TOOL_PROBLEM_OPT("hidden"),
    TOOL_PROBLEM_OPT("vocab"),
    TOOL_PROBLEM_OPT("dtype"),
    TOOL_PROBLEM_OPT("budget-mib"),
    TOOL_PROBLEM_OPT("arch"),
    {NULL, 0, NULL, 0},
};

int cmd_demo(int argc, char **argv)
{
    tool_opts o;
    tool_opts_init(&o);
    tool_cli c;
    tool_cli_start(&c, "demo", argc, argv, demo_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        if (v == TOOL_NEXT_HELP) return demo_usage(stdout), TOOL_EXIT_OK;
        if (v == TOOL_NEXT_BAD) return TOOL_EXIT_USAGE;
        if (v == TOOL_NEXT_WORD) return tool_misuse(c.cmd, "unexpected argument '%s'", c.arg);
        if (tool_set_common(&o, c.cmd, c.name, c.arg) <= 0) return TOOL_EXIT_USAGE;
    }
    if (tool_validate(c.cmd, &o.problem)) return TOOL_EXIT_USAGE;
    if (devmem_gpu_count() < 1) return demo_compile_only(&o);
    return demo_gpu(&o);
}
