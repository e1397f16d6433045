/* test_threads.c — the library's process-wide state used from many threads at once (issue 15):
 * the NVRTC version text of every cache key, the dispatcher's tune table (loaded once, looked up
 * under a lock by every plan), the per-thread error message, and one spec built by several threads
 * at once through a fresh disk cache. Each case starts its threads together behind a barrier. The
 * checks here are what any build sees; the `tsan` preset (label `threads`) runs the same under
 * ThreadSanitizer, which is what sees an unsynchronized first use. No GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nvrtc.h>

#include "check.h"
#include "config.h"
#include "error.h"
#include "jit.h"
#include "nvrtc_compile.h"
#include "tmpdir.h"
#include "tune.h"

enum { THREADS = 16 };
#define DEVICE "NVIDIA H100 80GB HBM3"

typedef struct crowd {
    pthread_barrier_t start;
    void *(*fn)(void *arg, int index);
    void *arg;
    void *result[THREADS];
} crowd;

typedef struct crowd_member {
    crowd *c;
    int index;
} crowd_member;

static void *crowd_main(void *p)
{
    crowd_member *m = p;
    pthread_barrier_wait(&m->c->start);
    m->c->result[m->index] = m->c->fn(m->c->arg, m->index);
    return NULL;
}

/* Runs fn(arg, i) on n threads released together; result[i] holds what each returned. */
static void run_crowd(crowd *c, int n)
{
    pthread_t th[THREADS];
    crowd_member m[THREADS];
    CHECK(n <= THREADS && pthread_barrier_init(&c->start, NULL, (unsigned)n) == 0);
    for (int i = 0; i < n; i++) {
        m[i] = (crowd_member){c, i};
        CHECK(pthread_create(&th[i], NULL, crowd_main, &m[i]) == 0);
    }
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&c->start);
}

/* ---- nvrtc_version_text ------------------------------------------------------------------- */

static void *version_of(void *arg, int index)
{
    (void)arg, (void)index;
    return (void *)nvrtc_version_text();
}

/* Every thread's first call at once: one text, the version NVRTC reports, never a half-written
 * one. (Before issue 15 each first caller wrote the static text unsynchronized: a data race.) */
static void nvrtc_version_is_one_text_from_many_threads(void)
{
    crowd c = {.fn = version_of};
    run_crowd(&c, THREADS);
    int major = 0, minor = 0;
    CHECK(nvrtcVersion(&major, &minor) == NVRTC_SUCCESS);
    char want[32];
    snprintf(want, sizeof want, "%d.%d", major, minor);
    for (int i = 0; i < THREADS; i++) {
        const char *got = c.result[i];
        CHECKF(got && !strcmp(got, want), "thread %d: '%s', want '%s'", i, got ? got : "(null)", want);
        CHECK(got == c.result[0]);
    }
}

/* ---- the tune table under concurrent plans ------------------------------------------------ */

static tune_entry tuned_entry(void)
{
    tune_entry e;
    memset(&e, 0, sizeof e);
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 5000, p.hidden = 4096, p.vocab_shard = 32768;
    tune_key_make(&p, p.tokens, DEVICE, 80, &e.key);
    e.tile[0] = (spec_tile){64, 128, 32, 3, 2, 2, MAINLOOP_MMA_SYNC};
    e.tile[1] = (spec_tile){128, 64, 64, 3, 2, 2, MAINLOOP_MMA_SYNC};
    e.tile[2] = (spec_tile){128, 128, 32, 4, 4, 2, MAINLOOP_MMA_SYNC};
    e.ms = 1;
    return e;
}

/* Half the threads plan the tuned class, half an untuned one; returns 1 when the tiles are the
 * table's (or the default's) as they should be. */
static void *plan_some(void *arg, int index)
{
    const tune_entry *e = arg;
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 5000, p.hidden = 4096, p.vocab_shard = 32768;
    int sm = index % 2 ? 86 : 80, ok = 1;
    spec_tile def = spec_default_tile(sm, p.dtype, ROLE_LOGITS);
    for (int round = 0; round < 20; round++) {
        plan pl;
        if (plan_make_on(&p, FLCE_OP_LOSS_AND_GRAD, DEVICE, sm, 132, NULL, &pl) != FLCE_OK) return NULL;
        const spec_tile *want = sm == 80 ? &e->tile[0] : &def;
        ok &= !memcmp(&pl.logits.tile, want, sizeof *want);
        if (sm == 80) ok &= !memcmp(&pl.dw.tile, &e->tile[2], sizeof e->tile[2]);
    }
    return ok ? (void *)1 : NULL;
}

