/* spec.c — kernel spec naming, resource arithmetic and validation (see spec.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "spec.h"

static const int supported_sms[] = {80, 86, 87, 89, 90, 100, 120};

int spec_arch_supported(int sm)
{
    for (size_t i = 0; i < sizeof supported_sms / sizeof supported_sms[0]; i++)
        if (supported_sms[i] == sm) return 1;
    return 0;
}

const char *spec_arch_name(int sm)
{
    switch (sm) {
    case 80: return "sm_80";
    case 86: return "sm_86";
    case 87: return "sm_87";
    case 89: return "sm_89";
    /* The "a" targets unlock wgmma/setmaxnreg (Hopper) and tcgen05 (Blackwell) for later paths;
     * a cubin for them runs only on that exact arch, which is what the JIT compiles for anyway. */
    case 90: return "sm_90a";
    case 100: return "sm_100a";
    case 120: return "sm_120";
    default: return "sm_unknown";
    }
}

int spec_parse_arch(const char *s)
{
    if (!s) return 0;
    if (!strncmp(s, "sm_", 3) || !strncmp(s, "SM_", 3)) s += 3;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || (*end && strcmp(end, "a") && strcmp(end, "f"))) return 0;
    return spec_arch_supported((int)v) ? (int)v : 0;
}

const char *spec_mainloop_name(spec_mainloop loop)
{
    switch (loop) {
    case MAINLOOP_MMA_SYNC: return "mma";
    case MAINLOOP_WGMMA_CP_ASYNC: return "wgmma";
    case MAINLOOP_WGMMA_TMA: return "wgmma+tma";
    case MAINLOOP_TCGEN05: return "tcgen05+tma";
    }
    return "?";
}

/* The loop as spec_summary has always printed it (the text is the JIT cache key's, so it stays). */
static const char *summary_loop(spec_mainloop loop)
{
    switch (loop) {
    case MAINLOOP_MMA_SYNC: return "";
    case MAINLOOP_WGMMA_CP_ASYNC: return " wgmma";
    case MAINLOOP_WGMMA_TMA: return " wgmma tma";
    case MAINLOOP_TCGEN05: return " tcgen05 tma";
    }
    return " loop=?";
}

const char *spec_role_name(spec_role role)
{
    switch (role) {
    case ROLE_LOGITS: return "logits";
    case ROLE_DH: return "dh";
    case ROLE_DW: return "dw";
    case ROLE_ROWOPS: return "rowops";
    case ROLE_DISTILL: return "distill";
    }
    return "unknown";
}

const char *spec_dtype_name(flce_dtype t)
{
    switch (t) {
    case FLCE_DTYPE_F32: return "f32";
    case FLCE_DTYPE_F16: return "f16";
    case FLCE_DTYPE_BF16: return "bf16";
    }
    return "?";
}

static const char *reduction_name(flce_reduction r)
{
    switch (r) {
    case FLCE_REDUCTION_MEAN: return "mean";
    case FLCE_REDUCTION_SUM: return "sum";
    case FLCE_REDUCTION_NONE: return "none";
    }
    return "?";
}

static int elem_bytes(flce_dtype t) { return t == FLCE_DTYPE_F32 ? 4 : 2; }

/* The options part of a summary: empty when everything is off. */
static void options_text(const kernel_spec *s, char *out, size_t cap)
{
    static const char *names[] = {"bias", "weights", "zsum", "entropy", "argmax", "grad-logprob", "grad-lse",
                                  "grad-entropy", "grad-loss-rows", "soft-target", "sparse-target"};
    size_t n = 0;
    out[0] = '\0';
    for (int b = 0; b < 10; b++)
        if (s->opts & (1u << b)) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " %s", names[b]);
    if (s->softcap > 0 && n < cap) n += (size_t)snprintf(out + n, cap - n, " softcap=%.9g", (double)s->softcap);
    if (s->temperature > 0 && n < cap) n += (size_t)snprintf(out + n, cap - n, " T=%.9g", (double)s->temperature);
    if (s->smoothing > 0 && n < cap) n += (size_t)snprintf(out + n, cap - n, " eps=%.9g", (double)s->smoothing);
    if (s->z_loss > 0 && n < cap) snprintf(out + n, cap - n, " zloss=%.9g", (double)s->z_loss);
}

