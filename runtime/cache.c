/*
 * cache.c — the on-disk kernel cache of DESIGN.md §5 (contract in cache.h). jit.c calls
 * cache_load before compiling and cache_store after; tools/cmd_cache.c calls list/stat/clear.
 *
 * Entry file "<32 hex>.cubin", all integers little-endian:
 *
 *   offset       size  field
 *   0            4     magic "FLCE"
 *   4            4     format version (CACHE_FORMAT_VERSION)
 *   8            8     key length K
 *   16           8     value length V
 *   24           K     key bytes
 *   24+K         V     value bytes (the cubin)
 *   24+K+V       8     checksum = hash64(value, hash64(key, hash64(header, CACHE_CHECKSUM_SEED)))
 *
 * The file size must be exactly 32+K+V. The checksum is chained through the seeds so a store can
 * write header, key and value from the caller's buffers without concatenating them first.
 *
 * Nothing here fails a compile short of running out of host memory: unusable directories and
 * failed writes become a warning (once per directory for the former) and FLCE_OK; bad entries
 * become misses.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "fault.h"
#include "hash.h"
#include "log.h"

#define CACHE_MAGIC "FLCE"
#define CACHE_FORMAT_VERSION 1u
#define CACHE_HEADER_BYTES 24u
#define CACHE_CHECKSUM_BYTES 8u
#define CACHE_CHECKSUM_SEED 0x5fd3a1c9e04b7263ull
#define CACHE_HEX_DIGITS 32
#define CACHE_SUFFIX ".cubin"
#define CACHE_TEMP_INFIX ".tmp."
/* "<hex>.cubin.tmp.<pid>.<16 hex>" */
#define CACHE_NAME_MAX 96
/* list/cmd_cache print the key's first line; a cubin's summary line is far shorter than this. */
#define CACHE_KEY_HEAD_MAX 512
/* Distinct unusable directories one process warns about; past that it keeps quiet. */
#define CACHE_WARN_SLOTS 64
/* O_EXCL retries when a temp name is taken (only another host sharing the directory over a
 * network file system, with the same pid, could cause one). */
#define CACHE_TEMP_TRIES 8

typedef enum cache_read_result {
    CACHE_READ_VALID,      /* well-formed, checksum matches, and the key matches if one was given */
    CACHE_READ_OTHER_KEY,  /* a well-formed header whose key is not ours: a hash collision */
    CACHE_READ_INVALID,    /* fails a format check: safe to remove */
    CACHE_READ_UNREADABLE, /* missing, not a regular file, or an I/O error: leave it alone */
    CACHE_READ_NOMEM
} cache_read_result;

/* An entry read whole into memory; key and value point into buf. */
typedef struct cache_entry {
    unsigned char *buf;
    size_t size;
    const unsigned char *key;
    uint64_t key_len;
    const unsigned char *value;
    uint64_t value_len;
    dev_t dev; /* identity of the file read, so a bad entry is removed only if still in place */
    ino_t ino;
    const char *why; /* reason for INVALID / UNREADABLE, for the log */
} cache_entry;

static pthread_mutex_t cache_warn_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cache_warned[CACHE_WARN_SLOTS]; /* hash64 of each directory warned about */
static size_t cache_warned_count;
static atomic_uint_fast64_t cache_temp_counter;

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
static int cache_is_entry_name(const char *name)
{
    return strlen(name) == CACHE_HEX_DIGITS + strlen(CACHE_SUFFIX) && cache_is_hex_name(name) &&
           strcmp(name + CACHE_HEX_DIGITS, CACHE_SUFFIX) == 0;
}

/* "<32 lowercase hex>.cubin.tmp.<anything>". */
static int cache_is_temp_name(const char *name)
{
    size_t prefix = CACHE_HEX_DIGITS + strlen(CACHE_SUFFIX);
    size_t infix = strlen(CACHE_TEMP_INFIX);
    return strlen(name) > prefix + infix && cache_is_hex_name(name) &&
           strncmp(name + CACHE_HEX_DIGITS, CACHE_SUFFIX, strlen(CACHE_SUFFIX)) == 0 &&
           strncmp(name + prefix, CACHE_TEMP_INFIX, infix) == 0;
}

/* 0 when "<dir>/<name>" does not fit in CACHE_PATH_MAX. */
static int cache_join(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, CACHE_PATH_MAX, "%s/%s", dir, name);
    return n > 0 && n < CACHE_PATH_MAX;
}

