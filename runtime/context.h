/*
 * context.h — what an flce_context holds (internal): the device and its primary context, the
 * kernels loaded so far (memory cache keyed by the hash of the source and toolchain, jit_key_hash),
 * an owned workspace, and the
 * host-mapped error flag that kernels raise and every call reads without synchronizing.
 */
#ifndef FLCE_CONTEXT_H
#define FLCE_CONTEXT_H

#include <pthread.h>
#include <stdint.h>

#include "cache.h"
#include "driver.h"
#include "jit.h"
#include "log.h"
#include "spec.h"

enum { CTX_MAX_KERNELS = 13 };

typedef struct ctx_module {
    uint64_t hash[2];  /* jit_key_hash of the source: the module's identity */
    kernel_spec spec;  /* the spec it was loaded for: equal bytes find it without emitting source */
    CUmodule module;
    CUfunction fn[CTX_MAX_KERNELS];
} ctx_module;

#define CTX_MAX_ALIASES 256
#define CTX_MAX_STANDINS 16

/* A context's settings (flce_options, resolved by flce_context_create_ex): where its kernels are
 * cached, how they compile, where its log lines go. */
typedef struct ctx_settings {
    char cache_dir[CACHE_PATH_MAX]; /* "": the process's (cache_dir_writable, at each use) */
    char cache_ro[CACHE_PATH_MAX];  /* with cache_ro_given; else $FLCE_CACHE_RO at each use */
    int cache_ro_given;
    int compile_threads;            /* 1..8; 0: FLCE_COMPILE_THREADS */
    int background;                 /* 0/1; -1: FLCE_PREFETCH (the process's, config_get) */
    int compile_in_call;            /* 0: FLCE_ERR_NOT_READY instead of compiling in a call */
    log_sink log;                   /* the thread's sink during the context's calls (CTX_LOG_SCOPE) */
} ctx_settings;

/* options (NULL: the environment's, as flce_context_create always took them: the cache directory,
 * its layers and FLCE_LOG at each use, the rest from config_get) into *out; a field out of range is
 * FLCE_ERR_INVALID_ARGUMENT naming it. No device needed (tests/test_options.c). */
flce_status ctx_settings_from(const flce_options *options, ctx_settings *out);
/* The jit's view of s (pointing into it: valid while s is). */
jit_settings ctx_jit(const ctx_settings *s);
/* Whether ctx compiles in the background (its flce_options.background_compile, else FLCE_PREFETCH). */
int ctx_background(const flce_context *ctx);

struct flce_context {
    ctx_settings settings;
    int ordinal;
    CUdevice dev;
    CUcontext primary;
    int sm;
    int num_sms;
    uint64_t mem_bytes; /* the device's memory: AUTO's default budget may take 1/16 of it (plan.h) */
    char name[256];
    pthread_mutex_t lock;
    ctx_module *modules;
    size_t n_modules, cap_modules;
    /* Specs that found a loaded module by their source's hash (kernels do not depend on D and V,
     * so another shape's spec finds the same module): their bytes, so that the next lookup needs
     * no source and no hash. At most CTX_MAX_ALIASES; beyond, lookups hash again. */
    struct ctx_alias {
        kernel_spec spec;
        size_t module;
    } *aliases;
    size_t n_aliases;
    /* Tiered kernels (issue 16): specs specialized for full vocab tiles whose kernel was neither
     * loaded nor on disk, served by the generic kernel (full_tiles 0, same tiles and flags) while
     * the specialized one compiles in the background (jit_prefetch); an entry goes when that
     * compile has finished, and the next call loads the specialized kernel from disk. */
    struct ctx_alias standins[CTX_MAX_STANDINS];
    size_t n_standins;
    int preparing; /* flce_prepare: build the specialized kernels themselves, no stand-ins */
    CUdeviceptr workspace; /* owned scratch, grown on demand */
    uint64_t workspace_bytes;
    CUstream workspace_stream; /* the stream the last call that used it was enqueued on */
    /* Recorded on that stream after the call's work (ctx_workspace_done): a call on another stream
     * waits for it on the device, not the host (flce.h, tensors.workspace) */
    CUevent workspace_done;
    int workspace_done_set;
    volatile int *flag_host; /* host-mapped int[2] (templates/params.h): kernels raise, the host reads */
    CUdeviceptr flag_dev;
    /* Tensor parallelism's overlapped dH reduction (launch.c): a non-blocking stream of the highest
     * priority, so its NCCL kernel gets SMs before the dW tiles that wait, and the fork and join
     * events that tie it to the caller's stream (graph-capturable). Made on first use, with the
     * context's lock held, as every launch is. */
    CUstream side;
    CUevent fork, join;
    /* FLCE_DEV grad_streams (launch.c): dW beside dH on a non-blocking stream of the lowest priority,
     * so that dH, in the caller's stream, takes the SMs first and dW's CTAs only fill those dH's
     * last wave leaves. Shares the fork and join events (never both in one call). */
    CUstream fill;
};

/* For the rest of the enclosing block this thread logs through ctx's sink (its flce_options log
 * callback and level); the sink before comes back when the block is left, by any return. Each
 * public call on a context starts with it. ctx NULL: the thread's sink stays. */
#define CTX_LOG_SCOPE(ctx) \
    log_sink ctx_log_saved_ __attribute__((cleanup(ctx_log_leave), unused)) = ctx_log_enter(ctx)
log_sink ctx_log_enter(const flce_context *ctx);
void ctx_log_leave(log_sink *saved);

/* Makes the context's primary context current on this thread; *prev receives the old one. */
flce_status ctx_enter(flce_context *ctx, CUcontext *prev);
void ctx_leave(CUcontext prev);

/* The kernels of each of n ≤ 8 specs' modules, fns[i] in emit_kernel_names(role) order for specs[i],
 * loading on first use; the missing ones compile in parallel (jit_build_many). Call with
 * ctx->lock held. */
flce_status ctx_kernels_many(flce_context *ctx, const kernel_spec *const *specs, int n,
                             CUfunction (*fns)[CTX_MAX_KERNELS]);

/* Before ctx_kernels_many, without holding ctx->lock (FLCE_DEV unlocked_compile, issue 16 item 1): the
 * specs ctx has not loaded compile into the disk cache (jit_build_many) while other threads' calls
 * on ctx go on; ctx_kernels_many then loads them from disk under the lock. Only the check of what
 * is loaded takes the lock. Specs a stand-in may serve (context.c, tiered) are left to
 * ctx_kernels_many unless `all` (flce_prepare). Never fails: whatever it could not build is built
 * under the lock as before. No-op without a writable cache directory. */
void ctx_prebuild(flce_context *ctx, const kernel_spec *const *specs, int n, int all);

/* Scratch of at least `bytes`, owned by the context (grown outside graph capture only). */
flce_status ctx_workspace(flce_context *ctx, uint64_t bytes, CUstream stream, CUdeviceptr *out);
/* After a call that used the context's workspace on `stream`: records workspace_done there (not
 * under capture), which the next call on another stream waits for on the device. */
flce_status ctx_workspace_done(flce_context *ctx, CUstream stream);

/* The side stream and its two events, made on first use. Call with ctx->lock held, inside ctx_enter. */
flce_status ctx_side_stream(flce_context *ctx);
/* The fill stream (and the fork and join events), made on first use; same rules. */
flce_status ctx_fill_stream(flce_context *ctx);
/* Reports (and clears) a raised device flag: FLCE_ERR_BAD_LABEL. */
flce_status ctx_take_flag(flce_context *ctx);

#endif
