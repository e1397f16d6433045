// rowops.cu — the per-token kernels around the GEMMs (DESIGN.md §1, §3):
//   flce_prepare  count valid labels of the whole batch; raise the flag for out-of-range labels
//   flce_combine  per-(row, split) partials → lse_i and loss_i = lse_i − z_iy
//   flce_dz       dz_ij = g_i · (exp(z_ij − lse_i) − 1[j = y_i]) in the input dtype, zero padding
//                 (for mean/sum g_i here is 0 or 1; the GEMM epilogues apply grad / count)
//   flce_reduce   loss = Σ_i loss_i (· 1/count for the mean), one CTA, fixed order: deterministic
// A label is valid when it is not ignore_index and lies in [0, vocab_total). Invalid, non-ignored
// labels raise the flag and are treated as ignored, so nothing reads out of bounds.
#ifndef FLCE_GENERATED
#define FLCE_DTYPE 2
#define FLCE_LABEL_BITS 32
#define FLCE_REDUCTION 0 // 0 mean, 1 sum, 2 none
constexpr long long VOCAB = 32768;
#include "params.h"
#include "common.cuh"
#endif

#define REDUCTION_MEAN 0
#define REDUCTION_SUM 1
#define REDUCTION_NONE 2

__device__ __forceinline__ bool label_valid(long long y, const flce_row_params &p)
{
    return y != p.ignore_index && y >= 0 && y < p.vocab_total;
}

extern "C" __global__ void __launch_bounds__(256) flce_prepare(const flce_row_params p)
{
    __shared__ int warp_counts[8];
    int valid = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.tokens;
         i += (long long)gridDim.x * blockDim.x) {
        long long y = load_label(p.labels, i);
        if (label_valid(y, p)) valid++;
        else if (y != p.ignore_index) *(volatile int *)p.flag = 1; // same value from every writer
    }
    for (int off = 16; off > 0; off >>= 1) valid += __shfl_xor_sync(0xffffffffu, valid, off);
    if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = valid;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); w++) total += warp_counts[w];
        if (total) atomicAdd((int *)p.count, total); // integer: order does not matter
    }
}

// One thread per row of the chunk.
extern "C" __global__ void __launch_bounds__(256) flce_combine(const flce_row_params p)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.rows) return;
    const float *pm = (const float *)p.part_m + i * p.splits, *ps = (const float *)p.part_s + i * p.splits;
    float m = NEG_INF, s = 0.f;
    for (int k = 0; k < p.splits; k++) lse_merge(m, s, pm[k], ps[k]);
    float lse = m + logf(s);
    long long y = load_label(p.labels, p.row0 + i);
    float loss = label_valid(y, p) ? lse - ((const float *)p.target)[i] : 0.f;
    if (p.lse) ((float *)p.lse)[p.row0 + i] = lse;
    if (p.loss_rows) ((float *)p.loss_rows)[p.row0 + i] = loss;
}

// The per-token part of g_i: 0 for ignored tokens, grad_output[i] for reduction none. The scalar
// part of mean and sum (grad / count) is applied by the dH/dW GEMM epilogues instead, so that dZ
// stays within [-1, 1] where fp16 keeps full precision.
__device__ __forceinline__ float token_scale(const flce_row_params &p, long long row, bool valid)
{
    if (!valid) return 0.f;
#if FLCE_REDUCTION == REDUCTION_NONE
    const float *go = (const float *)p.grad_output;
    return go ? go[row] : 1.f;
#else
    (void)row;
    return 1.f;
#endif
}

// grid: (rows, column blocks); each thread turns 4 consecutive logits into 4 gradients.
extern "C" __global__ void __launch_bounds__(256) flce_dz(const flce_row_params p)
{
    long long i = blockIdx.x;
    long long j = ((long long)blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (j >= p.ldz) return;
    long long y = load_label(p.labels, p.row0 + i);
    bool valid = label_valid(y, p);
    float g = token_scale(p, p.row0 + i, valid);
    float lse = ((const float *)p.lse)[p.row0 + i];
    long long local_y = valid ? y - p.vocab_offset : -1;
    float4 z = *(const float4 *)((const float *)p.z + i * p.ldz + j);
    float zs[4] = {z.x, z.y, z.z, z.w}, d[4];
#pragma unroll
    for (int c = 0; c < 4; c++) {
        long long col = j + c;
        d[c] = col < VOCAB ? g * (expf(zs[c] - lse) - (col == local_y ? 1.f : 0.f)) : 0.f;
    }
#if FLCE_DTYPE == DTYPE_F32
    *(float4 *)((float *)p.dz + i * p.ldz + j) = make_float4(d[0], d[1], d[2], d[3]);
#else
    uint2 packed;
    packed.x = (unsigned)from_f32(d[0]) | ((unsigned)from_f32(d[1]) << 16);
    packed.y = (unsigned)from_f32(d[2]) | ((unsigned)from_f32(d[3]) << 16);
    *(uint2 *)((elem_t *)p.dz + i * p.ldz + j) = packed;
#endif
}

// One CTA of 1024 threads: strided partial sums, then a fixed tree. Same order every run.
extern "C" __global__ void __launch_bounds__(1024) flce_reduce(const flce_row_params p)
{
    __shared__ float partial[1024];
    float s = 0.f;
    for (long long i = threadIdx.x; i < p.tokens; i += blockDim.x) s += ((const float *)p.loss_rows)[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int width = blockDim.x / 2; width > 0; width >>= 1) {
        if ((int)threadIdx.x < width) partial[threadIdx.x] += partial[threadIdx.x + width];
        __syncthreads();
    }
    if (threadIdx.x == 0 && p.loss_out) {
        float total = partial[0];
#if FLCE_REDUCTION == REDUCTION_MEAN
        int count = *(const int *)p.count;
        total = count > 0 ? total / (float)count : 0.f;
#endif
        *(float *)p.loss_out = total;
    }
}
