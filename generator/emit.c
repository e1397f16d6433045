/* emit.c — spec → CUDA source: a preamble of constants, then the embedded templates (see emit.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "error.h"

/* One entry name per GEMM role, so profilers and logs tell the three apart. */
static const char *const logits_names[] = {"flce_logits", NULL};
static const char *const dh_names[] = {"flce_dh", NULL};
static const char *const dw_names[] = {"flce_dw", NULL};
static const char *const distill_names[] = {"flce_distill_count", "flce_distill_row", "flce_distill_reduce",
                                            "flce_topk_row", "flce_distill_lse", "flce_distill_row_compact",
                                            "flce_distill_row_topk", "flce_distill_row_topk_compact",
                                            "flce_distill_topk_sort", "flce_distill_tp_pack",
                                            "flce_distill_tp_merge", "flce_distill_tp_out", "flce_topk_merge", NULL};
static const char *const rowops_names[] = {"flce_prepare", "flce_combine", "flce_dz", "flce_reduce",
                                           "flce_dbias", "flce_tp_pack", "flce_cast", "flce_qref", "flce_qscale",
                                           "flce_qlist_count", "flce_qlist_fill", "flce_qdw", "flce_qdh", NULL};

const char *const *emit_kernel_names(spec_role role)
{
    switch (role) {
    case ROLE_ROWOPS: return rowops_names;
    case ROLE_DISTILL: return distill_names;
    case ROLE_LOGITS: return logits_names;
    case ROLE_DH: return dh_names;
    default: return dw_names;
    }
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_append(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...) FLCE_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0) sb_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void sb_text(sbuf *b, const char *s) { sb_append(b, s, strlen(s)); }

