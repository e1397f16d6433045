/*
 * cache_entry.c — one entry file of the disk cache: its name (the key's hash), its byte layout
 * (cache_internal.h), reading and checking it, writing it. No directory policy lives here: the
 * callers (cache_load_store.c, cache_list.c, cache_prune.c) decide what a bad entry means.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "cache_consts.h"
#include "cache_internal.h"
#include "hash.h"

/* "<hex>.cubin.tmp.<pid>.<16 hex>" */
#define CACHE_NAME_MAX 96

/* ---- small helpers ---------------------------------------------------------------------- */

static void cache_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void cache_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t cache_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t cache_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int cache_is_hex_name(const char *name)
{
    for (int i = 0; i < CACHE_HEX_DIGITS; i++) {
        char c = name[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
    }
    return 1;
}

/* Exactly "<32 lowercase hex>.cubin". */
int cache_is_entry_name(const char *name)
{
    return strlen(name) == CACHE_HEX_DIGITS + strlen(CACHE_SUFFIX) && cache_is_hex_name(name) &&
           strcmp(name + CACHE_HEX_DIGITS, CACHE_SUFFIX) == 0;
}

/* "<32 lowercase hex>.cubin.tmp.<anything>". */
int cache_is_temp_name(const char *name)
{
    size_t prefix = CACHE_HEX_DIGITS + strlen(CACHE_SUFFIX);
    size_t infix = strlen(CACHE_TEMP_INFIX);
    return strlen(name) > prefix + infix && cache_is_hex_name(name) &&
           strncmp(name + CACHE_HEX_DIGITS, CACHE_SUFFIX, strlen(CACHE_SUFFIX)) == 0 &&
           strncmp(name + prefix, CACHE_TEMP_INFIX, infix) == 0;
}

/* "<32 lowercase hex>.lock". */
int cache_is_lock_name(const char *name)
{
    return strlen(name) == CACHE_HEX_DIGITS + strlen(CACHE_LOCK_SUFFIX) && cache_is_hex_name(name) &&
           strcmp(name + CACHE_HEX_DIGITS, CACHE_LOCK_SUFFIX) == 0;
}

/* "<dir>/<32 hex of hash128(key)><suffix>". */
int cache_key_path(char *out, const char *dir, const void *key, size_t key_len,
                          const char *suffix)
{
    uint64_t h[2];
    char name[CACHE_NAME_MAX];
    hash128(key, key_len, h);
    hash128_hex(h, name);
    snprintf(name + CACHE_HEX_DIGITS, sizeof name - CACHE_HEX_DIGITS, "%s", suffix);
    return cache_join(out, dir, name);
}

int cache_entry_path(char *out, const char *dir, const void *key, size_t key_len)
{
    return cache_key_path(out, dir, key, key_len, CACHE_SUFFIX);
}

/* ---- reading an entry ------------------------------------------------------------------- */

/* Records why an entry was turned down, for the log. */
static cache_read_result cache_reject(cache_entry *e, cache_read_result r, const char *why)
{
    e->why = why;
    return r;
}

/* 0 on success; short reads are retried, EOF before n bytes counts as failure (errno 0). */
static int cache_read_all(int fd, void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) {
            errno = 0;
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* Checks the header against the file size and (if given) the wanted key's length. */
static cache_read_result cache_check_header(const unsigned char *h, size_t size, size_t want_len,
                                            int have_want, cache_entry *e)
{
    if (memcmp(h, CACHE_MAGIC, 4) != 0) return cache_reject(e, CACHE_READ_INVALID, "bad magic");
    if (cache_get_u32(h + 4) != CACHE_FORMAT_VERSION)
        return cache_reject(e, CACHE_READ_INVALID, "unknown format version");
    e->key_len = cache_get_u64(h + 8);
    e->value_len = cache_get_u64(h + 16);
    /* Written this way so that garbage lengths near 2^64 cannot wrap the sum. */
    uint64_t body = (uint64_t)size - CACHE_HEADER_BYTES - CACHE_CHECKSUM_BYTES;
    if (e->key_len > body || e->value_len != body - e->key_len)
        return cache_reject(e, CACHE_READ_INVALID, "lengths do not match the file size");
    if (have_want && e->key_len != want_len) return CACHE_READ_OTHER_KEY;
    return CACHE_READ_VALID;
}

/* Checks the checksum and (if given) the key of an entry read whole into e->buf. */
static cache_read_result cache_check_body(cache_entry *e, const void *want, int have_want)
{
    e->key = e->buf + CACHE_HEADER_BYTES;
    e->value = e->key + e->key_len;
    const unsigned char *stored = e->value + e->value_len;
    uint64_t sum = hash64(e->buf, CACHE_HEADER_BYTES, CACHE_CHECKSUM_SEED);
    sum = hash64(e->key, (size_t)e->key_len, sum);
    sum = hash64(e->value, (size_t)e->value_len, sum);
    if (sum != cache_get_u64(stored))
        return cache_reject(e, CACHE_READ_INVALID, "checksum mismatch");
    if (have_want && e->key_len && memcmp(e->key, want, (size_t)e->key_len) != 0)
        return CACHE_READ_OTHER_KEY;
    return CACHE_READ_VALID;
}

/* Reads the file behind an open fd: header first, so garbage and other keys' entries are
 * rejected without reading (or allocating for) their payload. */
static cache_read_result cache_read_fd(int fd, const void *want, size_t want_len, int have_want,
                                       cache_entry *e)
{
    struct stat st;
    unsigned char header[CACHE_HEADER_BYTES];
    if (fstat(fd, &st) != 0) return cache_reject(e, CACHE_READ_UNREADABLE, "fstat failed");
    if (!S_ISREG(st.st_mode)) return cache_reject(e, CACHE_READ_UNREADABLE, "not a regular file");
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->mtime = st.st_mtime;
    e->size = (size_t)st.st_size;
    if ((uint64_t)st.st_size != e->size) return cache_reject(e, CACHE_READ_INVALID, "too large");
    if (e->size < CACHE_HEADER_BYTES + CACHE_CHECKSUM_BYTES)
        return cache_reject(e, CACHE_READ_INVALID, "shorter than a header");
    if (cache_read_all(fd, header, sizeof header) != 0)
        return cache_reject(e, CACHE_READ_UNREADABLE, "read failed");
    cache_read_result r = cache_check_header(header, e->size, want_len, have_want, e);
    if (r != CACHE_READ_VALID) return r;
    e->buf = malloc(e->size);
    if (!e->buf) return CACHE_READ_NOMEM;
    memcpy(e->buf, header, sizeof header);
    /* Entries are replaced by rename, never rewritten, so this inode cannot change under us:
     * an early end of file means the file itself is short (errno 0); anything else is an I/O
     * error that says nothing about the entry, so it is left in place. */
    if (cache_read_all(fd, e->buf + sizeof header, e->size - sizeof header) != 0)
        return errno ? cache_reject(e, CACHE_READ_UNREADABLE, "read failed")
                     : cache_reject(e, CACHE_READ_INVALID, "file ended early");
    return cache_check_body(e, want, have_want);
}

/* Opens and checks the entry at `path`; on VALID the caller owns e->buf. `want` may be NULL
 * (list/stat: any key is fine). */
cache_read_result cache_read_entry(const char *path, const void *want, size_t want_len,
                                          int have_want, cache_entry *e)
{
    memset(e, 0, sizeof *e);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cache_reject(e, CACHE_READ_UNREADABLE, "cannot open");
    cache_read_result r = cache_read_fd(fd, want, want_len, have_want, e);
    close(fd);
    if (r != CACHE_READ_VALID) {
        free(e->buf);
        e->buf = NULL;
    }
    return r;
}

/* Removes a bad entry so the next store replaces it, unless a writer has already renamed a new
 * file into its place (then that one is kept). The check-then-unlink window is tiny and losing
 * it only costs one recompile. */
void cache_remove_if_same(const char *path, const cache_entry *e)
{
    struct stat st;
    if (lstat(path, &st) != 0 || st.st_dev != e->dev || st.st_ino != e->ino) return;
    (void)unlink(path);
}

/* ---- writing an entry ------------------------------------------------------------------- */

/* Writes the whole entry to fd; 0 on success, else -1 with errno. */
int cache_write_entry(int fd, const void *key, size_t key_len, const void *blob, size_t len)
{
    unsigned char header[CACHE_HEADER_BYTES];
    unsigned char trailer[CACHE_CHECKSUM_BYTES];
    memcpy(header, CACHE_MAGIC, 4);
    cache_put_u32(header + 4, CACHE_FORMAT_VERSION);
    cache_put_u64(header + 8, key_len);
    cache_put_u64(header + 16, len);
    uint64_t sum = hash64(header, sizeof header, CACHE_CHECKSUM_SEED);
    sum = hash64(key, key_len, sum);
    sum = hash64(blob, len, sum);
    cache_put_u64(trailer, sum);
    if (atomic_file_write_all(fd, header, sizeof header) != 0) return -1;
    if (atomic_file_write_all(fd, key, key_len) != 0) return -1;
    if (atomic_file_write_all(fd, blob, len) != 0) return -1;
    return atomic_file_write_all(fd, trailer, sizeof trailer);
}
