/* cmd_bench.c — `flce bench`: the C benchmark of issue 4 (bench/compare.py's counterpart without
 * Python). Per shape, logit spread and strategy: CUDA-event time (median of --iters after --warmup,
 * inputs rotated over --sets buffers), TFLOP/s, workspace and measured extra device memory, and
 * errors against the sampled fp64 reference (bench_data.h). `--list` prints the plans, no GPU. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_data.h"
#include "cmd_gen.h"
#include "devmem.h"
#include "host.h"
#include "tool_api.h"

#define BENCH_MAX_SHAPES 16
#define BENCH_MAX_STDS 4
#define BENCH_MAX_SETS 8
#define MIB (1024.0 * 1024.0)

typedef struct bench_strategy {
    char name[48];
    flce_strategy strategy;
    uint64_t budget;
    int forward; /* flce_forward: loss and lse only, counted as 2NVD */
    int fp32z;   /* "+fp32z": FLCE_DEV=compact=0 for this row (the chunked strategy's fp32 Z store) */
    int main_grad; /* "+maingrad": dW added into an fp32 V × D buffer (accumulate_grad_weight, as
                    * Megatron's main_grad); the buffer counts as an input, not as extra memory */
} bench_strategy;

/* The named rows; --strategies also takes any of the first four with a budget, "chunked-1536MiB",
 * "+fp32z" for side-by-side timing of the compact store and "+maingrad" for dW into an fp32 buffer
 * (parse_strategy). */
static const bench_strategy BASE_STRATEGIES[] = { /* budget 0: the library's default, as a caller gets */
    {"auto", FLCE_STRATEGY_AUTO, 0, 0, 0},
    {"chunked", FLCE_STRATEGY_CHUNKED, 0, 0, 0},
    {"recompute", FLCE_STRATEGY_RECOMPUTE, 0, 0, 0},
    {"forward", FLCE_STRATEGY_AUTO, 0, 1, 0},
    /* flce_forward then flce_backward from the logits the forward kept (flce.h "Saved logits"):
     * what a binding runs when the upstream gradient comes only after the forward */
    {"saved", FLCE_STRATEGY_SAVED, 0, 0, 0},
};
enum { N_STRATEGIES = 16 };
static bench_strategy STRATEGIES[N_STRATEGIES];
static int n_strategies;

/* The five shapes, N × D × V (bench_usage says them too). */
static const char *DEFAULT_SHAPES = "8192x4096x128256,8192x2304x256000,4096x2048x32000,"
                                    "32768x4096x128256,512x4096x128256";

typedef struct bench_opts {
    int64_t shape[BENCH_MAX_SHAPES][3];
    int n_shapes;
    flce_dtype dtype;
    double std[BENCH_MAX_STDS];
    int n_stds;
    int strat[N_STRATEGIES];
    int n_strat;
    int warmup, iters, sets, samples, list, sm, timeline;
    const char *json;
} bench_opts;

enum { BENCH_MAX_KERNELS = 16 };
/* One kind of launch inside the timed runs (--timeline): its name and in-run time per call. */
typedef struct bench_kernel {
    const char *name; /* a string literal of runtime/launch.c ("dW kernel") */
    double launches, ms;
} bench_kernel;

typedef struct bench_row {
    int shape, strat;
    double std;
    const char *auto_choice;
    double ms, ms_min, ms_max, first_ms, tflops, workspace_mib, extra_mib;
    bench_errors e;
    int ran, within;
    int n_kernels; /* --timeline only */
    bench_kernel kernels[BENCH_MAX_KERNELS];
} bench_row;

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: flce bench [options]\n"
            "Times flce's fused loss-and-gradient call on GPU 0 and checks what it computes. For every\n"
            "shape (N tokens x D hidden x V vocab), spread of the random logits and strategy, it makes\n"
            "--warmup calls, then times --iters calls with CUDA events on one stream, and prints a\n"
            "Markdown table per shape: milliseconds per call (median, min, max), TFLOP/s (counted as\n"
            "6*N*V*D; 2*N*V*D for forward), the workspace and the measured extra device memory (MiB),\n"
            "the first call's wall time (compile or cache load, ms), and the relative errors of loss,\n"
            "lse, dH and dW against an fp64 CPU reference on sampled tokens and vocab rows. The\n"
            "strategies are set against each other (the auto row names what AUTO chose); PyTorch's\n"
            "side is bench/compare.py's. Progress goes to stderr.\n"
            "\n"
            "Options (default in brackets):\n"
            "  --shapes NxDxV,...   up to %d shapes [the issue's five: 8192x4096x128256,\n"
            "                       8192x2304x256000, 4096x2048x32000, 32768x4096x128256,\n"
            "                       512x4096x128256]\n"
            "  --dtype T            bf16, f16 or f32 [bf16]\n"
            "  --logit-std S,...    standard deviations of the random logits, up to %d [4,0.5]\n"
            "  --strategies S,...   auto, chunked, recompute, saved (forward, then backward from the\n"
            "                       logits it kept) or forward (loss and lse only); any but forward\n"
            "                       with a memory budget (chunked-128MiB), +fp32z (the chunked logits\n"
            "                       stored as fp32: FLCE_DEV=compact=0) or +maingrad (dW added into an\n"
            "                       fp32 buffer) [auto,chunked,chunked-128MiB,recompute,forward]\n"
            "  --warmup K           untimed calls before the timed ones, 0 to 1000 [3]\n"
            "  --iters K            timed calls, 1 to 10000; the median is reported [10]\n"
            "  --sets K             copies of the inputs the calls rotate over, 1 to %d, so that no\n"
            "                       call finds its operands in L2 (fewer where memory is short) [2]\n"
            "  --samples K          tokens and vocab rows checked against fp64, 2 to 1024 [8]\n"
            "  --json FILE          also write every row to FILE as JSON\n"
            "  --timeline           on stderr, each timed call and each kernel's time inside it (CUDA\n"
            "                       events between launches); with --json, each row's \"kernels\"\n"
            "  --list               print the plans instead (chunks, workspace, estimated ms, AUTO's\n"
            "                       choice and why), for an H100-sized GPU: no GPU needed\n"
            "  --arch A             the target --list plans for: sm_80 ... sm_120 [sm_90a]\n"
            "  -h, --help           this text\n"
            "\n"
            "Examples:\n"
            "  flce bench --shapes 8192x4096x128256 --strategies auto,recompute --iters 20\n"
            "  flce bench --list --shapes 512x4096x128256\n"
            "\n"
            "Exit status: 0 every row ran within tolerance (loss and lse 1e-5, per-token loss 1e-4,\n"
            "dH and dW 4e-3 for bf16 and f16, 1e-4 for f32), 1 a row failed or was outside it,\n"
            "2 a usage error, 3 no GPU (--list needs none).\n",
            BENCH_MAX_SHAPES, BENCH_MAX_STDS, BENCH_MAX_SETS);
}

