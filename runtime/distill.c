/* distill.c — the distillation call's plan (token chunks whose fp32 logits of both models fit the
 * memory budget) and its run, below distill_api.c's checks.
 *
 * v1 (issue 44 item 1; bench/NOTES.md, session 22's plan item 4), correct first: per token chunk,
 *   z_t = Ht·Wtᵀ and z_s = Hs·Wsᵀ in fp32 (flce_distill_gemm),
 *   flce_distill_row: both log-softmaxes at T, D_i, loss_i and dZs in place (× g_i),
 *   dHs = dZs·Ws (fp32, then rounded once to the dtype), dWs += dZsᵀ·Hs (fp32 accumulator),
 * then dWs rounded once, and the loss reduced in a fixed order (flce_distill_reduce). All kernels
 * are templates/distill.cu in one module (spec role ROLE_DISTILL). Its GEMM is a plain tiled one:
 * the CE path's tuned logits/dH/dW kernels are the step after this is proven right on a GPU. */
#include "distill.h"

#include <pthread.h>
#include <string.h>

#include "context.h"
#include "driver.h"
#include "error.h"
#include "launch_prim.h"
#include "log.h"

enum { DISTILL_DEFAULT_BUDGET = 512u << 20, DISTILL_THREADS = 256, DISTILL_TILE = 64 };
enum { DK_COUNT = 0, DK_ROW = 1, DK_REDUCE = 2, DK_GEMM = 3, DK_CAST = 4 }; /* emit.c distill_names */

static uint64_t align16(uint64_t x) { return (x + 15) & ~(uint64_t)15; }

void distill_plan_make(const flce_distill_problem *p, distill_plan *pl)
{
    uint64_t budget = p->memory_budget ? p->memory_budget : DISTILL_DEFAULT_BUDGET;
    uint64_t row_bytes = 8 * (uint64_t)p->vocab; /* fp32 z_s and z_t of one token */
    int64_t rows = (int64_t)(budget / row_bytes);
    if (rows < 1) rows = 1;
    if (rows > p->tokens) rows = p->tokens;
    pl->chunk_rows = rows;
    pl->chunks = (p->tokens + rows - 1) / rows;
    uint64_t z = align16(4 * (uint64_t)rows * (uint64_t)p->vocab);
    int wide = p->dtype != FLCE_DTYPE_F32; /* 16-bit outputs go through fp32 buffers, rounded once */
    pl->zs_offset = 0;
    pl->zt_offset = z;
    pl->dw_offset = 2 * z;
    uint64_t dw = wide ? align16(4 * (uint64_t)p->vocab * (uint64_t)p->hidden_student) : 0;
    pl->dh_offset = pl->dw_offset + dw;
    uint64_t dh = wide ? align16(4 * (uint64_t)rows * (uint64_t)p->hidden_student) : 0;
    pl->per_token_offset = pl->dh_offset + dh;
    pl->count_offset = pl->per_token_offset + align16(4 * (uint64_t)p->tokens);
    pl->workspace_bytes = pl->count_offset + 16;
}

/* The module's spec: everything the kernels are specialized on. */
static kernel_spec distill_spec(const flce_context *ctx, const flce_distill_problem *p, const flce_distill_tensors *t)
{
    kernel_spec s;
    memset(&s, 0, sizeof s); /* the spec is a cache key by its bytes */
    s.sm = ctx->sm, s.dtype = p->dtype, s.role = ROLE_DISTILL, s.label_bits = p->label_bits;
    s.hidden = p->hidden_student, s.vocab_shard = p->vocab; /* for logs: the code does not depend on them */
    s.reduction = p->reduction, s.temperature = p->temperature;
    s.divergence = (int)p->divergence, s.beta = p->beta, s.ce_weight = p->ce_weight, s.has_labels = t->labels != NULL;
    return s;
}

/* Field for field templates/distill.cu's structs (passed by value). */
typedef struct distill_row_args {
    unsigned long long zs, zt, labels, grad_output, divergence, loss_rows, loss, count;
    long long row0, rows, tokens, vocab, ignore_index;
    unsigned long long flag; /* the context's device flag (a label outside [0, V)) */
} distill_row_args;

typedef struct distill_gemm_args {
    unsigned long long a, b, c;
    long long m, n, k, a_sm, a_sk, b_sk, b_sn, ldc;
    int a_f32, accumulate;
} distill_gemm_args;

typedef struct distill_cast_args {
    unsigned long long src, dst;
    long long count;
} distill_cast_args;

static flce_status gemm(CUfunction fn, CUstream stream, distill_gemm_args g, const char *what)
{
    int64_t tiles = ceil_div(g.m, DISTILL_TILE) * ceil_div(g.n, DISTILL_TILE);
    return launch(fn, tiles, 1, DISTILL_THREADS, 0, stream, &g, what);
}

static flce_status cast(CUfunction fn, CUstream stream, unsigned long long src, unsigned long long dst, int64_t count)
{
    distill_cast_args c = {src, dst, count};
    int64_t blocks = ceil_div(count, DISTILL_THREADS);
    if (blocks > 65536) blocks = 65536;
    return launch(fn, blocks, 1, DISTILL_THREADS, 0, stream, &c, "distill cast");
}

