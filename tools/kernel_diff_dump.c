/* kernel_diff_dump.c — for tools/kernel_diff.sh (which compiles it against a build's libflce.a):
 * writes the generated source of a matrix of kernel specs (every GEMM main loop, role and logits
 * variant the templates have #if branches for, with and without options; rowops as a control),
 * NNN_<role>_<kind>_sm<arch>.cu plus index.txt, and the cubin the library's nvrtc_compile builds
 * from each (NNN_....cubin). Usage: kernel_diff_dump OUTDIR [--no-cubin] [--only NNN]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* tools/' one internal header (runtime/tool_api.h, issue 42). kernel_diff.sh also builds this file
 * against older trees, and a tree from before 2026-11-28 has no tool_api.h: there the three headers
 * it would bring in. (__has_include is a GCC/Clang extension before C23; without it, tool_api.h.) */
#if defined(__has_include)
#if !__has_include("tool_api.h")
#define KERNEL_DIFF_OLD_TREE 1
#endif
#endif
#ifdef KERNEL_DIFF_OLD_TREE
#include "emit.h"
#include "nvrtc_compile.h"
#include "spec.h"
#else
#include "tool_api.h"
#endif

/* A setting by its name (a variable, or a developer switch's FLCE_DEV key "tma"; value NULL: its
 * default), given to the library as data (config_set_name). Weak, with the environment as the
 * fallback, so that this file still builds and runs against a libflce.a from before config_set_name
 * (the other side of a comparison): there a switch is an item of FLCE_DEV and, before 2026-11-28,
 * its own FLCE_<KEY> (that build reads only that; a newer one reads both, with a warning), and the
 * settings are re-read after each setenv (config_reload, weak too: before config.c the library read
 * the environment at every call). */
int config_set_name(const char *name, const char *value) __attribute__((weak));
void config_reload(void) __attribute__((weak));
static void env_put(const char *name, const char *value)
{
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}
static void setting(const char *name, const char *value)
{
    if (config_set_name && config_set_name(name, value) == 0) return;
    if (strncmp(name, "FLCE_", 5)) { /* a developer switch's key */
        char item[64], legacy[64];
        snprintf(item, sizeof item, "%s=%s", name, value ? value : "");
        size_t n = (size_t)snprintf(legacy, sizeof legacy, "FLCE_%s", name);
        for (size_t i = 5; i < n && i < sizeof legacy; i++)
            if (legacy[i] >= 'a' && legacy[i] <= 'z') legacy[i] = (char)(legacy[i] - 'a' + 'A');
        env_put("FLCE_DEV", value ? item : NULL), env_put(legacy, value);
    } else env_put(name, value);
    if (config_reload) config_reload();
}

static const char *outdir;
static int want_cubin = 1, only = -1, count, invalid;
static FILE *index_file;

static void put(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
        fprintf(stderr, "kernel_diff_dump: cannot write %s\n", path);
        exit(1);
    }
}

static void dump(const kernel_spec *s, const char *kind)
{
    if (spec_validate(s) != FLCE_OK) {
        invalid++;
        return;
    }
    char *src = NULL;
    if (emit_source(s, &src) != FLCE_OK) {
        fprintf(stderr, "kernel_diff_dump: emit failed: %s\n", flce_last_error());
        exit(1);
    }
    char name[64], path[512], summary[256];
    const int idx = count++;
    if (only >= 0 && idx != only) {
        free(src);
        return;
    }
    snprintf(name, sizeof name, "%03d_%s_%s_sm%d", idx, spec_role_name(s->role), kind, s->sm);
    snprintf(path, sizeof path, "%s/%s.cu", outdir, name);
    put(path, src, strlen(src));
    spec_summary(s, summary, sizeof summary);
    fprintf(index_file, "%s sm=%d %s opts=%u fused_dz=%d compact=%d red=%d labels=%d\n", name, s->sm, summary,
            s->opts, s->fused_dz, s->compact, (int)s->reduction, s->label_bits);
    if (want_cubin) {
        void *bin = NULL;
        size_t len = 0;
        if (nvrtc_compile(src, "flce_kernel.cu", s->sm, &bin, &len) != FLCE_OK) {
            fprintf(stderr, "kernel_diff_dump: %s: %s\n", name, flce_last_error());
            exit(1);
        }
        snprintf(path, sizeof path, "%s/%s.cubin", outdir, name);
        put(path, bin, len);
        free(bin);
    }
    free(src);
}

static kernel_spec base(int sm, flce_dtype dt, spec_role role)
{
    kernel_spec s;
    memset(&s, 0, sizeof s);
    s.sm = sm, s.dtype = dt, s.hidden = 4096, s.vocab_shard = 32000, s.role = role;
    s.label_bits = 32, s.reduction = FLCE_REDUCTION_MEAN;
    if (role != ROLE_ROWOPS) s.tile = spec_default_tile(sm, dt, role);
    return s;
}

