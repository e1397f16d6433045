/*
 * check.h — the tiny harness every test program uses. A test file is a list of functions named
 * after the behaviour they check; main() runs them with RUN(), and FINISH() prints
 * "N passed, M failed" and returns the exit code CTest reads (77 = skipped).
 */
#ifndef FLCE_CHECK_H
#define FLCE_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed, check_failed, check_case_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);             \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);            \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            check_case_failed = 1;                                                                 \
        }                                                                                          \
    } while (0)

/* FLCE_TEST_FILTER=substring runs only the cases whose name contains it. */
#define RUN(fn)                                                                                    \
    do {                                                                                           \
        const char *check_filter_ = getenv("FLCE_TEST_FILTER");                                    \
        if (check_filter_ && *check_filter_ && !strstr(#fn, check_filter_)) break;                 \
        check_case_failed = 0;                                                                     \
        fn();                                                                                      \
        if (check_case_failed) {                                                                   \
            check_failed++;                                                                        \
            printf("FAIL %s\n", #fn);                                                              \
        } else {                                                                                   \
            check_passed++;                                                                        \
            printf("ok   %s\n", #fn);                                                              \
        }                                                                                          \
        fflush(stdout);                                                                            \
    } while (0)

#define FINISH()                                                                                   \
    do {                                                                                           \
        printf("%d passed, %d failed\n", check_passed, check_failed);                              \
        return check_failed ? 1 : 0;                                                               \
    } while (0)

#define SKIP_EXIT 77

#endif