static int parse_shapes(bench_opts *o, const char *s)
{
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return tool_misuse("bench", "--shapes: too long"), 0;
    o->n_shapes = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!tool_shape(tok, o->shape[o->n_shapes < BENCH_MAX_SHAPES ? o->n_shapes : 0]))
            return tool_misuse("bench", "--shapes '%s': expected NxDxV, e.g. 8192x4096x128256", tok), 0;
        if (o->n_shapes == BENCH_MAX_SHAPES)
            return tool_misuse("bench", "--shapes: at most %d shapes", BENCH_MAX_SHAPES), 0;
        o->n_shapes++;
    }
    if (!o->n_shapes) return tool_misuse("bench", "--shapes '%s': no shape given", s), 0;
    return 1;
}

/* "<base>[-<N>MiB][+fp32z][+maingrad]" → a STRATEGIES entry (reused when the same name came before); -1 when
 * the name is not one of those or the table is full. */
static int parse_strategy(const char *tok)
{
    for (int k = 0; k < n_strategies; k++)
        if (!strcmp(tok, STRATEGIES[k].name)) return k;
    if (n_strategies == N_STRATEGIES || strlen(tok) >= sizeof STRATEGIES[0].name) return -1;
    bench_strategy st;
    memset(&st, 0, sizeof st);
    snprintf(st.name, sizeof st.name, "%s", tok);
    char base[48];
    snprintf(base, sizeof base, "%s", tok);
    for (char *plus; (plus = strrchr(base, '+'));) {
        if (!strcmp(plus, "+fp32z") && !st.fp32z) st.fp32z = 1;
        else if (!strcmp(plus, "+maingrad") && !st.main_grad) st.main_grad = 1;
        else return -1;
        *plus = 0;
    }
    char *dash = strchr(base, '-');
    long long mib = 0; /* 0: the library's default budget */
    if (dash) {
        char *end = NULL;
        if (!isdigit((unsigned char)dash[1])) return -1;
        mib = strtoll(dash + 1, &end, 10);
        if (mib < 1 || mib > (1ll << 30) || strcmp(end, "MiB")) return -1;
        *dash = 0;
    }
    int b = 0, nb = (int)(sizeof BASE_STRATEGIES / sizeof BASE_STRATEGIES[0]);
    while (b < nb && strcmp(base, BASE_STRATEGIES[b].name)) b++;
    if (b == nb) return -1;
    st.strategy = BASE_STRATEGIES[b].strategy, st.forward = BASE_STRATEGIES[b].forward;
    if (st.forward && st.main_grad) return -1;
    st.budget = (uint64_t)mib << 20;
    STRATEGIES[n_strategies] = st;
    return n_strategies++;
}

static int parse_strategies(bench_opts *o, const char *s)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    o->n_strat = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int k = parse_strategy(tok);
        if (k < 0)
            return tool_misuse("bench", "--strategies: unknown strategy '%s' (use auto, chunked, recompute, saved "
                               "or forward, optionally with a budget, +fp32z and +maingrad: chunked-1536MiB+fp32z)", tok), 0;
        if (o->n_strat < N_STRATEGIES) o->strat[o->n_strat++] = k;
    }
    if (!o->n_strat) return tool_misuse("bench", "--strategies '%s': no strategy given", s), 0;
    return 1;
}

static int parse_stds(bench_opts *o, const char *s)
{
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return tool_misuse("bench", "--logit-std: too long"), 0;
    o->n_stds = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        double x = strtod(tok, &end);
        if (end == tok || *end || !(x > 0) || !isfinite(x) || o->n_stds == BENCH_MAX_STDS)
            return tool_misuse("bench", "--logit-std '%s': expected up to %d positive numbers, e.g. 4,0.5", tok,
                               BENCH_MAX_STDS), 0;
        o->std[o->n_stds++] = x;
    }
    if (!o->n_stds) return tool_misuse("bench", "--logit-std '%s': no number given", s), 0;
    return 1;
}

static flce_problem bench_problem(const bench_opts *o, int shape, int strat)
{
    flce_problem p;
    flce_problem_init(&p);
    p.dtype = o->dtype;
    p.tokens = o->shape[shape][0], p.hidden = o->shape[shape][1], p.vocab_shard = o->shape[shape][2];
    p.strategy = STRATEGIES[strat].strategy;
    p.memory_budget = STRATEGIES[strat].budget;
    p.accumulate_grad_weight = STRATEGIES[strat].main_grad;
    return p;
}

