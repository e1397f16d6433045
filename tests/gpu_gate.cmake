# gpu_gate.cmake — the GPU tests' gate (gpu_ready.h) can fail: behind a fake libcuda.so.1
# (fake_libcuda.c) whose cuInit returns what FAKE_CUINIT says, a missing GPU is a skip (77) and
# everything else is a failure (1): a driver that fails cuInit, a driver flce cannot load, a probe
# that crashes, and no GPU under FLCE_REQUIRE_GPU=1. Runs on any machine, GPU or not.
# Run by CTest: cmake -DPROBE=<gpu_probe> -DFAULT_GPU=<test_fault_gpu> -DFAKE_DIR=<dir> -P this.
set(failures "")
# case: "<expected exit>;<program>;<FAKE_CUINIT>[;<FLCE_REQUIRE_GPU>]"; 100 is CUDA_ERROR_NO_DEVICE,
# 34 CUDA_ERROR_STUB_LIBRARY (the toolkit's stub), 999 CUDA_ERROR_UNKNOWN.
foreach(case "77;PROBE;100" "77;PROBE;34" "1;PROBE;999" "1;PROBE;0" "1;PROBE;100;1" "77;PROBE;100;0"
             "77;FAULT_GPU;100" "1;FAULT_GPU;999" "1;FAULT_GPU;crash" "1;FAULT_GPU;100;1")
  list(GET case 0 want)
  list(GET case 1 program)
  list(GET case 2 cuinit)
  set(require "")
  list(LENGTH case n)
  if(n GREATER 3)
    list(GET case 3 require)
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${FAKE_DIR} FAKE_CUINIT=${cuinit}
                          FLCE_REQUIRE_GPU=${require} ${${program}}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(STRIP "${out}" out)
  message(STATUS "FAKE_CUINIT=${cuinit} FLCE_REQUIRE_GPU=${require} ${program}: exit ${rc}: ${out}")
  if(NOT rc STREQUAL want)
    string(APPEND failures "  FAKE_CUINIT=${cuinit} FLCE_REQUIRE_GPU=${require} ${program}: exit ${rc}, expected ${want}\n${out}\n${err}\n")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "the GPU gate decided wrongly:\n${failures}")
endif()