/* with_shape: D and V too (logs); without, what the code depends on (source header, cache key). */
static void summary_text(const kernel_spec *s, int with_shape, char *out, size_t cap)
{
    char opts[160], shape[64] = "", v[40] = "";
    options_text(s, opts, sizeof opts);
    if (with_shape) {
        snprintf(shape, sizeof shape, " D=%lld V=%lld", (long long)s->hidden, (long long)s->vocab_shard);
        snprintf(v, sizeof v, " V=%lld", (long long)s->vocab_shard);
    }
    if (s->role == ROLE_DISTILL) {
        snprintf(out, cap, "distill %s div=%d beta=%g T=%g ce=%g labels=%s reduction=%s %s", spec_dtype_name(s->dtype),
                 s->divergence, (double)s->beta, (double)s->temperature, (double)s->ce_weight,
                 s->has_labels ? (s->label_bits == 64 ? "i64" : "i32") : "none", reduction_name(s->reduction),
                 spec_arch_name(s->sm));
        return;
    }
    if (s->role == ROLE_ROWOPS) {
        snprintf(out, cap, "%s %s%s labels=i%d reduction=%s %s%s", spec_role_name(s->role), spec_dtype_name(s->dtype),
                 v, s->label_bits, reduction_name(s->reduction), spec_arch_name(s->sm), opts);
        return;
    }
    const spec_tile *t = &s->tile;
    snprintf(out, cap, "%s%s %s%s labels=i%d %s tile=%dx%dx%d stages=%d warps=%dx%d%s%s%s%s%s%s%s",
             spec_role_name(s->role), s->fused_dz ? "+dz" : s->qrows ? "+qrows" : s->compact ? "+compact" : "",
             spec_dtype_name(s->dtype), shape, s->label_bits, spec_arch_name(s->sm), t->bm, t->bn, t->bk, t->stages,
             t->warps_m, t->warps_n, summary_loop(t->loop),
             s->cluster > 1 ? " cluster=2" : "", s->plain_out ? " plain-out" : "", s->red_acc == 2 ? " red-acc-thread" : s->red_acc ? " red-acc" : "",
             s->full_tiles ? " full-tiles" : "", opts,
             s->fused_dz ? (s->reduction == FLCE_REDUCTION_NONE ? " reduction=none" : " reduction=mean/sum") : "");
}

void spec_summary(const kernel_spec *s, char *out, size_t cap) { summary_text(s, 1, out, cap); }

void spec_code_summary(const kernel_spec *s, char *out, size_t cap) { summary_text(s, 0, out, cap); }

/* Operand layouts per role: logits reads H and W K-major; dH reads W as [k][n]; dW reads dZ as
 * [k][m] and H as [k][n] (see templates/gemm.cu). */
static int a_kmajor(spec_role r) { return r != ROLE_DW; }
static int b_kmajor(spec_role r) { return r == ROLE_LOGITS; }

static size_t smem_bytes(const kernel_spec *s);

/* The bytes of the second staging buffer per warp that spec_bulk_red's kernels add. */
static size_t bulk_red_bytes(const kernel_spec *s) { return 2048u * (size_t)(s->tile.warps_m * s->tile.warps_n); }

/* Where a warp tile is 16 rows of whole 32-column blocks on the wgmma + TMA loop: the tiles the
 * staged fp32 rows of templates/gemm_wgmma_tma.cu (bulk_red_rows, staged_rows_out) take. */
static int bulk_tile(const spec_tile *t)
{
    return t->loop == MAINLOOP_WGMMA_TMA && t->warps_n == 1 && t->bm == 16 * t->warps_m && t->bn % 32 == 0;
}

