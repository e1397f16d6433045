/*
 * config_table.h — every environment variable the library reads, listed once (issue 42 item 3).
 * From this list come flce_config's fields and its defaults (config.h), the parser and the
 * FLCE_LOG=info log line (config.c), the one function that reads the environment (config_env, also
 * config.c), and the README's "Environment variables" tables (tests/test_settings_doc.c prints
 * them and checks README.md against them). A new setting is one row here (and, for a process
 * setting, the code that reads its field); README.md is regenerated with
 * `test_settings_doc --write README.md`.
 *
 * X(KIND, AUDIENCE, ID, field, "NAME", lo, hi, def, values, default, effect)
 *   KIND      how it is read. Once per process into flce_config (config_get): BOOL (on/off words),
 *             INT (an integer in lo..hi), TILE (on/off, a field of flce_config.tiles), FAST (the
 *             FLCE_NVRTC_FAST words). At each use through config_env (tests flip them between
 *             cases): LEVEL (FLCE_LOG), TEXT (a string), NUM (a number its user parses:
 *             cache_lock.c, cache_prune.c), EBOOL (on/off). LIB: once, when that library is first
 *             opened. SYS: a system variable the library derives a default from (not ours).
 *             SWITCHES: FLCE_DEV, the one variable that holds the developer switches.
 *   AUDIENCE  USER (operators: the README's first table), DEV (developer A/B switches: algorithm
 *             variants kept for side-by-side measurements and tests, the second table), TEST (a
 *             test hook), SYSTEM.
 *   ID        config_id CONFIG_<ID> (config_env's argument); field: flce_config's field.
 *   NAME      the variable; for a DEV switch (BOOL/INT/TILE) its lowercase key in FLCE_DEV
 *             (FLCE_DEV="tma=0,grad_streams=off"): one variable for all of them, so that no switch
 *             shares a name with a template macro (FLCE_TMA, FLCE_CLUSTER are kernel macros of
 *             another meaning). FLCE_<KEY> was the switch's own variable before 2026-11-28: still
 *             read for one release, with a warning (config.c config_from_env).
 *   lo, hi, def  range and default of BOOL/INT/TILE/FAST/EBOOL/NUM values (def also of NUM).
 *   values, default  the README's words; NULL: derived from the kind, lo, hi and def.
 *   effect    the README's Effect cell (Markdown).
 */
#ifndef FLCE_CONFIG_TABLE_H
#define FLCE_CONFIG_TABLE_H

/* The rows' defaults and bounds that the cache and the planner own come from their constants
 * headers alone, so the settings (config.c) stand below the cache and the planner that read them. */
#include "cache_consts.h" /* CACHE_DEFAULT_LOCK_TIMEOUT_S, CACHE_DEFAULT_MAX_MIB */
#include "plan_consts.h"  /* PLAN_RASTER_ROWS, PLAN_DH_K_SLICE, PLAN_DH_SPLITS_MAX */

