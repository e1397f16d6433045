/*
 * cache_stats.c — the persistent counters of a cache directory ("<dir>/stats.log", cache.h:
 * "persistent counters"): per-process unflushed counts, appended as one line per flush, compacted
 * under flock when the file grows, and summed back for `flce cache stats`.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "cache_consts.h"
#include "cache_internal.h"
#include "config.h"
#include "log.h"

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

void cache_stats_note_evicted(const char *dir, uint64_t evicted)
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
