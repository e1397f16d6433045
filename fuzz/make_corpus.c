/*
 * make_corpus.c — writes the hand-made seed corpora under fuzz/corpus/ (problem/, cache_entry/,
 * tool_args/, tune_table/), so the seeds are reviewable as code and reproducible after a format change:
 *
 *     fuzz_make_corpus <fuzz/corpus>
 *
 * Each seed aims at one branch: a valid problem per op, dtype and arch, one seed per check of
 * flce_problem_validate and spec_validate, well-formed cache entries written by cache_store and
 * their truncated and bit-flipped variants, tool command lines good and bad, and autotune tables
 * with one variant per way a line is refused. Reproducers of
 * what the fuzzer found are written here too (crash_*, emit_found_*), so they survive a layout
 * change. Files are overwritten by name; other files in the directories are left alone.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "cache_input.h"
#include "hash.h"
#include "problem_input.h"
#include "tune_table.h"

#define PATH_CAP 4096

static char root[PATH_CAP];
static int written;

/* ---- output ----------------------------------------------------------------------------- */

typedef struct wbuf {
    uint8_t b[8192];
    size_t n;
} wbuf;

static void put(wbuf *w, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) w->b[w->n++] = (uint8_t)(v >> (8 * i));
}

static void put_f32(wbuf *w, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put(w, u, 4);
}

/* "<a>/<b>" into out (PATH_CAP bytes); exits when it does not fit. */
static void join(char *out, const char *a, const char *b)
{
    int n = snprintf(out, PATH_CAP, "%s/%s", a, b);
    if (n <= 0 || n >= PATH_CAP) {
        fprintf(stderr, "path too long: %s/%s\n", a, b);
        exit(1);
    }
}

static void write_seed(const char *target, const char *name, const void *data, size_t size)
{
    char dir[PATH_CAP], path[PATH_CAP];
    join(dir, root, target);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", dir, strerror(errno));
        exit(1);
    }
    join(path, dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "writing %s: %s\n", path, strerror(errno));
        exit(1);
    }
    written++;
}

/* ---- fuzz_problem ----------------------------------------------------------------------- */

typedef struct seed {
    unsigned flags;
    uint32_t struct_size, api_version; /* written when the flags say so */
    flce_problem p;
    int op, sm, num_sms;
    unsigned outputs;
    kernel_spec s;
} seed;

/* A valid chunked problem on an H100; its raw spec is all zero (rejected: sm=0), so only seeds
 * that set a spec, or take the plan's, reach emit_source with a valid one. */
static seed base_problem(void)
{
    seed x;
    memset(&x, 0, sizeof x);
    x.flags = PI_SPEC_FROM_PLAN;
    flce_problem_init(&x.p);
    x.p.tokens = 300, x.p.hidden = 136, x.p.vocab_shard = 1001;
    x.op = FLCE_OP_LOSS_AND_GRAD, x.sm = 90, x.num_sms = 132;
    return x;
}

/* A valid GEMM spec, for seeds about spec_validate; the problem in front is invalid (tokens=0). */
static seed base_spec(spec_role role, int sm, flce_dtype dtype)
{
    seed x = base_problem();
    x.flags = 0;
    x.p.tokens = 0;
    x.s.sm = sm, x.s.dtype = dtype, x.s.hidden = 4096, x.s.vocab_shard = 32000;
    x.s.role = role, x.s.label_bits = 32, x.s.reduction = FLCE_REDUCTION_MEAN;
    /* The mma.sync tile on every arch (validate_tile's checks); wgmma seeds set theirs. */
    x.s.tile = (spec_tile){128, 128, dtype == FLCE_DTYPE_F32 ? 16 : 32, 3, 2, 4, MAINLOOP_MMA_SYNC};
    return x;
}

/* The Hopper main loop's tile (validate_wgmma's checks), cp.async-fed. */
static seed base_wgmma(spec_role role, flce_dtype dtype)
{
    seed x = base_spec(role, 90, dtype);
    x.s.tile = (spec_tile){128, 256, 64, 4, 8, 1, MAINLOOP_WGMMA_CP_ASYNC};
    return x;
}

/* The Blackwell main loop's tile (validate_tcgen05's checks): TMA-fed, tensor-memory accumulators. */
static seed base_tcgen05(spec_role role, flce_dtype dtype)
{
    seed x = base_spec(role, 100, dtype);
    x.s.tile = (spec_tile){128, 256, 64, 4, 8, 1, MAINLOOP_TCGEN05};
    return x;
}

