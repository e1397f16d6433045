/*
 * nvrtc_time.c — where a problem's NVRTC time goes (issue 16): for the kernels a loss-and-grad
 * call of one shape loads (the plan warmup and get_kernels use), compiles each generated source
 * with flce's own NVRTC options plus any extra ones, one kernel after another on one thread, and
 * prints each compile's time (every rep: the first one is the process's first compile of that
 * source, then best and median of --reps) and cubin size; writes the cubins (and, with --trace,
 * NVRTC's --fdevice-time-trace JSON) to --out for cuobjdump. No GPU needed.
 *
 * NVRTC is opened at run time as the library opens it (dlopen, timed: "nvrtc load"), so the
 * first compile in this process is what a first call's first compile pays. Probes for the cold
 * start questions of bench/NOTES.md ("Cold start: why a first call's compile ..."):
 *   --init      compiles a tiny kernel twice before anything else: the first NVRTC compile of a
 *               process (libnvrtc-builtins, NVRTC's own cache initialization, which opens
 *               libcuda.so.1 and calls cuInit where there is a driver) against the second; says
 *               whether NVRTC loaded libcuda.so.1 (its compile cache needs the driver)
 *   --threads   all the kernels at once, one thread each (what jit_build_many does): per round
 *               wall, process CPU, each thread's wall and CPU, and how many threads made progress
 *               in each 10 ms sample (a lock inside NVRTC shows as 1 thread at a time)
 *   --only R,R  only these roles (rowops, logits, logits_dz, dh, dw)
 * Reps of the same source in one process show NVRTC's compile cache where it is active (CUDA
 * 12.9+, GPU hosts: the driver's compute cache, CUDA_CACHE_PATH / CUDA_CACHE_DISABLE): rep 1
 * compiles, later reps are cache hits.
 *
 * Not part of the CMake build (it is an experiment, built by hand against the static library):
 *   gcc -O2 -std=c11 -D_DEFAULT_SOURCE -Iinclude -Ibase -Iruntime -Igenerator -I/usr/local/cuda/include \
 *       bench/nvrtc_time.c build/libflce.a -lpthread -ldl -lm -o /tmp/nvrtc_time
 *   /tmp/nvrtc_time --init --shape 8192x4096x128256 --reps 3 --out /tmp/nv/base
 *   /tmp/nvrtc_time --shape 8192x4096x128256 --reps 3 --out /tmp/nv/fcmid -- --Ofast-compile=mid
 *   /tmp/nvrtc_time --threads --reps 3
 */
#define _GNU_SOURCE /* RTLD_NOLOAD */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <nvrtc.h>

#include "dynload.h"
#include "emit.h"
#include "flce.h"
#include "nvrtc_compile.h"
#include "plan.h"
#include "spec.h"

#define MAX_OPTS 32
#define MAX_REPS 16
#define MAX_K 5

/* NVRTC's entry points, opened at run time (nvrtc.h gives the prototypes). */
static struct {
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                 const char *const *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
} nv;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, nvrtcResult r)
{
    fprintf(stderr, "nvrtc_time: %s: %s\n", what, nv.GetErrorString(r));
    exit(1);
}

/* This thread's CPU time: NVRTC compiles on the calling thread, so this is the compile's work
 * whatever else the machine runs (wall time is not, on a shared 2-core machine). */
static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static _Thread_local double last_cpu_ms;

/* One compile; returns wall ms (last_cpu_ms: its CPU ms). *cubin and *len set when asked. */
static double compile_once(const char *src, const char *name, const char **opts, int n, void **cubin,
                           size_t *len, int print_log)
{
    nvrtcProgram prog;
    nvrtcResult r = nv.CreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) die("nvrtcCreateProgram", r);
    double t0 = now_ms(), c0 = thread_cpu_ms();
    r = nv.CompileProgram(prog, n, opts);
    double ms = now_ms() - t0;
    last_cpu_ms = thread_cpu_ms() - c0;
    size_t log_len = 0;
    nv.GetProgramLogSize(prog, &log_len);
    if ((r != NVRTC_SUCCESS || print_log) && log_len > 1) {
        char *log = malloc(log_len);
        nv.GetProgramLog(prog, log);
        fprintf(stderr, "--- %s log ---\n%s\n", name, log);
        free(log);
    }
    if (r != NVRTC_SUCCESS) die(name, r);
    if (cubin) {
        nv.GetCUBINSize(prog, len);
        *cubin = malloc(*len);
        nv.GetCUBIN(prog, *cubin);
    }
    nv.DestroyProgram(&prog);
    return ms;
}

