/* plan.c — strategy, chunking, vocab splits and workspace layout of a call (plan.h, docs/DESIGN.md §3):
 * a pure function of its arguments (no environment, no file: plan_make.c binds it to those). */
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "error.h"
#include "params.h"
#include "plan.h"

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

static uint64_t take(uint64_t *cursor, uint64_t bytes)
{
    uint64_t at = *cursor;
    *cursor = align256(*cursor + bytes);
    return at;
}

/* Which per-token outputs the kernels must produce: all of them when planning the worst case. */
static int wants(const flce_tensors *t, const void *field) { return !t || field != NULL; }

static void plan_specs(const flce_problem *p, const flce_tensors *t, int sm, const flce_config *cfg, plan *pl)
{
    kernel_spec base;
    memset(&base, 0, sizeof base);
    base.sm = sm;
    base.dtype = p->dtype;
    base.hidden = p->hidden;
    base.vocab_shard = p->vocab_shard;
    base.label_bits = p->label_bits;
    base.reduction = FLCE_REDUCTION_MEAN; /* GEMMs do not depend on it: one canonical spec */
    pl->logits = pl->dh = pl->dw = pl->rowops = base;
    pl->logits.role = ROLE_LOGITS;
    pl->dh.role = ROLE_DH;
    pl->dw.role = ROLE_DW;
    pl->rowops.role = ROLE_ROWOPS;
    pl->logits.tile = spec_tile_pick(sm, p->dtype, ROLE_LOGITS, cfg->tiles);
    pl->dh.tile = spec_tile_pick(sm, p->dtype, ROLE_DH, cfg->tiles);
    pl->dw.tile = spec_tile_pick(sm, p->dtype, ROLE_DW, cfg->tiles);
    /* FLCE_PORTABLE=1 keeps Hopper on the mma.sync path (comparisons, a fallback). */
    if (cfg->portable) {
        /* the portable tile of the other arches (the one sm_86/89 take); never wgmma, TMA or tcgen05 */
        int psm = sm == 90 || sm == 100 ? 89 : sm;
        pl->logits.tile = spec_tile_pick(psm, p->dtype, ROLE_LOGITS, cfg->tiles);
        pl->dh.tile = spec_tile_pick(psm, p->dtype, ROLE_DH, cfg->tiles);
        pl->dw.tile = spec_tile_pick(psm, p->dtype, ROLE_DW, cfg->tiles);
    }

    unsigned opts = 0;
    if (p->has_bias) opts |= SPEC_OPT_BIAS;
    if (p->has_class_weights) opts |= SPEC_OPT_WEIGHTS;
    if (p->label_smoothing > 0) opts |= SPEC_OPT_ZSUM;
    if (wants(t, t ? t->entropy : NULL)) opts |= SPEC_OPT_ENTROPY;
    if (wants(t, t ? t->argmax : NULL)) opts |= SPEC_OPT_ARGMAX;
    /* per-token upstream gradients: the rowops kernels only (they form dZ) */
    unsigned token_grads = (unsigned)(p->grad_outputs & 15) << SPEC_OPT_TOKEN_GRADS_SHIFT;
    float temperature = p->temperature == 1.0f ? 0.0f : p->temperature; /* 0 = off */
    /* The logits GEMM needs the weights only for the weighted Σ w·z of smoothing. */
    pl->logits.opts = opts & ~(p->label_smoothing > 0 ? 0u : (unsigned)SPEC_OPT_WEIGHTS);
    pl->logits.softcap = p->softcap;
    pl->logits.temperature = temperature;
    pl->rowops.opts = opts | token_grads;
    pl->rowops.reduction = p->reduction;
    pl->rowops.softcap = p->softcap;
    pl->rowops.temperature = temperature;
    pl->rowops.smoothing = p->label_smoothing;
    pl->rowops.z_loss = p->z_loss;
}

/* CTAs of the logits kernel that fit on one SM at once: shared memory (the opt-in limit plus the
 * 1 KiB the driver keeps per CTA, against the SM's capacity, which exceeds the limit by that
 * KiB) and threads. */
static int64_t logits_ctas_per_sm(const kernel_spec *s)
{
    int64_t smem = (int64_t)spec_smem_bytes(s) + 1024, cap = (int64_t)spec_smem_limit(s->sm) + 1024;
    int64_t by_smem = smem > 0 ? cap / smem : 1, by_threads = 2048 / spec_threads(s);
    int64_t k = by_smem < by_threads ? by_smem : by_threads;
    if (s->tile.loop == MAINLOOP_MMA_SYNC) {
        /* mma.sync / FFMA: registers bound it too. ptxas gives the logits kernels about 120
         * registers beside the accumulators (248 at 64×64 warp tiles, issue 19), of the SM's 64 Ki. */
        int64_t acc = (int64_t)(s->tile.bm / s->tile.warps_m) * (s->tile.bn / s->tile.warps_n) / 32;
        int64_t regs = acc + 120 < 255 ? acc + 120 : 255;
        int64_t by_regs = 65536 / (regs * spec_threads(s));
        if (by_regs < k) k = by_regs;
    }
    return k > 0 ? k : 1;
}

void plan_vocab_splits(const plan *pl, int64_t rows, int64_t cols, int num_sms, int *splits,
                       int *tiles_per_split)
{
    /* Every CTA walks tiles_per_split tiles, so the pass takes ceil(CTAs / slots) rounds of that
     * many tiles. The old rule (about two waves of CTAs) left a third, mostly idle wave at
     * 8192 × 4096 × 128256 (320 CTAs on 132 SMs: 80 % of the SMs' time used); the split count
     * that minimizes rounds × tiles_per_split wastes a few percent at most (bench/NOTES.md).
     * Fewer splits win ties: less partial-statistics traffic. Capped so the partials stay small. */
    enum { MAX_SPLITS = 64 };
    int64_t tiles = ceil_div(cols, pl->logits.tile.bn);
    int64_t row_blocks = ceil_div(rows, pl->logits.tile.bm);
    if (pl->logits.cluster > 1) row_blocks = ceil_div(row_blocks, pl->logits.cluster) * pl->logits.cluster;
    int64_t slots = (int64_t)(num_sms > 0 ? num_sms : 1) * logits_ctas_per_sm(&pl->logits);
    int64_t best_cost = -1, best_tps = tiles;
    for (int64_t want = 1; want <= tiles && want <= MAX_SPLITS; want++) {
        int64_t tps = ceil_div(tiles, want), sp = ceil_div(tiles, tps);
        int64_t cost = ceil_div(row_blocks * sp, slots) * tps;
        if (best_cost < 0 || cost < best_cost) best_cost = cost, best_tps = tps;
    }
    if (best_tps < 1) best_tps = 1;
    *tiles_per_split = (int)best_tps;
    *splits = (int)ceil_div(tiles, best_tps);
}

