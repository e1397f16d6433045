/* api.c — the public entry points of flce.h: argument checks with messages, then plan and launch. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "api_limits.h"
#include "comm.h"
#include "config.h"
#include "context.h"
#include "jit.h"
#include "launch.h"
#include "log.h"
#include "plan.h"
#include "tune_run.h"

const char *flce_version(void) { return FLCE_VERSION_STRING; }

const char *flce_last_error(void) { return err_message(); }

const char *flce_status_name(flce_status s)
{
    switch (s) {
    case FLCE_OK: return "FLCE_OK";
    case FLCE_ERR_INVALID_ARGUMENT: return "FLCE_ERR_INVALID_ARGUMENT";
    case FLCE_ERR_UNSUPPORTED: return "FLCE_ERR_UNSUPPORTED";
    case FLCE_ERR_NO_DRIVER: return "FLCE_ERR_NO_DRIVER";
    case FLCE_ERR_NO_DEVICE: return "FLCE_ERR_NO_DEVICE";
    case FLCE_ERR_CUDA: return "FLCE_ERR_CUDA";
    case FLCE_ERR_COMPILE: return "FLCE_ERR_COMPILE";
    case FLCE_ERR_OUT_OF_MEMORY: return "FLCE_ERR_OUT_OF_MEMORY";
    case FLCE_ERR_BAD_LABEL: return "FLCE_ERR_BAD_LABEL";
    case FLCE_ERR_IO: return "FLCE_ERR_IO";
    case FLCE_ERR_INTERNAL: return "FLCE_ERR_INTERNAL";
    case FLCE_ERR_NOT_READY: return "FLCE_ERR_NOT_READY";
    }
    return "FLCE_ERR_UNKNOWN";
}

void flce_problem_init(flce_problem *p)
{
    if (!p) return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->api_version = FLCE_API_VERSION;
    p->dtype = FLCE_DTYPE_BF16;
    p->label_bits = 32;
    p->reduction = FLCE_REDUCTION_MEAN;
    p->ignore_index = -100;
    p->temperature = 1.0f;
    p->tp_size = 1;
    p->strategy = FLCE_STRATEGY_AUTO;
}

void flce_tensors_init(flce_tensors *t)
{
    if (!t) return;
    memset(t, 0, sizeof *t);
    t->struct_size = sizeof *t;
}

/* Copies the caller's struct into a full-size one with defaults for fields it does not have. */
static flce_status normalize_problem(const flce_problem *in, flce_problem *out)
{
    if (!in) return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem: NULL");
    flce_problem_init(out);
    /* The first published layout ended at memory_budget; later fields default for such callers. */
    if (in->struct_size < offsetof(flce_problem, memory_budget) + sizeof in->memory_budget)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.struct_size=%u: smaller than any flce_problem (%zu); initialize "
                       "with flce_problem_init",
                       in->struct_size, sizeof *in);
    if (in->struct_size > sizeof *in)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "problem.struct_size=%u: the caller was built against a newer flce.h than "
                       "this library (%s, %zu bytes)",
                       in->struct_size, FLCE_VERSION_STRING, sizeof *in);
    memcpy(out, in, in->struct_size);
    if (out->tp_size > 1 && out->vocab_total == 0)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.vocab_total=0: with tp_size=%d it must give the global vocab size",
                       out->tp_size);
    /* Only when the sum cannot overflow; check_shapes reports the bad fields otherwise. */
    if (out->vocab_total == 0 && out->vocab_shard >= 1 && out->vocab_offset >= 0 &&
        out->vocab_offset <= INT64_MAX - out->vocab_shard)
        out->vocab_total = out->vocab_offset + out->vocab_shard;
    return FLCE_OK;
}

