/* test_compile.c — every kernel spec the dispatcher can choose compiles with NVRTC for sm_80,
 * sm_90a and sm_100a (no GPU needed), the opt-in tcgen05 specs of sm_100a (FLCE_ENABLE_SM100=1)
 * included, and a representative set for sm_86, sm_87, sm_89 and sm_120. Compiles go through the
 * disk cache (FLCE_CACHE_DIR is the build tree's), whose key holds the full source, so a hit means
 * this exact source compiled.
 *
 * Each distinct source compiles once (issue 41 item 8: 548 s of the README's 9-minute test run was
 * this test). A spec's source differs from another arch's only in its header comments and its
 * `#define FLCE_SM` line wherever the generator chose the same kernel for both (every rowops spec,
 * the portable mma.sync GEMMs of sm_80 and sm_87, ...): the templates include no system header and
 * read the arch in one place only, `FLCE_SM >= 90` (checked by templates_read_the_arch_once). So a
 * spec whose source, without those lines and with that one bit where the source holds the test,
 * already compiled for another arch in this run is counted, not compiled again, except that every
 * (arch, role) still compiles at least one spec, its shortest source, so that each arch's code
 * generator sees every role: 123 compiles for 268 specs (159 for 336 before the 64-bit-label variants
 * were thinned, add_arch). FLCE_TEST_COMPILE_EVERY_ARCH=1
 * compiles every spec for its own arch as before (the CTest test_compile_every_arch, configuration
 * Extra:
 * ctest -C Extra -L compile_full). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "compile_pool.h"
#include "emit.h"
#include "jit.h"
#include "nvrtc_compile.h"
#include "plan.h"

enum { MAX_SPECS = 256 };
static kernel_spec specs[MAX_SPECS];
static int n_specs, failures;

/* The dispatcher's choices: every role, dtype, label width and reduction on the arch. Shapes only
 * change constants, so one awkward shape (odd vocab, small hidden) stands for all. */
static void add_arch(int sm)
{
    for (int dt = 0; dt < 3; dt++)
        for (int lb = 32; lb <= 64; lb += 32)
            for (int red = 0; red < 3; red++) {
                flce_problem p;
                flce_problem_init(&p);
                p.tokens = 300, p.hidden = 136, p.vocab_shard = 1001, p.dtype = (flce_dtype)dt;
                p.label_bits = lb, p.reduction = (flce_reduction)red;
                plan pl;
                if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &pl) != FLCE_OK) {
                    failures++;
                    continue;
                }
                /* 64-bit labels change only the label loads: their rowops with every option on for
                 * one reduction per dtype (each reduction once), their logits for one dtype (CI's
                 * 15 minutes; FLCE_TEST_COMPILE_EVERY_ARCH=1 compiles this thinned list too) */
                const int wide = lb == 64, wide_rowops = !wide || red == dt, wide_logits = !wide || dt == 1;
                if (!wide) specs[n_specs++] = pl.rowops;
                /* every option on, for each dtype and reduction: bias, weights, smoothing,
                 * z-loss, softcap, temperature, per-token outputs */
                p.has_bias = 1, p.has_class_weights = 1, p.label_smoothing = 0.1f, p.z_loss = 1e-4f;
                p.softcap = 30.f, p.temperature = 0.8f;
                flce_tensors t;
                flce_tensors_init(&t);
                plan po;
                if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &po) != FLCE_OK) {
                    failures++;
                    continue;
                }
                if (wide_rowops) specs[n_specs++] = po.rowops;
                if (lb == 32) specs[n_specs++] = po.logits;
                (void)t;
                /* recompute's logits pass with the dZ epilogue, which depends on the reduction
                 * (none or not): every option on, and none */
                if (lb == 32 && red != FLCE_REDUCTION_SUM) {
                    plan pr;
                    p.strategy = FLCE_STRATEGY_RECOMPUTE;
                    if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &pr) != FLCE_OK || !pr.fused_dz) failures++;
                    else specs[n_specs++] = pr.logits_dz;
                    p.has_bias = p.has_class_weights = 0, p.label_smoothing = p.z_loss = p.softcap = 0.f;
                    p.temperature = 1.f;
                    if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &pr) != FLCE_OK || !pr.fused_dz) failures++;
                    else if (red == FLCE_REDUCTION_MEAN) specs[n_specs++] = pr.logits_dz;
                }
                if (red) continue; /* GEMMs do not depend on the reduction */
                if (wide_logits) specs[n_specs++] = pl.logits;
                if (lb == 64) continue; /* nor dH/dW on the label width */
                specs[n_specs++] = pl.dh;
                specs[n_specs++] = pl.dw;
            }
}

