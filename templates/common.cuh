// common.cuh — device helpers every flce template uses: the input element type, conversions,
// and the few PTX instructions we need, each wrapped in a small named function. No toolkit
// header is included (NVRTC on a user's machine may have no include path). generator/emit.c pastes
// it after the preamble, whose constants (FLCE_DTYPE, OPT_*, …) it reads; `flce gen` output compiles
// alone. The dtype's variants are `if constexpr` branches: every branch is parsed for every dtype,
// so their operands are cast to the type the instruction takes (a no-op where the branch is taken).

#define DTYPE_F32 0
#define DTYPE_F16 1
#define DTYPE_BF16 2

// T where C holds, else F (std::conditional; NVRTC has no standard headers): a variant as a type.
template <bool C, class T, class F> struct pick_type {
    typedef T type;
};
template <class T, class F> struct pick_type<false, T, F> {
    typedef F type;
};
// The element type: float, or the raw 16-bit pattern of an fp16 or bf16 value.
typedef pick_type<FLCE_DTYPE == DTYPE_F32, float, unsigned short>::type elem_t;

constexpr int ELEM_BYTES = (int)sizeof(elem_t);
constexpr int VEC = 16 / ELEM_BYTES; // elements per 16-byte vector
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_f32(elem_t x)
{
    if constexpr (FLCE_DTYPE == DTYPE_F32) {
        return (float)x;
    } else if constexpr (FLCE_DTYPE == DTYPE_BF16) {
        return __uint_as_float((unsigned)x << 16);
    } else {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)x));
        return f;
    }
}

// An fp16 value's bits as fp32 (the compact store's p̃, whatever the inputs' dtype).
__device__ __forceinline__ float half_bits_to_float(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ elem_t from_f32(float x)
{
    if constexpr (FLCE_DTYPE == DTYPE_F32) {
        return (elem_t)x;
    } else if constexpr (FLCE_DTYPE == DTYPE_BF16) {
        unsigned short r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
        return (elem_t)r;
    } else {
        unsigned short r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
        return (elem_t)r;
    }
}

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    unsigned long long a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (unsigned)a;
}