static void emit_problem(const char *name, const seed *x)
{
    wbuf w = {.n = 0};
    const flce_problem *p = &x->p;
    put(&w, x->flags, 1);
    if ((x->flags & PI_SIZE_MASK) == PI_SIZE_GIVEN) put(&w, x->struct_size, 4);
    if (x->flags & PI_API_GIVEN) put(&w, x->api_version, 4);
    put(&w, (uint64_t)p->tokens, 8);
    put(&w, (uint64_t)p->hidden, 8);
    put(&w, (uint64_t)p->vocab_shard, 8);
    put(&w, (uint64_t)p->vocab_offset, 8);
    put(&w, (uint64_t)p->vocab_total, 8);
    put(&w, (uint32_t)p->dtype, 4);
    put(&w, (uint32_t)p->label_bits, 4);
    put(&w, (uint32_t)p->reduction, 4);
    put(&w, (uint64_t)p->ignore_index, 8);
    put_f32(&w, p->label_smoothing);
    put_f32(&w, p->z_loss);
    put_f32(&w, p->softcap);
    put_f32(&w, p->temperature);
    put(&w, (uint32_t)p->has_bias, 4);
    put(&w, (uint32_t)p->tp_rank, 4);
    put(&w, (uint32_t)p->tp_size, 4);
    put(&w, (uint32_t)p->allow_tf32, 4);
    put(&w, (uint32_t)p->deterministic, 4);
    put(&w, (uint32_t)p->strategy, 4);
    put(&w, p->memory_budget, 8);
    put(&w, (uint32_t)p->has_class_weights, 4);
    put(&w, (uint32_t)p->accumulate_grad_hidden, 4);
    put(&w, (uint32_t)p->accumulate_grad_weight, 4);
    put(&w, (uint32_t)p->sequence_parallel, 4);
    put(&w, (uint32_t)x->op, 1);
    put(&w, (uint32_t)x->sm, 4);
    put(&w, (uint32_t)x->num_sms, 4);
    put(&w, x->outputs, 2);
    const kernel_spec *s = &x->s;
    put(&w, (uint32_t)s->sm, 4);
    put(&w, (uint32_t)s->dtype, 4);
    put(&w, (uint64_t)s->hidden, 8);
    put(&w, (uint64_t)s->vocab_shard, 8);
    put(&w, (uint32_t)s->role, 4);
    put(&w, (uint32_t)s->tile.bm, 4);
    put(&w, (uint32_t)s->tile.bn, 4);
    put(&w, (uint32_t)s->tile.bk, 4);
    put(&w, (uint32_t)s->tile.stages, 4);
    put(&w, (uint32_t)s->tile.warps_m, 4);
    put(&w, (uint32_t)s->tile.warps_n, 4);
    put(&w, (uint32_t)s->tile.loop, 4);
    put(&w, (uint32_t)s->label_bits, 4);
    put(&w, (uint32_t)s->reduction, 4);
    put(&w, s->opts, 4);
    put_f32(&w, s->softcap);
    put_f32(&w, s->temperature);
    put_f32(&w, s->smoothing);
    put_f32(&w, s->z_loss);
    write_seed("problem", name, w.b, w.n);
}

/* Reproducers of bugs the fuzzer found, trimmed as libFuzzer's minimizer would: missing bytes read
 * as 0, so trailing zero bytes are dropped (a crash_ seed ends with its last meaningful field). */
static void emit_crash(const char *name, const seed *x)
{
    char path[PATH_CAP], dir[PATH_CAP];
    emit_problem(name, x);
    join(dir, root, "problem");
    join(path, dir, name);
    FILE *f = fopen(path, "rb");
    uint8_t b[8192];
    size_t n = f ? fread(b, 1, sizeof b, f) : 0;
    if (f) fclose(f);
    while (n && b[n - 1] == 0) n--;
    written--; /* rewritten below, counted once */
    write_seed("problem", name, b, n);
}

static void tile(seed *x, int bm, int bn, int bk, int stages, int wm, int wn)
{
    x->s.tile = (spec_tile){bm, bn, bk, stages, wm, wn, MAINLOOP_MMA_SYNC};
}

/* Raw specs that validate: spec_compile.c compiles the first ten distinct ones in name order,
 * hence the "emit_ok" names (sorted before the "ok_" problems). */