/* Cuts `total` into chunks of at most `fit` (a multiple of `unit` when at least one unit fits),
 * balanced so the last chunk is not a sliver. */
static int64_t balanced_chunk(int64_t total, int64_t fit, int64_t unit)
{
    if (fit >= total) return total;
    if (fit < unit) return fit;
    fit -= fit % unit;
    int64_t chunks = ceil_div(total, fit);
    int64_t balanced = ceil_div(ceil_div(total, chunks), unit) * unit;
    return balanced < fit ? balanced : fit;
}

static flce_status budget_error(uint64_t budget, uint64_t need, const char *what)
{
    return err_set(FLCE_ERR_INVALID_ARGUMENT,
                   "memory_budget=%llu bytes: too small for one %s of logits (%llu bytes needed)",
                   (unsigned long long)budget, what, (unsigned long long)need);
}

uint64_t plan_tp_block_bytes(int64_t rows)
{
    return (uint64_t)(FLCE_TP_HEADER + rows * FLCE_TP_RECORD) * 4;
}

/* The persistent dH/dW kernels walk their tiles in groups of PLAN_RASTER_ROWS row blocks, row
 * blocks fastest (templates/gemm_entry.cu, tile_origin): CTAs launched next to each other, which stay
 * close in k, then share the larger B tile in L2. Measured on an H100 (bench/NOTES.md v10): dH
 * DRAM traffic 72 % → 39 % of peak, loss+grad 54.5 → 51.3 ms at 8192×4096×128256, 63.7 → 61.1 at
 * 8192×2304×256000. FLCE_DEV=raster=G overrides (0: column tiles fastest, the old order): config's
 * raster_rows. */

/* The Hopper wgmma main loop fed by TMA (not tcgen05, which shares its pipeline): the only path
 * with clusters, the dW tile counter and the staged 16-bit store. */
static int hopper_tma(const kernel_spec *s) { return s->tile.loop == MAINLOOP_WGMMA_TMA; }

/* The logits pass in 2-CTA clusters, the pair's two row blocks sharing W's tile (each CTA loads
 * half and multicasts it: a third fewer operand bytes asked of L2 per tile, as cuBLAS's 2x1
 * clusters): FLCE_DEV=logits_cluster=1 always, 0 never, unset where its launches have
 * PLAN_LOGITS_CLUSTER_MIN_BLOCKS row blocks or more. Only on the wgmma TMA path.
 * Measured on an H100 (bench/NOTES.md v45): 8192×4096×128256 AUTO 36.3-36.6 vs 36.7-38.6 ms, its
 * logits kernel 12.4-12.6 vs 12.7-13.0; 32768 tokens forward 48.1 vs 52.2; 512 tokens even. */
static void plan_logits_cluster(const flce_config *cfg, int64_t rows, plan *pl)
{
    int want = cfg->logits_cluster == 1 ||
               (cfg->logits_cluster < 0 && ceil_div(rows, pl->logits.tile.bm) >= PLAN_LOGITS_CLUSTER_MIN_BLOCKS);
    pl->logits.cluster = want && hopper_tma(&pl->logits) ? 2 : 0;
}

/* FLCE_DEV=cluster=2 (plan.h cluster): the dH/dW specs on the wgmma TMA path (after the tune table)
 * take 2-CTA clusters with the B tile multicast; other paths (tcgen05, cp.async, mma.sync) ignore it. */
static void plan_cluster(const flce_config *cfg, plan *pl)
{
    pl->cluster = cfg->cluster == 2 ? 2 : 0;
    kernel_spec *grads[2] = {&pl->dh, &pl->dw};
    for (int i = 0; i < 2; i++) grads[i]->cluster = hopper_tma(grads[i]) ? pl->cluster : 0;
}

/* With FLCE_DEV cluster unset, dW alone in 2-CTA clusters where its k, the one token chunk, is short: a
 * 128×256 tile then loads nearly as many operand bytes as it multiplies (K = 512: 128 KB of dZ and
 * 256 KB of H per tile, L2 ~70 % busy) and the pair's shared H tile comes once, by multicast.
 * 512×4096×128256 on an H100: dW 0.87-0.88 ms against 0.89-0.92 (bench/NOTES.md session 14, d1).
 * Not with several chunks (dW's tile counter lets it fill dH's tails there), TP (the counter again,
 * for the overlap), or tuned tiles (measured as they are). */
#define PLAN_DW_CLUSTER_MAX_ROWS 1024
static void plan_dw_cluster(const flce_config *cfg, plan *pl)
{
    int64_t k = pl->recompute ? pl->n : pl->chunk_rows, launches = pl->recompute ? pl->n_vchunks : pl->n_chunks;
    if (cfg->cluster < 0 && hopper_tma(&pl->dw) && !pl->tiles_tuned && k <= PLAN_DW_CLUSTER_MAX_ROWS && launches == 1 &&
        pl->tp <= 1)
        pl->dw.cluster = 2;
}

/* Whether the chunked strategy may store compact logits: a training call (the statistics pass
 * writes the exact target logit the label's dZ needs) with 16-bit inputs. Softcap with label
 * smoothing is left out: its dZ needs every z, also where p̃ underflowed to 0. */
static int compact_options(const flce_problem *p, const flce_config *cfg)
{
    return cfg->compact && p->dtype != FLCE_DTYPE_F32 && !(p->softcap > 0 && p->label_smoothing > 0);
}
static int compact_allowed(const flce_problem *p, const flce_config *cfg, const plan *pl)
{
    return pl->op == FLCE_OP_LOSS_AND_GRAD && compact_options(p, cfg);
}

/* Whether a compact chunked plan stores its logits row-scaled (plan.h qrows): where dz is s_i times
 * exp(z − c_i) but at the label, in bf16 on the wgmma TMA logits pass. The vocab is this call's
 * whole, or a TP shard whose statistics this call gathers (collective, no SP): each rank then
 * keeps its own references c_i (flce_qref samples its shard), flce_qscale runs after the combine
 * with the global lse, and only the rank that holds a label takes its exact terms (its dH term
 * into the fp32 dH part that the ranks sum). */
static int qrows_allowed(const flce_problem *p, const flce_config *cfg, const plan *pl)
{
    int64_t total = p->vocab_total ? p->vocab_total : p->vocab_offset + p->vocab_shard;
    int whole = pl->tp <= 1 ? p->vocab_offset == 0 && total == p->vocab_shard : pl->collective && !pl->sp;
    /* (batch_invariant: the row-scaled store sums a row's statistics against its own reference,
     * taken only in chunks of 1e8 logits or more, so a token's bits would depend on N) */
    if (p->batch_invariant) return 0;
    /* (entropy's dz is not linear in p: it needs the dz pass) */
    return cfg->qrows != 0 && pl->compact && !pl->recompute && p->dtype == FLCE_DTYPE_BF16 && hopper_tma(&pl->logits) &&
           !(p->grad_outputs & FLCE_GRAD_ENTROPY) &&
           !p->has_bias && p->label_smoothing == 0 && !(p->softcap > 0) && p->z_loss == 0 && whole &&
           pl->tile_cols % 8 == 0;
}

