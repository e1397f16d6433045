/*
 * cache.c — the on-disk kernel cache of docs/DESIGN.md §5 (contract in cache.h). jit.c calls
 * cache_load before compiling, cache_lock_entry on a miss and cache_store after; tools/cmd_cache.c
 * calls list/stat/prune/clear.
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
 * become misses; a lock that cannot be taken means compiling without it.
 *
 * Other files of ours in the directory: "<32 hex>.cubin.tmp.<pid>.<nonce>" (a store in progress,
 * or left by a killed writer) and "<32 hex>.lock" (a compile in progress; its holder removes it,
 * one killed leaves it, unheld), "stats.log" (the directory's persistent counters, appended by
 * every process that looked kernels up there; cache.h) and "stats.log.tmp.<pid>.<nonce>" (its
 * compaction in progress); both temporary names are base/atomic_file.h's. Anything else there
 * (the tune table) is never touched.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "atomic_file.h"
#include "cache.h"
#include "config.h"
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
#define CACHE_TEMP_INFIX ATOMIC_FILE_TEMP_INFIX
#define CACHE_LOCK_SUFFIX ".lock"
/* A hit refreshes the entry's mtime (its recency for the cap) when it is older than this; newer
 * ones are left alone so that ranks loading one kernel together do not all write its inode. */
#define CACHE_TOUCH_SECONDS 60
/* Automatic eviction goes down to this share of the cap, so it does not run at every store. */
#define CACHE_EVICT_TARGET_PERCENT 90
/* Directories whose scan state a process remembers (cache_after_store); past that it scans at
 * every store to the others. */
#define CACHE_SCAN_SLOTS 16
/* Polling of a held lock: first pause, longest pause. */
#define CACHE_LOCK_POLL_MIN_MS 2.0
#define CACHE_LOCK_POLL_MAX_MS 50.0
/* "<hex>.cubin.tmp.<pid>.<16 hex>" */
#define CACHE_NAME_MAX 96
/* list/cmd_cache print the key's first line; a cubin's summary line is far shorter than this. */
#define CACHE_KEY_HEAD_MAX 512
/* Distinct unusable directories one process warns about; past that it keeps quiet. */
#define CACHE_WARN_SLOTS 64

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
    time_t mtime;
    const char *why; /* reason for INVALID / UNREADABLE, for the log */
} cache_entry;

/* What one process knows about a directory's size since it last scanned it. */
typedef struct cache_scan_state {
    uint64_t id;           /* hash64 of the directory name */
    uint64_t bytes_seen;   /* entries' bytes after the last scan */
    uint64_t stored_since; /* bytes this process stored there since */
    unsigned stores_since;
} cache_scan_state;

static pthread_mutex_t cache_warn_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cache_warned[CACHE_WARN_SLOTS]; /* hash64 of each directory warned about */
static size_t cache_warned_count;

static pthread_mutex_t cache_scan_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_scan_state cache_scans[CACHE_SCAN_SLOTS];
static size_t cache_scan_count;

static pthread_mutex_t cache_counter_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_counters cache_count;

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

/* "<32 lowercase hex>.lock". */
static int cache_is_lock_name(const char *name)
{
    return strlen(name) == CACHE_HEX_DIGITS + strlen(CACHE_LOCK_SUFFIX) && cache_is_hex_name(name) &&
           strcmp(name + CACHE_HEX_DIGITS, CACHE_LOCK_SUFFIX) == 0;
}

/* flock(), or the no-locks fault of fault.h: ENOLCK, as NFS without lockd answers. */
static int cache_flock(int fd, int op)
{
    if (fault_fire(FAULT_CACHE_LOCK)) {
        errno = ENOLCK;
        return -1;
    }
    return flock(fd, op);
}

