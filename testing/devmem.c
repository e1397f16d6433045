/* devmem.c — device buffers and timers for tools and tests (see devmem.h). */
#include <stdlib.h>

#include "devmem.h"
#include "driver.h"

int devmem_gpu_count(void) { return drv_device_count(); }

flce_status devmem_use(int ordinal)
{
    TRY(drv_load());
    CUdevice dev;
    CUcontext ctx;
    DRV_TRY(drv.DeviceGet(&dev, ordinal));
    DRV_TRY(drv.DevicePrimaryCtxRetain(&ctx, dev));
    DRV_TRY(drv.CtxSetCurrent(ctx));
    return FLCE_OK;
}

flce_status devmem_alloc(void **ptr, size_t bytes)
{
    CUdeviceptr p = 0;
    DRV_TRY(drv.MemAlloc(&p, bytes ? bytes : 16));
    *ptr = (void *)(uintptr_t)p;
    return FLCE_OK;
}

void devmem_free(void *ptr)
{
    if (ptr) drv.MemFree((CUdeviceptr)(uintptr_t)ptr);
}

/* Uploads and poisons are issued on the legacy default stream, and from pageable memory
 * cuMemcpyHtoD may return before its DMA lands (cuMemsetD8 is asynchronous too); work on a
 * CU_STREAM_NON_BLOCKING stream (devmem_stream_create, the tests' threads) is not ordered after
 * either. So both wait for the legacy stream: otherwise a kernel can read the previous buffer's
 * bytes at the same address (test_concurrency saw a mean's denominator counted from the last
 * round's labels: loss, dH and dW all 3.8 % off, H100, 2026-11-26). */
static flce_status legacy_stream_done(void)
{
    DRV_TRY(drv.StreamSynchronize(NULL));
    return FLCE_OK;
}

flce_status devmem_upload(void *dst, const void *src, size_t bytes)
{
    DRV_TRY(drv.MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes));
    return legacy_stream_done();
}

flce_status devmem_download(void *dst, const void *src, size_t bytes)
{
    DRV_TRY(drv.MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes));
    return FLCE_OK;
}

static flce_status fill_bytes(void *ptr, size_t bytes, unsigned char value)
{
    DRV_TRY(drv.MemsetD8((CUdeviceptr)(uintptr_t)ptr, value, bytes));
    return legacy_stream_done();
}

flce_status devmem_poison(void *ptr, size_t bytes) { return fill_bytes(ptr, bytes, 0xFF); }

flce_status devmem_zero(void *ptr, size_t bytes) { return fill_bytes(ptr, bytes, 0); }

flce_status devmem_sync(void)
{
    DRV_TRY(drv.CtxSynchronize());
    return FLCE_OK;
}

struct devmem_timer {
    CUevent start, stop;
};

flce_status devmem_timer_start(devmem_timer **out)
{
    devmem_timer *t = calloc(1, sizeof *t);
    if (!t) return err_set(FLCE_ERR_OUT_OF_MEMORY, "timer: out of host memory");
    CUresult r = drv.EventCreate(&t->start, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = drv.EventCreate(&t->stop, CU_EVENT_DEFAULT);
    if (r == CUDA_SUCCESS) r = drv.EventRecord(t->start, NULL);
    if (r != CUDA_SUCCESS) {
        free(t);
        return drv_error(r, "creating timing events");
    }
    *out = t;
    return FLCE_OK;
}

flce_status devmem_timer_stop(devmem_timer *t, float *ms)
{
    CUresult r = drv.EventRecord(t->stop, NULL);
    if (r == CUDA_SUCCESS) r = drv.EventSynchronize(t->stop);
    if (r == CUDA_SUCCESS) r = drv.EventElapsedTime(ms, t->start, t->stop);
    drv.EventDestroy(t->start);
    drv.EventDestroy(t->stop);
    free(t);
    if (r != CUDA_SUCCESS) return drv_error(r, "timing");
    return FLCE_OK;
}

flce_status devmem_stream_create(void **stream)
{
    CUstream s = NULL;
    DRV_TRY(drv.StreamCreate(&s, CU_STREAM_NON_BLOCKING));
    *stream = s;
    return FLCE_OK;
}

void devmem_stream_destroy(void *stream)
{
    if (stream) drv.StreamDestroy((CUstream)stream);
}

int devmem_stream_busy(void *stream)
{
    return drv.StreamQuery((CUstream)stream) == CUDA_ERROR_NOT_READY;
}

flce_status devmem_stream_sync(void *stream)
{
    DRV_TRY(drv.StreamSynchronize((CUstream)stream));
    return FLCE_OK;
}

flce_status devmem_capture_begin(void *stream)
{
    DRV_TRY(drv.StreamBeginCapture((CUstream)stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    return FLCE_OK;
}

flce_status devmem_capture_end(void *stream, void **exec)
{
    CUgraph graph = NULL;
    CUgraphExec ge = NULL;
    DRV_TRY(drv.StreamEndCapture((CUstream)stream, &graph));
    CUresult r = drv.GraphInstantiateWithFlags(&ge, graph, 0);
    drv.GraphDestroy(graph);
    if (r != CUDA_SUCCESS) return drv_error(r, "instantiating the captured graph");
    *exec = ge;
    return FLCE_OK;
}

flce_status devmem_graph_launch(void *exec, void *stream)
{
    DRV_TRY(drv.GraphLaunch((CUgraphExec)exec, (CUstream)stream));
    return FLCE_OK;
}

void devmem_graph_destroy(void *exec)
{
    if (exec) drv.GraphExecDestroy((CUgraphExec)exec);
}

flce_status devmem_info(size_t *free_bytes, size_t *total_bytes)
{
    DRV_TRY(drv.MemGetInfo(free_bytes, total_bytes));
    return FLCE_OK;
}
