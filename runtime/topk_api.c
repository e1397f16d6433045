/* topk_api.c — the public top-k log-probabilities entry points of flce.h (issue 44 item 2): argument
 * checks with messages naming the argument, the workspace size, then topk.c's launch. */
#include <stdint.h>
#include <string.h>

#include "api_limits.h"
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
}

void flce_topk_tensors_init(flce_topk_tensors *t)
{
    if (!t) return;
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
}

static flce_status normalize_problem(const flce_topk_problem *in, flce_topk_problem *out)
{
    if (!in) return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem: NULL");
    flce_topk_problem_init(out);
    TRY(call_check_struct_size(in->struct_size, sizeof *in, "problem", "flce_topk_problem"));
    memcpy(out, in, sizeof *out);
    return FLCE_OK;
}

flce_status flce_topk_problem_validate(const flce_topk_problem *problem)
{
    flce_topk_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(call_check_dim(p.tokens, "tokens", 1, 1, FLCE_MAX_TOKENS));
    TRY(call_check_dim(p.hidden, "hidden", 8, 8, FLCE_MAX_HIDDEN));
    TRY(call_check_dim(p.vocab, "vocab", 1, 1, FLCE_MAX_VOCAB));
    TRY(call_check_dtype(p.dtype));
    if (p.k < 1 || p.k > TOPK_K_MAX || p.k > p.vocab)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.k=%d: must be in [1, %d] and at most problem.vocab=%lld",
                       p.k, TOPK_K_MAX, (long long)p.vocab);
    return call_check_temperature(p.temperature);
}

static flce_status check_tensors(const flce_topk_tensors *t)
{
    if (!t) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: NULL");
    TRY(call_check_struct_size(t->struct_size, sizeof *t, "tensors", "flce_topk_tensors"));
    TRY(call_check_ptr(t->hidden, "hidden", 16, 1));
    TRY(call_check_ptr(t->weight, "weight", 16, 1));
    TRY(call_check_ptr(t->indices, "indices", 8, 1));
    TRY(call_check_ptr(t->logprobs, "logprobs", 4, 1));
    TRY(call_check_ptr(t->lse, "lse", 4, 0));
    TRY(call_check_ptr(t->workspace, "workspace", 16, 0));
    return FLCE_OK;
}

/* The problem as checked and its plan for ctx's device (workspace_size and prepare). */
static flce_status plan_problem(const flce_context *ctx, const flce_topk_problem *problem, flce_topk_problem *p,
                                topk_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(flce_topk_problem_validate(p));
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

flce_status flce_topk_prepare(flce_context *ctx, const flce_topk_problem *problem)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_topk_problem p;
    topk_plan pl;
    TRY(plan_problem(ctx, problem, &p, &pl));
    return topk_prepare(ctx, &p, &pl);
}

flce_status topk_check(const flce_topk_problem *problem, const flce_topk_tensors *t, const call_device *dev,
                       flce_topk_problem *p, topk_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(flce_topk_problem_validate(p));
    TRY(check_tensors(t));
    TRY(topk_plan_make(p, dev, pl));
    return call_check_workspace(t->workspace, t->workspace_bytes, pl->workspace_bytes, "flce_topk_workspace_size");
}

flce_status flce_topk_logprobs(flce_context *ctx, const flce_topk_problem *problem, const flce_topk_tensors *t,
                               void *stream)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_topk_problem p;
    topk_plan pl;
    call_device dev = call_device_of(ctx);
    TRY(topk_check(problem, t, &dev, &p, &pl));
    return topk_run(ctx, &p, &pl, t, stream);
}
