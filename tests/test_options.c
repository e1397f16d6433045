/* test_options.c — a context's settings as data (issue 42 item 4, include/flce.h flce_options):
 * flce_options_init takes the environment's values, a field out of range is named before any
 * device is touched, and — one level below the context, which needs a GPU — the settings a context
 * resolves (ctx_settings_from, ctx_jit) send its kernels to its own cache directory and read-only
 * layers, bound its compile threads, route its log lines to its callback (also from those threads),
 * and under compile_in_call = 0 make a call that lacks a kernel FLCE_ERR_NOT_READY instead of
 * compiling (with the kernel compiling in the background into the context's directory). No GPU
 * needed; tests/test_options_gpu.c does the same through real contexts. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "check.h"
#include "config.h"
#include "context.h"
#include "jit.h"
#include "log.h"
#include "nvrtc_compile.h"
#include "plan.h"
#include "tmpdir.h"

/* Three distinct kernels on sm_90a: the row kernels of three small loss-and-grad calls (bf16 mean,
 * fp16 sum, bf16 none). Row kernels, not GEMMs: each compiles in about a second, and the tests only
 * need distinct entries (the GEMMs made this test 40 s of CI's 2 cores, 60 s under ASan). */
static void call_specs(kernel_spec *s)
{
    static const flce_dtype dt[3] = {FLCE_DTYPE_BF16, FLCE_DTYPE_F16, FLCE_DTYPE_BF16};
    static const flce_reduction red[3] = {FLCE_REDUCTION_MEAN, FLCE_REDUCTION_SUM, FLCE_REDUCTION_NONE};
    for (int i = 0; i < 3; i++) {
        flce_problem p;
        flce_problem_init(&p);
        p.tokens = 300, p.hidden = 136, p.vocab_shard = 1001, p.dtype = dt[i], p.reduction = red[i];
        plan pl;
        CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 90, 132, NULL, &pl) == FLCE_OK);
        s[i] = pl.rowops;
    }
}

static uint64_t entries(const char *dir)
{
    cache_stats st;
    return cache_stat(dir, &st) == FLCE_OK ? st.entries : 0;
}

/* options with a cache directory of their own (and no read-only layers) resolved as a context would. */
static void settings_in(ctx_settings *s, const char *dir, flce_options *o)
{
    o->cache_dir = dir, o->cache_ro = "";
    CHECKF(ctx_settings_from(o, s) == FLCE_OK, "%s", flce_last_error());
}

/* The one case here that sets variables: what is under test is that flce_options_init takes the
 * values the process's environment holds (include/flce.h, the fields' "init"). */
static void options_init_takes_the_environment(void)
{
    setenv("FLCE_PREFETCH", "off", 1), setenv("FLCE_COMPILE_THREADS", "3", 1);
    setenv("FLCE_COMPILE_IN_CALL", "no", 1), setenv("FLCE_LOG", "info", 1);
    config_reload();
    flce_options o;
    memset(&o, 0x5a, sizeof o);
    flce_options_init(&o);
    unsetenv("FLCE_PREFETCH"), unsetenv("FLCE_COMPILE_THREADS"), unsetenv("FLCE_COMPILE_IN_CALL"), unsetenv("FLCE_LOG");
    config_reload();
    CHECK(o.struct_size == sizeof o && !o.cache_dir && !o.cache_ro && !o.log && !o.log_user);
    CHECKF(o.log_level == FLCE_LOG_INFO && o.compile_threads == 3 && !o.background_compile && !o.compile_in_call,
           "log_level %d, compile_threads %d, background_compile %d, compile_in_call %d", o.log_level,
           o.compile_threads, o.background_compile, o.compile_in_call);
    flce_options_init(&o);
    CHECK(o.log_level == FLCE_LOG_OFF && o.compile_threads == 8 && o.background_compile && o.compile_in_call);
    flce_options_init(NULL); /* no crash */
}

