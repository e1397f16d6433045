/* distill_api.c — the public distillation entry points of flce.h (issue 44): argument checks with
 * messages naming the argument, the workspace size, then distill.c's launch. Called by users and by
 * python/flce/_distill_lib.py. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api_limits.h"
#include "context.h"
#include "distill.h"
#include "error.h"
#include "row_call.h"
#include "log.h"

void flce_distill_problem_init(flce_distill_problem *p)
{
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->api_version = FLCE_API_VERSION;
    p->dtype = FLCE_DTYPE_BF16;
    p->label_bits = 32;
    p->divergence = FLCE_DIVERGENCE_FORWARD_KL;
    p->beta = 0.5f;
    p->temperature = 1.0f;
    p->ignore_index = -100;
    p->reduction = FLCE_REDUCTION_MEAN;
    p->tp_size = 1;
}

void flce_distill_tensors_init(flce_distill_tensors *t)
{
    if (!t) return;
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
}

static flce_status normalize_problem(const flce_distill_problem *in, flce_distill_problem *out)
{
    if (!in) return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem: NULL");
    flce_distill_problem_init(out);
    TRY(call_check_struct_size(in->struct_size, sizeof *in, "problem", "flce_distill_problem"));
    memcpy(out, in, sizeof *out);
    return FLCE_OK;
}

/* The tensor-parallel fields: a shard of a vocab the ranks tile (every divergence, dtype and teacher
 * form runs under TP). */
static flce_status check_tp(const flce_distill_problem *p)
{
    if (p->tp_size < 1 || p->tp_size > FLCE_MAX_TP || p->tp_rank < 0 || p->tp_rank >= p->tp_size)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.tp_rank=%d, tp_size=%d: need 1 <= tp_size <= %d and 0 <= tp_rank < tp_size",
                       p->tp_rank, p->tp_size, FLCE_MAX_TP);
    const int64_t total = p->vocab_total ? p->vocab_total : p->vocab_offset + p->vocab;
    if (p->vocab_offset < 0 || total > FLCE_MAX_VOCAB * (int64_t)FLCE_MAX_TP || p->vocab_offset + p->vocab > total)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.vocab_offset=%lld, vocab=%lld, vocab_total=%lld: this rank's rows "
                       "[vocab_offset, vocab_offset + vocab) must lie in [0, vocab_total)",
                       (long long)p->vocab_offset, (long long)p->vocab, (long long)p->vocab_total);
    if (p->tp_size == 1) {
        if (p->vocab_offset != 0 || total != p->vocab)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "problem.vocab_offset=%lld, vocab_total=%lld with tp_size=1: one rank holds the "
                           "whole vocab (vocab_offset 0, vocab_total 0 or vocab=%lld)",
                           (long long)p->vocab_offset, (long long)p->vocab_total, (long long)p->vocab);
        return FLCE_OK;
    }
    return FLCE_OK;
}

flce_status flce_distill_problem_validate(const flce_distill_problem *problem)
{
    flce_distill_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(call_check_dim(p.tokens, "tokens", 1, 1, FLCE_MAX_TOKENS));
    TRY(call_check_dim(p.hidden_student, "hidden_student", 8, 8, FLCE_MAX_HIDDEN));
    if (p.teacher_topk == 0)
        TRY(call_check_dim(p.hidden_teacher, "hidden_teacher", 8, 8, FLCE_MAX_HIDDEN));
    TRY(call_check_dim(p.vocab, "vocab", 1, 1, FLCE_MAX_VOCAB));
    TRY(call_check_dtype(p.dtype));
    if (p.label_bits != 32 && p.label_bits != 64)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.label_bits=%d: must be 32 or 64", p.label_bits);
    if (p.reduction != FLCE_REDUCTION_MEAN && p.reduction != FLCE_REDUCTION_SUM &&
        p.reduction != FLCE_REDUCTION_NONE)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.reduction=%d: not an flce_reduction",
                       (int)p.reduction);
    if (p.divergence != FLCE_DIVERGENCE_FORWARD_KL && p.divergence != FLCE_DIVERGENCE_REVERSE_KL &&
        p.divergence != FLCE_DIVERGENCE_JSD)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.divergence=%d: not an flce_divergence",
                       (int)p.divergence);
    if (!(p.beta >= 0.0f && p.beta <= 1.0f)) /* NaN fails too */
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.beta=%g: must be in [0, 1]", (double)p.beta);
    TRY(call_check_temperature(p.temperature));
    if (p.teacher_topk != 0) {
        if (p.teacher_topk < 0 || p.teacher_topk > DISTILL_TOPK_MAX || p.teacher_topk > p.vocab)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "problem.teacher_topk=%d: must be 0 (the teacher's weights) or in [1, %d] and at most "
                           "problem.vocab=%lld", p.teacher_topk, DISTILL_TOPK_MAX, (long long)p.vocab);
        if (p.hidden_teacher != 0)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "problem.hidden_teacher=%lld: must be 0 when the teacher comes as top-k "
                           "(problem.teacher_topk=%d)", (long long)p.hidden_teacher, p.teacher_topk);
        if (!(p.divergence == FLCE_DIVERGENCE_FORWARD_KL || (p.divergence == FLCE_DIVERGENCE_JSD && p.beta <= 0.0f)))
            return err_set(FLCE_ERR_UNSUPPORTED,
                           "problem.divergence=%d with problem.teacher_topk=%d: a teacher's top-k gives forward KL "
                           "over its ids only (reverse KL and JSD need every p)", (int)p.divergence, p.teacher_topk);
    }
    if (!(p.ce_weight >= 0.0f) || !isfinite(p.ce_weight))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.ce_weight=%g: must be finite and >= 0",
                       (double)p.ce_weight);
    if (p.ce_weight != 0.0f && p.temperature != 1.0f)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "problem.ce_weight=%g with problem.temperature=%g: the CE term runs at temperature "
                       "1 only in this version (set temperature 1 or ce_weight 0)",
                       (double)p.ce_weight, (double)p.temperature);
    return check_tp(&p);
}