static double cache_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Seconds since `t` on the wall clock (negative when the file system's clock is ahead). */
static double cache_age_s(time_t t) { return difftime(time(NULL), t); }

static void cache_sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1e3), (long)((ms - 1e3 * (double)(time_t)(ms / 1e3)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* 0 when "<dir>/<name>" does not fit in CACHE_PATH_MAX. */
static int cache_join(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, CACHE_PATH_MAX, "%s/%s", dir, name);
    return n > 0 && n < CACHE_PATH_MAX;
}

/* "<dir>/<32 hex of hash128(key)><suffix>". */
static int cache_key_path(char *out, const char *dir, const void *key, size_t key_len,
                          const char *suffix)
{
    uint64_t h[2];
    char name[CACHE_NAME_MAX];
    hash128(key, key_len, h);
    hash128_hex(h, name);
    snprintf(name + CACHE_HEX_DIGITS, sizeof name - CACHE_HEX_DIGITS, "%s", suffix);
    return cache_join(out, dir, name);
}

static int cache_entry_path(char *out, const char *dir, const void *key, size_t key_len)
{
    return cache_key_path(out, dir, key, key_len, CACHE_SUFFIX);
}

/* What a one-time warning is about, so that one directory can get one of each. */
typedef enum cache_warning { CACHE_WARN_UNUSABLE = 0, CACHE_WARN_NO_FLOCK = 1 } cache_warning;

/* True the first time this process sees `dir` here for `what`; the caller then logs its one
 * warning. */
static int cache_first_warning(const char *dir, cache_warning what)
{
    uint64_t id = hash64(dir, strlen(dir), (uint64_t)what);
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
    if (!cache_first_warning(dir, CACHE_WARN_UNUSABLE)) return;
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

/* Looks `key` up in one directory. `writable`: a corrupt entry is removed and a hit refreshes the
 * entry's recency; read-only layers get neither. */
static flce_status cache_load_from(const char *dir, const void *key, size_t key_len, int writable,
                                   void **blob, size_t *len)
{
    char path[CACHE_PATH_MAX];
    cache_entry e;
    if (!cache_entry_path(path, dir, key, key_len)) return FLCE_OK;
    switch (cache_read_entry(path, key, key_len, 1, &e)) {
    case CACHE_READ_VALID: break;
    case CACHE_READ_NOMEM:
        return err_set(FLCE_ERR_OUT_OF_MEMORY, "cache_load: cannot allocate %zu bytes for %s",
                       e.size, path);
    case CACHE_READ_INVALID:
        if (!writable) {
            log_msg(LOG_WARN, "cache entry %s (read-only layer) is corrupt (%s); ignored", path,
                    e.why);
            return FLCE_OK;
        }
        log_msg(LOG_WARN, "cache entry %s is corrupt (%s); removed", path, e.why);
        cache_remove_if_same(path, &e);
        return FLCE_OK;
    case CACHE_READ_OTHER_KEY:
        log_msg(LOG_DEBUG, "cache entry %s holds another key (hash collision)", path);
        return FLCE_OK;
    case CACHE_READ_UNREADABLE: return FLCE_OK;
    }
    /* The least recently used entries go first when the directory is over its cap: a hit makes
     * this one recent. mtime, not atime (relatime and noatime make atime unreliable); a failure
     * (another user's file) only costs recency. */
    if (writable && cache_age_s(e.mtime) > CACHE_TOUCH_SECONDS) (void)utimensat(AT_FDCWD, path, NULL, 0);
    /* Hand back the value in the buffer already allocated: move it to the front and shrink. A
     * zero-length value still gets a non-NULL pointer, so a hit is never mistaken for a miss. */
    size_t n = (size_t)e.value_len;
    memmove(e.buf, e.value, n);
    void *shrunk = realloc(e.buf, n ? n : 1);
    *blob = shrunk ? shrunk : e.buf;
    *len = n;
    return FLCE_OK;
}

/* The read-only layers of `list` (colon-separated), in order, skipping `dir` itself. */
static flce_status cache_load_layers(const char *dir, const char *list, const void *key, size_t key_len,
                                     void **blob, size_t *len)
{
    char layer[CACHE_PATH_MAX];
    while (list && *list && !*blob) {
        size_t n = strcspn(list, ":");
        if (n > 0 && n < sizeof layer) {
            memcpy(layer, list, n);
            layer[n] = '\0';
            if (strcmp(layer, dir) != 0) TRY(cache_load_from(layer, key, key_len, 0, blob, len));
            if (*blob) log_msg(LOG_DEBUG, "cache: hit in read-only layer %s", layer);
        }
        list += n + (list[n] == ':');
    }
    return FLCE_OK;
}

flce_status cache_load(const char *dir, const void *key, size_t key_len, void **blob, size_t *len)
{
    return cache_load_ro(dir, config_env(CONFIG_CACHE_RO), key, key_len, blob, len);
}

flce_status cache_load_ro(const char *dir, const char *ro_layers, const void *key, size_t key_len, void **blob,
                          size_t *len)
{
    if (!blob || !len)
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_load: blob and len must not be NULL");
    *blob = NULL;
    *len = 0;
    if (!dir || (!key && key_len))
        return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_load: dir=%p key=%p key_len=%zu",
                       (const void *)dir, key, key_len);
    TRY(cache_load_from(dir, key, key_len, 1, blob, len));
    if (!*blob) TRY(cache_load_layers(dir, ro_layers, key, key_len, blob, len));
    pthread_mutex_lock(&cache_counter_lock);
    if (*blob) {
        cache_count.hits++;
        cache_count.hit_bytes += *len;
    } else {
        cache_count.misses++;
    }
    pthread_mutex_unlock(&cache_counter_lock);
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
    if (atomic_file_write_all(fd, header, sizeof header) != 0) return -1;
    if (atomic_file_write_all(fd, key, key_len) != 0) return -1;
    if (atomic_file_write_all(fd, blob, len) != 0) return -1;
    return atomic_file_write_all(fd, trailer, sizeof trailer);
}

typedef struct cache_entry_data {
    const void *key, *blob;
    size_t key_len, len;
} cache_entry_data;

/* atomic_file_writer.fill: cache_write_entry, or the disk-full fault of fault.h: a few bytes land,
 * then ENOSPC (or, for the stall variant, the writer blocks there until a test kills it). */
static int cache_fill_entry(int fd, void *arg)
{
    const cache_entry_data *d = arg;
    fault_action f = fault_fire(FAULT_CACHE_WRITE);
    if (f == FAULT_PASS) return cache_write_entry(fd, d->key, d->key_len, d->blob, d->len);
    (void)atomic_file_write_all(fd, CACHE_MAGIC, 4);
    while (f == FAULT_STALL) pause();
    errno = ENOSPC;
    return -1;
}

/* atomic_file_writer.before_rename: the rename fault of fault.h. */
static int cache_before_rename(void *arg)
{
    (void)arg;
    if (!fault_fire(FAULT_CACHE_RENAME)) return 0;
    errno = EACCES;
    return -1;
}

static void cache_after_store(const char *dir, const char *kept, uint64_t bytes);
static void cache_stats_note_evicted(const char *dir, uint64_t evicted);

/* No fsync (atomic_file.h): after a crash a torn entry fails its checksum and is recompiled, which
 * is cheaper than an fsync per kernel on every rank's file system. */
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
    cache_entry_data data = {key, blob, key_len, len};
    atomic_file_writer w = {cache_fill_entry, cache_before_rename, &data};
    atomic_file_stage stage = atomic_file_write(path, &w, tmp, sizeof tmp);
    if (stage == ATOMIC_FILE_CREATE) {
        cache_warn_unusable(dir, "cannot create a file in it", errno);
        return FLCE_OK;
    }
    if (stage != ATOMIC_FILE_DONE) {
        log_msg(LOG_WARN, "cache: writing %s failed (%s); kernel not cached", path,
                strerror(errno));
        return FLCE_OK;
    }
    uint64_t bytes = 32u + (uint64_t)key_len + (uint64_t)len;
    pthread_mutex_lock(&cache_counter_lock);
    cache_count.stores++;
    cache_count.store_bytes += bytes;
    pthread_mutex_unlock(&cache_counter_lock);
    cache_after_store(dir, path + strlen(path) - (CACHE_HEX_DIGITS + strlen(CACHE_SUFFIX)), bytes);
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
    if ((v = config_env(CONFIG_CACHE_DIR)) && *v) return cache_dir_put(out, cap, v, "");
    /* The XDG spec says relative paths in these variables are invalid and must be ignored. */
    if ((v = config_env(CONFIG_XDG_CACHE_HOME)) && v[0] == '/') return cache_dir_put(out, cap, v, "/flce");
    if ((v = config_env(CONFIG_HOME)) && *v) return cache_dir_put(out, cap, v, "/.cache/flce");
    return err_set(FLCE_ERR_IO,
                   "no cache directory: FLCE_CACHE_DIR, XDG_CACHE_HOME and HOME are all unset");
}