/* The default budget of a compact chunked plan with its own dW. Fewer token chunks are faster: each chunk beyond the first reads and rewrites the V×D fp32 dW
 * accumulator (8 bytes per element; 16 chunks at 32768×4096×128256 move ~64 GB) and launches a dH
 * of fewer tiles. So the block grows:
 *  - to all tokens when their logits take no more than the default block plus the accumulator one
 *    chunk makes unnecessary: less memory and no accumulator traffic (8192×4096×128256 on an
 *    H100: 2.0 GiB instead of 2.5, 40.6 ms instead of 43.3; bench/NOTES.md v14);
 *  - else up to the device's share pl->mem_cap (1/16 of its memory; 0 = unknown, no growth) for
 *    the whole workspace: all tokens if they fit in it (8192×2304×256000: one 4.0 GiB block,
 *    45.2 ms, instead of 8 chunks in 2.7 GiB, 54–62 ms; NOTES session 6), else the largest block
 *    that leaves room for the accumulator.
 * pl->grown says the cap was used, so that a failed allocation can fall back to the lean plan.
 * Under TP every rank must cut its tokens alike (each chunk is one all-gather): only the first rule,
 * which depends on the shape alone (v_rows: an even shard of the global vocab), applies; the
 * device's memory could differ between ranks. 8192×4096×128256 at tp = 2 then runs one chunk
 * instead of two (4 × H200: 21.1 ms against 19.9 for the shard alone, the second chunk's dW
 * accumulator and all-gather). */
static uint64_t grown_budget(plan *pl, uint64_t budget, uint64_t all_rows, int64_t v_rows)
{
    uint64_t acc = (uint64_t)v_rows * (uint64_t)pl->d * 4;
    if (all_rows <= budget + acc) return all_rows;
    if (pl->tp > 1) return budget;
    if (pl->mem_cap >= all_rows) return pl->grown = 1, all_rows;
    if (pl->mem_cap > acc && pl->mem_cap - acc > budget) return pl->grown = 1, pl->mem_cap - acc;
    return budget;
}

/* SAVED (flce.h): all N tokens' compact logits (all_rows bytes) in one block, held from the forward
 * to the backward, within the caller's budget or else the default rule of grown_budget: the 512 MiB
 * block plus the dW accumulator one chunk makes unnecessary, or the device's share mem_cap. */
static flce_status saved_fits(const flce_problem *p, const plan *pl, uint64_t budget, uint64_t all_rows,
                              int64_t v_rows)
{
    if (!pl->compact && p->dtype == FLCE_DTYPE_F32)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.strategy=SAVED: needs 16-bit inputs (compact logits), "
                       "dtype=%d; use RECOMPUTE", (int)p->dtype);
    if (!pl->compact && !(p->softcap > 0 && p->label_smoothing > 0))
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.strategy=SAVED: needs compact logits, switched off by "
                       "FLCE_DEV=compact=0; use RECOMPUTE");
    if (!pl->compact) /* (compact_allowed: that dZ needs every z, also where p̃ underflows to 0) */
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.strategy=SAVED: not with both softcap=%g and "
                       "label_smoothing=%g (they need fp32 logits, not the compact ones SAVED keeps); use "
                       "RECOMPUTE or CHUNKED", (double)p->softcap, (double)p->label_smoothing);
    uint64_t acc = (uint64_t)v_rows * (uint64_t)pl->d * 4, cap = budget;
    if (!p->memory_budget) {
        cap = budget + acc;
        if (pl->mem_cap > cap) cap = pl->mem_cap;
    }
    if (all_rows > cap)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.strategy=SAVED: the compact logits of all %lld tokens take %llu bytes, more than "
                       "the %s %llu; use RECOMPUTE, fewer tokens per call, or a larger memory_budget",
                       (long long)pl->n, (unsigned long long)all_rows,
                       p->memory_budget ? "memory_budget" : "default budget's", (unsigned long long)cap);
    return FLCE_OK;
}

static flce_status plan_chunks(const flce_problem *p, const flce_config *cfg, plan *pl)
{
    uint64_t budget = p->memory_budget ? p->memory_budget : PLAN_DEFAULT_BUDGET;
    /* Under TP every rank must cut the tokens alike (each chunk is one all-gather), so the chunk
     * rows follow from an even shard of the global vocab, not this rank's: a rank with a larger
     * shard uses proportionally more than the budget. */
    int64_t v_rows = pl->tp > 1 ? ceil_div(p->vocab_total, pl->tp) : pl->v;
    uint64_t es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    uint64_t per_elem = 4 + (es == 4 ? 0 : 2); /* fp32 Z + dZ in the dtype */
    pl->fused_dz = pl->recompute && cfg->fused_dz; /* FLCE_DEV=fused_dz=0: Z store + dz pass */
    if (pl->fused_dz) per_elem = es; /* dZ only */
    if (pl->recompute) {
        uint64_t per_col = (uint64_t)pl->n * per_elem;
        if (budget < per_col * 8) return budget_error(budget, per_col * 8, "8-column vocab chunk");
        int64_t cols = (int64_t)(budget / per_col);
        pl->chunk_cols = balanced_chunk(pl->v, cols - cols % 8, pl->logits.tile.bn);
        pl->n_vchunks = ceil_div(pl->v, pl->chunk_cols);
        pl->chunk_rows = pl->n, pl->n_chunks = 1;
    } else {
        int64_t ld = ceil_div(v_rows, 8) * 8;
        pl->compact = compact_allowed(p, cfg, pl); /* FLCE_DEV=compact=0: fp32 Z store */
        pl->tile_cols = pl->logits.tile.bn / pl->logits.tile.warps_n; /* one warp tile's width */
        pl->tile_max_ld = pl->compact ? ceil_div(ceil_div(pl->v, 8) * 8, pl->tile_cols) : 0;
        uint64_t per_row = (uint64_t)ld * per_elem;
        if (pl->compact) per_row = (uint64_t)ld * 2 + (uint64_t)ceil_div(ld, pl->tile_cols) * 4;
        if (budget < per_row) return budget_error(budget, per_row, "token's row");
        /* Under TP the unit is fixed too: ranks with different (tuned) tiles must still agree. */
        int64_t unit = pl->tp > 1 ? 128 : pl->logits.tile.bm;
        if (pl->saved) {
            TRY(saved_fits(p, pl, budget, (uint64_t)pl->n * per_row, v_rows));
            budget = (uint64_t)pl->n * per_row;
        } else if (!p->memory_budget && pl->compact && !p->accumulate_grad_weight) {
            budget = grown_budget(pl, budget, (uint64_t)pl->n * per_row, v_rows);
        }
        pl->chunk_rows = balanced_chunk(pl->n, (int64_t)(budget / per_row), unit);
        pl->n_chunks = ceil_div(pl->n, pl->chunk_rows);
        pl->chunk_cols = pl->v, pl->n_vchunks = 1;
        /* (its per-row arrays, s ⊙ H among them, come on top of the budget, as the accumulators) */
        pl->qrows = qrows_allowed(p, cfg, pl) &&
                    (cfg->qrows > 0 || pl->chunk_rows * pl->v >= PLAN_QROWS_MIN_LOGITS);
        pl->qdh = pl->qrows && cfg->qdh;
    }
    pl->ldz = ceil_div(pl->chunk_cols, 8) * 8;
    return FLCE_OK;
}

