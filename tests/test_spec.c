/* test_spec.c — the generator: spec validation messages, source emission, and the planner's
 * chunking and workspace layout (all CPU-only). */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "emit.h"
#include "plan.h"
#include "regions.h"

static kernel_spec good_gemm(spec_role role, flce_dtype dtype)
{
    kernel_spec s;
    memset(&s, 0, sizeof s);
    s.sm = 90, s.dtype = dtype, s.hidden = 4096, s.vocab_shard = 32768, s.role = role, s.label_bits = 32;
    s.tile = spec_default_tile(80, dtype, role); /* the portable tile, valid on every arch */
    return s;
}

static int msg_has(const char *needle) { return strstr(flce_last_error(), needle) != NULL; }

static void default_specs_validate_for_every_arch_and_dtype(void)
{
    int sms[] = {80, 86, 89, 90, 100, 120};
    for (size_t a = 0; a < sizeof sms / sizeof sms[0]; a++)
        for (int t = 0; t < 3; t++)
            for (int r = ROLE_LOGITS; r <= ROLE_ROWOPS; r++) {
                kernel_spec s = good_gemm((spec_role)r, (flce_dtype)t);
                s.sm = sms[a];
                s.tile = spec_default_tile(sms[a], (flce_dtype)t, (spec_role)r);
                CHECKF(spec_validate(&s) == FLCE_OK, "sm_%d dtype %d role %d: %s", sms[a], t, r,
                       flce_last_error());
            }
}

static void shared_memory_over_the_arch_limit_names_the_tile(void)
{
    kernel_spec s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16);
    s.sm = 86;
    s.tile.bk = 128, s.tile.stages = 8;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT);
    CHECK(msg_has("shared memory") && msg_has("sm_86"));
}

static void bad_fields_are_named(void)
{
    kernel_spec s = good_gemm(ROLE_DH, FLCE_DTYPE_F16);
    s.hidden = 1000 + 4;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("hidden=1004"));
    s = good_gemm(ROLE_DH, FLCE_DTYPE_F16);
    s.tile.bm = 100;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.bm=100"));
    s = good_gemm(ROLE_DH, FLCE_DTYPE_F16);
    s.tile.stages = 1;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.stages=1"));
    s = good_gemm(ROLE_DH, FLCE_DTYPE_F16);
    s.sm = 75;
    CHECK(spec_validate(&s) == FLCE_ERR_UNSUPPORTED && msg_has("sm=75"));
    s = good_gemm(ROLE_DW, FLCE_DTYPE_BF16);
    s.label_bits = 16;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("label_bits=16"));
    s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16);
    s.tile.bm = 256, s.tile.bn = 256, s.tile.warps_m = 1, s.tile.warps_n = 2;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("accumulators"));
}

/* The TMA-fed tile: default on sm_90 16-bit (FLCE_DEV tma unset), never elsewhere, only with the
 * warpgroup shape; a producer warpgroup in front of the 8 computing warps, and two mbarriers per
 * stage. A loop number outside spec_mainloop is refused, naming the field. */
static void tma_tiles_are_the_hopper_default_and_need_wgmma(void)
{
    kernel_spec s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_LOGITS);
    CHECK(s.tile.loop == MAINLOOP_WGMMA_TMA && s.tile.bn == 256 && spec_validate(&s) == FLCE_OK);
    CHECK(spec_uses_wgmma(&s.tile) && spec_uses_tma(&s.tile) && spec_uses_warpgroup(&s.tile));
    CHECK(spec_threads(&s) == 384);
    /* the pipeline, alignment and barriers; then the fp32 Z store's two 2 KiB buffers per warp */
    CHECK(spec_smem_bytes(&s) == 4u * (128 + 256) * 64 * 2 + 1024 + 4 * 16 + 128 + 8 * 4096);
    char *src = NULL;
    CHECK(emit_source(&s, &src) == FLCE_OK && strstr(src, "#define FLCE_TMA 1"));
    free(src);
    CHECK(spec_default_tile(100, FLCE_DTYPE_BF16, ROLE_LOGITS).loop == MAINLOOP_MMA_SYNC);
    CHECK(spec_default_tile(90, FLCE_DTYPE_F32, ROLE_DH).loop == MAINLOOP_MMA_SYNC);
    s.tile.loop = (spec_mainloop)SPEC_MAINLOOPS;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.loop=4"));
    s.tile.loop = (spec_mainloop)-1;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.loop=-1"));
    s = good_gemm(ROLE_DH, FLCE_DTYPE_BF16);
    s.tile.loop = MAINLOOP_WGMMA_TMA;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.loop=wgmma+tma: needs bm=128"));
}

/* Bulk reductions (spec_bulk_red): red_acc 1 on the Hopper TMA tile with 16-row warp tiles, where a
 * second 2 KiB staging buffer per warp fits; never for red_acc 2, other tiles or the logits. */
