/*
 * replay.c — runs one fuzz target's LLVMFuzzerTestOneInput on every file of its corpus, built with
 * the normal compiler and no libFuzzer, so CTest (and CI's gcc) replays the committed corpora:
 *
 *     replay_<target> <target> <corpus dir or file>...
 *
 * The first argument must name the target linked in (FUZZ_TARGET_NAME), so a test cannot replay
 * one target's corpus through another. Each input runs in a forked child: a crash or a broken
 * invariant (abort) is reported with its file name and the other inputs still run. The last line
 * is "N passed, M failed", like the tests' check.h; exit status 1 when any failed or when no
 * input was found (a moved corpus must not pass silently). FUZZ_NO_FORK=1 runs in-process, for a
 * debugger.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corpus_file.h"

#ifndef FUZZ_TARGET_NAME
#error "build with -DFUZZ_TARGET_NAME=\"<target>\""
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int passed, failed;

static int run_input(const uint8_t *data, size_t size)
{
    if (getenv("FUZZ_NO_FORK")) {
        LLVMFuzzerTestOneInput(data, size);
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        LLVMFuzzerTestOneInput(data, size);
        exit(0); /* runs the target's atexit cleanup */
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
}

static void replay_file(const char *path)
{
    size_t size = 0;
    uint8_t *data = read_file(path, &size);
    if (!data) {
        fprintf(stderr, "FAIL %s: cannot read: %s\n", path, strerror(errno));
        failed++;
        return;
    }
    int status = run_input(data, size);
    free(data);
    if (status == 0) {
        passed++;
        return;
    }
    failed++;
    if (status > 0 && WIFSIGNALED(status))
        printf("FAIL %s (%zu bytes): killed by signal %d\n", path, size, WTERMSIG(status));
    else if (status > 0 && WIFEXITED(status))
        printf("FAIL %s (%zu bytes): exit status %d\n", path, size, WEXITSTATUS(status));
    else
        printf("FAIL %s: could not run\n", path);
}

static int skip_name(const struct dirent *de) { return de->d_name[0] != '.'; }

/* Files of a directory in name order, so runs and their output are reproducible. */
static void replay_dir(const char *dir)
{
    struct dirent **names = NULL;
    int n = scandir(dir, &names, skip_name, alphasort);
    if (n < 0) {
        printf("FAIL %s: %s\n", dir, strerror(errno));
        failed++;
        return;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name) < (int)sizeof path &&
            stat(path, &st) == 0 && S_ISREG(st.st_mode))
            replay_file(path);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s %s <corpus dir or file>...\n", argv[0], FUZZ_TARGET_NAME);
        return 2;
    }
    if (strcmp(argv[1], FUZZ_TARGET_NAME) != 0) {
        fprintf(stderr, "%s: this driver replays target '%s', not '%s'\n", argv[0],
                FUZZ_TARGET_NAME, argv[1]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) replay_dir(argv[i]);
        else replay_file(argv[i]);
    }
    printf("replayed %d inputs through %s\n", passed + failed, FUZZ_TARGET_NAME);
    printf("%d passed, %d failed\n", passed, failed);
    if (passed + failed == 0) fprintf(stderr, "no inputs found\n");
    return failed || passed + failed == 0 ? 1 : 0;
}
