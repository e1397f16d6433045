/*
 * hash.c — flce's own non-cryptographic hashes (see hash.h). Used by the disk cache (runtime/cache_entry.c) for entry names
 * (hash128 of the key) and entry checksums (hash64 chained over header, key and value), by jit.c
 * for module identities, by atomic_file.c for temporary file names.
 *
 * The output is part of the on-disk cache format: entry names and checksums written on one machine
 * are read on another, so the bytes are always read as little-endian words and every constant
 * below is fixed forever. Changing any of it means bumping the cache format version.
 *
 * Construction: each 8-byte word is mixed on its own (multiply, xorshift, multiply), folded into
 * a running state with a rotate and a multiply, and the state goes through a three-round
 * xorshift-multiply finalizer with the length folded in. The per-word mixing does not depend on
 * the state, so the CPU overlaps it across words; the state's dependency chain is a few cycles
 * per word (several GB/s), which keeps checksumming a multi-MB cubin far below a compile's cost.
 */
#include <string.h>

#include "hash.h"

/* Random odd constants with balanced bit counts, drawn once. Odd so every multiply is a
 * bijection on 64-bit words: distinct inputs to one step never merge. */
#define HASH_K_WORD1 0xc7f9ea2d42479ee3ull
#define HASH_K_WORD2 0xf1fb24f76d404871ull
#define HASH_K_STATE 0xefaa259102e5c4adull
#define HASH_K_ADD 0xe8ea8cafd3f4724bull
#define HASH_K_FIN1 0xce0d4426eea862c7ull
#define HASH_K_FIN2 0xb6111eedf9f75185ull
/* The two lanes of hash128: different seeds give unrelated states from the first word on. */
#define HASH_SEED_LANE0 0x8f05c5213afa4513ull
#define HASH_SEED_LANE1 0xc25f922e4fad4293ull

static uint64_t hash_rotl(uint64_t x, unsigned r) { return (x << r) | (x >> (64u - r)); }

/* Reads up to 8 bytes as a little-endian word, zero-padded. memcpy keeps the load legal for any
 * alignment; the byte swap keeps big-endian hosts producing the same names and checksums. */
static uint64_t hash_read_le(const unsigned char *p, size_t n)
{
    uint64_t w = 0;
    memcpy(&w, p, n);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

/* Every input bit reaches every output bit with probability close to 1/2 (checked by an
 * avalanche run when the constants were chosen). */
static uint64_t hash_finalize(uint64_t h)
{
    h ^= h >> 32;
    h *= HASH_K_FIN1;
    h ^= h >> 29;
    h *= HASH_K_FIN2;
    h ^= h >> 32;
    return h;
}

static uint64_t hash_mix_word(uint64_t w)
{
    w *= HASH_K_WORD1;
    w ^= w >> 31;
    w *= HASH_K_WORD2;
    return w;
}

/* The rotate carries high state bits down before the multiply, which only spreads bits upward. */
static uint64_t hash_fold(uint64_t h, uint64_t m)
{
    return hash_rotl(h ^ m, 27) * HASH_K_STATE + HASH_K_ADD;
}

uint64_t hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    size_t rest = len;
    uint64_t h = hash_finalize(seed ^ HASH_K_ADD);
    for (; rest >= 8; rest -= 8, p += 8) h = hash_fold(h, hash_mix_word(hash_read_le(p, 8)));
    /* A zero-padded tail is ambiguous ("ab" vs "ab\0"); folding in the length removes that. */
    if (rest) h = hash_fold(h, hash_mix_word(hash_read_le(p, rest)));
    return hash_finalize(h ^ (uint64_t)len);
}

void hash128(const void *data, size_t len, uint64_t out[2])
{
    out[0] = hash64(data, len, HASH_SEED_LANE0);
    out[1] = hash64(data, len, HASH_SEED_LANE1);
}

void hash128_hex(const uint64_t h[2], char out[33])
{
    static const char digits[] = "0123456789abcdef";
    for (int lane = 0; lane < 2; lane++)
        for (int i = 0; i < 16; i++) out[lane * 16 + i] = digits[(h[lane] >> (60 - 4 * i)) & 15u];
    out[32] = '\0';
}
