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

#include "cmd_gen.h"
#include "host.h"
#include "tool_api.h"

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
            "usage: flce warmup --shapes NxDxV,... [options]\n"
            "Compiles into the disk cache every kernel that one op's calls on these shapes (N tokens,\n"
            "hidden D, vocab shard V) will load, so that a job's first step (or every rank of it) loads\n"
            "them instead of compiling; says which were compiled and which were already cached. No GPU\n"
            "needed; processes warming one cache directory together split the work.\n"
            "\n"
            "Options (default in brackets):\n"
            "  --shapes NxDxV,...      the shapes the job will call, up to %d (required)\n"
            "  --op O                  loss-and-grad, forward or backward [loss-and-grad]\n"
            "  --strategy S            auto, chunked, recompute, forward or saved [auto]\n"
            "  --dtype T               bf16, f16 or f32 [bf16]\n"
            "  --arch A                target: sm_80, sm_86, sm_87, sm_89, sm_90a, sm_100a, sm_120\n"
            "                          [GPU 0's, else sm_90a]\n"
            "  --reduction R           mean, sum or none [mean]\n"
            "  --labels B              label width in bits: 32 or 64 [32]\n"
            "  --budget-mib M          memory budget for stored logits, MiB [0: the library's default]\n"
            "  --smoothing E           label smoothing, in [0, 1) [0]\n"
            "  --z-loss L              z-loss coefficient, >= 0 [0]\n"
            "  --softcap C             logit softcap, 0 = off [0]\n"
            "  --temperature T         logit temperature, > 0 [1]\n"
            "  --bias                  the calls pass a bias\n"
            "  --class-weights         the calls pass class weights\n"
            "  --accumulate            the gradients are added into fp32 buffers (accumulate_grad_*)\n"
            "  --batch-invariant       batch-invariant kernels (problem.batch_invariant)\n"
            "  --grad-outputs G,...    per-token outputs with upstream gradients: logprob, lse,\n"
            "                          entropy, loss_per_token [none]\n"
            "  --outputs O,...         what the calls ask for: usual (loss, lse and the gradients, as\n"
            "                          flce_prepare plans), all (every output, as flce gen plans), or\n"
            "                          entropy and/or argmax besides the usual [usual]\n"
            "  --jobs J                kernels compiled at once, 1 to %d [%d]\n"
            "  --sms N                 SM count for AUTO's cost model [GPU 0's, else %d]\n"
            "  --device NAME           the autotune table's device name to plan with, e.g.\n"
            "                          NVIDIA_H100_80GB_HBM3 [GPU 0's, else none: built-in tiles]\n"
            "  -h, --help              this text\n"
            "\n"
            "Example:\n"
            "  flce warmup --shapes 8192x4096x128256,4096x4096x128256 --arch sm_90a\n"
            "\n"
            "Exit status: 0 every kernel is in the cache, 1 a compile or the cache failed, 2 a usage\n"
            "error (an invalid shape too).\n",
            WARMUP_MAX_SHAPES, WARMUP_MAX_JOBS, WARMUP_MAX_JOBS, WARMUP_DEFAULT_SMS);
}

static int parse_shapes(warmup_opts *o, const char *s)
{
    char buf[2048];
    if (snprintf(buf, sizeof buf, "%s", s) >= (int)sizeof buf) return tool_misuse("warmup", "--shapes: too long"), 0;
    o->n_shapes = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->n_shapes == WARMUP_MAX_SHAPES)
            return tool_misuse("warmup", "--shapes: at most %d shapes", WARMUP_MAX_SHAPES), 0;
        if (!tool_shape(tok, o->shape[o->n_shapes]))
            return tool_misuse("warmup", "--shapes '%s': expected NxDxV, e.g. 8192x4096x128256", tok), 0;
        o->n_shapes++;
    }
    if (!o->n_shapes) return tool_misuse("warmup", "--shapes '%s': no shape given", s), 0;
    return 1;
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

static const struct option warmup_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"shapes", required_argument, NULL, 's'},
    {"op", required_argument, NULL, 'o'},
    {"strategy", required_argument, NULL, 'S'},
    {"outputs", required_argument, NULL, 'O'},
    {"grad-outputs", required_argument, NULL, 'g'},
    {"jobs", required_argument, NULL, 'j'},
    {"sms", required_argument, NULL, 'm'},
    {"device", required_argument, NULL, 'D'},
    {"bias", no_argument, NULL, 'b'},
    {"class-weights", no_argument, NULL, 'w'},
    {"accumulate", no_argument, NULL, 'A'},
    {"batch-invariant", no_argument, NULL, 'B'},
    {"arch", required_argument, NULL, 'a'},
    TOOL_PROBLEM_OPT("dtype"),
    TOOL_PROBLEM_OPT("reduction"),
    TOOL_PROBLEM_OPT("labels"),
    TOOL_PROBLEM_OPT("budget-mib"),
    TOOL_PROBLEM_OPT("smoothing"),
    TOOL_PROBLEM_OPT("z-loss"),
    TOOL_PROBLEM_OPT("softcap"),
    TOOL_PROBLEM_OPT("temperature"),
    {NULL, 0, NULL, 0},
};

