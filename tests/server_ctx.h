/* server_ctx.h — a server's context for the GPU tests of the prepare calls: compile_in_call = 0
 * and no background compiles over a fresh, empty cache directory (no read-only layers), so that a
 * call that was not prepared returns FLCE_ERR_NOT_READY; and its removal with that directory. */
#ifndef FLCE_TEST_SERVER_CTX_H
#define FLCE_TEST_SERVER_CTX_H

#include <stdio.h>
#include <stdlib.h>

#include "flce.h"

/* dir: a mkdtemp template ("/tmp/flce-…-XXXXXX"), made into the cache directory. NULL on failure
 * (flce_last_error says why when the context failed). */
static inline flce_context *server_context(char *dir)
{
    if (!mkdtemp(dir)) return NULL;
    flce_options o;
    flce_options_init(&o);
    o.cache_dir = dir, o.cache_ro = "", o.compile_in_call = 0, o.background_compile = 0;
    flce_context *server = NULL;
    return flce_context_create_ex(0, &o, &server) == FLCE_OK ? server : NULL;
}

/* Destroys the context and removes its cache directory; 0 when the removal succeeded. */
static inline int server_context_done(flce_context *server, const char *dir)
{
    flce_context_destroy(server);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

#endif
