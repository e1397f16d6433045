/* launch.c — the kernel sequence of forward, loss-and-grad and backward (see launch.h). */
#include <string.h>

#include "launch.h"
#include "params.h"

enum { K_PREPARE = 0, K_COMBINE = 1, K_DZ = 2, K_REDUCE = 3 };

typedef struct kernels {
    CUfunction logits, dh, dw, row[4];
} kernels;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static flce_status get_kernels(flce_context *ctx, const plan *pl, kernels *k)
{
    CUfunction fns[CTX_MAX_KERNELS];
    memset(k, 0, sizeof *k);
    TRY(ctx_kernels(ctx, &pl->rowops, k->row));
    TRY(ctx_kernels(ctx, &pl->logits, fns));
    k->logits = fns[0];
    if (pl->op != FLCE_OP_FORWARD) {
        TRY(ctx_kernels(ctx, &pl->dh, fns));
        k->dh = fns[0];
        TRY(ctx_kernels(ctx, &pl->dw, fns));
        k->dw = fns[0];
    }
    return FLCE_OK;
}

flce_status launch_prepare_kernels(flce_context *ctx, const plan *pl)
{
    kernels k;
    return get_kernels(ctx, pl, &k);
}

static flce_status launch(CUfunction fn, int64_t gx, int64_t gy, int threads, size_t smem,
                          CUstream stream, void *params, const char *what)
{
    if (gx < 1 || gy < 1) return FLCE_OK;
    if (gx > 0x7fffffff || gy > 65535)
        return err_set(FLCE_ERR_UNSUPPORTED, "%s: grid %lld x %lld exceeds the device's limits", what,
                       (long long)gx, (long long)gy);
    void *args[] = {params};
    CUresult r = drv.LaunchKernel(fn, (unsigned)gx, (unsigned)gy, 1, (unsigned)threads, 1, 1,
                                  (unsigned)smem, stream, args, NULL);
    if (r != CUDA_SUCCESS) return drv_error(r, what);
    return FLCE_OK;
}

static size_t esize(flce_dtype t) { return t == FLCE_DTYPE_F32 ? 4 : 2; }

typedef struct run {
    const plan *pl;
    const flce_problem *p;
    const flce_tensors *t;
    flce_context *ctx;
    CUdeviceptr ws;
    CUstream stream;
    kernels k;
    struct flce_row_params rp; /* fields common to every row kernel */
} run;

static void init_row_params(run *r)
{
    const plan *pl = r->pl;
    struct flce_row_params *rp = &r->rp;
    memset(rp, 0, sizeof *rp);
    rp->labels = (unsigned long long)(uintptr_t)r->t->labels;
    rp->part_m = r->ws + pl->off_part_m;
    rp->part_s = r->ws + pl->off_part_s;
    rp->target = r->ws + pl->off_target;
    rp->z = pl->off_z ? r->ws + pl->off_z : 0;
    rp->dz = pl->off_dz ? r->ws + pl->off_dz : 0;
    rp->lse = pl->need_lse ? r->ws + pl->off_lse : (unsigned long long)(uintptr_t)r->t->lse;
    if (pl->need_loss_rows) rp->loss_rows = r->ws + pl->off_loss_rows;
    else rp->loss_rows = (unsigned long long)(uintptr_t)r->t->loss; /* none: per-token output */
    rp->loss_out = r->p->reduction != FLCE_REDUCTION_NONE ? (unsigned long long)(uintptr_t)r->t->loss : 0;
    rp->grad_output = (unsigned long long)(uintptr_t)r->t->grad_output;
    rp->count = r->ws + pl->off_count;
    rp->flag = r->ctx->flag_dev;
    rp->tokens = pl->n;
    rp->ldz = pl->ldz;
    rp->vocab_offset = r->p->vocab_offset;
    rp->vocab_total = r->p->vocab_total ? r->p->vocab_total : r->p->vocab_offset + r->p->vocab_shard;
    rp->ignore_index = r->p->ignore_index;
    rp->splits = pl->splits;
}

static flce_status run_logits(run *r, int64_t row0, int64_t rows, int store_z)
{
    const plan *pl = r->pl;
    size_t es = esize(r->p->dtype);
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    g.a = (unsigned long long)(uintptr_t)r->t->hidden + (unsigned long long)(row0 * pl->d) * es;
    g.b = (unsigned long long)(uintptr_t)r->t->weight;
    g.out = store_z ? r->ws + pl->off_z : 0;
    g.labels = (unsigned long long)(uintptr_t)r->t->labels + (unsigned long long)row0 * (r->p->label_bits / 8);
    g.part_m = r->ws + pl->off_part_m;
    g.part_s = r->ws + pl->off_part_s;
    g.target = r->ws + pl->off_target;
    g.m = rows, g.n = pl->v, g.k = pl->d;
    g.a_rows = rows, g.a_cols = pl->d, g.lda = pl->d;
    g.b_rows = pl->v, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->ldz;
    g.vocab_offset = r->p->vocab_offset;
    g.splits = pl->splits;
    g.tiles_per_split = pl->tiles_per_split;
    return launch(r->k.logits, ceil_div(rows, pl->logits.tile.bm), pl->splits,
                  spec_threads(&pl->logits), spec_smem_bytes(&pl->logits), r->stream, &g,
                  "logits kernel");
}

