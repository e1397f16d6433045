/* problem_input.c — decodes fuzz_problem's input bytes into a case (layout in problem_input.h). */
#include <stddef.h>
#include <string.h>

#include "fuzz.h"
#include "problem_input.h"

static void decode_problem(fuzz_reader *r, flce_problem *p)
{
    p->tokens = fuzz_i64(r);
    p->hidden = fuzz_i64(r);
    p->vocab_shard = fuzz_i64(r);
    p->vocab_offset = fuzz_i64(r);
    p->vocab_total = fuzz_i64(r);
    /* Enums get any int: the validators must name an out-of-range value, not trust the type. */
    p->dtype = (flce_dtype)fuzz_i32(r);
    p->label_bits = fuzz_i32(r);
    p->reduction = (flce_reduction)fuzz_i32(r);
    p->ignore_index = fuzz_i64(r);
    p->label_smoothing = fuzz_f32(r);
    p->z_loss = fuzz_f32(r);
    p->softcap = fuzz_f32(r);
    p->temperature = fuzz_f32(r);
    p->has_bias = fuzz_i32(r);
    p->tp_rank = fuzz_i32(r);
    p->tp_size = fuzz_i32(r);
    p->allow_tf32 = fuzz_i32(r);
    p->deterministic = fuzz_i32(r);
    p->strategy = (flce_strategy)fuzz_i32(r);
    p->memory_budget = fuzz_u64(r);
    p->has_class_weights = fuzz_i32(r);
    p->accumulate_grad_hidden = fuzz_i32(r);
    p->accumulate_grad_weight = fuzz_i32(r);
    p->sequence_parallel = fuzz_i32(r);
}

static void decode_spec(fuzz_reader *r, kernel_spec *s)
{
    s->sm = fuzz_i32(r);
    s->dtype = (flce_dtype)fuzz_i32(r);
    s->hidden = fuzz_i64(r);
    s->vocab_shard = fuzz_i64(r);
    s->role = (spec_role)fuzz_i32(r);
    s->tile.bm = fuzz_i32(r);
    s->tile.bn = fuzz_i32(r);
    s->tile.bk = fuzz_i32(r);
    s->tile.stages = fuzz_i32(r);
    s->tile.warps_m = fuzz_i32(r);
    s->tile.warps_n = fuzz_i32(r);
    s->tile.loop = (spec_mainloop)fuzz_i32(r);
    s->label_bits = fuzz_i32(r);
    s->reduction = (flce_reduction)fuzz_i32(r);
    s->opts = fuzz_u32(r);
    s->softcap = fuzz_f32(r);
    s->temperature = fuzz_f32(r);
    s->smoothing = fuzz_f32(r);
    s->z_loss = fuzz_f32(r);
}

void problem_case_decode(const uint8_t *data, size_t size, problem_case *c)
{
    fuzz_reader r = {data, size};
    memset(c, 0, sizeof *c);
    c->flags = fuzz_u8(&r);
    uint32_t struct_size = (uint32_t)sizeof(flce_problem);
    switch (c->flags & PI_SIZE_MASK) {
    case PI_SIZE_GIVEN: struct_size = fuzz_u32(&r); break;
    case PI_SIZE_OLDER: struct_size = (uint32_t)offsetof(flce_problem, has_class_weights); break;
    case PI_SIZE_NEWER: struct_size += 8; break;
    default: break;
    }
    uint32_t api_version = (c->flags & PI_API_GIVEN) ? fuzz_u32(&r) : FLCE_API_VERSION;
    decode_problem(&r, &c->problem);
    c->problem.struct_size = struct_size;
    c->problem.api_version = api_version;
    c->op = (flce_op)(fuzz_u8(&r) % 3);
    c->sm = fuzz_i32(&r);
    c->num_sms = fuzz_i32(&r);
    c->outputs = (unsigned)fuzz_take(&r, 2);
    decode_spec(&r, &c->spec);
}

void problem_case_normalize(problem_case *c)
{
    flce_problem full;
    flce_problem_init(&full);
    size_t have = c->problem.struct_size < sizeof full ? c->problem.struct_size : sizeof full;
    memcpy(&full, &c->problem, have);
    full.struct_size = (uint32_t)sizeof full; /* (vocab_total is left as given: no plan uses it) */
    c->problem = full;
}

const flce_tensors *problem_case_tensors(const problem_case *c, flce_tensors *t)
{
    /* Never dereferenced: plan_make only asks which outputs the caller gave. */
    static float dummy[4];
    if (!(c->flags & PI_TENSORS)) return NULL;
    flce_tensors_init(t);
    unsigned m = c->outputs;
    if (m & TENSOR_LOSS) t->loss = dummy;
    if (m & TENSOR_LSE) t->lse = dummy;
    if (m & TENSOR_GRAD_HIDDEN) t->grad_hidden = dummy;
    if (m & TENSOR_GRAD_WEIGHT) t->grad_weight = dummy;
    if (m & TENSOR_GRAD_BIAS) t->grad_bias = dummy;
    if (m & TENSOR_LOSS_PER_TOKEN) t->loss_per_token = dummy;
    if (m & TENSOR_Z_LOSS) t->z_loss_out = dummy;
    if (m & TENSOR_TARGET_LOGPROB) t->target_logprob = dummy;
    if (m & TENSOR_ENTROPY) t->entropy = dummy;
    if (m & TENSOR_ARGMAX) t->argmax = (int64_t *)(void *)dummy;
    if (m & TENSOR_CLASS_WEIGHTS) t->class_weights = dummy;
    return t;
}

void problem_case_pick_spec(problem_case *c, const plan *pl)
{
    if (!(c->flags & PI_SPEC_FROM_PLAN)) return;
    const kernel_spec *by_role[4] = {&pl->logits, &pl->dh, &pl->dw, &pl->rowops};
    c->spec = *by_role[(unsigned)c->spec.role % 4];
}
