/* plan.c — chunking, vocab splits and workspace layout of a call (see plan.h, DESIGN.md §3). */
#include <string.h>

#include "error.h"
#include "plan.h"

static uint64_t align256(uint64_t x) { return (x + 255) & ~(uint64_t)255; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static uint64_t take(uint64_t *cursor, uint64_t bytes)
{
    uint64_t at = *cursor;
    *cursor = align256(*cursor + bytes);
    return at;
}

static void plan_specs(const flce_problem *p, int sm, plan *pl)
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
    pl->rowops.reduction = p->reduction;
    pl->logits.tile = spec_default_tile(sm, p->dtype, ROLE_LOGITS);
    pl->dh.tile = spec_default_tile(sm, p->dtype, ROLE_DH);
    pl->dw.tile = spec_default_tile(sm, p->dtype, ROLE_DW);
}

/* Enough CTAs for two waves: split the vocab when the token rows alone are too few. */
static void plan_splits(plan *pl, int64_t rows, int num_sms)
{
    int64_t tiles = ceil_div(pl->v, pl->logits.tile.bn);
    int64_t row_blocks = ceil_div(rows, pl->logits.tile.bm);
    int64_t want = ceil_div(2 * (int64_t)(num_sms > 0 ? num_sms : 1), row_blocks);
    if (want < 1) want = 1;
    if (want > tiles) want = tiles;
    pl->tiles_per_split = (int)ceil_div(tiles, want);
    pl->splits = (int)ceil_div(tiles, pl->tiles_per_split);
}

/* Largest chunk whose logits (fp32), dZ and partials fit the budget; balanced across chunks. */
static flce_status plan_chunks(const flce_problem *p, plan *pl, int num_sms)
{
    uint64_t budget = p->memory_budget ? p->memory_budget : PLAN_DEFAULT_BUDGET;
    int64_t tiles = ceil_div(pl->v, pl->logits.tile.bn);
    int64_t max_splits = 2 * (int64_t)(num_sms > 0 ? num_sms : 1);
    if (max_splits > tiles) max_splits = tiles;
    uint64_t dz_bytes = p->dtype == FLCE_DTYPE_F32 ? 0 : (uint64_t)pl->ldz * 2;
    uint64_t per_row = (uint64_t)pl->ldz * 4 + dz_bytes + 4 + 8 * (uint64_t)max_splits;
    if (budget < per_row + 4096)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "memory_budget=%llu bytes: too small for one token's logits (%llu bytes "
                       "needed at vocab_shard=%lld)",
                       (unsigned long long)budget, (unsigned long long)(per_row + 4096),
                       (long long)pl->v);
    int64_t rows = (int64_t)((budget - 4096) / per_row);
    int64_t bm = pl->logits.tile.bm;
    if (rows >= pl->n) {
        rows = pl->n;
    } else if (rows >= bm) {
        rows -= rows % bm;
        int64_t chunks = ceil_div(pl->n, rows);
        int64_t balanced = ceil_div(ceil_div(pl->n, chunks), bm) * bm;
        if (balanced < rows) rows = balanced;
    }
    pl->chunk_rows = rows;
    pl->n_chunks = ceil_div(pl->n, rows);
    return FLCE_OK;
}

flce_status plan_make(const flce_problem *p, flce_op op, int sm, int num_sms, const flce_tensors *t,
                      plan *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->op = op;
    pl->n = p->tokens, pl->d = p->hidden, pl->v = p->vocab_shard;
    pl->ldz = ceil_div(pl->v, 8) * 8;
    plan_specs(p, sm, pl);
    if (op == FLCE_OP_FORWARD) {
        pl->chunk_rows = pl->n;
        pl->n_chunks = 1;
    } else {
        TRY(plan_chunks(p, pl, num_sms));
    }
    plan_splits(pl, pl->chunk_rows, num_sms);

    int grads = op != FLCE_OP_FORWARD;
    pl->need_lse = !t || !t->lse;
    if (op == FLCE_OP_BACKWARD) pl->need_lse = 0; /* read from the caller */
    pl->need_loss_rows = op != FLCE_OP_BACKWARD &&
                         (p->reduction != FLCE_REDUCTION_NONE || !t || !t->loss);
    pl->need_dw_acc = grads && pl->n_chunks > 1 && p->dtype != FLCE_DTYPE_F32 &&
                      (!t || t->grad_weight);

    uint64_t cur = 0, rows = (uint64_t)pl->chunk_rows;
    pl->off_count = take(&cur, 16);
    pl->off_target = take(&cur, rows * 4);
    pl->off_part_m = take(&cur, rows * (uint64_t)pl->splits * 4);
    pl->off_part_s = take(&cur, rows * (uint64_t)pl->splits * 4);
    pl->off_loss_rows = pl->need_loss_rows ? take(&cur, (uint64_t)pl->n * 4) : 0;
    pl->off_lse = pl->need_lse ? take(&cur, (uint64_t)pl->n * 4) : 0;
    if (grads) {
        pl->off_z = take(&cur, rows * (uint64_t)pl->ldz * 4);
        pl->off_dz = p->dtype == FLCE_DTYPE_F32 ? pl->off_z : take(&cur, rows * (uint64_t)pl->ldz * 2);
        if (pl->need_dw_acc) pl->off_dw_acc = take(&cur, (uint64_t)pl->v * (uint64_t)pl->d * 4);
    }
    pl->workspace_bytes = cur;
    return FLCE_OK;
}