static void set_scale(const run *r, struct flce_gemm_params *g)
{
    if (r->p->reduction == FLCE_REDUCTION_NONE) return; /* g_i already in dZ */
    g->scale_mode = r->p->reduction == FLCE_REDUCTION_MEAN ? 2 : 1;
    g->scale_grad = (unsigned long long)(uintptr_t)r->t->grad_output;
    g->scale_count = r->ws + r->pl->off_count;
}

static flce_status run_dh(run *r, int64_t row0, int64_t rows)
{
    const plan *pl = r->pl;
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    set_scale(r, &g);
    g.a = r->ws + pl->off_dz;
    g.b = (unsigned long long)(uintptr_t)r->t->weight;
    g.out = (unsigned long long)(uintptr_t)r->t->grad_hidden + (unsigned long long)(row0 * pl->d) * esize(r->p->dtype);
    g.m = rows, g.n = pl->d, g.k = pl->v;
    g.a_rows = rows, g.a_cols = pl->ldz, g.lda = pl->ldz;
    g.b_rows = pl->v, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->d;
    return launch(r->k.dh, ceil_div(pl->d, pl->dh.tile.bn), ceil_div(rows, pl->dh.tile.bm),
                  spec_threads(&pl->dh), spec_smem_bytes(&pl->dh), r->stream, &g, "dH kernel");
}

/* dW accumulates over chunks: in fp32 (the caller's fp32 dW, or the workspace accumulator whose
 * last pass writes the input dtype), so rounding happens once. */
static flce_status run_dw(run *r, int64_t chunk, int64_t row0, int64_t rows)
{
    const plan *pl = r->pl;
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    set_scale(r, &g);
    unsigned long long dw = (unsigned long long)(uintptr_t)r->t->grad_weight;
    unsigned long long acc = pl->need_dw_acc ? r->ws + pl->off_dw_acc : dw;
    int first = chunk == 0, last = chunk == pl->n_chunks - 1;
    g.a = r->ws + pl->off_dz;
    g.b = (unsigned long long)(uintptr_t)r->t->hidden + (unsigned long long)(row0 * pl->d) * esize(r->p->dtype);
    g.out = last ? dw : acc;
    g.out_f32 = !last || r->p->dtype == FLCE_DTYPE_F32;
    g.addend = first ? 0 : acc;
    g.m = pl->v, g.n = pl->d, g.k = rows;
    g.a_rows = rows, g.a_cols = pl->ldz, g.lda = pl->ldz;
    g.b_rows = rows, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->d;
    return launch(r->k.dw, ceil_div(pl->d, pl->dw.tile.bn), ceil_div(pl->v, pl->dw.tile.bm),
                  spec_threads(&pl->dw), spec_smem_bytes(&pl->dw), r->stream, &g, "dW kernel");
}

static flce_status run_rows(run *r, int kernel, int64_t row0, int64_t rows)
{
    struct flce_row_params rp = r->rp;
    rp.row0 = row0;
    rp.rows = rows;
    rp.part_m = r->rp.part_m, rp.part_s = r->rp.part_s;
    switch (kernel) {
    case K_PREPARE: {
        int64_t blocks = ceil_div(r->pl->n, 256);
        if (blocks > 4 * (int64_t)r->ctx->num_sms) blocks = 4 * (int64_t)r->ctx->num_sms;
        return launch(r->k.row[K_PREPARE], blocks, 1, 256, 0, r->stream, &rp, "prepare kernel");
    }
    case K_COMBINE:
        return launch(r->k.row[K_COMBINE], ceil_div(rows, 256), 1, 256, 0, r->stream, &rp,
                      "combine kernel");
    case K_DZ:
        return launch(r->k.row[K_DZ], rows, ceil_div(r->pl->ldz / 4, 256), 256, 0, r->stream, &rp,
                      "dz kernel");
    default:
        return launch(r->k.row[K_REDUCE], 1, 1, 1024, 0, r->stream, &rp, "reduce kernel");
    }
}

flce_status launch_run(flce_context *ctx, const plan *pl, const flce_problem *p,
                       const flce_tensors *t, CUdeviceptr ws, CUstream stream)
{
    run r = {pl, p, t, ctx, ws, stream, {0}, {0}};
    TRY(get_kernels(ctx, pl, &r.k));
    init_row_params(&r);
    DRV_TRY(drv.MemsetD32Async(ws + pl->off_count, 0, 1, stream));
    TRY(run_rows(&r, K_PREPARE, 0, pl->n));
    int grads = pl->op != FLCE_OP_FORWARD;
    for (int64_t c = 0; c < pl->n_chunks; c++) {
        int64_t row0 = c * pl->chunk_rows;
        int64_t rows = pl->n - row0 < pl->chunk_rows ? pl->n - row0 : pl->chunk_rows;
        TRY(run_logits(&r, row0, rows, grads));
        if (pl->op != FLCE_OP_BACKWARD) TRY(run_rows(&r, K_COMBINE, row0, rows));
        if (!grads) continue;
        TRY(run_rows(&r, K_DZ, row0, rows));
        if (t->grad_hidden) TRY(run_dh(&r, row0, rows));
        if (t->grad_weight) TRY(run_dw(&r, c, row0, rows));
    }
    if (pl->op != FLCE_OP_BACKWARD && p->reduction != FLCE_REDUCTION_NONE && t->loss)
        TRY(run_rows(&r, K_REDUCE, 0, pl->n));
    return FLCE_OK;
}
