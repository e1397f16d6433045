/*
 * launch_grads.c — the gradient passes over one block of logits (launch_grads.h run_grads):
 * dZ (or its row-scaled stand-in), dH and dW GEMMs with their accumulation and output rules, the
 * labels' exact terms of row-scaled compact logits, db, and dH beside dW on two streams. Called by
 * launch.c's chunked, recompute and SAVED runs.
 */
#include <stdint.h>
#include <string.h>

#include "launch_grads.h"
#include "launch_tp.h"
#include "log.h"
#include "tma.h"

static void set_scale(const run *r, struct flce_gemm_params *g)
{
    if (r->p->reduction == FLCE_REDUCTION_NONE) return; /* g_i already in dZ */
    if (r->p->grad_outputs) { /* the scalar is folded into each row's dZ (rowops.cu loss_g) */
        if (r->p->dtype == FLCE_DTYPE_F16) g->scale_mode = 4;
        return;
    }
    g->scale_mode = r->p->reduction == FLCE_REDUCTION_MEAN ? 2 : 1;
    if (r->p->dtype == FLCE_DTYPE_F16) g->scale_mode |= 4; /* dZ stored × DZ_SCALE_F16 */
    g->scale_grad = addr(r->t->grad_output);
    g->scale_count = r->ws + r->pl->off_stats;
}

/* Where a gradient GEMM writes when its result builds up over several blocks: into the caller's
 * fp32 buffer (accumulate mode), in place (fp32 dtype), through an fp32 workspace accumulator
 * whose last step writes the dtype — so 16-bit gradients are rounded once — or (in_dtype, plan.h
 * dw_in_dtype) in place in the caller's 16-bit buffer, rounded once per block. `elem` is the element
 * offset of this block's output. */
static void set_output(const run *r, struct flce_gemm_params *g, unsigned long long final,
                       int caller_f32, unsigned long long acc, uint64_t elem, const block *b, int in_dtype)
{
    if (caller_f32) {
        g->out = final + elem * 4, g->out_f32 = 1, g->addend = g->out;
    } else if (in_dtype && r->es == 2) {
        g->out = final + elem * 2, g->out_f32 = 0, g->addend = b->first ? 0 : g->out, g->addend_dtype = 1;
    } else if (r->es == 4) {
        g->out = final + elem * 4, g->out_f32 = 1, g->addend = b->first ? 0 : g->out;
    } else if (!acc || (b->first && b->last)) {
        g->out = final + elem * r->es, g->out_f32 = 0, g->addend = 0;
    } else {
        unsigned long long a = acc + elem * 4;
        g->out = b->last ? final + elem * r->es : a;
        g->out_f32 = !b->last;
        g->addend = b->first ? 0 : a;
    }
}

/* A kernel compiled without some stores (spec plain_out, red_acc) must not be asked for them: the
 * plan and set_output must agree, and a mismatch would silently drop gradients. */
static flce_status check_grad_stores(const kernel_spec *s, const struct flce_gemm_params *g, const char *what)
{
    if ((s->plain_out && (g->addend || g->out_f32)) || (g->red_addend && !s->red_acc))
        return err_set(FLCE_ERR_INTERNAL, "%s kernel: compiled for %s stores but launched with %s (a planning bug)",
                       what, s->plain_out ? "complete 16-bit" : "no red.global",
                       g->red_addend ? "red.global" : "an fp32 addend or output");
    return FLCE_OK;
}

/* dH[rows] (+)= dZ · W[cols] over the vocab columns of s, a part of block b (whose dZ the
 * workspace holds from b->col0): A = dZ stored K-major, B = W stored [k = vocab][n = hidden]. */