static void problem_valid_specs(void)
{
    seed x = base_spec(ROLE_DH, 100, FLCE_DTYPE_BF16);
    tile(&x, 256, 128, 64, 3, 4, 2);
    emit_problem("emit_ok_dh_sm100_bf16_256x128x64", &x);
    x = base_spec(ROLE_DW, 90, FLCE_DTYPE_F32);
    tile(&x, 128, 64, 32, 2, 2, 2);
    emit_problem("emit_ok_dw_sm90_f32_128x64x32", &x);
    x = base_spec(ROLE_LOGITS, 80, FLCE_DTYPE_F16);
    tile(&x, 64, 64, 16, 2, 1, 1);
    x.s.label_bits = 64;
    emit_problem("emit_ok_logits_sm80_f16_64x64_one_warp_i64", &x);
    x = base_wgmma(ROLE_DW, FLCE_DTYPE_F16);
    x.s.tile.bn = 192, x.s.tile.stages = 3;
    emit_problem("emit_ok_dw_sm90_f16_wgmma_128x192x64", &x);
    /* the TMA-fed Hopper tiles: MN-major operands (dW) and the logits epilogue with every option */
    x = base_wgmma(ROLE_DW, FLCE_DTYPE_F16);
    x.s.tile.loop = MAINLOOP_WGMMA_TMA;
    emit_problem("emit_ok_dw_sm90_f16_wgmma_tma_128x256x64", &x);
    x = base_wgmma(ROLE_LOGITS, FLCE_DTYPE_BF16);
    x.s.tile.loop = MAINLOOP_WGMMA_TMA, x.s.label_bits = 64, x.s.softcap = 30.f, x.s.temperature = 0.8f;
    x.s.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX;
    emit_problem("emit_ok_logits_sm90_bf16_wgmma_tma_every_option", &x);
    /* the tcgen05 tiles (sm_100a): MN-major operands, and the logits epilogue with every option */
    x = base_tcgen05(ROLE_DW, FLCE_DTYPE_F16);
    emit_problem("emit_ok_dw_sm100_f16_tcgen05_128x256x64", &x);
    x = base_tcgen05(ROLE_LOGITS, FLCE_DTYPE_BF16);
    x.s.label_bits = 64, x.s.softcap = 30.f, x.s.temperature = 0.8f;
    x.s.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX;
    emit_problem("emit_ok_logits_sm100_bf16_tcgen05_every_option", &x);
    x = base_spec(ROLE_LOGITS, 90, FLCE_DTYPE_BF16);
    x.s.hidden = (int64_t)1 << 40;
    emit_problem("emit_ok_logits_sm90_hidden_2e40", &x);
    x = base_spec(ROLE_LOGITS, 89, FLCE_DTYPE_BF16);
    x.s.vocab_shard = INT64_MAX;
    emit_problem("emit_ok_logits_sm89_vocab_int64_max", &x);
    x = base_spec(ROLE_ROWOPS, 120, FLCE_DTYPE_F16);
    x.s.label_bits = 64, x.s.reduction = FLCE_REDUCTION_NONE, x.s.vocab_shard = 1;
    memset(&x.s.tile, 0, sizeof x.s.tile); /* rowops ignores the tile */
    emit_problem("emit_ok_rowops_sm120_f16_i64_none_v1", &x);
    x = base_spec(ROLE_DW, 86, FLCE_DTYPE_BF16);
    tile(&x, 32, 32, 128, 2, 2, 2);
    x.s.hidden = 8;
    emit_problem("emit_ok_dw_sm86_bf16_32x32x128_d8", &x);
    x = base_spec(ROLE_LOGITS, 90, FLCE_DTYPE_BF16);
    x.s.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX;
    x.s.softcap = 30.0f, x.s.temperature = 0.7f;
    emit_problem("emit_ok_logits_sm90_every_option", &x);
    x = base_spec(ROLE_ROWOPS, 80, FLCE_DTYPE_BF16);
    x.s.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX;
    x.s.softcap = 3.0e38f, x.s.temperature = 1.0e-30f, x.s.smoothing = 0.99999994f;
    x.s.z_loss = 3.0e38f, x.s.reduction = FLCE_REDUCTION_SUM;
    emit_problem("emit_ok_rowops_sm80_extreme_finite_options", &x);
}

/* Specs that validate but whose source NVRTC rejects (found while writing this corpus): named
 * "emit_found_" so spec_compile.c compiles them first. They fail until spec_validate and
 * flce_problem_validate reject what emit.c cannot print as a C++ float literal. */
static void problem_found(void)
{
    seed x = base_spec(ROLE_LOGITS, 90, FLCE_DTYPE_BF16);
    x.s.softcap = INFINITY;
    emit_problem("emit_found_spec_softcap_inf", &x);
    /* Through the public API: T = 1e-39 is finite and > 0, but 1/T overflows to inf. */
    x = base_problem();
    x.p.temperature = 1e-39f, x.s.role = ROLE_ROWOPS;
    emit_problem("emit_found_problem_temperature_1e-39", &x);
}

/* Undefined behaviour, wrapped workspace sizes and a division by zero, one seed each (see
 * bench/results/libfuzzer-2026-11-22.md). UBSan reports the first four only in the libFuzzer build; the
 * others fail the replay with any compiler. */
static void problem_crashes(void)
{
    seed x = base_problem();
    x.p.vocab_offset = INT64_MAX, x.p.vocab_total = 0;
    emit_crash("crash_ub_vocab_total_0_offset_int64_max", &x);
    x = base_problem();
    x.p.vocab_offset = INT64_MAX - 10, x.p.vocab_total = INT64_MAX;
    emit_crash("crash_ub_vocab_offset_plus_shard_overflows", &x);
    x = base_problem();
    x.p.tokens = INT64_MAX;
    emit_crash("crash_ub_chunked_tokens_int64_max", &x);
    x = base_spec(ROLE_LOGITS, 90, FLCE_DTYPE_BF16);
    x.s.tile.warps_m = 1 << 16, x.s.tile.warps_n = 1 << 16;
    emit_crash("crash_ub_spec_warps_65536x65536", &x);
    x = base_spec(ROLE_LOGITS, 90, FLCE_DTYPE_BF16);
    tile(&x, 1 << 30, 1 << 30, 32, 2, 1, 1);
    emit_crash("crash_ub_spec_tile_2e30_accumulators_overflow", &x);
    x = base_problem();
    x.p.tokens = (int64_t)1 << 62, x.op = FLCE_OP_FORWARD;
    emit_crash("crash_forward_tokens_2e62_workspace_wraps", &x);
    x = base_problem();
    x.p.tokens = 4096, x.p.hidden = (int64_t)1 << 61, x.p.memory_budget = 1u << 20;
    emit_crash("crash_chunked_hidden_2e61_dw_acc_wraps", &x);
    x = base_problem();
    x.p.tokens = ((int64_t)1 << 61) + 1, x.p.strategy = FLCE_STRATEGY_RECOMPUTE;
    x.op = FLCE_OP_BACKWARD;
    emit_crash("crash_sigfpe_recompute_tokens_2e61", &x);
    /* AUTO switches to recompute (token chunks under 1024 rows), whose 8-column minimum does not
     * fit the budget; CHUNKED plans the same problem. */
    x = base_problem();
    x.p.tokens = 1000000, x.p.hidden = 4096, x.p.vocab_shard = 128256;
    x.p.memory_budget = 32u << 20;
    emit_crash("crash_auto_refuses_what_chunked_plans", &x);
}

