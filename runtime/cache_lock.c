/*
 * cache_lock.c — the compile lock of one entry ("<32 hex>.lock", held with flock) and the
 * flock, clock and sleep helpers the lock and the stats file share. The lock only saves work
 * (cache.h): every way it can fail ends in compiling without it, never in an error.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache_counters.h"
#include "cache_consts.h"
#include "cache_internal.h"
#include "config.h"
#include "fault.h"
#include "log.h"

/* flock(), or the no-locks fault of fault.h: ENOLCK, as NFS without lockd answers. */
int cache_flock(int fd, int op)
{
    if (fault_fire(FAULT_CACHE_LOCK)) {
        errno = ENOLCK;
        return -1;
    }
    return flock(fd, op);
}

double cache_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Seconds since `t` on the wall clock (negative when the file system's clock is ahead). */
double cache_age_s(time_t t) { return difftime(time(NULL), t); }

void cache_sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1e3), (long)((ms - 1e3 * (double)(time_t)(ms / 1e3)) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
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

int cache_same_file(const struct stat *a, const struct stat *b)
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
        cache_count_lock_wait(lk->waited_ms);
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
int cache_remove_stale_lock(const char *path)
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