static const struct option bench_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"list", no_argument, NULL, 'l'},
    {"timeline", no_argument, NULL, 'T'},
    {"shapes", required_argument, NULL, 's'},
    {"strategies", required_argument, NULL, 'S'},
    {"logit-std", required_argument, NULL, 'L'},
    {"warmup", required_argument, NULL, 'w'},
    {"iters", required_argument, NULL, 'i'},
    {"sets", required_argument, NULL, 'e'},
    {"samples", required_argument, NULL, 'n'},
    {"json", required_argument, NULL, 'j'},
    {"dtype", required_argument, NULL, 'd'},
    {"arch", required_argument, NULL, 'a'},
    {NULL, 0, NULL, 0},
};

/* Returns 1 when parsed, 0 after --help, -1 (message printed) for a bad argument. */
static int bench_parse(bench_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->dtype = FLCE_DTYPE_BF16, o->warmup = 3, o->iters = 10, o->sets = 2, o->samples = 8, o->sm = 90;
    parse_shapes(o, DEFAULT_SHAPES);
    parse_stds(o, "4,0.5");
    parse_strategies(o, "auto,chunked,chunked-128MiB,recompute,forward");
    tool_cli c;
    tool_cli_start(&c, "bench", argc, argv, bench_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        int ok = 1;
        tool_opts t; /* --dtype and --arch through the tool's common parser */
        tool_opts_init(&t);
        switch (v) {
        case TOOL_NEXT_HELP: bench_usage(stdout); return 0;
        case TOOL_NEXT_BAD: return -1;
        case TOOL_NEXT_WORD: tool_misuse(c.cmd, "unexpected argument '%s'", c.arg); return -1;
        case 'l': o->list = 1; break;
        case 'T': o->timeline = 1; break;
        case 's': ok = parse_shapes(o, c.arg); break;
        case 'S': ok = parse_strategies(o, c.arg); break;
        case 'L': ok = parse_stds(o, c.arg); break;
        case 'w': ok = tool_int32(c.cmd, c.name, c.arg, 0, 1000, &o->warmup); break;
        case 'i': ok = tool_int32(c.cmd, c.name, c.arg, 1, 10000, &o->iters); break;
        case 'e': ok = tool_int32(c.cmd, c.name, c.arg, 1, BENCH_MAX_SETS, &o->sets); break;
        case 'n': ok = tool_int32(c.cmd, c.name, c.arg, 2, 1024, &o->samples); break;
        case 'j':
            ok = c.arg[0] != '\0';
            if (!ok) tool_misuse(c.cmd, "--json needs a file name");
            o->json = c.arg;
            break;
        case 'd':
            ok = tool_set_common(&t, c.cmd, c.name, c.arg) > 0;
            o->dtype = t.problem.dtype;
            break;
        case 'a':
            ok = tool_set_common(&t, c.cmd, c.name, c.arg) > 0;
            o->sm = t.sm;
            break;
        }
        if (!ok) return -1;
    }
    for (int s = 0; s < o->n_shapes; s++) {
        flce_problem p = bench_problem(o, s, 0);
        if (flce_problem_validate(&p) != FLCE_OK) {
            tool_misuse(c.cmd, "shape %lldx%lldx%lld: %s", (long long)p.tokens, (long long)p.hidden,
                        (long long)p.vocab_shard, flce_last_error());
            return -1;
        }
    }
    return 1;
}

/* What AUTO would run for this problem (its budget), on a device named `device` (NULL: built-in
 * tiles only) with `mem` bytes of memory. */
static const char *auto_choice(flce_problem p, int forward, const char *device, int sm, int sms, uint64_t mem)
{
    if (forward) return "forward";
    p.strategy = FLCE_STRATEGY_AUTO;
    plan pl;
    if (plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, device, sm, sms, mem, NULL, &pl) != FLCE_OK) return "error";
    return pl.recompute ? "recompute" : "chunked";
}

/* AUTO's choice for p with its reason: the cost model's estimates of both plans (plan.c). */
static void auto_why(flce_problem p, int sm, int sms, uint64_t mem, char *out, size_t cap)
{
    p.strategy = FLCE_STRATEGY_AUTO;
    plan pl;
    if (plan_make_dev(&p, FLCE_OP_LOSS_AND_GRAD, NULL, sm, sms, mem, NULL, &pl) != FLCE_OK) {
        snprintf(out, cap, "error: %s", flce_last_error());
        return;
    }
    const char *c = pl.compact ? "chunked (compact)" : "chunked";
    if (!pl.est_chunked_ms || !pl.est_recompute_ms)
        snprintf(out, cap, "%s (the only plan that fits)", pl.recompute ? "recompute" : c);
    else
        snprintf(out, cap, "%s (estimated %.1f ms vs %s %.1f ms)", pl.recompute ? "recompute" : c,
                 pl.recompute ? pl.est_recompute_ms : pl.est_chunked_ms, pl.recompute ? "chunked" : "recompute",
                 pl.recompute ? pl.est_chunked_ms : pl.est_recompute_ms);
}

/* A "+fp32z" row plans and runs with the compact store off (the process's settings replaced as data,
 * the environment untouched); fp32z_end puts the caller's setting back. fp32z_begin returns what to
 * pass to it. */