static flce_status check_tensors(const flce_distill_problem *p, const flce_distill_tensors *t)
{
    if (!t) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: NULL");
    TRY(call_check_struct_size(t->struct_size, sizeof *t, "tensors", "flce_distill_tensors"));
    TRY(call_check_ptr(t->student_hidden, "student_hidden", 16, 1));
    TRY(call_check_ptr(t->student_weight, "student_weight", 16, 1));
    if (p->teacher_topk) {
        if (t->teacher_hidden || t->teacher_weight)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "tensors.%s: given, but problem.teacher_topk=%d says the teacher comes as top-k "
                           "(give its hidden states and weight, or its top-k, not both)",
                           t->teacher_hidden ? "teacher_hidden" : "teacher_weight", p->teacher_topk);
        TRY(call_check_ptr(t->teacher_topk_indices, "teacher_topk_indices", 8, 1));
        TRY(call_check_ptr(t->teacher_topk_logprobs, "teacher_topk_logprobs", 4, 1));
    } else {
        if (t->teacher_topk_indices || t->teacher_topk_logprobs)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "tensors.%s: given, but problem.teacher_topk is 0 (the teacher as hidden states and "
                           "weight); set problem.teacher_topk to k to give the teacher as top-k",
                           t->teacher_topk_indices ? "teacher_topk_indices" : "teacher_topk_logprobs");
        TRY(call_check_ptr(t->teacher_hidden, "teacher_hidden", 16, 1));
        TRY(call_check_ptr(t->teacher_weight, "teacher_weight", 16, 1));
    }
    TRY(call_check_ptr(t->labels, "labels", (uintptr_t)p->label_bits / 8, 0));
    TRY(call_check_ptr(t->grad_output, "grad_output", 4, 0));
    TRY(call_check_ptr(t->loss, "loss", 4, 0));
    TRY(call_check_ptr(t->divergence, "divergence", 4, 0));
    TRY(call_check_ptr(t->grad_student_hidden, "grad_student_hidden", 16, 0));
    TRY(call_check_ptr(t->grad_student_weight, "grad_student_weight", 16, 0));
    TRY(call_check_ptr(t->workspace, "workspace", 16, 0));
    if (p->tp_size > 1 && !t->comm)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.comm: NULL, but problem.tp_size=%d: distillation under tensor parallelism issues "
                       "its collectives per token chunk itself (give the group's ncclComm_t)", p->tp_size);
    if (p->tp_size == 1 && t->comm)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.comm: given, but problem.tp_size is 1");
    if (p->ce_weight != 0.0f && !t->labels)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.labels: NULL, but problem.ce_weight=%g needs labels for its CE term",
                       (double)p->ce_weight);
    if (!t->loss && !t->divergence && !t->grad_student_hidden && !t->grad_student_weight)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: every output is NULL, nothing to compute");
    return FLCE_OK;
}

/* The problem as checked and its plan for ctx's device with the tensors given (NULL: the worst
 * case), for workspace_size and prepare. */
static flce_status plan_problem(const flce_context *ctx, const flce_distill_problem *problem,
                                const flce_distill_tensors *t, flce_distill_problem *p, distill_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(flce_distill_problem_validate(p));
    if (t) TRY(call_check_struct_size(t->struct_size, sizeof *t, "tensors", "flce_distill_tensors"));
    call_device dev = call_device_of(ctx);
    return distill_plan_make(p, &dev, t, pl);
}

/* What the plan depends on of the context's device. */
flce_status flce_distill_workspace_size(flce_context *ctx, const flce_distill_problem *problem,
                                        uint64_t *bytes)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    if (!bytes) return err_set(FLCE_ERR_INVALID_ARGUMENT, "bytes: NULL");
    flce_distill_problem p;
    distill_plan pl;
    TRY(plan_problem(ctx, problem, NULL, &p, &pl));
    *bytes = pl.workspace_bytes;
    return FLCE_OK;
}

flce_status flce_distill_prepare(flce_context *ctx, const flce_distill_problem *problem,
                                 const flce_distill_tensors *tensors)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_distill_problem p;
    distill_plan pl;
    TRY(plan_problem(ctx, problem, tensors, &p, &pl));
    return distill_prepare(ctx, &p, &pl, tensors);
}

flce_status distill_check(const flce_distill_problem *problem, const flce_distill_tensors *t,
                          const call_device *dev, flce_distill_problem *p, distill_plan *pl)
{
    TRY(normalize_problem(problem, p));
    TRY(flce_distill_problem_validate(p));
    TRY(check_tensors(p, t));
    TRY(distill_plan_make(p, dev, t, pl));
    return call_check_workspace(t->workspace, t->workspace_bytes, pl->workspace_bytes, "flce_distill_workspace_size");
}

flce_status flce_distill_loss_and_grad(flce_context *ctx, const flce_distill_problem *problem,
                                       const flce_distill_tensors *t, void *stream)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    flce_distill_problem p;
    distill_plan pl;
    call_device dev = call_device_of(ctx);
    TRY(distill_check(problem, t, &dev, &p, &pl));
    return distill_run(ctx, &p, &pl, t, stream);
}