static void bulk_reductions_need_the_tma_tile_and_room_for_their_buffers(void)
{
    kernel_spec s = good_gemm(ROLE_DW, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_DW);
    size_t plain = spec_smem_bytes(&s);
    CHECK(!spec_bulk_red(&s));
    s.red_acc = 1;
    CHECK(spec_validate(&s) == FLCE_OK && spec_bulk_red(&s));
    CHECK(spec_smem_bytes(&s) == plain + 2048u * (size_t)(s.tile.warps_m * s.tile.warps_n));
    CHECK(spec_smem_bytes(&s) <= spec_smem_limit(90));
    s.red_acc = 2; /* FLCE_DEV=bulk_red=0 */
    CHECK(spec_validate(&s) == FLCE_OK && !spec_bulk_red(&s) && spec_smem_bytes(&s) == plain);
    s.red_acc = 3;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("red_acc=3"));
    s.red_acc = 1, s.tile.stages = 5; /* no room left for the second buffer */
    CHECK(!spec_bulk_red(&s));
    s = good_gemm(ROLE_DW, FLCE_DTYPE_BF16); /* the portable tile: per-thread reductions */
    s.red_acc = 1;
    CHECK(!spec_bulk_red(&s));
}

/* The plain logits pass's staged Z store (spec_staged_z): on the Hopper TMA tile where two 2 KiB buffers
 * per warp fit; not for the compact, qrows or fused-dZ passes (their own stores), other roles or
 * tiles. */
static void staged_z_store_is_the_plain_logits_pass_on_the_tma_tile(void)
{
    kernel_spec s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_LOGITS);
    CHECK(spec_validate(&s) == FLCE_OK && spec_staged_z(&s) && spec_smem_bytes(&s) <= spec_smem_limit(90));
    char *src = NULL;
    CHECK(emit_source(&s, &src) == FLCE_OK && strstr(src, "#define FLCE_Z_STAGED 1"));
    free(src);
    const size_t bulk = spec_smem_bytes(&s);
    s.compact = 1; /* the compact pass: one staging buffer per warp, counted apart */
    CHECK(spec_validate(&s) == FLCE_OK && !spec_staged_z(&s) &&
          spec_smem_bytes(&s) == bulk - 4096u * (size_t)s.tile.warps_m + 2048u * (size_t)s.tile.warps_m);
    s.qrows = 1;
    CHECK(!spec_staged_z(&s));
    s.compact = 0, s.qrows = 0, s.fused_dz = 1;
    CHECK(!spec_staged_z(&s));
    s.fused_dz = 0, s.tile.stages = 5; /* no room left for the buffers */
    CHECK(!spec_staged_z(&s));
    s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16); /* the portable tile: direct stores */
    CHECK(!spec_staged_z(&s));
    CHECK(emit_source(&s, &src) == FLCE_OK && strstr(src, "#define FLCE_Z_STAGED 0"));
    free(src);
    s = good_gemm(ROLE_DH, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_DH);
    CHECK(!spec_staged_z(&s));
}

/* Clusters of 2 on the wgmma TMA tile for every GEMM role (logits: W's tile shared by two row
 * blocks). */
static void clusters_need_the_tma_tile(void)
{
    kernel_spec s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_LOGITS);
    s.cluster = 2;
    CHECK(spec_validate(&s) == FLCE_OK);
    s.cluster = 4;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("cluster=4"));
    s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16); /* the portable tile */
    s.cluster = 2;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("cluster=2"));
    s = good_gemm(ROLE_DH, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_DH);
    s.cluster = 2;
    CHECK(spec_validate(&s) == FLCE_OK);
}

/* The tcgen05 tile: only on sm_100 16-bit with FLCE_ENABLE_SM100=1 (spec_knobs enable_sm100);
 * validation names the field. */