static int fp32z_begin(int k)
{
    flce_config c = *config_get();
    int was = c.compact;
    if (!STRATEGIES[k].fp32z) return was;
    c.compact = 0;
    config_replace(&c);
    return was;
}

static void fp32z_end(int k, int was)
{
    if (!STRATEGIES[k].fp32z) return;
    flce_config c = *config_get();
    c.compact = was;
    config_replace(&c);
}

static int bench_list(const bench_opts *o)
{
    /* An H100 SXM: its SM count (vocab splits, dH's waves) and memory (the default budget's 1/16) */
    enum { LIST_SMS = 132 };
    const uint64_t list_mem = 80ull << 30;
    printf("flce bench --list: plans for %s with %d SMs and 80 GiB, %s (no GPU needed)\n", spec_arch_name(o->sm),
           LIST_SMS, host_dtype_name(o->dtype));
    for (int s = 0; s < o->n_shapes; s++) {
        printf("\n### %lldx%lldx%lld (N × D × V)\n\n", (long long)o->shape[s][0], (long long)o->shape[s][1],
               (long long)o->shape[s][2]);
        printf("| strategy | runs as | chunks | workspace MiB | estimate ms | AUTO's choice (why) |\n"
               "|---|---|---|---|---|---|\n");
        for (int j = 0; j < o->n_strat; j++) {
            int k = o->strat[j];
            flce_problem p = bench_problem(o, s, k);
            flce_op op = STRATEGIES[k].forward ? FLCE_OP_FORWARD : FLCE_OP_LOSS_AND_GRAD;
            plan pl;
            int saved = fp32z_begin(k);
            flce_status st = plan_make_dev(&p, op, NULL, o->sm, LIST_SMS, list_mem, NULL, &pl);
            fp32z_end(k, saved);
            if (st != FLCE_OK) {
                printf("| %s | error: %s | | | | |\n", STRATEGIES[k].name, flce_last_error());
                continue;
            }
            char chunks[96];
            if (op == FLCE_OP_FORWARD)
                snprintf(chunks, sizeof chunks, "one pass over %lld tokens", (long long)pl.n);
            else if (pl.recompute)
                snprintf(chunks, sizeof chunks, "%lld vocab chunks of %lld columns", (long long)pl.n_vchunks,
                         (long long)pl.chunk_cols);
            else
                snprintf(chunks, sizeof chunks, "%lld token chunks of %lld rows", (long long)pl.n_chunks,
                         (long long)pl.chunk_rows);
            const char *kind = op == FLCE_OP_FORWARD ? "forward" : pl.recompute ? "recompute"
                               : pl.qrows ? "chunked (compact bf16 logits, row-scaled)"
                               : pl.compact ? "chunked (compact fp16 logits)" : "chunked (fp32 logits)";
            /* the GEMMs' own shapes where the planner changed them (plan.c plan_logits_cluster,
             * plan_dh_splits, plan_dw_cluster, plan_dh_width) */
            char runs[192];
            int at = snprintf(runs, sizeof runs, "%s", kind);
            if (pl.logits.cluster > 1)
                at += snprintf(runs + at, sizeof runs - (size_t)at, "; logits in 2-CTA clusters");
            if (op != FLCE_OP_FORWARD && pl.dh_splits > 1)
                at += snprintf(runs + at, sizeof runs - (size_t)at, "; dH split in %d over the vocab", pl.dh_splits);
            else if (op != FLCE_OP_FORWARD && spec_uses_wgmma(&pl.dh.tile) && pl.dh.tile.bn < 256)
                at += snprintf(runs + at, sizeof runs - (size_t)at, "; dH tiles %d wide", pl.dh.tile.bn);
            if (op != FLCE_OP_FORWARD && pl.dw.cluster > 1)
                at += snprintf(runs + at, sizeof runs - (size_t)at, "; dW in %d-CTA clusters", pl.dw.cluster);
            /* (plan.h concurrent_grads: dW on its own stream, its tiles from a counter shared with
             * dH; the sanitize cases "gs-" pick shapes by this) */
            if (op != FLCE_OP_FORWARD && pl.concurrent_grads)
                snprintf(runs + at, sizeof runs - (size_t)at, "; dW beside dH (tiles from a counter)");
            char why[128] = "forward", est[24] = "";
            if (op != FLCE_OP_FORWARD) {
                auto_why(p, o->sm, LIST_SMS, list_mem, why, sizeof why);
                snprintf(est, sizeof est, "%.1f", plan_estimate_ms(&p, &pl, LIST_SMS));
            }
            printf("| %s | %s | %s | %.1f | %s | %s |\n", STRATEGIES[k].name, runs, chunks,
                   (double)pl.workspace_bytes / MIB, est, why);
        }
    }
    return 0;
}

static int bench_gpu(const bench_opts *o); /* below: the timed runs */

int cmd_bench(int argc, char **argv)
{
    bench_opts o;
    int r = bench_parse(&o, argc, argv);
    if (r <= 0) return r < 0 ? TOOL_EXIT_USAGE : TOOL_EXIT_OK;
    if (o.list) return bench_list(&o);
    if (devmem_gpu_count() < 1) return tool_no_gpu("bench", "; `flce bench --list` prints the plans without one");
    return bench_gpu(&o) ? TOOL_EXIT_FAILED : TOOL_EXIT_OK;
}

/* ---- on the GPU ---------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_set {
    void *h, *w, *labels;
} bench_set;

typedef struct bench_run {
    const bench_opts *o;
    bench_data d;
    bench_set set[BENCH_MAX_SETS];
    int sets;
    bench_ref ref;
    host_rng rng;
} bench_run;

static void progress(const char *fmt, ...)
{
    time_t now = time(NULL);
    char stamp[16];
    strftime(stamp, sizeof stamp, "%H:%M:%S", localtime(&now));
    fprintf(stderr, "[%s] flce bench: ", stamp);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* The "saved" row's workspace, which holds the logits from its forward to its backward. */
