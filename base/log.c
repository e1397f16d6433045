/* log.c — FLCE_LOG-gated logging to stderr (see log.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static log_level parse_level(const char *s)
{
    if (!s || !*s) return LOG_OFF;
    if (!strcmp(s, "warn") || !strcmp(s, "1")) return LOG_WARN;
    if (!strcmp(s, "info") || !strcmp(s, "2")) return LOG_INFO;
    if (!strcmp(s, "debug") || !strcmp(s, "3")) return LOG_DEBUG;
    return LOG_OFF;
}

log_level log_threshold(void)
{
    /* Read every time: cheap, and lets tests flip FLCE_LOG with setenv. */
    return parse_level(getenv("FLCE_LOG"));
}

int log_enabled(log_level level) { return level != LOG_OFF && level <= log_threshold(); }

void log_msg(log_level level, const char *fmt, ...)
{
    static const char *names[] = {"", "warn", "info", "debug"};
    char line[2048];
    va_list ap;
    if (!log_enabled(level)) return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "flce: %s: %s\n", names[level], line);
}