static void tcgen05_tiles_are_opt_in_blackwell_16_bit_only(void)
{
    spec_knobs off = {1, 0}, on = {1, 1};
    CHECK(spec_default_tile(100, FLCE_DTYPE_BF16, ROLE_LOGITS).loop == MAINLOOP_MMA_SYNC);
    CHECK(spec_tile_pick(100, FLCE_DTYPE_BF16, ROLE_LOGITS, off).loop == MAINLOOP_MMA_SYNC);
    kernel_spec s = good_gemm(ROLE_DW, FLCE_DTYPE_F16);
    s.sm = 100;
    s.tile = spec_tile_pick(100, FLCE_DTYPE_F16, ROLE_DW, on);
    CHECK(s.tile.loop == MAINLOOP_TCGEN05 && s.tile.bn == 256);
    CHECK(spec_uses_tma(&s.tile) && spec_uses_warpgroup(&s.tile) && !spec_uses_wgmma(&s.tile));
    CHECK(spec_validate(&s) == FLCE_OK);
    CHECK(spec_threads(&s) == 384 && spec_tmem_columns(&s) == 512);
    CHECK(spec_smem_bytes(&s) <= spec_smem_limit(100));
    CHECK(spec_tile_pick(100, FLCE_DTYPE_F32, ROLE_DW, on).loop == MAINLOOP_MMA_SYNC);
    CHECK(spec_tile_pick(90, FLCE_DTYPE_BF16, ROLE_DW, on).loop == MAINLOOP_WGMMA_TMA);
    CHECK(spec_tile_pick(80, FLCE_DTYPE_BF16, ROLE_DW, on).loop == MAINLOOP_MMA_SYNC);
    char *src = NULL;
    CHECK(emit_source(&s, &src) == FLCE_OK);
    CHECK(src && strstr(src, "tcgen05.mma.cta_group::1.kind::f16") && strstr(src, "#define FLCE_TCGEN05 1"));
    CHECK(src && !strstr(src, "#if FLCE_TCGEN05") && !strstr(src, "wgmma.mma_async"));
    free(src);
    kernel_spec h = good_gemm(ROLE_DW, FLCE_DTYPE_F16);
    h.tile = spec_default_tile(90, FLCE_DTYPE_F16, ROLE_DW);
    CHECK(emit_source(&h, &src) == FLCE_OK);
    CHECK(src && !strstr(src, "tcgen05") && !strstr(src, "FLCE_TCGEN05"));
    free(src);

    kernel_spec b = s;
    b.sm = 90;
    CHECK(spec_validate(&b) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.loop=tcgen05+tma") && msg_has("sm_100a"));
    b = s, b.dtype = FLCE_DTYPE_F32;
    CHECK(spec_validate(&b) == FLCE_ERR_INVALID_ARGUMENT && msg_has("f32"));
    b = s, b.tile.loop = MAINLOOP_WGMMA_TMA; /* Hopper's loop on sm_100 */
    CHECK(spec_validate(&b) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.loop=wgmma+tma: needs sm_90a"));
    b = s, b.tile.bn = 320;
    CHECK(spec_validate(&b) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.bn=320"));
    b = s, b.tile.stages = 5;
    CHECK(spec_validate(&b) == FLCE_ERR_INVALID_ARGUMENT && msg_has("shared memory") && msg_has("sm_100a"));
}

static void wgmma_tiles_are_hopper_and_16_bit_only(void)
{
    kernel_spec s = good_gemm(ROLE_LOGITS, FLCE_DTYPE_BF16);
    s.tile = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_LOGITS);
    CHECK(spec_uses_wgmma(&s.tile) && spec_validate(&s) == FLCE_OK);
    s.sm = 86;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("sm_90a") && msg_has("sm_86"));
    s.sm = 90, s.dtype = FLCE_DTYPE_F32;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("f32"));
    s.dtype = FLCE_DTYPE_F16, s.tile.bn = 96;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT && msg_has("tile.bn=96"));
    CHECK(spec_default_tile(90, FLCE_DTYPE_F32, ROLE_DW).loop == MAINLOOP_MMA_SYNC);
    char *src = NULL;
    s.tile.bn = 128, s.role = ROLE_DW;
    CHECK(emit_source(&s, &src) == FLCE_OK && strstr(src, "m64n128k16.f32.f16.f16") &&
          strstr(src, "p, 1, 1, 1, 1;"));
    free(src);
}

static void emitted_source_carries_the_spec_as_constants(void)
{
    kernel_spec s = good_gemm(ROLE_DW, FLCE_DTYPE_BF16);
    s.vocab_shard = 128256;
    char *src = NULL;
    CHECK(emit_source(&s, &src) == FLCE_OK);
    CHECK(src && !strstr(src, "VOCAB = 128256") && !strstr(src, "V=128256")); /* shapes are parameters */
    CHECK(src && strstr(src, "#define FLCE_DTYPE 2"));
    CHECK(src && strstr(src, "A_KMAJOR = false, B_KMAJOR = false"));
    CHECK(src && strstr(src, "#define ROLE_IS_DW 1"));
    CHECK(src && strstr(src, "flce_gemm_params")); /* params.h is pasted in */
    /* Nothing for NVRTC to find on disk: the templates' own #includes (for compiling them alone)
     * sit behind #ifndef FLCE_GENERATED, which the preamble defines first. */
    const char *gen = src ? strstr(src, "#define FLCE_GENERATED 1") : NULL;
    const char *inc = src ? strstr(src, "#include") : NULL;
    CHECK(gen && (!inc || gen < inc));
    free(src);
    s.role = ROLE_ROWOPS;
    CHECK(emit_source(&s, &src) == FLCE_OK && strstr(src, "flce_dz"));
    free(src);
}

static void arch_names_parse_and_print(void)
{
    CHECK(spec_parse_arch("sm_90a") == 90);
    CHECK(spec_parse_arch("sm_100a") == 100);
    CHECK(spec_parse_arch("80") == 80);
    CHECK(spec_parse_arch("sm_75") == 0);
    CHECK(spec_parse_arch("banana") == 0);
    CHECK(!strcmp(spec_arch_name(90), "sm_90a"));
}

static flce_problem problem(int64_t n, int64_t d, int64_t v, flce_dtype t)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_shard = v, p.dtype = t;
    return p;
}

