/* launch.c — the kernel sequences of forward, loss-and-grad and backward (see launch.h):
 *   forward:    prepare → logits (statistics) → combine → reduce
 *   chunked:    prepare → per token chunk: logits (+Z, or compact fp16 p̃ for 16-bit training)
 *               → [combine] → dz → dH → dW → db → [reduce]; with row-scaled compact logits (plan.h
 *               qrows) qref → logits → combine → qscale → dH → dW, no dz pass
 *   recompute:  [forward] → per vocab chunk: logits writing dZ (or Z → dz, FLCE_DEV=fused_dz=0)
 *               → dH (accumulated) → dW → db
 * With tensor parallelism (docs/DESIGN.md §2) every combine is preceded by tp_pack and ONE all-gather of
 * the per-row statistics, dH builds up in fp32 and is summed across ranks before it is rounded once
 * (by default an fp32 reduce-scatter, the cast and a 16-bit all-gather: reduce_dh_rows; under
 * sequence parallelism, which first all-gathers hidden states and labels, a reduce-scatter).
 * No host synchronization anywhere.
 *
 * This file runs a plan (launch_run); launch_call.c makes the plan, loads its kernels and finds its
 * workspace; launch_grads.c and launch_tp.c hold the gradient passes and the collectives, and
 * launch_prim.c the launches and kernel loading below them all. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "launch.h"
#include "launch_grads.h"
#include "launch_tp.h"
#include "log.h"
#include "timeline.h"
#include "tma.h"

static void init_row_params(run *r)
{
    const plan *pl = r->pl;
    const flce_tensors *t = r->t;
    struct flce_row_params *rp = &r->rp;
    int reduced = r->p->reduction != FLCE_REDUCTION_NONE;
    memset(rp, 0, sizeof *rp);
    rp->labels = addr(t->labels);
    rp->part_m = ws_at(r, pl->off_part_m, pl->off_part_m != 0);
    rp->part_s = ws_at(r, pl->off_part_s, pl->off_part_s != 0);
    rp->part_t = ws_at(r, pl->off_part_t, pl->off_part_t != 0);
    rp->part_zs = ws_at(r, pl->off_part_zs, pl->off_part_zs != 0);
    rp->part_arg = ws_at(r, pl->off_part_arg, pl->off_part_arg != 0);
    rp->target = ws_at(r, pl->off_target, pl->off_target != 0);
    rp->z = ws_at(r, pl->off_z, pl->off_z != 0);
    rp->dz = ws_at(r, pl->off_dz, pl->off_dz != 0);
    if (pl->compact) {
        rp->tile_max = r->ws + pl->off_tile_max;
        rp->tile_max_ld = pl->tile_max_ld, rp->tile_cols = pl->tile_cols;
    }
    if (pl->qrows) {
        rp->hidden = addr(t->hidden), rp->weight = addr(t->weight), rp->d = pl->d;
        rp->qref = r->ws + pl->off_qref, rp->qflags = r->ws + pl->off_qflags;
        rp->row_scale = r->ws + pl->off_row_scale, rp->qh = r->ws + pl->off_qh, rp->qlab = r->ws + pl->off_qlab;
        rp->qlist_start = r->ws + pl->off_qlist_start, rp->qlist_tok = r->ws + pl->off_qlist_tok;
        rp->qlist_blk = r->ws + pl->off_qlist_blk;
    }
    rp->lse = pl->need_lse ? r->ws + pl->off_lse : addr(t->lse);
    /* Per-token losses go to the workspace (reduced later), the caller's loss_per_token, and for
     * reduction none also the caller's loss. */
    if (pl->need_loss_rows) rp->loss_rows = r->ws + pl->off_loss_rows;
    else rp->loss_rows = reduced ? addr(t->loss_per_token) : addr(t->loss);
    if (t->loss_per_token && rp->loss_rows != addr(t->loss_per_token)) rp->loss_copy = addr(t->loss_per_token);
    /* Reduction none writes each token's z-loss part into the caller's z_loss_out, zeros when
     * z_loss is 0 (the Python suite found it left unwritten then); reduced, the reduce kernel
     * writes the sum, 0 without z-loss rows. */
    if (pl->need_zloss_rows) rp->zloss_rows = r->ws + pl->off_zloss_rows;
    else if (!reduced) rp->zloss_rows = addr(t->z_loss_out);
    rp->loss_out = reduced ? addr(t->loss) : 0;
    rp->zloss_out = reduced ? addr(t->z_loss_out) : 0;
    rp->logprob = addr(t->target_logprob);
    rp->entropy = addr(t->entropy);
    rp->argmax = addr(t->argmax);
    rp->grad_output = addr(t->grad_output);
    rp->grad_logprob = addr(t->grad_logprob);
    rp->grad_lse = addr(t->grad_lse);
    rp->grad_entropy = addr(t->grad_entropy);
    rp->grad_loss_rows = addr(t->grad_loss_per_token);
    rp->stats = r->ws + pl->off_stats;
    rp->class_weights = r->p->has_class_weights ? addr(t->class_weights) : 0;
    /* the caller's flag for this call, else the context's (reported by the next call) */
    rp->flag = t->error_flag ? addr(t->error_flag) : r->ctx->flag_dev;
    rp->dbias_acc = ws_at(r, pl->off_db_acc, pl->need_db_acc);
    rp->grad_bias = addr(t->grad_bias);
    rp->tokens = pl->n;
    rp->ldz = pl->ldz;
    rp->vocab_offset = r->p->vocab_offset;
    rp->vocab_total = r->p->vocab_total ? r->p->vocab_total : r->p->vocab_offset + r->p->vocab_shard;
    rp->ignore_index = r->p->ignore_index;
    rp->splits = pl->splits;
    rp->vocab_shard = r->p->vocab_shard;
    rp->tp_size = pl->tp;
    if (pl->collective && pl->op != FLCE_OP_BACKWARD) {
        rp->tp_send = r->ws + pl->off_tp_send;
        rp->tp_recv = r->ws + pl->off_tp_recv;
    }
}

