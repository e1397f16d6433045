/* cmd_gen.h — `flce gen` and the shared problem-option parser of the tool's subcommands. */
#ifndef FLCE_CMD_GEN_H
#define FLCE_CMD_GEN_H

#include "flce.h"

/* Options common to gen and demo: --arch, --dtype, --tokens, --hidden, --vocab, --labels, --reduction,
 * --budget. Returns the number of argv entries consumed at argv[i] (0 = not ours, -1 = bad value). */
typedef struct tool_opts {
    int sm;
    flce_problem problem;
    int role; /* gen only: -1 = all */
    int compile;
} tool_opts;

void tool_opts_init(tool_opts *o);
int tool_parse_common(tool_opts *o, int argc, char **argv, int i);
int cmd_gen(int argc, char **argv);

#endif