static void chunks_fit_the_memory_budget(void)
{
    uint64_t budgets[] = {64ull << 20, 128ull << 20, 512ull << 20};
    for (size_t b = 0; b < 3; b++) {
        flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
        p.memory_budget = budgets[b];
        p.strategy = FLCE_STRATEGY_CHUNKED;
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
        /* compact: fp16 p̃ (dZ in place) and a float per (row, warp tile) */
        uint64_t chunk_bytes = (uint64_t)pl.chunk_rows * ((uint64_t)pl.ldz * 2 + (uint64_t)pl.tile_max_ld * 4);
        CHECK(pl.compact && pl.tile_cols == 256 && pl.logits.compact);
        CHECKF(chunk_bytes <= budgets[b], "chunk %lld rows = %llu bytes > budget %llu",
               (long long)pl.chunk_rows, (unsigned long long)chunk_bytes,
               (unsigned long long)budgets[b]);
        CHECK(pl.chunk_rows * pl.n_chunks >= p.tokens);
        CHECK((pl.chunk_rows - 1) * pl.n_chunks < p.tokens || pl.chunk_rows % 128 == 0);
        CHECK(pl.need_dw_acc == (pl.n_chunks > 1));
    }
}

/* The logits pass's vocab splits keep the SMs busy: whole rounds of CTAs (one 128×256 CTA per SM
 * on sm_90) waste at most 6 % against a perfect spread of the row-block × vocab tiles, on the
 * issue's shapes (the old two-waves rule wasted 20–28 % on three of them), and cover the vocab. */
static void vocab_splits_fill_whole_waves(void)
{
    const int64_t shapes[][3] = {{8192, 4096, 128256}, {8192, 2304, 256000}, {4096, 2048, 32000},
                                 {32768, 4096, 128256}, {512, 4096, 128256}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        flce_problem p = problem(shapes[i][0], shapes[i][1], shapes[i][2], FLCE_DTYPE_BF16);
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_FORWARD, 90, 132, NULL, &pl) == FLCE_OK);
        int64_t bn = pl.logits.tile.bn, bm = pl.logits.tile.bm, tiles = (p.vocab_shard + bn - 1) / bn;
        int64_t rb = (p.tokens + bm - 1) / bm, ctas = rb * pl.splits;
        CHECK((int64_t)pl.splits * pl.tiles_per_split >= tiles);
        CHECK((int64_t)(pl.splits - 1) * pl.tiles_per_split < tiles);
        double rounds = (double)((ctas + 131) / 132) * pl.tiles_per_split, ideal = (double)(rb * tiles) / 132;
        CHECKF(ideal / rounds >= 0.94, "%lldx%lldx%lld: %d splits of %d tiles use %.0f %% of the SMs",
               (long long)shapes[i][0], (long long)shapes[i][1], (long long)shapes[i][2], pl.splits,
               pl.tiles_per_split, 100 * ideal / rounds);
    }
}

static void auto_recomputes_when_token_chunks_are_short(void)
{
    plan pl;
    flce_problem p = problem(8192, 2304, 256000, FLCE_DTYPE_BF16);
    p.memory_budget = 128ull << 20; /* compact token chunks of 256 rows */
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.recompute && !pl.compact);
    CHECK(pl.n_chunks == 1 && pl.chunk_rows == 8192 && pl.n_vchunks > 1);
    CHECK(pl.fused_dz && (uint64_t)pl.chunk_rows * (uint64_t)pl.ldz * 2 <= p.memory_budget);
    CHECK(!pl.logits.compact && pl.off_tile_max == 0);
    p = problem(4096, 2048, 32000, FLCE_DTYPE_BF16); /* 2048-row chunks: stays chunked */
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && !pl.recompute);
    p.strategy = FLCE_STRATEGY_CHUNKED, p.memory_budget = 64ull << 20; /* forced: never switched */
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && !pl.recompute);
}

/* AUTO takes the plan its cost model says is faster: compact token chunks where they are long
 * (2048 rows at 512 MiB for V = 128k) or one chunk holds all tokens, and also at 1024-row chunks
 * now that dW fills the SMs dH's short launches leave idle (8192×2304×256000 on an H100 with an
 * unknown memory size: chunked 54.4–54.8 ms vs recompute 57.4–57.7, bench/NOTES.md v23; without
 * the fill stream recompute won, 62.2 vs 64.4). Every estimate is positive and each forced
 * strategy is left alone. */
