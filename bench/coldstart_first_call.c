/*
 * coldstart_first_call.c — the C side of bench/coldstart.sh (issue 16): one fresh process, one
 * bf16 loss-and-grad call of N×D×V through the public API, timed from before the call to the end of
 * flce_check (which synchronizes): NVRTC or the disk cache, module loads, the workspace and the
 * kernels. Inputs are zeros (labels 0), so nothing but the first call's cost is measured.
 *
 * Prints one JSON line:
 *   first_call_s     the first flce_loss_and_grad + flce_check
 *   first_call_cpu_s the process's CPU time (user + system, all threads) during the first call:
 *                    NVRTC's work when it compiles (a compile cache hit costs little), whatever the
 *                    wall time says about how many cores it got
 *   second_call_s    the same call again (everything loaded): the GPU work and launch cost alone
 *   process_s        main() to the end of the first call (CUDA initialization included)
 *   init_s           main() to the first call = driver_init_s + flce_context_s + buffers_s:
 *                    cuInit + device 0's primary context, flce_context_create, the 7 buffers
 *   log              [[t, line], ...]: every line the process wrote to stderr (the library's
 *                    FLCE_LOG lines; bench/coldstart.sh sets FLCE_LOG=debug), t = seconds since the
 *                    start of the first call (negative before it), taken when the line arrived on
 *                    a pipe read by a thread of this program: the library is not changed or asked
 *                    anything, bench/coldstart.sh derives where the time went from these lines
 *   ok, error
 *
 * Built by bench/coldstart.sh against build/libflce.so; libcuda is opened at run time (the CUDA
 * driver comes with the GPU, its link-time stub does not always):
 *   cc -O2 -std=c11 -D_DEFAULT_SOURCE -Iinclude -I/usr/local/cuda/include \
 *      bench/coldstart_first_call.c -Lbuild -lflce -Wl,-rpath,$PWD/build -ldl -lpthread -o first_call
 *   FLCE_LOG=debug first_call 8192 4096 128256
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cuda.h>

#include "flce.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*CtxSynchronize)(void);
} cu;

/* ---- stderr, line by line with arrival times ---------------------------------------------- */

enum { LOG_MAX = 512, LOG_LINE = 400 };
static struct {
    double t[LOG_MAX];
    char line[LOG_MAX][LOG_LINE];
    int n, dropped;
    int fd_read, fd_saved; /* the pipe's read end; the original stderr (the lines are copied there) */
    pthread_t reader;
    int on;
} lg;

static void *log_reader(void *arg)
{
    (void)arg;
    char buf[4096], cur[LOG_LINE];
    size_t len = 0;
    for (;;) {
        ssize_t got = read(lg.fd_read, buf, sizeof buf);
        if (got <= 0) break;
        double t = now_s();
        if (write(lg.fd_saved, buf, (size_t)got) < 0) { /* the .err file keeps the lines */
        }
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] != '\n') {
                if (len < LOG_LINE - 1) cur[len++] = buf[i];
                continue;
            }
            cur[len] = '\0';
            if (lg.n < LOG_MAX) {
                lg.t[lg.n] = t;
                memcpy(lg.line[lg.n], cur, len + 1);
                lg.n++;
            } else {
                lg.dropped++;
            }
            len = 0;
        }
    }
    return NULL;
}

static void log_start(void)
{
    int p[2];
    if (pipe(p)) return;
    lg.fd_saved = dup(2);
    if (lg.fd_saved < 0 || dup2(p[1], 2) < 0) {
        close(p[0]), close(p[1]);
        return;
    }
    close(p[1]);
    lg.fd_read = p[0];
    setvbuf(stderr, NULL, _IONBF, 0);
    lg.on = pthread_create(&lg.reader, NULL, log_reader, NULL) == 0;
    if (!lg.on) dup2(lg.fd_saved, 2);
}

/* Puts stderr back and waits for the reader to take the last lines. */
static void log_stop(void)
{
    if (!lg.on) return;
    fflush(stderr);
    dup2(lg.fd_saved, 2); /* closes the pipe's last write end: the reader sees EOF */
    pthread_join(lg.reader, NULL);
    close(lg.fd_read);
    lg.on = 0;
}

static void json_string(const char *s)
{
    putchar('"');
    for (const char *p = s; *p; p++) /* JSON-safe */
        putchar(*p == '"' || *p == '\\' ? '\'' : (unsigned char)*p < 0x20 ? ' ' : *p);
    putchar('"');
}

