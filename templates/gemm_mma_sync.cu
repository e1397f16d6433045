// gemm_mma_sync.cu — the portable main loop (every sm_80+ GPU; Hopper too when the spec is not
// wgmma), built like the fast sm_80 GEMMs: STAGES BK-deep stages fed by cp.async into unpadded,
// XOR-swizzled shared tiles; each thread's load addresses and edge predicates set up once per
// output tile and advanced by one stage per k tile; the next k step's fragments loaded (ldmatrix)
// while this step's mma.sync run. 16-bit inputs use mma.sync.m16n8k16 (fp32 accumulate); fp32
// inputs use exact FFMA on the same fragment layout, so one epilogue serves both. Pasted after
// gemm.cu for the specs with neither wgmma nor tcgen05 only.
// A stored tile is ROWS rows of COLS contiguous elements (K-major operands: [rows][BK]; transposed
// ones: [BK][cols]), kept in shared memory as rows of 16-byte chunks, no padding. Logical chunk c
// of row r sits at chunk c ^ swz(r), so that the 8 rows one ldmatrix phase (or one cp.async
// phase) touches at the same logical chunk fall in 8 different 16-byte bank groups:
//   8 or more chunks per row:        swz = r mod 8
//   4 chunks (2 rows per 128 bytes): swz = (r / 2) mod 4
//   2 chunks (4 rows per 128 bytes): swz = (r / 4) mod 2
// swz repeats every 8 rows in each case, so moving 8·j rows down adds a constant offset.
template <int COLS> struct tile_layout {
    static constexpr int CPR = COLS / VEC;            // chunks per row
    static constexpr int SW = CPR < 8 ? CPR : 8;      // distinct swizzle values
    static constexpr int RPL = CPR < 8 ? 8 / CPR : 1; // rows sharing one 128-byte line of banks
    static_assert(COLS % VEC == 0 && (CPR == 1 || CPR == 2 || CPR == 4 || CPR % 8 == 0),
                  "a shared tile row must be 1, 2, 4 or a multiple of 8 vectors (spec_validate checks it)");
    __device__ static __forceinline__ int swz(int r) { return (r / RPL) % SW; }
    // Element offset of (r, c), any column c.
    __device__ static __forceinline__ int at(int r, int c) { return r * COLS + ((c / VEC) ^ swz(r)) * VEC + c % VEC; }
};
constexpr int PERIOD = 8; // rows after which every tile_layout's swizzle repeats

// Shared tiles of one stage: K-major [rows][BK], transposed [BK][rows].
using A_LAYOUT = tile_layout<A_KMAJOR ? BK : BM>;
using B_LAYOUT = tile_layout<B_KMAJOR ? BK : BN>;
constexpr int A_TILE = BM * BK, B_TILE = BN * BK;
constexpr int STAGE_ELEMS = A_TILE + B_TILE;
constexpr int STAGE_BYTES = STAGE_ELEMS * ELEM_BYTES;
constexpr int KSTEPS = BK / 16; // mma k steps per stage (16-bit inputs)
static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile must be whole 16x16 blocks");
static_assert(BK % 16 == 0 || FLCE_DTYPE == DTYPE_F32, "BK must be a multiple of 16");

