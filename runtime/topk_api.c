/* topk_api.c — the public top-k log-probabilities entry points of flce.h (issue 44 item 2): argument
 * checks with messages naming the argument, the workspace size, then topk.c's launch. The whole call
 * and the two halves of its vocab-parallel split phase (flce_topk_stats, flce_topk_finish) go
 * through one path, split_half, which differs only in the part it names. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api_limits.h"
#include "comm.h"
#include "context.h"
#include "error.h"
#include "row_call.h"
#include "topk.h"

enum { TOPK_K_MAX = 64 };

void flce_topk_problem_init(flce_topk_problem *p)
{
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->api_version = FLCE_API_VERSION;
    p->dtype = FLCE_DTYPE_BF16;
    p->k = 1;
    p->temperature = 1.0f;
    p->tp_size = 1;
}

void flce_topk_tensors_init(flce_topk_tensors *t)
{
    if (!t) return;
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
}

/* The caller's struct (`size` bytes, its struct_size, the first field of both structs) over `out`,
 * which holds the defaults: the first published layout had `first` bytes, and an older caller (any
 * size from `first` up) keeps the defaults of the fields it lacks; a newer caller is unsupported. */
static flce_status copy_versioned(void *out, const void *in, unsigned size, size_t first, size_t ours, const char *arg,
                                  const char *type)
{
    if (size < first || size > ours) return call_check_struct_size(size, ours, arg, type);
    memcpy(out, in, size);
    *(uint32_t *)out = (uint32_t)ours;
    return FLCE_OK;
}

/* The caller's problem copied into a full-size one, with the defaults for the fields it lacks and
 * vocab_total's (vocab_offset + vocab) where it is 0. */
static flce_status normalize_problem(const flce_topk_problem *in, flce_topk_problem *out)
{
    if (!in) return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem: NULL");
    flce_topk_problem_init(out);
    const size_t first = offsetof(flce_topk_problem, memory_budget) + sizeof in->memory_budget;
    TRY(copy_versioned(out, in, in->struct_size, first, sizeof *in, "problem", "flce_topk_problem"));
    /* only where the sum cannot overflow: check_tp reports the bad fields otherwise */
    if (out->vocab_total == 0 && out->vocab_offset >= 0 && out->vocab >= 0 &&
        out->vocab_offset <= INT64_MAX - out->vocab)
        out->vocab_total = out->vocab_offset + out->vocab;
    return FLCE_OK;
}

/* The tensor-parallel fields: the rank in the group, the shard inside the vocab, the ids the blocks
 * carry as int32. */
static flce_status check_tp(const flce_topk_problem *p)
{
    if (p->tp_size < 1 || p->tp_rank < 0 || p->tp_rank >= p->tp_size)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.tp_rank=%d, tp_size=%d: need tp_size >= 1 and 0 <= tp_rank < tp_size", p->tp_rank,
                       p->tp_size);
    if (p->tp_size > FLCE_MAX_TP)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.tp_size=%d: at most %d ranks supported", p->tp_size,
                       FLCE_MAX_TP);
    if (p->vocab_offset < 0)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.vocab_offset=%lld: must not be negative",
                       (long long)p->vocab_offset);
    if (p->vocab_offset > p->vocab_total || p->vocab > p->vocab_total - p->vocab_offset)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.vocab_offset + vocab = %lld + %lld exceeds vocab_total=%lld",
                       (long long)p->vocab_offset, (long long)p->vocab, (long long)p->vocab_total);
    if (p->tp_size == 1 && (p->vocab_offset != 0 || p->vocab_total != p->vocab))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.vocab_offset=%lld, vocab_total=%lld: with tp_size=1 the shard is the whole vocab "
                       "(vocab_offset 0, vocab_total 0 or vocab=%lld)",
                       (long long)p->vocab_offset, (long long)p->vocab_total, (long long)p->vocab);
    if (p->tp_size > 1 && p->vocab_total > INT32_MAX)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "problem.vocab_total=%lld: at most %d with tp_size > 1 (the gathered blocks carry int32 ids)",
                       (long long)p->vocab_total, INT32_MAX);
    return FLCE_OK;
}

static flce_status validate(const flce_topk_problem *p)
{
    TRY(call_check_dim(p->tokens, "tokens", 1, 1, FLCE_MAX_TOKENS));
    TRY(call_check_dim(p->hidden, "hidden", 8, 8, FLCE_MAX_HIDDEN));
    TRY(call_check_dim(p->vocab, "vocab", 1, 1, FLCE_MAX_VOCAB));
    TRY(call_check_dtype(p->dtype));
    if (p->k < 1 || p->k > TOPK_K_MAX || p->k > p->vocab)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.k=%d: must be in [1, %d] and at most problem.vocab=%lld%s",
                       p->k, TOPK_K_MAX, (long long)p->vocab,
                       p->tp_size > 1 ? " (this rank's shard: k must fit every rank's shard)" : "");
    TRY(call_check_temperature(p->temperature));
    return check_tp(p);
}

flce_status flce_topk_problem_validate(const flce_topk_problem *problem)
{
    flce_topk_problem p;
    TRY(normalize_problem(problem, &p));
    return validate(&p);
}

/* The tensors a part reads or writes: the inputs for the logits (all, stats), the outputs (all,
 * finish); the communicator for the whole call under TP. */
