/*
 * plan_consts.h — the planner's constants that the settings table (config_table.h) uses as a
 * default or a bound, in a header of their own so that config.c needs none of plan.h (which
 * includes this one): the settings stay below the planner that reads them.
 */
#ifndef FLCE_PLAN_CONSTS_H
#define FLCE_PLAN_CONSTS_H

#define PLAN_RASTER_ROWS 8 /* dH/dW tile order: row blocks per group (plan.c, raster_rows) */
/* The longest vocab range one chunked dH launch sums over (plan.c dh_k_slice): the tensor cores'
 * fp32 accumulation over a 2.2M-column shard left dH 3-4.7e-3 off (test_large, session 7), against
 * 1.7e-3 where launches of shorter ranges add up in memory. */
#define PLAN_DH_K_SLICE 262144
/* dH split over its k (plan.c plan_dh_width, dh_splits): at most this many splits, each over at
 * least PLAN_DH_SPLIT_MIN_K vocab columns (a main loop long enough to hide its pipeline's fill and
 * its fp32 slab's store). */
#define PLAN_DH_SPLITS_MAX 8
#define PLAN_DH_SPLIT_MIN_K 8192

#endif
