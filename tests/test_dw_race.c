/* test_dw_race.c — issue 43 item 1: dW's dynamic tile order gives the same bits as its static
 * order, call after call. Under FLCE_DEV grad_streams (default on; plan.h concurrent_grads, dw_dynamic)
 * dW runs beside dH and its CTAs take their tiles from a counter in the workspace; each CTA's
 * producer thread tells its consumer threads the tile's number through a shared-memory slot
 * (templates/gemm_wgmma_tma.cu, tile_slot; until issue 43 a ring of STAGES + 1 slots). A slot
 * rewritten before every consumer thread had read it would make a CTA compute one tile twice and
 * another never: a tile of dW left as the poison (NaN) or holding another tile's values, on some
 * calls only. compute-sanitizer's racecheck reported such a hazard at the report's 2304×512×33000
 * (issue 43); this is the test that a real race there would fail. At shapes whose default plan
 * takes that path on this device:
 *  - FLCE_TEST_REPS (default 64) calls of flce_loss_and_grad, grad_weight poisoned before each,
 *    each call's grad_weight free of poison and bitwise equal to the first's. Every other call runs
 *    beside a forward pass of another context on another stream, of a random size, enqueued just
 *    before or after it with a random host delay between (0-2 ms): dW's CTAs then find a different
 *    number of free SMs each time and take different tiles, some CTAs many more than others;
 *  - the same problem with FLCE_DEV=grad_streams=0 (dW alone, in the static order, the same kernel:
 *    checked on the plans), its strategy held to the one AUTO took: bitwise equal again.
 * The shapes: the report's 2304×512×33000 (dH split in 3, logits in clusters, persistent) and
 * 6144×1024×65536 (row-scaled compact logits, ~2048 dW tiles: some 15 slot rewrites per CTA).
 * A shape whose plan does not take the counter on this device (another SM count) is still
 * repeated and compared, and says so; the test fails when none does. Skipped (77) without a GPU,
 * and on a device or configuration without the wgmma TMA path (no tile counter there).
 * FLCE_PREFETCH and FLCE_TIERED are set to 0: no compile runs in the background, so that the
 * settings can change between the two orders (config_set), and every call runs the kernels
 * flce_prepare built. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "context.h"
#include "dev_switch.h"
#include "devmem.h"
#include "gpu_io.h"
#include "gpu_ready.h"
#include "host.h"
#include "plan.h"

static flce_context *ctx, *noise_ctx;
static void *main_stream, *noise_stream;
static host_rng rng;
static int reps = 64, exercised;

/* The interfering forward passes (noise_ctx, noise_stream): N of up to NOISE_N tokens. */
enum { NOISE_N = 8192, NOISE_D = 1024, NOISE_V = 32768 };
static struct {
    flce_problem p;
    flce_tensors t;
    void *h, *w, *labels, *loss, *lse, *ws;
} noise;

/* count values of sd·N(0, 1) in dtype dt on the device, made in steps (no fp64 copy of it all). */
static void *random_device(flce_dtype dt, int64_t count, double sd)
{
    enum { STEP = 1 << 20 };
    size_t es = host_dtype_size(dt);
    double *x = malloc(sizeof(double) * STEP);
    unsigned char *bits = malloc((size_t)count * es);
    void *dev = NULL;
    if (x && bits) {
        for (int64_t at = 0; at < count; at += STEP) {
            int64_t k = count - at < STEP ? count - at : STEP;
            for (int64_t i = 0; i < k; i++) x[i] = sd * host_rng_normal(&rng);
            host_to_dtype(dt, x, bits + (size_t)at * es, (size_t)k);
        }
        if (devmem_alloc(&dev, (size_t)count * es) != FLCE_OK || devmem_upload(dev, bits, (size_t)count * es) != FLCE_OK)
            dev = NULL;
    }
    free(x), free(bits);
    CHECKF(dev != NULL, "uploading %lld random values", (long long)count);
    return dev;
}

/* n int32 labels in [0, v), a few ignored (-100). */
static void *random_labels(int64_t n, int64_t v)
{
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    void *dev = NULL;
    for (int64_t i = 0; i < n; i++) y[i] = host_rng_uniform(&rng) < 0.03 ? -100 : (int32_t)host_rng_below(&rng, v);
    if (devmem_alloc(&dev, sizeof(int32_t) * (size_t)n) != FLCE_OK ||
        devmem_upload(dev, y, sizeof(int32_t) * (size_t)n) != FLCE_OK)
        dev = NULL;
    free(y);
    CHECK(dev != NULL);
    return dev;
}

/* Re-reads the settings with FLCE_DEV grad_streams on or off. */
static void grad_streams(int on)
{
    dev_switch_set("grad_streams", on ? "1" : "0");
}

