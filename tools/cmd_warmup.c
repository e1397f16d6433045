/*
 * cmd_warmup.c — `flce warmup`: compiles into the disk cache every kernel that calls of one op on
 * the given shapes will use, so that the job's first step (or every rank of it) loads them instead
 * of compiling. Per shape it makes the plan the call would make (plan_make_on: the strategy,
 * AUTO's choice, the autotune table on a GPU) and takes the kernels launch.c's get_kernels loads
 * for it: rowops and logits always, logits+dZ when the plan fuses dZ, dH and dW unless the op is a
 * forward. Kernels shared by several shapes (same D and V) are built once. They compile through
 * jit_build_many, up to --jobs at once, and through the cache's compile lock, so warmups started
 * together on many ranks or hosts sharing one directory split the work instead of repeating it.
 *
 * No GPU is needed: --arch names the target. Without --arch it is GPU 0's arch, with its name (for
 * the autotune table) and SM count (AUTO's cost model); where there is no GPU, sm_90a.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cmd_gen.h"
#include "context.h"
#include "host.h"
#include "jit.h"
#include "plan.h"

#define WARMUP_MAX_SHAPES 64
#define WARMUP_MAX_JOBS 8
/* The SM count AUTO's cost model assumes without a GPU (an H100 SXM or H200). */
#define WARMUP_DEFAULT_SMS 132

typedef struct warmup_opts {
    tool_opts t; /* --arch, --dtype, --reduction, --labels, --budget-mib (cmd_gen.h) */
    int arch_given;
    int64_t shape[WARMUP_MAX_SHAPES][3];
    int n_shapes;
    flce_op op;
    int outputs_all, entropy, argmax;
    int jobs;
    int sms;
    const char *device; /* tune-table device name without a GPU */
} warmup_opts;

/* One distinct kernel to build. */
typedef struct warmup_kernel {
    kernel_spec spec;
    char *key; /* jit_key: the identity of the cache entry */
    size_t key_len;
} warmup_kernel;

static void warmup_usage(FILE *f)
{
    fprintf(f,
            "usage: flce warmup --shapes NxDxV,... [--dtype bf16] [--arch sm_90a]\n"
            "                   [--op loss-and-grad|forward|backward]\n"
            "                   [--strategy auto|chunked|recompute|forward|saved]\n"
            "                   [--grad-outputs logprob,lse,entropy,loss_per_token] [--batch-invariant]\n"
            "                   [--budget-mib N] [--reduction mean|sum|none] [--labels 32|64]\n"
            "                   [--smoothing E] [--z-loss L] [--softcap C] [--temperature T] [--bias]\n"
            "                   [--class-weights] [--accumulate] [--outputs usual|all|entropy,argmax]\n"
            "                   [--jobs 1-8] [--sms N] [--device NAME]\n"
            "Compiles into the disk cache every kernel the op's calls on these shapes (N tokens, hidden D,\n"
            "vocab shard V) will load, and says which were compiled and which were already cached.\n"
            "No GPU needed. --arch: default GPU 0's arch, else sm_90a. --outputs: which outputs the\n"
            "calls ask for (usual: loss, lse and gradients, as flce_prepare with no tensors; all: every\n"
            "output, as flce gen and flce_workspace_size plan; entropy, argmax: usual plus those).\n"
            "--sms and --device (the autotune table's device name) stand in for a GPU's.\n");
}

static int warmup_misuse(const char *fmt, const char *arg)
{
    fprintf(stderr, "flce warmup: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    warmup_usage(stderr);
    return 2;
}

static int parse_shapes(warmup_opts *o, const char *s)
{
    char buf[2048];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return 0;
    o->n_shapes = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long long n, d, v;
        char end;
        if (sscanf(tok, "%lldx%lldx%lld%c", &n, &d, &v, &end) != 3 || n < 1 || d < 1 || v < 1)
            return 0;
        if (o->n_shapes == WARMUP_MAX_SHAPES) return 0;
        o->shape[o->n_shapes][0] = n, o->shape[o->n_shapes][1] = d, o->shape[o->n_shapes][2] = v;
        o->n_shapes++;
    }
    return o->n_shapes > 0;
}

static int parse_op(const char *s, flce_op *op)
{
    if (!strcmp(s, "loss-and-grad")) *op = FLCE_OP_LOSS_AND_GRAD;
    else if (!strcmp(s, "forward")) *op = FLCE_OP_FORWARD;
    else if (!strcmp(s, "backward")) *op = FLCE_OP_BACKWARD;
    else return 0;
    return 1;
}

