/* row_call.c — the shared checks and the locked run of the distillation and top-k calls
 * (row_call.h says what each does). */
#include "row_call.h"

#include <math.h>
#include <pthread.h>

#include "context.h"
#include "error.h"

call_device call_device_of(const flce_context *ctx)
{
    call_device d = {ctx->name, ctx->sm, ctx->num_sms};
    return d;
}

flce_status call_check_struct_size(unsigned struct_size, size_t ours, const char *arg, const char *type)
{
    if (struct_size == ours) return FLCE_OK;
    return err_set(struct_size > ours ? FLCE_ERR_UNSUPPORTED : FLCE_ERR_INVALID_ARGUMENT,
                   "%s.struct_size=%u: %s is %zu bytes in this library (%s); initialize with %s_init", arg,
                   struct_size, type, ours, FLCE_VERSION_STRING, type);
}

flce_status call_check_dim(int64_t value, const char *name, int64_t at_least, int64_t multiple, int64_t at_most)
{
    if (value < at_least || value % multiple)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.%s=%lld: must be at least %lld%s", name, (long long)value,
                       (long long)at_least, multiple > 1 ? " and a multiple of 8" : "");
    if (value > at_most)
        return err_set(FLCE_ERR_UNSUPPORTED, "problem.%s=%lld: at most %lld supported", name, (long long)value,
                       (long long)at_most);
    return FLCE_OK;
}

flce_status call_check_dtype(flce_dtype dtype)
{
    if (dtype != FLCE_DTYPE_F32 && dtype != FLCE_DTYPE_F16 && dtype != FLCE_DTYPE_BF16)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.dtype=%d: not an flce_dtype", (int)dtype);
    return FLCE_OK;
}

flce_status call_check_temperature(float temperature)
{
    if (!(temperature > 0.0f) || !isfinite(temperature) || !isfinite(1.0f / temperature))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "problem.temperature=%g: must be finite and > 0 (1/T finite)",
                       (double)temperature);
    return FLCE_OK;
}

flce_status call_check_ptr(const void *ptr, const char *name, uintptr_t align, int required)
{
    if (!ptr) return required ? err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s: NULL (required)", name) : FLCE_OK;
    if ((uintptr_t)ptr % align)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.%s=%p: must be %u-byte aligned", name, ptr, (unsigned)align);
    return FLCE_OK;
}

flce_status call_check_workspace(const void *workspace, uint64_t given, uint64_t needed, const char *size_fn)
{
    if (workspace && given < needed)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "tensors.workspace_bytes=%llu: this problem needs %llu (%s)",
                       (unsigned long long)given, (unsigned long long)needed, size_fn);
    return FLCE_OK;
}

flce_status call_run(flce_context *ctx, void *workspace, uint64_t workspace_bytes, CUstream stream, call_body body,
                     void *arg)
{
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_take_flag(ctx);
    if (st == FLCE_OK) st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        CUdeviceptr ws = (CUdeviceptr)(uintptr_t)workspace;
        /* a body that needs none (the top-k merge) takes none of the context's: no allocation of
         * 0 bytes, no wait on the workspace's last user, nothing refused under stream capture */
        const int ctx_ws = !ws && workspace_bytes > 0;
        if (ctx_ws) st = ctx_workspace(ctx, workspace_bytes, stream, &ws);
        if (st == FLCE_OK) {
            st = body(ctx, ws, stream, arg);
            if (ctx_ws) {
                flce_status done = ctx_workspace_done(ctx, stream);
                if (st == FLCE_OK) st = done;
            }
        }
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}

flce_status call_prepare(flce_context *ctx, call_body body, void *arg)
{
    pthread_mutex_lock(&ctx->lock);
    CUcontext prev = NULL;
    flce_status st = ctx_enter(ctx, &prev);
    if (st == FLCE_OK) {
        ctx->preparing = 1;
        st = body(ctx, 0, NULL, arg);
        ctx->preparing = 0;
        ctx_leave(prev);
    }
    pthread_mutex_unlock(&ctx->lock);
    return st;
}