static void *saved_ws;
static uint64_t saved_ws_bytes;

static flce_status bench_call(flce_context *ctx, const flce_problem *p, int forward, const flce_tensors *t)
{
    if (p->strategy == FLCE_STRATEGY_SAVED) {
        flce_tensors s = *t;
        s.workspace = saved_ws, s.workspace_bytes = saved_ws_bytes;
        flce_status st = flce_forward(ctx, p, &s, NULL);
        return st == FLCE_OK ? flce_backward(ctx, p, &s, NULL) : st;
    }
    return forward ? flce_forward(ctx, p, t, NULL) : flce_loss_and_grad(ctx, p, t, NULL);
}

/* dw_f32: a "+maingrad" row's fp32 buffer, which dW is added into; NULL: d_dw. */
static void bench_tensors(const bench_run *b, int set, int forward, void *dw_f32, flce_tensors *t)
{
    flce_tensors_init(t);
    t->hidden = b->set[set].h, t->weight = b->set[set].w, t->labels = b->set[set].labels;
    t->loss = b->d.d_loss, t->lse = b->d.d_lse;
    if (!forward) t->grad_hidden = b->d.d_dh, t->grad_weight = dw_f32 ? dw_f32 : b->d.d_dw;
}

/* One row. A fresh context per row, so the device-memory change of its first call is all that
 * this strategy needs (workspace, modules), not what an earlier row left in the context. */
static int bench_row_run_now(bench_run *b, int k, bench_row *row);

static int bench_row_run(bench_run *b, int k, bench_row *row)
{
    int saved = fp32z_begin(k);
    int ok = bench_row_run_now(b, k, row);
    fp32z_end(k, saved);
    return ok;
}

/* --timeline, on stderr: each timed run's milliseconds with its input set, then every kernel's
 * in-run time per call (CUDA events between launches: runtime/timeline.h), to set against ncu's
 * one-kernel-at-a-time durations and find what a sequence loses to clocks and tails. */
static void print_timeline(const bench_run *b, const bench_strategy *st, const double *ms, bench_row *row)
{
    enum { MAX_ENTRIES = 8192, MAX_NAMES = BENCH_MAX_KERNELS };
    static timeline_entry e[MAX_ENTRIES];
    int n = timeline_take(e, MAX_ENTRIES);
    fprintf(stderr, "timeline %s: runs (ms, input set):", st->name);
    for (int r = 0; r < b->o->iters; r++) fprintf(stderr, " %.3f/%d", ms[r], (b->o->warmup + r) % b->sets);
    fprintf(stderr, "\n");
    if (n < 0) {
        fprintf(stderr, "timeline %s: the kernel events could not be read\n", st->name);
        return;
    }
    const char *names[MAX_NAMES];
    double total[MAX_NAMES], sum = 0;
    int launches[MAX_NAMES], k = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < k && strcmp(names[j], e[i].what)) j++;
        if (j == k) {
            if (k == MAX_NAMES) continue;
            names[k] = e[i].what, total[k] = 0, launches[k] = 0, k++;
        }
        total[j] += e[i].ms, launches[j]++, sum += e[i].ms;
    }
    row->n_kernels = k;
    for (int j = 0; j < k; j++) {
        bench_kernel *bk = &row->kernels[j];
        bk->name = names[j], bk->launches = (double)launches[j] / b->o->iters, bk->ms = total[j] / b->o->iters;
        fprintf(stderr, "timeline %s: %-18s %5.1f launches/call %8.3f ms/call\n", st->name, bk->name, bk->launches,
                bk->ms);
    }
    fprintf(stderr, "timeline %s: %-18s %8.3f ms/call\n", st->name, "all kernels", sum / b->o->iters);
}