int spec_bulk_red(const kernel_spec *s)
{
    return s->red_acc == 1 && bulk_tile(&s->tile) && smem_bytes(s) + bulk_red_bytes(s) <= spec_smem_limit(s->sm);
}

/* The plain logits pass's fp32 Z store through shared memory: two 2 KiB staging buffers per warp, on a
 * 128-byte boundary past the barriers (the compact pass's one buffer is counted in smem_bytes). */
static size_t staged_z_bytes(const kernel_spec *s) { return 128u + 2u * bulk_red_bytes(s); }

int spec_staged_z(const kernel_spec *s)
{
    return s->role == ROLE_LOGITS && !s->compact && !s->qrows && !s->fused_dz && bulk_tile(&s->tile) &&
           smem_bytes(s) + staged_z_bytes(s) <= spec_smem_limit(s->sm);
}

size_t spec_smem_bytes(const kernel_spec *s)
{
    return smem_bytes(s) + (spec_bulk_red(s) ? bulk_red_bytes(s) : 0) + (spec_staged_z(s) ? staged_z_bytes(s) : 0);
}

static size_t smem_bytes(const kernel_spec *s)
{
    if (s->role == ROLE_ROWOPS || s->role == ROLE_DISTILL) return 0;
    const spec_tile *t = &s->tile;
    if (spec_uses_warpgroup(t)) /* swizzled tiles without padding, plus room to align them to 1024
                                 * bytes, plus TMA's two 8-byte mbarriers per stage; tcgen05 adds two
                                 * mbarriers per accumulator buffer (2) and the 4-byte tensor-memory
                                 * address, 36 bytes kept 16-aligned (gemm_tcgen05.cu, tmem_slot) */
        return (size_t)t->stages * (size_t)(t->bm + t->bn) * (size_t)t->bk * 2 + 1024 +
               (spec_uses_tma(t) ? 16u * (size_t)t->stages : 0) + (t->loop == MAINLOOP_TCGEN05 ? 48u : 0) +
               /* dH/dW on wgmma + TMA: stages + 1 words for the dynamic tile order, which uses two
                * of them since issue 43 (its tile slot and that slot's mbarrier; the room stays, and
                * with it every offset after it: templates/gemm_wgmma_tma.cu tile_slot) */
               (t->loop == MAINLOOP_WGMMA_TMA && s->role != ROLE_LOGITS ? 8u * (size_t)(t->stages + 1) : 0) +
               /* compact logits, dH and dW on wgmma + TMA: a 2 KiB buffer per warp through which
                * 16-bit tiles are stored, on a 128-byte boundary past the barriers and the tile slot
                * (templates/gemm_wgmma_tma.cu, STAGED_STORE, STAGING_OFFSET) */
               (t->loop == MAINLOOP_WGMMA_TMA && (s->role != ROLE_LOGITS || s->compact)
                    ? 128u + 2048u * (size_t)(t->warps_m * t->warps_n) : 0);
    /* mma.sync / FFMA: unpadded XOR-swizzled stages (templates/gemm_mma_sync.cu) */
    size_t pipeline = (size_t)t->stages * (size_t)(t->bm + t->bn) * (size_t)t->bk * (size_t)elem_bytes(s->dtype);
    /* the logits epilogue's cross-warp reduction: one 24-byte row_stats per (warp column, row) */
    size_t reduce = s->role == ROLE_LOGITS ? 24u * (size_t)t->warps_n * (size_t)t->bm : 0;
    return pipeline > reduce ? pipeline : reduce;
}

int spec_threads(const kernel_spec *s)
{
    if (s->role == ROLE_ROWOPS || s->role == ROLE_DISTILL) return 256;
    /* TMA: one producer warpgroup in front of the warps that compute */
    return s->tile.warps_m * s->tile.warps_n * 32 +
           (spec_uses_tma(&s->tile) ? 128 : 0);
}