/* The fields every logits pass over block b shares. */
static void logits_params(const run *r, const block *b, struct flce_gemm_params *g)
{
    const plan *pl = r->pl;
    memset(g, 0, sizeof *g);
    g->a = addr(r->t->hidden) + (unsigned long long)(b->row0 * pl->d) * r->es;
    g->b = addr(r->t->weight) + (unsigned long long)(b->col0 * pl->d) * r->es;
    g->labels = addr(r->t->labels) + (unsigned long long)b->row0 * (unsigned long long)(r->p->label_bits / 8);
    g->bias = r->p->has_bias ? addr(r->t->bias) + (unsigned long long)b->col0 * r->es : 0;
    g->class_weights = r->rp.class_weights;
    g->m = b->rows, g->n = b->cols, g->k = pl->d;
    g->a_rows = b->rows, g->a_cols = pl->d, g->lda = pl->d;
    g->b_rows = b->cols, g->b_cols = pl->d, g->ldb = pl->d;
    g->ldo = pl->ldz;
    g->vocab_offset = r->p->vocab_offset + b->col0;
}

static flce_status launch_logits(run *r, const kernel_spec *spec, CUfunction fn, const block *b, int stats,
                                 struct flce_gemm_params *g, const char *what)
{
    const plan *pl = r->pl;
    /* A full_tiles kernel has no code for a partial vocab tile (gemm_logits.cu NO_PARTIAL_TILE). */
    if (spec->full_tiles && b->cols % spec->tile.bn != 0)
        return err_set(FLCE_ERR_INTERNAL, "%s: compiled for whole %d-column tiles, launched over %lld columns "
                       "(a planning bug)", what, spec->tile.bn, (long long)b->cols);
    int splits = pl->splits, tps = pl->tiles_per_split;
    if (!stats) plan_vocab_splits(pl, b->rows, b->cols, r->ctx->num_sms, &splits, &tps);
    g->splits = splits;
    g->tiles_per_split = tps;
    g->group_rows = pl->logits_group;
    int64_t gx = ceil_div(b->rows, spec->tile.bm), gy = splits;
    if (spec->cluster > 1) gx = ceil_div(gx, spec->cluster) * spec->cluster; /* pairs of row blocks */
    if (stats && pl->logits_persist) {
        /* more items than CTAs resident at once (the slots the driver gives this kernel's
         * clusters): persistent CTAs walk them in turn (templates/gemm_entry.cu) */
        int cl = spec->cluster > 1 ? spec->cluster : 1;
        int64_t units = gx / cl, resident = resident_slots(r->ctx, spec, fn) / cl;
        if (resident > 0 && units * gy > resident) {
            g->persist = (int)resident;
            gx = resident * cl, gy = 1;
        }
        log_msg(LOG_DEBUG, "logits: %lld item(s) of %d tile(s), %s", (long long)(units * splits), tps,
                g->persist ? "persistent" : "one per CTA");
    }
    TRY(tma_prepare_gemm(spec, g, r->ctx->num_sms, &gx, &gy));
    return launch_cluster(fn, gx, gy, spec->cluster, spec_threads(spec), spec_smem_bytes(spec), r->stream, g, what);
}

