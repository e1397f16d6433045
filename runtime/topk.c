/* topk.c — the top-k log-probabilities call (flce_topk_logprobs): per token chunk the CE path's
 * logits kernel stores the chunk's logits at T in fp32 with its per-split statistics
 * (launch_store_logits), then flce_topk_row (templates/distill.cu, the distillation's module)
 * selects each row's k largest, forms those k logits again in fp64 from the inputs (and the lse
 * with them) and writes their ids and z/T − lse. */
#include "topk.h"

#include <string.h>

#include "config.h"
#include "context.h"
#include "driver.h"
#include "error.h"
#include "launch.h"
#include "log.h"

enum { TOPK_THREADS = 256, DK_TOPK = 3 }; /* emit.c distill_names */

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

flce_status topk_plan_make(const flce_topk_problem *p, const call_device *dev, topk_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    const uint64_t ld = (uint64_t)(p->vocab + 7) / 8 * 8, row = ld * 4;
    const uint64_t budget = p->memory_budget ? p->memory_budget : TOPK_DEFAULT_BUDGET;
    if (budget < row)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.memory_budget=%llu bytes: too small for one token's logits (%llu bytes at vocab=%lld)",
                       (unsigned long long)budget, (unsigned long long)row, (long long)p->vocab);
    flce_problem_init(&pl->ce);
    pl->ce.tokens = p->tokens, pl->ce.hidden = p->hidden, pl->ce.vocab_shard = p->vocab, pl->ce.dtype = p->dtype;
    pl->ce.label_bits = 32, pl->ce.reduction = FLCE_REDUCTION_NONE, pl->ce.strategy = FLCE_STRATEGY_CHUNKED;
    pl->ce.temperature = p->temperature; /* the logits pass stores and sums z/T */
    /* chunk rows: whole 128-row blocks where one fits (the CE plan's own rule, at 4 bytes a logit) */
    int64_t fit = (int64_t)(budget / row);
    if (fit >= 128) fit -= fit % 128;
    pl->chunk_rows = fit < p->tokens ? fit : p->tokens;
    pl->chunks = (p->tokens + pl->chunk_rows - 1) / pl->chunk_rows;
    pl->ce.memory_budget = (uint64_t)pl->chunk_rows * ld * 6; /* the CE plan's chunks alike (unused here) */
    flce_config cfg = *config_get();
    cfg.compact = 0, cfg.qrows = 0; /* plain fp32 logits */
    static char mark; /* a non-NULL address planning never dereferences: no per-token outputs */
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = t.weight = t.labels = &mark;
    t.loss = (float *)&mark;
    TRY(plan_make_cfg(&pl->ce, FLCE_OP_LOSS_AND_GRAD, dev->name, dev->sm, dev->num_sms, 0, &cfg, &t, &pl->model));
    if (pl->model.recompute || pl->model.compact || pl->model.logits.opts & ~(unsigned)SPEC_OPT_BIAS)
        return err_set(FLCE_ERR_INTERNAL, "top-k: the CE plan is not a plain chunked one (a planning bug)");
    pl->ld = (int64_t)ld;
    const uint64_t rows = (uint64_t)pl->chunk_rows, parts = rows * (uint64_t)pl->model.splits * 4;
    uint64_t cur = 0;
    pl->z_offset = cur, cur = align256(cur + rows * ld * 4);
    pl->part_m_offset = cur, cur = align256(cur + parts);
    pl->part_s_offset = cur, cur = align256(cur + parts);
    pl->target_offset = cur, cur = align256(cur + rows * 4);
    pl->labels_offset = cur, cur = align256(cur + (uint64_t)p->tokens * 4);
    pl->workspace_bytes = cur;
    return FLCE_OK;
}

kernel_spec topk_module_spec(int sm, const flce_topk_problem *p)
{
    kernel_spec s;
    memset(&s, 0, sizeof s); /* the spec is a cache key by its bytes */
    s.sm = sm, s.dtype = p->dtype, s.role = ROLE_DISTILL, s.label_bits = 32, s.reduction = FLCE_REDUCTION_NONE;
    s.temperature = 1.0f, s.divergence = FLCE_DIVERGENCE_FORWARD_KL;
    s.hidden = p->hidden, s.vocab_shard = p->vocab; /* for logs and spec_validate: the code does not depend on them */
    return s;
}

