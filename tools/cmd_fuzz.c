/*
 * cmd_fuzz.c — `flce fuzz`: the GPU differential fuzzer of issue 7. Random problems with every
 * option (testing/fuzz_case.c) run on the GPU with poisoned outputs and are compared with the fp64
 * reference on sampled rows. A failing case prints one line that reproduces it
 * (`flce fuzz --seed S --case K`) and its table of errors.
 *
 * Compiling kernels dominates (about 4 NVRTC modules per new kernel class), so --jobs J forks J
 * worker processes before anything touches CUDA; each owns an flce context on GPU 0 and takes the
 * next case number from a counter in shared memory, and all share the process-safe disk cache.
 * Workers send one fixed-size record per case through a pipe (writes under PIPE_BUF are atomic);
 * the parent prints progress on stderr and the summary on stdout. Past --time-limit no case starts,
 * and the progress line names the cases still running (a big case can outlast the limit by a
 * minute: give an outer timeout room).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmd_gen.h"
#include "devmem.h"
#include "fuzz_case.h"
#include "host.h"

/* base/error.h's TRY, kept here: the tool builds on flce.h and runtime/tool_api.h only (issue 42). */
#define FZ_TRY(expr)                                                                               \
    do {                                                                                           \
        flce_status fz_try_status_ = (expr);                                                       \
        if (fz_try_status_ != FLCE_OK) return fz_try_status_;                                      \
    } while (0)

#define FZ_SCAN_MAX_BYTES (256u << 20) /* whole gradients scanned for NaN up to this size */

enum { FZ_PASS = 0, FZ_MISMATCH = 1, FZ_API_ERROR = 2, FZ_HOST_ERROR = 3 };

/* One case's outcome, sent whole through the pipe (well under PIPE_BUF). */
typedef struct fz_record {
    uint64_t index;
    int32_t status, dtype;
    double call_s, gpu_s, host_s; /* calls (JIT compile + enqueue), device wait, data + reference */
    double err[FZ_Q_COUNT], tol[FZ_Q_COUNT];
    char msg[1200];
} fz_record;

typedef struct fz_opts {
    uint64_t seed;
    int64_t cases, one_case;
    int jobs, list, verbose;
    double time_limit;
} fz_opts;

/* ---- one case on the GPU ------------------------------------------------------------------- */

typedef struct fz_dev {
    void *h, *w, *b, *labels, *cw, *go;
    void *loss, *lse, *lpt, *zl, *logprob, *entropy, *argmax, *dh, *dw, *db;
} fz_dev;

static void fz_dev_free(fz_dev *d)
{
    void **p = (void **)d;
    for (size_t i = 0; i < sizeof *d / sizeof(void *); i++) devmem_free(p[i]);
    memset(d, 0, sizeof *d);
}

static flce_status fz_put(void **dst, const void *src, size_t bytes)
{
    FZ_TRY(devmem_alloc(dst, bytes));
    return devmem_upload(*dst, src, bytes);
}

static flce_status fz_put_f32(void **dst, const double *src, int64_t n)
{
    float *tmp = malloc(sizeof(float) * (size_t)n);
    if (!tmp) return FLCE_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)src[i];
    flce_status st = fz_put(dst, tmp, (size_t)n * 4);
    free(tmp);
    return st;
}

/* An output: poisoned (0xFF: NaN in every float type, −1 in integers) unless `init` is given. */
static flce_status fz_out_buf(void **dst, size_t bytes, const void *init)
{
    if (init) return fz_put(dst, init, bytes);
    FZ_TRY(devmem_alloc(dst, bytes));
    return devmem_poison(*dst, bytes);
}