/* The statistics pass (stats = 1: partials and target for combine) and/or the Z store. */
static flce_status run_logits(run *r, const block *b, int stats, int store_z)
{
    struct flce_gemm_params g;
    logits_params(r, b, &g);
    g.out = store_z ? r->ws + r->pl->off_z : 0;
    if (store_z && r->pl->compact) g.tile_max = r->rp.tile_max, g.ld_tile_max = r->pl->tile_max_ld;
    if (store_z && r->pl->qrows) g.qref = r->rp.qref, g.qflags = r->rp.qflags;
    if (stats) {
        g.part_m = r->rp.part_m, g.part_s = r->rp.part_s, g.target = r->rp.target;
        g.part_t = r->rp.part_t, g.part_zs = r->rp.part_zs, g.part_arg = r->rp.part_arg;
    }
    return launch_logits(r, &r->pl->logits, r->k.logits, b, stats, &g, "logits kernel");
}

flce_status launch_store_logits(run *r, const block *b, unsigned long long z, const logits_stats *st)
{
    struct flce_gemm_params g;
    logits_params(r, b, &g);
    g.out = z;
    if (st) {
        g.part_m = st->part_m, g.part_s = st->part_s, g.target = st->target;
        g.part_t = st->part_t, g.part_zs = st->part_zs;
        if (r->pl->logits.compact) g.tile_max = st->tile_max, g.ld_tile_max = r->pl->tile_max_ld;
        g.qref = st->soft, g.qflags = st->soft_tile_max, g.lse = st->soft_lse; /* params.h: OPT_SOFT */
        if (st->sparse_ids) g.qref = st->sparse_ids, g.qflags = st->sparse_p; /* OPT_SPARSE */
    }
    return launch_logits(r, &r->pl->logits, r->k.logits, b, st != NULL, &g, "logits kernel (Z store)");
}

/* Recompute's gradient pass over block b: the logits again, turned into dZ in the epilogue (the
 * rows' lse is known), which replaces the Z store and the dz kernel. */
static flce_status run_logits_dz(run *r, const block *b)
{
    struct flce_gemm_params g;
    logits_params(r, b, &g);
    g.out = r->ws + r->pl->off_dz;
    g.lse = r->rp.lse + (unsigned long long)b->row0 * 4;
    g.grad_output = r->p->reduction == FLCE_REDUCTION_NONE && r->t->grad_output
                        ? addr(r->t->grad_output) + (unsigned long long)b->row0 * 4 : 0;
    g.stats = r->rp.stats;
    g.vocab_total = r->rp.vocab_total;
    g.ignore_index = r->rp.ignore_index;
    return launch_logits(r, &r->pl->logits_dz, r->k.logits_dz, b, 0, &g, "logits+dz kernel");
}

static block complete(block b)
{
    b.first = b.last = 1;
    return b;
}

