/* cmd_tune.c — `flce tune` (issue 6): the command-line front of the library's tuner
 * (runtime/tune_run.h, which FLCE_TUNE=1 shares). For one problem class it lists the candidate
 * tiles (tune_cands_make), compiles them in parallel through the disk cache, makes real-size
 * random data, and has tune_search check each candidate's loss, lse, dH and dW against the first
 * candidate's (the built-in tiles) and time it with CUDA events, role after role (logits, then dH
 * with the best logits tile, then dW: the sum of the candidate counts, not their product); it
 * shows progress on stderr and stores the winner with tune_store_winner. --dry-run lists and
 * compiles the candidates only (no GPU). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "cmd_gen.h"
#include "context.h"
#include "devmem.h"
#include "host.h"
#include "jit.h"
#include "tune_run.h"

typedef struct tune_opts {
    tool_opts t;
    int device, jobs, runs, max_cand, dry_run;
} tune_opts;

/* ---- progress ---------------------------------------------------------------------------- */

typedef struct progress {
    int done, total;
    double start, best_ms;
    char best[96];
    const char *stage;
} progress;

/* "[=====>    ] done/total stage best … ETA m:ss" on stderr: redrawn in place on a terminal, one
 * line per step otherwise (logs). */
static void progress_draw(const progress *p, const char *what)
{
    enum { WIDTH = 24 };
    int fill = p->total ? p->done * WIDTH / p->total : WIDTH;
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
    bar[WIDTH] = '\0';
    double el = host_now_s() - p->start;
    double eta = p->done ? el / p->done * (p->total - p->done) : 0;
    char best[128] = "";
    if (p->best_ms > 0) snprintf(best, sizeof best, " best %.3f ms (%s)", p->best_ms, p->best);
    int tty = isatty(2);
    fprintf(stderr, "%s[%s] %d/%d %s %s%s ETA %d:%02d%s", tty ? "\r\033[K" : "", bar, p->done,
            p->total, p->stage, what, best, (int)eta / 60, (int)eta % 60, tty ? "" : "\n");
    if (tty && p->done == p->total) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- compiling the candidates in parallel --------------------------------------------------- */

typedef struct compile_pool {
    const tune_cands *c;
    int failures;
    progress prog;
    pthread_mutex_t lock; /* the progress bar and the count */
} compile_pool;

static void index_to(const tune_cands *c, int i, int *role, int *k)
{
    int r = 0;
    while (i >= c->n[r]) i -= c->n[r++];
    *role = r, *k = i;
}

static void compile_one(void *arg, int64_t i)
{
    compile_pool *pool = arg;
    int r, k;
    index_to(pool->c, (int)i, &r, &k);
    kernel_spec s = pool->c->base[r];
    s.tile = pool->c->tile[r][k];
    jit_result jr;
    char summary[256];
    spec_summary(&s, summary, sizeof summary);
    flce_status st = jit_build(&s, &jr); /* the disk cache is safe across threads and processes */
    if (st == FLCE_OK && r == 0 && pool->c->fused_dz) { /* the same tile's dZ-writing variant */
        free(jr.cubin);
        kernel_spec dz = pool->c->logits_dz;
        dz.tile = s.tile;
        st = jit_build(&dz, &jr);
    }
    pthread_mutex_lock(&pool->lock);
    pool->prog.done++;
    if (st != FLCE_OK) {
        pool->failures++;
        fprintf(stderr, "\nflce tune: candidate %s does not compile:\n%s\n", summary, flce_last_error());
    } else {
        free(jr.cubin);
    }
    progress_draw(&pool->prog, summary);
    pthread_mutex_unlock(&pool->lock);
}

static int compile_all(const tune_cands *c, int jobs)
{
    compile_pool pool;
    memset(&pool, 0, sizeof pool);
    pool.c = c;
    pool.prog.total = c->n[0] + c->n[1] + c->n[2];
    pool.prog.start = host_now_s();
    pool.prog.stage = "compiling";
    pthread_mutex_init(&pool.lock, NULL);
    host_parallel_for(pool.prog.total, jobs < 1 ? 1 : jobs, compile_one, &pool);
    pthread_mutex_destroy(&pool.lock);
    return pool.failures;
}

/* ---- timing on the device ----------------------------------------------------------------- */

typedef struct tune_data {
    flce_problem p;
    size_t es, nh, nw; /* element size; elements of H (= dH) and W (= dW) */
    void *d_h, *d_w, *d_labels, *d_loss, *d_lse, *d_dh, *d_dw;
    flce_tensors t;
} tune_data;

static int fill_random(tune_data *d)
{
    const flce_problem *p = &d->p;
    host_rng rng;
    host_rng_seed(&rng, 20261122);
    d->es = host_dtype_size(p->dtype);
    d->nh = (size_t)p->tokens * (size_t)p->hidden, d->nw = (size_t)p->vocab_shard * (size_t)p->hidden;
    void *h = malloc(d->nh * d->es), *w = malloc(d->nw * d->es);
    int32_t *labels = malloc((size_t)p->tokens * 4);
    double *row = malloc(sizeof(double) * (size_t)p->hidden);
    int ok = h && w && labels && row;
    double sw = 2.0 / sqrt((double)p->hidden); /* logits of sd ≈ 2, as in flce demo */
    for (int64_t r = 0; ok && r < p->tokens + p->vocab_shard; r++) {
        int is_h = r < p->tokens;
        for (int64_t k = 0; k < p->hidden; k++) row[k] = (is_h ? 1.0 : sw) * host_rng_normal(&rng);
        char *dst = is_h ? (char *)h + (size_t)r * p->hidden * d->es
                         : (char *)w + (size_t)(r - p->tokens) * p->hidden * d->es;
        host_to_dtype(p->dtype, row, dst, (size_t)p->hidden);
    }
    for (int64_t i = 0; ok && i < p->tokens; i++) labels[i] = (int32_t)host_rng_below(&rng, p->vocab_shard);
    ok = ok && devmem_alloc(&d->d_h, d->nh * d->es) == FLCE_OK &&
         devmem_alloc(&d->d_w, d->nw * d->es) == FLCE_OK &&
         devmem_alloc(&d->d_labels, (size_t)p->tokens * 4) == FLCE_OK &&
         devmem_alloc(&d->d_loss, 16) == FLCE_OK && devmem_alloc(&d->d_lse, (size_t)p->tokens * 4) == FLCE_OK &&
         devmem_alloc(&d->d_dh, d->nh * d->es) == FLCE_OK && devmem_alloc(&d->d_dw, d->nw * d->es) == FLCE_OK &&
         devmem_upload(d->d_h, h, d->nh * d->es) == FLCE_OK && devmem_upload(d->d_w, w, d->nw * d->es) == FLCE_OK &&
         devmem_upload(d->d_labels, labels, (size_t)p->tokens * 4) == FLCE_OK;
    free(h), free(w), free(labels), free(row);
    flce_tensors_init(&d->t);
    d->t.hidden = d->d_h, d->t.weight = d->d_w, d->t.labels = d->d_labels;
    d->t.loss = d->d_loss, d->t.lse = d->d_lse, d->t.grad_hidden = d->d_dh, d->t.grad_weight = d->d_dw;
    return ok;
}

static void free_data(tune_data *d)
{
    void *dev[] = {d->d_h, d->d_w, d->d_labels, d->d_loss, d->d_lse, d->d_dh, d->d_dw};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) devmem_free(dev[i]);
}

