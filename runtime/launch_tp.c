/*
 * launch_tp.c — what tensor and sequence parallelism add to a run (docs/DESIGN.md §2): dH summed
 * over the ranks in fp32 and rounded once (reduce_dh_rows, reduce_dh_sp), that reduction beside dW
 * on the side stream (tp_overlap), the forks and joins of the side and fill streams, and under SP
 * the all-gather of the token-sharded inputs and the copy of this rank's outputs back.
 */
#include <stdint.h>
#include <string.h>

#include "comm.h"
#include "launch_tp.h"

/* Stream s (the side or the fill stream) waits for everything the caller's stream holds so far. */
flce_status fork_to(run *r, CUstream s)
{
    CUresult res = drv.EventRecord(r->ctx->fork, r->stream);
    if (res == CUDA_SUCCESS) res = drv.StreamWaitEvent(s, r->ctx->fork, 0);
    if (res != CUDA_SUCCESS) return drv_error(res, "handing work to a second stream");
    int known = 0;
    for (int i = 0; i < r->n_forked; i++) known |= r->forked[i] == s;
    if (!known) r->forked[r->n_forked++] = s;
    return FLCE_OK;
}

static flce_status side_fork(run *r)
{
    TRY(ctx_side_stream(r->ctx));
    return fork_to(r, r->ctx->side);
}

/* The caller's stream waits for the forked stream's work (also after a failure: a stream capture
 * must end joined). */
flce_status side_join(run *r)
{
    CUresult res = CUDA_SUCCESS;
    for (int i = 0; i < r->n_forked; i++) { /* one event serves both: each wait takes its last record */
        CUresult e = drv.EventRecord(r->ctx->join, r->forked[i]);
        if (e == CUDA_SUCCESS) e = drv.StreamWaitEvent(r->stream, r->ctx->join, 0);
        if (res == CUDA_SUCCESS) res = e;
    }
    r->n_forked = 0;
    return res == CUDA_SUCCESS ? FLCE_OK : drv_error(res, "joining the second stream");
}

/* dH rows [row0, row0 + rows) summed over the ranks and rounded once into the caller's grad_hidden
 * (or added to it in accumulate mode), on r->stream: under dh_gather16 an fp32 reduce-scatter, the
 * cast of this rank's slice and a 16-bit all-gather in grad_hidden; else the fp32 all-reduce then
 * the cast; or under FLCE_DEV tp_dh_16bit the cast of this rank's part then a 16-bit all-reduce. */
static flce_status reduce_dh_rows(run *r, int64_t row0, int64_t rows)
{
    const plan *pl = r->pl;
    uint64_t at = (uint64_t)row0 * (uint64_t)pl->d, count = (uint64_t)rows * (uint64_t)pl->d;
    float *buf = (float *)(uintptr_t)(r->ws + pl->off_dh_tp) + at;
    CUdeviceptr dst = addr(r->t->grad_hidden) + at * (r->p->accumulate_grad_hidden ? 4 : r->es);
    block none = {0, 0, 0, 0, 1, 1};
    r->rp.cast_src = addr(buf), r->rp.cast_dst = dst, r->rp.cast_count = (long long)count;
    r->rp.cast_accumulate = r->p->accumulate_grad_hidden;
    if (pl->dh_reduce_16bit) { /* round this rank's part once, then sum the 16-bit parts */
        r->rp.cast_accumulate = 0;
        TRY(run_rows(r, K_CAST, &none));
        return comm_all_reduce_16(r->t->comm, (void *)(uintptr_t)dst, count, r->p->dtype == FLCE_DTYPE_BF16,
                                  r->stream, "the dH all-reduce (16-bit)");
    }
    if (pl->dh_gather16 && count % (4 * (uint64_t)pl->tp) == 0) {
        /* each slice a multiple of 4 values: the cast's float4 loads and 8-byte stores stay aligned */
        uint64_t slice = count / (uint64_t)pl->tp, own = (uint64_t)pl->rank * slice;
        TRY(comm_reduce_scatter_f32(r->t->comm, buf, slice, pl->rank, r->stream, "the dH reduce-scatter"));
        r->rp.cast_src = addr(buf + own), r->rp.cast_dst = dst + own * r->es, r->rp.cast_count = (long long)slice;
        TRY(run_rows(r, K_CAST, &none));
        return comm_all_gather(r->t->comm, (const void *)(uintptr_t)(dst + own * r->es), (void *)(uintptr_t)dst,
                               slice * r->es, r->stream, "the dH all-gather");
    }
    TRY(comm_all_reduce_f32(r->t->comm, buf, count, r->stream, "the dH all-reduce"));
    return run_rows(r, K_CAST, &none);
}