static int bench_row_run_now(bench_run *b, int k, bench_row *row)
{
    const bench_strategy *st = &STRATEGIES[k];
    flce_problem p = b->d.p;
    p.strategy = st->strategy, p.memory_budget = st->budget, p.accumulate_grad_weight = st->main_grad;
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK) return 0;
    void *mg = NULL; /* "+maingrad": allocated before the memory is read, as an input */
    size_t mg_bytes = (size_t)(p.vocab_shard * p.hidden) * 4;
    if (st->main_grad && (devmem_alloc(&mg, mg_bytes) != FLCE_OK || devmem_zero(mg, mg_bytes) != FLCE_OK)) {
        fprintf(stderr, "flce bench: %s: the fp32 dW buffer: %s\n", st->name, flce_last_error());
        devmem_free(mg);
        flce_context_destroy(ctx);
        return 0;
    }
    flce_context_info dev;
    flce_context_info_init(&dev);
    flce_context_info_get(ctx, &dev); /* cannot fail for a context just created */
    row->auto_choice = auto_choice(p, st->forward, dev.name, dev.sm, dev.num_sms, dev.memory_bytes);
    uint64_t ws = 0;
    flce_op op = st->forward || st->strategy == FLCE_STRATEGY_SAVED ? FLCE_OP_FORWARD : FLCE_OP_LOSS_AND_GRAD;
    size_t free0 = 0, free1 = 0, total = 0;
    flce_tensors t;
    bench_tensors(b, 0, st->forward, mg, &t);
    /* The first call's wall time is what a process pays once: NVRTC, or with a warm disk cache
     * (and autotune table) only the module load. */
    int ok = flce_workspace_size(ctx, &p, op, &ws) == FLCE_OK && devmem_info(&free0, &total) == FLCE_OK;
    saved_ws = NULL, saved_ws_bytes = ws;
    if (ok && st->strategy == FLCE_STRATEGY_SAVED) ok = devmem_alloc(&saved_ws, ws) == FLCE_OK; /* extra memory */
    double t0 = host_now_s();
    ok = ok && bench_call(ctx, &p, st->forward, &t) == FLCE_OK && flce_check(ctx, NULL) == FLCE_OK &&
         devmem_sync() == FLCE_OK;
    row->first_ms = 1e3 * (host_now_s() - t0);
    ok = ok && devmem_info(&free1, &total) == FLCE_OK;
    row->workspace_mib = (double)ws / MIB;
    row->extra_mib = ((double)free0 - (double)free1) / MIB;
    for (int r = 0; ok && r < b->o->warmup; r++) {
        bench_tensors(b, r % b->sets, st->forward, mg, &t);
        ok = bench_call(ctx, &p, st->forward, &t) == FLCE_OK;
    }
    double *ms = calloc((size_t)b->o->iters, sizeof(double));
    ok = ok && ms && devmem_sync() == FLCE_OK;
    timeline_enable(b->o->timeline);
    for (int r = 0; ok && r < b->o->iters; r++) {
        /* Continue the rotation after the warm-up: no run reads the operands of the run before. */
        bench_tensors(b, (b->o->warmup + r) % b->sets, st->forward, mg, &t);
        devmem_timer *tm;
        float one = 0;
        ok = devmem_timer_start(&tm) == FLCE_OK;
        if (ok && bench_call(ctx, &p, st->forward, &t) != FLCE_OK) {
            devmem_timer_stop(tm, &one);
            ok = 0;
        }
        ok = ok && devmem_timer_stop(tm, &one) == FLCE_OK;
        if (ok) ms[r] = one;
    }
    timeline_enable(0);
    if (ok && b->o->timeline) print_timeline(b, st, ms, row);
    if (ok) {
        qsort(ms, (size_t)b->o->iters, sizeof ms[0], cmp_double);
        row->ms = ms[b->o->iters / 2], row->ms_min = ms[0], row->ms_max = ms[b->o->iters - 1];
        double nvd = (double)p.tokens * (double)p.hidden * (double)p.vocab_shard;
        row->tflops = (st->forward ? 2.0 : 6.0) * nvd / row->ms / 1e9;
    }
    free(ms);
    /* The checked call: set 0 (the reference's data), outputs poisoned, per-token losses added. */
    ok = ok && bench_data_poison_outputs(&b->d) == FLCE_OK && (!mg || devmem_zero(mg, mg_bytes) == FLCE_OK);
    bench_tensors(b, 0, st->forward, mg, &t);
    t.loss_per_token = b->d.d_loss_rows;
    ok = ok && bench_call(ctx, &p, st->forward, &t) == FLCE_OK && flce_check(ctx, NULL) == FLCE_OK;
    if (ok) {
        bench_ref_compare(&b->ref, &b->d, !st->forward, &row->e);
        /* dW's reference needs every token's lse: the GPU's, once its sampled rows matched. */
        if (!b->ref.have_dw && row->e.lse < 1e-5) {
            float *lse = malloc((size_t)p.tokens * 4);
            if (lse && devmem_download(lse, b->d.d_lse, (size_t)p.tokens * 4) == FLCE_OK) {
                progress("  dW reference from the lse of %s", st->name);
                bench_ref_vocab(&b->ref, &b->d, &b->rng, lse);
                bench_ref_compare(&b->ref, &b->d, !st->forward, &row->e);
            }
            free(lse);
        }
        if (mg) bench_ref_compare_dw_f32(&b->ref, &b->d, mg, &row->e);
    }
    if (!ok) fprintf(stderr, "flce bench: %s: %s\n", st->name, flce_last_error());
    devmem_free(mg);
    devmem_free(saved_ws);
    saved_ws = NULL;
    flce_context_destroy(ctx);
    return ok;
}

