/*
 * test_shard.c — the shard harness of the GPU tests (tests/shard.h) on the CPU: every unit runs
 * exactly once over the shards and the shares are balanced; a failing case, a nonzero exit, a
 * signal and a skip (77) in one shard each fail the whole with that shard named; counts are summed;
 * FLCE_TEST_FILTER keeps every shard on the same numbering; FLCE_TEST_JOBS is read as documented.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "shard.h"

enum { UNITS_PER_TABLE = 17, TABLES = 3, JOBS = 5 };

/* Shared with the children: how often each unit ran, and in which shard. */
typedef struct seen {
    int runs[TABLES * UNITS_PER_TABLE + 8];
    int shard_of[TABLES * UNITS_PER_TABLE + 8];
    int small_runs;
    pid_t small_pid;
} seen;

static seen *log_;
static int table_no;
static const char *mode = "pass"; /* what shard 1 does: pass, fail, exit, signal, skip */

static void note(int unit)
{
    __atomic_fetch_add(&log_->runs[unit], 1, __ATOMIC_SEQ_CST);
    log_->shard_of[unit] = shard_index;
}

static void table_case_units(void)
{
    for (int i = 0; i < UNITS_PER_TABLE; i++) {
        if (!shard_mine()) continue;
        note(table_no * UNITS_PER_TABLE + i);
        if (!strcmp(mode, "fail") && shard_index == 1 && table_no == 0) CHECK(!"a case that fails");
    }
    table_no++;
}

static void small_unit(void)
{
    __atomic_fetch_add(&log_->small_runs, 1, __ATOMIC_SEQ_CST);
    log_->small_pid = getpid();
}

static int body(int k)
{
    table_no = 0;
    RUN_CASES(table_case_units);
    RUN_UNIT(small_unit);
    RUN_CASES(table_case_units);
    RUN_CASES(table_case_units);
    if (k == 1 && !strcmp(mode, "exit")) return 3;
    if (k == 1 && !strcmp(mode, "signal")) raise(SIGKILL);
    if (k == 1 && !strcmp(mode, "skip")) return SKIP_EXIT;
    return check_failed ? 1 : 0;
}

static shard_result run_mode(const char *m, int jobs)
{
    mode = m;
    memset(log_, 0, sizeof *log_);
    /* The harness's counters are the children's; keep this process's own. */
    int p = check_passed, f = check_failed, c = check_case_failed;
    shard_result r = shard_run(jobs, body);
    check_passed = p, check_failed = f, check_case_failed = c;
    return r;
}

static void every_unit_runs_once_and_shares_are_balanced(void)
{
    shard_result r = run_mode("pass", JOBS);
    int per_shard[JOBS] = {0}, total = TABLES * UNITS_PER_TABLE;
    for (int u = 0; u < total; u++) {
        CHECKF(log_->runs[u] == 1, "unit %d ran %d times", u, log_->runs[u]);
        per_shard[log_->shard_of[u]]++;
    }
    CHECKF(log_->small_runs == 1 && log_->small_pid != getpid(), "small unit ran %d times", log_->small_runs);
    for (int k = 0; k < JOBS; k++)
        CHECKF(per_shard[k] >= total / JOBS - 1 && per_shard[k] <= total / JOBS + 2,
               "shard %d ran %d of %d table units", k, per_shard[k], total);
    /* each shard passes the three tables it had cases of; one of them also the small unit */
    CHECKF(r.passed == JOBS * TABLES + 1 && r.failed == 0 && r.bad_shards == 0, "%d passed, %d failed, %d bad",
           r.passed, r.failed, r.bad_shards);
    CHECK(shard_finish(r) == 0);
}

static void a_failing_case_fails_the_whole(void)
{
    shard_result r = run_mode("fail", JOBS);
    CHECKF(r.failed == 1 && r.bad_shards == 1 && r.passed == JOBS * TABLES, "%d passed, %d failed, %d bad",
           r.passed, r.failed, r.bad_shards);
    CHECK(shard_finish(r) == 1);
}