/* $TMPDIR/flce-<uid> (else /tmp/flce-<uid>), made 0700; 0 when it is a directory of ours (not a
 * link) that nobody else can write, so nobody else can plant cubins in it. */
static int cache_private_tmp(char *out, size_t cap)
{
    const char *base = config_env(CONFIG_TMPDIR);
    struct stat st;
    if (!base || base[0] != '/') base = "/tmp";
    int n = snprintf(out, cap, "%s/flce-%lu", base, (unsigned long)geteuid());
    if (n <= 0 || (size_t)n >= cap) return -1;
    if (mkdir(out, 0700) != 0 && errno != EEXIST) return -1;
    if (lstat(out, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022) != 0 || access(out, W_OK | X_OK) != 0)
        return -1;
    return 0;
}

static pthread_mutex_t cache_dir_memo_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cache_dir_memo_id;
static int cache_dir_memo_set;
static char cache_dir_memo[CACHE_PATH_MAX];

/* Identifies the values cache_dir_writable's choice depends on. */
static uint64_t cache_dir_env_id(void)
{
    static const config_id names[] = {CONFIG_XDG_CACHE_HOME, CONFIG_HOME, CONFIG_TMPDIR};
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = config_env(names[i]);
        h = hash64(v ? v : "", v ? strlen(v) + 1 : 0, h); /* unset differs from "" */
    }
    return h;
}

flce_status cache_dir_writable(char *out, size_t cap)
{
    const char *given = config_env(CONFIG_CACHE_DIR);
    if (!out || cap == 0 || (given && *given)) return cache_dir(out, cap);
    uint64_t id = cache_dir_env_id();
    char dir[CACHE_PATH_MAX], why[CACHE_PATH_MAX + 512];
    pthread_mutex_lock(&cache_dir_memo_lock);
    int memo = cache_dir_memo_set && cache_dir_memo_id == id;
    if (memo) memcpy(dir, cache_dir_memo, sizeof dir);
    pthread_mutex_unlock(&cache_dir_memo_lock);
    if (memo) return cache_dir_put(out, cap, dir, "");

    why[0] = '\0';
    if (cache_dir(dir, sizeof dir) != FLCE_OK) {
        snprintf(why, sizeof why, "%s", err_message());
        err_clear();
        dir[0] = '\0';
    } else if (cache_make_dirs(dir) != 0) {
        snprintf(why, sizeof why, "cache directory '%s' cannot be created: %s", dir, strerror(errno));
    } else if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, sizeof why, "cache directory '%s' is not writable: %s", dir, strerror(errno));
    }
    if (why[0]) {
        char tmp[CACHE_PATH_MAX];
        if (cache_private_tmp(tmp, sizeof tmp) == 0) {
            if (cache_first_warning(tmp, CACHE_WARN_UNUSABLE))
                log_msg(LOG_WARN, "%s; using %s instead (set FLCE_CACHE_DIR to choose)", why, tmp);
            memcpy(dir, tmp, sizeof dir);
        } else if (!dir[0]) {
            return err_set(FLCE_ERR_IO, "%s, and %s is not a private directory of this user", why,
                           tmp);
        } /* else: keep the default; its stores will warn and stay in memory */
    }
    pthread_mutex_lock(&cache_dir_memo_lock);
    memcpy(cache_dir_memo, dir, sizeof dir);
    cache_dir_memo_id = id;
    cache_dir_memo_set = 1;
    pthread_mutex_unlock(&cache_dir_memo_lock);
    return cache_dir_put(out, cap, dir, "");
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
    if (cache_is_lock_name(name)) ((cache_stats *)user)->lock_files++;
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
    size_t stats_len = strlen(CACHE_STATS_FILE);
    int stats = !strncmp(name, CACHE_STATS_FILE, stats_len) &&
                (!name[stats_len] || !strncmp(name + stats_len, CACHE_TEMP_INFIX, strlen(CACHE_TEMP_INFIX)));
    if (!cache_is_entry_name(name) && !cache_is_temp_name(name) && !cache_is_lock_name(name) && !stats)
        return FLCE_OK;
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

/* ---- compile lock ----------------------------------------------------------------------- */

/* $FLCE_CACHE_LOCK_TIMEOUT in seconds (fractions allowed); 0 turns locking off. */
static double cache_lock_timeout_s(void)
{
    const char *v = config_env(CONFIG_CACHE_LOCK_TIMEOUT);
    char *end;
    if (!v || !*v) return CACHE_DEFAULT_LOCK_TIMEOUT_S;
    double t = strtod(v, &end);
    if (end == v || *end || !(t >= 0)) return CACHE_DEFAULT_LOCK_TIMEOUT_S;
    return t;
}