static flce_status fz_upload(const fz_case *c, const fz_data *x, fz_dev *d)
{
    const flce_problem *p = &c->p;
    size_t es = host_dtype_size(p->dtype), n = (size_t)x->n, nd = n * (size_t)x->d;
    size_t vd = (size_t)x->v * (size_t)x->d;
    FZ_TRY(fz_put(&d->h, x->h_dt, nd * es));
    FZ_TRY(fz_put(&d->w, x->w_dt, vd * es));
    if (x->b_dt) FZ_TRY(fz_put(&d->b, x->b_dt, (size_t)x->v * es));
    size_t lb = (size_t)p->label_bits / 8;
    void *lab = malloc(n * lb);
    if (!lab) return FLCE_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        if (lb == 4) ((int32_t *)lab)[i] = (int32_t)x->labels[i];
        else ((int64_t *)lab)[i] = x->labels[i];
    }
    flce_status st = fz_put(&d->labels, lab, n * lb);
    free(lab);
    FZ_TRY(st);
    if (x->cw) {
        int64_t total = p->vocab_total ? p->vocab_total : p->vocab_offset + p->vocab_shard;
        FZ_TRY(fz_put_f32(&d->cw, x->cw, total));
    }
    if (x->go) FZ_TRY(fz_put_f32(&d->go, x->go, x->n_loss));
    unsigned o = c->outputs;
    size_t nl = (size_t)x->n_loss * 4;
    if (o & TENSOR_LOSS) FZ_TRY(fz_out_buf(&d->loss, nl, NULL));
    if (o & TENSOR_LSE) FZ_TRY(fz_out_buf(&d->lse, n * 4, NULL));
    if (o & TENSOR_LOSS_PER_TOKEN) FZ_TRY(fz_out_buf(&d->lpt, n * 4, NULL));
    if (o & TENSOR_Z_LOSS) FZ_TRY(fz_out_buf(&d->zl, nl, NULL));
    if (o & TENSOR_TARGET_LOGPROB) FZ_TRY(fz_out_buf(&d->logprob, n * 4, NULL));
    if (o & TENSOR_ENTROPY) FZ_TRY(fz_out_buf(&d->entropy, n * 4, NULL));
    if (o & TENSOR_ARGMAX) FZ_TRY(fz_out_buf(&d->argmax, n * 8, NULL));
    if (o & TENSOR_GRAD_HIDDEN) FZ_TRY(fz_out_buf(&d->dh, nd * (x->acc_h ? 4 : es), x->acc_h));
    if (o & TENSOR_GRAD_WEIGHT) FZ_TRY(fz_out_buf(&d->dw, vd * (x->acc_w ? 4 : es), x->acc_w));
    if (o & TENSOR_GRAD_BIAS) FZ_TRY(fz_out_buf(&d->db, (size_t)x->v * es, NULL));
    return FLCE_OK;
}

/* Calls the library as the case's mode says; *call_s is the host time of the calls (JIT compile
 * and enqueue), *gpu_s the wait for the device that follows. */
static flce_status fz_run(flce_context *ctx, const fz_case *c, const fz_dev *d, double *call_s,
                          double *gpu_s)
{
    flce_tensors t;
    flce_tensors_init(&t);
    t.hidden = d->h, t.weight = d->w, t.bias = d->b, t.labels = d->labels;
    t.class_weights = d->cw, t.grad_output = d->go;
    t.loss = d->loss, t.lse = d->lse, t.loss_per_token = d->lpt, t.z_loss_out = d->zl;
    t.target_logprob = d->logprob, t.entropy = d->entropy, t.argmax = d->argmax;
    t.grad_hidden = d->dh, t.grad_weight = d->dw, t.grad_bias = d->db;
    double t0 = host_now_s();
    flce_status st;
    if (c->mode == FZ_LOSS_AND_GRAD) {
        st = flce_loss_and_grad(ctx, &c->p, &t, NULL);
    } else {
        flce_tensors f = t;
        f.grad_hidden = f.grad_weight = f.grad_bias = NULL, f.grad_output = NULL;
        flce_problem pf = c->p;
        if (c->mode == FZ_BACKWARD) pf.strategy = FLCE_STRATEGY_AUTO; /* the backward's strategy */
        st = flce_forward(ctx, &pf, &f, NULL);
        if (st == FLCE_OK && c->mode == FZ_BACKWARD) {
            flce_tensors b = t;
            b.loss = b.loss_per_token = b.z_loss_out = b.target_logprob = b.entropy = NULL;
            b.argmax = NULL;
            st = flce_backward(ctx, &c->p, &b, NULL);
        }
    }
    double t1 = host_now_s();
    if (st == FLCE_OK) st = flce_check(ctx, NULL);
    *call_s = t1 - t0, *gpu_s = host_now_s() - t1;
    return st;
}

