/*
 * test_fault.c — failures injected through the FLCE_FAULT test hook (runtime/fault.h) and the
 * disk's own failure modes (unwritable directory, a writer killed mid-write, many writers at once).
 * Each case checks the three promises of issue 7: a clean status and message, a cache directory
 * that stays valid (no partial entry, no temp file from a failed store), and nothing leaked (file
 * descriptors here, each new one named; memory under the asan preset). CPU only: NVRTC compiles the
 * small rowops role.
 * Every case works in its own mkdtemp directory, named through FLCE_CACHE_DIR, and removes it.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "check.h"
#include "tmpdir.h"
#include "jit.h"

/* Large enough that the stalled writer's value is clearly not written in one go. */
#define TEST_BIG_VALUE (1u << 20)
#define TEST_PROCESSES 16
/* How long the parent waits for the stalled child to reach its write. */
#define TEST_STALL_WAIT_MS 10000

/* ---- helpers ---------------------------------------------------------------------------- */

static void make_tmpdir(char *out) { make_tmpdir_named(out, "flce_test_fault"); }

/* Names in `dir` other than . and ..; *temp counts those that look like the cache's temp files. */
static int count_files(const char *dir, int *temp)
{
    int n = 0;
    if (temp) *temp = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        n++;
        if (temp && strstr(de->d_name, ".tmp.")) (*temp)++;
    }
    if (d) closedir(d);
    return n;
}

/* The open file descriptors of this process, so a case can check that it closed what it opened
 * and, when it did not, say what each one is. Descriptors past FD_TRACK_MAX are counted only. */
#define FD_TRACK_MAX 1024
typedef struct fd_snapshot {
    unsigned char open[FD_TRACK_MAX];
    int count;
} fd_snapshot;

static void fd_snapshot_take(fd_snapshot *s)
{
    memset(s, 0, sizeof *s);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int own = dirfd(d); /* the listing's own descriptor is not the process's */
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.') continue;
        int fd = atoi(de->d_name);
        if (fd == own) continue;
        s->count++;
        if (fd < FD_TRACK_MAX) s->open[fd] = 1;
    }
    closedir(d);
}

/* What descriptor fd points to ("/dev/nvidiactl", "pipe:[123]", "anon_inode:[eventfd]"). */
static void fd_target(int fd, char *out, size_t len)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, len - 1);
    if (n < 0) snprintf(out, len, "(readlink: %s)", strerror(errno));
    else out[n] = '\0';
}

/* Descriptors opened or closed since `before`, each printed with what it points to when `say`;
 * the first new one's target goes to first_new. Returns how many changed. */
static int fd_changes(const fd_snapshot *before, int say, char *first_new, size_t len)
{
    fd_snapshot now;
    fd_snapshot_take(&now);
    int opened = 0, closed = 0;
    if (first_new) first_new[0] = '\0';
    for (int fd = 0; fd < FD_TRACK_MAX; fd++) {
        if (now.open[fd] == before->open[fd]) continue;
        if (!now.open[fd]) {
            if (say) fprintf(stderr, "    descriptor %d, open before, was closed\n", fd);
            closed++;
            continue;
        }
        char target[TEST_PATH_MAX];
        fd_target(fd, target, sizeof target);
        if (first_new && !first_new[0]) snprintf(first_new, len, "%s", target);
        if (say) fprintf(stderr, "    descriptor %d opened: %s\n", fd, target);
        opened++;
    }
    int untracked = now.count - before->count - (opened - closed); /* past FD_TRACK_MAX */
    if (say && untracked) fprintf(stderr, "    %+d descriptor(s) numbered %d or more\n", untracked, FD_TRACK_MAX);
    return opened + closed + abs(untracked);
}

static int msg_has(const char *needle) { return strstr(flce_last_error(), needle) != NULL; }

/* The small rowops kernel: the fastest role to compile. Two dtypes give two distinct entries. */
static kernel_spec rowops_spec(flce_dtype dtype)
{
    kernel_spec s;
    memset(&s, 0, sizeof s);
    s.sm = 80, s.dtype = dtype, s.hidden = 4096, s.vocab_shard = 32768, s.role = ROLE_ROWOPS;
    s.label_bits = 32;
    s.tile = spec_default_tile(80, dtype, ROLE_ROWOPS);
    return s;
}

