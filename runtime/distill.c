/* distill.c — the distillation call's plan and run, below distill_api.c's checks.
 *
 * The GEMMs are the CE path's tuned kernels (issue 44; v1's plain fp32 GEMM ran at 58x the cuBLAS
 * floor, bench/NOTES.md session 23). Per token chunk:
 *   z_t/T = Ht·Wtᵀ/T and z_s/T = Hs·Wsᵀ/T stored in fp32 with their per-split statistics (max,
 *     Σ exp) by the logits kernel of a chunked CE plan at temperature T with the compact store off
 *     (launch_store_logits),
 *   flce_distill_row (templates/distill.cu): both log-normalizers from those statistics, D_i,
 *     loss_i and dZs in the dtype (× g_i), one read of each row (forward KL) or two,
 *   dHs = dZs·Ws and dWs += dZsᵀ·Hs (launch_grads.c run_grad_gemms: the CE path's dH and dW with
 *     their accumulation rules, dH beside dW on two streams), or on 16-bit inputs in several chunks
 *     where it takes no more memory than dWs's fp32 accumulator, dHs alone, dZs kept for every
 *     token and dWs once after the last chunk; or, where a memory_budget holds neither, dWs added
 *     into the caller's dW in the dtype chunk by chunk (dw_schedule; the compact paths too),
 * then the loss reduced in a fixed order (flce_distill_reduce). The CE plan is made for a problem
 * with reduction none, so its GEMM epilogues scale nothing: g_i is in dZs already. Forward KL on
 * 16-bit inputs takes the compact path instead (plan_compact; the teacher as top-k:
 * plan_topk_compact): fp16 p̃ stores, the row kernels named there. Under tensor parallelism each
 * chunk adds an all-gather of the shards' statistics and an all-reduce of the divergence's sums
 * (tp_merge_stats, then tp_divergence on the compact paths, tp_fp32_sums on the fp32 one), and dHs
 * is summed over the ranks as the CE path's. */
#include "distill.h"

#include <string.h>

#include "config.h"
#include "context.h"
#include "driver.h"
#include "error.h"
#include "launch.h"
#include "comm.h"
#include "launch_grads.h"
#include "launch_tp.h"
#include "log.h"

enum { DISTILL_THREADS = 256 };
enum { DK_COUNT = 0, DK_ROW = 1, DK_REDUCE = 2, DK_LSE = 4, DK_ROW_COMPACT = 5, DK_ROW_TOPK = 6, DK_ROW_TOPK_COMPACT = 7,
       DK_TOPK_SORT = 8, DK_TP_PACK = 9, DK_TP_MERGE = 10, DK_TP_OUT = 11 }; /* emit.c distill_names */
/* templates/distill.cu: one rank's all-gather block, FLCE_TP_HEADER (params.h) + DISTILL_TP_RECORD words a row */
static uint64_t tp_block_bytes(uint64_t rows) { return 4 * (FLCE_TP_HEADER + rows * 4); }

/* the sparse target's lists (spec.h) hold a top-k teacher's ids, the most it may give */
_Static_assert(DISTILL_TOPK_MAX == SPEC_SPARSE_K, "DISTILL_TOPK_MAX and SPEC_SPARSE_K differ");

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }

/* The CE problem whose chunked plan runs one model's GEMMs. */
static void ce_problem(const flce_distill_problem *p, int64_t hidden, uint64_t budget, flce_problem *q)
{
    flce_problem_init(q);
    q->tokens = p->tokens, q->hidden = hidden, q->vocab_shard = p->vocab, q->dtype = p->dtype;
    q->label_bits = p->label_bits, q->reduction = FLCE_REDUCTION_NONE, q->ignore_index = p->ignore_index;
    q->strategy = FLCE_STRATEGY_CHUNKED, q->memory_budget = budget;
    if (p->tp_size > 1) /* (the whole vocab otherwise: the CE plan as before, bit for bit) */
        q->vocab_offset = p->vocab_offset, q->vocab_total = p->vocab_total, q->tp_rank = p->tp_rank,
        q->tp_size = p->tp_size;
}

/* What the CE planner is told the call has: the gradients asked for (both when t is NULL: the worst
 * case) and no per-token outputs. A NULL tensors would plan the worst case of those too (entropy and
 * argmax statistics, whose arrays the logits passes would then write). Planning reads only which
 * pointers are set. */
static void planned_tensors(const flce_distill_tensors *t, int tp, flce_tensors *ts, flce_tensors *tt)
{
    static char mark; /* a non-NULL address that is never dereferenced */
    flce_tensors_init(ts);
    ts->hidden = ts->weight = ts->labels = &mark;
    ts->grad_hidden = t ? t->grad_student_hidden : (void *)&mark;
    ts->grad_weight = t ? t->grad_student_weight : (void *)&mark;
    ts->loss = (float *)&mark; /* reduction none: the CE loss output, which no pass writes here */
    *tt = *ts;
    tt->grad_hidden = tt->grad_weight = NULL;
    /* TP: the student's plan sums dHs over the ranks (need_dh_tp: its fp32 part in the workspace) */
    if (tp > 1) ts->comm = &mark;
}

/* The CE plans a path runs on: the student's, and the teacher's where its GEMM runs, each for a
 * problem at the call's temperature (the logits passes store and sum z/T, so the row kernels'
 * log-probabilities are at T as they stand) with `budget` for its chunk. */
