/* nvrtc_compile.c — source → cubin through NVRTC (see nvrtc_compile.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dl_iterate_phdr and struct dl_phdr_info (link.h) */
#endif
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

#include "config.h"
#include "dynload.h"
#include "fault.h"
#include "log.h"
#include "nvrtc_compile.h"
#include "spec.h"

/* NVRTC is opened on first use (dynload.h), so the library loads where NVRTC is missing or of another
 * CUDA major version than the build's; nvrtc.h gives the prototypes. Looked for on the library path,
 * then in the pip wheels (nvidia-cuda-nvrtc for CUDA 13, nvidia-cuda-nvrtc-cu12) of the Python
 * environments dynload.h lists, then in the build's toolkit; FLCE_NVRTC_LIBRARY names the file. */
static struct {
    nvrtcResult (*Version)(int *, int *);
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                 const char *const *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
} nv;
static int nv_loaded;
static char nv_why[3072];
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

/* NVRTC opens libnvrtc-builtins.so.<major>.<minor> by name when it compiles. Some of its builds (the
 * 13.0 toolkit's and wheel's) carry no RUNPATH, so a copy loaded from a directory outside the library
 * path (a pip wheel's, FLCE_NVRTC_LIBRARY's) would not find the builtins beside it: open them from
 * that directory first; the loader then matches NVRTC's request by soname. Kept open for good. */
static void nv_preload_builtins(void)
{
    const char *file = dyn_file_of(&nv);
    const char *slash = file ? strrchr(file, '/') : NULL;
    int major = 0, minor = 0;
    if (!slash || nv.Version(&major, &minor) != NVRTC_SUCCESS) return;
    char path[4096];
    int n = snprintf(path, sizeof path, "%.*s/libnvrtc-builtins.so.%d.%d", (int)(slash - file), file, major, minor);
    if (n < 0 || n >= (int)sizeof path) return;
    FILE *probe = fopen(path, "rb");
    if (!probe) return;
    fclose(probe);
    if (!dlopen(path, RTLD_NOW | RTLD_LOCAL)) (void)dlerror(); /* NVRTC's own message says it, if it matters */
}

static void nv_load(void)
{
    static const char *const libs[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
    static const char *const syms[] = {"nvrtcVersion", "nvrtcGetErrorString", "nvrtcCreateProgram",
                                       "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
                                       "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcDestroyProgram"};
    enum { N = sizeof syms / sizeof syms[0] };
    _Static_assert(sizeof nv == N * sizeof(void *), "one slot per symbol");
    /* the wheels' layouts: CUDA 13 (nvidia-cuda-nvrtc) and CUDA 12 (nvidia-cuda-nvrtc-cu12) */
    static const char *const wheels[] = {"nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                                         NULL};
    char tried[2560];
    nv_loaded = dyn_load_table(libs, wheels, config_env(CONFIG_NVRTC_LIBRARY), syms, N, &nv, tried, sizeof tried);
    if (nv_loaded) nv_preload_builtins();
    else
        snprintf(nv_why, sizeof nv_why,
                 "NVRTC (the CUDA runtime compiler flce compiles its kernels with) could not be loaded: %s. "
                 "Install it: pip install nvidia-cuda-nvrtc (CUDA 13) or nvidia-cuda-nvrtc-cu12 (CUDA 12) "
                 "in a Python environment searched above, or the CUDA toolkit's libnvrtc (e.g. apt install "
                 "cuda-nvrtc-13-0) on the library path; or set FLCE_NVRTC_LIBRARY to the file",
                 tried);
}

/* FLCE_OK once NVRTC is loaded; else FLCE_ERR_COMPILE saying what was tried and how to get it. */
static flce_status nv_require(void)
{
    pthread_once(&nv_once, nv_load);
    if (nv_loaded) return FLCE_OK;
    return err_set(FLCE_ERR_COMPILE, "%s", nv_why);
}

enum { NVRTC_MAX_OPTS = 8 };

/* FLCE_NVRTC_FAST: "1" or "mid" adds --Ofast-compile=mid, "min" and "max" those levels; unset,
 * "" or "0" adds nothing (the default). bench/NOTES.md ("Cold start: where NVRTC time goes")
 * measured mid at a quarter of the compile time of 8192x4096x128256's kernels with worse SASS
 * (stack frames, local loads and stores in the GEMM main loops, half the wgmma unrolled): an
 * opt-in for jobs that compile far more than they run, until a GPU A/B says what it costs. The
 * option text is part of every cache key, so fast and full-speed kernels never mix in the cache. */
static const char *nvrtc_fast_option(void)
{
    static const char *const opt[] = {NULL, "--Ofast-compile=min", "--Ofast-compile=mid", "--Ofast-compile=max"};
    return opt[config_get()->nvrtc_fast]; /* config.c parses and warns */
}

static int nvrtc_options(int sm, const char **opts, char *arch_buf, size_t cap)
{
    int n = 0;
    snprintf(arch_buf, cap, "--gpu-architecture=%s", spec_arch_name(sm));
    opts[n++] = arch_buf;
    opts[n++] = "-std=c++17";
    /* No --use_fast_math: the per-token math (lse, the loss, dz coefficients) uses accurate
     * expf/logf; the per-logit exps call ex2.approx themselves where measured safe (NOTES v15),
     * within docs/DESIGN.md §8.2's tolerances. */
    opts[n++] = "--fmad=true";
    opts[n++] = "-default-device";
    const char *fast = nvrtc_fast_option();
    if (fast) opts[n++] = fast;
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
    pthread_once(&nv_once, nv_load);
    if (!nv_loaded || nv.Version(&major, &minor) != NVRTC_SUCCESS) major = minor = 0;
    snprintf(nvrtc_version_buf, sizeof nvrtc_version_buf, "%d.%d", major, minor);
}

/* The GNU build ID of the loaded libnvrtc (hex), so that cache keys tell apart two builds of one
 * major.minor (a toolkit update in place: 13.0.1 and 13.0.2 both say "13.0"; issue 16 item 4). Read
 * from the ELF note of the loaded object that holds nvrtcVersion: no file I/O, the same on every
 * host with the same library, "none" where there is no such note. */
static pthread_once_t nvrtc_build_once = PTHREAD_ONCE_INIT;
static char nvrtc_build_buf[2 * 64 + 1] = "none";

static int nvrtc_build_visit(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t want = (uintptr_t)data;
    int mine = 0;
    for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        mine = ph->p_type == PT_LOAD && want >= lo && want < lo + ph->p_memsz;
    }
    if (!mine) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
        const unsigned char *end = p + ph->p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)(const void *)p;
            const unsigned char *name = p + sizeof *nh;
            const unsigned char *desc = name + ((nh->n_namesz + 3u) & ~3u);
            const unsigned char *next = desc + ((nh->n_descsz + 3u) & ~3u);
            if (next > end) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !memcmp(name, "GNU", 4) &&
                nh->n_descsz > 0 && nh->n_descsz <= 64) {
                for (unsigned k = 0; k < nh->n_descsz; k++)
                    snprintf(nvrtc_build_buf + 2 * k, 3, "%02x", desc[k]);
                return 1;
            }
            p = next;
        }
    }
    return 1; /* the right object, without a build ID */
}

