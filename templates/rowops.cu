// rowops.cu — the per-token kernels around the GEMMs (docs/DESIGN.md §1, §3):
//   flce_prepare  Σ over valid tokens of w_y (the mean's denominator; the count without class
//                 weights) and Σ_j w_j, in one CTA in a fixed order; raises the flag for labels
//                 outside [0, vocab_total)
//   flce_combine  per-(row, split) statistics → lse, loss_i and the per-token outputs (8 lanes a row)
//   flce_dz       dZ in the input dtype (gradient w.r.t. the raw logit h·w + b), zero padding
//   flce_reduce   loss (and z-loss) = Σ_i (· 1/denominator for the mean), one CTA, fixed order
//   flce_dbias    db = Σ_i dZ_i, accumulated in fp32 over chunks, rounded once
//   flce_tp_pack  tensor parallelism: this rank's per-row statistics (splits merged) and a header,
//                 the block every rank all-gathers; flce_combine then merges the ranks in order
//   flce_cast     fp32 → the dtype (or += into fp32): the all-reduced dH to the caller's buffer
// A label is valid when it is not ignore_index and lies in [0, vocab_total). Invalid, non-ignored
// labels raise the flag and are treated as ignored, so nothing reads out of bounds.
//
//   loss_i = (1−ε)·w_y·(lse − z_y) + (ε/V)·Σ_j w_j·(lse − z_j) + λ·w_y·lse²
//   dz_ij  = g_i·[a_i·p_ij − (1−ε)·w_y·1[j=y] − (ε/V)·w_j]·(1/T)·(1 − (z_ij/c)²),
//   a_i    = (1−ε)·w_y + (ε/V)·Σ_j w_j + 2λ·w_y·lse
// For mean and sum, g_i here is 0 or 1 (or grad_output_i for none); the scalar grad/denominator is
// applied by the GEMM epilogues, so dZ stays in [-1, 1] where fp16 keeps full precision.
// Pasted by generator/emit.c after the preamble, params.h and common.cuh (`flce gen --role rowops`
// writes the whole module, which compiles alone). The bf16-only kernels (flce_qref, flce_qscale,
// flce_qdw, flce_qdh) are in every module, their bodies `if constexpr` on the dtype.

__device__ __forceinline__ bool label_valid(long long y, const flce_row_params &p)
{
    return y != p.ignore_index && y >= 0 && y < p.vocab_total;
}

__device__ __forceinline__ float class_weight(const flce_row_params &p, long long id)
{
    return OPT_WEIGHTS ? ((const float *)p.class_weights)[id] : 1.f;
}

// Sums a value over a CTA of FLCE_ROW_CTA_THREADS threads in a fixed order; the result is valid
// in thread 0.
__device__ float block_sum_1024(float v, float *scratch)
{
    scratch[threadIdx.x] = v;
    __syncthreads();
    for (int width = FLCE_ROW_CTA_THREADS / 2; width > 0; width >>= 1) {
        if ((int)threadIdx.x < width) scratch[threadIdx.x] += scratch[threadIdx.x + width];
        __syncthreads();
    }
    float total = scratch[0];
    __syncthreads();
    return total;
}

// One CTA of FLCE_ROW_CTA_THREADS threads: deterministic sums.
extern "C" __global__ void __launch_bounds__(FLCE_ROW_CTA_THREADS) flce_prepare(const flce_row_params p)
{
    __shared__ float scratch[FLCE_ROW_CTA_THREADS];
    float denom = 0.f;
    for (long long i = threadIdx.x; i < p.tokens; i += blockDim.x) {
        long long y = load_label(p.labels, i);
        if (label_valid(y, p)) denom += class_weight(p, y);
        else if (y != p.ignore_index) *(volatile int *)p.flag = 1; // flag[0]: same value from every writer
    }
    denom = block_sum_1024(denom, scratch);
    float wsum = (float)p.vocab_total;
    if (OPT_WEIGHTS) {
        float s = 0.f;
        for (long long j = threadIdx.x; j < p.vocab_total; j += blockDim.x) s += class_weight(p, j);
        wsum = block_sum_1024(s, scratch);
    }
    if (threadIdx.x == 0) {
        ((float *)p.stats)[0] = denom;
        ((float *)p.stats)[1] = wsum;
    }
}

// flce_combine and flce_tp_pack give each row a group of FLCE_MERGE_LANES lanes that merge its
// vocab splits together, each step reading 8 neighbouring partials: one thread walking them took
// 52 µs at 8192 rows (63 splits at the tp = 4 shard of 8192 × 4096 × 128256, 39 on one GPU; only
// 32 CTAs, each load its own sector). FLCE_MERGE_LANES: params.h.

// Row i's statistics over this rank's shard, its vocab splits merged in a fixed order (so the same
// bits every run): lane g of the row's group folds splits g, g + 8, …, then the lanes merge pairwise
// 4, 2 and 1 apart (lane ^ off: within the group). Every lane of the warp calls it (the shuffles);
// `row_ok` false for lanes past the last row. The group's lane 0 holds the result (lane 0 folds
// 4, then 2, then 1: one fixed order).
__device__ row_stats merge_splits(const flce_row_params &p, long long i, int g, bool row_ok)
{
    row_stats a;
    a.m = NEG_INF, a.s = 0.f, a.t = 0.f, a.zs = 0.f, a.arg = 0x7fffffffffffffffLL;
    for (int k = g; row_ok && k < p.splits; k += FLCE_MERGE_LANES) {
        long long at = i * p.splits + k;
        row_stats b;
        b.m = ((const float *)p.part_m)[at];
        b.s = ((const float *)p.part_s)[at];
        b.t = OPT_ENTROPY ? ((const float *)p.part_t)[at] : 0.f;
        b.zs = OPT_ZSUM ? ((const float *)p.part_zs)[at] : 0.f;
        b.arg = OPT_ARGMAX ? ((const long long *)p.part_arg)[at] : 0;
        stats_merge(a, b);
    }
#pragma unroll
    for (int off = FLCE_MERGE_LANES / 2; off > 0; off >>= 1) stats_merge(a, shfl_stats(a, off));
    return a;
}

// Words of one rank's block in the all-gather (params.h).
__device__ __forceinline__ long long tp_block_words(const flce_row_params &p)
{
    return FLCE_TP_HEADER + p.rows * FLCE_TP_RECORD;
}

// The label's logit when it lies in this rank's columns (the logits epilogue wrote it), else 0:
// every other rank contributes an exact 0 to the sum the combine forms.
__device__ __forceinline__ float local_target(const flce_row_params &p, long long i, long long y)
{
    long long local = y - p.chunk_offset;
    return local >= 0 && local < p.cols ? ((const float *)p.target)[i] : 0.f;
}