static flce_status plan_models(const flce_distill_problem *p, const call_device *dev, const flce_distill_tensors *t,
                               const flce_config *cfg, uint64_t budget, int teacher, distill_plan *pl)
{
    ce_problem(p, p->hidden_student, budget, &pl->student_problem);
    ce_problem(p, p->hidden_teacher, budget, &pl->teacher_problem);
    pl->student_problem.temperature = pl->teacher_problem.temperature = p->temperature;
    flce_tensors ts, tt;
    planned_tensors(t, p->tp_size, &ts, &tt);
    TRY(plan_make_cfg(&pl->student_problem, FLCE_OP_LOSS_AND_GRAD, dev->name, dev->sm, dev->num_sms, 0, cfg, &ts,
                      &pl->student));
    if (teacher)
        TRY(plan_make_cfg(&pl->teacher_problem, FLCE_OP_LOSS_AND_GRAD, dev->name, dev->sm, dev->num_sms, 0, cfg, &tt,
                          &pl->teacher));
    return FLCE_OK;
}

/* Forward KL (JSD at β = 0 is one: emit.c) on 16-bit inputs: the compact path. */
static int compact_divergence(const flce_distill_problem *p)
{
    return p->divergence == FLCE_DIVERGENCE_FORWARD_KL || (p->divergence == FLCE_DIVERGENCE_JSD && p->beta <= 0.0f);
}

/* How dWs builds up over several token chunks on 16-bit inputs. By default the student's dZs of
 * every token kept (plan_dz_all_rows; on the compact paths the p̃ that becomes dZs in place) so that
 * dWs runs once over all of them after the last chunk, straight into the dtype, where that takes no
 * more workspace than the fp32 V × Ds accumulator and the one chunk's dZs it replaces ((N − chunk
 * rows)·V·2 ≤ V·Ds·4 bytes); else that accumulator (the CE plan's). Accumulating dWs chunk by chunk
 * (fp32 stores, bulk reductions, then the dtype) cost a reverse KL step at 8192×4096×128256 in 3
 * chunks 15.9 ms of dW against 12.4 in one launch (bench/NOTES.md session 31), and forward KL at
 * 8192×2048×151936 (teacher 4096) in 2 chunks 10.6 against 6.9 (session 32). `in_dtype`
 * (distill_plan_make: a memory_budget that holds neither): each chunk's dWs added into the caller's
 * dW in the dtype (plan_dw_in_dtype), no buffer beyond the chunk's. Under TP the accumulator
 * (dWs beside dHs's all-reduce: launch_grads.c; the budget: distill_plan_make). */
static flce_status dw_schedule(const flce_distill_problem *p, const flce_distill_tensors *t, int in_dtype,
                               distill_plan *pl)
{
    plan *s = &pl->student;
    if (s->n_chunks <= 1 || !s->need_dw_acc) return FLCE_OK; /* (need_dw_acc: 16-bit, dWs asked for) */
    flce_tensors ts, tt;
    planned_tensors(t, p->tp_size, &ts, &tt);
    if (p->tp_size > 1) return FLCE_OK;
    if (in_dtype) return plan_dw_in_dtype(&pl->student_problem, &ts, s);
    plan all = *s;
    TRY(plan_dz_all_rows(&pl->student_problem, &ts, &all));
    if (all.workspace_bytes <= s->workspace_bytes) *s = all;
    return FLCE_OK;
}

/* A compact path's budget holds one token's fp16 p̃ and group maxima (64-column groups at most) of
 * `models` models (2: student and teacher, 1: the student alone), or a status naming it. */
static flce_status compact_budget_check(const flce_distill_problem *p, uint64_t budget, int models)
{
    const uint64_t ld = (uint64_t)(p->vocab + 7) / 8 * 8, row = (uint64_t)models * (ld * 2 + (ld + 63) / 64 * 4);
    if (budget < row)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.memory_budget=%llu bytes: too small for one token's logits of %s (%llu bytes at "
                       "vocab=%lld)", (unsigned long long)budget, models == 2 ? "both models" : "the student",
                       (unsigned long long)row, (long long)p->vocab);
    return FLCE_OK;
}

/* TP's buffers (distill.h) from *cur on, for chunks of `rows` tokens (the row sums' all-reduce
 * buffer where `sums`); nothing without TP. */
static void tp_layout(const flce_distill_problem *p, uint64_t rows, int sums, distill_plan *pl, uint64_t *cur)
{
    if (p->tp_size <= 1) return;
    pl->tp = p->tp_size;
    pl->tp_send_offset = *cur, *cur = align256(*cur + tp_block_bytes(rows));
    pl->tp_recv_offset = *cur, *cur = align256(*cur + tp_block_bytes(rows) * (uint64_t)p->tp_size);
    pl->lse_s_offset = *cur, *cur = align256(*cur + rows * 4);
    pl->x_offset = *cur, *cur = align256(*cur + rows * 4);
    if (sums) pl->aw_offset = *cur, *cur = align256(*cur + rows * 8);
}

/* The compact forward-KL plan (distill.h), or FLCE_ERR_UNSUPPORTED when the two CE plans do not
 * give it (then the fp32 path runs: not an error the caller sees). 4 bytes per logit: both p̃, dZs
 * in the student's. */