/* K input sets, fewer when they would not fit beside the outputs and the largest workspace. */
static int bench_sets(bench_run *b)
{
    const flce_problem *p = &b->d.p;
    uint64_t ws_max = 0;
    flce_context *ctx = NULL;
    if (flce_context_create(0, &ctx) != FLCE_OK) return 0;
    for (int j = 0; j < b->o->n_strat; j++) {
        flce_problem q = *p;
        q.strategy = STRATEGIES[b->o->strat[j]].strategy, q.memory_budget = STRATEGIES[b->o->strat[j]].budget;
        q.accumulate_grad_weight = STRATEGIES[b->o->strat[j]].main_grad;
        uint64_t ws = 0;
        int fwd_op = STRATEGIES[b->o->strat[j]].forward || q.strategy == FLCE_STRATEGY_SAVED;
        if (flce_workspace_size(ctx, &q, fwd_op ? FLCE_OP_FORWARD : FLCE_OP_LOSS_AND_GRAD, &ws) != FLCE_OK)
            continue;
        if (q.accumulate_grad_weight) ws += (uint64_t)(q.vocab_shard * q.hidden) * 4; /* its fp32 dW */
        if (ws > ws_max) ws_max = ws;
    }
    flce_context_destroy(ctx);
    size_t free_b = 0, total = 0;
    devmem_info(&free_b, &total);
    /* 1 GiB for modules, the context and the allocator's granularity. */
    uint64_t need = ws_max + (1ull << 30), in = bench_data_input_bytes(p);
    int fit = free_b > need ? 1 + (int)((free_b - need) / in) : 1;
    b->sets = fit < b->o->sets ? fit : b->o->sets;
    if (b->sets < 1) b->sets = 1;
    if (b->sets < b->o->sets)
        fprintf(stderr, "flce bench: %d input set(s) instead of %d: %.0f MiB free, %.0f MiB per set\n",
                b->sets, b->o->sets, (double)free_b / MIB, (double)in / MIB);
    b->set[0] = (bench_set){b->d.d_h, b->d.d_w, b->d.d_labels};
    /* Copies of set 0 at other addresses: L2 holds addresses, so a copy is as cold as new data,
     * and set 0's reference checks every set's inputs. */
    size_t nh = (size_t)(p->tokens * p->hidden) * b->d.es, nw = (size_t)(p->vocab_shard * p->hidden) * b->d.es;
    for (int s = 1; s < b->sets; s++) {
        bench_set *x = &b->set[s];
        if (devmem_alloc(&x->h, nh) != FLCE_OK || devmem_alloc(&x->w, nw) != FLCE_OK ||
            devmem_alloc(&x->labels, (size_t)p->tokens * 4) != FLCE_OK ||
            devmem_upload(x->h, b->d.h, nh) != FLCE_OK || devmem_upload(x->w, b->d.w, nw) != FLCE_OK ||
            devmem_upload(x->labels, b->d.labels, (size_t)p->tokens * 4) != FLCE_OK) {
            fprintf(stderr, "flce bench: input set %d: %s; using %d\n", s, flce_last_error(), s);
            devmem_free(x->h), devmem_free(x->w), devmem_free(x->labels);
            memset(x, 0, sizeof *x);
            b->sets = s;
        }
    }
    return 1;
}

static void bench_free_sets(bench_run *b)
{
    for (int s = 1; s < b->sets; s++)
        devmem_free(b->set[s].h), devmem_free(b->set[s].w), devmem_free(b->set[s].labels);
}

static int within_tolerance(const bench_row *r, flce_dtype dt)
{
    double tol = dt == FLCE_DTYPE_F32 ? 1e-4 : 4e-3;
    int grads = !STRATEGIES[r->strat].forward;
    return r->ran && r->e.mean < 1e-5 && r->e.lse < 1e-5 && r->e.loss_row < 1e-4 &&
           (!grads || (r->e.dh < tol && r->e.dw < tol));
}

/* Runs every strategy of one (shape, logit std). Returns the rows written. */
static int bench_case(const bench_opts *o, int shape, double std, bench_row *rows)
{
    bench_run b;
    memset(&b, 0, sizeof b);
    b.o = o;
    b.d.p = bench_problem(o, shape, 0);
    char name[96];
    snprintf(name, sizeof name, "%lldx%lldx%lld", (long long)b.d.p.tokens, (long long)b.d.p.hidden,
             (long long)b.d.p.vocab_shard);
    uint64_t seed = host_fresh_seed();
    progress("%s, logit std %g: random data and the sampled fp64 reference", name, std);
    int n = 0;
    if (!bench_data_fill(&b.d, seed, std) || bench_data_upload(&b.d) != FLCE_OK || !bench_sets(&b)) {
        fprintf(stderr, "flce bench: %s: %s\n", name, flce_last_error()[0] ? flce_last_error() : "host memory");
        goto done;
    }
    host_rng_seed(&b.rng, seed ^ 0x5eed);
    if (!bench_ref_tokens(&b.ref, &b.d, &b.rng, o->samples)) goto done;
    for (int j = 0; j < o->n_strat; j++, n++) {
        bench_row *r = &rows[n];
        memset(r, 0, sizeof *r);
        r->shape = shape, r->strat = o->strat[j], r->std = std, r->auto_choice = "?";
        r->ms = r->ms_min = r->ms_max = r->tflops = NAN;
        progress("%s, logit std %g: %s", name, std, STRATEGIES[r->strat].name);
        r->ran = bench_row_run(&b, r->strat, r);
        if (!r->ran) r->e.mean = r->e.lse = r->e.loss_row = r->e.dh = r->e.dw = NAN;
        r->within = within_tolerance(r, o->dtype);
    }
done:
    bench_ref_free(&b.ref);
    bench_free_sets(&b);
    bench_data_free(&b.d);
    return n;
}

/* err_loss: the worse of the sampled per-token losses and the mean against them. */
static double err_loss(const bench_row *r)
{
    return isnan(r->e.mean) || isnan(r->e.loss_row) ? NAN : fmax(r->e.mean, r->e.loss_row);
}

static void print_err(double x)
{
    if (isnan(x)) printf(" – |");
    else printf(" %.1e |", x);
}

static void print_table(const bench_opts *o, int shape, const bench_row *rows, int n)
{
    printf("\n### %lldx%lldx%lld (N × D × V), %s\n\n", (long long)o->shape[shape][0],
           (long long)o->shape[shape][1], (long long)o->shape[shape][2], host_dtype_name(o->dtype));
    printf("| logit std | strategy | ms (median) | min | max | TFLOP/s | workspace MiB | extra MiB | "
           "first call ms | err loss | err lse | err dH | err dW |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        if (r->shape != shape) continue;
        const char *nm = STRATEGIES[r->strat].name;
        if (STRATEGIES[r->strat].strategy == FLCE_STRATEGY_AUTO && !STRATEGIES[r->strat].forward)
            printf("| %g | %s (AUTO → %s) |", r->std, nm, r->auto_choice);
        else
            printf("| %g | %s%s |", r->std, nm, r->within ? "" : " **outside tolerance**");
        if (!r->ran) {
            printf(" failed | | | | | | | | | | |\n");
            continue;
        }
        printf(" %.3f | %.3f | %.3f | %.1f%s | %.1f | %.1f | %.1f |", r->ms, r->ms_min, r->ms_max, r->tflops,
               STRATEGIES[r->strat].forward ? " (2NVD)" : "", r->workspace_mib, r->extra_mib, r->first_ms);
        print_err(err_loss(r)), print_err(r->e.lse), print_err(r->e.dh), print_err(r->e.dw);
        printf("\n");
    }
}