/* Each field out of range is FLCE_ERR_INVALID_ARGUMENT naming it, before the driver is looked for
 * (so the same on a machine without one); valid options get as far as the device. */
static void out_of_range_options_are_named_before_any_device(void)
{
    static char long_dir[CACHE_PATH_MAX + 10];
    memset(long_dir, 'a', sizeof long_dir - 1);
    long_dir[0] = '/';
    static const struct {
        const char *field;
        int value;
        const char *words;
    } bad[] = {{"log_level", 4, "options.log_level=4"},        {"log_level", -2, "options.log_level=-2"},
               {"compile_threads", 0, "options.compile_threads=0"}, {"compile_threads", 9, "options.compile_threads=9"},
               {"background_compile", 2, "options.background_compile=2"},
               {"compile_in_call", -1, "options.compile_in_call=-1"}, {"struct_size", 4, "options.struct_size=4"},
               {"cache_dir", 0, "options.cache_dir"},               {"cache_ro", 0, "options.cache_ro"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        flce_options o;
        flce_options_init(&o);
        if (!strcmp(bad[i].field, "log_level")) o.log_level = bad[i].value;
        if (!strcmp(bad[i].field, "compile_threads")) o.compile_threads = bad[i].value;
        if (!strcmp(bad[i].field, "background_compile")) o.background_compile = bad[i].value;
        if (!strcmp(bad[i].field, "compile_in_call")) o.compile_in_call = bad[i].value;
        if (!strcmp(bad[i].field, "struct_size")) o.struct_size = (uint32_t)bad[i].value;
        if (!strcmp(bad[i].field, "cache_dir")) o.cache_dir = long_dir;
        if (!strcmp(bad[i].field, "cache_ro")) o.cache_ro = long_dir;
        flce_context *ctx = (flce_context *)&o; /* must become NULL */
        flce_status st = flce_context_create_ex(0, &o, &ctx);
        CHECKF(st == FLCE_ERR_INVALID_ARGUMENT && !ctx && strstr(flce_last_error(), bad[i].words), "%s: %s: %s",
               bad[i].words, flce_status_name(st), flce_last_error());
    }
    flce_options o;
    flce_options_init(&o);
    o.struct_size = sizeof o + 8;
    CHECK(flce_context_create_ex(0, &o, &(flce_context *){NULL}) == FLCE_ERR_UNSUPPORTED);
    CHECK(flce_context_create_ex(0, NULL, NULL) == FLCE_ERR_INVALID_ARGUMENT);
    flce_options_init(&o);
    flce_context *ctx = NULL;
    flce_status st = flce_context_create_ex(0, &o, &ctx); /* no driver here: NO_DRIVER; a GPU: OK */
    CHECKF(st != FLCE_ERR_INVALID_ARGUMENT && st != FLCE_ERR_UNSUPPORTED, "%s: %s", flce_status_name(st), flce_last_error());
    flce_context_destroy(ctx);
    CHECK(!strcmp(flce_status_name(FLCE_ERR_NOT_READY), "FLCE_ERR_NOT_READY"));
}

/* NULL options are the process's settings, the environment's at each use; given ones are fixed. */
static void null_options_follow_the_environment(void)
{
    ctx_settings s;
    CHECK(ctx_settings_from(NULL, &s) == FLCE_OK);
    jit_settings js = ctx_jit(&s);
    CHECK(!js.cache_dir && !js.cache_ro && js.threads == 0 && js.background == -1 && s.log.level == -1 && !s.log.fn);
    CHECK(s.compile_in_call == config_get()->compile_in_call);
    flce_options o;
    flce_options_init(&o);
    o.cache_dir = "/x/y", o.cache_ro = "/a:/b", o.compile_threads = 2, o.background_compile = 0, o.log_level = 3;
    CHECK(ctx_settings_from(&o, &s) == FLCE_OK);
    js = ctx_jit(&s);
    CHECK(!strcmp(js.cache_dir, "/x/y") && !strcmp(js.cache_ro, "/a:/b") && js.threads == 2 && js.background == 0);
    CHECK(s.log.level == 3);
    o.cache_ro = "";
    CHECK(ctx_settings_from(&o, &s) == FLCE_OK);
    js = ctx_jit(&s);
    CHECK(js.cache_ro && !*js.cache_ro); /* none, whatever FLCE_CACHE_RO says */
}

/* The same kernel built under two contexts' settings lands in each one's directory (compiled in
 * each: neither sees the other's), and not in the process's FLCE_CACHE_DIR; NULL settings still
 * use FLCE_CACHE_DIR. */
static void two_contexts_cache_into_their_own_directories(void)
{
    kernel_spec s[3];
    call_specs(s);
    char a[TEST_PATH_MAX], b[TEST_PATH_MAX], env[TEST_PATH_MAX];
    make_tmpdir_named(a, "flce-opt-a"), make_tmpdir_named(b, "flce-opt-b"), make_tmpdir_named(env, "flce-opt-env");
    config_set(CONFIG_CACHE_DIR, env);
    flce_options o;
    flce_options_init(&o);
    ctx_settings sa, sb;
    settings_in(&sa, a, &o), settings_in(&sb, b, &o);
    jit_settings ja = ctx_jit(&sa), jb = ctx_jit(&sb);
    jit_result r;
    CHECKF(jit_build_with(&ja, &s[0], &r) == FLCE_OK && r.origin == JIT_COMPILED, "%s", flce_last_error());
    free(r.cubin);
    CHECK(jit_build_with(&jb, &s[0], &r) == FLCE_OK && r.origin == JIT_COMPILED);
    free(r.cubin);
    CHECK(jit_build_with(&ja, &s[0], &r) == FLCE_OK && r.origin == JIT_DISK_HIT);
    free(r.cubin);
    CHECKF(entries(a) == 1 && entries(b) == 1 && entries(env) == 0, "entries: a %llu, b %llu, FLCE_CACHE_DIR %llu",
           (unsigned long long)entries(a), (unsigned long long)entries(b), (unsigned long long)entries(env));
    CHECK(jit_build_with(NULL, &s[0], &r) == FLCE_OK && r.origin == JIT_COMPILED && entries(env) == 1);
    free(r.cubin);
    config_clear(CONFIG_CACHE_DIR);
    remove_tree(a), remove_tree(b), remove_tree(env);
}

/* A context's read-only layers are its own: given, they are searched whatever FLCE_CACHE_RO says;
 * "" searches none; NULL (not given) takes FLCE_CACHE_RO. */
static void read_only_layers_are_the_contexts(void)
{
    kernel_spec s[3];
    call_specs(s);
    char full[TEST_PATH_MAX], empty[TEST_PATH_MAX];
    make_tmpdir_named(full, "flce-opt-ro"), make_tmpdir_named(empty, "flce-opt-rw");
    flce_options o;
    flce_options_init(&o);
    ctx_settings fill, with, without, from_env;
    settings_in(&fill, full, &o);
    jit_settings j = ctx_jit(&fill);
    jit_result r;
    CHECK(jit_build_with(&j, &s[0], &r) == FLCE_OK && r.cubin);
    free(r.cubin);
    o.cache_dir = empty, o.cache_ro = full;
    CHECK(ctx_settings_from(&o, &with) == FLCE_OK);
    o.cache_ro = "";
    CHECK(ctx_settings_from(&o, &without) == FLCE_OK);
    o.cache_ro = NULL;
    CHECK(ctx_settings_from(&o, &from_env) == FLCE_OK);
    config_set(CONFIG_CACHE_RO, full);
    j = ctx_jit(&with);
    CHECK(jit_lookup_with(&j, &s[0], &r) == FLCE_OK && r.cubin && r.origin == JIT_DISK_HIT);
    free(r.cubin);
    j = ctx_jit(&without);
    CHECK(jit_lookup_with(&j, &s[0], &r) == FLCE_OK && !r.cubin);
    j = ctx_jit(&from_env);
    CHECK(jit_lookup_with(&j, &s[0], &r) == FLCE_OK && r.cubin);
    free(r.cubin);
    config_set(CONFIG_CACHE_RO, NULL);
    CHECK(jit_lookup_with(&j, &s[0], &r) == FLCE_OK && !r.cubin);
    CHECK(entries(empty) == 0 && entries(full) == 1);
    remove_tree(full), remove_tree(empty);
}

/* The threads that wrote "compiled in" lines through one sink, and the lines' levels. */
typedef struct seen_lines {
    pthread_mutex_t lock;
    pthread_t thread[16];
    int threads, compiled, infos, others;
} seen_lines;

static void note_line(void *user, int level, const char *line)
{
    seen_lines *s = user;
    pthread_mutex_lock(&s->lock);
    if (level == FLCE_LOG_INFO) s->infos++;
    else s->others++;
    if (strstr(line, ": compiled in ")) {
        s->compiled++;
        int known = 0;
        for (int i = 0; i < s->threads; i++) known |= pthread_equal(s->thread[i], pthread_self());
        if (!known && s->threads < 16) s->thread[s->threads++] = pthread_self();
    }
    pthread_mutex_unlock(&s->lock);
}

/* compile_threads bounds one build's threads, and the context's log callback gets the lines of all
 * of them (each on the thread that compiled). */
static void compile_threads_bound_a_build_and_log_through_the_context(void)
{
    kernel_spec s[3];
    call_specs(s);
    const kernel_spec *ptr[3] = {&s[0], &s[1], &s[2]};
    for (int threads = 1; threads <= 3; threads += 2) {
        char dir[TEST_PATH_MAX];
        make_tmpdir_named(dir, "flce-opt-threads");
        seen_lines seen = {.lock = PTHREAD_MUTEX_INITIALIZER};
        flce_options o;
        flce_options_init(&o);
        o.compile_threads = threads, o.log = note_line, o.log_user = &seen, o.log_level = FLCE_LOG_INFO;
        ctx_settings cs;
        settings_in(&cs, dir, &o);
        jit_settings j = ctx_jit(&cs);
        jit_result r[3];
        log_sink was = log_sink_set(cs.log); /* as CTX_LOG_SCOPE does in each call */
        flce_status st = jit_build_many_with(&j, ptr, 3, r);
        log_sink_set(was);
        CHECKF(st == FLCE_OK, "%s", flce_last_error());
        for (int i = 0; i < 3; i++) free(r[i].cubin);
        CHECKF(seen.compiled == 3 && seen.threads == threads && seen.others == 0,
               "compile_threads=%d: %d compiled lines from %d threads, %d lines not info", threads, seen.compiled,
               seen.threads, seen.others);
        if (threads == 1) CHECK(seen.threads == 1 && pthread_equal(seen.thread[0], pthread_self()));
        CHECK(entries(dir) == 3);
        remove_tree(dir);
    }
}

static int scoped_warning(const flce_context *ctx)
{
    CTX_LOG_SCOPE(ctx);
    log_msg(LOG_WARN, "inside");
    return 1; /* the sink before comes back on the way out */
}

/* The sink's level filters; FLCE_LOG_FROM_ENV reads FLCE_LOG at each line; CTX_LOG_SCOPE puts the
 * thread's sink back on any return. */
static void a_contexts_log_level_and_callback_are_its_own(void)
{
    seen_lines seen = {.lock = PTHREAD_MUTEX_INITIALIZER};
    log_sink was = log_sink_set((log_sink){note_line, &seen, LOG_WARN});
    log_msg(LOG_INFO, "not at warn");
    log_msg(LOG_WARN, "at warn");
    CHECK(seen.infos == 0 && seen.others == 1);
    log_sink_set((log_sink){note_line, &seen, FLCE_LOG_FROM_ENV});
    config_set(CONFIG_LOG, NULL);
    log_msg(LOG_WARN, "FLCE_LOG unset");
    config_set(CONFIG_LOG, "info");
    log_msg(LOG_INFO, "FLCE_LOG=info");
    config_set(CONFIG_LOG, NULL);
    CHECK(seen.infos == 1 && seen.others == 1);
    log_sink_set(was);
    CHECK(log_sink_get().fn == NULL && log_sink_get().level == -1);

    flce_context *ctx = calloc(1, sizeof *ctx);
    flce_options o;
    flce_options_init(&o);
    o.log = note_line, o.log_user = &seen, o.log_level = FLCE_LOG_WARN;
    CHECK(ctx && ctx_settings_from(&o, &ctx->settings) == FLCE_OK);
    CHECK(scoped_warning(ctx) && seen.others == 2 && log_sink_get().fn == NULL);
    CHECK(scoped_warning(NULL) && seen.others == 2);
    free(ctx);
}

/* compile_in_call = 0: a call whose kernel is neither loaded nor in the context's cache gets
 * FLCE_ERR_NOT_READY with words that say what to do, and (background compiles on) the kernel then
 * compiles in the background into that cache; with background compiles off nothing is built.
 * (A zeroed context: ctx_kernels_many reaches no driver call before it answers.) */
static void a_context_that_never_compiles_in_a_call_says_not_ready(void)
{
    kernel_spec s[3];
    call_specs(s);
    const kernel_spec *one = &s[0];
    for (int background = 1; background >= 0; background--) {
        char dir[TEST_PATH_MAX];
        make_tmpdir_named(dir, "flce-opt-ready");
        flce_context *ctx = calloc(1, sizeof *ctx);
        flce_options o;
        flce_options_init(&o);
        o.compile_in_call = 0, o.background_compile = background;
        settings_in(&ctx->settings, dir, &o);
        CUfunction fns[1][CTX_MAX_KERNELS];
        flce_status st = ctx_kernels_many(ctx, &one, 1, fns);
        const char *msg = flce_last_error();
        CHECKF(st == FLCE_ERR_NOT_READY && strstr(msg, "compile_in_call = 0") && strstr(msg, "flce_prepare") &&
                   (!background == !strstr(msg, "compiling in the background")),
               "background %d: %s: %s", background, flce_status_name(st), msg);
        CHECK(ctx->n_modules == 0);
        CHECK(jit_prefetch_wait(300));
        jit_settings j = ctx_jit(&ctx->settings);
        jit_result r;
        CHECK(jit_lookup_with(&j, &s[0], &r) == FLCE_OK && !r.cubin == !background);
        free(r.cubin);
        CHECKF(entries(dir) == (uint64_t)background, "%llu entries", (unsigned long long)entries(dir));
        free(ctx->modules), free(ctx->aliases), free(ctx);
        remove_tree(dir);
    }
}

int main(void)
{
    /* As test_jit_parallel: NVRTC's own cache (where a driver is installed) off, so "compiled" is.
     * The driver's variable, not one of ours: only the environment reaches it. */
    setenv("CUDA_CACHE_DISABLE", "1", 1);
    config_get(); /* read (and logged) before the cases set FLCE_LOG */
    RUN(options_init_takes_the_environment);
    RUN(out_of_range_options_are_named_before_any_device);
    RUN(null_options_follow_the_environment);
    RUN(a_contexts_log_level_and_callback_are_its_own);
    if (nvrtc_load_error()) {
        printf("skip the compiling cases: %s\n", nvrtc_load_error());
        FINISH();
    }
    RUN(two_contexts_cache_into_their_own_directories);
    RUN(read_only_layers_are_the_contexts);
    RUN(compile_threads_bound_a_build_and_log_through_the_context);
    RUN(a_context_that_never_compiles_in_a_call_says_not_ready);
    FINISH();
}