static flce_status run_dh_part(run *r, const block *s, const block *b)
{
    const plan *pl = r->pl;
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    set_scale(r, &g);
    int64_t off = s->col0 - b->col0; /* a multiple of PLAN_DH_K_SLICE: 16-byte aligned for TMA */
    g.a = r->ws + pl->off_dz + (unsigned long long)off * r->es;
    g.b = addr(r->t->weight) + (unsigned long long)(s->col0 * pl->d) * r->es;
    if (pl->need_dh_tp) { /* this rank's part of dH, fp32, summed across ranks at the end */
        g.out = r->ws + pl->off_dh_tp + (uint64_t)(s->row0 * pl->d) * 4;
        g.out_f32 = 1, g.addend = s->first ? 0 : g.out;
    } else {
        unsigned long long acc = ws_at(r, pl->off_dh_acc, pl->need_dh_acc);
        /* chunked: the accumulator holds this token chunk's rows only (plan.c), set_output indexes
         * by the absolute row */
        if (acc && !pl->recompute) acc -= (unsigned long long)(s->row0 * pl->d) * 4;
        set_output(r, &g, addr(r->t->grad_hidden), r->p->accumulate_grad_hidden, acc, (uint64_t)(s->row0 * pl->d), s,
                   0);
    }
    g.m = s->rows, g.n = pl->d, g.k = s->cols;
    g.a_rows = s->rows, g.a_cols = pl->ldz - off, g.lda = pl->ldz;
    g.b_rows = s->cols, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->d;
    int64_t gx = ceil_div(pl->d, pl->dh.tile.bn), gy = ceil_div(s->rows, pl->dh.tile.bm);
    if (pl->dh_splits > 1) { /* one fp32 slab per split of k, [rows][d] each; sum_dh_splits adds them */
        g.out = r->ws + pl->off_dh_split, g.out_f32 = 1, g.addend = 0;
        g.k_splits = pl->dh_splits, g.k_split = pl->dh_split_k;
        g.out_split_stride = (unsigned long long)s->rows * (unsigned long long)pl->d * 4;
        gy *= pl->dh_splits; /* the units tma_prepare_gemm spreads over the persistent grid */
    }
    g.raster_rows = pl->raster_rows;
    g.red_addend = pl->red_acc && g.addend && g.addend == g.out && g.out_f32;
    TRY(check_grad_stores(&pl->dh, &g, "dH"));
    if (pl->qrows) { /* chunk rows, as the launch's; the labels' dz where they lie in its k range */
        g.row_scale = r->rp.row_scale;
        if (!pl->qdh) g.qlab = r->rp.qlab, g.qlab_k0 = off; /* else flce_qdh adds them after dH */
    }
    TRY(tma_prepare_gemm(&pl->dh, &g, resident_slots(r->ctx, &pl->dh, r->k.dh), &gx, &gy));
    return launch_cluster(r->k.dh, gx, gy, pl->dh.cluster, spec_threads(&pl->dh), spec_smem_bytes(&pl->dh), r->stream,
                          &g, "dH kernel");
}

/* A labels' pass (K_QDH, K_QDW) of block b adding into dst (fp32 where f32, else the dtype; the
 * kernel's row 0), the row parameters as they were afterwards. */
static flce_status run_label_terms(run *r, int kernel, const block *b, unsigned long long dst, int f32)
{
    struct flce_row_params keep = r->rp;
    r->rp.cast_dst = dst;
    r->rp.cast_accumulate = f32;
    flce_status st = run_rows(r, kernel, b);
    r->rp = keep;
    return st;
}

/* r->stream waits for the work queued so far on s (graph-capturable: an event). */
static flce_status wait_for(run *r, CUstream s)
{
    CUresult res = drv.EventRecord(r->ctx->join, s);
    if (res == CUDA_SUCCESS) res = drv.StreamWaitEvent(r->stream, r->ctx->join, 0);
    return res == CUDA_SUCCESS ? FLCE_OK : drv_error(res, "waiting for the second stream's dW launch");
}

/* plan qdh: the labels' exact dz_i·W_y into the dH rows of token chunk b at dst (its row 0; fp32
 * where f32, else the dtype), after its dH launches on the same stream, where they now lie: the
 * caller's buffer, (dh_splits) the first fp32 slab, or (TP) this rank's fp32 part of dH. A token
 * chunk completes its rows; under TP only the rank holding a row's label adds its term. */
static flce_status run_qdh(run *r, const block *b, unsigned long long dst, int f32)
{
    return run_label_terms(r, K_QDH, b, dst, f32);
}