static flce_status check_shapes(const flce_problem *p)
{
    if (p->tokens < 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.tokens=%lld: must be at least 1",
                       (long long)p->tokens);
    /* Bounds that keep every workspace size and pointer offset far from 64-bit overflow. */
    if (p->tokens > FLCE_MAX_TOKENS)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.tokens=%lld: at most %d supported",
                       (long long)p->tokens, FLCE_MAX_TOKENS);
    if (p->hidden > FLCE_MAX_HIDDEN)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.hidden=%lld: at most %d supported",
                       (long long)p->hidden, FLCE_MAX_HIDDEN);
    if (p->hidden < 8 || p->hidden % 8)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.hidden=%lld: must be a positive multiple of 8", (long long)p->hidden);
    if (p->vocab_shard < 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.vocab_shard=%lld: must be at least 1",
                       (long long)p->vocab_shard);
    if (p->vocab_shard > FLCE_MAX_VOCAB)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.vocab_shard=%lld: at most %d supported",
                       (long long)p->vocab_shard, FLCE_MAX_VOCAB);
    if (p->vocab_offset < 0)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.vocab_offset=%lld: must not be negative",
                       (long long)p->vocab_offset);
    if (p->vocab_offset > p->vocab_total || p->vocab_shard > p->vocab_total - p->vocab_offset)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.vocab_offset + vocab_shard = %lld + %lld exceeds vocab_total=%lld",
                       (long long)p->vocab_offset, (long long)p->vocab_shard,
                       (long long)p->vocab_total);
    return FLCE_OK;
}

static flce_status check_enums(const flce_problem *p)
{
    if (p->dtype != FLCE_DTYPE_F32 && p->dtype != FLCE_DTYPE_F16 && p->dtype != FLCE_DTYPE_BF16)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.dtype=%d: not an flce_dtype", (int)p->dtype);
    if (p->label_bits != 32 && p->label_bits != 64)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.label_bits=%d: must be 32 or 64",
                       p->label_bits);
    if (p->reduction != FLCE_REDUCTION_MEAN && p->reduction != FLCE_REDUCTION_SUM &&
        p->reduction != FLCE_REDUCTION_NONE)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.reduction=%d: not an flce_reduction",
                       (int)p->reduction);
    if ((int)p->strategy < FLCE_STRATEGY_AUTO || (int)p->strategy > FLCE_STRATEGY_SAVED)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.strategy=%d: not an flce_strategy",
                       (int)p->strategy);
    if (p->tp_size < 1 || p->tp_rank < 0 || p->tp_rank >= p->tp_size)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.tp_rank=%d, tp_size=%d: need tp_size >= 1 and 0 <= tp_rank < tp_size",
                       p->tp_rank, p->tp_size);
    /* Bounds the all-gather buffer (tp_size blocks of 32 bytes per token) far from overflow. */
    if (p->tp_size > FLCE_MAX_TP)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.tp_size=%d: at most %d ranks supported",
                       p->tp_size, FLCE_MAX_TP);
    if (p->has_bias != 0 && p->has_bias != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.has_bias=%d: must be 0 or 1", p->has_bias);
    if (p->batch_invariant != 0 && p->batch_invariant != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.batch_invariant=%d: must be 0 or 1", p->batch_invariant);
    if (p->grad_outputs & ~(FLCE_GRAD_LOGPROB | FLCE_GRAD_LSE | FLCE_GRAD_ENTROPY | FLCE_GRAD_LOSS_PER_TOKEN))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.grad_outputs=0x%x: unknown bits (FLCE_GRAD_*)",
                       (unsigned)p->grad_outputs);
    return FLCE_OK;
}

