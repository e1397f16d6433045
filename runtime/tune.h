/*
 * tune.h — the autotuner's hooks into the dispatcher (docs/DESIGN.md §6.5, issue 6). plan.c calls
 * tune_apply after choosing the built-in tiles; `flce tune` (tools/cmd_tune.c) and the
 * FLCE_TUNE=1 path force candidate tiles through tune_force_tiles; tune_candidates lists what is
 * worth timing. Internal: nothing here is part of include/flce.h.
 */
#ifndef FLCE_TUNE_H
#define FLCE_TUNE_H

#include "plan.h"
#include "tune_table.h"

/* Forces the GEMM tiles (logits, dH, dW) of every plan this thread makes until cleared with NULL.
 * For the tuner only: it overrides the table and the FLCE_PORTABLE / FLCE_DEV tma switches. The tiles
 * must pass spec_validate for the problem (plan_make then uses them as given). */
void tune_force_tiles(const spec_tile tiles[TUNE_ROLES]);

/* The dispatcher's tile choice for a plan whose specs hold the built-in tiles: forced tiles, else
 * (unless FLCE_PORTABLE=1 or FLCE_DEV=tma=0 is set, or device is NULL) the table's winner for the
 * class, after spec validation. Logs "tuned tiles from <table>" or "default tiles" at info,
 * once per class change. Never fails: a table problem is a warning and the default stays. */
void tune_apply(const flce_problem *p, const char *device, int sm, plan *pl);

/* Whether the table (as this process read it) has a valid winner for the class. */
int tune_have(const tune_key *k);

/* Drops the in-memory table so the next plan reads the file again (after a store; tests). */
void tune_forget(void);

/* Up to cap candidate tiles of a role that spec_validate accepts for (sm, dtype, hidden, vocab);
 * the built-in default first. Returns how many were written. */
int tune_candidates(int sm, flce_dtype dtype, spec_role role, int64_t hidden, int64_t vocab,
                    spec_tile *out, int cap);

/* FLCE_TUNE=1 in the environment: api.c tunes an untuned class on first use (tune_run.c). */
int tune_on_first_use(void);

#endif
