/*
 * dynload.h — opens a shared library at run time by its usual names, so libflce.so needs NVRTC only
 * when it compiles and NCCL only for collectives (issue 17): one build loads beside CUDA 12 and 13
 * applications and on machines without NCCL. Used by nvrtc_compile.c and comm.c.
 */
#ifndef FLCE_DYNLOAD_H
#define FLCE_DYNLOAD_H

#include <stddef.h>

/* The first of `names` (NULL-terminated) that dlopen finds, else the same names in the toolkit
 * library directory the build saw (FLCE_TOOLKIT_LIB_DIR); `override`, when set and non-empty, is
 * the only path tried. NULL when none loads: `why` then lists what was tried and dlerror's words. */
void *dyn_open(const char *const *names, const char *override, char *why, size_t cap);

/* dyn_open, then each of the n symbol names into the matching slot of `table`, a struct of n function
 * pointers in the same order. 1 when all loaded; else 0 with what was tried or the missing symbol
 * in `why`. */
int dyn_load_table(const char *const *libs, const char *override, const char *const *syms, int n,
                   void *table, char *why, size_t cap);

#endif
