/* jit.c — spec → source → cubin, memoized on disk (see jit.h and docs/DESIGN.md §5). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "config.h"
#include "emit.h"
#include "hash.h"
#include "jit.h"
#include "log.h"
#include "nvrtc_compile.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* CPU time of the calling thread, -1 where the clock is missing. A compile's wall time alone
 * cannot tell a compile that waited for a core (ranks or jit_build_many's threads sharing few
 * cores) from one that NVRTC 12.9+'s own cache under CUDA_CACHE_PATH served in a fraction of the
 * work (bench/NOTES.md, cold start); its thread's CPU time can. The thread's, not the process's,
 * because jit_build_many runs several compiles at once. NVRTC compiles on the calling thread
 * (flce passes no --split-compile), so this is the compile's CPU time: `flce warmup` of one shape
 * on a 2-core host logged five compiles' CPU summing to 5.56 s, its process 5.57 s in all. */
static double thread_cpu_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static flce_status key_from_source(const kernel_spec *s, const char *src, char **key, size_t *len)
{
    char summary[256], opts[256];
    spec_code_summary(s, summary, sizeof summary); /* no D or V: one entry for every shape */
    nvrtc_options_text(s->sm, opts, sizeof opts);
    size_t cap = strlen(summary) + strlen(opts) + strlen(src) + 512;
    char *k = malloc(cap);
    if (!k) return err_set(FLCE_ERR_OUT_OF_MEMORY, "building a cache key: out of host memory");
    int n = snprintf(k, cap, "%s\nflce %s | nvrtc %s build %s | %s | %s\n%s", summary,
                     FLCE_VERSION_STRING, nvrtc_version_text(), nvrtc_build_text(),
                     spec_arch_name(s->sm), opts, src);
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

flce_status jit_key_hash(const kernel_spec *s, uint64_t out[2])
{
    char *key = NULL;
    size_t len = 0;
    TRY(jit_key(s, &key, &len));
    hash128(key, len, out);
    free(key);
    return FLCE_OK;
}

/* js's cache directory: its own, as given, or the process's (cache_dir_writable). */
static flce_status jit_dir(const jit_settings *js, char *dir, size_t cap)
{
    if (!js || !js->cache_dir || !*js->cache_dir) return cache_dir_writable(dir, cap);
    int n = snprintf(dir, cap, "%s", js->cache_dir);
    if (n < 0 || (size_t)n >= cap)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache directory '%s': longer than %zu bytes", js->cache_dir, cap - 1);
    return FLCE_OK;
}

static const char *jit_ro(const jit_settings *js)
{
    return js && js->cache_ro ? js->cache_ro : config_env(CONFIG_CACHE_RO);
}

static int jit_threads(const jit_settings *js)
{
    int t = js && js->threads > 0 ? js->threads : config_get()->compile_threads;
    return t < 1 ? 1 : t > 8 ? 8 : t;
}

static int jit_background(const jit_settings *js)
{
    return js && js->background >= 0 ? js->background : config_get()->prefetch;
}

flce_status jit_lookup(const kernel_spec *s, jit_result *out) { return jit_lookup_with(NULL, s, out); }

flce_status jit_lookup_with(const jit_settings *js, const kernel_spec *s, jit_result *out)
{
    memset(out, 0, sizeof *out);
    char dir[CACHE_PATH_MAX], *key = NULL;
    size_t key_len = 0;
    if (jit_dir(js, dir, sizeof dir) != FLCE_OK) {
        err_clear(); /* memory only: nothing to find */
        return FLCE_OK;
    }
    double t0 = now_ms();
    TRY(jit_key(s, &key, &key_len));
    hash128(key, key_len, out->key_hash);
    flce_status st = cache_load_ro(dir, jit_ro(js), key, key_len, &out->cubin, &out->len);
    free(key);
    if (st == FLCE_OK && out->cubin) {
        out->origin = JIT_DISK_HIT, out->ms = now_ms() - t0;
        cache_stats_note(dir, CACHE_OUTCOME_HIT, 0, 0, 0);
    }
    return st;
}

flce_status jit_build(const kernel_spec *s, jit_result *out) { return jit_build_with(NULL, s, out); }

flce_status jit_build_with(const jit_settings *js, const kernel_spec *s, jit_result *out)
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
    hash128(key, key_len, out->key_hash);

    double t0 = now_ms();
    int have_dir = jit_dir(js, dir, sizeof dir) == FLCE_OK;
    if (have_dir) {
        st = cache_load_ro(dir, jit_ro(js), key, key_len, &out->cubin, &out->len);
        /* A miss: take the entry's compile lock, so that processes missing it together compile it
         * once (the others wait in cache_lock_entry), then look again: the holder waited for has
         * stored it. Without the lock (read-only directory, timeout) this compiles anyway. */
        int missed = st == FLCE_OK && !out->cubin;
        if (missed) {
            cache_lock_entry(dir, key, key_len, &lock);
            st = cache_load_ro(dir, jit_ro(js), key, key_len, &out->cubin, &out->len);
        }
        if (st != FLCE_OK) goto done;
        if (out->cubin) {
            out->origin = JIT_DISK_HIT;
            out->ms = now_ms() - t0;
            /* The directory's persistent counters (flce cache stats): a hit, or a miss that
             * another process's (or thread's) compile served. */
            cache_stats_note(dir, missed ? CACHE_OUTCOME_WAITED : CACHE_OUTCOME_HIT, 0, 0, lock.waited_ms);
            log_msg(LOG_INFO, "kernel %s: disk cache hit (%.1f ms%s)", summary, out->ms,
                    missed ? ", after waiting for another compile of it" : "");
            goto done;
        }
    } else {
        log_msg(LOG_WARN, "no cache directory (%s); compiled kernels stay in memory only",
                err_message());
        err_clear();
    }
    /* The compile lock (when one was had) is held from here until after the store: a process
     * killed in NVRTC leaves the lock file unheld and no entry (tests/test_fault.c waits for this
     * line to kill one there). */
    log_msg(LOG_DEBUG, "kernel %s: cache miss, compiling%s", summary,
            lock.fd >= 0 ? " (holding its compile lock)" : "");
    double tc = now_ms(), cpu0 = thread_cpu_ms();
    st = nvrtc_compile(src, spec_role_name(s->role), s->sm, &out->cubin, &out->len);
    double cpu1 = thread_cpu_ms();
    if (st != FLCE_OK) {
        err_wrap(st, "kernel %s", summary);
        goto done;
    }
    out->origin = JIT_COMPILED;
    out->ms = now_ms() - t0;
    double compile_ms = now_ms() - tc;
    double cpu_ms = cpu0 >= 0 && cpu1 >= cpu0 ? cpu1 - cpu0 : -1;
    cache_note_compile(compile_ms, cpu_ms);
    if (have_dir) cache_stats_note(dir, CACHE_OUTCOME_COMPILED, compile_ms, cpu_ms, lock.waited_ms);
    /* The first "compiled in" ms is the whole build (lookups and lock waits included); the fields
     * after "cache miss" are NVRTC's call alone, wall then CPU. bench/coldstart.sh parses the line
     * up to "ms": new fields go at the end. */
    char cpu_text[32] = "?";
    if (cpu_ms >= 0) snprintf(cpu_text, sizeof cpu_text, "%.0f", cpu_ms);
    log_msg(LOG_INFO, "kernel %s: compiled in %.0f ms (%zu-byte cubin, cache miss, nvrtc %.0f ms wall, %s ms cpu)",
            summary, out->ms, out->len, compile_ms, cpu_text);
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

/* One kernel of jit_build_many. The message of a failure is thread-local, so it travels back in
 * the slot. */
typedef struct jit_slot {
    const kernel_spec *spec;
    jit_result *out;
    flce_status st;
    char msg[1024];
} jit_slot;

/* One thread of jit_build_many: slots first, first + step, ... of n, logging through the caller's
 * sink (a context's log callback). */
typedef struct jit_worker_arg {
    const jit_settings *js;
    jit_slot *slot;
    int first, step, n;
    log_sink sink;
} jit_worker_arg;

static void *jit_worker(void *arg)
{
    jit_worker_arg *w = arg;
    log_sink was = log_sink_set(w->sink);
    for (int i = w->first; i < w->n; i += w->step) {
        jit_slot *j = &w->slot[i];
        j->st = jit_build_with(w->js, j->spec, j->out);
        if (j->st != FLCE_OK) snprintf(j->msg, sizeof j->msg, "%s", err_message());
    }
    log_sink_set(was);
    return NULL;
}

flce_status jit_build_many(const kernel_spec *const *specs, int n, jit_result *out)
{
    return jit_build_many_with(NULL, specs, n, out);
}

flce_status jit_build_many_with(const jit_settings *js, const kernel_spec *const *specs, int n, jit_result *out)
{
    enum { MAX_PARALLEL = 8 };
    if (n <= 0) return FLCE_OK;
    if (n > MAX_PARALLEL) return err_set(FLCE_ERR_INTERNAL, "jit_build_many: %d kernels, at most %d", n, MAX_PARALLEL);
    jit_slot slot[MAX_PARALLEL];
    for (int i = 0; i < n; i++) {
        slot[i].spec = specs[i], slot[i].out = &out[i], slot[i].st = FLCE_OK, slot[i].msg[0] = 0;
        memset(&out[i], 0, sizeof out[i]);
    }
    int workers = jit_threads(js) < n ? jit_threads(js) : n;
    jit_worker_arg arg[MAX_PARALLEL];
    pthread_t th[MAX_PARALLEL];
    int started[MAX_PARALLEL] = {0};
    for (int w = 0; w < workers; w++) arg[w] = (jit_worker_arg){js, slot, w, workers, n, log_sink_get()};
    /* The last worker's kernels build on the calling thread, as do those of any whose thread would
     * not start. */
    for (int w = 0; w < workers - 1; w++) started[w] = pthread_create(&th[w], NULL, jit_worker, &arg[w]) == 0;
    jit_worker(&arg[workers - 1]);
    for (int w = 0; w < workers - 1; w++)
        if (!started[w]) jit_worker(&arg[w]);
    for (int w = 0; w < workers - 1; w++)
        if (started[w]) pthread_join(th[w], NULL);
    for (int i = 0; i < n; i++) {
        if (slot[i].st == FLCE_OK) continue;
        for (int k = 0; k < n; k++) free(out[k].cubin), out[k].cubin = NULL;
        return err_set(slot[i].st, "%s", slot[i].msg);
    }
    err_clear(); /* a worker on this thread may have left a note from a degraded cache */
    return FLCE_OK;
}

/* ---- background prefetch ------------------------------------------------------------------- */

typedef struct jit_prefetch_job {
    int n;
    kernel_spec spec[8];
    char dir[CACHE_PATH_MAX]; /* resolved when queued ("": none, nothing is built) */
    char ro[CACHE_PATH_MAX];
    int ro_given, threads;    /* ro (else $FLCE_CACHE_RO); the settings' threads */
} jit_prefetch_job;

static pthread_mutex_t jit_prefetch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t jit_prefetch_done = PTHREAD_COND_INITIALIZER;
static uint64_t jit_prefetched[JIT_PREFETCH_MAX]; /* jit_prefetch_key of the specs queued */
static unsigned char jit_prefetched_done[JIT_PREFETCH_MAX]; /* its build finished (or never started) */
static int jit_prefetched_count;
static int jit_prefetch_running; /* threads not finished yet */
static pid_t jit_prefetch_pid;   /* the process they run in (a forked child has none of them) */
/* Threads whose work is done, not yet joined (at most one per queued spec). They are joined, not
 * detached, so that none is still exiting when the process exits: glibc frees a thread's
 * thread-specific data (libnvrtc's keys) as the thread exits, and one caught exiting at process
 * exit was reported leaked by LeakSanitizer (bench/NOTES.md session 32). */
static pthread_t jit_prefetch_ended[JIT_PREFETCH_MAX];
static int jit_prefetch_ended_count;

static void jit_prefetch_at_exit(void)
{
    if (!jit_prefetch_wait(JIT_PREFETCH_EXIT_WAIT_S))
        log_msg(LOG_WARN, "prefetch: a background compile was still running %.0f s after exit began",
                JIT_PREFETCH_EXIT_WAIT_S);
}

/* Exit runs its handlers newest first. Registered once, at the first prefetch, the wait ran after
 * the destructors that NVRTC registers lazily during later compiles: a shard of test_gpu died in
 * nvrtcCompileProgram on a prefetch thread during exit (session 7, twice in ~10 runs). Registered
 * again with every queued job, it runs before everything registered until then. At most
 * JIT_PREFETCH_MAX jobs, so at most that many registrations. */
static void jit_prefetch_register(void) { (void)atexit(jit_prefetch_at_exit); }

/* A spec's summary line and the cache directory it builds into: two contexts with their own
 * directories each fill theirs. */
static uint64_t jit_prefetch_key(const kernel_spec *s, const char *dir)
{
    char summary[256];
    spec_summary(s, summary, sizeof summary);
    return hash64(dir, strlen(dir), hash64(summary, strlen(summary), 0x7072656665746368ull));
}

/* Marks the job's specs finished. Called with jit_prefetch_lock held. */
static void jit_prefetch_mark_done(const jit_prefetch_job *job)
{
    for (int i = 0; i < job->n; i++) {
        uint64_t h = jit_prefetch_key(&job->spec[i], job->dir);
        for (int k = 0; k < jit_prefetched_count; k++)
            if (jit_prefetched[k] == h) jit_prefetched_done[k] = 1;
    }
}

jit_prefetch_status jit_prefetch_state(const kernel_spec *s) { return jit_prefetch_state_with(NULL, s); }

jit_prefetch_status jit_prefetch_state_with(const jit_settings *js, const kernel_spec *s)
{
    char dir[CACHE_PATH_MAX];
    if (jit_dir(js, dir, sizeof dir) != FLCE_OK) {
        err_clear();
        dir[0] = '\0';
    }
    uint64_t h = jit_prefetch_key(s, dir);
    jit_prefetch_status st = JIT_PREFETCH_NONE;
    pthread_mutex_lock(&jit_prefetch_lock);
    for (int k = 0; k < jit_prefetched_count && st == JIT_PREFETCH_NONE; k++)
        if (jit_prefetched[k] == h)
            st = jit_prefetched_done[k] || jit_prefetch_pid != getpid() ? JIT_PREFETCH_FINISHED : JIT_PREFETCH_QUEUED;
    pthread_mutex_unlock(&jit_prefetch_lock);
    return st;
}

static void *jit_prefetch_worker(void *arg)
{
    jit_prefetch_job *job = arg;
    const kernel_spec *ptr[8];
    jit_result res[8];
    for (int i = 0; i < job->n; i++) ptr[i] = &job->spec[i];
    jit_settings js = {job->dir, job->ro_given ? job->ro : NULL, job->threads, 1};
    double t0 = now_ms();
    if (jit_build_many_with(&js, ptr, job->n, res) == FLCE_OK) {
        int compiled = 0;
        for (int i = 0; i < job->n; i++) compiled += res[i].origin == JIT_COMPILED, free(res[i].cubin);
        log_msg(LOG_INFO, "prefetch: %d kernel%s in the background, %d compiled (%.0f ms)", job->n,
                job->n == 1 ? "" : "s", compiled, now_ms() - t0);
    } else {
        log_msg(LOG_DEBUG, "prefetch: %s (the call that needs these kernels will say it again)",
                err_message());
        err_clear();
    }
    pthread_mutex_lock(&jit_prefetch_lock);
    jit_prefetch_mark_done(job);
    free(job);
    if (jit_prefetch_ended_count < JIT_PREFETCH_MAX) jit_prefetch_ended[jit_prefetch_ended_count++] = pthread_self();
    jit_prefetch_running--;
    pthread_cond_broadcast(&jit_prefetch_done);
    pthread_mutex_unlock(&jit_prefetch_lock);
    return NULL;
}

int jit_prefetch(const kernel_spec *const *specs, int n) { return jit_prefetch_with(NULL, specs, n); }

int jit_prefetch_with(const jit_settings *js, const kernel_spec *const *specs, int n)
{
    if (!jit_background(js) || n <= 0 || n > 8 || !specs) return 0;
    jit_prefetch_job *job = calloc(1, sizeof *job);
    if (!job) return 0;
    int have_dir = jit_dir(js, job->dir, sizeof job->dir) == FLCE_OK;
    if (!have_dir) {
        err_clear(); /* memory only: a compile here would be thrown away */
        job->dir[0] = '\0';
    }
    const char *ro = jit_ro(js);
    job->ro_given = ro != NULL && strlen(ro) < sizeof job->ro;
    if (job->ro_given) memcpy(job->ro, ro, strlen(ro) + 1);
    job->threads = jit_threads(js);
    pthread_mutex_lock(&jit_prefetch_lock);
    if (jit_prefetch_pid != getpid()) { /* first here, or a forked child: its parent's threads are gone */
        jit_prefetch_running = 0, jit_prefetch_ended_count = 0, jit_prefetch_pid = getpid();
        for (int k = 0; k < jit_prefetched_count; k++) jit_prefetched_done[k] = 1;
    }
    for (int i = 0; i < n; i++) {
        uint64_t h = jit_prefetch_key(specs[i], job->dir);
        int seen = 0;
        for (int k = 0; k < jit_prefetched_count && !seen; k++) seen = jit_prefetched[k] == h;
        if (seen || jit_prefetched_count == JIT_PREFETCH_MAX) continue;
        jit_prefetched_done[jit_prefetched_count] = 0;
        jit_prefetched[jit_prefetched_count++] = h;
        job->spec[job->n++] = *specs[i];
    }
    if (job->n) jit_prefetch_running++;
    pthread_mutex_unlock(&jit_prefetch_lock);
    int queued = have_dir ? job->n : 0;
    pthread_t th;
    pthread_attr_t attr;
    if (queued) {
        jit_prefetch_register();
        if (pthread_attr_init(&attr) != 0) {
            queued = 0;
        } else { /* joinable: jit_prefetch_wait joins it once its work is done */
            if (pthread_create(&th, &attr, jit_prefetch_worker, job) != 0) queued = 0;
            pthread_attr_destroy(&attr);
        }
    }
    if (!queued) {
        pthread_mutex_lock(&jit_prefetch_lock);
        jit_prefetch_mark_done(job); /* nothing will build them: a caller must not wait on them */
        if (job->n) jit_prefetch_running--;
        pthread_cond_broadcast(&jit_prefetch_done);
        pthread_mutex_unlock(&jit_prefetch_lock);
        free(job);
        return 0;
    }
    log_msg(LOG_DEBUG, "prefetch: %d kernel%s queued", queued, queued == 1 ? "" : "s");
    return queued;
}

int jit_prefetch_wait(double timeout_s)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double whole = (double)(time_t)timeout_s;
    until.tv_sec += (time_t)timeout_s;
    until.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&jit_prefetch_lock);
    if (jit_prefetch_pid != getpid()) /* a forked child: no such threads */
        jit_prefetch_running = 0, jit_prefetch_ended_count = 0;
    while (jit_prefetch_running > 0)
        if (pthread_cond_timedwait(&jit_prefetch_done, &jit_prefetch_lock, &until) != 0) break;
    int idle = jit_prefetch_running == 0;
    /* the threads whose work is done: joined outside the lock (each takes it last before it ends) */
    pthread_t ended[JIT_PREFETCH_MAX];
    int n_ended = jit_prefetch_ended_count;
    memcpy(ended, jit_prefetch_ended, sizeof ended[0] * (size_t)n_ended);
    jit_prefetch_ended_count = 0;
    pthread_mutex_unlock(&jit_prefetch_lock);
    for (int i = 0; i < n_ended; i++) pthread_join(ended[i], NULL);
    return idle;
}