/* The plan this context's call makes (launch.c launch_call). */
static flce_status plan_of(const flce_problem *p, const flce_tensors *t, plan *pl)
{
    return plan_make_dev(p, FLCE_OP_LOSS_AND_GRAD, ctx->name, ctx->sm, ctx->num_sms, ctx->mem_bytes, t, pl);
}

static int noise_setup(void)
{
    flce_problem_init(&noise.p);
    noise.p.tokens = NOISE_N, noise.p.hidden = NOISE_D, noise.p.vocab_shard = NOISE_V;
    noise.h = random_device(FLCE_DTYPE_BF16, (int64_t)NOISE_N * NOISE_D, 1.0);
    noise.w = random_device(FLCE_DTYPE_BF16, (int64_t)NOISE_V * NOISE_D, 2.0 / 32.0);
    noise.labels = random_labels(NOISE_N, NOISE_V);
    noise.loss = poisoned(4), noise.lse = poisoned(4 * NOISE_N);
    flce_tensors_init(&noise.t);
    noise.t.hidden = noise.h, noise.t.weight = noise.w, noise.t.labels = noise.labels;
    noise.t.loss = noise.loss, noise.t.lse = noise.lse;
    uint64_t bytes = 0;
    /* a workspace of the caller's: no context workspace, no device-wide sync between the streams */
    if (flce_workspace_size(noise_ctx, &noise.p, FLCE_OP_FORWARD, &bytes) != FLCE_OK ||
        devmem_alloc(&noise.ws, bytes ? bytes : 16) != FLCE_OK)
        return 0;
    noise.t.workspace = noise.ws, noise.t.workspace_bytes = bytes;
    for (int64_t n = 1024; n <= NOISE_N; n *= 2) { /* its kernels built before anything is timed */
        noise.p.tokens = n;
        if (flce_prepare(noise_ctx, &noise.p, FLCE_OP_FORWARD, &noise.t) != FLCE_OK) return 0;
    }
    return noise.h && noise.w && noise.labels && noise.loss && noise.lse;
}

/* A forward pass of 1024-8192 tokens on the other context's stream. */
static void noise_call(void)
{
    noise.p.tokens = (int64_t)1024 << host_rng_below(&rng, 4);
    CHECKF(flce_forward(noise_ctx, &noise.p, &noise.t, noise_stream) == FLCE_OK, "%s", flce_last_error());
}

static void noise_free(void)
{
    devmem_free(noise.h), devmem_free(noise.w), devmem_free(noise.labels);
    devmem_free(noise.loss), devmem_free(noise.lse), devmem_free(noise.ws);
}

/* bf16 values still all-ones (the poison, a NaN no gradient here has). */
static int64_t poisoned_count(const uint16_t *x, int64_t n)
{
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += x[i] == 0xffff;
    return k;
}

/* How got differs from want, an rows × cols matrix in tiles of bm × bn (dW's), on stderr. */
static void describe(const char *what, const uint16_t *want, const uint16_t *got, int64_t rows, int64_t cols, int bm,
                     int bn)
{
    int64_t elems = 0, tiles = 0, tn = (cols + bn - 1) / bn, tm = (rows + bm - 1) / bm, shown = 0;
    for (int64_t a = 0; a < tm; a++)
        for (int64_t b = 0; b < tn; b++) {
            int64_t here = 0;
            for (int64_t r = a * bm; r < rows && r < (a + 1) * bm; r++)
                for (int64_t c = b * bn; c < cols && c < (b + 1) * bn; c++) here += want[r * cols + c] != got[r * cols + c];
            elems += here, tiles += here > 0;
            if (here && shown++ < 5)
                fprintf(stderr, "     %s: tile (row block %lld, column block %lld, number %lld of the walk) differs in %lld values\n",
                        what, (long long)a, (long long)b, (long long)(a * tn + b), (long long)here);
        }
    fprintf(stderr, "     %s: %lld values in %lld of %lld tiles of %dx%d differ; %lld values are still the poison\n", what,
            (long long)elems, (long long)tiles, (long long)(tm * tn), bm, bn, (long long)poisoned_count(got, rows * cols));
}

typedef struct rcase {
    int64_t n, d, v;
} rcase;