/* ---- timing on the device: tune_search, with the progress bar ------------------------------- */

typedef struct timing {
    const tune_cands *c;
    progress prog;
} timing;

static void timing_report(void *arg, int role, const spec_tile *tile, double ms, const char *why)
{
    timing *tm = arg;
    char what[96], text[48];
    tune_tile_text(tile, text, sizeof text);
    snprintf(what, sizeof what, "%s %s", spec_role_name(tm->c->base[role].role), text);
    if (ms <= 0 && why[0]) fprintf(stderr, "\nflce tune: candidate %s\n", why);
    if (ms > 0 && (tm->prog.best_ms <= 0 || ms < tm->prog.best_ms)) {
        snprintf(tm->prog.best, sizeof tm->prog.best, "%s", what);
        tm->prog.best_ms = ms;
    }
    tm->prog.done++;
    progress_draw(&tm->prog, what);
}

static int time_all(flce_context *ctx, tune_data *d, const tune_cands *c, int runs,
                    spec_tile best[TUNE_ROLES], double *best_ms, double *builtin_ms)
{
    timing tm = {c, {0, c->n[0] + c->n[1] + c->n[2], host_now_s(), 0, "", "timing"}};
    tune_bench b;
    memset(&b, 0, sizeof b);
    b.ctx = ctx, b.p = d->p, b.op = FLCE_OP_LOSS_AND_GRAD, b.t = d->t, b.stream = NULL;
    b.runs = runs, b.roles = TUNE_ROLES, b.report = timing_report, b.arg = &tm;
    if (tune_search(&b, c, best, best_ms, builtin_ms) != FLCE_OK) {
        fprintf(stderr, "flce tune: %s\n", flce_last_error());
        return 1;
    }
    return 0;
}