static void json_num(FILE *f, const char *key, double x, const char *sep)
{
    if (isnan(x) || isinf(x)) fprintf(f, "\"%s\": null%s", key, sep);
    else fprintf(f, "\"%s\": %.6g%s", key, x, sep);
}

static int write_json(const bench_opts *o, const bench_row *rows, int n)
{
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "flce bench: --json %s: cannot write\n", o->json);
        return 0;
    }
    fprintf(f, "[\n");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        fprintf(f, "  {\"shape\": \"%lldx%lldx%lld\", \"dtype\": \"%s\", ", (long long)o->shape[r->shape][0],
                (long long)o->shape[r->shape][1], (long long)o->shape[r->shape][2], host_dtype_name(o->dtype));
        json_num(f, "logit_std", r->std, ", ");
        fprintf(f, "\"strategy\": \"%s\", \"auto_choice\": \"%s\", ", STRATEGIES[r->strat].name, r->auto_choice);
        json_num(f, "ms", r->ms, ", "), json_num(f, "ms_min", r->ms_min, ", "), json_num(f, "ms_max", r->ms_max, ", ");
        json_num(f, "tflops", r->tflops, ", "), json_num(f, "workspace_mib", r->workspace_mib, ", ");
        json_num(f, "extra_mib", r->ran ? r->extra_mib : NAN, ", ");
        json_num(f, "first_call_ms", r->ran ? r->first_ms : NAN, ", ");
        json_num(f, "err_loss", err_loss(r), ", "), json_num(f, "err_lse", r->e.lse, ", ");
        json_num(f, "err_dh", r->e.dh, ", "), json_num(f, "err_dw", r->e.dw, r->n_kernels ? ", " : "");
        if (r->n_kernels) {
            fprintf(f, "\"kernels\": [");
            for (int j = 0; j < r->n_kernels; j++) {
                fprintf(f, "{\"name\": \"%s\", ", r->kernels[j].name);
                json_num(f, "launches_per_call", r->kernels[j].launches, ", ");
                json_num(f, "ms_per_call", r->kernels[j].ms, "");
                fprintf(f, "}%s", j + 1 < r->n_kernels ? ", " : "");
            }
            fprintf(f, "]");
        }
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "]\n");
    return fclose(f) == 0;
}

/* The commit, as bench/stamp.py finds it: the device stamp (.device-commit from bench/stamp-commit.sh,
 * device-commit.txt in a .dev/ export; the device's tree has no .git), else git. */
static void bench_commit(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    static const char *const stamps[] = {".device-commit", "device-commit.txt"};
    for (size_t i = 0; i < sizeof stamps / sizeof stamps[0]; i++) {
        FILE *f = fopen(stamps[i], "r");
        if (!f) continue;
        if (fgets(out, (int)n, f)) out[strcspn(out, "\n")] = 0;
        fclose(f);
        return;
    }
    FILE *f = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (!f) return;
    if (!fgets(out, (int)n, f)) snprintf(out, n, "unknown");
    out[strcspn(out, "\n")] = 0;
    pclose(f);
}

static int bench_gpu(const bench_opts *o)
{
    flce_context *ctx = NULL;
    if (devmem_use(0) != FLCE_OK || flce_context_create(0, &ctx) != FLCE_OK) {
        fprintf(stderr, "flce bench: %s\n", flce_last_error());
        return 1;
    }
    flce_context_info dev;
    flce_context_info_init(&dev);
    flce_context_info_get(ctx, &dev); /* cannot fail for a context just created */
    char commit[128], date[32];
    bench_commit(commit, sizeof commit);
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("# flce bench — %s (sm_%d, %d SMs), %s, flce %s, commit %s\n\n", dev.name, dev.sm, dev.num_sms,
           date, flce_version(), commit);
    printf("CUDA events on one stream, %d warm-up runs, median of %d, inputs rotated over %d set(s) "
           "(fewer where memory is short: see stderr); TFLOP/s count 6NVD (2NVD for forward); errors are "
           "rel. vs fp64 on %d sampled tokens and vocab rows.\n", o->warmup, o->iters, o->sets, o->samples);
    flce_context_destroy(ctx);
    bench_row *rows = calloc((size_t)(o->n_shapes * o->n_stds * o->n_strat), sizeof *rows);
    if (!rows) return 1;
    int n = 0, bad = 0;
    for (int s = 0; s < o->n_shapes; s++) {
        int first = n;
        for (int k = 0; k < o->n_stds; k++) n += bench_case(o, s, o->std[k], rows + n);
        print_table(o, s, rows + first, n - first);
        fflush(stdout);
    }
    for (int i = 0; i < n; i++) bad += !rows[i].within;
    if (o->json && !write_json(o, rows, n)) bad++;
    if (bad) fprintf(stderr, "flce bench: %d row(s) failed or outside tolerance\n", bad);
    free(rows);
    return bad ? 1 : 0;
}