// FLCE_MERGE_LANES threads per row of the chunk; thread 0 also writes the header.
extern "C" __global__ void __launch_bounds__(256) flce_tp_pack(const flce_row_params p)
{
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, i = tid / FLCE_MERGE_LANES;
    long long *hdr = (long long *)p.tp_send;
    if (tid == 0) hdr[0] = p.vocab_offset, hdr[1] = p.vocab_shard, hdr[2] = p.vocab_total, hdr[3] = p.tokens;
    row_stats a = merge_splits(p, i, (int)(tid % FLCE_MERGE_LANES), i < p.rows);
    if (i >= p.rows || tid % FLCE_MERGE_LANES) return;
    long long y = load_label(p.labels, p.row0 + i);
    float *rec = (float *)p.tp_send + FLCE_TP_HEADER + i * FLCE_TP_RECORD;
    rec[0] = a.m, rec[1] = a.s, rec[2] = a.t, rec[3] = a.zs;
    rec[4] = label_valid(y, p) ? local_target(p, i, y) : 0.f;
    rec[5] = 0.f;
    *(long long *)(rec + 6) = a.arg;
}

// Checks that the gathered headers describe one vocab cut into consecutive shards in rank order
// and one token count; raises flag[1] bits otherwise. One thread, tp_size reads.
__device__ void tp_check_headers(const flce_row_params &p)
{
    const long long *h0 = (const long long *)p.tp_recv;
    long long next = 0;
    int bad = 0;
    for (int r = 0; r < p.tp_size; r++) {
        const long long *h = (const long long *)((const float *)p.tp_recv + r * tp_block_words(p));
        if (h[0] != next) bad |= FLCE_FLAG_TP_SHARDS;
        if (h[2] != h0[2]) bad |= FLCE_FLAG_TP_TOTAL;
        if (h[3] != h0[3]) bad |= FLCE_FLAG_TP_TOKENS;
        next = h[0] + h[1];
    }
    if (next != h0[2]) bad |= FLCE_FLAG_TP_SHARDS;
    if (bad) ((volatile int *)p.flag)[1] |= bad;
}

// FLCE_MERGE_LANES threads per row of the chunk (the group's lane 0 finishes the row). Without TP
// the row's statistics come from its vocab splits; with TP from every rank's record, merged in rank
// order, so all ranks get the same bits.
extern "C" __global__ void __launch_bounds__(256) flce_combine(const flce_row_params p)
{
    long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x, i = tid / FLCE_MERGE_LANES;
    if (p.tp_recv && tid == 0) tp_check_headers(p);
    row_stats a;
    if (!p.tp_recv) a = merge_splits(p, i, (int)(tid % FLCE_MERGE_LANES), i < p.rows); // uniform branch
    if (i >= p.rows || tid % FLCE_MERGE_LANES) return;
    const long long row = p.row0 + i;
    long long y = load_label(p.labels, row);
    bool valid = label_valid(y, p);
    float zy = 0.f;
    if (p.tp_recv) {
        a.m = NEG_INF, a.s = 0.f, a.t = 0.f, a.zs = 0.f, a.arg = 0x7fffffffffffffffLL;
        for (int r = 0; r < p.tp_size; r++) {
            const float *rec = (const float *)p.tp_recv + r * tp_block_words(p) + FLCE_TP_HEADER +
                               i * FLCE_TP_RECORD;
            row_stats b;
            b.m = rec[0], b.s = rec[1], b.t = rec[2], b.zs = rec[3];
            b.arg = *(const long long *)(rec + 6);
            stats_merge(a, b);
            zy += rec[4];
        }
    } else if (valid) {
        zy = ((const float *)p.target)[i];
    }
    float lse = a.m + logf(a.s);
    float loss = 0.f, zl = 0.f, logprob = 0.f;
    if (valid) {
        float wy = class_weight(p, y);
        logprob = zy - lse;
        loss = (1.f - SMOOTHING) * wy * (lse - zy);
        if (OPT_ZSUM) {
            float wsum = ((const float *)p.stats)[1];
            loss += SMOOTHING * (wsum * lse - a.zs) / (float)p.vocab_total;
        }
        if (ZLOSS > 0.f) zl = ZLOSS * wy * lse * lse, loss += zl;
    }
    if (p.lse) ((float *)p.lse)[row] = lse;
    if (p.loss_rows) ((float *)p.loss_rows)[row] = loss;
    if (p.loss_copy) ((float *)p.loss_copy)[row] = loss;
    if (p.zloss_rows) ((float *)p.zloss_rows)[row] = zl;
    if (p.logprob) ((float *)p.logprob)[row] = logprob;
    if (OPT_ENTROPY && p.entropy) ((float *)p.entropy)[row] = lse - a.t / a.s;
    if (OPT_ARGMAX && p.argmax) ((long long *)p.argmax)[row] = a.arg;
}

// dst[0, count) *= g in place, in the dtype (rounded once, as x.mul_(g) would). 16 bytes per thread
// and step; a tail of count % 8 (a bias of odd length) goes element by element.
__device__ __forceinline__ void scale_in_place(const flce_row_params &p, float g)
{
    elem_t *dst = (elem_t *)p.cast_dst;
    const int per = 16 / (int)sizeof(elem_t);
    long long vec = p.cast_count / per * per;
    long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x, threads = (long long)gridDim.x * blockDim.x;
    for (long long j = first * per; j < vec; j += threads * per) {
        uint4 raw = *(const uint4 *)(dst + j);
        elem_t *e = (elem_t *)&raw;
#pragma unroll
        for (int c = 0; c < per; c++) e[c] = from_f32(to_f32(e[c]) * g);
        *(uint4 *)(dst + j) = raw;
    }
    for (long long j = vec + first; j < p.cast_count; j += threads) dst[j] = from_f32(to_f32(dst[j]) * g);
}

// Grid-stride over cast_count values, 4 at a time (counts are multiples of D, a multiple of 8),
// each the sum of cast_splits slabs in slab order (one without splits).
// With cast_scale: the in-place scaling of flce_scale_gradients instead.
extern "C" __global__ void __launch_bounds__(256) flce_cast(const flce_row_params p)
{
    if (p.cast_scale) {
        const float g = *(const float *)p.cast_scale;
        if (g != 1.f) scale_in_place(p, g);
        return;
    }
    long long stride = (long long)gridDim.x * blockDim.x * 4;
    for (long long j = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4; j < p.cast_count; j += stride) {
        const float *src = (const float *)p.cast_src + j;
        float4 v = *(const float4 *)src;
        for (int s = 1; s < p.cast_splits; s++) {
            const float4 w = *(const float4 *)(src + s * p.cast_split_stride);
            v = make_float4(v.x + w.x, v.y + w.y, v.z + w.z, v.w + w.w);
        }
        if (p.cast_accumulate) {
            float4 *d = (float4 *)((float *)p.cast_dst + j);
            float4 o = *d;
            *d = make_float4(o.x + v.x, o.y + v.y, o.z + v.z, o.w + v.w);
            continue;
        }
        if constexpr (FLCE_DTYPE == DTYPE_F32) {
            *(float4 *)((float *)p.cast_dst + j) = v;
        } else {
            uint2 packed;
            packed.x = (unsigned)from_f32(v.x) | ((unsigned)from_f32(v.y) << 16);
            packed.y = (unsigned)from_f32(v.z) | ((unsigned)from_f32(v.w) << 16);
            *(uint2 *)((elem_t *)p.cast_dst + j) = packed;
        }
    }
}

