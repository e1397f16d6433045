// gemm_grad.cu — the DH/DW epilogue: out = scale · acc (+ addend), and the scale of mean and sum.
// generator/emit.c pastes it after the main loop, for DH and DW only.
// out = scale · acc (+ addend) for one output tile, in fp32 or the input dtype.
// The addend is usually `out` itself (an fp32 accumulator built up over chunks), so the compiler
// must keep each load behind the previous store: one full memory round trip per 8 columns, 32 per
// row of a 128×256 tile, which made the epilogue as long as a K = 640 main loop. Loading a batch
// of ADD_BATCH fragments before any of their stores puts those loads in flight together.
__host__ __device__ constexpr int add_batch(int d) { return NI % d == 0 ? d : add_batch(d - 1); }
constexpr int ADD_BATCH = add_batch(NI < 16 ? NI : 16); // the largest divisor of NI up to 16
// *at += (v0, v1) as reductions L2 carries out; the thread does not wait for them.
__device__ __forceinline__ void red_add2(float *at, float v0, float v1)
{
    if constexpr (FLCE_SM >= 90) { // (the vector form is sm_90's)
        asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(at), "f"(v0), "f"(v1) : "memory");
    } else {
        asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(at), "f"(v0) : "memory");
        asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(at + 1), "f"(v1) : "memory");
    }
}

// out += scale · acc for an fp32 accumulator updated in place (p.red_addend; runtime/plan.h red_acc):
// instead of loading the addend, waiting for it and storing, the consumers hand L2 one reduction
// per element and go on to the next tile's main loop while L2 reads, adds and writes back (the
// chunked strategy's dW accumulator is 13.7 GB of such traffic at 8192×4096×128256, bench/NOTES.md
// v12–v13). One reduction per element per launch, so the order is fixed and the result is that of
// the load-add-store except that f32 reductions flush subnormal values (|x| < 1.2e-38) to zero.
__device__ __forceinline__ void red_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long m0,
                                             long long n0, int wm, int wn, int lane, float scale)
{
    const int g = lane / 4, t = lane % 4;
    const long long c0 = n0 + wn * WTN + 2 * t;
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            long long row = m0 + wm * WTM + mi * 16 + g + 8 * h;
            if (row >= p.m) continue;
            float *out = (float *)p.out + row * p.ldo + c0;
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
                if (c0 + ni * 8 < p.n) red_add2(out + ni * 8, acc[mi][ni][2 * h] * scale, acc[mi][ni][2 * h + 1] * scale);
        }
}

// The same update as red_epilogue, handed to the TMA unit instead as bulk reductions of whole
// 128-byte rows (bulk_red_rows, gemm_wgmma_tma.cu, says how). With per-thread reductions the
// consumers stalled on the LSU (LG throttle) and on their registers still being read (long
// scoreboard): dW into the fp32 main_grad ran 30 % longer per k than with a bf16 store
// (bench/NOTES.md session 15). Still one reduction per element per launch; f32 reductions flush
// subnormals to zero as red.global does.
// Needs out and the row stride 16-byte aligned (bulk_out_ok; else red_epilogue). FLCE_GRAD_BULK
// kernels only (generator/spec.c spec_bulk_red: the Hopper TMA tile, room for the buffers).
__device__ __forceinline__ void bulk_red_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long m0,
                                                  long long n0, int wm, int lane, float scale, unsigned char *smem)
{
    bulk_red_rows(acc, (float *)p.out, p.ldo, p.m, p.n, m0 + wm * WTM, n0, scale, staging_addr(smem, wm), lane);
}

// dH over row-scaled compact logits (FLCE_QROWS, p.row_scale): row r of the tile times s_r, plus
// (p.qlab set: the runtime's qdh off) its label's exact dz (flce_qscale; the label's stored entry
// is 0) times the label's row of W where that lies in this launch's k range; 0 where s_r is 0 (an
// ignored token, whose row of the compact logits may hold anything finite or not). With qdh on,
// flce_qdh adds the label's term after dH instead (rowops.cu).
__device__ __forceinline__ void scale_rows(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long m0,
                                           long long n0, int wm, int wn, int lane)
{
    if (!ROLE_IS_DH || !p.row_scale) return; // uniform
    if constexpr (FLCE_DTYPE == DTYPE_BF16) { // (bf16 only: row-scaled compact logits, runtime/plan.c)
        const long long c0 = n0 + wn * WTN + 2 * (lane % 4);
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const long long row = m0 + wm * WTM + mi * 16 + lane / 4 + 8 * h;
                const float s = row < p.m ? ((const float *)p.row_scale)[row] : 0.f;
                const float2 ql = p.qlab && row < p.m ? ((const float2 *)p.qlab)[row] : make_float2(0.f, 0.f);
                const long long yk = (long long)__float_as_int(ql.y) - p.qlab_k0;
                const bool lab = ql.x != 0.f && __float_as_int(ql.y) >= 0 && yk >= 0 && yk < p.k;
                const elem_t *wy = (const elem_t *)p.b + (lab ? yk : 0) * p.ldb + c0;
#pragma unroll
                for (int ni = 0; ni < NI; ni++) {
                    float w0 = 0.f, w1 = 0.f;
                    if (lab && c0 + ni * 8 < p.n) {
                        const unsigned pr = *(const unsigned *)(wy + ni * 8);
                        w0 = __uint_as_float(pr << 16), w1 = __uint_as_float(pr & 0xffff0000u);
                    }
                    const float v0 = fmaf(ql.x, w0, acc[mi][ni][2 * h] * s);
                    const float v1 = fmaf(ql.x, w1, acc[mi][ni][2 * h + 1] * s);
                    acc[mi][ni][2 * h] = s == 0.f ? 0.f : v0;
                    acc[mi][ni][2 * h + 1] = s == 0.f ? 0.f : v1;
                }
            }
    } else {
        (void)acc, (void)m0, (void)n0, (void)wm, (void)wn, (void)lane;
    }
}