static flce_status check_tensors(const flce_topk_problem *p, const flce_topk_tensors *in, topk_part part,
                                 flce_topk_tensors *t)
{
    if (!in) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: NULL");
    flce_topk_tensors_init(t);
    const size_t first = offsetof(flce_topk_tensors, workspace_bytes) + sizeof in->workspace_bytes;
    TRY(copy_versioned(t, in, in->struct_size, first, sizeof *in, "tensors", "flce_topk_tensors"));
    const int inputs = part != TOPK_FINISH, outputs = part != TOPK_STATS;
    TRY(call_check_ptr(t->hidden, "hidden", 16, inputs));
    TRY(call_check_ptr(t->weight, "weight", 16, inputs));
    TRY(call_check_ptr(t->indices, "indices", 8, outputs));
    TRY(call_check_ptr(t->logprobs, "logprobs", 4, outputs));
    TRY(call_check_ptr(t->lse, "lse", 4, 0));
    TRY(call_check_ptr(t->workspace, "workspace", 16, 0));
    if (part != TOPK_ALL) return FLCE_OK; /* the halves take no communicator: the caller gathers */
    if (p->tp_size == 1 && t->comm)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.comm: given, but problem.tp_size is 1 (set tp_rank and tp_size)");
    if (p->tp_size > 1 && !t->comm)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.comm: NULL with tp_size=%d; pass the NCCL communicator, or use the split-phase calls "
                       "(flce_topk_stats, an all-gather of the blocks, flce_topk_finish)",
                       p->tp_size);
    return FLCE_OK;
}

/* The block (stats) or the gathered blocks (finish) a half of the split phase is given. */
static flce_status check_buffer(const void *buf, topk_part part)
{
    if (part == TOPK_ALL) return FLCE_OK;
    const char *name = part == TOPK_STATS ? "block" : "gathered";
    if (!buf)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "%s: NULL (device memory of %s bytes)", name,
                       part == TOPK_STATS ? "flce_topk_stats_bytes" : "tp_size × flce_topk_stats_bytes");
    if ((uintptr_t)buf % 16) return err_set(FLCE_ERR_INVALID_ARGUMENT, "%s=%p: must be 16-byte aligned", name, buf);
    return FLCE_OK;
}

/* The problem as checked and its plan for ctx's device (workspace_size and prepare). */
static flce_status plan_problem(const flce_context *ctx, const flce_topk_problem *problem, flce_topk_problem *p,
                                topk_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(validate(p));
    call_device dev = call_device_of(ctx);
    return topk_plan_make(p, &dev, pl);
}

flce_status flce_topk_workspace_size(flce_context *ctx, const flce_topk_problem *problem, uint64_t *bytes)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    if (!bytes) return err_set(FLCE_ERR_INVALID_ARGUMENT, "bytes: NULL");
    flce_topk_problem p;
    topk_plan pl;
    TRY(plan_problem(ctx, problem, &p, &pl));
    *bytes = pl.workspace_bytes;
    return FLCE_OK;
}

flce_status flce_topk_stats_bytes(const flce_topk_problem *problem, uint64_t *bytes)
{
    err_clear();
    if (!bytes) return err_set(FLCE_ERR_INVALID_ARGUMENT, "bytes: NULL");
    flce_topk_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(validate(&p));
    *bytes = topk_block_bytes(&p);
    return FLCE_OK;
}

flce_status flce_topk_prepare(flce_context *ctx, const flce_topk_problem *problem)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_topk_problem p;
    topk_plan pl;
    TRY(plan_problem(ctx, problem, &p, &pl));
    return topk_prepare(ctx, &p, &pl);
}

flce_status topk_check(const flce_topk_problem *problem, const flce_topk_tensors *tensors, topk_part part,
                       const void *buf, const call_device *dev, flce_topk_problem *p, flce_topk_tensors *t,
                       topk_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(validate(p));
    TRY(check_tensors(p, tensors, part, t));
    TRY(check_buffer(buf, part));
    TRY(topk_plan_make(p, dev, pl));
    return call_check_workspace(t->workspace, t->workspace_bytes, topk_part_workspace(pl, part),
                                "flce_topk_workspace_size");
}

/* One public call: the whole one (buf NULL) or a half of the split phase (buf its block or the
 * gathered blocks), checked, then enqueued. */
static flce_status split_half(flce_context *ctx, const flce_topk_problem *problem, const flce_topk_tensors *tensors,
                              topk_part part, const void *buf, void *stream)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_topk_problem p;
    flce_topk_tensors t;
    topk_plan pl;
    call_device dev = call_device_of(ctx);
    TRY(topk_check(problem, tensors, part, buf, &dev, &p, &t, &pl));
    if (part == TOPK_ALL && p.tp_size > 1) TRY(comm_check(t.comm, p.tp_rank, p.tp_size));
    return topk_run(ctx, &p, &pl, &t, part, (void *)(uintptr_t)buf, stream);
}

flce_status flce_topk_logprobs(flce_context *ctx, const flce_topk_problem *problem, const flce_topk_tensors *t,
                               void *stream)
{
    return split_half(ctx, problem, t, TOPK_ALL, NULL, stream);
}

flce_status flce_topk_stats(flce_context *ctx, const flce_topk_problem *problem, const flce_topk_tensors *t,
                            void *block, void *stream)
{
    return split_half(ctx, problem, t, TOPK_STATS, block, stream);
}

flce_status flce_topk_finish(flce_context *ctx, const flce_topk_problem *problem, const flce_topk_tensors *t,
                             const void *gathered, void *stream)
{
    return split_half(ctx, problem, t, TOPK_FINISH, gathered, stream);
}