/* One token chunk: both logits, the rows, dHs and this chunk's share of dWs. */
static flce_status run_chunk(const CUfunction *k, const flce_distill_problem *p, const distill_plan *pl,
                             const flce_distill_tensors *t, CUdeviceptr ws, CUstream stream, distill_row_args ra)
{
    const long long v = p->vocab, ds = p->hidden_student, dt = p->hidden_teacher, rows = ra.rows;
    const size_t es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    const unsigned long long zs = ws + pl->zs_offset, zt = ws + pl->zt_offset;
    const unsigned long long hs = addr(t->student_hidden) + (unsigned long long)(ra.row0 * ds) * es;
    const unsigned long long ht = addr(t->teacher_hidden) + (unsigned long long)(ra.row0 * dt) * es;
    distill_gemm_args z_t = {ht, addr(t->teacher_weight), zt, rows, v, dt, dt, 1, 1, dt, v, 0, 0};
    TRY(gemm(k[DK_GEMM], stream, z_t, "distill teacher logits"));
    distill_gemm_args z_s = {hs, addr(t->student_weight), zs, rows, v, ds, ds, 1, 1, ds, v, 0, 0};
    TRY(gemm(k[DK_GEMM], stream, z_s, "distill student logits"));
    TRY(launch(k[DK_ROW], rows, 1, DISTILL_THREADS, 0, stream, &ra, "distill rows"));
    if (t->grad_student_hidden) {
        const int wide = p->dtype != FLCE_DTYPE_F32;
        unsigned long long out = addr(t->grad_student_hidden) + (unsigned long long)(ra.row0 * ds) * es;
        distill_gemm_args dh = {zs, addr(t->student_weight), wide ? ws + pl->dh_offset : out, rows, ds, v, v, 1,
                                ds, 1, ds, 1, 0};
        TRY(gemm(k[DK_GEMM], stream, dh, "distill dHs"));
        if (wide) TRY(cast(k[DK_CAST], stream, ws + pl->dh_offset, out, rows * ds));
    }
    if (t->grad_student_weight) {
        unsigned long long acc = p->dtype == FLCE_DTYPE_F32 ? addr(t->grad_student_weight) : ws + pl->dw_offset;
        distill_gemm_args dw = {zs, hs, acc, v, ds, rows, 1, v, ds, 1, ds, 1, ra.row0 > 0};
        TRY(gemm(k[DK_GEMM], stream, dw, "distill dWs"));
    }
    return FLCE_OK;
}

static flce_status run_all(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                           const flce_distill_tensors *t, CUdeviceptr ws, CUstream stream)
{
    kernel_spec s = distill_spec(ctx, p, t);
    const kernel_spec *specs[1] = {&s};
    CUfunction fns[1][CTX_MAX_KERNELS];
    TRY(ctx_kernels_many(ctx, specs, 1, fns));
    const CUfunction *k = fns[0];
    distill_row_args ra = {ws + pl->zs_offset, ws + pl->zt_offset, addr(t->labels), addr(t->grad_output),
                           addr(t->divergence), ws + pl->per_token_offset, addr(t->loss), ws + pl->count_offset,
                           0, 0, p->tokens, p->vocab, p->ignore_index, (unsigned long long)ctx->flag_dev};
    TRY(launch(k[DK_COUNT], 1, 1, DISTILL_THREADS, 0, stream, &ra, "distill count"));
    for (int64_t row0 = 0; row0 < p->tokens; row0 += pl->chunk_rows) {
        ra.row0 = row0;
        ra.rows = p->tokens - row0 < pl->chunk_rows ? p->tokens - row0 : pl->chunk_rows;
        TRY(run_chunk(k, p, pl, t, ws, stream, ra));
    }
    if (t->grad_student_weight && p->dtype != FLCE_DTYPE_F32)
        TRY(cast(k[DK_CAST], stream, ws + pl->dw_offset, addr(t->grad_student_weight), p->vocab * p->hidden_student));
    if (p->reduction != FLCE_REDUCTION_NONE && t->loss)
        TRY(launch(k[DK_REDUCE], 1, 1, DISTILL_THREADS, 0, stream, &ra, "distill reduce"));
    return FLCE_OK;
}

flce_status distill_run(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                        const flce_distill_tensors *t, void *stream_arg)
{
    CTX_LOG_SCOPE(ctx);
    CUstream stream = (CUstream)stream_arg;
    log_msg(LOG_DEBUG, "distill: N=%lld Ds=%lld Dt=%lld V=%lld, %lld token chunk(s) of %lld rows, workspace %.1f MiB",
            (long long)p->tokens, (long long)p->hidden_student, (long long)p->hidden_teacher, (long long)p->vocab,
            (long long)pl->chunks, (long long)pl->chunk_rows, (double)pl->workspace_bytes / (1 << 20));
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_take_flag(ctx);
    if (st == FLCE_OK) st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        CUdeviceptr ws = (CUdeviceptr)(uintptr_t)t->workspace;
        if (!ws) st = ctx_workspace(ctx, pl->workspace_bytes, stream, &ws);
        if (st == FLCE_OK) {
            st = run_all(ctx, p, pl, t, ws, stream);
            if (!t->workspace) { /* after a failed call too: some of its work may be queued */
                flce_status done = ctx_workspace_done(ctx, stream);
                if (st == FLCE_OK) st = done;
            }
        }
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
