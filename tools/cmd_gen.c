/* cmd_gen.c — `flce gen`: prints the exact CUDA source NVRTC compiles for a problem's kernels, or
 * with --compile compiles them (through the disk cache) and reports sizes and times. Also what every
 * subcommand shares on its command line (cmd_gen.h): getopt_long with messages that name the word
 * at fault, strict numbers, the problem options. They live here because the fuzz replay of the
 * tool's arguments (fuzz/fuzz_tool_args.c) compiles this file with the library alone. */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_gen.h"
#include "host.h"
#include "tool_api.h"

/* ---- messages ------------------------------------------------------------------------------ */

int tool_misuse(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "flce %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'flce %s --help'.\n", cmd);
    return TOOL_EXIT_USAGE;
}

int tool_no_gpu(const char *cmd, const char *hint)
{
    const char *why = flce_last_error()[0] ? flce_last_error() : "no CUDA device";
    fprintf(stderr, "flce %s: no GPU (%s)%s\n", cmd, why, hint);
    return TOOL_EXIT_NO_GPU;
}

/* ---- getopt_long, strictly ------------------------------------------------------------------ */

void tool_cli_start(tool_cli *c, const char *cmd, int argc, char **argv, const struct option *opts)
{
    memset(c, 0, sizeof *c);
    c->cmd = cmd, c->argc = argc, c->argv = argv, c->opts = opts;
    optind = 0; /* a fresh scan (glibc rereads "-:h" then); it starts at argv[1] */
    opterr = 0; /* the messages are ours: they name the command and the help */
}

/* Edits between two short words (Levenshtein), capped: enough to catch "--tokns". */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXLEN = 40 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXLEN || m >= MAXLEN) return MAXLEN;
    int row[MAXLEN + 1];
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best, diag = up;
        }
    }
    return row[m];
}

/* The option a mistyped name most likely meant: one it begins, else one within two edits. */
static const char *closest_option(const struct option *opts, const char *name, size_t len)
{
    char typed[40];
    if (len < 2 || len >= sizeof typed) return NULL;
    memcpy(typed, name, len);
    typed[len] = '\0';
    const char *best = NULL;
    int best_d = 3;
    for (const struct option *o = opts; o->name; o++) {
        if (!strncmp(o->name, typed, len)) return o->name;
        int d = edit_distance(typed, o->name);
        if (d < best_d) best = o->name, best_d = d;
    }
    return best;
}

static int bad_long_option(const tool_cli *c, const char *word)
{
    const char *name = word + 2;
    size_t len = strcspn(name, "=");
    for (const struct option *o = c->opts; o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, name, len) && name[len] == '=' && o->has_arg == no_argument)
            return tool_misuse(c->cmd, "--%s takes no value ('%s')", o->name, word);
    const char *near = closest_option(c->opts, name, len);
    if (near) return tool_misuse(c->cmd, "unknown option '%.*s' (did you mean --%s?)", (int)(len + 2), word, near);
    return tool_misuse(c->cmd, "unknown option '%.*s'", (int)(len + 2), word);
}

/* getopt_long's '?' and ':' as a message naming the word. */
static int bad_option(const tool_cli *c, int v)
{
    const char *word = c->argv[optind - 1];
    if (v == ':') return tool_misuse(c->cmd, "%s needs a value", word);
    if (!strncmp(word, "--", 2)) return bad_long_option(c, word);
    /* a short option: getopt_long stays on its word until the word's last letter */
    if (optind < c->argc && c->argv[optind][0] == '-' && c->argv[optind][1] != '-' && optopt &&
        strchr(c->argv[optind], optopt))
        word = c->argv[optind];
    for (const struct option *o = c->opts; o->name && strlen(word) > 2; o++)
        if (!strcmp(o->name, word + 1))
            return tool_misuse(c->cmd, "unknown option '%s' (long options take two dashes: --%s)", word, o->name);
    return tool_misuse(c->cmd, "unknown option '%s'", word);
}