/* The rows of block b in the caller's dH: fp32 (accumulate_grad_hidden) or the dtype. */
static unsigned long long dh_rows_at(const run *r, const block *b)
{
    return addr(r->t->grad_hidden) + (uint64_t)(b->row0 * r->pl->d) * (r->p->accumulate_grad_hidden ? 4 : r->es);
}

/* plan dh_splits: (plan qdh) the labels' terms into the first fp32 slab, then one flce_cast sums
 * the slabs in order into dH's rows of block b, stored in the dtype or added to the caller's fp32
 * buffer: one rounding, the same bits every run. */
static flce_status sum_dh_splits(run *r, const block *b)
{
    const plan *pl = r->pl;
    unsigned long long slabs = r->ws + pl->off_dh_split;
    long long count = (long long)b->rows * (long long)pl->d;
    if (pl->qdh) TRY(run_qdh(r, b, slabs, 1));
    struct flce_row_params keep = r->rp;
    block none = {0, 0, 0, 0, 1, 1};
    r->rp.cast_src = slabs, r->rp.cast_splits = pl->dh_splits, r->rp.cast_split_stride = count;
    r->rp.cast_count = count, r->rp.cast_scale = 0;
    r->rp.cast_dst = dh_rows_at(r, b), r->rp.cast_accumulate = r->p->accumulate_grad_hidden;
    flce_status st = run_rows(r, K_CAST, &none);
    r->rp = keep;
    return st;
}

/* dH of block b: one launch, or (plan dh_k_slice) one per slice of its vocab columns, each slice
 * a step of the fp32 accumulation (first and last as b's at its ends), or (plan dh_splits) one
 * launch into per-split slabs that sum_dh_splits adds up; then (plan qdh) the labels' terms. */
static flce_status run_dh(run *r, const block *b)
{
    int64_t slice = r->pl->dh_k_slice;
    if (r->pl->dh_splits > 1) {
        TRY(run_dh_part(r, b, b));
        return sum_dh_splits(r, b);
    }
    if (!slice || b->cols <= slice) {
        TRY(run_dh_part(r, b, b));
    } else {
        for (int64_t c = 0; c < b->cols; c += slice) {
            block s = *b;
            s.col0 = b->col0 + c, s.cols = b->cols - c < slice ? b->cols - c : slice;
            s.first = b->first && c == 0, s.last = b->last && c + s.cols == b->cols;
            TRY(run_dh_part(r, &s, b));
        }
    }
    if (!r->pl->qdh) return FLCE_OK;
    if (r->pl->need_dh_tp) /* TP: into this rank's fp32 part, before the ranks sum it */
        return run_qdh(r, b, r->ws + r->pl->off_dh_tp + (uint64_t)(b->row0 * r->pl->d) * 4, 1);
    return run_qdh(r, b, dh_rows_at(r, b), r->p->accumulate_grad_hidden);
}

/* dW's tile counter (plan dw_dynamic) zeroed on the caller's stream, before any launch that takes
 * tiles from it. */
static flce_status zero_tile_counter(run *r)
{
    CUresult res = drv.MemsetD32Async((CUdeviceptr)(r->ws + r->pl->off_tile_counter), 0, 2, r->stream);
    return res == CUDA_SUCCESS ? FLCE_OK : drv_error(res, "zeroing dW's tile counter");
}

/* dW[cols] (+)= dZᵀ · H[rows]: A = dZ stored [k = token][m = vocab], B = H stored [k][n]. One
 * launch of persistent CTAs on r->stream; or, with `late` > 0 (tp_overlap, the tile
 * counter already zeroed: zero_tile_counter), two that share the counter: the first with `late`
 * fewer CTAs than the SMs, which stay free for NCCL's all-reduce on the side stream (dW's CTAs,
 * once resident, hold their SMs until the counter runs dry: TP v3 in bench/NOTES.md), and `late`
 * CTAs on the side stream behind the reduction, which take the tiles left when it ends. */