static double *fz_get_f32(const void *dev, int64_t n, int *nonfinite)
{
    if (!dev) return NULL;
    float *tmp = malloc(sizeof(float) * (size_t)n);
    double *out = malloc(sizeof(double) * (size_t)n);
    if (tmp && out && devmem_download(tmp, dev, (size_t)n * 4) == FLCE_OK) {
        for (int64_t i = 0; i < n; i++) {
            out[i] = tmp[i];
            if (!isfinite(out[i])) *nonfinite = 1;
        }
    } else {
        *nonfinite = 1; /* treated as a failure: nothing came back */
    }
    free(tmp);
    return out;
}

/* Rows `rows` (count k) of a rows × d device matrix in type t (f32 when acc), as doubles. */
static double *fz_get_rows(const void *dev, flce_dtype t, int acc, const int64_t *rows, int64_t k,
                           int64_t d)
{
    if (!dev) return NULL;
    size_t es = acc ? 4 : host_dtype_size(t);
    flce_dtype dt = acc ? FLCE_DTYPE_F32 : t;
    double *out = malloc(sizeof(double) * (size_t)(k * d > 0 ? k * d : 1));
    void *tmp = malloc((size_t)d * es);
    for (int64_t r = 0; out && tmp && r < k; r++) {
        devmem_download(tmp, (const char *)dev + (size_t)rows[r] * (size_t)d * es, (size_t)d * es);
        host_from_dtype(dt, tmp, out + r * d, (size_t)d);
    }
    free(tmp);
    return out;
}

/* NaN/Inf anywhere in a whole output (up to FZ_SCAN_MAX_BYTES): catches rows nothing wrote. */
static int fz_scan(const void *dev, flce_dtype t, size_t count)
{
    if (!dev || count * host_dtype_size(t) > FZ_SCAN_MAX_BYTES) return 0;
    size_t chunk = 1 << 20, es = host_dtype_size(t);
    void *tmp = malloc(chunk * es);
    double *val = malloc(sizeof(double) * chunk);
    int bad = !tmp || !val;
    for (size_t at = 0; !bad && at < count; at += chunk) {
        size_t k = count - at < chunk ? count - at : chunk;
        devmem_download(tmp, (const char *)dev + at * es, k * es);
        host_from_dtype(t, tmp, val, k);
        for (size_t i = 0; i < k; i++) bad |= !isfinite(val[i]);
    }
    free(tmp), free(val);
    return bad;
}

static void fz_download(const fz_case *c, const fz_data *x, const fz_sample *s, const fz_dev *d,
                        fz_got *g)
{
    memset(g, 0, sizeof *g);
    int bad = 0;
    flce_dtype t = c->p.dtype;
    g->loss = fz_get_f32(d->loss, x->n_loss, &bad);
    g->lse = fz_get_f32(d->lse, x->n, &bad);
    g->lpt = fz_get_f32(d->lpt, x->n, &bad);
    g->zl = fz_get_f32(d->zl, x->n_loss, &bad);
    g->logprob = fz_get_f32(d->logprob, x->n, &bad);
    g->entropy = fz_get_f32(d->entropy, x->n, &bad);
    if (d->argmax) {
        g->argmax = malloc(sizeof(int64_t) * (size_t)x->n);
        if (g->argmax) devmem_download(g->argmax, d->argmax, (size_t)x->n * 8);
        for (int64_t i = 0; g->argmax && i < x->n; i++)
            bad |= g->argmax[i] < c->p.vocab_offset || g->argmax[i] >= c->p.vocab_offset + x->v;
    }
    g->dh_rows = fz_get_rows(d->dh, t, x->acc_h != NULL, s->tok, s->n_tok, x->d);
    g->dw_rows = fz_get_rows(d->dw, t, x->acc_w != NULL, s->voc, s->n_voc, x->d);
    g->db_rows = fz_get_rows(d->db, t, 0, s->voc, s->n_voc, 1);
    bad |= fz_scan(d->dh, x->acc_h ? FLCE_DTYPE_F32 : t, (size_t)(x->n * x->d));
    bad |= fz_scan(d->dw, x->acc_w ? FLCE_DTYPE_F32 : t, (size_t)(x->v * x->d));
    bad |= fz_scan(d->db, t, (size_t)x->v);
    g->nonfinite = bad;
}