static void emit_preamble(sbuf *b, const kernel_spec *s)
{
    char summary[256];
    spec_code_summary(s, summary, sizeof summary);
    sb_printf(b, "// flce %s generated kernel: %s\n", FLCE_VERSION_STRING, summary);
    /* -gencode with the virtual arch spelled out: nvcc 13 reads -arch=sm_90a as compute_90 PTX for
     * sm_90a, and ptxas then refuses wgmma and setmaxnreg (checked: tests/gen_nvcc.cmake). -x cu: the
     * file may be saved under any name. */
    const char *arch = spec_arch_name(s->sm);
    sb_printf(b, "// Compile it alone with: nvcc -std=c++17 -gencode arch=compute_%s,code=%s -x cu -c <this file>\n",
              arch + 3, arch);
    sb_text(b, "#define FLCE_GENERATED 1\n");
    sb_printf(b, "#define FLCE_SM %d\n", s->sm);
    sb_printf(b, "#define FLCE_DTYPE %d\n", (int)s->dtype);
    sb_printf(b, "#define FLCE_LABEL_BITS %d\n", s->label_bits);
    sb_printf(b, "#define FLCE_REDUCTION %d\n", (int)s->reduction);
    sb_printf(b, "#define ROLE_IS_LOGITS %d\n", s->role == ROLE_LOGITS);
    sb_printf(b, "#define ROLE_IS_DH %d\n", s->role == ROLE_DH);
    sb_printf(b, "#define ROLE_IS_DW %d\n", s->role == ROLE_DW);
    /* Every switch of a GEMM with its value, 0 included: the templates read them as compile-time
     * values (`if constexpr`, constexpr bool), which need them defined. */
    if (s->role != ROLE_ROWOPS) {
        const spec_tile *t = &s->tile;
        sb_printf(b, "#define FLCE_WGMMA %d  // 1: the Hopper path's 128-byte-swizzled tiles (also Blackwell's)\n",
                  spec_uses_warpgroup(t));
        sb_printf(b, "#define FLCE_TMA %d  // 1: TMA + mbarrier pipeline, producer warpgroup\n", spec_uses_tma(t));
        sb_printf(b, "#define FLCE_FUSED_DZ %d\n", !!s->fused_dz);
        sb_printf(b, "#define FLCE_COMPACT %d\n", !!s->compact);
        sb_printf(b, "#define FLCE_QROWS %d  // p̃ = bf16 exp(z − ref) against one reference per row\n", !!s->qrows);
        sb_printf(b, "#define FLCE_GRAD_PLAIN %d  // only complete 16-bit tiles, through shared memory\n",
                  !!s->plain_out);
        sb_printf(b, "#define FLCE_GRAD_RED %d  // fp32 accumulators may be updated by red.global\n", !!s->red_acc);
        sb_printf(b, "#define FLCE_GRAD_BULK %d  // … by bulk reductions from shared memory\n", spec_bulk_red(s));
        sb_printf(b, "#define FLCE_Z_STAGED %d  // the fp32 Z store staged in shared memory\n", spec_staged_z(s));
        sb_printf(b, "#define FLCE_FULL_TILES %d  // every launch's n is a multiple of BN\n", !!s->full_tiles);
        sb_printf(b, "#define FLCE_CLUSTER %d  // CTAs per cluster: the B tile is multicast to all of them\n",
                  s->cluster > 1 ? s->cluster : 0);
    }
    sb_printf(b, "#define OPT_BIAS %d\n", !!(s->opts & SPEC_OPT_BIAS));
    sb_printf(b, "#define OPT_WEIGHTS %d\n", !!(s->opts & SPEC_OPT_WEIGHTS));
    sb_printf(b, "#define OPT_ZSUM %d\n", !!(s->opts & SPEC_OPT_ZSUM));
    sb_printf(b, "#define OPT_ENTROPY %d\n", !!(s->opts & SPEC_OPT_ENTROPY));
    sb_printf(b, "#define OPT_ARGMAX %d\n", !!(s->opts & SPEC_OPT_ARGMAX));
    sb_printf(b, "#define OPT_TOKEN_GRADS %u  // FLCE_GRAD_* bits: per-token upstream gradients\n",
              (s->opts >> SPEC_OPT_TOKEN_GRADS_SHIFT) & 15u);
    sb_printf(b, "#define OPT_SOFT %d  // Σ_j p_j·z_j against another pass's compact p̃ (distillation)\n",
              !!(s->opts & SPEC_OPT_SOFT));
    sb_printf(b, "#define OPT_SPARSE %d  // Σ_u p_u·z_u over a sorted (id, p) list per row (distillation, top-k)\n",
              !!(s->opts & SPEC_OPT_SPARSE));
    sb_printf(b, "constexpr int SPARSE_K = %d;\n", SPEC_SPARSE_K);
    /* Hex float literals: the exact float the caller passed, no decimal round trip. */
    sb_printf(b, "constexpr float SOFTCAP = %af, INV_TEMP = %af, SMOOTHING = %af, ZLOSS = %af;\n",
              (double)s->softcap, (double)(s->temperature > 0 ? 1.0f / s->temperature : 1.0f), (double)s->smoothing,
              (double)s->z_loss);
    /* No D or V: the shapes are kernel parameters, so one kernel serves every shape (spec.h). */
    if (s->role != ROLE_ROWOPS) {
        const spec_tile *t = &s->tile;
        sb_printf(b, "constexpr int BM = %d, BN = %d, BK = %d, STAGES = %d, WARPS_M = %d, WARPS_N = %d;\n",
                  t->bm, t->bn, t->bk, t->stages, t->warps_m, t->warps_n);
        sb_printf(b, "constexpr bool A_KMAJOR = %s, B_KMAJOR = %s;\n",
                  s->role == ROLE_DW ? "false" : "true", s->role == ROLE_LOGITS ? "true" : "false");
    }
    sb_text(b, "\n");
}

