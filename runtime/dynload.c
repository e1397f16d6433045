/* dynload.c — run-time loading of NVRTC and NCCL (see dynload.h for where it looks). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr and Dl_info */
#endif
#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "dynload.h"

#ifndef FLCE_TOOLKIT_LIB_DIR
#define FLCE_TOOLKIT_LIB_DIR ""
#endif

/* The message under construction: appends, truncating at the buffer's end. */
typedef struct msg {
    char *buf;
    size_t cap;
} msg;

static void msg_add(msg *m, const char *fmt, ...)
{
    size_t used = strlen(m->buf);
    if (used + 1 >= m->cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->buf + used, m->cap - used, fmt, ap);
    va_end(ap);
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- the site-packages directories (dynload.h, step 3) ------------------------------------- */

enum { SITE_MAX = 32 };

typedef struct site_list {
    char dir[SITE_MAX][PATH_MAX];
    int n;
} site_list;

/* Adds `dir` when it is an existing directory not in the list yet (compared after realpath). */
static void site_add(site_list *s, const char *dir)
{
    char real[PATH_MAX];
    if (s->n >= SITE_MAX || !*dir || !is_dir(dir) || !realpath(dir, real)) return;
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->dir[i], real)) return;
    snprintf(s->dir[s->n++], PATH_MAX, "%s", real);
}

/* Adds <prefix>/lib/python3.X/<leaf> for every X found. */
static void site_add_prefix(site_list *s, const char *prefix, const char *leaf)
{
    char pattern[PATH_MAX];
    if (!prefix || !*prefix) return;
    if (snprintf(pattern, sizeof pattern, "%s/lib/python3*/%s", prefix, leaf) >= (int)sizeof pattern) return;
    glob_t g;
    if (glob(pattern, GLOB_ONLYDIR, NULL, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) site_add(s, g.gl_pathv[i]);
    globfree(&g);
}

static int leaf_is_site(const char *dir)
{
    const char *slash = strrchr(dir, '/');
    const char *leaf = slash ? slash + 1 : dir;
    return !strcmp(leaf, "site-packages") || !strcmp(leaf, "dist-packages");
}

/* The site-packages directory one or two levels above the file holding this code: libflce.so.0 in
 * site-packages/flce/ (the pip package) or the tool in site-packages/flce/bin/. */
static const char own_anchor; /* an address inside flce's own file */

static void site_add_own(site_list *s)
{
    Dl_info info;
    if (!dladdr(&own_anchor, &info) || !info.dli_fname || !*info.dli_fname) return;
    char dir[PATH_MAX];
    if (!realpath(info.dli_fname, dir)) return;
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) return;
        *slash = '\0'; /* up 0: the file's directory; 1: its parent; 2: the grandparent */
        if (up > 0 && leaf_is_site(dir)) {
            site_add(s, dir);
            return;
        }
    }
}

/* Each entry of a colon-separated list, as f(s, entry). */
static void each_entry(site_list *s, const char *list, void (*f)(site_list *, const char *))
{
    if (!list) return;
    while (*list) {
        const char *end = strchr(list, ':');
        size_t len = end ? (size_t)(end - list) : strlen(list);
        char entry[PATH_MAX];
        if (len > 0 && len < sizeof entry) {
            memcpy(entry, list, len);
            entry[len] = '\0';
            f(s, entry);
        }
        if (!end) break;
        list = end + 1;
    }
}

/* A PATH directory holding python3 or python: its prefix's site-packages and dist-packages. */
static void site_add_path_dir(site_list *s, const char *dir)
{
    static const char *const exes[] = {"python3", "python"};
    for (size_t i = 0; i < sizeof exes / sizeof exes[0]; i++) {
        char exe[PATH_MAX], prefix[PATH_MAX];
        if (snprintf(exe, sizeof exe, "%s/%s", dir, exes[i]) >= (int)sizeof exe || access(exe, X_OK) != 0) continue;
        if (snprintf(prefix, sizeof prefix, "%s/..", dir) >= (int)sizeof prefix) return;
        site_add_prefix(s, prefix, "site-packages");
        site_add_prefix(s, prefix, "dist-packages");
        return;
    }
}

