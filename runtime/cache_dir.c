/*
 * cache_dir.c — where the disk cache lives and how its directory is walked: the choice of
 * directory (cache_dir, cache_dir_writable and its private fallback under $TMPDIR), mkdir -p,
 * path joining, the directory scan every listing and prune uses, and the once-per-directory
 * warnings, so that a cache that cannot be written says so once and then stays quiet.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache_consts.h"
#include "cache_internal.h"
#include "config.h"
#include "hash.h"
#include "log.h"

/* Distinct unusable directories one process warns about; past that it keeps quiet. */
#define CACHE_WARN_SLOTS 64

static pthread_mutex_t cache_warn_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cache_warned[CACHE_WARN_SLOTS]; /* hash64 of each directory warned about */
static size_t cache_warned_count;

/* 0 when "<dir>/<name>" does not fit in CACHE_PATH_MAX. */
int cache_join(char *out, const char *dir, const char *name)
{
    int n = snprintf(out, CACHE_PATH_MAX, "%s/%s", dir, name);
    return n > 0 && n < CACHE_PATH_MAX;
}

/* True the first time this process sees `dir` here for `what`; the caller then logs its one
 * warning. */
int cache_first_warning(const char *dir, cache_warning what)
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

void cache_warn_unusable(const char *dir, const char *what, int err)
{
    if (!cache_first_warning(dir, CACHE_WARN_UNUSABLE)) return;
    log_msg(LOG_WARN, "cache directory '%s' is unusable (%s: %s); kernels stay in memory only",
            dir, what, strerror(err));
}

/* Calls fn for each directory entry name. A missing directory holds nothing. */
flce_status cache_scan(const char *dir, cache_name_fn fn, void *user)
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

/* ---- which directory -------------------------------------------------------------------- */

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
