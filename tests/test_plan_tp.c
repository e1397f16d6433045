/* test_plan_tp.c — the plan of a tensor-parallel call (runtime/plan.c, docs/DESIGN.md §2), without a GPU:
 * ranks with uneven shards must cut the tokens alike (each token chunk is one all-gather, so a
 * different count would leave NCCL waiting), and the workspace must hold the all-gather blocks,
 * the fp32 dH that is summed across ranks, and under sequence parallelism the gathered inputs and
 * all-token outputs, none of them overlapping. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "params.h"
#include "plan.h"
#include "regions.h"

static flce_problem tp_problem(int64_t n, int64_t d, int64_t total, int rank, int size,
                               const int64_t *cut)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.dtype = FLCE_DTYPE_BF16, p.vocab_total = total;
    p.vocab_offset = cut[rank], p.vocab_shard = cut[rank + 1] - cut[rank];
    p.tp_rank = rank, p.tp_size = size;
    return p;
}

static void uneven_ranks_cut_the_tokens_alike(void)
{
    const int64_t cut[] = {0, 30000, 63000, 95000, 128256};
    uint64_t budgets[] = {0, 128ull << 20, 16ull << 20};
    for (int strat = FLCE_STRATEGY_AUTO; strat <= FLCE_STRATEGY_CHUNKED; strat += 2)
        for (size_t b = 0; b < 3; b++) {
            plan first;
            for (int r = 0; r < 4; r++) {
                flce_problem p = tp_problem(8192, 4096, 128256, r, 4, cut);
                p.strategy = (flce_strategy)strat, p.memory_budget = budgets[b];
                plan pl;
                CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
                if (r == 0) first = pl;
                CHECKF(pl.recompute == first.recompute && pl.n_chunks == first.n_chunks &&
                           pl.chunk_rows == first.chunk_rows && pl.stat_rows == first.stat_rows,
                       "strategy %d budget %llu: rank %d plans %lld chunks of %lld (recompute %d), "
                       "rank 0 %lld of %lld (recompute %d)", strat, (unsigned long long)budgets[b], r,
                       (long long)pl.n_chunks, (long long)pl.chunk_rows, pl.recompute,
                       (long long)first.n_chunks, (long long)first.chunk_rows, first.recompute);
                CHECK(pl.tp_block_bytes == plan_tp_block_bytes(pl.stat_rows));
            }
        }
}

/* The default budget grows under TP by the shape's rule alone (plan.c grown_budget): one token chunk
 * where a shard's compact logits take no more than the budget plus the dW accumulator that one
 * chunk spares; never by the device's memory, which may differ between ranks. */
static void tp_default_budget_grows_by_the_shape_alone(void)
{
    const int64_t cut[] = {0, 64128, 128256};
    const uint64_t mem[] = {80ull << 30, 141ull << 30};
    const int64_t tokens[] = {8192, 32768};
    for (int i = 0; i < 2; i++) {
        plan pl[2];
        for (int r = 0; r < 2; r++) {
            flce_problem p = tp_problem(tokens[i], 4096, 128256, r, 2, cut);
            CHECK(plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, "dev", 90, 132, mem[r], NULL, &pl[r]) == FLCE_OK);
            CHECK(!pl[r].recompute && pl[r].compact && !pl[r].grown);
        }
        CHECKF(pl[0].n_chunks == pl[1].n_chunks && pl[0].chunk_rows == pl[1].chunk_rows,
               "%lld tokens: ranks plan %lld and %lld chunks", (long long)tokens[i], (long long)pl[0].n_chunks,
               (long long)pl[1].n_chunks);
        if (i == 0) CHECKF(pl[0].n_chunks == 1, "8192 tokens at tp = 2: %lld chunks", (long long)pl[0].n_chunks);
        else CHECK(pl[0].n_chunks > 1 && pl[0].need_dw_acc);
    }
}

static void tp_workspace_holds_the_gather_and_the_fp32_dh(void)
{
    const int64_t cut[] = {0, 1500, 3001};
    flce_problem p = tp_problem(5000, 256, 3001, 1, 2, cut);
    p.memory_budget = 8ull << 20;
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK); /* NULL: worst case */
    CHECK(pl.collective && !pl.sp && pl.tp == 2 && pl.rank == 1 && pl.n == 5000 && pl.n_local == 5000);
    CHECK(pl.need_dh_tp && !pl.need_dh_acc);
    region r[PLAN_REGIONS];
    size_t n = plan_regions(&pl, r);
    uint64_t rows = (uint64_t)pl.stat_rows;
    check_disjoint(r, n, pl.workspace_bytes, "TP");
    CHECK(pl.tp_block_bytes == (uint64_t)(FLCE_TP_HEADER + rows * FLCE_TP_RECORD) * 4);

    /* Without a communicator (the split phase, or a backward leaving partial dH) nothing of it. */
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = t.weight = t.labels = (void *)256;
    t.grad_hidden = t.grad_weight = (void *)256;
    CHECK(plan_make(&p, FLCE_OP_BACKWARD, 90, 132, &t, &pl) == FLCE_OK);
    CHECK(!pl.collective && !pl.need_dh_tp && !pl.off_tp_send && !pl.off_tp_recv);
}

