/* test_api.c — the public API's argument checks and error messages, without a GPU: every bad
 * problem field gets its own status and a message naming it; versioned structs; NULL handling;
 * a machine without a driver gets FLCE_ERR_NO_DRIVER (or a context when a GPU is present). */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "flce.h"

static flce_problem good(void)
{
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 1024, p.hidden = 4096, p.vocab_shard = 32000;
    return p;
}

static int says(const char *needle) { return strstr(flce_last_error(), needle) != NULL; }

static void defaults_are_those_of_the_header(void)
{
    flce_problem p;
    memset(&p, 0x5a, sizeof p);
    flce_problem_init(&p);
    CHECK(p.struct_size == sizeof p && p.api_version == FLCE_API_VERSION);
    CHECK(p.dtype == FLCE_DTYPE_BF16 && p.label_bits == 32 && p.reduction == FLCE_REDUCTION_MEAN);
    CHECK(p.ignore_index == -100 && p.temperature == 1.0f && p.tp_size == 1 && p.memory_budget == 0);
    flce_tensors t;
    memset(&t, 0x5a, sizeof t);
    flce_tensors_init(&t);
    CHECK(t.struct_size == sizeof t && !t.hidden && !t.workspace);
    CHECK(flce_problem_validate(NULL) == FLCE_ERR_INVALID_ARGUMENT && says("problem"));
    flce_problem ok = good();
    CHECK(flce_problem_validate(&ok) == FLCE_OK);
}

typedef struct bad_case {
    const char *field_message; /* what the message must contain */
    flce_status want;
    void (*mutate)(flce_problem *);
} bad_case;

#define MUT(name, body) static void name(flce_problem *p) { body; }
MUT(zero_tokens, p->tokens = 0)
MUT(neg_tokens, p->tokens = -3)
MUT(hidden_not_8, p->hidden = 1000 + 2)
MUT(hidden_zero, p->hidden = 0)
MUT(vocab_zero, p->vocab_shard = 0)
MUT(offset_neg, p->vocab_offset = -1)
MUT(shard_past_total, (p->vocab_offset = 10, p->vocab_total = 32005))
MUT(bad_dtype, p->dtype = (flce_dtype)7)
MUT(bad_label_bits, p->label_bits = 16)
MUT(bad_reduction, p->reduction = (flce_reduction)9)
MUT(smoothing_neg, p->label_smoothing = -0.1f)
MUT(smoothing_one, p->label_smoothing = 1.0f)
MUT(zloss_neg, p->z_loss = -1e-4f)
MUT(softcap_neg, p->softcap = -30.f)
MUT(temperature_zero, p->temperature = 0.f)
MUT(tp_rank_out, (p->tp_size = 2, p->tp_rank = 2, p->vocab_total = 64000))
MUT(bias_two, p->has_bias = 2)
MUT(bad_strategy, p->strategy = (flce_strategy)11)
MUT(struct_too_small, p->struct_size = 8)
MUT(struct_newer, p->struct_size = sizeof(flce_problem) + 64)
MUT(weights_two, p->has_class_weights = 2)
MUT(accumulate_three, p->accumulate_grad_weight = 3)
MUT(softcap_inf, p->softcap = 1.0f / 0.0f)
MUT(tp_no_total, (p->tp_size = 2, p->tp_rank = 1, p->vocab_total = 0))
MUT(sp_without_tp, p->sequence_parallel = 1)
MUT(tp_huge, (p->tp_size = 5000, p->tp_rank = 0, p->vocab_total = 64000))
MUT(sp_two, (p->tp_size = 2, p->vocab_total = 64000, p->sequence_parallel = 2))
MUT(tokens_huge, p->tokens = (int64_t)1 << 40)
MUT(hidden_huge, p->hidden = (int64_t)1 << 30)
MUT(temperature_tiny, p->temperature = 1e-39f)
MUT(offset_overflows, (p->vocab_offset = INT64_MAX - 10, p->vocab_total = INT64_MAX))
MUT(offset_max_total_zero, (p->vocab_offset = INT64_MAX, p->vocab_total = 0))