static int parse_strategy(const char *s, flce_strategy *st)
{
    if (!strcmp(s, "auto")) *st = FLCE_STRATEGY_AUTO;
    else if (!strcmp(s, "chunked")) *st = FLCE_STRATEGY_CHUNKED;
    else if (!strcmp(s, "recompute")) *st = FLCE_STRATEGY_RECOMPUTE;
    else if (!strcmp(s, "forward")) *st = FLCE_STRATEGY_FORWARD;
    else if (!strcmp(s, "saved")) *st = FLCE_STRATEGY_SAVED;
    else return 0;
    return 1;
}

/* --grad-outputs logprob,lse,entropy: problem.grad_outputs */
static int parse_grad_outputs(const char *s, int32_t *bits)
{
    char buf[128];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return 0;
    *bits = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "logprob")) *bits |= FLCE_GRAD_LOGPROB;
        else if (!strcmp(tok, "lse")) *bits |= FLCE_GRAD_LSE;
        else if (!strcmp(tok, "entropy")) *bits |= FLCE_GRAD_ENTROPY;
        else if (!strcmp(tok, "loss_per_token")) *bits |= FLCE_GRAD_LOSS_PER_TOKEN;
        else return 0;
    }
    return 1;
}

static int parse_outputs(warmup_opts *o, const char *s)
{
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return 0;
    o->outputs_all = o->entropy = o->argmax = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "all")) o->outputs_all = 1;
        else if (!strcmp(tok, "entropy")) o->entropy = 1;
        else if (!strcmp(tok, "argmax")) o->argmax = 1;
        else if (strcmp(tok, "usual")) return 0;
    }
    return 1;
}

/* A float option's value: 0 when it is not a number. */
static int parse_float(const char *s, float *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end) return 0;
    *out = (float)v;
    return 1;
}

/* Parses argv into o; returns -1 to go on, else the exit code (help: 0, misuse: 2). */
static int warmup_parse(warmup_opts *o, int argc, char **argv)
{
    flce_problem *p = &o->t.problem;
    for (int i = 1; i < argc;) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
            warmup_usage(stdout);
            return 0;
        }
        /* flags without a value */
        if (!strcmp(k, "--bias") || !strcmp(k, "--class-weights") || !strcmp(k, "--accumulate") ||
            !strcmp(k, "--batch-invariant")) {
            if (!strcmp(k, "--bias")) p->has_bias = 1;
            else if (!strcmp(k, "--batch-invariant")) p->batch_invariant = 1;
            else if (!strcmp(k, "--class-weights")) p->has_class_weights = 1;
            else p->accumulate_grad_hidden = p->accumulate_grad_weight = 1;
            i++;
            continue;
        }
        if (!strcmp(k, "--arch")) o->arch_given = 1;
        int used = tool_parse_common(&o->t, argc, argv, i);
        if (used < 0) return 2;
        if (used > 0) {
            i += used;
            continue;
        }
        if (!v) return warmup_misuse("%s needs a value (or is unknown)", k);
        int ok = 1;
        if (!strcmp(k, "--shapes")) ok = parse_shapes(o, v);
        else if (!strcmp(k, "--op")) ok = parse_op(v, &o->op);
        else if (!strcmp(k, "--strategy")) ok = parse_strategy(v, &p->strategy);
        else if (!strcmp(k, "--outputs")) ok = parse_outputs(o, v);
        else if (!strcmp(k, "--grad-outputs")) ok = parse_grad_outputs(v, &p->grad_outputs);
        else if (!strcmp(k, "--smoothing")) ok = parse_float(v, &p->label_smoothing);
        else if (!strcmp(k, "--z-loss")) ok = parse_float(v, &p->z_loss);
        else if (!strcmp(k, "--softcap")) ok = parse_float(v, &p->softcap);
        else if (!strcmp(k, "--temperature")) ok = parse_float(v, &p->temperature);
        else if (!strcmp(k, "--jobs")) ok = (o->jobs = atoi(v)) >= 1 && o->jobs <= WARMUP_MAX_JOBS;
        else if (!strcmp(k, "--sms")) ok = (o->sms = atoi(v)) >= 1;
        else if (!strcmp(k, "--device")) o->device = v;
        else return warmup_misuse("unknown option %s", k);
        if (!ok) {
            fprintf(stderr, "flce warmup: %s %s: bad value\n", k, v);
            warmup_usage(stderr);
            return 2;
        }
        i += 2;
    }
    if (!o->n_shapes) return warmup_misuse("%s", "--shapes is required (e.g. --shapes 8192x4096x128256)");
    if (p->strategy == FLCE_STRATEGY_FORWARD && o->op != FLCE_OP_FORWARD)
        return warmup_misuse("%s", "--strategy forward computes no gradients: use it with --op forward");
    if ((p->strategy == FLCE_STRATEGY_CHUNKED || p->strategy == FLCE_STRATEGY_RECOMPUTE) &&
        o->op == FLCE_OP_FORWARD)
        return warmup_misuse("%s", "a forward call uses --strategy forward or auto");
    return -1;
}