// cp.async and ldmatrix on 32-bit shared-window addresses (the loop keeps those, not pointers).
__device__ __forceinline__ void cp_async_16s(unsigned dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// One operand's part of every stage for this thread: vectors i = 0 .. ITERS-1 at rows r + i·RSTEP,
// column c of the stored tile (r, c fixed by the thread index). Set up once per output tile; each
// k tile then costs one pointer increment, and the k extent is tested only where a k tile is
// partial. `ok` bit i: vector i lies inside the stored matrix in the dimension that does not move
// with k (the tile's rows of M or N).
template <int ROWS, int COLS> struct tile_loader {
    static constexpr int VPR = COLS / VEC; // vectors per stored row
    static constexpr int RSTEP = THREADS / VPR;
    static constexpr int ITERS = (ROWS + RSTEP - 1) / RSTEP;
    static_assert(THREADS % VPR == 0, "the CTA's threads must cover whole stored rows (spec_validate checks it)");
    static_assert(ITERS <= 32, "one predicate bit per vector");
};
struct operand_loader {
    const elem_t *src; // this thread's first vector of the next k tile to load
    unsigned ok;
};

// mn0: the operand's first row of M (A) or N (B); n_rows × n_cols the stored matrix.
template <int ROWS, int COLS, bool KMAJOR>
__device__ __forceinline__ operand_loader loader_init(const elem_t *base, long long mn0, long long n_rows,
                                                      long long n_cols, long long ld)
{
    using T = tile_loader<ROWS, COLS>;
    const int r = threadIdx.x / T::VPR, c = threadIdx.x % T::VPR * VEC;
    operand_loader l;
    l.ok = 0;
    if (KMAJOR) { // rows: M or N; columns: k
        l.src = base + (mn0 + r) * ld + c;
#pragma unroll
        for (int i = 0; i < T::ITERS; i++) l.ok |= (unsigned)(mn0 + r + i * T::RSTEP < n_rows) << i;
    } else { // rows: k; columns: M or N
        l.src = base + (long long)r * ld + mn0 + c;
        l.ok = mn0 + c < n_cols ? ~0u : 0u;
    }
    return l;
}

// Issues this thread's cp.async of one operand's k tile k0 into the stage at shared address `stage`,
// then advances to the next k tile. k_bound: the stored extent along k (columns when K-major).
template <int ROWS, int COLS, bool KMAJOR>
__device__ __forceinline__ void loader_issue(operand_loader &l, unsigned stage, const elem_t *base, long long k0,
                                             long long k_bound, long long ld)
{
    using T = tile_loader<ROWS, COLS>;
    using L = tile_layout<COLS>;
    const int r = threadIdx.x / T::VPR, c = threadIdx.x % T::VPR * VEC;
    const bool k_full = k0 + BK <= k_bound; // uniform: only the last k tile of a ragged k is tested
#pragma unroll
    for (int i = 0; i < T::ITERS; i++) {
        const int row = r + i * T::RSTEP;
        if (ROWS % T::RSTEP != 0 && row >= ROWS) break;
        bool ok = (l.ok >> i) & 1u;
        if (!k_full) ok = ok && (KMAJOR ? k0 + c < k_bound : k0 + row < k_bound);
        const unsigned dst = stage + (T::RSTEP % PERIOD == 0 ? (unsigned)(L::at(r, c) + i * T::RSTEP * COLS)
                                                              : (unsigned)L::at(row, c)) * ELEM_BYTES;
        cp_async_16s(dst, ok ? l.src + i * T::RSTEP * ld : base, ok);
    }
    l.src += KMAJOR ? (long long)BK : BK * ld;
}

struct stage_loader {
    operand_loader a, b;
};

__device__ __forceinline__ stage_loader stage_loader_init(const flce_gemm_params &p, long long m0, long long n0)
{
    const elem_t *A = (const elem_t *)p.a, *B = (const elem_t *)p.b;
    stage_loader s;
    if (A_KMAJOR) s.a = loader_init<BM, BK, true>(A, m0, p.a_rows, p.a_cols, p.lda);
    else s.a = loader_init<BK, BM, false>(A, m0, p.a_rows, p.a_cols, p.lda);
    if (B_KMAJOR) s.b = loader_init<BN, BK, true>(B, n0, p.b_rows, p.b_cols, p.ldb);
    else s.b = loader_init<BK, BN, false>(B, n0, p.b_rows, p.b_cols, p.ldb);
    return s;
}

__device__ __forceinline__ void stage_issue(stage_loader &s, unsigned stage, const flce_gemm_params &p, long long k0)
{
    const elem_t *A = (const elem_t *)p.a, *B = (const elem_t *)p.b;
    if (A_KMAJOR) loader_issue<BM, BK, true>(s.a, stage, A, k0, p.a_cols, p.lda);
    else loader_issue<BK, BM, false>(s.a, stage, A, k0, p.a_rows, p.lda);
    if (B_KMAJOR) loader_issue<BN, BK, true>(s.b, stage + A_TILE * ELEM_BYTES, B, k0, p.b_cols, p.ldb);
    else loader_issue<BK, BN, false>(s.b, stage + A_TILE * ELEM_BYTES, B, k0, p.b_rows, p.ldb);
}

// 16-bit dtypes (mma_16816): fragment addresses of the m16n8k16 layouts, relative to a stage:
// ldmatrix (K-major tiles) or ldmatrix.trans (transposed tiles) hands each thread exactly the A rows
// g, g+8 / B column g (g = lane/4) pairs it needs. Along the dimension that steps by 16 (mi or nj on
// K-major tiles, the k step on transposed ones) an address moves by a constant (16 rows: two swizzle
// periods), so only the other dimension's offsets are kept: KSTEPS of them for a K-major tile, MI (A)
// or NI/2 (B) for a transposed one.
constexpr int A_OFFS = A_KMAJOR ? KSTEPS : MI;
constexpr int B_OFFS = B_KMAJOR ? KSTEPS : NI / 2;
struct frag_offsets {
    unsigned a[A_OFFS], b[B_OFFS];
};

__device__ __forceinline__ frag_offsets frag_offsets_init(int wm, int wn, int lane)
{
    const int idx = lane / 8, r8 = lane % 8;
    frag_offsets f;
#pragma unroll
    for (int i = 0; i < A_OFFS; i++)
        f.a[i] = (unsigned)(A_KMAJOR ? A_LAYOUT::at(wm * WTM + lane % 16, i * 16 + (lane / 16) * 8)
                                     : A_LAYOUT::at(r8 + (idx / 2) * 8, wm * WTM + i * 16 + (idx % 2) * 8)) *
                 ELEM_BYTES;
#pragma unroll
    for (int i = 0; i < B_OFFS; i++)
        f.b[i] = (unsigned)(A_TILE + (B_KMAJOR ? B_LAYOUT::at(wn * WTN + r8 + (idx / 2) * 8, i * 16 + (idx % 2) * 8)
                                               : B_LAYOUT::at(r8 + (idx % 2) * 8, wn * WTN + i * 16 + (idx / 2) * 8))) *
                 ELEM_BYTES;
    return f;
}

struct frags {
    unsigned a[MI][4], b[NI][2];
};

// The fragments of k step ks of the stage at shared address `stage`.
__device__ __forceinline__ void load_frags(frags &f, unsigned stage, const frag_offsets &o, int ks)
{
#pragma unroll
    for (int mi = 0; mi < MI; mi++) {
        if (A_KMAJOR) ldsm_x4(f.a[mi], stage + o.a[ks] + mi * 16 * BK * ELEM_BYTES);
        else ldsm_x4_trans(f.a[mi], stage + o.a[mi] + ks * 16 * BM * ELEM_BYTES);
    }
#pragma unroll
    for (int nj = 0; nj < NI / 2; nj++) {
        unsigned r[4];
        if (B_KMAJOR) ldsm_x4(r, stage + o.b[ks] + nj * 16 * BK * ELEM_BYTES);
        else ldsm_x4_trans(r, stage + o.b[nj] + ks * 16 * BN * ELEM_BYTES);
        f.b[2 * nj][0] = r[0], f.b[2 * nj][1] = r[1];
        f.b[2 * nj + 1][0] = r[2], f.b[2 * nj + 1][1] = r[3];
    }
}

__device__ __forceinline__ void mma_frags(float (&acc)[MI][NI][4], const frags &f)
{
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++) mma_16816(acc[mi][ni], f.a[mi], f.b[ni][0], f.b[ni][1]);
}

