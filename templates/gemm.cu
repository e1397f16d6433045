// gemm.cu — the portable tiled GEMM of flce (mma.sync, every sm_80+ GPU), specialized by the
// generator for one role:
//
//   LOGITS  Z = H·Wᵀ over one token chunk. The epilogue folds each row's logits into a running
//           (max m, Σ exp(z − m)) over this CTA's vocab split, records z of the row's label, and
//           stores Z in fp32 when the strategy needs it:  part_m, part_s [row][split], target[row].
//           FLCE_FUSED_DZ (the recompute pass, lse already known): writes dZ instead, nothing else.
//   DH      dH = dZ·W   (A = dZ stored K-major, B = W stored [k = vocab][n = hidden])
//   DW      dW = dZᵀ·H  (A = dZ stored [k = token][m = vocab], B = H stored [k = token][n = hidden])
//           DH/DW store out = acc (+ addend), in fp32 or the input dtype.
//
// C[m × n] = A[m × k] · B[n × k]ᵀ with BM × BN tiles, BK-deep stages fed by cp.async, warps
// arranged WARPS_M × WARPS_N, each owning a (BM/WARPS_M) × (BN/WARPS_N) block of 16×8 mma tiles.
// 16-bit inputs use mma.sync.m16n8k16 (fp32 accumulate); fp32 inputs use exact FFMA on the same
// fragment layout, so one epilogue serves both.
#ifndef FLCE_GENERATED
// Defaults so this file compiles alone: nvcc -arch=sm_80 -c gemm.cu -I. (the generator writes its own)
#define FLCE_DTYPE 2
#define FLCE_LABEL_BITS 32
#define FLCE_REDUCTION 0
#define ROLE_IS_LOGITS 1
#define ROLE_IS_DH 0
#define ROLE_IS_DW 0
#define OPT_BIAS 0
#define OPT_WEIGHTS 0
#define OPT_ZSUM 0
#define OPT_ENTROPY 0
#define OPT_ARGMAX 0
#define FLCE_WGMMA 0 // 1: the Hopper main loop (needs the generator's wgmma_tile for BN)
#define FLCE_TMA 0   // 1 (with FLCE_WGMMA): TMA loads, mbarriers, a producer warpgroup
#define FLCE_FUSED_DZ 0 // 1 (logits): the epilogue writes dZ instead of statistics or Z
constexpr float SOFTCAP = 0.f, INV_TEMP = 1.f, SMOOTHING = 0.f, ZLOSS = 0.f;
constexpr int BM = 128, BN = 128, BK = 32, STAGES = 3, WARPS_M = 2, WARPS_N = 4;
constexpr bool A_KMAJOR = true, B_KMAJOR = true;
constexpr long long VOCAB = 32768; // rows of this shard
#include "params.h"
#include "common.cuh"
#endif

#ifndef FLCE_TMA
#define FLCE_TMA 0
#endif
#ifndef FLCE_FUSED_DZ
#define FLCE_FUSED_DZ 0
#endif
#ifndef FLCE_COMPACT
#define FLCE_COMPACT 0 // 1 (logits): Z is stored as fp16 p̃ plus per-(row, warp tile) maxima (common.cuh)
#endif

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
#if FLCE_WGMMA
// ---- Hopper main loop: wgmma from 128-byte-swizzled shared tiles (sm_90a) -------------------
// Two warpgroups each own 64 rows of the 128-row tile (WARPS_M = 8 warps of 16 rows, WARPS_N = 1),
// so a thread's accumulators acc[0][j][e] sit exactly where the mma.sync path puts them (row
// 16*warp + g + 8*(e/2), column 8*j + 2*t + e%2) and the epilogues below serve both paths.
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

// One stored tile into its swizzled shared layout. K-major: ROWS rows of 64 k. MN-major: 64 k rows
// of ROWS contiguous elements.
template <int ROWS, bool KMAJOR>
__device__ __forceinline__ void load_swizzled(unsigned char *dst, const elem_t *src, long long mn0,
                                              long long k0, long long n_rows, long long n_cols, long long ld)
{
    constexpr int CHUNKS = ROWS * BK / 8; // 16-byte chunks in the tile
    for (int i = threadIdx.x; i < CHUNKS; i += THREADS) {
        long long gr, gc;
        int off;
        if (KMAJOR) {
            int r = i / 8, c = i % 8;
            gr = mn0 + r, gc = k0 + c * 8;
            off = r * 128 + ((c ^ (r & 7)) << 4);
        } else {
            int r = i / (ROWS / 8), cc = i % (ROWS / 8), blk = cc / 8, c = cc % 8;
            gr = k0 + r, gc = mn0 + cc * 8;
            off = blk * (BK * 128) + r * 128 + ((c ^ (r & 7)) << 4);
        }
        bool ok = gr < n_rows && gc < n_cols;
        cp_async_16(dst + off, ok ? src + gr * ld + gc : src, ok);
    }
}

__device__ __forceinline__ void load_stage(unsigned char *stage, const flce_gemm_params &p, long long m0,
                                           long long n0, long long k0)
{
    load_swizzled<BM, A_KMAJOR>(stage, (const elem_t *)p.a, m0, k0, p.a_rows, p.a_cols, p.lda);
    load_swizzled<BN, B_KMAJOR>(stage + A_BYTES, (const elem_t *)p.b, n0, k0, p.b_rows, p.b_cols, p.ldb);
}

#if FLCE_TCGEN05
// (tcgen05: one thread issues each stage's MMAs, mma_tiles below)
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

#if FLCE_TMA
// ---- TMA + mbarrier pipeline, warp-specialized -----------------------------------------------
// Warpgroup 0 is the producer: one of its threads issues, per stage, the TMA copies of the A and B
// tiles into the same swizzled layouts as above (the tensor maps use the 128-byte swizzle, and the
// stages sit on 1024-byte boundaries) and arms the stage's "full" barrier with the bytes to expect.
// Warpgroups 1 and 2 are the consumers: the 64-row halves of the cp.async path, same fragments, so
// the epilogues are shared. Each stage has two mbarriers:
//   full[s]   1 arrival (the producer's arrive.expect_tx) + STAGE_BYTES of completed copies;
//   empty[s]  one arrival per consumer warpgroup, once the wgmmas that read the stage are done.
// The u-th use of stage s (u = it / STAGES, `it` counting k-tiles over all of the CTA's tiles)
// waits for parity u & 1 of full[s]; the producer waits for parity (u & 1) ^ 1 of empty[s], which a
// fresh barrier reports complete, so the first STAGES loads go out at once. The producer runs
// ahead across output tiles too: the next tile's first stages load during this tile's epilogue.
// No CTA-wide barrier after the role split: the producer warpgroup has returned.
constexpr int CONSUMER_WGS = THREADS / 128;
constexpr int PIPE_BYTES = STAGES * STAGE_BYTES; // the 2·STAGES barriers follow the stages
// Registers per thread after the split: 128·40 + 256·232 = 64512 of the SM's 65536.
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
static_assert(THREADS == 256, "TMA path: two consumer warpgroups");

