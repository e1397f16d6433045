/*
 * gpu_ready.h — whether a test of label gpu runs, is skipped or fails. Every GPU test's main()
 * decides it here (and tests/gpu_probe.c for the `flce fuzz` smoke run), the same way:
 *  - no driver (no libcuda.so.1, or the toolkit's stub) or no device: skipped (exit 77), which is
 *    what the CPU-only CI machine must see;
 *  - a driver that is installed but does not work (any other cuInit error, a driver flce cannot
 *    load, device 0's primary context failing): a failure. A broken GPU machine must not pass as a
 *    CPU one, and flce's own loader says FLCE_ERR_NO_DRIVER for both, so the probe asks cuInit;
 *  - FLCE_REQUIRE_GPU=n (n >= 1): fewer than n usable GPUs is a failure too, so a GPU job cannot go
 *    green by skipping everything (bench/device_ci.sh sets it). A test that needs more GPUs than
 *    that (tensor parallelism on a 1-GPU machine under FLCE_REQUIRE_GPU=1) still skips.
 */
#ifndef FLCE_GPU_READY_H
#define FLCE_GPU_READY_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "devmem.h"
#include "driver.h"

typedef enum { GPU_USABLE, GPU_ABSENT, GPU_BROKEN } gpu_state;

/* FLCE_REQUIRE_GPU as a count of GPUs; 0 when unset or empty. */
static inline int gpu_required(void)
{
    const char *v = getenv("FLCE_REQUIRE_GPU");
    return v && *v ? atoi(v) : 0;
}

/* The driver's own name for a cuInit result, looked up without flce's loader. */
static inline const char *gpu_cu_name(void *lib, CUresult r)
{
    CUresult (*name_of)(CUresult, const char **) = NULL;
    const char *name = "unknown CUresult";
    *(void **)&name_of = dlsym(lib, "cuGetErrorName");
    if (name_of) name_of(r, &name);
    return name;
}

/* cuInit, asked directly: only its result tells "no GPU here" from "a GPU whose driver fails". */
static inline gpu_state gpu_probe_driver(char *why, size_t len)
{
    /* Left open: the driver stays loaded for the life of the process anyway. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return snprintf(why, len, "no CUDA driver: %s", dlerror()), GPU_ABSENT;
    CUresult (*init)(unsigned) = NULL;
    *(void **)&init = dlsym(lib, "cuInit");
    if (!init) return snprintf(why, len, "libcuda.so.1 has no cuInit"), GPU_BROKEN;
    CUresult r = init(0);
    if (r == CUDA_SUCCESS) return GPU_USABLE;
    snprintf(why, len, "cuInit: %s (%d)", gpu_cu_name(lib, r), (int)r);
    return r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_STUB_LIBRARY ? GPU_ABSENT : GPU_BROKEN;
}

/* The driver, then flce's view of it, then device 0's primary context (left current on this
 * thread, as devmem_use leaves it). *count: the devices the driver sees. */
static inline gpu_state gpu_probe(int *count, char *why, size_t len)
{
    *count = 0;
    gpu_state s = gpu_probe_driver(why, len);
    if (s != GPU_USABLE) return s;
    if (drv_load() != FLCE_OK)
        return snprintf(why, len, "cuInit works but flce cannot load the driver: %s", flce_last_error()), GPU_BROKEN;
    CUresult r = drv.DeviceGetCount(count);
    if (r != CUDA_SUCCESS) return snprintf(why, len, "cuDeviceGetCount: error %d", (int)r), GPU_BROKEN;
    if (*count == 0) return snprintf(why, len, "the CUDA driver sees no device"), GPU_ABSENT;
    if (devmem_use(0) != FLCE_OK)
        return snprintf(why, len, "device 0's primary context: %s", flce_last_error()), GPU_BROKEN;
    return GPU_USABLE;
}

/* Absent or too few GPUs (`have` usable): says so, and returns SKIP_EXIT, or 1 when
 * FLCE_REQUIRE_GPU asks for more than `have`. */
static inline int gpu_skip_code(int have, const char *what)
{
    int required = gpu_required();
    if (have >= required) {
        printf("%s: skipped\n", what);
        return SKIP_EXIT;
    }
    printf("FAIL: %s; FLCE_REQUIRE_GPU=%d makes that a failure, not a skip\n", what, required);
    return 1;
}

/* For main(): 1 when `needed` GPUs are usable (device 0's context current on this thread), with
 * *exit_code 0. Otherwise says why, sets *exit_code to SKIP_EXIT, or to 1 for a broken driver or
 * an unmet FLCE_REQUIRE_GPU, and returns 0. */
static inline int gpu_ready(int needed, int *exit_code)
{
    char why[600] = "", what[700];
    int count = 0;
    gpu_state s = gpu_probe(&count, why, sizeof why);
    *exit_code = 0;
    if (s == GPU_BROKEN) {
        printf("FAIL: a CUDA driver is installed but does not work: %s\n", why);
        *exit_code = 1;
    } else if (s == GPU_ABSENT) {
        snprintf(what, sizeof what, "no GPU (%s)", why);
        *exit_code = gpu_skip_code(0, what);
    } else if (count < needed) {
        snprintf(what, sizeof what, "%d GPU(s), %d needed", count, needed);
        *exit_code = gpu_skip_code(count, what);
    }
    return *exit_code == 0;
}

/* For a case that needs more GPUs than main() asked for: 1 when there are enough; otherwise says
 * it skips, and fails the case when FLCE_REQUIRE_GPU asks for that many. */
static inline int gpu_enough(int have, int needed)
{
    if (have >= needed) return 1;
    printf("     skipped: this machine has %d GPU(s), %d needed\n", have, needed);
    CHECKF(have >= gpu_required(), "FLCE_REQUIRE_GPU=%d but %d GPU(s)", gpu_required(), have);
    return 0;
}

#endif
