/*
 * emit.h — turns a valid kernel spec into the exact CUDA source NVRTC compiles: a preamble of
 * compile-time constants, then the embedded template text (params.h, common.cuh, the role's
 * template). `flce gen` prints the same string; it also compiles with nvcc as it is.
 */
#ifndef FLCE_EMIT_H
#define FLCE_EMIT_H

#include "spec.h"

/* *src is malloc'd (caller frees). Validates the spec first. */
flce_status emit_source(const kernel_spec *s, char **src);

/* Names of the kernels in a role's module, NULL-terminated. */
const char *const *emit_kernel_names(spec_role role);

/* The distillation call's kernels (templates/distill.cu, runtime/distill.c): what they are
 * specialized on. The GEMMs around them are ordinary kernel_specs. */
typedef struct distill_kernel_spec {
    int sm;                   /* compute capability ×10 */
    flce_dtype dtype;         /* of the GEMMs' inputs and gradient outputs */
    flce_divergence divergence; /* JSD with β = 0 or 1 is emitted as forward or reverse KL */
    float beta;               /* JSD's β */
    float temperature;        /* T > 0 */
    float ce_weight;          /* 0 = no CE term (needs labels and T = 1 otherwise) */
    int has_labels;           /* labels given */
    int label_bits;           /* 32 or 64 */
    flce_reduction reduction;
} distill_kernel_spec;

/* *src is malloc'd (caller frees): the preamble of s's constants, then templates/distill.cu. */
flce_status emit_distill_source(const distill_kernel_spec *s, char **src);

/* The embedded template files, one array per file of templates/ (CMakeLists.txt FLCE_TEMPLATES,
 * cmake/embed.cmake); emit_source pastes those a spec uses. */
extern const char tmpl_params_h[];
extern const char tmpl_common_cuh[];
extern const char tmpl_gemm_cu[];
extern const char tmpl_gemm_wgmma_cu[];
extern const char tmpl_gemm_wgmma_tma_cu[];
extern const char tmpl_gemm_tcgen05_cu[];
extern const char tmpl_gemm_wgmma_cp_async_cu[];
extern const char tmpl_gemm_mma_sync_cu[];
extern const char tmpl_gemm_logits_cu[];
extern const char tmpl_gemm_grad_cu[];
extern const char tmpl_gemm_entry_cu[];
extern const char tmpl_rowops_cu[];
extern const char tmpl_distill_cu[];
/* Every array above, in the order of FLCE_TEMPLATES, NULL-terminated: for what hashes all the
 * kernel text (runtime/tune_table.c tune_generator_version, tests/test_compile.c). */
extern const char *const tmpl_all[];

#endif