static flce_status plan_compact(const flce_distill_problem *p, const call_device *dev, const flce_distill_tensors *t,
                                uint64_t budget, int in_dtype, distill_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    const uint64_t ld = (uint64_t)(p->vocab + 7) / 8 * 8;
    TRY(compact_budget_check(p, budget, 2));
    flce_config cfg = *config_get();
    cfg.qrows = 0; /* the compact fp16 p̃ (the soft-target sums read the teacher's) */
    TRY(plan_models(p, dev, t, &cfg, budget / 2, 1, pl));
    const plan *s = &pl->student, *te = &pl->teacher;
    /* the soft-target sums read the teacher's p̃ where the student's own sits: same groups */
    if (!s->compact || !te->compact || s->recompute || s->qrows || te->qrows || s->tile_cols != te->tile_cols ||
        s->tile_max_ld != te->tile_max_ld || s->ldz != (int64_t)ld || te->ldz != (int64_t)ld ||
        (s->logits.opts | te->logits.opts) & ~(unsigned)SPEC_OPT_BIAS || s->off_z != s->off_dz)
        return FLCE_ERR_UNSUPPORTED;
    TRY(dw_schedule(p, t, in_dtype, pl));
    pl->student.logits.opts |= SPEC_OPT_SOFT;
    TRY(spec_validate(&pl->student.logits));
    pl->compact = 1;
    pl->ld = (int64_t)ld;
    pl->chunk_rows = s->chunk_rows, pl->chunks = s->n_chunks;
    const uint64_t rows = (uint64_t)pl->chunk_rows, n = (uint64_t)p->tokens;
    uint64_t cur = align256(s->workspace_bytes);
    pl->pt_offset = cur, cur = align256(cur + rows * ld * 2);
    pl->teacher_tile_max = cur, cur = align256(cur + rows * (uint64_t)te->tile_max_ld * 4);
    const uint64_t parts = rows * (uint64_t)te->splits * 4;
    pl->teacher_part_m = cur, cur = align256(cur + parts);
    pl->teacher_part_s = cur, cur = align256(cur + parts);
    pl->teacher_target = cur, cur = align256(cur + rows * 4);
    pl->lse_t_offset = cur, cur = align256(cur + rows * 4);
    pl->part_xs_offset = cur, cur = align256(cur + rows * (uint64_t)s->splits * 4);
    tp_layout(p, rows, 1, pl, &cur);
    pl->labels_offset = cur, cur = align256(cur + ((!t || !t->labels) ? n * 8 : 0));
    pl->per_token_offset = cur, cur = align256(cur + n * 4);
    pl->count_offset = cur, cur += 16;
    pl->workspace_bytes = cur;
    return FLCE_OK;
}

/* The teacher as top-k on 16-bit inputs: the student's compact CE pass alone (2 bytes per logit: p̃,
 * dZs written in its place) with the sparse target (its epilogue sums Σ_K p·z/T over the sorted
 * lists flce_distill_topk_sort makes; templates/distill.cu flce_distill_row_topk_compact), or
 * FLCE_ERR_UNSUPPORTED when its CE plan does not give it (then the fp32 path runs). */
static flce_status plan_topk_compact(const flce_distill_problem *p, const call_device *dev,
                                     const flce_distill_tensors *t, uint64_t budget, int in_dtype, distill_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    const uint64_t ld = (uint64_t)(p->vocab + 7) / 8 * 8;
    TRY(compact_budget_check(p, budget, 1));
    flce_config cfg = *config_get();
    cfg.qrows = 0; /* the compact fp16 p̃ with group maxima, which the row kernel reads */
    TRY(plan_models(p, dev, t, &cfg, budget, 0, pl));
    const plan *s = &pl->student;
    if (!s->compact || s->recompute || s->qrows || s->ldz != (int64_t)ld || s->logits.opts & ~(unsigned)SPEC_OPT_BIAS ||
        s->off_z != s->off_dz)
        return FLCE_ERR_UNSUPPORTED;
    TRY(dw_schedule(p, t, in_dtype, pl));
    pl->student.logits.opts |= SPEC_OPT_SPARSE;
    TRY(spec_validate(&pl->student.logits));
    pl->teacher.ldz = (int64_t)ld; /* (no teacher plan: its GEMM does not run) */
    pl->compact = 1, pl->topk = p->teacher_topk;
    pl->ld = (int64_t)ld;
    pl->chunk_rows = s->chunk_rows, pl->chunks = s->n_chunks;
    uint64_t cur = align256(s->workspace_bytes), n = (uint64_t)p->tokens, rows = (uint64_t)pl->chunk_rows;
    pl->sparse_ids_offset = cur, cur = align256(cur + rows * SPEC_SPARSE_K * 4);
    pl->sparse_p_offset = cur, cur = align256(cur + rows * SPEC_SPARSE_K * 4);
    pl->part_xs_offset = cur, cur = align256(cur + rows * (uint64_t)s->splits * 4);
    tp_layout(p, rows, 0, pl, &cur); /* (the row kernel forms D from the given lists: no second exchange) */
    pl->labels_offset = cur, cur = align256(cur + ((!t || !t->labels) ? n * 8 : 0));
    pl->per_token_offset = cur, cur = align256(cur + n * 4);
    pl->count_offset = cur, cur += 16;
    pl->workspace_bytes = cur;
    return FLCE_OK;
}

/* The plan of the path the call takes (compact, top-k compact or fp32) with `budget` for its token
 * chunks' logits, dWs built up as dw_schedule says. */
