/*
 * tune_run.c — the tuner (tune_run.h): the candidate lists, the checked and timed search, the
 * store, shared by `flce tune` (tools/cmd_tune.c) and FLCE_TUNE=1 (tune_first_use, at the end).
 *
 * FLCE_TUNE=1: the library tunes a problem class on its first call (api.c calls tune_first_use
 * before planning). It times only the logits tile, with forward passes over the caller's own
 * inputs (hidden, weight, labels: read, never written) into scratch outputs of its own, and
 * stores the winner with the built-in dH and dW tiles. It synchronizes the host (once per class
 * and process), so it never runs while the stream is being captured into a CUDA graph, nor for
 * tensor parallelism (ranks would tune apart), and it skips tiles that would need more workspace
 * than the caller passed. Every step is logged at info; a failure is a warning and the call goes
 * on with the default tiles.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "fault.h"
#include "launch.h"
#include "log.h"
#include "tune_run.h"

/* flce_tensors_init's result, without calling up into the public API (api.c calls this file). */
static void tensors_empty(flce_tensors *t)
{
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
}

/* ---- candidates ---------------------------------------------------------------------------- */

flce_status tune_cands_make(const flce_problem *p, int sm, int cap, tune_cands *c)
{
    /* The kernels of the timed calls: loss and gradients, no entropy or argmax outputs (a plan
     * without tensors would assume every output and time heavier logits epilogues than the calls
     * the table's winner is used for, and leave their kernels uncompiled). */
    flce_tensors none;
    tensors_empty(&none);
    flce_problem pg = *p;
    if (pg.strategy == FLCE_STRATEGY_FORWARD) pg.strategy = FLCE_STRATEGY_AUTO; /* a forward's class */
    plan pl;
    TRY(plan_make(&pg, FLCE_OP_LOSS_AND_GRAD, sm, 132, &none, &pl));
    memset(c, 0, sizeof *c);
    c->base[0] = pl.logits, c->base[1] = pl.dh, c->base[2] = pl.dw;
    c->fused_dz = pl.fused_dz, c->logits_dz = pl.logits_dz;
    if (cap > TUNE_MAX_CAND) cap = TUNE_MAX_CAND;
    for (int r = 0; r < TUNE_ROLES; r++)
        c->n[r] = tune_candidates(sm, p->dtype, c->base[r].role, p->hidden, p->vocab_shard, c->tile[r], cap);
    return FLCE_OK;
}

flce_status tune_first_use_cands(const flce_problem *p, int sm, tune_cands *c)
{
    return tune_cands_make(p, sm, TUNE_FIRST_USE_CAND, c);
}

double tune_grad_tolerance(flce_dtype t)
{
    /* only the fp32 summation order changes between tilings, so 16-bit outputs move by about one
     * rounding of the dtype on some elements */
    return t == FLCE_DTYPE_BF16 ? 1e-2 : t == FLCE_DTYPE_F16 ? 2e-3 : 1e-4;
}

/* ---- checking a candidate's outputs ---------------------------------------------------------- */