/* Each case: a fresh cache directory, no fault set; case_end checks fds and cleans up. */
typedef struct fault_case {
    char dir[TEST_PATH_MAX];
    fd_snapshot fds;
} fault_case;

static void case_begin(fault_case *c)
{
    make_tmpdir(c->dir);
    setenv("FLCE_CACHE_DIR", c->dir, 1);
    unsetenv("FLCE_FAULT");
    fd_snapshot_take(&c->fds);
}

static void case_end(fault_case *c)
{
    unsetenv("FLCE_FAULT");
    int changed = fd_changes(&c->fds, 1, NULL, 0);
    CHECKF(changed == 0, "%d file descriptor(s) opened or closed by the case (listed above)", changed);
    remove_tree(c->dir);
}

static cache_stats stat_of(const char *dir)
{
    cache_stats st;
    flce_status s = cache_stat(dir, &st);
    CHECKF(s == FLCE_OK, "cache_stat(%s): %s", dir, flce_last_error());
    return st;
}

/* jit_build that must succeed with a cubin from `origin`; returns the cubin (caller frees). */
static void *build_ok(const kernel_spec *s, jit_origin origin, size_t *len)
{
    jit_result r;
    flce_status st = jit_build(s, &r);
    CHECKF(st == FLCE_OK, "jit_build: %s", flce_last_error());
    CHECK(r.cubin != NULL && r.len > 0);
    CHECKF(r.origin == origin, "origin %d, expected %d", (int)r.origin, (int)origin);
    if (len) *len = r.len;
    return r.cubin;
}

/* ---- cases ------------------------------------------------------------------------------ */

static void nvrtc_failure_is_a_clean_compile_error(void)
{
    fault_case c;
    case_begin(&c);
    kernel_spec s = rowops_spec(FLCE_DTYPE_BF16);
    jit_result r;
    setenv("FLCE_FAULT", "nvrtc:1", 1);
    CHECK(jit_build(&s, &r) == FLCE_ERR_COMPILE);
    CHECKF(msg_has("injected fault: NVRTC compile"), "message: %s", flce_last_error());
    CHECK(r.cubin == NULL && r.len == 0);
    CHECK(count_files(c.dir, NULL) == 0);
    unsetenv("FLCE_FAULT");
    free(build_ok(&s, JIT_COMPILED, NULL));
    cache_stats st = stat_of(c.dir);
    CHECK(st.entries == 1 && st.temp_files == 0 && st.invalid == 0);
    CHECK(count_files(c.dir, NULL) == 1);
    case_end(&c);
}

/* The descriptor check of case_end can fail: a descriptor left open is found and named. */
static void leaked_descriptor_is_found_and_named(void)
{
    fd_snapshot before;
    fd_snapshot_take(&before);
    int fd = open("/dev/null", O_RDONLY);
    char target[TEST_PATH_MAX];
    int changed = fd_changes(&before, 0, target, sizeof target);
    CHECKF(fd >= 0 && changed == 1 && !strcmp(target, "/dev/null"), "fd %d: %d change(s), first '%s'",
           fd, changed, target);
    if (fd >= 0) close(fd);
    CHECK(fd_changes(&before, 1, NULL, 0) == 0);
}

/* nth counts calls at the point since FLCE_FAULT took its value: the 2nd compile fails, the 3rd
 * does not (a disk hit makes no NVRTC call, so each compile here is of a new spec or a retry). */
static void nth_call_alone_fails(void)
{
    fault_case c;
    case_begin(&c);
    kernel_spec a = rowops_spec(FLCE_DTYPE_BF16), b = rowops_spec(FLCE_DTYPE_F16);
    jit_result r;
    setenv("FLCE_FAULT", "nvrtc:2", 1);
    free(build_ok(&a, JIT_COMPILED, NULL));
    CHECK(jit_build(&b, &r) == FLCE_ERR_COMPILE && msg_has("injected") && r.cubin == NULL);
    free(build_ok(&b, JIT_COMPILED, NULL));
    free(build_ok(&a, JIT_DISK_HIT, NULL));
    CHECK(stat_of(c.dir).entries == 2);
    case_end(&c);
}