/* ---- each distinct source once ------------------------------------------------------------- */

static uint64_t fnv(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

/* The source's hash without its leading comment lines and its FLCE_SM line, with FLCE_SM >= 90
 * (the one way the templates read the arch) in its place where the source reads it; `len` the
 * source's length. */
static int arch_free_hash(const kernel_spec *s, uint64_t *out, size_t *len)
{
    char *src = NULL;
    if (emit_source(s, &src) != FLCE_OK) return 0;
    uint64_t h = 1469598103934665603ull;
    int header = 1;
    for (const char *q = src; *q;) {
        const char *e = strchr(q, '\n');
        size_t n = e ? (size_t)(e - q) + 1 : strlen(q);
        int comment = n >= 2 && q[0] == '/' && q[1] == '/';
        if (!(header && comment) && strncmp(q, "#define FLCE_SM ", 16) != 0) h = fnv(h, q, n);
        if (!comment) header = 0;
        q += n;
    }
    /* the one arch test of the templates, where the source holds it (the GEMMs' red_add2) */
    char bit = strstr(src, "FLCE_SM >= 90") ? (s->sm >= 90 ? '1' : '0') : '-';
    *out = fnv(h, &bit, 1);
    *len = strlen(src);
    free(src);
    return 1;
}

enum { MAX_SEEN = 1024 };
static uint64_t seen[MAX_SEEN]; /* arch-free hashes compiled so far in this process */
static int n_seen, n_skipped, n_compiled;

static int seen_before(uint64_t h)
{
    for (int i = 0; i < n_seen; i++)
        if (seen[i] == h) return 1;
    return 0;
}

/* Compiles specs[0 .. n_specs) less those whose arch-free source already compiled (above), keeping
 * for every (arch, role) of the batch at least its shortest source. */
static void compile_all(void)
{
    if (getenv("FLCE_TEST_COMPILE_EVERY_ARCH") && atoi(getenv("FLCE_TEST_COMPILE_EVERY_ARCH"))) {
        failures += compile_pool_run(specs, n_specs);
        n_compiled += n_specs;
        return;
    }
    static kernel_spec todo[MAX_SPECS];
    uint64_t hash[MAX_SPECS];
    size_t len[MAX_SPECS];
    int keep[MAX_SPECS], n = 0, skipped = 0;
    for (int i = 0; i < n_specs; i++) {
        if (!arch_free_hash(&specs[i], &hash[i], &len[i])) {
            fprintf(stderr, "  emit failed: %s\n", flce_last_error());
            failures++;
            keep[i] = 0;
            continue;
        }
        keep[i] = !seen_before(hash[i]); /* also an exact repeat within the batch: added just below */
        if (keep[i] && n_seen < MAX_SEEN) seen[n_seen++] = hash[i];
    }
    /* every (arch, role) of the batch compiles something: its shortest source if nothing yet */
    for (int i = 0; i < n_specs; i++) {
        int covered = 0, best = -1;
        for (int j = 0; j < n_specs; j++) {
            if (specs[j].sm != specs[i].sm || specs[j].role != specs[i].role || !len[j]) continue;
            covered |= keep[j];
            if (best < 0 || len[j] < len[best]) best = j;
        }
        if (!covered && best >= 0) keep[best] = 1;
    }
    for (int i = 0; i < n_specs; i++) {
        if (keep[i]) todo[n++] = specs[i];
        else skipped++;
    }
    printf("     (%d specs: %d compiled, %d the same source as one compiled for another arch or above)\n", n_specs,
           n, skipped);
    failures += compile_pool_run(todo, n);
    n_compiled += n, n_skipped += skipped;
}

/* The arch-free hash above is sound only while the templates read the arch as `FLCE_SM >= 90`
 * alone, include no system header and never test __CUDA_ARCH__ (NVRTC defines it per arch). */
static void templates_read_the_arch_once(void)
{
    const char *const *tmpl = tmpl_all;
    int uses = 0, known = 0;
    for (size_t t = 0; tmpl[t]; t++) {
        for (const char *p = tmpl[t]; (p = strstr(p, "FLCE_SM")) != NULL; p++) uses++;
        for (const char *p = tmpl[t]; (p = strstr(p, "FLCE_SM >= 90")) != NULL; p++) known++;
        CHECKF(!strstr(tmpl[t], "__CUDA_ARCH__"), "template %zu tests __CUDA_ARCH__: compile_all's hash misses it", t);
        CHECKF(!strstr(tmpl[t], "#include <"), "template %zu includes a system header: compile_all's hash misses "
               "what it does per arch", t);
    }
    CHECKF(uses == known, "the templates read FLCE_SM otherwise than `FLCE_SM >= 90` (%d uses, %d known): "
           "extend arch_free_hash in test_compile.c", uses, known);
}

/* The other arches the dispatcher plans for run the same portable mma.sync kernels with their own
 * shared-memory limit (fewer stages on sm_86/89/120): one representative set per arch, issue 15:
 * the 16-bit and the fp32 main loop, every option on (logits, the recompute dZ epilogue, rowops)
 * and dH/dW, mean reduction, 32-bit labels. What add_arch adds beyond this only varies constants. */
static void add_representative(int sm)
{
    static const flce_dtype dts[] = {FLCE_DTYPE_BF16, FLCE_DTYPE_F32};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        flce_problem p;
        flce_problem_init(&p);
        p.tokens = 300, p.hidden = 136, p.vocab_shard = 1001, p.dtype = dts[k];
        p.has_bias = 1, p.has_class_weights = 1, p.label_smoothing = 0.1f, p.z_loss = 1e-4f;
        p.softcap = 30.f, p.temperature = 0.8f;
        plan pl, pr;
        if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &pl) != FLCE_OK) {
            failures++;
            continue;
        }
        specs[n_specs++] = pl.rowops;
        specs[n_specs++] = pl.logits;
        specs[n_specs++] = pl.dh;
        specs[n_specs++] = pl.dw;
        p.strategy = FLCE_STRATEGY_RECOMPUTE;
        if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, sm, 100, NULL, &pr) != FLCE_OK || !pr.fused_dz) failures++;
        else specs[n_specs++] = pr.logits_dz;
    }
}

