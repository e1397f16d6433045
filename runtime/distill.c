/* distill.c — the distillation call's plan (token chunks whose fp32 logits of both models fit the
 * memory budget, bench/NOTES.md session 22 plan item 4) and its run. Called by distill_api.c.
 *
 * v1 design (issue 44 item 1): per token chunk, the teacher's logits GEMM storing fp32 z_t, the
 * student's storing fp32 z_s, one row kernel (templates/distill.cu) forming both log-softmaxes at
 * temperature T, D_i and dZ_s in place, then the CE path's dH_s = dZ_s·W_s and dW_s += dZ_sᵀ·H_s.
 * The run is NOT wired yet: distill_run refuses with FLCE_ERR_UNSUPPORTED (see NOTES). */
#include "distill.h"

#include "error.h"

enum { DISTILL_DEFAULT_BUDGET = 512u << 20 };

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
    pl->zs_offset = 0;
    pl->zt_offset = z;
    pl->dw_offset = 2 * z;
    /* fp32 inputs write dWs straight into the caller's buffer; 16-bit ones accumulate in fp32 */
    uint64_t dw = p->dtype == FLCE_DTYPE_F32 ? 0 : align16(4 * (uint64_t)p->vocab * (uint64_t)p->hidden_student);
    pl->per_token_offset = pl->dw_offset + dw;
    pl->count_offset = pl->per_token_offset + align16(4 * (uint64_t)p->tokens);
    pl->workspace_bytes = pl->count_offset + 16;
}

flce_status distill_run(flce_context *ctx, const flce_distill_problem *p, const distill_plan *pl,
                        const flce_distill_tensors *t, void *stream)
{
    (void)ctx, (void)p, (void)pl, (void)t, (void)stream;
    return err_set(FLCE_ERR_UNSUPPORTED,
                   "flce_distill_loss_and_grad: the GPU run of the distillation call is not in this "
                   "build yet (issue 44 item 1: arguments are checked, nothing was enqueued)");
}