/* The outputs the calls ask for, as flce_prepare marks them (only which pointers are non-NULL
 * matters to the plan); NULL plans every output. */
static const flce_tensors *warmup_tensors(const warmup_opts *o, flce_tensors *t)
{
    static char mark;
    if (o->outputs_all) return NULL;
    flce_tensors_init(t);
    t->loss = t->lse = (float *)(void *)&mark;
    if (o->op != FLCE_OP_FORWARD) t->grad_hidden = t->grad_weight = &mark;
    if (o->entropy) t->entropy = (float *)(void *)&mark;
    if (o->argmax) t->argmax = (int64_t *)(void *)&mark;
    return t;
}

/* Adds spec to the list unless a kernel with the same cache key is there already. */
static int warmup_add(warmup_kernel **list, int *n, int *cap, const kernel_spec *s)
{
    char *key = NULL;
    size_t key_len = 0;
    if (jit_key(s, &key, &key_len) != FLCE_OK) {
        fprintf(stderr, "flce warmup: %s\n", flce_last_error());
        return -1;
    }
    for (int i = 0; i < *n; i++)
        if ((*list)[i].key_len == key_len && !memcmp((*list)[i].key, key, key_len)) {
            free(key);
            return 0;
        }
    if (*n == *cap) {
        int grown_cap = *cap ? 2 * *cap : 16;
        warmup_kernel *grown = realloc(*list, (size_t)grown_cap * sizeof *grown);
        if (!grown) {
            free(key);
            fprintf(stderr, "flce warmup: out of host memory\n");
            return -1;
        }
        *list = grown, *cap = grown_cap;
    }
    (*list)[*n].spec = *s, (*list)[*n].key = key, (*list)[*n].key_len = key_len;
    (*n)++;
    return 1;
}

static const char *op_name(flce_op op)
{
    return op == FLCE_OP_FORWARD ? "forward" : op == FLCE_OP_BACKWARD ? "backward" : "loss-and-grad";
}

/* The target: --arch, else GPU 0 (its name and SM count too), else sm_90a. */
static void warmup_target(warmup_opts *o, char *device, size_t cap)
{
    device[0] = '\0';
    if (o->device) snprintf(device, cap, "%s", o->device);
    flce_context *ctx = NULL;
    int sm = 0;
    if (!o->device && flce_context_create(0, &ctx) == FLCE_OK && flce_context_arch(ctx, &sm) == FLCE_OK &&
        (!o->arch_given || sm == o->t.sm)) {
        o->t.sm = sm;
        if (!o->sms) o->sms = ctx->num_sms;
        snprintf(device, cap, "%s", ctx->name);
        printf("target: GPU 0, %s, %s, %d SMs\n", ctx->name, spec_arch_name(sm), o->sms);
    } else {
        if (!o->arch_given && !sm) o->t.sm = 90; /* no GPU */
        if (!o->sms) o->sms = WARMUP_DEFAULT_SMS;
        printf("target: %s%s%s, %d SMs for AUTO's cost model%s\n", spec_arch_name(o->t.sm),
               device[0] ? ", autotune table entries of " : "", device, o->sms,
               o->arch_given || o->device ? "" : " (no GPU found)");
    }
    if (ctx) flce_context_destroy(ctx);
}