/* clang-format off */
#define CONFIG_SETTINGS(X) \
    /* ---- user settings, read once per process ---- */ \
    X(BOOL, USER, PORTABLE, portable, "FLCE_PORTABLE", 0, 1, 0, NULL, NULL, \
      "Hopper and Blackwell run the portable `mma.sync` tile (comparisons, a fallback); the tune table " \
      "is not consulted.") \
    X(TILE, USER, ENABLE_SM100, enable_sm100, "FLCE_ENABLE_SM100", 0, 1, 0, NULL, NULL, \
      "sm_100 16-bit: the `tcgen05` tile (compiles in CI, not yet run on a B200); off: the portable " \
      "tile.") \
    X(BOOL, USER, TUNE, tune, "FLCE_TUNE", 0, 1, 0, NULL, NULL, \
      "A problem class missing from the tune table is tuned on its first call and stored " \
      "([Autotuning](#autotuning)).") \
    X(BOOL, USER, PREFETCH, prefetch, "FLCE_PREFETCH", 0, 1, 1, NULL, NULL, \
      "A forward that saves lse compiles the backward's kernels into the disk cache in the background. " \
      "Off: no background compiles at all (no tiered stand-ins either). " \
      "`flce_options.background_compile` per context.") \
    X(BOOL, USER, TIERED, tiered, "FLCE_TIERED", 0, 1, 1, NULL, NULL, \
      "A call whose whole-vocab-tile logits kernel is not cached runs on its cached generic twin while " \
      "the specialized one compiles in the background ([kernel cache](#the-tool)); off: compile it in " \
      "the call.") \
    X(INT, USER, COMPILE_THREADS, compile_threads, "FLCE_COMPILE_THREADS", 1, 8, 8, NULL, NULL, \
      "The most kernels one call (or one background job) compiles at once, one NVRTC thread each; a " \
      "first call waits for its slowest kernel instead of their sum. `flce_options.compile_threads` " \
      "per context.") \
    X(BOOL, USER, COMPILE_IN_CALL, compile_in_call, "FLCE_COMPILE_IN_CALL", 0, 1, 1, NULL, NULL, \
      "A call whose kernels are neither loaded nor in the disk cache compiles them; off: it returns " \
      "`FLCE_ERR_NOT_READY` at once instead (and, with background compiles on, they compile in the " \
      "background meanwhile), so that no call ever waits for NVRTC: `flce_prepare` compiles. " \
      "`flce_options.compile_in_call` per context.") \
    X(FAST, USER, NVRTC_FAST, nvrtc_fast, "FLCE_NVRTC_FAST", 0, 3, CONFIG_NVRTC_FAST_OFF, \
      "on/off, `min`, `mid`, `max`", "off", \
      "Adds `--Ofast-compile=` (on = `mid`): about 3.5x less compile time, worse SASS; own cache keys.") \
    /* ---- user settings, read at each use ---- */ \
    X(LEVEL, USER, LOG, log, "FLCE_LOG", 0, 3, 0, "`warn`/`1`, `info`/`2`, `debug`/`3`", "off", \
      "Messages on stderr prefixed `flce:`: warnings; each compile, cache hit and wait, tune choice, " \
      "the settings; each call's plan and AUTO's estimates. `flce_options.log` and `log_level` per " \
      "context.") \
    X(TEXT, USER, CACHE_DIR, cache_dir, "FLCE_CACHE_DIR", 0, 0, 0, \
      "a directory", "`$XDG_CACHE_HOME/flce`, `~/.cache/flce`", \
      "Where compiled kernels and the tune table live; unusable: memory-only cache. " \
      "`flce_options.cache_dir` per context (kernels; the tune table stays here).") \
    X(TEXT, USER, CACHE_RO, cache_ro, "FLCE_CACHE_RO", 0, 0, 0, "`dir1:dir2`", "none", \
      "Read-only caches searched after the writable one. `flce_options.cache_ro` per context.") \
    X(NUM, USER, CACHE_LOCK_TIMEOUT, cache_lock_timeout, "FLCE_CACHE_LOCK_TIMEOUT", 0, 0, CACHE_DEFAULT_LOCK_TIMEOUT_S, \
      "seconds ≥ 0", NULL, \
      "How long a process waits for another's compile of the same kernel; 0: no lock.") \
    X(NUM, USER, CACHE_MAX_MIB, cache_max_mib, "FLCE_CACHE_MAX_MIB", 0, 0, CACHE_DEFAULT_MAX_MIB, "MiB", NULL, \
      "Size cap of the cache directory (least recently used entries go); 0: no cap.") \
    X(EBOOL, USER, CACHE_STATS, cache_stats, "FLCE_CACHE_STATS", 0, 1, 1, NULL, NULL, \
      "Per-directory counters in `<cache dir>/stats.log` (`flce cache stats`).") \
    X(LIB, USER, NVRTC_LIBRARY, nvrtc_library, "FLCE_NVRTC_LIBRARY", 0, 0, 0, \
      "a file", "`libnvrtc.so.13`, `.12`, `libnvrtc.so`, then the pip wheels' (see \"Set up\")", \
      "The NVRTC library to open.") \
    X(LIB, USER, NCCL_LIBRARY, nccl_library, "FLCE_NCCL_LIBRARY", 0, 0, 0, \
      "a file", "`libnccl.so.2`, `libnccl.so`, then the pip wheel's", \
      "The NCCL library to open (`tensors.comm`).") \
    /* ---- developer A/B switches: the keys of FLCE_DEV ---- */ \
    X(SWITCHES, DEV, DEV, dev, "FLCE_DEV", 0, 0, 0, "`key=value,…`", "none", \
      "The developer switches below, each as its key and value: `FLCE_DEV=tma=0,grad_streams=off`.") \
    X(TILE, DEV, TMA, tma, "tma", 0, 1, 1, NULL, NULL, \
      "sm_90 16-bit: wgmma fed by TMA; off: the cp.async-fed wgmma loop (logits BN 128); the tune table" \
      " is not consulted.") \
    X(BOOL, DEV, COMPACT, compact, "compact", 0, 1, 1, NULL, NULL, \
      "Chunked loss-and-grad with 16-bit inputs stores fp16 p̃ + maxima (2 bytes per logit) instead of " \
      "fp32 Z + dZ (6); off for side-by-side timing.") \
    X(BOOL, DEV, FUSED_DZ, fused_dz, "fused_dz", 0, 1, 1, NULL, NULL, \
      "Recompute's logits pass writes dZ itself; off: the separate Z store and dz pass.") \
    X(INT, DEV, QROWS, qrows, "qrows", 0, 1, -1, "0/1", "auto", \
      "Row-scaled compact logits (see \"Compact logits\"): unset, where a bf16 chunk holds at least 1e8" \
      " logits (measured on an H100, 2026-11-26, against `qrows=0` in the same call: 0.4–1.0 ms " \
      "faster at 8192×4096×128256, 1.2–1.4 ms at 8192×2304×256000, 0.03–0.09 ms at 4096×2048×32000 and " \
      "1024×4096×128256, even at 512 tokens); 1 wherever it applies; 0 never.") \
    X(BOOL, DEV, QDH, qdh, "qdh", 0, 1, 1, NULL, NULL, \
      "Under row-scaled logits, the labels' exact dH term added by a pass after dH (`flce_qdh`, 0.07 ms" \
      " at 8192×4096×128256) instead of dH's epilogue, whose gathers of the labels' W rows cost its " \
      "main loop 0.2–0.3 ms.") \
    X(INT, DEV, RASTER, raster_rows, "raster", 0, 4096, PLAN_RASTER_ROWS, NULL, NULL, \
      "dH/dW tile order: row blocks per group (0: column tiles fastest, the old order).") \
    X(INT, DEV, CLUSTER, cluster, "cluster", -1, 2, -1, "0, 1, 2", "auto", \
      "2: dH/dW on the wgmma TMA path in 2-CTA clusters with the B tile multicast (not measured faster " \
      "at large shapes); 0 and 1: off. Unset: dW alone in clusters where a call's one token chunk has " \
      "at most 1024 rows, whose short k makes each dW tile load as many operand bytes as it multiplies " \
      "(H100, 2026-11-26: dW 0.53 vs 0.56–0.57 ms at 256 × 4096 × 128256, 1.54–1.61 vs 1.60–1.65 at " \
      "1024 tokens, even at 512).") \
    X(BOOL, DEV, RED_ACC, red_acc, "red_acc", 0, 1, 1, NULL, NULL, \
      "dH/dW add into fp32 accumulators (the chunked strategy's dW accumulator, a caller's fp32 " \
      "`main_grad`) with `red.global.add` instead of load + add + store: on an H100, 32768×4096×128256 " \
      "took 159.9 ms instead of 162.7 and dW into main_grad 40.6 instead of 41.7 (2026-11-26). " \
      "Deterministic (one reduction per element per launch); fp32 sums below 1.2e-38 flush to zero.") \
    X(BOOL, DEV, BULK_RED, bulk_red, "bulk_red", 0, 1, 1, NULL, NULL, \
      "Under `red_acc`, on Hopper's wgmma + TMA path: each warp stages its fp32 tile rows in " \
      "shared memory and hands them to the TMA unit as bulk reductions (`cp.reduce.async.bulk … " \
      "add.f32`, 128 bytes a row) instead of one `red.global` per element pair; off: per-thread " \
      "`red.global`. Same sums (one reduction per element per launch). Needs a 16-byte aligned fp32 " \
      "buffer (else per-thread). Measured on an H100 (2026-11-27): dW into a caller's fp32 main_grad at" \
      " 512 × 4096 × 128256 2.30 instead of 2.53 ms (the call 3.81–3.85 vs 4.04–4.07); even at 8192 " \
      "tokens (four 2048-row chunks: bound by DRAM traffic, not by issuing the reductions).") \
    X(INT, DEV, LOGITS_CLUSTER, logits_cluster, "logits_cluster", -1, 1, -1, "-1/0/1", NULL, \
      "The logits pass (statistics, compact store, recompute's logits + dZ) on Hopper's wgmma + TMA " \
      "path in 2-CTA clusters: two adjacent row blocks of one vocab split share W's tile, each CTA " \
      "loading half and multicasting it (a third fewer operand bytes asked of L2 per tile; measured: " \
      "the same cycles at a fixed clock, 14 % fewer L2 bytes in all, so fewer joules and a higher clock" \
      " under the power cap). -1: where the launch has at least 4 row blocks of 128 tokens (an odd " \
      "count pairs the last block with an idle one); 1 always; 0 never. Measured on an H100 " \
      "(2026-11-27): 8192 × 4096 × 128256 AUTO 36.3–36.6 vs 36.7–38.6 ms; forward at 32768 tokens 48.1 " \
      "vs 52.2 ms; 512 tokens even.") \
    X(BOOL, DEV, LOGITS_PERSIST, logits_persist, "logits_persist", 0, 1, 1, NULL, NULL, \
      "The statistics pass (forward, and the chunked strategy's compact store) on Hopper's wgmma + TMA " \
      "path in persistent CTAs where its items (row blocks × vocab splits) outnumber the CTAs resident " \
      "at once: each CTA walks items u, u + G, … in the same grouped order with its pipeline running " \
      "on, instead of one CTA starting, filling its pipeline and draining per item. Not with the " \
      "entropy or argmax outputs (that kernel has no persistent loop). Measured on an H100 (2026-11-27," \
      " logits kernel in-run): 8192 × 4096 × 32064 (the tp = 4 shard, 2016 items of 2 tiles) 3.03–3.15 " \
      "vs 3.12–3.20 ms; 8192 × 4096 × 64128 and 128256 even.") \
    X(INT, DEV, LOGITS_SPLITS, logits_splits, "logits_splits", 0, 64, 0, NULL, NULL, \
      "Forces the statistics pass's vocab split count (0: the planner's, which minimizes whole rounds ×" \
      " tiles per split). For comparison runs.") \
    X(INT, DEV, LOGITS_GROUP, logits_group, "logits_group", 0, 4096, 0, NULL, "0 (= 8)", \
      "Row blocks per group of the logits items' order (each group's items run with all its row blocks " \
      "on one vocab split at a time, so its A blocks stay in L2 and each W tile is read by the group " \
      "together). 16, 32 and 64 measured even with 8 on an H100 (2026-11-27). For comparison runs.") \
    X(INT, DEV, DH_K_SLICE, dh_k_slice, "dh_k_slice", 0, 1 << 30, PLAN_DH_K_SLICE, \
      "0, multiple of 256", NULL, \
      "The most vocab columns one dH launch sums (a chunked call's shard, recompute's vocab chunk); a " \
      "longer range runs dH in slices added up in fp32 (one launch over 2.2M columns left dH 3–4.7e-3 " \
      "off on an H100, slices 1.7e-3, 2026-11-26). 0: no limit.") \
    X(BOOL, DEV, FULL_TILES, full_tiles, "full_tiles", 0, 1, 1, NULL, NULL, \
      "The compact logits kernel without partial-tile code where the vocabulary is whole tiles; off: " \
      "the generic kernel everywhere (to compare them).") \
    X(BOOL, DEV, UNLOCKED_COMPILE, unlocked_compile, "unlocked_compile", 0, 1, 0, NULL, NULL, \
      "A call's missing kernels compile before it takes its context's lock, so other threads' calls on " \
      "the same context go on meanwhile. Off until it has run on a GPU (`ctest -C Extra -L unlocked`).") \
    X(BOOL, DEV, TP_DH_16BIT, tp_dh_16bit, "tp_dh_16bit", 0, 1, 0, NULL, NULL, \
      "Tensor parallelism: each rank's dH is rounded to the input dtype and summed across ranks in it " \
      "(half the bytes of the fp32 all-reduce, as Megatron does) instead of in fp32 and rounded once. " \
      "Only for the plain all-reduce (not SP, not `accumulate_grad_hidden`). For measurements " \
      "(bench/tp_compare.py); off until its error is known.") \
    X(BOOL, DEV, TP_DH_GATHER16, tp_dh_gather16, "tp_dh_gather16", 0, 1, 1, NULL, NULL, \
      "Tensor parallelism: dH's fp32 sum across ranks as a reduce-scatter in fp32, each rank rounding " \
      "its 1/tp of the sums into `grad_hidden`, then an all-gather of the rounded values (3/4 of the " \
      "bytes of the fp32 all-reduce; the cast on 1/tp of the values; the same fp32 sums rounded once). " \
      "Off: the fp32 all-reduce, then every rank rounds all of it. Where the plain all-reduce applies " \
      "(not SP, not `accumulate_grad_hidden`, not `tp_dh_16bit`, 16-bit inputs). Measured even " \
      "with the all-reduce within ±0.1 ms per step on 2 and 4 NVLink H100s (2026-11-27, " \
      "`bench/results/2026-11-27-session18/d5`); the fewer bytes count on slower links.") \
    X(BOOL, DEV, TP_OVERLAP, tp_overlap, "tp_overlap", 0, 1, 1, NULL, NULL, \
      "Tensor parallelism: each token chunk's dH rows are summed across ranks on a side stream (highest" \
      " priority) while dW runs; dW's first launch leaves `tp_overlap_sms` SMs to NCCL's kernel " \
      "and a second joins its tile counter after the reduction. Under SP the one reduce-scatter of " \
      "every row runs beside the last token chunk's dW. wgmma + TMA dW without clusters. Measured −0.1 " \
      "to −0.4 ms at tp = 2 and 4 (4 × H200, 8192 × 4096 × 128256).") \
    X(INT, DEV, TP_OVERLAP_SMS, tp_overlap_sms, "tp_overlap_sms", 0, 1024, 32, "0–1024", NULL, \
      "The SMs dW leaves to NCCL's all-reduce under `tp_overlap`: at least the CTAs NCCL launches " \
      "(\"coll channels\" in its INFO log); 16 measured slower than 32 where NCCL used 24 (4 × H100 " \
      "NVLink, 2026-11-27: 16 +0.4–0.5 ms per step, 24 +0.1, 48 even with 32).") \
    X(INT, DEV, DH_BN, dh_bn, "dh_bn", 0, 256, 0, "0, 64, 128, 192, 256", "0 (auto)", \
      "dH's tile width on Hopper (wgmma + TMA). Auto narrows it from 256 where dH makes one launch " \
      "whose tiles leave a wave part empty and a narrower tile costs less (measured on an H100: " \
      "8192×2304×256000 takes 192), unless `dh_splits` splits it instead. A tune table's tiles are" \
      " kept as they are.") \
    X(INT, DEV, DH_SPLITS, dh_splits, "dh_splits", -1, PLAN_DH_SPLITS_MAX, -1, "-1, 0–8", "-1 (auto)", \
      "dH's one launch split over the vocab into S units per 256-wide tile, each stored to its own fp32" \
      " slab (S × N × D × 4 bytes of workspace), summed in a fixed order by one small pass " \
      "(deterministic, one rounding). Auto: where dH's tiles would fill under half the SMs (few " \
      "tokens), the S with the fewest waves per split, each split at least 8192 columns (H100, " \
      "2026-11-26: dH 0.67–0.69 instead of 0.78–0.79 ms at 512 × 4096 × 128256, 0.38 instead of 1.20 at" \
      " 256 tokens). 0 or 1: never; 2–8: that many wherever dH makes one launch on Hopper without " \
      "clusters or TP.") \
    X(BOOL, DEV, GRAD_STREAMS, grad_streams, "grad_streams", 0, 1, 1, NULL, NULL, \
      "dH (in your stream) and dW (on a second stream of the lowest priority, tied to yours by events: " \
      "graph-capturable) run at once, dW taking its tiles from a counter: dW's CTAs fill the SMs that " \
      "dH's last, partial wave leaves idle. Where both gradients are asked for and dW is on the wgmma +" \
      " TMA path without clusters.") \
    /* ---- test hooks ---- */ \
    X(TEXT, TEST, FAULT, fault, "FLCE_FAULT", 0, 0, 0, "`point[:n[:stall]]`", "none", \
      "Test hook: fail (or stall) the nth call at an injection point (`nvrtc`, `cache_write`, " \
      "`module_load`, `device_alloc`, …).") \
    /* ---- system variables the library derives defaults from ---- */ \
    X(SYS, SYSTEM, XDG_CACHE_HOME, xdg_cache_home, "XDG_CACHE_HOME", 0, 0, 0, NULL, NULL, \
      "The default cache directory, `$XDG_CACHE_HOME/flce` (an absolute path only).") \
    X(SYS, SYSTEM, HOME, home, "HOME", 0, 0, 0, NULL, NULL, \
      "The default cache directory without `XDG_CACHE_HOME`, `~/.cache/flce`; `~/.local` searched for " \
      "NVRTC and NCCL pip wheels.") \
    X(SYS, SYSTEM, TMPDIR, tmpdir, "TMPDIR", 0, 0, 0, NULL, NULL, \
      "The private fallback cache directory `$TMPDIR/flce-<uid>` (else `/tmp`) when the default one is " \
      "unusable.") \
    X(SYS, SYSTEM, PYTHONPATH, pythonpath, "PYTHONPATH", 0, 0, 0, NULL, NULL, \
      "Searched for the NVRTC and NCCL pip wheels.") \
    X(SYS, SYSTEM, VIRTUAL_ENV, virtual_env, "VIRTUAL_ENV", 0, 0, 0, NULL, NULL, \
      "Its site-packages searched for the NVRTC and NCCL pip wheels.") \
    X(SYS, SYSTEM, CONDA_PREFIX, conda_prefix, "CONDA_PREFIX", 0, 0, 0, NULL, NULL, \
      "Its site-packages searched for the NVRTC and NCCL pip wheels.") \
    X(SYS, SYSTEM, PATH, path, "PATH", 0, 0, 0, NULL, NULL, \
      "The site-packages of each Python on it searched for the NVRTC and NCCL pip wheels.")
/* clang-format on */

#endif
