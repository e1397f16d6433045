// gemm_dz_convert.cu — dZ formed beside dH (FLCE_DZ_CONVERT, the chunked strategy with compact
// logits; runtime/plan.h dz_convert). Pasted after gemm_wgmma.cu, before gemm_wgmma_tma.cu, whose
// producer waits here.
//
// The dz pass reads the compact logits (fp16 p̃) and writes dZ over them: 4 bytes of DRAM traffic
// per logit, 1.1-1.5 ms at 8192×4096×128256 in which no tensor core works (bench/NOTES.md v35).
// dH, the GEMM that reads dZ first, is bound by its tensor cores, and three of the four warps of
// its producer warpgroup have nothing to do (one thread issues the TMA loads). Here those warps
// do the dz pass while the consumers multiply: flce_dz_factors has turned each (token, column
// group) maximum into the factor F with dz = p̃·F and the label's target logit into its exact dz
// (rowops.cu: the dz pass's values), so a logit costs a multiply and the label column a select.
//
// Work comes in parts of 16 tokens × 512 columns (16 KiB of p̃), one warp each, numbered from a
// counter shared by every CTA; a part's last act is a release increment of the flag of its
// (128-row block, 512-column segment). The producer, before its TMA load of a k-tile that starts
// a segment, waits (acquire) until that flag counts all the block's parts. Parts are numbered so
// that the blocks dH works on first are converted first: bands of dz_band row blocks (about one
// and a half waves of dH tiles, launch.c), within a band segment by segment, the order in which
// the band's tiles walk their k. No converter ever waits, so the kernel cannot deadlock however
// few of its CTAs are resident, and it ends only after every part is converted: dW and db,
// later in the stream, read dZ.
// p.dz_flags: 32-bit words, zeroed before the launch: [0] the part counter, [1] unused,
// [2 + rb·segs + seg] the parts of (row block rb, segment seg) done.
#ifndef FLCE_DZ_CONVERT
#define FLCE_DZ_CONVERT 0
#endif
#if FLCE_DZ_CONVERT
#if !ROLE_IS_DH || !FLCE_TMA || FLCE_DTYPE == DTYPE_F32 || (defined(FLCE_CLUSTER) && FLCE_CLUSTER) || \
    (defined(FLCE_DZ_OPERAND) && FLCE_DZ_OPERAND)
#error "dz convert: dH on the Hopper TMA path (not Blackwell), 16-bit, one CTA per tile (generator/spec.c)"
#endif
constexpr int DZC_ROWS = 16, DZC_COLS = 512, DZC_PARTS = BM / DZC_ROWS;
static_assert(BM % DZC_ROWS == 0 && DZC_COLS % BK == 0, "dz convert: a k-tile lies in one segment");

__device__ __forceinline__ long long dzc_segs(const flce_gemm_params &p) { return (p.lda + DZC_COLS - 1) / DZC_COLS; }

// The producer thread, before loading the k-tile at column k0 (a multiple of BK) of row block m0.
__device__ __forceinline__ void dzc_wait(const flce_gemm_params &p, long long m0, long long k0)
{
    if (!p.dz_flags || k0 % DZC_COLS != 0) return;
    const long long rows = p.m - m0 < BM ? p.m - m0 : BM;
    const unsigned need = (unsigned)((rows + DZC_ROWS - 1) / DZC_ROWS);
    const unsigned *flag = (const unsigned *)p.dz_flags + 2 + (m0 / BM) * dzc_segs(p) + k0 / DZC_COLS;
    for (;;) {
        unsigned got;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(got) : "l"(flag) : "memory");
        if (got >= need) break;
        __nanosleep(128);
    }
    // What the converters wrote through the generic proxy, read by the copy engine (async proxy).
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

__device__ __forceinline__ uint4 dzc_load(const unsigned short *at)
{
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(at)
                 : "memory");
    return v;
}

// Row t's 8 columns c… from p̃ to dZ (raw in, packed dtype out): p̃·F, the label's column y its
// dz l, columns past the shard (the row's padding up to ldz) 0, as the dz pass writes them.
// Columns in int: a chunk's vocab is a TMA extent (< 2^31).
__device__ __forceinline__ uint4 dzc_chunk(uint4 raw, float f, int c, int y, float l, int cols)
{
    const unsigned in[4] = {raw.x, raw.y, raw.z, raw.w};
    unsigned out[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float lo, hi;
        asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((unsigned short)(in[q] & 0xffff)));
        asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((unsigned short)(in[q] >> 16)));
        lo *= f, hi *= f;
        const int j = c + 2 * q;
        if (j == y) lo = l;
        if (j + 1 == y) hi = l;
        if (j >= cols) lo = 0.f;
        if (j + 1 >= cols) hi = 0.f;
        out[q] = pack2_elem(lo, hi);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
}