/* A failed store costs the cache entry, never the compile; the next store works. */
static void failed_store_leaves_no_entry_and_compile_succeeds(const char *fault)
{
    fault_case c;
    case_begin(&c);
    kernel_spec s = rowops_spec(FLCE_DTYPE_BF16);
    setenv("FLCE_FAULT", fault, 1);
    free(build_ok(&s, JIT_COMPILED, NULL));
    int temp = -1;
    CHECKF(count_files(c.dir, &temp) == 0, "FLCE_FAULT=%s left %d files (%d temp)", fault,
           count_files(c.dir, NULL), temp);
    unsetenv("FLCE_FAULT");
    size_t n1 = 0, n2 = 0;
    void *compiled = build_ok(&s, JIT_COMPILED, &n1);
    void *loaded = build_ok(&s, JIT_DISK_HIT, &n2);
    CHECK(compiled && loaded && n1 == n2 && memcmp(compiled, loaded, n1) == 0);
    free(compiled);
    free(loaded);
    cache_stats st = stat_of(c.dir);
    CHECK(st.entries == 1 && st.temp_files == 0 && st.invalid == 0);
    case_end(&c);
}

static void disk_full_during_cache_write_leaves_no_entry_and_compile_succeeds(void)
{
    failed_store_leaves_no_entry_and_compile_succeeds("cache_write");
}

static void rename_failure_leaves_no_entry_and_compile_succeeds(void)
{
    failed_store_leaves_no_entry_and_compile_succeeds("cache_rename");
}

/* A path below a regular file: mkdir fails with ENOTDIR even for root. */
static void readonly_cache_directory_still_compiles(void)
{
    fault_case c;
    case_begin(&c);
    char file[TEST_PATH_MAX], below[TEST_PATH_MAX];
    join(file, c.dir, "file");
    join(below, file, "cache");
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    setenv("FLCE_CACHE_DIR", below, 1);
    kernel_spec s = rowops_spec(FLCE_DTYPE_BF16);
    free(build_ok(&s, JIT_COMPILED, NULL));
    free(build_ok(&s, JIT_COMPILED, NULL)); /* nothing was stored, so no hit */
    struct stat st;
    CHECK(count_files(c.dir, NULL) == 1 && stat(file, &st) == 0 && st.st_size == 0);
    case_end(&c);
}

/* Polls until `dir` holds a temp file of at least `min_bytes`; 0 on timeout. */
static int wait_for_temp_file(const char *dir, long min_bytes)
{
    struct timespec pause_ts = {0, 10 * 1000 * 1000};
    for (int waited = 0; waited < TEST_STALL_WAIT_MS; waited += 10) {
        DIR *d = opendir(dir);
        struct dirent *de;
        int found = 0;
        while (d && !found && (de = readdir(d)) != NULL) {
            char path[TEST_PATH_MAX];
            struct stat st;
            join(path, dir, de->d_name);
            found = strstr(de->d_name, ".tmp.") && stat(path, &st) == 0 && st.st_size >= min_bytes;
        }
        if (d) closedir(d);
        if (found) return 1;
        nanosleep(&pause_ts, NULL);
    }
    return 0;
}

static void writer_killed_mid_write_leaves_cache_valid(void)
{
    fault_case c;
    case_begin(&c);
    static const char key[] = "writer killed mid-write\nkey body";
    unsigned char *value = malloc(TEST_BIG_VALUE);
    if (!value) {
        CHECK(value != NULL);
        case_end(&c);
        return;
    }
    for (size_t i = 0; i < TEST_BIG_VALUE; i++) value[i] = (unsigned char)(i * 131u + 7u);
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        setenv("FLCE_FAULT", "cache_write:1:stall", 1);
        cache_store(c.dir, key, sizeof key - 1, value, TEST_BIG_VALUE);
        _exit(3); /* not reached: the store stalls inside its write */
    }
    CHECK(child > 0);
    CHECK(wait_for_temp_file(c.dir, 4));
    int status = 0;
    kill(child, SIGKILL);
    CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status) &&
          WTERMSIG(status) == SIGKILL);

    void *blob = (void *)1;
    size_t len = 1;
    CHECK(cache_load(c.dir, key, sizeof key - 1, &blob, &len) == FLCE_OK && blob == NULL &&
          len == 0);
    cache_stats st = stat_of(c.dir);
    CHECK(st.entries == 0 && st.invalid == 0 && st.temp_files == 1);

    CHECK(cache_store(c.dir, key, sizeof key - 1, value, TEST_BIG_VALUE) == FLCE_OK);
    CHECK(cache_load(c.dir, key, sizeof key - 1, &blob, &len) == FLCE_OK && blob != NULL &&
          len == TEST_BIG_VALUE && memcmp(blob, value, TEST_BIG_VALUE) == 0);
    free(blob);
    st = stat_of(c.dir);
    CHECK(st.entries == 1 && st.invalid == 0 && st.temp_files == 1);
    uint64_t removed = 0;
    CHECK(cache_clear(c.dir, &removed) == FLCE_OK && removed == 2);
    free(value);
    case_end(&c);
}