/* One seed per check of spec_validate / validate_tile. */
static void problem_invalid_specs(void)
{
    seed b = base_spec(ROLE_LOGITS, 90, FLCE_DTYPE_BF16), x;
#define BAD_SPEC(name, stmt)                                                                       \
    do {                                                                                           \
        x = b;                                                                                     \
        stmt;                                                                                      \
        emit_problem("emit_bad_" name, &x);                                                        \
    } while (0)
    BAD_SPEC("sm_75", x.s.sm = 75);
    BAD_SPEC("sm_negative", x.s.sm = -90);
    BAD_SPEC("dtype_3", x.s.dtype = (flce_dtype)3);
    BAD_SPEC("hidden_12", x.s.hidden = 12);
    BAD_SPEC("hidden_negative", x.s.hidden = -4096);
    BAD_SPEC("vocab_0", x.s.vocab_shard = 0);
    BAD_SPEC("label_bits_16", x.s.label_bits = 16);
    BAD_SPEC("role_7", x.s.role = (spec_role)7);
    BAD_SPEC("rowops_reduction_3", (x.s.role = ROLE_ROWOPS, x.s.reduction = (flce_reduction)3));
    BAD_SPEC("warps_0x4", x.s.tile.warps_m = 0);
    BAD_SPEC("warps_4x5", (x.s.tile.warps_m = 4, x.s.tile.warps_n = 5));
    BAD_SPEC("bm_80_for_2_warps", x.s.tile.bm = 80);
    BAD_SPEC("bn_100", x.s.tile.bn = 100);
    BAD_SPEC("bk_8_bf16", x.s.tile.bk = 8);
    BAD_SPEC("bk_256", x.s.tile.bk = 256);
    BAD_SPEC("f32_bk_6", (x.s.dtype = FLCE_DTYPE_F32, x.s.tile.bk = 6));
    BAD_SPEC("stages_1", x.s.tile.stages = 1);
    BAD_SPEC("stages_9", x.s.tile.stages = 9);
    BAD_SPEC("accumulators_256x256_1x1", (x.s.tile = (spec_tile){256, 256, 32, 2, 1, 1, MAINLOOP_MMA_SYNC}));
    BAD_SPEC("smem_256x256x128_s8", (x.s.tile = (spec_tile){256, 256, 128, 8, 4, 4, MAINLOOP_MMA_SYNC}));
    BAD_SPEC("smem_sm86_128x128x64_s4",
             (x.s.sm = 86, x.s.tile = (spec_tile){128, 128, 64, 4, 2, 4, MAINLOOP_MMA_SYNC}));
    /* the Hopper main loop's own checks */
    seed w = base_wgmma(ROLE_DW, FLCE_DTYPE_BF16);
    x = w, x.s.sm = 80;
    emit_problem("emit_bad_wgmma_sm80", &x);
    x = w, x.s.dtype = FLCE_DTYPE_F32;
    emit_problem("emit_bad_wgmma_f32", &x);
    x = w, x.s.tile.bm = 64;
    emit_problem("emit_bad_wgmma_bm_64", &x);
    x = w, x.s.tile.bn = 320;
    emit_problem("emit_bad_wgmma_bn_320", &x);
    x = w, x.s.tile.stages = 9;
    emit_problem("emit_bad_wgmma_stages_9", &x);
    x = w, x.s.tile.stages = 8;
    emit_problem("emit_bad_wgmma_smem_8_stages_of_128x256x64", &x);
    x = w, x.s.tile.loop = MAINLOOP_WGMMA_TMA, x.s.sm = 100;
    emit_problem("emit_bad_wgmma_tma_sm100", &x);
    /* a loop number that names no loop */
    BAD_SPEC("loop_4", x.s.tile.loop = (spec_mainloop)SPEC_MAINLOOPS);
    /* the Blackwell main loop's own checks */
    seed t = base_tcgen05(ROLE_DH, FLCE_DTYPE_BF16);
    x = t, x.s.sm = 90;
    emit_problem("emit_bad_tcgen05_sm90", &x);
    x = t, x.s.dtype = FLCE_DTYPE_F32;
    emit_problem("emit_bad_tcgen05_f32", &x);
    x = t, x.s.tile.bn = 320;
    emit_problem("emit_bad_tcgen05_bn_320", &x);
    x = t, x.s.tile.stages = 5;
    emit_problem("emit_bad_tcgen05_smem_5_stages_of_128x256x64", &x);
    x = t, x.s.tile.loop = (spec_mainloop)-1;
    emit_problem("emit_bad_loop_minus_1", &x);
    BAD_SPEC("opts_bit_5", x.s.opts = 1u << 5);
    BAD_SPEC("softcap_nan", x.s.softcap = NAN);
    BAD_SPEC("temperature_negative", x.s.temperature = -1.0f);
    BAD_SPEC("smoothing_1", x.s.smoothing = 1.0f);
    BAD_SPEC("z_loss_negative", x.s.z_loss = -1e-4f);
#undef BAD_SPEC
}

