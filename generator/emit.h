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

/* The embedded template files (generated at build time from templates/). */
extern const char tmpl_params_h[];
extern const char tmpl_common_cuh[];
extern const char tmpl_gemm_cu[]; /* templates/gemm.cu and its pieces, concatenated (CMakeLists.txt) */
extern const char tmpl_rowops_cu[];

#endif
