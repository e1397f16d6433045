/* nvrtc_compile.c — source → cubin through NVRTC (see nvrtc_compile.h). */
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

const char *nvrtc_version_text(void)
{
    static char text[32];
    int major = 0, minor = 0;
    if (!text[0]) {
        nvrtcVersion(&major, &minor);
        snprintf(text, sizeof text, "%d.%d", major, minor);
    }
    return text;
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