// The per-token part of g_i: 0 for ignored tokens, grad_output[i] for reduction none, else 1.
__device__ __forceinline__ float token_scale(const flce_row_params &p, long long row, bool valid)
{
    if (!valid) return 0.f;
    if constexpr (FLCE_REDUCTION == REDUCTION_NONE) {
        const float *go = (const float *)p.grad_output;
        return go ? go[row] : 1.f;
    } else {
        (void)row;
        return 1.f;
    }
}

__device__ __forceinline__ float mean_scale(const flce_row_params &p);

// The loss term's g_i when the other outputs carry per-token gradients: token_scale times the
// reduction's scalar grad_output·(1/denominator), which the GEMM epilogues then leave out
// (runtime/launch.c set_scale): each output's term has its own per-token factor, so no one scalar
// applied after the GEMMs could serve them all.
__device__ __forceinline__ float loss_g(const flce_row_params &p, long long row, bool valid)
{
    float g = token_scale(p, row, valid);
    if constexpr (FLCE_REDUCTION != REDUCTION_NONE) {
        const float *go = (const float *)p.grad_output;
        g *= (go ? go[0] : 1.f) * mean_scale(p);
    }
    if ((OPT_TOKEN_GRADS & 8) && valid && p.grad_loss_rows) g += ((const float *)p.grad_loss_rows)[row];
    return g;
}

// A row's dz coefficients (common.cuh dz_coef) from its label's validity, w_y (0 when not valid)
// and lse. A log-prob is 0 for an ignored token (no gradient); lse and entropy exist for every
// token, so their terms apply to ignored rows too.
__device__ __forceinline__ dz_coef row_coef(const flce_row_params &p, long long row, bool valid, float wy, float lse)
{
    const float g = loss_g(p, row, valid);
    dz_coef c;
    c.ap = g * dz_row_a(wy, lse, ((const float *)p.stats)[1], p.vocab_total);
    c.al = g * (1.f - SMOOTHING) * wy;
    c.aw = g * SMOOTHING / (float)p.vocab_total;
    c.ah = 0.f, c.h = 0.f;
    const float glp = (OPT_TOKEN_GRADS & 1) && valid && p.grad_logprob ? ((const float *)p.grad_logprob)[row] : 0.f;
    const float gl = (OPT_TOKEN_GRADS & 2) && p.grad_lse ? ((const float *)p.grad_lse)[row] : 0.f;
    c.ap += gl - glp;
    c.al -= glp;
    if ((OPT_TOKEN_GRADS & 4) && p.grad_entropy) {
        c.ah = ((const float *)p.grad_entropy)[row];
        c.h = c.ah != 0.f ? ((const float *)p.entropy)[row] : 0.f;
    }
    return c;
}

// Whether a row has any dz: a valid label, or a nonzero lse or entropy term.
__device__ __forceinline__ bool row_active(const dz_coef &c, bool valid)
{
    return valid || c.ap != 0.f || c.ah != 0.f;
}

// dZ of DZ_COMPACT_COLS consecutive columns j… of row i from the compact logits (common.cuh),
// their 16 bytes `raw` and their group's maximum m already loaded:
// p = p̃·2^-15·exp(m − lse) with one exp per group, except at the label, whose p comes from the
// exact fp32 target logit (p_y ≈ 1 on confident rows: a 16-bit p̃ would cancel badly against the
// −1). z itself is rebuilt only for softcap's chain rule, clamped to [−c, c] where p̃ underflowed
// to 0. 8 columns are one 16-byte load and store: this pass is pure memory traffic (2 + 2 bytes
// per logit), and 8-byte accesses left it at ~2.1 TB/s on an H100.
#define DZ_COMPACT_COLS 8
// Groups of 8 columns per thread, blockDim.x · 8 columns apart (each access stays coalesced): one
// group per thread made 516 K CTAs of one 16-byte load each at 8192 × 128256, latency-bound at
// ~2.1 TB/s (1.98 ms, bench/NOTES.md v19); all the groups' loads are issued before any store
// (the store may alias the load: dZ is written in place).
#define DZ_COMPACT_GROUPS 4
__device__ __forceinline__ void dz_compact(const flce_row_params &p, long long i, long long j, uint4 raw, float m,
                                           float lse, float a, long long local_y, float wy, float g, bool valid,
                                           float (&d)[DZ_COMPACT_COLS])
{
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
    const float scale = expf(m - lse) * (1.f / COMPACT_SCALE);
    // The common group: inside the shard, not holding the label, no smoothing or softcap. Then dz
    // is linear in p̃ with one factor per row and group, one multiply per logit: with the general
    // path below for every logit the pass was bound by instruction issue (ncu: 88 % SM
    // throughput, 20 of 32 lanes active after predication, 1.69 ms at a locked clock).
    if (!OPT_ZSUM && SOFTCAP == 0.f && valid && j + DZ_COMPACT_COLS <= p.cols &&
        (unsigned long long)(local_y - j) >= DZ_COMPACT_COLS) {
        const float f = dz_value_p(scale, 0.f, a, false, wy, 1.f, g, p.vocab_total);
#pragma unroll
        for (int c = 0; c < DZ_COMPACT_COLS; c++) {
            float pt_f;
            const unsigned short half = (unsigned short)(c & 1 ? words[c / 2] >> 16 : words[c / 2] & 0xffff);
            asm("cvt.f32.f16 %0, %1;" : "=f"(pt_f) : "h"(half));
            d[c] = pt_f * f;
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < DZ_COMPACT_COLS; c++) {
        long long col = j + c;
        d[c] = 0.f;
        if (col >= p.cols || !valid) continue;
        unsigned short half = (unsigned short)(c & 1 ? words[c / 2] >> 16 : words[c / 2] & 0xffff);
        float pt_f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(pt_f) : "h"(half));
        float prob = pt_f * scale, z = 0.f;
        if (col == local_y) {
            z = ((const float *)p.target)[i];
            prob = expf(z - lse);
        } else if (SOFTCAP > 0.f) {
            z = fminf(fmaxf(m + logf(pt_f) - COMPACT_LN_SCALE, -SOFTCAP), SOFTCAP);
        }
        d[c] = dz_value_p(prob, z, a, col == local_y, wy, class_weight(p, p.chunk_offset + col), g, p.vocab_total);
    }
}