static void representative_specs_compile_for_sm_86_87_89_120(void)
{
    static const int sms[] = {86, 87, 89, 120};
    n_specs = failures = 0;
    for (size_t a = 0; a < sizeof sms / sizeof sms[0]; a++) add_representative(sms[a]);
    CHECKF(n_specs == 40, "%d specs", n_specs);
    for (int i = 0; i < n_specs; i++)
        CHECKF(specs[i].tile.loop == MAINLOOP_MMA_SYNC, "sm_%d: not the portable path", specs[i].sm);
    compile_all();
    CHECKF(failures == 0, "%d of %d specs failed", failures, n_specs);
}

/* issue 19: the portable main loop at the shapes its tiles may take besides the default 128×256×32
 * (the autotuner's 256×128 and BK 64 at 4 warps by 2, a 4-warp tile whose BK 16 gives an odd
 * k-step count, a 64-row tile), every option on, all three roles (dW reads both operands
 * transposed); and Hopper's FLCE_PORTABLE=1 plan, which must take the portable 128×256 tile. */
static void portable_tile_shapes_compile(void)
{
    static const struct {
        int sm;
        flce_dtype dt;
        spec_tile t;
    } cases[] = {
        {80, FLCE_DTYPE_BF16, {256, 128, 32, 4, 4, 2, MAINLOOP_MMA_SYNC}},
        {80, FLCE_DTYPE_F16, {128, 256, 64, 3, 2, 4, MAINLOOP_MMA_SYNC}},
        {86, FLCE_DTYPE_BF16, {128, 128, 16, 4, 2, 2, MAINLOOP_MMA_SYNC}},
        {89, FLCE_DTYPE_F32, {256, 128, 16, 4, 4, 2, MAINLOOP_MMA_SYNC}},
        {120, FLCE_DTYPE_F16, {64, 128, 32, 3, 2, 2, MAINLOOP_MMA_SYNC}},
    };
    n_specs = failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flce_problem p;
        flce_problem_init(&p);
        p.tokens = 300, p.hidden = 136, p.vocab_shard = 1001, p.dtype = cases[i].dt;
        p.has_bias = 1, p.has_class_weights = 1, p.label_smoothing = 0.1f, p.softcap = 30.f;
        plan pl;
        if (plan_make(&p, FLCE_OP_LOSS_AND_GRAD, cases[i].sm, 100, NULL, &pl) != FLCE_OK) {
            failures++;
            continue;
        }
        kernel_spec *role[3] = {&pl.logits, &pl.dh, &pl.dw};
        for (int r = 0; r < 3; r++) {
            role[r]->tile = cases[i].t;
            CHECKF(spec_validate(role[r]) == FLCE_OK, "case %zu role %d: %s", i, r, flce_last_error());
            specs[n_specs++] = *role[r];
        }
    }
    config_set(CONFIG_PORTABLE, "1");
    int before = n_specs;
    add_representative(90);
    for (int i = before; i < n_specs; i++)
        if (specs[i].role != ROLE_ROWOPS)
            CHECKF(specs[i].tile.loop == MAINLOOP_MMA_SYNC && specs[i].tile.bm == 128 && specs[i].tile.bn == 256,
                   "FLCE_PORTABLE=1 on sm_90: tile %dx%d loop %s", specs[i].tile.bm, specs[i].tile.bn,
                   spec_mainloop_name(specs[i].tile.loop));
    config_set(CONFIG_PORTABLE, NULL);
    compile_all();
    CHECKF(failures == 0, "%d of %d specs failed", failures, n_specs);
}