static void problem_valid(void)
{
    seed x = base_problem();
    emit_problem("ok_bf16_loss_and_grad_sm90_logits", &x);
    x = base_problem();
    x.p.dtype = FLCE_DTYPE_F32, x.p.reduction = FLCE_REDUCTION_NONE;
    x.op = FLCE_OP_FORWARD, x.sm = 80, x.num_sms = 108, x.s.role = ROLE_ROWOPS;
    emit_problem("ok_f32_forward_none_sm80_rowops", &x);
    x = base_problem();
    x.p.dtype = FLCE_DTYPE_F16, x.op = FLCE_OP_BACKWARD, x.sm = 86, x.num_sms = 84;
    x.flags |= PI_TENSORS, x.outputs = TENSOR_LSE | TENSOR_GRAD_WEIGHT, x.s.role = ROLE_DW;
    emit_problem("ok_f16_backward_sm86_tensors_dw", &x);
    x = base_problem();
    x.p.tokens = 5000, x.p.memory_budget = 1u << 20, x.s.role = ROLE_DH;
    x.flags |= PI_TENSORS, x.outputs = TENSOR_LOSS | TENSOR_GRAD_HIDDEN | TENSOR_GRAD_WEIGHT;
    emit_problem("ok_bf16_1mib_budget_many_chunks_dw_acc_dh", &x);
    x = base_problem();
    x.p.tokens = 1, x.p.hidden = 8, x.p.vocab_shard = 1, x.sm = 120, x.num_sms = 1;
    emit_problem("ok_n1_d8_v1_sm120", &x);
    x = base_problem();
    x.p.vocab_shard = 8000000, x.p.tokens = 4096, x.sm = 100, x.num_sms = 148, x.s.role = ROLE_DW;
    emit_problem("ok_vocab_8000000_sm100_dw", &x);
    x = base_problem();
    x.p.label_bits = 64, x.p.reduction = FLCE_REDUCTION_SUM, x.num_sms = -5, x.sm = 89;
    x.p.strategy = FLCE_STRATEGY_CHUNKED, x.s.role = ROLE_ROWOPS;
    emit_problem("ok_i64_sum_chunked_negative_sm_count", &x);
    x = base_problem();
    x.p.vocab_offset = 1000, x.p.vocab_total = 5000, x.p.ignore_index = 4999;
    x.p.allow_tf32 = 1, x.p.deterministic = 1, x.op = FLCE_OP_FORWARD;
    emit_problem("ok_offset_1000_of_5000_forward", &x);
    x = base_problem();
    x.sm = 75;
    emit_problem("ok_plan_for_unsupported_sm75", &x);
    x = base_problem();
    x.flags |= PI_API_GIVEN, x.api_version = 99;
    emit_problem("ok_api_version_99", &x);
    x = base_problem();
    x.p.label_smoothing = 0.1f, x.p.z_loss = 1e-4f, x.p.softcap = 30.0f, x.p.temperature = 0.8f;
    x.p.has_bias = 1, x.p.has_class_weights = 1, x.s.role = ROLE_ROWOPS;
    emit_problem("ok_every_option_loss_and_grad_rowops", &x);
    x = base_problem();
    x.p.label_smoothing = 0.1f, x.p.has_class_weights = 1, x.op = FLCE_OP_FORWARD;
    x.flags |= PI_TENSORS, x.outputs = TENSOR_LOSS | TENSOR_ENTROPY | TENSOR_ARGMAX |
                                       TENSOR_TARGET_LOGPROB | TENSOR_CLASS_WEIGHTS;
    emit_problem("ok_forward_smoothing_weights_per_token_outputs", &x);
    x = base_problem();
    x.p.z_loss = 1e-4f, x.p.reduction = FLCE_REDUCTION_SUM, x.flags |= PI_TENSORS;
    x.outputs = TENSOR_LOSS | TENSOR_Z_LOSS | TENSOR_GRAD_HIDDEN | TENSOR_LOSS_PER_TOKEN;
    emit_problem("ok_z_loss_out_sum_tensors", &x);
    x = base_problem();
    x.p.strategy = FLCE_STRATEGY_RECOMPUTE, x.op = FLCE_OP_BACKWARD, x.p.memory_budget = 1u << 20;
    x.p.tokens = 4096, x.p.vocab_shard = 50257, x.s.role = ROLE_DH;
    emit_problem("ok_recompute_backward_1mib_vocab_chunks", &x);
    x = base_problem();
    x.p.strategy = FLCE_STRATEGY_RECOMPUTE, x.op = FLCE_OP_LOSS_AND_GRAD, x.p.has_bias = 1;
    x.p.accumulate_grad_hidden = 1, x.p.accumulate_grad_weight = 1, x.p.memory_budget = 4u << 20;
    x.p.tokens = 2048, x.p.vocab_shard = 32000;
    x.flags |= PI_TENSORS, x.outputs = TENSOR_GRAD_HIDDEN | TENSOR_GRAD_WEIGHT | TENSOR_GRAD_BIAS;
    emit_problem("ok_recompute_loss_and_grad_bias_accumulate", &x);
    x = base_problem();
    x.p.has_bias = 1, x.p.tokens = 5000, x.p.memory_budget = 1u << 20, x.s.role = ROLE_DW;
    emit_problem("ok_bias_chunked_db_acc", &x);
    x = base_problem();
    x.flags = (x.flags & ~(unsigned)PI_SIZE_MASK) | PI_SIZE_OLDER;
    emit_problem("ok_first_layout_struct_size", &x);
    x = base_problem();
    x.flags |= PI_SIZE_GIVEN;
    x.struct_size = (uint32_t)offsetof(flce_problem, has_class_weights) + 2;
    emit_problem("ok_struct_size_ends_mid_field", &x);
    x = base_problem();
    x.p.memory_budget = 1000;
    emit_problem("plan_bad_budget_1000_bytes", &x);
    x = base_problem();
    x.p.strategy = FLCE_STRATEGY_RECOMPUTE, x.op = FLCE_OP_BACKWARD, x.p.tokens = 100000;
    x.p.memory_budget = 1u << 20;
    emit_problem("plan_bad_recompute_budget_below_8_columns", &x);
}

