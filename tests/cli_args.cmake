# cli_args.cmake — issue 41 item 9: every subcommand of `flce` parses its command line strictly
# (getopt_long, tools/cmd_gen.c). A bad option or value ends with status 2 (usage), a message that
# names the word at fault and the hint "Try 'flce <cmd> --help'."; nothing runs before that, so the
# whole table takes well under a second. Valid spellings ("--tokens=8", hex seeds) still work.
# Run by CTest: cmake -DFLCE=<tool> -DWORK=<scratch dir> -P cli_args.cmake
cmake_minimum_required(VERSION 3.25)
foreach(v FLCE WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "cli_args.cmake: -D${v}= is missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

# command | arguments | a word the message must contain
set(cases
  "demo|--tokens abc|'abc': not a whole number"
  "demo|--tokns 8|unknown option '--tokns' (did you mean --tokens?)"
  "demo|--tok 8|write the option in full: --tokens"
  "demo|--tokens|--tokens needs a value"
  "demo|--tokens 0|--tokens '0': must be from 1"
  "demo|--tokens -5|'-5'"
  "demo|--tokens 99999999999999999999|'99999999999999999999'"
  "demo|--tokens 1.5|'1.5': not a whole number"
  "demo|--tokens 8x|'8x'"
  "demo|--tokens= |--tokens '': not a whole number"
  "demo|--hidden 1001|--hidden '1001': must be a multiple of 8"
  "demo|--vocab 0|--vocab '0'"
  "demo|--dtype int8|'int8'"
  "demo|--budget-mib -1|--budget-mib '-1'"
  "demo|--arch sm_70|'sm_70'"
  "demo|-tokens 8|'-tokens' (long options take two dashes: --tokens)"
  "demo|8192|unexpected argument '8192'"
  "demo|--labels 64|unknown option '--labels'"
  "bench|--iters abc|--iters 'abc'"
  "bench|--iters 0|--iters '0'"
  "bench|--warmup -1|--warmup '-1'"
  "bench|--sets 9|--sets '9'"
  "bench|--samples 1|--samples '1'"
  "bench|--shapes 8192x4096x|'8192x4096x'"
  "bench|--shapes -1x8x8|'-1x8x8'"
  "bench|--logit-std inf|'inf'"
  "bench|--strategies chunked-0MiB|'chunked-0MiB'"
  "bench|--list=1|--list takes no value"
  "bench|--json|--json needs a value"
  "bench|--timelime|did you mean --timeline?"
  "fuzz|--seed abc|--seed 'abc'"
  "fuzz|--seed -1|--seed '-1'"
  "fuzz|--seed 99999999999999999999999|'99999999999999999999999'"
  "fuzz|--cases 0|--cases '0'"
  "fuzz|--case -1|--case '-1'"
  "fuzz|--jobs 257|--jobs '257'"
  "fuzz|--time-limit -1|--time-limit '-1'"
  "fuzz|--time-limit 5s|'5s': not a number"
  "fuzz|--cases|--cases needs a value"
  "tune|--runs 33|--runs '33'"
  "tune|--max-candidates 0|--max-candidates '0'"
  "tune|--jobs x|--jobs 'x'"
  "tune|--device -1|--device '-1'"
  "tune|--softcap -1|--softcap '-1'"
  "tune|--temperature 0|--temperature '0'"
  "tune|--smoothing 1|--smoothing '1': must be in"
  "tune|--z-loss nan|--z-loss 'nan'"
  "tune|--dry-runn|unknown option '--dry-runn'"
  "gen|--role foo|--role 'foo'"
  "gen|--labels 16|--labels '16'"
  "gen|--reduction avg|'avg'"
  "gen|--compile=yes|--compile takes no value"
  "warmup|--shapes 8x8x8 --jobs 0|--jobs '0'"
  "warmup|--shapes 8x8x8 --sms x|--sms 'x'"
  "warmup|--shapes 8x0x8|'8x0x8'"
  "warmup|--shapes 8x8x8 --op fwd|--op 'fwd'"
  "warmup|--shapes 8x8x8 --outputs most|'most'"
  "warmup|--shapes 8x8x8 --grad-outputs foo|'foo'"
  "warmup|--shapes 8x8x8 --temperature 0|--temperature '0'"
  "warmup|--tokens 8 --shapes 8x8x8|unknown option '--tokens'"
  "warmup|--shapes 8x1001x8|hidden=1001"
  "cache|ls --max-mib 5|--max-mib is prune's"
  "cache|prune --max-mib x|--max-mib 'x'"
  "cache|lss|unknown subcommand 'lss'"
  "cache|ls extra|unexpected argument 'extra'"
  "cache||a subcommand is needed"
  "info|--verbose|unknown option '--verbose'"
  "info|now|unexpected argument 'now'")
set(n 0)
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 cmd)
  list(GET parts 1 args)
  list(GET parts 2 named)
  separate_arguments(args UNIX_COMMAND "${args}")
  execute_process(COMMAND ${FLCE} ${cmd} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${named}" at)
  string(FIND "${err}" "Try 'flce ${cmd} --help'." hint)
  if(NOT rc EQUAL 2 OR at EQUAL -1 OR hint EQUAL -1)
    message(FATAL_ERROR "flce ${cmd} ${args}: status ${rc}; expected 2 and a message with \"${named}\" and "
                        "the --help hint\nstderr: ${err}\nstdout: ${out}")
  endif()
  math(EXPR n "${n} + 1")
endforeach()

# What is valid still parses: "--name=value", hex seeds, "--" before no words, options in any order.
set(valid
  "gen|--role rowops --tokens=8 --arch sm_80 --dtype f32 --labels 64 --reduction none"
  "fuzz|--seed 0x10 --cases 2 --list"
  "fuzz|--list --cases=3 --seed 18446744073709551615"
  "bench|--list --shapes=512x4096x128256 --iters 5 --warmup 0 --logit-std 1.5 --"
  "cache|--dir ${WORK} stats --json"
  "info|--")
foreach(case IN LISTS valid)
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 cmd)
  list(GET parts 1 args)
  separate_arguments(args UNIX_COMMAND "${args}")
  execute_process(COMMAND ${FLCE} ${cmd} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "flce ${cmd} ${args}: status ${rc}, expected 0\nstderr: ${err}")
  endif()
endforeach()
execute_process(COMMAND ${FLCE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: flce <command>")
  message(FATAL_ERROR "flce without a command: status ${rc}, expected 2 and the usage on stderr\n${out}${err}")
endif()
execute_process(COMMAND ${FLCE} dmeo RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "unknown command 'dmeo'")
  message(FATAL_ERROR "flce dmeo: status ${rc}, expected 2 and a message naming it\n${out}${err}")
endif()
file(REMOVE_RECURSE ${WORK})
message(STATUS "cli_args: ${n} bad command lines refused with status 2, each naming its word; valid ones parse")