// dz_compact with per-token upstream gradients (row_coef): the entropy term needs log p_j =
// log p̃ − ln 2^15 + m − lse per logit, so only rows without it take the linear shortcut.
__device__ __forceinline__ void dz_compact_c(const flce_row_params &p, long long i, long long j, uint4 raw, float m,
                                             float lse, long long local_y, const dz_coef &cf, bool active,
                                             float (&d)[DZ_COMPACT_COLS])
{
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
    const float scale = expf(m - lse) * (1.f / COMPACT_SCALE);
    if (!OPT_ZSUM && SOFTCAP == 0.f && cf.ah == 0.f && j + DZ_COMPACT_COLS <= p.cols &&
        (unsigned long long)(local_y - j) >= DZ_COMPACT_COLS) {
        const float f = active ? dz_value_c(scale, 0.f, 0.f, false, 1.f, cf) : 0.f;
#pragma unroll
        for (int c = 0; c < DZ_COMPACT_COLS; c++) {
            float pt_f;
            const unsigned short half = (unsigned short)(c & 1 ? words[c / 2] >> 16 : words[c / 2] & 0xffff);
            asm("cvt.f32.f16 %0, %1;" : "=f"(pt_f) : "h"(half));
            d[c] = pt_f * f;
        }
        return;
    }
    // The common group with the entropy term: p = p̃·scale and log p = ln p̃ + m − lse − ln 2^15, so
    // dz = p·(ap − ah·(log p + H)) = p̃·(a0 + a1·log2 p̃) with two factors per group: one lg2 and two
    // FMAs per logit, where the general path below takes a logf and the label and bounds tests.
    if ((OPT_TOKEN_GRADS & 4) && !OPT_ZSUM && SOFTCAP == 0.f && active && j + DZ_COMPACT_COLS <= p.cols &&
        (unsigned long long)(local_y - j) >= DZ_COMPACT_COLS) {
        const dz_coef unit = {1.f, 0.f, 0.f, 0.f, 0.f};
        const float post = dz_value_c(1.f, 0.f, 0.f, false, 1.f, unit) * scale; // 1/T (and fp16's scale)
        const float a0 = (cf.ap - cf.ah * (m - lse - COMPACT_LN_SCALE + cf.h)) * post;
        const float a1 = -cf.ah * 0.6931471805599453f * post;
#pragma unroll
        for (int c = 0; c < DZ_COMPACT_COLS; c++) {
            float pt_f;
            const unsigned short half = (unsigned short)(c & 1 ? words[c / 2] >> 16 : words[c / 2] & 0xffff);
            asm("cvt.f32.f16 %0, %1;" : "=f"(pt_f) : "h"(half));
            d[c] = pt_f > 0.f ? pt_f * fmaf(a1, lg2_approx(pt_f), a0) : 0.f;
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < DZ_COMPACT_COLS; c++) {
        const long long col = j + c;
        d[c] = 0.f;
        if (col >= p.cols || !active) continue;
        const unsigned short half = (unsigned short)(c & 1 ? words[c / 2] >> 16 : words[c / 2] & 0xffff);
        float pt_f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(pt_f) : "h"(half));
        float prob = pt_f * scale, z = 0.f;
        float logp = pt_f > 0.f ? logf(pt_f) - COMPACT_LN_SCALE + m - lse : 0.f;
        if (col == local_y) {
            z = ((const float *)p.target)[i];
            prob = expf(z - lse), logp = z - lse;
        } else if (SOFTCAP > 0.f) {
            z = fminf(fmaxf(m + logf(pt_f) - COMPACT_LN_SCALE, -SOFTCAP), SOFTCAP);
        }
        d[c] = dz_value_c(prob, logp, z, col == local_y, class_weight(p, p.chunk_offset + col), cf);
    }
}

// The low and high bf16 of a packed pair, as floats (exact).
__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Σ_k x_k·y_k over 8 bf16 pairs in two 16-byte vectors, in fp32.
__device__ __forceinline__ float dot8_bf16(uint4 x, uint4 y)
{
    const unsigned a[4] = {x.x, x.y, x.z, x.w}, b[4] = {y.x, y.y, y.z, y.w};
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < 4; c++) {
        s = fmaf(bf16_lo(a[c]), bf16_lo(b[c]), s);
        s = fmaf(bf16_hi(a[c]), bf16_hi(b[c]), s);
    }
    return s;
}

// 8 bf16 values (16 bytes at src) times f, rounded back to bf16 at dst (which may be src).
__device__ __forceinline__ void scale8_bf16(const void *src, void *dst, float f)
{
    const uint4 raw = *(const uint4 *)src;
    unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = pack2_elem(bf16_lo(w[k]) * f, bf16_hi(w[k]) * f);
    st_global_16(dst, w[0], w[1], w[2], w[3]);
}

// s[0..8) += d·(8 bf16 values at h).
__device__ __forceinline__ void axpy8_bf16(float d, const elem_t *h, float (&s)[8])
{
    const uint4 hv = *(const uint4 *)h;
    const unsigned hw[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        s[2 * q] = fmaf(d, bf16_lo(hw[q]), s[2 * q]);
        s[2 * q + 1] = fmaf(d, bf16_hi(hw[q]), s[2 * q + 1]);
    }
}