/* One seed per check of flce_problem_validate. */
static void problem_invalid(void)
{
    seed b = base_problem(), x;
#define BAD(name, stmt)                                                                            \
    do {                                                                                           \
        x = b;                                                                                     \
        stmt;                                                                                      \
        emit_problem("bad_" name, &x);                                                             \
    } while (0)
    BAD("struct_size_0", (x.flags |= PI_SIZE_GIVEN, x.struct_size = 0));
    BAD("struct_size_first_layout_minus_4", (x.flags |= PI_SIZE_GIVEN,
        x.struct_size = (uint32_t)offsetof(flce_problem, has_class_weights) - 4));

    BAD("struct_size_newer", x.flags |= PI_SIZE_NEWER);
    BAD("struct_size_4g", (x.flags |= PI_SIZE_GIVEN, x.struct_size = UINT32_MAX));
    BAD("tokens_0", x.p.tokens = 0);
    BAD("hidden_1004", x.p.hidden = 1004);
    BAD("vocab_0", x.p.vocab_shard = 0);
    BAD("vocab_8000001", x.p.vocab_shard = 8000001);
    BAD("vocab_offset_negative", x.p.vocab_offset = -1);
    BAD("vocab_past_total", (x.p.vocab_offset = 10, x.p.vocab_total = 1010));
    BAD("dtype_7", x.p.dtype = (flce_dtype)7);
    BAD("label_bits_48", x.p.label_bits = 48);
    BAD("reduction_negative", x.p.reduction = (flce_reduction)-1);
    BAD("strategy_9", x.p.strategy = (flce_strategy)9);
    BAD("tp_rank_2_of_2", (x.p.tp_rank = 2, x.p.tp_size = 2));
    BAD("tp_size_0", x.p.tp_size = 0);
    BAD("has_bias_2", x.p.has_bias = 2);
    BAD("smoothing_nan", x.p.label_smoothing = NAN);
    BAD("smoothing_1", x.p.label_smoothing = 1.0f);
    BAD("z_loss_negative", x.p.z_loss = -0.5f);
    BAD("softcap_inf", x.p.softcap = INFINITY);
    BAD("temperature_0", x.p.temperature = 0.0f);
    BAD("temperature_nan", x.p.temperature = NAN);
    BAD("class_weights_2", x.p.has_class_weights = 2);
    BAD("accumulate_grad_hidden_3", x.p.accumulate_grad_hidden = 3);
    BAD("accumulate_grad_weight_negative", x.p.accumulate_grad_weight = -1);
    BAD("unsupported_tp_2", (x.p.tp_size = 2, x.p.tp_rank = 1, x.p.vocab_total = 2002));
#undef BAD
}

/* ---- fuzz_cache_entry ------------------------------------------------------------------- */

static char store_dir[PATH_CAP];

