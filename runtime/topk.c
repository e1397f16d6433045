/* topk.c — the top-k log-probabilities call (flce_topk_logprobs): per token chunk the CE path's
 * logits kernel stores the chunk's logits at T in fp32 with its per-split statistics (max, Σ exp,
 * and the entropy statistic Σ exp·z; launch_store_logits), then flce_topk_row (templates/distill.cu,
 * the distillation's module) selects each row's k largest, forms those k logits again in fp64 from
 * the inputs, corrects the lse with them (their differences, and the pass's bias they reveal on the
 * other columns) and writes their ids and z/T − lse. Under tensor parallelism the row kernel writes
 * this rank's block instead (the stats half), the blocks are all-gathered (over tensors.comm here,
 * or by the caller between flce_topk_stats and flce_topk_finish), and flce_topk_merge forms the
 * outputs from them (the finish half). */
#include "topk.h"

#include <string.h>

#include "comm.h"
#include "config.h"
#include "context.h"
#include "driver.h"
#include "error.h"
#include "launch.h"
#include "log.h"

enum { TOPK_THREADS = 256, DK_TOPK = 3, DK_TOPK_MERGE = 12 }; /* emit.c distill_names */

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

uint64_t topk_block_bytes(const flce_topk_problem *p)
{
    return 4 * (FLCE_TP_HEADER + (uint64_t)p->tokens * (2 + 2 * (uint64_t)p->k));
}

uint64_t topk_part_workspace(const topk_plan *pl, topk_part part)
{
    return part == TOPK_FINISH ? 0 : part == TOPK_STATS ? pl->stats_bytes : pl->workspace_bytes;
}

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
    t.entropy = (float *)&mark; /* the entropy statistic: E_p[z/T] for flce_topk_row's lse correction */
    TRY(plan_make_cfg(&pl->ce, FLCE_OP_LOSS_AND_GRAD, dev->name, dev->sm, dev->num_sms, 0, &cfg, &t, &pl->model));
    if (pl->model.recompute || pl->model.compact ||
        (pl->model.logits.opts & ~(unsigned)SPEC_OPT_BIAS) != SPEC_OPT_ENTROPY)
        return err_set(FLCE_ERR_INTERNAL, "top-k: the CE plan is not a plain chunked one (a planning bug)");
    pl->ld = (int64_t)ld;
    const uint64_t rows = (uint64_t)pl->chunk_rows, parts = rows * (uint64_t)pl->model.splits * 4;
    uint64_t cur = 0;
    pl->z_offset = cur, cur = align256(cur + rows * ld * 4);
    pl->part_m_offset = cur, cur = align256(cur + parts);
    pl->part_s_offset = cur, cur = align256(cur + parts);
    pl->part_t_offset = cur, cur = align256(cur + parts);
    pl->target_offset = cur, cur = align256(cur + rows * 4);
    pl->labels_offset = cur, cur = align256(cur + (uint64_t)p->tokens * 4);
    pl->stats_bytes = cur;
    pl->block_bytes = topk_block_bytes(p);
    if (p->tp_size > 1) {
        pl->block_offset = cur, cur = align256(cur + pl->block_bytes);
        pl->gathered_offset = cur, cur = align256(cur + pl->block_bytes * (uint64_t)p->tp_size);
    }
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
    unsigned long long z, part_m, part_s, part_t, indices, logprobs, lse;
    long long row0, vocab, ld;
    int splits, k;
    unsigned long long hidden, weight; /* the k logits again, in fp64 */
    long long dim;
    float temperature;
    unsigned long long block, gathered, flag; /* tensor parallelism */
    long long vocab_offset, vocab_total, tokens;
    int tp_size;
} topk_row_args;

/* The arguments both kernels share: the problem's, the outputs', the TP header's. */
static topk_row_args row_args(flce_context *ctx, const flce_topk_problem *p, const flce_topk_tensors *t)
{
    topk_row_args a;
    memset(&a, 0, sizeof a);
    a.indices = addr(t->indices), a.logprobs = addr(t->logprobs), a.lse = addr(t->lse);
    a.vocab = p->vocab, a.k = p->k, a.hidden = addr(t->hidden), a.weight = addr(t->weight), a.dim = p->hidden;
    a.temperature = p->temperature, a.flag = (unsigned long long)ctx->flag_dev;
    a.vocab_offset = p->vocab_offset, a.vocab_total = p->vocab_total, a.tokens = p->tokens, a.tp_size = p->tp_size;
    return a;
}

/* The stats half: per token chunk the logits pass, then flce_topk_row into `rank_block` (this
 * rank's block under TP) or, with 0, into the outputs. */