static flce_status check_options(const flce_problem *p)
{
    if (!isfinite(p->label_smoothing) || p->label_smoothing < 0 || p->label_smoothing >= 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.label_smoothing=%g: must be in [0, 1)",
                       (double)p->label_smoothing);
    if (!isfinite(p->z_loss) || p->z_loss < 0)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.z_loss=%g: must be finite and >= 0",
                       (double)p->z_loss);
    if (!isfinite(p->softcap) || p->softcap < 0)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.softcap=%g: must be 0 (off) or a finite value > 0", (double)p->softcap);
    if (!isfinite(p->temperature) || p->temperature <= 0 || !isfinite(1.0f / p->temperature))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.temperature=%g: must be finite and > 0, with a finite fp32 reciprocal",
                       (double)p->temperature);
    if (p->has_class_weights != 0 && p->has_class_weights != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.has_class_weights=%d: must be 0 or 1",
                       p->has_class_weights);
    if ((p->accumulate_grad_hidden | p->accumulate_grad_weight) & ~1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.accumulate_grad_hidden=%d, accumulate_grad_weight=%d: must be 0 or 1",
                       p->accumulate_grad_hidden, p->accumulate_grad_weight);
    if (p->sequence_parallel != 0 && p->sequence_parallel != 1)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.sequence_parallel=%d: must be 0 or 1",
                       p->sequence_parallel);
    if (p->sequence_parallel && p->tp_size < 2)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.sequence_parallel=1: needs tp_size > 1 (tp_size=%d)", p->tp_size);
    if (p->sequence_parallel && p->tokens > INT32_MAX / p->tp_size)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "problem.tokens=%lld × tp_size=%d: at most %d tokens in all supported",
                       (long long)p->tokens, p->tp_size, INT32_MAX);
    return FLCE_OK;
}

flce_status flce_problem_validate(const flce_problem *problem)
{
    err_clear(); /* like every public call: success leaves no message behind */
    flce_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(check_shapes(&p));
    TRY(check_enums(&p));
    return check_options(&p);
}

static flce_status check_ptr(const void *ptr, const char *name, uintptr_t align, int required)
{
    if (!ptr) {
        if (required) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s: NULL (required)", name);
        return FLCE_OK;
    }
    if ((uintptr_t)ptr % align)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s=%p: must be %u-byte aligned", name, ptr,
                       (unsigned)align);
    return FLCE_OK;
}

/* Copies the caller's tensors into a full-size struct; fields it does not have are NULL. */
static flce_status normalize_tensors(const flce_tensors *in, flce_tensors *out)
{
    if (!in) return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: NULL");
    flce_tensors_init(out);
    size_t first = offsetof(flce_tensors, workspace_bytes) + sizeof in->workspace_bytes;
    if (in->struct_size < first || in->struct_size > sizeof *in)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.struct_size=%u: expected %zu to %zu; initialize with flce_tensors_init",
                       in->struct_size, first, sizeof *in);
    memcpy(out, in, in->struct_size);
    out->struct_size = sizeof *out;
    return FLCE_OK;
}

/* Tensor parallelism: which calls need the communicator, and that it matches the problem. */
static flce_status check_comm(const flce_problem *p, const flce_tensors *t, flce_op op, launch_part part)
{
    if (p->tp_size == 1) {
        if (t->comm)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "tensors.comm: given, but problem.tp_size is 1 (set tp_rank and tp_size)");
        return FLCE_OK;
    }
    if (part != PART_ALL) {
        if (p->sequence_parallel)
            return err_set(FLCE_ERR_UNSUPPORTED,
                           "problem.sequence_parallel=1: the split-phase calls serve plain TP; "
                           "sequence parallelism needs tensors.comm and flce_forward/_loss_and_grad");
        return FLCE_OK;
    }
    if (!t->comm) {
        /* A backward without collectives leaves dH as this rank's partial sum for the caller to
         * all-reduce; everything else needs the combined statistics. */
        if (op == FLCE_OP_BACKWARD && !p->sequence_parallel) return FLCE_OK;
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.comm: NULL with tp_size=%d; pass the NCCL communicator, or use the "
                       "split-phase calls (flce_forward_stats, flce_forward_finish)%s",
                       p->tp_size, p->sequence_parallel ? " (not with sequence_parallel)" : "");
    }
    return comm_check(t->comm, p->tp_rank, p->tp_size);
}

