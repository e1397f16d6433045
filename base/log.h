/*
 * log.h — the library's only voice. Nothing is printed unless the environment variable FLCE_LOG
 * asks for it: FLCE_LOG=warn (warnings), info (each compile, cache hit/miss, plan), debug (more).
 * Lines go to stderr prefixed with "flce:".
 */
#ifndef FLCE_LOG_H
#define FLCE_LOG_H

#include "error.h"

typedef enum log_level { LOG_OFF = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 } log_level;

log_level log_threshold(void); /* read once from FLCE_LOG */
int log_enabled(log_level level);
void log_msg(log_level level, const char *fmt, ...) FLCE_PRINTF(2, 3);

#endif
