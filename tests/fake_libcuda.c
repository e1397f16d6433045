/* fake_libcuda.c — a libcuda.so.1 whose cuInit does what FAKE_CUINIT says, for gpu_gate.cmake to
 * show that the GPU tests' gate (gpu_ready.h) skips only where there is no GPU: FAKE_CUINIT=<n>
 * returns CUresult n, FAKE_CUINIT=crash dies in cuInit as a broken driver can. It has no
 * cuGetProcAddress_v2, so a cuInit that "succeeds" leaves a driver flce cannot load. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

int cuInit(unsigned flags);
int cuGetErrorName(int result, const char **name);

int cuInit(unsigned flags)
{
    (void)flags;
    const char *how = getenv("FAKE_CUINIT");
    if (how && !strcmp(how, "crash")) raise(SIGSEGV);
    return how ? atoi(how) : 0;
}

int cuGetErrorName(int result, const char **name)
{
    *name = result == 100 ? "CUDA_ERROR_NO_DEVICE" : result == 34 ? "CUDA_ERROR_STUB_LIBRARY" : "FAKE_ERROR";
    return 0;
}