static flce_status run_dw_split(run *r, const block *b, int late)
{
    const plan *pl = r->pl;
    struct flce_gemm_params g;
    memset(&g, 0, sizeof g);
    set_scale(r, &g);
    g.a = r->ws + pl->off_dz;
    /* row-scaled compact logits: B is s ⊙ H of the chunk's rows (flce_qscale) */
    g.b = pl->qrows ? r->rp.qh : addr(r->t->hidden) + (unsigned long long)(b->row0 * pl->d) * r->es;
    set_output(r, &g, addr(r->t->grad_weight), r->p->accumulate_grad_weight,
               ws_at(r, pl->off_dw_acc, pl->need_dw_acc), (uint64_t)(b->col0 * pl->d), b, pl->dw_in_dtype);
    g.m = b->cols, g.n = pl->d, g.k = b->rows;
    g.a_rows = b->rows, g.a_cols = pl->ldz, g.lda = pl->ldz;
    g.b_rows = b->rows, g.b_cols = pl->d, g.ldb = pl->d;
    g.ldo = pl->d;
    g.raster_rows = pl->raster_rows;
    g.red_addend = pl->red_acc && g.addend && g.addend == g.out && g.out_f32;
    TRY(check_grad_stores(&pl->dw, &g, "dW"));
    int dynamic = pl->dw_dynamic && b->rows > 0; /* tiles from a counter: see plan.h, dw_dynamic */
    if (dynamic) {
        g.tile_counter = r->ws + pl->off_tile_counter;
        if (!late) TRY(zero_tile_counter(r));
    }
    const int64_t tiles_x = ceil_div(pl->d, pl->dw.tile.bn), tiles_y = ceil_div(b->cols, pl->dw.tile.bm);
    int64_t slots = resident_slots(r->ctx, &pl->dw, r->k.dw), gx = tiles_x, gy = tiles_y;
    int split = dynamic && late > 0 && late < slots && tiles_x * tiles_y > slots - late;
    TRY(tma_prepare_gemm(&pl->dw, &g, split ? slots - late : slots, &gx, &gy));
    g.counter_base = gx, g.block0 = 0;
    TRY(launch_cluster(r->k.dw, gx, gy, pl->dw.cluster, spec_threads(&pl->dw), spec_smem_bytes(&pl->dw), r->stream,
                       &g, "dW kernel"));
    if (split) {
        struct flce_gemm_params g2 = g;
        int64_t gx2 = tiles_x, gy2 = tiles_y;
        TRY(tma_prepare_gemm(&pl->dw, &g2, late, &gx2, &gy2));
        g2.counter_base = gx, g2.block0 = gx;
        TRY(launch_cluster(r->k.dw, gx2, gy2, pl->dw.cluster, spec_threads(&pl->dw), spec_smem_bytes(&pl->dw),
                           r->ctx->side, &g2, "dW kernel (after the dH all-reduce)"));
    }
    if (!pl->qrows) return FLCE_OK;
    /* The labels' exact Σ dz·h into the rows dW wrote (rowops.cu flce_qdw), after both launches of
     * a split dW: the late one's tiles (side stream) are plain stores that would overwrite them
     * (TP at tp = 4 lost them: dW 2.9e-2 off, bench/NOTES.md session 14). */
    if (split) TRY(wait_for(r, r->ctx->side));
    return run_label_terms(r, K_QDW, b, g.out, g.out_f32);
}

static flce_status run_dw(run *r, const block *b) { return run_dw_split(r, b, 0); }

/* Whether dH's reduction across ranks goes beside dW after this row step (tp_overlap): after the
 * last vocab step of each token chunk; under SP once, after the last chunk (one reduce-scatter of
 * every row). */
static int reduce_beside_dw(const run *r, const block *rows_step)
{
    const plan *pl = r->pl;
    return pl->tp_overlap && rows_step->last && (!pl->sp || rows_step->row0 + rows_step->rows == pl->n);
}