/* AUTO's cost model of a loss-and-grad plan, in milliseconds on an H100 (the ratio between plans is
 * what matters; other GPUs scale both alike). Each GEMM pass runs at PLAN_GEMM_RATE, stretched by
 * the wave quantization of dH's tiles (its grid is the smallest: a chunk's rows × D); the bytes
 * beyond the GEMMs' operands move at PLAN_DRAM_RATE, none of them hidden:
 *   chunked    3 passes; per logit 2 (compact p̃) or 4 (fp32 Z) bytes stored, read and overwritten
 *              by dZ; the fp32 dW accumulator written, re-read and re-written once per chunk
 *   recompute  4 passes (3 from a saved lse: flce_backward); dZ written (2 bytes); the fp32 dH
 *              accumulator once per vocab chunk
 * Against the H100 (bench/NOTES.md v11, predicted / measured, ms): 8192×4096×128256 chunked 46.8 /
 * 43.0, recompute 54.4 / 50.7; 8192×2304×256000 (1024-row chunks) 72.6 / 64.4 vs 63.4 / 62.2;
 * 4096×2048×32000 2.76 / 2.60 vs 3.42 / 3.16; 512×4096×128256 3.50 / 3.64 vs 4.2 / 4.3: the same
 * winner as measured on every shape. */
#define PLAN_GEMM_RATE 650e12 /* FLOP/s of one flce GEMM pass back to back, bf16 */
#define PLAN_DRAM_RATE 3.0e12 /* bytes/s read + written */
/* dH's time per output column at 192 and 128 wide, relative to 256 (plan_dh_width), from dH's
 * in-run times at 8192×4096×128256 on an H100 (bench/NOTES.md v36): 12.9 and 17.7 ms against
 * 12.0, less the waves' share of the difference */
#define PLAN_DH_COST_192 1.05
#define PLAN_DH_COST_128 1.45

static double wave_stretch(int64_t tiles, int num_sms)
{
    int64_t sms = num_sms > 0 ? num_sms : 1;
    return tiles > 0 ? (double)(ceil_div(tiles, sms) * sms) / (double)tiles : 1.0;
}

/* Bytes of an fp32 accumulator of `elems` values built over `steps` passes and rounded once to the
 * 16-bit output (caller_f32: the caller's fp32 buffer, read and written by every pass). */
static double acc_bytes(double elems, int64_t steps, int caller_f32)
{
    if (caller_f32) return elems * 8 * (double)steps;
    return steps > 1 ? elems * (8.0 * (double)steps - 6) : 0;
}

/* Whether dW should run beside dH on the fill stream (FLCE_DEV grad_streams): where the call makes more
 * than one dH launch, or its one launch leaves over 10 % of the SMs' time idle in its last wave.
 * Measured on an H100 (bench/NOTES.md v23): 8 launches of 72 tiles (8192×2304×256000, chunked)
 * -7.5 ms, 8 launches of 576 (recompute) -2.8 ms; one launch of 1024 tiles, 3 % idle
 * (8192×4096×128256), +0.3-0.6 ms: there the two GEMMs only share L2. */
static int grads_overlap(const plan *pl, int num_sms)
{
    int64_t launches = pl->recompute ? pl->n_vchunks : pl->n_chunks;
    int64_t rows = pl->recompute ? pl->n : pl->chunk_rows;
    int64_t tiles = ceil_div(rows, pl->dh.tile.bm) * ceil_div(pl->d, pl->dh.tile.bn);
    if (pl->dh_splits > 1) tiles *= pl->dh_splits; /* its units */
    return pl->grad_streams_wanted && (launches > 1 || wave_stretch(tiles, num_sms) > 1 / 0.9);
}

double plan_estimate_ms(const flce_problem *p, const plan *pl, int num_sms)
{
    /* Under TP every rank must make the same choice: an even shard stands in for this rank's. */
    int64_t v_rows = pl->tp > 1 ? ceil_div(p->vocab_total, pl->tp) : pl->v;
    int64_t vchunks = pl->recompute ? ceil_div(v_rows, pl->chunk_cols) : 1;
    double n = (double)pl->n, v = (double)v_rows, d = (double)pl->d, ldz = (double)(ceil_div(v_rows, 8) * 8);
    double pass = 2 * n * v * d / PLAN_GEMM_RATE;
    int64_t dh_rows = pl->recompute ? pl->n : pl->chunk_rows;
    int64_t dh_tiles = ceil_div(dh_rows, pl->dh.tile.bm) * ceil_div(pl->d, pl->dh.tile.bn);
    if (pl->dh_splits > 1) dh_tiles *= pl->dh_splits; /* (its units; known once the plan is made) */
    /* recompute's own forward pass only in a training call: backward starts from the saved lse */
    int forward_pass = pl->recompute && pl->op == FLCE_OP_LOSS_AND_GRAD;
    /* dH's idle SMs are dW's when the two run at once */
    double stretch = grads_overlap(pl, num_sms) ? 1.0 : wave_stretch(dh_tiles, num_sms);
    double passes = 2 + forward_pass + stretch, bytes;
    if (pl->recompute) {
        bytes = n * ldz * 2 + acc_bytes(n * d, vchunks, p->accumulate_grad_hidden) +
                (p->accumulate_grad_weight ? v * d * 8 : 0);
    } else {
        bytes = n * ldz * (pl->qrows ? 2 : pl->compact ? 6 : 10) + acc_bytes(v * d, pl->n_chunks, p->accumulate_grad_weight) +
                (p->accumulate_grad_hidden ? n * d * 8 : 0);
    }
    return 1e3 * (pass * passes + bytes / PLAN_DRAM_RATE);
}

/* The smallest budget any plan of a loss-and-grad call accepts: one token row (chunked) or all
 * tokens × 8 columns (recompute), whichever is less. */
