/*
 * hash.h — non-cryptographic hashes of our own: 128-bit for cache entry names and 64-bit
 * checksums for entry contents. Collisions are harmless by construction (the cache compares the
 * stored key), so speed and good mixing matter, not cryptographic strength.
 */
#ifndef FLCE_HASH_H
#define FLCE_HASH_H

#include <stddef.h>
#include <stdint.h>

void hash128(const void *data, size_t len, uint64_t out[2]);
uint64_t hash64(const void *data, size_t len, uint64_t seed);
/* Writes 32 lowercase hex digits and a NUL into out (33 bytes). */
void hash128_hex(const uint64_t h[2], char out[33]);

#endif