int cmd_warmup(int argc, char **argv)
{
    warmup_opts o;
    memset(&o, 0, sizeof o);
    tool_opts_init(&o.t);
    o.op = FLCE_OP_LOSS_AND_GRAD;
    o.jobs = WARMUP_MAX_JOBS;
    int rc = warmup_parse(&o, argc, argv);
    if (rc >= 0) return rc;

    char device[256], dir[CACHE_PATH_MAX];
    warmup_target(&o, device, sizeof device);
    if (cache_dir_writable(dir, sizeof dir) != FLCE_OK) {
        fprintf(stderr, "flce warmup: %s: nothing to warm\n", flce_last_error());
        return 1;
    }
    printf("cache: %s\n", dir);

    /* Plan every shape; collect the distinct kernels. */
    warmup_kernel *list = NULL;
    int n = 0, cap = 0;
    rc = 0;
    for (int s = 0; s < o.n_shapes && !rc; s++) {
        flce_problem p = o.t.problem;
        p.tokens = o.shape[s][0], p.hidden = o.shape[s][1], p.vocab_shard = o.shape[s][2];
        flce_tensors t;
        plan pl;
        if (flce_problem_validate(&p) != FLCE_OK ||
            plan_make_on(&p, p.strategy == FLCE_STRATEGY_SAVED ? FLCE_OP_LOSS_AND_GRAD : o.op,
                         device[0] ? device : NULL, o.t.sm, o.sms, warmup_tensors(&o, &t),
                         &pl) != FLCE_OK) {
            fprintf(stderr, "flce warmup: %lldx%lldx%lld: %s\n", (long long)p.tokens,
                    (long long)p.hidden, (long long)p.vocab_shard, flce_last_error());
            rc = 2;
            break;
        }
        /* What launch.c's get_kernels loads for this plan. */
        const kernel_spec *specs[6];
        int k = 0;
        specs[k++] = &pl.rowops;
        specs[k++] = &pl.logits;
        /* and its generic twin, which a vocabulary of partial tiles loads and a new one of whole
         * tiles runs on while its own compiles (runtime/context.c, tiered kernels) */
        kernel_spec twin = pl.logits;
        twin.full_tiles = 0;
        if (pl.logits.full_tiles) specs[k++] = &twin;
        if (pl.fused_dz) specs[k++] = &pl.logits_dz;
        if (pl.op != FLCE_OP_FORWARD) specs[k++] = &pl.dh, specs[k++] = &pl.dw;
        int added = 0;
        for (int i = 0; i < k && !rc; i++) {
            int r = warmup_add(&list, &n, &cap, specs[i]);
            if (r < 0) rc = 1;
            added += r > 0;
        }
        const char *how = o.op == FLCE_OP_FORWARD ? "forward"
                          : pl.recompute          ? (pl.fused_dz ? "recompute, fused dZ" : "recompute")
                          : pl.compact            ? "chunked, compact logits"
                                                  : "chunked";
        if (!rc)
            printf("%lldx%lldx%lld %s %s: %s, %d kernels (%d new to this run)\n", (long long)p.tokens,
                   (long long)p.hidden, (long long)p.vocab_shard, host_dtype_name(p.dtype), op_name(o.op),
                   how, k, added);
    }

    /* Build them, up to --jobs at once; report each as its batch finishes. */
    int compiled = 0, cached = 0;
    double t0 = host_now_s(), compile_ms = 0;
    cache_counters before;
    cache_counters_get(&before);
    for (int first = 0; first < n && !rc; first += o.jobs) {
        int m = n - first < o.jobs ? n - first : o.jobs;
        const kernel_spec *batch[WARMUP_MAX_JOBS];
        jit_result res[WARMUP_MAX_JOBS];
        for (int i = 0; i < m; i++) batch[i] = &list[first + i].spec;
        printf("[%d-%d/%d] building %d kernel%s at once...\n", first + 1, first + m, n, m, m == 1 ? "" : "s");
        fflush(stdout);
        if (jit_build_many(batch, m, res) != FLCE_OK) {
            fprintf(stderr, "flce warmup: %s\n", flce_last_error());
            rc = 1;
            break;
        }
        for (int i = 0; i < m; i++) {
            char summary[256];
            spec_summary(batch[i], summary, sizeof summary);
            int hit = res[i].origin == JIT_DISK_HIT;
            compiled += !hit, cached += hit;
            if (!hit) compile_ms += res[i].ms;
            printf("  %-8s %7zu-byte cubin %9.1f ms  %s\n", hit ? "cached" : "compiled", res[i].len,
                   res[i].ms, summary);
            free(res[i].cubin);
        }
        fflush(stdout);
    }
    double wall = host_now_s() - t0;
    if (!rc) {
        cache_counters after;
        cache_counters_get(&after);
        printf("warmup: %d kernel%s for %d shape%s: %d compiled, %d already cached, %.2f s wall "
               "(%.2f s of compiles)\n",
               n, n == 1 ? "" : "s", o.n_shapes, o.n_shapes == 1 ? "" : "s", compiled, cached, wall,
               compile_ms / 1e3);
        if (after.lock_waits > before.lock_waits)
            printf("        %" PRIu64 " waited for another process compiling the same kernel (%.2f s)\n",
                   after.lock_waits - before.lock_waits, (after.lock_wait_ms - before.lock_wait_ms) / 1e3);
        if (after.evicted > before.evicted)
            printf("        %" PRIu64 " older entries evicted to keep the cache under its cap\n",
                   after.evicted - before.evicted);
    }
    for (int i = 0; i < n; i++) free(list[i].key);
    free(list);
    return rc;
}