/* The first plans of a process race to read the table: each sees the whole table, once read. */
static void plans_on_many_threads_share_one_tune_table(void)
{
    char dir[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-threads");
    config_set(CONFIG_CACHE_DIR, dir);
    tune_entry e = tuned_entry();
    CHECK(tune_table_store(dir, &e) == FLCE_OK);
    tune_forget();
    config_set(CONFIG_LOG, "off"); /* the log's class-change bookkeeping runs; its lines do not */
    crowd c = {.fn = plan_some, .arg = &e};
    run_crowd(&c, THREADS);
    for (int i = 0; i < THREADS; i++) CHECKF(c.result[i], "thread %d (sm_%d) planned other tiles", i, i % 2 ? 86 : 80);
    config_set(CONFIG_LOG, NULL);
    config_clear(CONFIG_CACHE_DIR);
    tune_forget();
    remove_tree(dir);
}

/* ---- per-thread messages ------------------------------------------------------------------ */

static void *fail_with_own_message(void *arg, int index)
{
    (void)arg;
    flce_problem p;
    flce_problem_init(&p);
    p.hidden = 8, p.vocab_shard = 8;
    int ok = 1;
    for (int round = 0; round < 50; round++) {
        p.tokens = -1 - index; /* this thread's own bad value, named in its own message */
        char want[32];
        snprintf(want, sizeof want, "tokens=%d:", -1 - index);
        ok &= flce_problem_validate(&p) != FLCE_OK && strstr(flce_last_error(), want) != NULL;
        p.tokens = 4;
        ok &= flce_problem_validate(&p) == FLCE_OK && flce_last_error()[0] == '\0';
    }
    return ok ? (void *)1 : NULL;
}

static void messages_stay_per_thread_under_contention(void)
{
    crowd c = {.fn = fail_with_own_message};
    run_crowd(&c, THREADS);
    for (int i = 0; i < THREADS; i++) CHECKF(c.result[i], "thread %d saw another thread's message", i);
}

/* ---- one spec built by several threads through a fresh cache ----------------------------- */

typedef struct build_job {
    kernel_spec spec;
    jit_result r[THREADS];
} build_job;

static void *build_it(void *arg, int index)
{
    build_job *j = arg;
    return jit_build(&j->spec, &j->r[index]) == FLCE_OK ? (void *)1 : NULL;
}

/* Several threads miss the same key at once: each compiles and stores, none fails, the entry
 * left behind loads, and every cubin is the same bytes. */
static void one_spec_built_by_threads_at_once(void)
{
    enum { BUILDERS = 3 };
    char dir[TEST_PATH_MAX];
    make_tmpdir_named(dir, "flce-threads");
    config_set(CONFIG_CACHE_DIR, dir);
    static build_job j;
    flce_problem p;
    flce_problem_init(&p);
    p.tokens = 300, p.hidden = 136, p.vocab_shard = 1001;
    plan pl;
    CHECK(plan_make(&p, FLCE_OP_LOSS_AND_GRAD, 80, 100, NULL, &pl) == FLCE_OK);
    j.spec = pl.rowops; /* the smallest module: the test is about the threads, not NVRTC */
    crowd c = {.fn = build_it, .arg = &j};
    run_crowd(&c, BUILDERS);
    for (int i = 0; i < BUILDERS; i++) {
        CHECKF(c.result[i] && j.r[i].cubin && j.r[i].len > 0, "builder %d failed", i);
        if (i && c.result[i] && c.result[0])
            CHECKF(j.r[i].len == j.r[0].len && !memcmp(j.r[i].cubin, j.r[0].cubin, j.r[0].len),
                   "builder %d made other bytes", i);
    }
    jit_result again;
    CHECK(jit_build(&j.spec, &again) == FLCE_OK && again.origin == JIT_DISK_HIT);
    CHECK(again.len == j.r[0].len && again.cubin && !memcmp(again.cubin, j.r[0].cubin, again.len));
    free(again.cubin);
    for (int i = 0; i < BUILDERS; i++) free(j.r[i].cubin);
    config_clear(CONFIG_CACHE_DIR);
    remove_tree(dir);
}

int main(void)
{
    config_set(CONFIG_PORTABLE, NULL);
    config_set(CONFIG_DEV, NULL);
    RUN(nvrtc_version_is_one_text_from_many_threads);
    RUN(plans_on_many_threads_share_one_tune_table);
    RUN(messages_stay_per_thread_under_contention);
    RUN(one_spec_built_by_threads_at_once);
    FINISH();
}
