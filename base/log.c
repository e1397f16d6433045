/* log.c — leveled logging to stderr (see log.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

log_level log_parse_level(const char *s)
{
    if (!s || !*s) return LOG_OFF;
    if (!strcmp(s, "warn") || !strcmp(s, "1")) return LOG_WARN;
    if (!strcmp(s, "info") || !strcmp(s, "2")) return LOG_INFO;
    if (!strcmp(s, "debug") || !strcmp(s, "3")) return LOG_DEBUG;
    return LOG_OFF;
}

/* Set once, when the library loads (config.c), before any thread of ours runs. */
static int (*log_level_source)(void);

void log_set_level_source(int (*read)(void)) { log_level_source = read; }

static _Thread_local log_sink log_current = {NULL, NULL, -1};

log_sink log_sink_set(log_sink s)
{
    log_sink was = log_current;
    log_current = s;
    return was;
}

log_sink log_sink_get(void) { return log_current; }

log_level log_threshold(void)
{
    /* The process's level is read every time: cheap, and lets tests flip FLCE_LOG with setenv. */
    int level = log_current.level >= 0 ? log_current.level : log_level_source ? log_level_source() : LOG_OFF;
    return level < LOG_OFF || level > LOG_DEBUG ? LOG_OFF : (log_level)level;
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
    if (log_current.fn) log_current.fn(log_current.user, (int)level, line);
    else fprintf(stderr, "flce: %s: %s\n", names[level], line);
}
