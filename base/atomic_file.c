/* atomic_file.c — temp-file-and-rename replacement of a file (see atomic_file.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "atomic_file.h"
#include "hash.h"

/* O_EXCL retries when a temp name is taken (only another host sharing the directory over a
 * network file system, with the same pid, could cause one). */
#define ATOMIC_FILE_TEMP_TRIES 8

static atomic_uint_fast64_t atomic_file_counter;

int atomic_file_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
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
static int atomic_file_open_temp(const char *path, char *tmp, size_t cap)
{
    for (int attempt = 0; attempt < ATOMIC_FILE_TEMP_TRIES; attempt++) {
        struct timespec ts;
        uint64_t seed[3];
        clock_gettime(CLOCK_REALTIME, &ts);
        seed[0] = (uint64_t)ts.tv_sec;
        seed[1] = (uint64_t)ts.tv_nsec;
        seed[2] = atomic_fetch_add(&atomic_file_counter, 1);
        uint64_t nonce = hash64(seed, sizeof seed, (uint64_t)getpid());
        int n = snprintf(tmp, cap, "%s%s%ld.%016llx", path, ATOMIC_FILE_TEMP_INFIX, (long)getpid(),
                         (unsigned long long)nonce);
        if (n <= 0 || (size_t)n >= cap) {
            if (cap) tmp[0] = '\0';
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    return -1;
}

/* Removes the temporary file of a failed write, keeping the failure's errno. */
static atomic_file_stage atomic_file_fail(atomic_file_stage stage, int err, const char *tmp)
{
    (void)unlink(tmp);
    errno = err;
    return stage;
}

atomic_file_stage atomic_file_write(const char *path, const atomic_file_writer *w, char *tmp,
                                    size_t cap)
{
    int fd = atomic_file_open_temp(path, tmp, cap);
    if (fd < 0) return ATOMIC_FILE_CREATE;
    int failed = w->fill(fd, w->arg) != 0;
    int err = errno;
    /* close can be where a network file system reports a failed write. */
    if (close(fd) != 0 && !failed) {
        failed = 1;
        err = errno;
    }
    if (failed) return atomic_file_fail(ATOMIC_FILE_WRITE, err, tmp);
    if (w->before_rename && w->before_rename(w->arg) != 0)
        return atomic_file_fail(ATOMIC_FILE_RENAME, errno, tmp);
    if (rename(tmp, path) != 0) return atomic_file_fail(ATOMIC_FILE_RENAME, errno, tmp);
    return ATOMIC_FILE_DONE;
}