// Two addend values at element `at`: fp32, or (p.addend_dtype) the 16-bit dtype, one word.
__device__ __forceinline__ float2 addend_pair(const flce_gemm_params &p, long long at)
{
    if constexpr (FLCE_DTYPE != DTYPE_F32) {
        if (p.addend_dtype) {
            const unsigned w = *(const unsigned *)((const elem_t *)p.addend + at);
            return make_float2(to_f32((elem_t)(w & 0xffffu)), to_f32((elem_t)(w >> 16)));
        }
    }
    return *(const float2 *)((const float *)p.addend + at);
}

// Which stores this kernel holds (generator/spec.h plain_out, red_acc): the runtime launches a
// FLCE_GRAD_PLAIN kernel only with no addend, a 16-bit output and n a multiple of BN.
static_assert(!FLCE_GRAD_PLAIN || (STAGED_STORE && FLCE_DTYPE != DTYPE_F32),
              "plain_out: the staged 16-bit store of the wgmma TMA path");
// `out`: p.out, or (a split of k, params.h k_splits) the split's fp32 slab.
__device__ __forceinline__ void grad_epilogue(float (&acc)[MI][NI][4], const flce_gemm_params &p, long long m0,
                                              long long n0, int wm, int wn, int lane, float scale,
                                              unsigned char *smem, unsigned long long out)
{
    scale_rows(acc, p, m0, n0, wm, wn, lane);
    if constexpr (FLCE_GRAD_RED) {
        if (p.red_addend) { // uniform across the CTA
            if constexpr (FLCE_GRAD_BULK) {
                if (bulk_out_ok(p)) {
                    bulk_red_epilogue(acc, p, m0, n0, wm, lane, scale, smem);
                    return;
                }
            }
            red_epilogue(acc, p, m0, n0, wm, wn, lane, scale);
            return;
        }
    }
    if constexpr (FLCE_GRAD_BULK && FLCE_DTYPE != DTYPE_F32) {
        // added in place into a 16-bit output (a distillation's dWs chunk by chunk): whole rows
        // through shared memory (staged_add_rows). Uniform across the CTA.
        if (p.addend_dtype && p.addend == out && !p.out_f32 && (out & 7) == 0 && p.ldo % 4 == 0) {
            staged_add_rows(acc, (unsigned short *)out, p.ldo, p.m, p.n, m0 + wm * WTM, n0, scale,
                            staging_addr(smem, wm), lane);
            return;
        }
    }
    if constexpr (STAGED_STORE && FLCE_DTYPE != DTYPE_F32) {
        // A full-width tile of a 16-bit output with no addend (a complete dH or dW: the one-chunk
        // strategies' common case) goes out through shared memory, whole 128-byte rows per store
        // (gemm_wgmma_tma.cu). Uniform across the CTA.
        if (FLCE_GRAD_PLAIN || (!p.addend && !p.out_f32 && n0 + BN <= p.n)) {
            unsigned pk[NI][2];
#pragma unroll
            for (int ni = 0; ni < NI; ni++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    pk[ni][h] = pack2_elem(acc[0][ni][2 * h] * scale, acc[0][ni][2 * h + 1] * scale);
            staged_store(pk, (unsigned short *)out, p.ldo, p.m, p.n, staging_addr(smem, wm), m0 + wm * WTM, n0, lane);
            return;
        }
    } else {
        (void)smem;
    }
    if constexpr (!FLCE_GRAD_PLAIN) {
        const int g = lane / 4, t = lane % 4;
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
                        add[i] = p.addend && c0 + ni * 8 < p.n ? addend_pair(p, at0 + ni * 8)
                                                               : make_float2(0.f, 0.f);
                    }
#pragma unroll
                    for (int i = 0; i < ADD_BATCH; i++) {
                        const int ni = nb + i;
                        if (c0 + ni * 8 >= p.n) continue;
                        const long long at = at0 + ni * 8;
                        float v0 = acc[mi][ni][2 * h] * scale + add[i].x;
                        float v1 = acc[mi][ni][2 * h + 1] * scale + add[i].y;
                        if (p.out_f32 || FLCE_DTYPE == DTYPE_F32) {
                            *(float2 *)((float *)out + at) = make_float2(v0, v1);
                        } else {
                            unsigned packed = (unsigned)from_f32(v0) | ((unsigned)from_f32(v1) << 16);
                            *(unsigned *)((elem_t *)out + at) = packed;
                        }
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