static void every_dispatchable_spec_compiles_for_sm_80(void)
{
    n_specs = failures = 0;
    add_arch(80);
    compile_all();
    CHECKF(failures == 0, "%d of %d specs failed", failures, n_specs);
}

static void every_dispatchable_spec_compiles_for_sm_90a(void)
{
    n_specs = failures = 0;
    add_arch(90);
    /* the bf16 logits passes (compact, statistics only, logits+dZ; every option and none) in 2-CTA
     * clusters (the default from 4 row blocks) */
    const int base = n_specs;
    for (int i = 0; i < base && n_specs + 1 <= MAX_SPECS; i++) {
        kernel_spec c = specs[i];
        if (c.role != ROLE_LOGITS || c.tile.loop != MAINLOOP_WGMMA_TMA || c.dtype != FLCE_DTYPE_BF16 || c.label_bits != 32 || c.cluster)
            continue;
        c.cluster = 2;
        specs[n_specs++] = c;
    }
    printf("     (%d specs, %d of them logits in clusters)\n", n_specs, n_specs - base);
    compile_all();
    CHECKF(failures == 0, "%d of %d specs failed", failures, n_specs);
}

static void every_dispatchable_spec_compiles_for_sm_100a(void)
{
    n_specs = failures = 0;
    add_arch(100);
    compile_all();
    CHECKF(failures == 0, "%d of %d specs failed", failures, n_specs);
}