__device__ __forceinline__ unsigned full_bar(unsigned char *smem, int s) { return smem_addr(smem + PIPE_BYTES) + 8 * s; }
__device__ __forceinline__ unsigned empty_bar(unsigned char *smem, int s)
{
    return smem_addr(smem + PIPE_BYTES) + 8 * (STAGES + s);
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Spins until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// One box of the tensor map at element coordinates (x = innermost, y) into shared memory; the
// copy's bytes complete on `bar`. Out-of-bounds parts of the box arrive as zeros.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const flce_tmap *map, int x, int y, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }

#if FLCE_TCGEN05
// ---- Blackwell: tcgen05.mma into tensor memory (sm_100a) ------------------------------------
// Same TMA stages, swizzled layouts and producer thread as above; what changes is who multiplies.
// Warp 1 of the producer warpgroup allocates TMEM_COLS columns of tensor memory (two BN-column fp32
// accumulators: D row i lives in TMEM lane i, column j in column j of the buffer) and one of its
// threads issues tcgen05.mma for the whole 128 × BN tile, 4 per stage (K = 16 each). Its
// tcgen05.commit returns a stage to the producer (empty[s], 1 arrival) once those MMAs have read it,
// and reports a finished accumulator on tmem_full[b]. The consumers copy the accumulator into the
// acc[0][j][e] fragment of the wgmma path with tcgen05.ld.16x256b (whose register r of lane l holds
// row l/4 + 8·(r/2 % 2), column 2·(l%4) + r%2 + 8·(r/4): the mma.sync C layout), release the buffer
// on tmem_empty[b] (all 256 consumer threads) and run the shared epilogues while warp 1 already
// accumulates the next tile into the other buffer. tcgen05.ld lets warp w reach only TMEM lanes
// 32·(w % 4) … +31, so consumer warp w (CTA warp w + 4) owns rows 16·tc_row_block(w) … +15.
static_assert(TMEM_COLS >= 2 * BN && TMEM_COLS <= 512, "two accumulators in tensor memory");
static_assert(BN % 64 == 0, "the epilogue loads 64 accumulator columns at a time");

__device__ __forceinline__ int tc_row_block(int warp) { return 2 * (warp % 4) + warp / 4; }
__device__ __forceinline__ unsigned tmem_full_bar(unsigned char *smem, int b) { return full_bar(smem, 2 * STAGES + b); }
__device__ __forceinline__ unsigned tmem_empty_bar(unsigned char *smem, int b) { return full_bar(smem, 2 * STAGES + 2 + b); }
// tcgen05.alloc writes the tensor-memory address (lane 0, first column) here.
__device__ __forceinline__ unsigned *tmem_slot(unsigned char *smem) { return (unsigned *)(smem + PIPE_BYTES + 8 * (2 * STAGES + 4)); }

__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }

// Shared memory descriptor of sm_100 (PTX ISA, "tcgen05 shared memory descriptor"): start, LBO and
// SBO >> 4 as on Hopper, plus the fixed version 0b001 at bits 46-48; base offset 0 (stages sit on
// 1024-byte boundaries), swizzle mode 2 = 128-byte at bits 61-63.
__device__ __forceinline__ unsigned long long umma_desc(unsigned addr, unsigned lbo, unsigned sbo)
{
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 46) | (2ull << 61);
}

// Instruction descriptor of .kind::f16 (PTX ISA, "Instruction descriptor"): D f32 (bits 4-5 = 1),
// A and B f16 = 0 / bf16 = 1 (bits 7-9, 10-12), transpose = MN-major A (bit 15) and B (bit 16) as
// wgmma's imm-trans, N >> 3 (bits 17-22), M >> 4 (bits 24-28); dense, no negation, no shift.
constexpr unsigned AB_TYPE = FLCE_DTYPE == DTYPE_BF16 ? 1u : 0u;
constexpr unsigned IDESC = (1u << 4) | (AB_TYPE << 7) | (AB_TYPE << 10) | ((A_KMAJOR ? 0u : 1u) << 15) |
                           ((B_KMAJOR ? 0u : 1u) << 16) | ((unsigned)(BN >> 3) << 17) | ((unsigned)(BM >> 4) << 24);

// D[tmem] (+)= A[a] · B[b] for 128 × BN × 16, issued by one thread; accumulate = 0 overwrites D.
__device__ __forceinline__ void tc_mma(unsigned d, unsigned long long a, unsigned long long b, unsigned accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %4, 0;\n"
                 "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p;\n}\n"
                 ::"r"(d), "l"(a), "l"(b), "r"(IDESC), "r"(accumulate)
                 : "memory");
}
// One arrival on `bar` once every tcgen05.mma this thread issued so far has completed.
__device__ __forceinline__ void tc_commit(unsigned bar)
{
    asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Called by every thread before the role split: barriers (thread 0) and tensor memory (warp 1).
__device__ __forceinline__ void pipe_init(unsigned char *smem)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full_bar(smem, s), 1), mbar_init(empty_bar(smem, s), 1);
        for (int b = 0; b < 2; b++) mbar_init(tmem_full_bar(smem, b), 1), mbar_init(tmem_empty_bar(smem, b), THREADS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the copy engine
    }
    if (threadIdx.x / 32 == 1) { // warp-wide; one CTA per SM (launch bounds, shared memory), so no wait
        asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n"
                     ::"r"(smem_addr(tmem_slot(smem))), "n"(TMEM_COLS) : "memory");
        asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
    }
    tc_fence_before();
    __syncthreads();
    tc_fence_after();
}
#else
// Called by every thread before the role split.
__device__ __forceinline__ void pipe_init(unsigned char *smem)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(full_bar(smem, s), 1), mbar_init(empty_bar(smem, s), CONSUMER_WGS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); // visible to the copy engine
    }
    __syncthreads();
}

