/*
 * driver.c — loads the CUDA driver at run time (dlopen + cuGetProcAddress) into the `drv` table.
 * Nothing links against libcuda, so the library, the tool and the cpu tests run on machines with no
 * driver; GPU entry points then fail with FLCE_ERR_NO_DRIVER and a message saying so.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <cudaTypedefs.h>

#include "driver.h"
#include "log.h"

drv_table drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static flce_status drv_status = FLCE_ERR_NO_DRIVER;
static char drv_message[512];

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

/* cuGetProcAddress hands out the newest ABI of an entry point at or below the version asked for,
 * and an ABI can change under the same name: asked for at CUDA 13.0, cuCtxSynchronize is
 * cuCtxSynchronize_v2(CUcontext), and calling it as (void) passes a garbage context
 * (CUDA_ERROR_CONTEXT_IS_DESTROYED). So each entry point is resolved at a pinned version, and the
 * compiler checks that version's prototype (cudaTypedefs.h) against the table's. The list: every
 * entry point flce uses, with the version whose prototype drv_table declares. */
#define DRV_ENTRY_POINTS(X) \
    X(Init, 2000) X(DriverGetVersion, 2020) X(GetErrorString, 6000) X(GetErrorName, 6000) \
    X(DeviceGetCount, 2000) X(DeviceGet, 2000) X(DeviceGetName, 2000) X(DeviceGetAttribute, 2000) \
    X(DeviceTotalMem, 3020) \
    X(DevicePrimaryCtxRetain, 7000) X(DevicePrimaryCtxRelease, 11000) X(CtxGetCurrent, 4000) \
    X(CtxSetCurrent, 4000) X(CtxSynchronize, 2000) X(ModuleLoadData, 2000) X(ModuleUnload, 2000) \
    X(ModuleGetFunction, 2000) X(FuncSetAttribute, 9000) X(FuncGetAttribute, 2020) \
    X(LaunchKernel, 4000) X(MemAlloc, 3020) X(MemFree, 3020) X(MemHostAlloc, 2020) \
    X(MemHostGetDevicePointer, 3020) X(MemFreeHost, 2000) X(MemGetInfo, 3020) X(MemcpyHtoD, 3020) \
    X(MemcpyDtoH, 3020) X(MemsetD8Async, 3020) X(MemsetD32Async, 3020) X(MemsetD8, 3020) \
    X(StreamCreate, 2000) X(StreamDestroy, 4000) X(StreamSynchronize, 2000) \
    X(StreamIsCapturing, 10000) X(EventCreate, 2000) X(EventDestroy, 4000) X(EventRecord, 2000) \
    X(EventSynchronize, 2000) X(EventElapsedTime, 12080) X(StreamBeginCapture, 10010) \
    X(StreamEndCapture, 10000) X(GraphInstantiateWithFlags, 11040) X(GraphLaunch, 10000) \
    X(GraphExecDestroy, 10000) X(GraphDestroy, 10000) X(TensorMapEncodeTiled, 12000) \
    X(MemcpyDtoDAsync, 3020) X(LaunchKernelEx, 11060) X(OccupancyMaxActiveClusters, 11070) \
    X(StreamWaitEvent, 3020) X(StreamCreateWithPriority, 5050) X(CtxGetStreamPriorityRange, 5050) \
    X(StreamQuery, 2000)

#define DRV_ABI(f, v)                                                                              \
    _Static_assert(_Generic(drv.f, PFN_cu##f##_v##v: 1, default: 0),                              \
                   "drv." #f " does not match the ABI of cu" #f " at version " #v);
DRV_ENTRY_POINTS(DRV_ABI)

static int drv_resolve(get_proc_fn get, const char *name, void **slot, int version)
{
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    if (get(name, slot, version, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
        found != CU_GET_PROC_ADDRESS_SUCCESS || !*slot) {
        snprintf(drv_message, sizeof drv_message,
                 "the CUDA driver has no %s (driver too old for CUDA %d.%d?)", name,
                 CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
        return 0;
    }
    return 1;
}

static void drv_load_once(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(drv_message, sizeof drv_message,
                 "no CUDA driver: dlopen(libcuda.so.1) failed (%s); flce needs an NVIDIA GPU and "
                 "its driver to run kernels",
                 dlerror());
        return;
    }
    get_proc_fn get = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!get) {
        snprintf(drv_message, sizeof drv_message,
                 "libcuda.so.1 has no cuGetProcAddress_v2: driver older than CUDA 12");
        return;
    }
    static const struct {
        const char *name;
        void **slot;
        int version;
    } syms[] = {
#define SYM(f, v) {"cu" #f, (void **)&drv.f, v},
        DRV_ENTRY_POINTS(SYM)
#undef SYM
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!drv_resolve(get, syms[i].name, syms[i].slot, syms[i].version)) return;
    CUresult r = drv.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *s = "unknown error";
        if (drv.GetErrorString) drv.GetErrorString(r, &s);
        snprintf(drv_message, sizeof drv_message, "cuInit failed: %s (error %d)", s, (int)r);
        drv_status = r == CUDA_ERROR_NO_DEVICE ? FLCE_ERR_NO_DEVICE : FLCE_ERR_NO_DRIVER;
        return;
    }
    int version = 0;
    if (drv.DriverGetVersion(&version) == CUDA_SUCCESS)
        log_msg(LOG_INFO, "CUDA driver %d.%d loaded", version / 1000, version % 1000 / 10);
    else /* the version is only logged: nothing depends on it */
        log_msg(LOG_INFO, "CUDA driver loaded (cuDriverGetVersion failed)");
    drv_status = FLCE_OK;
}

flce_status drv_load(void)
{
    pthread_once(&drv_once, drv_load_once);
    if (drv_status != FLCE_OK) return err_set(drv_status, "%s", drv_message);
    return FLCE_OK;
}

int drv_device_count(void)
{
    int n = 0;
    if (drv_load() != FLCE_OK) return 0;
    if (drv.DeviceGetCount(&n) != CUDA_SUCCESS) return 0;
    return n;
}

flce_status drv_release(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS) return FLCE_OK;
    flce_status st = drv_error(r, what);
    log_msg(LOG_WARN, "%s", err_message());
    return st;
}

flce_status drv_error(CUresult r, const char *what)
{
    const char *name = "?", *desc = "?";
    if (drv.GetErrorName) drv.GetErrorName(r, &name);
    if (drv.GetErrorString) drv.GetErrorString(r, &desc);
    return err_set(r == CUDA_ERROR_OUT_OF_MEMORY ? FLCE_ERR_OUT_OF_MEMORY : FLCE_ERR_CUDA,
                   "%s: %s: %s", what, name, desc);
}