static flce_status check_tensors(const flce_problem *p, const flce_tensors *t, flce_op op,
                                 launch_part part)
{
    TRY(check_ptr(t->hidden, "hidden", 16, part != PART_TP_FINISH));
    TRY(check_ptr(t->weight, "weight", 16, part != PART_TP_FINISH));
    TRY(check_ptr(t->labels, "labels", (uintptr_t)p->label_bits / 8, 1));
    TRY(check_ptr(t->bias, "bias", 16, p->has_bias));
    TRY(check_ptr(t->grad_output, "grad_output", 4, 0));
    TRY(check_ptr(t->loss, "loss", 4, 0));
    TRY(check_ptr(t->lse, "lse", 4, op == FLCE_OP_BACKWARD));
    TRY(check_ptr(t->grad_hidden, "grad_hidden", 16, 0));
    TRY(check_ptr(t->grad_weight, "grad_weight", 16, 0));
    TRY(check_ptr(t->workspace, "workspace", 256, 0));
    TRY(check_ptr(t->class_weights, "class_weights", 4, p->has_class_weights));
    TRY(check_ptr(t->grad_bias, "grad_bias", 4, 0));
    TRY(check_ptr(t->loss_per_token, "loss_per_token", 4, 0));
    TRY(check_ptr(t->z_loss_out, "z_loss_out", 4, 0));
    TRY(check_ptr(t->target_logprob, "target_logprob", 4, 0));
    TRY(check_ptr(t->entropy, "entropy", 4, 0));
    TRY(check_ptr(t->argmax, "argmax", 8, 0));
    TRY(check_ptr(t->error_flag, "error_flag", 4, 0));
    int saved = p->strategy == FLCE_STRATEGY_SAVED;
    TRY(check_ptr(t->workspace, "workspace (strategy SAVED: the logits kept between the calls)", 256, saved));
    const struct {
        const float *ptr;
        int bit;
        const char *name;
    } token_grads[] = {{t->grad_logprob, FLCE_GRAD_LOGPROB, "grad_logprob"},
                       {t->grad_lse, FLCE_GRAD_LSE, "grad_lse"},
                       {t->grad_entropy, FLCE_GRAD_ENTROPY, "grad_entropy"},
                       {t->grad_loss_per_token, FLCE_GRAD_LOSS_PER_TOKEN, "grad_loss_per_token"}};
    for (int k = 0; k < 4; k++) {
        TRY(check_ptr(token_grads[k].ptr, token_grads[k].name, 4, 0));
        if (token_grads[k].ptr && !(p->grad_outputs & token_grads[k].bit))
            return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s: given, but problem.grad_outputs lacks its bit",
                           token_grads[k].name);
    }
    if (t->grad_entropy && op != FLCE_OP_FORWARD && !t->entropy)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.entropy: NULL, but grad_entropy is given (its dZ needs each token's entropy)");
    if (t->grad_bias && !p->has_bias)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.grad_bias: given, but problem.has_bias is 0");
    if (t->class_weights && !p->has_class_weights)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.class_weights: given, but problem.has_class_weights is 0");
    /* flce_backward writes gradients only; output pointers it is handed are left untouched. */
    if (op == FLCE_OP_FORWARD && part != PART_TP_STATS && !t->loss && !t->lse && !t->loss_per_token && !t->z_loss_out &&
        !t->target_logprob && !t->entropy && !t->argmax)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors: every output is NULL, nothing to compute");
    if (op == FLCE_OP_BACKWARD && !t->grad_hidden && !t->grad_weight)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.grad_hidden and tensors.grad_weight: both NULL, nothing to compute");
    return check_comm(p, t, op, part);
}

static flce_status check_strategy(const flce_problem *p, flce_op op)
{
    if (p->strategy == FLCE_STRATEGY_FORWARD && op != FLCE_OP_FORWARD)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.strategy=FORWARD: computes no gradients; use AUTO or CHUNKED here");
    if (p->strategy == FLCE_STRATEGY_SAVED && op == FLCE_OP_LOSS_AND_GRAD)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.strategy=SAVED: splits loss-and-grad into flce_forward + flce_backward; "
                       "use CHUNKED (or AUTO) for one call");
    if (p->strategy == FLCE_STRATEGY_RECOMPUTE && p->grad_outputs)
        return err_set(FLCE_ERR_UNSUPPORTED,
                       "problem.grad_outputs=0x%x: gradients of per-token outputs need strategy SAVED or CHUNKED, "
                       "not RECOMPUTE", (unsigned)p->grad_outputs);
    if ((p->strategy == FLCE_STRATEGY_CHUNKED || p->strategy == FLCE_STRATEGY_RECOMPUTE) &&
        op == FLCE_OP_FORWARD)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.strategy=%s: a forward call uses FORWARD (or AUTO)",
                       p->strategy == FLCE_STRATEGY_CHUNKED ? "CHUNKED" : "RECOMPUTE");
    return FLCE_OK;
}