#endif // FLCE_TCGEN05
// One operand's tile of a stage: K-major one box of 64 k × ROWS, MN-major ROWS/64 boxes of 64 × 64 k.
template <int ROWS, bool KMAJOR>
__device__ __forceinline__ void tma_operand(unsigned char *dst, const flce_tmap *map, int mn0, int k0, unsigned bar)
{
    if (KMAJOR) {
        tma_load_2d(smem_addr(dst), map, k0, mn0, bar);
    } else {
#pragma unroll
        for (int b = 0; b < ROWS / 64; b++) tma_load_2d(smem_addr(dst + b * (BK * 128)), map, mn0 + 64 * b, k0, bar);
    }
}

// Producer (one thread): every k-tile of n_tiles output tiles (m0, n0 + i·BN), in the consumers'
// order; `it` carries the pipeline position from call to call.
__device__ void produce(const flce_gemm_params &p, unsigned char *smem, long long m0, long long n0, long long n_tiles,
                        int &it)
{
    const int ktiles = (int)((p.k + BK - 1) / BK);
    for (long long t = 0; t < n_tiles; t++)
        for (int kt = 0; kt < ktiles; kt++, it++) {
            const int s = it % STAGES;
            mbar_wait(empty_bar(smem, s), ((it / STAGES) & 1) ^ 1);
            const unsigned full = full_bar(smem, s);
            mbar_arrive_expect_tx(full, STAGE_BYTES);
            unsigned char *stage = smem + s * STAGE_BYTES;
            tma_operand<BM, A_KMAJOR>(stage, &p.tmap_a, (int)m0, kt * BK, full);
            tma_operand<BN, B_KMAJOR>(stage + A_BYTES, &p.tmap_b, (int)(n0 + t * BN), kt * BK, full);
        }
}

#if FLCE_TCGEN05
// Warp 1 (all 32 threads; lane 0 issues): the MMAs of n_tiles output tiles in the producer's order,
// accumulator buffer t % 2 for the t-th, then the tensor memory goes back once the consumers have
// read the last accumulator (they release the buffers in order, so its release implies the rest).
// Not inlined: inside the kernel ptxas spilled 8 bytes of this loop (NVRTC 13.0); alone, none.
__device__ __noinline__ void mma_tiles(const flce_gemm_params &p, unsigned char *smem, long long n_tiles)
{
    const unsigned tmem = *(volatile unsigned *)tmem_slot(smem);
    const int ktiles = (int)((p.k + BK - 1) / BK);
    constexpr unsigned A_LBO = A_KMAJOR ? 16 : BK * 128, B_LBO = B_KMAJOR ? 16 : BK * 128;
    if (threadIdx.x % 32 == 0) {
        int it = 0;
        for (long long t = 0; t < n_tiles; t++) {
            const int buf = (int)(t & 1);
            mbar_wait(tmem_empty_bar(smem, buf), (unsigned)((t >> 1) & 1) ^ 1); // consumers read it
            tc_fence_after();
            const unsigned d = tmem + (unsigned)(buf * BN); // column offset in the low 16 bits
            for (int kt = 0; kt < ktiles; kt++, it++) {
                const int s = it % STAGES;
                mbar_wait(full_bar(smem, s), (it / STAGES) & 1);
                tc_fence_after();
                const unsigned a_base = smem_addr(smem + s * STAGE_BYTES), b_base = a_base + A_BYTES;
#pragma unroll
                for (int kk = 0; kk < BK / 16; kk++) {
                    // K-major: 32 bytes further inside the swizzled row; MN-major: 16 k rows further
                    unsigned long long da = umma_desc(a_base + (A_KMAJOR ? kk * 32 : kk * 2048), A_LBO, 1024);
                    unsigned long long db = umma_desc(b_base + (B_KMAJOR ? kk * 32 : kk * 2048), B_LBO, 1024);
                    tc_mma(d, da, db, (kt | kk) != 0);
                }
                tc_commit(empty_bar(smem, s)); // the stage goes back once these MMAs have read it
            }
            if (ktiles > 0) tc_commit(tmem_full_bar(smem, buf));
            else mbar_arrive(tmem_full_bar(smem, buf)); // no MMA: the consumers write zeros
        }
    }
    __syncwarp();
    if (n_tiles > 0) mbar_wait(tmem_empty_bar(smem, (int)((n_tiles - 1) & 1)), (unsigned)(((n_tiles - 1) >> 1) & 1));
    tc_fence_after();
    asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(tmem), "n"(TMEM_COLS) : "memory");
}

// 64 accumulator columns (8 fragments j0 … j0+7) of this warp's 16 rows from tensor memory. The
// wait sits in the same asm statement, so no instruction can read a register before it has landed.
__device__ __forceinline__ void tmem_ld64(float (&d)[NI][4], int j0, unsigned taddr)
{
    asm volatile("tcgen05.ld.sync.aligned.16x256b.x8.b32 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, [%32];\n"
                 "tcgen05.wait::ld.sync.aligned;\n"
                 : "=f"(d[j0][0]), "=f"(d[j0][1]), "=f"(d[j0][2]), "=f"(d[j0][3]),
                   "=f"(d[j0 + 1][0]), "=f"(d[j0 + 1][1]), "=f"(d[j0 + 1][2]), "=f"(d[j0 + 1][3]),
                   "=f"(d[j0 + 2][0]), "=f"(d[j0 + 2][1]), "=f"(d[j0 + 2][2]), "=f"(d[j0 + 2][3]),
                   "=f"(d[j0 + 3][0]), "=f"(d[j0 + 3][1]), "=f"(d[j0 + 3][2]), "=f"(d[j0 + 3][3]),
                   "=f"(d[j0 + 4][0]), "=f"(d[j0 + 4][1]), "=f"(d[j0 + 4][2]), "=f"(d[j0 + 4][3]),
                   "=f"(d[j0 + 5][0]), "=f"(d[j0 + 5][1]), "=f"(d[j0 + 5][2]), "=f"(d[j0 + 5][3]),
                   "=f"(d[j0 + 6][0]), "=f"(d[j0 + 6][1]), "=f"(d[j0 + 6][2]), "=f"(d[j0 + 6][3]),
                   "=f"(d[j0 + 7][0]), "=f"(d[j0 + 7][1]), "=f"(d[j0 + 7][2]), "=f"(d[j0 + 7][3])
                 : "r"(taddr)
                 : "memory");
}