// 16-byte global→shared copy that bypasses L1; when `valid` is false it writes zeros and reads
// nothing (src-size 0), which is how tiles past the matrix edge are filled.
// Two floats rounded to the 16-bit dtype in one word, lo in the low half (what from_f32 gives each);
// for 16-bit dtypes (fp32 builds parse it and never call it).
__device__ __forceinline__ unsigned pack2_elem(float lo, float hi)
{
    unsigned r;
    if constexpr (FLCE_DTYPE == DTYPE_BF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// 16-byte global store of four words (a struct copy of uint4 may be split into four 4-byte ones).
__device__ __forceinline__ void st_global_16(void *dst, unsigned x, unsigned y, unsigned z, unsigned w)
{
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ void cp_async_16(void *dst, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// D = A·B + D on a 16×8×16 tile: A row-major 16×16, B column-major 16×8, fp32 accumulators.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1)
{
    if constexpr (FLCE_DTYPE == DTYPE_BF16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else if constexpr (FLCE_DTYPE == DTYPE_F16) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        (void)d; (void)a; (void)b0; (void)b1; // fp32 inputs take the exact FFMA path instead
    }
}

__device__ __forceinline__ long long load_label(unsigned long long base, long long i)
{
    if constexpr (FLCE_LABEL_BITS == 64) return ((const long long *)base)[i];
    else return ((const int *)base)[i];
}

// exp(x) for the x ≤ 0 of per-element softmax terms (z − max, z − lse): ex2.approx of x·log2 e, two
// instructions instead of expf's ten (PTX ISA: ex2.approx.ftz.f32 within 2^-22.5 relative; results
// below 2^-126 flush to 0, where p adds nothing; NaN stays NaN, −inf gives 0). Every epilogue's
// per-logit exp uses it; expf stays where one value per row or group is formed.
__device__ __forceinline__ float ex2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// log2(x) by the SFU (lg2.approx: ~2^-22 relative), for x > 0.
__device__ __forceinline__ float lg2_approx(float x)
{
    float r;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ float exp_le0(float x) { return ex2_approx(x * 1.4426950408889634f); }

// Merges two (max, Σexp(x − max)) pairs. Empty pairs carry max = −inf and sum = 0.
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    float mm = fmaxf(m, m2);
    if (mm == NEG_INF) return;
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

// Per owned row, the running statistics of this CTA's vocab split (docs/DESIGN.md §1):
//   m = max z, s = Σ exp(z − m), t = Σ exp(z − m)·z (entropy), zs = Σ w_j·z (smoothing),
//   arg = global id of the first maximum (argmax).
// fp16 dZ of reduction mean/sum is stored times this power of two and the gradient GEMMs and db
// divide it out: probabilities p ≥ 2^-14/256 ≈ 2.4e-7 stay normal fp16 (a vocab of 128k has
// typical p ≈ 8e-6, subnormal without it), while dZ values up to 255 in magnitude (class weights,
// z-loss) still fit under fp16's 65504.
// Reduction none carries the caller's per-token gradient in dZ, so it is not scaled.
#define DZ_SCALE_F16 256.f

#define REDUCTION_MEAN 0
#define REDUCTION_SUM 1
#define REDUCTION_NONE 2

// ---- dZ of one logit (the math in rowops.cu's header), written once: flce_dz (rowops.cu) and the
// recompute pass's logits epilogue (gemm_logits.cu, FLCE_FUSED_DZ) both call these, so both give the same
// bits for the same z and lse. They use the generated constants (SMOOTHING, ZLOSS, INV_TEMP,
// SOFTCAP, FLCE_REDUCTION), which every template defines before including this file.
// a_i of a valid row: wy = w_y, wsum = Σ_j w_j (stats[1]).
__device__ __forceinline__ float dz_row_a(float wy, float lse, float wsum, long long vocab_total)
{
    float a = (1.f - SMOOTHING) * wy;
    if (OPT_ZSUM) a += SMOOTHING * wsum / (float)vocab_total;
    if (ZLOSS > 0.f) a += 2.f * ZLOSS * wy * lse;
    return a;
}
// dz of a valid row's element whose probability p = exp(z − lse) is already known (the compact
// logits of the chunked strategy carry p, not z; z is then needed only by softcap's chain rule).
__device__ __forceinline__ float dz_value_p(float prob, float z, float a, bool is_label, float wy, float wj,
                                            float g, long long vocab_total)
{
    float v = a * prob;
    if (is_label) v -= (1.f - SMOOTHING) * wy;
    if (OPT_ZSUM) v -= SMOOTHING * wj / (float)vocab_total;
    if (INV_TEMP != 1.f) v *= INV_TEMP;
    if (SOFTCAP > 0.f) {
        float r = z * (1.f / SOFTCAP);
        v *= 1.f - r * r;
    }
    v *= g;
    if constexpr (FLCE_DTYPE == DTYPE_F16 && FLCE_REDUCTION != REDUCTION_NONE) v *= DZ_SCALE_F16;
    return v;
}
// Per-token upstream gradients (flce.h problem.grad_outputs; the generator defines OPT_TOKEN_GRADS,
// bit 8: loss_per_token's, added to the loss's g_i;
// FLCE_GRAD_* bits, only for rowops kernels that take them). A row's dz is then
//   ap·p_j − al·1[j=y] − aw·w_j − ah·p_j·(log p_j + H)      (then 1/T and softcap's chain factor)
// with ap = g·a + g_lse − g_lp, al = g·(1−ε)·w_y − g_lp, aw = g·ε/V, ah = g_H: the loss's term
// (g with the reduction's scalar folded in, a as above), the log-prob's g_lp·(1[j=y] − p_j), lse's
// g_lse·p_j and entropy's −g_H·p_j·(log p_j + H) (docs/DESIGN.md §1.3). Where p_j underflowed to 0,
// p_j·log p_j → 0: the entropy term is 0.
struct dz_coef {
    float ap, al, aw, ah, h;
};
__device__ __forceinline__ float dz_value_c(float prob, float logp, float z, bool is_label, float wj, const dz_coef &c)
{
    float v = c.ap * prob;
    if (is_label) v -= c.al;
    if (OPT_ZSUM) v -= c.aw * wj;
    if ((OPT_TOKEN_GRADS & 4) && c.ah != 0.f && prob > 0.f) v -= c.ah * prob * (logp + c.h);
    if (INV_TEMP != 1.f) v *= INV_TEMP;
    if (SOFTCAP > 0.f) {
        float r = z * (1.f / SOFTCAP);
        v *= 1.f - r * r;
    }
    if constexpr (FLCE_DTYPE == DTYPE_F16 && FLCE_REDUCTION != REDUCTION_NONE) v *= DZ_SCALE_F16;
    return v;
}

// dz of the transformed logit z of a valid row (g = token scale, wj = w_j, used with smoothing).
__device__ __forceinline__ float dz_value(float z, float lse, float a, bool is_label, float wy, float wj, float g,
                                          long long vocab_total)
{
    return dz_value_p(exp_le0(z - lse), z, a, is_label, wy, wj, g, vocab_total);
}

// Compact logits (the chunked strategy's store, docs/DESIGN.md §3.2): each logit z is kept as fp16
// p̃ = exp(z − m)·2^15, m the fp32 maximum of its (row, column group). fp16's 11 significant bits
// put at most 2^-11 of relative error on p (bf16 dZ itself rounds at up to 2^-8); the 2^15 keeps p̃
// a normal fp16 number down to exp(z − m) ≈ 2e-9 (z − m ≈ −20), below which p adds nothing measurable.
#define COMPACT_SCALE 32768.f
#define COMPACT_LN_SCALE 10.3972077f // ln 2^15

// Row-scaled compact logits (FLCE_QROWS, bf16): each logit is stored as bf16 exp(z − c_i), c_i one
// reference per row taken before the logits pass (flce_qref: the largest of QREF_SAMPLES sampled
// logits and the label's), so dz_ij = s_i·p̃_ij with s_i = g_i·a_i·exp(c_i − lse_i)/T, and
// dH = s ⊙ (p̃·W), dW = p̃ᵀ·(s ⊙ H): no dz pass. The label's entry is set to 0 and its exact dz
// added to dH and dW apart (flce_qscale; flce_qdh, or gemm_grad.cu scale_rows; flce_qdw).
// A tile whose maximum lies more than QROWS_SPAN above c_i is stored against that maximum instead
// (p̃ ≤ 1: no overflow) and flags its row, which flce_qscale rescales to c_i = lse_i; so does a
// row whose lse lies more than QROWS_SPAN above c_i (s_i would be tiny). Within the span the stored
// values stay below e^32 and s_i above e^-32·g_i·a_i, far inside fp32 and bf16's range.
#define QROWS_SPAN 32.f
#define QREF_SAMPLES 8

// zs: a plain sum over the row's columns (no rescaling by the running max): label smoothing's
// Σ_j w_j·z_j, or the distillation's soft-target Σ_j p_j·z_j (OPT_SOFT, gemm_logits.cu), or its
// sparse target's Σ_u p_u·z_u over a top-k teacher's ids (OPT_SPARSE)
constexpr bool STATS_ZS = OPT_ZSUM || OPT_SOFT || OPT_SPARSE;

struct row_stats {
    float m, s, t, zs;
    long long arg;
};

__device__ __forceinline__ void stats_merge(row_stats &a, const row_stats &b)
{
    float mm = fmaxf(a.m, b.m);
    if (OPT_ARGMAX && (b.m > a.m || (b.m == a.m && b.arg < a.arg))) a.arg = b.arg;
    if (a.s != a.s || b.s != b.s) { a.s = a.s + b.s; return; } // NaN inputs stay NaN
    if (mm == NEG_INF) return;
    float ea = expf(a.m - mm), eb = expf(b.m - mm);
    a.s = a.s * ea + b.s * eb;
    if (OPT_ENTROPY) a.t = a.t * ea + b.t * eb;
    a.m = mm;
    if (STATS_ZS) a.zs += b.zs;
}

// The statistics held by the lane `off` away (lane ^ off) in the warp.
__device__ __forceinline__ row_stats shfl_stats(const row_stats &a, int off)
{
    row_stats b;
    b.m = __shfl_xor_sync(0xffffffffu, a.m, off);
    b.s = __shfl_xor_sync(0xffffffffu, a.s, off);
    b.t = OPT_ENTROPY ? __shfl_xor_sync(0xffffffffu, a.t, off) : 0.f;
    b.zs = STATS_ZS ? __shfl_xor_sync(0xffffffffu, a.zs, off) : 0.f;
    b.arg = OPT_ARGMAX ? __shfl_xor_sync(0xffffffffu, a.arg, off) : 0;
    return b;
}