size_t spec_smem_limit(int sm)
{
    switch (sm) {
    case 80: case 87: return 166912;
    case 86: case 89: case 120: return 101376;
    case 90: case 100: return 232448;
    default: return 49152;
    }
}

int spec_tmem_columns(const kernel_spec *s)
{
    if (s->role == ROLE_ROWOPS || s->tile.loop != MAINLOOP_TCGEN05 || s->tile.bn < 1) return 0;
    int need = 2 * s->tile.bn, cols = 32; /* tcgen05.alloc: a power of two, at least 32 */
    while (cols < need && cols < (1 << 20)) cols *= 2;
    return cols;
}

/* k.enable_sm100 (FLCE_ENABLE_SM100=1): the tcgen05 path compiles (CI) but has not run on a
 * Blackwell GPU yet, so it is opt-in; without it sm_100 runs the portable mma.sync kernels. */
spec_tile spec_tile_pick(int sm, flce_dtype dtype, spec_role role, spec_knobs k)
{
    if (sm == 100 && dtype != FLCE_DTYPE_F32 && k.enable_sm100) {
        /* The Hopper TMA tile's shape and pipeline (128×256×64, 4 stages, producer warpgroup + two
         * consumer warpgroups); tcgen05.mma accumulates in tensor memory, two 256-column buffers,
         * so the next tile's MMAs run during this tile's epilogue. */
        spec_tile b = {128, 256, 64, 4, 8, 1, MAINLOOP_TCGEN05};
        return b;
    }
    if (sm == 90 && dtype != FLCE_DTYPE_F32) {
        /* wgmma: two warpgroups of 64 rows, 4 stages, 128×256 tiles (a third less L2 traffic per
         * FLOP than 128×128). With TMA a producer warpgroup gives its registers to the consumers
         * (setmaxnreg), so the logits epilogue fits beside 128 accumulators; on the cp.async path
         * (k.tma = 0, FLCE_TMA=0) it spills at 128×256 and keeps 128×128 (bench/NOTES.md v2). */
        int tma = k.tma != 0;
        spec_tile w = {128, role == ROLE_LOGITS && !tma ? 128 : 256, 64, 4, 8, 1,
                       tma ? MAINLOOP_WGMMA_TMA : MAINLOOP_WGMMA_CP_ASYNC};
        return w;
    }
    /* mma.sync (FFMA for fp32): 128×256 CTA tiles of 8 warps with 64×64 warp tiles, the shape of
     * the fast sm_80 GEMMs: a third less shared-memory and L2 traffic per FLOP than 128×128 with
     * 64×32 warp tiles, and 8 ldmatrix.x4 per 32 mma.sync per warp. BK 32 (16 fp32: the same 64
     * bytes per row), 4 stages of 24 KiB, which fit the 99 KiB of sm_86/89/120 (issue 19). */
    spec_tile t = {128, 256, 32, 4, 2, 4, MAINLOOP_MMA_SYNC};
    (void)role;
    if (dtype == FLCE_DTYPE_F32) t.bk = 16;
    return t;
}

/* The tile both warpgroup paths (wgmma, tcgen05) take: two consumer warpgroups of 64 rows, BK 64,
 * BN a multiple of 64 up to 256. `path` names the path in the messages. */
static flce_status validate_warpgroup_shape(const spec_tile *t, const char *path)
{
    if (t->bm != 128 || t->bk != 64 || t->warps_m != 8 || t->warps_n != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile.loop=%s: needs bm=128, bk=64, warps=8x1 (got %d, %d, %dx%d)",
                       spec_mainloop_name(t->loop), t->bm, t->bk, t->warps_m, t->warps_n);
    if (t->bn < 64 || t->bn > 256 || t->bn % 64)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.bn=%d: the %s path takes 64, 128, 192 or 256", t->bn,
                       path);
    if (t->stages < 2 || t->stages > 8)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.stages=%d: must be 2 to 8", t->stages);
    return FLCE_OK;
}