// Consumer: acc = this warp's 16 rows of the next output tile (tile `it` of the CTA's sequence, in
// accumulator buffer it % 2); `it` counts tiles here, not k-tiles. wg is unused (kept for the call).
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p, int &it, int wg)
{
    (void)wg;
    const int buf = it & 1;
    mbar_wait(tmem_full_bar(smem, buf), (unsigned)(it >> 1) & 1);
    it++;
    tc_fence_after();
    const int warp = (int)(threadIdx.x - PRODUCER_THREADS) / 32;
    // TMEM address: lane (bits 31-16) = this warp's first row, column (bits 15-0) = the buffer's.
    const unsigned taddr = *(volatile unsigned *)tmem_slot(smem) + ((unsigned)(16 * tc_row_block(warp)) << 16) +
                           (unsigned)(buf * BN);
#pragma unroll
    for (int c = 0; c < NI / 8; c++) tmem_ld64(acc[0], 8 * c, taddr + 64 * c);
    if (p.k <= 0) // no MMA ran: the buffer holds stale values
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    tc_fence_before();
    mbar_arrive(tmem_empty_bar(smem, buf));
}
#else
// Consumer warpgroup wg: acc = this warpgroup's 64 rows of the next output tile. `it` carries the
// pipeline position from tile to tile.
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p, int &it, int wg)
{
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    fence_acc(acc);
    const int ktiles = (int)((p.k + BK - 1) / BK);
    const bool signals = threadIdx.x % 128 == 0; // one arrival per warpgroup
    for (int kt = 0; kt < ktiles; kt++, it++) {
        const int s = it % STAGES;
        mbar_wait(full_bar(smem, s), (it / STAGES) & 1);
        compute_stage(acc, smem + s * STAGE_BYTES, wg);
        // This k-tile's wgmmas stay in flight; the previous one's are done, so its stage goes back.
        wgmma_wait<1>();
        if (kt > 0 && signals) mbar_arrive(empty_bar(smem, (it - 1) % STAGES));
    }
    wgmma_wait<0>();
    fence_acc(acc);
    if (ktiles > 0 && signals) mbar_arrive(empty_bar(smem, (it - 1) % STAGES));
}
#endif // FLCE_TCGEN05
#else
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem, const flce_gemm_params &p,
                         long long m0, long long n0, int wm, int wn, int lane)
{
    (void)wn, (void)lane;
    const int wg = wm / 4;
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[0][j][e] = 0.f;
    const int ktiles = (int)((p.k + BK - 1) / BK);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load_stage(smem + s * STAGE_BYTES, p, m0, n0, (long long)s * BK);
        cp_async_commit();
    }
    fence_acc(acc);
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        fence_proxy_async(); // cp.async wrote through the generic proxy; wgmma reads through the async one
        __syncthreads();     // stage kt landed for everyone
        compute_stage(acc, smem + (kt % STAGES) * STAGE_BYTES, wg);
        // Keep this k-tile's wgmmas in flight; the previous tile's must be done (in both
        // warpgroups, hence the barrier) before its stage is refilled.
        wgmma_wait<1>();
        __syncthreads();
        int next = kt + STAGES - 1;
        if (next < ktiles) load_stage(smem + (next % STAGES) * STAGE_BYTES, p, m0, n0, (long long)next * BK);
        cp_async_commit();
    }
    wgmma_wait<0>();
    fence_acc(acc);
    cp_async_wait<0>();
    __syncthreads();
}
#endif // FLCE_TMA

// The dynamic shared window rounded up to the 1024-byte boundary the swizzle pattern starts on.
__device__ __forceinline__ unsigned char *tile_smem(unsigned char *raw)
{
    unsigned a = smem_addr(raw);
    return raw + ((1024 - (a & 1023)) & 1023);
}
#else
constexpr int PAD = VEC;                               // one vector of padding: no bank conflicts
// Shared tiles: K-major [rows][BK + PAD], transposed [BK][rows + PAD].
constexpr int A_TILE = A_KMAJOR ? BM * (BK + PAD) : BK * (BM + PAD);
constexpr int B_TILE = B_KMAJOR ? BN * (BK + PAD) : BK * (BN + PAD);
constexpr int STAGE_ELEMS = A_TILE + B_TILE;
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be whole 16x16 blocks");
static_assert(BK % 16 == 0 || FLCE_DTYPE == DTYPE_F32, "BK must be a multiple of 16");

__device__ __forceinline__ elem_t *a_at(elem_t *As, int row, int k)
{
    return A_KMAJOR ? As + row * (BK + PAD) + k : As + k * (BM + PAD) + row;
}
__device__ __forceinline__ elem_t *b_at(elem_t *Bs, int col, int k)
{
    return B_KMAJOR ? Bs + col * (BK + PAD) + k : Bs + k * (BN + PAD) + col;
}

// Copies one stored tile (rows × cols of the stored matrix, cols contiguous) into shared memory.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(elem_t *dst, const elem_t *src, long long r0, long long c0,
                                          long long n_rows, long long n_cols, long long ld)
{
    constexpr int VPR = COLS / VEC; // vectors per row
    for (int i = threadIdx.x; i < ROWS * VPR; i += THREADS) {
        int r = i / VPR, c = (i % VPR) * VEC;
        long long gr = r0 + r, gc = c0 + c;
        bool ok = gr < n_rows && gc < n_cols;
        cp_async_16(dst + r * (COLS + PAD) + c, ok ? src + gr * ld + gc : src, ok);
    }
}

__device__ __forceinline__ void load_stage(elem_t *stage, const flce_gemm_params &p, long long m0,
                                           long long n0, long long k0)
{
    const elem_t *A = (const elem_t *)p.a, *B = (const elem_t *)p.b;
    if (A_KMAJOR) load_tile<BM, BK>(stage, A, m0, k0, p.a_rows, p.a_cols, p.lda);
    else load_tile<BK, BM>(stage, A, k0, m0, p.a_rows, p.a_cols, p.lda);
    if (B_KMAJOR) load_tile<BN, BK>(stage + A_TILE, B, n0, k0, p.b_rows, p.b_cols, p.ldb);
    else load_tile<BK, BN>(stage + A_TILE, B, k0, n0, p.b_rows, p.b_cols, p.ldb);
}

