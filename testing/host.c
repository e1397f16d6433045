/*
 * host.c — host helpers shared by the tool, the tests and the benchmarks (contract in host.h):
 * dtype conversions that round to nearest even exactly as the GPU's cvt.rn does (so the reference
 * sees the GPU's inputs bit for bit), and a small seeded random generator (xoroshiro128+).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime, getpid */
#endif

#include "host.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

size_t host_dtype_size(flce_dtype t) {
    switch (t) {
    case FLCE_DTYPE_F32: return 4;
    case FLCE_DTYPE_F16: return 2;
    case FLCE_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *host_dtype_name(flce_dtype t) {
    switch (t) {
    case FLCE_DTYPE_F32: return "fp32";
    case FLCE_DTYPE_F16: return "fp16";
    case FLCE_DTYPE_BF16: return "bf16";
    }
    return "unknown";
}

static uint32_t host_float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float host_bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 is the top half of a float. Adding 0x7FFF plus the kept lsb rounds to nearest with ties to
 * even, and carries into the exponent (up to inf) exactly when it should. NaN must not go through
 * the addition: a NaN with only low mantissa bits would round to inf, so keep it quiet instead. */
static uint16_t host_float_to_bf16(float f) {
    uint32_t u = host_float_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float host_bf16_to_float(uint16_t b) {
    return host_bits_float((uint32_t)b << 16);
}

/* Drops the low `shift` bits of m rounding to nearest, ties to even (1 <= shift <= 31). */
static uint32_t host_round_shift(uint32_t m, unsigned shift) {
    uint32_t kept = m >> shift;
    uint32_t rest = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u)))
        kept++;
    return kept;
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; max finite 65504, smallest
 * subnormal 2^-24. A carry out of the mantissa bumps the exponent field, which is the right
 * encoding in every range (subnormal -> smallest normal, 2^k·1.11..1 -> 2^(k+1)). */
static uint16_t host_float_to_fp16(float f) {
    uint32_t u = host_float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) /* NaN: keep it a quiet NaN, with what fits of the payload */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 = 65504 + half an ulp: the tie goes to even, i.e. inf */
        return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) { /* >= 2^-14: normal */
        uint32_t exp16 = (a >> 23) - 127u + 15u;
        /* The half's exponent and mantissa, followed by the 13 bits to round off. */
        uint32_t bits = (exp16 << 23) | (a & 0x7FFFFFu);
        return (uint16_t)(sign | host_round_shift(bits, 13));
    }
    /* Subnormal: value = mant·2^(e−150), the result counts units of 2^-24: shift by 126 − e. */
    uint32_t e = a >> 23;
    unsigned shift = 126u - e;
    if (shift > 24) /* below 2^-25 (and float subnormals, zeros): rounds to ±0 */
        return sign;
    return (uint16_t)(sign | host_round_shift((a & 0x7FFFFFu) | 0x800000u, shift));
}

static float host_fp16_to_float(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exp16 = (x >> 10) & 0x1Fu;
    uint32_t mant = x & 0x3FFu;
    if (exp16 == 0) { /* zero or subnormal: mant·2^-24, exact in float */
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp16 == 31)
        return host_bits_float(sign | 0x7F800000u | (mant << 13));
    return host_bits_float(sign | ((exp16 - 15u + 127u) << 23) | (mant << 13));
}

/* Double -> 16 bits goes through float (round twice) on purpose: the GPU path also starts from the
 * values a caller holds in fp32, and the reference only ever reads back what was stored. */
void host_to_dtype(flce_dtype t, const double *src, void *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float f = (float)src[i];
        if (t == FLCE_DTYPE_F32)
            ((float *)dst)[i] = f;
        else if (t == FLCE_DTYPE_F16)
            ((uint16_t *)dst)[i] = host_float_to_fp16(f);
        else if (t == FLCE_DTYPE_BF16)
            ((uint16_t *)dst)[i] = host_float_to_bf16(f);
    }
}

void host_from_dtype(flce_dtype t, const void *src, double *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (t == FLCE_DTYPE_F32)
            dst[i] = ((const float *)src)[i];
        else if (t == FLCE_DTYPE_F16)
            dst[i] = host_fp16_to_float(((const uint16_t *)src)[i]);
        else if (t == FLCE_DTYPE_BF16)
            dst[i] = host_bf16_to_float(((const uint16_t *)src)[i]);
    }
}