static int cache_entry_path(char *out, const char *dir, const void *key, size_t key_len)
{
    uint64_t h[2];
    char name[CACHE_HEX_DIGITS + 1 + sizeof CACHE_SUFFIX];
    hash128(key, key_len, h);
    hash128_hex(h, name);
    memcpy(name + CACHE_HEX_DIGITS, CACHE_SUFFIX, sizeof CACHE_SUFFIX);
    return cache_join(out, dir, name);
}

/* True the first time this process sees `dir` here; the caller then logs its one warning. */
static int cache_first_warning(const char *dir)
{
    uint64_t id = hash64(dir, strlen(dir), 0);
    int first = 1;
    pthread_mutex_lock(&cache_warn_lock);
    for (size_t i = 0; i < cache_warned_count && first; i++) first = cache_warned[i] != id;
    if (first && cache_warned_count < CACHE_WARN_SLOTS) cache_warned[cache_warned_count++] = id;
    else if (first) first = 0;
    pthread_mutex_unlock(&cache_warn_lock);
    return first;
}

static void cache_warn_unusable(const char *dir, const char *what, int err)
{
    if (!cache_first_warning(dir)) return;
    log_msg(LOG_WARN, "cache directory '%s' is unusable (%s: %s); kernels stay in memory only",
            dir, what, strerror(err));
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
static cache_read_result cache_read_entry(const char *path, const void *want, size_t want_len,
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
static void cache_remove_if_same(const char *path, const cache_entry *e)
{
    struct stat st;
    if (lstat(path, &st) != 0 || st.st_dev != e->dev || st.st_ino != e->ino) return;
    (void)unlink(path);
}

/* ---- load and store --------------------------------------------------------------------- */

flce_status cache_load(const char *dir, const void *key, size_t key_len, void **blob, size_t *len)
{
    char path[CACHE_PATH_MAX];
    cache_entry e;
    if (!blob || !len)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_load: blob and len must not be NULL");
    *blob = NULL;
    *len = 0;
    if (!dir || (!key && key_len))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_load: dir=%p key=%p key_len=%zu",
                       (const void *)dir, key, key_len);
    if (!cache_entry_path(path, dir, key, key_len)) return FLCE_OK;
    switch (cache_read_entry(path, key, key_len, 1, &e)) {
    case CACHE_READ_VALID: break;
    case CACHE_READ_NOMEM:
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "cache_load: cannot allocate %zu bytes for %s",
                       e.size, path);
    case CACHE_READ_INVALID:
        log_msg(LOG_WARN, "cache entry %s is corrupt (%s); removed", path, e.why);
        cache_remove_if_same(path, &e);
        return FLCE_OK;
    case CACHE_READ_OTHER_KEY:
        log_msg(LOG_DEBUG, "cache entry %s holds another key (hash collision)", path);
        return FLCE_OK;
    case CACHE_READ_UNREADABLE: return FLCE_OK;
    }
    /* Hand back the value in the buffer already allocated: move it to the front and shrink. A
     * zero-length value still gets a non-NULL pointer, so a hit is never mistaken for a miss. */
    size_t n = (size_t)e.value_len;
    memmove(e.buf, e.value, n);
    void *shrunk = realloc(e.buf, n ? n : 1);
    *blob = shrunk ? shrunk : e.buf;
    *len = n;
    return FLCE_OK;
}

int cache_make_dirs(const char *dir)
{
    char path[CACHE_PATH_MAX];
    struct stat st;
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char saved = path[i];
        path[i] = '\0';
        /* 0777 so the user's umask decides, as with mkdir -p. */
        if (mkdir(path, 0777) != 0 && errno != EEXIST) return -1;
        path[i] = saved;
    }
    if (stat(dir, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* 0 on success; short writes are retried. */
static int cache_write_all(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) return -1;
        p += put;
        n -= (size_t)put;
    }
    return 0;
}

/* Unique among this process's threads (counter), processes (pid) and, with high probability,
 * hosts sharing the directory (clock); O_EXCL turns the rest into a retry. */
