/*
 * problem_input.h — how fuzz_problem's input bytes become a case: an flce_problem (struct_size
 * and api_version sometimes honest, sometimes not), the op / arch / SM count / given outputs that
 * plan_make sees, and a kernel_spec. fuzz_problem.c, spec_compile.c (the NVRTC test over the
 * corpus) and make_corpus.c (which writes the seeds) share it, so the corpus and its readers
 * agree on one layout.
 *
 * Layout, all integers little-endian, missing bytes read as 0 (fuzz.h). Fields are read in the
 * order of their structs, so a field added to flce_problem or kernel_spec is added here in place
 * and the seeds are rewritten with fuzz_make_corpus (make_corpus.c):
 *   u8  flags      bits 0-1 struct_size: 0 sizeof(flce_problem), 1 the u32 that follows,
 *                           2 the first published layout (up to memory_budget), 3 sizeof + 8;
 *                  bit 2    api_version is the u32 that follows (else FLCE_API_VERSION);
 *                  bit 3    the spec is the plan's spec of spec.role (when the problem plans);
 *                  bit 4    plan_make gets tensors (the outputs named by the mask below)
 *  [u32 struct_size] [u32 api_version]
 *   problem: i64 tokens hidden vocab_shard vocab_offset vocab_total, i32 dtype label_bits
 *            reduction, i64 ignore_index, f32 label_smoothing z_loss softcap temperature,
 *            i32 has_bias tp_rank tp_size allow_tf32 deterministic strategy, u64 memory_budget,
 *            i32 has_class_weights accumulate_grad_hidden accumulate_grad_weight sequence_parallel
 *   plan:    u8 op (mod 3), i32 sm, i32 num_sms, u16 outputs mask (TENSOR_*, testing/tensor_fields.h)
 *   spec:    i32 sm dtype, i64 hidden vocab_shard, i32 role bm bn bk stages warps_m warps_n
 *            loop (spec_mainloop) label_bits reduction, u32 opts, f32 softcap temperature smoothing z_loss
 */
#ifndef FLCE_FUZZ_PROBLEM_INPUT_H
#define FLCE_FUZZ_PROBLEM_INPUT_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "tensor_fields.h"

enum {
    PI_SIZE_HONEST = 0,
    PI_SIZE_GIVEN = 1,
    PI_SIZE_OLDER = 2,
    PI_SIZE_NEWER = 3,
    PI_SIZE_MASK = 3,
    PI_API_GIVEN = 1 << 2,
    PI_SPEC_FROM_PLAN = 1 << 3,
    PI_TENSORS = 1 << 4
};

typedef struct problem_case {
    unsigned flags;
    flce_problem problem; /* struct_size holds what the caller claims, which may be a lie */
    flce_op op;
    int sm, num_sms;
    unsigned outputs;     /* TENSOR_* */
    kernel_spec spec;     /* raw; see problem_case_pick_spec */
} problem_case;

void problem_case_decode(const uint8_t *data, size_t size, problem_case *c);

/* After flce_problem_validate accepted c->problem: the problem as the library goes on to use it
 * (api.c's normalize_problem), fields past the caller's struct_size at their defaults, so
 * plan_make sees what flce_workspace_size would hand it. */
void problem_case_normalize(problem_case *c);

/* The tensors plan_make sees: NULL without PI_TENSORS, else non-NULL dummies (plan_make only
 * tests them for NULL) for the outputs in the mask. */
const flce_tensors *problem_case_tensors(const problem_case *c, flce_tensors *storage);

/* With PI_SPEC_FROM_PLAN, replaces c->spec by the plan's spec of role (c->spec.role mod 4). */
void problem_case_pick_spec(problem_case *c, const plan *pl);

#endif