/* REPS calls with the tile counter against the first, then 3 in the static order against it. */
static void repeat_and_compare(const rcase *c, const flce_problem *p, const flce_problem *p_static,
                               const flce_tensors *t, void *dw, const plan *on)
{
    const int64_t nw = c->v * c->d;
    const size_t dw_bytes = (size_t)nw * 2;
    uint16_t *first = malloc(dw_bytes), *got = malloc(dw_bytes);
    int differing = 0, with_poison = 0, failed_calls = 0;
    double t0 = host_now_s();
    for (int rep = 0; rep < reps; rep++) {
        CHECK(devmem_poison(dw, dw_bytes) == FLCE_OK);
        int noisy = rep % 2 == 1, before = (int)host_rng_below(&rng, 2);
        unsigned delay_us = (unsigned)host_rng_below(&rng, 2000);
        if (noisy && before) noise_call(), usleep(delay_us);
        flce_status st = flce_loss_and_grad(ctx, p, t, main_stream);
        if (noisy && !before) usleep(delay_us), noise_call();
        if (st == FLCE_OK) st = flce_check(ctx, main_stream);
        if (st != FLCE_OK) {
            if (failed_calls++ == 0) fprintf(stderr, "     call %d: %s\n", rep, flce_last_error());
            continue;
        }
        CHECK(devmem_stream_sync(noise_stream) == FLCE_OK);
        CHECK(devmem_download(rep == 0 ? first : got, dw, dw_bytes) == FLCE_OK);
        const uint16_t *snap = rep == 0 ? first : got;
        int64_t left = poisoned_count(snap, nw);
        if (left) {
            if (with_poison++ == 0) fprintf(stderr, "     call %d: %lld dW values never written\n", rep, (long long)left);
        }
        if (rep > 0 && memcmp(first, got, dw_bytes)) {
            if (differing++ == 0) {
                char what[64];
                snprintf(what, sizeof what, "call %d against call 0", rep);
                describe(what, first, got, c->v, c->d, on->dw.tile.bm, on->dw.tile.bn);
            }
        }
    }
    printf("     %d calls with the tile counter (every other one beside another context's forward) in %.1f s\n", reps,
           host_now_s() - t0);
    CHECKF(failed_calls == 0, "%d of %d calls failed", failed_calls, reps);
    CHECKF(with_poison == 0, "%d of %d calls left dW values unwritten", with_poison, reps);
    CHECKF(differing == 0, "%d of %d calls gave a dW that differs from the first call's", differing, reps - 1);

    /* The static order: dW alone, tile t at CTA t % grid. */
    grad_streams(0);
    CHECKF(flce_prepare(ctx, p_static, FLCE_OP_LOSS_AND_GRAD, t) == FLCE_OK, "%s", flce_last_error());
    int static_differing = 0;
    for (int rep = 0; rep < 3; rep++) {
        CHECK(devmem_poison(dw, dw_bytes) == FLCE_OK);
        flce_status st = flce_loss_and_grad(ctx, p_static, t, main_stream);
        if (st == FLCE_OK) st = flce_check(ctx, main_stream);
        CHECKF(st == FLCE_OK, "static order, call %d: %s", rep, flce_last_error());
        if (st != FLCE_OK) break;
        CHECK(devmem_download(got, dw, dw_bytes) == FLCE_OK);
        CHECKF(poisoned_count(got, nw) == 0, "static order, call %d: dW values unwritten", rep);
        if (memcmp(first, got, dw_bytes)) {
            if (static_differing++ == 0)
                describe("static order against the counter's call 0", first, got, c->v, c->d, on->dw.tile.bm, on->dw.tile.bn);
        }
    }
    grad_streams(1);
    CHECKF(static_differing == 0, "%d of 3 calls in the static order (grad_streams=0) differ from the tile counter's dW",
           static_differing);
    free(first), free(got);
}