static void every_bad_field_is_named(void)
{
    const bad_case cases[] = {
        {"tokens=0", FLCE_ERR_INVALID_ARGUMENT, zero_tokens},
        {"tokens=-3", FLCE_ERR_INVALID_ARGUMENT, neg_tokens},
        {"hidden=1002", FLCE_ERR_INVALID_ARGUMENT, hidden_not_8},
        {"hidden=0", FLCE_ERR_INVALID_ARGUMENT, hidden_zero},
        {"vocab_shard=0", FLCE_ERR_INVALID_ARGUMENT, vocab_zero},
        {"vocab_offset=-1", FLCE_ERR_INVALID_ARGUMENT, offset_neg},
        {"vocab_total=32005", FLCE_ERR_INVALID_ARGUMENT, shard_past_total},
        {"dtype=7", FLCE_ERR_INVALID_ARGUMENT, bad_dtype},
        {"label_bits=16", FLCE_ERR_INVALID_ARGUMENT, bad_label_bits},
        {"reduction=9", FLCE_ERR_INVALID_ARGUMENT, bad_reduction},
        {"label_smoothing=-0.1", FLCE_ERR_INVALID_ARGUMENT, smoothing_neg},
        {"label_smoothing=1", FLCE_ERR_INVALID_ARGUMENT, smoothing_one},
        {"z_loss=-0.0001", FLCE_ERR_INVALID_ARGUMENT, zloss_neg},
        {"softcap=-30", FLCE_ERR_INVALID_ARGUMENT, softcap_neg},
        {"temperature=0", FLCE_ERR_INVALID_ARGUMENT, temperature_zero},
        {"tp_rank=2", FLCE_ERR_INVALID_ARGUMENT, tp_rank_out},
        {"has_bias=2", FLCE_ERR_INVALID_ARGUMENT, bias_two},
        {"strategy=11", FLCE_ERR_INVALID_ARGUMENT, bad_strategy},
        {"struct_size=8", FLCE_ERR_INVALID_ARGUMENT, struct_too_small},
        {"newer flce.h", FLCE_ERR_UNSUPPORTED, struct_newer},
        {"has_class_weights=2", FLCE_ERR_INVALID_ARGUMENT, weights_two},
        {"accumulate_grad_weight=3", FLCE_ERR_INVALID_ARGUMENT, accumulate_three},
        {"softcap=inf", FLCE_ERR_INVALID_ARGUMENT, softcap_inf},
        /* valid requests that this build does not implement yet: said, never silently wrong */
        {"vocab_total=0: with tp_size=2", FLCE_ERR_INVALID_ARGUMENT, tp_no_total},
        {"sequence_parallel=1: needs tp_size > 1", FLCE_ERR_INVALID_ARGUMENT, sp_without_tp},
        {"sequence_parallel=2", FLCE_ERR_INVALID_ARGUMENT, sp_two},
        {"tp_size=5000: at most 4096", FLCE_ERR_UNSUPPORTED, tp_huge},
        /* sizes whose workspace arithmetic would overflow (found by fuzz_problem) */
        {"tokens=1099511627776: at most", FLCE_ERR_UNSUPPORTED, tokens_huge},
        {"hidden=1073741824: at most", FLCE_ERR_UNSUPPORTED, hidden_huge},
        {"finite fp32 reciprocal", FLCE_ERR_INVALID_ARGUMENT, temperature_tiny},
        {"exceeds vocab_total", FLCE_ERR_INVALID_ARGUMENT, offset_overflows},
        {"vocab_offset", FLCE_ERR_INVALID_ARGUMENT, offset_max_total_zero},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        flce_problem p = good();
        cases[i].mutate(&p);
        flce_status st = flce_problem_validate(&p);
        CHECKF(st == cases[i].want && says(cases[i].field_message), "case '%s': got %s, '%s'",
               cases[i].field_message, flce_status_name(st), flce_last_error());
    }
}