/* The word a long option came in: "--tokens=8", or "--tokens" followed by its value. */
static const char *option_word(const tool_cli *c, const struct option *o)
{
    if (o->has_arg != no_argument && optarg && optind >= 2 && optarg == c->argv[optind - 1]) return c->argv[optind - 2];
    return c->argv[optind - 1];
}

int tool_next(tool_cli *c)
{
    c->name = c->arg = NULL;
    if (c->ended) {
        if (optind >= c->argc) return TOOL_NEXT_END;
        c->arg = c->argv[optind++];
        return TOOL_NEXT_WORD;
    }
    int idx = -1;
    /* "-": words that are no option come back in their place (val 1), whatever POSIXLY_CORRECT
     * says; ":": a missing value is ':', not '?' */
    int v = getopt_long(c->argc, c->argv, "-:h", c->opts, &idx);
    if (v == -1) {
        c->ended = 1; /* the end, or "--": what follows are words */
        return tool_next(c);
    }
    if (v == 1) {
        c->arg = optarg;
        return TOOL_NEXT_WORD;
    }
    if (v == '?' || v == ':') return bad_option(c, v), TOOL_NEXT_BAD;
    if (idx < 0) return v; /* -h */
    const struct option *o = &c->opts[idx];
    const char *word = option_word(c, o);
    size_t len = strcspn(word + 2, "=");
    if (strncmp(word, "--", 2) || len != strlen(o->name) || strncmp(word + 2, o->name, len)) {
        /* getopt_long takes any unambiguous prefix; an option added later would make it ambiguous
         * and break the script that used it, so only whole names are taken */
        tool_misuse(c->cmd, "'%.*s': write the option in full: --%s", (int)(len + 2), word, o->name);
        return TOOL_NEXT_BAD;
    }
    c->name = o->name, c->arg = optarg;
    return v;
}

/* ---- numbers ------------------------------------------------------------------------------- */

