// gemm_logits.cu — the LOGITS epilogues, on any main loop's accumulators: the logit transform,
// the running per-row statistics with the target logit and the fp32 Z store, or (FLCE_COMPACT)
// the fp16 p̃ store with per-(row, warp tile) maxima; FLCE_FUSED_DZ's dZ epilogue instead; and
// the reduction of the statistics across lanes into the partials. Pasted after the main loop,
// for LOGITS only. Its variants (FLCE_COMPACT, FLCE_QROWS, FLCE_FUSED_DZ, the staged store) are
// compile-time values: `if constexpr`, and overloads on the per-row state's type.
// Two floats to fp16 (round to nearest) in one word, lo in the low half: the stored pair order.
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// One stored pair of the compact pass: fp16 p̃ = e (exp(z − m)·2^15), or under FLCE_QROWS bf16
// e·qk = exp(z − ref): e = exp(z − ref) and qk = 1 (Q_REF_STATS), else qk = exp(m − ref)·2^-15, one
// per row and tile.
__device__ __forceinline__ unsigned pack_compact(float e0, float e1, float qk)
{
    if constexpr (FLCE_QROWS) {
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(e1 * qk), "f"(e0 * qk));
        return r;
    } else if constexpr (FLCE_COMPACT) {
        (void)qk;
        return pack_f16x2(e0, e1);
    } else {
        (void)e0, (void)e1, (void)qk;
        return 0;
    }
}
// Under FLCE_QROWS a tile's exps are taken against the stored reference ref itself (so the stored
// values need no multiply, and the statistics are kept against ref: any reference will do for the
// sums) — except with the argmax output, whose merge compares the tiles' maxima: there the exps are
// against the tile's maximum, as without FLCE_QROWS, and rescaled by qk when stored.
constexpr bool Q_REF_STATS = !OPT_ARGMAX;
// The Hopper TMA path stores the compact p̃ of a full tile through shared memory (STAGED_STORE,
// gemm.cu): straight from the fragments the pass ran 8.5 % slower than the statistics-only one at
// a locked clock (bench/NOTES.md v19).
constexpr bool COMPACT_STAGED = FLCE_COMPACT && STAGED_STORE;
// (mma.sync paths) c ? a : b that the compiler cannot see through. The target logit's select chain over a row's
// accumulators, written in C++, is turned into an indexed load of acc, which puts the whole
// accumulator tile in local memory (512 bytes per thread at 64×64 warp tiles, stored and reloaded
// every vocab tile).
__device__ __forceinline__ float select_f32(int c, float a, float b)
{
    float r;
    asm("{\n.reg .pred q;\nsetp.ne.b32 q, %3, 0;\nselp.f32 %0, %1, %2, q;\n}" : "=f"(r) : "f"(a), "f"(b), "r"(c));
    return r;
}
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

// acc's element of row (mi, h) at this lane's column j (one of ni·8 + {0, 1}): a select chain over
// ni, since acc is indexed only by constants (it lives in registers); 0 for a j the lane lacks
__device__ __forceinline__ float acc_at(const float (&acc)[MI][NI][4], int mi, int h, int j)
{
    float zy = 0.f;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
        if constexpr (FLCE_WGMMA)
            zy = ni == j >> 3 ? ((j & 1) ? acc[mi][ni][2 * h + 1] : acc[mi][ni][2 * h]) : zy;
        else
            zy = select_f32(ni == j >> 3, select_f32(j & 1, acc[mi][ni][2 * h + 1], acc[mi][ni][2 * h]), zy);
    }
    return zy;
}

