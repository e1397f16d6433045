/*
 * fuzz_cache_entry.c — libFuzzer target over the on-disk cache reader (runtime/cache_load_store.c, runtime/cache_entry.c): the
 * input bytes become an entry file in a private temporary cache directory, named as cache.h
 * names the entry of a key (32 hex digits of hash128(key) + ".cubin"), then cache_load looks that
 * key up and cache_list / cache_stat scan the directory. Three keys per input: the key the entry
 * itself claims to hold (so mutated entries reach the checksum and key comparison), a fixed
 * key, and the empty key.
 *
 * The oracle is an independent reading of the format documented at the top of cache_internal.h. Invariants:
 *  - cache_load returns FLCE_OK, and a hit exactly when the file is a well-formed entry (magic,
 *    version, lengths that add up to the file size, checksum) for that very key; the hit's value
 *    is byte-for-byte the stored one; anything else is a miss with *blob = NULL, *len = 0;
 *  - an entry that fails the format checks is removed (cache.h: "removed, so the next store
 *    replaces it"); a hit leaves the file in place;
 *  - cache_list visits the file once, valid exactly when well-formed for some key, with a key
 *    head that is the key's first line (at most 511 bytes, control bytes as '?');
 *    cache_stat agrees with it;
 *  - cache_store of a well-formed entry's key and value writes back the identical bytes.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache.h"
#include "cache_input.h"
#include "fuzz.h"
#include "hash.h"

/* Part of the on-disk format (cache_consts.h's CACHE_CHECKSUM_SEED), repeated here so the oracle does not
 * share code with what it checks: a change to either side shows up as a replay failure. */
#define ENTRY_CHECKSUM_SEED 0x5fd3a1c9e04b7263ull
#define ENTRY_HEADER 24u
#define ENTRY_TRAILER 8u
#define KEY_HEAD_MAX 512

static const char fixed_key[] = FUZZ_CACHE_FIXED_KEY;

static char fuzz_dir[CACHE_PATH_MAX];

typedef struct entry_view {
    int format_ok;   /* magic, version and lengths match the file size */
    int checksum_ok; /* and the checksum matches: a valid entry for key[0, key_len) */
    const uint8_t *key, *value;
    uint64_t key_len, value_len;
} entry_view;

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void view_entry(const uint8_t *d, size_t size, entry_view *e)
{
    memset(e, 0, sizeof *e);
    if (size < ENTRY_HEADER + ENTRY_TRAILER) return;
    if (memcmp(d, "FLCE", 4) != 0 || get_le(d + 4, 4) != 1) return;
    uint64_t body = size - ENTRY_HEADER - ENTRY_TRAILER;
    e->key_len = get_le(d + 8, 8);
    e->value_len = get_le(d + 16, 8);
    if (e->key_len > body || e->value_len != body - e->key_len) return;
    e->format_ok = 1;
    e->key = d + ENTRY_HEADER;
    e->value = e->key + e->key_len;
    uint64_t sum = hash64(d, ENTRY_HEADER, ENTRY_CHECKSUM_SEED);
    sum = hash64(e->key, (size_t)e->key_len, sum);
    sum = hash64(e->value, (size_t)e->value_len, sum);
    e->checksum_ok = sum == get_le(e->value + e->value_len, 8);
}

static void remove_fuzz_dir(void)
{
    (void)cache_clear(fuzz_dir, NULL);
    (void)rmdir(fuzz_dir);
}

/* One private directory per process, removed at exit (left behind only by a crash). */
static const char *dir_once(void)
{
    if (fuzz_dir[0]) return fuzz_dir;
    const char *tmp = getenv("TMPDIR");
    if (!tmp || tmp[0] != '/') tmp = "/tmp";
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/flce-fuzz-cache.XXXXXX", tmp);
    FUZZ_REQUIRE(mkdtemp(fuzz_dir) != NULL, "mkdtemp %s: %s", fuzz_dir, strerror(errno));
    atexit(remove_fuzz_dir);
    return fuzz_dir;
}

static void entry_path(char *out, const void *key, size_t key_len)
{
    uint64_t h[2];
    char hex[33];
    hash128(key, key_len, h);
    hash128_hex(h, hex);
    int n = snprintf(out, CACHE_PATH_MAX, "%s/%s.cubin", fuzz_dir, hex);
    FUZZ_REQUIRE(n > 0 && n < CACHE_PATH_MAX, "entry path under %s too long", fuzz_dir);
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FUZZ_REQUIRE(fd >= 0, "creating %s: %s", path, strerror(errno));
    while (size) {
        ssize_t put = write(fd, data, size);
        FUZZ_REQUIRE(put > 0, "writing %s: %s", path, strerror(errno));
        data += put;
        size -= (size_t)put;
    }
    close(fd);
}

/* 1 when the file at path holds exactly data[0, size). */
static int file_equals(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int same = 1;
    for (size_t i = 0; i < size && same; i++) same = fgetc(f) == data[i];
    same = same && fgetc(f) == EOF;
    fclose(f);
    return same;
}

static int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

typedef struct list_seen {
    const entry_view *e;
    uint64_t size;
    int visits, valid;
} list_seen;

