// gemm_mma_sync.cu — the portable main loop (every sm_80+ GPU; Hopper too when the spec is not
// wgmma): BK-deep stages fed by cp.async into padded shared tiles. 16-bit inputs use
// mma.sync.m16n8k16 (fp32 accumulate); fp32 inputs use exact FFMA on the same fragment layout, so
// one epilogue serves both. Pasted after the Hopper pieces.
#if !FLCE_WGMMA
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
#endif // !FLCE_WGMMA