/* Field for field templates/distill.cu's flce_topk_params. */
typedef struct topk_row_args {
    unsigned long long z, part_m, part_s, indices, logprobs, lse;
    long long row0, vocab, ld;
    int splits, k;
    unsigned long long hidden, weight; /* the k logits again, in fp64 */
    long long dim;
    float inv_temp;
} topk_row_args;

static flce_status run_all(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl,
                           const flce_topk_tensors *t, CUdeviceptr ws, CUstream stream)
{
    kernel_spec s = topk_module_spec(ctx->sm, p);
    const kernel_spec *specs[2] = {&pl->model.logits, &s};
    CUfunction fns[2][CTX_MAX_KERNELS];
    TRY(ctx_kernels_many(ctx, specs, 2, fns));
    CUresult res = drv.MemsetD32Async(ws + pl->labels_offset, 0, (size_t)p->tokens, stream);
    if (res != CUDA_SUCCESS) return drv_error(res, "zeroing the top-k call's stand-in labels");
    flce_tensors ts;
    flce_tensors_init(&ts);
    ts.hidden = t->hidden, ts.weight = t->weight, ts.labels = (const void *)(uintptr_t)(ws + pl->labels_offset);
    run r;
    memset(&r, 0, sizeof r);
    r.pl = &pl->model, r.p = &pl->ce, r.t = &ts, r.ctx = ctx, r.ws = ws, r.stream = stream;
    r.es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    r.k.logits = fns[0][0];
    r.rp.flag = ctx->flag_dev;
    const logits_stats st = {ws + pl->part_m_offset, ws + pl->part_s_offset, ws + pl->target_offset};
    topk_row_args a = {ws + pl->z_offset, st.part_m, st.part_s, addr(t->indices), addr(t->logprobs), addr(t->lse),
                       0, p->vocab, pl->ld, pl->model.splits, p->k, addr(t->hidden), addr(t->weight), p->hidden,
                       1.0f / p->temperature};
    for (int64_t c = 0; c < pl->chunks; c++) {
        block b = {c * pl->chunk_rows, 0, 0, p->vocab, c == 0, c == pl->chunks - 1};
        b.rows = p->tokens - b.row0 < pl->chunk_rows ? p->tokens - b.row0 : pl->chunk_rows;
        TRY(launch_store_logits(&r, &b, ws + pl->z_offset, &st));
        a.row0 = b.row0;
        TRY(launch(fns[1][DK_TOPK], b.rows, 1, TOPK_THREADS, 0, stream, &a, "top-k rows"));
    }
    return FLCE_OK;
}

typedef struct topk_call {
    const flce_topk_problem *p;
    const topk_plan *pl;
    const flce_topk_tensors *t; /* NULL when preparing */
} topk_call;

static flce_status topk_body(flce_context *ctx, CUdeviceptr ws, CUstream stream, void *arg)
{
    const topk_call *c = arg;
    if (c->t) return run_all(ctx, c->p, c->pl, c->t, ws, stream);
    kernel_spec s = topk_module_spec(ctx->sm, c->p);
    const kernel_spec *specs[2] = {&c->pl->model.logits, &s};
    CUfunction fns[2][CTX_MAX_KERNELS];
    return ctx_kernels_many(ctx, specs, 2, fns);
}

flce_status topk_prepare(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl)
{
    CTX_LOG_SCOPE(ctx);
    topk_call c = {p, pl, NULL};
    return call_prepare(ctx, topk_body, &c);
}

flce_status topk_run(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl, const flce_topk_tensors *t,
                     void *stream)
{
    CTX_LOG_SCOPE(ctx);
    log_msg(LOG_DEBUG, "top-k: N=%lld D=%lld V=%lld k=%d, %lld token chunk(s) of %lld rows, workspace %.1f MiB",
            (long long)p->tokens, (long long)p->hidden, (long long)p->vocab, p->k, (long long)pl->chunks,
            (long long)pl->chunk_rows, (double)pl->workspace_bytes / (1 << 20));
    topk_call c = {p, pl, t};
    return call_run(ctx, t->workspace, pl->workspace_bytes, (CUstream)stream, topk_body, &c);
}