/* The plan of `op` for `problem` on ctx's device, as flce_workspace_size, flce_strategy_of and
 * flce_prepare see it: t says which outputs the call asks for (NULL: the worst case). */
static flce_status plan_for(flce_context *ctx, const flce_problem *problem, flce_op op,
                            const flce_tensors *t, plan *pl)
{
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    if (op != FLCE_OP_FORWARD && op != FLCE_OP_LOSS_AND_GRAD && op != FLCE_OP_BACKWARD)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "op=%d: not an flce_op", (int)op);
    flce_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(flce_problem_validate(&p));
    TRY(check_strategy(&p, op));
    if (p.strategy == FLCE_STRATEGY_SAVED) op = FLCE_OP_LOSS_AND_GRAD; /* both calls run its plan */
    return plan_make_dev(&p, op, ctx->name, ctx->sm, ctx->num_sms, ctx->mem_bytes, t, pl);
}

flce_status flce_workspace_size(flce_context *ctx, const flce_problem *problem, flce_op op,
                                uint64_t *bytes)
{
    err_clear();
    CTX_LOG_SCOPE(ctx);
    if (!bytes) return err_set(FLCE_ERR_INVALID_ARGUMENT, "bytes: NULL");
    plan pl;
    TRY(plan_for(ctx, problem, op, NULL, &pl));
    *bytes = pl.workspace_bytes;
    return FLCE_OK;
}

/* The outputs a typical call of op asks for (loss, lse, and for training ops both gradients), for
 * planning only: just which pointers are non-NULL is read. */
static void typical_outputs(flce_op op, flce_tensors *t)
{
    static const char mark;
    flce_tensors_init(t);
    t->loss = t->lse = (float *)(uintptr_t)&mark;
    if (op != FLCE_OP_FORWARD) t->grad_hidden = t->grad_weight = (void *)(uintptr_t)&mark;
}