static void fz_got_free(fz_got *g)
{
    free(g->loss), free(g->lse), free(g->lpt), free(g->zl), free(g->logprob), free(g->entropy);
    free(g->argmax), free(g->dh_rows), free(g->dw_rows), free(g->db_rows);
}

static void fz_run_case(flce_context *ctx, uint64_t seed, uint64_t k, fz_record *rec)
{
    memset(rec, 0, sizeof *rec);
    rec->index = k;
    fz_case c;
    fz_case_make(seed, k, &c);
    rec->dtype = c.p.dtype;
    for (int q = 0; q < FZ_Q_COUNT; q++) rec->err[q] = -1;
    double t0 = host_now_s();
    fz_data x;
    fz_sample s;
    fz_dev d;
    memset(&d, 0, sizeof d);
    if (fz_inputs_make(&c, &x, &s)) {
        rec->status = FZ_HOST_ERROR;
        snprintf(rec->msg, sizeof rec->msg, "host memory");
        goto out;
    }
    double host = host_now_s() - t0;
    flce_status st = fz_upload(&c, &x, &d);
    if (st == FLCE_OK) st = fz_run(ctx, &c, &d, &rec->call_s, &rec->gpu_s);
    if (st != FLCE_OK) {
        rec->status = FZ_API_ERROR;
        snprintf(rec->msg, sizeof rec->msg, "%s: %s", flce_status_name(st), flce_last_error());
        goto out;
    }
    double t1 = host_now_s();
    fz_got g;
    fz_download(&c, &x, &s, &d, &g);
    fz_result r;
    if (fz_check(&c, &x, &s, &g, &r)) {
        rec->status = FZ_HOST_ERROR;
        snprintf(rec->msg, sizeof rec->msg, "host memory in the reference");
    } else {
        rec->status = r.failed ? FZ_MISMATCH : FZ_PASS;
        memcpy(rec->err, r.err, sizeof r.err), memcpy(rec->tol, r.tol, sizeof r.tol);
        if (g.nonfinite) snprintf(rec->msg, sizeof rec->msg, "NaN, Inf or poison in an output; ");
        size_t used = strlen(rec->msg);
        if (r.failed) snprintf(rec->msg + used, sizeof rec->msg - used, "%s", r.detail);
    }
    fz_got_free(&g);
    rec->host_s = host + (host_now_s() - t1);
out:;
    size_t used = strlen(rec->msg);
    fz_case_describe(&c, rec->msg + used, sizeof rec->msg - used);
    fz_dev_free(&d);
    fz_sample_free(&s);
    fz_data_free(&x);
}

/* ---- reporting ---------------------------------------------------------------------------- */

static void fz_print_table(FILE *f, const fz_record *r)
{
    fprintf(f, "    %-9s %-10s %-10s\n", "quantity", "error", "tolerance");
    for (int q = 0; q < FZ_Q_COUNT; q++) {
        if (r->err[q] < 0) continue;
        fprintf(f, "    %-9s %-10.3e %-10.3e%s\n", fz_q_names[q], r->err[q], r->tol[q],
                r->err[q] <= r->tol[q] ? "" : "  <-- over");
    }
}

static void fz_report_failure(const fz_opts *o, const fz_record *r)
{
    printf("FAIL case %" PRIu64 ": flce fuzz --seed %" PRIu64 " --case %" PRIu64 "   # %s\n", r->index,
           o->seed, r->index, r->msg);
    if (r->status == FZ_MISMATCH) fz_print_table(stdout, r);
    fflush(stdout);
}

typedef struct fz_summary {
    int64_t done, pass, mismatch, api_error, host_error;
    double call_s, gpu_s, host_s;
    double max_err[3][FZ_Q_COUNT];
} fz_summary;