// One BK-deep stage of tensor-core work. Fragment addresses follow the m16n8k16 layouts:
// ldmatrix (K-major tiles) or ldmatrix.trans (transposed tiles) hands each thread exactly the
// A rows g, g+8 / B column g (g = lane/4) pairs it needs.
__device__ __forceinline__ void compute_stage(float (&acc)[MI][NI][4], elem_t *As, elem_t *Bs,
                                              int wm, int wn, int lane)
{
#if FLCE_DTYPE != DTYPE_F32
    const int idx = lane / 8, r8 = lane % 8;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
        unsigned af[MI][4], bf[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
            int row = wm * WTM + mi * 16;
            if (A_KMAJOR) ldmatrix_x4(af[mi], a_at(As, row + lane % 16, kk + (lane / 16) * 8));
            else ldmatrix_x4_trans(af[mi], a_at(As, row + (idx % 2) * 8, kk + r8 + (idx / 2) * 8));
        }
#pragma unroll
        for (int nj = 0; nj < NI / 2; nj++) {
            int col = wn * WTN + nj * 16;
            unsigned r[4];
            if (B_KMAJOR) ldmatrix_x4(r, b_at(Bs, col + r8 + (idx / 2) * 8, kk + (idx % 2) * 8));
            else ldmatrix_x4_trans(r, b_at(Bs, col + (idx / 2) * 8, kk + r8 + (idx % 2) * 8));
            bf[2 * nj][0] = r[0], bf[2 * nj][1] = r[1];
            bf[2 * nj + 1][0] = r[2], bf[2 * nj + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++) mma_16816(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
#else
    const int g = lane / 4, t = lane % 4;
#pragma unroll 4
    for (int kk = 0; kk < BK; kk++) {
        float a[MI][2], b[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) a[mi][h] = *a_at(As, wm * WTM + mi * 16 + g + 8 * h, kk);
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int c = 0; c < 2; c++) b[ni][c] = *b_at(Bs, wn * WTN + ni * 8 + 2 * t + c, kk);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mi][ni][e] = fmaf(a[mi][e / 2], b[ni][e % 2], acc[mi][ni][e]);
    }
#endif
}

// acc = A[m0.., :] · B[n0.., :]ᵀ over the whole k extent, STAGES-deep cp.async pipeline.
// Ends with a barrier so the caller may reuse shared memory.
__device__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem_bytes, const flce_gemm_params &p,
                         long long m0, long long n0, int wm, int wn, int lane)
{
    elem_t *smem = (elem_t *)smem_bytes;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.f;
    const int ktiles = (int)((p.k + BK - 1) / BK);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) load_stage(smem + s * STAGE_ELEMS, p, m0, n0, (long long)s * BK);
        cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); // stage kt landed for everyone; stage kt-1 is free to refill
        int next = kt + STAGES - 1;
        if (next < ktiles) load_stage(smem + (next % STAGES) * STAGE_ELEMS, p, m0, n0, (long long)next * BK);
        cp_async_commit();
        elem_t *stage = smem + (kt % STAGES) * STAGE_ELEMS;
        compute_stage(acc, stage, stage + A_TILE, wm, wn, lane);
    }
    cp_async_wait<0>();
    __syncthreads();
}

__device__ __forceinline__ unsigned char *tile_smem(unsigned char *raw) { return raw; }
#endif

#if ROLE_IS_LOGITS
#if FLCE_COMPACT
// Two floats to fp16 (round to nearest) in one word, lo in the low half: the stored pair order.
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif
// The logit transform of the math: bias, temperature, softcap — all compile-time optional.
__device__ __forceinline__ float transform_logit(float acc, long long col, const flce_gemm_params &p)
{
    float z = acc;
    if (OPT_BIAS) z += to_f32(((const elem_t *)p.bias)[col]);
    if (INV_TEMP != 1.f) z *= INV_TEMP;
    if (SOFTCAP > 0.f) z = SOFTCAP * tanhf(z * (1.f / SOFTCAP));
    return z;
}

// Columns j < cols_inside(limit, c0) of a thread's warp tile starting at column c0 lie below
// `limit` (the shard's n, or a row stride).
__device__ __forceinline__ int cols_inside(long long limit, long long c0)
{
    return (int)(limit - c0 < WTN ? (limit - c0 > 0 ? limit - c0 : 0) : WTN);
}
// The label's j within the warp tile at c0, or −1 when the label (lab ≥ 0) falls elsewhere.
__device__ __forceinline__ int label_col(long long lab, long long c0)
{
    const long long ly = lab - c0;
    return lab >= 0 && ly >= 0 && ly < WTN ? (int)ly : -1;
}

// Folds one vocab tile into each owned row's running statistics; records target logits and stores
// Z. Element (mi, ni, e) of acc sits at row wm*WTM + mi*16 + g + 8*(e/2), column
// wn*WTN + ni*8 + 2*t + e%2 of the tile, i.e. at column c0 + j of the shard with j = ni*8 + e%2.
// Columns are handled as the small int j against per-thread limits (FULL: the whole tile lies
// inside the shard, the common case, no masks at all), which keeps the 128×256 tile's epilogue
// within the consumers' registers beside 128 accumulators.
template <bool FULL>
__device__ __forceinline__ void logits_epilogue_t(float (&acc)[MI][NI][4], const flce_gemm_params &p,
                                                  long long m0, long long n0, int wm, int wn, int lane,
                                                  const long long (&lab)[MI][2], row_stats (&run)[MI][2])
{
    const int g = lane / 4, t = lane % 4;
    const long long c0 = n0 + wn * WTN + 2 * t;
    // Columns j < lim lie inside the shard; j < zlim inside Z's row. Past the shard TMA and
    // cp.async filled zeros, which are logits of 0, not absent: they are masked here.
    const int lim = FULL ? WTN : cols_inside(p.n, c0);
    const int zlim = FULL ? WTN : cols_inside(p.ldo, c0);
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long row = m0 + wm * WTM + mi * 16 + g + 8 * h;
            const int lj = label_col(lab[mi][h], c0);
            row_stats tile;
            tile.m = NEG_INF, tile.s = 0.f, tile.t = 0.f, tile.zs = 0.f;
            int arg = -1; // j of the first maximum
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int j = ni * 8 + c;
                    const bool in = FULL || j < lim;
                    float z = in ? transform_logit(acc[mi][ni][2 * h + c], c0 + j, p) : 0.f;
                    acc[mi][ni][2 * h + c] = z;
                    if (in && z > tile.m) tile.m = z, arg = j;
                }
