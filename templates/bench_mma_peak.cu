// bench_mma_peak.cu — the device's mma.sync throughput ceiling for bench/mma_peak.c (issue 6: the
// Ampere path is reported as a fraction of it). Every warp issues MMA_CHAINS independent
// m16n8k16 bf16/fp16 → fp32 mma.sync per step on register operands only: no memory traffic, enough
// independent accumulators to cover the instruction's latency. Compiled by NVRTC at run time.
#ifndef MMA_CHAINS
#define MMA_CHAINS 8
#endif

extern "C" __global__ void __launch_bounds__(256) mma_peak(float *out, int iters, unsigned seed)
{
    // Operands: small finite bf16/fp16 bit patterns that differ per thread (the compiler cannot fold them).
    unsigned a0 = 0x3c003c00u ^ (threadIdx.x & 7u) ^ seed, a1 = a0 ^ 0x10u, a2 = a0 ^ 0x20u, a3 = a0 ^ 0x30u;
    unsigned b0 = a0 ^ 0x40u, b1 = a0 ^ 0x50u;
    float acc[MMA_CHAINS][4];
#pragma unroll
    for (int j = 0; j < MMA_CHAINS; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int j = 0; j < MMA_CHAINS; j++)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < MMA_CHAINS; j++) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s; // keeps every chain live
}