static void exit_signal_and_skip_in_a_shard_are_failures(void)
{
    const char *modes[] = {"exit", "signal", "skip"};
    for (int i = 0; i < 3; i++) {
        shard_result r = run_mode(modes[i], JOBS);
        CHECKF(r.bad_shards == 1 && r.failed == 1, "%s: %d failed, %d bad", modes[i], r.failed, r.bad_shards);
        /* a shard that exits reported its passes first; a killed one never did */
        int want = JOBS * TABLES + 1 - (!strcmp(modes[i], "signal") ? TABLES : 0);
        CHECKF(r.passed == want, "%s: %d passed, want %d", modes[i], r.passed, want);
        CHECK(shard_finish(r) == 1);
    }
}

/* More shards than units: the idle ones pass with nothing run. */
static void more_shards_than_units(void)
{
    shard_result r = run_mode("pass", TABLES * UNITS_PER_TABLE + 5);
    for (int u = 0; u < TABLES * UNITS_PER_TABLE; u++) CHECKF(log_->runs[u] == 1, "unit %d ran %d times", u, log_->runs[u]);
    CHECK(r.failed == 0 && r.bad_shards == 0 && log_->small_runs == 1);
    /* and a count beyond the harness's limit is refused, not overrun */
    r = run_mode("pass", SHARD_MAX_JOBS + 1);
    CHECK(r.failed == 1 && r.bad_shards == 1 && log_->small_runs == 0);
}

/* The filter drops whole functions in every shard alike, so the numbering still agrees.
 * FLCE_TEST_FILTER and FLCE_TEST_JOBS are the test harness's variables (check.h, shard.h), not the
 * library's settings: CTest and CI set them, and reading them is what these cases test. */
static void the_filter_applies_in_every_shard(void)
{
    setenv("FLCE_TEST_FILTER", "small", 1);
    shard_result r = run_mode("fail", JOBS);
    unsetenv("FLCE_TEST_FILTER");
    int table_runs = 0;
    for (int u = 0; u < TABLES * UNITS_PER_TABLE; u++) table_runs += log_->runs[u];
    CHECKF(table_runs == 0 && log_->small_runs == 1 && r.passed == 1 && r.failed == 0,
           "table units %d, small %d, %d passed %d failed", table_runs, log_->small_runs, r.passed, r.failed);
}

static void jobs_come_from_the_environment(void)
{
    setenv("FLCE_TEST_JOBS", "3", 1);
    CHECK(shard_jobs() == 3);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int def = cpus / 2 > 8 ? 8 : cpus / 2 < 1 ? 1 : (int)(cpus / 2);
    const char *bad[] = {"0", "-2", "abc", "3x", "65"};
    for (int i = 0; i < 5; i++) {
        setenv("FLCE_TEST_JOBS", bad[i], 1);
        CHECKF(shard_jobs() == def, "FLCE_TEST_JOBS=%s gave %d", bad[i], shard_jobs());
    }
    unsetenv("FLCE_TEST_JOBS");
    CHECK(shard_jobs() == def);
}

/* Without shards every unit is this process's. */
static void one_shard_runs_everything_here(void)
{
    memset(log_, 0, sizeof *log_);
    mode = "pass";
    int p = check_passed, f = check_failed;
    body(0);
    check_passed = p, check_failed = f, check_case_failed = 0;
    for (int u = 0; u < TABLES * UNITS_PER_TABLE; u++) CHECK(log_->runs[u] == 1);
    CHECK(log_->small_runs == 1 && log_->small_pid == getpid());
    shard_units = shard_taken = 0;
}

int main(void)
{
    log_ = mmap(NULL, sizeof *log_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (log_ == MAP_FAILED) return 1;
    RUN(every_unit_runs_once_and_shares_are_balanced);
    RUN(a_failing_case_fails_the_whole);
    RUN(exit_signal_and_skip_in_a_shard_are_failures);
    RUN(more_shards_than_units);
    RUN(the_filter_applies_in_every_shard);
    RUN(jobs_come_from_the_environment);
    RUN(one_shard_runs_everything_here);
    FINISH();
}