static flce_status plan_path(const flce_distill_problem *p, const call_device *dev, const flce_distill_tensors *t,
                             uint64_t budget, int in_dtype, distill_plan *pl)
{
    const int teacher = p->teacher_topk == 0; /* the teacher's GEMM runs (else its top-k is given) */
    if (p->dtype != FLCE_DTYPE_F32 && compact_divergence(p) && config_get()->compact) {
        flce_status st = teacher ? plan_compact(p, dev, t, budget, in_dtype, pl)
                                 : plan_topk_compact(p, dev, t, budget, in_dtype, pl);
        if (st != FLCE_ERR_UNSUPPORTED) return st;
        err_clear();
    }
    memset(pl, 0, sizeof *pl);
    const int f32 = p->dtype == FLCE_DTYPE_F32;
    const uint64_t ld = (uint64_t)(p->vocab + 7) / 8 * 8;
    const uint64_t student_row = ld * (f32 ? 4 : 6), row = student_row + (teacher ? ld * 4 : 0);
    if (budget < row)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.memory_budget=%llu bytes: too small for one token's logits of %s "
                       "(%llu bytes at vocab=%lld)", (unsigned long long)budget,
                       teacher ? "both models" : "the student", (unsigned long long)row, (long long)p->vocab);
    /* the student's share of the budget, so that its chunk rows are the rows the whole fits */
    const uint64_t student_budget = budget / row * student_row;
    flce_config cfg = *config_get();
    cfg.compact = 0, cfg.qrows = 0; /* the fp32 Z store: the row kernel reads plain logits */
    TRY(plan_models(p, dev, t, &cfg, student_budget, teacher, pl));
    if (!teacher) pl->teacher.ldz = (int64_t)ld; /* (no teacher plan: its GEMM does not run) */
    pl->topk = p->teacher_topk;
    if ((pl->student.logits.opts | pl->teacher.logits.opts) & ~(unsigned)SPEC_OPT_BIAS)
        return err_set(FLCE_ERR_INTERNAL, "distillation: a logits pass planned with statistics beyond (max, sum) "
                       "(opts 0x%x, 0x%x; a planning bug)", pl->student.logits.opts, pl->teacher.logits.opts);
    if (pl->student.recompute || pl->student.compact || pl->student.qrows || pl->student.ldz != (int64_t)ld ||
        pl->teacher.ldz != (int64_t)ld || !pl->student.off_z || !pl->student.off_part_m)
        return err_set(FLCE_ERR_INTERNAL, "distillation: the student's CE plan is not a plain chunked one "
                       "(recompute %d, compact %d, qrows %d, ldz %lld for %llu; a planning bug)",
                       pl->student.recompute, pl->student.compact, pl->student.qrows,
                       (long long)pl->student.ldz, (unsigned long long)ld);
    pl->ld = (int64_t)ld;
    pl->chunk_rows = pl->student.chunk_rows, pl->chunks = pl->student.n_chunks;
    TRY(dw_schedule(p, t, in_dtype, pl));
    uint64_t cur = align256(pl->student.workspace_bytes), n = (uint64_t)p->tokens;
    if (teacher) {
        pl->zt_offset = cur, cur = align256(cur + (uint64_t)pl->chunk_rows * ld * 4);
        const uint64_t parts = (uint64_t)pl->chunk_rows * (uint64_t)pl->teacher.splits * 4;
        pl->teacher_part_m = cur, cur = align256(cur + parts);
        pl->teacher_part_s = cur, cur = align256(cur + parts);
        pl->teacher_target = cur, cur = align256(cur + (uint64_t)pl->chunk_rows * 4);
    }
    if (p->tp_size > 1) { /* the shard's teacher lse, then the merged one (run_all) */
        if (teacher) pl->lse_t_offset = cur, cur = align256(cur + (uint64_t)pl->chunk_rows * 4);
        tp_layout(p, (uint64_t)pl->chunk_rows, 1, pl, &cur);
    }
    pl->labels_offset = cur, cur = align256(cur + ((!t || !t->labels) ? n * 8 : 0)); /* int64 or int32 */
    pl->per_token_offset = cur, cur = align256(cur + n * 4);
    pl->count_offset = cur, cur += 16;
    pl->workspace_bytes = cur;
    return FLCE_OK;
}

/* plan_path with the largest chunks' budget (to 1/1024) whose whole workspace fits in `cap`, or
 * FLCE_ERR_INVALID_ARGUMENT naming memory_budget where not even one token's chunk does. Below one
 * token's row plan_path refuses, and above it the workspace grows with the budget in steps of whole
 * chunk rows: budgets lie in three ranges in that order (too small, fits, too large), and a
 * bisection over them finds the top of the middle one. The first guess takes the excess off, which
 * is most often one step from the answer. */
static flce_status plan_within(const flce_distill_problem *p, const call_device *dev, const flce_distill_tensors *t,
                               uint64_t cap, int in_dtype, distill_plan *pl)
{
    flce_status st = plan_path(p, dev, t, cap, in_dtype, pl);
    if (st != FLCE_OK || pl->workspace_bytes <= cap) return st;
    uint64_t lo = 0, hi = cap, b = pl->workspace_bytes - cap < cap ? cap - (pl->workspace_bytes - cap) : cap / 2;
    uint64_t best = 0, took = pl->workspace_bytes;
    distill_plan trial;
    for (int round = 0; round < 64 && hi - lo > hi / 1024 + 1; round++) {
        st = plan_path(p, dev, t, b, in_dtype, &trial);
        if (st == FLCE_OK && trial.workspace_bytes <= cap) {
            best = b, lo = b, *pl = trial;
        } else if (st == FLCE_OK) {
            hi = b, took = trial.workspace_bytes;
        } else if (st == FLCE_ERR_INVALID_ARGUMENT) {
            lo = b; /* under one token's row */
        } else {
            return st;
        }
        err_clear();
        b = lo + (hi - lo) / 2;
    }
    if (best) return FLCE_OK;
    return err_set(FLCE_ERR_INVALID_ARGUMENT,
                   "problem.memory_budget=%llu bytes: too small for this call's workspace (its per-token arrays, "
                   "%s and at least one token's logits: %llu bytes at the least budget for the logits tried)",
                   (unsigned long long)cap, in_dtype ? "no dW buffer" : "dW's buffer", (unsigned long long)took);
}