// OPT_SPARSE: Σ_u p_u·z_u over the ids of one row's list that lie in this thread's columns of the
// warp tile (acc rows mi, h: already the transformed logits). The list (p.qref: SPARSE_K int ids
// ascending, padded with ids past every column; p.qflags: their fp32 weights) holds ~k·WTN/V ids
// per warp tile, so its first id at or past the tile's first column cw is found by binary search
// and the walk stops at the tile's end; of the 4 lanes sharing the row, the one holding an id's
// column (lj = id − c0 with lj % 8 in {0, 1}, as the target vote) adds p·z.
template <bool FULL>
__device__ __forceinline__ float sparse_sum(const float (&acc)[MI][NI][4], const flce_gemm_params &p, long long row,
                                            int mi, int h, long long c0, int t, int lim)
{
    const int *ids = (const int *)p.qref + row * SPARSE_K;
    const float *w = (const float *)p.qflags + row * SPARSE_K;
    const long long cw = c0 - 2 * t;
    int lo = 0;
#pragma unroll
    for (int step = SPARSE_K / 2; step > 0; step /= 2)
        if (ids[lo + step - 1] < cw) lo += step;
    float sum = 0.f;
    for (int u = lo; u < SPARSE_K; u++) {
        const long long lj = ids[u] - c0;
        if (lj + 2 * t >= WTN) break; // the rest lie past this warp tile (padding included)
        if (lj < 0 || (lj & 6) != 0 || !(FULL || lj < lim)) continue;
        sum = fmaf(w[u], acc_at(acc, mi, h, (int)lj), sum);
    }
    return sum;
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
                                                  const long long (&lab)[MI][2], row_stats (&run)[MI][2],
                                                  unsigned char *smem, const float *qc)
{
    constexpr bool STAGED = COMPACT_STAGED && FULL; // a tile reaching past the shard keeps the direct stores
    // The plain pass's fp32 Z goes out through shared memory (FLCE_Z_STAGED: generator/spec.c
    // spec_staged_z, the Hopper TMA tile with room for two staging buffers per warp;
    // staged_rows_out) where Z and its row stride are 16-byte aligned, else straight from the
    // fragments: those 8-byte stores, 8 rows per instruction, made the pass ~25 % slower than the
    // compact one at 8192×4096×128256 (bench/NOTES.md session 30). Uniform across the CTA.
    const bool staged_z = FLCE_Z_STAGED && p.out && bulk_out_ok(p);
    unsigned pk[NI][2]; // STAGED: the packed p̃ pairs, stored after both rows of the fragment
    if constexpr (!COMPACT_STAGED && !FLCE_Z_STAGED) (void)smem;
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
            const int lj = p.target ? label_col(lab[mi][h], c0) : -1; // −1: no target store here
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
                    if (!OPT_ARGMAX) {
                        if (in) tile.m = fmaxf(tile.m, z); // one FMNMX; NaN z left out as below
                    } else if (in && z > tile.m) {
                        tile.m = z, arg = j;
                    }
                }
            // The target logit: one warp-uniform vote per row pair, since a label lies in one vocab
            // tile of ~500 and a per-element test costs a compare and a predicated store each.
            // lj is relative to this lane's first column, and the lane holds columns ni·8 + {0, 1}
            // only: one of the 4 lanes sharing the row owns the label's column, the others see
            // lj % 8 in 2..7 and must not store.
            if (__any_sync(0xffffffffu, lj >= 0)) {
                const float zy = acc_at(acc, mi, h, lj);
                if (lj >= 0 && (lj & 6) == 0) ((float *)p.target)[row] = zy;
            }
            // FLCE_COMPACT: whether this row's p̃ is stored, where, the tile's reference (the maximum,
            // or FLCE_QROWS's c), the stored values' factor and the exps' offset (set below).
            bool store = false;
            unsigned *pt_row = nullptr;
            float ref = 0.f, qk = 1.f, mb = 0.f;
            if constexpr (FLCE_COMPACT) {
                // One m per (row, warp tile): the 4 lanes sharing the row agree on their maximum, so
                // the exps below are both the statistics' and the stored p̃. A lane whose own maximum
                // is below it holds no argmax candidate.
                {
                    const float own = tile.m;
                    tile.m = fmaxf(tile.m, __shfl_xor_sync(0xffffffffu, tile.m, 1));
                    tile.m = fmaxf(tile.m, __shfl_xor_sync(0xffffffffu, tile.m, 2));
                    if (own < tile.m) arg = -1;
                }
                store = p.out && row < p.m;
                pt_row = (unsigned *)((unsigned short *)p.out + (store ? row : 0) * p.ldo + c0);
                // (lim > 0: a warp tile wholly past the shard, as in the mma.sync path's last tile, has
                // no group of its own in tile_max.)
                if constexpr (FLCE_QROWS) {
                    // The tile's reference: the row's c (flce_qref), or its own maximum where that lies
                    // more than QROWS_SPAN above c, which flags the row for flce_qscale (common.cuh).
                    const float c = qc[mi * 2 + h]; // loaded once per CTA (gemm_entry.cu)
                    const bool far = tile.m - c > QROWS_SPAN;
                    ref = far ? tile.m : c;
                    if (far && store && t == 0) ((int *)p.qflags)[row] = 1;
                    qk = Q_REF_STATS ? 1.f : ex2_approx((tile.m - ref) * 1.4426950408889634f - 15.f);
                } else {
                    (void)qc;
                    ref = tile.m;
                }
                if (store && t == 0 && (FULL || lim > 0))
                    ((float *)p.tile_max)[row * p.ld_tile_max + (c0 - 2 * t) / WTN] = ref;
                // exp(z − m)·2^15, the stored p̃, as one FFMA and one ex2: 2^(z·log2e − (m·log2e − 15)).
                // The sums below are then in units of 2^-15 and scaled back once per row and tile
                // (exactly: a power of two). m·log2e rounds once (≤ 2^-24 relative, ~4e-6 of p at
                // |m| = 60), far below p̃'s fp16 step; m = ±inf gives what exp_le0(z − m) gives.
                // Q_REF_STATS: exp(z − ref) ≤ e^QROWS_SPAN the same way, ref·log2e rounded once.
                if constexpr (FLCE_QROWS && Q_REF_STATS) mb = ref * 1.4426950408889634f;
                else mb = tile.m * 1.4426950408889634f - 15.f;
            }
            // OPT_SOFT (the distillation's student pass): Σ_j p_j·z_j with p_j the teacher's
            // probability at this element, p̃_j·2^-15·exp(m_t − lse_t) from the teacher pass's compact
            // store (same rows, columns and column groups: p.qref, row stride ldo), its group maxima
            // (p.qflags, [row][ld_tile_max]) and its lse (p.lse, per row). The p̃ pairs sit where
            // this thread's own p̃ pairs are stored; sw sums them times z, scaled once per group.
            const unsigned *soft_row = nullptr;
            float soft_scale = 0.f, sw = 0.f;
            if constexpr (OPT_SOFT) {
                if (row < p.m) {
                    soft_row = (const unsigned *)((const unsigned short *)p.qref + row * p.ldo + c0);
                    const float mt = ((const float *)p.qflags)[row * p.ld_tile_max + (c0 - 2 * t) / WTN];
                    soft_scale = ex2_approx((mt - ((const float *)p.lse)[row]) * 1.4426950408889634f - 15.f);
                }
            }
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                float en[2] = {0.f, 0.f};
                float wt[2] = {0.f, 0.f};
                if constexpr (OPT_SOFT) {
                    if (soft_row && (FULL || ni * 8 < lim)) {
                        const unsigned pair = soft_row[ni * 4];
                        wt[0] = half_bits_to_float((unsigned short)(pair & 0xffffu));
                        wt[1] = half_bits_to_float((unsigned short)(pair >> 16));
                    }
                }
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int j = ni * 8 + c;
                    float z = acc[mi][ni][2 * h + c];
                    if (FULL || j < lim) {
                        if constexpr (OPT_SOFT) sw = fmaf(wt[c], z, sw);
                        float e;
                        if constexpr (FLCE_COMPACT) e = ex2_approx(fmaf(z, 1.4426950408889634f, -mb));
                        else e = exp_le0(z - tile.m);
                        en[c] = e;
                        tile.s += e;
                        if (OPT_ENTROPY) tile.t += e * z;
                        if (OPT_ZSUM)
                            tile.zs += OPT_WEIGHTS ? ((const float *)p.class_weights)[p.vocab_offset + c0 + j] * z : z;
                    }
                }
                if constexpr (STAGED) pk[ni][h] = pack_compact(en[0], en[1], qk);
                else if constexpr (FLCE_COMPACT) {
                    if (store && (FULL || ni * 8 < zlim)) pt_row[ni * 4] = pack_compact(en[0], en[1], qk);
                } else {
                    (void)en;
                }
            }
            if constexpr (OPT_SOFT) tile.zs = sw * soft_scale;
            if constexpr (OPT_SPARSE)
                if (row < p.m) tile.zs = sparse_sum<FULL>(acc, p, row, mi, h, c0, t, lim);
            if constexpr (FLCE_QROWS && Q_REF_STATS) {
                tile.m = ref; // the sums' reference
            } else if constexpr (FLCE_COMPACT) {
                tile.s *= 1.f / COMPACT_SCALE;
                if (OPT_ENTROPY) tile.t *= 1.f / COMPACT_SCALE;
            }
            tile.arg = arg < 0 ? 0x7fffffffffffffffLL : p.vocab_offset + c0 + arg;
            if (tile.s != tile.s || tile.m != NEG_INF) stats_merge(run[mi][h], tile);
            if (!FLCE_COMPACT && !staged_z && p.out && row < p.m) {
                float *z_row = (float *)p.out + row * p.ldo + c0;
#pragma unroll
                for (int ni = 0; ni < NI; ni++)
                    if (FULL || ni * 8 < zlim)
                        *(float2 *)(z_row + ni * 8) = make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
    if constexpr (STAGED) {
        if (p.out)
            staged_store(pk, (unsigned short *)p.out, p.ldo, p.m, p.ldo, staging_addr(smem, wm), m0 + wm * WTM, n0, lane);
    }
    if constexpr (FLCE_Z_STAGED) {
        if (staged_z) // the tile's Z rows (to the row stride, as the direct stores) through shared memory
            staged_rows_out(acc, (float *)p.out, p.ldo, p.m, p.ldo, m0 + wm * WTM, n0, staging_addr(smem, wm), lane);
    }
}

