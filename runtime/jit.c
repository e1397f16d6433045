/* jit.c — spec → source → cubin, memoized on disk (see jit.h and DESIGN.md §5). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache.h"
#include "emit.h"
#include "jit.h"
#include "log.h"
#include "nvrtc_compile.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static flce_status key_from_source(const kernel_spec *s, const char *src, char **key, size_t *len)
{
    char summary[256], opts[256];
    spec_summary(s, summary, sizeof summary);
    nvrtc_options_text(s->sm, opts, sizeof opts);
    size_t cap = strlen(summary) + strlen(opts) + strlen(src) + 256;
    char *k = malloc(cap);
    if (!k) return err_set(FLCE_ERR_OUT_OF_MEMORY, "building a cache key: out of host memory");
    int n = snprintf(k, cap, "%s\nflce %s | nvrtc %s | %s | %s\n%s", summary, FLCE_VERSION_STRING,
                     nvrtc_version_text(), spec_arch_name(s->sm), opts, src);
    *key = k;
    *len = (size_t)n;
    return FLCE_OK;
}

flce_status jit_key(const kernel_spec *s, char **key, size_t *len)
{
    char *src = NULL;
    TRY(emit_source(s, &src));
    flce_status st = key_from_source(s, src, key, len);
    free(src);
    return st;
}

flce_status jit_build(const kernel_spec *s, jit_result *out)
{
    memset(out, 0, sizeof *out);
    char summary[256], dir[CACHE_PATH_MAX];
    spec_summary(s, summary, sizeof summary);
    char *src = NULL, *key = NULL;
    size_t key_len = 0;
    TRY(emit_source(s, &src));
    flce_status st = key_from_source(s, src, &key, &key_len);
    if (st != FLCE_OK) goto done;

    double t0 = now_ms();
    int have_dir = cache_dir(dir, sizeof dir) == FLCE_OK;
    if (have_dir) {
        st = cache_load(dir, key, key_len, &out->cubin, &out->len);
        if (st != FLCE_OK) goto done;
        if (out->cubin) {
            out->origin = JIT_DISK_HIT;
            out->ms = now_ms() - t0;
            log_msg(LOG_INFO, "kernel %s: disk cache hit (%.1f ms)", summary, out->ms);
            goto done;
        }
    } else {
        log_msg(LOG_WARN, "no cache directory (%s); compiled kernels stay in memory only",
                err_message());
        err_clear();
    }
    st = nvrtc_compile(src, spec_role_name(s->role), s->sm, &out->cubin, &out->len);
    if (st != FLCE_OK) {
        err_wrap(st, "kernel %s", summary);
        goto done;
    }
    out->origin = JIT_COMPILED;
    out->ms = now_ms() - t0;
    log_msg(LOG_INFO, "kernel %s: compiled in %.0f ms (%zu-byte cubin, cache miss)", summary, out->ms,
            out->len);
    if (have_dir) st = cache_store(dir, key, key_len, out->cubin, out->len);
done:
    free(src);
    free(key);
    if (st != FLCE_OK) {
        free(out->cubin);
        out->cubin = NULL;
    }
    return st;
}