#if FLCE_COMPACT
            // One m per (row, warp tile): the 4 lanes sharing the row agree on their maximum, so
            // the exps below are both the statistics' and the stored p̃. A lane whose own maximum
            // is below it holds no argmax candidate.
            {
                const float own = tile.m;
                tile.m = fmaxf(tile.m, __shfl_xor_sync(0xffffffffu, tile.m, 1));
                tile.m = fmaxf(tile.m, __shfl_xor_sync(0xffffffffu, tile.m, 2));
                if (own < tile.m) arg = -1;
            }
            const bool store = p.out && row < p.m;
            unsigned *pt_row = (unsigned *)((unsigned short *)p.out + (store ? row : 0) * p.ldo + c0);
            // (lim > 0: a warp tile wholly past the shard, as in the mma.sync path's last tile, has
            // no group of its own in tile_max.)
            if (store && t == 0 && (FULL || lim > 0))
                ((float *)p.tile_max)[row * p.ld_tile_max + (c0 - 2 * t) / WTN] = tile.m;
#endif
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                float en[2] = {0.f, 0.f};
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int j = ni * 8 + c;
                    float z = acc[mi][ni][2 * h + c];
                    if (FULL || j < lim) {
                        float e = expf(z - tile.m);
                        en[c] = e;
                        tile.s += e;
                        if (OPT_ENTROPY) tile.t += e * z;
                        if (OPT_ZSUM)
                            tile.zs += OPT_WEIGHTS ? ((const float *)p.class_weights)[p.vocab_offset + c0 + j] * z : z;
                    }
                    if (j == lj && p.target) ((float *)p.target)[row] = z;
                }
#if FLCE_COMPACT
                if (store && (FULL || ni * 8 < zlim)) pt_row[ni * 4] = pack_f16x2(en[0] * COMPACT_SCALE, en[1] * COMPACT_SCALE);
#else
                (void)en;
#endif
            }
            tile.arg = arg < 0 ? 0x7fffffffffffffffLL : p.vocab_offset + c0 + arg;
            if (tile.s != tile.s || tile.m != NEG_INF) stats_merge(run[mi][h], tile);
            if (!FLCE_COMPACT && p.out && row < p.m) {
                float *z_row = (float *)p.out + row * p.ldo + c0;
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
                    if (FULL || ni * 8 < zlim)
                        *(float2 *)(z_row + ni * 8) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
}

__device__ __forceinline__ void logits_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p,
                                                long long m0, long long n0, int wm, int wn, int lane,
                                                const long long (&lab)[MI][2], row_stats (&run)[MI][2])
{
    if (n0 + BN <= p.n) logits_epilogue_t<true>(acc, p, m0, n0, wm, wn, lane, lab, run);
    else logits_epilogue_t<false>(acc, p, m0, n0, wm, wn, lane, lab, run);
}

#if FLCE_FUSED_DZ
// What the dZ epilogue needs of each owned row (rowops.cu's flce_dz computes the same per row).
struct dz_row {
    float lse, a, wy, g;
    bool valid;
};

__device__ __forceinline__ dz_row dz_row_setup(const flce_gemm_params &p, long long row)
{
    dz_row r;
    long long y = row < p.m ? load_label(p.labels, row) : p.ignore_index;
    r.valid = y != p.ignore_index && y >= 0 && y < p.vocab_total;
    r.lse = r.valid ? ((const float *)p.lse)[row] : 0.f;
    r.wy = r.valid ? (OPT_WEIGHTS ? ((const float *)p.class_weights)[y] : 1.f) : 0.f;
    r.g = 1.f;
#if FLCE_REDUCTION == REDUCTION_NONE
    if (r.valid && p.grad_output) r.g = ((const float *)p.grad_output)[row];
#endif
    r.a = dz_row_a(r.wy, r.lse, ((const float *)p.stats)[1], p.vocab_total);
    return r;
}

// dZ of one vocab tile in the input dtype, straight from the accumulators: the same formula as
// flce_dz (common.cuh) without the fp32 Z round trip through memory. Columns past the shard up to
// the row stride get zeros, as flce_dz writes them.
template <bool FULL>
__device__ __forceinline__ void dz_epilogue_t(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long m0,
                                              long long n0, int wm, int wn, int lane, const long long (&lab)[MI][2],
                                              const dz_row (&dr)[MI][2])
{
    const int g = lane / 4, t = lane % 4;
    const long long c0 = n0 + wn * WTN + 2 * t;
    const int lim = FULL ? WTN : cols_inside(p.n, c0);
    const int zlim = FULL ? WTN : cols_inside(p.ldo, c0);
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long long row = m0 + wm * WTM + mi * 16 + g + 8 * h;
            if (row >= p.m) continue;
            const dz_row r = dr[mi][h];
            const int lj = label_col(lab[mi][h], c0);
            elem_t *dz = (elem_t *)p.out + row * p.ldo + c0;
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                if (!FULL && ni * 8 >= zlim) continue;
                float v[2];
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int j = ni * 8 + c;
                    v[c] = 0.f;
                    if ((FULL || j < lim) && r.valid) {
                        const float z = transform_logit(acc[mi][ni][2 * h + c], c0 + j, p);
                        const float wj = OPT_ZSUM && OPT_WEIGHTS ? ((const float *)p.class_weights)[p.vocab_offset + c0 + j] : 1.f;
                        v[c] = dz_value(z, r.lse, r.a, j == lj, r.wy, wj, r.g, p.vocab_total);
                    }
                }
#if FLCE_DTYPE == DTYPE_F32
                *(float2 *)(dz + ni * 8) = make_float2(v[0], v[1]);
#else
                *(unsigned *)(dz + ni * 8) = (unsigned)from_f32(v[0]) | ((unsigned)from_f32(v[1]) << 16);
#endif
            }
        }
}
#endif // FLCE_FUSED_DZ

__device__ __forceinline__ row_stats shfl_stats(const row_stats &a, int off)
{
    row_stats b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, off);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, off);
    b.t = OPT_ENTROPY ? __shfl_xor_sync(0xffffffffu, a.t, off) : 0.f;
    b.zs = OPT_ZSUM ? __shfl_xor_sync(0xffffffffu, a.zs, off) : 0.f;
    b.arg = OPT_ARGMAX ? __shfl_xor_sync(0xffffffffu, a.arg, off) : 0;
    return b;
}

__device__ __forceinline__ void store_partials(const flce_gemm_params &p, long long row, int split, const row_stats &a)
{
    long long at = row * p.splits + split;
    ((float *)p.part_m)[at] = a.m;
    ((float *)p.part_s)[at] = a.s;
    if (OPT_ENTROPY) ((float *)p.part_t)[at] = a.t;
    if (OPT_ZSUM) ((float *)p.part_zs)[at] = a.zs;
    if (OPT_ARGMAX) ((long long *)p.part_arg)[at] = a.arg;
}