/* The entry cache_store writes for (key, value), read back into *out (malloc'd). */
static size_t stored_entry(const void *key, size_t key_len, const void *value, size_t len,
                           uint8_t **out)
{
    uint64_t h[2];
    char hex[40], path[PATH_CAP];
    if (cache_store(store_dir, key, key_len, value, len) != FLCE_OK) {
        fprintf(stderr, "cache_store: %s\n", flce_last_error());
        exit(1);
    }
    hash128(key, key_len, h);
    hash128_hex(h, hex);
    strcat(hex, ".cubin");
    join(path, store_dir, hex);
    FILE *f = fopen(path, "rb");
    size_t size = 32 + key_len + len;
    *out = malloc(size + 16);
    if (!f || !*out || fread(*out, 1, size + 16, f) != size) {
        fprintf(stderr, "reading back %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fclose(f);
    unlink(path);
    return size;
}

static void entry_seed(const char *name, const void *d, size_t n)
{
    write_seed("cache_entry", name, d, n);
}

/* A well-formed entry and its damaged variants: each damage reaches one rejection in cache_entry.c. */
static void entry_variants(const char *stem, const void *key, size_t key_len, const void *value,
                           size_t len)
{
    char name[256];
    uint8_t *e, *x;
    size_t n = stored_entry(key, key_len, value, len, &e);
    x = malloc(n + 1);
    snprintf(name, sizeof name, "%s_valid", stem);
    entry_seed(name, e, n);
#define VARIANT(suffix, size, stmt)                                                                \
    do {                                                                                           \
        memcpy(x, e, n);                                                                           \
        stmt;                                                                                      \
        snprintf(name, sizeof name, "%s_%s", stem, suffix);                                        \
        entry_seed(name, x, size);                                                                 \
    } while (0)
    VARIANT("truncated_by_1", n - 1, (void)0);
    VARIANT("truncated_to_header", 24, (void)0);
    VARIANT("one_byte_appended", n + 1, x[n] = 0);
    VARIANT("bad_magic", n, x[0] = 'f');
    VARIANT("version_2", n, x[4] = 2);
    VARIANT("key_len_plus_1", n, x[8]++);
    VARIANT("key_len_huge", n, memset(x + 8, 0xff, 8));
    VARIANT("value_len_huge", n, memset(x + 16, 0xff, 8));
    VARIANT("checksum_flipped", n, x[n - 1] ^= 0x80);
    if (key_len) VARIANT("key_byte_flipped", n, x[24] ^= 1);
    if (len) VARIANT("value_byte_flipped", n, x[24 + key_len + len - 1] ^= 0x10);
#undef VARIANT
    free(x);
    free(e);
}

static void cache_entries(void)
{
    snprintf(store_dir, sizeof store_dir, "/tmp/flce-make-corpus.XXXXXX");
    if (!mkdtemp(store_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    static const char fixed[] = FUZZ_CACHE_FIXED_KEY;
    static const char cubin[] = "\x7f" "ELF\x02\x01\x01" "fake cubin for the fuzz corpus";
    entry_variants("small", "k", 1, cubin, sizeof cubin - 1);
    entry_variants("fixed_key", fixed, sizeof fixed - 1, cubin, sizeof cubin - 1);

    uint8_t *e;
    size_t n = stored_entry(NULL, 0, NULL, 0, &e);
    entry_seed("empty_key_empty_value_valid", e, n);
    free(e);
    n = stored_entry(fixed, sizeof fixed - 1, NULL, 0, &e);
    entry_seed("fixed_key_empty_value_valid", e, n);
    free(e);
    /* Same length as the fixed key, one byte different: a well-formed entry of another key. */
    char other[sizeof fixed];
    memcpy(other, fixed, sizeof fixed);
    other[0] = 'L';
    n = stored_entry(other, sizeof fixed - 1, cubin, sizeof cubin - 1, &e);
    entry_seed("fixed_key_length_other_key_valid", e, n);
    free(e);
    static const char ctrl[] = "line\tone\x01\x7f\x1b[31m red\nsecond line";
    n = stored_entry(ctrl, sizeof ctrl - 1, "v", 1, &e);
    entry_seed("key_control_bytes_valid", e, n);
    free(e);
    static const char nul[] = "ab\0cd";
    n = stored_entry(nul, sizeof nul - 1, "v", 1, &e);
    entry_seed("key_with_nul_valid", e, n);
    free(e);
    char long_key[600];
    memset(long_key, 'x', sizeof long_key);
    n = stored_entry(long_key, sizeof long_key, "v", 1, &e);
    entry_seed("key_600_bytes_one_line_valid", e, n);
    free(e);
    uint8_t big[3000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
    n = stored_entry("big", 3, big, sizeof big, &e);
    entry_seed("value_3000_bytes_valid", e, n);
    free(e);

    entry_seed("empty_file", "", 0);
    entry_seed("text_file", "hello, cache\n", 13);
    static const uint8_t header_only[32] = {'F', 'L', 'C', 'E', 1};
    entry_seed("zero_lengths_zero_checksum", header_only, sizeof header_only);
    rmdir(store_dir);
}

/* ---- fuzz_tool_args --------------------------------------------------------------------- */

/* Sizes come from the literals, so embedded NULs (a separator for the target) count. */
#define TOOL_SEED(name, words) {name, words, sizeof words - 1}

static void tool_args(void)
{
    static const struct {
        const char *name, *words;
        size_t size;
    } cases[] = {
        TOOL_SEED("ok_h100_llama3", "--arch sm_90a --dtype bf16 --tokens 8192 --hidden 4096 "
                                    "--vocab 128256"),
        TOOL_SEED("ok_role_dw_compile_f32", "--role dw --compile --arch sm_80 --dtype f32 "
                                            "--reduction none --labels 64"),
        TOOL_SEED("ok_arch_100a_fp16_budget", "--arch 100a --dtype fp16 --budget-mib 64 --role rowops"),
        TOOL_SEED("ok_arch_upper_sm86_sum", "--arch SM_86 --reduction sum --role logits"),
        TOOL_SEED("ok_arch_sm_120f_tiny", "--arch sm_120f --tokens 1 --hidden 8 --vocab 1 --role dh"),
        TOOL_SEED("ok_budget_negative_wraps", "--budget-mib -1"),
        TOOL_SEED("ok_whitespace_mix", "\t--dtype\nf16\r\n--tokens\v77  --vocab 50257\f"),
        TOOL_SEED("ok_nul_separated", "--hidden\0" "1024\0--vocab\0" "32000"),
        TOOL_SEED("ok_empty", ""),
        TOOL_SEED("bad_arch_sm75", "--arch sm_75"),
        TOOL_SEED("bad_arch_garbage", "--arch sm_9x0"),
        TOOL_SEED("bad_dtype_int8", "--dtype int8"),
        TOOL_SEED("bad_reduction_avg", "--reduction avg"),
        TOOL_SEED("bad_role_bogus", "--role bogus"),
        TOOL_SEED("bad_option", "--frobnicate 3"),
        TOOL_SEED("bad_positional", "gen"),
        TOOL_SEED("bad_missing_value", "--tokens"),
        TOOL_SEED("bad_tokens_negative", "--tokens -5"),
        TOOL_SEED("bad_tokens_text", "--tokens many"),
        TOOL_SEED("bad_hidden_12", "--hidden 12"),
        TOOL_SEED("bad_vocab_0", "--vocab 0"),
        TOOL_SEED("bad_vocab_8000001", "--vocab 8000001"),
        TOOL_SEED("bad_labels_48", "--labels 48"),
        TOOL_SEED("bad_budget_tiny_vocab_huge", "--budget-mib 1 --vocab 8000000"),
        /* found by the fuzzer (minimized): signed overflow in plan.c's ceil_div */
        TOOL_SEED("crash_ub_tokens_int64_max", "--tokens 9223372036854775807"),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        write_seed("tool_args", cases[i].name, cases[i].words, cases[i].size);
}

/* ---- fuzz_tune_table --------------------------------------------------------------------- */

/* A table line for an H100 class with the given logits tile (sum and versions of this build). */
static void tune_line(char *out, size_t cap, int sm, int64_t hidden, spec_tile logits)
{
    tune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.key.device, sizeof e.key.device, "NVIDIA_H100_80GB_HBM3");
    e.key.sm = sm, e.key.dtype = FLCE_DTYPE_BF16, e.key.hidden = hidden, e.key.vocab = 32768;
    e.key.bucket = 4096, e.key.label_bits = 32, e.key.opts = TUNE_OPT_SOFTCAP;
    e.tile[0] = logits;
    e.tile[1] = e.tile[2] = spec_default_tile(sm, FLCE_DTYPE_BF16, ROLE_DW);
    e.ms = 3.25;
    if (tune_line_format(&e, out, cap) != FLCE_OK) {
        fprintf(stderr, "tune_line_format: %s\n", flce_last_error());
        exit(1);
    }
}

static void tune_seed(const char *name, const char *text)
{
    write_seed("tune_table", name, text, strlen(text));
}

/* A valid table and one variant per way a line can be refused. The valid lines carry this build's
 * generator hash: after the templates change they replay as stale lines, which is still a case. */
static void tune_tables(void)
{
    char a[TUNE_LINE_MAX + 2], b[TUNE_LINE_MAX + 2], text[8 * TUNE_LINE_MAX];
    tune_line(a, sizeof a, 90, 4096, (spec_tile){128, 128, 64, 4, 8, 1, MAINLOOP_WGMMA_TMA});
    tune_line(b, sizeof b, 80, 2048, (spec_tile){64, 128, 32, 3, 2, 2, MAINLOOP_MMA_SYNC});
    snprintf(text, sizeof text, "%s\n# comment\n%s\n\n%s\n", TUNE_TABLE_HEADER, a, b);
    tune_seed("ok_two_classes", text);
    snprintf(text, sizeof text, "%s\n%s\n%s\n", TUNE_TABLE_HEADER, a, a);
    tune_seed("ok_duplicate_class", text);
    tune_seed("ok_empty", "");
    tune_seed("ok_header_only", TUNE_TABLE_HEADER "\n");
    snprintf(text, sizeof text, "flce-tune-table 2\n%s\n", a);
    tune_seed("bad_header_version", text);
    snprintf(text, sizeof text, "%s\n%.*s", TUNE_TABLE_HEADER, (int)(strlen(a) / 2), a);
    tune_seed("bad_torn_line", text);
    char edited[TUNE_LINE_MAX + 2];
    snprintf(edited, sizeof edited, "%s", a);
    edited[strlen("NVIDIA_H100_80GB_HBM3 sm_9")] = '0'; /* sm_90 → sm_80: checksum mismatch */
    snprintf(text, sizeof text, "%s\n%s\n%s\n", TUNE_TABLE_HEADER, edited, b);
    tune_seed("bad_edited_line", text);
    char stale[TUNE_LINE_MAX + 2];
    snprintf(stale, sizeof stale, "%s", a);
    char *v = strstr(stale, "flce=");
    if (v) v[5] = '9';
    snprintf(text, sizeof text, "%s\n%s\n", TUNE_TABLE_HEADER, stale);
    tune_seed("bad_stale_version", text);
    char wrong[TUNE_LINE_MAX + 2]; /* wgmma on sm_80 with a valid checksum: validation refuses */
    tune_line(wrong, sizeof wrong, 80, 4096, (spec_tile){128, 256, 64, 4, 8, 1, MAINLOOP_WGMMA_TMA});
    snprintf(text, sizeof text, "%s\n%s\n", TUNE_TABLE_HEADER, wrong);
    tune_seed("bad_tile_for_arch", text);
    snprintf(text, sizeof text, "%s\nx y\n\x01\x02 sum=zz\na b c d e f g h i j k l m n sum=0000000000000000\n%s\n",
             TUNE_TABLE_HEADER, b);
    tune_seed("bad_garbage_then_valid", text);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s <fuzz/corpus>\n", argv[0]);
        return 2;
    }
    snprintf(root, sizeof root, "%s", argv[1]);
    if (mkdir(root, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "mkdir %s: %s\n", root, strerror(errno));
        return 1;
    }
    problem_valid_specs();
    problem_found();
    problem_crashes();
    problem_invalid_specs();
    problem_valid();
    problem_invalid();
    cache_entries();
    tool_args();
    tune_tables();
    printf("wrote %d seeds under %s\n", written, root);
    return 0;
}