static int cache_same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* The holder's pid as it wrote it into the lock file, for messages ("?" when unreadable). */
static void cache_lock_holder(int fd, char *out, size_t cap)
{
    ssize_t n = pread(fd, out, cap - 1, 0);
    if (n <= 0) n = 0;
    out[n] = '\0';
    out[strcspn(out, "\n")] = '\0';
    if (!out[0]) snprintf(out, cap, "?");
}

/* flock refused (ENOLCK, EOPNOTSUPP, ENOSYS...: a file system without locks): the caller compiles
 * without the lock, and says so once per directory. The file just opened (created, most likely)
 * is removed if nobody ever held it (a holder writes its pid into it), so such a directory does
 * not collect one lock file per kernel that nothing could ever prune. */
static void cache_lock_refused(const char *dir, const char *path, int fd, const struct stat *mine, int err)
{
    struct stat now;
    if (cache_first_warning(dir, CACHE_WARN_NO_FLOCK))
        log_msg(LOG_WARN, "cache: the file system of '%s' refuses flock (%s); compiling without the "
                "compile lock (processes missing a kernel at once may each compile it; entries stay whole)",
                dir, strerror(err));
    else
        log_msg(LOG_DEBUG, "cache: no compile lock %s (flock: %s)", path, strerror(err));
    if (fstat(fd, &now) == 0 && now.st_size == 0 && cache_same_file(&now, mine) &&
        stat(path, &now) == 0 && cache_same_file(&now, mine))
        (void)unlink(path);
}

/* Polls flock(LOCK_NB) rather than blocking in flock(): the wait must be bounded, a lock file
 * replaced or removed meanwhile must be followed to the new one, and a hung holder noticed. */
int cache_lock_entry(const char *dir, const void *key, size_t key_len, cache_entry_lock *lk)
{
    memset(lk, 0, offsetof(cache_entry_lock, path));
    lk->fd = -1;
    lk->path[0] = '\0';
    double timeout = cache_lock_timeout_s();
    if (timeout <= 0 || !dir || (!key && key_len)) return 0;
    if (!cache_key_path(lk->path, dir, key, key_len, CACHE_LOCK_SUFFIX)) return 0;
    if (cache_make_dirs(dir) != 0) return 0; /* cache_store will say the directory is unusable */
    double t0 = cache_now_ms(), pause = CACHE_LOCK_POLL_MIN_MS;
    int fd = -1, held = 0, waited = 0, broke = 0;
    struct stat mine, now;
    char holder[32];
    for (;;) {
        if (fd < 0) {
            fd = open(lk->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0 && errno == EACCES) fd = open(lk->path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) break; /* a read-only directory: compile without the lock */
            if (fstat(fd, &mine) != 0) break;
        }
        if (cache_flock(fd, LOCK_EX | LOCK_NB) == 0) {
            /* Ours only if the file is still the one at the path: a holder removes it before it
             * unlocks, and a waiter that breaks a stale lock removes it. */
            if (stat(lk->path, &now) == 0 && cache_same_file(&now, &mine)) {
                held = 1;
                break;
            }
            close(fd);
            fd = -1;
            continue;
        }
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK) {
            cache_lock_refused(dir, lk->path, fd, &mine, errno);
            break;
        }
        if (stat(lk->path, &now) != 0 || !cache_same_file(&now, &mine)) {
            close(fd); /* removed or replaced since we opened it: lock what is there now */
            fd = -1;
            continue;
        }
        if (!broke && cache_age_s(now.st_mtime) > timeout) {
            cache_lock_holder(fd, holder, sizeof holder);
            log_msg(LOG_WARN, "cache: compile lock %s is %.0f s old (pid %s hung?); breaking it",
                    lk->path, cache_age_s(now.st_mtime), holder);
            if (stat(lk->path, &now) == 0 && cache_same_file(&now, &mine)) (void)unlink(lk->path);
            broke = 1;
            close(fd);
            fd = -1;
            continue;
        }
        double waited_ms = cache_now_ms() - t0;
        if (waited_ms > timeout * 1e3) {
            cache_lock_holder(fd, holder, sizeof holder);
            log_msg(LOG_WARN, "cache: waited %.0f s for compile lock %s (pid %s); compiling without it",
                    waited_ms / 1e3, lk->path, holder);
            break;
        }
        if (!waited) {
            cache_lock_holder(fd, holder, sizeof holder);
            log_msg(LOG_INFO, "cache: pid %s is compiling this kernel (%s); waiting for it", holder,
                    lk->path);
            waited = 1;
        }
        cache_sleep_ms(pause);
        pause = pause * 1.5 < CACHE_LOCK_POLL_MAX_MS ? pause * 1.5 : CACHE_LOCK_POLL_MAX_MS;
    }
    if (waited) {
        lk->waited_ms = cache_now_ms() - t0;
        pthread_mutex_lock(&cache_counter_lock);
        cache_count.lock_waits++;
        cache_count.lock_wait_ms += lk->waited_ms;
        pthread_mutex_unlock(&cache_counter_lock);
    }
    if (!held) {
        if (fd >= 0) close(fd);
        return 0;
    }
    lk->fd = fd;
    lk->dev = mine.st_dev;
    lk->ino = mine.st_ino;
    /* A fresh mtime: waiters judge a hung holder by it. The pid is for messages and people. */
    char text[32];
    int n = snprintf(text, sizeof text, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) (void)futimens(fd, NULL);
    return 1;
}

void cache_unlock_entry(cache_entry_lock *lk)
{
    struct stat st;
    if (!lk || lk->fd < 0) return;
    /* Removed first, so the directory keeps no lock files; a waiter that then gets the old file's
     * lock sees it gone and locks a new one (cache_lock_entry). */
    if (stat(lk->path, &st) == 0 && st.st_dev == lk->dev && st.st_ino == lk->ino) (void)unlink(lk->path);
    close(lk->fd);
    lk->fd = -1;
}