static int cache_open_temp(char *tmp, const char *path)
{
    for (int attempt = 0; attempt < CACHE_TEMP_TRIES; attempt++) {
        struct timespec ts;
        uint64_t seed[3];
        clock_gettime(CLOCK_REALTIME, &ts);
        seed[0] = (uint64_t)ts.tv_sec;
        seed[1] = (uint64_t)ts.tv_nsec;
        seed[2] = atomic_fetch_add(&cache_temp_counter, 1);
        uint64_t nonce = hash64(seed, sizeof seed, (uint64_t)getpid());
        int n = snprintf(tmp, CACHE_PATH_MAX, "%s%s%ld.%016llx", path, CACHE_TEMP_INFIX,
                         (long)getpid(), (unsigned long long)nonce);
        if (n <= 0 || n >= CACHE_PATH_MAX) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* Writes the whole entry to fd; 0 on success, else -1 with errno. */
static int cache_write_entry(int fd, const void *key, size_t key_len, const void *blob, size_t len)
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
    if (cache_write_all(fd, header, sizeof header) != 0) return -1;
    if (cache_write_all(fd, key, key_len) != 0) return -1;
    if (cache_write_all(fd, blob, len) != 0) return -1;
    return cache_write_all(fd, trailer, sizeof trailer);
}

/* cache_write_entry, or the disk-full fault of fault.h: a few bytes land, then ENOSPC (or, for
 * the stall variant, the writer blocks there until a test kills it). */
static int cache_write_entry_hooked(int fd, const void *key, size_t key_len, const void *blob,
                                    size_t len)
{
    fault_action f = fault_fire(FAULT_CACHE_WRITE);
    if (f == FAULT_PASS) return cache_write_entry(fd, key, key_len, blob, len);
    (void)cache_write_all(fd, CACHE_MAGIC, 4);
    while (f == FAULT_STALL) pause();
    errno = ENOSPC;
    return -1;
}

/* fsync is skipped on purpose: after a crash a torn entry fails its checksum and is recompiled,
 * which is cheaper than an fsync per kernel on every rank's file system. */
flce_status cache_store(const char *dir, const void *key, size_t key_len, const void *blob,
                        size_t len)
{
    char path[CACHE_PATH_MAX];
    char tmp[CACHE_PATH_MAX];
    if (!dir || (!key && key_len) || (!blob && len))
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "cache_store: dir=%p key=%p key_len=%zu blob=%p len=%zu", (const void *)dir,
                       key, key_len, blob, len);
    if (!cache_entry_path(path, dir, key, key_len)) {
        cache_warn_unusable(dir, "path too long", ENAMETOOLONG);
        return FLCE_OK;
    }
    if (cache_make_dirs(dir) != 0) {
        cache_warn_unusable(dir, "cannot create it", errno);
        return FLCE_OK;
    }
    int fd = cache_open_temp(tmp, path);
    if (fd < 0) {
        cache_warn_unusable(dir, "cannot create a file in it", errno);
        return FLCE_OK;
    }
    int failed = cache_write_entry_hooked(fd, key, key_len, blob, len);
    int err = errno;
    /* close can be where a network file system reports a failed write. */
    if (close(fd) != 0 && !failed) {
        failed = 1;
        err = errno;
    }
    if (!failed && fault_fire(FAULT_CACHE_RENAME)) {
        failed = 1;
        err = EACCES;
    }
    if (!failed && rename(tmp, path) != 0) {
        failed = 1;
        err = errno;
    }
    if (failed) {
        log_msg(LOG_WARN, "cache: writing %s failed (%s); kernel not cached", path, strerror(err));
        (void)unlink(tmp);
    }
    return FLCE_OK;
}

/* ---- directory ------------------------------------------------------------------------ */

static flce_status cache_dir_put(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s%s", a, b);
    if (n < 0 || (size_t)n >= cap)
        return err_set(FLCE_ERR_INVALID_ARGUMENT,
                       "cache directory '%s%s' is %d bytes; the buffer holds %zu", a, b, n, cap);
    return FLCE_OK;
}

flce_status cache_dir(char *out, size_t cap)
{
    const char *v;
    if (!out || cap == 0)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_dir: out=%p cap=%zu", (void *)out, cap);
    out[0] = '\0';
    if ((v = getenv("FLCE_CACHE_DIR")) && *v) return cache_dir_put(out, cap, v, "");
    /* The XDG spec says relative paths in these variables are invalid and must be ignored. */
    if ((v = getenv("XDG_CACHE_HOME")) && v[0] == '/') return cache_dir_put(out, cap, v, "/flce");
    if ((v = getenv("HOME")) && *v) return cache_dir_put(out, cap, v, "/.cache/flce");
    return err_set(FLCE_ERR_IO,
                   "no cache directory: FLCE_CACHE_DIR, XDG_CACHE_HOME and HOME are all unset");
}

/* ---- list, stat, clear ---------------------------------------------------------------- */

