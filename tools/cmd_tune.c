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

#include "cmd_gen.h"
#include "devmem.h"
#include "host.h"
#include "tool_api.h"

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
            "usage: flce tune [options]\n"
            "Autotunes one problem class on a GPU: compiles every candidate tile configuration of the\n"
            "logits, dH and dW kernels (in parallel, through the disk cache), checks each one's loss,\n"
            "lse, dH and dW against the built-in tiles' on random data of the real size, times them\n"
            "with CUDA events role after role, and stores the fastest in the autotune table of the\n"
            "cache directory (`flce info` names it). Every later call of that class (device, arch,\n"
            "dtype, D, V, the token count's power-of-two bucket, options) uses it; FLCE_LOG=info says\n"
            "\"tuned tiles from ...\".\n"
            "\n"
            "Options (default in brackets):\n"
            "  --tokens N           tokens N [4096]\n"
            "  --hidden D           hidden size D, a multiple of 8 [4096]\n"
            "  --vocab V            vocabulary (shard) size V [32768]\n"
            "  --dtype T            bf16, f16 or f32 [bf16]\n"
            "  --labels B           label width in bits: 32 or 64 [32]\n"
            "  --reduction R        mean, sum or none [mean]\n"
            "  --budget-mib M       memory budget for stored logits, MiB [0: the library's default]\n"
            "  --softcap C          logit softcap, 0 = off [0]\n"
            "  --temperature T      logit temperature, > 0 [1]\n"
            "  --smoothing E        label smoothing, in [0, 1) [0]\n"
            "  --z-loss L           z-loss coefficient, >= 0 [0]\n"
            "  --device N           the GPU to tune on [0]\n"
            "  --jobs J             parallel compiles, at least 1 [the CPU count]\n"
            "  --runs R             timed calls per candidate, 1 to 32; the median counts [5]\n"
            "  --max-candidates K   at most K candidates per kernel, 1 to %d [%d]\n"
            "  --dry-run            list and compile the candidates only: no GPU needed\n"
            "  --arch A             the target of --dry-run: sm_80 ... sm_120 [sm_90a]\n"
            "  -h, --help           this text\n"
            "\n"
            "Examples:\n"
            "  flce tune --tokens 8192 --hidden 4096 --vocab 128256\n"
            "  flce tune --dry-run --arch sm_90a --tokens 8192 --hidden 4096 --vocab 128256\n"
            "\n"
            "Exit status: 0 a winner was stored (--dry-run: every candidate compiled), 1 a failure,\n"
            "2 a usage error, 3 no GPU (--dry-run needs none).\n",
            TUNE_MAX_CAND, TUNE_MAX_CAND);
}

static const struct option tune_options[] = {
    {"help", no_argument, NULL, 'h'},
    TOOL_PROBLEM_OPT("tokens"),
    TOOL_PROBLEM_OPT("hidden"),
    TOOL_PROBLEM_OPT("vocab"),
    TOOL_PROBLEM_OPT("dtype"),
    TOOL_PROBLEM_OPT("labels"),
    TOOL_PROBLEM_OPT("reduction"),
    TOOL_PROBLEM_OPT("budget-mib"),
    TOOL_PROBLEM_OPT("softcap"),
    TOOL_PROBLEM_OPT("temperature"),
    TOOL_PROBLEM_OPT("smoothing"),
    TOOL_PROBLEM_OPT("z-loss"),
    TOOL_PROBLEM_OPT("arch"),
    {"device", required_argument, NULL, 'D'},
    {"jobs", required_argument, NULL, 'j'},
    {"runs", required_argument, NULL, 'r'},
    {"max-candidates", required_argument, NULL, 'k'},
    {"dry-run", no_argument, NULL, 'n'},
    {NULL, 0, NULL, 0},
};

/* Parses argv into o; returns -1 to go on, else the exit code (help: 0, misuse: 2). */
static int parse_args(tune_opts *o, int argc, char **argv)
{
    tool_opts_init(&o->t);
    o->device = 0, o->runs = 5, o->max_cand = TUNE_MAX_CAND;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->jobs = cpus > 0 ? (int)cpus : 2;
    tool_cli c;
    tool_cli_start(&c, "tune", argc, argv, tune_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        int ok = 1;
        switch (v) {
        case TOOL_NEXT_HELP: tune_usage(stdout); return TOOL_EXIT_OK;
        case TOOL_NEXT_BAD: return TOOL_EXIT_USAGE;
        case TOOL_NEXT_WORD: return tool_misuse(c.cmd, "unexpected argument '%s'", c.arg);
        case 'n': o->dry_run = 1; break;
        case 'D': ok = tool_int32(c.cmd, c.name, c.arg, 0, 1023, &o->device); break;
        case 'j': ok = tool_int32(c.cmd, c.name, c.arg, 1, 1024, &o->jobs); break;
        case 'r': ok = tool_int32(c.cmd, c.name, c.arg, 1, 32, &o->runs); break;
        case 'k': ok = tool_int32(c.cmd, c.name, c.arg, 1, TUNE_MAX_CAND, &o->max_cand); break;
        default: ok = tool_set_common(&o->t, c.cmd, c.name, c.arg) > 0;
        }
        if (!ok) return TOOL_EXIT_USAGE;
    }
    if (tool_validate(c.cmd, &o->t.problem)) return TOOL_EXIT_USAGE;
    return -1;
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
    flce_context_info dev;
    flce_context_info_init(&dev);
    flce_context_info_get(ctx, &dev); /* cannot fail for a context just created */
    int sm = dev.sm;
    printf("flce tune: %s (sm_%d), N=%lld D=%lld V=%lld %s\n", dev.name, sm, (long long)o->t.problem.tokens,
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
    rc = tune_store(o, dev.name, sm, best, best_ms);
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
    int rc = parse_args(&o, argc, argv);
    if (rc >= 0) return rc;
    if (!o.dry_run) {
        if (devmem_gpu_count() < 1)
            return tool_no_gpu("tune", "; --dry-run --arch sm_XX lists and compiles the candidates without one");
        return tune_gpu(&o);
    }
    static tune_cands c;
    printf("flce tune --dry-run: %s, N=%lld D=%lld V=%lld %s (class bucket N~%lld)\n", spec_arch_name(o.t.sm),
           (long long)o.t.problem.tokens, (long long)o.t.problem.hidden, (long long)o.t.problem.vocab_shard,
           host_dtype_name(o.t.problem.dtype), (long long)tune_bucket(o.t.problem.tokens));
    if (!list_candidates(&o, o.t.sm, &c)) return TOOL_EXIT_FAILED;
    int failed = compile_all(&c, o.jobs);
    printf("%d of %d candidates compiled for %s; nothing was timed (dry run)\n",
           c.n[0] + c.n[1] + c.n[2] - failed, c.n[0] + c.n[1] + c.n[2], spec_arch_name(o.t.sm));
    return failed ? TOOL_EXIT_FAILED : TOOL_EXIT_OK;
}
