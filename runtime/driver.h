/*
 * driver.h — the CUDA driver API, loaded at run time with dlopen("libcuda.so.1") and
 * cuGetProcAddress, so libflce and its tests load on machines without a driver and say so.
 * drv_load() fills the table once (thread-safe); every other module calls through `drv`.
 * DRV_TRY turns a CUresult into an flce_status with the driver's own words.
 */
#ifndef FLCE_DRIVER_H
#define FLCE_DRIVER_H

#include <cuda.h>

#include "error.h"

typedef struct drv_table {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncSetAttribute)(CUfunction, CUfunction_attribute, int);
    CUresult (*FuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
    /* 2-CTA cluster launches of the dH/dW kernels (spec cluster; runtime/launch.c) */
    CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*OccupancyMaxActiveClusters)(int *, CUfunction, const CUlaunchConfig *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*MemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    /* the side stream of tensor parallelism's overlapped dH reduction (runtime/launch.c) */
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned int, int);
    CUresult (*CtxGetStreamPriorityRange)(int *, int *);
    /* graph capture: used by tests and tools to prove calls are capturable */
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    /* TMA tensor maps of the Hopper GEMM path (runtime/tma.c) */
    CUresult (*TensorMapEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                     const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
} drv_table;

extern drv_table drv;

/* Loads libcuda and calls cuInit(0) once. FLCE_ERR_NO_DRIVER with a message when it can't. */
flce_status drv_load(void);
/* Number of CUDA devices; 0 (and FLCE_OK) when the driver is absent or sees none. */
int drv_device_count(void);
/* Converts a failed CUresult into an flce_status (OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY,
 * CUDA otherwise) with "<what>: <driver error name>: <driver's description>". */
flce_status drv_error(CUresult r, const char *what);
/* For the calls that release something (cuMemFree, cuModuleUnload, cuEventDestroy …), where the
 * caller goes on releasing the rest: FLCE_OK, or drv_error's status for `what` with the message
 * also logged as a warning (a release path often has no caller left to read it). */
flce_status drv_release(CUresult r, const char *what);

#define DRV_TRY(call)                                                                              \
    do {                                                                                           \
        CUresult drv_r_ = (call);                                                                  \
        if (drv_r_ != CUDA_SUCCESS) return drv_error(drv_r_, #call);                               \
    } while (0)

#endif