/* FLCE_DEV grad_streams (plan.h, concurrent_grads): dH on the side stream (highest priority) and dW on
 * the fill stream (lowest), both behind one event after dZ; the caller's stream waits for both
 * before it goes on (the next chunk overwrites dZ). dH must get the SMs first: dW's persistent
 * CTAs, once resident, keep their SMs until its tile counter runs dry, and priority never
 * pre-empts them. With dH on the side stream and dW next in the caller's (v18), dW won: a kernel
 * next in its own stream starts the moment its predecessor ends, one behind an event a little
 * later. With dH next in the caller's stream and dW behind the event (v23) dH usually won, but not
 * always: 512×4096×128256 took 2.4 or 2.9 ms from run to run (H100, session 6). Behind the same
 * event, the block scheduler takes the higher priority's CTAs first, and dW's take the SMs dH
 * leaves.
 *
 * Under tp_overlap the dH rows' reduction follows dH on the side stream, and dW is split
 * (run_dw_split) so that NCCL's kernel finds SMs: its second launch follows the reduction. */
static flce_status run_dh_dw_at_once(run *r, const block *rows_step, const block *cols_step)
{
    int reduce = reduce_beside_dw(r, rows_step), late = reduce ? r->pl->tp_overlap_sms : 0;
    TRY(ctx_fill_stream(r->ctx));
    TRY(ctx_side_stream(r->ctx));
    if (late) TRY(zero_tile_counter(r)); /* before the forks: both dW launches come after it */
    TRY(fork_to(r, r->ctx->side));
    TRY(fork_to(r, r->ctx->fill));
    CUstream caller = r->stream;
    r->stream = r->ctx->side;
    flce_status st = run_dh(r, rows_step);
    if (st == FLCE_OK && reduce) st = reduce_dh(r, rows_step); /* (r->stream is the side stream) */
    r->stream = r->ctx->fill;
    if (st == FLCE_OK) st = run_dw_split(r, cols_step, late);
    r->stream = caller;
    flce_status joined = side_join(r);
    return st != FLCE_OK ? st : joined;
}

/* dZ of one block and the gradient GEMMs that consume it. `rows_step` and `cols_step` carry the
 * accumulation state (first/last) of the outputs indexed by rows (dH) and by vocab columns (dW,
 * db): token chunks complete their dH rows at once and build dW up; vocab chunks the reverse. */
flce_status run_grads(run *r, const block *rows_step, const block *cols_step)
{
    /* dZ: written by recompute's logits pass (fused_dz), the row-scaled logits themselves (qrows:
     * flce_qscale writes the labels' entries, dH and dW apply s_i), or the dz pass */
    if (r->pl->qrows) {
        TRY(run_rows(r, K_QSCALE, rows_step));
        if (r->t->grad_weight) { /* the chunk rows by label, for flce_qdw after dW */
            TRY(run_rows(r, K_QLIST_COUNT, rows_step));
            TRY(run_rows(r, K_QLIST_FILL, rows_step));
        }
    } else if (!r->pl->fused_dz) {
        TRY(run_rows(r, K_DZ, rows_step));
    }
    return run_grad_gemms(r, rows_step, cols_step);
}

flce_status run_grad_gemms(run *r, const block *rows_step, const block *cols_step)
{
    if (r->pl->concurrent_grads && r->t->grad_hidden && r->t->grad_weight) {
        TRY(run_dh_dw_at_once(r, rows_step, cols_step));
        if (r->p->has_bias && r->t->grad_bias) TRY(run_rows(r, K_DBIAS, cols_step));
        return FLCE_OK;
    }
    if (r->t->grad_hidden) TRY(run_dh(r, rows_step));
    if (r->t->grad_hidden && reduce_beside_dw(r, rows_step)) {
        /* dW beside the reduction (run_dw_split); the next chunk's dZ waits for both launches */
        int late = r->t->grad_weight && r->pl->dw_dynamic ? r->pl->tp_overlap_sms : 0;
        if (late) TRY(zero_tile_counter(r));
        TRY(overlap_dh(r, rows_step));
        if (r->t->grad_weight) TRY(run_dw_split(r, cols_step, late));
        if (late) TRY(side_join(r));
    } else if (r->t->grad_weight) {
        TRY(run_dw(r, cols_step));
    }
    if (r->p->has_bias && r->t->grad_bias) TRY(run_rows(r, K_DBIAS, cols_step));
    return FLCE_OK;
}