/* ---- the command ---------------------------------------------------------------------------- */

static void tune_usage(FILE *f)
{
    fprintf(f,
            "usage: flce tune [--device N] [--tokens N] [--hidden D] [--vocab V] [--dtype bf16|f16|f32]\n"
            "                 [--labels 32|64] [--budget-mib M] [--softcap C] [--temperature T]\n"
            "                 [--smoothing E] [--z-loss L] [--jobs J] [--runs R] [--max-candidates K]\n"
            "                 [--dry-run [--arch sm_90a]]\n"
            "Times every candidate tile configuration of the problem class on the GPU and stores the\n"
            "winner in the autotune table of the cache directory (`flce info` names it); the library\n"
            "then uses it for every call of that class (FLCE_LOG=info says \"tuned tiles from ...\").\n"
            "--dry-run lists and compiles the candidates without a GPU.\n");
}

/* Options beyond tool_parse_common: 2 consumed, 1 for flags, 0 not ours, -1 bad value. */
static int parse_tune_opt(tune_opts *o, int argc, char **argv, int i)
{
    const char *k = argv[i];
    if (!strcmp(k, "--dry-run")) return o->dry_run = 1;
    if (i + 1 >= argc) return 0;
    char *end = NULL;
    double v = strtod(argv[i + 1], &end);
    if (end == argv[i + 1] || *end) {
        if (!strncmp(k, "--", 2)) fprintf(stderr, "flce tune: %s %s: not a number\n", k, argv[i + 1]);
        return strncmp(k, "--", 2) ? 0 : -1;
    }
    flce_problem *p = &o->t.problem;
    if (!strcmp(k, "--device")) o->device = (int)v;
    else if (!strcmp(k, "--jobs")) o->jobs = (int)v;
    else if (!strcmp(k, "--runs")) o->runs = (int)v;
    else if (!strcmp(k, "--max-candidates")) o->max_cand = (int)v;
    else if (!strcmp(k, "--softcap")) p->softcap = (float)v;
    else if (!strcmp(k, "--temperature")) p->temperature = (float)v;
    else if (!strcmp(k, "--smoothing")) p->label_smoothing = (float)v;
    else if (!strcmp(k, "--z-loss")) p->z_loss = (float)v;
    else return 0;
    return 2;
}

static int parse_args(tune_opts *o, int argc, char **argv)
{
    tool_opts_init(&o->t);
    o->device = 0, o->runs = 5, o->max_cand = TUNE_MAX_CAND;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->jobs = cpus > 0 ? (int)cpus : 2;
    for (int i = 1; i < argc;) {
        int used = tool_parse_common(&o->t, argc, argv, i);
        if (used == 0) used = parse_tune_opt(o, argc, argv, i);
        if (used <= 0) {
            if (used == 0) fprintf(stderr, "flce tune: unknown option '%s'\n", argv[i]);
            tune_usage(stderr);
            return 0;
        }
        i += used;
    }
    if (o->runs < 1 || o->runs > 32 || o->max_cand < 1 || o->jobs < 1) {
        fprintf(stderr, "flce tune: --runs must be 1 to 32, --max-candidates and --jobs at least 1\n");
        return 0;
    }
    if (flce_problem_validate(&o->t.problem) != FLCE_OK) {
        fprintf(stderr, "flce tune: %s\n", flce_last_error());
        return 0;
    }
    return 1;
}