/* SP: every row's dH summed over the ranks by an fp32 reduce-scatter to this rank's rows, then
 * rounded once into the caller's grad_hidden (or added to it in accumulate mode), on r->stream. */
static flce_status reduce_dh_sp(run *r)
{
    const plan *pl = r->pl;
    float *buf = (float *)(uintptr_t)(r->ws + pl->off_dh_tp);
    uint64_t local = (uint64_t)pl->n_local * (uint64_t)pl->d;
    TRY(comm_reduce_scatter_f32(r->t->comm, buf, local, pl->rank, r->stream, "the dH reduce-scatter"));
    buf += (uint64_t)pl->rank * local;
    r->rp.cast_src = addr(buf);
    r->rp.cast_dst = addr(r->t->grad_hidden);
    r->rp.cast_count = (long long)local;
    r->rp.cast_accumulate = r->p->accumulate_grad_hidden;
    block none = {0, 0, 0, 0, 1, 1};
    return run_rows(r, K_CAST, &none);
}

/* The dH rows of `rows_done` summed over the ranks (under SP: all rows, reduce-scattered), on
 * r->stream. */
flce_status reduce_dh(run *r, const block *rows_done)
{
    return r->pl->sp ? reduce_dh_sp(r) : reduce_dh_rows(r, rows_done->row0, rows_done->rows);
}

/* FLCE_DEV tp_overlap (plan.h, tp_overlap): the dH rows of `rows_done` are final on this rank; their
 * reduction goes to the side stream, after everything the caller's stream holds so far, and the
 * caller's stream goes on with dW. launch_run joins the two before it returns. */
flce_status overlap_dh(run *r, const block *rows_done)
{
    TRY(side_fork(r));
    CUstream caller = r->stream;
    r->stream = r->ctx->side;
    flce_status st = reduce_dh(r, rows_done);
    r->stream = caller;
    return st;
}

/* dH summed over the ranks in fp32 (all-reduce; reduce-scatter to this rank's rows under SP),
 * then rounded once into the caller's grad_hidden (or added to it in accumulate mode); with
 * tp_overlap already done on the side stream, chunk by chunk. */
flce_status finish_dh(run *r)
{
    const plan *pl = r->pl;
    if (!pl->need_dh_tp || !r->t->grad_hidden || pl->tp_overlap) return FLCE_OK;
    block all = {0, pl->n_local, 0, 0, 1, 1};
    return reduce_dh(r, &all);
}

/* Sequence parallelism: the per-token arrays that hold all tokens, by SP_* index. */
static void **sp_field(flce_tensors *t, int k, int none)
{
    switch (k) {
    case SP_LSE: return (void **)&t->lse;
    case SP_LOSS: return none ? (void **)&t->loss : NULL;
    case SP_LOSS_PER_TOKEN: return (void **)&t->loss_per_token;
    case SP_ZLOSS: return none ? (void **)&t->z_loss_out : NULL;
    case SP_LOGPROB: return (void **)&t->target_logprob;
    case SP_ENTROPY: return (void **)&t->entropy;
    default: return (void **)&t->argmax;
    }
}

/* SP: all-gathers the token-sharded inputs into the workspace and points `all` (a copy of the
 * caller's tensors) at them and at all-token stand-ins for the per-token outputs. */
static const float **sp_grad_field(flce_tensors *t, int k)
{
    return k == SP_GRAD_LOGPROB ? &t->grad_logprob : k == SP_GRAD_LSE ? &t->grad_lse
           : k == SP_GRAD_ENTROPY ? &t->grad_entropy : &t->grad_loss_per_token;
}

