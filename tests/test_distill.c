/* test_distill.c — the distillation call (issue 44 item 1, include/flce.h "Distillation"), the part
 * that needs no GPU: every bad problem field and tensor gets its status and a message naming it
 * (runtime/distill_api.c), the token-chunk plan follows the budget (runtime/distill.c), and the
 * module (templates/distill.cu) emits through the spec path and compiles through NVRTC for sm_80 and
 * sm_90a in every variant. The GPU comparison against ref_distill is tests/test_distill_gpu.c. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "context.h"
#include "api_limits.h"
#include "distill.h"
#include "topk.h"
#include "emit.h"
#include "flce.h"
#include "dev_switch.h"
#include "nvrtc_compile.h"

static int says(const char *needle) { return strstr(flce_last_error(), needle) != NULL; }

static flce_distill_problem good(void)
{
    flce_distill_problem p;
    flce_distill_problem_init(&p);
    p.tokens = 1024, p.hidden_student = 2048, p.hidden_teacher = 4096, p.vocab = 32000;
    return p;
}

/* The plan's device when there is none: an H100's arch and SMs, no tune table. */
static const call_device H100 = {NULL, 90, 132};

/* Fake, aligned device addresses: distill_check never dereferences them. */
#define ADDR(k) ((void *)(uintptr_t)(0x10000u * (k)))

static flce_distill_tensors good_tensors(void)
{
    flce_distill_tensors t;
    flce_distill_tensors_init(&t);
    t.student_hidden = ADDR(1), t.student_weight = ADDR(2), t.teacher_hidden = ADDR(3);
    t.teacher_weight = ADDR(4), t.labels = ADDR(5), t.loss = ADDR(6), t.divergence = ADDR(7);
    t.grad_student_hidden = ADDR(8), t.grad_student_weight = ADDR(9);
    return t;
}

static void defaults_are_those_of_the_header(void)
{
    flce_distill_problem p;
    memset(&p, 0x5a, sizeof p);
    flce_distill_problem_init(&p);
    CHECK(p.struct_size == sizeof p && p.api_version == FLCE_API_VERSION);
    CHECK(p.dtype == FLCE_DTYPE_BF16 && p.label_bits == 32 && p.reduction == FLCE_REDUCTION_MEAN);
    CHECK(p.divergence == FLCE_DIVERGENCE_FORWARD_KL && p.temperature == 1.0f && p.ce_weight == 0.0f);
    CHECK(p.ignore_index == -100 && p.memory_budget == 0);
    CHECK(p.tp_size == 1 && p.tp_rank == 0 && p.vocab_offset == 0 && p.vocab_total == 0);
    flce_distill_tensors t;
    memset(&t, 0x5a, sizeof t);
    flce_distill_tensors_init(&t);
    CHECK(t.struct_size == sizeof t && !t.student_hidden && !t.workspace && t.workspace_bytes == 0);
    flce_distill_problem q = good();
    CHECKF(flce_distill_problem_validate(&q) == FLCE_OK, "%s", flce_last_error());
}

/* The layout python/flce/_distill_lib.py mirrors with ctypes (x86-64 / aarch64 LP64). */
static void struct_layout_is_the_bindings(void)
{
    CHECK(offsetof(flce_distill_problem, tokens) == 8);
    CHECK(offsetof(flce_distill_problem, dtype) == 40);
    CHECK(offsetof(flce_distill_problem, divergence) == 48);
    CHECK(offsetof(flce_distill_problem, ignore_index) == 64);
    CHECK(offsetof(flce_distill_problem, memory_budget) == 80 && offsetof(flce_distill_problem, teacher_topk) == 88);
    CHECK(offsetof(flce_distill_problem, vocab_offset) == 96 && offsetof(flce_distill_problem, vocab_total) == 104 &&
          offsetof(flce_distill_problem, tp_rank) == 112 && offsetof(flce_distill_problem, tp_size) == 116 &&
          sizeof(flce_distill_problem) == 120);
    CHECK(offsetof(flce_distill_tensors, student_hidden) == 8);
    CHECK(offsetof(flce_distill_tensors, workspace_bytes) == 96 && offsetof(flce_distill_tensors, teacher_topk_logprobs) == 112 &&
          offsetof(flce_distill_tensors, comm) == 120 && sizeof(flce_distill_tensors) == 128);
}

typedef struct bad_case {
    const char *name; /* what the message must name */
    flce_status status;
    void (*mutate)(flce_distill_problem *);
} bad_case;

#define MUT(fn, body) static void fn(flce_distill_problem *p) { body; }
MUT(zero_tokens, p->tokens = 0)
MUT(huge_tokens, p->tokens = (int64_t)INT32_MAX + 1)
MUT(zero_student_hidden, p->hidden_student = 0)
MUT(odd_student_hidden, p->hidden_student = 1001)
MUT(odd_teacher_hidden, p->hidden_teacher = 12)
MUT(zero_vocab, p->vocab = 0)
MUT(huge_vocab, p->vocab = 9000000)
MUT(bad_dtype, p->dtype = (flce_dtype)7)
MUT(bad_label_bits, p->label_bits = 16)
MUT(bad_reduction, p->reduction = (flce_reduction)9)
MUT(bad_divergence, p->divergence = (flce_divergence)3)
MUT(beta_below, p->beta = -0.1f)
MUT(beta_above, p->beta = 1.5f)
MUT(beta_nan, p->beta = 0.0f / 0.0f)
MUT(temperature_zero, p->temperature = 0.0f)
MUT(temperature_negative, p->temperature = -1.0f)
MUT(temperature_inf, p->temperature = 1.0f / 0.0f)
MUT(ce_negative, p->ce_weight = -0.5f)
MUT(ce_with_temperature, p->ce_weight = 0.5f; p->temperature = 2.0f)
MUT(small_struct, p->struct_size = 16)
MUT(big_struct, p->struct_size = sizeof *p + 8)

static void every_bad_problem_field_is_named(void)
{
    static const bad_case cases[] = {
        {"problem.tokens=0", FLCE_ERR_INVALID_ARGUMENT, zero_tokens},
        {"problem.tokens=2147483648", FLCE_ERR_UNSUPPORTED, huge_tokens},
        {"problem.hidden_student=0", FLCE_ERR_INVALID_ARGUMENT, zero_student_hidden},
        {"problem.hidden_student=1001", FLCE_ERR_INVALID_ARGUMENT, odd_student_hidden},
        {"problem.hidden_teacher=12", FLCE_ERR_INVALID_ARGUMENT, odd_teacher_hidden},
        {"problem.vocab=0", FLCE_ERR_INVALID_ARGUMENT, zero_vocab},
        {"problem.vocab=9000000", FLCE_ERR_UNSUPPORTED, huge_vocab},
        {"problem.dtype=7", FLCE_ERR_INVALID_ARGUMENT, bad_dtype},
        {"problem.label_bits=16", FLCE_ERR_INVALID_ARGUMENT, bad_label_bits},
        {"problem.reduction=9", FLCE_ERR_INVALID_ARGUMENT, bad_reduction},
        {"problem.divergence=3", FLCE_ERR_INVALID_ARGUMENT, bad_divergence},
        {"problem.beta=-0.1", FLCE_ERR_INVALID_ARGUMENT, beta_below},
        {"problem.beta=1.5", FLCE_ERR_INVALID_ARGUMENT, beta_above},
        {"problem.beta=", FLCE_ERR_INVALID_ARGUMENT, beta_nan},
        {"problem.temperature=0", FLCE_ERR_INVALID_ARGUMENT, temperature_zero},
        {"problem.temperature=-1", FLCE_ERR_INVALID_ARGUMENT, temperature_negative},
        {"problem.temperature=inf", FLCE_ERR_INVALID_ARGUMENT, temperature_inf},
        {"problem.ce_weight=-0.5", FLCE_ERR_INVALID_ARGUMENT, ce_negative},
        {"problem.ce_weight=0.5 with problem.temperature=2", FLCE_ERR_UNSUPPORTED, ce_with_temperature},
        {"problem.struct_size=16", FLCE_ERR_INVALID_ARGUMENT, small_struct},
        {"problem.struct_size=", FLCE_ERR_UNSUPPORTED, big_struct},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flce_distill_problem p = good();
        cases[i].mutate(&p);
        flce_status st = flce_distill_problem_validate(&p);
        CHECKF(st == cases[i].status && says(cases[i].name), "case %s: status %s, message '%s'", cases[i].name,
               flce_status_name(st), flce_last_error());
        /* the call itself reports the same before touching anything */
        flce_distill_tensors t = good_tensors();
        flce_distill_problem q;
        distill_plan pl;
        st = distill_check(&p, &t, &H100, &q, &pl);
        CHECKF(st == cases[i].status && says(cases[i].name), "case %s via distill_check: %s '%s'", cases[i].name,
               flce_status_name(st), flce_last_error());
    }
    CHECK(flce_distill_problem_validate(NULL) == FLCE_ERR_INVALID_ARGUMENT && says("problem: NULL"));
}

