/*
 * coldstart_first_call.c — the C side of bench/coldstart.sh (issue 16): one fresh process, one
 * bf16 loss-and-grad call of N×D×V through the public API, timed from before the call to the end of
 * flce_check (which synchronizes): NVRTC or the disk cache, module loads, the workspace and the
 * kernels. Inputs are zeros (labels 0), so nothing but the first call's cost is measured.
 * Prints one JSON line: {"first_call_s", "process_s" (main() to the end of the call, CUDA
 * initialization included), "init_s" (CUDA + flce context + buffers), "ok", "error"}.
 *
 * Built by bench/coldstart.sh against build/libflce.so; libcuda is opened at run time (the CUDA
 * driver comes with the GPU, its link-time stub does not always):
 *   cc -O2 -std=c11 -D_DEFAULT_SOURCE -Iinclude -I/usr/local/cuda/include \
 *      bench/coldstart_first_call.c -Lbuild -lflce -Wl,-rpath,$PWD/build -ldl -o first_call
 *   first_call 8192 4096 128256
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "flce.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*CtxSynchronize)(void);
} cu;

static int fail(double t_main, const char *what, const char *why)
{
    printf("{\"first_call_s\": null, \"process_s\": %.4f, \"init_s\": null, \"ok\": false, "
           "\"error\": \"%s: ", now_s() - t_main, what);
    for (const char *p = why; *p; p++) /* JSON-safe */
        putchar(*p == '"' || *p == '\\' ? '\'' : (unsigned char)*p < 0x20 ? ' ' : *p);
    printf("\"}\n");
    return 1;
}

int main(int argc, char **argv)
{
    double t_main = now_s();
    if (argc != 4) {
        fprintf(stderr, "usage: %s N D V\n", argv[0]);
        return 2;
    }
    long long n = atoll(argv[1]), d = atoll(argv[2]), v = atoll(argv[3]);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return fail(t_main, "dlopen libcuda.so.1", dlerror());
    const char *names[] = {"cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                           "cuMemAlloc_v2", "cuMemsetD8_v2", "cuCtxSynchronize"};
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i]))) return fail(t_main, "dlsym", names[i]);
    CUdevice dev;
    CUcontext pctx;
    if (cu.Init(0) || cu.DeviceGet(&dev, 0) || cu.PrimaryCtxRetain(&pctx, dev) || cu.CtxSetCurrent(pctx))
        return fail(t_main, "CUDA", "cannot initialize device 0");

    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_shard = v, p.dtype = FLCE_DTYPE_BF16;
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK) return fail(t_main, "flce_context_create", flce_last_error());
    size_t sizes[] = {(size_t)(n * d * 2), (size_t)(v * d * 2), (size_t)(n * 4), 4, (size_t)(n * 4),
                      (size_t)(n * d * 2), (size_t)(v * d * 2)};
    CUdeviceptr buf[7];
    for (int i = 0; i < 7; i++)
        if (cu.MemAlloc(&buf[i], sizes[i]) || cu.MemsetD8(buf[i], 0, sizes[i]))
            return fail(t_main, "cuMemAlloc", "out of device memory?");
    if (cu.CtxSynchronize()) return fail(t_main, "CUDA", "synchronize");
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = (void *)buf[0], t.weight = (void *)buf[1], t.labels = (void *)buf[2];
    t.loss = (float *)buf[3], t.lse = (float *)buf[4];
    t.grad_hidden = (void *)buf[5], t.grad_weight = (void *)buf[6];
    double t0 = now_s();
    if (flce_loss_and_grad(ctx, &p, &t, NULL) != FLCE_OK)
        return fail(t_main, "flce_loss_and_grad", flce_last_error());
    if (flce_check(ctx, NULL) != FLCE_OK) return fail(t_main, "flce_check", flce_last_error());
    double t1 = now_s();
    printf("{\"first_call_s\": %.4f, \"process_s\": %.4f, \"init_s\": %.4f, \"ok\": true, \"error\": null}\n",
           t1 - t0, t1 - t_main, t0 - t_main);
    flce_context_destroy(ctx);
    return 0;
}
