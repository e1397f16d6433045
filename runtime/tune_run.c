/*
 * tune_run.c — FLCE_TUNE=1: the library tunes a problem class on its first call (api.c calls
 * tune_first_use before planning). A simplified version of `flce tune`: it times only the logits
 * tile, with forward passes over the caller's own inputs (hidden, weight, labels: read, never
 * written) into scratch outputs of its own, checks each candidate's lse against the first's,
 * and stores the winner with the built-in dH and dW tiles. It synchronizes the host (once per
 * class and process), so it never runs while the stream is being captured into a CUDA graph,
 * nor for tensor parallelism (ranks would tune apart), and it skips tiles that would need more
 * workspace than the caller passed. Every step is logged at info; a failure is a warning and the
 * call goes on with the default tiles.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "context.h"
#include "log.h"
#include "tune_run.h"

#define TUNE_RUN_CANDIDATES 16
#define TUNE_RUN_TIMED 3
#define TUNE_RUN_TRIED 64

static _Thread_local int tune_running; /* the forward calls below come back through api.c */
static pthread_mutex_t tried_lock = PTHREAD_MUTEX_INITIALIZER;
static tune_key tried[TUNE_RUN_TRIED]; /* classes this process tuned or gave up on: once each */
static int n_tried;

/* 1 the first time this process sees class k here. */
static int first_try(const tune_key *k)
{
    int fresh = 1;
    pthread_mutex_lock(&tried_lock);
    for (int i = 0; i < n_tried && fresh; i++) fresh = !tune_key_equal(&tried[i], k);
    if (fresh && n_tried < TUNE_RUN_TRIED) tried[n_tried++] = *k;
    else if (fresh) fresh = 0; /* a process with this many classes tunes them with `flce tune` */
    pthread_mutex_unlock(&tried_lock);
    return fresh;
}

static flce_status capturing(flce_context *ctx, void *stream, int *yes)
{
    CUcontext prev = NULL;
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    TRY(ctx_enter(ctx, &prev));
    CUresult r = drv.StreamIsCapturing((CUstream)stream, &cs);
    ctx_leave(prev);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuStreamIsCapturing");
    *yes = cs != CU_STREAM_CAPTURE_STATUS_NONE;
    return FLCE_OK;
}

typedef struct run_state {
    flce_context *ctx;
    const flce_problem *p;    /* the forward problem timed (strategy AUTO) */
    const flce_problem *orig; /* the caller's, for the workspace check */
    flce_tensors tf;
    CUstream stream;
    CUevent start, stop;
    float *ref, *lse; /* host copies of the first candidate's lse and the current one's */
    CUdeviceptr d_lse;
} run_state;

/* One forward with tiles forced, then TUNE_RUN_TIMED timed ones: ms per call, < 0 on failure. */
static double time_forward(run_state *s, const spec_tile tiles[TUNE_ROLES], int first)
{
    double ms = -1;
    float total = 0;
    tune_force_tiles(tiles);
    if (flce_forward(s->ctx, s->p, &s->tf, s->stream) != FLCE_OK) goto out;
    CUcontext prev = NULL;
    if (ctx_enter(s->ctx, &prev) != FLCE_OK) goto out;
    CUresult r = drv.StreamSynchronize(s->stream);
    if (r == CUDA_SUCCESS) r = drv.MemcpyDtoH(first ? s->ref : s->lse, s->d_lse, (size_t)s->p->tokens * 4);
    ctx_leave(prev);
    if (r != CUDA_SUCCESS) goto out;
    if (!first) { /* relative L2 of lse against the first candidate's (fp32 both) */
        double num = 0, den = 0;
        for (int64_t i = 0; i < s->p->tokens; i++) {
            double d = (double)s->lse[i] - s->ref[i];
            num += d * d, den += (double)s->ref[i] * s->ref[i];
        }
        if (!(num <= 1e-8 * (den > 0 ? den : 1))) {
            log_msg(LOG_WARN, "FLCE_TUNE: a logits candidate disagrees with the default (rel L2 %.2e); skipped",
                    sqrt(num / (den > 0 ? den : 1)));
            goto out;
        }
    }
    if (drv.EventRecord(s->start, s->stream) != CUDA_SUCCESS) goto out;
    for (int i = 0; i < TUNE_RUN_TIMED; i++)
        if (flce_forward(s->ctx, s->p, &s->tf, s->stream) != FLCE_OK) goto out;
    if (drv.EventRecord(s->stop, s->stream) != CUDA_SUCCESS || drv.EventSynchronize(s->stop) != CUDA_SUCCESS ||
        drv.EventElapsedTime(&total, s->start, s->stop) != CUDA_SUCCESS)
        goto out;
    ms = total / TUNE_RUN_TIMED;
out:
    tune_force_tiles(NULL);
    return ms;
}

/* Whether tiles fit the workspace the caller passed (none passed: the context grows its own). */
static int fits_workspace(const flce_problem *p, flce_op op, flce_context *ctx, const flce_tensors *t,
                          const spec_tile tiles[TUNE_ROLES])
{
    if (!t->workspace) return 1;
    plan pl;
    tune_force_tiles(tiles);
    flce_status st = plan_make_on(p, op, ctx->name, ctx->sm, ctx->num_sms, t, &pl);
    tune_force_tiles(NULL);
    return st == FLCE_OK && pl.workspace_bytes <= t->workspace_bytes;
}