static double from_dtype(flce_dtype t, const void *base, size_t i)
{
    if (t == FLCE_DTYPE_F32) return ((const float *)base)[i];
    uint16_t h = ((const uint16_t *)base)[i];
    if (t == FLCE_DTYPE_BF16) {
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

/* ‖a − b‖ / ‖b‖ over n elements of dtype t. */
static double rel_l2(flce_dtype t, const void *a, const void *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double x = from_dtype(t, a, i), y = from_dtype(t, b, i);
        num += (x - y) * (x - y), den += y * y;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Host copies of one candidate's outputs. */
typedef struct outputs {
    float loss, *lse;
    void *dh, *dw;
} outputs;

typedef struct session {
    const tune_bench *b;
    size_t es, nh, nw; /* element size; elements of dH and dW */
    int check_loss;
    outputs ref, cur;  /* the first candidate's outputs, and the current one's */
    CUevent start, stop;
} session;

static flce_status session_open(session *s, const tune_bench *b)
{
    memset(s, 0, sizeof *s);
    s->b = b;
    const flce_problem *p = &b->p;
    s->es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    s->nh = b->t.grad_hidden ? (size_t)p->tokens * (size_t)p->hidden : 0;
    s->nw = b->t.grad_weight ? (size_t)p->vocab_shard * (size_t)p->hidden : 0;
    s->check_loss = b->t.loss && p->reduction != FLCE_REDUCTION_NONE;
    outputs *o[2] = {&s->ref, &s->cur};
    for (int i = 0; i < 2; i++) {
        o[i]->lse = malloc((size_t)p->tokens * 4);
        o[i]->dh = s->nh ? malloc(s->nh * s->es) : NULL;
        o[i]->dw = s->nw ? malloc(s->nw * s->es) : NULL;
        if (!o[i]->lse || (s->nh && !o[i]->dh) || (s->nw && !o[i]->dw))
            return err_set(FLCE_ERR_OUT_OF_MEMORY, "the tuner's host copies of the outputs: out of host memory");
    }
    CUresult r = fault_fire(FAULT_DEVICE_RESOURCE) ? CUDA_ERROR_OUT_OF_MEMORY : drv.EventCreate(&s->start, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuEventCreate (tuner)");
    r = drv.EventCreate(&s->stop, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) return drv_error(r, "cuEventCreate (tuner)");
    return FLCE_OK;
}

static void session_close(session *s)
{
    outputs *o[2] = {&s->ref, &s->cur};
    for (int i = 0; i < 2; i++) free(o[i]->lse), free(o[i]->dh), free(o[i]->dw);
    if (s->start) drv_release(drv.EventDestroy(s->start), "cuEventDestroy (tuner)");
    if (s->stop) drv_release(drv.EventDestroy(s->stop), "cuEventDestroy (tuner)");
}

/* One call, the host waiting for it: the device's error flag raised by it is its failure. */
static flce_status call_and_wait(const tune_bench *b)
{
    TRY(launch_call(b->ctx, &b->p, b->op, &b->t, b->stream, PART_ALL, 0));
    pthread_mutex_lock(&b->ctx->lock);
    CUresult r = drv.StreamSynchronize(b->stream);
    flce_status st = r == CUDA_SUCCESS ? ctx_take_flag(b->ctx) : drv_error(r, "cuStreamSynchronize (tuner)");
    pthread_mutex_unlock(&b->ctx->lock);
    return st;
}

static flce_status download(const session *s, outputs *o)
{
    const flce_tensors *t = &s->b->t;
    CUresult r = CUDA_SUCCESS;
    if (s->check_loss) r = drv.MemcpyDtoH(&o->loss, (CUdeviceptr)(uintptr_t)t->loss, 4);
    if (r == CUDA_SUCCESS)
        r = drv.MemcpyDtoH(o->lse, (CUdeviceptr)(uintptr_t)t->lse, (size_t)s->b->p.tokens * 4);
    if (r == CUDA_SUCCESS && s->nh) r = drv.MemcpyDtoH(o->dh, (CUdeviceptr)(uintptr_t)t->grad_hidden, s->nh * s->es);
    if (r == CUDA_SUCCESS && s->nw) r = drv.MemcpyDtoH(o->dw, (CUdeviceptr)(uintptr_t)t->grad_weight, s->nw * s->es);
    return r == CUDA_SUCCESS ? FLCE_OK : drv_error(r, "cuMemcpyDtoH (the tuner's check of the outputs)");
}

/* Whether the current outputs agree with the reference; *why says by how much either way. */
static int outputs_agree(const session *s, char *why, size_t cap)
{
    const outputs *a = &s->cur, *ref = &s->ref;
    flce_dtype dt = s->b->p.dtype;
    double e_loss = s->check_loss ? fabs((double)a->loss - ref->loss) / fmax(fabs((double)ref->loss), 1e-30) : 0;
    double e_lse = rel_l2(FLCE_DTYPE_F32, a->lse, ref->lse, (size_t)s->b->p.tokens);
    double e_dh = s->nh ? rel_l2(dt, a->dh, ref->dh, s->nh) : 0;
    double e_dw = s->nw ? rel_l2(dt, a->dw, ref->dw, s->nw) : 0;
    double tol = tune_grad_tolerance(dt);
    snprintf(why, cap,
             "relative L2 vs the first candidate: loss %.2e lse %.2e dH %.2e dW %.2e (tolerance %.0e, %.0e for fp32 outputs)",
             e_loss, e_lse, e_dh, e_dw, tol, 1e-4);
    return (!s->check_loss || isfinite(a->loss)) && e_loss <= 1e-4 && e_lse <= 1e-4 && e_dh <= tol && e_dw <= tol;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* `runs` calls, each between two events on the stream: the median ms. */
static flce_status time_runs(const session *s, double *median)
{
    const tune_bench *b = s->b;
    double ms[32];
    int runs = b->runs < 1 ? 1 : b->runs > 32 ? 32 : b->runs;
    for (int i = 0; i < runs; i++) {
        float one = 0;
        CUresult r = drv.EventRecord(s->start, b->stream);
        if (r != CUDA_SUCCESS) return drv_error(r, "cuEventRecord (tuner)");
        TRY(launch_call(b->ctx, &b->p, b->op, &b->t, b->stream, PART_ALL, 0));
        r = drv.EventRecord(s->stop, b->stream);
        if (r != CUDA_SUCCESS) return drv_error(r, "cuEventRecord (tuner)");
        r = drv.EventSynchronize(s->stop);
        if (r != CUDA_SUCCESS) return drv_error(r, "cuEventSynchronize (tuner)");
        r = drv.EventElapsedTime(&one, s->start, s->stop);
        if (r != CUDA_SUCCESS) return drv_error(r, "cuEventElapsedTime (tuner)");
        ms[i] = one;
    }
    qsort(ms, (size_t)runs, sizeof ms[0], cmp_double);
    *median = ms[runs / 2];
    return FLCE_OK;
}

/* One candidate: a first call (module load) and the check (the reference's outputs are kept
 * instead), then the timed calls. The median ms, or < 0 with why saying what went wrong. */
static double try_candidate(session *s, const spec_tile tiles[TUNE_ROLES], int is_reference, char *why,
                            size_t cap)
{
    const tune_bench *b = s->b;
    double ms = -1;
    if (b->skip && b->skip(b->arg, tiles, why, cap)) return -1;
    tune_force_tiles(tiles);
    char agree[512];
    if (call_and_wait(b) != FLCE_OK || download(s, is_reference ? &s->ref : &s->cur) != FLCE_OK)
        snprintf(why, cap, "failed: %s", err_message());
    else if (!is_reference && !outputs_agree(s, agree, sizeof agree))
        snprintf(why, cap, "rejected, its results disagree: %s", agree);
    else if (time_runs(s, &ms) != FLCE_OK)
        snprintf(why, cap, "failed: %s", err_message()), ms = -1;
    tune_force_tiles(NULL);
    return ms;
}

static flce_status search(session *s, const tune_cands *c, spec_tile best[TUNE_ROLES], double *best_ms,
                          double *builtin_ms)
{
    const tune_bench *b = s->b;
    int roles = b->roles < 1 ? 1 : b->roles > TUNE_ROLES ? TUNE_ROLES : b->roles;
    for (int r = 0; r < TUNE_ROLES; r++) best[r] = c->tile[r][0];
    *best_ms = *builtin_ms = -1;
    for (int r = 0; r < roles; r++)
        for (int k = 0; k < c->n[r]; k++) {
            spec_tile tiles[TUNE_ROLES];
            char why[1024] = "";
            memcpy(tiles, best, sizeof tiles);
            tiles[r] = c->tile[r][k];
            int is_ref = r == 0 && k == 0;
            /* later roles' first candidate is the current best again: its time is known */
            double ms = r > 0 && k == 0 ? *best_ms : try_candidate(s, tiles, is_ref, why, sizeof why);
            if (b->report) b->report(b->arg, r, &tiles[r], ms, why);
            if (is_ref && ms <= 0)
                return err_set(FLCE_ERR_INTERNAL, "the built-in tiles themselves fail; nothing to compare with");
            if (is_ref) *builtin_ms = ms;
            if (ms > 0 && (*best_ms < 0 || ms < *best_ms)) *best_ms = ms, best[r] = tiles[r];
        }
    return FLCE_OK;
}

flce_status tune_search(const tune_bench *b, const tune_cands *c, spec_tile best[TUNE_ROLES], double *best_ms,
                        double *builtin_ms)
{
    if (!b->t.lse) return err_set(FLCE_ERR_INTERNAL, "tune_search: the timed calls must write lse");
    CUcontext prev = NULL;
    TRY(ctx_enter(b->ctx, &prev));
    session s;
    flce_status st = session_open(&s, b);
    if (st == FLCE_OK) st = search(&s, c, best, best_ms, builtin_ms);
    session_close(&s);
    ctx_leave(prev);
    return st;
}

flce_status tune_store_winner(const flce_problem *p, const char *device, int sm, const spec_tile best[TUNE_ROLES],
                              double ms, tune_entry *e, char *dir, size_t cap)
{
    memset(e, 0, sizeof *e);
    tune_key_make(p, p->tokens, device, sm, &e->key);
    memcpy(e->tile, best, sizeof e->tile);
    e->ms = ms;
    TRY(cache_dir(dir, cap));
    TRY(tune_table_store(dir, e));
    tune_forget();
    return FLCE_OK;
}

/* ---- FLCE_TUNE=1 --------------------------------------------------------------------------- */

#define TUNE_RUN_TRIED 64

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

/* The caller's call, for the workspace check of each candidate. */
typedef struct first_use {
    flce_context *ctx;
    const flce_problem *p;
    flce_op op;
    const flce_tensors *t;
} first_use;

/* Skips tiles whose plan of the caller's call needs more than the workspace it passed (none
 * passed: the context grows its own). */
static int first_use_skip(void *arg, const spec_tile tiles[TUNE_ROLES], char *why, size_t cap)
{
    const first_use *f = arg;
    if (!f->t->workspace) return 0;
    plan pl;
    tune_force_tiles(tiles);
    flce_status st =
        plan_make_dev(f->p, f->op, f->ctx->name, f->ctx->sm, f->ctx->num_sms, f->ctx->mem_bytes, f->t, &pl);
    tune_force_tiles(NULL);
    if (st == FLCE_OK && pl.workspace_bytes <= f->t->workspace_bytes) return 0;
    snprintf(why, cap, "skipped: needs more workspace than passed");
    return 1;
}

static void first_use_report(void *arg, int role, const spec_tile *tile, double ms, const char *why)
{
    (void)arg, (void)role;
    char text[48];
    tune_tile_text(tile, text, sizeof text);
    if (!strncmp(why, "skipped", 7)) {
        log_msg(LOG_INFO, "FLCE_TUNE: %s needs more workspace than passed; skipped", text);
        return;
    }
    log_msg(LOG_INFO, "FLCE_TUNE: logits %s: %s", text, ms > 0 ? "timed" : "failed");
    if (ms > 0) log_msg(LOG_INFO, "FLCE_TUNE:   %.3f ms per forward", ms);
    else if (!strncmp(why, "rejected", 8)) log_msg(LOG_WARN, "FLCE_TUNE: a logits candidate %s; skipped", why);
}

static void tune_class(tune_bench *b, first_use *f, const tune_key *k)
{
    tune_cands c;
    spec_tile best[TUNE_ROLES];
    double best_ms = -1, builtin_ms = -1;
    if (tune_first_use_cands(f->p, b->ctx->sm, &c) != FLCE_OK) {
        log_msg(LOG_WARN, "FLCE_TUNE: no candidates (%s); default tiles", err_message());
        return;
    }
    log_msg(LOG_INFO, "FLCE_TUNE: tuning %s sm_%d D=%lld V=%lld N~%lld: %d logits candidates", k->device,
            k->sm, (long long)k->hidden, (long long)k->vocab, (long long)k->bucket, c.n[0]);
    if (tune_search(b, &c, best, &best_ms, &builtin_ms) != FLCE_OK || best_ms <= 0) {
        log_msg(LOG_WARN, "FLCE_TUNE: no candidate could be timed (%s); default tiles", err_message());
        return;
    }
    tune_entry e;
    char dir[CACHE_PATH_MAX];
    if (tune_store_winner(f->p, b->ctx->name, b->ctx->sm, best, best_ms, &e, dir, sizeof dir) != FLCE_OK)
        log_msg(LOG_WARN, "FLCE_TUNE: winner not stored: %s", err_message());
}

/* Scratch outputs of the timed forwards: lse, and the loss (per token for reduction none). */
static flce_status first_use_outputs(flce_context *ctx, int64_t tokens, CUdeviceptr *lse, CUdeviceptr *loss)
{
    CUcontext prev = NULL;
    TRY(ctx_enter(ctx, &prev));
    CUresult r = fault_fire(FAULT_DEVICE_RESOURCE) ? CUDA_ERROR_OUT_OF_MEMORY : drv.MemAlloc(lse, (size_t)tokens * 4);
    if (r == CUDA_SUCCESS) r = drv.MemAlloc(loss, (size_t)tokens * 4 + 16);
    ctx_leave(prev);
    return r == CUDA_SUCCESS ? FLCE_OK : drv_error(r, "cuMemAlloc (FLCE_TUNE's scratch outputs)");
}

static void first_use_free(flce_context *ctx, CUdeviceptr lse, CUdeviceptr loss)
{
    CUcontext prev = NULL;
    if (ctx_enter(ctx, &prev) != FLCE_OK) return;
    if (lse) drv_release(drv.MemFree(lse), "cuMemFree (FLCE_TUNE's lse)");
    if (loss) drv_release(drv.MemFree(loss), "cuMemFree (FLCE_TUNE's loss)");
    ctx_leave(prev);
}

flce_status tune_first_use(flce_context *ctx, const flce_problem *p, flce_op op, const flce_tensors *t,
                           void *stream)
{
    if (!tune_on_first_use() || p->tp_size > 1) return FLCE_OK;
    tune_key k;
    tune_key_make(p, p->tokens, ctx->name, ctx->sm, &k);
    if (tune_have(&k) || !first_try(&k)) return FLCE_OK;
    int cap = 0;
    if (capturing(ctx, stream, &cap) != FLCE_OK) {
        log_msg(LOG_WARN, "FLCE_TUNE: cannot tell whether the stream is captured (%s); not tuning",
                err_message());
        err_clear();
        return FLCE_OK;
    }
    if (cap) {
        log_msg(LOG_INFO, "FLCE_TUNE: stream is being captured; not tuning (default tiles), run once outside capture");
        return FLCE_OK;
    }
    CUdeviceptr lse = 0, loss = 0;
    if (first_use_outputs(ctx, p->tokens, &lse, &loss) != FLCE_OK) {
        log_msg(LOG_WARN, "FLCE_TUNE: no memory for the tuning outputs (%s); default tiles", err_message());
    } else {
        first_use f = {ctx, p, op, t};
        tune_bench b;
        memset(&b, 0, sizeof b);
        b.ctx = ctx, b.p = *p, b.op = FLCE_OP_FORWARD, b.stream = (CUstream)stream;
        b.p.strategy = FLCE_STRATEGY_AUTO; /* a forward refuses CHUNKED and RECOMPUTE */
        b.runs = TUNE_FIRST_USE_RUNS, b.roles = 1;
        b.report = first_use_report, b.skip = first_use_skip, b.arg = &f;
        tensors_empty(&b.t);
        b.t.hidden = t->hidden, b.t.weight = t->weight, b.t.labels = t->labels;
        b.t.bias = t->bias, b.t.class_weights = t->class_weights;
        b.t.lse = (float *)(uintptr_t)lse, b.t.loss = (float *)(uintptr_t)loss;
        tune_class(&b, &f, &k);
    }
    first_use_free(ctx, lse, loss);
    err_clear();
    return FLCE_OK;
}
