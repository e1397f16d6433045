/* jit.c — spec → source → cubin, memoized on disk (see jit.h and DESIGN.md §5). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
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
    cache_entry_lock lock = {.fd = -1};
    TRY(emit_source(s, &src));
    flce_status st = key_from_source(s, src, &key, &key_len);
    if (st != FLCE_OK) goto done;

    double t0 = now_ms();
    int have_dir = cache_dir_writable(dir, sizeof dir) == FLCE_OK;
    if (have_dir) {
        st = cache_load(dir, key, key_len, &out->cubin, &out->len);
        /* A miss: take the entry's compile lock, so that processes missing it together compile it
         * once (the others wait in cache_lock_entry), then look again: the holder waited for has
         * stored it. Without the lock (read-only directory, timeout) this compiles anyway. */
        int missed = st == FLCE_OK && !out->cubin;
        if (missed) {
            cache_lock_entry(dir, key, key_len, &lock);
            st = cache_load(dir, key, key_len, &out->cubin, &out->len);
        }
        if (st != FLCE_OK) goto done;
        if (out->cubin) {
            out->origin = JIT_DISK_HIT;
            out->ms = now_ms() - t0;
            /* The directory's persistent counters (flce cache stats): a hit, or a miss that
             * another process's (or thread's) compile served. */
            cache_stats_note(dir, missed ? CACHE_OUTCOME_WAITED : CACHE_OUTCOME_HIT, 0, lock.waited_ms);
            log_msg(LOG_INFO, "kernel %s: disk cache hit (%.1f ms%s)", summary, out->ms,
                    missed ? ", after waiting for another compile of it" : "");
            goto done;
        }
    } else {
        log_msg(LOG_WARN, "no cache directory (%s); compiled kernels stay in memory only",
                err_message());
        err_clear();
    }
    double tc = now_ms();
    st = nvrtc_compile(src, spec_role_name(s->role), s->sm, &out->cubin, &out->len);
    if (st != FLCE_OK) {
        err_wrap(st, "kernel %s", summary);
        goto done;
    }
    out->origin = JIT_COMPILED;
    out->ms = now_ms() - t0;
    double compile_ms = now_ms() - tc;
    cache_note_compile(compile_ms);
    if (have_dir) cache_stats_note(dir, CACHE_OUTCOME_COMPILED, compile_ms, lock.waited_ms);
    log_msg(LOG_INFO, "kernel %s: compiled in %.0f ms (%zu-byte cubin, cache miss)", summary, out->ms,
            out->len);
    if (have_dir) st = cache_store(dir, key, key_len, out->cubin, out->len);
done:
    cache_unlock_entry(&lock); /* after the store: waiters find the entry */
    free(src);
    free(key);
    if (st != FLCE_OK) {
        free(out->cubin);
        out->cubin = NULL;
    }
    return st;
}

/* One kernel of jit_build_many on its own thread. The message of a failure is thread-local, so it
 * travels back in the slot. */
typedef struct jit_slot {
    const kernel_spec *spec;
    jit_result *out;
    flce_status st;
    char msg[1024];
} jit_slot;

static void *jit_worker(void *arg)
{
    jit_slot *j = arg;
    j->st = jit_build(j->spec, j->out);
    if (j->st != FLCE_OK) snprintf(j->msg, sizeof j->msg, "%s", err_message());
    return NULL;
}

flce_status jit_build_many(const kernel_spec *const *specs, int n, jit_result *out)
{
    enum { MAX_PARALLEL = 8 };
    if (n <= 0) return FLCE_OK;
    if (n > MAX_PARALLEL) return err_set(FLCE_ERR_INTERNAL, "jit_build_many: %d kernels, at most %d", n, MAX_PARALLEL);
    jit_slot slot[MAX_PARALLEL];
    pthread_t th[MAX_PARALLEL];
    int started[MAX_PARALLEL] = {0};
    for (int i = 0; i < n; i++) {
        slot[i].spec = specs[i], slot[i].out = &out[i], slot[i].st = FLCE_OK, slot[i].msg[0] = 0;
        memset(&out[i], 0, sizeof out[i]);
        /* The last kernel builds on the calling thread, as does any whose thread would not start. */
        if (i < n - 1) started[i] = pthread_create(&th[i], NULL, jit_worker, &slot[i]) == 0;
        if (!started[i]) jit_worker(&slot[i]);
    }
    for (int i = 0; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++) {
        if (slot[i].st == FLCE_OK) continue;
        for (int k = 0; k < n; k++) free(out[k].cubin), out[k].cubin = NULL;
        return err_set(slot[i].st, "%s", slot[i].msg);
    }
    err_clear(); /* a worker on this thread may have left a note from a degraded cache */
    return FLCE_OK;
}
