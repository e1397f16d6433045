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

#include "driver.h"
#include "log.h"

drv_table drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static flce_status drv_status = FLCE_ERR_NO_DRIVER;
static char drv_message[512];

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static int drv_resolve(get_proc_fn get, const char *name, void **slot)
{
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SUCCESS;
    if (get(name, slot, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
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
    struct {
        const char *name;
        void **slot;
    } syms[] = {
#define SYM(f) {"cu" #f, (void **)&drv.f}
        SYM(Init), SYM(DriverGetVersion), SYM(GetErrorString), SYM(GetErrorName),
        SYM(DeviceGetCount), SYM(DeviceGet), SYM(DeviceGetName), SYM(DeviceGetAttribute),
        SYM(DevicePrimaryCtxRetain), SYM(DevicePrimaryCtxRelease), SYM(CtxGetCurrent),
        SYM(CtxSetCurrent), SYM(CtxSynchronize), SYM(ModuleLoadData), SYM(ModuleUnload),
        SYM(ModuleGetFunction), SYM(FuncSetAttribute), SYM(FuncGetAttribute), SYM(LaunchKernel),
        SYM(MemAlloc), SYM(MemFree), SYM(MemHostAlloc), SYM(MemHostGetDevicePointer),
        SYM(MemFreeHost), SYM(MemGetInfo), SYM(MemcpyHtoD), SYM(MemcpyDtoH), SYM(MemsetD8Async),
        SYM(MemsetD32Async), SYM(MemsetD8), SYM(StreamCreate), SYM(StreamDestroy),
        SYM(StreamSynchronize), SYM(StreamIsCapturing), SYM(EventCreate), SYM(EventDestroy),
        SYM(EventRecord), SYM(EventSynchronize), SYM(EventElapsedTime), SYM(StreamBeginCapture),
        SYM(StreamEndCapture), SYM(GraphInstantiateWithFlags), SYM(GraphLaunch),
        SYM(GraphExecDestroy), SYM(GraphDestroy), SYM(TensorMapEncodeTiled),
        SYM(MemcpyDtoDAsync),
#undef SYM
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (!drv_resolve(get, syms[i].name, syms[i].slot)) return;
    CUresult r = drv.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *s = "unknown error";
        if (drv.GetErrorString) drv.GetErrorString(r, &s);
        snprintf(drv_message, sizeof drv_message, "cuInit failed: %s (error %d)", s, (int)r);
        drv_status = r == CUDA_ERROR_NO_DEVICE ? FLCE_ERR_NO_DEVICE : FLCE_ERR_NO_DRIVER;
        return;
    }
    int version = 0;
    drv.DriverGetVersion(&version);
    log_msg(LOG_INFO, "CUDA driver %d.%d loaded", version / 1000, version % 1000 / 10);
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

flce_status drv_error(CUresult r, const char *what)
{
    const char *name = "?", *desc = "?";
    if (drv.GetErrorName) drv.GetErrorName(r, &name);
    if (drv.GetErrorString) drv.GetErrorString(r, &desc);
    return err_set(r == CUDA_ERROR_OUT_OF_MEMORY ? FLCE_ERR_OUT_OF_MEMORY : FLCE_ERR_CUDA,
                   "%s: %s: %s", what, name, desc);
}