/* Child of sixteen_processes_share_one_cache_dir: waits for the start signal (EOF on the pipe),
 * then builds both specs. Exit status 0 = both built. */
static void build_both_after_start(int start_fd, const kernel_spec *specs)
{
    char byte;
    while (read(start_fd, &byte, 1) > 0) {
    }
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        jit_result r;
        ok = ok && jit_build(&specs[i], &r) == FLCE_OK && r.cubin != NULL;
        if (ok) free(r.cubin);
    }
    _exit(ok ? 0 : 1);
}

static void sixteen_processes_share_one_cache_dir(void)
{
    fault_case c;
    case_begin(&c);
    kernel_spec specs[2] = {rowops_spec(FLCE_DTYPE_BF16), rowops_spec(FLCE_DTYPE_F16)};
    pid_t kids[TEST_PROCESSES];
    int start[2];
    CHECK(pipe(start) == 0);
    fflush(NULL);
    for (int i = 0; i < TEST_PROCESSES; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(start[1]);
            build_both_after_start(start[0], specs);
        }
        CHECK(kids[i] > 0);
    }
    close(start[0]);
    close(start[1]); /* all children start at once */
    for (int i = 0; i < TEST_PROCESSES; i++) {
        int status = 0;
        if (kids[i] <= 0) continue;
        CHECK(waitpid(kids[i], &status, 0) == kids[i]);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %#x", i, status);
    }
    cache_stats st = stat_of(c.dir);
    CHECKF(st.entries == 2 && st.temp_files == 0 && st.invalid == 0,
           "entries=%llu temp=%llu invalid=%llu", (unsigned long long)st.entries,
           (unsigned long long)st.temp_files, (unsigned long long)st.invalid);
    CHECK(count_files(c.dir, NULL) == 2);
    for (int i = 0; i < 2; i++) free(build_ok(&specs[i], JIT_DISK_HIT, NULL));
    case_end(&c);
}

/* One successful NVRTC compile before any case counts descriptors: NVRTC 13 starts the CUDA driver
 * on its first compile where there is one, and the driver keeps its descriptors (/dev/nvidia*, an
 * eventfd, pipes: 13 on an H100) for the life of the process. That is no leak of the case that
 * happens to compile first; on a machine without a driver nothing is opened. */
static int warm_up_nvrtc(void)
{
    char dir[TEST_PATH_MAX];
    make_tmpdir(dir);
    setenv("FLCE_CACHE_DIR", dir, 1);
    kernel_spec s = rowops_spec(FLCE_DTYPE_F32); /* a spec no case builds */
    jit_result r;
    flce_status st = jit_build(&s, &r);
    if (st == FLCE_OK) free(r.cubin);
    else fprintf(stderr, "warm-up compile: %s\n", flce_last_error());
    remove_tree(dir);
    return st == FLCE_OK;
}

int main(void)
{
    kernel_spec s = rowops_spec(FLCE_DTYPE_BF16);
    if (spec_validate(&s) != FLCE_OK) {
        fprintf(stderr, "the test's rowops spec is invalid: %s\n", flce_last_error());
        return 1;
    }
    if (!warm_up_nvrtc()) return 1;
    RUN(leaked_descriptor_is_found_and_named);
    RUN(nvrtc_failure_is_a_clean_compile_error);
    RUN(nth_call_alone_fails);
    RUN(disk_full_during_cache_write_leaves_no_entry_and_compile_succeeds);
    RUN(rename_failure_leaves_no_entry_and_compile_succeeds);
    RUN(readonly_cache_directory_still_compiles);
    RUN(writer_killed_mid_write_leaves_cache_valid);
    RUN(sixteen_processes_share_one_cache_dir);
    FINISH();
}