static void sites_find(site_list *s)
{
    s->n = 0;
    site_add_own(s);
    each_entry(s, config_env(CONFIG_PYTHONPATH), site_add);
    site_add_prefix(s, config_env(CONFIG_VIRTUAL_ENV), "site-packages");
    site_add_prefix(s, config_env(CONFIG_CONDA_PREFIX), "site-packages");
    each_entry(s, config_env(CONFIG_PATH), site_add_path_dir);
    const char *home = config_env(CONFIG_HOME);
    if (home && *home) {
        char local[PATH_MAX];
        if (snprintf(local, sizeof local, "%s/.local", home) < (int)sizeof local)
            site_add_prefix(s, local, "site-packages");
    }
}

/* ---- opening ------------------------------------------------------------------------------- */

/* dlopen(path); a failure other than "no such file" goes into the message with dlerror's words. */
static void *try_open(const char *path, msg *m)
{
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib) return lib;
    const char *e = dlerror();
    if (e && !strstr(e, "No such file")) msg_add(m, "; %s failed: %s", path, e);
    return NULL;
}

static void *open_from_wheels(const char *const *wheel_files, msg *m)
{
    site_list *s = malloc(sizeof *s); /* 128 KiB: not on a thread's stack */
    if (!s) return NULL;
    sites_find(s);
    void *lib = NULL;
    for (int i = 0; i < s->n && !lib; i++)
        for (int k = 0; wheel_files[k] && !lib; k++) {
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", s->dir[i], wheel_files[k]) >= (int)sizeof path) continue;
            if (is_file(path)) lib = try_open(path, m);
        }
    if (!lib) {
        msg_add(m, "; the NVIDIA pip wheels' ");
        for (int k = 0; wheel_files[k]; k++) msg_add(m, "%s%s", k ? ", " : "", wheel_files[k]);
        msg_add(m, " in the Python site-packages directories (flce's own, PYTHONPATH, VIRTUAL_ENV, "
                   "CONDA_PREFIX, python3 or python in PATH, ~/.local): ");
        if (!s->n) msg_add(m, "none found");
        for (int i = 0; i < s->n; i++) msg_add(m, "%s%s", i ? ", " : "", s->dir[i]);
    }
    free(s);
    return lib;
}

void *dyn_open(const char *const *names, const char *const *wheel_files, const char *override, char *why,
               size_t cap)
{
    msg m = {why, cap};
    why[0] = '\0';
    if (override && *override) {
        void *lib = dlopen(override, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            msg_add(&m, "%s (%s)", override, e ? e : "not found");
        }
        return lib;
    }
    for (int i = 0; names[i]; i++) msg_add(&m, "%s%s", i ? ", " : "", names[i]);
    msg_add(&m, ": not on the library path (LD_LIBRARY_PATH, the ld.so cache)");
    for (int i = 0; names[i]; i++) {
        void *lib = try_open(names[i], &m);
        if (lib) return lib;
    }
    if (wheel_files && wheel_files[0]) {
        void *lib = open_from_wheels(wheel_files, &m);
        if (lib) return lib;
    }
    if (*FLCE_TOOLKIT_LIB_DIR) {
        for (int i = 0; names[i]; i++) {
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/%s", FLCE_TOOLKIT_LIB_DIR, names[i]) >= (int)sizeof path) continue;
            void *lib = try_open(path, &m);
            if (lib) return lib;
        }
        msg_add(&m, "; nor in the build's toolkit directory %s", FLCE_TOOLKIT_LIB_DIR);
    }
    return NULL;
}

int dyn_load_table(const char *const *libs, const char *const *wheel_files, const char *override,
                   const char *const *syms, int n, void *table, char *why, size_t cap)
{
    void *lib = dyn_open(libs, wheel_files, override, why, cap);
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

const char *dyn_file_of(const void *table)
{
    void *fn;
    memcpy(&fn, table, sizeof fn); /* the first slot dyn_load_table filled */
    Dl_info info;
    if (!fn || !dladdr(fn, &info) || !info.dli_fname) return NULL;
    return info.dli_fname;
}
