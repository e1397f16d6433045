// gemm.cu — the tiled GEMMs of flce, specialized by the generator for one role:
//
//   LOGITS  Z = H·Wᵀ over one token chunk. The epilogue folds each row's logits into a running
//           (max m, Σ exp(z − m)) over this CTA's vocab split, records z of the row's label, and
//           stores Z in fp32 when the strategy needs it:  part_m, part_s [row][split], target[row].
//           FLCE_FUSED_DZ (the recompute pass, lse already known): writes dZ instead, nothing else.
//   DH      dH = dZ·W   (A = dZ stored K-major, B = W stored [k = vocab][n = hidden])
//   DW      dW = dZᵀ·H  (A = dZ stored [k = token][m = vocab], B = H stored [k = token][n = hidden])
//           DH/DW store out = acc (+ addend), in fp32 or the input dtype.
//
// C[m × n] = A[m × k] · B[n × k]ᵀ with BM × BN tiles, warps arranged WARPS_M × WARPS_N, each
// owning a (BM/WARPS_M) × (BN/WARPS_N) block of 16×8 mma tiles. Every main loop leaves its
// accumulators in that mma.sync fragment layout (acc[MI][NI][4]), so one set of epilogues serves
// all of them.
//
// This file holds what every path shares: the thread counts, launch bounds and warp tile. The rest
// of the GEMM is in one file per main loop and per epilogue; generator/emit.c (emit_gemm) pastes
// this file, then only the pieces the spec's main loop and role use, then gemm_entry.cu, after its
// preamble of constants, params.h and common.cuh. That output compiles alone with nvcc (`flce gen`);
// this file does not, having neither the constants nor the pieces.
// The switches (FLCE_WGMMA, FLCE_TMA, FLCE_FUSED_DZ, FLCE_COMPACT, …) are all defined by the
// preamble, 0 or not, so the templates use them as compile-time values: `if constexpr` where a
// switch changes code. Every branch of one is parsed, so a name it uses must exist on every path;
// #if stays where a branch calls what only one main loop's file defines (the TMA pipeline; the
// Blackwell MMAs, whose blocks generator/emit.c resolves itself) or picks a kernel's attributes.

constexpr int THREADS = WARPS_M * WARPS_N * 32;        // the threads that compute and run the epilogue
constexpr int PRODUCER_THREADS = FLCE_TMA ? 128 : 0;   // TMA: one warpgroup in front that only loads
constexpr int CTA_THREADS = THREADS + PRODUCER_THREADS;
#if FLCE_TMA
// setmaxnreg takes effect only under a register cap at entry: 1 CTA of 384 threads (168 registers).
#define FLCE_KERNEL_BOUNDS __launch_bounds__(CTA_THREADS, 1)
#define FLCE_PARAM const __grid_constant__ flce_gemm_params // the tensor maps are read in place
#else
#define FLCE_KERNEL_BOUNDS __launch_bounds__(THREADS)
#define FLCE_PARAM const flce_gemm_params
#endif
constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N; // warp tile
constexpr int MI = WTM / 16, NI = WTN / 8;             // mma tiles per warp

// The epilogues' 16-bit tiles go out through shared memory (stmatrix into a per-warp staging buffer,
// gemm_wgmma_tma.cu) on the Hopper TMA path only: the Blackwell path's accumulators come from
// tensor memory in another layout, and the cp.async paths have no room set aside for the buffers.
#if FLCE_TCGEN05
constexpr bool STAGED_STORE = false;
#else
constexpr bool STAGED_STORE = FLCE_TMA;
#endif
// Defined by gemm_wgmma_tma.cu; the other paths name them only in `if constexpr (STAGED_STORE …)`
// branches, which they parse but never compile to code, so a declaration is all those need.
__device__ unsigned staging_addr(unsigned char *smem, int warp);
__device__ void staged_store(const unsigned (&pk)[NI][2], unsigned short *out, long long ld, long long rows,
                             long long cols, unsigned buf, long long row0, long long col0, int lane);
__device__ void staged_rows_out(const float (&acc)[MI][NI][4], float *out, long long ld, long long rows,
                                long long cols, long long row0, long long col0, unsigned buf0, int lane);
__device__ void bulk_red_rows(const float (&acc)[MI][NI][4], float *out, long long ld, long long rows, long long cols,
                              long long row0, long long col0, float scale, unsigned buf0, int lane);
__device__ void staged_add_rows(const float (&acc)[MI][NI][4], unsigned short *out, long long ld, long long rows,
                                long long cols, long long row0, long long col0, float scale, unsigned buf0, int lane);
// Whether the output at p.out and its row stride (fp32) are 16-byte aligned, as those two need.
__device__ __forceinline__ bool bulk_out_ok(const flce_gemm_params &p)
{
    return ((p.out | ((unsigned long long)p.ldo * 4ull)) & 15ull) == 0;
}
// Before a consumer warp leaves: its bulk reductions (FLCE_GRAD_BULK) done, their shared memory
// read and their global writes complete before the kernel's end is seen by the next launch.
__device__ __forceinline__ void bulk_drain(int lane)
{
    if constexpr (FLCE_GRAD_BULK) {
        if (lane < 16) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    } else {
        (void)lane;
    }
}