static flce_status no_plan_fits(const flce_problem *p, const flce_config *cfg, const plan *pl)
{
    uint64_t budget = p->memory_budget ? p->memory_budget : PLAN_DEFAULT_BUDGET;
    int64_t v_rows = pl->tp > 1 ? ceil_div(p->vocab_total, pl->tp) : pl->v, ld = ceil_div(v_rows, 8) * 8;
    uint64_t row = (uint64_t)ld * 2 + 4 * (uint64_t)ceil_div(ld, pl->logits.tile.bn / pl->logits.tile.warps_n);
    if (!compact_allowed(p, cfg, pl)) row = (uint64_t)ld * (p->dtype == FLCE_DTYPE_F32 ? 4 : 6);
    uint64_t cols8 = (uint64_t)pl->n * 8 * (p->dtype == FLCE_DTYPE_F32 ? 4 : 2);
    return err_set(FLCE_ERR_INVALID_ARGUMENT,
                   "memory_budget=%llu bytes: too small for any strategy; the smallest that works is %llu "
                   "bytes (chunked needs %llu for one token's row of logits, recompute %llu for all tokens "
                   "x 8 vocab columns)", (unsigned long long)budget, (unsigned long long)(row < cols8 ? row : cols8),
                   (unsigned long long)row, (unsigned long long)cols8);
}

/* Chunks of the forced strategy, or AUTO's choice: the plan (chunked or recompute) that fits the
 * budget and has the smaller estimate. */
static flce_status plan_auto(const flce_problem *p, int num_sms, const flce_config *cfg, plan *pl)
{
    /* (per-token upstream gradients: the chunked rowops form dZ; recompute's logits pass does not) */
    if (p->strategy != FLCE_STRATEGY_AUTO || p->grad_outputs) return plan_chunks(p, cfg, pl);
    plan chunked = *pl, recompute = *pl;
    recompute.recompute = 1;
    int ok_c = plan_chunks(p, cfg, &chunked) == FLCE_OK, ok_r = plan_chunks(p, cfg, &recompute) == FLCE_OK;
    err_clear();
    if (!ok_c && !ok_r) return no_plan_fits(p, cfg, &chunked);
    double est_c = ok_c ? plan_estimate_ms(p, &chunked, num_sms) : 0;
    double est_r = ok_r ? plan_estimate_ms(p, &recompute, num_sms) : 0;
    *pl = ok_c && (!ok_r || est_c <= est_r) ? chunked : recompute;
    pl->est_chunked_ms = est_c, pl->est_recompute_ms = est_r;
    return FLCE_OK;
}

/* Sequence parallelism: the all-gathered inputs, and every per-token output for all tokens (this
 * rank's rows are copied out at the end). */
static void plan_sp_layout(const flce_problem *p, const flce_tensors *t, plan *pl, uint64_t *cur)
{
    uint64_t n = (uint64_t)pl->n;
    int none = p->reduction == FLCE_REDUCTION_NONE, stats = pl->op != FLCE_OP_BACKWARD;
    pl->off_sp_hidden = take(cur, n * (uint64_t)pl->d * (p->dtype == FLCE_DTYPE_F32 ? 4 : 2));
    pl->off_sp_labels = take(cur, n * (uint64_t)(p->label_bits / 8));
    /* (SAVED: whether or not this call names grad_output; its forward usually does not, and both
     * calls must share the layout: python test_tp found the backward reading the entropy it kept
     * from a shifted offset) */
    if (none && pl->op != FLCE_OP_FORWARD && (pl->saved || wants(t, t ? t->grad_output : NULL)))
        pl->off_sp_go = take(cur, n * 4);
    if (pl->op == FLCE_OP_BACKWARD) pl->off_sp_lse = take(cur, n * 4);
    /* by the problem's bits, not the pointers: a SAVED forward and its backward share this layout */
    for (int k = 0; k < SP_GRADS && pl->op != FLCE_OP_FORWARD; k++)
        if (p->grad_outputs & (1 << k)) pl->off_sp_grads[k] = take(cur, n * 4);
    if (!stats) return;
    const void *given[SP_OUTPUTS] = {NULL};
    if (t) {
        given[SP_LSE] = t->lse, given[SP_LOSS] = none ? t->loss : NULL;
        given[SP_LOSS_PER_TOKEN] = t->loss_per_token, given[SP_ZLOSS] = none ? t->z_loss_out : NULL;
        given[SP_LOGPROB] = t->target_logprob, given[SP_ENTROPY] = t->entropy, given[SP_ARGMAX] = t->argmax;
    }
    for (int k = 0; k < SP_OUTPUTS; k++)
        if (!t || given[k]) pl->off_sp_out[k] = take(cur, n * (k == SP_ARGMAX ? 8 : 4));
}