/* A memory_budget given bounds the whole workspace: the plans whose dWs rounds once (dw_schedule's
 * default: every token's dZs or the fp32 accumulator beside the chunks) with their chunks cut to fit,
 * unless dWs added into the caller's dW per chunk (in_dtype) fits in at least two fewer chunks:
 * giving up the one rounding for one more chunk is not worth it, for more it is (a chunk's logits
 * and dHs launches each fill fewer waves). Without a budget, and under TP (where every rank must cut
 * the tokens alike, so the chunks cannot follow one rank's workspace), the budget is the chunks'
 * logits' (DISTILL_DEFAULT_BUDGET without one) and dWs's buffer comes on top. */
flce_status distill_plan_make(const flce_distill_problem *p, const call_device *dev,
                              const flce_distill_tensors *t, distill_plan *pl)
{
    if (!p->memory_budget || p->tp_size > 1)
        return plan_path(p, dev, t, p->memory_budget ? p->memory_budget : DISTILL_DEFAULT_BUDGET, 0, pl);
    flce_status st = plan_within(p, dev, t, p->memory_budget, 0, pl);
    if (st != FLCE_OK && st != FLCE_ERR_INVALID_ARGUMENT) return st;
    if (st == FLCE_OK && !pl->student.dz_all_rows && !pl->student.need_dw_acc) return st;
    distill_plan in_dtype;
    flce_status st2 = plan_within(p, dev, t, p->memory_budget, 1, &in_dtype);
    if (st2 != FLCE_OK || (st == FLCE_OK && pl->chunks <= in_dtype.chunks + 1)) {
        if (st == FLCE_OK) err_clear();
        return st == FLCE_OK ? FLCE_OK : st2;
    }
    err_clear();
    *pl = in_dtype;
    return FLCE_OK;
}

/* The module's spec: everything the row kernels are specialized on. */
static kernel_spec distill_spec(const flce_context *ctx, const flce_distill_problem *p, int has_labels)
{
    kernel_spec s;
    memset(&s, 0, sizeof s); /* the spec is a cache key by its bytes */
    s.sm = ctx->sm, s.dtype = p->dtype, s.role = ROLE_DISTILL, s.label_bits = p->label_bits;
    s.hidden = p->hidden_student, s.vocab_shard = p->vocab; /* for logs: the code does not depend on them */
    s.reduction = p->reduction, s.temperature = p->temperature;
    s.divergence = (int)p->divergence, s.beta = p->beta, s.ce_weight = p->ce_weight, s.has_labels = has_labels;
    return s;
}

/* Field for field templates/distill.cu's flce_distill_params (passed by value). */
typedef struct distill_row_args {
    unsigned long long zs, zt, dz, part_ms, part_ss, part_mt, part_st;
    unsigned long long labels, grad_output, divergence, loss_rows, loss, count;
    long long row0, rows, tokens, vocab, ignore_index, ld;
    int splits_s, splits_t;
    unsigned long long flag; /* the context's device flag (a label outside [0, V)) */
    unsigned long long pt, tile_ms, tile_mt, part_xs, target_s, lse_t; /* the compact path's */
    long long ld_tile;
    int tile_cols;
    unsigned long long tk_idx, tk_lp; /* the teacher's top-k (flce_distill_row_topk) */
    int topk;
    unsigned long long sp_ids, sp_p; /* the sorted (id, p) lists (flce_distill_topk_sort) */
    long long vocab_total;
    unsigned long long lse_s_rows, x_rows, tp_aw, tp_send, tp_recv; /* TP (flce_distill_tp_*) */
    long long vocab_offset;
    int tp_size, tp_sums;
} distill_row_args;

/* The two models' runs of the CE launch path over the workspace: the student's with its plan's
 * kernels and tensors (dH, dW into the caller's gradients), the teacher's with its logits kernel. */
typedef struct distill_runs {
    run student, teacher;
    flce_tensors ts, tt;
    CUfunction k[CTX_MAX_KERNELS]; /* the row kernels, DK_* */
} distill_runs;

/* The call's kernels, in load()'s order: the student plan's rowops, logits, dH, dW, the teacher's
 * logits (the module again when the teacher's top-k is given: no teacher pass runs), the row
 * kernels' module (s, which the caller owns). */
static void call_specs(const distill_plan *pl, const kernel_spec *s, const kernel_spec *all[6])
{
    all[0] = &pl->student.rowops, all[1] = &pl->student.logits, all[2] = &pl->student.dh, all[3] = &pl->student.dw;
    all[4] = pl->topk ? s : &pl->teacher.logits, all[5] = s;
}

typedef struct distill_call {
    const flce_distill_problem *p;
    const distill_plan *pl;
    const flce_distill_tensors *t;
} distill_call;

static flce_status run_all(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                           const flce_distill_tensors *t, CUdeviceptr ws, CUstream stream);

static flce_status run_body(flce_context *ctx, CUdeviceptr ws, CUstream stream, void *arg)
{
    const distill_call *c = arg;
    return run_all(ctx, c->p, c->pl, c->t, ws, stream);
}

/* Preparing loads the kernels of the tensors given, or of both variants the module has (with and
 * without labels: only whether labels are given shapes it). */
static flce_status prepare_body(flce_context *ctx, CUdeviceptr ws, CUstream stream, void *arg)
{
    (void)ws, (void)stream;
    const distill_call *c = arg;
    const int labels[2] = {c->t ? c->t->labels != NULL : 1, 0}, variants = c->t ? 1 : 2;
    for (int v = 0; v < variants; v++) {
        kernel_spec s = distill_spec(ctx, c->p, labels[v]);
        const kernel_spec *all[6];
        CUfunction fns[6][CTX_MAX_KERNELS];
        call_specs(c->pl, &s, all);
        TRY(ctx_kernels_many(ctx, all, 6, fns));
    }
    return FLCE_OK;
}

