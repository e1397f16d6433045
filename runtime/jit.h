/*
 * jit.h — spec → cubin, through the on-disk cache and NVRTC. No GPU needed (the tool's no-GPU demo
 * and the cpu tests use it directly); the context loads the cubin it returns (context.c).
 */
#ifndef FLCE_JIT_H
#define FLCE_JIT_H

#include <stddef.h>

#include "spec.h"

typedef enum jit_origin { JIT_COMPILED = 0, JIT_DISK_HIT = 1 } jit_origin;

typedef struct jit_result {
    void *cubin;        /* malloc'd; caller frees */
    size_t len;
    jit_origin origin;
    double ms;          /* time spent (compile or disk read) */
} jit_result;

flce_status jit_build(const kernel_spec *s, jit_result *out);

/* jit_build of n ≤ 8 specs at once, one thread each (NVRTC runs one compile per thread; the disk
 * cache takes concurrent writers), so a first call waits for its slowest kernel instead of the sum
 * of all of them. All or nothing: on a failure every cubin is freed and the first failing spec's
 * status and message are returned. */
flce_status jit_build_many(const kernel_spec *const *specs, int n, jit_result *out);

/* The cache key of a spec: its summary line, the toolchain identity, then the full source.
 * *key is malloc'd. */
flce_status jit_key(const kernel_spec *s, char **key, size_t *len);

#endif