// The last vocab tile of a shard whose V is not a multiple of BN through the full tile's code, so
// that the epilogue is compiled once (a second, masked copy was a quarter of the compact logits
// kernel's NVRTC time, the longest compile of a first call; issue 16). Where the epilogue only
// takes maxima and exps of the logits, a column past the shard behaves as absent once its logit is
// -FLT_MAX: it never sets a maximum, its exp is 0 (the p̃ stored for columns up to the row stride,
// as the masked code stored) and the store stops at the row stride. Entropy (0·z), the z-sum, the
// argmax and a logit transform (applied by the epilogue itself) keep the masked copy.
// Where every launch's n is a multiple of BN (FLCE_FULL_TILES: the compact pass over a shard that
// is; runtime/launch.c checks it), no tile is partial and neither copy nor mask is compiled: with
// the mask compiled in (not taken), the pass ran 0.35 ms slower at 8192×4096×128256 on an H100
// (bench/NOTES.md, session 6, d6).
constexpr bool NO_PARTIAL_TILE = FLCE_FULL_TILES;
constexpr bool ONE_EPILOGUE = COMPACT_STAGED && !OPT_BIAS && !STATS_ZS && !OPT_ARGMAX && !OPT_ENTROPY &&
                              INV_TEMP == 1.f && SOFTCAP == 0.f;