/* Every logits variant (plain Z store, compact p̃, fused dZ with reduction mean / none) with no
 * options and with all of them, and dH, dW; `tile` overrides the default tile when non-NULL. */
static void gemms(int sm, flce_dtype dt, const char *kind, const spec_tile *tile)
{
    const unsigned all = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX;
    for (int role = ROLE_LOGITS; role <= ROLE_DW; role++) {
        kernel_spec s = base(sm, dt, (spec_role)role);
        if (tile) s.tile = *tile;
        if (role != ROLE_LOGITS) {
            dump(&s, kind);
            continue;
        }
        for (int o = 0; o < 2; o++) {
            kernel_spec l = s;
            if (o) l.opts = all, l.softcap = 30.f, l.temperature = 0.7f, l.label_bits = 64;
            dump(&l, kind); /* statistics + fp32 Z */
            kernel_spec c = l;
            c.compact = 1;
            if (dt != FLCE_DTYPE_F32) dump(&c, kind);
            for (int r = 0; r < 2; r++) {
                kernel_spec z = l;
                z.fused_dz = 1;
                z.reduction = r ? FLCE_REDUCTION_NONE : FLCE_REDUCTION_MEAN;
                if (o) z.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM, z.smoothing = 0.1f, z.z_loss = 1e-4f;
                dump(&z, kind);
            }
        }
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    outdir = argv[1];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--no-cubin")) want_cubin = 0;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = atoi(argv[++i]);
        else return 2;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/index.txt", outdir);
    index_file = fopen(path, "w");
    if (!index_file) return 1;
    const flce_dtype dts[] = {FLCE_DTYPE_BF16, FLCE_DTYPE_F16, FLCE_DTYPE_F32};
    const char *dtn[] = {"bf16", "f16", "f32"};
    char kind[64];
    setting("FLCE_ENABLE_SM100", NULL);
    setting("FLCE_DEV", NULL), setting("tma", NULL); /* every switch at its default */
    for (int d = 0; d < 3; d++) {
        /* sm_80: mma.sync (16-bit) and exact FFMA (f32) */
        snprintf(kind, sizeof kind, "mma_%s", dtn[d]);
        gemms(80, dts[d], kind, NULL);
        /* sm_90a: wgmma + TMA (16-bit), FFMA (f32) */
        snprintf(kind, sizeof kind, "%s_%s", d < 2 ? "tma" : "mma", dtn[d]);
        gemms(90, dts[d], kind, NULL);
    }
    /* sm_90a, FLCE_DEV tma=0: wgmma fed by cp.async; FLCE_PORTABLE's tile: mma.sync on Hopper */
    setting("tma", "0");
    for (int d = 0; d < 2; d++) {
        snprintf(kind, sizeof kind, "cpasync_%s", dtn[d]);
        gemms(90, dts[d], kind, NULL);
    }
    setting("tma", NULL);
    for (int d = 0; d < 2; d++) {
        spec_tile t = spec_default_tile(89, dts[d], ROLE_LOGITS);
        t.stages = 4;
        snprintf(kind, sizeof kind, "portable_%s", dtn[d]);
        gemms(90, dts[d], kind, &t);
    }
    /* other tile shapes: wgmma+TMA and cp.async wgmma at BN 128 and 64, a small mma.sync tile */
    {
        spec_tile t = spec_default_tile(90, FLCE_DTYPE_BF16, ROLE_DH);
        t.bn = 128;
        gemms(90, FLCE_DTYPE_BF16, "tma128_bf16", &t);
        t.loop = MAINLOOP_WGMMA_CP_ASYNC, t.bn = 64;
        gemms(90, FLCE_DTYPE_F16, "cpasync64_f16", &t);
        spec_tile m = {64, 64, 32, 2, 2, 2, MAINLOOP_MMA_SYNC};
        gemms(80, FLCE_DTYPE_F16, "mma64_f16", &m);
        m.bk = 16;
        gemms(80, FLCE_DTYPE_F32, "mma64_f32", &m);
    }
    /* sm_100a: tcgen05 (FLCE_ENABLE_SM100=1, 16-bit), FFMA (f32); without the opt-in, mma.sync */
    setting("FLCE_ENABLE_SM100", "1");
    for (int d = 0; d < 3; d++) {
        snprintf(kind, sizeof kind, "%s_%s", d < 2 ? "tcgen05" : "mma", dtn[d]);
        gemms(100, dts[d], kind, NULL);
    }
    {
        spec_tile t = spec_default_tile(100, FLCE_DTYPE_BF16, ROLE_DW);
        t.bn = 128, t.stages = 6;
        gemms(100, FLCE_DTYPE_BF16, "tcgen05_128_bf16", &t);
    }
    setting("FLCE_ENABLE_SM100", NULL);
    gemms(100, FLCE_DTYPE_BF16, "mma_bf16", NULL);
    /* rowops: without and with every option; then with the per-token upstream gradients (every
     * SPEC_OPT_GRAD_* bit: OPT_TOKEN_GRADS) under the sum and the none reduction, which take
     * rowops.cu's other branches of the dz coefficients and scales */
    for (int d = 0; d < 3; d++) {
        kernel_spec r = base(90, dts[d], ROLE_ROWOPS);
        dump(&r, dtn[d]);
        r.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX;
        r.softcap = 30.f, r.temperature = 0.7f, r.smoothing = 0.1f, r.z_loss = 1e-4f, r.label_bits = 64;
        r.reduction = FLCE_REDUCTION_NONE;
        dump(&r, dtn[d]);
    }
    for (int d = 0; d < 3; d++) {
        kernel_spec r = base(90, dts[d], ROLE_ROWOPS);
        r.opts = SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_GRAD_LOGPROB | SPEC_OPT_GRAD_LSE |
                 SPEC_OPT_GRAD_ENTROPY | SPEC_OPT_GRAD_LOSS_ROWS;
        r.smoothing = 0.1f, r.reduction = FLCE_REDUCTION_SUM;
        dump(&r, dtn[d]);
        r.reduction = FLCE_REDUCTION_NONE, r.softcap = 30.f, r.temperature = 0.7f;
        dump(&r, dtn[d]);
    }
    /* The spec flags the lists above leave at 0, appended so that the numbers above stay: qrows,
     * full_tiles, 2-CTA clusters (logits, dH, dW), plain_out, red_acc 1 (bulk reductions where
     * spec_bulk_red) and 2 (red.global), on the paths that take them; invalid ones are skipped. */
    setting("FLCE_ENABLE_SM100", "1");
    const int variant_sm[] = {90, 80, 100};
    for (int a = 0; a < 3; a++)
        for (int d = 0; d < 3; d++) {
            const int sm = variant_sm[a];
            snprintf(kind, sizeof kind, "var_%s", dtn[d]);
            for (int o = 0; o < 2; o++) {
                kernel_spec l = base(sm, dts[d], ROLE_LOGITS);
                if (o) l.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM | SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX,
                       l.label_bits = 64;
                l.compact = 1, l.qrows = 1;
                dump(&l, kind);
                l.full_tiles = 1;
                dump(&l, kind);
                l.qrows = 0;
                dump(&l, kind);
                l.full_tiles = 0, l.compact = 0, l.cluster = 2;
                dump(&l, kind);
                l.compact = 1;
                dump(&l, kind);
                l.compact = 0, l.fused_dz = 1, l.reduction = o ? FLCE_REDUCTION_NONE : FLCE_REDUCTION_MEAN;
                if (o) l.opts = SPEC_OPT_BIAS | SPEC_OPT_WEIGHTS | SPEC_OPT_ZSUM, l.smoothing = 0.1f;
                dump(&l, kind);
            }
            for (int role = ROLE_DH; role <= ROLE_DW; role++) {
                kernel_spec g = base(sm, dts[d], (spec_role)role);
                g.cluster = 2;
                dump(&g, kind);
                g.cluster = 0, g.plain_out = 1;
                dump(&g, kind);
                for (int r = 1; r <= 2; r++) {
                    g.plain_out = 0, g.red_acc = r;
                    dump(&g, kind);
                    g.cluster = 2;
                    dump(&g, kind);
                    g.cluster = 0;
                }
            }
        }
    setting("FLCE_ENABLE_SM100", NULL);
    /* The distillation and top-k row kernels' module (ROLE_DISTILL, templates/distill.cu), appended
     * after the GEMMs: each dtype and divergence, without labels (T 2) and with them (the CE term
     * at T 1; 64-bit labels for fp16), the three reductions in turn. */
    for (int d = 0; d < 3; d++)
        for (int div = 0; div < 3; div++)
            for (int lab = 0; lab < 2; lab++) {
                kernel_spec s;
                memset(&s, 0, sizeof s);
                s.sm = 90, s.dtype = dts[d], s.role = ROLE_DISTILL, s.hidden = 4096, s.vocab_shard = 32000;
                s.divergence = div, s.beta = div == 2 ? 0.4f : 0.5f, s.temperature = lab ? 1.f : 2.f;
                s.has_labels = lab, s.ce_weight = lab ? 0.5f : 0.f, s.label_bits = lab && d == 1 ? 64 : 32;
                s.reduction = (flce_reduction)((d + div + lab) % 3);
                snprintf(kind, sizeof kind, "%s_div%d_lab%d", dtn[d], div, lab);
                dump(&s, kind);
            }
    fclose(index_file);
    printf("kernel_diff_dump: %d sources (%d invalid combinations skipped)\n", count, invalid);
    return 0;
}