static void fz_account(fz_summary *sm, const fz_record *r)
{
    sm->done++;
    sm->pass += r->status == FZ_PASS, sm->mismatch += r->status == FZ_MISMATCH;
    sm->api_error += r->status == FZ_API_ERROR, sm->host_error += r->status == FZ_HOST_ERROR;
    sm->call_s += r->call_s, sm->gpu_s += r->gpu_s, sm->host_s += r->host_s;
    for (int q = 0; q < FZ_Q_COUNT && r->dtype >= 0 && r->dtype < 3; q++)
        if (r->err[q] > sm->max_err[r->dtype][q]) sm->max_err[r->dtype][q] = r->err[q];
}

static void fz_print_summary(const fz_opts *o, const fz_summary *sm, double wall)
{
    printf("flce fuzz: seed %" PRIu64 ": %" PRId64 " of %" PRId64 " cases run in %.1f s with %d job(s): "
           "%" PRId64 " passed, %" PRId64 " mismatches, %" PRId64 " API errors, %" PRId64 " host errors\n",
           o->seed, sm->done, o->cases, wall, o->jobs, sm->pass, sm->mismatch, sm->api_error,
           sm->host_error);
    printf("  time summed over cases: %.1f s in library calls (NVRTC compile + cache load + enqueue), "
           "%.1f s waiting for the GPU, %.1f s data + fp64 reference\n", sm->call_s, sm->gpu_s, sm->host_s);
    printf("  max error per dtype (error measure of fuzz_case.c; tolerances: loss/lse 1e-5, "
           "per-token 1e-5..1e-4, grads 1e-4 f32 (2e-3 tf32) / 4e-3 f16, bf16):\n");
    printf("    %-5s", "dtype");
    for (int q = 0; q < FZ_Q_COUNT; q++) printf(" %-9s", fz_q_names[q]);
    printf("\n");
    for (int t = 0; t < 3; t++) {
        printf("    %-5s", host_dtype_name((flce_dtype)t));
        for (int q = 0; q < FZ_Q_COUNT; q++) printf(" %-9.2e", sm->max_err[t][q]);
        printf("\n");
    }
}

/* ---- workers ------------------------------------------------------------------------------- */

/* Shared with the workers: the next case number, then each worker's running case + 1 (0: none). */
typedef struct fz_shared {
    _Atomic uint64_t next;
    _Atomic uint64_t running[];
} fz_shared;

static int fz_worker(const fz_opts *o, fz_shared *sh, int j, double start, int fd)
{
    if (devmem_gpu_count() < 1) return 77;
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        fprintf(stderr, "flce fuzz: worker: %s\n", flce_last_error());
        return 1;
    }
    for (;;) {
        if (o->time_limit > 0 && host_now_s() - start > o->time_limit) break;
        uint64_t k = atomic_fetch_add(&sh->next, 1);
        if (k >= (uint64_t)o->cases) break;
        fz_record rec;
        atomic_store(&sh->running[j], k + 1);
        fz_run_case(ctx, o->seed, k, &rec);
        atomic_store(&sh->running[j], 0);
        if (write(fd, &rec, sizeof rec) != (ssize_t)sizeof rec) break;
    }
    flce_context_destroy(ctx);
    return 0;
}

/* The progress line; past the time limit it names the cases still running. */
static void fz_progress(const fz_opts *o, const fz_summary *sm, fz_shared *sh, double start)
{
    double now = host_now_s();
    fprintf(stderr, "\rflce fuzz: %" PRId64 "/%" PRId64 " cases, %" PRId64 " failed, %.0f s   ", sm->done, o->cases,
            sm->done - sm->pass, now - start);
    if (o->time_limit > 0 && now - start > o->time_limit) {
        fprintf(stderr, "(time limit: still running");
        for (int j = 0; j < o->jobs; j++) {
            uint64_t k = atomic_load(&sh->running[j]);
            if (k) fprintf(stderr, " %" PRIu64, k - 1);
        }
        fprintf(stderr, ")   ");
    }
}