// Row-scaled compact logits (common.cuh, FLCE_QROWS), before the chunk's logits pass: c_i, the
// largest of QREF_SAMPLES logits at evenly spaced columns of the shard and the label's (when it
// lies in the shard), in fp32 from the bf16 operands. Any logit of the row will do as long as the
// row's maximum lies within QROWS_SPAN above it; the samples make that the common case (a row whose
// maximum lies further costs a rescale in flce_qscale, not accuracy). qflags zeroed here. A group of
// p.qref_warps warps (1, 2, 4 or 8: launch.c, so that few rows still fill the SMs) per QREF_ROWS
// rows, each warp a slice of d, summed over the group through shared memory in warp order; 8 warps
// per CTA; d is a multiple of 8 (16-byte vectors).
#define QREF_ROWS 4
extern "C" __global__ void __launch_bounds__(256, 1) flce_qref(const flce_row_params p)
{
    if constexpr (FLCE_DTYPE == DTYPE_BF16) { // (bf16 only: runtime/plan.c; every rowops module has the entry)
        constexpr int S = QREF_SAMPLES, R = QREF_ROWS;
        __shared__ float part[8][R][S + 1];
        const int G = p.qref_warps > 1 ? p.qref_warps : 1, warp = threadIdx.x / 32, sub = warp % G;
        const long long i0 = ((long long)blockIdx.x * (8 / G) + warp / G) * R;
        const int lane = threadIdx.x % 32;
        const bool active = i0 < p.rows; // uniform over the group
        // Each lane's 8 hidden values of a 256-wide slice of R rows against the S sampled weight rows
        // (shared by the rows: loaded once per slice) and each row's label row, all loads of a step in
        // flight at once. One dependent chain per sample took 0.38 ms at 8192×4096 (latency-bound), a
        // warp per row re-reading the samples 0.10 ms (bench/NOTES.md v39, v40); at 512 rows one warp
        // per 4 rows filled 16 SMs for 37 µs (session 14).
        const elem_t *ws[S], *h[R], *wl[R];
        bool lab[R];
#pragma unroll
        for (int k = 0; k < S; k++) ws[k] = (const elem_t *)p.weight + (p.col0 + (2 * k + 1) * p.cols / (2 * S)) * p.d;
#pragma unroll
        for (int r = 0; r < R; r++) {
            const long long i = i0 + r < p.rows ? i0 + r : (active ? i0 : 0); // a row past the chunk repeats one
            const long long y = load_label(p.labels, p.row0 + i);
            const long long ly = label_valid(y, p) ? y - p.chunk_offset : -1;
            lab[r] = ly >= 0 && ly < p.cols;
            h[r] = (const elem_t *)p.hidden + (p.row0 + i) * p.d;
            wl[r] = (const elem_t *)p.weight + (p.col0 + (lab[r] ? ly : 0)) * p.d;
        }
        float acc[R][S + 1];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k <= S; k++) acc[r][k] = 0.f;
        for (long long e = ((long long)sub * 32 + lane) * 8; active && e < p.d; e += (long long)G * 32 * 8) {
            uint4 wv[S], hv[R], lv[R];
#pragma unroll
            for (int k = 0; k < S; k++) wv[k] = *(const uint4 *)(ws[k] + e);
#pragma unroll
            for (int r = 0; r < R; r++) hv[r] = *(const uint4 *)(h[r] + e), lv[r] = *(const uint4 *)(wl[r] + e);
#pragma unroll
            for (int r = 0; r < R; r++) {
#pragma unroll
                for (int k = 0; k < S; k++) acc[r][k] += dot8_bf16(hv[r], wv[k]);
                acc[r][S] += dot8_bf16(hv[r], lv[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int k = 0; k <= S; k++) {
                float a = acc[r][k];
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) a += __shfl_xor_sync(0xffffffffu, a, off);
                acc[r][k] = a;
                if (G > 1 && lane == 0) part[warp][r][k] = a;
            }
        if (G > 1) {
            __syncthreads();
            if (sub != 0) return;
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int k = 0; k <= S; k++) {
                    float a = part[warp][r][k];
                    for (int g = 1; g < G; g++) a += part[warp + g][r][k];
                    acc[r][k] = a;
                }
        }
        if (!active) return;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float c = NEG_INF;
#pragma unroll
            for (int k = 0; k <= S; k++)
                if (k < S || lab[r]) c = fmaxf(c, acc[r][k] * INV_TEMP);
            if (lane == 0 && i0 + r < p.rows) {
                ((float *)p.qref)[i0 + r] = c;
                ((int *)p.qflags)[i0 + r] = 0;
            }
        }
    } else {
        (void)p;
    }
}

// After the chunk's combine (lse known), one CTA per chunk row: a flagged row (a tile stored against
// its own maximum), or one whose lse lies more than QROWS_SPAN above c_i, is rescaled in place to
// the reference lse (each tile's p̃ times exp(ref_t − lse), ref_t from tile_max). Then
// s_i = g_i·a_i·exp(c_i − lse_i)/T (0 for an ignored token) goes to row_scale, s_i·h_i (rounded to
// bf16) to qh, dW's B operand, and the label's exact dz (from the fp32 target logit) with its column
// to qlab, its entry of p̃ set to 0. Without smoothing, softcap or z-loss (runtime/plan.c), s_i = 0
// only where dz_iy = 0 too.
extern "C" __global__ void __launch_bounds__(256) flce_qscale(const flce_row_params p)
{
    if constexpr (FLCE_DTYPE == DTYPE_BF16) {
        const long long i = blockIdx.x, row = p.row0 + i;
        const long long y = load_label(p.labels, row);
        const bool valid = label_valid(y, p);
        const float g = token_scale(p, row, valid);
        const float lse = ((const float *)p.lse)[row];
        const float wy = valid ? class_weight(p, y) : 0.f;
        const float a = dz_row_a(wy, lse, ((const float *)p.stats)[1], p.vocab_total);
        // Without per-token gradients cf stays unused (and compiled out); with them it holds g_i.
        dz_coef cf = {};
        bool active = valid;
        float gs = g;
        if constexpr (OPT_TOKEN_GRADS != 0) {
            cf = row_coef(p, row, valid, wy, lse);
            active = row_active(cf, valid);
            gs = active ? cf.ap : 0.f; // s_i's factor: dz is linear in p (no entropy term here)
        }
        float c = ((const float *)p.qref)[i];
        unsigned short *q = (unsigned short *)p.z + i * p.ldz;
        const bool fix = ((const int *)p.qflags)[i] != 0 || (gs != 0.f && !(lse - c <= QROWS_SPAN));
        if (fix) { // uniform across the CTA
            const float *ref = (const float *)p.tile_max + i * p.tile_max_ld;
            for (long long j = (long long)threadIdx.x * 8; j < p.cols; j += 256 * 8) {
                const float f = expf(ref[j / p.tile_cols] - lse); // 8 | tile_cols: one ref per group
                scale8_bf16(q + j, q + j, f);
            }
            c = lse;
            __syncthreads(); // the label's entry below is written after every rescale
        }
        float s;
        if constexpr (OPT_TOKEN_GRADS != 0) s = active ? gs * expf(c - lse) * INV_TEMP : 0.f;
        else s = active ? g * a * expf(c - lse) * INV_TEMP : 0.f;
        if (threadIdx.x == 0) ((float *)p.row_scale)[i] = s;
        const elem_t *h = (const elem_t *)p.hidden + row * p.d;
        elem_t *hs = (elem_t *)p.qh + i * p.d;
        for (long long e = (long long)threadIdx.x * 8; e < p.d; e += 256 * 8) scale8_bf16(h + e, hs + e, s);
        const long long local_y = y - p.chunk_offset;
        if (threadIdx.x != 0) return;
        float dz = 0.f;
        int ycol = -1;
        if (valid && local_y >= 0 && local_y < p.cols) {
            // The label's entry leaves the GEMMs: its exact dz (from the fp32 target logit; it
            // dominates its rows of dH and dW, and s_i·bf16(dz/s_i) would round it at an arbitrary
            // mantissa, twice in dW with s ⊙ H) is added by dH's epilogue times W_y (gemm_grad.cu
            // scale_rows) and by flce_qdw times h_i, and its stored p̃ becomes 0.
            const float z = ((const float *)p.target)[i];
            if constexpr (OPT_TOKEN_GRADS != 0)
                dz = dz_value_c(expf(z - lse), z - lse, z, true, class_weight(p, y), cf);
            else dz = dz_value_p(expf(z - lse), z, a, true, wy, class_weight(p, y), g, p.vocab_total);
            q[local_y] = 0;
            ycol = (int)local_y;
        }
        ((float *)p.qlab)[2 * i] = dz;
        ((int *)p.qlab)[2 * i + 1] = ycol;
    } else {
        (void)p;
    }
}

