/*
 * shard.h — a test program's work spread over forked child processes (test_gpu uses it). NVRTC
 * compiles one specialized kernel per call on one core, and test_gpu needs hundreds: on one
 * process the suite took ~280 s on a 16-core H100 machine. With S shards, child k (its own flce
 * context) runs the units u with u % S == k; the children share the disk cache, whose per-entry
 * compile lock makes two children needing the same kernel compile it once.
 *
 * A unit is a function run with RUN_UNIT, or one case of a function run with RUN_CASES, whose loop
 * asks shard_mine() before each case (the heavy table-driven tests, so the shards are balanced).
 * Every child walks the same units in the same order (same FLCE_TEST_FILTER, same loops) and
 * keeps its own share: no coordination is needed. Control flow that decides what is a unit must
 * not depend on random data, or the children would disagree on the numbering.
 *
 *   FLCE_TEST_JOBS=S   children; default min(8, online CPUs / 2), at least 1. S = 1 runs
 *                      everything in the process itself, with no fork: the old behaviour.
 *
 * The CUDA driver does not survive fork(): a process that initialized it cannot hand it to a child.
 * So the parent never touches CUDA: shard_gpu_check asks gpu_ready in a child of its own, and each
 * shard's child calls gpu_ready itself before creating its context.
 *
 * The parent fails when any child fails a case, exits nonzero, dies of a signal, or exits 77
 * (skipped) although the parent's check saw a GPU; it names the shard and prints the summed
 * "N passed, M failed" line of check.h.
 */
#ifndef FLCE_SHARD_H
#define FLCE_SHARD_H

#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "gpu_ready.h"

#define SHARD_MAX_JOBS 64
#define SHARD_DEFAULT_MAX_JOBS 8

/* This process's place: shard_index of shard_count (0 of 1 without children). */
static int shard_count = 1, shard_index = 0;
/* Units seen so far in the walk every shard makes, and those of them this shard ran. */
static long shard_units, shard_taken;

/* 1 when the next unit of work is this shard's. Called once per unit, in every shard. */
static inline int shard_mine(void)
{
    int mine = shard_units++ % shard_count == shard_index;
    shard_taken += mine;
    return mine;
}

/* Whether FLCE_TEST_FILTER lets a test function run (as check.h's RUN decides). */
static inline int shard_wanted(const char *name)
{
    const char *f = getenv("FLCE_TEST_FILTER");
    return !f || !*f || strstr(name, f) != NULL;
}

