/*
 * log.h — the library's only voice. Nothing is printed unless asked for: FLCE_LOG=warn (warnings),
 * info (each compile, cache hit/miss, plan), debug (more). Lines go to stderr prefixed with "flce:".
 * base/ reads no environment: runtime/config.c hands log.c its FLCE_LOG reader when the library
 * loads (log_set_level_source); without one (base/ alone) nothing is printed.
 */
#ifndef FLCE_LOG_H
#define FLCE_LOG_H

#include "error.h"

typedef enum log_level { LOG_OFF = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 } log_level;

/* "warn"/"1", "info"/"2", "debug"/"3"; anything else (NULL, "") is LOG_OFF. */
log_level log_parse_level(const char *text);
/* Where the level comes from: read(), called at each log_msg (tests flip FLCE_LOG between cases). */
void log_set_level_source(int (*read)(void));

log_level log_threshold(void);
int log_enabled(log_level level);
void log_msg(log_level level, const char *fmt, ...) FLCE_PRINTF(2, 3);

#endif