flce_status distill_prepare(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                            const flce_distill_tensors *t)
{
    CTX_LOG_SCOPE(ctx);
    distill_call c = {p, pl, t};
    return call_prepare(ctx, prepare_body, &c);
}

static flce_status load(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                        const flce_distill_tensors *t, CUdeviceptr ws, CUstream stream, distill_runs *d)
{
    kernel_spec s = distill_spec(ctx, p, t->labels != NULL);
    const kernel_spec *all[6];
    call_specs(pl, &s, all);
    CUfunction fns[6][CTX_MAX_KERNELS];
    TRY(ctx_kernels_many(ctx, all, 6, fns));
    memcpy(d->k, fns[5], sizeof d->k);
    const unsigned long long labels = t->labels ? addr(t->labels) : ws + pl->labels_offset;
    flce_tensors_init(&d->ts);
    d->ts.hidden = t->student_hidden, d->ts.weight = t->student_weight, d->ts.labels = (const void *)(uintptr_t)labels;
    d->ts.grad_hidden = t->grad_student_hidden, d->ts.grad_weight = t->grad_student_weight;
    d->ts.comm = t->comm; /* TP: the student run's dHs reduction (launch_tp.c) */
    flce_tensors_init(&d->tt);
    d->tt.hidden = t->teacher_hidden, d->tt.weight = t->teacher_weight, d->tt.labels = d->ts.labels;
    run *r = &d->student;
    memset(r, 0, sizeof *r);
    r->pl = &pl->student, r->p = &pl->student_problem, r->t = &d->ts, r->ctx = ctx, r->ws = ws, r->stream = stream;
    r->es = p->dtype == FLCE_DTYPE_F32 ? 4 : 2;
    memcpy(r->k.row, fns[0], sizeof r->k.row);
    r->k.logits = fns[1][0], r->k.dh = fns[2][0], r->k.dw = fns[3][0];
    r->rp.flag = ctx->flag_dev;
    d->teacher = *r;
    d->teacher.pl = &pl->teacher, d->teacher.p = &pl->teacher_problem, d->teacher.t = &d->tt;
    d->teacher.k.logits = fns[4][0], d->teacher.k.dh = d->teacher.k.dw = NULL;
    return FLCE_OK;
}

/* Grid of the one-thread-per-row kernels over a chunk of ra->rows rows. */
static int64_t row_blocks(const distill_row_args *ra) { return (ra->rows + DISTILL_THREADS - 1) / DISTILL_THREADS; }

/* TP's buffers in the row kernels' arguments (nothing without TP) */
static void tp_args(const flce_distill_problem *p, const distill_plan *pl, CUdeviceptr ws, distill_row_args *ra)
{
    if (!pl->tp) return;
    ra->tp_send = ws + pl->tp_send_offset, ra->tp_recv = ws + pl->tp_recv_offset;
    ra->lse_s_rows = ws + pl->lse_s_offset, ra->x_rows = ws + pl->x_offset;
    ra->tp_aw = pl->aw_offset ? ws + pl->aw_offset : 0;
    ra->vocab_offset = p->vocab_offset, ra->tp_size = pl->tp;
}

/* TP, after both logits passes of a chunk: every rank's (lse_s^r, lse_t^r, x_r) to every rank, merged
 * into the global lse's and x (templates/distill.cu, "tensor parallelism"). */
static flce_status tp_merge_stats(distill_runs *d, distill_row_args *ra)
{
    const CUstream stream = d->student.stream;
    TRY(launch(d->k[DK_TP_PACK], row_blocks(ra), 1, DISTILL_THREADS, 0, stream, ra, "distill TP pack"));
    TRY(comm_all_gather(d->ts.comm, (const void *)(uintptr_t)ra->tp_send, (void *)(uintptr_t)ra->tp_recv,
                        tp_block_bytes((uint64_t)ra->rows), stream, "the distillation statistics' all-gather"));
    return launch(d->k[DK_TP_MERGE], row_blocks(ra), 1, DISTILL_THREADS, 0, stream, ra, "distill TP merge");
}

/* The fp32 path under TP, after both logits passes of a chunk: the shard's teacher lse, the merged
 * statistics (tp_merge_stats), the row kernel's first read (tp_sums: the shard's parts of the row
 * sums) and their all-reduce; the second read (run_all) forms dZs and the outputs. */
static flce_status tp_fp32_sums(distill_runs *d, distill_row_args *ra)
{
    const CUstream stream = d->student.stream;
    if (!ra->topk) TRY(launch(d->k[DK_LSE], row_blocks(ra), 1, DISTILL_THREADS, 0, stream, ra, "distill teacher lse"));
    TRY(tp_merge_stats(d, ra));
    ra->tp_sums = 1;
    flce_status st = launch(d->k[ra->topk ? DK_ROW_TOPK : DK_ROW], ra->rows, 1, DISTILL_THREADS, 0, stream, ra,
                            "distill rows (TP sums)");
    ra->tp_sums = 0;
    TRY(st);
    return comm_all_reduce_f32(d->ts.comm, (float *)(uintptr_t)ra->tp_aw, 2 * (uint64_t)ra->rows, stream,
                               "the divergence sums' all-reduce");
}

/* TP, after the row kernel: the shards' (Σ p̂ log p̂, Σ p̂) summed, then each token's D and loss. */
static flce_status tp_divergence(distill_runs *d, distill_row_args *ra)
{
    const CUstream stream = d->student.stream;
    TRY(comm_all_reduce_f32(d->ts.comm, (float *)(uintptr_t)ra->tp_aw, 2 * (uint64_t)ra->rows, stream,
                            "the divergence sums' all-reduce"));
    return launch(d->k[DK_TP_OUT], row_blocks(ra), 1, DISTILL_THREADS, 0, stream, ra, "distill TP out");
}