static int fz_many(const fz_opts *o)
{
    size_t jobs = o->jobs > 0 && o->jobs <= 256 ? (size_t)o->jobs : 1; /* cmd_fuzz keeps it in 1..256 */
    size_t shared_bytes = sizeof(fz_shared) + sizeof(_Atomic uint64_t) * jobs;
    fz_shared *sh = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int fds[2];
    if (sh == MAP_FAILED || pipe(fds)) {
        perror("flce fuzz");
        return 1;
    }
    atomic_store(&sh->next, 0);
    for (size_t j = 0; j < jobs; j++) atomic_store(&sh->running[j], 0);
    double start = host_now_s();
    pid_t *kids = calloc(jobs, sizeof *kids);
    if (!kids) {
        perror("flce fuzz");
        return 1;
    }
    fflush(stdout), fflush(stderr);
    for (int j = 0; j < o->jobs; j++) {
        kids[j] = fork();
        if (kids[j] == 0) {
            close(fds[0]);
            int rc = fz_worker(o, sh, j, start, fds[1]);
            close(fds[1]);
            fflush(stdout), fflush(stderr);
            _exit(rc);
        }
    }
    close(fds[1]);
    fz_summary sm;
    memset(&sm, 0, sizeof sm);
    fz_record rec;
    double last = 0;
    int drew = 0; /* a progress line is on stderr: end it */
    for (;;) {
        /* wake every 2 s without a record: the progress line (and the running cases past the
         * limit) stays current while long cases run */
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int ready = poll(&pfd, 1, 2000);
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) {
            fz_progress(o, &sm, sh, start);
            last = host_now_s(), drew = 1;
            continue;
        }
        ssize_t got = 0;
        while (got < (ssize_t)sizeof rec) {
            ssize_t n = read(fds[0], (char *)&rec + got, sizeof rec - (size_t)got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += n;
        }
        if (got < (ssize_t)sizeof rec) break;
        fz_account(&sm, &rec);
        if (rec.status != FZ_PASS) fz_report_failure(o, &rec);
        else if (o->verbose) printf("ok   case %" PRIu64 ": %s\n", rec.index, rec.msg);
        double now = host_now_s();
        if (now - last > 2 || sm.done == o->cases) {
            fz_progress(o, &sm, sh, start);
            last = now, drew = 1;
        }
    }
    if (drew) fprintf(stderr, "\n");
    close(fds[0]);
    int skipped = 0, crashed = 0;
    for (int j = 0; j < o->jobs; j++) {
        int status = 0;
        waitpid(kids[j], &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77) skipped++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) crashed++;
    }
    free(kids);
    munmap(sh, shared_bytes);
    if (skipped == o->jobs) { /* the workers are gone: asking the driver here now harms none */
        devmem_gpu_count();   /* for the reason in flce_last_error() */
        return tool_no_gpu("fuzz", "; --list describes the cases without one");
    }
    fz_print_summary(o, &sm, host_now_s() - start);
    if (crashed) printf("flce fuzz: %d worker(s) died\n", crashed);
    /* Cases cut off by --time-limit are reported, not failed: the summary says how many ran. */
    return sm.done - sm.pass > 0 || crashed || sm.done == 0 ? 1 : 0;
}

static int fz_one(const fz_opts *o)
{
    if (devmem_gpu_count() < 1) return tool_no_gpu("fuzz", "; --list describes the cases without one");
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK || devmem_use(0) != FLCE_OK) {
        fprintf(stderr, "flce fuzz: %s\n", flce_last_error());
        return 1;
    }
    fz_record rec;
    fz_run_case(ctx, o->seed, (uint64_t)o->one_case, &rec);
    flce_context_destroy(ctx);
    printf("%s case %" PRId64 " of seed %" PRIu64 ": %s\n", rec.status == FZ_PASS ? "ok  " : "FAIL",
           o->one_case, o->seed, rec.msg);
    printf("  %.3f s in calls, %.3f s on the GPU, %.3f s data + reference\n", rec.call_s, rec.gpu_s, rec.host_s);
    fz_print_table(stdout, &rec);
    return rec.status == FZ_PASS ? 0 : 1;
}