static flce_status run_stats(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl,
                             const flce_topk_tensors *t, CUdeviceptr ws, CUdeviceptr rank_block, CUstream stream)
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
    const logits_stats st = {.part_m = ws + pl->part_m_offset, .part_s = ws + pl->part_s_offset,
                             .target = ws + pl->target_offset, .part_t = ws + pl->part_t_offset};
    topk_row_args a = row_args(ctx, p, t);
    a.z = ws + pl->z_offset, a.part_m = st.part_m, a.part_s = st.part_s, a.part_t = st.part_t;
    a.ld = pl->ld, a.splits = pl->model.splits;
    a.block = rank_block;
    for (int64_t c = 0; c < pl->chunks; c++) {
        block b = {c * pl->chunk_rows, 0, 0, p->vocab, c == 0, c == pl->chunks - 1};
        b.rows = p->tokens - b.row0 < pl->chunk_rows ? p->tokens - b.row0 : pl->chunk_rows;
        TRY(launch_store_logits(&r, &b, ws + pl->z_offset, &st));
        a.row0 = b.row0;
        TRY(launch(fns[1][DK_TOPK], b.rows, 1, TOPK_THREADS, 0, stream, &a, "top-k rows"));
    }
    return FLCE_OK;
}

/* The finish half: every token's outputs merged from the tp_size blocks at `gathered`. */
static flce_status run_finish(flce_context *ctx, const flce_topk_problem *p, const flce_topk_tensors *t,
                              CUdeviceptr gathered, CUstream stream)
{
    kernel_spec s = topk_module_spec(ctx->sm, p);
    const kernel_spec *specs[1] = {&s};
    CUfunction fns[1][CTX_MAX_KERNELS];
    TRY(ctx_kernels_many(ctx, specs, 1, fns));
    topk_row_args a = row_args(ctx, p, t);
    a.gathered = gathered;
    return launch(fns[0][DK_TOPK_MERGE], p->tokens, 1, TOPK_THREADS, 0, stream, &a, "top-k merge");
}

/* The whole call: without TP the row kernel writes the outputs; with it, this rank's block, the
 * all-gather over tensors.comm, then the merge, all in the workspace. */
static flce_status run_all(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl,
                           const flce_topk_tensors *t, CUdeviceptr ws, CUstream stream)
{
    if (p->tp_size == 1) return run_stats(ctx, p, pl, t, ws, 0, stream);
    CUdeviceptr mine = ws + pl->block_offset, gathered = ws + pl->gathered_offset;
    TRY(run_stats(ctx, p, pl, t, ws, mine, stream));
    TRY(comm_all_gather(t->comm, (const void *)(uintptr_t)mine, (void *)(uintptr_t)gathered, pl->block_bytes, stream,
                        "the top-k all-gather"));
    return run_finish(ctx, p, t, gathered, stream);
}

typedef struct topk_call {
    const flce_topk_problem *p;
    const topk_plan *pl;
    const flce_topk_tensors *t; /* NULL when preparing */
    topk_part part;
    CUdeviceptr buf;            /* this rank's block (TOPK_STATS) or the gathered ones (TOPK_FINISH) */
} topk_call;

static flce_status topk_body(flce_context *ctx, CUdeviceptr ws, CUstream stream, void *arg)
{
    const topk_call *c = arg;
    if (c->t && c->part == TOPK_STATS) return run_stats(ctx, c->p, c->pl, c->t, ws, c->buf, stream);
    if (c->t && c->part == TOPK_FINISH) return run_finish(ctx, c->p, c->t, c->buf, stream);
    if (c->t) return run_all(ctx, c->p, c->pl, c->t, ws, stream);
    kernel_spec s = topk_module_spec(ctx->sm, c->p);
    const kernel_spec *specs[2] = {&c->pl->model.logits, &s};
    CUfunction fns[2][CTX_MAX_KERNELS];
    return ctx_kernels_many(ctx, specs, 2, fns);
}

flce_status topk_prepare(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl)
{
    CTX_LOG_SCOPE(ctx);
    topk_call c = {p, pl, NULL, TOPK_ALL, 0};
    return call_prepare(ctx, topk_body, &c);
}

flce_status topk_run(flce_context *ctx, const flce_topk_problem *p, const topk_plan *pl, const flce_topk_tensors *t,
                     topk_part part, void *buf, void *stream)
{
    CTX_LOG_SCOPE(ctx);
    static const char *const part_name[] = {"", " (stats half)", " (finish half)"};
    log_msg(LOG_DEBUG,
            "top-k%s: N=%lld D=%lld V=%lld k=%d rank %d of %d, %lld token chunk(s) of %lld rows, workspace %.1f MiB",
            part_name[part], (long long)p->tokens, (long long)p->hidden, (long long)p->vocab, p->k, p->tp_rank,
            p->tp_size, (long long)pl->chunks, (long long)pl->chunk_rows,
            (double)topk_part_workspace(pl, part) / (1 << 20));
    topk_call c = {p, pl, t, part, (CUdeviceptr)(uintptr_t)buf};
    return call_run(ctx, t->workspace, topk_part_workspace(pl, part), (CUstream)stream, topk_body, &c);
}