// fp32, exact: each thread's A rows g, g+8 and B columns 2t, 2t+1 of every 16×8 block, two k at a
// time, in FFMA (the accumulator layout of m16n8k16, so the epilogues are shared). Pairs adjacent
// in shared memory come in one 8-byte load (a chunk holds 4 floats and pairs start even): along k
// on K-major tiles, along the columns 2t, 2t+1 on a transposed B; 24 loads per 256 FFMA where a
// load per value took 48.
__device__ __forceinline__ float2 lds_f2(const elem_t *p) { return *(const float2 *)p; }

__device__ __forceinline__ void ffma_stage(float (&acc)[MI][NI][4], const elem_t *As, const elem_t *Bs, int wm,
                                           int wn, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll 1 // unrolled, the next pairs' 48 values are loaded early and the epilogues spill
    for (int kk = 0; kk < BK; kk += 2) {
        float a[MI][2][2], b[NI][2][2]; // [..][row or column][k - kk]
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = wm * WTM + mi * 16 + g + 8 * h;
                if (A_KMAJOR) {
                    const float2 v = lds_f2(As + A_LAYOUT::at(row, kk));
                    a[mi][h][0] = v.x, a[mi][h][1] = v.y;
                } else {
                    a[mi][h][0] = As[A_LAYOUT::at(kk, row)], a[mi][h][1] = As[A_LAYOUT::at(kk + 1, row)];
                }
            }
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
            const int col = wn * WTN + ni * 8 + 2 * t;
            if (B_KMAJOR) {
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float2 v = lds_f2(Bs + B_LAYOUT::at(col + c, kk));
                    b[ni][c][0] = v.x, b[ni][c][1] = v.y;
                }
            } else {
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const float2 v = lds_f2(Bs + B_LAYOUT::at(kk + k, col));
                    b[ni][0][k] = v.x, b[ni][1][k] = v.y;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[mi][ni][e] = fmaf(a[mi][e / 2][k], b[ni][e % 2][k], acc[mi][ni][e]);
    }
}

