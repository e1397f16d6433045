# cli_no_gpu.cmake — issue 41 item 9: the commands of `flce` that run kernels (demo, bench, fuzz,
# tune) end with status 3 and one line "flce <cmd>: no GPU (<why>)..." on stderr where there is no
# usable GPU, distinct from usage errors (2) and failures (1); a usage error still wins over it, and
# what needs no GPU (bench --list, fuzz --list) still succeeds. demo compiles its kernels first (a
# few seconds with a cold cache; FLCE_CACHE_DIR is the tests' shared one). On a machine with a GPU
# (`flce info` lists one) only the usage-error half runs: the others would start real work.
# Run by CTest: cmake -DFLCE=<tool> -P cli_no_gpu.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED FLCE)
  message(FATAL_ERROR "cli_no_gpu.cmake: -DFLCE= is missing")
endif()

function(expect_status want cmd)
  execute_process(COMMAND ${FLCE} ${cmd} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL want)
    message(FATAL_ERROR "flce ${cmd} ${ARGN}: status ${rc}, expected ${want}\nstderr: ${err}\nstdout: ${out}")
  endif()
  set(err "${err}" PARENT_SCOPE)
endfunction()

# Usage errors are 2 with or without a GPU: the command line is read before the GPU is looked for.
expect_status(2 bench --iters 0)
expect_status(2 demo --hidden 12)
expect_status(2 tune --runs 0)
expect_status(2 fuzz --jobs 0)

execute_process(COMMAND ${FLCE} info RESULT_VARIABLE rc OUTPUT_VARIABLE info ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "flce info: status ${rc}\n${info}${err}")
endif()
if(NOT info MATCHES "\nGPU: none \\(")
  message(STATUS "SKIPPED the no-GPU half: `flce info` lists a GPU")
  return()
endif()

# (demo: its CPU half, the kernels compiled, then the same one line and status 0: the README's
# first command must succeed on a machine without a GPU)
foreach(cmd "bench" "fuzz;--cases;2;--jobs;2" "fuzz;--seed;7;--case;0" "tune" "demo;--tokens;256;--hidden;64;--vocab;1024")
  list(GET cmd 0 name)
  if(name STREQUAL "demo")
    expect_status(0 ${cmd})
  else()
    expect_status(3 ${cmd})
  endif()
  string(REGEX MATCHALL "\n" lines "${err}")
  list(LENGTH lines n)
  if(NOT n EQUAL 1 OR NOT err MATCHES "^flce ${name}: no GPU \\([^\n]+\\)")
    message(FATAL_ERROR "flce ${cmd}: expected one line \"flce ${name}: no GPU (...)\" on stderr, got:\n${err}")
  endif()
endforeach()
expect_status(0 bench --list --shapes 512x4096x128256)
expect_status(0 fuzz --seed 7 --cases 3 --list)
message(STATUS "cli_no_gpu: bench, fuzz (both forms) and tune end with status 3 and one line without a GPU, demo with 0 after compiling")