static void auto_takes_the_cheaper_estimate(void)
{
    const int64_t shapes[][3] = {{8192, 4096, 128256}, {8192, 2304, 256000}, {4096, 2048, 32000},
                                 {32768, 4096, 128256}, {512, 4096, 128256}};
    const int want_recompute[] = {0, 0, 0, 0, 0};
    for (size_t i = 0; i < 5; i++) {
        flce_problem p = problem(shapes[i][0], shapes[i][1], shapes[i][2], FLCE_DTYPE_BF16);
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
        CHECKF(pl.recompute == want_recompute[i], "shape %zu: AUTO chose %s (estimates %.1f chunked, %.1f recompute)",
               i, pl.recompute ? "recompute" : "chunked", pl.est_chunked_ms, pl.est_recompute_ms);
        CHECK(pl.est_chunked_ms > 0 && pl.est_recompute_ms > 0);
        CHECK(pl.recompute || pl.compact);
        p.strategy = FLCE_STRATEGY_CHUNKED;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && !pl.recompute && pl.est_chunked_ms == 0);
    }
    /* From a saved lse (flce_backward) both strategies recompute the logits once; recompute's dZ
     * comes straight from the GEMM (2 bytes per logit, no fp32 Z): AUTO takes it. */
    {
        flce_problem b = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
        plan pb;
        CHECK(plan_make(&b, FLCE_OP_BACKWARD, 90, 132, NULL, &pb) == FLCE_OK && pb.recompute && pb.fused_dz);
        CHECK(pb.est_recompute_ms < pb.est_chunked_ms);
    }
    /* Both plans too big: the message names the smallest budget that works. */
    flce_problem p = problem(100, 64, 256000, FLCE_DTYPE_BF16);
    p.memory_budget = 1000;
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_ERR_INVALID_ARGUMENT);
    CHECKF(msg_has("too small for any strategy") && msg_has("smallest that works is 1600 bytes"), "%s", flce_last_error());
}

/* Recompute's logits pass writes dZ itself: no fp32 Z region, so a vocab chunk is three times
 * wider in the same budget (bf16: 2 bytes per logit instead of 6); FLCE_DEV=fused_dz=0 restores the
 * Z store and the dz pass. The dZ spec is the logits spec with the options dZ needs. */
static void recompute_writes_dz_in_the_logits_pass(void)
{
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    p.strategy = FLCE_STRATEGY_RECOMPUTE, p.has_class_weights = 1, p.reduction = FLCE_REDUCTION_SUM;
    plan fused, split;
    flce_config cfg;
    config_defaults(&cfg);
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &fused) == FLCE_OK);
    cfg.fused_dz = 0; /* FLCE_DEV=fused_dz=0 */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &split) == FLCE_OK);
    CHECK(fused.fused_dz && !split.fused_dz && fused.off_z == 0 && split.off_z != 0);
    CHECKF(fused.chunk_cols >= 3 * split.chunk_cols - fused.logits.tile.bn, "chunk columns %lld vs %lld",
           (long long)fused.chunk_cols, (long long)split.chunk_cols);
    CHECK(fused.workspace_bytes <= split.workspace_bytes);
    const kernel_spec *s = &fused.logits_dz;
    CHECK(s->fused_dz == 1 && s->role == ROLE_LOGITS && spec_validate(s) == FLCE_OK);
    CHECK(!memcmp(&s->tile, &fused.logits.tile, sizeof s->tile));
    CHECK((s->opts & SPEC_OPT_WEIGHTS) && !(s->opts & (SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX)));
    CHECK(s->reduction == FLCE_REDUCTION_MEAN); /* sum and mean compile alike */
    p.strategy = FLCE_STRATEGY_CHUNKED;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &split) == FLCE_OK && !split.fused_dz);
    kernel_spec bad = fused.dh;
    bad.fused_dz = 1;
    CHECK(spec_validate(&bad) == FLCE_ERR_INVALID_ARGUMENT && msg_has("fused_dz"));
}

/* The dH/dW tile order is the plan's: groups of PLAN_RASTER_ROWS row blocks unless FLCE_DEV raster says
 * otherwise (0: column tiles fastest; out of 0..4096: a warning and the default, test_config). */
static void gradient_tile_order_comes_from_the_plan(void)
{
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    flce_config cfg;
    config_defaults(&cfg);
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.raster_rows == PLAN_RASTER_ROWS);
    cfg.raster_rows = 16;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK && pl.raster_rows == 16);
    cfg.raster_rows = 0;
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK && pl.raster_rows == 0);
}

/* The accumulator knob: L2 reductions on (FLCE_DEV red_acc, measured faster where fp32 accumulators
 * are updated: NOTES session 7). */
static void fp32_accumulators_default_to_reductions(void)
{
    flce_problem p = problem(8192, 4096, 128256, FLCE_DTYPE_BF16);
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.red_acc);
    flce_config cfg;
    config_defaults(&cfg);
    cfg.red_acc = 0; /* FLCE_DEV=red_acc=0 */
    CHECK(plan_build(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &cfg, NULL, NULL, &pl) == FLCE_OK && !pl.red_acc);
}

/* A dH over a vocab range longer than PLAN_DH_K_SLICE (a chunked call's shard, recompute's vocab
 * chunk) runs in slices added up in fp32 (the tensor cores' sum over 2.2M columns lost precision);
 * shorter ranges keep one launch. */