/* Removes a lock file nobody holds that is older than CACHE_STALE_SECONDS (its holder was killed);
 * 1 when removed. Taking the lock first makes sure no holder loses it. */
static int cache_remove_stale_lock(const char *path)
{
    struct stat st, mine;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || cache_age_s(st.st_mtime) <= CACHE_STALE_SECONDS)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int removed = 0;
    /* Locked by us, or a file system that refuses flock: then nobody can hold it either. */
    int ours = cache_flock(fd, LOCK_EX | LOCK_NB) == 0 || (errno != EWOULDBLOCK && errno != EINTR);
    if (ours && fstat(fd, &mine) == 0 && lstat(path, &st) == 0 && cache_same_file(&st, &mine))
        removed = unlink(path) == 0;
    close(fd);
    return removed;
}

/* ---- size cap, eviction, stale files ----------------------------------------------------- */

uint64_t cache_max_bytes(void)
{
    const char *v = config_env(CONFIG_CACHE_MAX_MIB);
    char *end;
    if (!v || !*v || *v == '-') return (uint64_t)CACHE_DEFAULT_MAX_MIB << 20;
    errno = 0;
    unsigned long long mib = strtoull(v, &end, 10);
    if (end == v || *end || errno) return (uint64_t)CACHE_DEFAULT_MAX_MIB << 20;
    if (mib > (UINT64_MAX >> 20)) mib = UINT64_MAX >> 20;
    return (uint64_t)mib << 20;
}

/* One entry file as a scan saw it. */
typedef struct cache_file {
    char name[CACHE_HEX_DIGITS + sizeof CACHE_SUFFIX];
    uint64_t bytes;
    struct timespec mtime;
    dev_t dev;
    ino_t ino;
} cache_file;

typedef struct cache_prune_ctx {
    cache_file *files;
    size_t n, cap;
    uint64_t total;
    int check; /* read and check every entry (cache_prune), or only stat them (stores) */
    cache_prune_result *r;
} cache_prune_ctx;

static flce_status cache_prune_one(void *user, const char *dir, const char *name)
{
    cache_prune_ctx *c = user;
    char path[CACHE_PATH_MAX];
    struct stat st;
    if (!cache_join(path, dir, name)) return FLCE_OK;
    if (cache_is_temp_name(name)) {
        /* A store renames its temp file within moments; one this old lost its writer. */
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
            cache_age_s(st.st_mtime) > CACHE_STALE_SECONDS && unlink(path) == 0)
            c->r->temp_removed++;
        return FLCE_OK;
    }
    if (cache_is_lock_name(name)) {
        c->r->locks_removed += (uint64_t)cache_remove_stale_lock(path);
        return FLCE_OK;
    }
    if (!cache_is_entry_name(name) || lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) return FLCE_OK;
    if (c->check) {
        cache_entry e;
        cache_read_result res = cache_read_entry(path, NULL, 0, 0, &e);
        free(e.buf);
        if (res == CACHE_READ_NOMEM)
            return err_set(FLCE_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to check %s", e.size,
                           path);
        if (res == CACHE_READ_INVALID) {
            log_msg(LOG_INFO, "cache entry %s is corrupt (%s); removed", path, e.why);
            cache_remove_if_same(path, &e);
            c->r->invalid_removed++;
            return FLCE_OK;
        }
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        cache_file *grown = realloc(c->files, cap * sizeof *grown);
        if (!grown) return err_set(FLCE_ERR_OUT_OF_MEMORY, "scanning %s: out of host memory", dir);
        c->files = grown;
        c->cap = cap;
    }
    cache_file *f = &c->files[c->n++];
    memcpy(f->name, name, sizeof f->name);
    f->bytes = (uint64_t)st.st_size;
    f->mtime = st.st_mtim;
    f->dev = st.st_dev;
    f->ino = st.st_ino;
    c->total += f->bytes;
    return FLCE_OK;
}

