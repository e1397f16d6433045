/* dev_switch.h — one developer switch (README "Developer switches") given to this process as data
 * for a test: config_set on the switch's row, which takes effect at once (the environment untouched, no reload). A
 * test that means the other path must really set it, so a key that is not a switch
 * (config_table.h) aborts rather than run the default. */
#ifndef FLCE_TEST_DEV_SWITCH_H
#define FLCE_TEST_DEV_SWITCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/* The row of the developer switch named key; aborts when there is none. */
static inline config_id dev_switch_id(const char *key)
{
    for (int i = 0; i < CONFIG_COUNT; i++)
        if (config_is_dev_switch(&config_settings()[i]) && !strcmp(config_settings()[i].name, key)) return (config_id)i;
    fprintf(stderr, "dev_switch: '%s' is not a developer switch (runtime/config_table.h)\n", key);
    abort();
}

/* key's switch takes value (its FLCE_DEV words: "0", "off", "2"); value NULL: its default. */
static inline void dev_switch_set(const char *key, const char *value) { config_set(dev_switch_id(key), value); }

#endif