static void fz_usage(FILE *f)
{
    fprintf(f,
            "usage: flce fuzz [options]\n"
            "       flce fuzz --seed S --case K      (rerun one case: the line a failure prints)\n"
            "The GPU differential fuzzer: random problems (every dtype, reduction, option, output,\n"
            "accumulate mode and strategy; N 1-40000, D 8-8192, V 1-256000, vocab shards) run on GPU 0\n"
            "with poisoned outputs and are checked against an fp64 CPU reference on sampled rows. A\n"
            "failing case prints one line that reruns it and its table of errors; the summary gives\n"
            "each dtype's largest errors and where the time went.\n"
            "\n"
            "Options (default in brackets):\n"
            "  --seed S          the cases' seed, decimal or 0x... [a fresh one, printed first]\n"
            "  --cases C         number of cases, at least 1 [200]\n"
            "  --case K          run case K (from 0) of the seed alone, with its table of errors\n"
            "  --jobs J          worker processes, 1 to 256, sharing GPU 0 and the disk cache [1]\n"
            "  --time-limit T    start no case after T seconds (0: no limit); a running case ends\n"
            "                    first [0]\n"
            "  --list            describe the cases instead: no GPU needed\n"
            "  --verbose         a line for every case that passes too\n"
            "  -h, --help        this text\n"
            "\n"
            "Examples:\n"
            "  flce fuzz --seed 7 --cases 500 --jobs 8 --time-limit 600\n"
            "  flce fuzz --seed 7 --cases 20 --list\n"
            "\n"
            "Exit status: 0 every case passed, 1 a case failed (or a worker died, or none ran),\n"
            "2 a usage error, 3 no GPU (--list needs none).\n");
}

static const struct option fz_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"seed", required_argument, NULL, 's'},
    {"cases", required_argument, NULL, 'c'},
    {"case", required_argument, NULL, 'k'},
    {"jobs", required_argument, NULL, 'j'},
    {"time-limit", required_argument, NULL, 't'},
    {"list", no_argument, NULL, 'l'},
    {"verbose", no_argument, NULL, 'v'},
    {NULL, 0, NULL, 0},
};

/* Parses argv into o; returns -1 to go on, else the exit code (help: 0, misuse: 2). */
static int fz_parse(fz_opts *o, int argc, char **argv)
{
    tool_cli c;
    tool_cli_start(&c, "fuzz", argc, argv, fz_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        int ok = 1;
        switch (v) {
        case TOOL_NEXT_HELP: fz_usage(stdout); return TOOL_EXIT_OK;
        case TOOL_NEXT_BAD: return TOOL_EXIT_USAGE;
        case TOOL_NEXT_WORD: return tool_misuse(c.cmd, "unexpected argument '%s'", c.arg);
        case 'l': o->list = 1; break;
        case 'v': o->verbose = 1; break;
        case 's': ok = tool_u64(c.cmd, c.name, c.arg, &o->seed); break;
        case 'c': ok = tool_int(c.cmd, c.name, c.arg, 1, INT64_MAX, &o->cases); break;
        case 'k': ok = tool_int(c.cmd, c.name, c.arg, 0, INT64_MAX, &o->one_case); break;
        case 'j': ok = tool_int32(c.cmd, c.name, c.arg, 1, 256, &o->jobs); break;
        case 't': ok = tool_real(c.cmd, c.name, c.arg, 0, 1e9, "from 0 (no limit) to 1e9 seconds", &o->time_limit); break;
        }
        if (!ok) return TOOL_EXIT_USAGE;
    }
    return -1;
}

int cmd_fuzz(int argc, char **argv)
{
    fz_opts o = {0, 200, -1, 1, 0, 0, 0};
    o.seed = host_fresh_seed();
    int rc = fz_parse(&o, argc, argv);
    if (rc >= 0) return rc;
    if (o.list) {
        for (int64_t k = 0; k < o.cases; k++) {
            fz_case c;
            char line[1024];
            fz_case_make(o.seed, (uint64_t)k, &c);
            fz_case_describe(&c, line, sizeof line);
            printf("%" PRId64 ": %s\n", k, line);
        }
        return 0;
    }
    printf("flce fuzz: seed %" PRIu64 " (rerun any case with --seed %" PRIu64 " --case K)\n", o.seed, o.seed);
    fflush(stdout);
    return o.one_case >= 0 ? fz_one(&o) : fz_many(&o);
}