flce_status flce_prepare(flce_context *ctx, const flce_problem *problem, flce_op op,
                         const flce_tensors *tensors)
{
    err_clear();
    CTX_LOG_SCOPE(ctx);
    flce_tensors t;
    typical_outputs(op, &t);
    if (tensors) TRY(normalize_tensors(tensors, &t));
    plan pl;
    TRY(plan_for(ctx, problem, op, &t, &pl));
    launch_prebuild_kernels(ctx, &pl, 1); /* FLCE_DEV unlocked_compile: compiles before the lock */
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        ctx->preparing = 1; /* the kernels a call will run, not stand-ins (context.c, tiered) */
        st = launch_prepare_kernels(ctx, &pl);
        ctx->preparing = 0;
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

flce_status flce_strategy_of(flce_context *ctx, const flce_problem *problem, flce_op op,
                             flce_strategy *strategy)
{
    err_clear();
    CTX_LOG_SCOPE(ctx);
    if (!strategy) return err_set(FLCE_ERR_INVALID_ARGUMENT, "strategy: NULL");
    plan pl;
    TRY(plan_for(ctx, problem, op, NULL, &pl));
    *strategy = pl.saved                  ? FLCE_STRATEGY_SAVED
                : op == FLCE_OP_FORWARD ? FLCE_STRATEGY_FORWARD
                : pl.recompute        ? FLCE_STRATEGY_RECOMPUTE
                                      : FLCE_STRATEGY_CHUNKED;
    launch_log_plan(&pl);
    return FLCE_OK;
}

/* A forward that saves lse is one whose backward may follow (an inference forward asks for the
 * loss only): the backward's kernels start compiling into the disk cache now, on jit_prefetch's
 * thread, so the first flce_backward loads them instead of paying NVRTC (issue 16). It starts after
 * the forward's own kernels are loaded, takes no lock of ours and touches no stream; any problem
 * only means the backward compiles as before, so it never fails the forward. FLCE_PREFETCH=0: off
 * (checked first: each such forward otherwise plans the backward once more, microseconds). */
static void prefetch_backward(flce_context *ctx, const flce_problem *p, const flce_tensors *t)
{
    if (!ctx_background(ctx)) return; /* nothing to plan for */
    static const char mark;
    /* The backward call as the bindings make it: inputs, lse and both gradients, nothing else. */
    flce_tensors b;
    flce_tensors_init(&b);
    b.hidden = t->hidden, b.weight = t->weight, b.labels = t->labels, b.bias = t->bias;
    b.class_weights = t->class_weights, b.lse = t->lse, b.comm = t->comm;
    b.grad_hidden = b.grad_weight = (void *)(uintptr_t)&mark;
    flce_problem q = *p;
    if (q.strategy == FLCE_STRATEGY_FORWARD) q.strategy = FLCE_STRATEGY_AUTO;
    plan bp;
    if (plan_make_dev(&q, FLCE_OP_BACKWARD, ctx->name, ctx->sm, ctx->num_sms, ctx->mem_bytes, &b, &bp) ==
        FLCE_OK) {
        const kernel_spec *s[3] = {bp.fused_dz ? &bp.logits_dz : &bp.logits, &bp.dh, &bp.dw};
        jit_settings js = ctx_jit(&ctx->settings);
        jit_prefetch_with(&js, s, 3);
    }
    err_clear();
}

static flce_status run_op(flce_context *ctx, const flce_problem *problem,
                          const flce_tensors *tensors, void *stream, flce_op op, launch_part part,
                          const void *tp_buffer)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    CTX_LOG_SCOPE(ctx);
    flce_problem p;
    flce_tensors tt;
    const flce_tensors *t = &tt;
    TRY(normalize_problem(problem, &p));
    TRY(flce_problem_validate(&p));
    TRY(check_strategy(&p, op));
    TRY(normalize_tensors(tensors, &tt));
    TRY(check_tensors(&p, t, op, part));
    if (part != PART_ALL) {
        if (p.tp_size < 2)
            return err_set(FLCE_ERR_INVALID_ARGUMENT,
                           "problem.tp_size=%d: the split-phase calls need tp_size > 1", p.tp_size);
        TRY(check_ptr(tp_buffer, part == PART_TP_STATS ? "stats (argument)" : "gathered (argument)", 16, 1));
        tt.comm = NULL; /* the caller owns the collective */
    }
    if (p.strategy == FLCE_STRATEGY_SAVED) { /* the one plan of both calls (flce.h "Saved logits") */
        /* (the split-phase halves keep their part: the statistics half stores the logits too) */
        if (part == PART_ALL) part = op == FLCE_OP_FORWARD ? PART_SAVE : PART_SAVED_GRADS;
        return launch_call(ctx, &p, FLCE_OP_LOSS_AND_GRAD, t, (CUstream)stream, part,
                           (CUdeviceptr)(uintptr_t)tp_buffer);
    }
    /* FLCE_TUNE=1; tuning compiles, so not where a call must not (flce_options.compile_in_call) */
    if (part == PART_ALL && ctx->settings.compile_in_call) TRY(tune_first_use(ctx, &p, op, t, stream));
    flce_status st = launch_call(ctx, &p, op, t, (CUstream)stream, part, (CUdeviceptr)(uintptr_t)tp_buffer);
    if (st == FLCE_OK && op == FLCE_OP_FORWARD && part == PART_ALL && t->lse) prefetch_backward(ctx, &p, t);
    return st;
}

flce_status flce_forward(flce_context *ctx, const flce_problem *p, const flce_tensors *t, void *stream)
{
    return run_op(ctx, p, t, stream, FLCE_OP_FORWARD, PART_ALL, NULL);
}

flce_status flce_loss_and_grad(flce_context *ctx, const flce_problem *p, const flce_tensors *t,
                               void *stream)
{
    return run_op(ctx, p, t, stream, FLCE_OP_LOSS_AND_GRAD, PART_ALL, NULL);
}