/* The opening of a wgmma asm statement: the predicate and the accumulator list (%0…). */
static void emit_wgmma_asm(sbuf *b, int n, const char *ab)
{
    int regs = n / 2;
    sb_text(b, "    asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n\"\n");
    sb_printf(b, "                 \"wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s {\"\n", n, ab, ab);
    for (int i = 0; i < regs; i += 8) {
        sb_text(b, "                 \"");
        for (int j = i; j < i + 8 && j < regs; j++) sb_printf(b, "%%%d%s", j, j + 1 < regs ? ", " : "");
        sb_text(b, "\"\n");
    }
}
/* The accumulators as read-write operands of that statement. */
static void emit_wgmma_acc(sbuf *b, int regs)
{
    sb_text(b, "                 : ");
    for (int j = 0; j < regs; j++)
        sb_printf(b, "\"+f\"(d[%d][%d])%s%s", j / 4, j % 4, j + 1 < regs ? ", " : "",
                  j % 4 == 3 && j + 1 < regs ? "\n                   " : "");
}

/* The wgmma instruction for the tile's N, with its BN/2 accumulator registers spelled out. */
static void emit_wgmma(sbuf *b, const kernel_spec *s)
{
    int n = s->tile.bn, regs = n / 2;
    const char *ab = s->dtype == FLCE_DTYPE_BF16 ? "bf16" : "f16";
    int ta = s->role == ROLE_DW, tb = s->role != ROLE_LOGITS; /* transposed (MN-major) operands */
    sb_printf(b, "// D(64x%d) += A(64x16) * B(16x%d) for one warpgroup; A %s-major, B %s-major in shared memory.\n",
              n, n, ta ? "M" : "K", tb ? "N" : "K");
    sb_printf(b, "__device__ __forceinline__ void wgmma_tile(float (&d)[%d][4], unsigned long long da, "
                 "unsigned long long db)\n{\n", n / 8);
    emit_wgmma_asm(b, n, ab);
    sb_printf(b, "                 \"}, %%%d, %%%d, p, 1, 1, %d, %d;\\n}\\n\"\n", regs, regs + 1, ta, tb);
    emit_wgmma_acc(b, regs);
    sb_text(b, "\n                 : \"l\"(da), \"l\"(db));\n}\n\n");
}

/* The tcgen05 flag: the Hopper path's swizzled TMA tiles and pipeline (FLCE_WGMMA, FLCE_TMA: the
 * preamble) with its wgmma replaced by tcgen05.mma into tensor memory (templates/gemm_tcgen05.cu).
 * Only Blackwell sources name it: the templates' `#if FLCE_TCGEN05` blocks are resolved here. */
static void emit_tcgen05(sbuf *b, const kernel_spec *s)
{
    sb_text(b, "#define FLCE_TCGEN05 1  // ... with tcgen05.mma into tensor memory instead of wgmma (sm_100a)\n");
    sb_printf(b, "constexpr int TMEM_COLS = %d;  // two BN-column fp32 accumulators\n\n", spec_tmem_columns(s));
}

static int starts_with(const char *line, const char *end, const char *word)
{
    size_t n = strlen(word);
    while (line < end && (*line == ' ' || *line == '\t')) line++;
    return (size_t)(end - line) >= n && !memcmp(line, word, n);
}

/* Appends a template with its `#if FLCE_TCGEN05` and `#if FLCE_CLUSTER` blocks already resolved
 * for the spec: the lines of the branch the spec takes stay, the directives and the other branch go.
 * Sources of the Hopper and portable specs therefore hold no line of the Blackwell path (whose own
 * file emit_gemm leaves out), those without clusters no line of the 2-CTA cluster path, and edits
 * to one leave the other specs' JIT cache keys alone. A block
 * opens with a line starting `#if FLCE_TCGEN05` or `#if FLCE_CLUSTER`, may have one `#else` (no
 * `#elif`) and closes at its `#endif`; such blocks may nest in each other, and other preprocessor
 * conditionals inside or around them are copied through untouched (when their lines are kept). */