static void plan_layout(const flce_problem *p, const flce_tensors *t, plan *pl)
{
    int grads = pl->op != FLCE_OP_FORWARD;
    int stats = pl->op != FLCE_OP_BACKWARD; /* forward statistics (lse, loss) are computed */
    int reduced = p->reduction != FLCE_REDUCTION_NONE;
    pl->need_lse = stats && (!t || !t->lse);
    pl->need_loss_rows = stats && (!t || (reduced ? !t->loss_per_token : (!t->loss && !t->loss_per_token)));
    pl->need_zloss_rows = stats && p->z_loss > 0 && reduced && (!t || t->z_loss_out);
    int caller_dw = p->accumulate_grad_weight, caller_dh = p->accumulate_grad_hidden;
    int f32 = p->dtype == FLCE_DTYPE_F32;
    pl->need_dw_acc = grads && !pl->recompute && pl->n_chunks > 1 && !f32 && !caller_dw && !pl->dz_all_rows &&
                      !pl->dw_in_dtype && (!t || t->grad_weight);
    /* With collectives, dH always builds up in fp32 (need_dh_tp): it is summed across ranks
     * before it is rounded once. */
    pl->need_dh_tp = grads && pl->collective && (!t || t->grad_hidden);
    int dw_counter_ok = hopper_tma(&pl->dw) && pl->dw.cluster == 0;
    pl->tp_overlap = pl->overlap_wanted && pl->need_dh_tp && (!t || t->grad_weight) && dw_counter_ok;
    pl->concurrent_grads = grads_overlap(pl, pl->num_sms) && grads && dw_counter_ok &&
                           (!t || (t->grad_hidden && t->grad_weight));
    pl->dw_dynamic = pl->tp_overlap || pl->concurrent_grads;
    /* A vocab range too long for one launch's fp32 sum (PLAN_DH_K_SLICE): the whole shard of a
     * chunked call, recompute's vocab chunk. dH in slices. */
    int64_t k_max = pl->dh_k_slice_max, k = pl->recompute ? pl->chunk_cols : pl->v;
    pl->dh_k_slice = grads && k_max > 0 && k > k_max ? k_max : 0;
    pl->need_dh_acc = grads && ((pl->recompute && pl->n_vchunks > 1) || pl->dh_k_slice) && !f32 && !caller_dh &&
                      !pl->need_dh_tp && (!t || t->grad_hidden);
    pl->need_db_acc = grads && p->has_bias && pl->n_chunks > 1 && (!t || t->grad_bias);
    /* Statistics arrays hold the rows of one forward pass: all tokens (forward, recompute) or one
     * token chunk (chunked loss-and-grad). */
    pl->stat_rows = stats ? (pl->op == FLCE_OP_FORWARD || pl->recompute ? pl->n : pl->chunk_rows) : 0;

    uint64_t cur = 0, rows = (uint64_t)pl->stat_rows, sp = (uint64_t)pl->splits;
    unsigned o = pl->logits.opts;
    pl->off_stats = take(&cur, 16);
    if (stats) {
        pl->off_target = take(&cur, rows * 4);
        pl->off_part_m = take(&cur, rows * sp * 4);
        pl->off_part_s = take(&cur, rows * sp * 4);
        if (o & SPEC_OPT_ENTROPY) pl->off_part_t = take(&cur, rows * sp * 4);
        if (o & SPEC_OPT_ZSUM) pl->off_part_zs = take(&cur, rows * sp * 4);
        if (o & SPEC_OPT_ARGMAX) pl->off_part_arg = take(&cur, rows * sp * 8);
    }
    uint64_t n = (uint64_t)pl->n;
    if (pl->need_loss_rows) pl->off_loss_rows = take(&cur, n * 4);
    if (pl->need_zloss_rows) pl->off_zloss_rows = take(&cur, n * 4);
    if (pl->need_lse) pl->off_lse = take(&cur, n * 4);
    if (grads) {
        uint64_t chunk_elems = (uint64_t)pl->chunk_rows * (uint64_t)pl->ldz;
        if (pl->fused_dz) {
            pl->off_dz = take(&cur, chunk_elems * (f32 ? 4 : 2));
        } else if (pl->compact) { /* fp16 p̃, turned into dZ in place, and the maxima */
            pl->off_z = pl->off_dz = take(&cur, (pl->dz_all_rows ? n * (uint64_t)pl->ldz : chunk_elems) * 2);
            pl->off_tile_max = take(&cur, (uint64_t)pl->chunk_rows * (uint64_t)pl->tile_max_ld * 4);
            if (pl->qrows) {
                uint64_t r = (uint64_t)pl->chunk_rows;
                pl->off_qref = take(&cur, r * 4);
                pl->off_qflags = take(&cur, r * 4);
                pl->off_row_scale = take(&cur, r * 4);
                pl->off_qh = take(&cur, r * (uint64_t)pl->d * 2);
                pl->off_qlab = take(&cur, r * 8);
                pl->off_qlist_start = take(&cur, ((uint64_t)pl->v + 1) * 4);
                pl->off_qlist_tok = take(&cur, r * 4);
                pl->off_qlist_blk = take(&cur, (uint64_t)ceil_div(pl->v, 128) * 4);
            }
        } else {
            pl->off_z = take(&cur, chunk_elems * 4);
            pl->off_dz = f32 ? pl->off_z : take(&cur, (pl->dz_all_rows ? n * (uint64_t)pl->ldz : chunk_elems) * 2);
        }
        if (pl->need_dw_acc) pl->off_dw_acc = take(&cur, (uint64_t)pl->v * (uint64_t)pl->d * 4);
        /* recompute: every token's dH builds up over the vocab chunks; chunked: one token chunk's */
        if (pl->need_dh_acc)
            pl->off_dh_acc = take(&cur, (pl->recompute ? n : (uint64_t)pl->chunk_rows) * (uint64_t)pl->d * 4);
        if (pl->need_db_acc) pl->off_db_acc = take(&cur, (uint64_t)pl->v * 4);
        if (pl->need_dh_tp) pl->off_dh_tp = take(&cur, n * (uint64_t)pl->d * 4);
        if (pl->dh_splits > 1)
            pl->off_dh_split = take(&cur, (uint64_t)pl->dh_splits * (uint64_t)(pl->recompute ? pl->n : pl->chunk_rows) *
                                              (uint64_t)pl->d * 4);
        if (pl->dw_dynamic) pl->off_tile_counter = take(&cur, 8);
    }
    if (pl->collective && stats) {
        pl->tp_block_bytes = plan_tp_block_bytes(pl->stat_rows);
        pl->off_tp_send = take(&cur, pl->tp_block_bytes);
        pl->off_tp_recv = take(&cur, pl->tp_block_bytes * (uint64_t)pl->tp);
    }
    if (pl->sp) plan_sp_layout(p, t, pl, &cur);
    pl->workspace_bytes = cur;
}

/* The dH/dW epilogue each kernel needs (spec plain_out, red_acc): plain where every launch writes
 * a complete 16-bit tile with no addend (launch_grads.c set_output: no caller fp32 buffer, no workspace
 * accumulator, no TP fp32 dH), so the kernel leaves out the fp32 and partial-tile stores. */
static void plan_grad_stores(const flce_problem *p, plan *pl)
{
    int bits16 = p->dtype != FLCE_DTYPE_F32;
    kernel_spec *dh = &pl->dh, *dw = &pl->dw;
    int dh_plain = bits16 && !pl->need_dh_tp && !p->accumulate_grad_hidden && !pl->need_dh_acc && pl->dh_splits <= 1;
    int dw_plain = bits16 && !p->accumulate_grad_weight && !pl->need_dw_acc && !pl->dw_in_dtype;
    dh->plain_out = dh_plain && hopper_tma(dh) && pl->d % dh->tile.bn == 0;
    dw->plain_out = dw_plain && hopper_tma(dw) && pl->d % dw->tile.bn == 0;
    int red = pl->bulk_red ? 1 : 2;
    dh->red_acc = pl->red_acc && !dh->plain_out ? red : 0;
    dw->red_acc = pl->red_acc && !dw->plain_out ? red : 0;
}

/* plan_dz_all_rows and plan_dw_in_dtype: a chunked 16-bit plan with gradients laid out again with
 * dW built up one of their ways (collective: where `collective_ok`). */
static flce_status relay_dw(const flce_problem *p, const flce_tensors *t, plan *pl, int all_rows, int in_dtype,
                            int collective_ok, const char *who)
{
    if (pl->op == FLCE_OP_FORWARD || pl->recompute || pl->qrows || pl->fused_dz ||
        (pl->collective && !collective_ok) || p->dtype == FLCE_DTYPE_F32 || p->accumulate_grad_weight)
        return err_set(FLCE_ERR_INTERNAL, "%s: not a chunked 16-bit plan with gradients (a planning bug)", who);
    pl->dz_all_rows = all_rows, pl->dw_in_dtype = in_dtype, pl->off_dw_acc = 0;
    plan_layout(p, t, pl);
    plan_grad_stores(p, pl);
    return FLCE_OK;
}

flce_status plan_dz_all_rows(const flce_problem *p, const flce_tensors *t, plan *pl)
{
    return relay_dw(p, t, pl, 1, 0, 0, "plan_dz_all_rows");
}

flce_status plan_dw_in_dtype(const flce_problem *p, const flce_tensors *t, plan *pl)
{
    return relay_dw(p, t, pl, 0, 1, 1, "plan_dw_in_dtype");
}