/* The key's first line, with control bytes shown as '?' so a terminal prints it safely. */
static void cache_key_head(const cache_entry *e, char *out, size_t cap)
{
    size_t n = 0;
    for (; n < e->key_len && n + 1 < cap && e->key[n] != '\n'; n++) {
        unsigned char c = e->key[n];
        out[n] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    out[n] = '\0';
}

typedef flce_status (*cache_name_fn)(void *user, const char *dir, const char *name);

/* Calls fn for each directory entry name. A missing directory holds nothing. */
static flce_status cache_scan(const char *dir, cache_name_fn fn, void *user)
{
    if (!dir) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache directory is NULL");
    DIR *d = opendir(dir);
    if (!d && errno == ENOENT) return FLCE_OK;
    if (!d) return err_set(FLCE_ERR_IO, "opening cache directory '%s': %s", dir, strerror(errno));
    flce_status status = FLCE_OK;
    struct dirent *de;
    while (status == FLCE_OK && (errno = 0, de = readdir(d)) != NULL)
        status = fn(user, dir, de->d_name);
    if (status == FLCE_OK && errno != 0)
        status = err_set(FLCE_ERR_IO, "reading cache directory '%s': %s", dir, strerror(errno));
    closedir(d);
    return status;
}

typedef struct cache_list_ctx {
    cache_visit_fn visit;
    void *user;
} cache_list_ctx;

static flce_status cache_list_one(void *user, const char *dir, const char *name)
{
    cache_list_ctx *ctx = user;
    char path[CACHE_PATH_MAX];
    char head[CACHE_KEY_HEAD_MAX];
    struct stat st;
    cache_entry e;
    if (!cache_is_entry_name(name) || !cache_join(path, dir, name)) return FLCE_OK;
    if (stat(path, &st) != 0) return FLCE_OK; /* removed since readdir */
    cache_read_result r = cache_read_entry(path, NULL, 0, 0, &e);
    if (r == CACHE_READ_NOMEM)
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to check %s", e.size,
                       path);
    head[0] = '\0';
    if (r == CACHE_READ_VALID) cache_key_head(&e, head, sizeof head);
    free(e.buf);
    ctx->visit(ctx->user, name, (uint64_t)st.st_size, r == CACHE_READ_VALID, head);
    return FLCE_OK;
}

flce_status cache_list(const char *dir, cache_visit_fn visit, void *user)
{
    cache_list_ctx ctx = {visit, user};
    if (!visit) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_list: visit is NULL");
    return cache_scan(dir, cache_list_one, &ctx);
}

static void cache_stat_visit(void *user, const char *file_name, uint64_t bytes, int valid,
                             const char *key_head)
{
    cache_stats *s = user;
    (void)file_name;
    (void)key_head;
    if (valid) {
        s->entries++;
        s->bytes += bytes;
    } else {
        s->invalid++;
    }
}

static flce_status cache_count_temp(void *user, const char *dir, const char *name)
{
    (void)dir;
    if (cache_is_temp_name(name)) ((cache_stats *)user)->temp_files++;
    return FLCE_OK;
}

flce_status cache_stat(const char *dir, cache_stats *out)
{
    if (!out) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_stat: out is NULL");
    memset(out, 0, sizeof *out);
    TRY(cache_list(dir, cache_stat_visit, out));
    return cache_scan(dir, cache_count_temp, out);
}

typedef struct cache_clear_ctx {
    uint64_t removed;
    flce_status status; /* first failure, reported after removing everything else */
} cache_clear_ctx;

static flce_status cache_clear_one(void *user, const char *dir, const char *name)
{
    cache_clear_ctx *ctx = user;
    char path[CACHE_PATH_MAX];
    if (!cache_is_entry_name(name) && !cache_is_temp_name(name)) return FLCE_OK;
    if (!cache_join(path, dir, name)) return FLCE_OK;
    if (unlink(path) == 0) {
        ctx->removed++;
    } else if (errno != ENOENT && ctx->status == FLCE_OK) {
        ctx->status = err_set(FLCE_ERR_IO, "removing %s: %s", path, strerror(errno));
    }
    return FLCE_OK;
}

flce_status cache_clear(const char *dir, uint64_t *removed)
{
    cache_clear_ctx ctx = {0, FLCE_OK};
    flce_status status = cache_scan(dir, cache_clear_one, &ctx);
    if (removed) *removed = ctx.removed;
    return status != FLCE_OK ? status : ctx.status;
}