void host_round_to_dtype(flce_dtype t, double *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        union {
            float f;
            uint16_t h;
        } buf; /* one value of any dtype */
        host_to_dtype(t, &x[i], &buf, 1);
        host_from_dtype(t, &buf, &x[i], 1);
    }
}

/* splitmix64: turns any seed (even 0 or a small counter) into well-mixed state words. */
static uint64_t host_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t host_rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

void host_rng_seed(host_rng *r, uint64_t seed) {
    uint64_t st = seed;
    r->s[0] = host_splitmix64(&st);
    r->s[1] = host_splitmix64(&st);
    if (r->s[0] == 0 && r->s[1] == 0) /* the one state xoroshiro never leaves */
        r->s[1] = 1;
}

/* xoroshiro128+ (Blackman & Vigna, 2018 constants 24/16/37). Its lowest bits are weak, so every
 * consumer below uses the top bits. */
uint64_t host_rng_next(host_rng *r) {
    uint64_t s0 = r->s[0], s1 = r->s[1];
    uint64_t out = s0 + s1;
    s1 ^= s0;
    r->s[0] = host_rotl(s0, 24) ^ s1 ^ (s1 << 16);
    r->s[1] = host_rotl(s1, 37);
    return out;
}

double host_rng_uniform(host_rng *r) {
    return (double)(host_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Box–Muller; 1 − u lies in (0, 1], so the log is finite. The sine half is dropped: the state has
 * no room for it and the tests' data sizes make the extra draw irrelevant. */
double host_rng_normal(host_rng *r) {
    double u1 = 1.0 - host_rng_uniform(r);
    double u2 = host_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* floor(u·n) over 53-bit u: the bias is below n/2^53, far under anything a test can notice. */
int64_t host_rng_below(host_rng *r, int64_t n) {
    if (n <= 1)
        return 0;
    int64_t k = (int64_t)(host_rng_uniform(r) * (double)n);
    return k < n ? k : n - 1; /* u·n can round up to n when n is above 2^53 */
}

/* FNV-1a, so that FLCE_SEED=anything reproduces too, not only numbers. */
static uint64_t host_hash_text(const char *s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001B3ull;
    return h;
}

double host_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t host_fresh_seed(void) {
    const char *env = getenv("FLCE_SEED");
    if (env && *env) {
        char *end;
        unsigned long long v = strtoull(env, &end, 0);
        return *end == '\0' ? (uint64_t)v : host_hash_text(env);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t st = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    st ^= (uint64_t)getpid() << 32;
    /* Mixed so that two runs a nanosecond apart, or in sibling processes, look unrelated. */
    return host_splitmix64(&st);
}

uint64_t host_announced_seed(void)
{
    uint64_t seed = host_fresh_seed();
    printf("seed %llu (FLCE_SEED=%llu reproduces)\n", (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}

/* ---- a parallel for over the host's cores ----------------------------------------------------- */

typedef struct par_job {
    void (*fn)(void *, int64_t);
    void *arg;
    int64_t n, next;
    pthread_mutex_t lock;
} par_job;

static void *par_worker(void *p)
{
    par_job *j = p;
    for (;;) {
        pthread_mutex_lock(&j->lock);
        int64_t i = j->next++;
        pthread_mutex_unlock(&j->lock);
        if (i >= j->n) return NULL;
        j->fn(j->arg, i);
    }
}

void host_parallel_for(int64_t n, int threads, void (*fn)(void *arg, int64_t i), void *arg)
{
    enum { MAX_THREADS = 64 };
    if (threads < 1) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n) threads = (int)(n > 0 ? n : 1);
    par_job j = {fn, arg, n, 0, PTHREAD_MUTEX_INITIALIZER};
    pthread_t th[MAX_THREADS];
    int started = 0;
    for (; started < threads - 1; started++)
        if (pthread_create(&th[started], NULL, par_worker, &j) != 0) break;
    par_worker(&j); /* the caller works too: with no thread started, this is the serial loop */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}

char *host_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    char *s = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) free(s), s = NULL;
    fclose(f);
    if (s) {
        s[n] = '\0';
        if (len) *len = (size_t)n;
    }
    return s;
}