/* dH's tile width on the wgmma TMA path. dH's output is only tokens × D, so its 128×256 tiles may
 * come in few waves with an idle tail: 576 tiles at 8192×2304 fill 4.36 waves of 132 SMs, the last
 * 36 % full (dH 1.115× cuBLAS there, bench/NOTES.md session 9); 64 tiles at 512 tokens leave half
 * the SMs idle. A narrower tile moves more bytes per FLOP ((128 + bn) / bn per column) for fuller
 * waves. Cost per width: waves × bn × its column cost (PLAN_DH_COST_*), and a narrower width only
 * where it saves over 2 %. Measured (H100, v36): 8192×2304×256000 AUTO 45.3 → 44.8 ms (192 wide),
 * 512×4096×128256 2.90 → 2.55 ms (128 wide). One launch only: where dH makes several (token or
 * vocab chunks), dW already fills their tails (grads_overlap) and narrow tiles measured slower
 * (8192×4096×128256 at 128 MiB, 16 launches: 57.4–58.8 → 63.0–63.9 ms, the runs' minima).
 * FLCE_DEV dh_bn forces a width; tuned tiles stay. */
static double dh_col_cost(int bn) { return bn >= 256 ? 1.0 : bn >= 192 ? PLAN_DH_COST_192 : PLAN_DH_COST_128; }

/* dH's one launch split over its k (plan.h dh_splits) where its tiles would fill under half the SMs:
 * S units per 256-wide tile, each over k / S vocab columns into an fp32 slab, summed after (about
 * 12 bytes per dH element more: 16 MiB at 512×4096 with S = 2). A wider tile at full rate instead
 * of a narrow one: 512×4096×128256 on an H100 (d1 of bench/NOTES.md session 14) ran dH 128 wide
 * (128 tiles) at 855 µs and cuBLAS its split-K 256×128 tiles at 758 µs, at ncu's locked clock.
 * Cost per split count as plan_dh_width's: waves of units / S, ties to fewer splits; a forced
 * FLCE_DEV dh_splits is taken as long as every split keeps 64 columns. Only one dH launch (no token or
 * vocab chunks, no k slices), no TP, no cluster, and with row-scaled logits only where flce_qdh
 * adds the labels' terms. */
static void plan_dh_splits(const flce_config *cfg, int num_sms, plan *pl, int64_t blocks, int64_t launches)
{
    int64_t k = pl->v; /* the one launch's vocab columns */
    int64_t k_max = pl->dh_k_slice_max;
    pl->dh_splits = 0, pl->dh_split_k = 0;
    if (cfg->dh_splits == 0 || cfg->dh_splits == 1 || !hopper_tma(&pl->dh) || pl->dh.cluster || launches != 1 ||
        pl->tp > 1 || (pl->qrows && !pl->qdh) || pl->dh.dtype == FLCE_DTYPE_F32 ||
        (k_max > 0 && k > k_max) || num_sms <= 0)
        return;
    int64_t tiles = blocks * ceil_div(pl->d, pl->dh.tile.bn);
    int best = 1;
    if (cfg->dh_splits > 1) {
        best = k / cfg->dh_splits >= 64 ? cfg->dh_splits : 1;
    } else if (2 * tiles <= num_sms) {
        double best_cost = (double)ceil_div(tiles, num_sms);
        for (int s = 2; s <= PLAN_DH_SPLITS_MAX && k / s >= PLAN_DH_SPLIT_MIN_K; s++) {
            double cost = (double)ceil_div(tiles * s, num_sms) / s;
            if (cost < best_cost) best_cost = cost, best = s;
        }
    }
    if (best < 2) return;
    pl->dh_split_k = ceil_div(ceil_div(k, best), 64) * 64;
    pl->dh_splits = (int)ceil_div(k, pl->dh_split_k); /* (no empty split) */
}

static void plan_dh_width(const flce_config *cfg, int num_sms, plan *pl)
{
    if (!hopper_tma(&pl->dh) || pl->tiles_tuned || num_sms <= 0) return;
    int64_t rows = pl->recompute ? pl->n : pl->chunk_rows, blocks = ceil_div(rows, pl->dh.tile.bm);
    int64_t launches = pl->recompute ? pl->n_vchunks : pl->n_chunks;
    int best = pl->dh.tile.bn;
    if (pl->dh.tile.bn == 256 && !cfg->dh_bn) {
        plan_dh_splits(cfg, num_sms, pl, blocks, launches);
        if (pl->dh_splits) return;
    }
    if (cfg->dh_bn) {
        best = cfg->dh_bn;
    } else if (pl->dh.tile.bn == 256 && launches == 1) {
        static const int widths[] = {256, 192, 128};
        double best_cost = 0;
        for (int i = 0; i < 3; i++) {
            int64_t tiles = blocks * ceil_div(pl->d, widths[i]);
            double cost = (double)ceil_div(tiles, num_sms) * widths[i] * dh_col_cost(widths[i]);
            if (i == 0 || cost < best_cost * 0.98) best_cost = cost, best = widths[i];
        }
    }
    if (best == pl->dh.tile.bn) return;
    kernel_spec s = pl->dh;
    s.tile.bn = best;
    if (spec_validate(&s) != FLCE_OK) { /* e.g. a forced width the path does not take: keep 256 */
        err_clear();
        return;
    }
    pl->dh.tile.bn = best;
}

/* The plan up to its tiles: specs with the built-in tiles and the knobs config gives. */
void plan_start(const flce_problem *p, flce_op op, int sm, const flce_config *cfg, const flce_tensors *t, plan *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->op = op;
    pl->recompute = op != FLCE_OP_FORWARD && p->strategy == FLCE_STRATEGY_RECOMPUTE;
    pl->saved = op == FLCE_OP_LOSS_AND_GRAD && p->strategy == FLCE_STRATEGY_SAVED;
    pl->tp = p->tp_size, pl->rank = p->tp_rank;
    pl->collective = p->tp_size > 1 && (!t || t->comm);
    pl->sp = p->tp_size > 1 && p->sequence_parallel;
    pl->n_local = p->tokens;
    pl->n = pl->sp ? p->tokens * p->tp_size : p->tokens;
    pl->d = p->hidden, pl->v = p->vocab_shard;
    plan_specs(p, t, sm, cfg, pl);
    pl->raster_rows = cfg->raster_rows;
    pl->red_acc = cfg->red_acc, pl->bulk_red = cfg->bulk_red;
    pl->dh_k_slice_max = cfg->dh_k_slice;
    /* Where dH's plain fp32 all-reduce would apply, the two ways of doing it with fewer bytes. */
    int plain_all_reduce = pl->collective && !pl->sp && !p->accumulate_grad_hidden && p->dtype != FLCE_DTYPE_F32;
    pl->dh_reduce_16bit = plain_all_reduce && cfg->tp_dh_16bit;
    pl->dh_gather16 = plain_all_reduce && cfg->tp_dh_gather16 && !pl->dh_reduce_16bit;
    pl->overlap_wanted = cfg->tp_overlap;
    pl->tp_overlap_sms = cfg->tp_overlap_sms;
    pl->grad_streams_wanted = cfg->grad_streams;
}