/* dz_all_rows: dHs of chunk b from its rows of dZs (the student plan's off_dz moved to them) */
static flce_status run_dh_chunk(const distill_runs *d, const block *b)
{
    plan chunk = *d->student.pl;
    chunk.off_dz += (uint64_t)b->row0 * (uint64_t)chunk.ldz * 2;
    flce_tensors ts = d->ts;
    ts.grad_weight = NULL;
    run r = d->student;
    r.pl = &chunk, r.t = &ts;
    block rows_done = *b;
    rows_done.first = rows_done.last = 1; /* a token chunk completes its dHs rows */
    return run_grad_gemms(&r, &rows_done, b);
}

/* dz_all_rows: dWs once over every token's dZs, straight into the dtype */
static flce_status run_dw_all(const distill_runs *d, const flce_distill_problem *p)
{
    flce_tensors ts = d->ts;
    ts.grad_hidden = NULL;
    run r = d->student;
    r.t = &ts;
    const block all = {0, p->tokens, 0, p->vocab, 1, 1};
    return run_grad_gemms(&r, &all, &all);
}

/* Where token chunk b's rows of the student's dZs (compact: p̃) start, from the plan's off_dz: its
 * rows of every token's (dz_all_rows), else the one chunk's buffer. */
static unsigned long long dz_rows_at(const distill_plan *pl, const block *b)
{
    return pl->student.dz_all_rows ? (unsigned long long)b->row0 * (unsigned long long)pl->ld * 2 : 0;
}

/* The student's gradient GEMMs of token chunk b once its dZs is written: dHs alone (dz_all_rows: dWs
 * runs once after the last chunk, finish_chunks), else dHs and dWs. */
static flce_status chunk_grads(distill_runs *d, const block *b)
{
    if (d->student.pl->dz_all_rows) return run_dh_chunk(d, b);
    block rows_done = *b;
    rows_done.first = rows_done.last = 1; /* a token chunk completes its dHs rows */
    return run_grad_gemms(&d->student, &rows_done, b);
}

/* After the last chunk: dWs once (dz_all_rows), dHs summed over the ranks (TP; unless each chunk's
 * went beside dW: tp_overlap), and the loss reduced. */
static flce_status finish_chunks(distill_runs *d, const flce_distill_problem *p, const distill_plan *pl,
                                 distill_row_args *ra)
{
    if (pl->student.dz_all_rows && d->ts.grad_weight) TRY(run_dw_all(d, p));
    if (pl->tp) {
        flce_status st = finish_dh(&d->student), joined = side_join(&d->student);
        TRY(st);
        TRY(joined);
    }
    if (p->reduction != FLCE_REDUCTION_NONE && ra->loss)
        TRY(launch(d->k[DK_REDUCE], 1, 1, DISTILL_THREADS, 0, d->student.stream, ra, "distill reduce"));
    return FLCE_OK;
}

/* The compact forward-KL path per token chunk (templates/distill.cu says the math): the teacher's
 * compact pass, its lse, the student's compact pass with the soft-target sums, the row kernel (D_i,
 * loss_i, dZs over the student's p̃), dHs and dWs (dz_all_rows: dHs per chunk at its rows of every
 * token's p̃ / dZs, dWs once after the last chunk). */
static flce_status run_compact(distill_runs *d, const flce_distill_problem *p, const distill_plan *pl,
                               distill_row_args *ra)
{
    const CUdeviceptr ws = d->student.ws;
    const CUstream stream = d->student.stream;
    const plan *s = &pl->student;
    const logits_stats st_t = {.part_m = ws + pl->teacher_part_m, .part_s = ws + pl->teacher_part_s,
                               .target = ws + pl->teacher_target, .tile_max = ws + pl->teacher_tile_max};
    logits_stats st_s = {.part_m = ws + s->off_part_m, .part_s = ws + s->off_part_s, .target = ws + s->off_target,
                         .part_zs = ws + pl->part_xs_offset, .tile_max = ws + s->off_tile_max,
                         .soft = ws + pl->pt_offset, .soft_tile_max = ws + pl->teacher_tile_max,
                         .soft_lse = ws + pl->lse_t_offset};
    if (pl->topk) { /* no teacher pass: the sparse target's lists instead */
        st_s.soft = st_s.soft_tile_max = st_s.soft_lse = 0;
        st_s.sparse_ids = ws + pl->sparse_ids_offset, st_s.sparse_p = ws + pl->sparse_p_offset;
        ra->sp_ids = st_s.sparse_ids, ra->sp_p = st_s.sparse_p;
    }
    ra->zt = 0;
    ra->part_ms = st_s.part_m, ra->part_ss = st_s.part_s, ra->part_mt = st_t.part_m, ra->part_st = st_t.part_s;
    ra->pt = st_s.soft, ra->tile_ms = st_s.tile_max, ra->tile_mt = st_t.tile_max, ra->part_xs = st_s.part_zs;
    ra->target_s = st_s.target, ra->lse_t = st_s.soft_lse;
    ra->ld_tile = s->tile_max_ld, ra->tile_cols = (int)s->tile_cols;
    tp_args(p, pl, ws, ra);
    for (int64_t c = 0; c < pl->chunks; c++) {
        block b = {c * pl->chunk_rows, 0, 0, p->vocab, c == 0, c == pl->chunks - 1};
        b.rows = p->tokens - b.row0 < pl->chunk_rows ? p->tokens - b.row0 : pl->chunk_rows;
        ra->row0 = b.row0, ra->rows = b.rows;
        ra->zs = ws + s->off_z + dz_rows_at(pl, &b), ra->dz = ws + s->off_dz + dz_rows_at(pl, &b);
        if (!pl->topk) {
            TRY(launch_store_logits(&d->teacher, &b, ws + pl->pt_offset, &st_t));
            TRY(launch(d->k[DK_LSE], (b.rows + DISTILL_THREADS - 1) / DISTILL_THREADS, 1, DISTILL_THREADS, 0, stream,
                       ra, "distill teacher lse"));
        }
        if (pl->topk) TRY(launch(d->k[DK_TOPK_SORT], b.rows, 1, DISTILL_THREADS, 0, stream, ra, "distill top-k sort"));
        TRY(launch_store_logits(&d->student, &b, ra->zs, &st_s));
        if (pl->tp) TRY(tp_merge_stats(d, ra));
        if (pl->topk)
            TRY(launch(d->k[DK_ROW_TOPK_COMPACT], b.rows, 1, DISTILL_THREADS, 0, stream, ra, "distill rows (top-k)"));
        else
            TRY(launch(d->k[DK_ROW_COMPACT], b.rows, 1, DISTILL_THREADS, 0, stream, ra, "distill rows (compact)"));
        if (pl->tp && !pl->topk) TRY(tp_divergence(d, ra));
        TRY(chunk_grads(d, &b));
    }
    return finish_chunks(d, p, pl, ra);
}