static void every_option_together_validates(void)
{
    flce_problem p = good();
    p.label_smoothing = 0.1f, p.z_loss = 1e-4f, p.softcap = 30.f, p.temperature = 0.7f;
    p.has_bias = 1, p.has_class_weights = 1, p.accumulate_grad_weight = 1, p.accumulate_grad_hidden = 1;
    p.strategy = FLCE_STRATEGY_RECOMPUTE, p.label_bits = 64, p.reduction = FLCE_REDUCTION_NONE;
    CHECKF(flce_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
}

/* A caller built against the first layout (ending at memory_budget) still works: the fields added
 * since take their defaults. */
static void first_layout_callers_get_defaults(void)
{
    flce_problem p = good();
    p.has_class_weights = 7; /* garbage past the old struct's end must not be read */
    p.struct_size = (uint32_t)(offsetof(flce_problem, memory_budget) + sizeof p.memory_budget);
    CHECKF(flce_problem_validate(&p) == FLCE_OK, "%s", flce_last_error());
}

static void vocab_total_zero_means_offset_plus_shard(void)
{
    flce_problem p = good();
    p.vocab_offset = 100, p.vocab_total = 0;
    CHECK(flce_problem_validate(&p) == FLCE_OK);
}

static void null_context_and_outputs_are_named(void)
{
    flce_problem p = good();
    flce_tensors t;
    flce_tensors_init(&t);
    uint64_t bytes = 0;
    CHECK(flce_forward(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
    CHECK(flce_loss_and_grad(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
    CHECK(flce_backward(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
    CHECK(flce_workspace_size(NULL, &p, FLCE_OP_FORWARD, &bytes) == FLCE_ERR_INVALID_ARGUMENT);
    flce_strategy strategy;
    CHECK(flce_strategy_of(NULL, &p, FLCE_OP_LOSS_AND_GRAD, &strategy) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
    CHECK(flce_check(NULL, NULL) == FLCE_ERR_INVALID_ARGUMENT);
    CHECK(flce_scale_gradients(NULL, &p, &t, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
    CHECK(flce_context_create(0, NULL) == FLCE_ERR_INVALID_ARGUMENT && says("out"));
    CHECK(flce_context_destroy(NULL) == FLCE_OK);
    int sm;
    CHECK(flce_context_arch(NULL, &sm) == FLCE_ERR_INVALID_ARGUMENT);
    flce_context_info info;
    flce_context_info_init(&info);
    CHECK(info.struct_size == sizeof info);
    CHECK(flce_context_info_get(NULL, &info) == FLCE_ERR_INVALID_ARGUMENT && says("ctx"));
}

/* flce_library_info_get: its versioned struct is checked like flce_problem's, and each line says
 * something whether or not NVRTC and NCCL are there (no GPU needed). */
static void library_info_names_each_library(void)
{
    static flce_library_info lib;
    CHECK(flce_library_info_get(NULL) == FLCE_ERR_INVALID_ARGUMENT && says("info"));
    memset(&lib, 0, sizeof lib);
    CHECK(flce_library_info_get(&lib) == FLCE_ERR_INVALID_ARGUMENT && says("info.struct_size=0") &&
          says("flce_library_info_init"));
    flce_library_info_init(&lib);
    lib.struct_size++;
    CHECK(flce_library_info_get(&lib) == FLCE_ERR_UNSUPPORTED && says("newer flce.h"));
    flce_library_info_init(&lib);
    CHECK(flce_library_info_get(&lib) == FLCE_OK);
    CHECK(lib.nvrtc[0] != '\0' && lib.nccl[0] != '\0');
}

static void context_without_a_driver_says_so(void)
{
    flce_context *ctx = NULL;
    flce_status st = flce_context_create(0, &ctx);
    if (st == FLCE_OK) { /* a GPU machine: the context works and reports its arch */
        int sm = 0;
        CHECK(flce_context_arch(ctx, &sm) == FLCE_OK && sm >= 80);
        flce_context_info info;
        flce_context_info_init(&info);
        CHECK(flce_context_info_get(ctx, &info) == FLCE_OK && info.sm == sm && info.device == 0 &&
              info.num_sms > 0 && info.memory_bytes > 0 && info.name[0]);
        info.struct_size = 4;
        CHECK(flce_context_info_get(ctx, &info) == FLCE_ERR_INVALID_ARGUMENT && says("info.struct_size=4"));
        flce_context *other = NULL;
        CHECK(flce_context_create(9999, &other) == FLCE_ERR_NO_DEVICE && !other && says("device=9999"));
        flce_context_destroy(ctx);
        return;
    }
    CHECKF(st == FLCE_ERR_NO_DRIVER || st == FLCE_ERR_NO_DEVICE, "got %s", flce_status_name(st));
    CHECK(ctx == NULL);
    CHECK(says("driver") || says("device"));
}

static void status_names_cover_every_code(void)
{
    for (int s = FLCE_OK; s <= FLCE_ERR_INTERNAL; s++)
        CHECK(strncmp(flce_status_name((flce_status)s), "FLCE_", 5) == 0 &&
              strcmp(flce_status_name((flce_status)s), "FLCE_ERR_UNKNOWN") != 0);
    CHECK(strcmp(flce_status_name((flce_status)999), "FLCE_ERR_UNKNOWN") == 0);
    CHECK(strcmp(flce_version(), FLCE_VERSION_STRING) == 0);
}

/* Sets this thread's message to one naming "tokens" (a failed validate). */
static void fail_on_tokens(void)
{
    flce_problem p = good();
    p.tokens = 0;
    flce_problem_validate(&p);
}

typedef struct thread_view {
    char seen_at_start[256]; /* this thread's message before it made any call */
    char own[256];           /* after its own failure */
} thread_view;

static void *other_thread(void *arg)
{
    thread_view *v = arg;
    snprintf(v->seen_at_start, sizeof v->seen_at_start, "%s", flce_last_error());
    flce_context_create(0, NULL); /* fails: "out: NULL ..." */
    snprintf(v->own, sizeof v->own, "%s", flce_last_error());
    return NULL;
}

/* A message set in one thread is not visible in another, and the other's failure does not replace
 * it (joined before checking: what is checked is where the message lives, not a race). */
static void messages_are_per_thread(void)
{
    fail_on_tokens();
    thread_view v = {"", ""};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, other_thread, &v) == 0 && pthread_join(th, NULL) == 0);
    CHECKF(v.seen_at_start[0] == '\0', "a new thread sees '%s'", v.seen_at_start);
    CHECKF(strstr(v.own, "out") && !strstr(v.own, "tokens"), "the other thread's message: '%s'", v.own);
    CHECKF(says("tokens") && !says("out: NULL"), "this thread's message became '%s'", flce_last_error());
    /* a later failure on this thread replaces the message */
    flce_tensors t;
    flce_tensors_init(&t);
    flce_problem p = good();
    CHECK(flce_forward(NULL, &p, &t, NULL) != FLCE_OK && says("ctx") && !says("tokens"));
}

/* A successful call made after a failure, and whether flce_last_error() is "" after it. */
typedef struct success_call {
    const char *name;
    flce_status (*call)(flce_context *ctx); /* ctx: NULL unless the machine has a GPU */
    int needs_gpu;
} success_call;

static flce_status call_validate(flce_context *ctx)
{
    (void)ctx;
    flce_problem p = good();
    return flce_problem_validate(&p);
}

static flce_status call_tp_stats_bytes(flce_context *ctx)
{
    (void)ctx;
    flce_problem p = good();
    uint64_t bytes = 0;
    return flce_tp_stats_bytes(&p, &bytes);
}

static flce_status call_destroy_null(flce_context *ctx)
{
    (void)ctx;
    return flce_context_destroy(NULL);
}

static flce_status call_context_create(flce_context *ctx)
{
    (void)ctx;
    flce_context *c = NULL;
    flce_status st = flce_context_create(0, &c);
    flce_context_destroy(c); /* sets no message, so what is checked is create's */
    return st;
}

static flce_status call_arch(flce_context *ctx)
{
    int sm = 0;
    return flce_context_arch(ctx, &sm);
}

static flce_status call_workspace_size(flce_context *ctx)
{
    flce_problem p = good();
    uint64_t bytes = 0;
    return flce_workspace_size(ctx, &p, FLCE_OP_LOSS_AND_GRAD, &bytes);
}

static flce_status call_strategy_of(flce_context *ctx)
{
    flce_problem p = good();
    flce_strategy s;
    return flce_strategy_of(ctx, &p, FLCE_OP_LOSS_AND_GRAD, &s);
}

static flce_status call_check(flce_context *ctx) { return flce_check(ctx, NULL); }

/* flce.h: flce_last_error() is "the message of the last failed call on this thread". After a
 * failure, each successful call must clear it, or a caller that checks the message (a binding
 * that raises when it is non-empty) reports the old failure again. The calls that need a device
 * run where flce_context_create works. */
static void messages_are_cleared_by_success(void)
{
    static const success_call calls[] = {
        {"flce_problem_validate", call_validate, 0},
        {"flce_tp_stats_bytes", call_tp_stats_bytes, 0},
        {"flce_context_destroy(NULL)", call_destroy_null, 0},
        {"flce_context_create", call_context_create, 1},
        {"flce_context_arch", call_arch, 1},
        {"flce_workspace_size", call_workspace_size, 1},
        {"flce_strategy_of", call_strategy_of, 1},
        {"flce_check", call_check, 1},
    };
    flce_context *ctx = NULL;
    int gpu = flce_context_create(0, &ctx) == FLCE_OK;
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const success_call *c = &calls[i];
        if (c->needs_gpu && !gpu) continue;
        fail_on_tokens();
        flce_status st = c->call(ctx);
        CHECKF(st == FLCE_OK, "%s: %s", c->name, flce_status_name(st));
        CHECKF(flce_last_error()[0] == '\0', "%s succeeded but left the message '%s'", c->name, flce_last_error());
    }
    flce_context_destroy(ctx);
}

int main(void)
{
    RUN(defaults_are_those_of_the_header);
    RUN(every_bad_field_is_named);
    RUN(vocab_total_zero_means_offset_plus_shard);
    RUN(every_option_together_validates);
    RUN(first_layout_callers_get_defaults);
    RUN(null_context_and_outputs_are_named);
    RUN(context_without_a_driver_says_so);
    RUN(library_info_names_each_library);
    RUN(status_names_cover_every_code);
    RUN(messages_are_per_thread);
    RUN(messages_are_cleared_by_success);
    FINISH();
}