static void sb_template(sbuf *b, const char *text, int tcgen05, int cluster)
{
    enum { MAX_DEPTH = 64 };
    struct {
        char resolved, keep; /* resolved: one of our blocks (directives dropped); keep: branch taken */
    } stack[MAX_DEPTH];
    int depth = 0, hidden = 0; /* hidden: resolved blocks on the stack whose current branch is dropped */
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        const char *end = nl ? nl + 1 : line + strlen(line);
        int copy = !hidden;
        int flag = starts_with(line, end, "#if FLCE_TCGEN05")   ? tcgen05
                   : starts_with(line, end, "#if FLCE_CLUSTER") ? cluster
                                                                : -1;
        if (flag >= 0 && depth < MAX_DEPTH) {
            stack[depth].resolved = 1, stack[depth].keep = (char)!!flag;
            hidden += !flag, depth++, copy = 0;
        } else if ((starts_with(line, end, "#if") || starts_with(line, end, "# if")) && depth < MAX_DEPTH) {
            stack[depth].resolved = 0, stack[depth].keep = 1, depth++;
        } else if (depth > 0 && stack[depth - 1].resolved && starts_with(line, end, "#else")) {
            hidden += stack[depth - 1].keep ? 1 : -1;
            stack[depth - 1].keep = (char)!stack[depth - 1].keep, copy = 0;
        } else if (depth > 0 && starts_with(line, end, "#endif")) {
            depth--;
            if (stack[depth].resolved) hidden -= !stack[depth].keep, copy = 0;
        }
        if (copy) sb_append(b, line, (size_t)(end - line));
        line = end;
    }
}

/* A GEMM: the generated constants of its main loop, then the template pieces it uses and no other,
 * so a spec's source (and JIT cache key) holds only its own main loop and its role's epilogue.
 * The pieces keep one order, each building on the ones before: gemm.cu (what all paths share);
 * the main loop (gemm_wgmma.cu's swizzled tiles under both Hopper loops and tcgen05, then
 * gemm_wgmma_tma.cu and gemm_tcgen05.cu, or gemm_wgmma_cp_async.cu, or gemm_mma_sync.cu); the
 * epilogue (gemm_logits.cu or gemm_grad.cu); gemm_entry.cu, the kernels. */
static void emit_gemm(sbuf *b, const kernel_spec *s)
{
    int tcgen05 = s->tile.loop == MAINLOOP_TCGEN05, cluster = s->cluster > 1;
    int hopper = spec_uses_warpgroup(&s->tile); /* FLCE_WGMMA: the swizzled TMA / cp.async tiles */
    if (spec_uses_wgmma(&s->tile)) emit_wgmma(b, s);
    if (tcgen05) emit_tcgen05(b, s);
    const char *pieces[8];
    int n = 0;
    pieces[n++] = tmpl_gemm_cu;
    if (hopper) {
        pieces[n++] = tmpl_gemm_wgmma_cu;
        if (spec_uses_tma(&s->tile)) pieces[n++] = tmpl_gemm_wgmma_tma_cu;
        if (tcgen05) pieces[n++] = tmpl_gemm_tcgen05_cu;
        if (!spec_uses_tma(&s->tile)) pieces[n++] = tmpl_gemm_wgmma_cp_async_cu;
    } else {
        pieces[n++] = tmpl_gemm_mma_sync_cu;
    }
    pieces[n++] = s->role == ROLE_LOGITS ? tmpl_gemm_logits_cu : tmpl_gemm_grad_cu;
    pieces[n++] = tmpl_gemm_entry_cu;
    for (int i = 0; i < n; i++) {
        /* Each piece starts on a line of its own, as when the build concatenated them. */
        if (b->len && b->p[b->len - 1] != '\n') sb_text(b, "\n");
        sb_template(b, pieces[i], tcgen05, cluster);
    }
}