#ifndef LOGITS_GROUP
#define LOGITS_GROUP 8
#endif
// grid: (row blocks, vocab splits). Each CTA walks tiles_per_split vocab tiles of its split.
extern "C" __global__ void FLCE_KERNEL_BOUNDS flce_logits(FLCE_PARAM p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = tile_smem(smem_raw);
    // CTAs start in launch order (blockIdx.x fastest). Taken as given, the CTAs running at once
    // would hold ~all row blocks (at 8192 tokens, 64 blocks of A, 1 MiB each at D = 4096: more than
    // L2) and each re-reads its block for every vocab tile. Renumbered in groups of LOGITS_GROUP
    // row blocks × all splits, the CTAs in flight share a few A blocks (which stay in L2) and each
    // vocab tile of W is read by LOGITS_GROUP of them at about the same time. A bijection of the
    // grid, so every (row block, split) still runs exactly once.
    long long m0;
    int split;
    {
        const long long row_blocks = gridDim.x, lin = (long long)blockIdx.y * gridDim.x + blockIdx.x;
        const long long per_group = (long long)LOGITS_GROUP * gridDim.y, g = lin / per_group, w = lin % per_group;
        const long long first = g * LOGITS_GROUP;
        const long long rows_here = row_blocks - first < LOGITS_GROUP ? row_blocks - first : LOGITS_GROUP;
        m0 = (first + w % rows_here) * BM;
        split = (int)(w / rows_here);
    }
    const long long tiles = (p.n + BN - 1) / BN;
    long long t_begin = (long long)split * p.tiles_per_split;
    long long t_end = t_begin + p.tiles_per_split < tiles ? t_begin + p.tiles_per_split : tiles;
#if FLCE_TMA
    pipe_init(smem);
    if (threadIdx.x < PRODUCER_THREADS) {
        setmaxnreg_dec<PRODUCER_REGS>();
        int it = 0;
        if (threadIdx.x == 0) produce(p, smem, m0, t_begin * BN, t_end - t_begin, it);
#if FLCE_TCGEN05
        if (threadIdx.x / 32 == 1) mma_tiles(p, smem, t_end - t_begin); // warp 1: MMAs, then dealloc
#endif
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
    int it = 0;
#endif
    const int warp = (threadIdx.x - PRODUCER_THREADS) / 32, lane = threadIdx.x % 32;
#if FLCE_TCGEN05
    const int wm = tc_row_block(warp), wn = 0;
#else
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
#endif

    // Label column of each owned row within [0, n); −1 when ignored, out of range or elsewhere.
    long long lab[MI][2];
#if FLCE_FUSED_DZ
    dz_row dr[MI][2];
#else
    row_stats run[MI][2];
#endif
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long row = m0 + wm * WTM + mi * 16 + lane / 4 + 8 * h;
            long long y = row < p.m ? load_label(p.labels, row) - p.vocab_offset : -1;
            lab[mi][h] = (y >= 0 && y < p.n) ? y : -1;
#if FLCE_FUSED_DZ
            dr[mi][h] = dz_row_setup(p, row);
            if (!dr[mi][h].valid) lab[mi][h] = -1;
#else
            run[mi][h].m = NEG_INF, run[mi][h].s = 0.f, run[mi][h].t = 0.f, run[mi][h].zs = 0.f;
            run[mi][h].arg = 0x7fffffffffffffffLL;
#endif
        }

    float acc[MI][NI][4];
    for (long long vt = t_begin; vt < t_end; vt++) {
#if FLCE_TMA
        mainloop(acc, smem, p, it, wm / 4);
#else
        mainloop(acc, smem, p, m0, vt * BN, wm, wn, lane);
#endif
#if FLCE_FUSED_DZ
        if (vt * BN + BN <= p.n) dz_epilogue_t<true>(acc, p, m0, vt * BN, wm, wn, lane, lab, dr);
        else dz_epilogue_t<false>(acc, p, m0, vt * BN, wm, wn, lane, lab, dr);
#else
        logits_epilogue(acc, p, m0, vt * BN, wm, wn, lane, lab, run);
#endif
    }
#if FLCE_FUSED_DZ
    (void)split; // dZ is all this pass writes
#else

    if (!p.part_m) return; // a gradient pass: only Z was wanted (uniform across the CTA)
    // Reduce each row's stats: first over the 4 lanes that share it, then over the WARPS_N warps
    // in a fixed order (deterministic).
    // One warp column (the wgmma paths) owns whole rows: its lane 4g stores them, no CTA barrier
    // (the TMA path's producer warpgroup has left).
    row_stats *red = (row_stats *)smem;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) stats_merge(run[mi][h], shfl_stats(run[mi][h], off));
            int r = wm * WTM + mi * 16 + lane / 4 + 8 * h;
            if (lane % 4 != 0) continue;
            if (WARPS_N > 1) red[wn * BM + r] = run[mi][h];
            else if (m0 + r < p.m) store_partials(p, m0 + r, split, run[mi][h]);
        }
    if (WARPS_N == 1) return;
    __syncthreads();
    for (int r = threadIdx.x; r < BM; r += THREADS) {
        if (m0 + r >= p.m) continue;
        row_stats a = red[r];
        for (int w = 1; w < WARPS_N; w++) stats_merge(a, red[w * BM + r]);
        store_partials(p, m0 + r, split, a);
    }
#endif // FLCE_FUSED_DZ
}

#else // DH, DW