/* A small test function: one unit, run whole by one shard. */
#define RUN_UNIT(fn)                                                                               \
    do {                                                                                           \
        if (!shard_wanted(#fn) || !shard_mine()) break;                                            \
        RUN(fn);                                                                                   \
    } while (0)

/* A table-driven test function that every shard calls; each of its cases is a unit (the function
 * asks shard_mine() per case). It counts as passed in a shard only when that shard ran one. */
#define RUN_CASES(fn)                                                                              \
    do {                                                                                           \
        if (!shard_wanted(#fn)) break;                                                             \
        long taken_ = shard_taken;                                                                 \
        check_case_failed = 0;                                                                     \
        fn();                                                                                      \
        if (check_case_failed) {                                                                   \
            check_failed++;                                                                        \
            printf("FAIL %s\n", #fn);                                                              \
        } else if (shard_taken > taken_) {                                                         \
            check_passed++;                                                                        \
            if (shard_count == 1) printf("ok   %s\n", #fn);                                        \
            else printf("ok   %s (%ld of its cases in shard %d/%d)\n", #fn, shard_taken - taken_,   \
                        shard_index, shard_count);                                                 \
        }                                                                                          \
        fflush(stdout);                                                                            \
    } while (0)

/* FLCE_TEST_JOBS, else min(8, online CPUs / 2); always in [1, SHARD_MAX_JOBS]. Half the CPUs:
 * ctest runs two suites at once (jobs 2), and each call's kernels compile on parallel threads. */
static inline int shard_jobs(void)
{
    const char *v = getenv("FLCE_TEST_JOBS");
    if (v && *v) {
        char *end = NULL;
        long s = strtol(v, &end, 10);
        if (*end == '\0' && s >= 1 && s <= SHARD_MAX_JOBS) return (int)s;
        printf("FLCE_TEST_JOBS=%s: not a count in [1, %d]; using the default\n", v, SHARD_MAX_JOBS);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long s = cpus / 2;
    if (s > SHARD_DEFAULT_MAX_JOBS) s = SHARD_DEFAULT_MAX_JOBS;
    return s < 1 ? 1 : (int)s;
}

/* gpu_ready(needed) asked in a child, so that this process never initializes CUDA: its exit code
 * (0, 77 or 1). A child that dies is a failure, never a skip. */
static inline int shard_gpu_check(int needed)
{
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int rc;
        gpu_ready(needed, &rc);
        fflush(stdout);
        _exit(rc);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) {
        printf("FAIL: could not run the GPU check in a child process\n");
        return 1;
    }
    if (WIFSIGNALED(status)) {
        printf("FAIL: the GPU check's child died of signal %d\n", WTERMSIG(status));
        return 1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* One shard's counts, written by the child into memory the parent shares. */
typedef struct shard_tally {
    int passed, failed, reported;
} shard_tally;

typedef struct shard_result {
    int passed, failed; /* summed over the shards; a shard that ended badly adds one failure */
    int bad_shards;     /* shards that failed, died, or skipped */
} shard_result;

/* A shard that dies of a signal says where, on stderr, before dying of it again: the thread that
 * faulted, its stack (addresses as binary(+offset), for addr2line), and whether exit had begun
 * (atexit handlers and library destructors run then, beside any thread still working). */
static volatile sig_atomic_t shard_exiting;
static inline void shard_crash_report(int sig)
{
    char line[160];
    int n = snprintf(line, sizeof line, "shard %d/%d: signal %d (%s), %s; its stack:\n", shard_index, shard_count,
                     sig, sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGABRT ? "SIGABRT" : "other",
                     shard_exiting ? "during exit (after the shard's tally)" : "while running its cases");
    if (n > 0) (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    void *frames[48];
    int depth = backtrace(frames, 48);
    backtrace_symbols_fd(frames, depth, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void shard_catch_crashes(void)
{
    void *warm[1];
    (void)backtrace(warm, 1); /* loads libgcc now: not in the handler */
    signal(SIGSEGV, shard_crash_report);
    signal(SIGBUS, shard_crash_report);
    signal(SIGABRT, shard_crash_report);
}

/* In the child of shard k: a fresh count, then body(k), whose return is the exit code. */
static inline void shard_child(int k, int jobs, pid_t parent, shard_tally *tally, int (*body)(int))
{
    /* Dies with the parent (a CTest timeout kills only the process it started). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    /* Whole lines: the shards write to one pipe, and a line under PIPE_BUF is written at once. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    setvbuf(stderr, NULL, _IOLBF, 0);
    shard_count = jobs, shard_index = k, shard_units = shard_taken = 0;
    shard_catch_crashes();
    check_passed = check_failed = check_case_failed = 0;
    int rc = body(k);
    tally[k].passed = check_passed, tally[k].failed = check_failed, tally[k].reported = 1;
    printf("shard %d/%d: %d passed, %d failed\n", k, jobs, check_passed, check_failed);
    fflush(NULL);
    shard_exiting = 1;
    exit(rc);
}

/* What the parent makes of shard k's end; 1 when it is a failure (said in words). */
static inline int shard_judge(int k, int jobs, pid_t pid, int status, const shard_tally *t)
{
    if (WIFSIGNALED(status)) {
        printf("FAIL: shard %d/%d (pid %d) was killed by signal %d (%s)\n", k, jobs, (int)pid,
               WTERMSIG(status), strsignal(WTERMSIG(status)));
        return 1;
    }
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (rc == SKIP_EXIT) {
        printf("FAIL: shard %d/%d (pid %d) skipped (exit 77) although the GPU check found a GPU\n", k,
               jobs, (int)pid);
        return 1;
    }
    if (rc != 0 || !t->reported || t->failed) {
        printf("FAIL: shard %d/%d (pid %d) exited with %d, %s (FLCE_TEST_JOBS=%d reproduces its "
               "share)\n", k, jobs, (int)pid, rc,
               t->reported ? (t->failed ? "cases failed" : "no case failed") : "before reporting", jobs);
        return 1;
    }
    return 0;
}

/* Forks `jobs` children, child k running body(k) (which must create its own CUDA context), and
 * waits for all of them. The caller must not have initialized CUDA. */
static inline shard_result shard_run(int jobs, int (*body)(int))
{
    shard_result r = {0, 0, 0};
    if (jobs < 1 || jobs > SHARD_MAX_JOBS) {
        printf("FAIL: %d shards: the harness runs 1 to %d\n", jobs, SHARD_MAX_JOBS);
        r.failed = r.bad_shards = 1;
        return r;
    }
    shard_tally *tally = mmap(NULL, sizeof(shard_tally) * (size_t)jobs, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (tally == MAP_FAILED) {
        printf("FAIL: shared memory for %d shards: mmap failed\n", jobs);
        r.failed = r.bad_shards = 1;
        return r;
    }
    memset(tally, 0, sizeof(shard_tally) * (size_t)jobs);
    pid_t parent = getpid(), pids[SHARD_MAX_JOBS];
    fflush(stdout), fflush(stderr);
    for (int k = 0; k < jobs; k++) {
        pids[k] = fork();
        if (pids[k] == 0) shard_child(k, jobs, parent, tally, body);
        if (pids[k] < 0) printf("FAIL: fork of shard %d/%d failed\n", k, jobs);
    }
    for (int k = 0; k < jobs; k++) {
        int status = 0;
        if (pids[k] < 0 || waitpid(pids[k], &status, 0) != pids[k]) {
            r.failed++, r.bad_shards++;
            continue;
        }
        r.passed += tally[k].passed, r.failed += tally[k].failed;
        if (shard_judge(k, jobs, pids[k], status, &tally[k])) {
            r.bad_shards++;
            if (tally[k].failed == 0) r.failed++; /* ended badly without counting a failure */
        }
    }
    munmap(tally, sizeof(shard_tally) * (size_t)jobs);
    return r;
}

/* check.h's last line for the shards' sum; the exit code of main. */
static inline int shard_finish(shard_result r)
{
    printf("%d passed, %d failed\n", r.passed, r.failed);
    return r.failed || r.bad_shards ? 1 : 0;
}

#endif