static void nvrtc_build_init(void)
{
    pthread_once(&nv_once, nv_load);
    if (!nv_loaded) return;
    union { nvrtcResult (*fn)(int *, int *); void *p; } sym = {nv.Version};
    dl_iterate_phdr(nvrtc_build_visit, sym.p);
}

const char *nvrtc_build_text(void)
{
    pthread_once(&nvrtc_build_once, nvrtc_build_init);
    return nvrtc_build_buf;
}

const char *nvrtc_load_error(void)
{
    pthread_once(&nv_once, nv_load);
    return nv_loaded ? NULL : nv_why;
}

const char *nvrtc_library_file(void)
{
    pthread_once(&nv_once, nv_load);
    return nv_loaded ? dyn_file_of(&nv) : NULL;
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
    if (nv.GetProgramLogSize(prog, &log_len) == NVRTC_SUCCESS && log_len > 1) {
        log = malloc(log_len);
        if (log && nv.GetProgramLog(prog, log) != NVRTC_SUCCESS) log[0] = '\0';
    }
    flce_status st = err_set(FLCE_ERR_COMPILE, "NVRTC could not compile %s for %s: %s%s%s", name,
                             spec_arch_name(sm), nv.GetErrorString(r), log ? "\n" : "",
                             log ? log : "");
    free(log);
    nv.DestroyProgram(&prog);
    return st;
}

flce_status nvrtc_compile(const char *src, const char *name, int sm, void **cubin, size_t *len)
{
    *cubin = NULL;
    *len = 0;
    if (fault_fire(FAULT_NVRTC_COMPILE))
        return err_set(FLCE_ERR_COMPILE, "injected fault: NVRTC compile of %s for %s", name,
                       spec_arch_name(sm));
    TRY(nv_require());
    nvrtcProgram prog;
    nvrtcResult r = nv.CreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return err_set(FLCE_ERR_COMPILE, "nvrtcCreateProgram(%s): %s", name, nv.GetErrorString(r));
    const char *opts[NVRTC_MAX_OPTS];
    char arch[64];
    int n = nvrtc_options(sm, opts, arch, sizeof arch);
    r = nv.CompileProgram(prog, n, opts);
    if (r != NVRTC_SUCCESS) return nvrtc_fail(prog, r, name, sm);
    size_t size = 0;
    r = nv.GetCUBINSize(prog, &size);
    if (r != NVRTC_SUCCESS || size == 0) return nvrtc_fail(prog, r, name, sm);
    void *bin = malloc(size);
    if (!bin) {
        nv.DestroyProgram(&prog);
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "compiling %s: no host memory for a %zu-byte cubin",
                       name, size);
    }
    r = nv.GetCUBIN(prog, bin);
    if (r != NVRTC_SUCCESS) {
        free(bin);
        return nvrtc_fail(prog, r, name, sm);
    }
    nv.DestroyProgram(&prog);
    *cubin = bin;
    *len = size;
    return FLCE_OK;
}