/* FLCE_DEV logits_persist (plan.h logits_persist): the statistics pass on the wgmma TMA path with one
 * CTA per SM may walk its items in persistent CTAs: there the loop stores each item's statistics
 * straight from the warp that owns its rows (one warp column), with tcgen05 left out, and without
 * the entropy and argmax statistics (the loop's registers made that kernel spill;
 * templates/gemm_entry.cu LOGITS_PERSIST). */
static void plan_logits_persist(const flce_config *cfg, plan *pl)
{
    pl->logits_persist = cfg->logits_persist && hopper_tma(&pl->logits) &&
                         pl->logits.tile.warps_n == 1 && logits_ctas_per_sm(&pl->logits) == 1 &&
                         !(pl->logits.opts & (SPEC_OPT_ENTROPY | SPEC_OPT_ARGMAX));
}

/* FLCE_DEV logits_splits: the statistics pass's split count forced (at most one per vocab tile). */
static void plan_forced_splits(int want, plan *pl)
{
    int64_t tiles = ceil_div(pl->v, pl->logits.tile.bn);
    if (want > tiles) want = (int)tiles;
    pl->tiles_per_split = (int)ceil_div(tiles, want);
    pl->splits = (int)ceil_div(tiles, pl->tiles_per_split);
}

/* problem.batch_invariant (flce.h): what a token's statistics depend on made independent of the
 * call. The online (max, sum) of a row runs over its vocab split's tiles in order and the combine
 * merges the splits in order, so the splits are fixed by V alone (PLAN_INVARIANT_SPLIT_COLS each);
 * every 16-bit logits pass takes the compact pass's exp and per-warp-tile maxima (gemm_logits.cu:
 * a forward then computes what a chunked or saved call's statistics pass does, storing nothing);
 * the tile is the built-in one (a tune table entry is per token bucket). The row-scaled store is
 * off (qrows_allowed). */
static int sm_of(const plan *pl) { return pl->logits.sm; }
static void plan_invariant_logits(const flce_problem *p, int sm, const flce_config *cfg, plan *pl)
{
    if (pl->tiles_tuned) {
        pl->logits.tile = spec_tile_pick(sm, p->dtype, ROLE_LOGITS, cfg->tiles);
        if (cfg->portable && (sm == 90 || sm == 100))
            pl->logits.tile = spec_tile_pick(89, p->dtype, ROLE_LOGITS, cfg->tiles);
    }
    /* (Only where a chunked call of these options stores compact logits: with softcap and label
     * smoothing it stores fp32 Z, through the plain kernel, which every pass then takes; forcing the
     * compact kernel there wrote p̃ over that fp32 store and its maxima through a null pointer:
     * fuzz_binding.py seed 21 cases 369 and 402, an illegal address on an H200, 2026-11-28.) */
    if (compact_options(p, cfg) && !(pl->recompute && !pl->fused_dz)) pl->logits.compact = 1;
    int64_t tiles = ceil_div(pl->v, pl->logits.tile.bn), per = PLAN_INVARIANT_SPLIT_COLS / pl->logits.tile.bn;
    pl->tiles_per_split = (int)(per > 0 ? (per < tiles ? per : tiles) : 1);
    pl->splits = (int)ceil_div(tiles, pl->tiles_per_split);
}

/* The rest, once the tiles are final (built-in or tuned). */
flce_status plan_finish(const flce_problem *p, flce_op op, int num_sms, const flce_config *cfg,
                        const flce_tensors *t, plan *pl)
{
    plan_cluster(cfg, pl);
    pl->num_sms = num_sms;
    if (op == FLCE_OP_FORWARD) {
        pl->chunk_rows = pl->n, pl->n_chunks = 1;
        pl->chunk_cols = pl->v, pl->n_vchunks = 1;
        pl->ldz = ceil_div(pl->v, 8) * 8;
    } else {
        TRY(plan_auto(p, num_sms, cfg, pl));
        plan_dh_width(cfg, num_sms, pl);
        plan_dw_cluster(cfg, pl);
    }
    /* The statistics pass sees all tokens (forward, and the forward half of recompute) or one
     * token chunk, always over the whole shard. */
    int64_t stat_rows = op == FLCE_OP_FORWARD || pl->recompute ? pl->n : pl->chunk_rows;
    plan_logits_cluster(cfg, stat_rows, pl);
    if (pl->compact) { /* the chunked pass's only logits kernel, always over the whole shard */
        pl->logits.compact = 1;
        pl->logits.qrows = pl->qrows;
        pl->logits.full_tiles = cfg->full_tiles && pl->v % pl->logits.tile.bn == 0;
    }
    if (pl->fused_dz) {
        pl->logits_dz = pl->logits; /* the same (possibly tuned) tile */
        pl->logits_dz.fused_dz = 1;
        /* dZ needs w_y whenever there are weights; entropy and argmax are the statistics pass's */
        pl->logits_dz.opts = (pl->logits.opts & (SPEC_OPT_BIAS | SPEC_OPT_ZSUM)) |
                             (p->has_class_weights ? (unsigned)SPEC_OPT_WEIGHTS : 0u);
        /* mean and sum compile alike (the scalar is applied by the dH/dW epilogues): one spec */
        pl->logits_dz.reduction = p->reduction == FLCE_REDUCTION_NONE ? FLCE_REDUCTION_NONE : FLCE_REDUCTION_MEAN;
        pl->logits_dz.smoothing = p->label_smoothing;
        pl->logits_dz.z_loss = p->z_loss;
    }
    plan_vocab_splits(pl, stat_rows, pl->v, num_sms, &pl->splits, &pl->tiles_per_split);
    if (cfg->logits_splits > 0) plan_forced_splits(cfg->logits_splits, pl);
    if (p->batch_invariant) plan_invariant_logits(p, sm_of(pl), cfg, pl);
    plan_logits_persist(cfg, pl);
    pl->logits_group = cfg->logits_group;
    plan_layout(p, t, pl);
    if (op != FLCE_OP_FORWARD) plan_grad_stores(p, pl);
    return FLCE_OK;
}

flce_status plan_build(const flce_problem *p, flce_op op, int sm, int num_sms, const flce_config *cfg,
                       const spec_tile *tuned, const flce_tensors *t, plan *pl)
{
    plan_start(p, op, sm, cfg, t, pl);
    if (tuned) pl->logits.tile = tuned[0], pl->dh.tile = tuned[1], pl->dw.tile = tuned[2], pl->tiles_tuned = 1;
    return plan_finish(p, op, num_sms, cfg, t, pl);
}
