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
/* Every array above, in the order of FLCE_TEMPLATES, NULL-terminated: for what hashes all the
 * kernel text (runtime/tune_table.c tune_generator_version, tests/test_compile.c). */
extern const char *const tmpl_all[];

#endif
