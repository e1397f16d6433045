/*
 * cmd_cache.h — `flce cache ls|stats|prune|clear [--dir DIR] [--max-mib N]`: inspects, prunes and
 * empties the on-disk kernel cache (runtime/cache.h). Called by the flce tool's main with its
 * arguments from "cache" on.
 */
#ifndef FLCE_CMD_CACHE_H
#define FLCE_CMD_CACHE_H

/* argv[0] is "cache". Returns the process exit code: 0 done, 1 an error (message on stderr),
 * 2 a usage mistake (usage on stderr). */
int cmd_cache(int argc, char **argv);

#endif
