/* timeline.c — CUDA events around kernel launches (see timeline.h). */
#include <pthread.h>
#include <stddef.h>

#include "timeline.h"

enum { TIMELINE_MAX = 8192 };

typedef struct mark {
    const char *what;
    CUevent start, stop;
    int failed; /* the stop event was not recorded */
} mark;

static pthread_mutex_t tl_lock = PTHREAD_MUTEX_INITIALIZER;
static int tl_on;
static mark tl_marks[TIMELINE_MAX];
static int tl_count, tl_open = -1; /* tl_open: the mark waiting for its stop event */

void timeline_enable(int on) { __atomic_store_n(&tl_on, on, __ATOMIC_RELEASE); }

/* Read on every launch: no lock while it is off. */
int timeline_enabled(void) { return __atomic_load_n(&tl_on, __ATOMIC_ACQUIRE); }

void timeline_before(CUstream stream, const char *what)
{
    pthread_mutex_lock(&tl_lock);
    if (tl_on && tl_count < TIMELINE_MAX) {
        mark *m = &tl_marks[tl_count];
        m->what = what, m->start = m->stop = NULL, m->failed = 0;
        if (drv.EventCreate(&m->start, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
            drv.EventCreate(&m->stop, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
            drv.EventRecord(m->start, stream) == CUDA_SUCCESS)
            tl_open = tl_count++;
        else {
            if (m->start) drv_release(drv.EventDestroy(m->start), "cuEventDestroy (timeline)");
            if (m->stop) drv_release(drv.EventDestroy(m->stop), "cuEventDestroy (timeline)");
        }
    }
    pthread_mutex_unlock(&tl_lock);
}

void timeline_after(CUstream stream)
{
    pthread_mutex_lock(&tl_lock);
    if (tl_open >= 0 && drv.EventRecord(tl_marks[tl_open].stop, stream) != CUDA_SUCCESS)
        tl_marks[tl_open].failed = 1; /* timeline_take reports it as a failure */
    tl_open = -1;
    pthread_mutex_unlock(&tl_lock);
}

int timeline_take(timeline_entry *out, int cap)
{
    int n = 0, bad = 0;
    pthread_mutex_lock(&tl_lock);
    for (int i = 0; i < tl_count; i++) {
        mark *m = &tl_marks[i];
        float ms = 0;
        if (m->failed || drv.EventSynchronize(m->stop) != CUDA_SUCCESS ||
            drv.EventElapsedTime(&ms, m->start, m->stop) != CUDA_SUCCESS)
            bad = 1;
        else if (n < cap)
            out[n].what = m->what, out[n].ms = ms, n++;
        bad |= drv_release(drv.EventDestroy(m->start), "cuEventDestroy (timeline)") != FLCE_OK;
        bad |= drv_release(drv.EventDestroy(m->stop), "cuEventDestroy (timeline)") != FLCE_OK;
    }
    tl_count = 0, tl_open = -1;
    pthread_mutex_unlock(&tl_lock);
    return bad ? -1 : n;
}