// The chunk's tokens grouped by label, for flce_qdw: qlist_start[v] (v = 0..cols) the first entry
// of vocab row v in qlist_tok, which holds the chunk rows i labelled v in increasing order (so the
// sums over them are deterministic). No global atomics: one CTA per block of QLIST_BLOCK vocab rows
// scans all the chunk's labels (its 8 warps take consecutive eighths, QLIST_UNROLL loads in flight).
#define QLIST_BLOCK 128
#define QLIST_UNROLL 8
// The block-relative vocab row of chunk row i's label, or −1 outside block [v0, v0 + QLIST_BLOCK).
__device__ __forceinline__ int qlist_row(const flce_row_params &p, long long i, long long end, long long v0)
{
    if (i >= end) return -1;
    const long long y = load_label(p.labels, p.row0 + i);
    const long long r = y - p.chunk_offset - v0;
    return label_valid(y, p) && y - p.chunk_offset < p.cols && r >= 0 && r < QLIST_BLOCK ? (int)r : -1;
}

// Counts of block v0's rows among the chunk rows [lo, hi) of warp w, into cnt (shared, atomics: the
// counts do not depend on the order).
__device__ __forceinline__ void qlist_count_range(const flce_row_params &p, long long lo, long long hi, long long v0,
                                                  int lane, int *cnt)
{
    for (long long base = lo; base < hi; base += 32 * QLIST_UNROLL) {
        int r[QLIST_UNROLL];
#pragma unroll
        for (int u = 0; u < QLIST_UNROLL; u++) r[u] = qlist_row(p, base + u * 32 + lane, hi, v0);
#pragma unroll
        for (int u = 0; u < QLIST_UNROLL; u++)
            if (r[u] >= 0) atomicAdd(&cnt[r[u]], 1);
    }
}

// Σ of v over the warp (every lane gets it).
__device__ __forceinline__ int warp_sum_int(int v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// grid: one CTA of 256 threads per block. The block's total into qlist_blk[b].
extern "C" __global__ void __launch_bounds__(256) flce_qlist_count(const flce_row_params p)
{
    __shared__ int cnt[QLIST_BLOCK];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long b = blockIdx.x, v0 = b * QLIST_BLOCK, per = (p.rows + 7) / 8;
    if (threadIdx.x < QLIST_BLOCK) cnt[threadIdx.x] = 0;
    __syncthreads();
    qlist_count_range(p, w * per, (w + 1) * per < p.rows ? (w + 1) * per : p.rows, v0, lane, cnt);
    __syncthreads();
    if (w == 0) {
        int total = 0;
        for (int r = lane; r < QLIST_BLOCK; r += 32) total += cnt[r];
        total = warp_sum_int(total);
        if (lane == 0) ((int *)p.qlist_blk)[b] = total;
    }
}

// grid as flce_qlist_count, after it: the block's start (the earlier blocks' totals), qlist_start
// of its rows (and of row cols, by the last block), and its chunk rows in qlist_tok, each warp its
// eighth of them in order after the earlier warps' (per row).
extern "C" __global__ void __launch_bounds__(256) flce_qlist_fill(const flce_row_params p)
{
    static_assert(QLIST_BLOCK == 128, "the row prefix below: 4 warps of 32 rows");
    __shared__ int cnt[8][QLIST_BLOCK];
    __shared__ long long before_w[8];
    __shared__ int warp_tot[4];
    const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long b = blockIdx.x, v0 = b * QLIST_BLOCK, per = (p.rows + 7) / 8;
    const long long lo = w * per, hi = (w + 1) * per < p.rows ? (w + 1) * per : p.rows;
    for (int r = lane; r < QLIST_BLOCK; r += 32) cnt[w][r] = 0;
    long long before = 0;
    for (long long u = threadIdx.x; u < b; u += 256) before += ((const int *)p.qlist_blk)[u];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) before += __shfl_xor_sync(0xffffffffu, before, off);
    if (lane == 0) before_w[w] = before;
    __syncwarp();
    qlist_count_range(p, lo, hi, v0, lane, cnt[w]);
    __syncthreads();
    before = 0;
    for (int k = 0; k < 8; k++) before += before_w[k];
    // Row r's entries start after the earlier rows' and, within the row, the earlier warps':
    // an exclusive prefix over the rows' totals, by the first 4 warps (a row each per lane).
    const int r = threadIdx.x;
    int own[8], tot = 0, incl = 0;
    if (r < QLIST_BLOCK) {
        for (int k = 0; k < 8; k++) own[k] = cnt[k][r], tot += own[k];
        incl = tot;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += x;
        }
        if (lane == 31) warp_tot[w] = incl;
    }
    __syncthreads(); // every count and warp total read before cnt turns into the warps' first slots
    if (r < QLIST_BLOCK) {
        int run = (int)before + incl - tot;
        for (int k = 0; k < w; k++) run += warp_tot[k];
        if (v0 + r < p.cols) ((int *)p.qlist_start)[v0 + r] = run;
        for (int k = 0; k < 8; k++) cnt[k][r] = run, run += own[k];
        if (v0 + r == p.cols - 1) ((int *)p.qlist_start)[p.cols] = run;
    }
    __syncthreads();
    for (long long base = lo; base < hi; base += 32 * QLIST_UNROLL) {
        int rr[QLIST_UNROLL]; // the loads of QLIST_UNROLL rounds in flight, then the rounds in order
#pragma unroll
        for (int u = 0; u < QLIST_UNROLL; u++) rr[u] = qlist_row(p, base + u * 32 + lane, hi, v0);
#pragma unroll
        for (int u = 0; u < QLIST_UNROLL; u++) {
            unsigned mask = __ballot_sync(0xffffffffu, rr[u] >= 0);
            while (mask) { // the matches in lane (= chunk row) order
                const int src = __ffs(mask) - 1, row = __shfl_sync(0xffffffffu, rr[u], src);
                if (lane == 0) ((int *)p.qlist_tok)[cnt[w][row]++] = (int)(base + u * 32 + src);
                mask &= mask - 1;
            }
        }
    }
}

