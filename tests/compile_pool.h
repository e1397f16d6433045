/*
 * compile_pool.h — compiles a list of kernel specs with NVRTC through the disk cache on two threads
 * (the CI machine's two cores), one line per spec ("made" or "hit", size, time), and says how many
 * failed, each with NVRTC's log. Shared by test_compile and test_tune_compile.
 */
#ifndef FLCE_COMPILE_POOL_H
#define FLCE_COMPILE_POOL_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "host.h"
#include "jit.h"

typedef struct compile_pool {
    const kernel_spec *specs;
    int failures;
    pthread_mutex_t lock; /* the output and the count */
} compile_pool;

static void compile_pool_one(void *arg, int64_t i)
{
    compile_pool *cp = arg;
    jit_result jr;
    char summary[256];
    spec_summary(&cp->specs[i], summary, sizeof summary);
    flce_status st = jit_build(&cp->specs[i], &jr);
    pthread_mutex_lock(&cp->lock);
    if (st != FLCE_OK) {
        cp->failures++;
        fprintf(stderr, "  FAILED %s:\n%s\n", summary, flce_last_error());
    } else {
        printf("  %s %6zu bytes %7.0f ms  %s\n", jr.origin == JIT_DISK_HIT ? "hit " : "made", jr.len, jr.ms,
               summary);
        free(jr.cubin);
    }
    pthread_mutex_unlock(&cp->lock);
}

/* Compiles specs[0 .. n); returns the number that failed. */
static int compile_pool_run(const kernel_spec *specs, int n)
{
    compile_pool cp = {specs, 0, PTHREAD_MUTEX_INITIALIZER};
    host_parallel_for(n, 2, compile_pool_one, &cp);
    return cp.failures;
}

#endif