static void long_vocab_shards_slice_dh(void)
{
    plan pl;
    flce_problem p = problem(1000, 2048, 2200000, FLCE_DTYPE_BF16);
    p.strategy = FLCE_STRATEGY_CHUNKED;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
    CHECK(pl.dh_k_slice == PLAN_DH_K_SLICE && pl.need_dh_acc && !pl.dh.plain_out && spec_validate(&pl.dh) == FLCE_OK);
    CHECK(PLAN_DH_K_SLICE % 256 == 0); /* slices start 16-byte aligned in dZ (TMA) */
    p.vocab_shard = 256000;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.dh_k_slice == 0 && !pl.need_dh_acc);
    p.vocab_shard = 2200000, p.dtype = FLCE_DTYPE_F32; /* fp32 dH is its own accumulator */
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.dh_k_slice && !pl.need_dh_acc);
    p.dtype = FLCE_DTYPE_BF16, p.strategy = FLCE_STRATEGY_RECOMPUTE; /* vocab chunks within the slice */
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.chunk_cols <= PLAN_DH_K_SLICE);
    CHECK(pl.dh_k_slice == 0 && pl.need_dh_acc);
    p.memory_budget = 16ull << 30; /* one vocab chunk of all 2.2M columns: sliced */
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK && pl.n_vchunks == 1);
    CHECK(pl.dh_k_slice == PLAN_DH_K_SLICE && pl.need_dh_acc);
}

/* The default budget keeps all tokens in one chunk when their compact logits take no more than
 * 512 MiB plus the fp32 dW accumulator several chunks would need (plan.c), and only then: an
 * explicit budget, a caller's fp32 dW buffer, fp32 inputs or a larger N keep their chunks. */
static void default_budget_takes_one_chunk_when_it_costs_no_more_memory(void)
{
    struct {
        int64_t n, d, v;
        uint64_t budget;
        int acc_dw;
        flce_dtype dt;
        int one_chunk;
    } cases[] = {
        {8192, 4096, 128256, 0, 0, FLCE_DTYPE_BF16, 1},          /* 2.0 GiB ≤ 0.5 + 2.0 */
        {8192, 4096, 128256, 512ull << 20, 0, FLCE_DTYPE_BF16, 0}, /* an explicit budget is kept */
        {8192, 4096, 128256, 0, 1, FLCE_DTYPE_BF16, 0},          /* no accumulator to save */
        {32768, 4096, 128256, 0, 0, FLCE_DTYPE_BF16, 0},         /* 8.4 GiB > 2.5 */
        {8192, 2304, 256000, 0, 0, FLCE_DTYPE_BF16, 0},          /* 4.2 GiB > 0.5 + 2.2 */
        {8192, 4096, 128256, 0, 0, FLCE_DTYPE_F32, 0},           /* not compact */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flce_problem p = problem(cases[i].n, cases[i].d, cases[i].v, cases[i].dt);
        p.memory_budget = cases[i].budget, p.accumulate_grad_weight = cases[i].acc_dw;
        p.strategy = FLCE_STRATEGY_CHUNKED;
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
        CHECKF((pl.n_chunks == 1) == cases[i].one_chunk, "case %zu: %lld chunks of %lld rows", i,
               (long long)pl.n_chunks, (long long)pl.chunk_rows);
        if (cases[i].one_chunk) {
            uint64_t acc = (uint64_t)cases[i].v * (uint64_t)cases[i].d * 4;
            CHECKF(pl.workspace_bytes < (512ull << 20) + acc, "case %zu: workspace %llu", i,
                   (unsigned long long)pl.workspace_bytes);
            CHECK(!pl.need_dw_acc);
        }
    }
}

/* On a device of known memory the default budget may grow to 1/16 of it (plan.c grown_budget):
 * all tokens when they fit, else the largest block beside the dW accumulator; never with an
 * explicit budget, a caller's fp32 dW, TP, or an unknown device; the workspace stays within the
 * share (but for a few floats per token) and `grown` marks the plans that used it. */
static void default_budget_grows_to_a_sixteenth_of_the_device(void)
{
    const uint64_t gib = 1ull << 30, mem = 80 * gib, cap = mem / 16;
    struct {
        int64_t n, d, v;
        uint64_t budget;
        int acc_dw;
        int64_t chunks; /* expected token chunks on an 80 GiB device */
        int grown;
    } cases[] = {
        {8192, 2304, 256000, 0, 0, 1, 1},          /* 4.0 GiB of logits ≤ 5 GiB */
        {32768, 4096, 128256, 0, 0, 3, 1},         /* 3 chunks + the 2.0 GiB accumulator ≤ 5 GiB */
        {8192, 4096, 128256, 0, 0, 1, 0},          /* one chunk already by the 512 MiB + accumulator rule */
        {8192, 2304, 256000, 512ull << 20, 0, 8, 0}, /* an explicit budget is kept */
        {8192, 2304, 256000, 0, 1, 8, 0},          /* the caller's fp32 dW: the lean plan */
        {4096, 2048, 32000, 0, 0, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flce_problem p = problem(cases[i].n, cases[i].d, cases[i].v, FLCE_DTYPE_BF16);
        p.memory_budget = cases[i].budget, p.accumulate_grad_weight = cases[i].acc_dw;
        p.strategy = FLCE_STRATEGY_CHUNKED;
        plan pl, lean;
        CHECK(plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, NULL, 90, 132, mem, NULL, &pl) == FLCE_OK);
        CHECKF(pl.n_chunks == cases[i].chunks && pl.grown == cases[i].grown, "case %zu: %lld chunks, grown %d", i,
               (long long)pl.n_chunks, pl.grown);
        if (pl.grown)
            CHECKF(pl.workspace_bytes <= cap + (uint64_t)cases[i].n * 64, "case %zu: workspace %.2f GiB", i,
                   (double)pl.workspace_bytes / (double)gib);
        CHECK(plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, NULL, 90, 132, 0, NULL, &lean) == FLCE_OK);
        CHECK(!lean.grown && lean.n_chunks >= pl.n_chunks && (pl.grown || lean.n_chunks == pl.n_chunks));
        CHECK(pl.need_dw_acc == (pl.n_chunks > 1 && !cases[i].acc_dw));
    }
    /* AUTO on the grown plan: one chunk at 8192×2304×256000, estimated well under recompute */
    flce_problem p = problem(8192, 2304, 256000, FLCE_DTYPE_BF16);
    plan pl;
    CHECK(plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, NULL, 90, 132, mem, NULL, &pl) == FLCE_OK);
    CHECK(!pl.recompute && pl.n_chunks == 1 && pl.est_chunked_ms < pl.est_recompute_ms);
    /* TP ranks must cut tokens alike whatever their devices: no growth */
    p.tp_size = 2, p.tp_rank = 0, p.vocab_total = 256000, p.vocab_shard = 128000;
    CHECK(plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, NULL, 90, 132, mem, NULL, &pl) == FLCE_OK && !pl.grown);
}