// out = scale · acc (+ addend) for one output tile, in fp32 or the input dtype.
// The addend is usually `out` itself (an fp32 accumulator built up over chunks), so the compiler
// must keep each load behind the previous store: one full memory round trip per 8 columns, 32 per
// row of a 128×256 tile, which made the epilogue as long as a K = 640 main loop. Loading a batch
// of ADD_BATCH fragments before any of their stores puts those loads in flight together.
__host__ __device__ constexpr int add_batch(int d) { return NI % d == 0 ? d : add_batch(d - 1); }
constexpr int ADD_BATCH = add_batch(NI < 16 ? NI : 16); // the largest divisor of NI up to 16
__device__ __forceinline__ void grad_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long m0,
                                              long long n0, int wm, int wn, int lane, float scale)
{
    const int g = lane / 4, t = lane % 4;
    const float *addend = (const float *)p.addend;
    const long long c0 = n0 + wn * WTN + 2 * t; // even; n is a multiple of 8
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long row = m0 + wm * WTM + mi * 16 + g + 8 * h;
            if (row >= p.m) continue;
            const long long at0 = row * p.ldo + c0;
#pragma unroll
            for (int nb = 0; nb < NI; nb += ADD_BATCH) {
                float2 add[ADD_BATCH];
#pragma unroll
                for (int i = 0; i < ADD_BATCH; i++) {
                    const int ni = nb + i;
                    add[i] = addend && c0 + ni * 8 < p.n ? *(const float2 *)(addend + at0 + ni * 8) : make_float2(0.f, 0.f);
                }
#pragma unroll
                for (int i = 0; i < ADD_BATCH; i++) {
                    const int ni = nb + i;
                    if (c0 + ni * 8 >= p.n) continue;
                    const long long at = at0 + ni * 8;
                    float v0 = acc[mi][ni][2 * h] * scale + add[i].x, v1 = acc[mi][ni][2 * h + 1] * scale + add[i].y;
                    if (p.out_f32 || FLCE_DTYPE == DTYPE_F32) {
                        *(float2 *)((float *)p.out + at) = make_float2(v0, v1);
                    } else {
                        unsigned packed = (unsigned)from_f32(v0) | ((unsigned)from_f32(v1) << 16);
                        *(unsigned *)((elem_t *)p.out + at) = packed;
                    }
                }
            }
        }
}

// The scalar g of mean/sum is applied in the epilogue rather than in dZ, so dZ keeps values in
// [-1, 1] (fp16 would flush g·p to zero for large batches); an fp16 dZ of mean/sum is also stored
// times DZ_SCALE_F16 (scale_mode bit 4, common.cuh) so that probabilities down to ~2.4e-7 stay
// normal fp16 numbers.
__device__ __forceinline__ float grad_scale(const flce_gemm_params &p)
{
    if (!p.scale_mode) return 1.f;
    float scale = p.scale_grad ? *(const float *)p.scale_grad : 1.f;
    float denom = (p.scale_mode & 3) == 2 ? *(const float *)p.scale_count : 1.f;
    scale = denom != 0.f ? scale / denom : 0.f; // mean over no valid token: zero gradients
    return p.scale_mode & 4 ? scale * (1.f / DZ_SCALE_F16) : scale;
}

// Output tile t of the persistent walk: column tiles fastest over all rows, or (raster_rows = G)
// in groups of G row blocks × all column tiles, row blocks fastest inside a group, so the CTAs in
// flight share fewer B column tiles (a bijection either way).
__device__ __forceinline__ void tile_origin(const flce_gemm_params &p, long long t, long long tiles_m,
                                            long long tiles_n, long long &m0, long long &n0)
{
    if (p.raster_rows <= 0) {
        m0 = t / tiles_n * BM, n0 = t % tiles_n * BN;
        return;
    }
    const long long per = (long long)p.raster_rows * tiles_n, first = t / per * p.raster_rows, w = t % per;
    const long long rows_here = tiles_m - first < p.raster_rows ? tiles_m - first : p.raster_rows;
    m0 = (first + w % rows_here) * BM, n0 = w / rows_here * BN;
}

// grid: (column tiles, row tiles). On the TMA path a persistent grid instead (gridDim.y = 1, at
// most one CTA per SM, runtime/tma.c) walks the same tiles in the same order, column tiles
// fastest: tile t = blockIdx.x + i·gridDim.x. Its producer loads the next tile's first stages
// while the consumers run this tile's epilogue.
#if ROLE_IS_DH
#define FLCE_GRAD_ENTRY flce_dh
#else
#define FLCE_GRAD_ENTRY flce_dw
#endif
#if FLCE_TMA
// An accumulating tile (chunked dW, recompute's dH, caller fp32 buffers) adds 128 KB of fp32 addend
// read from DRAM in its epilogue, which nothing overlaps: the chunked strategy's dW loses ~1 ms per
// chunk to it at 8192×4096×128256 (bench/NOTES.md v11). With p.prefetch_addend the producer asks L2
// for the tile's addend rows when it starts loading the tile, a main loop before the epilogue reads
// them. Measured 1.7 % slower (NOTES v12: the cost is DRAM bandwidth, not latency), so the runtime
// leaves it off unless FLCE_ACC_PREFETCH=1.
__device__ __forceinline__ void prefetch_addend(const flce_gemm_params &p, long long m0, long long n0)
{
    if (!p.addend || !p.prefetch_addend) return;
    const long long cols = p.n - n0 < BN ? p.n - n0 : BN;
    const unsigned bytes = (unsigned)(cols * 4); // n is a multiple of 8: whole 32-byte sectors
    for (int r = 0; r < BM && m0 + r < p.m; r++) {
        const float *row = (const float *)p.addend + (m0 + r) * p.ldo + n0;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "r"(bytes) : "memory");
    }
}
#endif

extern "C" __global__ void FLCE_KERNEL_BOUNDS FLCE_GRAD_ENTRY(FLCE_PARAM p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = tile_smem(smem_raw);
#if FLCE_TMA
    const long long tiles_n = (p.n + BN - 1) / BN, tiles_m = (p.m + BM - 1) / BM, tiles = tiles_n * tiles_m;
    int it = 0;
    pipe_init(smem);
    if (threadIdx.x < PRODUCER_THREADS) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x == 0)
            for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
                long long m0, n0;
                tile_origin(p, t, tiles_m, tiles_n, m0, n0);
                prefetch_addend(p, m0, n0);
                produce(p, smem, m0, n0, 1, it);
            }
#if FLCE_TCGEN05
        if (threadIdx.x / 32 == 1) // warp 1: the MMAs of this CTA's tiles, then dealloc
            mma_tiles(p, smem, tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0);
#endif
        return;
    }
    setmaxnreg_inc<CONSUMER_REGS>();
#endif
    const int warp = (threadIdx.x - PRODUCER_THREADS) / 32, lane = threadIdx.x % 32;
#if FLCE_TCGEN05
    const int wm = tc_row_block(warp), wn = 0;
#else
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
#endif
    const float scale = grad_scale(p);
    float acc[MI][NI][4];
#if FLCE_TMA
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
        long long m0, n0;
        tile_origin(p, t, tiles_m, tiles_n, m0, n0);
        mainloop(acc, smem, p, it, wm / 4);
        grad_epilogue(acc, p, m0, n0, wm, wn, lane, scale);
    }
#else
    const long long n0 = (long long)blockIdx.x * BN, m0 = (long long)blockIdx.y * BM;
    mainloop(acc, smem, p, m0, n0, wm, wn, lane);
    grad_epilogue(acc, p, m0, n0, wm, wn, lane, scale);
#endif
}
#endif
