/* fault.c — the FLCE_FAULT test hook (see fault.h). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fault.h"
#include "log.h"

/* Longer settings are not ours to parse; they inject nothing. */
#define FAULT_SETTING_MAX 64

static const char *const fault_names[] = {
    [FAULT_NONE] = "none",
    [FAULT_NVRTC_COMPILE] = "nvrtc",
    [FAULT_CACHE_WRITE] = "cache_write",
    [FAULT_CACHE_RENAME] = "cache_rename",
    [FAULT_CACHE_LOCK] = "cache_lock",
    [FAULT_MODULE_LOAD] = "module_load",
    [FAULT_DEVICE_ALLOC] = "device_alloc",
    [FAULT_DEVICE_RESOURCE] = "device_resource",
};
#define FAULT_POINTS (sizeof fault_names / sizeof fault_names[0])

/* Calls seen at each point since FLCE_FAULT last changed (so tests can setenv between cases). */
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static char fault_seen[FAULT_SETTING_MAX];
static uint64_t fault_calls[FAULT_POINTS];

typedef struct fault_setting {
    fault_point point;
    uint64_t nth;
    int stall;
} fault_setting;

/* 0 when `v` is not "<point>[:<nth>[:stall]]". */
static int fault_parse(const char *v, fault_setting *out)
{
    memset(out, 0, sizeof *out);
    size_t name_len = strcspn(v, ":");
    for (size_t i = 1; i < FAULT_POINTS; i++)
        if (strlen(fault_names[i]) == name_len && !strncmp(v, fault_names[i], name_len))
            out->point = (fault_point)i;
    if (out->point == FAULT_NONE) return 0;
    v += name_len;
    if (*v == '\0') return 1;
    char *end = NULL;
    out->nth = strtoull(v + 1, &end, 10);
    if (end == v + 1) return 0;
    if (*end == '\0') return 1;
    out->stall = strcmp(end, ":stall") == 0;
    return out->stall;
}

fault_action fault_fire(fault_point p)
{
    const char *v = config_env(CONFIG_FAULT);
    fault_setting s;
    if (!v || !*v || strlen(v) >= FAULT_SETTING_MAX || !fault_parse(v, &s) || s.point != p)
        return FAULT_PASS;
    pthread_mutex_lock(&fault_lock);
    if (strcmp(fault_seen, v) != 0) {
        strcpy(fault_seen, v);
        memset(fault_calls, 0, sizeof fault_calls);
    }
    uint64_t call = ++fault_calls[p];
    pthread_mutex_unlock(&fault_lock);
    if (s.nth && call != s.nth) return FAULT_PASS;
    log_msg(LOG_WARN, "injected fault at %s (call %llu, FLCE_FAULT=%s)", fault_names[p],
            (unsigned long long)call, v);
    return s.stall ? FAULT_STALL : FAULT_FAIL;
}
