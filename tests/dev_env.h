/* dev_env.h — one developer switch set or cleared in the FLCE_DEV variable itself (README
 * "Developer switches"), the other items kept: for the tests of the environment's parser
 * (test_config), which call config_reload() after, as after any setenv. A test that only needs a
 * switch gives it as data instead (dev_switch.h). A misspelt key is only a warning under FLCE_LOG,
 * so dev_env_set aborts on a key that is not a switch (config_table.h) rather than run the default. */
#ifndef FLCE_TEST_DEV_ENV_H
#define FLCE_TEST_DEV_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dev_switch.h"

/* key=value added to FLCE_DEV (replacing key's item); value NULL: key's item removed (its default). */
static inline void dev_env_set(const char *key, const char *value)
{
    (void)dev_switch_id(key); /* aborts on a key that is no switch */
    const char *old = getenv("FLCE_DEV");
    char out[1024] = "";
    size_t klen = strlen(key), n = 0;
    for (const char *p = old ? old : ""; *p;) { /* keep every item but key's */
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int mine = len > klen && !strncmp(p, key, klen) && p[klen] == '=';
        if (len && !mine) n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, "%s%.*s", n ? "," : "", (int)len, p);
        p += len + (comma != NULL);
    }
    if (value) n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, "%s%s=%s", n ? "," : "", key, value);
    if (n >= sizeof out) abort(); /* a test's handful of switches never fills it */
    if (n) setenv("FLCE_DEV", out, 1);
    else unsetenv("FLCE_DEV");
}

#endif
