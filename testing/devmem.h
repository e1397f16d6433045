/*
 * devmem.h — device memory for the tool, the tests and the benchmarks (never the library): thin
 * wrappers over the driver table that make the device's primary context current and move data.
 */
#ifndef FLCE_DEVMEM_H
#define FLCE_DEVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "flce.h"

/* 1 when a driver and at least one device are present. */
int devmem_gpu_count(void);
/* Makes device `ordinal`'s primary context current on this thread (retained until exit). */
flce_status devmem_use(int ordinal);
flce_status devmem_alloc(void **ptr, size_t bytes);
void devmem_free(void *ptr);
flce_status devmem_upload(void *dst, const void *src, size_t bytes);
flce_status devmem_download(void *dst, const void *src, size_t bytes);
/* Fills with 0xFF bytes: NaN in fp32, fp16 and bf16, −1 in integers — an unwritten output shows. */
flce_status devmem_poison(void *ptr, size_t bytes);
flce_status devmem_zero(void *ptr, size_t bytes);
flce_status devmem_sync(void);
/* Device-wide timing with events on the legacy stream. */
typedef struct devmem_timer devmem_timer;
flce_status devmem_timer_start(devmem_timer **t);
flce_status devmem_timer_stop(devmem_timer *t, float *ms); /* frees the timer */
/* A stream of our own, and a CUDA graph captured from work enqueued on it. */
flce_status devmem_stream_create(void **stream);
void devmem_stream_destroy(void *stream);
flce_status devmem_stream_sync(void *stream);
int devmem_stream_busy(void *stream); /* 1: work queued on it has not finished (cuStreamQuery) */
flce_status devmem_capture_begin(void *stream);
/* Ends the capture and instantiates it: *exec is launched with devmem_graph_launch. */
flce_status devmem_capture_end(void *stream, void **exec);
flce_status devmem_graph_launch(void *exec, void *stream);
void devmem_graph_destroy(void *exec);
/* Free and total device memory, bytes. */
flce_status devmem_info(size_t *free_bytes, size_t *total_bytes);

#endif