/* (SAVED: the forward's gathered hidden states and labels, its all-token outputs (lse, entropy)
 * stay in the workspace for the backward, which gathers only the upstream gradients; the forward
 * gathers none of these.) */
flce_status sp_gather(run *r, const flce_tensors *caller, flce_tensors *all, launch_part part)
{
    const plan *pl = r->pl;
    uint64_t nl = (uint64_t)pl->n_local;
    int none = r->p->reduction == FLCE_REDUCTION_NONE;
    int inputs = part != PART_SAVED_GRADS, grads = part != PART_SAVE;
    *all = *caller;
    all->hidden = (const void *)(uintptr_t)(r->ws + pl->off_sp_hidden);
    all->labels = (const void *)(uintptr_t)(r->ws + pl->off_sp_labels);
    if (pl->off_sp_go && caller->grad_output) all->grad_output = (const float *)(uintptr_t)(r->ws + pl->off_sp_go);
    for (int k = 0; k < SP_OUTPUTS; k++) {
        void **f = sp_field(all, k, none);
        if (f && *f && pl->off_sp_out[k]) *f = (void *)(uintptr_t)(r->ws + pl->off_sp_out[k]);
    }
    for (int k = 0; k < SP_GRADS; k++) {
        const float **f = sp_grad_field(all, k);
        if (*f && pl->off_sp_grads[k]) *f = (const float *)(uintptr_t)(r->ws + pl->off_sp_grads[k]);
    }
    if (pl->off_sp_lse) all->lse = (float *)(uintptr_t)(r->ws + pl->off_sp_lse); /* backward's input */
    TRY(comm_group_start());
    flce_status st = FLCE_OK;
    if (inputs)
        st = comm_all_gather(caller->comm, caller->hidden, (void *)all->hidden,
                             nl * (uint64_t)pl->d * r->es, r->stream, "the hidden-state all-gather");
    if (st == FLCE_OK && inputs)
        st = comm_all_gather(caller->comm, caller->labels, (void *)all->labels,
                             nl * (uint64_t)(r->p->label_bits / 8), r->stream, "the label all-gather");
    if (st == FLCE_OK && grads && pl->off_sp_go && caller->grad_output)
        st = comm_all_gather(caller->comm, caller->grad_output, (void *)all->grad_output, nl * 4,
                             r->stream, "the grad_output all-gather");
    flce_tensors own = *caller; /* (the caller's pointers, read through sp_grad_field) */
    for (int k = 0; k < SP_GRADS && st == FLCE_OK && grads; k++) {
        const float *mine = *sp_grad_field(&own, k);
        if (mine && pl->off_sp_grads[k])
            st = comm_all_gather(caller->comm, mine, (void *)(uintptr_t)(r->ws + pl->off_sp_grads[k]), nl * 4,
                                 r->stream, "a per-token upstream gradient's all-gather");
    }
    if (st == FLCE_OK && pl->off_sp_lse)
        st = comm_all_gather(caller->comm, caller->lse, (void *)(uintptr_t)(r->ws + pl->off_sp_lse), nl * 4, r->stream, "the lse all-gather");
    flce_status end = comm_group_end();
    return st != FLCE_OK ? st : end;
}

/* SP: this rank's rows of every all-token output go back to the caller's arrays. */
flce_status sp_scatter_outputs(run *r, const flce_tensors *caller)
{
    const plan *pl = r->pl;
    if (pl->op == FLCE_OP_BACKWARD) return FLCE_OK;
    int none = r->p->reduction == FLCE_REDUCTION_NONE;
    flce_tensors c = *caller;
    for (int k = 0; k < SP_OUTPUTS; k++) {
        void **f = sp_field(&c, k, none);
        if (!f || !*f || !pl->off_sp_out[k]) continue;
        uint64_t size = k == SP_ARGMAX ? 8 : 4, bytes = (uint64_t)pl->n_local * size;
        CUresult res = drv.MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)*f,
                                           r->ws + pl->off_sp_out[k] + (uint64_t)pl->rank * bytes,
                                           (size_t)bytes, r->stream);
        if (res != CUDA_SUCCESS) return drv_error(res, "copying this rank's per-token outputs");
    }
    return FLCE_OK;
}
