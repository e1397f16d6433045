/* row_call.h — what the calls beside the loss call (distillation, top-k) share: the argument checks
 * whose messages name the argument, the device facts their plans read, and one call's run under
 * the context's lock with the CUDA context entered and a workspace held. */
#ifndef FLCE_ROW_CALL_H
#define FLCE_ROW_CALL_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "flce.h"

/* The device facts a plan reads (a plan made from them needs no context: tests plan for any GPU). */
typedef struct call_device {
    const char *name;
    int sm, num_sms;
} call_device;

call_device call_device_of(const flce_context *ctx);

/* A struct's struct_size against this library's: larger is a newer caller (unsupported), smaller
 * or garbage an argument error. `arg` names it ("problem", "tensors"), `type` the struct. */
flce_status call_check_struct_size(unsigned struct_size, size_t ours, const char *arg, const char *type);

/* problem.<name> within [at_least, at_most] and a multiple of `multiple` (1 or 8). */
flce_status call_check_dim(int64_t value, const char *name, int64_t at_least, int64_t multiple, int64_t at_most);

/* problem.dtype one of flce_dtype's; problem.temperature finite, > 0, with 1/T finite. */
flce_status call_check_dtype(flce_dtype dtype);
flce_status call_check_temperature(float temperature);

/* tensors.<name>: aligned to `align` bytes; NULL only where not required. */
flce_status call_check_ptr(const void *ptr, const char *name, uintptr_t align, int required);

/* The workspace of a call: the caller's when it gave one (and its size was checked), else the
 * context's own grown to `bytes`. `tensors_arg` names the function that sizes it in the message. */
flce_status call_check_workspace(const void *workspace, uint64_t given, uint64_t needed, const char *size_fn);

/* One call's body: its kernels loaded and launched on `stream` over the workspace at `ws`. */
typedef flce_status (*call_body)(flce_context *ctx, CUdeviceptr ws, CUstream stream, void *arg);

/* Under ctx->lock with the CUDA context entered: the bad-label flag taken, the workspace (the
 * caller's `workspace` or the context's, released after the body's work on `stream`, a failed
 * body's too since some of its work may be queued; none when workspace_bytes is 0 and the caller
 * gave none: the body gets 0), then body. */
flce_status call_run(flce_context *ctx, void *workspace, uint64_t workspace_bytes, CUstream stream, call_body body,
                     void *arg);

/* Under ctx->lock with the CUDA context entered and ctx->preparing set (compile whatever is missing,
 * whatever compile_in_call says): body with no workspace and no stream, to load its kernels. */
flce_status call_prepare(flce_context *ctx, call_body body, void *arg);

#endif