/* --threads: every kernel compiled at once, one thread each (what jit_build_many does). */
typedef struct job {
    const char *src, *name;
    const char **opts;
    int n;
    double ms, cpu_ms;
    clockid_t clock; /* this thread's CPU clock, for the sampler */
    volatile int ready, done;
} job;

static void *job_run(void *arg)
{
    job *j = arg;
    pthread_getcpuclockid(pthread_self(), &j->clock);
    __atomic_store_n(&j->ready, 1, __ATOMIC_RELEASE);
    j->ms = compile_once(j->src, j->name, j->opts, j->n, NULL, NULL, 0);
    j->cpu_ms = last_cpu_ms;
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static double clock_ms(clockid_t c)
{
    struct timespec ts;
    if (clock_gettime(c, &ts)) return -1;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

static int libcuda_loaded(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

static const char tiny_src[] = "extern \"C\" __global__ void tiny(float *x) { x[threadIdx.x] += 1.0f; }\n";

int main(int argc, char **argv)
{
    long long n = 8192, d = 4096, v = 128256;
    int sm = 90, reps = 1, trace = 0, print_log = 0, threads = 0, init = 0;
    const char *out = NULL, *only = NULL;
    const char *extra[MAX_OPTS];
    int n_extra = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            for (i++; i < argc && n_extra < MAX_OPTS; i++) extra[n_extra++] = argv[i];
            break;
        }
        const char *val = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(argv[i], "--shape") && sscanf(val, "%lldx%lldx%lld", &n, &d, &v) == 3) i++;
        else if (!strcmp(argv[i], "--arch") && sscanf(val, "sm_%d", &sm) == 1) i++;
        else if (!strcmp(argv[i], "--reps") && (reps = atoi(val)) >= 1 && reps <= MAX_REPS) i++;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--trace")) trace = 1;
        else if (!strcmp(argv[i], "--log")) print_log = 1;
        else if (!strcmp(argv[i], "--threads")) threads = 1;
        else if (!strcmp(argv[i], "--init")) init = 1;
        else {
            fprintf(stderr,
                    "usage: nvrtc_time [--shape NxDxV] [--arch sm_90a] [--reps R] [--out DIR] [--only ROLE,...] "
                    "[--init] [--trace] [--log] [--threads] [-- extra NVRTC options]\n");
            return 2;
        }
    }

    /* NVRTC the way the library opens it (runtime/dynload.h), timed. */
    static const char *const libs[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
    static const char *const syms[] = {"nvrtcGetErrorString", "nvrtcVersion", "nvrtcCreateProgram",
                                       "nvrtcCompileProgram", "nvrtcGetCUBINSize", "nvrtcGetCUBIN",
                                       "nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcDestroyProgram"};
    static const char *const wheels[] = {"nvidia/cu13/lib/libnvrtc.so.13", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                                         NULL};
    char why[3072];
    double t_load = now_ms();
    if (!dyn_load_table(libs, wheels, getenv("FLCE_NVRTC_LIBRARY"), syms, (int)(sizeof syms / sizeof syms[0]), &nv, why,
                        sizeof why)) {
        fprintf(stderr, "nvrtc_time: %s\n", why);
        return 1;
    }
    t_load = now_ms() - t_load;
    int major = 0, minor = 0;
    nv.Version(&major, &minor);
    printf("nvrtc %d.%d: load (dlopen) %.1f ms; load average %.2f on %ld cores; CUDA_CACHE_PATH=%s "
           "CUDA_CACHE_DISABLE=%s\n",
           major, minor, t_load, loadavg(), sysconf(_SC_NPROCESSORS_ONLN),
           getenv("CUDA_CACHE_PATH") ? getenv("CUDA_CACHE_PATH") : "(unset)",
           getenv("CUDA_CACHE_DISABLE") ? getenv("CUDA_CACHE_DISABLE") : "(unset)");

    /* flce's options (nvrtc_options_text), then the extra ones. */
    static char base[512];
    nvrtc_options_text(sm, base, sizeof base);
    const char *opts[2 * MAX_OPTS];
    int n_opts = 0;
    for (char *save = NULL, *tok = strtok_r(base, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
        opts[n_opts++] = tok;
    for (int i = 0; i < n_extra; i++) opts[n_opts++] = extra[i];
    printf("options:");
    for (int i = 0; i < n_opts; i++) printf(" %s", opts[i]);
    printf("\n");

    if (init) {
        int cuda_before = libcuda_loaded();
        double w1 = compile_once(tiny_src, "tiny", opts, n_opts, NULL, NULL, 0), c1 = last_cpu_ms;
        int cuda_after = libcuda_loaded();
        double w2 = compile_once(tiny_src, "tiny", opts, n_opts, NULL, NULL, 0), c2 = last_cpu_ms;
        printf("init: tiny kernel, first compile of the process %.1f ms wall (%.1f cpu), second %.1f ms "
               "(%.1f cpu): one-time NVRTC start %.1f ms; libcuda.so.1 %s\n",
               w1, c1, w2, c2, w1 - w2,
               cuda_before ? "was already loaded" : cuda_after ? "loaded by NVRTC's first compile (its compile cache can be on)"
                                                               : "not loaded (no driver: NVRTC's compile cache is off)");
        fflush(stdout);
    }

    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_shard = v, p.dtype = FLCE_DTYPE_BF16;
    /* The outputs a training step asks for (loss, lse, both gradients), as flce_prepare marks them. */
    static char mark;
    flce_tensors t;
    flce_tensors_init(&t);
    t.loss = t.lse = (float *)(void *)&mark;
    t.grad_hidden = t.grad_weight = &mark;
    plan pl;
    double t_plan = now_ms();
    if (plan_make_on(&p, FLCE_OP_LOSS_AND_GRAD, NULL, sm, 132, &t, &pl) != FLCE_OK) {
        fprintf(stderr, "nvrtc_time: %s\n", flce_last_error());
        return 1;
    }
    t_plan = now_ms() - t_plan;
    const kernel_spec *all[MAX_K], *specs[MAX_K];
    const char *all_roles[MAX_K], *roles[MAX_K];
    int n_all = 0, k = 0;
    all[n_all] = &pl.rowops, all_roles[n_all++] = "rowops";
    all[n_all] = &pl.logits, all_roles[n_all++] = "logits";
    if (pl.fused_dz) all[n_all] = &pl.logits_dz, all_roles[n_all++] = "logits_dz";
    all[n_all] = &pl.dh, all_roles[n_all++] = "dh";
    all[n_all] = &pl.dw, all_roles[n_all++] = "dw";
    for (int i = 0; i < n_all; i++) {
        if (only) {
            /* whole names in a comma-separated list */
            size_t len = strlen(all_roles[i]);
            const char *s = only;
            int hit = 0;
            while ((s = strstr(s, all_roles[i])) && !hit) {
                hit = (s == only || s[-1] == ',') && (s[len] == ',' || s[len] == '\0');
                s += len;
            }
            if (!hit) continue;
        }
        specs[k] = all[i], roles[k++] = all_roles[i];
    }
    if (!k) {
        fprintf(stderr, "nvrtc_time: --only %s matches none of this plan's kernels\n", only);
        return 2;
    }

    if (threads) {
        /* All kernels at once, --reps times: wall and CPU time of each round, of each thread, and how
         * many threads progressed in each 10 ms sample. */
        char *srcs[MAX_K];
        job jobs[MAX_K];
        pthread_t th[MAX_K];
        for (int i = 0; i < k; i++)
            if (emit_source(specs[i], &srcs[i]) != FLCE_OK) return 1;
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < k; i++) jobs[i] = (job){srcs[i], roles[i], opts, n_opts, 0, 0, 0, 0, 0};
            double l0 = loadavg(), t0 = now_ms(), c0 = cpu_s();
            for (int i = 0; i < k; i++) pthread_create(&th[i], NULL, job_run, &jobs[i]);
            for (int i = 0; i < k; i++)
                while (!__atomic_load_n(&jobs[i].ready, __ATOMIC_ACQUIRE)) sched_yield();
            int hist[MAX_K + 1] = {0}, samples = 0, left = k;
            double last[MAX_K];
            for (int i = 0; i < k; i++) last[i] = clock_ms(jobs[i].clock);
            while (left) {
                struct timespec ts = {0, 10 * 1000 * 1000};
                nanosleep(&ts, NULL);
                int moving = 0;
                left = 0;
                for (int i = 0; i < k; i++) {
                    if (__atomic_load_n(&jobs[i].done, __ATOMIC_ACQUIRE)) continue;
                    left++;
                    double c = clock_ms(jobs[i].clock); /* valid until the thread is joined */
                    if (c >= 0 && c - last[i] > 1.0) moving++; /* > 10 % of the 10 ms sample */
                    if (c >= 0) last[i] = c;
                }
                if (left) hist[moving]++, samples++;
            }
            for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
            double sum_cpu = 0;
            for (int i = 0; i < k; i++) sum_cpu += jobs[i].cpu_ms;
            printf("threads: %d kernels at once: wall %.1f ms, process cpu %.1f ms (threads' compiles %.1f), "
                   "load average %.2f;",
                   k, now_ms() - t0, (cpu_s() - c0) * 1e3, sum_cpu, l0);
            for (int i = 0; i < k; i++) printf(" %s %.0f/%.0f", jobs[i].name, jobs[i].ms, jobs[i].cpu_ms);
            printf(" (wall/cpu ms)\n  10 ms samples with 0..%d threads progressing:", k);
            for (int i = 0; i <= k; i++) printf(" %d", hist[i]);
            printf(" (of %d)\n", samples);
            fflush(stdout);
        }
        for (int i = 0; i < k; i++) free(srcs[i]);
        return 0;
    }

    double total_best = 0;
    for (int i = 0; i < k; i++) {
        char *src = NULL, summary[256], trace_opt[1200], path[1024];
        double t_src = now_ms();
        if (emit_source(specs[i], &src) != FLCE_OK) {
            fprintf(stderr, "nvrtc_time: %s\n", flce_last_error());
            return 1;
        }
        t_src = now_ms() - t_src;
        spec_summary(specs[i], summary, sizeof summary);
        const char *role = roles[i];
        int m = n_opts;
        if (trace && out) {
            snprintf(trace_opt, sizeof trace_opt, "--fdevice-time-trace=%s/%s.trace", out, role);
            opts[m++] = trace_opt;
        }
        double ms[MAX_REPS], cpu[MAX_REPS], seq_ms[MAX_REPS], seq_cpu[MAX_REPS];
        void *cubin = NULL;
        size_t len = 0;
        for (int r = 0; r < reps; r++) {
            /* The trace goes with the last rep only, to a fresh file (ptxas reads an existing one). */
            if (m > n_opts) {
                char json[1300];
                snprintf(json, sizeof json, "%s.json", trace_opt + strlen("--fdevice-time-trace="));
                remove(json); /* NVRTC writes <name>.json */
            }
            ms[r] = seq_ms[r] = compile_once(src, role, opts, r == reps - 1 ? m : n_opts,
                                             r == reps - 1 ? &cubin : NULL, &len, print_log && r == reps - 1);
            cpu[r] = seq_cpu[r] = last_cpu_ms;
        }
        qsort(ms, (size_t)reps, sizeof ms[0], cmp_d);
        qsort(cpu, (size_t)reps, sizeof cpu[0], cmp_d);
        printf("%-10s wall best %7.1f median %7.1f ms  cpu best %7.1f ms  cubin %7zu B  %s\n", role,
               ms[0], ms[reps / 2], cpu[0], len, summary);
        printf("%-10s source generated in %.2f ms (%zu bytes)\n", "", t_src, strlen(src));
        if (reps > 1) {
            printf("%-10s each rep (wall/cpu ms):", "");
            for (int r = 0; r < reps; r++) printf(" %.1f/%.1f", seq_ms[r], seq_cpu[r]);
            printf("\n");
        }
        fflush(stdout);
        total_best += cpu[0];
        if (out) {
            snprintf(path, sizeof path, "%s/%s.cubin", out, role);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(cubin, 1, len, f) != len) fprintf(stderr, "nvrtc_time: cannot write %s\n", path);
            if (f) fclose(f);
        }
        free(cubin);
        free(src);
    }
    printf("total cpu (best of each) %.1f ms for %d kernels (plan %.2f ms); libcuda.so.1 %s\n", total_best, k, t_plan,
           libcuda_loaded() ? "loaded (NVRTC's compile cache can be on)" : "not loaded (NVRTC's compile cache is off)");
    return 0;
}