/* The statistics of block b's rows, complete over the global vocab: with TP, this rank's records
 * go to every rank (one all-gather) before the combine merges them in rank order. */
static flce_status combine_rows(run *r, const block *b)
{
    const plan *pl = r->pl;
    if (pl->collective) {
        TRY(run_rows(r, K_TP_PACK, b));
        TRY(comm_all_gather(r->t->comm, (const void *)(uintptr_t)(r->ws + pl->off_tp_send),
                            (void *)(uintptr_t)(r->ws + pl->off_tp_recv), plan_tp_block_bytes(b->rows),
                            r->stream, "the statistics all-gather"));
    }
    return run_rows(r, K_COMBINE, b);
}

static flce_status run_forward(run *r)
{
    block all = {0, r->pl->n, 0, r->pl->v, 1, 1};
    TRY(run_logits(r, &all, 1, 0));
    return combine_rows(r, &all);
}

static flce_status run_chunked(run *r)
{
    const plan *pl = r->pl;
    int stats = pl->op == FLCE_OP_LOSS_AND_GRAD;
    for (int64_t c = 0; c < pl->n_chunks; c++) {
        block b = {c * pl->chunk_rows, 0, 0, pl->v, c == 0, c == pl->n_chunks - 1};
        b.rows = pl->n - b.row0 < pl->chunk_rows ? pl->n - b.row0 : pl->chunk_rows;
        if (pl->qrows) TRY(run_rows(r, K_QREF, &b)); /* each row's reference for the compact store */
        TRY(run_logits(r, &b, stats, 1));
        if (stats) TRY(combine_rows(r, &b));
        block rows_done = complete(b);
        TRY(run_grads(r, &rows_done, &b));
    }
    return FLCE_OK;
}

/* Strategy SAVED (flce.h): run_chunked's one chunk cut between two calls. The forward's compact
 * logits, maxima, target logits and row references stay in the workspace (the caller keeps it),
 * with lse in the caller's buffer; the backward forms dZ from them with the upstream gradients it
 * is given. */
static flce_status run_tp_part(run *r, launch_part part, CUdeviceptr tp_buffer);

/* Under the split-phase TP forward (no communicator) its statistics half stores the logits too and
 * the finishing half combines the gathered statistics; the backward leaves dH as this rank's part. */
static flce_status run_saved(run *r, launch_part part, CUdeviceptr tp_buffer)
{
    const plan *pl = r->pl;
    if (!pl->saved || pl->n_chunks != 1)
        return err_set(FLCE_ERR_INTERNAL, "SAVED call planned with %lld token chunks (a planning bug)",
                       (long long)pl->n_chunks);
    block b = {0, pl->n, 0, pl->v, 1, 1};
    if (part == PART_TP_STATS || part == PART_TP_FINISH) return run_tp_part(r, part, tp_buffer);
    if (part == PART_SAVE) {
        if (pl->qrows) TRY(run_rows(r, K_QREF, &b));
        TRY(run_logits(r, &b, 1, 1));
        return combine_rows(r, &b);
    }
    block rows_done = complete(b);
    return run_grads(r, &rows_done, &b);
}

static flce_status run_recompute(run *r)
{
    const plan *pl = r->pl;
    if (pl->op == FLCE_OP_LOSS_AND_GRAD) TRY(run_forward(r));
    for (int64_t c = 0; c < pl->n_vchunks; c++) {
        block b = {0, pl->n, c * pl->chunk_cols, 0, c == 0, c == pl->n_vchunks - 1};
        b.cols = pl->v - b.col0 < pl->chunk_cols ? pl->v - b.col0 : pl->chunk_cols;
        TRY(pl->fused_dz ? run_logits_dz(r, &b) : run_logits(r, &b, 0, 1));
        block cols_done = complete(b);
        TRY(run_grads(r, &b, &cols_done));
    }
    return FLCE_OK;
}