static void print_log(double t0)
{
    printf(", \"log\": [");
    for (int i = 0; i < lg.n; i++) {
        printf("%s[%.4f, ", i ? ", " : "", lg.t[i] - t0);
        json_string(lg.line[i]);
        putchar(']');
    }
    printf("], \"log_dropped\": %d}\n", lg.dropped);
}

/* ---- the run -------------------------------------------------------------------------------- */

static double cpu_now_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static double t_main, t_call = -1;
/* driver_init, flce_context, buffers, first, second, the first's CPU */
static double times[6] = {-1, -1, -1, -1, -1, -1};

static void print_num(const char *name, double v)
{
    if (v < 0) printf(", \"%s\": null", name);
    else printf(", \"%s\": %.4f", name, v);
}

static int finish(const char *what, const char *why)
{
    log_stop();
    double init = times[0] >= 0 && times[1] >= 0 && times[2] >= 0 ? times[0] + times[1] + times[2] : -1;
    printf("{\"ok\": %s", what ? "false" : "true");
    print_num("first_call_s", times[3]);
    print_num("first_call_cpu_s", times[5]);
    print_num("second_call_s", times[4]);
    print_num("process_s", t_call >= 0 && times[3] >= 0 ? t_call - t_main + times[3] : now_s() - t_main);
    print_num("init_s", init);
    print_num("driver_init_s", times[0]);
    print_num("flce_context_s", times[1]);
    print_num("buffers_s", times[2]);
    printf(", \"error\": ");
    if (what) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s: %s", what, why);
        json_string(msg);
    } else {
        printf("null");
    }
    print_log(t_call >= 0 ? t_call : now_s());
    return what ? 1 : 0;
}

int main(int argc, char **argv)
{
    t_main = now_s();
    if (argc != 4) {
        fprintf(stderr, "usage: %s N D V\n", argv[0]);
        return 2;
    }
    log_start();
    long long n = atoll(argv[1]), d = atoll(argv[2]), v = atoll(argv[3]);
    double t = now_s();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) return finish("dlopen libcuda.so.1", dlerror());
    const char *names[] = {"cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                           "cuMemAlloc_v2", "cuMemsetD8_v2", "cuCtxSynchronize"};
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!(slots[i] = dlsym(lib, names[i]))) return finish("dlsym", names[i]);
    CUdevice dev;
    CUcontext pctx;
    if (cu.Init(0) || cu.DeviceGet(&dev, 0) || cu.PrimaryCtxRetain(&pctx, dev) || cu.CtxSetCurrent(pctx))
        return finish("CUDA", "cannot initialize device 0");
    times[0] = now_s() - t;

    flce_problem p;
    flce_problem_init(&p);
    p.tokens = n, p.hidden = d, p.vocab_shard = v, p.dtype = FLCE_DTYPE_BF16;
    flce_context *ctx = NULL;
    t = now_s();
    if (flce_context_create(0, &ctx) != FLCE_OK) return finish("flce_context_create", flce_last_error());
    times[1] = now_s() - t;
    t = now_s();
    size_t sizes[] = {(size_t)(n * d * 2), (size_t)(v * d * 2), (size_t)(n * 4), 4, (size_t)(n * 4),
                      (size_t)(n * d * 2), (size_t)(v * d * 2)};
    CUdeviceptr buf[7];
    for (int i = 0; i < 7; i++)
        if (cu.MemAlloc(&buf[i], sizes[i]) || cu.MemsetD8(buf[i], 0, sizes[i]))
            return finish("cuMemAlloc", "out of device memory?");
    if (cu.CtxSynchronize()) return finish("CUDA", "synchronize");
    times[2] = now_s() - t;
    flce_tensors tt;
    flce_tensors_init(&tt);
    tt.hidden = (void *)buf[0], tt.weight = (void *)buf[1], tt.labels = (void *)buf[2];
    tt.loss = (float *)buf[3], tt.lse = (float *)buf[4];
    tt.grad_hidden = (void *)buf[5], tt.grad_weight = (void *)buf[6];
    for (int call = 0; call < 2; call++) {
        double t0 = now_s(), c0 = cpu_now_s();
        if (call == 0) t_call = t0;
        if (flce_loss_and_grad(ctx, &p, &tt, NULL) != FLCE_OK)
            return finish("flce_loss_and_grad", flce_last_error());
        if (flce_check(ctx, NULL) != FLCE_OK) return finish("flce_check", flce_last_error());
        times[3 + call] = now_s() - t0;
        if (call == 0) times[5] = cpu_now_s() - c0;
    }
    flce_context_destroy(ctx);
    return finish(NULL, NULL);
}