/* Row-scaled compact logits on every rank of a TP call that gathers its statistics (plan.c
 * qrows_allowed): each rank keeps its own references and its labels' exact terms; not under SP
 * (the hidden rows are gathered there) nor without a communicator. */
static void tp_ranks_store_row_scaled_logits(void)
{
    const int64_t cut2[] = {0, 64128, 128256}, cut4[] = {0, 32064, 64128, 96192, 128256};
    for (int r = 0; r < 4; r++) {
        flce_problem p = tp_problem(8192, 4096, 128256, r, 4, cut4);
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
        CHECKF(pl.qrows && pl.qdh && pl.need_dh_tp && pl.off_qh && pl.off_qlab && !pl.dh_splits,
               "tp = 4 rank %d: qrows %d qdh %d", r, pl.qrows, pl.qdh);
        region reg[PLAN_REGIONS];
        check_disjoint(reg, plan_regions(&pl, reg), pl.workspace_bytes, "TP qrows");
        if (r < 2) {
            p = tp_problem(8192, 4096, 128256, r, 2, cut2);
            CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
            CHECK(pl.qrows && pl.n_chunks == 1);
        }
    }
    flce_problem p = tp_problem(8192, 4096, 128256, 1, 4, cut4);
    p.sequence_parallel = 1;
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
    CHECK(pl.sp && !pl.qrows);
    p.sequence_parallel = 0;
    flce_tensors t; /* no communicator: nothing gathers the statistics */
    flce_tensors_init(&t);
    t.hidden = t.weight = t.labels = (void *)256;
    t.grad_hidden = t.grad_weight = (void *)256;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, &t, &pl) == FLCE_OK);
    CHECK(!pl.collective && !pl.qrows);
}

static void sp_plans_every_ranks_tokens(void)
{
    const int64_t cut[] = {0, 1000, 2000, 3000, 4001};
    flce_problem p = tp_problem(300, 64, 4001, 3, 4, cut);
    p.sequence_parallel = 1, p.reduction = FLCE_REDUCTION_NONE;
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
    CHECK(pl.sp && pl.n == 1200 && pl.n_local == 300 && pl.stat_rows <= 1200);
    uint64_t n = 1200;
    region r[] = {{pl.off_dh_tp, n * 64 * 4},
                  {pl.off_sp_hidden, n * 64 * 2},
                  {pl.off_sp_labels, n * 4},
                  {pl.off_sp_go, n * 4},
                  {pl.off_sp_out[SP_LSE], n * 4},
                  {pl.off_sp_out[SP_LOSS], n * 4},
                  {pl.off_sp_out[SP_LOSS_PER_TOKEN], n * 4},
                  {pl.off_sp_out[SP_ZLOSS], n * 4},
                  {pl.off_sp_out[SP_LOGPROB], n * 4},
                  {pl.off_sp_out[SP_ENTROPY], n * 4},
                  {pl.off_sp_out[SP_ARGMAX], n * 8},
                  {pl.off_tp_send, pl.tp_block_bytes},
                  {pl.off_tp_recv, pl.tp_block_bytes * 4}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) CHECKF(r[i].off != 0, "SP region %zu missing", i);
    check_disjoint(r, sizeof r / sizeof r[0], pl.workspace_bytes, "SP");
    /* A backward under SP gathers the saved lse and computes no per-token outputs. */
    CHECK(plan_make(&p, FLCE_OP_BACKWARD, 90, 132, NULL, &pl) == FLCE_OK);
    CHECK(pl.off_sp_lse != 0 && pl.off_sp_out[SP_LSE] == 0 && !pl.off_tp_send);
}

int main(void)
{
    RUN(uneven_ranks_cut_the_tokens_alike);
    RUN(tp_default_budget_grows_by_the_shape_alone);
    RUN(tp_workspace_holds_the_gather_and_the_fp32_dh);
    RUN(sp_plans_every_ranks_tokens);
    RUN(tp_ranks_store_row_scaled_logits);
    FINISH();
}
