# gen_nvcc.cmake — issue 41 item 9: the "Compile it alone with: nvcc ..." line at the top of every
# generated source (generator/emit.c) names the exact target, and the line works as it is written.
# nvcc 13 reads `-arch=sm_90a` as compute_90 PTX for sm_90a, which ptxas refuses for wgmma and
# setmaxnreg; so the line spells `-gencode arch=compute_90a,code=sm_90a`. Run by CTest:
#   cmake -DFLCE=<tool> -DWORK=<scratch dir> [-DNVCC=<nvcc>] -P gen_nvcc.cmake
# 1. for every arch the tool accepts, `flce gen` writes the line with that arch's own virtual and
#    real target (text only: quick);
# 2. with nvcc (no GPU needed), Hopper's wgmma + TMA logits kernel — the source the old line broke —
#    is compiled with the command the line gives, character for character (some 2 s).
cmake_minimum_required(VERSION 3.25)
foreach(v FLCE WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "gen_nvcc.cmake: -D${v}= is missing")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

# The line of a generated source, without its "// Compile it alone with: " head.
function(compile_line source out_var)
  string(REGEX MATCH "// Compile it alone with: ([^\n]*)" line "${source}")
  if(NOT line)
    message(FATAL_ERROR "no 'Compile it alone with:' line in:\n${source}")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# 1. every arch: "sm_90a" → "-gencode arch=compute_90a,code=sm_90a"
foreach(arch sm_80 sm_86 sm_87 sm_89 sm_90a sm_100a sm_120)
  execute_process(COMMAND ${FLCE} gen --role rowops --arch ${arch} RESULT_VARIABLE rc OUTPUT_VARIABLE src
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "flce gen --role rowops --arch ${arch}: status ${rc}\n${err}")
  endif()
  compile_line("${src}" line)
  string(REPLACE "sm_" "compute_" virt ${arch})
  if(NOT line STREQUAL "nvcc -std=c++17 -gencode arch=${virt},code=${arch} -x cu -c <this file>")
    message(FATAL_ERROR "flce gen --arch ${arch}: the compile line is\n  ${line}")
  endif()
endforeach()

# 2. compile one with nvcc, exactly as the line says
if(NOT NVCC OR NOT EXISTS "${NVCC}")
  message(STATUS "SKIPPED the nvcc half: no nvcc (-DNVCC=)")
  message(STATUS "gen_nvcc: the compile line names each arch's own target")
  return()
endif()
execute_process(COMMAND ${FLCE} gen --typical --role logits --arch sm_90a RESULT_VARIABLE rc OUTPUT_VARIABLE src
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT src MATCHES "wgmma tma")
  message(FATAL_ERROR "flce gen --role logits --arch sm_90a: status ${rc}, not a wgmma + TMA kernel?\n${err}")
endif()
file(WRITE ${WORK}/logits_sm90a.txt "${src}") # not .cu: -x cu in the line makes the name not matter
compile_line("${src}" line)
string(REPLACE "<this file>" "${WORK}/logits_sm90a.txt -o ${WORK}/logits_sm90a.o" line "${line}")
separate_arguments(cmd UNIX_COMMAND "${line}")
list(POP_FRONT cmd) # "nvcc": the one given
execute_process(COMMAND ${NVCC} ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/logits_sm90a.o)
  message(FATAL_ERROR "${NVCC} ${cmd}: status ${rc}\n${out}${err}")
endif()
file(REMOVE_RECURSE ${WORK})
message(STATUS "gen_nvcc: the compile line names each arch's own target; nvcc built sm_90a's wgmma + TMA "
               "logits kernel with it")