/* One shape: REPS counter-fed calls against each other, then the static order against them. */
static void run_case(const rcase *c)
{
    const int64_t nw = c->v * c->d;
    const size_t dw_bytes = (size_t)nw * 2;
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = c->n, p.hidden = c->d, p.vocab_shard = c->v, p.dtype = FLCE_DTYPE_BF16;
    void *h = random_device(FLCE_DTYPE_BF16, c->n * c->d, 1.0);
    void *w = random_device(FLCE_DTYPE_BF16, nw, 2.0 / sqrt((double)c->d));
    void *labels = random_labels(c->n, c->v);
    void *loss = poisoned(4), *lse = poisoned(4 * (size_t)c->n);
    void *dh = poisoned((size_t)(c->n * c->d) * 2), *dw = poisoned(dw_bytes), *ws = NULL;
    /* the demo's outputs (the report's command): loss, lse, dH, dW */
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = h, t.weight = w, t.labels = labels, t.loss = loss, t.lse = lse, t.grad_hidden = dh, t.grad_weight = dw;

    plan on, off;
    grad_streams(1);
    CHECKF(plan_of(&p, &t, &on) == FLCE_OK, "%s", flce_last_error());
    flce_problem p_static = p; /* the strategy AUTO took, held with grad streams off */
    p_static.strategy = on.recompute ? FLCE_STRATEGY_RECOMPUTE : FLCE_STRATEGY_CHUNKED;
    grad_streams(0);
    CHECKF(plan_of(&p_static, &t, &off) == FLCE_OK, "%s", flce_last_error());
    grad_streams(1);
    const int taken = on.dw_dynamic && on.concurrent_grads;
    exercised += taken;
    printf("     %lldx%lldx%lld on %d SMs: %s%s, %lld token chunk(s), dH split %d, dW tile %dx%d: %s\n", (long long)c->n,
           (long long)c->d, (long long)c->v, ctx->num_sms, on.recompute ? "recompute" : "chunked",
           on.qrows ? " (row-scaled compact logits)" : on.compact ? " (compact logits)" : "", (long long)on.n_chunks,
           on.dh_splits, on.dw.tile.bm, on.dw.tile.bn,
           taken ? "dW beside dH, tiles from the counter" : "dW NOT from the counter on this device (not this test's path)");
    /* The two orders must run the same kernels on the same dZ, or their bits may differ anyway. */
    CHECK(!off.dw_dynamic && !off.concurrent_grads && off.recompute == on.recompute && off.qrows == on.qrows &&
          off.compact == on.compact && off.n_chunks == on.n_chunks && off.chunk_rows == on.chunk_rows);
    CHECKF(!memcmp(&on.dw, &off.dw, sizeof on.dw) && !memcmp(&on.logits, &off.logits, sizeof on.logits) &&
               !memcmp(&on.rowops, &off.rowops, sizeof on.rowops),
           "the plans with grad streams on and off differ in a kernel");
    uint64_t bytes = on.workspace_bytes > off.workspace_bytes ? on.workspace_bytes : off.workspace_bytes;
    CHECK(devmem_alloc(&ws, bytes) == FLCE_OK);
    t.workspace = ws, t.workspace_bytes = bytes;
    CHECKF(flce_prepare(ctx, &p, FLCE_OP_LOSS_AND_GRAD, &t) == FLCE_OK, "%s", flce_last_error());

    if (!check_case_failed) repeat_and_compare(c, &p, &p_static, &t, dw, &on);
    devmem_free(h), devmem_free(w), devmem_free(labels), devmem_free(loss), devmem_free(lse);
    devmem_free(dh), devmem_free(dw), devmem_free(ws);
}

/* The report's shape (issue 43): dH split in 3 over the vocab, logits in 2-CTA clusters and
 * persistent, dW's 516 tiles from the counter beside dH. */
static void report_shape_dw_is_bitwise_stable(void)
{
    const rcase c = {2304, 512, 33000};
    run_case(&c);
}

/* Row-scaled compact logits (a chunk of 4e8 logits), ~2048 dW tiles from the counter: some 15 per
 * CTA, so every CTA rewrites its tile slot many times. */
static void larger_row_scaled_dw_is_bitwise_stable(void)
{
    const rcase c = {6144, 1024, 65536};
    run_case(&c);
}

int main(void)
{
    int rc = 0;
    if (!gpu_ready(1, &rc)) return rc;
    /* before the settings are first read: nothing compiles in the background (see the top) */
    config_set(CONFIG_PREFETCH, "0");
    config_set(CONFIG_TIERED, "0");
    const char *r = getenv("FLCE_TEST_REPS");
    if (r && *r) reps = atoi(r) > 1 ? atoi(r) : 2;
    host_rng_seed(&rng, host_announced_seed());
    if (flce_context_create(0, &ctx) != FLCE_OK || flce_context_create(0, &noise_ctx) != FLCE_OK ||
        devmem_use(0) != FLCE_OK) {
        printf("FAIL: context: %s\n", flce_last_error());
        return 1;
    }
    if (ctx->sm < 90 || config_get()->portable || !config_get()->tiles.tma) {
        printf("skipped: no tile counter for dW here (sm_%d%s): it needs the wgmma TMA path\n", ctx->sm,
               config_get()->portable ? ", FLCE_PORTABLE=1" : !config_get()->tiles.tma ? ", FLCE_DEV=tma=0" : "");
        flce_context_destroy(noise_ctx), flce_context_destroy(ctx);
        return SKIP_EXIT;
    }
    if (devmem_stream_create(&main_stream) != FLCE_OK || devmem_stream_create(&noise_stream) != FLCE_OK ||
        !noise_setup()) {
        printf("FAIL: setup: %s\n", flce_last_error());
        return 1;
    }
    printf("%d calls per shape (FLCE_TEST_REPS)\n", reps);
    RUN(report_shape_dw_is_bitwise_stable);
    RUN(larger_row_scaled_dw_is_bitwise_stable);
    const char *filter = getenv("FLCE_TEST_FILTER");
    if (!(filter && *filter) && exercised == 0) {
        printf("FAIL no shape's plan took dW's tile counter on this device (%d SMs): pick shapes that do\n",
               ctx->num_sms);
        check_failed++;
    }
    devmem_sync();
    noise_free();
    devmem_stream_destroy(main_stream), devmem_stream_destroy(noise_stream);
    flce_context_destroy(noise_ctx), flce_context_destroy(ctx);
    FINISH();
}