__device__ __forceinline__ void mask_past_shard(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long n0,
                                                int wn, int lane)
{
    static_assert(!ONE_EPILOGUE || WARPS_N == 1, "one epilogue: a warp tile spans the CTA tile, so none is all past");
    const int lim = cols_inside(p.n, n0 + wn * WTN + 2 * (lane % 4));
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (ni * 8 + (e & 1) >= lim) acc[mi][ni][e] = -3.402823466e38f;
}

__device__ __forceinline__ void logits_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p,
                                                long long m0, long long n0, int wm, int wn, int lane,
                                                const long long (&lab)[MI][2], row_stats (&run)[MI][2],
                                                unsigned char *smem, const float *qc = nullptr)
{
    const bool full = n0 + BN <= p.n;
    if constexpr (NO_PARTIAL_TILE) {
        (void)full;
        logits_epilogue_t<true>(acc, p, m0, n0, wm, wn, lane, lab, run, smem, qc);
    } else if constexpr (ONE_EPILOGUE) {
        if (!full) mask_past_shard(acc, p, n0, wn, lane);
        logits_epilogue_t<true>(acc, p, m0, n0, wm, wn, lane, lab, run, smem, qc);
    } else if (full) {
        logits_epilogue_t<true>(acc, p, m0, n0, wm, wn, lane, lab, run, smem, qc);
    } else {
        logits_epilogue_t<false>(acc, p, m0, n0, wm, wn, lane, lab, run, smem, qc);
    }
}