// acc = A[m0.., :] · B[n0.., :]ᵀ over the whole k extent, STAGES-deep cp.async pipeline.
// Stage kt is read at k tile kt; the stage refilled at k tile kt (with k tile kt + STAGES − 1) is
// the one read at kt − 1, whose last fragments every warp loaded before the barrier of kt − 1.
// Ends with a barrier so the caller may reuse shared memory. Both the 16-bit fragments and the fp32
// FFMA stage above are compiled for every dtype (they are parsed either way); the dtype picks one.
__device__ __forceinline__ void mainloop(float (&acc)[MI][NI][4], unsigned char *smem_bytes,
                                         const flce_gemm_params &p, long long m0, long long n0, int wm, int wn,
                                         int lane)
{
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.f;
    const unsigned smem0 = smem_addr(smem_bytes);
    stage_loader ld = stage_loader_init(p, m0, n0);
    const int ktiles = (int)((p.k + BK - 1) / BK);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ktiles) stage_issue(ld, smem0 + s * STAGE_BYTES, p, (long long)s * BK);
        cp_async_commit();
    }
    int write = STAGES - 1, read = 0; // stage indices
    if constexpr (FLCE_DTYPE != DTYPE_F32) {
        const frag_offsets fo = frag_offsets_init(wm, wn, lane);
        frags f[2];
        cp_async_wait<STAGES - 2>();
        __syncthreads(); // stage 0 landed for everyone
        load_frags(f[0], smem0, fo, 0);
        for (int kt = 0; kt < ktiles; kt++) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                if (ks == 0) {
                    const int next = kt + STAGES - 1;
                    if (next < ktiles) stage_issue(ld, smem0 + write * STAGE_BYTES, p, (long long)next * BK);
                    cp_async_commit();
                    write = write + 1 == STAGES ? 0 : write + 1;
                }
                if (ks == KSTEPS - 1) { // the next fragments come from stage kt + 1
                    cp_async_wait<STAGES - 2>();
                    __syncthreads();
                    read = read + 1 == STAGES ? 0 : read + 1;
                }
                // (past the last k tile this reads a stale stage; those fragments are never used)
                load_frags(f[(ks + 1) % 2], smem0 + read * STAGE_BYTES, fo, (ks + 1) % KSTEPS);
                mma_frags(acc, f[ks % 2]);
            }
            if (KSTEPS % 2) f[0] = f[1]; // an odd step count ends with the next k tile's fragments in f[1]
        }
    } else {
        (void)read;
        elem_t *smem = (elem_t *)smem_bytes;
        for (int kt = 0; kt < ktiles; kt++) {
            cp_async_wait<STAGES - 2>();
            __syncthreads(); // stage kt landed for everyone; stage kt-1 is free to refill
            const int next = kt + STAGES - 1;
            if (next < ktiles) stage_issue(ld, smem0 + write * STAGE_BYTES, p, (long long)next * BK);
            cp_async_commit();
            write = write + 1 == STAGES ? 0 : write + 1;
            elem_t *stage = smem + (kt % STAGES) * STAGE_ELEMS;
            ffma_stage(acc, stage, stage + A_TILE, wm, wn, lane);
        }
    }
    cp_async_wait<0>();
    __syncthreads();
}

__device__ __forceinline__ unsigned char *tile_smem(unsigned char *raw) { return raw; }