// The labels' exact terms, after the GEMM whose output they join (same stream): a warp per
// labelled row adds Σ_k x_k·(bf16 source row k) over the row's n entries, in order (fp32), times the
// GEMM epilogue's scalar `scale`, to the destination row: into fp32 (cast_accumulate: a workspace
// accumulator or the caller's fp32 buffer) exactly, or into the dtype, rounded once more (the
// GEMM's part of such a row is the small Σ p·h or Σ p·w). entry(k, x) gives entry k's source row
// and its x. QADD_UNROLL 256-column slices at a time, their destination loads issued before the
// sources': one slice at a time with a dependent chain per entry took 0.15 ms for dW's 8192 labels
// at 8192×4096×128256 (bench/NOTES.md v40).
#define QADD_UNROLL 4
template <class Entry>
__device__ __forceinline__ void qadd_row(const flce_row_params &p, void *dst_row, int n, Entry entry, float scale,
                                         int lane)
{
    for (long long c = (long long)lane * 8; c < p.d; c += 32 * 8 * QADD_UNROLL) {
        float s[QADD_UNROLL][8];
        uint4 old16[QADD_UNROLL];
        float4 old32[QADD_UNROLL][2];
#pragma unroll
        for (int u = 0; u < QADD_UNROLL; u++) {
#pragma unroll
            for (int q = 0; q < 8; q++) s[u][q] = 0.f;
            const long long at = c + u * 256;
            if (at >= p.d) continue;
            if (p.cast_accumulate) {
                const float4 *o = (const float4 *)((const float *)dst_row + at);
                old32[u][0] = o[0], old32[u][1] = o[1];
            } else {
                old16[u] = *(const uint4 *)((const elem_t *)dst_row + at);
            }
        }
        for (int k = 0; k < n; k++) {
            float x;
            const elem_t *src = entry(k, x) + c;
#pragma unroll
            for (int u = 0; u < QADD_UNROLL; u++)
                if (c + u * 256 < p.d) axpy8_bf16(x, src + u * 256, s[u]);
        }
#pragma unroll
        for (int u = 0; u < QADD_UNROLL; u++) {
            const long long at = c + u * 256;
            if (at >= p.d) continue;
            if (p.cast_accumulate) {
                float4 *o = (float4 *)((float *)dst_row + at);
                const float4 a = old32[u][0], b = old32[u][1];
                o[0] = make_float4(a.x + scale * s[u][0], a.y + scale * s[u][1], a.z + scale * s[u][2], a.w + scale * s[u][3]);
                o[1] = make_float4(b.x + scale * s[u][4], b.y + scale * s[u][5], b.z + scale * s[u][6], b.w + scale * s[u][7]);
            } else {
                unsigned wv[4] = {old16[u].x, old16[u].y, old16[u].z, old16[u].w};
#pragma unroll
                for (int q = 0; q < 4; q++)
                    wv[q] = pack2_elem(bf16_lo(wv[q]) + scale * s[u][2 * q], bf16_hi(wv[q]) + scale * s[u][2 * q + 1]);
                *(uint4 *)((elem_t *)dst_row + at) = make_uint4(wv[0], wv[1], wv[2], wv[3]);
            }
        }
    }
}

// Row `at` (elements of d) of cast_dst, fp32 or the dtype (cast_accumulate).
__device__ __forceinline__ void *qadd_dst(const flce_row_params &p, long long at)
{
    return p.cast_accumulate ? (void *)((float *)p.cast_dst + at * p.d) : (void *)((elem_t *)p.cast_dst + at * p.d);
}

// The scalar the GEMM epilogues apply (and db, the labels' terms): grad_output (mean, sum) times
// 1/denominator (mean); 1 for none (g_i is in each dz).
__device__ __forceinline__ float upstream_scale(const flce_row_params &p)
{
    if constexpr (FLCE_REDUCTION != REDUCTION_NONE && !OPT_TOKEN_GRADS) { // (else folded into each row: loss_g)
        const float *go = (const float *)p.grad_output;
        return (go ? go[0] : 1.f) * mean_scale(p);
    } else {
        (void)p;
        return 1.f;
    }
}

// grid as flce_qlist_count, after the chunk's dW launch (same stream): each labelled vocab row v of
// the block (a warp per row, round robin) adds the labels' term Σ dz_i·h_i over its chunk rows i
// (in order) to dW's row v (cast_dst: the block's row 0).
extern "C" __global__ void __launch_bounds__(256) flce_qdw(const flce_row_params p)
{
    if constexpr (FLCE_DTYPE == DTYPE_BF16) {
        const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
        const long long v0 = (long long)blockIdx.x * QLIST_BLOCK;
        const int *start = (const int *)p.qlist_start, *tok = (const int *)p.qlist_tok;
        const float scale = upstream_scale(p);
        // The warp's rows w, w + 8, … (QLIST_BLOCK / 8 ≤ 32 of them): lane j reads row j's range, all
        // in one round (a load per row in turn was most of this pass where few rows have labels: 36 µs
        // at 512 tokens, session 14); then the labelled ones in order.
        static_assert(QLIST_BLOCK / 8 <= 32, "one lane per row of the warp");
        const long long vj = v0 + w + 8 * lane;
        const int aj = lane < QLIST_BLOCK / 8 && vj < p.cols ? start[vj] : 0;
        const int ej = lane < QLIST_BLOCK / 8 && vj < p.cols ? start[vj + 1] : 0;
        for (unsigned mask = __ballot_sync(0xffffffffu, aj != ej); mask; mask &= mask - 1) {
            const int j = __ffs(mask) - 1;
            const int a = __shfl_sync(0xffffffffu, aj, j), e = __shfl_sync(0xffffffffu, ej, j);
            auto entry = [&](int k, float &x) {
                const int i = tok[a + k];
                x = ((const float *)p.qlab)[2 * i];
                return (const elem_t *)p.hidden + (p.row0 + i) * p.d;
            };
            qadd_row(p, qadd_dst(p, v0 + w + 8 * j), e - a, entry, scale, lane);
        }
    } else {
        (void)p;
    }
}

// After the chunk's dH (same stream, grid: a warp per chunk row, 8 per CTA): each row's label term
// dz_i·W_y, when its label lies in the chunk's columns, into dH's row i (cast_dst: the chunk's row
// 0). Taken out of dH's epilogue, where gathering the W rows cost 0.25 ms of the main loop at
// 8192×4096×128256 (bench/NOTES.md v39, v40).
extern "C" __global__ void __launch_bounds__(256) flce_qdh(const flce_row_params p)
{
    if constexpr (FLCE_DTYPE == DTYPE_BF16) {
        const long long i = (long long)blockIdx.x * 8 + threadIdx.x / 32;
        if (i >= p.rows) return;
        const float dz = ((const float *)p.qlab)[2 * i];
        const int ycol = ((const int *)p.qlab)[2 * i + 1];
        if (ycol < 0 || dz == 0.f) return; // warp-uniform
        auto entry = [&](int, float &x) {
            x = dz;
            return (const elem_t *)p.weight + (p.col0 + ycol) * p.d;
        };
        qadd_row(p, qadd_dst(p, i), 1, entry, upstream_scale(p), threadIdx.x % 32);
    } else {
        (void)p;
    }
}