flce_status emit_source(const kernel_spec *s, char **src)
{
    *src = NULL;
    TRY(spec_validate(s));
    if (s->role == ROLE_DISTILL) {
        distill_kernel_spec d = {s->sm, s->dtype, (flce_divergence)s->divergence, s->beta, s->temperature,
                                 s->ce_weight, s->has_labels, s->label_bits, s->reduction};
        return emit_distill_source(&d, src);
    }
    sbuf b = {0};
    emit_preamble(&b, s);
    sb_text(&b, tmpl_params_h);
    sb_text(&b, "\n");
    sb_text(&b, tmpl_common_cuh);
    sb_text(&b, "\n");
    if (s->role == ROLE_ROWOPS) sb_text(&b, tmpl_rowops_cu);
    else emit_gemm(&b, s);
    if (b.oom) {
        free(b.p);
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "emitting kernel source: out of host memory");
    }
    *src = b.p;
    return FLCE_OK;
}



flce_status emit_distill_source(const distill_kernel_spec *s, char **src)
{
    *src = NULL;
    if (!spec_arch_supported(s->sm))
        return err_set(FLCE_ERR_UNSUPPORTED, "distill spec: sm=%d not supported", s->sm);
    if (s->label_bits != 32 && s->label_bits != 64)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "distill spec: label_bits=%d", s->label_bits);
    if (!(s->temperature > 0.0f) || !(s->beta >= 0.0f && s->beta <= 1.0f))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "distill spec: temperature=%g, beta=%g", (double)s->temperature,
                       (double)s->beta);
    if (s->ce_weight != 0.0f && (!s->has_labels || s->temperature != 1.0f))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "distill spec: ce_weight=%g needs labels and temperature 1",
                       (double)s->ce_weight);
    int div = (int)s->divergence;
    if (div == FLCE_DIVERGENCE_JSD && s->beta <= 0.0f) div = FLCE_DIVERGENCE_FORWARD_KL; /* Liger's ends */
    if (div == FLCE_DIVERGENCE_JSD && s->beta >= 1.0f) div = FLCE_DIVERGENCE_REVERSE_KL;
    sbuf b = {0};
    sb_text(&b, "// Generated by flce (generator/emit.c emit_distill_source): the distillation row kernels.\n");
    sb_printf(&b, "// distill %s div=%d beta=%.9g T=%.9g ce=%.9g labels=%d/%d reduction=%d\n",
              spec_arch_name(s->sm), div, (double)s->beta, (double)s->temperature, (double)s->ce_weight,
              s->has_labels, s->label_bits, (int)s->reduction);
    sb_text(&b, "#define FLCE_GENERATED 1\n");
    sb_printf(&b, "#define FLCE_DTYPE %d  // 0 f32, 1 f16, 2 bf16: the GEMMs' inputs and outputs\n", (int)s->dtype);
    sb_printf(&b, "#define DISTILL_DIV %d  // 0 forward KL, 1 reverse KL, 2 JSD\n", div);
    sb_printf(&b, "#define DISTILL_LABELS %d\n", !!s->has_labels);
    sb_printf(&b, "#define FLCE_LABEL_BITS %d\n", s->label_bits);
    sb_printf(&b, "#define FLCE_REDUCTION %d  // 0 mean, 1 sum, 2 none\n", (int)s->reduction);
    /* %a: the exact float, so the kernel uses the caller's β, 1/T and weight bit for bit */
    sb_printf(&b, "constexpr float DISTILL_BETA = %af, INV_TEMP = %af, CE_WEIGHT = %af;\n\n", (double)s->beta,
              (double)(1.0f / s->temperature), (double)s->ce_weight);
    sb_text(&b, tmpl_params_h); /* the top-k merge's FLCE_TP_HEADER and FLCE_FLAG_TP_* */
    sb_text(&b, tmpl_distill_cu);
    if (b.oom) {
        free(b.p);
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "emitting distill source: out of host memory");
    }
    *src = b.p;
    return FLCE_OK;
}
