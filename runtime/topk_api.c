/* topk_api.c — the public top-k log-probabilities entry points of flce.h (issue 44 item 2): argument
 * checks with messages naming the argument, the workspace size, then topk.c's launch. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "api_limits.h"
#include "context.h"
#include "error.h"
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
    if (in->struct_size != sizeof *in)
        return err_set(in->struct_size > sizeof *in ? FLCE_ERR_UNSUPPORTED : FLCE_ERR_INVALID_ARGUMENT,
                       "problem.struct_size=%u: flce_topk_problem is %zu bytes in this library (%s); "
                       "initialize with flce_topk_problem_init",
                       in->struct_size, sizeof *in, FLCE_VERSION_STRING);
    memcpy(out, in, sizeof *out);
    return FLCE_OK;
}

static flce_status check_dim(int64_t value, const char *name, int64_t at_least, int64_t multiple, int64_t at_most)
{
    if (value < at_least || value % multiple)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.%s=%lld: must be at least %lld%s", name, (long long)value,
                       (long long)at_least, multiple > 1 ? " and a multiple of 8" : "");
    if (value > at_most)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.%s=%lld: at most %lld supported", name, (long long)value,
                       (long long)at_most);
    return FLCE_OK;
}

flce_status flce_topk_problem_validate(const flce_topk_problem *problem)
{
    flce_topk_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(check_dim(p.tokens, "tokens", 1, 1, FLCE_MAX_TOKENS));
    TRY(check_dim(p.hidden, "hidden", 8, 8, FLCE_MAX_HIDDEN));
    TRY(check_dim(p.vocab, "vocab", 1, 1, FLCE_MAX_VOCAB));
    if (p.dtype != FLCE_DTYPE_F32 && p.dtype != FLCE_DTYPE_F16 && p.dtype != FLCE_DTYPE_BF16)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.dtype=%d: not an flce_dtype", (int)p.dtype);
    if (p.k < 1 || p.k > TOPK_K_MAX || p.k > p.vocab)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.k=%d: must be in [1, %d] and at most problem.vocab=%lld",
                       p.k, TOPK_K_MAX, (long long)p.vocab);
    if (!(p.temperature > 0.0f) || !isfinite(p.temperature) || !isfinite(1.0f / p.temperature))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.temperature=%g: must be finite and > 0 (1/T finite)",
                       (double)p.temperature);
    return FLCE_OK;
}

static flce_status check_ptr(const void *ptr, const char *name, uintptr_t align, int required)
{
    if (!ptr) return required ? err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s: NULL (required)", name) : FLCE_OK;
    if ((uintptr_t)ptr % align)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s=%p: must be %u-byte aligned", name, ptr, (unsigned)align);
    return FLCE_OK;
}

static flce_status check_tensors(const flce_topk_tensors *t)
{
    if (!t) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: NULL");
    if (t->struct_size != sizeof *t)
        return err_set(t->struct_size > sizeof *t ? FLCE_ERR_UNSUPPORTED : FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.struct_size=%u: flce_topk_tensors is %zu bytes in this library (%s); "
                       "initialize with flce_topk_tensors_init",
                       t->struct_size, sizeof *t, FLCE_VERSION_STRING);
    TRY(check_ptr(t->hidden, "hidden", 16, 1));
    TRY(check_ptr(t->weight, "weight", 16, 1));
    TRY(check_ptr(t->indices, "indices", 8, 1));
    TRY(check_ptr(t->logprobs, "logprobs", 4, 1));
    TRY(check_ptr(t->lse, "lse", 4, 0));
    TRY(check_ptr(t->workspace, "workspace", 16, 0));
    return FLCE_OK;
}

static distill_device device_of(const flce_context *ctx)
{
    distill_device d = {ctx->name, ctx->sm, ctx->num_sms};
    return d;
}

flce_status flce_topk_workspace_size(flce_context *ctx, const flce_topk_problem *problem, uint64_t *bytes)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    if (!bytes) return err_set(FLCE_ERR_INVALID_ARGUMENT, "bytes: NULL");
    flce_topk_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(flce_topk_problem_validate(&p));
    topk_plan pl;
    distill_device dev = device_of(ctx);
    TRY(topk_plan_make(&p, &dev, &pl));
    *bytes = pl.workspace_bytes;
    return FLCE_OK;
}

flce_status flce_topk_prepare(flce_context *ctx, const flce_topk_problem *problem)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_topk_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(flce_topk_problem_validate(&p));
    topk_plan pl;
    distill_device dev = device_of(ctx);
    TRY(topk_plan_make(&p, &dev, &pl));
    return topk_prepare(ctx, &p, &pl);
}

flce_status topk_check(const flce_topk_problem *problem, const flce_topk_tensors *t, const distill_device *dev,
                       flce_topk_problem *p, topk_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(flce_topk_problem_validate(p));
    TRY(check_tensors(t));
    TRY(topk_plan_make(p, dev, pl));
    if (t->workspace && t->workspace_bytes < pl->workspace_bytes)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.workspace_bytes=%llu: this problem needs %llu (flce_topk_workspace_size)",
                       (unsigned long long)t->workspace_bytes, (unsigned long long)pl->workspace_bytes);
    return FLCE_OK;
}

flce_status flce_topk_logprobs(flce_context *ctx, const flce_topk_problem *problem, const flce_topk_tensors *t,
                               void *stream)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_topk_problem p;
    topk_plan pl;
    distill_device dev = device_of(ctx);
    TRY(topk_check(problem, t, &dev, &p, &pl));
    return topk_run(ctx, &p, &pl, t, stream);
}