/* Least recently used first; the name breaks ties so the order is the same for everyone. */
static int cache_file_order(const void *pa, const void *pb)
{
    const cache_file *a = pa, *b = pb;
    if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
    if (a->mtime.tv_nsec != b->mtime.tv_nsec) return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Removes the least recently used entries until the rest take at most `target` bytes. `kept` (the
 * entry a store just wrote) stays; so does an entry used (mtime) or replaced (inode) since the
 * scan. */
static void cache_evict(const char *dir, cache_prune_ctx *c, uint64_t target, const char *kept)
{
    char path[CACHE_PATH_MAX];
    qsort(c->files, c->n, sizeof *c->files, cache_file_order);
    for (size_t i = 0; i < c->n && c->total > target; i++) {
        const cache_file *f = &c->files[i];
        struct stat st;
        if ((kept && !strcmp(f->name, kept)) || !cache_join(path, dir, f->name)) continue;
        if (lstat(path, &st) != 0) {
            c->total -= f->bytes; /* someone else removed it */
            c->r->entries--;
            continue;
        }
        if (st.st_dev != f->dev || st.st_ino != f->ino || st.st_mtim.tv_sec != f->mtime.tv_sec ||
            st.st_mtim.tv_nsec != f->mtime.tv_nsec)
            continue;
        if (unlink(path) != 0) continue;
        log_msg(LOG_DEBUG, "cache: evicted %s (%llu bytes)", path, (unsigned long long)f->bytes);
        c->total -= f->bytes;
        c->r->entries--;
        c->r->evicted++;
        c->r->evicted_bytes += f->bytes;
    }
}

/* Scans `dir`; over `trigger` bytes of entries (0: never), evicts down to `target`. */
static flce_status cache_prune_dir(const char *dir, uint64_t trigger, uint64_t target,
                                   const char *kept, int check, cache_prune_result *r)
{
    cache_prune_ctx c = {NULL, 0, 0, 0, check, r};
    memset(r, 0, sizeof *r);
    flce_status status = cache_scan(dir, cache_prune_one, &c);
    r->entries = c.n;
    if (status == FLCE_OK && trigger && c.total > trigger) cache_evict(dir, &c, target, kept);
    r->bytes = c.total;
    free(c.files);
    if (r->evicted) {
        pthread_mutex_lock(&cache_counter_lock);
        cache_count.evicted += r->evicted;
        cache_count.evicted_bytes += r->evicted_bytes;
        pthread_mutex_unlock(&cache_counter_lock);
    }
    return status;
}

flce_status cache_prune(const char *dir, uint64_t max_bytes, cache_prune_result *out)
{
    cache_prune_result r;
    if (!dir) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_prune: dir is NULL");
    flce_status status = cache_prune_dir(dir, max_bytes, max_bytes, NULL, 1, &r);
    if (out) *out = r;
    return status;
}

/* After a store: scan and evict when this process's view of the directory says it may be over
 * its cap (cache.h, "Size cap"). */
static void cache_after_store(const char *dir, const char *kept, uint64_t bytes)
{
    uint64_t cap = cache_max_bytes();
    if (!cap) return;
    uint64_t id = hash64(dir, strlen(dir), 0);
    int scan = 1;
    pthread_mutex_lock(&cache_scan_lock);
    cache_scan_state *s = NULL;
    for (size_t i = 0; i < cache_scan_count && !s; i++)
        if (cache_scans[i].id == id) s = &cache_scans[i];
    if (s) {
        s->stored_since += bytes;
        s->stores_since++;
        scan = s->stores_since >= CACHE_SCAN_STORES ||
               s->bytes_seen >= cap || 4 * s->stored_since > cap - s->bytes_seen;
    }
    pthread_mutex_unlock(&cache_scan_lock);
    if (!scan) return;
    cache_prune_result r;
    if (cache_prune_dir(dir, cap, cap / 100 * CACHE_EVICT_TARGET_PERCENT, kept, 0, &r) != FLCE_OK) {
        err_clear(); /* the store itself worked; the next one scans again */
        return;
    }
    cache_stats_note_evicted(dir, r.evicted);
    if (r.evicted)
        log_msg(LOG_INFO,
                "cache: %s was over its cap of %llu MiB: removed %llu least recently used "
                "entries (%.1f MiB)",
                dir, (unsigned long long)(cap >> 20), (unsigned long long)r.evicted,
                (double)r.evicted_bytes / (1024.0 * 1024.0));
    if (r.temp_removed || r.locks_removed)
        log_msg(LOG_INFO, "cache: removed %llu stale temporary and %llu stale lock files in %s",
                (unsigned long long)r.temp_removed, (unsigned long long)r.locks_removed, dir);
    pthread_mutex_lock(&cache_scan_lock);
    s = NULL;
    for (size_t i = 0; i < cache_scan_count && !s; i++)
        if (cache_scans[i].id == id) s = &cache_scans[i];
    if (!s && cache_scan_count < CACHE_SCAN_SLOTS) {
        s = &cache_scans[cache_scan_count++];
        s->id = id;
    }
    if (s) {
        s->bytes_seen = r.bytes;
        s->stored_since = 0;
        s->stores_since = 0;
    }
    pthread_mutex_unlock(&cache_scan_lock);
}

/* ---- counters --------------------------------------------------------------------------- */

void cache_counters_get(cache_counters *out)
{
    pthread_mutex_lock(&cache_counter_lock);
    *out = cache_count;
    pthread_mutex_unlock(&cache_counter_lock);
}

void cache_note_compile(double ms, double cpu_ms)
{
    pthread_mutex_lock(&cache_counter_lock);
    cache_count.compiles++;
    cache_count.compile_ms += ms;
    if (cpu_ms > 0) cache_count.compile_cpu_ms += cpu_ms;
    pthread_mutex_unlock(&cache_counter_lock);
}

/* ---- persistent counters of a directory (cache.h: "persistent counters") ------------------ */

/* Directories whose unflushed counts one process keeps; an event for another one is written at
 * once. */
#define CACHE_STATS_SLOTS 16
#define CACHE_STATS_TAG "flce-stats 1 "
#define CACHE_STATS_LINE_MAX 256
/* How long an appender waits for a compaction holding the file (it takes milliseconds). */
#define CACHE_STATS_LOCK_WAIT_MS 500.0
/* The most of a stats file read back (far more than CACHE_STATS_COMPACT_BYTES allows to grow). */
#define CACHE_STATS_READ_MAX (16u << 20)

typedef struct cache_stats_slot {
    char dir[CACHE_PATH_MAX];
    cache_dir_counters c; /* lookups, misses and records unused until merged */
} cache_stats_slot;

static pthread_mutex_t cache_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static cache_stats_slot cache_stats_slots[CACHE_STATS_SLOTS];
static size_t cache_stats_used;
static pid_t cache_stats_pid; /* the process the slots' counts belong to (not a forked child) */
static pthread_once_t cache_stats_once = PTHREAD_ONCE_INIT;

static int cache_stats_enabled(void)
{
    return config_env_bool(CONFIG_CACHE_STATS); /* read at each use */
}

static int cache_stats_pending(const cache_dir_counters *c)
{
    return c->hits || c->waited || c->compiles || c->evicted || c->wait_ms > 0;
}

/* One line: tag, records, hits, waited, compiles, compile ms, wait ms, evicted, pid, compile CPU
 * ms. The CPU ms came later than the rest, so it goes after the pid: a reader of the older format
 * (which ignores what follows the pid) still counts these lines, and this one reads old lines,
 * which end at the pid, with no CPU time. Further fields go after it, for the same reason. */
static int cache_stats_format(char *line, size_t cap, const cache_dir_counters *c, uint64_t records)
{
    int n = snprintf(line, cap, CACHE_STATS_TAG "%llu %llu %llu %llu %.3f %.3f %llu %ld %.3f\n",
                     (unsigned long long)records, (unsigned long long)c->hits,
                     (unsigned long long)c->waited, (unsigned long long)c->compiles, c->compile_ms,
                     c->wait_ms, (unsigned long long)c->evicted, (long)getpid(), c->compile_cpu_ms);
    return n > 0 && (size_t)n < cap ? n : 0;
}

/* Adds every well-formed line of text[0, n) to *sum; a line without its newline (an append in
 * progress, a torn write) or of another format is skipped. */
static void cache_stats_parse(const char *text, size_t n, cache_dir_counters *sum)
{
    size_t tag = strlen(CACHE_STATS_TAG);
    for (size_t at = 0; at < n;) {
        const char *nl = memchr(text + at, '\n', n - at);
        if (!nl) break;
        size_t len = (size_t)(nl - (text + at));
        char line[CACHE_STATS_LINE_MAX];
        unsigned long long rec, hits, waited, compiles, evicted;
        double cms, wms, cpu = 0;
        long pid;
        if (len > tag && len < sizeof line && !memcmp(text + at, CACHE_STATS_TAG, tag)) {
            memcpy(line, text + at, len);
            line[len] = '\0';
            /* 8 fields: a line of the format before the CPU time (cache_stats_format), cpu = 0. */
            int got = sscanf(line + tag, "%llu %llu %llu %llu %lf %lf %llu %ld %lf", &rec, &hits, &waited,
                             &compiles, &cms, &wms, &evicted, &pid, &cpu);
            if ((got == 8 || got == 9) && cms >= 0 && wms >= 0 && cpu >= 0) {
                sum->records += rec;
                sum->hits += hits;
                sum->waited += waited;
                sum->compiles += compiles;
                sum->compile_ms += cms;
                sum->compile_cpu_ms += cpu;
                sum->wait_ms += wms;
                sum->evicted += evicted;
            }
        }
        at += len + 1;
    }
}

/* The whole file behind fd (at most CACHE_STATS_READ_MAX bytes), malloc'd; NULL on failure. */
static char *cache_stats_slurp(int fd, size_t *n)
{
    struct stat st;
    *n = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return NULL;
    size_t want = (uint64_t)st.st_size > CACHE_STATS_READ_MAX ? CACHE_STATS_READ_MAX : (size_t)st.st_size;
    char *buf = malloc(want ? want : 1);
    if (!buf) return NULL;
    size_t got = 0;
    while (got < want) {
        ssize_t r = pread(fd, buf + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    *n = got;
    return buf;
}

/* flock(op | LOCK_NB) polled for up to CACHE_STATS_LOCK_WAIT_MS; 1 when held. */
static int cache_stats_flock(int fd, int op)
{
    double t0 = cache_now_ms(), pause = CACHE_LOCK_POLL_MIN_MS;
    for (;;) {
        if (cache_flock(fd, op | LOCK_NB) == 0) return 1;
        if (errno == EINTR) continue;
        if (errno != EWOULDBLOCK || cache_now_ms() - t0 > CACHE_STATS_LOCK_WAIT_MS) return 0;
        cache_sleep_ms(pause);
        pause = pause * 2 < CACHE_LOCK_POLL_MAX_MS ? pause * 2 : CACHE_LOCK_POLL_MAX_MS;
    }
}

typedef struct cache_stats_text {
    const char *p;
    size_t n;
} cache_stats_text;

/* atomic_file_writer.fill of the compacted stats.log. */
static int cache_stats_fill(int fd, void *arg)
{
    const cache_stats_text *t = arg;
    return atomic_file_write_all(fd, t->p, t->n);
}

/* Folds the file at `path` into one line, unless someone else is compacting it. Appenders hold
 * the lock shared while they write, so no line lands in the old file after it was read. */
static void cache_stats_compact(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat mine, now;
    if (cache_flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &mine) != 0 || stat(path, &now) != 0 ||
        !cache_same_file(&mine, &now) || (uint64_t)mine.st_size <= CACHE_STATS_COMPACT_BYTES) {
        close(fd);
        return;
    }
    size_t n;
    char *text = cache_stats_slurp(fd, &n);
    cache_dir_counters sum;
    memset(&sum, 0, sizeof sum);
    if (text) cache_stats_parse(text, n, &sum);
    free(text);
    char line[CACHE_STATS_LINE_MAX], tmp[CACHE_PATH_MAX + 32];
    int len = cache_stats_format(line, sizeof line, &sum, sum.records);
    if (text && len) {
        cache_stats_text t = {line, (size_t)len};
        atomic_file_writer w = {cache_stats_fill, NULL, &t};
        (void)atomic_file_write(path, &w, tmp, sizeof tmp); /* a failure leaves the long file */
    }
    close(fd);
}

/* Appends one line to <dir>/stats.log; silently nothing when the directory cannot be written. */
static void cache_stats_append(const char *dir, const char *line, size_t n)
{
    char path[CACHE_PATH_MAX];
    if (!cache_join(path, dir, CACHE_STATS_FILE)) return;
    for (int attempt = 0; attempt < 4; attempt++) {
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return; /* no directory (removed, never made) or not writable */
        struct stat mine, now;
        int locked = cache_stats_flock(fd, LOCK_SH);
        if (locked && (fstat(fd, &mine) != 0 || stat(path, &now) != 0 || !cache_same_file(&mine, &now))) {
            close(fd); /* a compaction replaced the file since we opened it: append to the new one */
            continue;
        }
        int ok = atomic_file_write_all(fd, line, n) == 0;
        uint64_t size = fstat(fd, &mine) == 0 ? (uint64_t)mine.st_size : 0;
        close(fd);
        if (!ok) log_msg(LOG_DEBUG, "cache: could not append to %s: %s", path, strerror(errno));
        if (ok && size > CACHE_STATS_COMPACT_BYTES) cache_stats_compact(path);
        return;
    }
}

/* Writes slot s and zeroes it; called with cache_stats_lock held. */
static void cache_stats_write_slot(cache_stats_slot *s)
{
    char line[CACHE_STATS_LINE_MAX];
    if (!cache_stats_pending(&s->c)) return;
    int n = cache_stats_format(line, sizeof line, &s->c, 1);
    if (n) cache_stats_append(s->dir, line, (size_t)n);
    memset(&s->c, 0, sizeof s->c);
}

void cache_stats_flush(void)
{
    pthread_mutex_lock(&cache_stats_lock);
    if (cache_stats_pid == getpid())
        for (size_t i = 0; i < cache_stats_used; i++) cache_stats_write_slot(&cache_stats_slots[i]);
    pthread_mutex_unlock(&cache_stats_lock);
}

static void cache_stats_at_exit(void) { cache_stats_flush(); }

static void cache_stats_register(void) { (void)atexit(cache_stats_at_exit); }

/* The slot of `dir` (made if there is room), with cache_stats_lock held; NULL when the table is
 * full. A forked child drops the counts it inherited: they are its parent's to write. */
static cache_stats_slot *cache_stats_slot_of(const char *dir)
{
    if (cache_stats_pid != getpid()) {
        cache_stats_used = 0;
        cache_stats_pid = getpid();
    }
    for (size_t i = 0; i < cache_stats_used; i++)
        if (!strcmp(cache_stats_slots[i].dir, dir)) return &cache_stats_slots[i];
    if (cache_stats_used == CACHE_STATS_SLOTS || strlen(dir) >= CACHE_PATH_MAX) return NULL;
    cache_stats_slot *s = &cache_stats_slots[cache_stats_used++];
    memset(s, 0, sizeof *s);
    memcpy(s->dir, dir, strlen(dir) + 1);
    return s;
}

/* Adds d to dir's unflushed counts; writes them when they are many or there is no slot. */
static void cache_stats_add(const char *dir, const cache_dir_counters *d)
{
    if (!dir || !*dir || !cache_stats_enabled()) return;
    pthread_once(&cache_stats_once, cache_stats_register);
    pthread_mutex_lock(&cache_stats_lock);
    cache_stats_slot *s = cache_stats_slot_of(dir), spill;
    if (!s) {
        memset(&spill, 0, sizeof spill);
        memcpy(spill.dir, dir, strlen(dir) + 1);
        s = &spill;
    }
    s->c.hits += d->hits;
    s->c.waited += d->waited;
    s->c.compiles += d->compiles;
    s->c.compile_ms += d->compile_ms;
    s->c.compile_cpu_ms += d->compile_cpu_ms;
    s->c.wait_ms += d->wait_ms;
    s->c.evicted += d->evicted;
    if (s == &spill || s->c.hits + s->c.waited + s->c.compiles >= CACHE_STATS_FLUSH_EVENTS)
        cache_stats_write_slot(s);
    pthread_mutex_unlock(&cache_stats_lock);
}

void cache_stats_note(const char *dir, cache_outcome outcome, double compile_ms, double compile_cpu_ms,
                      double wait_ms)
{
    cache_dir_counters d;
    memset(&d, 0, sizeof d);
    d.hits = outcome == CACHE_OUTCOME_HIT;
    d.waited = outcome == CACHE_OUTCOME_WAITED;
    d.compiles = outcome == CACHE_OUTCOME_COMPILED;
    d.compile_ms = outcome == CACHE_OUTCOME_COMPILED && compile_ms > 0 ? compile_ms : 0;
    d.compile_cpu_ms = outcome == CACHE_OUTCOME_COMPILED && compile_cpu_ms > 0 ? compile_cpu_ms : 0;
    d.wait_ms = wait_ms > 0 ? wait_ms : 0;
    cache_stats_add(dir, &d);
}

static void cache_stats_note_evicted(const char *dir, uint64_t evicted)
{
    cache_dir_counters d;
    memset(&d, 0, sizeof d);
    d.evicted = evicted;
    if (evicted) cache_stats_add(dir, &d);
}

flce_status cache_dir_counters_read(const char *dir, cache_dir_counters *out)
{
    char path[CACHE_PATH_MAX];
    if (!dir || !out) return err_set(FLCE_ERR_INVALID_ARGUMENT, "cache_dir_counters_read: NULL");
    memset(out, 0, sizeof *out);
    if (!cache_join(path, dir, CACHE_STATS_FILE))
        return err_set(FLCE_ERR_IO, "cache directory name too long: %s", dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) return err_set(FLCE_ERR_IO, "opening %s: %s", path, strerror(errno));
    if (fd >= 0) {
        size_t n;
        char *text = cache_stats_slurp(fd, &n);
        close(fd);
        if (!text) return err_set(FLCE_ERR_IO, "reading %s: %s", path, strerror(errno));
        cache_stats_parse(text, n, out);
        free(text);
    }
    pthread_mutex_lock(&cache_stats_lock);
    for (size_t i = 0; cache_stats_pid == getpid() && i < cache_stats_used; i++) {
        const cache_dir_counters *c = &cache_stats_slots[i].c;
        if (strcmp(cache_stats_slots[i].dir, dir) || !cache_stats_pending(c)) continue;
        out->hits += c->hits, out->waited += c->waited, out->compiles += c->compiles;
        out->compile_ms += c->compile_ms, out->compile_cpu_ms += c->compile_cpu_ms;
        out->wait_ms += c->wait_ms, out->evicted += c->evicted;
        out->records++;
    }
    pthread_mutex_unlock(&cache_stats_lock);
    out->misses = out->waited + out->compiles;
    out->lookups = out->hits + out->misses;
    return FLCE_OK;
}