static flce_status validate_smem(const kernel_spec *s)
{
    const spec_tile *t = &s->tile;
    size_t smem = spec_smem_bytes(s), limit = spec_smem_limit(s->sm);
    if (smem > limit)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile %dx%dx%d with %d stages needs %zu bytes of shared memory; %s allows %zu",
                       t->bm, t->bn, t->bk, t->stages, smem, spec_arch_name(s->sm), limit);
    return FLCE_OK;
}

static flce_status validate_wgmma(const kernel_spec *s)
{
    const spec_tile *t = &s->tile;
    if (s->sm != 90)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.loop=%s: needs sm_90a, not %s", spec_mainloop_name(t->loop),
                       spec_arch_name(s->sm));
    if (s->dtype == FLCE_DTYPE_F32)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.loop=%s: takes f16 or bf16 inputs, not f32",
                       spec_mainloop_name(t->loop));
    TRY(validate_warpgroup_shape(t, "wgmma"));
    return validate_smem(s);
}

static flce_status validate_tcgen05(const kernel_spec *s)
{
    const spec_tile *t = &s->tile;
    if (s->sm != 100)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.loop=%s: needs sm_100a, not %s", spec_mainloop_name(t->loop),
                       spec_arch_name(s->sm));
    if (s->dtype == FLCE_DTYPE_F32)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.loop=%s: takes f16 or bf16 inputs, not f32",
                       spec_mainloop_name(t->loop));
    /* tcgen05.mma M = 128 takes N a multiple of 16 up to 256; the epilogue loads 64 columns at a time */
    TRY(validate_warpgroup_shape(t, "tcgen05"));
    int cols = spec_tmem_columns(s);
    if (cols > SPEC_TMEM_COLUMNS_SM100)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile.bn=%d: two fp32 accumulators need %d tensor-memory columns; sm_100a has %d "
                       "(x 128 lanes x 32 bits)",
                       t->bn, cols, (int)SPEC_TMEM_COLUMNS_SM100);
    return validate_smem(s);
}

/* A stored tile of the portable main loop (templates/gemm_mma_sync.cu) is kept in shared memory as
 * rows of `cols` elements: its XOR swizzle needs 1, 2, 4 or a multiple of 8 16-byte vectors per
 * row, and its loader gives every thread the same column of whole rows. */
static flce_status validate_stored_rows(const kernel_spec *s, const char *operand, int cols)
{
    const spec_tile *t = &s->tile;
    int vpr = cols / (16 / elem_bytes(s->dtype)), threads = t->warps_m * t->warps_n * 32;
    if (vpr < 1 || (vpr != 1 && vpr != 2 && vpr != 4 && vpr % 8) || threads % vpr)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile %dx%dx%d, warps %dx%d: the %s operand's shared rows of %d elements (%d 16-byte "
                       "vectors) must be 1, 2, 4 or a multiple of 8 vectors dividing the %d threads",
                       t->bm, t->bn, t->bk, t->warps_m, t->warps_n, operand, cols, vpr, threads);
    return FLCE_OK;
}