// One warp: part q (tokens 16q…) of segment seg, in place. Lane l takes columns 8l… and 256 + 8l…
// of each row: two 16-byte loads in flight per lane (the producer warpgroup has 40 registers;
// four spilled), behind an L2 prefetch of the whole part.
__device__ void dzc_part(const flce_gemm_params &p, unsigned q, unsigned seg, int lane)
{
    const int cols = (int)p.k, ld = (int)p.lda, c0 = (int)seg * DZC_COLS + lane * 8, c1 = c0 + 256;
    const long long r0 = (long long)q * DZC_ROWS;
    const int rows = p.m - r0 < DZC_ROWS ? (int)(p.m - r0) : DZC_ROWS;
    const int g0 = c0 >> p.tile_cols_log2, g1 = c1 >> p.tile_cols_log2;
    // The part's rows asked of L2 at once, one bulk prefetch per row (lanes 0-15): the row loop
    // below then waits for DRAM once and for L2 after. Its two loads per lane in flight alone made
    // ~0.5 TB/s of conversion, too slow for dH's first waves (bench/NOTES.md v35).
    if (lane < rows) {
        const long long c = (long long)seg * DZC_COLS;
        const unsigned bytes = (unsigned)((p.lda - c < DZC_COLS ? p.lda - c : DZC_COLS) * 2); // 8 | ldz
        const unsigned short *row = (const unsigned short *)p.a + (r0 + lane) * p.lda + c;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(row), "r"(bytes) : "memory");
    }
    for (int i = 0; i < rows; i++) {
        const long long t = r0 + i;
        unsigned short *at = (unsigned short *)p.a + t * ld;
        uint4 raw0 = make_uint4(0, 0, 0, 0), raw1 = raw0;
        if (c0 < ld) raw0 = dzc_load(at + c0);
        if (c1 < ld) raw1 = dzc_load(at + c1);
        const long long lab = load_label(p.labels, t), ly = lab - p.vocab_offset;
        int y = -1;
        float l = 0.f;
        if (lab != p.ignore_index && lab >= 0 && lab < p.vocab_total && ly >= 0 && ly < cols)
            y = (int)ly, l = ((const float *)p.target)[t];
        const float *fac = (const float *)p.tile_max + t * p.ld_tile_max;
        if (c0 < ld) {
            const uint4 d = dzc_chunk(raw0, c0 < cols ? fac[g0] : 0.f, c0, y, l, cols);
            st_global_16(at + c0, d.x, d.y, d.z, d.w);
        }
        if (c1 < ld) {
            const uint4 d = dzc_chunk(raw1, c1 < cols ? fac[g1] : 0.f, c1, y, l, cols);
            st_global_16(at + c1, d.x, d.y, d.z, d.w);
        }
    }
}

// Part u of the conversion order → its 16-row group q and segment seg; false past the last part.
// 32-bit arithmetic (a 64-bit division is a call, which spilled the 40 registers): a chunk's parts
// are far fewer than 2^32 (its p̃ fits a workspace).
__device__ __forceinline__ bool dzc_unit(const flce_gemm_params &p, unsigned u, unsigned &q, unsigned &seg)
{
    const unsigned segs = (unsigned)dzc_segs(p), parts = (unsigned)((p.m + DZC_ROWS - 1) / DZC_ROWS);
    if (u >= parts * segs) return false;
    const unsigned band_parts = (unsigned)p.dz_band * DZC_PARTS, band_units = band_parts * segs;
    // Bands before this one are whole, so u / band_units is the band even in a short last one.
    const unsigned band = u / band_units, w = u % band_units, first = band * band_parts;
    const unsigned here = parts - first < band_parts ? parts - first : band_parts;
    seg = w / here, q = first + w % here;
    return true;
}

__device__ __forceinline__ unsigned dzc_next(unsigned *ctl, int lane)
{
    unsigned u = 0;
    if (lane == 0) u = atomicAdd(ctl, 1u);
    return __shfl_sync(0xffffffffu, u, 0);
}

// Warps 1-3 of the producer warpgroup: parts from the counter until none is left.
__device__ void dzc_convert(const flce_gemm_params &p)
{
    unsigned *ctl = (unsigned *)p.dz_flags;
    const int lane = threadIdx.x % 32;
    unsigned q, seg;
    while (dzc_unit(p, dzc_next(ctl, lane), q, seg)) {
        dzc_part(p, q, seg, lane);
        // Every lane's stores, for the generic proxy (release below) and the copy engine's reads.
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
        __threadfence();
        __syncwarp();
        if (lane == 0) {
            unsigned *flag = ctl + 2 + (q / DZC_PARTS) * (unsigned)dzc_segs(p) + seg;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(flag) : "memory");
        }
    }
}
#else
__device__ __forceinline__ void dzc_wait(const flce_gemm_params &, long long, long long) {}
#endif
