/* error.c — the thread-local last-error message behind flce_last_error() (see error.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

#define ERR_CAP 4096

static _Thread_local char err_buf[ERR_CAP];

flce_status err_set(flce_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return status;
}

flce_status err_wrap(flce_status status, const char *fmt, ...)
{
    char prefix[1024];
    char old[ERR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old);
    size_t n = strlen(prefix);
    memcpy(err_buf, prefix, n);
    memcpy(err_buf + n, ": ", 2);
    size_t room = sizeof err_buf - n - 3;
    size_t m = strnlen(old, room);
    memcpy(err_buf + n + 2, old, m);
    err_buf[n + 2 + m] = '\0';
    return status;
}

void err_clear(void) { err_buf[0] = '\0'; }

const char *err_message(void) { return err_buf; }
