/*
 * gpu_io.h — moving test data to and from the device for the GPU tests: uploads of fp64 host
 * arrays in the problem's dtype or fp32, poisoned (all-0xFF: NaN) output buffers, and downloads
 * back to fp64. Failures leave NULL pointers or zeros, which the tests' checks then catch.
 * Static inline: a test that uses a few of them includes them all without unused-function errors.
 */
#ifndef FLCE_GPU_IO_H
#define FLCE_GPU_IO_H

#include <stdint.h>
#include <stdlib.h>

#include "devmem.h"
#include "host.h"

static inline double *dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* x (or zeros when x is NULL) in dtype t on the device. */
static inline void *upload_dtype(flce_dtype t, const double *x, int64_t n)
{
    size_t es = host_dtype_size(t);
    double *zeros = x ? NULL : dalloc(n);
    void *tmp = malloc((size_t)(n > 0 ? n : 1) * es), *dev = NULL;
    host_to_dtype(t, x ? x : zeros, tmp, (size_t)n);
    if (tmp && devmem_alloc(&dev, (size_t)n * es) == FLCE_OK) devmem_upload(dev, tmp, (size_t)n * es);
    free(tmp), free(zeros);
    return dev;
}

/* x (or zeros when x is NULL) as fp32 on the device. */
static inline void *upload_f32(const double *x, int64_t n)
{
    float *tmp = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    void *dev = NULL;
    for (int64_t i = 0; i < n; i++) tmp[i] = x ? (float)x[i] : 0.f;
    if (devmem_alloc(&dev, (size_t)n * 4) == FLCE_OK) devmem_upload(dev, tmp, (size_t)n * 4);
    free(tmp);
    return dev;
}

static inline void *poisoned(size_t bytes)
{
    void *dev = NULL;
    if (devmem_alloc(&dev, bytes) == FLCE_OK) devmem_poison(dev, bytes);
    return dev;
}

static inline void down_f32(const void *dev, double *out, int64_t n)
{
    float *tmp = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    devmem_download(tmp, dev, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) out[i] = tmp[i];
    free(tmp);
}

static inline void download_f64(flce_dtype t, const void *dev, double *out, size_t n)
{
    size_t es = host_dtype_size(t);
    void *tmp = malloc((n > 0 ? n : 1) * es);
    devmem_download(tmp, dev, n * es);
    host_from_dtype(t, tmp, out, n);
    free(tmp);
}

#endif
