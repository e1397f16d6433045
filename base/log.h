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

/* Where a thread's lines go: a context's flce_options log callback and level during its calls
 * (context.h CTX_LOG_SCOPE), else the process's (stderr under FLCE_LOG). */
typedef void (*log_fn)(void *user, int level, const char *line);
typedef struct log_sink {
    log_fn fn;  /* called with the line (no "flce:" prefix); NULL: stderr, "flce: <level>: " prefixed */
    void *user; /* fn's first argument */
    int level;  /* the most verbose log_level written; -1: the process's (FLCE_LOG, read at each use) */
} log_sink;
#define LOG_SINK_PROCESS ((log_sink){NULL, NULL, -1})
/* The calling thread's sink becomes s; returns the one it replaces (to put back). A new thread
 * starts with LOG_SINK_PROCESS. */
log_sink log_sink_set(log_sink s);
log_sink log_sink_get(void);

log_level log_threshold(void); /* the calling thread's sink's level */
int log_enabled(log_level level);
void log_msg(log_level level, const char *fmt, ...) FLCE_PRINTF(2, 3);

#endif
