/*
 * fault.h — a TEST HOOK, not a feature: makes chosen operations fail on purpose so the tests
 * (tests/test_fault.c) can check that every failure ends in a clean status and message, leaves the
 * disk cache valid and leaks nothing (SQLite-style fault injection). Always compiled in, inert
 * unless the environment variable FLCE_FAULT is set, and consulted only on cold paths (compile,
 * cache store and locks, module load, workspace allocation), so it costs one getenv per such call.
 *
 *   FLCE_FAULT=<point>[:<nth>[:stall]]
 *
 *   point   nvrtc | cache_write | cache_rename | cache_lock | module_load | device_alloc |
 *           device_resource
 *   nth     which call at that point fails, counting from 1 since FLCE_FAULT took its current
 *           value in this process (setting the same value again does not restart the count;
 *           a forked child inherits it); 0 or absent = every call.
 *   stall   instead of failing, block forever (only cache_write honours it: the writer stops
 *           part way through its temporary file, so a test can SIGKILL it mid-write; every other
 *           point treats stall as fail).
 *
 * Called by nvrtc_compile.c, cache_load_store.c, cache_lock.c, context.c and tune_run.c; nothing else should depend on it.
 */
#ifndef FLCE_FAULT_H
#define FLCE_FAULT_H

typedef enum fault_point {
    FAULT_NONE = 0,
    FAULT_NVRTC_COMPILE,  /* nvrtc_compile: FLCE_ERR_COMPILE before NVRTC runs */
    FAULT_CACHE_WRITE,    /* cache_store: a short write ending in ENOSPC (disk full) */
    FAULT_CACHE_RENAME,   /* cache_store: rename() of the finished temp file fails */
    FAULT_CACHE_LOCK,     /* cache_lock.c: flock() (compile locks, stats.log) fails with ENOLCK; without
                             nth, every one: a file system without locks (NFS without lockd) */
    FAULT_MODULE_LOAD,    /* ctx_load_module: cuModuleLoadData fails (CUDA_ERROR_INVALID_IMAGE) */
    FAULT_DEVICE_ALLOC,   /* ctx_workspace: cuMemAlloc fails (CUDA_ERROR_OUT_OF_MEMORY) */
    FAULT_DEVICE_RESOURCE /* the other device resources a context or the tuner makes: the
                             host-mapped error flag (context creation), the side and fill streams
                             and their events, the workspace's event, the tuner's events and
                             scratch outputs: CUDA_ERROR_OUT_OF_MEMORY instead of the driver call */
} fault_point;

typedef enum fault_action { FAULT_PASS = 0, FAULT_FAIL = 1, FAULT_STALL = 2 } fault_action;

/* FAULT_PASS (0) unless FLCE_FAULT selects this call at `p`; then FAULT_FAIL, or FAULT_STALL when
 * the setting says stall. Thread-safe; logs each injected fault at level warn. */
fault_action fault_fire(fault_point p);

#endif
