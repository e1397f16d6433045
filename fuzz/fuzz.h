/*
 * fuzz.h — what every flce fuzz target shares: the libFuzzer entry point, a little-endian reader
 * of the input bytes, and FUZZ_REQUIRE, which turns a broken invariant into abort() so that
 * libFuzzer (clang builds) and replay.c (any compiler, CTest) both report it as a crash.
 *
 * Targets include the library's internal headers (error.h, spec.h, plan.h, cache.h) on purpose:
 * they fuzz the internal parsers and planners directly, below the public API.
 */
#ifndef FLCE_FUZZ_H
#define FLCE_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Called by libFuzzer, or by replay.c once per corpus file. Returns 0 (libFuzzer's "keep"). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_REQUIRE(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Reads fields off the front of the input. Past the end every byte reads as 0, so any prefix of
 * a corpus entry is still a well-defined (mostly invalid) case and the fuzzer may shorten freely. */
typedef struct fuzz_reader {
    const uint8_t *p;
    size_t left;
} fuzz_reader;

static inline uint64_t fuzz_take(fuzz_reader *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) {
        uint64_t b = 0;
        if (r->left) {
            b = *r->p++;
            r->left--;
        }
        v |= b << (8 * i);
    }
    return v;
}

static inline uint8_t fuzz_u8(fuzz_reader *r) { return (uint8_t)fuzz_take(r, 1); }
static inline uint32_t fuzz_u32(fuzz_reader *r) { return (uint32_t)fuzz_take(r, 4); }
static inline uint64_t fuzz_u64(fuzz_reader *r) { return fuzz_take(r, 8); }
/* Two's complement reinterpretation without relying on implementation-defined conversions. */
static inline int32_t fuzz_i32(fuzz_reader *r)
{
    uint32_t u = fuzz_u32(r);
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}
static inline int64_t fuzz_i64(fuzz_reader *r)
{
    uint64_t u = fuzz_u64(r);
    int64_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}
/* Any bit pattern, NaNs and infinities included: the validators must reject those in words. */
static inline float fuzz_f32(fuzz_reader *r)
{
    uint32_t u = fuzz_u32(r);
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* The error contract of flce.h: FLCE_OK, or a status flce knows with a message in words. The
 * caller clears the message before the call (err_clear), so a stale message cannot pass. */
static inline void fuzz_check_status(flce_status st, const char *call)
{
    if (st == FLCE_OK) return;
    FUZZ_REQUIRE(st > FLCE_OK && st <= FLCE_ERR_INTERNAL, "%s returned %d", call, (int)st);
    FUZZ_REQUIRE(st != FLCE_ERR_INTERNAL, "%s: internal error: %s", call, err_message());
    FUZZ_REQUIRE(err_message()[0] != '\0', "%s returned %s with no message", call,
                 flce_status_name(st));
}

#endif