static void tune_class(run_state *s, flce_op op, const flce_tensors *t, const tune_key *k)
{
    spec_tile cand[TUNE_RUN_CANDIDATES], tiles[TUNE_ROLES], best[TUNE_ROLES];
    int n = tune_candidates(s->ctx->sm, s->p->dtype, ROLE_LOGITS, s->p->hidden, s->p->vocab_shard, cand,
                            TUNE_RUN_CANDIDATES);
    best[0] = cand[0];
    best[1] = spec_default_tile(s->ctx->sm, s->p->dtype, ROLE_DH);
    best[2] = spec_default_tile(s->ctx->sm, s->p->dtype, ROLE_DW);
    double best_ms = -1;
    log_msg(LOG_INFO, "FLCE_TUNE: tuning %s sm_%d D=%lld V=%lld N~%lld: %d logits candidates", k->device,
            k->sm, (long long)k->hidden, (long long)k->vocab, (long long)k->bucket, n);
    for (int i = 0; i < n; i++) {
        memcpy(tiles, best, sizeof tiles);
        tiles[0] = cand[i];
        char text[48];
        tune_tile_text(&cand[i], text, sizeof text);
        if (!fits_workspace(s->orig, op, s->ctx, t, tiles)) {
            log_msg(LOG_INFO, "FLCE_TUNE: %s needs more workspace than passed; skipped", text);
            continue;
        }
        double ms = time_forward(s, tiles, i == 0);
        log_msg(LOG_INFO, "FLCE_TUNE: logits %s: %s", text, ms > 0 ? "timed" : "failed");
        if (ms > 0) log_msg(LOG_INFO, "FLCE_TUNE:   %.3f ms per forward", ms);
        if (i == 0 && ms <= 0) break; /* nothing to compare with */
        if (ms > 0 && (best_ms < 0 || ms < best_ms)) best_ms = ms, best[0] = cand[i];
    }
    err_clear();
    if (best_ms <= 0) {
        log_msg(LOG_WARN, "FLCE_TUNE: no candidate could be timed; default tiles");
        return;
    }
    tune_entry e;
    char dir[CACHE_PATH_MAX];
    memset(&e, 0, sizeof e);
    e.key = *k;
    memcpy(e.tile, best, sizeof e.tile);
    e.ms = best_ms;
    if (cache_dir(dir, sizeof dir) != FLCE_OK || tune_table_store(dir, &e) != FLCE_OK)
        log_msg(LOG_WARN, "FLCE_TUNE: winner not stored: %s", flce_last_error());
    err_clear();
    tune_forget();
}

flce_status tune_first_use(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                           void *stream)
{
    if (tune_running || !tune_on_first_use() || p->tp_size > 1) return FLCE_OK;
    tune_key k;
    tune_key_make(p, p->tokens, ctx->name, ctx->sm, &k);
    if (tune_have(&k) || !first_try(&k)) return FLCE_OK;
    int cap = 0;
    if (capturing(ctx, stream, &cap) != FLCE_OK) {
        log_msg(LOG_WARN, "FLCE_TUNE: cannot tell whether the stream is captured (%s); not tuning",
                flce_last_error());
        err_clear();
        return FLCE_OK;
    }
    if (cap) {
        log_msg(LOG_INFO, "FLCE_TUNE: stream is being captured; not tuning (default tiles), run once outside capture");
        return FLCE_OK;
    }
    run_state s;
    memset(&s, 0, sizeof s);
    flce_problem pf = *p;
    pf.strategy = FLCE_STRATEGY_AUTO; /* flce_forward refuses CHUNKED and RECOMPUTE */
    s.ctx = ctx, s.p = &pf, s.orig = p, s.stream = (CUstream)stream;
    s.ref = malloc((size_t)p->tokens * 4), s.lse = malloc((size_t)p->tokens * 4);
    CUcontext prev = NULL;
    CUdeviceptr loss = 0;
    flce_status st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        int ok = s.ref && s.lse && drv.MemAlloc(&s.d_lse, (size_t)p->tokens * 4) == CUDA_SUCCESS &&
                 drv.MemAlloc(&loss, (size_t)p->tokens * 4 + 16) == CUDA_SUCCESS &&
                 drv.EventCreate(&s.start, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
                 drv.EventCreate(&s.stop, CU_EVENT_DEFAULT) == CUDA_SUCCESS;
        ctx_leave(prev);
        if (ok) {
            flce_tensors_init(&s.tf);
            s.tf.hidden = t->hidden, s.tf.weight = t->weight, s.tf.labels = t->labels;
            s.tf.bias = t->bias, s.tf.class_weights = t->class_weights;
            s.tf.lse = (float *)(uintptr_t)s.d_lse, s.tf.loss = (float *)(uintptr_t)loss;
            tune_running = 1;
            tune_class(&s, op, t, &k);
            tune_running = 0;
        } else {
            log_msg(LOG_WARN, "FLCE_TUNE: no memory for the tuning outputs; default tiles");
        }
        if (ctx_enter(ctx, &prev) == FLCE_OK) {
            if (s.d_lse) drv.MemFree(s.d_lse);
            if (loss) drv.MemFree(loss);
            if (s.start) drv.EventDestroy(s.start);
            if (s.stop) drv.EventDestroy(s.stop);
            ctx_leave(prev);
        }
    }
    free(s.ref), free(s.lse);
    err_clear();
    return FLCE_OK;
}
