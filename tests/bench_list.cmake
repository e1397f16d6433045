# bench_list.cmake — `flce bench --list` without a GPU: every default shape and strategy appears, and
# bad arguments are refused with a message naming them. Run by CTest: cmake -DFLCE=<tool> -P this.
execute_process(COMMAND ${FLCE} bench --list RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "flce bench --list: status ${rc}\n${out}${err}")
endif()
foreach(want 8192x4096x128256 8192x2304x256000 4096x2048x32000 32768x4096x128256 512x4096x128256
             "| auto |" "| chunked |" "| chunked-128MiB |" "| recompute |" "| forward |" "AUTO's choice")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "flce bench --list does not mention '${want}':\n${out}")
  endif()
endforeach()
# The planner's changes to the GEMMs are shown (plan.c plan_logits_cluster, plan_dh_splits and
# plan_dw_cluster: 512 tokens splits dH in 2 and runs dW in clusters, 8192 tokens neither; the
# logits pass in clusters at both, 4 and 64 row blocks).
string(REGEX MATCH "### 512x4096x128256[^#]*" few "${out}")
string(REGEX MATCH "### 8192x4096x128256[^#]*" many "${out}")
if(NOT few MATCHES "\\| auto \\| [^|]*; logits in 2-CTA clusters; dH split in 2 over the vocab; dW in 2-CTA clusters" OR
   NOT many MATCHES "\\| auto \\| [^|]*row-scaled\\); logits in 2-CTA clusters \\|" OR many MATCHES "dH split|dW in")
  message(FATAL_ERROR "flce bench --list: the GEMMs' plan at 512 / 8192 tokens:\n${few}\n${many}")
endif()
# "+maingrad" rows plan with dW added into the caller's fp32 buffer: no grown budget, so the main
# shape takes 4 chunks of 2048 rows in the default 512 MiB (plan.c plan_chunks).
execute_process(COMMAND ${FLCE} bench --list --shapes 8192x4096x128256 --strategies auto,auto+maingrad
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\| auto\\+maingrad \\| [^|]*\\| 4 token chunks of 2048 rows" OR
   NOT out MATCHES "\\| auto \\| [^|]*\\| 1 token chunks of 8192 rows")
  message(FATAL_ERROR "flce bench --list --strategies auto,auto+maingrad: status ${rc}\n${out}${err}")
endif()
# Each bad argument: status 2 and a message that names the offending value.
foreach(case "--shapes;8192x4096;8192x4096" "--strategies;chunked,fast;fast" "--strategies;forward+maingrad;forward+maingrad" "--logit-std;-1;-1"
             "--dtype;int8;int8" "--iters;0;--iters" "--bogus;1;--bogus" "--shapes;64x1001x64;hidden=1001")
  list(GET case 0 opt)
  list(GET case 1 val)
  list(GET case 2 named)
  execute_process(COMMAND ${FLCE} bench --list ${opt} ${val} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${named}" at)
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(FATAL_ERROR "flce bench ${opt} ${val}: status ${rc}, expected 2 and a message naming '${named}':\n${err}")
  endif()
endforeach()
message(STATUS "flce bench --list: 5 shapes × 5 strategies listed; bad arguments refused")
