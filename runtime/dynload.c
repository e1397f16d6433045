/* dynload.c — run-time loading of NVRTC and NCCL (see dynload.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "dynload.h"

#ifndef FLCE_TOOLKIT_LIB_DIR
#define FLCE_TOOLKIT_LIB_DIR ""
#endif

static void *try_open(const char *path, char *why, size_t cap)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        size_t used = strlen(why);
        const char *e = dlerror();
        snprintf(why + used, cap - used, "%s%s (%s)", used ? "; " : "", path, e ? e : "not found");
    }
    return lib;
}

void *dyn_open(const char *const *names, const char *override, char *why, size_t cap)
{
    why[0] = '\0';
    if (override && *override) return try_open(override, why, cap);
    for (int i = 0; names[i]; i++) {
        void *lib = try_open(names[i], why, cap);
        if (lib) return lib;
    }
    if (!*FLCE_TOOLKIT_LIB_DIR) return NULL;
    for (int i = 0; names[i]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", FLCE_TOOLKIT_LIB_DIR, names[i]);
        void *lib = try_open(path, why, cap);
        if (lib) return lib;
    }
    return NULL;
}

int dyn_load_table(const char *const *libs, const char *override, const char *const *syms, int n,
                   void *table, char *why, size_t cap)
{
    void *lib = dyn_open(libs, override, why, cap);
    if (!lib) return 0;
    for (int i = 0; i < n; i++) {
        void *fn = dlsym(lib, syms[i]);
        if (!fn) {
            snprintf(why, cap, "symbol %s not found", syms[i]);
            return 0;
        }
        /* POSIX: the object pointer dlsym returns is the function's address */
        memcpy((char *)table + (size_t)i * sizeof fn, &fn, sizeof fn);
    }
    return 1;
}
