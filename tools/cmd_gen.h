/* cmd_gen.h — `flce gen`, and what every subcommand of the tool shares on its command line (defined
 * in cmd_gen.c, which the tool and the fuzz replay of its arguments both compile): the exit codes,
 * getopt_long with messages that name the word at fault, strict numbers, and the problem options
 * (--arch, --dtype, --tokens, ...). */
#ifndef FLCE_CMD_GEN_H
#define FLCE_CMD_GEN_H

#include <getopt.h>
#include <stdint.h>

#include "flce.h"

/* printf-checked messages, defined here rather than taken from base/error.h: the tool builds on
 * flce.h and runtime/tool_api.h only (issue 42). */
#if defined(__GNUC__) || defined(__clang__)
#define TOOL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TOOL_PRINTF(a, b)
#endif

/* The exit status of every `flce` command (`flce --help` and README "The tool" say the same). */
enum {
    TOOL_EXIT_OK = 0,
    TOOL_EXIT_FAILED = 1, /* the work failed: a check, a compile, a file (the message says which) */
    TOOL_EXIT_USAGE = 2,  /* the command line: unknown option, bad value, invalid problem */
    TOOL_EXIT_NO_GPU = 3, /* a command that runs kernels found no usable GPU (no driver, no device,
                           * or a driver that fails to start: the one-line message says which) */
};

/* ---- the command line ---------------------------------------------------------------------- */

/* Option tables hold `val` TOOL_OPT_PROBLEM for the problem options tool_set_common knows, so
 * a command lists exactly the ones it takes; its own options use their short letter or 256 + k. */
#define TOOL_OPT_PROBLEM 0x7000
#define TOOL_PROBLEM_OPT(name) {name, required_argument, NULL, TOOL_OPT_PROBLEM}

/* What tool_next returns besides an option's val. */
enum {
    TOOL_NEXT_END = -1,  /* no words left */
    TOOL_NEXT_WORD = 1,  /* a word that is no option (cache's ls, ...): in ->arg */
    TOOL_NEXT_HELP = 'h', /* -h or --help (every table should hold {"help", no_argument, NULL, 'h'}) */
    TOOL_NEXT_BAD = '?', /* a message is printed: return TOOL_EXIT_USAGE */
};

typedef struct tool_cli {
    const char *cmd; /* "demo": messages start "flce demo: " */
    int argc;
    char **argv; /* argv[0] is the subcommand's name */
    const struct option *opts;
    const char *name; /* after an option: its long name ("tokens") */
    const char *arg;  /* its value (NULL for a flag), or the word of TOOL_NEXT_WORD */
    int ended;        /* getopt_long saw "--" or the end: the rest are words */
} tool_cli;

void tool_cli_start(tool_cli *c, const char *cmd, int argc, char **argv, const struct option *opts);
/* The next option's val, or a TOOL_NEXT_* value. Options are taken only in full ("--tokens 8" or
 * "--tokens=8"; not getopt_long's "--tok 8"); an unknown one names the closest real one. */
int tool_next(tool_cli *c);

/* "flce <cmd>: <message>" and "Try 'flce <cmd> --help'." on stderr; returns TOOL_EXIT_USAGE. */
int tool_misuse(const char *cmd, const char *fmt, ...) TOOL_PRINTF(2, 3);
/* The one line of a command that needs a GPU and has none: "flce <cmd>: no GPU (<why>)<hint>" on
 * stderr (hint: what works without one, "" for none); returns TOOL_EXIT_NO_GPU. */
int tool_no_gpu(const char *cmd, const char *hint);

/* Strict numbers: the whole word in base 10 (seeds: also 0x...), no sign where it cannot be,
 * inside [lo, hi]. On a bad word: the message (naming --<name> and the word) via tool_misuse and 0;
 * else *out is set and 1. tool_real takes finite values only; range says [lo, hi] in words. */
int tool_int(const char *cmd, const char *name, const char *text, int64_t lo, int64_t hi, int64_t *out);
int tool_int32(const char *cmd, const char *name, const char *text, int lo, int hi, int *out);
int tool_u64(const char *cmd, const char *name, const char *text, uint64_t *out);
int tool_real(const char *cmd, const char *name, const char *text, double lo, double hi, const char *range,
              double *out);

/* "NxDxV": three whole numbers from 1 (at most 18 digits each) joined by 'x'; 1 when parsed. */
int tool_shape(const char *text, int64_t shape[3]);

/* ---- the problem options ------------------------------------------------------------------- */

typedef struct tool_opts {
    int sm;
    flce_problem problem;
    int role; /* gen only: -1 = all */
    int compile;
} tool_opts;

void tool_opts_init(tool_opts *o);
/* One problem option by its long name ("tokens", "arch", ...) and value: 1 set, 0 not a problem
 * option, -1 a bad value (message printed through tool_misuse, as `flce <cmd>`). Names: arch,
 * dtype, reduction, tokens, hidden, vocab, labels, budget-mib, softcap, temperature, smoothing,
 * z-loss. */
int tool_set_common(tool_opts *o, const char *cmd, const char *name, const char *value);
/* The same, walking argv as words: at argv[i] "--name" and argv[i + 1] its value. Returns the
 * words consumed (2), 0 when argv[i] is not such an option or has no value, -1 for a bad value.
 * (fuzz/fuzz_tool_args.c drives the problem options through this.) */
int tool_parse_common(tool_opts *o, int argc, char **argv, int i);
/* flce_problem_validate; on failure the message and TOOL_EXIT_USAGE, else TOOL_EXIT_OK. */
int tool_validate(const char *cmd, const flce_problem *p);

int cmd_gen(int argc, char **argv);

#endif
