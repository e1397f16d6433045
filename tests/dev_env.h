/* dev_env.h — one developer switch set or cleared in FLCE_DEV (README "Developer switches") for a
 * test, the other items kept; the test calls config_reload() after, as after any setenv. A test
 * that means the other path must really set it: a misspelt key is only a warning under FLCE_LOG,
 * so dev_env_set aborts on a key that is not a switch (config_table.h) rather than run the default. */
#ifndef FLCE_TEST_DEV_ENV_H
#define FLCE_TEST_DEV_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/* key=value added to FLCE_DEV (replacing key's item); value NULL: key's item removed (its default). */
static inline void dev_env_set(const char *key, const char *value)
{
    int known = 0;
    for (int i = 0; i < CONFIG_COUNT; i++)
        known |= config_is_dev_switch(&config_settings()[i]) && !strcmp(config_settings()[i].name, key);
    if (!known) {
        fprintf(stderr, "dev_env_set: '%s' is not a developer switch (runtime/config_table.h)\n", key);
        abort();
    }
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
