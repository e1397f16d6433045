/*
 * mma_peak.c — measures the device's mma.sync (m16n8k16, fp32 accumulate) throughput with a
 * register-only kernel (templates/bench_mma_peak.cu, compiled by NVRTC for the device's arch without
 * the 'a' features, as the Ampere path is). The Ampere path's TFLOP/s from `flce bench` under
 * FLCE_PORTABLE=1 divided by this is its fraction of the mma.sync ceiling (issue 6). `f32` measures
 * the fp32 FFMA ceiling instead (the same file's ffma_peak), the reference of the fp32 path
 * (`flce bench --dtype f32`, exact FFMA on the mma.sync fragments; issue 19).
 *   usage: flce_mma_peak [bf16|f16|f32]                  prints TFLOP/s: median of 11 timed launches
 *          flce_mma_peak [bf16|f16|f32] --compile sm_NN  compiles the kernel only (no GPU; a cpu test)
 */
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devmem.h"
#include "driver.h"
#include "host.h"

#ifndef FLCE_MMA_PEAK_SRC
#error "FLCE_MMA_PEAK_SRC: the path of templates/bench_mma_peak.cu (set by CMake)"
#endif

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* The kernel's cubin for sm_<arch> (malloc'd, *len bytes), or NULL with NVRTC's log on stderr. */
static char *compile_kernel(const char *type, int arch, size_t *len)
{
    char *src = host_read_file(FLCE_MMA_PEAK_SRC, NULL);
    if (!src) {
        fprintf(stderr, "flce_mma_peak: cannot read %s\n", FLCE_MMA_PEAK_SRC);
        return NULL;
    }
    char arch_opt[64], def[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=sm_%d", arch);
    /* f32: the module still holds the mma kernel, compiled for bf16, beside ffma_peak */
    snprintf(def, sizeof def, "-DMMA_TYPE=\"%s\"", strcmp(type, "f32") ? type : "bf16");
    const char *opts[] = {arch_opt, def, "-std=c++17"};
    nvrtcProgram prog;
    char *cubin = NULL;
    if (nvrtcCreateProgram(&prog, src, "bench_mma_peak.cu", 0, NULL, NULL) != NVRTC_SUCCESS) {
        free(src);
        return NULL;
    }
    if (nvrtcCompileProgram(prog, 3, opts) != NVRTC_SUCCESS) {
        size_t n = 0;
        nvrtcGetProgramLogSize(prog, &n);
        char *log = malloc(n + 1);
        if (log && nvrtcGetProgramLog(prog, log) == NVRTC_SUCCESS) fprintf(stderr, "flce_mma_peak: NVRTC:\n%s\n", log);
        free(log);
    } else if (nvrtcGetCUBINSize(prog, len) == NVRTC_SUCCESS && (cubin = malloc(*len)) &&
               nvrtcGetCUBIN(prog, cubin) != NVRTC_SUCCESS) {
        free(cubin), cubin = NULL;
    }
    nvrtcDestroyProgram(&prog);
    free(src);
    return cubin;
}

int main(int argc, char **argv)
{
    const char *type = argc > 1 ? argv[1] : "bf16";
    if ((strcmp(type, "bf16") && strcmp(type, "f16") && strcmp(type, "f32")) ||
        (argc > 2 && (argc != 4 || strcmp(argv[2], "--compile")))) {
        fprintf(stderr, "usage: flce_mma_peak [bf16|f16|f32] [--compile sm_NN]\n");
        return 2;
    }
    const int ffma = !strcmp(type, "f32");
    size_t cubin_len = 0;
    if (argc == 4) { /* no GPU: the kernel compiles for that arch */
        int arch = atoi(argv[3] + (strncmp(argv[3], "sm_", 3) ? 0 : 3));
        char *cubin = arch >= 80 ? compile_kernel(type, arch, &cubin_len) : NULL;
        if (cubin) printf("flce_mma_peak: %s kernel compiles for sm_%d (%zu-byte cubin)\n", type, arch, cubin_len);
        free(cubin);
        return cubin ? 0 : 1;
    }
    if (devmem_gpu_count() < 1) {
        fprintf(stderr, "flce_mma_peak: no GPU\n");
        return 77;
    }
    CUdevice dev;
    int major = 0, minor = 0, sms = 0;
    char name[128];
    if (devmem_use(0) != FLCE_OK || drv.DeviceGet(&dev, 0) != CUDA_SUCCESS) {
        fprintf(stderr, "flce_mma_peak: %s\n", flce_last_error());
        return 1;
    }
    drv.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    drv.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    drv.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    drv.DeviceGetName(name, sizeof name, dev);
    char *cubin = compile_kernel(type, major * 10 + minor, &cubin_len);
    if (!cubin) return 1;
    CUmodule mod;
    CUfunction fn;
    void *out = NULL;
    enum { THREADS = 256, BLOCKS_PER_SM = 4, ITERS = 8192, CHAINS = 8, FFMA_CHAINS = 16, RUNS = 11 };
    int blocks = sms * BLOCKS_PER_SM;
    if (drv.ModuleLoadData(&mod, cubin) != CUDA_SUCCESS || drv.ModuleGetFunction(&fn, mod, ffma ? "ffma_peak" : "mma_peak") != CUDA_SUCCESS ||
        devmem_alloc(&out, (size_t)blocks * THREADS * 4) != FLCE_OK) {
        fprintf(stderr, "flce_mma_peak: loading the kernel failed\n");
        return 1;
    }
    int iters = ITERS;
    unsigned seed = 0;
    void *args[] = {&out, &iters, &seed};
    float ms[RUNS];
    for (int r = -2; r < RUNS; r++) { /* two warm-up launches */
        devmem_timer *t;
        float one = 0;
        if (devmem_timer_start(&t) != FLCE_OK ||
            drv.LaunchKernel(fn, (unsigned)blocks, 1, 1, THREADS, 1, 1, 0, NULL, args, NULL) != CUDA_SUCCESS ||
            devmem_timer_stop(t, &one) != FLCE_OK) {
            fprintf(stderr, "flce_mma_peak: launch failed: %s\n", flce_last_error());
            return 1;
        }
        if (r >= 0) ms[r] = one;
    }
    qsort(ms, RUNS, sizeof ms[0], cmp_f);
    double flops = ffma ? (double)blocks * THREADS * (double)ITERS * FFMA_CHAINS * 2.0
                        : (double)blocks * (THREADS / 32) * (double)ITERS * CHAINS * (2.0 * 16 * 8 * 16);
    if (ffma)
        printf("fp32 FFMA, %s (sm_%d%d, %d SMs): %.1f TFLOP/s (median of %d, %.3f ms)\n", name, major, minor, sms,
               flops / (ms[RUNS / 2] * 1e-3) / 1e12, RUNS, ms[RUNS / 2]);
    else
        printf("mma.sync m16n8k16 %s, fp32 accumulate, %s (sm_%d%d, %d SMs): %.1f TFLOP/s (median of %d, %.3f ms)\n",
               type, name, major, minor, sms, flops / (ms[RUNS / 2] * 1e-3) / 1e12, RUNS, ms[RUNS / 2]);
    devmem_free(out);
    drv.ModuleUnload(mod);
    free(cubin);
    return 0;
}
