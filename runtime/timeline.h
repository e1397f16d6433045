/* timeline.h — per-kernel times inside a real run, for `flce bench --timeline`: a CUDA event on the
 * stream before and after every kernel launch. Nsight Systems does not run on our GPU machines and
 * ncu replays each kernel alone at idle clocks, so neither shows what a kernel costs between its
 * neighbours under sustained load. Off unless a tool turns it on: one branch per launch. */
#ifndef FLCE_TIMELINE_H
#define FLCE_TIMELINE_H

#include "driver.h"

typedef struct timeline_entry {
    const char *what; /* the launch's name ("dW kernel"): a string literal */
    float ms;
} timeline_entry;

void timeline_enable(int on);
int timeline_enabled(void);
/* Around one launch on `stream`; silent on failure (the timeline then just misses that kernel). */
void timeline_before(CUstream stream, const char *what);
void timeline_after(CUstream stream);
/* Waits for the recorded kernels, fills up to `cap` entries in launch order, forgets them all;
 * returns how many were filled (-1 when an event could not be read). */
int timeline_take(timeline_entry *out, int cap);

#endif
