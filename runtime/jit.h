/*
 * jit.h — spec → cubin, through the on-disk cache and NVRTC. No GPU needed (the tool's no-GPU demo
 * and the cpu tests use it directly); the context loads the cubin it returns (context.c).
 */
#ifndef FLCE_JIT_H
#define FLCE_JIT_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

typedef enum jit_origin { JIT_COMPILED = 0, JIT_DISK_HIT = 1 } jit_origin;

typedef struct jit_result {
    void *cubin;        /* malloc'd; caller frees */
    size_t len;
    jit_origin origin;
    double ms;          /* time spent (compile or disk read) */
    uint64_t key_hash[2]; /* jit_key_hash of the spec */
} jit_result;

/* Where and how kernels build: a context's settings (flce_options, context.h), or NULL for the
 * process's (the environment's: FLCE_CACHE_DIR and FLCE_CACHE_RO at each use, FLCE_COMPILE_THREADS,
 * FLCE_PREFETCH), which the functions without _with use. The strings are only read during the call
 * (a prefetch copies them). */
typedef struct jit_settings {
    const char *cache_dir; /* the writable cache directory, used as given; NULL: cache_dir_writable's */
    const char *cache_ro;  /* read-only layers "dir1:dir2" ("" none); NULL: $FLCE_CACHE_RO */
    int threads;           /* the most compiles one jit_build_many runs at once, 1..8; 0: FLCE_COMPILE_THREADS */
    int background;        /* jit_prefetch queues compiles (1) or not (0); -1: FLCE_PREFETCH */
} jit_settings;

flce_status jit_build(const kernel_spec *s, jit_result *out);
flce_status jit_build_with(const jit_settings *js, const kernel_spec *s, jit_result *out);

/* jit_build from the disk cache only (its read-only layers included): no compile, no lock. A miss
 * is FLCE_OK with out->cubin NULL. */
flce_status jit_lookup(const kernel_spec *s, jit_result *out);
flce_status jit_lookup_with(const jit_settings *js, const kernel_spec *s, jit_result *out);

/* jit_build of n ≤ 8 specs at once, one thread each up to the settings' threads (NVRTC runs one
 * compile per thread; the disk cache takes concurrent writers), so a first call waits for its
 * slowest kernel instead of the sum of all of them. The threads log through the caller's log sink
 * (log.h). All or nothing: on a failure every cubin is freed and the first failing spec's status and
 * message are returned. */
flce_status jit_build_many(const kernel_spec *const *specs, int n, jit_result *out);
flce_status jit_build_many_with(const jit_settings *js, const kernel_spec *const *specs, int n, jit_result *out);

/* Compiles specs (n ≤ 8) into the disk cache on one detached background thread (they build at once
 * there, through the compile lock), so that a later call needing them loads them instead of
 * compiling: issue 16's "the backward's kernels when the forward is called". Returns at once, the
 * number of kernels queued; never waits for NVRTC, never touches a context, a stream or a lock of
 * the caller. Each spec (by its summary line) is queued
 * at most once per process, so calling it on every step costs a table lookup; a failed build is
 * logged (debug) and not retried. Nothing is queued when FLCE_PREFETCH=0, when there is no cache
 * directory (nothing to fill) or after JIT_PREFETCH_MAX distinct specs. A call that needs a kernel
 * while it is being prefetched waits for it on the entry's compile lock rather than compiling it
 * again. At exit the process waits (up to JIT_PREFETCH_EXIT_WAIT_S) for a prefetch in progress, so
 * it never unloads NVRTC under a running compile. */
#define JIT_PREFETCH_MAX 256
#define JIT_PREFETCH_EXIT_WAIT_S 60.0
int jit_prefetch(const kernel_spec *const *specs, int n);
/* jit_prefetch into js's cache (a spec is queued once per process and directory), compiling with its
 * threads; nothing when its background is 0. The background thread logs to the process's log
 * (FLCE_LOG), never to a context's callback: it may outlive the context. */
int jit_prefetch_with(const jit_settings *js, const kernel_spec *const *specs, int n);
/* Where spec s's prefetch stands in this process: never queued, queued or compiling, or finished
 * (built, failed, or queued by the parent of this forked process): the tier of context.c serves
 * the specialized kernel's calls from a stand-in only while it is JIT_PREFETCH_QUEUED. */
typedef enum { JIT_PREFETCH_NONE = 0, JIT_PREFETCH_QUEUED = 1, JIT_PREFETCH_FINISHED = 2 } jit_prefetch_status;
jit_prefetch_status jit_prefetch_state(const kernel_spec *s);
jit_prefetch_status jit_prefetch_state_with(const jit_settings *js, const kernel_spec *s);
/* Waits up to timeout_s for every prefetch queued so far to finish, and joins the threads whose work
 * is done (exit waits here: runtime/jit.c); 1 when none is left running. */
int jit_prefetch_wait(double timeout_s);

/* The cache key of a spec: its summary line, the toolchain identity, then the full source.
 * *key is malloc'd. */
flce_status jit_key(const kernel_spec *s, char **key, size_t *len);
/* hash128 of jit_key: the name of the spec's disk cache entry, and the identity a context keeps a
 * loaded module under (context.c): equal hashes, equal source and toolchain. Emits the source. */
flce_status jit_key_hash(const kernel_spec *s, uint64_t out[2]);

#endif