// ---- FLCE_FUSED_DZ: the recompute pass writes dZ instead of statistics ------------------------
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
    if constexpr (FLCE_REDUCTION == REDUCTION_NONE) {
        if (r.valid && p.grad_output) r.g = ((const float *)p.grad_output)[row];
    }
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
                if constexpr (FLCE_DTYPE == DTYPE_F32)
                    *(float2 *)(dz + ni * 8) = make_float2(v[0], v[1]);
                else
                    *(unsigned *)(dz + ni * 8) = (unsigned)from_f32(v[0]) | ((unsigned)from_f32(v[1]) << 16);
            }
        }
}

// The dZ pass's tile epilogue under the statistics pass's name: the kernels call logits_epilogue
// with the pass's row_state (below), and the type picks the pass.
__device__ __forceinline__ void logits_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p,
                                                long long m0, long long n0, int wm, int wn, int lane,
                                                const long long (&lab)[MI][2], const dz_row (&dr)[MI][2],
                                                unsigned char *, const float * = nullptr)
{
    if (n0 + BN <= p.n) dz_epilogue_t<true>(acc, p, m0, n0, wm, wn, lane, lab, dr);
    else dz_epilogue_t<false>(acc, p, m0, n0, wm, wn, lane, lab, dr);
}

// Merges a row's statistics over the 4 lanes of the quad that holds its columns.
__device__ __forceinline__ void quad_merge(row_stats &a)
{
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) stats_merge(a, shfl_stats(a, off));
}

// What the pass keeps per owned row beside its label: the dZ factors, or running statistics.
typedef pick_type<FLCE_FUSED_DZ, dz_row, row_stats>::type row_state;

__device__ __forceinline__ row_stats empty_stats()
{
    row_stats a;
    a.m = NEG_INF, a.s = 0.f, a.t = 0.f, a.zs = 0.f, a.arg = 0x7fffffffffffffffLL;
    return a;
}
// A row's state at the start of an item, by the pass: the dZ factors, or empty statistics; and
// whether the row takes part (the dZ pass drops an invalid row's label). (Written as a function
// template and a test rather than one overload that sets both through references: with that form
// NVVM ordered the sm_100 dZ kernels' loads differently, tools/kernel_diff.sh showed.)
template <class State> __device__ __forceinline__ State initial_state(const flce_gemm_params &p, long long row);
template <> __device__ __forceinline__ dz_row initial_state<dz_row>(const flce_gemm_params &p, long long row)
{
    return dz_row_setup(p, row);
}
template <> __device__ __forceinline__ row_stats initial_state<row_stats>(const flce_gemm_params &, long long)
{
    return empty_stats();
}
__device__ __forceinline__ bool state_valid(const dz_row &r) { return r.valid; }
__device__ __forceinline__ bool state_valid(const row_stats &) { return true; }

// Each row a thread owns: its label's column within [0, n) (−1 when ignored, out of range or in
// another shard) and its state: the dZ pass's per-row factors (an invalid row's label −1 too), or
// empty statistics.
__device__ __forceinline__ void rows_setup(const flce_gemm_params &p, long long m0, int wm, int lane,
                                           long long (&lab)[MI][2], row_state (&st)[MI][2])
{
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const long long row = m0 + wm * WTM + mi * 16 + lane / 4 + 8 * h;
            const long long y = row < p.m ? load_label(p.labels, row) - p.vocab_offset : -1;
            lab[mi][h] = (y >= 0 && y < p.n) ? y : -1;
            st[mi][h] = initial_state<row_state>(p, row);
            if (!state_valid(st[mi][h])) lab[mi][h] = -1;
        }
}

