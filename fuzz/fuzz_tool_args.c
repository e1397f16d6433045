/*
 * fuzz_tool_args.c — libFuzzer target over the `flce` tool's option parsing (tools/cmd_gen.c):
 * the input is split into argv words (at whitespace and NUL bytes) behind a "gen" argv[0], and
 * walked as cmd_gen walks it — --compile and --role handled here, everything else through
 * tool_parse_common — then, when every word parsed, the problem goes on as `flce gen` sends it:
 * flce_problem_validate, plan_make for the parsed arch with 132 SMs, and emit_source of one of
 * the plan's specs (the source is not printed, and nothing is compiled: NVRTC is too slow here).
 *
 * Invariants: no crash or undefined behaviour; tool_parse_common consumes 2 words, none (0) or
 * rejects the value (-1), never more words than there are; a parsed --arch is a supported arch;
 * the library calls keep the error contract of fuzz.h (a status with a message).
 */
#include <ctype.h>
#include <string.h>

#include "cmd_gen.h"
#include "emit.h"
#include "fuzz.h"
#include "plan.h"

/* More words than any real command line needs; the rest of the input is ignored. */
#define MAX_WORDS 64

static int is_separator(uint8_t c) { return c == 0 || isspace(c); }

/* Copies the words into buf (NUL-terminated, one after another) and points argv at them. */
static int split_words(const uint8_t *data, size_t size, char *buf, char **argv)
{
    int argc = 0;
    argv[argc++] = (char *)"gen";
    size_t i = 0, out = 0;
    while (argc < MAX_WORDS) {
        while (i < size && is_separator(data[i])) i++;
        if (i == size) break;
        argv[argc++] = buf + out;
        while (i < size && !is_separator(data[i])) buf[out++] = (char)data[i++];
        buf[out++] = '\0';
    }
    argv[argc] = NULL;
    return argc;
}

static int role_by_name(const char *s)
{
    for (int r = ROLE_LOGITS; r <= ROLE_ROWOPS; r++)
        if (!strcmp(s, spec_role_name((spec_role)r))) return r;
    return -2;
}

/* cmd_gen's loop: 1 when every word parsed, 0 where `flce gen` would print usage and exit 2. */
static int parse_like_cmd_gen(tool_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc;) {
        if (!strcmp(argv[i], "--compile")) {
            o->compile = 1, i++;
            continue;
        }
        if (!strcmp(argv[i], "--role") && i + 1 < argc) {
            o->role = role_by_name(argv[i + 1]);
            if (o->role == -2) return 0;
            i += 2;
            continue;
        }
        int used = tool_parse_common(o, argc, argv, i);
        FUZZ_REQUIRE(used == -1 || used == 0 || used == 2, "tool_parse_common used %d words", used);
        FUZZ_REQUIRE(i + used <= argc, "tool_parse_common used %d words at %d of %d", used, i, argc);
        if (used <= 0) return 0;
        if (!strcmp(argv[i], "--arch"))
            FUZZ_REQUIRE(spec_arch_supported(o->sm), "--arch %s parsed as sm=%d", argv[i + 1], o->sm);
        i += used;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char **argv = malloc((MAX_WORDS + 1) * sizeof *argv);
    char *buf = malloc(size + MAX_WORDS + 1);
    if (!argv || !buf) {
        free(argv);
        free(buf);
        return 0;
    }
    int argc = split_words(data, size, buf, argv);
    tool_opts o;
    tool_opts_init(&o);
    if (parse_like_cmd_gen(&o, argc, argv)) {
        err_clear();
        flce_status st = flce_problem_validate(&o.problem);
        fuzz_check_status(st, "flce_problem_validate");
        plan pl;
        if (st == FLCE_OK) {
            err_clear();
            st = plan_make(&o.problem, FLCE_OP_LOSS_AND_GRAD, o.sm, 132, NULL, &pl);
            fuzz_check_status(st, "plan_make");
        }
        if (st == FLCE_OK) {
            const kernel_spec *specs[] = {&pl.logits, &pl.dh, &pl.dw, &pl.rowops};
            char *src = NULL;
            err_clear();
            st = emit_source(specs[o.role >= 0 ? o.role : 0], &src);
            fuzz_check_status(st, "emit_source");
            FUZZ_REQUIRE(st != FLCE_OK || (src && strstr(src, "#define FLCE_GENERATED 1\n")),
                         "emit_source succeeded without the generated-source marker");
            free(src);
        }
    }
    free(buf);
    free(argv);
    return 0;
}
