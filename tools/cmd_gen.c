/* cmd_gen.c — `flce gen`: prints the exact CUDA source NVRTC compiles for a problem's kernels, or
 * with --compile compiles them (through the disk cache) and reports sizes and times. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_gen.h"
#include "emit.h"
#include "host.h"
#include "jit.h"
#include "plan.h"

void tool_opts_init(tool_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sm = 90;
    o->role = -1;
    flce_problem_init(&o->problem);
    o->problem.tokens = 4096;
    o->problem.hidden = 4096;
    o->problem.vocab_shard = 32768;
}

static int parse_dtype(const char *s, flce_dtype *t)
{
    if (!strcmp(s, "bf16")) *t = FLCE_DTYPE_BF16;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16")) *t = FLCE_DTYPE_F16;
    else if (!strcmp(s, "f32") || !strcmp(s, "fp32")) *t = FLCE_DTYPE_F32;
    else return 0;
    return 1;
}

static int parse_reduction(const char *s, flce_reduction *r)
{
    if (!strcmp(s, "mean")) *r = FLCE_REDUCTION_MEAN;
    else if (!strcmp(s, "sum")) *r = FLCE_REDUCTION_SUM;
    else if (!strcmp(s, "none")) *r = FLCE_REDUCTION_NONE;
    else return 0;
    return 1;
}

int tool_parse_common(tool_opts *o, int argc, char **argv, int i)
{
    const char *k = argv[i];
    if (i + 1 >= argc) return 0;
    const char *v = argv[i + 1];
    flce_problem *p = &o->problem;
    if (!strcmp(k, "--arch")) {
        o->sm = spec_parse_arch(v);
        if (!o->sm) fprintf(stderr, "flce: --arch %s: unknown (try sm_80, sm_90a, sm_100a)\n", v);
        return o->sm ? 2 : -1;
    }
    if (!strcmp(k, "--dtype")) {
        if (!parse_dtype(v, &p->dtype)) fprintf(stderr, "flce: --dtype %s: use bf16, f16 or f32\n", v);
        return parse_dtype(v, &p->dtype) ? 2 : -1;
    }
    if (!strcmp(k, "--reduction")) {
        if (!parse_reduction(v, &p->reduction)) fprintf(stderr, "flce: --reduction %s: use mean, sum or none\n", v);
        return parse_reduction(v, &p->reduction) ? 2 : -1;
    }
    long long n = strtoll(v, NULL, 10);
    if (!strcmp(k, "--tokens")) p->tokens = n;
    else if (!strcmp(k, "--hidden")) p->hidden = n;
    else if (!strcmp(k, "--vocab")) p->vocab_shard = n;
    else if (!strcmp(k, "--labels")) p->label_bits = (int)n;
    else if (!strcmp(k, "--budget-mib")) p->memory_budget = (uint64_t)n << 20;
    else return 0;
    return 2;
}

static int parse_role(const char *s)
{
    for (int r = ROLE_LOGITS; r <= ROLE_ROWOPS; r++)
        if (!strcmp(s, spec_role_name((spec_role)r))) return r;
    return -2;
}

static void gen_usage(FILE *f)
{
    fprintf(f,
            "usage: flce gen [--role logits|dh|dw|rowops] [--compile] [--arch sm_90a] [--dtype bf16]\n"
            "                [--tokens N] [--hidden D] [--vocab V] [--labels 32|64] [--reduction mean]\n"
            "                [--typical]\n"
            "Prints the CUDA source NVRTC compiles for the problem's kernels (all roles unless\n"
            "--role); with --compile, compiles them through the cache and reports instead.\n"
            "--typical: the kernels of a call asking for loss, lse, dH and dW (default: every output,\n"
            "entropy and argmax included).\n");
}

static int gen_one(const kernel_spec *s, int compile)
{
    char summary[256];
    spec_summary(s, summary, sizeof summary);
    if (!compile) {
        char *src = NULL;
        if (emit_source(s, &src) != FLCE_OK) {
            fprintf(stderr, "flce gen: %s\n", flce_last_error());
            return 1;
        }
        fputs(src, stdout);
        free(src);
        return 0;
    }
    jit_result jr;
    if (jit_build(s, &jr) != FLCE_OK) {
        fprintf(stderr, "flce gen: %s\n", flce_last_error());
        return 1;
    }
    printf("%-8s %7zu-byte cubin  %7.1f ms  %s\n", jr.origin == JIT_DISK_HIT ? "cached" : "compiled",
           jr.len, jr.ms, summary);
    free(jr.cubin);
    return 0;
}

int cmd_gen(int argc, char **argv)
{
    tool_opts o;
    tool_opts_init(&o);
    int typical = 0;
    for (int i = 1; i < argc;) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            gen_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--compile")) {
            o.compile = 1, i++;
            continue;
        }
        if (!strcmp(argv[i], "--typical")) {
            typical = 1, i++;
            continue;
        }
        if (!strcmp(argv[i], "--role") && i + 1 < argc) {
            o.role = parse_role(argv[i + 1]);
            if (o.role == -2) {
                gen_usage(stderr);
                return 2;
            }
            i += 2;
            continue;
        }
        int used = tool_parse_common(&o, argc, argv, i);
        if (used <= 0) {
            if (used == 0) gen_usage(stderr);
            return 2;
        }
        i += used;
    }
    if (flce_problem_validate(&o.problem) != FLCE_OK) {
        fprintf(stderr, "flce gen: %s\n", flce_last_error());
        return 2;
    }
    /* --typical: the kernels of a call asking for loss, lse, dH and dW only (no entropy or argmax,
     * which select other variants); without it, the worst case: every output. */
    static const char mark;
    flce_tensors t;
    flce_tensors_init(&t);
    t.loss = t.lse = (float *)(uintptr_t)&mark;
    t.grad_hidden = t.grad_weight = (void *)(uintptr_t)&mark;
    plan pl;
    if (plan_make(&o.problem, FLCE_OP_LOSS_AND_GRAD, o.sm, 132, typical ? &t : NULL, &pl) != FLCE_OK) {
        fprintf(stderr, "flce gen: %s\n", flce_last_error());
        return 2;
    }
    /* and recompute's dZ-writing logits pass when the plan has one */
    const kernel_spec *specs[] = {&pl.logits, &pl.dh, &pl.dw, &pl.rowops, &pl.logits_dz};
    int rc = 0;
    for (int r = 0; r < 4 + pl.fused_dz && !rc; r++)
        if (o.role < 0 || o.role == (int)specs[r]->role) rc = gen_one(specs[r], o.compile);
    return rc;
}