static flce_status validate_tile(const kernel_spec *s)
{
    const spec_tile *t = &s->tile;
    switch (t->loop) {
    case MAINLOOP_TCGEN05: return validate_tcgen05(s);
    case MAINLOOP_WGMMA_CP_ASYNC:
    case MAINLOOP_WGMMA_TMA: return validate_wgmma(s);
    case MAINLOOP_MMA_SYNC: break;
    default: return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.loop=%d: not a spec_mainloop", (int)t->loop);
    }
    int vec = 16 / elem_bytes(s->dtype);
    if (t->warps_m < 1 || t->warps_n < 1 || t->warps_m > 16 || t->warps_n > 16 ||
        t->warps_m * t->warps_n > 16)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile.warps=%dx%d: need 1 to 16 warps in all", t->warps_m, t->warps_n);
    if (t->bm < 16 || t->bm % (16 * t->warps_m))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile.bm=%d: must be a positive multiple of 16 × warps_m (%d)", t->bm,
                       16 * t->warps_m);
    if (t->bn < 16 || t->bn % (16 * t->warps_n))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile.bn=%d: must be a positive multiple of 16 × warps_n (%d)", t->bn,
                       16 * t->warps_n);
    int bk_unit = s->dtype == FLCE_DTYPE_F32 ? vec : 16;
    if (t->bk < bk_unit || t->bk % bk_unit || t->bk > 128)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile.bk=%d: must be a multiple of %d between %d and 128 for %s", t->bk,
                       bk_unit, bk_unit, spec_dtype_name(s->dtype));
    if (t->stages < 2 || t->stages > 8)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tile.stages=%d: must be 2 to 8", t->stages);
    TRY(validate_stored_rows(s, "A", a_kmajor(s->role) ? t->bk : t->bm));
    TRY(validate_stored_rows(s, "B", b_kmajor(s->role) ? t->bk : t->bn));
    long long acc = (long long)(t->bm / t->warps_m) * (t->bn / t->warps_n) / 32;
    if (acc > 128)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tile %dx%d over %dx%d warps: %lld accumulators per thread, more than the "
                       "128 that fit in registers",
                       t->bm, t->bn, t->warps_m, t->warps_n, acc);
    return validate_smem(s);
}