// The portable path's running statistics (gemm_entry.cu, logits_portable): row r of the CTA's
// block is held by thread r mod THREADS, in run[r / THREADS].
constexpr int RUN_ROWS = (BM + THREADS - 1) / THREADS;

// Folds one vocab tile's statistics (each lane's pieces of its rows) into the running ones: the 4
// lanes sharing a row merge by shuffles, then the WARPS_N warps sharing it through shared memory,
// in a fixed order (deterministic). The pipeline's shared memory is free: the main loop ended on a
// barrier, and the second barrier here comes before the next tile's loads overwrite it.
__device__ __forceinline__ void fold_row_stats(row_stats (&tile)[MI][2], row_stats (&run)[RUN_ROWS],
                                               unsigned char *smem, int wm, int wn, int lane)
{
    row_stats *red = (row_stats *)smem;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            quad_merge(tile[mi][h]);
            if (lane % 4 == 0) red[wn * BM + wm * WTM + mi * 16 + lane / 4 + 8 * h] = tile[mi][h];
        }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RUN_ROWS; i++) {
        const int r = threadIdx.x + i * THREADS;
        if (r >= BM) break;
        for (int w = 0; w < WARPS_N; w++) stats_merge(run[i], red[w * BM + r]);
    }
    __syncthreads();
}

__device__ __forceinline__ void store_partials(const flce_gemm_params &p, long long row, int split, const row_stats &a)
{
    long long at = row * p.splits + split;
    ((float *)p.part_m)[at] = a.m;
    ((float *)p.part_s)[at] = a.s;
    if (OPT_ENTROPY) ((float *)p.part_t)[at] = a.t;
    if (STATS_ZS) ((float *)p.part_zs)[at] = a.zs;
    if (OPT_ARGMAX) ((long long *)p.part_arg)[at] = a.arg;
}

// The end of an item of the wgmma paths' logits kernel, by the pass. One warp column owns whole
// rows: its lane 4g stores them after the 4 lanes that share each have merged, no CTA barrier (the
// TMA path's producer warpgroup has left), so a persistent CTA stores each item's statistics as it
// finishes it. Several warp columns (never persistent: runtime/plan.c) merge through shared memory
// in store_cta_stats. The dZ pass stores no statistics.
__device__ __forceinline__ void store_item_stats(row_stats (&rs)[MI][2], const flce_gemm_params &p, long long m0,
                                                 int wm, int lane, int split)
{
    if (WARPS_N == 1 && p.part_m) {
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                quad_merge(rs[mi][h]);
                const long long row = m0 + wm * WTM + mi * 16 + lane / 4 + 8 * h;
                if (lane % 4 == 0 && row < p.m) store_partials(p, row, split, rs[mi][h]);
            }
    }
}
__device__ __forceinline__ void store_item_stats(dz_row (&)[MI][2], const flce_gemm_params &, long long, int, int, int)
{
}

// The end of that kernel with several warp columns: each row's stats merged over the 4 lanes that
// share it, then over the WARPS_N warps in a fixed order (deterministic). Nothing where one warp
// column stored them per item, or in a gradient pass (only Z was wanted), or in the dZ pass.
__device__ __forceinline__ void store_cta_stats(row_stats (&rs)[MI][2], const flce_gemm_params &p, long long m0,
                                                int wm, int wn, int lane, int split, unsigned char *smem)
{
    if (WARPS_N == 1 || !p.part_m) return;
    row_stats *red = (row_stats *)smem;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            quad_merge(rs[mi][h]);
            int r = wm * WTM + mi * 16 + lane / 4 + 8 * h;
            if (lane % 4 == 0) red[wn * BM + r] = rs[mi][h];
        }
    __syncthreads();
    for (int r = threadIdx.x; r < BM; r += THREADS) {
        if (m0 + r >= p.m) continue;
        row_stats a = red[r];
        for (int w = 1; w < WARPS_N; w++) stats_merge(a, red[w * BM + r]);
        store_partials(p, m0 + r, split, a);
    }
}
__device__ __forceinline__ void store_cta_stats(dz_row (&)[MI][2], const flce_gemm_params &, long long, int, int,
                                                int, int, unsigned char *)
{
}