/* Split-phase TP forward: one half of it (launch.h). */
static flce_status run_tp_part(run *r, launch_part part, CUdeviceptr tp_buffer)
{
    block all = {0, r->pl->n, 0, r->pl->v, 1, 1};
    if (part == PART_TP_STATS) {
        TRY(run_logits(r, &all, 1, r->pl->saved)); /* SAVED: the logits stay for flce_backward */
        r->rp.tp_send = tp_buffer;
        return run_rows(r, K_TP_PACK, &all);
    }
    r->rp.tp_recv = tp_buffer;
    return run_rows(r, K_COMBINE, &all);
}

flce_status launch_run(flce_context *ctx, const plan *pl, const flce_problem *p,
                       const flce_tensors *t, CUdeviceptr ws, CUstream stream, launch_part part,
                       CUdeviceptr tp_buffer)
{
    run r;
    flce_tensors all;
    memset(&r, 0, sizeof r);
    r.pl = pl, r.p = p, r.t = t, r.ctx = ctx, r.ws = ws, r.stream = stream;
    r.es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    TRY(get_kernels(ctx, pl, &r.k));
    if (pl->sp) {
        TRY(sp_gather(&r, t, &all, part));
        r.t = &all;
    }
    init_row_params(&r);
    block whole = {0, pl->n, 0, pl->v, 1, 1};
    TRY(run_rows(&r, K_PREPARE, &whole));
    if (pl->saved) {
        flce_status st = run_saved(&r, part, tp_buffer);
        flce_status joined = side_join(&r); /* (tp_overlap: dH's reduction beside dW) */
        TRY(st);
        TRY(joined);
        if (part == PART_TP_STATS) return FLCE_OK;
    } else if (part != PART_ALL) {
        TRY(run_tp_part(&r, part, tp_buffer));
        if (part == PART_TP_STATS) return FLCE_OK;
    } else if (pl->op == FLCE_OP_FORWARD) {
        TRY(run_forward(&r));
    } else {
        flce_status st = pl->recompute ? run_recompute(&r) : run_chunked(&r);
        flce_status joined = side_join(&r); /* the overlapped dH reductions (tp_overlap) */
        TRY(st);
        TRY(joined);
    }
    int reduced = p->reduction != FLCE_REDUCTION_NONE;
    if (pl->op != FLCE_OP_BACKWARD && part != PART_SAVED_GRADS && reduced && (r.t->loss || r.t->z_loss_out))
        TRY(run_rows(&r, K_REDUCE, &whole));
    if (part == PART_ALL || part == PART_SAVED_GRADS) TRY(finish_dh(&r));
    if (pl->sp && part != PART_SAVED_GRADS) TRY(sp_scatter_outputs(&r, t));
    return FLCE_OK;
}

flce_status launch_scale(flce_context *ctx, const plan *pl, const flce_tensors *t, CUstream stream)
{
    const kernel_spec *rowops = &pl->rowops;
    CUfunction fns[1][CTX_MAX_KERNELS];
    TRY(ctx_kernels_many(ctx, &rowops, 1, fns));
    size_t es = pl->logits.dtype == FLCE_DTYPE_F32 ? 4 : 2;
    const struct {
        const void *ptr;
        long long count;
        const char *what;
    } grads[] = {
        {t->grad_hidden, (long long)pl->n_local * pl->d, "scale kernel (grad_hidden)"},
        {t->grad_weight, (long long)pl->v * pl->d, "scale kernel (grad_weight)"},
        {t->grad_bias, (long long)pl->v, "scale kernel (grad_bias)"},
    };
    for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++) {
        if (!grads[i].ptr || grads[i].count < 1) continue;
        struct flce_row_params rp;
        memset(&rp, 0, sizeof rp);
        rp.cast_dst = addr(grads[i].ptr), rp.cast_count = grads[i].count;
        rp.cast_scale = addr(t->grad_output);
        /* A few resident CTAs per SM, grid-stride: when the scale is 1 each exits at once. */
        int64_t blocks = ceil_div(ceil_div(grads[i].count * (long long)es, 16), 256), cap = 8ll * ctx->num_sms;
        TRY(launch(fns[0][K_CAST], blocks < cap ? blocks : cap, 1, 256, 0, stream, &rp, grads[i].what));
    }
    return FLCE_OK;
}