/* The teacher as top-k (problem.teacher_topk): every inconsistency named, the plan without the
 * teacher's GEMM, pass or regions. */
static void teacher_topk_is_checked_and_planned(void)
{
    flce_distill_problem p = good(), q;
    p.teacher_topk = 16, p.hidden_teacher = 0;
    CHECKF(flce_distill_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
    p.hidden_teacher = 4096; /* a teacher width with top-k: a caller mixing the two forms */
    CHECK(flce_distill_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says("problem.hidden_teacher=4096") &&
          says("teacher_topk=16"));
    p.hidden_teacher = 0, p.teacher_topk = 65;
    CHECK(flce_distill_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says("problem.teacher_topk=65"));
    p.teacher_topk = -1;
    CHECK(flce_distill_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says("problem.teacher_topk=-1"));
    p.teacher_topk = 8, p.vocab = 5; /* more ids than the vocabulary */
    CHECK(flce_distill_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says("problem.teacher_topk=8") &&
          says("problem.vocab=5"));
    p.vocab = 32000, p.teacher_topk = 16, p.divergence = FLCE_DIVERGENCE_REVERSE_KL;
    CHECK(flce_distill_problem_validate(&p) == FLCE_ERR_UNSUPPORTED && says("problem.divergence=1"));
    p.divergence = FLCE_DIVERGENCE_JSD, p.beta = 0.0f; /* JSD at β = 0 is forward KL */
    CHECK(flce_distill_problem_validate(&p) == FLCE_OK);
    p.divergence = FLCE_DIVERGENCE_FORWARD_KL;
    /* tensors: the teacher given both ways, or the top-k missing */
    flce_distill_tensors t = good_tensors();
    distill_plan pl;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.teacher_hidden: given") &&
          says("not both"));
    t.teacher_hidden = NULL;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.teacher_weight: given"));
    t.teacher_weight = NULL;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.teacher_topk_indices: NULL (required)"));
    t.teacher_topk_indices = (const int64_t *)ADDR(10);
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.teacher_topk_logprobs: NULL (required)"));
    t.teacher_topk_logprobs = (const float *)((char *)ADDR(11) + 2);
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.teacher_topk_logprobs=") &&
          says("4-byte aligned"));
    t.teacher_topk_logprobs = (const float *)ADDR(11);
    CHECKF(distill_check(&p, &t, &H100, &q, &pl) == FLCE_OK, "%s", flce_last_error());
    /* 16-bit: the student's compact pass alone (flce_distill_row_topk_compact), dZs over its p̃ */
    CHECKF(pl.topk == 16 && pl.compact && !pl.zt_offset && !pl.teacher_part_m && !pl.pt_offset && pl.chunks == 1,
           "topk %d compact %d zt %llu tpm %llu pt %llu chunks %lld", pl.topk, pl.compact,
           (unsigned long long)pl.zt_offset, (unsigned long long)pl.teacher_part_m, (unsigned long long)pl.pt_offset,
           (long long)pl.chunks);
    CHECK(pl.student.compact && pl.student.off_z == pl.student.off_dz && pl.student.logits.opts == SPEC_OPT_SPARSE &&
          pl.workspace_bytes > pl.per_token_offset);
    p.memory_budget = 32000ull * 2 * 300; /* the student's fp16 p̃ (and its group maxima) only */
    CHECKF(distill_check(&p, &t, &H100, &q, &pl) == FLCE_OK && pl.compact && pl.chunk_rows > 200 &&
           pl.chunk_rows <= 300, "%lld rows", (long long)pl.chunk_rows);
    /* (a memory_budget bounds the whole workspace: there is no room for every token's p̃ / dZs or the
     * fp32 dWs accumulator, so each chunk's dWs is added into the caller's dW in the dtype) */
    CHECK(pl.student.dw_in_dtype && !pl.student.dz_all_rows && !pl.student.need_dw_acc && !pl.student.off_dw_acc &&
          !pl.student.dw.plain_out && pl.workspace_bytes <= p.memory_budget);
    p.memory_budget = 32000ull * 2 * 1100; /* every token's p̃ / dZs fits, in 2 chunks: dWs once */
    CHECKF(distill_check(&p, &t, &H100, &q, &pl) == FLCE_OK && pl.chunks == 2 && pl.student.dz_all_rows &&
           !pl.student.dw_in_dtype && pl.student.off_z == pl.student.off_dz &&
           pl.student.workspace_bytes >= pl.student.off_dz + 32000ull * 2 * (uint64_t)p.tokens &&
           pl.workspace_bytes <= p.memory_budget, "%lld chunks", (long long)pl.chunks);
    p.memory_budget = 32000ull * 2; /* not one token's p̃ and group maxima */
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("problem.memory_budget=") &&
          says("the student"));
    /* fp32: the fp32 logits path without the teacher's plan */
    p.dtype = FLCE_DTYPE_F32, p.memory_budget = 0;
    CHECKF(distill_check(&p, &t, &H100, &q, &pl) == FLCE_OK && pl.topk == 16 && !pl.compact && !pl.zt_offset &&
           !pl.student.compact, "%s", flce_last_error());
    const uint64_t row = 32000 * 4; /* the student's fp32 logits, dZs in place */
    p.memory_budget = row * 300;
    CHECKF(distill_check(&p, &t, &H100, &q, &pl) == FLCE_OK && pl.chunk_rows > 200 && pl.chunk_rows <= 300,
           "%lld rows: %s", (long long)pl.chunk_rows, flce_last_error());
    p.dtype = FLCE_DTYPE_BF16, p.memory_budget = 0;
    /* top-k tensors with a dense teacher */
    flce_distill_problem dense = good();
    flce_distill_tensors u = good_tensors();
    u.teacher_topk_logprobs = (const float *)ADDR(11);
    CHECK(distill_check(&dense, &u, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.teacher_topk_logprobs: given, but problem.teacher_topk is 0"));
}

static void jsd_ends_and_every_divergence_validate(void)
{
    float betas[] = {0.0f, 0.25f, 1.0f};
    for (int d = 0; d < 3; d++)
        for (int b = 0; b < 3; b++) {
            flce_distill_problem p = good();
            p.divergence = (flce_divergence)d, p.beta = betas[b], p.temperature = 2.0f;
            CHECKF(flce_distill_problem_validate(&p) == FLCE_OK, "div %d beta %g: %s", d, (double)betas[b],
                   flce_last_error());
        }
    flce_distill_problem p = good();
    p.ce_weight = 0.3f; /* CE at T = 1 is fine */
    CHECK(flce_distill_problem_validate(&p) == FLCE_OK);
}

static void every_bad_tensor_is_named(void)
{
    static const char *const required[] = {"student_hidden", "student_weight", "teacher_hidden", "teacher_weight"};
    for (int k = 0; k < 4; k++) {
        flce_distill_problem p = good(), q;
        flce_distill_tensors t = good_tensors();
        const void **f[] = {&t.student_hidden, &t.student_weight, &t.teacher_hidden, &t.teacher_weight};
        *f[k] = NULL;
        distill_plan pl;
        flce_status st = distill_check(&p, &t, &H100, &q, &pl);
        char want[64];
        snprintf(want, sizeof want, "tensors.%s: NULL (required)", required[k]);
        CHECKF(st == FLCE_ERR_INVALID_ARGUMENT && says(want), "%s: %s", want, flce_last_error());
        *f[k] = (const void *)((uintptr_t)ADDR(1) + 8); /* not 16-byte aligned */
        st = distill_check(&p, &t, &H100, &q, &pl);
        snprintf(want, sizeof want, "tensors.%s=", required[k]);
        CHECKF(st == FLCE_ERR_INVALID_ARGUMENT && says(want) && says("16-byte aligned"), "%s", flce_last_error());
    }
    flce_distill_problem p = good(), q;
    distill_plan pl;
    flce_distill_tensors t = good_tensors();
    p.label_bits = 64, t.labels = (const void *)((uintptr_t)ADDR(5) + 4);
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.labels=") &&
          says("8-byte aligned"));
    p = good(), t = good_tensors();
    p.ce_weight = 1.0f, t.labels = NULL;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.labels: NULL") &&
          says("ce_weight"));
    p = good(), t = good_tensors();
    t.labels = NULL; /* no CE: labels are optional */
    CHECKF(distill_check(&p, &t, &H100, &q, &pl) == FLCE_OK, "%s", flce_last_error());
    t = good_tensors();
    t.loss = NULL, t.divergence = NULL, t.grad_student_hidden = NULL, t.grad_student_weight = NULL;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("every output is NULL"));
    t = good_tensors();
    t.loss = (float *)((uintptr_t)ADDR(6) + 2);
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.loss="));
    t = good_tensors();
    t.struct_size = 8;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.struct_size=8"));
    CHECK(distill_check(&p, NULL, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors: NULL"));
    t = good_tensors();
    t.workspace = ADDR(10), t.workspace_bytes = 1024;
    CHECK(distill_check(&p, &t, &H100, &q, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.workspace_bytes=1024"));
}

/* flce_topk_logprobs's checks (runtime/topk_api.c) and plan (runtime/topk.c), no GPU. */
static flce_topk_problem topk_good(void)
{
    flce_topk_problem p;
    flce_topk_problem_init(&p);
    p.tokens = 1000, p.hidden = 2048, p.vocab = 32000, p.k = 8;
    return p;
}

static void topk_bad_arguments_are_named(void)
{
    flce_topk_problem p = topk_good();
    CHECKF(flce_topk_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
    struct { const char *name; flce_status st; int k; int64_t vocab; float temperature; int64_t hidden; } cases[] = {
        {"problem.k=0", FLCE_ERR_INVALID_ARGUMENT, 0, 32000, 1.0f, 2048},
        {"problem.k=65", FLCE_ERR_INVALID_ARGUMENT, 65, 32000, 1.0f, 2048},
        {"problem.k=10: must be in [1, 64] and at most problem.vocab=5", FLCE_ERR_INVALID_ARGUMENT, 10, 5, 1.0f, 2048},
        {"problem.temperature=0", FLCE_ERR_INVALID_ARGUMENT, 8, 32000, 0.0f, 2048},
        {"problem.temperature=nan", FLCE_ERR_INVALID_ARGUMENT, 8, 32000, NAN, 2048},
        {"problem.hidden=12", FLCE_ERR_INVALID_ARGUMENT, 8, 32000, 1.0f, 12},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p = topk_good();
        p.k = cases[i].k, p.vocab = cases[i].vocab, p.temperature = cases[i].temperature, p.hidden = cases[i].hidden;
        flce_status st = flce_topk_problem_validate(&p);
        CHECKF(st == cases[i].st && says(cases[i].name), "%s: %s '%s'", cases[i].name, flce_status_name(st),
               flce_last_error());
    }
    p = topk_good();
    p.struct_size = 8;
    CHECK(flce_topk_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says("problem.struct_size=8"));
    CHECK(flce_topk_problem_validate(NULL) == FLCE_ERR_INVALID_ARGUMENT && says("problem: NULL"));
    /* tensors: each required one named, alignment named, the workspace's size */
    p = topk_good();
    flce_topk_tensors t;
    flce_topk_tensors_init(&t);
    t.hidden = ADDR(1), t.weight = ADDR(2), t.indices = (int64_t *)ADDR(3), t.logprobs = (float *)ADDR(4);
    flce_topk_problem q;
    flce_topk_tensors tq;
    topk_plan pl;
    CHECKF(topk_check(&p, &t, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_OK, "%s", flce_last_error());
    flce_topk_tensors u = t;
    u.indices = NULL;
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.indices: NULL (required)"));
    u = t, u.logprobs = NULL;
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.logprobs: NULL"));
    u = t, u.weight = (const void *)((uintptr_t)ADDR(2) + 8);
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.weight=") &&
          says("16-byte aligned"));
    u = t, u.indices = (int64_t *)((uintptr_t)ADDR(3) + 4);
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.indices=") &&
          says("8-byte aligned"));
    u = t, u.workspace = ADDR(9), u.workspace_bytes = 64;
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.workspace_bytes=64"));
    CHECK(topk_check(&p, NULL, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors: NULL"));
    uint64_t bytes;
    CHECK(flce_topk_workspace_size(NULL, &p, &bytes) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
    CHECK(flce_topk_logprobs(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
    CHECK(flce_topk_prepare(NULL, &p) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
}

static void topk_chunks_follow_the_budget(void)
{
    flce_topk_problem p = topk_good();
    topk_plan pl;
    CHECKF(topk_plan_make(&p, &H100, &pl) == FLCE_OK, "%s", flce_last_error()); /* 1 GiB / 128000 ≥ N */
    CHECK(pl.chunk_rows == 1000 && pl.chunks == 1 && pl.ld == 32000 && !pl.model.compact && pl.model.splits >= 1);
    CHECK(pl.workspace_bytes >= 1000ull * 32000 * 4 + 3 * 1000ull * pl.model.splits * 4);
    /* the logits pass also sums Σ exp·z (the entropy statistic: flce_topk_row's E_p[z] for the lse's
     * bias term), into its own split array */
    CHECK(pl.model.logits.opts == SPEC_OPT_ENTROPY && spec_validate(&pl.model.logits) == FLCE_OK);
    const uint64_t parts = 1000ull * (uint64_t)pl.model.splits * 4;
    CHECK(pl.part_t_offset >= pl.part_s_offset + parts && pl.target_offset >= pl.part_t_offset + parts &&
          pl.part_t_offset % 256 == 0);
    p.memory_budget = 128000ull * 300; /* 300 rows fit: 256-row chunks */
    CHECKF(topk_plan_make(&p, &H100, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.chunk_rows == 256 && pl.chunks == 4);
    p.memory_budget = 128000ull * 50; /* under one 128-row block */
    CHECK(topk_plan_make(&p, &H100, &pl) == FLCE_OK && pl.chunk_rows == 50 && pl.chunks == 20);
    p.memory_budget = 127999;
    CHECK(topk_plan_make(&p, &H100, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("problem.memory_budget=127999"));
    /* the module the call loads is a valid spec whose source holds flce_topk_row */
    kernel_spec s = topk_module_spec(90, &p);
    CHECKF(spec_validate(&s) == FLCE_OK, "%s", flce_last_error());
    char *src = NULL;
    CHECKF(emit_source(&s, &src) == FLCE_OK && src && strstr(src, "flce_topk_row"), "%s", flce_last_error());
    free(src);
}

/* Tensor parallelism's fields (runtime/topk_api.c check_tp): each bad one named with its value. */
static void topk_tp_fields_are_named(void)
{
    flce_topk_problem p;
    memset(&p, 0x5a, sizeof p);
    flce_topk_problem_init(&p);
    CHECK(p.tp_size == 1 && p.tp_rank == 0 && p.vocab_offset == 0 && p.vocab_total == 0);
    CHECK(p.api_version == FLCE_API_VERSION && FLCE_API_VERSION >= 4);
    /* the layout python/flce/_distill_lib.py mirrors (LP64) */
    CHECK(offsetof(flce_topk_problem, memory_budget) == 48 && offsetof(flce_topk_problem, vocab_offset) == 56 &&
          offsetof(flce_topk_problem, tp_rank) == 72 && offsetof(flce_topk_problem, tp_size) == 76 &&
          sizeof(flce_topk_problem) == 80);
    CHECK(offsetof(flce_topk_tensors, workspace_bytes) == 56 && offsetof(flce_topk_tensors, comm) == 64 &&
          sizeof(flce_topk_tensors) == 72);
    struct {
        const char *name;
        flce_status st;
        int32_t rank, size;
        int64_t offset, total, vocab;
        int k;
    } cases[] = {
        {"problem.tp_rank=2, tp_size=2", FLCE_ERR_INVALID_ARGUMENT, 2, 2, 0, 64000, 32000, 8},
        {"problem.tp_rank=-1, tp_size=2", FLCE_ERR_INVALID_ARGUMENT, -1, 2, 0, 64000, 32000, 8},
        {"problem.tp_rank=0, tp_size=0", FLCE_ERR_INVALID_ARGUMENT, 0, 0, 0, 64000, 32000, 8},
        {"problem.tp_size=4097: at most 4096", FLCE_ERR_UNSUPPORTED, 0, 4097, 0, 64000, 32000, 8},
        {"problem.vocab_offset=-5", FLCE_ERR_INVALID_ARGUMENT, 1, 2, -5, 64000, 32000, 8},
        {"problem.vocab_offset + vocab = 40000 + 32000 exceeds vocab_total=64000", FLCE_ERR_INVALID_ARGUMENT, 1, 2,
         40000, 64000, 32000, 8},
        {"problem.vocab_offset=32000, vocab_total=64000: with tp_size=1", FLCE_ERR_INVALID_ARGUMENT, 0, 1, 32000,
         64000, 32000, 8},
        {"problem.vocab_offset=0, vocab_total=64000: with tp_size=1", FLCE_ERR_INVALID_ARGUMENT, 0, 1, 0, 64000,
         32000, 8},
        {"problem.vocab_total=4294967296: at most 2147483647", FLCE_ERR_UNSUPPORTED, 1, 2, 4294967296ll - 32000,
         4294967296ll, 32000, 8},
        {"problem.k=20: must be in [1, 64] and at most problem.vocab=10 (this rank's shard", FLCE_ERR_INVALID_ARGUMENT,
         1, 2, 32000, 32010, 10, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p = topk_good();
        p.tp_rank = cases[i].rank, p.tp_size = cases[i].size, p.vocab_offset = cases[i].offset;
        p.vocab_total = cases[i].total, p.vocab = cases[i].vocab, p.k = cases[i].k;
        flce_status st = flce_topk_problem_validate(&p);
        CHECKF(st == cases[i].st && says(cases[i].name), "%s: %s '%s'", cases[i].name, flce_status_name(st),
               flce_last_error());
    }
    /* good ones: the last shard of two; vocab_total 0 = vocab_offset + vocab; k equal to the shard */
    p = topk_good();
    p.tp_rank = 1, p.tp_size = 2, p.vocab_offset = 32000, p.vocab_total = 64000;
    CHECKF(flce_topk_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
    p.vocab_total = 0;
    CHECKF(flce_topk_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
    p.vocab = 64, p.k = 64, p.vocab_total = 32064;
    CHECKF(flce_topk_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
    /* a caller of the first layout (no TP fields): struct_size up to memory_budget works, with the
     * defaults; the bytes past it are never read */
    p = topk_good();
    p.tp_size = 0, p.vocab_offset = -1; /* garbage the old size excludes */
    p.struct_size = offsetof(flce_topk_problem, memory_budget) + sizeof p.memory_budget;
    CHECKF(flce_topk_problem_validate(&p) == FLCE_OK, "old problem size: %s", flce_last_error());
    p.struct_size = offsetof(flce_topk_problem, memory_budget);
    CHECK(flce_topk_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says("problem.struct_size="));
    p.struct_size = sizeof p + 8;
    CHECK(flce_topk_problem_validate(&p) == FLCE_ERR_UNSUPPORTED && says("problem.struct_size="));
}

/* The split phase's checks and sizes: each half needs only its own tensors and its buffer, the
 * whole call under TP needs the communicator, the block is 4·(8 + N·(2 + 2k)) bytes. */
static void topk_split_phase_checks_and_sizes(void)
{
    flce_topk_problem p = topk_good(), q;
    p.tp_rank = 1, p.tp_size = 3, p.vocab_offset = 32000, p.vocab_total = 100000;
    uint64_t bytes = 0;
    CHECKF(flce_topk_stats_bytes(&p, &bytes) == FLCE_OK, "%s", flce_last_error());
    CHECK(bytes == 4ull * (8 + 1000ull * (2 + 2 * 8)));
    p.k = 64, p.tokens = 8192;
    CHECK(flce_topk_stats_bytes(&p, &bytes) == FLCE_OK && bytes == 4ull * (8 + 8192ull * 130)); /* 8.4 MB */
    p.tokens = 1;
    CHECK(flce_topk_stats_bytes(&p, &bytes) == FLCE_OK && bytes == 4ull * (8 + 130));
    CHECK(flce_topk_stats_bytes(&p, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("bytes: NULL"));
    CHECK(flce_topk_stats_bytes(NULL, &bytes) == FLCE_ERR_INVALID_ARGUMENT && says("problem: NULL"));
    p.tp_rank = 3;
    CHECK(flce_topk_stats_bytes(&p, &bytes) == FLCE_ERR_INVALID_ARGUMENT && says("problem.tp_rank=3"));
    p = topk_good();
    p.tp_rank = 1, p.tp_size = 3, p.vocab_offset = 32000, p.vocab_total = 100000;
    /* the plan: this rank's block and the three gathered ones after the logits pass's part */
    topk_plan pl;
    CHECKF(topk_plan_make(&p, &H100, &pl) == FLCE_OK, "%s", flce_last_error());
    const uint64_t blk = 4ull * (8 + 1000ull * 18);
    CHECK(pl.block_bytes == blk && pl.block_offset >= pl.stats_bytes && pl.gathered_offset >= pl.block_offset + blk);
    CHECK(pl.workspace_bytes >= pl.gathered_offset + 3 * blk && pl.block_offset % 256 == 0 &&
          pl.gathered_offset % 256 == 0);
    CHECK(topk_part_workspace(&pl, TOPK_STATS) == pl.stats_bytes && topk_part_workspace(&pl, TOPK_FINISH) == 0);
    flce_topk_problem one = topk_good();
    topk_plan pl1;
    CHECK(topk_plan_make(&one, &H100, &pl1) == FLCE_OK && pl1.workspace_bytes == pl1.stats_bytes);
    /* the whole call under TP: comm required, naming the split phase */
    flce_topk_tensors t, tq;
    flce_topk_tensors_init(&t);
    t.hidden = ADDR(1), t.weight = ADDR(2), t.indices = (int64_t *)ADDR(3), t.logprobs = (float *)ADDR(4);
    CHECK(topk_check(&p, &t, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.comm: NULL with tp_size=3") && says("flce_topk_stats") && says("flce_topk_finish"));
    t.comm = ADDR(20);
    CHECKF(topk_check(&p, &t, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(topk_check(&one, &t, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.comm: given, but problem.tp_size is 1"));
    t.comm = NULL;
    /* the stats half: no outputs needed, the block required and aligned; its workspace is the
     * logits pass's only */
    flce_topk_tensors u = t;
    u.indices = NULL, u.logprobs = NULL;
    CHECKF(topk_check(&p, &u, TOPK_STATS, ADDR(30), &H100, &q, &tq, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(topk_check(&p, &u, TOPK_STATS, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("block: NULL") && says("flce_topk_stats_bytes"));
    CHECK(topk_check(&p, &u, TOPK_STATS, (char *)ADDR(30) + 8, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("block=") && says("16-byte aligned"));
    u.hidden = NULL;
    CHECK(topk_check(&p, &u, TOPK_STATS, ADDR(30), &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.hidden: NULL"));
    u = t, u.workspace = ADDR(40), u.workspace_bytes = pl.stats_bytes;
    CHECKF(topk_check(&p, &u, TOPK_STATS, ADDR(30), &H100, &q, &tq, &pl) == FLCE_OK, "%s", flce_last_error());
    u.comm = ADDR(20);
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.workspace_bytes="));
    /* the finish half: no inputs needed, the outputs and the gathered blocks required */
    u = t, u.hidden = NULL, u.weight = NULL;
    CHECKF(topk_check(&p, &u, TOPK_FINISH, ADDR(31), &H100, &q, &tq, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(topk_check(&p, &u, TOPK_FINISH, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("gathered: NULL"));
    u.indices = NULL;
    CHECK(topk_check(&p, &u, TOPK_FINISH, ADDR(31), &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.indices: NULL"));
    /* a caller of the first tensors layout (no comm) */
    u = t, u.comm = ADDR(20); /* past the old size: never read */
    u.struct_size = offsetof(flce_topk_tensors, workspace_bytes) + sizeof u.workspace_bytes;
    CHECK(topk_check(&p, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_ERR_INVALID_ARGUMENT &&
          says("tensors.comm: NULL"));
    CHECKF(topk_check(&one, &u, TOPK_ALL, NULL, &H100, &q, &tq, &pl) == FLCE_OK && tq.comm == NULL &&
           tq.struct_size == sizeof tq, "%s", flce_last_error());
    CHECK(flce_topk_stats(NULL, &p, &t, ADDR(30), NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
    CHECK(flce_topk_finish(NULL, &p, &t, ADDR(31), NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
}

static void null_context_and_bytes_are_named(void)
{
    flce_distill_problem p = good();
    flce_distill_tensors t = good_tensors();
    uint64_t bytes = 0;
    CHECK(flce_distill_loss_and_grad(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
    CHECK(flce_distill_workspace_size(NULL, &p, &bytes) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
    CHECK(flce_distill_prepare(NULL, &p, &t) == FLCE_ERR_INVALID_ARGUMENT && says("ctx: NULL"));
}

/* The fp32-logits path: reverse KL and JSD (and fp32 inputs, and FLCE_DEV=compact=0) */
static void chunks_follow_the_budget(void)
{
    flce_distill_problem p = good();
    p.divergence = FLCE_DIVERGENCE_REVERSE_KL;
    distill_plan pl;
    const uint64_t ld = 32000, row = ld * 10; /* teacher fp32 Z + student fp32 Z + 16-bit dZ */
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.chunk_rows == 1024 && pl.chunks == 1 && pl.ld == 32000); /* 4 GiB / 320000 = 13421 rows ≥ N */
    CHECK(!pl.compact && !pl.student.compact && !pl.student.qrows && !pl.student.recompute && pl.student.off_z != pl.student.off_dz);
    CHECK(!pl.student.need_dw_acc); /* one chunk: dWs straight into the caller's buffer */
    CHECK(pl.zt_offset >= pl.student.workspace_bytes && pl.workspace_bytes >= pl.zt_offset + 1024 * ld * 4 + 1024 * 4);
    /* A memory_budget bounds the whole workspace (distill_plan_make). 300 rows of logits: chunks of
     * whole 128-row blocks, balanced, and no room for a dWs buffer beside them: each chunk's dWs added
     * into the caller's dW in the dtype */
    p.memory_budget = row * 300;
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECKF(pl.chunk_rows == 256 && pl.chunks == 4, "%lld rows x %lld", (long long)pl.chunk_rows, (long long)pl.chunks);
    CHECK(pl.student.dw_in_dtype && !pl.student.need_dw_acc && !pl.student.dz_all_rows && !pl.student.off_dw_acc &&
          !pl.student.dw.plain_out && pl.workspace_bytes <= p.memory_budget);
    /* room for every token's dZs beside chunks at most one more than dWs in the dtype would take:
     * dZs of every token kept (no larger than the fp32 V x Ds accumulator), dWs once */
    p.memory_budget = row * 500;
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECKF(pl.chunks == 4 && !pl.student.need_dw_acc && pl.student.dz_all_rows && !pl.student.off_dw_acc &&
           !pl.student.dw_in_dtype, "%lld chunks", (long long)pl.chunks);
    CHECK(pl.student.off_dz != pl.student.off_z && pl.student.dw.plain_out);
    CHECK(pl.student.workspace_bytes >= pl.student.off_dz + 1024 * ld * 2 && pl.workspace_bytes <= p.memory_budget);
    p.hidden_student = 256, p.memory_budget = row * 400; /* (N − rows)·V·2 > V·Ds·4: the fp32 accumulator */
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.chunks == 4 && pl.student.need_dw_acc && !pl.student.dz_all_rows && !pl.student.dw_in_dtype &&
          pl.workspace_bytes <= p.memory_budget);
    p.hidden_student = 2048;
    p.memory_budget = 100 * row; /* under one 128-row block: as many rows as fit */
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.chunk_rows <= 100 && pl.chunks * pl.chunk_rows >= 1024);
    p.memory_budget = row - 1; /* not one token's row */
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("problem.memory_budget=") &&
          says("one token's logits"));
    p.memory_budget = 0, p.dtype = FLCE_DTYPE_F32; /* fp32: dZ in place of the student's Z */
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.student.off_dz == pl.student.off_z);
    CHECK(pl.zt_offset % 256 == 0 && pl.per_token_offset % 256 == 0 && pl.count_offset % 256 == 0 &&
          pl.labels_offset % 256 == 0);
    /* with labels given there is no stand-in labels array */
    flce_distill_tensors t = good_tensors();
    distill_plan with;
    p.dtype = FLCE_DTYPE_BF16;
    CHECKF(distill_plan_make(&p, &H100, &t, &with) == FLCE_OK, "%s", flce_last_error());
    CHECK(with.per_token_offset == with.labels_offset);
}

/* Forward KL on 16-bit inputs: both passes compact (4 bytes per logit), the student's with the
 * soft-target sums over the teacher's p̃ in the same column groups, dZs in place of its p̃. */
static void forward_kl_plans_the_compact_path(void)
{
    flce_distill_problem p = good();
    distill_plan pl;
    const uint64_t ld = 32000;
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.compact && pl.student.compact && pl.teacher.compact && !pl.student.qrows && !pl.teacher.qrows);
    CHECK(pl.student.logits.opts == SPEC_OPT_SOFT && !(pl.teacher.logits.opts & SPEC_OPT_SOFT));
    CHECK(pl.student.tile_cols == pl.teacher.tile_cols && pl.student.tile_max_ld == pl.teacher.tile_max_ld);
    CHECK(pl.student.off_z == pl.student.off_dz && pl.chunk_rows == 1024 && pl.chunks == 1);
    CHECK(pl.pt_offset >= pl.student.workspace_bytes && pl.teacher_tile_max >= pl.pt_offset + 1024 * ld * 2 &&
          pl.lse_t_offset % 256 == 0 && pl.part_xs_offset % 256 == 0 && pl.per_token_offset % 256 == 0);
    CHECK(spec_validate(&pl.student.logits) == FLCE_OK);
    const uint64_t row = 2 * (ld * 2 + (ld + 63) / 64 * 4); /* what the plan counts per token */
    p.memory_budget = row * 300;
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECKF(pl.compact && pl.chunk_rows <= 300 && pl.chunks * pl.chunk_rows >= 1024 &&
           (uint64_t)pl.chunk_rows * ld * 4 <= p.memory_budget, "%lld rows x %lld", (long long)pl.chunk_rows,
           (long long)pl.chunks);
    /* (no room for a dWs buffer: dWs added into the caller's dW per chunk) */
    CHECK(pl.student.dw_in_dtype && !pl.student.need_dw_acc && !pl.student.dz_all_rows &&
          pl.workspace_bytes <= p.memory_budget);
    /* the student's p̃ / dZs of every token kept where it fits and takes no more than the fp32 V x Ds
     * accumulator ((N − chunk rows)·V·2 ≤ V·Ds·4), dWs once */
    p.memory_budget = row * 700;
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.chunks == 3 && !pl.student.need_dw_acc && pl.student.dz_all_rows && !pl.student.off_dw_acc);
    CHECK(pl.student.off_z == pl.student.off_dz && pl.student.dw.plain_out && pl.student.logits.opts == SPEC_OPT_SOFT);
    CHECK(pl.student.workspace_bytes >= pl.student.off_dz + 1024 * ld * 2 && pl.pt_offset >= pl.student.workspace_bytes);
    CHECK(pl.student.off_tile_max + (uint64_t)pl.chunk_rows * (uint64_t)pl.student.tile_max_ld * 4 <=
          pl.student.workspace_bytes); /* the maxima stay one chunk's */
    p.hidden_student = 256; /* (1024 − 384)·V·2 > V·256·4: the accumulator instead */
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.compact && pl.chunks == 3 && pl.student.need_dw_acc && !pl.student.dz_all_rows &&
          pl.workspace_bytes <= p.memory_budget);
    /* under TP the budget is the chunks' logits (every rank cuts the tokens alike) and the
     * accumulator comes on top */
    p.hidden_student = 2048, p.tp_size = 2, p.vocab_total = 64000, p.memory_budget = row * 300;
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.compact && pl.chunks == 4 && !pl.student.dz_all_rows && !pl.student.dw_in_dtype &&
          pl.student.need_dw_acc);
    p.tp_size = 1, p.vocab_total = 0;
    p.memory_budget = row - 1;
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("problem.memory_budget="));
    p.memory_budget = 0;
    p.divergence = FLCE_DIVERGENCE_JSD, p.beta = 0.0f; /* JSD at β = 0 is forward KL */
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK && pl.compact);
    p.beta = 0.5f;
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK && !pl.compact);
    p.divergence = FLCE_DIVERGENCE_FORWARD_KL, p.dtype = FLCE_DTYPE_F32;
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK && !pl.compact);
    p.dtype = FLCE_DTYPE_F16;
    dev_switch_set("compact", "0"); /* the developer switch keeps the fp32 logits */
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK && !pl.compact);
    dev_switch_set("compact", NULL);
    CHECK(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK && pl.compact);
    /* a soft-target spec is a compact logits pass's only */
    kernel_spec s = pl.student.logits;
    s.compact = 0;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && says("soft-target"));
    s = pl.student.logits, s.opts |= SPEC_OPT_ZSUM;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && says("soft-target"));
    /* and it compiles (the student pass's kernel on sm_90a, the Hopper path CI cannot run) */
    if (!nvrtc_load_error()) {
        char *src = NULL;
        void *cubin = NULL;
        size_t len = 0;
        flce_status st = emit_source(&pl.student.logits, &src);
        if (st == FLCE_OK) st = nvrtc_compile(src, "soft", 90, &cubin, &len);
        CHECKF(st == FLCE_OK && len > 0, "%s", flce_last_error());
        free(src), free(cubin);
    }
}

/* Tensor parallelism: its fields named when wrong, tensors.comm required, and its plans (compact and
 * fp32-logits, the teacher as weights or top-k): the student's CE plan sums dHs over the ranks, the
 * workspace holds the exchanges' buffers. */
static void tensor_parallel_is_checked_and_planned(void)
{
    static const struct {
        int64_t offset, total;
        int rank, size;
        const char *says;
    } bad[] = {
        {0, 64000, 2, 2, "problem.tp_rank=2"},
        {0, 64000, -1, 2, "problem.tp_rank=-1"},
        {0, 64000, 0, 0, "tp_size=0"},
        {0, 64000, 0, FLCE_MAX_TP + 1, "tp_size=4097"},
        {-8, 64000, 0, 2, "problem.vocab_offset=-8"},
        {40000, 64000, 1, 2, "problem.vocab_offset=40000"},
        {32000, 0, 0, 1, "with tp_size=1"},
        {0, 64000, 0, 1, "with tp_size=1"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        flce_distill_problem p = good();
        p.vocab_offset = bad[k].offset, p.vocab_total = bad[k].total, p.tp_rank = bad[k].rank, p.tp_size = bad[k].size;
        CHECKF(flce_distill_problem_validate(&p) == FLCE_ERR_INVALID_ARGUMENT && says(bad[k].says), "case %zu: %s", k,
               flce_last_error());
    }
    flce_distill_problem p = good();
    p.vocab_offset = 32000, p.vocab_total = 64000, p.tp_rank = 1, p.tp_size = 2;
    CHECKF(flce_distill_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
    distill_plan pl;
    flce_distill_problem f32k = p; /* fp32 inputs with a top-k teacher: the fp32 path's two reads, no teacher lse */
    f32k.dtype = FLCE_DTYPE_F32, f32k.teacher_topk = 8, f32k.hidden_teacher = 0;
    CHECKF(flce_distill_problem_validate(&f32k) == FLCE_OK, "%s", flce_last_error());
    CHECKF(distill_plan_make(&f32k, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(!pl.compact && pl.topk == 8 && pl.tp == 2 && pl.student.need_dh_tp && !pl.lse_t_offset && pl.aw_offset &&
          pl.labels_offset >= pl.aw_offset + (uint64_t)pl.chunk_rows * 8);
    /* the fp32-logits path under TP (reverse KL, JSD with β > 0, fp32 inputs): the same exchanges'
     * buffers, the teacher's lse per row, dHs summed over the ranks */
    const flce_divergence fp32_divs[] = {FLCE_DIVERGENCE_REVERSE_KL, FLCE_DIVERGENCE_JSD, FLCE_DIVERGENCE_FORWARD_KL};
    for (int k = 0; k < 3; k++) {
        flce_distill_problem f = p;
        f.divergence = fp32_divs[k], f.beta = 0.5f;
        if (k == 2) f.dtype = FLCE_DTYPE_F32;
        CHECKF(flce_distill_problem_validate(&f) == FLCE_OK, "%s", flce_last_error());
        CHECKF(distill_plan_make(&f, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
        const uint64_t r = (uint64_t)pl.chunk_rows, blk = 4 * (8 + r * 4);
        CHECKF(!pl.compact && pl.tp == 2 && pl.student.need_dh_tp && pl.student.collective && pl.zt_offset &&
               pl.lse_t_offset >= pl.teacher_target + r * 4 && pl.tp_send_offset >= pl.lse_t_offset + r * 4 &&
               pl.tp_recv_offset >= pl.tp_send_offset + blk && pl.lse_s_offset >= pl.tp_recv_offset + 2 * blk &&
               pl.aw_offset > pl.x_offset && pl.labels_offset >= pl.aw_offset + r * 8, "divergence %d", k);
    }
    flce_distill_problem ce = p; /* the CE term runs under TP */
    ce.ce_weight = 0.5f;
    CHECKF(flce_distill_problem_validate(&ce) == FLCE_OK, "%s", flce_last_error());
    CHECKF(distill_plan_make(&p, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.compact && pl.tp == 2 && pl.student.need_dh_tp && pl.student.collective && !pl.teacher.collective);
    CHECK(pl.student.tile_cols == pl.teacher.tile_cols && pl.student.off_dh_tp > 0);
    const uint64_t rows = (uint64_t)pl.chunk_rows, block = 4 * (8 + rows * 4);
    CHECK(pl.tp_recv_offset >= pl.tp_send_offset + block && pl.lse_s_offset >= pl.tp_recv_offset + 2 * block &&
          pl.x_offset > pl.lse_s_offset && pl.aw_offset > pl.x_offset && pl.labels_offset >= pl.aw_offset + rows * 8 &&
          pl.workspace_bytes > pl.count_offset);
    flce_distill_problem k = p; /* the teacher as top-k: one exchange (no (a, w) buffer) */
    k.teacher_topk = 8, k.hidden_teacher = 0;
    CHECKF(distill_plan_make(&k, &H100, NULL, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(pl.compact && pl.topk == 8 && pl.tp == 2 && pl.student.need_dh_tp && pl.x_offset > pl.lse_s_offset &&
          !pl.aw_offset && pl.labels_offset >= pl.x_offset + rows * 4);
    distill_plan one;
    flce_distill_problem q = good();
    CHECK(distill_plan_make(&q, &H100, NULL, &one) == FLCE_OK && one.tp == 0 && !one.student.need_dh_tp);
    /* tensors.comm: required with TP, refused without */
    flce_distill_tensors t = good_tensors();
    flce_distill_problem out;
    CHECK(distill_check(&p, &t, &H100, &out, &pl) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.comm: NULL"));
    t.comm = (void *)(uintptr_t)0x1000;
    CHECKF(distill_check(&p, &t, &H100, &out, &pl) == FLCE_OK, "%s", flce_last_error());
    CHECK(distill_check(&q, &t, &H100, &out, &one) == FLCE_ERR_INVALID_ARGUMENT && says("tensors.comm: given"));
}

static void jsd_ends_are_emitted_as_the_kls(void)
{
    distill_kernel_spec s = {90, FLCE_DTYPE_BF16, FLCE_DIVERGENCE_JSD, 0.0f, 1.0f, 0.0f, 1, 32, FLCE_REDUCTION_MEAN};
    char *src = NULL;
    CHECK(emit_distill_source(&s, &src) == FLCE_OK && strstr(src, "#define DISTILL_DIV 0"));
    free(src);
    s.beta = 1.0f;
    CHECK(emit_distill_source(&s, &src) == FLCE_OK && strstr(src, "#define DISTILL_DIV 1"));
    free(src);
    s.beta = 0.5f;
    CHECK(emit_distill_source(&s, &src) == FLCE_OK && strstr(src, "#define DISTILL_DIV 2"));
    free(src);
    s.ce_weight = 1.0f, s.temperature = 2.0f;
    CHECK(emit_distill_source(&s, &src) == FLCE_ERR_INVALID_ARGUMENT && !src);
}

/* The module as the runtime asks for it: a kernel_spec of role ROLE_DISTILL through emit_source. */
static void distill_spec_emits_through_the_spec_path(void)
{
    kernel_spec s;
    memset(&s, 0, sizeof s);
    s.sm = 90, s.dtype = FLCE_DTYPE_F16, s.role = ROLE_DISTILL, s.hidden = 64, s.vocab_shard = 1000, s.label_bits = 64, s.reduction = FLCE_REDUCTION_SUM;
    s.temperature = 1.0f, s.divergence = FLCE_DIVERGENCE_REVERSE_KL, s.ce_weight = 0.25f, s.has_labels = 1;
    char *src = NULL;
    CHECKF(emit_source(&s, &src) == FLCE_OK, "%s", flce_last_error());
    CHECK(src && strstr(src, "#define FLCE_DTYPE 1") && strstr(src, "#define DISTILL_DIV 1") &&
          strstr(src, "#define FLCE_LABEL_BITS 64") && strstr(src, "flce_distill_row"));
    free(src);
    const char *const *names = emit_kernel_names(ROLE_DISTILL);
    CHECK(names && !strcmp(names[0], "flce_distill_count") && !strcmp(names[1], "flce_distill_row") &&
          !strcmp(names[2], "flce_distill_reduce") && !strcmp(names[3], "flce_topk_row") && !strcmp(names[4], "flce_distill_lse") &&
          !strcmp(names[5], "flce_distill_row_compact") && !strcmp(names[6], "flce_distill_row_topk") && !strcmp(names[7], "flce_distill_row_topk_compact") && !strcmp(names[8], "flce_distill_topk_sort") &&
          !strcmp(names[9], "flce_distill_tp_pack") && !strcmp(names[10], "flce_distill_tp_merge") &&
          !strcmp(names[11], "flce_distill_tp_out") && !strcmp(names[12], "flce_topk_merge") && !names[13]);
    CHECK(13 <= CTX_MAX_KERNELS); /* a module's kernels fit the context's table (context.h) */
    char line[256];
    spec_summary(&s, line, sizeof line);
    CHECKF(strstr(line, "distill f16 div=1") != NULL, "%s", line);
    s.divergence = 7;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && says("divergence=7"));
}

/* Every variant of the module (the row kernels) compiles for both arches CI targets. */
/* Of the 9 (divergence, CE configuration) variants, which `n` of them an arch compiles: all 9, one
 * per divergence (3: each with another CE configuration), or the first (1). */
static int variant_taken(int n, int d, int ce) { return n == 9 || (n == 3 && ce == d) || (n == 1 && d == 0 && ce == 0); }

static void row_kernels_compile_for_sm_80_and_sm_90a(void)
{
    if (nvrtc_load_error()) {
        printf("  (NVRTC not loadable here: %s; not compiled)\n", nvrtc_load_error());
        return;
    }
    /* Each arch: every divergence with each label configuration (no labels; labels; labels + CE,
     * int64), the reduction and dtype rotating so that each arch meets each of them with each
     * divergence: 18 compiles, not 54 (CI's time budget; NVRTC ~1 s each, uncached) */
    int sms[] = {80, 90}, compiled = 0;
    /* The module has no arch-dependent code (no __CUDA_ARCH__): sm_90a compiles the 9 variants,
     * sm_80 one per divergence (its CE configuration and reduction still rotating), 12 compiles of
     * ~2.5 s (the module grew with the TP kernels: CI's budget). A sanitized build compiles one
     * variant per arch: NVRTC is not instrumented, and the plain build's compiles took ~95 s of
     * CI's sanitizer workflow. */
#ifdef FLCE_TEST_SANITIZED
    const int variants[2] = {1, 1};
    printf("  (sanitized build: 1 variant per arch; the plain build compiles 3 for sm_80, 9 for sm_90a)\n");
#else
    const int variants[2] = {3, 9};
#endif
    for (int a = 0; a < 2; a++)
        for (int d = 0; d < 3; d++)
            for (int ce = 0; ce < 3; ce++)
                for (int r = (d + ce + a) % 3, once = variant_taken(variants[a], d, ce); once; once = 0) {
                    distill_kernel_spec s = {sms[a], (flce_dtype)((d + r) % 3), (flce_divergence)d, 0.3f, ce == 2 ? 1.0f : 2.0f,
                                             ce == 2 ? 0.5f : 0.0f, ce > 0, ce == 2 ? 64 : 32, (flce_reduction)r};
                    char *src = NULL;
                    void *cubin = NULL;
                    size_t len = 0;
                    flce_status st = emit_distill_source(&s, &src);
                    if (st == FLCE_OK) st = nvrtc_compile(src, "distill", s.sm, &cubin, &len);
                    CHECKF(st == FLCE_OK && len > 0, "sm %d div %d ce %d reduction %d: %s", s.sm, d, ce, r,
                           flce_last_error());
                    compiled += st == FLCE_OK;
                    free(src);
                    free(cubin);
                }
    printf("  %d module variants compiled\n", compiled);
}

/* A memory_budget given bounds the whole workspace (runtime/distill.c distill_plan_make) on every
 * path — compact forward KL, the fp32 path (reverse KL, JSD, fp32 inputs), the top-k teacher — with
 * and without the labels array, at budgets from under one token's row to past one chunk: each plan
 * fits its budget or is FLCE_ERR_INVALID_ARGUMENT naming memory_budget, a plan that fits never
 * becomes too small at a larger budget, and dWs takes exactly one way of building up. */
static void every_budget_given_is_kept(void)
{
    struct { flce_divergence div; flce_dtype dtype; int topk; int64_t ds; } paths[] = {
        {FLCE_DIVERGENCE_FORWARD_KL, FLCE_DTYPE_BF16, 0, 2048}, {FLCE_DIVERGENCE_FORWARD_KL, FLCE_DTYPE_F16, 0, 256},
        {FLCE_DIVERGENCE_REVERSE_KL, FLCE_DTYPE_BF16, 0, 2048}, {FLCE_DIVERGENCE_JSD, FLCE_DTYPE_F16, 0, 256},
        {FLCE_DIVERGENCE_FORWARD_KL, FLCE_DTYPE_F32, 0, 512}, {FLCE_DIVERGENCE_FORWARD_KL, FLCE_DTYPE_BF16, 16, 2048},
        {FLCE_DIVERGENCE_FORWARD_KL, FLCE_DTYPE_F32, 16, 128},
    };
    int planned = 0, in_dtype = 0, once = 0, acc = 0;
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++)
        for (int labels = 0; labels < 2; labels++) {
            flce_distill_problem p = good();
            p.divergence = paths[k].div, p.dtype = paths[k].dtype, p.hidden_student = paths[k].ds;
            p.beta = 0.5f;
            flce_distill_tensors t = good_tensors();
            if (paths[k].topk) {
                p.teacher_topk = paths[k].topk, p.hidden_teacher = 0;
                t.teacher_hidden = t.teacher_weight = NULL;
                t.teacher_topk_indices = ADDR(10), t.teacher_topk_logprobs = (const float *)ADDR(11);
            }
            if (!labels) t.labels = NULL;
            int fitted = 0;
            /* 1.3× steps from 40 KB to 400 MB: under one row (32000-column rows of 64-320 KB) to one chunk */
            for (double b = 40e3; b < 400e6; b *= 1.3) {
                p.memory_budget = (uint64_t)b;
                flce_distill_problem q;
                distill_plan pl;
                flce_status st = distill_check(&p, &t, &H100, &q, &pl);
                if (st != FLCE_OK) {
                    CHECKF(st == FLCE_ERR_INVALID_ARGUMENT && says("problem.memory_budget=") && !fitted,
                           "path %zu labels %d budget %llu: %d %s", k, labels, (unsigned long long)p.memory_budget,
                           st, flce_last_error());
                    continue;
                }
                fitted = 1, planned++;
                CHECKF(pl.workspace_bytes <= p.memory_budget, "path %zu labels %d: %llu bytes over a budget of %llu",
                       k, labels, (unsigned long long)pl.workspace_bytes, (unsigned long long)p.memory_budget);
                const plan *s = &pl.student;
                CHECK(s->dw_in_dtype + s->dz_all_rows + s->need_dw_acc <= 1);
                CHECK(pl.chunks > 1 || (!s->dw_in_dtype && !s->dz_all_rows && !s->need_dw_acc));
                in_dtype += s->dw_in_dtype, once += s->dz_all_rows, acc += s->need_dw_acc;
            }
            CHECKF(fitted, "path %zu labels %d: no budget up to 400 MB planned", k, labels);
        }
    CHECKF(in_dtype && once && acc, "plans %d: dWs in the dtype %d, once %d, accumulated %d", planned, in_dtype, once,
           acc);
}

int main(void)
{
    RUN(defaults_are_those_of_the_header);
    RUN(struct_layout_is_the_bindings);
    RUN(every_bad_problem_field_is_named);
    RUN(jsd_ends_and_every_divergence_validate);
    RUN(teacher_topk_is_checked_and_planned);
    RUN(every_bad_tensor_is_named);
    RUN(null_context_and_bytes_are_named);
    RUN(chunks_follow_the_budget);
    RUN(forward_kl_plans_the_compact_path);
    RUN(every_budget_given_is_kept);
    RUN(tensor_parallel_is_checked_and_planned);
    RUN(jsd_ends_are_emitted_as_the_kls);
    RUN(distill_spec_emits_through_the_spec_path);
    RUN(row_kernels_compile_for_sm_80_and_sm_90a);
    RUN(topk_bad_arguments_are_named);
    RUN(topk_chunks_follow_the_budget);
    RUN(topk_tp_fields_are_named);
    RUN(topk_split_phase_checks_and_sizes);
    FINISH();
}
