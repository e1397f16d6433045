/*
 * config.h — the library's settings from the environment, in one place (README "Environment
 * variables" lists them all). config_get() reads every knob below once per process, with one on/off
 * convention (1/0, on/off, true/false, yes/no, any case; anything else: a warning under FLCE_LOG=warn
 * and the default) and range-checked numbers, and logs the effective settings once under
 * FLCE_LOG=info. Planning and the generator take these values as data (plan_build, spec_tile_pick),
 * so they never read the environment themselves.
 *
 * Read at each use instead, by design: FLCE_LOG (log.c), FLCE_FAULT (fault.c, a test hook flipped
 * between cases), the FLCE_CACHE_* variables (cache.c: tests point each case at its own directory),
 * FLCE_NVRTC_LIBRARY and FLCE_NCCL_LIBRARY (read when that library is first opened, once per
 * process). Internal: not part of include/flce.h.
 */
#ifndef FLCE_CONFIG_H
#define FLCE_CONFIG_H

#include "spec.h"

typedef enum config_nvrtc_fast {
    CONFIG_NVRTC_FAST_OFF = 0, /* full optimization (the default) */
    CONFIG_NVRTC_FAST_MIN,     /* --Ofast-compile=min */
    CONFIG_NVRTC_FAST_MID,     /* --Ofast-compile=mid (FLCE_NVRTC_FAST=1) */
    CONFIG_NVRTC_FAST_MAX      /* --Ofast-compile=max */
} config_nvrtc_fast;

typedef struct flce_config {
    int portable;      /* FLCE_PORTABLE: Hopper/Blackwell on the mma.sync tile (default off) */
    spec_knobs tiles;  /* FLCE_TMA (default on), FLCE_ENABLE_SM100 (default off) */
    int compact;       /* FLCE_COMPACT: chunked strategy stores compact p̃ (default on) */
    int fused_dz;      /* FLCE_FUSED_DZ: recompute's logits pass writes dZ (default on) */
    int qrows;         /* FLCE_QROWS: the chunked bf16 compact logits stored against one reference per row, so
                        * that dZ is a per-row factor times them: no dz pass. -1 (default, unset): where a
                        * chunk holds at least PLAN_QROWS_MIN_LOGITS logits; 1: wherever it applies; 0: never
                        * (bench/NOTES.md v39) */
    int qdh;           /* FLCE_QDH: under qrows, the labels' term of dH added by a pass after dH (flce_qdh)
                        * instead of dH's epilogue (default on: bench/NOTES.md v40) */
    int red_acc;       /* FLCE_RED_ACC: red.global.add into fp32 accumulators (default on) */
    int cluster;       /* FLCE_CLUSTER: 2-CTA clusters for dH/dW on wgmma + TMA (2), none (0 or 1), or
                        * (-1, default) dW's alone where plan.c's rule takes them (short token chunks) */
    int raster_rows;   /* FLCE_RASTER: dH/dW row blocks per tile group, 0..4096 (default 8) */
    int tune;          /* FLCE_TUNE: tune an untuned class on first use (default off) */
    int prefetch;      /* FLCE_PREFETCH: background compiles of the backward's kernels (default on) */
    int full_tiles;    /* FLCE_FULL_TILES: the compact logits kernel without partial-tile code where the
                        * vocabulary is whole tiles (default on; off: the generic kernel, to compare) */
    int dh_k_slice;    /* FLCE_DH_K_SLICE: the most vocab columns one chunked dH launch sums (default
                        * PLAN_DH_K_SLICE; a multiple of 256; 0: no limit). Small values: tests */
    int unlocked_compile; /* FLCE_UNLOCKED_COMPILE: a call's missing kernels compile before it takes its
                           * context's lock (default off until run on a GPU) */
    int tiered;        /* FLCE_TIERED: a kernel specialized for full vocab tiles that is not cached yet runs
                        * as the generic one while it compiles in the background (default on) */
    int tp_dh_16bit;   /* FLCE_TP_DH_16BIT: TP's dH summed across ranks in the input dtype (default off: fp32) */
    int tp_dh_gather16; /* FLCE_TP_DH_GATHER16: TP's dH reduce-scattered in fp32, each rank rounding its
                         * slice once, then all-gathered in the input dtype (default on) */
    int tp_overlap;    /* FLCE_TP_OVERLAP: TP's dH reduction on a side stream beside dW (default on) */
    int tp_overlap_sms; /* FLCE_TP_OVERLAP_SMS: SMs dW leaves to NCCL's all-reduce under FLCE_TP_OVERLAP
                         * (default 32, at least the CTAs NCCL launches: its log's "coll channels") */
    int dh_bn;         /* FLCE_DH_BN: dH's tile width on the wgmma TMA path, 64/128/192/256; 0 (default):
                        * plan.c picks it from dH's wave count */
    int grad_streams;  /* FLCE_GRAD_STREAMS: dH and dW launched on two streams at once (default on) */
    int dh_splits;     /* FLCE_DH_SPLITS: dH split over its k (vocab) into this many fp32 slabs summed
                        * after it (plan.c plan_dh_splits); -1 (default): where dH's tiles fill under
                        * half the SMs, 0 or 1: never */
    int bulk_red;      /* FLCE_BULK_RED: fp32 accumulators' reductions handed to the TMA unit as bulk
                        * reductions from shared memory where the tile allows (default on; off:
                        * red.global per thread) */
    int logits_cluster; /* FLCE_LOGITS_CLUSTER: the logits pass on the wgmma TMA path in 2-CTA clusters that
                         * share W's tile by multicast: -1 (default, unset) where a launch has at least
                         * PLAN_LOGITS_CLUSTER_MIN_BLOCKS row blocks, 1 always, 0 never */
    int logits_splits;  /* FLCE_LOGITS_SPLITS: the statistics pass's vocab splits (0, default: plan.c's
                         * rule), for side-by-side runs */
    int logits_group;   /* FLCE_LOGITS_GROUP: row blocks per group of the logits pass's item order (0, default:
                         * the kernel's LOGITS_GROUP, 8) */
    int logits_persist; /* FLCE_LOGITS_PERSIST: the statistics pass in persistent CTAs that walk its items
                         * in turn where they outnumber the CTAs resident at once (default on) */
    config_nvrtc_fast nvrtc_fast; /* FLCE_NVRTC_FAST (default off) */
} flce_config;

/* The process's settings, read from the environment on the first call (thread-safe). Never NULL;
 * the struct lives until exit and must not be written. */
const flce_config *config_get(void);

/* Every setting at its default, as with an empty environment. */
void config_defaults(flce_config *c);

/* Fills c from the environment now (warnings for values that do not parse). */
void config_from_env(flce_config *c);

/* Tests and the bench tool's side-by-side rows only: re-reads the environment into the process's
 * settings after a setenv. Not safe while another thread plans or compiles. */
void config_reload(void);

/* The parsers every knob goes through. value NULL or "" gives def silently; a value that does not
 * parse gives def and a warning that names the variable. */
int config_parse_bool(const char *name, const char *value, int def);
int config_parse_int(const char *name, const char *value, int lo, int hi, int def);

/* One line per setting at FLCE_LOG=info: "config: FLCE_TMA=on (default)". */
void config_log(const flce_config *c);

#endif