flce_status flce_backward(flce_context *ctx, const flce_problem *p, const flce_tensors *t, void *stream)
{
    return run_op(ctx, p, t, stream, FLCE_OP_BACKWARD, PART_ALL, NULL);
}

flce_status flce_scale_gradients(flce_context *ctx, const flce_problem *problem, const flce_tensors *tensors,
                                 void *stream)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL (create one with flce_context_create)");
    CTX_LOG_SCOPE(ctx);
    flce_problem p;
    flce_tensors t;
    TRY(normalize_problem(problem, &p));
    TRY(flce_problem_validate(&p));
    TRY(normalize_tensors(tensors, &t));
    if (p.reduction == FLCE_REDUCTION_NONE)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.reduction=none: the upstream gradient is one value per token; pass it as "
                       "tensors.grad_output to flce_loss_and_grad or flce_backward instead");
    if (p.accumulate_grad_hidden || p.accumulate_grad_weight)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "problem.accumulate_grad_%s=1: gradients added into a caller's fp32 buffer cannot be "
                       "scaled afterwards; pass the upstream gradient as tensors.grad_output with the call",
                       p.accumulate_grad_hidden ? "hidden" : "weight");
    TRY(check_ptr(t.grad_output, "grad_output", 4, 1));
    TRY(check_ptr(t.grad_hidden, "grad_hidden", 16, 0));
    TRY(check_ptr(t.grad_weight, "grad_weight", 16, 0));
    TRY(check_ptr(t.grad_bias, "grad_bias", 4, 0));
    if (t.grad_bias && !p.has_bias)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.grad_bias: given, but problem.has_bias is 0");
    if (!t.grad_hidden && !t.grad_weight && !t.grad_bias)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "tensors.grad_hidden, grad_weight and grad_bias: all NULL, nothing to scale");
    p.strategy = FLCE_STRATEGY_AUTO; /* only the plan's shapes and row-kernel spec are used */
    /* The row kernels of the call whose gradients these are, as flce_prepare plans it: its module
     * holds the scale kernel and is loaded already. Planned for every output (NULL), the spec asked
     * for entropy and argmax too: a second module, compiled in the first backward of the Python
     * binding (0.5 s of its cold start, session 7). */
    flce_tensors typical;
    typical_outputs(FLCE_OP_LOSS_AND_GRAD, &typical);
    plan pl;
    TRY(plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, ctx->name, ctx->sm, ctx->num_sms, ctx->mem_bytes, &typical, &pl));
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        st = launch_scale(ctx, &pl, &t, (CUstream)stream);
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

flce_status flce_tp_stats_bytes(const flce_problem *problem, uint64_t *bytes)
{
    err_clear();
    if (!bytes) return err_set(FLCE_ERR_INVALID_ARGUMENT, "bytes: NULL");
    flce_problem p;
    TRY(normalize_problem(problem, &p));
    TRY(flce_problem_validate(&p));
    *bytes = plan_tp_block_bytes(p.tokens);
    return FLCE_OK;
}

flce_status flce_forward_stats(flce_context *ctx, const flce_problem *p, const flce_tensors *t,
                               void *stats, void *stream)
{
    return run_op(ctx, p, t, stream, FLCE_OP_FORWARD, PART_TP_STATS, stats);
}

flce_status flce_forward_finish(flce_context *ctx, const flce_problem *p, const flce_tensors *t,
                                const void *gathered, void *stream)
{
    return run_op(ctx, p, t, stream, FLCE_OP_FORWARD, PART_TP_FINISH, gathered);
}

flce_status flce_check(flce_context *ctx, void *stream)
{
    err_clear();
    if (!ctx) return err_set(FLCE_ERR_INVALID_ARGUMENT, "ctx: NULL");
    CTX_LOG_SCOPE(ctx);
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        CUresult r = drv.StreamSynchronize((CUstream)stream);
        st = r == CUDA_SUCCESS ? ctx_take_flag(ctx) : drv_error(r, "synchronizing the stream");
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
