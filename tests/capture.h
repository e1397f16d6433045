/* capture.h — what a piece of library code printed to stderr under a given FLCE_LOG level, for
 * tests of warnings and log lines (the library logs to stderr only). */
#ifndef FLCE_TEST_CAPTURE_H
#define FLCE_TEST_CAPTURE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"

/* Runs fn(arg) with stderr going to a temporary file and FLCE_LOG=level (given as data, config_set;
 * unset after); returns what it printed (static storage, overwritten by the next call; at most 64
 * KiB). */
static inline const char *capture_stderr(const char *level, void (*fn)(void *), void *arg)
{
    static char text[1 << 16];
    char path[] = "/tmp/flce-test-err.XXXXXX";
    int fd = mkstemp(path);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    config_set(CONFIG_LOG, level);
    fn(arg);
    config_set(CONFIG_LOG, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, text, sizeof text - 1);
    text[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return text;
}

#endif
