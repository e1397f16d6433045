/* nvrtc_compile.c — source → cubin through NVRTC (see nvrtc_compile.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

#include "fault.h"
#include "log.h"
#include "nvrtc_compile.h"
#include "spec.h"

enum { NVRTC_MAX_OPTS = 8 };

static int nvrtc_options(int sm, const char **opts, char *arch_buf, size_t cap)
{
    int n = 0;
    snprintf(arch_buf, cap, "--gpu-architecture=%s", spec_arch_name(sm));
    opts[n++] = arch_buf;
    opts[n++] = "-std=c++17";
    /* Exact math: the loss and softmax use accurate expf/logf (DESIGN §8 tolerances). */
    opts[n++] = "--fmad=true";
    opts[n++] = "-default-device";
    return n;
}

const char *nvrtc_options_text(int sm, char *out, size_t cap)
{
    const char *opts[NVRTC_MAX_OPTS];
    char arch[64];
    int n = nvrtc_options(sm, opts, arch, sizeof arch);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i) strncat(out, " ", cap - strlen(out) - 1);
        strncat(out, opts[i], cap - strlen(out) - 1);
    }
    return out;
}

/* Every cache key holds the version, and the compile pools build keys on several threads at once:
 * the text is written once, under pthread_once (issue 15: each first caller used to write it
 * unsynchronized, a data race ThreadSanitizer reported in test_threads and test_tune_compile). */
static pthread_once_t nvrtc_version_once = PTHREAD_ONCE_INIT;
static char nvrtc_version_buf[32];

static void nvrtc_version_init(void)
{
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) major = minor = 0;
    snprintf(nvrtc_version_buf, sizeof nvrtc_version_buf, "%d.%d", major, minor);
}

const char *nvrtc_version_text(void)
{
    pthread_once(&nvrtc_version_once, nvrtc_version_init);
    return nvrtc_version_buf;
}

static flce_status nvrtc_fail(nvrtcProgram prog, nvrtcResult r, const char *name, int sm)
{
    size_t log_len = 0;
    char *log = NULL;
    if (nvrtcGetProgramLogSize(prog, &log_len) == NVRTC_SUCCESS && log_len > 1) {
        log = malloc(log_len);
        if (log && nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
    }
    flce_status st = err_set(FLCE_ERR_COMPILE, "NVRTC could not compile %s for %s: %s%s%s", name,
                             spec_arch_name(sm), nvrtcGetErrorString(r), log ? "\n" : "",
                             log ? log : "");
    free(log);
    nvrtcDestroyProgram(&prog);
    return st;
}

flce_status nvrtc_compile(const char *src, const char *name, int sm, void **cubin, size_t *len)
{
    *cubin = NULL;
    *len = 0;
    if (fault_fire(FAULT_NVRTC_COMPILE))
        return err_set(FLCE_ERR_COMPILE, "injected fault: NVRTC compile of %s for %s", name,
                       spec_arch_name(sm));
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return err_set(FLCE_ERR_COMPILE, "nvrtcCreateProgram(%s): %s", name, nvrtcGetErrorString(r));
    const char *opts[NVRTC_MAX_OPTS];
    char arch[64];
    int n = nvrtc_options(sm, opts, arch, sizeof arch);
    r = nvrtcCompileProgram(prog, n, opts);
    if (r != NVRTC_SUCCESS) return nvrtc_fail(prog, r, name, sm);
    size_t size = 0;
    r = nvrtcGetCUBINSize(prog, &size);
    if (r != NVRTC_SUCCESS || size == 0) return nvrtc_fail(prog, r, name, sm);
    void *bin = malloc(size);
    if (!bin) {
        nvrtcDestroyProgram(&prog);
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "compiling %s: no host memory for a %zu-byte cubin",
                       name, size);
    }
    r = nvrtcGetCUBIN(prog, bin);
    if (r != NVRTC_SUCCESS) {
        free(bin);
        return nvrtc_fail(prog, r, name, sm);
    }
    nvrtcDestroyProgram(&prog);
    *cubin = bin;
    *len = size;
    return FLCE_OK;
}
