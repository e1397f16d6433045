// gemm_wgmma.cu — what both Hopper main loops (sm_90a, FLCE_WGMMA; gemm_wgmma_tma.cu and
// gemm_wgmma_cp_async.cu) share: the 128-byte-swizzled shared tiles, wgmma's matrix descriptors,
// one stage's wgmmas for a warpgroup (wgmma_tile itself is the generator's, sized for BN) and the
// dynamic shared window aligned for the swizzle. Pasted after gemm.cu for the Hopper and
// Blackwell specs only.
// ---- Hopper main loop: wgmma from 128-byte-swizzled shared tiles (sm_90a) -------------------
// Two warpgroups each own 64 rows of the 128-row tile (WARPS_M = 8 warps of 16 rows, WARPS_N = 1),
// so a thread's accumulators acc[0][j][e] sit exactly where the mma.sync path puts them (row
// 16*warp + g + 8*(e/2), column 8*j + 2*t + e%2) and the epilogues serve both paths.
// Shared layout per operand and stage, BK = 64 elements = 128 bytes:
//   K-major  [rows][64 k], row r at r*128 bytes, 16-byte chunk c stored at chunk c ^ (r % 8)
//   MN-major blocks of 64 along M/N: block b, k row r at b*BK*128 + r*128, chunk c at c ^ (r % 8)
// which are wgmma's canonical 128B-swizzle layouts (PTX ISA, "Shared Memory Matrix Layout"):
// K-major SBO = 1024 (8 rows); MN-major LBO = BK*128 (next 64-wide block), SBO = 1024 (next 8 k rows).
static_assert(BK == 64 && BM == 128 && WARPS_M == 8 && WARPS_N == 1, "wgmma tile shape");
static_assert(ELEM_BYTES == 2, "wgmma path takes 16-bit inputs");
constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_BYTES + B_BYTES;

__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Matrix descriptor: start address, leading and stride byte offsets (>> 4), 128-byte swizzle.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}

#if FLCE_TCGEN05
// (tcgen05: one thread issues each stage's MMAs, mma_tiles in gemm_tcgen05.cu)
#else
// Four k16 steps of this warpgroup's 64 × BN block. K-major descriptors advance 32 bytes per step
// inside the swizzled row; MN-major ones advance 16 k rows (2048 bytes).
__device__ __forceinline__ void compute_stage(float (&acc)[MI][NI][4], unsigned char *stage, int wg)
{
    unsigned a_base = smem_addr(stage) + wg * (64 * 128), b_base = smem_addr(stage + A_BYTES);
    constexpr unsigned A_LBO = A_KMAJOR ? 16 : BK * 128, B_LBO = B_KMAJOR ? 16 : BK * 128;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
        unsigned long long da = smem_desc(a_base + (A_KMAJOR ? kk * 32 : kk * 2048), A_LBO, 1024);
        unsigned long long db = smem_desc(b_base + (B_KMAJOR ? kk * 32 : kk * 2048), B_LBO, 1024);
        wgmma_tile(acc[0], da, db);
    }
    wgmma_commit();
}

#endif // FLCE_TCGEN05
// Keeps the compiler from touching accumulators across an asynchronous wgmma.
__device__ __forceinline__ void fence_acc(float (&acc)[MI][NI][4])
{
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(acc[0][j][e])::"memory");
}

// The dynamic shared window rounded up to the 1024-byte boundary the swizzle pattern starts on.
__device__ __forceinline__ unsigned char *tile_smem(unsigned char *raw)
{
    unsigned a = smem_addr(raw);
    return raw + ((1024 - (a & 1023)) & 1023);
}