/* Base-10 digits with at most a leading sign: what strtoll may read whole (no spaces, no "0x"). */
static int is_integer_word(const char *s)
{
    if (*s == '-' || *s == '+') s++;
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

static int range_misuse(const char *cmd, const char *name, const char *text, int64_t lo, int64_t hi)
{
    if (hi == INT64_MAX) return tool_misuse(cmd, "--%s '%s': must be at least %lld", name, text, (long long)lo);
    return tool_misuse(cmd, "--%s '%s': must be from %lld to %lld", name, text, (long long)lo, (long long)hi);
}

int tool_int(const char *cmd, const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    if (!is_integer_word(text)) return tool_misuse(cmd, "--%s '%s': not a whole number", name, text), 0;
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    if (errno == ERANGE || v < lo || v > hi) return range_misuse(cmd, name, text, lo, hi), 0;
    *out = v;
    return 1;
}

int tool_int32(const char *cmd, const char *name, const char *text, int lo, int hi, int *out)
{
    int64_t v;
    if (!tool_int(cmd, name, text, lo, hi, &v)) return 0;
    *out = (int)v;
    return 1;
}

int tool_u64(const char *cmd, const char *name, const char *text, uint64_t *out)
{
    int hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    const char *digits = hex ? text + 2 : text;
    int ok = *digits != '\0';
    for (const char *s = digits; *s && ok; s++) ok = hex ? isxdigit((unsigned char)*s) : isdigit((unsigned char)*s);
    if (!ok) return tool_misuse(cmd, "--%s '%s': not a whole number from 0 (decimal, or hex as 0x...)", name, text), 0;
    errno = 0;
    unsigned long long v = strtoull(digits, NULL, hex ? 16 : 10);
    if (errno == ERANGE) return tool_misuse(cmd, "--%s '%s': larger than 2^64 - 1", name, text), 0;
    *out = v;
    return 1;
}

int tool_real(const char *cmd, const char *name, const char *text, double lo, double hi, const char *range,
              double *out)
{
    char *end = NULL;
    errno = 0;
    double v = isspace((unsigned char)text[0]) ? 0 : strtod(text, &end);
    if (!end || end == text || *end) return tool_misuse(cmd, "--%s '%s': not a number", name, text), 0;
    if (errno == ERANGE || !(v >= lo && v <= hi)) /* NaN fails too */
        return tool_misuse(cmd, "--%s '%s': must be %s", name, text, range), 0;
    *out = v;
    return 1;
}

int tool_shape(const char *text, int64_t shape[3])
{
    const char *s = text;
    for (int k = 0; k < 3; k++) {
        size_t n = strspn(s, "0123456789");
        if (n < 1 || n > 18 || s[n] != (k < 2 ? 'x' : '\0')) return 0;
        shape[k] = strtoll(s, NULL, 10);
        if (shape[k] < 1) return 0;
        s += n + 1;
    }
    return 1;
}

/* ---- the problem options ------------------------------------------------------------------- */

void tool_opts_init(tool_opts *o)
{
    memset(o, 0, sizeof *o);
    o->sm = 90;
    o->role = -1;
    flce_problem_init(&o->problem);
    o->problem.tokens = 4096;
    o->problem.hidden = 4096;
    o->problem.vocab_shard = 32768;
}

static int parse_dtype(const char *s, flce_dtype *t)
{
    if (!strcmp(s, "bf16")) *t = FLCE_DTYPE_BF16;
    else if (!strcmp(s, "f16") || !strcmp(s, "fp16")) *t = FLCE_DTYPE_F16;
    else if (!strcmp(s, "f32") || !strcmp(s, "fp32")) *t = FLCE_DTYPE_F32;
    else return 0;
    return 1;
}

static int parse_reduction(const char *s, flce_reduction *r)
{
    if (!strcmp(s, "mean")) *r = FLCE_REDUCTION_MEAN;
    else if (!strcmp(s, "sum")) *r = FLCE_REDUCTION_SUM;
    else if (!strcmp(s, "none")) *r = FLCE_REDUCTION_NONE;
    else return 0;
    return 1;
}

/* A float field of the problem: finite, in [lo, hi] (range in words for the message). */
static int set_float(const char *cmd, const char *name, const char *text, double lo, const char *range,
                     float *field)
{
    double v;
    if (!tool_real(cmd, name, text, lo, FLT_MAX, range, &v)) return -1;
    *field = (float)v;
    return 1;
}

/* The limits are flce_problem_validate's (runtime/api.c), said here with the option's name. */
int tool_set_common(tool_opts *o, const char *cmd, const char *name, const char *v)
{
    flce_problem *p = &o->problem;
    int64_t n;
    if (!strcmp(name, "arch")) {
        o->sm = spec_parse_arch(v);
        if (!o->sm) tool_misuse(cmd, "--arch '%s': unknown (sm_80, sm_86, sm_87, sm_89, sm_90a, sm_100a, sm_120)", v);
        return o->sm ? 1 : -1;
    }
    if (!strcmp(name, "dtype")) {
        if (parse_dtype(v, &p->dtype)) return 1;
        return tool_misuse(cmd, "--dtype '%s': use bf16, f16 or f32", v), -1;
    }
    if (!strcmp(name, "reduction")) {
        if (parse_reduction(v, &p->reduction)) return 1;
        return tool_misuse(cmd, "--reduction '%s': use mean, sum or none", v), -1;
    }
    if (!strcmp(name, "tokens")) {
        if (!tool_int(cmd, name, v, 1, INT32_MAX, &n)) return -1;
        return p->tokens = n, 1;
    }
    if (!strcmp(name, "hidden")) {
        if (!tool_int(cmd, name, v, 8, 1 << 20, &n)) return -1;
        if (n % 8) return tool_misuse(cmd, "--hidden '%s': must be a multiple of 8", v), -1;
        return p->hidden = n, 1;
    }
    if (!strcmp(name, "vocab")) {
        if (!tool_int(cmd, name, v, 1, 8000000, &n)) return -1;
        return p->vocab_shard = n, 1;
    }
    if (!strcmp(name, "labels")) {
        if (strcmp(v, "32") && strcmp(v, "64")) return tool_misuse(cmd, "--labels '%s': use 32 or 64", v), -1;
        return p->label_bits = atoi(v), 1;
    }
    if (!strcmp(name, "budget-mib")) { /* 0: the library's default */
        if (!tool_int(cmd, name, v, 0, INT64_C(1) << 30, &n)) return -1;
        return p->memory_budget = (uint64_t)n << 20, 1;
    }
    if (!strcmp(name, "softcap")) return set_float(cmd, name, v, 0, "at least 0 (0: off)", &p->softcap);
    if (!strcmp(name, "temperature"))
        return set_float(cmd, name, v, FLT_MIN, "greater than 0 (at least 1.2e-38)", &p->temperature);
    if (!strcmp(name, "smoothing")) {
        double e;
        if (!tool_real(cmd, name, v, 0, 0.99999994, "in [0, 1)", &e)) return -1;
        return p->label_smoothing = (float)e, 1;
    }
    if (!strcmp(name, "z-loss")) return set_float(cmd, name, v, 0, "at least 0", &p->z_loss);
    return 0;
}

int tool_parse_common(tool_opts *o, int argc, char **argv, int i)
{
    if (i + 1 >= argc || strncmp(argv[i], "--", 2)) return 0;
    int r = tool_set_common(o, "gen", argv[i] + 2, argv[i + 1]);
    return r > 0 ? 2 : r;
}

int tool_validate(const char *cmd, const flce_problem *p)
{
    if (flce_problem_validate(p) == FLCE_OK) return TOOL_EXIT_OK;
    return tool_misuse(cmd, "%s", flce_last_error());
}

/* ---- flce gen ------------------------------------------------------------------------------ */

static int parse_role(const char *s)
{
    for (int r = ROLE_LOGITS; r <= ROLE_ROWOPS; r++)
        if (!strcmp(s, spec_role_name((spec_role)r))) return r;
    return -2;
}

static void gen_usage(FILE *f)
{
    fprintf(f,
            "usage: flce gen [options]\n"
            "Prints the CUDA source NVRTC compiles for the kernels of one problem: the exact text, with\n"
            "a comment at its top saying how to compile it alone with nvcc. No GPU needed.\n"
            "\n"
            "Options (default in brackets):\n"
            "  --role R          only one kernel: logits, dh, dw or rowops [every kernel of the call]\n"
            "  --compile         compile them (NVRTC, through the disk cache) and print cubin sizes\n"
            "                    and compile times instead of the source\n"
            "  --typical         the kernels of a call asking for loss, lse, dH and dW [every output,\n"
            "                    entropy and argmax included]\n"
            "  --arch A          target GPU: sm_80, sm_86, sm_87, sm_89, sm_90a, sm_100a, sm_120 [sm_90a]\n"
            "  --dtype T         bf16, f16 or f32 [bf16]\n"
            "  --tokens N        tokens N [4096]\n"
            "  --hidden D        hidden size D, a multiple of 8 [4096]\n"
            "  --vocab V         vocabulary (shard) size V [32768]\n"
            "  --labels B        label width in bits: 32 or 64 [32]\n"
            "  --reduction R     mean, sum or none [mean]\n"
            "  --budget-mib M    memory budget for stored logits, MiB [0: the library's default]\n"
            "  -h, --help        this text\n"
            "\n"
            "Examples:\n"
            "  flce gen --role logits --arch sm_90a > logits.cu\n"
            "  flce gen --compile --tokens 8192 --hidden 4096 --vocab 128256\n"
            "\n"
            "Exit status: 0 done, 1 a kernel failed to generate or compile, 2 a usage error.\n");
}

static const struct option gen_options[] = {
    {"help", no_argument, NULL, 'h'},
    {"role", required_argument, NULL, 'r'},
    {"compile", no_argument, NULL, 'c'},
    {"typical", no_argument, NULL, 't'},
    TOOL_PROBLEM_OPT("arch"),
    TOOL_PROBLEM_OPT("dtype"),
    TOOL_PROBLEM_OPT("tokens"),
    TOOL_PROBLEM_OPT("hidden"),
    TOOL_PROBLEM_OPT("vocab"),
    TOOL_PROBLEM_OPT("labels"),
    TOOL_PROBLEM_OPT("reduction"),
    TOOL_PROBLEM_OPT("budget-mib"),
    {NULL, 0, NULL, 0},
};

static int gen_one(const kernel_spec *s, int compile)
{
    char summary[256];
    spec_summary(s, summary, sizeof summary);
    if (!compile) {
        char *src = NULL;
        if (emit_source(s, &src) != FLCE_OK) {
            fprintf(stderr, "flce gen: %s\n", flce_last_error());
            return 1;
        }
        fputs(src, stdout);
        free(src);
        return 0;
    }
    jit_result jr;
    if (jit_build(s, &jr) != FLCE_OK) {
        fprintf(stderr, "flce gen: %s\n", flce_last_error());
        return 1;
    }
    printf("%-8s %7zu-byte cubin  %7.1f ms  %s\n", jr.origin == JIT_DISK_HIT ? "cached" : "compiled",
           jr.len, jr.ms, summary);
    free(jr.cubin);
    return 0;
}

int cmd_gen(int argc, char **argv)
{
    tool_opts o;
    tool_opts_init(&o);
    int typical = 0;
    tool_cli c;
    tool_cli_start(&c, "gen", argc, argv, gen_options);
    for (int v; (v = tool_next(&c)) != TOOL_NEXT_END;) {
        switch (v) {
        case TOOL_NEXT_HELP: gen_usage(stdout); return TOOL_EXIT_OK;
        case TOOL_NEXT_BAD: return TOOL_EXIT_USAGE;
        case TOOL_NEXT_WORD: return tool_misuse(c.cmd, "unexpected argument '%s'", c.arg);
        case 'c': o.compile = 1; break;
        case 't': typical = 1; break;
        case 'r':
            o.role = parse_role(c.arg);
            if (o.role == -2) return tool_misuse(c.cmd, "--role '%s': use logits, dh, dw or rowops", c.arg);
            break;
        default:
            if (tool_set_common(&o, c.cmd, c.name, c.arg) <= 0) return TOOL_EXIT_USAGE;
        }
    }
    if (tool_validate(c.cmd, &o.problem)) return TOOL_EXIT_USAGE;
    /* --typical: the kernels of a call asking for loss, lse, dH and dW only (no entropy or argmax,
     * which select other variants); without it, the worst case: every output. */
    static const char mark;
    flce_tensors t;
    flce_tensors_init(&t);
    t.loss = t.lse = (float *)(uintptr_t)&mark;
    t.grad_hidden = t.grad_weight = (void *)(uintptr_t)&mark;
    plan pl;
    if (plan_make(&o.problem, FLCE_OP_LOSS_AND_GRAD, o.sm, 132, typical ? &t : NULL, &pl) != FLCE_OK)
        return tool_misuse(c.cmd, "%s", flce_last_error());
    /* and recompute's dZ-writing logits pass when the plan has one */
    const kernel_spec *specs[] = {&pl.logits, &pl.dh, &pl.dw, &pl.rowops, &pl.logits_dz};
    int rc = 0;
    for (int r = 0; r < 4 + pl.fused_dz && !rc; r++)
        if (o.role < 0 || o.role == (int)specs[r]->role) rc = gen_one(specs[r], o.compile);
    return rc;
}