static void list_visit(void *user, const char *file_name, uint64_t bytes, int valid,
                       const char *key_head)
{
    list_seen *s = user;
    const entry_view *e = s->e;
    s->visits++;
    s->valid = valid;
    FUZZ_REQUIRE(strlen(file_name) == 32 + strlen(".cubin"), "listed '%s'", file_name);
    FUZZ_REQUIRE(bytes == s->size, "listed %llu bytes for a %llu-byte file",
                 (unsigned long long)bytes, (unsigned long long)s->size);
    FUZZ_REQUIRE(valid == e->checksum_ok, "listed valid=%d for a %s entry", valid,
                 e->checksum_ok ? "well-formed" : "malformed");
    size_t n = strlen(key_head);
    FUZZ_REQUIRE(n < KEY_HEAD_MAX, "key head of %zu bytes", n);
    if (!valid) {
        FUZZ_REQUIRE(n == 0, "an invalid entry listed key head '%s'", key_head);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char k = e->key[i], h = (unsigned char)key_head[i];
        FUZZ_REQUIRE(k != '\n', "key head runs past the key's first line");
        FUZZ_REQUIRE(h == ((k < 0x20 || k == 0x7f) ? '?' : k), "key head byte %zu: %#x for %#x",
                     i, h, k);
    }
    FUZZ_REQUIRE(n == e->key_len || n == KEY_HEAD_MAX - 1 || e->key[n] == '\n',
                 "key head stops at byte %zu of a %llu-byte key", n,
                 (unsigned long long)e->key_len);
}

static void check_dir(const entry_view *e, size_t size, int present)
{
    list_seen seen = {e, size, 0, 0};
    err_clear();
    flce_status st = cache_list(fuzz_dir, list_visit, &seen);
    FUZZ_REQUIRE(st == FLCE_OK, "cache_list: %s", err_message());
    FUZZ_REQUIRE(seen.visits == present, "cache_list visited %d files, %d present", seen.visits,
                 present);
    cache_stats stats;
    err_clear();
    st = cache_stat(fuzz_dir, &stats);
    FUZZ_REQUIRE(st == FLCE_OK, "cache_stat: %s", err_message());
    int valid = present && e->checksum_ok;
    FUZZ_REQUIRE(stats.entries == (uint64_t)valid && stats.invalid == (uint64_t)(present - valid) &&
                     stats.bytes == (valid ? size : 0) && stats.temp_files == 0,
                 "cache_stat: %llu entries, %llu invalid, %llu bytes, %llu temp for one %s file",
                 (unsigned long long)stats.entries, (unsigned long long)stats.invalid,
                 (unsigned long long)stats.bytes, (unsigned long long)stats.temp_files,
                 present ? (valid ? "valid" : "invalid") : "absent");
}

/* The input stored as the entry of `key`, looked up, listed, then removed. */
static void load_as(const uint8_t *data, size_t size, const entry_view *e, const void *key,
                    size_t key_len)
{
    char path[CACHE_PATH_MAX];
    entry_path(path, key, key_len);
    write_file(path, data, size);

    static char sentinel;
    void *blob = &sentinel;
    size_t len = 12345;
    err_clear();
    flce_status st = cache_load(fuzz_dir, key, key_len, &blob, &len);
    FUZZ_REQUIRE(st == FLCE_OK, "cache_load returned %s: %s", flce_status_name(st), err_message());
    int mine = e->checksum_ok && e->key_len == key_len &&
               (key_len == 0 || memcmp(e->key, key, key_len) == 0);
    if (mine) {
        FUZZ_REQUIRE(blob != NULL && blob != &sentinel, "a well-formed entry for the key missed");
        FUZZ_REQUIRE(len == e->value_len && memcmp(blob, e->value, len) == 0,
                     "hit returned %zu bytes that differ from the stored %llu", len,
                     (unsigned long long)e->value_len);
        FUZZ_REQUIRE(file_equals(path, data, size), "a hit changed or removed the entry");
    } else {
        FUZZ_REQUIRE(blob == NULL && len == 0, "hit (%zu bytes) on an entry that is %s", len,
                     e->checksum_ok ? "another key's" : "malformed");
    }
    if (blob != &sentinel) free(blob);
    if (!e->format_ok) FUZZ_REQUIRE(!file_exists(path), "a malformed entry was left in place");

    check_dir(e, size, file_exists(path));
    (void)unlink(path);
}

/* A well-formed entry is exactly what cache_store writes for its key and value. */
static void check_store_round_trip(const uint8_t *data, size_t size, const entry_view *e)
{
    char path[CACHE_PATH_MAX];
    if (!e->checksum_ok) return;
    entry_path(path, e->key, (size_t)e->key_len);
    err_clear();
    flce_status st = cache_store(fuzz_dir, e->key, (size_t)e->key_len, e->value,
                                 (size_t)e->value_len);
    FUZZ_REQUIRE(st == FLCE_OK, "cache_store: %s", err_message());
    FUZZ_REQUIRE(file_equals(path, data, size),
                 "cache_store of a well-formed entry's key and value wrote other bytes");
    (void)unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    entry_view e;
    dir_once();
    view_entry(data, size, &e);
    /* The key the entry claims, as far as the file has it: reaches the checksum and key
     * comparison even when a mutation broke the lengths. */
    size_t own_len = 0;
    const uint8_t *own = data + (size < ENTRY_HEADER ? size : ENTRY_HEADER);
    if (size >= ENTRY_HEADER) {
        uint64_t claimed = get_le(data + 8, 8);
        own_len = claimed < size - ENTRY_HEADER ? (size_t)claimed : size - ENTRY_HEADER;
    }
    load_as(data, size, &e, own, own_len);
    load_as(data, size, &e, fixed_key, sizeof fixed_key - 1);
    load_as(data, size, &e, NULL, 0);
    check_store_round_trip(data, size, &e);
    return 0;
}
