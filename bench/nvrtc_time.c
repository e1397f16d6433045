/*
 * nvrtc_time.c — where a problem's NVRTC time goes (issue 16): for the kernels a loss-and-grad
 * call of one shape loads (the plan warmup and get_kernels use), compiles each generated source
 * with flce's own NVRTC options plus any extra ones, one kernel after another on one thread, and
 * prints each compile's time (best and median of --reps) and cubin size; writes the cubins (and,
 * with --trace, NVRTC's --fdevice-time-trace JSON) to --out for cuobjdump. No GPU needed.
 *
 * Not part of the CMake build (it is an experiment, built by hand against the static library):
 *   gcc -O2 -std=c11 -D_DEFAULT_SOURCE -Iinclude -Iruntime -Igenerator -I/usr/local/cuda/include \
 *       bench/nvrtc_time.c build/libflce.a -L/usr/local/cuda/lib64 -lnvrtc -lpthread -ldl -lm \
 *       -o /tmp/nvrtc_time
 *   /tmp/nvrtc_time --shape 8192x4096x128256 --reps 3 --out /tmp/nv/base
 *   /tmp/nvrtc_time --shape 8192x4096x128256 --reps 3 --out /tmp/nv/fcmid -- --Ofast-compile=mid
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>
#include <sys/resource.h>

#include <nvrtc.h>

#include "emit.h"
#include "flce.h"
#include "nvrtc_compile.h"
#include "plan.h"
#include "spec.h"

#define MAX_OPTS 32
#define MAX_REPS 16

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
    fprintf(stderr, "nvrtc_time: %s: %s\n", what, nvrtcGetErrorString(r));
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

static double last_cpu_ms;

/* One compile; returns wall ms (last_cpu_ms: its CPU ms). *cubin/*len set when asked. */
static double compile_once(const char *src, const char *name, const char **opts, int n, void **cubin,
                           size_t *len, int print_log)
{
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) die("nvrtcCreateProgram", r);
    double t0 = now_ms(), c0 = thread_cpu_ms();
    r = nvrtcCompileProgram(prog, n, opts);
    double ms = now_ms() - t0;
    last_cpu_ms = thread_cpu_ms() - c0;
    size_t log_len = 0;
    nvrtcGetProgramLogSize(prog, &log_len);
    if ((r != NVRTC_SUCCESS || print_log) && log_len > 1) {
        char *log = malloc(log_len);
        nvrtcGetProgramLog(prog, log);
        fprintf(stderr, "--- %s log ---\n%s\n", name, log);
        free(log);
    }
    if (r != NVRTC_SUCCESS) die(name, r);
    if (cubin) {
        nvrtcGetCUBINSize(prog, len);
        *cubin = malloc(*len);
        nvrtcGetCUBIN(prog, *cubin);
    }
    nvrtcDestroyProgram(&prog);
    return ms;
}

/* --threads: every kernel compiled at once, one thread each (what jit_build_many does). */
typedef struct job {
    const char *src, *name;
    const char **opts;
    int n;
    double ms;
} job;

static void *job_run(void *arg)
{
    job *j = arg;
    j->ms = compile_once(j->src, j->name, j->opts, j->n, NULL, NULL, 0);
    return NULL;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv)
{
    long long n = 8192, d = 4096, v = 128256;
    int sm = 90, reps = 1, trace = 0, print_log = 0, threads = 0;
    const char *out = NULL;
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
        else if (!strcmp(argv[i], "--out")) out = argv[++i];
        else if (!strcmp(argv[i], "--trace")) trace = 1;
        else if (!strcmp(argv[i], "--log")) print_log = 1;
        else if (!strcmp(argv[i], "--threads")) threads = 1;
        else {
            fprintf(stderr,
                    "usage: nvrtc_time [--shape NxDxV] [--arch sm_90a] [--reps R] [--out DIR] "
                    "[--trace] [--log] [--threads] [-- extra NVRTC options]\n");
            return 2;
        }
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
    if (plan_make_on(&p, FLCE_OP_LOSS_AND_GRAD, NULL, sm, 132, &t, &pl) != FLCE_OK) {
        fprintf(stderr, "nvrtc_time: %s\n", flce_last_error());
        return 1;
    }
    const kernel_spec *specs[5];
    int k = 0;
    specs[k++] = &pl.rowops;
    specs[k++] = &pl.logits;
    if (pl.fused_dz) specs[k++] = &pl.logits_dz;
    specs[k++] = &pl.dh, specs[k++] = &pl.dw;

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

    if (threads) {
        /* All kernels at once, --reps times: wall and CPU time of each round. */
        char *srcs[5];
        job jobs[5];
        pthread_t th[5];
        for (int i = 0; i < k; i++) {
            if (emit_source(specs[i], &srcs[i]) != FLCE_OK) return 1;
            jobs[i] = (job){srcs[i], spec_role_name(specs[i]->role), opts, n_opts, 0};
        }
        for (int r = 0; r < reps; r++) {
            double t0 = now_ms(), c0 = cpu_s();
            for (int i = 0; i < k; i++) pthread_create(&th[i], NULL, job_run, &jobs[i]);
            for (int i = 0; i < k; i++) pthread_join(th[i], NULL);
            printf("threads: %d kernels at once: wall %.1f ms, cpu %.1f ms;", k, now_ms() - t0,
                   (cpu_s() - c0) * 1e3);
            for (int i = 0; i < k; i++) printf(" %s %.0f", jobs[i].name, jobs[i].ms);
            printf("\n");
            fflush(stdout);
        }
        for (int i = 0; i < k; i++) free(srcs[i]);
        return 0;
    }

    double total_best = 0;
    for (int i = 0; i < k; i++) {
        char *src = NULL, summary[256], trace_opt[1200], path[1024];
        if (emit_source(specs[i], &src) != FLCE_OK) {
            fprintf(stderr, "nvrtc_time: %s\n", flce_last_error());
            return 1;
        }
        spec_summary(specs[i], summary, sizeof summary);
        const char *role = i == 2 && pl.fused_dz ? "logits_dz" : spec_role_name(specs[i]->role);
        int m = n_opts;
        if (trace && out) {
            snprintf(trace_opt, sizeof trace_opt, "--fdevice-time-trace=%s/%s.trace", out, role);
            opts[m++] = trace_opt;
        }
        double ms[MAX_REPS], cpu[MAX_REPS];
        void *cubin = NULL;
        size_t len = 0;
        for (int r = 0; r < reps; r++) {
            /* The trace goes with the last rep only, to a fresh file (ptxas reads an existing one). */
            if (m > n_opts) {
                char json[1300];
                snprintf(json, sizeof json, "%s.json", trace_opt + strlen("--fdevice-time-trace="));
                remove(json); /* NVRTC writes <name>.json */
            }
            ms[r] = compile_once(src, role, opts, r == reps - 1 ? m : n_opts, r == reps - 1 ? &cubin : NULL, &len,
                                 print_log && r == reps - 1);
            cpu[r] = last_cpu_ms;
        }
        qsort(ms, (size_t)reps, sizeof ms[0], cmp_d);
        qsort(cpu, (size_t)reps, sizeof cpu[0], cmp_d);
        printf("%-10s wall best %7.1f median %7.1f ms  cpu best %7.1f ms  cubin %7zu B  %s\n", role,
               ms[0], ms[reps / 2], cpu[0], len, summary);
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
    printf("total cpu (best of each) %.1f ms for %d kernels\n", total_best, k);
    return 0;
}
