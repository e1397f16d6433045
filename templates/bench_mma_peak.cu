// bench_mma_peak.cu — the device's mma.sync throughput ceiling for bench/mma_peak.c (issue 6: the
// Ampere path is reported as a fraction of it). Every warp issues MMA_CHAINS independent
// m16n8k16 bf16/fp16 → fp32 mma.sync per step on register operands only: no memory traffic, enough
// independent accumulators to cover the instruction's latency. Also ffma_peak, the fp32 FFMA
// ceiling the fp32 path (exact FFMA on the same fragments) is measured against (issue 19).
// Compiled by NVRTC at run time.
constexpr int MMA_CHAINS = 8; // bench/mma_peak.c's CHAINS: its FLOP count

// acc (16×8 fp32 fragment) += a (16×16) · b (16×8), operands as packed 16-bit pairs.
__device__ __forceinline__ void mma_16816(float (&acc)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// FLOPs: gridDim.x · blockDim.x/32 warps · iters · MMA_CHAINS · 4096 (2·16·8·16 per mma).
extern "C" __global__ void __launch_bounds__(256) mma_peak(float *out, int iters, unsigned seed)
{
    // Operands: small finite bf16/fp16 bit patterns that differ per thread (nothing to fold).
    const unsigned base = 0x3c003c00u ^ (threadIdx.x & 7u) ^ seed;
    const unsigned a[4] = {base, base ^ 0x10u, base ^ 0x20u, base ^ 0x30u}, b[2] = {base ^ 0x40u, base ^ 0x50u};
    float acc[MMA_CHAINS][4];
#pragma unroll
    for (int j = 0; j < MMA_CHAINS; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < MMA_CHAINS; j++) mma_16816(acc[j], a, b);
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < MMA_CHAINS; j++) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s; // keeps every chain live
}

constexpr int FFMA_CHAINS = 16; // bench/mma_peak.c's FFMA_CHAINS
// FLOPs: gridDim.x · blockDim.x · iters · FFMA_CHAINS · 2. Each thread runs FFMA_CHAINS independent
// a = a·x + y chains; x and y come from the arguments, so nothing folds at compile time.
extern "C" __global__ void __launch_bounds__(256) ffma_peak(float *out, int iters, unsigned seed)
{
    const float x = 0.999f + 1e-7f * (float)((threadIdx.x ^ seed) & 7u), y = 1e-3f * (float)((threadIdx.x + seed) & 3u);
    float acc[FFMA_CHAINS];
#pragma unroll
    for (int j = 0; j < FFMA_CHAINS; j++) acc[j] = y * (float)j;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < FFMA_CHAINS; j++) acc[j] = fmaf(acc[j], x, y);
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < FFMA_CHAINS; j++) s += acc[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s; // keeps every chain live
}