static int list_candidates(const tune_opts *o, int sm, tune_cands *c)
{
    if (tune_cands_make(&o->t.problem, sm, o->max_cand, c) != FLCE_OK) {
        fprintf(stderr, "flce tune: %s\n", flce_last_error());
        return 0;
    }
    for (int r = 0; r < TUNE_ROLES; r++) {
        printf("%s: %d candidates:", spec_role_name(c->base[r].role), c->n[r]);
        for (int k = 0; k < c->n[r]; k++) {
            char text[48];
            tune_tile_text(&c->tile[r][k], text, sizeof text);
            printf(" %s", text);
        }
        printf("\n");
    }
    fflush(stdout); /* before the progress bar's stderr */
    return 1;
}

static int tune_store(const tune_opts *o, const char *device, int sm, const spec_tile best[TUNE_ROLES],
                      double ms)
{
    char dir[CACHE_PATH_MAX];
    tune_entry e;
    if (tune_store_winner(&o->t.problem, device, sm, best, ms, &e, dir, sizeof dir) != FLCE_OK) {
        fprintf(stderr, "flce tune: storing the winner: %s\n", flce_last_error());
        return 1;
    }
    char line[TUNE_LINE_MAX + 2];
    tune_line_format(&e, line, sizeof line);
    printf("winner (%.3f ms per loss-and-grad call) stored in %s/%s:\n%s\n", ms, dir, TUNE_TABLE_FILE, line);
    return 0;
}

static int tune_gpu(const tune_opts *o)
{
    flce_context *ctx = NULL;
    if (flce_context_create(o->device, &ctx) != FLCE_OK || devmem_use(o->device) != FLCE_OK) {
        fprintf(stderr, "flce tune: device %d: %s\n", o->device, flce_last_error());
        flce_context_destroy(ctx);
        return 1;
    }
    int sm = ctx->sm;
    printf("flce tune: %s (sm_%d), N=%lld D=%lld V=%lld %s\n", ctx->name, sm, (long long)o->t.problem.tokens,
           (long long)o->t.problem.hidden, (long long)o->t.problem.vocab_shard, host_dtype_name(o->t.problem.dtype));
    static tune_cands c;
    tune_data d;
    memset(&d, 0, sizeof d);
    d.p = o->t.problem;
    int rc = 1;
    spec_tile best[TUNE_ROLES];
    double best_ms = -1, builtin_ms = -1, t0 = host_now_s();
    if (!list_candidates(o, sm, &c)) goto out;
    if (compile_all(&c, o->jobs) != 0) goto out;
    if (!fill_random(&d)) {
        fprintf(stderr, "flce tune: allocating the random problem: %s\n", flce_last_error());
        goto out;
    }
    if (time_all(ctx, &d, &c, o->runs, best, &best_ms, &builtin_ms) != 0 || best_ms <= 0) goto out;
    rc = tune_store(o, ctx->name, sm, best, best_ms);
    if (rc == 0)
        printf("built-in tiles %.3f ms, winner %.3f ms (%.3fx); tuning took %.1f s\n", builtin_ms, best_ms,
               builtin_ms / best_ms, host_now_s() - t0);
out:
    free_data(&d);
    flce_context_destroy(ctx);
    return rc;
}

int cmd_tune(int argc, char **argv)
{
    tune_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            tune_usage(stdout);
            return 0;
        }
    if (!parse_args(&o, argc, argv)) return 2;
    if (!o.dry_run) {
        if (devmem_gpu_count() < 1) {
            fprintf(stderr, "flce tune: no GPU (%s); --dry-run --arch sm_XX lists and compiles the candidates\n",
                    flce_last_error()[0] ? flce_last_error() : "no CUDA device");
            return 1;
        }
        return tune_gpu(&o);
    }
    static tune_cands c;
    printf("flce tune --dry-run: %s, N=%lld D=%lld V=%lld %s (class bucket N~%lld)\n", spec_arch_name(o.t.sm),
           (long long)o.t.problem.tokens, (long long)o.t.problem.hidden, (long long)o.t.problem.vocab_shard,
           host_dtype_name(o.t.problem.dtype), (long long)tune_bucket(o.t.problem.tokens));
    if (!list_candidates(&o, o.t.sm, &c)) return 1;
    int failed = compile_all(&c, o.jobs);
    printf("%d of %d candidates compiled for %s; nothing was timed (dry run)\n",
           c.n[0] + c.n[1] + c.n[2] - failed, c.n[0] + c.n[1] + c.n[2], spec_arch_name(o.t.sm));
    return failed ? 1 : 0;
}