static flce_status run_all(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                           const flce_distill_tensors *t, CUdeviceptr ws, CUstream stream)
{
    distill_runs d;
    TRY(load(ctx, p, pl, t, ws, stream, &d));
    if (!t->labels) { /* the logits epilogue reads a label per row: zeros, which it only compares */
        CUresult res = drv.MemsetD32Async(ws + pl->labels_offset, 0, 2 * (size_t)p->tokens, stream);
        if (res != CUDA_SUCCESS) return drv_error(res, "zeroing the distillation's stand-in labels");
    }
    const unsigned long long zs = ws + pl->student.off_z, dz = ws + pl->student.off_dz, zt = ws + pl->zt_offset;
    const logits_stats st_s = {ws + pl->student.off_part_m, ws + pl->student.off_part_s, ws + pl->student.off_target};
    const logits_stats st_t = {ws + pl->teacher_part_m, ws + pl->teacher_part_s, ws + pl->teacher_target};
    distill_row_args ra = {zs, zt, dz, st_s.part_m, st_s.part_s, st_t.part_m, st_t.part_s,
                           addr(t->labels), addr(t->grad_output), addr(t->divergence),
                           ws + pl->per_token_offset, addr(t->loss), ws + pl->count_offset,
                           0, 0, p->tokens, p->vocab, p->ignore_index, pl->ld, pl->student.splits, pl->teacher.splits,
                           (unsigned long long)ctx->flag_dev};
    ra.vocab_total = p->tp_size > 1 ? (p->vocab_total ? p->vocab_total : p->vocab_offset + p->vocab) : p->vocab;
    TRY(launch(d.k[DK_COUNT], 1, 1, DISTILL_THREADS, 0, stream, &ra, "distill count"));
    ra.tk_idx = addr(t->teacher_topk_indices), ra.tk_lp = addr(t->teacher_topk_logprobs), ra.topk = pl->topk;
    if (pl->compact) return run_compact(&d, p, pl, &ra);
    tp_args(p, pl, ws, &ra);
    if (pl->tp) ra.lse_t = pl->topk ? 0 : ws + pl->lse_t_offset, ra.target_s = st_s.target;
    for (int64_t c = 0; c < pl->chunks; c++) {
        block b = {c * pl->chunk_rows, 0, 0, p->vocab, c == 0, c == pl->chunks - 1};
        b.rows = p->tokens - b.row0 < pl->chunk_rows ? p->tokens - b.row0 : pl->chunk_rows;
        if (!pl->topk) TRY(launch_store_logits(&d.teacher, &b, zt, &st_t));
        TRY(launch_store_logits(&d.student, &b, zs, &st_s));
        ra.row0 = b.row0, ra.rows = b.rows;
        ra.dz = dz + dz_rows_at(pl, &b);
        if (pl->tp) TRY(tp_fp32_sums(&d, &ra));
        if (pl->topk) TRY(launch(d.k[DK_ROW_TOPK], b.rows, 1, DISTILL_THREADS, 0, stream, &ra, "distill rows (top-k)"));
        else TRY(launch(d.k[DK_ROW], b.rows, 1, DISTILL_THREADS, 0, stream, &ra, "distill rows"));
        TRY(chunk_grads(&d, &b));
    }
    return finish_chunks(&d, p, pl, &ra);
}

flce_status distill_run(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                        const flce_distill_tensors *t, void *stream_arg)
{
    CTX_LOG_SCOPE(ctx);
    CUstream stream = (CUstream)stream_arg;
    log_msg(LOG_DEBUG, "distill: N=%lld Ds=%lld Dt=%lld V=%lld, %lld token chunk(s) of %lld rows, workspace %.1f MiB",
            (long long)p->tokens, (long long)p->hidden_student, (long long)p->hidden_teacher, (long long)p->vocab,
            (long long)pl->chunks, (long long)pl->chunk_rows, (double)pl->workspace_bytes / (1 << 20));
    if (pl->tp) TRY(comm_check(t->comm, p->tp_rank, p->tp_size));
    distill_call c = {p, pl, t};
    return call_run(ctx, t->workspace, pl->workspace_bytes, stream, run_body, &c);
}
