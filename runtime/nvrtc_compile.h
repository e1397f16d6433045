/*
 * nvrtc_compile.h — compiles generated CUDA source to a cubin for one exact arch with NVRTC (never
 * PTX-only: a cubin loads without the driver's JIT). Needs no GPU, so CI compiles every spec.
 */
#ifndef FLCE_NVRTC_H
#define FLCE_NVRTC_H

#include <stddef.h>

#include "error.h"

/* *cubin is malloc'd (caller frees). On failure FLCE_ERR_COMPILE with NVRTC's log in the message. */
flce_status nvrtc_compile(const char *src, const char *name, int sm, void **cubin, size_t *len);
/* The options nvrtc_compile passes for `sm`, joined by spaces (part of the cache key). */
const char *nvrtc_options_text(int sm, char *out, size_t cap);
/* "13.0" ("0.0" when NVRTC could not be loaded) */
const char *nvrtc_version_text(void);
/* The loaded libnvrtc's GNU build ID in hex ("none" when it has none or NVRTC is not loaded): part of
 * every cache key, so a toolkit update that keeps major.minor still misses the old entries. */
const char *nvrtc_build_text(void);
/* NULL once NVRTC is loaded (it is opened at run time, runtime/dynload.h), else what was tried. */
const char *nvrtc_load_error(void);
/* The file NVRTC was loaded from (NULL when it could not be loaded or the file is unknown). */
const char *nvrtc_library_file(void);

#endif