/* The Blackwell path has not run on hardware, so it is opt-in; CI at least compiles every spec it
 * can choose: three roles, both 16-bit dtypes, with and without every option (their registers sit
 * beside the 128 accumulators), both label widths. f32 stays portable. */
static void tcgen05_specs_compile_for_sm_100a_when_enabled(void)
{
    config_set(CONFIG_ENABLE_SM100, "1");
    n_specs = failures = 0;
    add_arch(100);
    int tc[3][3] = {{0}}; /* [dtype][role] */
    for (int i = 0; i < n_specs; i++) {
        const kernel_spec *s = &specs[i];
        if (s->role == ROLE_ROWOPS) continue;
        int tcgen05 = s->tile.loop == MAINLOOP_TCGEN05;
        CHECKF(tcgen05 == (s->dtype != FLCE_DTYPE_F32), "dtype %d role %d: loop %s", (int)s->dtype, (int)s->role,
               spec_mainloop_name(s->tile.loop));
        if (tcgen05) tc[s->dtype][s->role]++;
    }
    for (int dt = FLCE_DTYPE_F16; dt <= FLCE_DTYPE_BF16; dt++)
        CHECKF(tc[dt][ROLE_LOGITS] >= 2 && tc[dt][ROLE_DH] >= 1 && tc[dt][ROLE_DW] >= 1,
               "dtype %d: %d logits, %d dh, %d dw tcgen05 specs", dt, tc[dt][ROLE_LOGITS], tc[dt][ROLE_DH],
               tc[dt][ROLE_DW]);
    compile_all();
    CHECKF(failures == 0, "%d of %d specs failed", failures, n_specs);
    /* never chosen on other arches, enabled or not */
    int sms[] = {80, 86, 89, 90, 120};
    for (size_t a = 0; a < sizeof sms / sizeof sms[0]; a++) {
        n_specs = failures = 0;
        add_arch(sms[a]);
        CHECK(failures == 0);
        for (int i = 0; i < n_specs; i++) CHECKF(specs[i].tile.loop != MAINLOOP_TCGEN05, "sm_%d chose tcgen05", sms[a]);
    }
    config_set(CONFIG_ENABLE_SM100, NULL);
    n_specs = failures = 0;
    add_arch(100);
    for (int i = 0; i < n_specs; i++) CHECKF(specs[i].tile.loop != MAINLOOP_TCGEN05, "sm_100 chose tcgen05 without FLCE_ENABLE_SM100");
}

static void broken_source_reports_the_nvrtc_log(void)
{
    void *cubin = NULL;
    size_t len = 0;
    const char *src = "extern \"C\" __global__ void k(int *p) { *p = undeclared_name; }\n";
    CHECK(nvrtc_compile(src, "broken", 90, &cubin, &len) == FLCE_ERR_COMPILE);
    CHECK(cubin == NULL && len == 0);
    CHECKF(strstr(flce_last_error(), "undeclared_name") && strstr(flce_last_error(), "sm_90a"),
           "message: %s", flce_last_error());
}

int main(void)
{
    RUN(templates_read_the_arch_once);
    RUN(broken_source_reports_the_nvrtc_log);
    RUN(every_dispatchable_spec_compiles_for_sm_80);
    RUN(every_dispatchable_spec_compiles_for_sm_90a);
    RUN(every_dispatchable_spec_compiles_for_sm_100a);
    RUN(tcgen05_specs_compile_for_sm_100a_when_enabled);
    RUN(representative_specs_compile_for_sm_86_87_89_120);
    RUN(portable_tile_shapes_compile);
    printf("%d compiled, %d skipped as the same source as one compiled (FLCE_TEST_COMPILE_EVERY_ARCH=1: all)\n",
           n_compiled, n_skipped);
    FINISH();
}
