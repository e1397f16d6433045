/*
 * error.h — how failures travel inside flce: every fallible function returns flce_status, the
 * message is written where the failure is first understood (err_set), and TRY returns the first
 * failure upward. The message lives in a thread-local buffer read by flce_last_error().
 */
#ifndef FLCE_ERROR_H
#define FLCE_ERROR_H

#include "flce.h"

#if defined(__GNUC__)
#define FLCE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FLCE_PRINTF(a, b)
#endif

/* Sets this thread's message (printf-style) and returns `status`, so callers can write
 * `return err_set(FLCE_ERR_INVALID_ARGUMENT, "hidden=%lld: must be a multiple of 8", d);` */
flce_status err_set(flce_status status, const char *fmt, ...) FLCE_PRINTF(2, 3);
/* Prepends context to the current message ("compiling logits kernel: <old message>"). */
flce_status err_wrap(flce_status status, const char *fmt, ...) FLCE_PRINTF(2, 3);
void err_clear(void);
const char *err_message(void);

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        flce_status try_status_ = (expr);                                                          \
        if (try_status_ != FLCE_OK) return try_status_;                                            \
    } while (0)

#endif