/* Parses argv into o; returns -1 to go on, else the exit code (help: 0, misuse: 2). */
static int warmup_parse(warmup_opts *o, int argc, char **argv)
{
    flce_problem *p = &o->t.problem;
    tool_cli c;
    tool_cli_start(&c, "warmup", argc, argv, warmup_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        int ok = 1;
        const char *what = NULL; /* a value that is not one of the words the option takes */
        switch (v) {
        case TOOL_NEXT_HELP: warmup_usage(stdout); return TOOL_EXIT_OK;
        case TOOL_NEXT_BAD: return TOOL_EXIT_USAGE;
        case TOOL_NEXT_WORD: return tool_misuse(c.cmd, "unexpected argument '%s'", c.arg);
        case 'b': p->has_bias = 1; break;
        case 'w': p->has_class_weights = 1; break;
        case 'A': p->accumulate_grad_hidden = p->accumulate_grad_weight = 1; break;
        case 'B': p->batch_invariant = 1; break;
        case 's': ok = parse_shapes(o, c.arg); break;
        case 'o': what = parse_op(c.arg, &o->op) ? NULL : "loss-and-grad, forward or backward"; break;
        case 'S': what = parse_strategy(c.arg, &p->strategy) ? NULL : "auto, chunked, recompute, forward or saved"; break;
        case 'O': what = parse_outputs(o, c.arg) ? NULL : "usual, all, entropy or argmax, comma-separated"; break;
        case 'g':
            what = parse_grad_outputs(c.arg, &p->grad_outputs) ? NULL : "logprob, lse, entropy or loss_per_token, comma-separated";
            break;
        case 'j': ok = tool_int32(c.cmd, c.name, c.arg, 1, WARMUP_MAX_JOBS, &o->jobs); break;
        case 'm': ok = tool_int32(c.cmd, c.name, c.arg, 1, 65536, &o->sms); break;
        case 'D':
            ok = c.arg[0] != '\0';
            if (!ok) tool_misuse(c.cmd, "--device needs a device name");
            o->device = c.arg;
            break;
        case 'a':
            o->arch_given = 1;
            ok = tool_set_common(&o->t, c.cmd, c.name, c.arg) > 0;
            break;
        default: ok = tool_set_common(&o->t, c.cmd, c.name, c.arg) > 0;
        }
        if (what) return tool_misuse(c.cmd, "--%s '%s': use %s", c.name, c.arg, what);
        if (!ok) return TOOL_EXIT_USAGE;
    }
    if (!o->n_shapes) return tool_misuse(c.cmd, "--shapes is required (e.g. --shapes 8192x4096x128256)");
    if (p->strategy == FLCE_STRATEGY_FORWARD && o->op != FLCE_OP_FORWARD)
        return tool_misuse(c.cmd, "--strategy forward computes no gradients: use it with --op forward");
    if ((p->strategy == FLCE_STRATEGY_CHUNKED || p->strategy == FLCE_STRATEGY_RECOMPUTE) &&
        o->op == FLCE_OP_FORWARD)
        return tool_misuse(c.cmd, "a forward call uses --strategy forward or auto");
    for (int k = 0; k < o->n_shapes; k++) { /* before anything is printed */
        flce_problem q = *p;
        q.tokens = o->shape[k][0], q.hidden = o->shape[k][1], q.vocab_shard = o->shape[k][2];
        if (flce_problem_validate(&q) != FLCE_OK)
            return tool_misuse(c.cmd, "shape %lldx%lldx%lld: %s", (long long)q.tokens, (long long)q.hidden,
                               (long long)q.vocab_shard, flce_last_error());
    }
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
    flce_context_info dev;
    flce_context_info_init(&dev); /* dev.sm stays 0 without a GPU */
    if (!o->device && flce_context_create(0, &ctx) == FLCE_OK) flce_context_info_get(ctx, &dev);
    int sm = dev.sm;
    if (sm && (!o->arch_given || sm == o->t.sm)) {
        o->t.sm = sm;
        if (!o->sms) o->sms = dev.num_sms;
        snprintf(device, cap, "%s", dev.name);
        printf("target: GPU 0, %s, %s, %d SMs\n", dev.name, spec_arch_name(sm), o->sms);
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
            rc = tool_misuse("warmup", "%lldx%lldx%lld: %s", (long long)p.tokens, (long long)p.hidden,
                             (long long)p.vocab_shard, flce_last_error());
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
