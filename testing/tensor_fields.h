/*
 * tensor_fields.h — one bit per optional pointer of flce_tensors, for the code that chooses which
 * a call passes: the GPU fuzzer's cases (testing/fuzz_case.c, the outputs a case asks for) and
 * fuzz_problem's inputs (fuzz/problem_input.c, the fields plan_make gets non-NULL).
 *
 * The values are part of the fuzz_problem corpus (fuzz/corpus/problem, its u16 outputs mask): add
 * bits at the end, never renumber.
 */
#ifndef FLCE_TENSOR_FIELDS_H
#define FLCE_TENSOR_FIELDS_H

enum {
    TENSOR_LOSS = 1 << 0,
    TENSOR_LSE = 1 << 1,
    TENSOR_GRAD_HIDDEN = 1 << 2,
    TENSOR_GRAD_WEIGHT = 1 << 3,
    TENSOR_GRAD_BIAS = 1 << 4,
    TENSOR_LOSS_PER_TOKEN = 1 << 5,
    TENSOR_Z_LOSS = 1 << 6,
    TENSOR_TARGET_LOGPROB = 1 << 7,
    TENSOR_ENTROPY = 1 << 8,
    TENSOR_ARGMAX = 1 << 9,
    TENSOR_CLASS_WEIGHTS = 1 << 10
};

#endif