// grid: (rows, column blocks); each thread turns 4 consecutive logits (from compact logits, p.tile_max
// set: DZ_COMPACT_GROUPS groups of DZ_COMPACT_COLS; launch.c sizes the grid to match) into as many
// gradients.
extern "C" __global__ void __launch_bounds__(256) flce_dz(const flce_row_params p)
{
    long long i = blockIdx.x;
    if constexpr (FLCE_DTYPE != DTYPE_F32) { // compact logits (p.tile_max) are 16-bit
        if (p.tile_max) {
            const long long span = (long long)blockDim.x * DZ_COMPACT_COLS; // columns between a thread's groups
            const long long j0 = (long long)blockIdx.y * span * DZ_COMPACT_GROUPS + threadIdx.x * DZ_COMPACT_COLS;
            if (j0 >= p.ldz) return;
            long long y = load_label(p.labels, p.row0 + i);
            bool valid = label_valid(y, p);
            float g = token_scale(p, p.row0 + i, valid);
            float lse = ((const float *)p.lse)[p.row0 + i];
            float wy = valid ? class_weight(p, y) : 0.f;
            float a = dz_row_a(wy, lse, ((const float *)p.stats)[1], p.vocab_total);
            long long local_y = valid ? y - p.chunk_offset : -1;
            dz_coef cf = {}; // per-token gradients only (else unused, compiled out)
            bool active = valid;
            if constexpr (OPT_TOKEN_GRADS != 0) {
                cf = row_coef(p, p.row0 + i, valid, wy, lse);
                active = row_active(cf, valid);
            }
            uint4 raw[DZ_COMPACT_GROUPS];
            float m[DZ_COMPACT_GROUPS];
#pragma unroll
            for (int q = 0; q < DZ_COMPACT_GROUPS; q++) {
                const long long j = j0 + q * span;
                if (j >= p.ldz) break;
                raw[q] = *(const uint4 *)((const unsigned short *)p.z + i * p.ldz + j);
                // DZ_COMPACT_COLS | tile_cols (a warp tile is a multiple of 8 columns wide), so the
                // group shares one m (a column past cols reads a valid m or is unused).
                m[q] = j < p.cols ? ((const float *)p.tile_max)[i * p.tile_max_ld + j / p.tile_cols] : 0.f;
            }
#pragma unroll
            for (int q = 0; q < DZ_COMPACT_GROUPS; q++) {
                const long long j = j0 + q * span;
                if (j >= p.ldz) break;
                float d[DZ_COMPACT_COLS];
                if constexpr (OPT_TOKEN_GRADS != 0) dz_compact_c(p, i, j, raw[q], m[q], lse, local_y, cf, active, d);
                else dz_compact(p, i, j, raw[q], m[q], lse, a, local_y, wy, g, valid, d);
                unsigned w[DZ_COMPACT_COLS / 2];
#pragma unroll
                for (int c = 0; c < DZ_COMPACT_COLS / 2; c++) w[c] = pack2_elem(d[2 * c], d[2 * c + 1]);
                st_global_16((elem_t *)p.dz + i * p.ldz + j, w[0], w[1], w[2], w[3]);
            }
            return;
        }
    }
    long long j = ((long long)blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (j >= p.ldz) return;
    long long y = load_label(p.labels, p.row0 + i);
    bool valid = label_valid(y, p);
    float g = token_scale(p, p.row0 + i, valid);
    float lse = ((const float *)p.lse)[p.row0 + i];
    float wy = valid ? class_weight(p, y) : 0.f;
    float a = dz_row_a(wy, lse, ((const float *)p.stats)[1], p.vocab_total);
    long long local_y = valid ? y - p.chunk_offset : -1;
    float d[4];
    float4 z = *(const float4 *)((const float *)p.z + i * p.ldz + j);
    float zs[4] = {z.x, z.y, z.z, z.w};
    dz_coef cf = {}; // per-token gradients only (else unused, compiled out)
    bool active = valid;
    if constexpr (OPT_TOKEN_GRADS != 0) {
        cf = row_coef(p, p.row0 + i, valid, wy, lse);
        active = row_active(cf, valid);
    }
#pragma unroll
    for (int c = 0; c < 4; c++) {
        long long col = j + c;
        float v = 0.f;
        if constexpr (OPT_TOKEN_GRADS != 0) {
            if (col < p.cols && active)
                v = dz_value_c(exp_le0(zs[c] - lse), zs[c] - lse, zs[c], col == local_y,
                               class_weight(p, p.chunk_offset + col), cf);
        } else {
            if (col < p.cols && valid)
                v = dz_value(zs[c], lse, a, col == local_y, wy, class_weight(p, p.chunk_offset + col), g,
                             p.vocab_total);
        }
        d[c] = v;
    }
    if constexpr (FLCE_DTYPE == DTYPE_F32) {
        *(float4 *)((float *)p.dz + i * p.ldz + j) = make_float4(d[0], d[1], d[2], d[3]);
    } else {
        uint2 packed;
        packed.x = (unsigned)from_f32(d[0]) | ((unsigned)from_f32(d[1]) << 16);
        packed.y = (unsigned)from_f32(d[2]) | ((unsigned)from_f32(d[3]) << 16);
        *(uint2 *)((elem_t *)p.dz + i * p.ldz + j) = packed;
    }
}

__device__ __forceinline__ float mean_scale(const flce_row_params &p)
{
    if constexpr (FLCE_REDUCTION == REDUCTION_MEAN) {
        float denom = ((const float *)p.stats)[0];
        return denom != 0.f ? 1.f / denom : 0.f;
    } else {
        (void)p;
        return 1.f;
    }
}

// One CTA of FLCE_ROW_CTA_THREADS threads: strided partial sums, then a fixed tree. Same order
// every run.
extern "C" __global__ void __launch_bounds__(FLCE_ROW_CTA_THREADS) flce_reduce(const flce_row_params p)
{
    __shared__ float scratch[FLCE_ROW_CTA_THREADS];
    float s = 0.f, z = 0.f;
    for (long long i = threadIdx.x; i < p.tokens; i += blockDim.x) {
        s += ((const float *)p.loss_rows)[i];
        if (p.zloss_rows) z += ((const float *)p.zloss_rows)[i];
    }
    s = block_sum_1024(s, scratch);
    if (p.zloss_rows) z = block_sum_1024(z, scratch);
    if (threadIdx.x == 0) {
        float scale = mean_scale(p);
        if (p.loss_out) *(float *)p.loss_out = s * scale;
        if (p.zloss_out) *(float *)p.zloss_out = z * scale;
    }
}

// db: one thread per column of the chunk, rows summed in order (deterministic), fp32 across chunks.
extern "C" __global__ void __launch_bounds__(256) flce_dbias(const flce_row_params p)
{
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= p.cols) return;
    float s = 0.f;
    for (long long r = 0; r < p.rows; r++) s += to_f32(((const elem_t *)p.dz)[r * p.ldz + j]);
    float *acc = (float *)p.dbias_acc + p.col0 + j;
    if (!p.first) s += *acc;
    if (!p.last) {
        *acc = s;
        return;
    }
    if constexpr (FLCE_REDUCTION != REDUCTION_NONE) {
        s *= upstream_scale(p);
        if constexpr (FLCE_DTYPE == DTYPE_F16) s *= 1.f / DZ_SCALE_F16;
    }
    ((elem_t *)p.grad_bias)[p.col0 + j] = from_f32(s);
}