flce_status spec_validate(const kernel_spec *s)
{
    if (!s) return err_set(FLCE_ERR_INVALID_ARGUMENT, "spec: NULL");
    if (!spec_arch_supported(s->sm))
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "sm=%d: unsupported arch (flce supports sm_80, 86, 87, 89, 90, 100, 120)",
                       s->sm);
    if (s->dtype != FLCE_DTYPE_F32 && s->dtype != FLCE_DTYPE_F16 && s->dtype != FLCE_DTYPE_BF16)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "dtype=%d: not an flce_dtype", (int)s->dtype);
    if (s->hidden < 8 || s->hidden % 8)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "hidden=%lld: must be a positive multiple of 8",
                       (long long)s->hidden);
    if (s->vocab_shard < 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "vocab_shard=%lld: must be at least 1",
                       (long long)s->vocab_shard);
    if (s->label_bits != 32 && s->label_bits != 64)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "label_bits=%d: must be 32 or 64", s->label_bits);
    if (s->opts & ~2047u)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "opts=0x%x: unknown option bits", s->opts);
    /* the soft target's weights are another compact pass's p̃ in this pass's column groups, and its
     * sum takes part_zs, which label smoothing's Σ w_j·z_j otherwise holds */
    if ((s->opts & SPEC_OPT_SOFT) &&
        (s->role != ROLE_LOGITS || !s->compact || s->qrows || s->fused_dz || (s->opts & SPEC_OPT_ZSUM)))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "opts=0x%x: soft-target is for a compact logits pass without "
                       "row-scaled logits, fused dz or zsum", s->opts);
    /* the sparse target's sum takes part_zs too, and is the soft target's alternative */
    if ((s->opts & SPEC_OPT_SPARSE) && (s->role != ROLE_LOGITS || !s->compact || s->qrows || s->fused_dz ||
                                        (s->opts & (SPEC_OPT_ZSUM | SPEC_OPT_SOFT))))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "opts=0x%x: sparse-target is for a compact logits pass without "
                       "row-scaled logits, fused dz, zsum or soft-target", s->opts);
    /* emit.c prints these as float literals: they must be finite (1/T included). */
    if (!(s->softcap >= 0) || !isfinite(s->softcap) || !(s->temperature >= 0) ||
        !isfinite(s->temperature) || (s->temperature > 0 && !isfinite(1.0f / s->temperature)) ||
        !(s->smoothing >= 0 && s->smoothing < 1) || !(s->z_loss >= 0) || !isfinite(s->z_loss))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "options softcap=%g temperature=%g smoothing=%g z_loss=%g: out of range",
                       (double)s->softcap, (double)s->temperature, (double)s->smoothing,
                       (double)s->z_loss);
    if (s->role == ROLE_DISTILL) {
        if (s->reduction != FLCE_REDUCTION_MEAN && s->reduction != FLCE_REDUCTION_SUM &&
            s->reduction != FLCE_REDUCTION_NONE)
            return err_set(FLCE_ERR_INVALID_ARGUMENT, "reduction=%d: not an flce_reduction", (int)s->reduction);
        if (s->divergence < FLCE_DIVERGENCE_FORWARD_KL || s->divergence > FLCE_DIVERGENCE_JSD)
            return err_set(FLCE_ERR_INVALID_ARGUMENT, "divergence=%d: not an flce_divergence", s->divergence);
        return FLCE_OK; /* beta, temperature, ce_weight: emit_distill_source checks them */
    }
    if (s->role == ROLE_ROWOPS) {
        if (s->reduction != FLCE_REDUCTION_MEAN && s->reduction != FLCE_REDUCTION_SUM &&
            s->reduction != FLCE_REDUCTION_NONE)
            return err_set(FLCE_ERR_INVALID_ARGUMENT, "reduction=%d: not an flce_reduction",
                           (int)s->reduction);
        return FLCE_OK;
    }
    if (s->role != ROLE_LOGITS && s->role != ROLE_DH && s->role != ROLE_DW)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "role=%d: not a spec_role", (int)s->role);
    if (s->fused_dz != 0 && (s->fused_dz != 1 || s->role != ROLE_LOGITS))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "fused_dz=%d: 0, or 1 for the logits role only", s->fused_dz);
    if (s->fused_dz && s->reduction != FLCE_REDUCTION_MEAN && s->reduction != FLCE_REDUCTION_SUM &&
        s->reduction != FLCE_REDUCTION_NONE)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "reduction=%d: not an flce_reduction", (int)s->reduction);
    if (s->compact != 0 && (s->compact != 1 || s->role != ROLE_LOGITS || s->fused_dz))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "compact=%d: 0, or 1 for the logits role without fused_dz",
                       s->compact);
    if (s->compact && s->dtype == FLCE_DTYPE_F32)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "compact=1: needs a 16-bit dtype (fp32 logits are stored as they are)");
    if (s->qrows != 0 && (s->qrows != 1 || s->role != ROLE_LOGITS || !s->compact || s->dtype != FLCE_DTYPE_BF16 ||
                          s->tile.loop != MAINLOOP_WGMMA_TMA))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "qrows=%d: 0, or 1 for the compact bf16 logits pass on the wgmma TMA path", s->qrows);
    if (s->plain_out != 0 && (s->plain_out != 1 || s->role == ROLE_LOGITS || s->tile.loop != MAINLOOP_WGMMA_TMA ||
                              s->dtype == FLCE_DTYPE_F32 || s->hidden % s->tile.bn != 0))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "plain_out=%d: 0, or 1 for dH/dW on the wgmma TMA path with a 16-bit dtype and hidden a "
                       "multiple of the tile's BN",
                       s->plain_out);
    if (s->full_tiles != 0 && (s->full_tiles != 1 || s->role != ROLE_LOGITS || !s->compact ||
                               s->vocab_shard % s->tile.bn != 0))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "full_tiles=%d: 0, or 1 for the compact logits pass with vocab_shard a multiple of the tile's BN",
                       s->full_tiles);
    if (s->red_acc != 0 && (s->red_acc < 0 || s->red_acc > 2 || s->role == ROLE_LOGITS || s->plain_out))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "red_acc=%d: 0, or 1 or 2 for dH/dW without plain_out", s->red_acc);
    if (s->cluster != 0 && (s->cluster != 2 || s->tile.loop != MAINLOOP_WGMMA_TMA))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "cluster=%d: 0, or 2 on the wgmma TMA path (tile.loop=wgmma+tma)", s->cluster);
    return validate_tile(s);
}