/* The generated code does not depend on D or V (they are kernel parameters), so two shapes whose
 * plans pick the same tiles and flags share their kernels' source, hence their cache entries: a new
 * model or vocab shard of a known kind needs no compile (issue 16). What does depend on the shape
 * is a flag in the source: full_tiles (V a multiple of the logits tile's BN), plain_out, qrows (a
 * chunk of PLAN_QROWS_MIN_LOGITS logits or more: both shapes here, one chunk each). */
static void kernels_of_shapes_with_the_same_flags_are_shared(void)
{
    flce_problem a = problem(8192, 4096, 128256, FLCE_DTYPE_BF16), b = problem(11264, 4096, 64000, FLCE_DTYPE_BF16);
    plan pa, pb;
    CHECK(plan_make(&a, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pa) == FLCE_OK);
    CHECK(plan_make(&b, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pb) == FLCE_OK);
    CHECK(pa.logits.full_tiles && pb.logits.full_tiles && pa.dh.plain_out && pb.dh.plain_out);
    CHECK(pa.logits.qrows && pb.logits.qrows);
    const kernel_spec *sa[] = {&pa.logits, &pa.dh, &pa.dw, &pa.rowops}, *sb[] = {&pb.logits, &pb.dh, &pb.dw, &pb.rowops};
    for (int i = 0; i < 4; i++) {
        char *x = NULL, *y = NULL;
        CHECK(emit_source(sa[i], &x) == FLCE_OK && emit_source(sb[i], &y) == FLCE_OK);
        CHECKF(x && y && !strcmp(x, y), "role %d: the two shapes' sources differ", i);
        CHECK(x && !strstr(x, "D=4096") && !strstr(x, "V=128256") && !strstr(x, "HIDDEN ="));
        free(x), free(y);
    }
    /* V = 64128 is not a multiple of 256: its logits kernel keeps the partial-tile code */
    flce_problem c = problem(8192, 4096, 64128, FLCE_DTYPE_BF16);
    plan pc;
    CHECK(plan_make(&c, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pc) == FLCE_OK && !pc.logits.full_tiles);
    char *x = NULL, *y = NULL;
    CHECK(emit_source(&pa.logits, &x) == FLCE_OK && emit_source(&pc.logits, &y) == FLCE_OK);
    CHECK(x && y && strstr(x, "#define FLCE_FULL_TILES 1") && !strstr(y, "#define FLCE_FULL_TILES 1") && strcmp(x, y));
    free(x), free(y);
    kernel_spec s = pc.logits;
    s.full_tiles = 1;
    CHECK(spec_validate(&s) == FLCE_ERR_INVALID_ARGUMENT);
}

static void small_problems_take_one_chunk_and_no_accumulator(void)
{
    flce_problem p = problem(1, 8, 1, FLCE_DTYPE_F16);
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 80, 108, NULL, &pl) == FLCE_OK);
    CHECK(pl.n_chunks == 1 && pl.chunk_rows == 1 && pl.ldz == 8 && pl.splits == 1);
    CHECK(!pl.need_dw_acc);
}

static void too_small_a_budget_is_an_error_naming_it(void)
{
    flce_problem p = problem(100, 64, 256000, FLCE_DTYPE_BF16);
    p.memory_budget = 1000;
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_ERR_INVALID_ARGUMENT);
    CHECK(msg_has("memory_budget=1000"));
}

