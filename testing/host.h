/*
 * host.h — host-side helpers shared by the tool, the tests and the benchmarks: dtype conversions
 * (round-to-nearest-even, as the GPU's cvt.rn does), a seeded random generator, and poison values.
 */
#ifndef FLCE_HOST_H
#define FLCE_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"

size_t host_dtype_size(flce_dtype t);
const char *host_dtype_name(flce_dtype t);
/* Converts n doubles to dtype (rounding to nearest even) into dst, and back. */
void host_to_dtype(flce_dtype t, const double *src, void *dst, size_t n);
void host_from_dtype(flce_dtype t, const void *src, double *dst, size_t n);
/* Rounds each value to what dtype can hold (so the reference sees exactly the GPU's inputs). */
void host_round_to_dtype(flce_dtype t, double *x, size_t n);

typedef struct host_rng {
    uint64_t s[2];
} host_rng;

void host_rng_seed(host_rng *r, uint64_t seed);
uint64_t host_rng_next(host_rng *r);
double host_rng_uniform(host_rng *r);          /* [0, 1) */
double host_rng_normal(host_rng *r);           /* mean 0, sd 1 */
int64_t host_rng_below(host_rng *r, int64_t n); /* [0, n) */
/* Seconds on the monotonic clock (differences only). */
double host_now_s(void);

/* The whole file at `path`, NUL-terminated (malloc'd; *len its bytes when len is not NULL), or NULL
 * when it cannot be opened or read. */
char *host_read_file(const char *path, size_t *len);

/* Runs fn(arg, i) for i in [0, n) on `threads` threads (the caller's included; 0: one per core, at
 * most 64); returns when all are done. fn must not depend on the order. */
void host_parallel_for(int64_t n, int threads, void (*fn)(void *arg, int64_t i), void *arg);

/* A seed that differs every run (time and pid) unless FLCE_SEED is set; printed by tests. */
uint64_t host_fresh_seed(void);

/* host_fresh_seed(), printed as the line that reproduces the run ("seed S (FLCE_SEED=S reproduces)"). */
uint64_t host_announced_seed(void);

#endif
