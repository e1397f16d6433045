/* tool_api.h — the internal interfaces the flce tool (tools/) builds on beyond include/flce.h, in
 * one place: the only non-public header a file of tools/ includes (issue 42; DESIGN.md §7 layers
 * tools/ over runtime/ and testing/). What a tool can ask through flce.h it asks there (a context's
 * device: flce_context_info_get; NVRTC, NCCL and the tune table: flce_library_info_get); what is
 * left below is the generator and the runtime's own machinery, which the tool's commands exist to
 * show or drive and which no library user should see:
 *   plan.h      the planner's plan for a problem without a GPU: demo, gen, warmup, bench --list
 *               (strategy, chunks, splits, the cost model's estimates)
 *   jit.h       spec → cubin through the disk cache, and the cache key: demo, gen, tune, warmup
 *   emit.h      a spec's CUDA source: gen
 *   spec.h      (through the above) kernel specs, tiles, arch and role names
 *   tune_run.h  the autotuner's candidates, timing and table entries: tune
 *   cache.h     the disk cache's directory, listing, stats, prune, clear and counters: cache, warmup
 *   config.h    the process's settings as data: bench's "+fp32z" rows switch the compact store off
 *   timeline.h  per-kernel event timing: bench --timeline
 *   nvrtc_compile.h  source → cubin with NVRTC alone, past the cache: kernel_diff_dump (the cubin
 *               a refactor of templates/ must leave alone)
 * A new need of the tool goes into flce.h when a library user could want it too, else here.
 * testing/'s headers (host.h, devmem.h, bench_data.h, fuzz_case.h) are not counted as internal:
 * testing/ is its own layer above runtime/ (the library the tests, fuzz replays and benchmarks share;
 * DESIGN.md §7), built on flce.h and this header's kind of access, so a command using it (fuzz, bench,
 * demo, tune) takes nothing more from below than this header gives. */
#ifndef FLCE_TOOL_API_H
#define FLCE_TOOL_API_H

#include "flce.h"

#include "cache.h"
#include "config.h"
#include "emit.h"
#include "jit.h"
#include "nvrtc_compile.h"
#include "plan.h"
#include "timeline.h"
#include "tune_run.h"

#endif