static void workspace_regions_do_not_overlap(void)
{
    for (int strat = FLCE_STRATEGY_CHUNKED; strat <= FLCE_STRATEGY_RECOMPUTE; strat++) {
        flce_problem p = problem(5000, 256, 3001, FLCE_DTYPE_BF16);
        p.memory_budget = 8ull << 20, p.strategy = (flce_strategy)strat;
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
        uint64_t blk = (uint64_t)pl.chunk_rows * pl.ldz;
        region r[PLAN_REGIONS];
        size_t n = plan_regions(&pl, r);
        CHECK(strat == FLCE_STRATEGY_CHUNKED ? pl.need_dw_acc && !pl.need_dh_acc : pl.need_dh_acc && !pl.need_dw_acc);
        CHECK(blk * (pl.fused_dz || pl.compact ? 2 : 6) <= p.memory_budget);
        CHECK(pl.compact == (strat == FLCE_STRATEGY_CHUNKED));
        CHECK(pl.fused_dz == (strat == FLCE_STRATEGY_RECOMPUTE));
        char what[32];
        snprintf(what, sizeof what, "strategy %d", strat);
        check_disjoint(r, n, pl.workspace_bytes, what);
    }
}

/* The largest problem flce_problem_validate accepts (INT32_MAX tokens, D = 2^20, V_r = 8M) plans
 * with every region inside a workspace that did not wrap around, for each op, strategy and dtype,
 * and AUTO's estimates stay finite (issue 15: the planner's arithmetic far from 64-bit overflow). */
static void the_largest_problems_plan_without_overflow(void)
{
    const int64_t shapes[][3] = {{2147483647, 1 << 20, 8000000}, {2147483647, 8, 1}, {1, 1 << 20, 8000000}};
    const flce_op ops[] = {FLCE_OP_FORWARD, FLCE_OP_LOSS_AND_GRAD, FLCE_OP_BACKWARD};
    for (size_t i = 0; i < 3; i++)
        for (int dt = 0; dt < 3; dt++)
            for (int strat = FLCE_STRATEGY_AUTO; strat <= FLCE_STRATEGY_RECOMPUTE; strat++)
                for (size_t o = 0; o < 3; o++) {
                    if (strat == FLCE_STRATEGY_FORWARD) continue;
                    flce_problem p = problem(shapes[i][0], shapes[i][1], shapes[i][2], (flce_dtype)dt);
                    p.strategy = (flce_strategy)strat, p.memory_budget = 1ull << 40;
                    CHECK(flce_problem_validate(&p) == FLCE_OK);
                    plan pl;
                    flce_status st = plan_make(&p, ops[o], 90, 132, NULL, &pl);
                    char what[96];
                    snprintf(what, sizeof what, "shape %zu dtype %d strategy %d op %d", i, dt, strat, (int)ops[o]);
                    CHECKF(st == FLCE_OK, "%s: %s", what, flce_last_error());
                    if (st != FLCE_OK) continue;
                    CHECKF(pl.workspace_bytes < (1ull << 62), "%s: workspace %llu", what,
                           (unsigned long long)pl.workspace_bytes);
                    region r[PLAN_REGIONS];
                    if (ops[o] == FLCE_OP_LOSS_AND_GRAD) /* the regions plan_regions models */
                        check_disjoint(r, plan_regions(&pl, r), pl.workspace_bytes, what);
                    CHECK(pl.est_chunked_ms == pl.est_chunked_ms && pl.est_chunked_ms < 1e30 &&
                          pl.est_recompute_ms == pl.est_recompute_ms && pl.est_recompute_ms < 1e30);
                }
}

int main(void)
{
    RUN(default_specs_validate_for_every_arch_and_dtype);
    RUN(recompute_writes_dz_in_the_logits_pass);
    RUN(auto_takes_the_cheaper_estimate);
    RUN(fp32_accumulators_default_to_reductions);
    RUN(long_vocab_shards_slice_dh);
    RUN(gradient_tile_order_comes_from_the_plan);
    RUN(shared_memory_over_the_arch_limit_names_the_tile);
    RUN(bad_fields_are_named);
    RUN(emitted_source_carries_the_spec_as_constants);
    RUN(wgmma_tiles_are_hopper_and_16_bit_only);
    RUN(tcgen05_tiles_are_opt_in_blackwell_16_bit_only);
    RUN(tma_tiles_are_the_hopper_default_and_need_wgmma);
    RUN(bulk_reductions_need_the_tma_tile_and_room_for_their_buffers);
    RUN(staged_z_store_is_the_plain_logits_pass_on_the_tma_tile);
    RUN(clusters_need_the_tma_tile);
    RUN(arch_names_parse_and_print);
    RUN(chunks_fit_the_memory_budget);
    RUN(vocab_splits_fill_whole_waves);
    RUN(small_problems_take_one_chunk_and_no_accumulator);
    RUN(default_budget_takes_one_chunk_when_it_costs_no_more_memory);
    RUN(default_budget_grows_to_a_sixteenth_of_the_device);
    RUN(kernels_of_shapes_with_the_same_flags_are_shared);
    RUN(auto_recomputes_when_token_chunks_are_short);
    RUN(too_small_a_budget_is_an_error_naming_it);
    RUN(workspace_regions_do_not_overlap);
    RUN(the_largest_problems_plan_without_overflow);
    FINISH();
}
